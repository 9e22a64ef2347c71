#include "io/pickle.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"
#include "io/name_index.h"

namespace ckpt::io {
namespace {

/// What a global is to the reader. Opaque: not on the allowlist, kept as a Value::Object.
/// KnownObject: on torch's weights_only allowlist but not modelled (sparse, quantized, meta,
/// nested, wrapper-subclass tensors), also kept as a Value::Object. Plain: an allowlisted class
/// or constant that is only referenced (torch.Tensor, torch.FloatTensor, torch.per_tensor_affine).
enum class Fn { Opaque, KnownObject, Plain, OrderedDict, Counter, RebuildTensor, RebuildV2, RebuildV3,
                RebuildParameter, RebuildParameterWithState, RebuildFromType, GetLayout, Parameter, Storage,
                UntypedStorage, Size, Device, Dtype, CodecsEncode, Set, FrozenSet, ByteArray, Complex };

struct GlobalInfo {
    Fn fn = Fn::Opaque;
    DType dtype = DType::U8;   // Storage / Dtype
};

/// Globals torch.load(weights_only=True) accepts (torch/_weights_only_unpickler.py
/// _get_allowed_globals, torch/_utils.py rebuild functions, torch/storage.py storage and dtype
/// maps). nullopt for anything else.
std::optional<GlobalInfo> lookup_global(const std::string& module, const std::string& name) {
    if (module == "collections") {
        if (name == "OrderedDict") return GlobalInfo{Fn::OrderedDict};
        if (name == "Counter") return GlobalInfo{Fn::Counter};
        return std::nullopt;
    }
    if (module == "torch._utils") {
        if (name == "_rebuild_tensor") return GlobalInfo{Fn::RebuildTensor};
        if (name == "_rebuild_tensor_v2") return GlobalInfo{Fn::RebuildV2};
        if (name == "_rebuild_tensor_v3") return GlobalInfo{Fn::RebuildV3};
        if (name == "_rebuild_parameter") return GlobalInfo{Fn::RebuildParameter};
        if (name == "_rebuild_parameter_with_state") return GlobalInfo{Fn::RebuildParameterWithState};
        static const char* objects[] = {"_rebuild_sparse_tensor", "_rebuild_sparse_csr_tensor", "_rebuild_qtensor",
                                        "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass",
                                        "_rebuild_nested_tensor", "_rebuild_device_tensor_from_numpy",
                                        "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_xla_tensor"};
        for (auto n : objects)
            if (name == n) return GlobalInfo{Fn::KnownObject};
        return std::nullopt;
    }
    if (module == "torch._tensor" && name == "_rebuild_from_type_v2") return GlobalInfo{Fn::RebuildFromType};
    if (module == "torch.serialization" && name == "_get_layout") return GlobalInfo{Fn::GetLayout};
    if (module == "torch.nn.parameter" && name == "Parameter") return GlobalInfo{Fn::Parameter};
    if (module == "torch.storage" && name == "UntypedStorage") return GlobalInfo{Fn::UntypedStorage, DType::U8};
    if (module == "torch.storage" && name == "TypedStorage") return GlobalInfo{Fn::Plain};
    if (module == "torch" || module == "torch.cuda" || module == "torch.sparse") {
        // Tensor classes (torch._tensor_classes), only ever referenced.
        static const char* tensor_classes[] = {"DoubleTensor", "FloatTensor", "HalfTensor", "BFloat16Tensor",
                                               "LongTensor", "IntTensor", "ShortTensor", "CharTensor", "ByteTensor",
                                               "BoolTensor", "ComplexFloatTensor", "ComplexDoubleTensor"};
        for (auto n : tensor_classes)
            if (name == n) return GlobalInfo{Fn::Plain};
    }
    if (module == "torch") {
        static const std::pair<const char*, DType> storages[] = {
            {"FloatStorage", DType::F32}, {"DoubleStorage", DType::F64}, {"HalfStorage", DType::F16},
            {"BFloat16Storage", DType::BF16}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
            {"ShortStorage", DType::I16}, {"CharStorage", DType::I8}, {"ByteStorage", DType::U8},
            {"BoolStorage", DType::Bool}, {"ComplexFloatStorage", DType::C64},
            {"ComplexDoubleStorage", DType::C128}, {"QInt8Storage", DType::QI8}, {"QUInt8Storage", DType::QU8},
            {"QInt32Storage", DType::QI32}, {"QUInt4x2Storage", DType::QU4X2}, {"QUInt2x4Storage", DType::QU2X4}};
        for (auto& [n, d] : storages)
            if (name == n) return GlobalInfo{Fn::Storage, d};
        if (name == "UntypedStorage") return GlobalInfo{Fn::UntypedStorage, DType::U8};
        if (name == "Size") return GlobalInfo{Fn::Size};
        if (name == "device") return GlobalInfo{Fn::Device};
        if (name == "Tensor") return GlobalInfo{Fn::Plain};
        static const std::pair<const char*, DType> dtypes[] = {
            {"float32", DType::F32}, {"float", DType::F32}, {"float64", DType::F64}, {"double", DType::F64},
            {"float16", DType::F16}, {"half", DType::F16}, {"bfloat16", DType::BF16}, {"int64", DType::I64},
            {"long", DType::I64}, {"int32", DType::I32}, {"int", DType::I32}, {"int16", DType::I16},
            {"short", DType::I16}, {"int8", DType::I8}, {"uint8", DType::U8}, {"bool", DType::Bool},
            {"complex64", DType::C64}, {"cfloat", DType::C64}, {"complex128", DType::C128},
            {"cdouble", DType::C128}, {"complex32", DType::C32}, {"chalf", DType::C32},
            {"float8_e5m2", DType::F8_E5M2}, {"float8_e4m3fn", DType::F8_E4M3},
            {"float8_e5m2fnuz", DType::F8_E5M2FNUZ}, {"float8_e4m3fnuz", DType::F8_E4M3FNUZ},
            {"float8_e8m0fnu", DType::F8_E8M0}, {"float4_e2m1fn_x2", DType::F4_E2M1X2},
            {"uint16", DType::U16}, {"uint32", DType::U32}, {"uint64", DType::U64},
            {"qint8", DType::QI8}, {"quint8", DType::QU8}, {"qint32", DType::QI32}, {"quint4x2", DType::QU4X2},
            {"quint2x4", DType::QU2X4}, {"bits8", DType::Bits8}, {"bits16", DType::Bits16},
            {"bits1x8", DType::Bits1x8}, {"bits2x4", DType::Bits2x4}, {"bits4x2", DType::Bits4x2}};
        for (auto& [n, d] : dtypes)
            if (name == n) return GlobalInfo{Fn::Dtype, d};
        // torch.uint1..uint7 / int1..int7 (sub-byte shells, one byte per element in a storage)
        if (name.size() == 5 && name.compare(0, 4, "uint") == 0 && name[4] >= '1' && name[4] <= '7')
            return GlobalInfo{Fn::Dtype, DType::U1_7};
        if (name.size() == 4 && name.compare(0, 3, "int") == 0 && name[3] >= '1' && name[3] <= '7')
            return GlobalInfo{Fn::Dtype, DType::I1_7};
        static const char* qschemes[] = {"per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                                         "per_channel_symmetric", "per_channel_affine_float_qparams"};
        for (auto n : qschemes)
            if (name == n) return GlobalInfo{Fn::Plain};
        return std::nullopt;
    }
    if (module == "_codecs" && name == "encode") return GlobalInfo{Fn::CodecsEncode};
    if (module == "builtins" || module == "__builtin__") {
        if (name == "set") return GlobalInfo{Fn::Set};
        if (name == "frozenset") return GlobalInfo{Fn::FrozenSet};
        if (name == "bytearray") return GlobalInfo{Fn::ByteArray};
        if (name == "complex") return GlobalInfo{Fn::Complex};
    }
    return std::nullopt;
}

bool in_module(const std::string& module, const char* m) {
    const std::size_t n = std::strlen(m);
    return module.compare(0, n, m) == 0 && (module.size() == n || module[n] == '.');
}

/// True when importing `module` and fetching `name` from it (pickle's find_class, which for
/// protocol >= 4 walks a dotted name attribute by attribute) and then calling it can run code
/// when the restored file is torch.load-ed: torch's own blocklist (_weights_only_unpickler.py
/// _blocklisted_modules), picklescan's and fickling's unsafe globals, and the torch helpers
/// that load or exec nested data (torch/storage.py _load_from_bytes, torch/fx/graph_module.py
/// reduce_graph_module).
bool runs_code(std::string module, const std::string& name) {
    if (module == "__builtin__" || module == "exceptions") module = "builtins";   // pickle's IMPORT_MAPPING
    static const char* modules[] = {
        "os", "posix", "nt", "sys", "subprocess", "commands", "popen2", "importlib", "runpy", "pty", "socket",
        "socketserver", "shutil", "webbrowser", "pickle", "_pickle", "cPickle", "marshal", "pdb", "bdb", "code",
        "codeop", "ctypes", "_ctypes", "multiprocessing", "asyncio", "signal", "timeit", "trace", "profile",
        "cProfile", "doctest", "pydoc", "antigravity", "idlelib", "tkinter", "turtle", "ensurepip", "pip",
        "venv", "distutils", "setuptools", "dill", "cloudpickle", "joblib", "jsonpickle", "yaml", "httplib",
        "http.client", "urllib.request", "urllib2", "requests", "aiohttp", "ftplib", "smtplib", "telnetlib",
        "xmlrpc", "torch.hub", "torch.jit", "torch.package", "torch.fx.graph_module", "torch.utils.cpp_extension",
        "torch._dynamo", "torch._inductor", "numpy.f2py", "numpy.distutils", "numpy.testing", "pandas.io.pickle"};
    for (auto m : modules)
        if (in_module(module, m)) return true;
    static const char* full[] = {
        "builtins.eval", "builtins.exec", "builtins.execfile", "builtins.compile", "builtins.__import__",
        "builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.open", "builtins.file",
        "builtins.breakpoint", "builtins.apply", "builtins.input", "builtins.raw_input", "builtins.globals",
        "builtins.locals", "builtins.vars", "builtins.help", "builtins.exit", "builtins.quit", "builtins.reload",
        "operator.attrgetter", "operator.methodcaller", "functools.reduce", "torch.load",
        "torch.serialization.load", "torch.serialization._load", "torch.serialization._legacy_load",
        "torch.storage._load_from_bytes", "numpy.load", "numpy.lib.npyio.load", "pandas.read_pickle",
        "types.CodeType", "types.FunctionType", "types.LambdaType", "types.MethodType", "types.ModuleType"};
    const std::string qual = module + "." + name;
    for (auto f : full)
        if (qual == f) return true;
    if (name.find('.') == std::string::npos) return false;
    // Dotted names reach attributes of the module: refuse any path through a dunder or an
    // imported dangerous module (torch.os.system, argparse._os.system, x.__class__.__base__).
    static const char* parts[] = {"os", "posix", "nt", "sys", "subprocess", "builtins", "__builtins__",
                                  "importlib", "pickle", "marshal", "socket", "shutil", "runpy", "pty", "ctypes"};
    std::size_t b = 0;
    for (;;) {
        std::size_t e = name.find('.', b);
        std::string part = name.substr(b, e == std::string::npos ? std::string::npos : e - b);
        if (part.size() >= 4 && part.compare(0, 2, "__") == 0 && part.compare(part.size() - 2, 2, "__") == 0)
            return true;
        std::string bare = part.substr(std::min(part.find_first_not_of('_'), part.size()));
        for (auto p : parts)
            if (part == p || bare == p) return true;
        if (runs_code(module, part)) return true;   // the same name without the dots
        if (e == std::string::npos) return false;
        b = e + 1;
    }
}

/// Python objects live in an arena and refer to each other by index, so hostile nesting
/// or cycles can neither overflow the stack on destruction nor leak.
/// 32 bytes: a checkpoint of 10^5 tensors has millions of them, most of them ints, tuples
/// and short strings, so strings and items live in side tables (Unpickler::str / items).
struct Obj {
    enum Kind : uint8_t { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Set, Tensor, Global, Storage, Object };
    Kind kind = None;
    bool b = false;
    uint32_t s = 0;       // Str / Bytes; Global / Object ("module.name"): 1 + index into strings_ (0: "")
    GlobalInfo global;    // Global / Object: what its global is
    union {
        int64_t i = 0;    // Int; Global / Object: length of the module part of s
        double d;         // Float
    };
    std::size_t index = 0;  // Tensor / Storage index; Object: index into parts_; List / Tuple / Set / Dict:
                            // 1 + index into lists_ (0: no items; Dict: k0, v0, k1, v1, ...)
};
static_assert(sizeof(Obj) == 32);

/// Append-only storage whose elements never move (a first chunk of 256, then chunks of
/// 4096): growing it copies nothing (a vector of 10^6 objects would move them ~20 times),
/// a reference to an element stays valid while more are appended, and a small pickle
/// allocates a small chunk.
template <class T>
class Arena {
public:
    T& operator[](std::size_t i) { return i < kFirst ? first_[i] : chunks_[(i - kFirst) >> kShift][(i - kFirst) & kMask]; }
    const T& operator[](std::size_t i) const {
        return i < kFirst ? first_[i] : chunks_[(i - kFirst) >> kShift][(i - kFirst) & kMask];
    }
    std::size_t size() const { return size_; }
    void push_back(T&& x) {
        if (size_ == 0) first_.reset(new T[kFirst]);
        if (size_ >= kFirst && ((size_ - kFirst) & kMask) == 0) chunks_.emplace_back(new T[kChunk]);
        (*this)[size_] = std::move(x);
        ++size_;
    }

private:
    static constexpr std::size_t kFirst = 256, kShift = 12, kChunk = std::size_t(1) << kShift, kMask = kChunk - 1;
    std::unique_ptr<T[]> first_;
    std::vector<std::unique_ptr<T[]>> chunks_;
    std::size_t size_ = 0;
};

/// The recorded construction of an opaque object (Value::Object before conversion).
struct Parts {
    Value::Object::Made made = Value::Object::Made::Global;
    std::vector<std::size_t> args, kwargs, states, items, kv;   // kwargs / kv: k0, v0, k1, v1, ...
};

constexpr std::size_t kNoView = ~std::size_t(0);
constexpr std::size_t kNoMemo = ~std::size_t(0);

class Unpickler {
public:
    Unpickler(RangeReader& in, const Limits& limits, PersistentIds ids) : in_(in), limits_(limits), ids_(ids) {}

    PickleResult run();

private:
    [[noreturn]] void fail(const std::string& msg) const {
        throw BadInput(in_.file().path(), fmt::format("pickle at offset {}: {}", op_offset_, msg));
    }
    std::size_t make(Obj o) {
        if (arena_.size() >= max_objects_) fail(fmt::format("more than {} objects (limit)", max_objects_));
        arena_.push_back(std::move(o));
        return arena_.size() - 1;
    }
    std::size_t make_kind(Obj::Kind k) { Obj o; o.kind = k; return make(std::move(o)); }
    std::size_t make_int(int64_t v) {
        Obj o;
        o.kind = Obj::Int;
        o.i = v;
        return v >= 0 && v < 256 ? make_shared(3 + std::size_t(v), o) : make(std::move(o));
    }
    std::size_t make_bool(bool b) {
        Obj o;
        o.kind = Obj::Bool;
        o.b = b;
        return make_shared(1 + std::size_t(b), o);
    }
    std::size_t make_none() { return make_shared(0, Obj{}); }
    /// None, False, True and the ints 0..255 are made once and shared (they never change;
    /// CPython shares them too): a state_dict repeats them for every tensor.
    std::size_t make_shared(std::size_t slot, const Obj& o) {
        if (!shared_[slot]) shared_[slot] = make(Obj(o)) + 1;
        return shared_[slot] - 1;
    }
    std::size_t shared_[3 + 256] = {};   ///< 1 + arena index; 0: not made yet
    std::size_t make_float(double v) { Obj o; o.kind = Obj::Float; o.d = v; return make(std::move(o)); }
    std::size_t make_str(Obj::Kind k, std::string s) { Obj o; o.kind = k; o.s = new_str(std::move(s)); return make(std::move(o)); }
    /// The string of a Str / Bytes / Global / Object ("" when it has none).
    const std::string& str(const Obj& o) const { return o.s ? strings_[o.s - 1] : kEmptyStr; }
    uint32_t new_str(std::string s) {
        strings_.push_back(std::move(s));
        return uint32_t(strings_.size());
    }
    /// The items of a List / Tuple / Set / Dict, read-only, and of object `id` to fill in.
    const std::vector<std::size_t>& items(const Obj& o) const { return o.index ? lists_[o.index - 1] : kNoItems; }
    std::vector<std::size_t>& items_of(std::size_t id) {
        Obj& o = arena_[id];
        if (!o.index) {
            lists_.push_back({});
            o.index = lists_.size();
        }
        return lists_[o.index - 1];
    }
    void push(std::size_t id) {
        if (stack_.size() + marks_.size() >= limits_.max_objects) fail("stack exceeds the object limit");
        stack_.push_back(id);
    }
    std::size_t pop() {
        if (stack_.size() <= floor()) fail("stack underflow");
        std::size_t v = stack_.back();
        stack_.pop_back();
        return v;
    }
    std::size_t top() {
        if (stack_.size() <= floor()) fail("stack underflow");
        return stack_.back();
    }
    std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
    /// Items above the last MARK, removing them and the mark.
    std::vector<std::size_t> pop_mark() {
        if (marks_.empty()) fail("opcode needs a MARK but none is open");
        std::size_t m = marks_.back();
        marks_.pop_back();
        std::vector<std::size_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
        stack_.resize(m);
        return items;
    }
    std::string counted(uint64_t n, const char* what) {
        if (n > in_.remaining())
            fail(fmt::format("{} length {} exceeds the {} bytes left", what, n, in_.remaining()));
        return in_.string(static_cast<std::size_t>(n), "pickle");
    }
    uint64_t le(int n) {
        uint8_t b[8] = {};
        in_.read(b, static_cast<std::size_t>(n), "pickle");
        uint64_t v = 0;
        for (int k = n - 1; k >= 0; --k) v = (v << 8) | b[k];
        return v;
    }
    /// The argument line of a protocol-0 text opcode (INT, LONG, FLOAT, PUT, GET).
    std::string text_arg(const char* what) { return in_.line(256, what); }
    uint64_t text_index(const char* what) {
        const std::string t = text_arg(what);
        uint64_t v = 0;
        if (t.empty() || t.size() > 19) fail(fmt::format("{} index '{}' is not a number", what, t.substr(0, 20)));
        for (char c : t) {
            if (c < '0' || c > '9') fail(fmt::format("{} index '{}' is not a number", what, t.substr(0, 20)));
            v = v * 10 + static_cast<uint64_t>(c - '0');
        }
        return v;
    }
    std::size_t text_int(std::string t, bool is_long);
    // The memo: keys are 0, 1, 2, ... in every pickler (MEMOIZE stores at the memo's
    // size), so they go to a vector that grows while a key lies within twice its size
    // (memory stays proportional to the entries); any other key goes to a map. A key is in
    // one of the two: a map key that the vector comes to cover moves there when stored.
    void memo_put(uint64_t idx, std::size_t id) {
        const bool dense = idx < 2 * memo_dense_.size() + 1024;
        bool fresh;
        if (dense) {
            fresh = idx >= memo_dense_.size() || memo_dense_[idx] == kNoMemo;
            if (fresh && !memo_.empty() && memo_.erase(idx)) fresh = false;
        } else {
            fresh = !memo_.count(idx);
        }
        if (fresh && memo_count_ >= limits_.max_memo_entries)
            fail(fmt::format("memo exceeds {} entries (limit)", limits_.max_memo_entries));
        memo_count_ += fresh;
        if (dense) {
            if (idx >= memo_dense_.size()) memo_dense_.resize(idx + 1, kNoMemo);
            memo_dense_[idx] = id;
        } else {
            memo_[idx] = id;
        }
    }
    std::size_t memo_get(uint64_t idx) {
        if (idx < memo_dense_.size() && memo_dense_[idx] != kNoMemo) return memo_dense_[idx];
        auto it = memo_.find(idx);
        if (it == memo_.end()) fail(fmt::format("memo key {} was never stored", idx));
        return it->second;
    }
    void check_hashable(std::size_t k) {
        auto kind = arena_[k].kind;
        if (kind == Obj::List || kind == Obj::Dict || kind == Obj::Set)
            fail("unhashable dict key (list, dict or set)");
    }
    /// SETITEM(S): into a dict, or recorded on an opaque object (a dict subclass).
    void set_items(std::size_t dict, const std::vector<std::size_t>& kv) {
        const auto kind = arena_[dict].kind;
        if (kind != Obj::Dict && kind != Obj::Object) fail("SETITEM(S) on an object that is not a dict");
        if (kv.size() % 2) fail("SETITEMS with an odd number of items");
        for (std::size_t k = 0; k < kv.size(); k += 2) check_hashable(kv[k]);
        auto& dst = kind == Obj::Dict ? items_of(dict) : parts_[arena_[dict].index].kv;
        dst.insert(dst.end(), kv.begin(), kv.end());
    }
    /// APPEND(S): onto a list, or recorded on an opaque object (a list subclass).
    void append_items(std::size_t list, const std::vector<std::size_t>& items, const char* op) {
        const auto kind = arena_[list].kind;
        if (kind != Obj::List && kind != Obj::Object) fail(fmt::format("{} to an object that is not a list", op));
        auto& dst = kind == Obj::List ? items_of(list) : parts_[arena_[list].index].items;
        dst.insert(dst.end(), items.begin(), items.end());
    }
    std::size_t long_from_bytes(const std::string& b);
    std::size_t global(std::string module, std::string name);
    std::size_t call(std::size_t fn, std::size_t args, Value::Object::Made made, std::size_t kwargs, const char* op);
    /// getattr(cls, name) with cls an opaque class and name a public identifier: the global
    /// cls.name (an enum member); anything else is refused as code-running.
    std::size_t enum_member(std::size_t args, const char* op, const std::string& spelled);
    std::size_t record(std::size_t fn, std::size_t args, Value::Object::Made made, std::size_t kwargs);
    std::size_t reduce(std::size_t fn, std::size_t args);
    std::size_t make_tensor(const std::string& fn, const std::vector<std::size_t>& a, std::optional<std::size_t> dtype);
    std::size_t persistent(std::size_t pid);
    const std::vector<std::size_t>& tuple_items(std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Tuple && arena_[id].kind != Obj::List) fail(fmt::format("{} must be a tuple", what));
        return items(arena_[id]);
    }
    int64_t as_int(std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Int) fail(fmt::format("{} must be an int", what));
        return arena_[id].i;
    }
    const std::string& as_str(std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Str) fail(fmt::format("{} must be a str", what));
        return str(arena_[id]);
    }
    std::vector<int64_t> int_tuple(std::size_t id, const char* what) {
        std::vector<int64_t> out;
        for (auto e : tuple_items(id, what)) out.push_back(as_int(e, what));
        return out;
    }
    Value convert(std::size_t id, int depth);
    Value::List convert_all(const std::vector<std::size_t>& ids, int depth) {
        Value::List l;
        l.reserve(ids.size());
        for (auto e : ids) l.push_back(convert(e, depth + 1));
        return l;
    }
    Value::Dict convert_pairs(const std::vector<std::size_t>& kv, int depth) {
        Value::Dict d;
        d.reserve(kv.size() / 2);  // no regrowth: a large state_dict would be copied and faulted again
        for (std::size_t k = 0; k + 1 < kv.size(); k += 2)
            d.emplace_back(convert(kv[k], depth + 1), convert(kv[k + 1], depth + 1));
        return d;
    }

