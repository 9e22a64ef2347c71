// JsonTree (see json_tree.h): nlohmann SAX events into flat arrays; dump() reproduces
// nlohmann::json::dump() byte for byte (the trace hash depends on it).
#include "replay/json_tree.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ckpt::replay {

using json = nlohmann::json;

struct JsonTreeBuilder : nlohmann::json_sax<json> {
    using Kind = JsonTree::Node::Kind;
    JsonTree& t;
    size_t max_depth;
    struct Frame {
        uint32_t node;
        std::vector<uint32_t> kids;
    };
    std::vector<Frame> stack;   // reused by depth
    size_t depth = 0;
    bool have_key = false;
    uint32_t key_first = 0, key_count = 0;

    JsonTreeBuilder(JsonTree& tree, size_t max) : t(tree), max_depth(max) {}

    bool fits(size_t more) const {
        return t.pool_.size() + more <= std::numeric_limits<uint32_t>::max() &&
               t.nodes_.size() < std::numeric_limits<uint32_t>::max();
    }
    // Append a node as the next child of the open container (or as the root).
    JsonTree::Node* add(Kind k) {
        if (!fits(0)) return nullptr;
        auto idx = static_cast<uint32_t>(t.nodes_.size());
        JsonTree::Node& n = t.nodes_.emplace_back();
        n.tree_ = &t;
        n.kind_ = k;
        if (have_key) {
            n.key_first_ = key_first;
            n.key_count_ = key_count;
            have_key = false;
        }
        if (depth > 0) stack[depth - 1].kids.push_back(idx);
        return &n;
    }
    bool null() override { return add(Kind::Null) != nullptr; }
    bool boolean(bool b) override {
        auto* n = add(Kind::Bool);
        return n && (n->v_.b = b, true);
    }
    bool number_integer(json::number_integer_t i) override {
        auto* n = add(Kind::Int);
        return n && (n->v_.i = i, true);
    }
    bool number_unsigned(json::number_unsigned_t u) override {
        auto* n = add(Kind::Uint);
        return n && (n->v_.u = u, true);
    }
    bool number_float(json::number_float_t f, const std::string&) override {
        auto* n = add(Kind::Float);
        return n && (n->v_.f = f, true);
    }
    bool string(std::string& s) override { return string_view(s); }
    bool string_view(std::string_view s) {
        if (!fits(s.size())) return false;
        auto* n = add(Kind::String);
        if (!n) return false;
        n->first_ = static_cast<uint32_t>(t.pool_.size());
        n->count_ = static_cast<uint32_t>(s.size());
        t.pool_ += s;
        return true;
    }
    bool binary(json::binary_t&) override { return false; }
    bool open(Kind k) {
        if (depth >= max_depth) return false;
        auto* n = add(k);
        if (!n) return false;
        if (stack.size() <= depth) stack.emplace_back();
        stack[depth].node = static_cast<uint32_t>(t.nodes_.size() - 1);
        stack[depth].kids.clear();
        ++depth;
        return true;
    }
    bool close() {
        Frame& f = stack[--depth];
        if (t.kids_.size() + f.kids.size() > std::numeric_limits<uint32_t>::max()) return false;
        JsonTree::Node& n = t.nodes_[f.node];
        n.first_ = static_cast<uint32_t>(t.kids_.size());
        n.count_ = static_cast<uint32_t>(f.kids.size());
        t.kids_.insert(t.kids_.end(), f.kids.begin(), f.kids.end());
        return true;
    }
    bool start_object(std::size_t) override { return open(Kind::Object); }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(Kind::Array); }
    bool end_array() override { return close(); }
    bool key(std::string& k) override { return key_view(k); }
    bool key_view(std::string_view k) {
        if (!fits(k.size())) return false;
        key_first = static_cast<uint32_t>(t.pool_.size());
        key_count = static_cast<uint32_t>(k.size());
        t.pool_ += k;
        have_key = true;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
        return false;
    }
};

