// The format-neutral view of a checkpoint file that every reader produces.
// A checkpoint file is a byte string; readers locate every tensor storage in it
// (a byte range) and describe every tensor as a view of one storage.
// Everything that is not a storage range (pickle, zip headers, JSON header) is
// kept verbatim by the container, so a restore can rebuild the file exactly.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "io/dtype.h"   // DType, dtype_size, dtype_name, dtype_from_name

namespace ckpt {

/// Configurable size limits for untrusted input, and the reader mode. Exceeding a limit is BadInput.
struct Limits {
    uint64_t max_header_bytes = 100'000'000;   ///< safetensors JSON header (reference reader)
    uint64_t max_pickle_bytes = 1ull << 30;    ///< data.pkl / legacy pickle
    uint64_t max_memo_entries = 1u << 24;      ///< pickle memo size
    uint64_t max_objects = 1u << 26;           ///< pickle stack + containers, total
    uint64_t max_zip_entries = 1u << 20;       ///< central-directory records
    /// Pickle globals: false (default) keeps every global that is not on the tensor allowlist as
    /// an opaque Value::Object; true refuses them like torch.load(weights_only=True)
    /// (torch/_weights_only_unpickler.py). Globals that run code on load are refused either way.
    bool strict = false;
};

/// One storage: a contiguous byte range of the input file.
struct StorageInfo {
    std::string key;              ///< torch storage key ("0", "1", ...) or safetensors tensor name
    DType dtype = DType::U8;      ///< element type of the storage
    uint64_t numel = 0;           ///< elements
    uint64_t file_offset = 0;     ///< bytes from start of file
    uint64_t nbytes = 0;          ///< == numel * dtype_size(dtype)
    /// File offsets of little-endian u32 CRC-32 fields covering exactly this range
    /// (zip local header / data descriptor / central directory). A restore that changes
    /// the bytes must rewrite them. Empty for formats without checksums.
    std::vector<uint64_t> crc_offsets;
};

/// One tensor: a strided view of a storage.
struct TensorInfo {
    std::string path;              ///< object path, '/'-joined: "optimizer/state/3/exp_avg"
    std::size_t storage = 0;       ///< index into Checkpoint::storages
    DType dtype = DType::F32;
    std::vector<int64_t> shape;    ///< elements; empty for 0-d
    std::vector<int64_t> stride;   ///< elements
    int64_t storage_offset = 0;    ///< elements
    /// Element count (product of shape; 1 for 0-d).
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
};

/// A decoded Python value from the checkpoint's object tree (pickle or safetensors header).
/// Tensors appear as Tensor{index into Checkpoint::tensors}. Objects the reader does not know
/// (argparse.Namespace, numpy scalars, a pickled nn.Module, a DeepSpeed loss scaler...) appear
/// as Object: the recorded call, never executed, with its arguments and state as Values.
struct Value {
    struct None {};
    struct Tensor { std::size_t index; };
    using List = std::vector<Value>;                              // list or tuple
    using Dict = std::vector<std::pair<Value, Value>>;            // dict / OrderedDict, insertion order
    /// An opaque Python object as the pickle describes it (CPython Lib/pickle.py load_reduce,
    /// load_newobj(_ex), load_build, load_append(s), load_setitem(s)): the global `module.name`,
    /// called (REDUCE / NEWOBJ / NEWOBJ_EX) with `args` / `kwargs` or just referenced, then
    /// given `state` by BUILD and items by APPEND(S) / SETITEM(S). Nothing here was run.
    struct Object {
        enum class Made { Global, Reduce, NewObj };   ///< bare GLOBAL reference, REDUCE, NEWOBJ(_EX)
        std::string module;    ///< as spelled in the pickle ("argparse", "numpy.core.multiarray")
        std::string name;      ///< "Namespace", "scalar"; dotted for nested classes
        Made made = Made::Global;
        List args;             ///< positional arguments of the call (empty when Made::Global)
        Dict kwargs;           ///< NEWOBJ_EX keyword arguments
        List state;            ///< BUILD states in order: usually none or one (a __dict__ dict,
                               ///< or a (dict-or-None, slots dict) tuple, or any value)
        List items;            ///< APPEND(S) items (list subclasses)
        Dict dict_items;       ///< SETITEM(S) items (dict subclasses)

        Object();                                 ///< out of line for clang 14, see below
        ~Object();
        Object(const Object&);
        Object(Object&&) noexcept;
        Object& operator=(const Object&);
        Object& operator=(Object&&) noexcept;