    RangeReader& in_;
    const Limits& limits_;
    PersistentIds ids_;
    uint64_t op_offset_ = 0;
    Arena<Obj> arena_;
    Arena<std::string> strings_;                   ///< Obj::s
    Arena<std::vector<std::size_t>> lists_;        ///< Obj::index of containers
    inline static const std::string kEmptyStr;
    inline static const std::vector<std::size_t> kNoItems;
    /// limits_.max_objects, at most 2^32 - 2 (Obj::s indexes strings with 32 bits)
    const uint64_t max_objects_ = std::min<uint64_t>(limits_.max_objects, UINT32_MAX - 1);
    std::vector<Parts> parts_;
    std::vector<std::size_t> stack_;
    std::vector<std::size_t> marks_;
    std::unordered_map<uint64_t, std::size_t> memo_;   // keys off the dense run
    std::vector<std::size_t> memo_dense_;
    uint64_t memo_count_ = 0;
    PickleResult res_;
    NameIndex storage_by_key_;   // key -> res_.storages position
    std::vector<std::size_t> storage_view_;   // per storage: tensor index of its whole-storage view
    uint64_t converted_ = 0, convert_budget_ = 0;
};

std::size_t Unpickler::long_from_bytes(const std::string& b) {
    // Two's complement little-endian. Values beyond int64 are rendered as a double.
    if (b.empty()) return make_int(0);
    bool neg = static_cast<uint8_t>(b.back()) & 0x80;
    if (b.size() <= 8) {
        uint64_t v = 0;
        for (std::size_t k = b.size(); k-- > 0;) v = (v << 8) | static_cast<uint8_t>(b[k]);
        if (neg && b.size() < 8) v |= ~uint64_t(0) << (8 * b.size());
        return make_int(static_cast<int64_t>(v));
    }
    double d = 0;
    for (std::size_t k = b.size(); k-- > 0;) {
        uint8_t byte = static_cast<uint8_t>(b[k]);
        d = d * 256.0 + (neg ? static_cast<uint8_t>(~byte) : byte);
    }
    return make_float(neg ? -(d + 1) : d);
}