namespace {
// A strict JSON parser for the common case of trace files (ASCII strings without escapes,
// numbers that fit int64 / uint64 / a finite double), ~5x faster than nlohmann's lexer, which
// copies every character into its token buffer. It returns false on anything it does not
// handle, valid or not (an escape, a non-ASCII byte, a huge number, a syntax error, a
// builder refusal); JsonTree::parse then parses the same text again with nlohmann's SAX
// parser, so what is accepted and the values read are exactly nlohmann's.
class FastParser {
public:
    FastParser(std::string_view text, JsonTreeBuilder& b) : p_(text.data()), end_(p_ + text.size()), b_(b) {}
    bool run() {
        if (!value()) return false;
        ws();
        return p_ == end_;
    }

private:
    void ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
    }
    bool literal(std::string_view w) {
        if (static_cast<size_t>(end_ - p_) < w.size() || std::string_view(p_, w.size()) != w) return false;
        p_ += w.size();
        return true;
    }
    // A string without escapes or non-ASCII bytes (the opening quote at p_).
    bool string(std::string_view& out) {
        const char* s = ++p_;
        while (p_ < end_) {
            auto c = static_cast<unsigned char>(*p_);
            if (c == '"') {
                out = std::string_view(s, static_cast<size_t>(p_ - s));
                ++p_;
                return true;
            }
            if (c < 0x20 || c >= 0x80 || c == '\\') return false;
            ++p_;
        }
        return false;
    }
    bool number() {
        const char* s = p_;
        bool neg = false, frac = false;
        if (*p_ == '-') neg = true, ++p_;
        if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
        if (*p_ == '0') ++p_;
        else while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        if (p_ < end_ && *p_ == '.') {
            frac = true;
            ++p_;
            if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            frac = true;
            ++p_;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
            if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        }
        if (!frac) {   // nlohmann: int64 when negative, uint64 otherwise (overflow: leave it)
            if (neg) {
                int64_t v = 0;
                auto r = std::from_chars(s, p_, v);
                return r.ec == std::errc() && r.ptr == p_ && b_.number_integer(v);
            }
            uint64_t v = 0;
            auto r = std::from_chars(s, p_, v);
            return r.ec == std::errc() && r.ptr == p_ && b_.number_unsigned(v);
        }
        double v = 0;   // from_chars is correctly rounded, as nlohmann's strtod
        auto r = std::from_chars(s, p_, v);
        if (r.ec != std::errc() || r.ptr != p_ || !std::isfinite(v)) return false;
        static std::string unused;
        return b_.number_float(v, unused);
    }
    bool value() {
        ws();
        if (p_ == end_) return false;
        switch (*p_) {
            case '{': {
                ++p_;
                if (!b_.start_object(0)) return false;
                ws();
                if (p_ < end_ && *p_ == '}') return ++p_, b_.end_object();
                while (true) {
                    ws();
                    std::string_view k;
                    if (p_ == end_ || *p_ != '"' || !string(k) || !b_.key_view(k)) return false;
                    ws();
                    if (p_ == end_ || *p_++ != ':' || !value()) return false;
                    ws();
                    if (p_ == end_) return false;
                    if (*p_ == ',') { ++p_; continue; }
                    if (*p_ == '}') return ++p_, b_.end_object();
                    return false;
                }
            }
            case '[': {
                ++p_;
                if (!b_.start_array(0)) return false;
                ws();
                if (p_ < end_ && *p_ == ']') return ++p_, b_.end_array();
                while (true) {
                    if (!value()) return false;
                    ws();
                    if (p_ == end_) return false;
                    if (*p_ == ',') { ++p_; continue; }
                    if (*p_ == ']') return ++p_, b_.end_array();
                    return false;
                }
            }
            case '"': {
                std::string_view v;
                return string(v) && b_.string_view(v);
            }
            case 't': return literal("true") && b_.boolean(true);
            case 'f': return literal("false") && b_.boolean(false);
            case 'n': return literal("null") && b_.null();
            default: return number();
        }
    }
    const char* p_;
    const char* end_;
    JsonTreeBuilder& b_;
};
}  // namespace

