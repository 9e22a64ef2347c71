// A compact read-only JSON tree for large traces (internal to ckpt_replay): parsed with
// nlohmann's SAX parser into flat arrays (one node array, one child-index array, one string
// pool), so a 100,000-segment trace costs no per-node allocation. JsonTree::Node offers the
// subset of nlohmann::json's reading interface that trace.cpp's reader uses, so one template
// reads both. Anything it does not model (wrong-type value()/get(), duplicate keys) throws
// JsonTree::Unsupported: the caller then falls back to nlohmann::json.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt::replay {

class JsonTree {
public:
    /// Thrown for input the tree does not model; parse it with nlohmann::json instead.
    struct Unsupported : std::runtime_error {
        using std::runtime_error::runtime_error;
    };

    /// One JSON value. References stay valid while the tree lives.
    class Node {
    public:
        /// Type tests, as nlohmann::json's (integers: Int = negative, Uint = non-negative).
        bool is_object() const { return kind_ == Kind::Object; }
        bool is_array() const { return kind_ == Kind::Array; }
        bool is_string() const { return kind_ == Kind::String; }
        bool is_boolean() const { return kind_ == Kind::Bool; }
        bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Uint || kind_ == Kind::Float; }
        bool is_number_integer() const { return kind_ == Kind::Int || kind_ == Kind::Uint; }
        bool is_number_unsigned() const { return kind_ == Kind::Uint; }
        /// Elements of an array, members of an object, 0 otherwise (nlohmann's 1 for scalars
        /// is not modelled; the reader sizes containers only).
        size_t size() const { return is_array() || is_object() ? count_ : 0; }
        /// size() == 0.
        bool empty() const { return size() == 0; }
        /// Array element k (k < size()).
        const Node& operator[](size_t k) const;
        /// The member called key (the first one; duplicates make dump() throw), or nullptr.
        const Node* find(std::string_view key) const;
        /// find(key) != nullptr.
        bool contains(std::string_view key) const { return find(key) != nullptr; }
        /// Value as T (uint64_t, int64_t, double, bool, std::string) with nlohmann's number
        /// conversions; Unsupported for any other type pairing.
        template <class T> T get() const;
        /// get<T>() of member key, or def when absent (as nlohmann::json::value).
        std::string value(std::string_view key, const char* def) const;
        bool value(std::string_view key, bool def) const;
        /// canonical_dump() of this value (keys sorted, no spaces, Python float format: the
        /// trace hash's text); Unsupported on a repeated key.
        std::string dump() const;
        /// The same text as dump(), handed to `sink` in consecutive chunks of ~64 KiB (no
        /// whole copy of a large trace in memory); Unsupported on a repeated key.
        using ChunkSink = std::function<void(std::string_view)>;
        void dump(const ChunkSink& sink) const;

    private:
        friend class JsonTree;
        friend struct JsonTreeBuilder;
        enum class Kind : uint8_t { Null, Bool, Int, Uint, Float, String, Array, Object };
        void dump_to(std::string& out, const ChunkSink* sink) const;
        std::string_view str() const;
        std::string_view key() const;
        const JsonTree* tree_ = nullptr;
        Kind kind_ = Kind::Null;
        union {
            bool b;
            int64_t i;
            uint64_t u;
            double f;
        } v_{};
        uint32_t first_ = 0, count_ = 0;          // container: kids_[first_, first_+count_)
                                                  // string: pool_[first_, first_+count_)
        uint32_t key_first_ = 0, key_count_ = 0;  // member name in pool_ (object members)
    };

    /// Parse `text` (strict JSON, as nlohmann::json::parse; a fast parser for plain ASCII
    /// traces, nlohmann's SAX parser for everything else). nullptr when nlohmann rejects it,
    /// nesting exceeds max_depth, or it is too large for 32-bit offsets.
    static std::unique_ptr<JsonTree> parse(const std::string& text, size_t max_depth = 64);
    /// The top-level value.
    const Node& root() const { return nodes_.front(); }

    JsonTree(const JsonTree&) = delete;   // nodes point at their tree
    JsonTree& operator=(const JsonTree&) = delete;

private:
    friend struct JsonTreeBuilder;
    JsonTree() = default;
    std::vector<Node> nodes_;
    std::vector<uint32_t> kids_;
    std::string pool_;
};

/// Append a double as Python's repr() / json.dumps() writes it (shortest round-trip digits;
/// fixed notation for decimal exponents -4 < e <= 16 with at least one decimal, else
/// d.ddde+XX): the trace hash's number format (formats/trace.md), which nlohmann's
/// grisu2 dump does not always match.
void append_python_float(std::string& out, double x);

/// The trace hash's canonical JSON of a nlohmann value: keys sorted, no spaces, strings as
/// nlohmann escapes them (UTF-8 kept), floats by append_python_float. Equals
/// json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).
std::string canonical_dump(const nlohmann::json& j);

}  // namespace ckpt::replay