std::size_t Unpickler::text_int(std::string t, bool is_long) {
    // INT: "00"/"01" are False/True (protocol 0 bools); LONG ends in 'L'. Decimal only: CPython's
    // writers never emit another base. Values beyond int64 are rendered as a double.
    if (!is_long && (t == "00" || t == "01")) {
        return make_bool(t == "01");
    }
    if (is_long && !t.empty() && t.back() == 'L') t.pop_back();
    std::size_t k = 0;
    bool neg = false;
    if (k < t.size() && (t[k] == '-' || t[k] == '+')) neg = t[k++] == '-';
    if (k == t.size()) fail(fmt::format("{} argument '{}' is not a decimal integer", is_long ? "LONG" : "INT", t.substr(0, 20)));
    uint64_t v = 0;
    double d = 0;
    bool big = false;
    for (; k < t.size(); ++k) {
        if (t[k] < '0' || t[k] > '9')
            fail(fmt::format("{} argument '{}' is not a decimal integer", is_long ? "LONG" : "INT", t.substr(0, 20)));
        unsigned digit = static_cast<unsigned>(t[k] - '0');
        d = d * 10 + digit;
        if (!big && (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, digit, &v))) big = true;
    }
    if (big || v > (neg ? uint64_t(1) << 63 : (uint64_t(1) << 63) - 1)) return make_float(neg ? -d : d);
    return make_int(neg ? static_cast<int64_t>(~v + 1) : static_cast<int64_t>(v));
}

