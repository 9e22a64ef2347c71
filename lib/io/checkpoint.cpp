#include "io/checkpoint.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"
#include "io/detail.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "io/torch_file.h"
#include "io/zip.h"

namespace ckpt {

const char* format_name(Format f) {
    switch (f) {
    case Format::TorchZip: return "torch-zip";
    case Format::TorchLegacy: return "torch-legacy";
    case Format::Safetensors: return "safetensors";
    }
    return "?";
}

Value::Value() = default;
Value::~Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;
Value::Object::Object() = default;
Value::Object::~Object() = default;
Value::Object::Object(const Object&) = default;
Value::Object::Object(Object&&) noexcept = default;
Value::Object& Value::Object::operator=(const Object&) = default;
Value::Object& Value::Object::operator=(Object&&) noexcept = default;
Value::ObjectPtr::ObjectPtr(Object o) : p(std::make_unique<Object>(std::move(o))) {}
Value::ObjectPtr::~ObjectPtr() = default;
Value::ObjectPtr::ObjectPtr(const ObjectPtr& o) : p(o.p ? std::make_unique<Object>(*o.p) : nullptr) {}
Value::ObjectPtr::ObjectPtr(ObjectPtr&&) noexcept = default;
Value::ObjectPtr& Value::ObjectPtr::operator=(const ObjectPtr& o) {
    p = o.p ? std::make_unique<Object>(*o.p) : nullptr;
    return *this;
}
Value::ObjectPtr& Value::ObjectPtr::operator=(ObjectPtr&&) noexcept = default;

const Value* Value::Object::attr(const std::string& key) const {
    for (auto it = state.rbegin(); it != state.rend(); ++it) {
        if (const Value* v = it->get(key)) return v;
        // (state, slotstate) pair of CPython's load_build
        auto pair = std::get_if<List>(&it->v);
        if (pair && it->is_tuple && pair->size() == 2)
            for (const Value& part : *pair)
                if (const Value* v = part.get(key)) return v;
    }
    for (const auto& [k, val] : dict_items)
        if (std::holds_alternative<std::string>(k.v) && std::get<std::string>(k.v) == key) return &val;
    return nullptr;
}

std::string Value::key_text() const {
    if (auto s = std::get_if<std::string>(&v)) return *s;
    if (auto i = std::get_if<int64_t>(&v)) return std::to_string(*i);
    if (auto b = std::get_if<bool>(&v)) return *b ? "True" : "False";
    if (auto d = std::get_if<double>(&v)) return fmt::format("{}", *d);
    if (std::holds_alternative<None>(v)) return "None";
    if (auto o = object()) return o->qualname();
    return "?";
}

const Value* Value::get(const std::string& key) const {
    auto d = std::get_if<Dict>(&v);
    if (!d) return nullptr;
    for (const auto& [k, val] : *d) {  // no key_text() string per entry
        if (auto s = std::get_if<std::string>(&k.v)) {
            if (*s == key) return &val;
        } else if (std::holds_alternative<int64_t>(k.v) && k.key_text() == key) {
            return &val;
        }
    }
    return nullptr;
}

namespace io {

std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

void finalize_checkpoint(Checkpoint& ck) {
    auto bad = [&](const std::string& m) { return BadInput(ck.path, m); };
    for (auto& s : ck.storages) {
        auto nb = checked_mul(s.numel, dtype_size(s.dtype));
        if (!nb || *nb != s.nbytes)
            throw bad(fmt::format("storage '{}': {} elements of {} do not make {} bytes", s.key, s.numel,
                                  dtype_name(s.dtype), s.nbytes));
        if (s.file_offset > ck.file_size || s.nbytes > ck.file_size - s.file_offset)
            throw bad(fmt::format("storage '{}' (offset {}, {} bytes) runs past end of file ({} bytes)", s.key,
                                  s.file_offset, s.nbytes, ck.file_size));
    }
    std::vector<std::size_t> order(ck.storages.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const auto &x = ck.storages[a], &y = ck.storages[b];
        return std::tie(x.file_offset, x.nbytes) < std::tie(y.file_offset, y.nbytes);
    });
    std::vector<std::size_t> new_index(order.size());
    std::vector<StorageInfo> sorted;
    sorted.reserve(order.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
        new_index[order[i]] = i;
        sorted.push_back(std::move(ck.storages[order[i]]));
    }
    ck.storages = std::move(sorted);
    for (std::size_t i = 1; i < ck.storages.size(); ++i) {
        const auto &p = ck.storages[i - 1], &c = ck.storages[i];
        if (p.file_offset + p.nbytes > c.file_offset)
            throw bad(fmt::format("storages '{}' and '{}' overlap in the file", p.key, c.key));
    }
    for (auto& t : ck.tensors) {
        if (t.storage >= new_index.size()) throw bad(fmt::format("tensor '{}' has no storage", t.path));
        t.storage = new_index[t.storage];
        const StorageInfo& s = ck.storages[t.storage];
        auto view = [&] {
            std::string shape, stride;
            for (auto d : t.shape) shape += fmt::format("{}{}", shape.empty() ? "" : ",", d);
            for (auto d : t.stride) stride += fmt::format("{}{}", stride.empty() ? "" : ",", d);
            return fmt::format("tensor '{}' (storage '{}' of {} bytes, offset {}, shape [{}], stride [{}])", t.path,
                               s.key, s.nbytes, t.storage_offset, shape, stride);
        };
        if (t.shape.size() != t.stride.size()) throw bad(view() + ": shape and stride differ in rank");
        if (t.storage_offset < 0) throw bad(view() + ": negative storage offset");
        bool empty = false;
        uint64_t last = static_cast<uint64_t>(t.storage_offset);   // highest element index touched
        bool overflow = false;
        for (std::size_t d = 0; d < t.shape.size(); ++d) {
            if (t.shape[d] < 0) throw bad(view() + ": negative size");
            if (t.stride[d] < 0) throw bad(view() + ": negative stride");
            if (t.shape[d] == 0) empty = true;
        }
        if (!empty) {
            for (std::size_t d = 0; d < t.shape.size(); ++d) {
                auto step = checked_mul(static_cast<uint64_t>(t.shape[d] - 1), static_cast<uint64_t>(t.stride[d]));
                if (!step || __builtin_add_overflow(last, *step, &last)) overflow = true;
            }
        }
        const uint64_t es = dtype_size(t.dtype);
        // Bytes the view needs: up to and including element `last` (empty views: up to the offset).
        uint64_t need = 0;
        if (!overflow) {
            auto n = checked_mul(empty ? last : last + 1, es);
            if (!n) overflow = true; else need = *n;
        }
        if (overflow) throw bad(view() + ": extent overflows 64 bits");
        if (need > s.nbytes)
            throw bad(fmt::format("{}: view needs {} bytes, past the end of its storage", view(), need));
    }
}

}  // namespace io

