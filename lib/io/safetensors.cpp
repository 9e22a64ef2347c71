#include "io/safetensors.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/detail.h"

namespace ckpt::io {
namespace {

/// Strict UTF-8 check (no overlongs, surrogates or code points above U+10FFFF).
bool valid_utf8(const std::string& s) {
    std::size_t i = 0, n = s.size();
    while (i < n) {
        auto c = static_cast<uint8_t>(s[i]);
        std::size_t len;
        uint32_t cp;
        if (c < 0x80) { ++i; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + len > n) return false;
        for (std::size_t k = 1; k < len; ++k) {
            auto cc = static_cast<uint8_t>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

}  // namespace

Checkpoint read_safetensors(const InputFile& f, const Limits& limits) {
    auto bad = [&](const std::string& m) { return BadInput(f.path(), "safetensors: " + m); };
    if (f.size() < 8) throw bad(fmt::format("file of {} bytes is too small for the 8-byte header length", f.size()));
    const uint64_t n = f.u64(0, "safetensors header length");
    if (n > limits.max_header_bytes)
        throw bad(fmt::format("header length {} exceeds the limit of {} bytes", n, limits.max_header_bytes));
    if (n > f.size() - 8)
        throw bad(fmt::format("header length {} runs past end of file ({} bytes)", n, f.size()));
    if (n < 2) throw bad(fmt::format("header length {} is too small for a JSON object", n));
    std::string header = f.read_string(8, n, "safetensors header");
    if (!valid_utf8(header)) throw bad("header is not valid UTF-8");
    if (header[0] != '{') throw bad("header does not start with '{'");

    // Parse keeping file order, rejecting duplicate keys at any depth.
    std::vector<std::set<std::string>> seen;
    std::string dup;
    auto cb = [&](int, nlohmann::ordered_json::parse_event_t ev, nlohmann::ordered_json& parsed) {
        using E = nlohmann::ordered_json::parse_event_t;
        if (ev == E::object_start) seen.emplace_back();
        else if (ev == E::object_end && !seen.empty()) seen.pop_back();
        else if (ev == E::key && !seen.empty() && !seen.back().insert(parsed.get<std::string>()).second && dup.empty())
            dup = parsed.get<std::string>();
        return true;
    };
    nlohmann::ordered_json j;
    try {
        j = nlohmann::ordered_json::parse(header, cb);
    } catch (const nlohmann::json::exception& e) {
        std::string what = e.what();
        throw bad("header is not valid JSON: " + what.substr(0, 200));
    }
    if (!dup.empty()) throw bad(fmt::format("header has duplicate key '{}'", dup.substr(0, 200)));
    if (!j.is_object()) throw bad("header is not a JSON object");

    const uint64_t buf_start = 8 + n;
    const uint64_t buf_size = f.size() - buf_start;
    Checkpoint ck;
    ck.format = Format::Safetensors;
    Value::Dict root;
    Value meta;
    bool has_meta = false;
    struct Range { uint64_t b, e; std::size_t tensor; };
    std::vector<Range> ranges;
    for (auto& [name, info] : j.items()) {
        if (name == "__metadata__") {
            if (!info.is_object()) throw bad("__metadata__ is not an object");
            Value::Dict md;
            for (auto& [k, val] : info.items()) {
                if (!val.is_string()) throw bad(fmt::format("__metadata__ value of '{}' is not a string", k));
                Value kv, vv;
                kv.v = k;
                vv.v = val.get<std::string>();
                md.emplace_back(std::move(kv), std::move(vv));
            }
            meta.v = std::move(md);
            has_meta = true;
            continue;
        }
        // init-capture: clang 14 cannot capture a structured binding directly
        auto tb = [&, &tname = name](const std::string& m) { return bad(fmt::format("tensor '{}': {}", tname, m)); };
        if (!info.is_object()) throw tb("entry is not an object");
        if (!info.contains("dtype") || !info["dtype"].is_string()) throw tb("missing or non-string dtype");
        if (!info.contains("shape") || !info["shape"].is_array()) throw tb("missing or non-array shape");
        if (!info.contains("data_offsets") || !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
            throw tb("data_offsets must be an array of 2 integers");
        std::string dts = info["dtype"].get<std::string>();
        auto dt = dtype_from_name(dts);
        if (!dt || *dt == DType::C128) throw tb(fmt::format("unsupported dtype '{}'", dts.substr(0, 32)));
        TensorInfo t;
        t.path = name;
        t.dtype = *dt;
        uint64_t numel = 1;
        uint64_t extent = 1;   // product of max(dim, 1): bounds numel and every stride
        for (auto& d : info["shape"]) {
            if (!d.is_number_unsigned()) throw tb("shape entries must be non-negative integers");
            uint64_t v = d.get<uint64_t>();
            auto m = checked_mul(extent, std::max<uint64_t>(v, 1));
            if (!m || *m > uint64_t(INT64_MAX)) throw tb("element count overflows");
            extent = *m;
            numel *= v;   // <= extent
            t.shape.push_back(static_cast<int64_t>(v));
        }
        t.stride.resize(t.shape.size());
        int64_t st = 1;
        for (std::size_t k = t.shape.size(); k-- > 0;) {
            t.stride[k] = st;
            st *= std::max<int64_t>(t.shape[k], 1);   // <= extent <= INT64_MAX
        }
        auto& off = info["data_offsets"];
        if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            throw tb("data_offsets must be non-negative integers");
        uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        auto nb = checked_mul(numel, dtype_size(*dt));
        if (!nb) throw tb("byte size overflows");
        if (e < b) throw tb(fmt::format("data_offsets [{}, {}) end before they begin", b, e));
        if (e - b != *nb)
            throw tb(fmt::format("data_offsets [{}, {}) hold {} bytes, but {} x {} needs {}", b, e, e - b, numel,
                                 dts, *nb));
        StorageInfo s;
        s.key = name;
        s.dtype = *dt;
        s.numel = numel;
        s.nbytes = *nb;
        s.file_offset = buf_start + b;   // e <= buf_size is checked by the tiling below
        t.storage = ck.storages.size();
        ranges.push_back({b, e, ck.tensors.size()});
        Value key, tv;
        key.v = name;
        tv.v = Value::Tensor{ck.tensors.size()};
        root.emplace_back(std::move(key), std::move(tv));
        ck.storages.push_back(std::move(s));
        ck.tensors.push_back(std::move(t));
    }
    std::stable_sort(ranges.begin(), ranges.end(),
                     [](const Range& x, const Range& y) { return std::tie(x.b, x.e) < std::tie(y.b, y.e); });
    uint64_t at = 0;
    for (const auto& r : ranges) {
        if (r.b != at)
            throw bad(fmt::format("tensor '{}' data_offsets [{}, {}) do not start where the previous one ends ({}): {}",
                                  ck.tensors[r.tensor].path, r.b, r.e, at, r.b > at ? "gap" : "overlap"));
        at = r.e;
    }
    if (at != buf_size)
        throw bad(fmt::format("tensors cover {} bytes but the data buffer has {} (file not fully covered)", at,
                              buf_size));
    if (has_meta) {
        Value key;
        key.v = std::string("__metadata__");
        root.emplace_back(std::move(key), std::move(meta));
    }
    ck.root.v = std::move(root);
    return ck;
}

}  // namespace ckpt::io