std::size_t Unpickler::global(std::string module, std::string name) {
    std::string full = module + "." + name;
    for (char& ch : full)
        if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    const bool getattr_global = (module == "builtins" || module == "__builtin__") && name == "getattr" && !limits_.strict;
    if (runs_code(module, name) && !getattr_global)
        fail(fmt::format("pickle global {} is not allowed: it can run code when the file is loaded", full));
    auto info = getattr_global ? std::optional<GlobalInfo>(GlobalInfo{}) : lookup_global(module, name);
    if (!info && limits_.strict)
        fail(fmt::format("pickle global {} is not allowed in strict mode (only torch.load(weights_only=True) "
                         "globals)", full));
    Obj o;
    o.kind = Obj::Global;
    o.global = info.value_or(GlobalInfo{});
    o.i = static_cast<int64_t>(module.size());
    o.s = new_str(full == "torch.float" ? "torch.float32" : full);
    if (full == "torch.float") o.i = 5;
    return make(std::move(o));
}

std::size_t Unpickler::persistent(std::size_t pid) {
    if (ids_ == PersistentIds::None) fail("persistent id not allowed in this pickle");
    const auto t = tuple_items(pid, "persistent id");
    std::size_t want = ids_ == PersistentIds::TorchZip ? 5 : 6;
    if (t.size() != want) fail(fmt::format("persistent id has {} fields, expected {}", t.size(), want));
    if (as_str(t[0], "persistent id tag") != "storage") fail("persistent id tag is not 'storage'");
    const Obj& cls = arena_[t[1]];
    if (cls.kind != Obj::Global || (cls.global.fn != Fn::Storage && cls.global.fn != Fn::UntypedStorage))
        fail("persistent id storage type is not a torch storage class");
    PickleStorage st;
    st.dtype = cls.global.dtype;
    st.key = as_str(t[2], "storage key");
    st.location = as_str(t[3], "storage location");
    int64_t numel = as_int(t[4], "storage numel");
    if (numel < 0) fail(fmt::format("storage '{}' has negative size {}", st.key, numel));
    st.numel = static_cast<uint64_t>(numel);
    if (want == 6 && arena_[t[5]].kind != Obj::None)
        fail(fmt::format("storage '{}' is a legacy storage view, which is not supported", st.key));
    const std::size_t index = storage_by_key_.insert(st.key, res_.storages.size(), [&](std::size_t k) -> const std::string& {
        return res_.storages[k].key;
    });
    if (index != res_.storages.size()) {
        const auto& prev = res_.storages[index];
        if (prev.dtype != st.dtype || prev.numel != st.numel)
            fail(fmt::format("storage '{}' is declared twice with different type or size", st.key));
    } else {
        res_.storages.push_back(std::move(st));
        storage_view_.push_back(kNoView);
    }
    Obj o;
    o.kind = Obj::Storage;
    o.index = index;
    return make(std::move(o));
}

