#include "io/pickle.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"

namespace ckpt::io {
namespace {

/// Allowed callables / classes (torch.load(weights_only=True) plus _codecs.encode etc.).
enum class Fn { OrderedDict, RebuildV2, RebuildV3, RebuildParameter, Storage, UntypedStorage, Size, Device,
                Dtype, CodecsEncode, Set, FrozenSet, ByteArray, Complex };

struct GlobalInfo {
    Fn fn;
    DType dtype = DType::U8;   // Storage / Dtype
};

std::optional<GlobalInfo> lookup_global(const std::string& module, const std::string& name) {
    if (module == "collections" && name == "OrderedDict") return GlobalInfo{Fn::OrderedDict};
    if (module == "torch._utils") {
        if (name == "_rebuild_tensor_v2") return GlobalInfo{Fn::RebuildV2};
        if (name == "_rebuild_tensor_v3") return GlobalInfo{Fn::RebuildV3};
        if (name == "_rebuild_parameter") return GlobalInfo{Fn::RebuildParameter};
        return std::nullopt;
    }
    if (module == "torch") {
        static const std::pair<const char*, DType> storages[] = {
            {"FloatStorage", DType::F32}, {"DoubleStorage", DType::F64}, {"HalfStorage", DType::F16},
            {"BFloat16Storage", DType::BF16}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
            {"ShortStorage", DType::I16}, {"CharStorage", DType::I8}, {"ByteStorage", DType::U8},
            {"BoolStorage", DType::Bool}, {"ComplexFloatStorage", DType::C64},
            {"ComplexDoubleStorage", DType::C128}};
        for (auto& [n, d] : storages)
            if (name == n) return GlobalInfo{Fn::Storage, d};
        if (name == "UntypedStorage") return GlobalInfo{Fn::UntypedStorage, DType::U8};
        if (name == "Size") return GlobalInfo{Fn::Size};
        if (name == "device") return GlobalInfo{Fn::Device};
        static const std::pair<const char*, DType> dtypes[] = {
            {"float32", DType::F32}, {"float", DType::F32}, {"float64", DType::F64}, {"double", DType::F64},
            {"float16", DType::F16}, {"half", DType::F16}, {"bfloat16", DType::BF16}, {"int64", DType::I64},
            {"long", DType::I64}, {"int32", DType::I32}, {"int", DType::I32}, {"int16", DType::I16},
            {"short", DType::I16}, {"int8", DType::I8}, {"uint8", DType::U8}, {"bool", DType::Bool},
            {"complex64", DType::C64}, {"cfloat", DType::C64}, {"complex128", DType::C128},
            {"cdouble", DType::C128}, {"float8_e5m2", DType::F8_E5M2}, {"float8_e4m3fn", DType::F8_E4M3},
            {"uint16", DType::U16}, {"uint32", DType::U32}, {"uint64", DType::U64}};
        for (auto& [n, d] : dtypes)
            if (name == n) return GlobalInfo{Fn::Dtype, d};
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

/// Python objects live in an arena and refer to each other by index, so hostile nesting
/// or cycles can neither overflow the stack on destruction nor leak.
struct Obj {
    enum Kind { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Set, Tensor, Global, Storage } kind = None;
    bool b = false;
    int64_t i = 0;
    double d = 0;
    std::string s;                  // Str / Bytes / Global "module.name"
    std::vector<std::size_t> items; // List / Tuple / Set; Dict: k0, v0, k1, v1, ...
    std::size_t index = 0;          // Tensor / Storage index
    GlobalInfo global{Fn::Set};
};

class Unpickler {
public:
    Unpickler(RangeReader& in, const Limits& limits, PersistentIds ids) : in_(in), limits_(limits), ids_(ids) {}

    PickleResult run();

private:
    [[noreturn]] void fail(const std::string& msg) const {
        throw BadInput(in_.file().path(), fmt::format("pickle at offset {}: {}", op_offset_, msg));
    }
    std::size_t make(Obj o) {
        if (arena_.size() >= limits_.max_objects)
            fail(fmt::format("more than {} objects (limit)", limits_.max_objects));
        arena_.push_back(std::move(o));
        return arena_.size() - 1;
    }
    std::size_t make_kind(Obj::Kind k) { Obj o; o.kind = k; return make(std::move(o)); }
    std::size_t make_int(int64_t v) { Obj o; o.kind = Obj::Int; o.i = v; return make(std::move(o)); }
    std::size_t make_str(Obj::Kind k, std::string s) { Obj o; o.kind = k; o.s = std::move(s); return make(std::move(o)); }
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
    void memo_put(uint64_t idx, std::size_t id) {
        if (memo_.size() >= limits_.max_memo_entries && !memo_.count(idx))
            fail(fmt::format("memo exceeds {} entries (limit)", limits_.max_memo_entries));
        memo_[idx] = id;
    }
    std::size_t memo_get(uint64_t idx) {
        auto it = memo_.find(idx);
        if (it == memo_.end()) fail(fmt::format("memo key {} was never stored", idx));
        return it->second;
    }
    void check_hashable(std::size_t k) {
        auto kind = arena_[k].kind;
        if (kind == Obj::List || kind == Obj::Dict || kind == Obj::Set)
            fail("unhashable dict key (list, dict or set)");
    }
    void set_items(std::size_t dict, const std::vector<std::size_t>& kv) {
        if (arena_[dict].kind != Obj::Dict) fail("SETITEM(S) on an object that is not a dict");
        if (kv.size() % 2) fail("SETITEMS with an odd number of items");
        for (std::size_t k = 0; k < kv.size(); k += 2) {
            check_hashable(kv[k]);
            auto& items = arena_[dict].items;
            items.push_back(kv[k]);
            items.push_back(kv[k + 1]);
        }
    }
    std::size_t long_from_bytes(const std::string& b);
    std::size_t reduce(std::size_t fn, std::size_t args);
    std::size_t persistent(std::size_t pid);
    const std::vector<std::size_t>& tuple_items(std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Tuple && arena_[id].kind != Obj::List) fail(fmt::format("{} must be a tuple", what));
        return arena_[id].items;
    }
    int64_t as_int(std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Int) fail(fmt::format("{} must be an int", what));
        return arena_[id].i;
    }
    const std::string& as_str(std::size_t id, const char* what) {
        if (arena_[id].kind != Obj::Str) fail(fmt::format("{} must be a str", what));
        return arena_[id].s;
    }
    std::vector<int64_t> int_tuple(std::size_t id, const char* what) {
        std::vector<int64_t> out;
        for (auto e : tuple_items(id, what)) out.push_back(as_int(e, what));
        return out;
    }
    Value convert(std::size_t id, int depth);

    RangeReader& in_;
    const Limits& limits_;
    PersistentIds ids_;
    uint64_t op_offset_ = 0;
    std::vector<Obj> arena_;
    std::vector<std::size_t> stack_;
    std::vector<std::size_t> marks_;
    std::unordered_map<uint64_t, std::size_t> memo_;
    PickleResult res_;
    std::unordered_map<std::string, std::size_t> storage_by_key_;
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
    Obj o;
    o.kind = Obj::Float;
    o.d = neg ? -(d + 1) : d;
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
    std::size_t index;
    auto it = storage_by_key_.find(st.key);
    if (it != storage_by_key_.end()) {
        const auto& prev = res_.storages[it->second];
        if (prev.dtype != st.dtype || prev.numel != st.numel)
            fail(fmt::format("storage '{}' is declared twice with different type or size", st.key));
        index = it->second;
    } else {
        index = res_.storages.size();
        storage_by_key_.emplace(st.key, index);
        res_.storages.push_back(std::move(st));
    }
    Obj o;
    o.kind = Obj::Storage;
    o.index = index;
    return make(std::move(o));
}

std::size_t Unpickler::reduce(std::size_t fn_id, std::size_t args_id) {
    const Obj& fn = arena_[fn_id];
    if (fn.kind != Obj::Global) fail("REDUCE on an object that is not an allowed callable");
    if (arena_[args_id].kind != Obj::Tuple) fail(fmt::format("REDUCE of {} with arguments that are not a tuple", fn.s));
    const std::vector<std::size_t> a = arena_[args_id].items;
    const std::string name = fn.s;
    auto nargs = [&](std::size_t lo, std::size_t hi) {
        if (a.size() < lo || a.size() > hi)
            fail(fmt::format("{} called with {} arguments", name, a.size()));
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
    case Fn::RebuildV2:
    case Fn::RebuildV3: {
        bool v3 = fn.global.fn == Fn::RebuildV3;
        nargs(v3 ? 7 : 6, v3 ? 8 : 7);
        if (arena_[a[0]].kind != Obj::Storage) fail(fmt::format("{} argument 0 is not a storage", name));
        PickleTensor t;
        t.storage = arena_[a[0]].index;
        t.dtype = res_.storages[t.storage].dtype;
        t.storage_offset = as_int(a[1], "tensor storage offset");
        t.shape = int_tuple(a[2], "tensor size");
        t.stride = int_tuple(a[3], "tensor stride");
        if (t.shape.size() != t.stride.size())
            fail(fmt::format("tensor size has {} dims but stride has {}", t.shape.size(), t.stride.size()));
        if (arena_[a[4]].kind != Obj::Bool) fail("tensor requires_grad must be a bool");
        if (v3) {
            const Obj& dt = arena_[a[6]];
            if (dt.kind != Obj::Global || dt.global.fn != Fn::Dtype) fail("_rebuild_tensor_v3 dtype is not a torch dtype");
            t.dtype = dt.global.dtype;
        }
        Obj o;
        o.kind = Obj::Tensor;
        o.index = res_.tensors.size();
        res_.tensors.push_back(std::move(t));
        return make(std::move(o));
    }
    case Fn::RebuildParameter:
        nargs(3, 3);
        if (arena_[a[0]].kind != Obj::Tensor) fail("_rebuild_parameter argument 0 is not a tensor");
        return a[0];
    case Fn::Size: {
        nargs(1, 1);
        std::size_t t = make_kind(Obj::Tuple);
        auto dims = tuple_items(a[0], "torch.Size argument");
        for (auto e : dims) as_int(e, "torch.Size dimension");
        arena_[t].items = dims;
        return t;
    }
    case Fn::Device: {
        nargs(1, 2);
        std::string s = as_str(a[0], "torch.device type");
        if (a.size() == 2) s += fmt::format(":{}", as_int(a[1], "torch.device index"));
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
            arena_[s].items = items;
        }
        return s;
    }
    case Fn::ByteArray: {
        nargs(0, 1);
        if (a.empty()) return make_str(Obj::Bytes, "");
        if (arena_[a[0]].kind != Obj::Bytes) fail("bytearray argument must be bytes");
        return make_str(Obj::Bytes, arena_[a[0]].s);
    }
    case Fn::Complex: {
        nargs(2, 2);
        for (auto e : a)
            if (arena_[e].kind != Obj::Float && arena_[e].kind != Obj::Int) fail("complex parts must be numbers");
        std::size_t t = make_kind(Obj::Tuple);
        arena_[t].items = a;
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
    case Obj::Str: v.v = o.s; break;
    case Obj::Bytes: v.v = o.s; v.is_bytes = true; break;
    case Obj::Global: v.v = o.s; break;   // dtype objects etc. render as "torch.float32"
    case Obj::Tensor: v.v = Value::Tensor{o.index}; break;
    case Obj::Storage: fail("a bare storage object is not supported outside a tensor");
    case Obj::List: case Obj::Tuple: case Obj::Set: {
        Value::List l;
        auto items = o.items;   // copy: arena_ is stable here, but keep the reference simple
        l.reserve(items.size());
        for (auto e : items) l.push_back(convert(e, depth + 1));
        v.v = std::move(l);
        v.is_tuple = o.kind == Obj::Tuple;
        break;
    }
    case Obj::Dict: {
        Value::Dict d;
        auto items = o.items;
        for (std::size_t k = 0; k + 1 < items.size(); k += 2)
            d.emplace_back(convert(items[k], depth + 1), convert(items[k + 1], depth + 1));
        v.v = std::move(d);
        break;
    }
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
        case 'N': push(make_kind(Obj::None)); break;
        case 0x88: case 0x89: {   // NEWTRUE / NEWFALSE
            Obj o; o.kind = Obj::Bool; o.b = op == 0x88; push(make(std::move(o)));
            break;
        }
        case 'J': push(make_int(static_cast<int32_t>(static_cast<uint32_t>(le(4))))); break;   // BININT
        case 'K': push(make_int(static_cast<int64_t>(le(1)))); break;                             // BININT1
        case 'M': push(make_int(static_cast<int64_t>(le(2)))); break;                             // BININT2
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
            Obj o; o.kind = Obj::Float; std::memcpy(&o.d, &bits, 8); push(make(std::move(o)));
            break;
        }
        case 'X': push(make_str(Obj::Str, counted(le(4), "BINUNICODE"))); break;
        case 0x8c: push(make_str(Obj::Str, counted(le(1), "SHORT_BINUNICODE"))); break;
        case 0x8d: push(make_str(Obj::Str, counted(le(8), "BINUNICODE8"))); break;
        case 'B': push(make_str(Obj::Bytes, counted(le(4), "BINBYTES"))); break;
        case 'C': push(make_str(Obj::Bytes, counted(le(1), "SHORT_BINBYTES"))); break;
        case 0x8e: push(make_str(Obj::Bytes, counted(le(8), "BINBYTES8"))); break;
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
            arena_[t].items = std::move(items);
            push(t);
            break;
        }
        case 0x85: case 0x86: case 0x87: {                  // TUPLE1..3
            std::size_t n = op - 0x84u;
            if (stack_.size() < floor() + n) fail("stack underflow");
            std::vector<std::size_t> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
            stack_.resize(stack_.size() - n);
            std::size_t t = make_kind(Obj::Tuple);
            arena_[t].items = std::move(items);
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
            std::size_t l = top();
            if (arena_[l].kind != Obj::List) fail("APPEND to an object that is not a list");
            arena_[l].items.push_back(v);
            break;
        }
        case 'e': {    // APPENDS
            auto items = pop_mark();
            std::size_t l = top();
            if (arena_[l].kind != Obj::List) fail("APPENDS to an object that is not a list");
            auto& dst = arena_[l].items;
            dst.insert(dst.end(), items.begin(), items.end());
            break;
        }
        case 0x90: {   // ADDITEMS
            auto items = pop_mark();
            std::size_t s = top();
            if (arena_[s].kind != Obj::Set) fail("ADDITEMS to an object that is not a set");
            for (auto e : items) check_hashable(e);
            auto& dst = arena_[s].items;
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
        case 'c': case 0x93: {   // GLOBAL / STACK_GLOBAL
            std::string module, name;
            if (op == 'c') {
                module = in_.line(256, "pickle GLOBAL");
                name = in_.line(256, "pickle GLOBAL");
            } else {
                std::size_t n = pop(), m = pop();
                name = as_str(n, "STACK_GLOBAL name");
                module = as_str(m, "STACK_GLOBAL module");
            }
            auto info = lookup_global(module, name);
            std::string full = module + "." + name;
            for (char& ch : full)
                if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
            if (!info) fail(fmt::format("pickle global {} is not allowed", full));
            Obj o;
            o.kind = Obj::Global;
            o.global = *info;
            o.s = full == "torch.float" ? "torch.float32" : full;
            push(make(std::move(o)));
            break;
        }
        case 'R': {    // REDUCE
            std::size_t args = pop();
            std::size_t fn = pop();
            push(reduce(fn, args));
            break;
        }
        case 'b': {    // BUILD: allowed on OrderedDict and tensors; the state is ignored
            pop();
            auto kind = arena_[top()].kind;
            if (kind != Obj::Dict && kind != Obj::Tensor) fail("BUILD on an object that is not an OrderedDict or tensor");
            break;
        }
        case 'Q': {    // BINPERSID
            std::size_t pid = pop();
            push(persistent(pid));
            break;
        }
        case 'q': memo_put(le(1), top()); break;           // BINPUT
        case 'r': memo_put(le(4), top()); break;           // LONG_BINPUT
        case 0x94: memo_put(memo_.size(), top()); break;   // MEMOIZE
        case 'h': push(memo_get(le(1))); break;            // BINGET
        case 'j': push(memo_get(le(4))); break;            // LONG_BINGET
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