        std::string qualname() const { return module + "." + name; }   ///< "argparse.Namespace"
        /// An attribute from the last BUILD state that names it (its __dict__ part, then its
        /// slots part), else a SETITEM item with that str key; nullptr when absent.
        const Value* attr(const std::string& key) const;
    };
    /// An Object held by pointer and deep-copied with its Value: a Value is then 48 bytes,
    /// not the Object's ~190 (a checkpoint of 10^5 tensors has millions of Values).
    struct ObjectPtr {
        std::unique_ptr<Object> p;   ///< null only once moved from
        explicit ObjectPtr(Object o);
        ~ObjectPtr();
        ObjectPtr(const ObjectPtr&);
        ObjectPtr(ObjectPtr&&) noexcept;
        ObjectPtr& operator=(const ObjectPtr&);
        ObjectPtr& operator=(ObjectPtr&&) noexcept;
    };
    std::variant<None, bool, int64_t, double, std::string, Tensor, List, Dict, ObjectPtr> v;
    bool is_tuple = false;   ///< List came from a tuple
    bool is_bytes = false;   ///< string holds raw bytes (python bytes)

    // Special members are defined out of line (checkpoint.cpp), where Value is complete:
    // defaulted in the class, clang 14 with libstdc++ 12 in C++20 instantiates the variant's
    // constexpr destructor, hence ~vector<pair<Value, Value>>, while pair<Value, Value> is
    // still incomplete, and rejects the type. GCC accepts either form.
    Value();                                  ///< None
    ~Value();                                 ///< destroys the subtree
    Value(const Value&);                      ///< deep copy
    Value(Value&&) noexcept;                  ///< move
    Value& operator=(const Value&);           ///< deep copy
    Value& operator=(Value&&) noexcept;       ///< move

    const Value* get(const std::string& key) const;   ///< Dict lookup by str or int key text; nullptr if absent
    bool is_dict() const { return std::holds_alternative<Dict>(v); }
    bool is_list() const { return std::holds_alternative<List>(v); }
    bool is_object() const { return std::holds_alternative<ObjectPtr>(v); }
    /// nullptr unless an Object.
    const Object* object() const {
        auto o = std::get_if<ObjectPtr>(&v);
        return o ? o->p.get() : nullptr;
    }
    std::string key_text() const;   ///< str or int rendered as text (for paths); an Object's qualname

    /// Visit the direct children with their path segments: list/tuple items by index, dict
    /// values by key_text(), and an Object's parts as "@args/<i>", "@kwargs/<key>", "@state"
    /// (more BUILDs: "@state1", ...), "@items/<i>", "@dict/<key>". Dict keys are not visited.
    template <class F> void for_each_child(F&& f) const { visit_children(*this, f); }
    template <class F> void for_each_child(F&& f) { visit_children(*this, f); }

private:
    template <class V, class F> static void visit_children(V& self, F& f);
};

template <class V, class F> void Value::visit_children(V& self, F& f) {
    if (auto l = std::get_if<List>(&self.v)) {
        for (std::size_t i = 0; i < l->size(); ++i) f(std::to_string(i), (*l)[i]);
    } else if (auto d = std::get_if<Dict>(&self.v)) {
        for (auto& kv : *d) f(kv.first.key_text(), kv.second);
    } else if (auto op = std::get_if<ObjectPtr>(&self.v); op && op->p) {
        auto& o = op->p;
        for (std::size_t i = 0; i < o->args.size(); ++i) f("@args/" + std::to_string(i), o->args[i]);
        for (auto& kv : o->kwargs) f("@kwargs/" + kv.first.key_text(), kv.second);
        for (std::size_t i = 0; i < o->state.size(); ++i) f(i ? "@state" + std::to_string(i) : std::string("@state"), o->state[i]);
        for (std::size_t i = 0; i < o->items.size(); ++i) f("@items/" + std::to_string(i), o->items[i]);
        for (auto& kv : o->dict_items) f("@dict/" + kv.first.key_text(), kv.second);
    }
}

enum class Format { TorchZip, TorchLegacy, Safetensors };
const char* format_name(Format);

/// A parsed checkpoint: its storages (byte ranges of the file), tensors and object tree.
/// Readers validate every offset before returning: each storage range lies inside the
/// file, ranges do not overlap, and each tensor view lies inside its storage.
struct Checkpoint {
    std::string path;
    Format format = Format::TorchZip;
    uint64_t file_size = 0;                ///< bytes
    std::vector<StorageInfo> storages;     ///< sorted by file_offset
    std::vector<TensorInfo> tensors;
    Value root;                            ///< the unpickled object / safetensors dict (+ "__metadata__")
};

namespace io { class InputFile; }

/// Open any supported checkpoint by sniffing its first bytes. Throws BadInput.
Checkpoint read_checkpoint(const std::string& path, const Limits& = {});
/// The same over an open input (a file, or bytes in memory: io::InputFile's spans).
Checkpoint read_checkpoint(const io::InputFile&, const Limits& = {});

}  // namespace ckpt