/// A strided view: torch/_utils.py _rebuild_tensor(storage, storage_offset, size, stride),
/// _v2 (+ requires_grad, backward_hooks[, metadata]) and _v3 (+ dtype[, metadata]; the storage
/// is then an UntypedStorage counted in bytes). `dtype` is the index of v3's dtype argument.
std::size_t Unpickler::make_tensor(const std::string& fn, const std::vector<std::size_t>& a,
                                   std::optional<std::size_t> dtype) {
    if (arena_[a[0]].kind != Obj::Storage) fail(fmt::format("{} argument 0 is not a storage", fn));
    PickleTensor t;
    t.storage = arena_[a[0]].index;
    t.dtype = res_.storages[t.storage].dtype;
    t.storage_offset = as_int(a[1], "tensor storage offset");
    t.shape = int_tuple(a[2], "tensor size");
    t.stride = int_tuple(a[3], "tensor stride");
    if (t.shape.size() != t.stride.size())
        fail(fmt::format("tensor size has {} dims but stride has {}", t.shape.size(), t.stride.size()));
    if (a.size() > 4 && arena_[a[4]].kind != Obj::Bool) fail("tensor requires_grad must be a bool");
    if (dtype) {
        const Obj& dt = arena_[a[*dtype]];
        if (dt.kind != Obj::Global || dt.global.fn != Fn::Dtype) fail(fmt::format("{} dtype is not a torch dtype", fn));
        t.dtype = dt.global.dtype;
    }
    Obj o;
    o.kind = Obj::Tensor;
    o.index = res_.tensors.size();
    res_.tensors.push_back(std::move(t));
    return make(std::move(o));
}

/// An opaque object: `fn` called with `args` (a tuple) and `kwargs` (a dict or kNoView), recorded.
std::size_t Unpickler::record(std::size_t fn, std::size_t args, Value::Object::Made made, std::size_t kwargs) {
    Parts p;
    p.made = made;
    p.args = items(arena_[args]);
    if (kwargs != kNoView) p.kwargs = items(arena_[kwargs]);
    parts_.push_back(std::move(p));
    Obj o;
    o.kind = Obj::Object;
    o.s = arena_[fn].s;
    o.i = arena_[fn].i;
    o.global = arena_[fn].global;
    o.index = parts_.size() - 1;
    return make(std::move(o));
}

/// REDUCE / NEWOBJ / NEWOBJ_EX: `fn` must be a global. Allowlisted ones are modelled (tensors,
/// dicts, sizes...), everything else is recorded as an opaque object; nothing is called.
std::size_t Unpickler::enum_member(std::size_t args, const char* op, const std::string& spelled) {
    const auto& a = arena_[args];
    const std::string refuse = "pickle global " + spelled + " is not allowed: it can run code when the file is loaded";
    if (std::string(op) != "REDUCE" || a.kind != Obj::Tuple || items(a).size() != 2) fail(refuse);
    const Obj& cls = arena_[items(a)[0]];
    const Obj& attr = arena_[items(a)[1]];
    const std::string &c = str(cls), &at = str(attr);
    if (cls.kind != Obj::Global || cls.global.fn != Fn::Opaque || attr.kind != Obj::Str || at.empty() ||
        at[0] == '_' || at.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos)
        fail(refuse);
    const std::string module = c.substr(0, std::size_t(cls.i)), name = c.substr(std::size_t(cls.i) + 1) + "." + at;
    if (runs_code(module, name)) fail(refuse);
    return global(module, name);
}