std::unique_ptr<JsonTree> JsonTree::parse(const std::string& text, size_t max_depth) {
    for (int pass = 0; pass < 2; ++pass) {   // the fast parser, then nlohmann's (see above)
        std::unique_ptr<JsonTree> t(new JsonTree);
        t->pool_.reserve(text.size() / 2);
        t->nodes_.reserve(text.size() / 12);   // ~1 value per 12-30 bytes of trace JSON
        t->kids_.reserve(text.size() / 12);
        JsonTreeBuilder b(*t, max_depth);
        const bool ok = pass == 0 ? FastParser(text, b).run() : json::sax_parse(text, &b);
        if (ok && !t->nodes_.empty()) return t;   // reserved, never touched pages cost no RSS
    }
    return nullptr;
}

std::string_view JsonTree::Node::str() const {
    return std::string_view(tree_->pool_).substr(first_, count_);
}

std::string_view JsonTree::Node::key() const {
    return std::string_view(tree_->pool_).substr(key_first_, key_count_);
}

const JsonTree::Node& JsonTree::Node::operator[](size_t k) const {
    if (!is_array() || k >= count_) throw Unsupported("index out of range");
    return tree_->nodes_[tree_->kids_[first_ + k]];
}

const JsonTree::Node* JsonTree::Node::find(std::string_view key) const {
    if (!is_object()) return nullptr;
    for (uint32_t k = 0; k < count_; ++k) {
        const Node& m = tree_->nodes_[tree_->kids_[first_ + k]];
        if (m.key() == key) return &m;
    }
    return nullptr;
}

template <>
uint64_t JsonTree::Node::get<uint64_t>() const {
    if (kind_ == Kind::Uint) return v_.u;
    if (kind_ == Kind::Int) return static_cast<uint64_t>(v_.i);
    throw Unsupported("not an integer");
}
template <>
int64_t JsonTree::Node::get<int64_t>() const {
    if (kind_ == Kind::Int) return v_.i;
    if (kind_ == Kind::Uint) return static_cast<int64_t>(v_.u);
    throw Unsupported("not an integer");
}
template <>
double JsonTree::Node::get<double>() const {
    if (kind_ == Kind::Float) return v_.f;
    if (kind_ == Kind::Int) return static_cast<double>(v_.i);
    if (kind_ == Kind::Uint) return static_cast<double>(v_.u);
    throw Unsupported("not a number");
}
template <>
bool JsonTree::Node::get<bool>() const {
    if (kind_ == Kind::Bool) return v_.b;
    throw Unsupported("not a boolean");
}
template <>
std::string JsonTree::Node::get<std::string>() const {
    if (kind_ == Kind::String) return std::string(str());
    throw Unsupported("not a string");
}

std::string JsonTree::Node::value(std::string_view key, const char* def) const {
    if (!is_object()) throw Unsupported("not an object");
    const Node* m = find(key);
    return m ? m->get<std::string>() : std::string(def);
}

bool JsonTree::Node::value(std::string_view key, bool def) const {
    if (!is_object()) throw Unsupported("not an object");
    const Node* m = find(key);
    return m ? m->get<bool>() : def;
}

namespace {
// A JSON string as nlohmann's dump() writes it (ensure_ascii off): printable ASCII other than
// '"' and '\' is copied; anything else goes through nlohmann (escapes, UTF-8 checks).
void dump_string(std::string& out, std::string_view s) {
    bool plain = std::all_of(s.begin(), s.end(), [](char c) {
        auto u = static_cast<unsigned char>(c);
        return u >= 0x20 && u < 0x80 && c != '"' && c != '\\';
    });
    if (plain) {
        out += '"';
        out += s;
        out += '"';
    } else {
        out += json(std::string(s)).dump();
    }
}
}  // namespace