namespace {
/// Error text is built from hostile names (zip entries, tensor names, storage keys): keep it
/// one printable line of bounded length.
std::string one_line(const std::string& s) {
    constexpr std::size_t kMax = 600;
    std::string out;
    for (unsigned char c : s.substr(0, kMax)) out.push_back(c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c));
    if (s.size() > kMax) out += "...";
    return out;
}

Checkpoint read_any(const io::InputFile& f, const Limits& limits);
}  // namespace

Checkpoint read_checkpoint(const std::string& path, const Limits& limits) {
    try {
        const io::InputFile f(path);
        return read_any(f, limits);
    } catch (const BadInput& e) {
        throw BadInput(e.file, one_line(e.what()));
    }
}

Checkpoint read_checkpoint(const io::InputFile& f, const Limits& limits) {
    try {
        return read_any(f, limits);
    } catch (const BadInput& e) {
        throw BadInput(e.file, one_line(e.what()));
    }
}

namespace {
Checkpoint read_any(const io::InputFile& f, const Limits& limits) {
    const std::string& path = f.path();
    uint8_t head[16] = {};
    std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(f.size(), sizeof head));
    f.read_at(0, head, n, "file header");
    Checkpoint ck;
    // A stored zip entry has method 0 at byte 8; '{' there means a safetensors header length.
    if (n >= 9 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4 && head[8] != '{')
        ck = io::read_torch_zip(f, limits);
    else if (io::is_torch_legacy(f))
        ck = io::read_torch_legacy(f, limits);
    else if (n >= 9 && head[8] == '{')
        ck = io::read_safetensors(f, limits);
    else if (io::has_zip_eocd(f))
        ck = io::read_torch_zip(f, limits);
    else if (f.size() < 9)
        throw BadInput(path, fmt::format("file of {} bytes is too small to be a checkpoint", f.size()));
    else
        throw BadInput(path, "not a torch.save zip, legacy torch file or safetensors file "
                             "(no zip end record, legacy magic number or safetensors JSON header)");
    ck.path = path;
    ck.file_size = f.size();
    io::finalize_checkpoint(ck);
    return ck;
}
}  // namespace

}  // namespace ckpt