std::size_t Unpickler::call(std::size_t fn, std::size_t args, Value::Object::Made made, std::size_t kwargs,
                            const char* op) {
    if (arena_[fn].kind != Obj::Global) fail(fmt::format("{} on an object that is not a global (a class or function)", op));
    if (arena_[args].kind != Obj::Tuple)
        fail(fmt::format("{} of {} with arguments that are not a tuple", op, str(arena_[fn])));
    if (kwargs != kNoView && arena_[kwargs].kind != Obj::Dict)
        fail(fmt::format("{} of {} with keyword arguments that are not a dict", op, str(arena_[fn])));
    const std::string& name = str(arena_[fn]);
    if (name == "builtins.getattr" || name == "__builtin__.getattr") return enum_member(args, op, name);
    const Fn f = arena_[fn].global.fn;
    if (f == Fn::Opaque || f == Fn::KnownObject || f == Fn::Plain || (kwargs != kNoView && !items(arena_[kwargs]).empty()))
        return record(fn, args, made, kwargs);
    return reduce(fn, args);
}

std::size_t Unpickler::reduce(std::size_t fn_id, std::size_t args_id) {
    const Obj& fn = arena_[fn_id];
    const std::vector<std::size_t> a = items(arena_[args_id]);
    const std::string name = str(fn);
    auto nargs = [&](std::size_t lo, std::size_t hi) {
        if (a.size() < lo || a.size() > hi)
            fail(fmt::format("{} called with {} arguments", name, a.size()));
    };
    auto tensor_like = [&](std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Tensor && arena_[id].kind != Obj::Object)
            fail(fmt::format("{} argument 0 is not a tensor", what));
        return id;
    };
    switch (fn.global.fn) {
    case Fn::OrderedDict: {
        nargs(0, 1);
        std::size_t d = make_kind(Obj::Dict);
        if (a.size() == 1) {
            for (auto pair : std::vector<std::size_t>(tuple_items(a[0], "OrderedDict items"))) {
                auto kv = tuple_items(pair, "OrderedDict item");
                if (kv.size() != 2) fail("OrderedDict item is not a pair");
                set_items(d, kv);
            }
        }
        return d;
    }
    case Fn::Counter: {   // collections.Counter.__reduce__: (Counter, (dict(self),))
        nargs(0, 1);
        std::size_t d = make_kind(Obj::Dict);
        if (a.size() == 1) {
            if (arena_[a[0]].kind != Obj::Dict) fail("collections.Counter argument must be a dict");
            items_of(d) = items(arena_[a[0]]);
        }
        return d;
    }
    case Fn::RebuildTensor:
        nargs(4, 4);
        return make_tensor(name, a, std::nullopt);
    case Fn::RebuildV2:
        nargs(6, 7);
        return make_tensor(name, a, std::nullopt);
    case Fn::RebuildV3:
        nargs(7, 8);
        return make_tensor(name, a, 6);
    case Fn::RebuildParameter:   // (data, requires_grad, backward_hooks)
        nargs(3, 3);
        return tensor_like(a[0], "_rebuild_parameter");
    case Fn::RebuildParameterWithState:   // (data, requires_grad, backward_hooks, state): state dropped
        nargs(4, 4);
        return tensor_like(a[0], "_rebuild_parameter_with_state");
    case Fn::Parameter:   // torch.nn.Parameter(data[, requires_grad])
        nargs(1, 2);
        return tensor_like(a[0], "torch.nn.parameter.Parameter");
    case Fn::RebuildFromType: {
        // torch/_tensor.py _rebuild_from_type_v2(func, new_type, args, state): func(*args),
        // then as_subclass(new_type) and the Python attributes in state. A plain Tensor or
        // Parameter is the tensor itself; a subclass is kept as an object holding it.
        nargs(4, 4);
        const Obj& func = arena_[a[0]];
        if (func.kind != Obj::Global || arena_[a[2]].kind != Obj::Tuple)
            fail("_rebuild_from_type_v2 needs a global function and an argument tuple");
        const Obj& type = arena_[a[1]];
        const bool plain = type.kind == Obj::Global && (str(type) == "torch.Tensor" || type.global.fn == Fn::Parameter);
        std::size_t inner = call(a[0], a[2], Value::Object::Made::Reduce, kNoView, "_rebuild_from_type_v2");
        if (plain && arena_[inner].kind == Obj::Tensor) return inner;
        std::size_t t = make_kind(Obj::Tuple);
        items_of(t) = {a[0], a[1], inner, a[3]};
        return record(fn_id, t, Value::Object::Made::Reduce, kNoView);
    }
    case Fn::GetLayout:   // torch/serialization.py _get_layout("torch.sparse_coo")
        nargs(1, 1);
        return make_str(Obj::Str, as_str(a[0], "_get_layout name"));
    case Fn::Size: {
        nargs(1, 1);
        std::size_t t = make_kind(Obj::Tuple);
        auto dims = tuple_items(a[0], "torch.Size argument");
        for (auto e : dims) as_int(e, "torch.Size dimension");
        items_of(t) = dims;
        return t;
    }
    case Fn::Device: {
        nargs(1, 2);
        std::string s = as_str(a[0], "torch.device type");
        if (a.size() == 2 && arena_[a[1]].kind != Obj::None) s += fmt::format(":{}", as_int(a[1], "torch.device index"));
        return make_str(Obj::Str, std::move(s));
    }
    case Fn::CodecsEncode: {
        nargs(2, 2);
        const std::string& enc = as_str(a[1], "_codecs.encode encoding");
        if (enc != "latin1" && enc != "latin-1" && enc != "iso-8859-1")
            fail(fmt::format("_codecs.encode with encoding '{}' is not allowed", enc));
        const std::string& u = as_str(a[0], "_codecs.encode text");
        std::string out;   // UTF-8 code points below 256 -> bytes
        for (std::size_t k = 0; k < u.size();) {
            uint8_t c = static_cast<uint8_t>(u[k]);
            if (c < 0x80) { out.push_back(static_cast<char>(c)); k += 1; }
            else if ((c & 0xE0) == 0xC0 && k + 1 < u.size() && c <= 0xC3) {
                out.push_back(static_cast<char>(((c & 0x1F) << 6) | (static_cast<uint8_t>(u[k + 1]) & 0x3F)));
                k += 2;
            } else fail("_codecs.encode text has a character outside latin-1");
        }
        return make_str(Obj::Bytes, std::move(out));
    }
    case Fn::Set:
    case Fn::FrozenSet: {
        nargs(0, 1);
        std::size_t s = make_kind(Obj::Set);
        if (a.size() == 1) {
            auto items = tuple_items(a[0], "set argument");
            for (auto e : items) check_hashable(e);
            items_of(s) = items;
        }
        return s;
    }
    case Fn::ByteArray: {
        nargs(0, 1);
        if (a.empty()) return make_str(Obj::Bytes, "");
        if (arena_[a[0]].kind != Obj::Bytes) fail("bytearray argument must be bytes");
        return make_str(Obj::Bytes, str(arena_[a[0]]));
    }
    case Fn::Complex: {
        nargs(2, 2);
        for (auto e : a)
            if (arena_[e].kind != Obj::Float && arena_[e].kind != Obj::Int) fail("complex parts must be numbers");
        std::size_t t = make_kind(Obj::Tuple);
        items_of(t) = a;
        return t;
    }
    default:
        fail(fmt::format("pickle calls {}, which is not a callable", name));
    }
}