void JsonTree::Node::dump_to(std::string& out, const ChunkSink* sink) const {
    if (sink && out.size() >= (1u << 16)) {   // hand full chunks to the sink
        (*sink)(out);
        out.clear();
    }
    switch (kind_) {
        case Kind::Null: out += "null"; return;
        case Kind::Bool: out += v_.b ? "true" : "false"; return;
        case Kind::Int: fmt::format_to(std::back_inserter(out), "{}", v_.i); return;
        case Kind::Uint: fmt::format_to(std::back_inserter(out), "{}", v_.u); return;
        case Kind::Float: append_python_float(out, v_.f); return;
        case Kind::String: dump_string(out, str()); return;
        case Kind::Array:
            out += '[';
            for (uint32_t k = 0; k < count_; ++k) {
                if (k) out += ',';
                tree_->nodes_[tree_->kids_[first_ + k]].dump_to(out, sink);
            }
            out += ']';
            return;
        case Kind::Object: {
            // nlohmann objects are std::map: members in key order (std::string comparison).
            std::vector<const Node*> m(count_);
            for (uint32_t k = 0; k < count_; ++k) m[k] = &tree_->nodes_[tree_->kids_[first_ + k]];
            std::sort(m.begin(), m.end(), [](const Node* a, const Node* b) { return a->key() < b->key(); });
            out += '{';
            for (size_t k = 0; k < m.size(); ++k) {
                if (k && m[k - 1]->key() == m[k]->key()) throw Unsupported("repeated key");
                if (k) out += ',';
                dump_string(out, m[k]->key());
                out += ':';
                m[k]->dump_to(out, sink);
            }
            out += '}';
            return;
        }
    }
}

std::string JsonTree::Node::dump() const {
    std::string out;
    out.reserve(tree_->pool_.size() + tree_->nodes_.size() * 8);
    dump_to(out, nullptr);
    return out;
}

void JsonTree::Node::dump(const ChunkSink& sink) const {
    std::string out;
    out.reserve((1u << 16) + 4096);
    dump_to(out, &sink);
    if (!out.empty()) sink(out);
}

void append_python_float(std::string& out, double x) {
    if (!std::isfinite(x)) {  // not JSON; nlohmann writes null
        out += "null";
        return;
    }
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);  // shortest
    const std::string_view sci(buf, std::size_t(r.ptr - buf));       // [-]d[.ddd]e[+-]XX
    const std::size_t e = sci.find('e');
    std::string_view mant = sci.substr(0, e);
    const int exp10 = std::stoi(std::string(sci.substr(e + 1)));
    if (!mant.empty() && mant[0] == '-') {
        out += '-';
        mant.remove_prefix(1);
    }
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    const int decpt = exp10 + 1;  // x = 0.d1d2... * 10^decpt
    const int nd = int(digits.size());
    if (decpt > -4 && decpt <= 16) {  // Python's float_repr_style 'short' rule
        if (decpt <= 0) {
            out += "0.";
            out.append(std::size_t(-decpt), '0');
            out += digits;
        } else if (decpt >= nd) {
            out += digits;
            out.append(std::size_t(decpt - nd), '0');
            out += ".0";
        } else {
            out.append(digits, 0, std::size_t(decpt));
            out += '.';
            out.append(digits, std::size_t(decpt), std::string::npos);
        }
        return;
    }
    out += digits[0];
    if (nd > 1) {
        out += '.';
        out.append(digits, 1, std::string::npos);
    }
    fmt::format_to(std::back_inserter(out), "e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
}

namespace {
void canonical_to(std::string& out, const json& j) {
    switch (j.type()) {
        case json::value_t::number_float: append_python_float(out, j.get<double>()); return;
        case json::value_t::array: {
            out += '[';
            bool first = true;
            for (const auto& v : j) {
                if (!first) out += ',';
                first = false;
                canonical_to(out, v);
            }
            out += ']';
            return;
        }
        case json::value_t::object: {  // std::map: keys already sorted
            out += '{';
            bool first = true;
            for (auto it = j.begin(); it != j.end(); ++it) {
                if (!first) out += ',';
                first = false;
                dump_string(out, it.key());
                out += ':';
                canonical_to(out, it.value());
            }
            out += '}';
            return;
        }
        default: out += j.dump(); return;  // null, bool, integers, strings
    }
}
}  // namespace

std::string canonical_dump(const json& j) {
    std::string out;
    canonical_to(out, j);
    return out;
}

}  // namespace ckpt::replay