Value Unpickler::convert(std::size_t id, int depth) {
    if (depth > 256) fail("object nesting deeper than 256 levels (or a cycle)");
    if (++converted_ > convert_budget_) fail("object tree too large after expanding shared references");
    const Obj& o = arena_[id];
    Value v;
    switch (o.kind) {
    case Obj::None: break;
    case Obj::Bool: v.v = o.b; break;
    case Obj::Int: v.v = o.i; break;
    case Obj::Float: v.v = o.d; break;
    case Obj::Str: v.v = str(o); break;
    case Obj::Bytes: v.v = str(o); v.is_bytes = true; break;
    case Obj::Tensor: v.v = Value::Tensor{o.index}; break;
    case Obj::Storage: {
        // A storage saved on its own (torch.save(t.untyped_storage())) or held by an object:
        // a 1-d tensor over the whole storage, so that it is found and kept like any tensor.
        std::size_t& view = storage_view_[o.index];
        if (view == kNoView) {
            PickleTensor t;
            t.storage = o.index;
            t.dtype = res_.storages[o.index].dtype;
            t.shape = {static_cast<int64_t>(std::min<uint64_t>(res_.storages[o.index].numel, INT64_MAX))};
            t.stride = {1};
            view = res_.tensors.size();
            res_.tensors.push_back(std::move(t));
        }
        v.v = Value::Tensor{view};
        break;
    }
    case Obj::Global:
        if (o.global.fn != Fn::Opaque) { v.v = str(o); break; }   // dtype objects etc. render as "torch.float32"
        [[fallthrough]];
    case Obj::Object: {
        Value::Object obj;
        const std::string& qualname = str(o);
        obj.module = qualname.substr(0, static_cast<std::size_t>(o.i));
        obj.name = qualname.substr(std::min(qualname.size(), static_cast<std::size_t>(o.i) + 1));
        if (o.kind == Obj::Object) {
            const Parts p = parts_[o.index];   // copy: keep it simple across the recursion
            obj.made = p.made;
            obj.args = convert_all(p.args, depth);
            obj.kwargs = convert_pairs(p.kwargs, depth);
            obj.state = convert_all(p.states, depth);
            obj.items = convert_all(p.items, depth);
            obj.dict_items = convert_pairs(p.kv, depth);
        }
        v.v = Value::ObjectPtr(std::move(obj));
        break;
    }
    case Obj::List: case Obj::Tuple: case Obj::Set: {
        const bool tuple = o.kind == Obj::Tuple;
        v.v = convert_all(items(o), depth);  // the side tables never move (Arena)
        v.is_tuple = tuple;
        break;
    }
    case Obj::Dict:
        v.v = convert_pairs(items(o), depth);
        break;
    }
    return v;
}

PickleResult Unpickler::run() {
    const uint64_t start = in_.position();
    for (;;) {
        op_offset_ = in_.position();
        if (op_offset_ - start > limits_.max_pickle_bytes)
            fail(fmt::format("pickle longer than {} bytes (limit)", limits_.max_pickle_bytes));
        uint8_t op = in_.byte("pickle");
        switch (op) {
        case 0x80: {   // PROTO
            uint8_t p = in_.byte("pickle");
            if (p < 2 || p > 5) fail(fmt::format("unsupported pickle protocol {}", p));
            break;
        }
        case 0x95: le(8); break;   // FRAME: the length is only a hint
        case '.': {    // STOP
            if (!marks_.empty()) fail("STOP with an open MARK");
            if (stack_.size() != 1) fail(fmt::format("STOP with {} objects on the stack, expected 1", stack_.size()));
            convert_budget_ = std::min<uint64_t>(limits_.max_objects, 4 * arena_.size() + 4096);
            res_.root = convert(stack_.back(), 0);
            return std::move(res_);
        }
        case '(': marks_.push_back(stack_.size()); break;   // MARK
        case '0': pop(); break;                              // POP
        case '1': pop_mark(); break;                         // POP_MARK
        case '2': push(top()); break;                        // DUP
        case 'N': push(make_none()); break;
        case 0x88: case 0x89: {   // NEWTRUE / NEWFALSE
            push(make_bool(op == 0x88));
            break;
        }
        case 'J': push(make_int(static_cast<int32_t>(static_cast<uint32_t>(le(4))))); break;   // BININT
        case 'K': push(make_int(static_cast<int64_t>(le(1)))); break;                             // BININT1
        case 'M': push(make_int(static_cast<int64_t>(le(2)))); break;                             // BININT2
        case 'I': push(text_int(text_arg("pickle INT"), false)); break;                         // INT (text)
        case 'L': push(text_int(text_arg("pickle LONG"), true)); break;                         // LONG (text)
        case 'F': {    // FLOAT (text, repr of a double)
            const std::string t = text_arg("pickle FLOAT");
            char* end = nullptr;
            double d = std::strtod(t.c_str(), &end);
            if (t.empty() || end != t.c_str() + t.size()) fail(fmt::format("FLOAT argument '{}' is not a number", t.substr(0, 20)));
            push(make_float(d));
            break;
        }
        case 0x8a: push(long_from_bytes(counted(le(1), "LONG1"))); break;
        case 0x8b: {   // LONG4
            int64_t n = static_cast<int32_t>(static_cast<uint32_t>(le(4)));
            if (n < 0) fail("LONG4 with negative length");
            push(long_from_bytes(counted(static_cast<uint64_t>(n), "LONG4")));
            break;
        }
        case 'G': {    // BINFLOAT, big-endian
            uint8_t b[8];
            in_.read(b, 8, "pickle");
            uint64_t bits = 0;
            for (uint8_t c : b) bits = (bits << 8) | c;
            double d;
            std::memcpy(&d, &bits, 8);
            push(make_float(d));
            break;
        }
        case 'X': push(make_str(Obj::Str, counted(le(4), "BINUNICODE"))); break;
        case 0x8c: push(make_str(Obj::Str, counted(le(1), "SHORT_BINUNICODE"))); break;
        case 0x8d: push(make_str(Obj::Str, counted(le(8), "BINUNICODE8"))); break;
        case 'B': push(make_str(Obj::Bytes, counted(le(4), "BINBYTES"))); break;
        case 'C': push(make_str(Obj::Bytes, counted(le(1), "SHORT_BINBYTES"))); break;
        case 0x8e: push(make_str(Obj::Bytes, counted(le(8), "BINBYTES8"))); break;
        case 0x96: push(make_str(Obj::Bytes, counted(le(8), "BYTEARRAY8"))); break;
        case 'U': push(make_str(Obj::Str, counted(le(1), "SHORT_BINSTRING"))); break;
        case 'T': {
            int64_t n = static_cast<int32_t>(static_cast<uint32_t>(le(4)));
            if (n < 0) fail("BINSTRING with negative length");
            push(make_str(Obj::Str, counted(static_cast<uint64_t>(n), "BINSTRING")));
            break;
        }
        case '}': push(make_kind(Obj::Dict)); break;        // EMPTY_DICT
        case ']': push(make_kind(Obj::List)); break;        // EMPTY_LIST
        case ')': push(make_kind(Obj::Tuple)); break;       // EMPTY_TUPLE
        case 0x8f: push(make_kind(Obj::Set)); break;        // EMPTY_SET
        case 't': case 'l': case 0x91: {                    // TUPLE / LIST / FROZENSET
            auto items = pop_mark();
            if (op == 0x91) for (auto e : items) check_hashable(e);
            std::size_t t = make_kind(op == 't' ? Obj::Tuple : op == 'l' ? Obj::List : Obj::Set);
            items_of(t) = std::move(items);
            push(t);
            break;
        }
        case 0x85: case 0x86: case 0x87: {                  // TUPLE1..3
            std::size_t n = op - 0x84u;
            if (stack_.size() < floor() + n) fail("stack underflow");
            std::vector<std::size_t> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
            stack_.resize(stack_.size() - n);
            std::size_t t = make_kind(Obj::Tuple);
            items_of(t) = std::move(items);
            push(t);
            break;
        }
        case 'd': {    // DICT
            auto items = pop_mark();
            std::size_t d = make_kind(Obj::Dict);
            set_items(d, items);
            push(d);
            break;
        }
        case 'a': {    // APPEND
            std::size_t v = pop();
            append_items(top(), {v}, "APPEND");
            break;
        }
        case 'e': {    // APPENDS
            auto items = pop_mark();
            append_items(top(), items, "APPENDS");
            break;
        }
        case 0x90: {   // ADDITEMS
            auto items = pop_mark();
            std::size_t s = top();
            if (arena_[s].kind != Obj::Set) fail("ADDITEMS to an object that is not a set");
            for (auto e : items) check_hashable(e);
            auto& dst = items_of(s);
            dst.insert(dst.end(), items.begin(), items.end());
            break;
        }
        case 's': {    // SETITEM
            std::size_t v = pop();
            std::size_t k = pop();
            set_items(top(), {k, v});
            break;
        }
        case 'u': {    // SETITEMS
            auto items = pop_mark();
            set_items(top(), items);
            break;
        }
        case 'c': {    // GLOBAL
            std::string module = in_.line(256, "pickle GLOBAL");
            std::string name = in_.line(256, "pickle GLOBAL");
            push(global(std::move(module), std::move(name)));
            break;
        }
        case 0x93: {   // STACK_GLOBAL
            std::size_t n = pop(), m = pop();
            push(global(as_str(m, "STACK_GLOBAL module"), as_str(n, "STACK_GLOBAL name")));
            break;
        }
        case 'R': {    // REDUCE
            std::size_t args = pop();
            std::size_t fn = pop();
            push(call(fn, args, Value::Object::Made::Reduce, kNoView, "REDUCE"));
            break;
        }
        case 0x81: {   // NEWOBJ: cls.__new__(cls, *args)
            std::size_t args = pop();
            std::size_t cls = pop();
            push(call(cls, args, Value::Object::Made::NewObj, kNoView, "NEWOBJ"));
            break;
        }
        case 0x92: {   // NEWOBJ_EX: cls.__new__(cls, *args, **kwargs)
            std::size_t kwargs = pop();
            std::size_t args = pop();
            std::size_t cls = pop();
            push(call(cls, args, Value::Object::Made::NewObj, kwargs, "NEWOBJ_EX"));
            break;
        }
        case 'b': {    // BUILD: recorded on opaque objects; ignored on OrderedDict (_metadata) and tensors
            std::size_t state = pop();
            std::size_t target = top();
            auto kind = arena_[target].kind;
            if (kind == Obj::Object) parts_[arena_[target].index].states.push_back(state);
            else if (kind != Obj::Dict && kind != Obj::Tensor)
                fail("BUILD on an object that is not an OrderedDict, tensor or object");
            break;
        }
        case 'Q': {    // BINPERSID
            std::size_t pid = pop();
            push(persistent(pid));
            break;
        }
        case 'q': memo_put(le(1), top()); break;           // BINPUT
        case 'r': memo_put(le(4), top()); break;           // LONG_BINPUT
        case 'p': memo_put(text_index("pickle PUT"), top()); break;   // PUT (text)
        case 0x94: memo_put(memo_count_, top()); break;    // MEMOIZE: at len(memo)
        case 'h': push(memo_get(le(1))); break;            // BINGET
        case 'j': push(memo_get(le(4))); break;            // LONG_BINGET
        case 'g': push(memo_get(text_index("pickle GET"))); break;    // GET (text)
        case 0x82: case 0x83: case 0x84:                   // EXT1 / EXT2 / EXT4
            fail(fmt::format("opcode 0x{:02x} (EXT) needs copyreg's extension registry, which a stock Python "
                             "leaves empty", op));
        case 0x97: case 0x98:                              // NEXT_BUFFER / READONLY_BUFFER
            fail(fmt::format("opcode 0x{:02x} refers to an out-of-band buffer, which a file cannot carry", op));
        default:
            fail(fmt::format("opcode 0x{:02x} is not supported", op));
        }
    }
}

}  // namespace

PickleResult unpickle(RangeReader& in, const Limits& limits, PersistentIds ids) {
    return Unpickler(in, limits, ids).run();
}

}  // namespace ckpt::io
