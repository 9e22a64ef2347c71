// Trace reading, validation and serialisation (formats/trace.md).
#include "replay/trace.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <unordered_set>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "replay/json_tree.h"

namespace ckpt::replay {
namespace {
constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;
uint64_t fnv1a64(uint64_t h, std::string_view bytes) {
    for (unsigned char c : bytes) {
        h ^= c;
        h *= kFnvPrime;
    }
    return h;
}
/// The trace hash (formats/trace.md) of either JSON model: FNV-1a 64 of the canonical text
/// (the compact tree's is streamed in chunks, never held whole).
std::string trace_hash(const nlohmann::json& j) { return fnv1a64_hex(canonical_dump(j)); }
std::string trace_hash(const JsonTree::Node& j) {
    uint64_t h = kFnvOffset;
    j.dump([&h](std::string_view chunk) { h = fnv1a64(h, chunk); });
    return fmt::format("{:016x}", h);
}
}  // namespace

namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "ckptkit-trace";
// Limits that keep every sum of the cost model inside 64 bits: values (bytes, versions)
// <= 2^44 (16 TiB), times <= 1e7 ms, at most 2^20 segments (planner benchmarks go to 100,000).
constexpr uint64_t kMaxValue = 1ull << 44;
constexpr size_t kMaxSegments = size_t{1} << 20;
// Per-value limits alone do not bound the sums at 2^20 segments (2^20 x 2^44 = 2^64), so the
// trace's totals are bounded too: every byte figure summed (sizes, state, regions' metadata)
// <= 2^60 (1 EiB), every time summed <= 1e9 ms, and copying 3 x that byte total at the
// device's copy_gbps <= 4e18 ns. Then every held prefix, work and preserved sum fits in
// int64, and step time <= 2 x 1e9 ms + 4e18 ns < 2^63 ns.
constexpr double kMaxTotalBytes = 1152921504606846976.0;   // 2^60
constexpr double kMaxTotalMs = 1e9;
constexpr double kMaxCopyNs = 4e18;
constexpr uint64_t kMaxRegionMeta = 16;   // bytes of index metadata per region (contract.h)
// Largest trace file read (the compact tree uses 32-bit offsets).
constexpr uint64_t kMaxFileBytes = uint64_t{4} << 30;

// Member `key` of object o, or nullptr (J = nlohmann::json or JsonTree::Node).
const json* member(const json& o, const char* key) {
    auto it = o.find(key);
    return it == o.end() ? nullptr : &*it;
}
const JsonTree::Node* member(const JsonTree::Node& o, const char* key) { return o.find(key); }

// Field access with a clear message (the path of the field) on a missing or mistyped field.
// One reader for both JSON representations: nlohmann::json (trace_from_json) and the compact
// JsonTree (load_trace's fast path for large traces).
template <class J>
struct Reader {
    const std::string& file;
    [[noreturn]] void fail(const std::string& what) const { throw BadInput(file, what); }
    const J& field(const J& o, const char* key, const std::string& where) const {
        if (!o.is_object()) fail(where + ": expected an object");
        const J* m = member(o, key);
        if (!m) fail(fmt::format("{}: missing field '{}'", where, key));
        return *m;
    }
    uint64_t u64(const J& o, const char* key, const std::string& where) const {
        const J& v = field(o, key, where);
        if (!v.is_number_integer() || (!v.is_number_unsigned() && v.template get<int64_t>() < 0))
            fail(fmt::format("{}.{}: expected a non-negative integer", where, key));
        uint64_t x = v.template get<uint64_t>();
        if (x > kMaxValue)
            fail(fmt::format("{}.{}: {} is implausibly large (limit 2^44)", where, key, x));
        return x;
    }
    uint64_t u64_or(const J& o, const char* key, const std::string& where, uint64_t d) const {
        return o.contains(key) ? u64(o, key, where) : d;
    }
    double ms(const J& o, const char* key, const std::string& where) const {
        const J& v = field(o, key, where);
        if (!v.is_number()) fail(fmt::format("{}.{}: expected a number", where, key));
        double d = v.template get<double>();
        if (!std::isfinite(d) || d < 0 || d > 1e7)
            fail(fmt::format("{}.{}: expected a finite non-negative time", where, key));
        return d;
    }
    std::string str(const J& o, const char* key, const std::string& where) const {
        const J& v = field(o, key, where);
        if (!v.is_string()) fail(fmt::format("{}.{}: expected a string", where, key));
        return v.template get<std::string>();
    }
    const J& arr(const J& o, const char* key, const std::string& where) const {
        const J& v = field(o, key, where);
        if (!v.is_array()) fail(fmt::format("{}.{}: expected an array", where, key));
        return v;
    }
};

template <class J>
std::vector<Region> read_regions(const Reader<J>& r, const J& a, const std::string& where,
                                 uint64_t size) {
    std::vector<Region> out;
    out.reserve(a.size());
    uint64_t prev_end = 0;
    for (size_t k = 0; k < a.size(); ++k) {
        const J& p = a[k];
        auto w = [&] { return fmt::format("{}.regions[{}]", where, k); };   // on failure only
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() ||
            !p[1].is_number_integer() || p[0].template get<int64_t>() < 0 || p[1].template get<int64_t>() < 0)
            r.fail(w() + ": expected [offset, length]");
        Region g{p[0].template get<uint64_t>(), p[1].template get<uint64_t>()};
        if (g.length == 0 || g.offset > size || g.length > size - g.offset)
            r.fail(fmt::format("{}: [{}, {}] outside the buffer's {} bytes", w(), g.offset,
                               g.length, size));
        if (k > 0 && g.offset < prev_end) r.fail(w() + ": regions overlap or are not sorted");
        prev_end = g.offset + g.length;
        out.push_back(g);
    }
    return out;
}

template <class J>
Trace read_trace(const J& j, const std::string& file) {
    Reader<J> r{file};
    if (!j.is_object()) r.fail("expected a JSON object");
    if (r.str(j, "format", "trace") != kFormat)
        r.fail(fmt::format("format is not '{}'", kFormat));
    const uint64_t format_version = r.u64(j, "format_version", "trace");
    if (format_version != 1 && format_version != 2)
        r.fail(fmt::format("unsupported format_version {} (this tool reads 1 and 2)", format_version));
    Trace t;
    t.format_version = static_cast<int>(format_version);
    if (format_version >= 2 && j.contains("fingerprint"))
        t.fingerprint = r.str(r.field(j, "fingerprint", "trace"), "hash", "fingerprint");
    t.source = j.value("source", "");
    t.model = j.value("model", "");
    if (j.contains("device")) {
        const J& d = r.field(j, "device", "trace");
        if (d.contains("copy_gbps")) {
            t.copy_gbps = r.ms(d, "copy_gbps", "device");
            if (t.copy_gbps < 1e-3) r.fail("device.copy_gbps must be at least 0.001");
        }
    }
    const J& fixed = r.field(j, "fixed", "trace");
    t.param_bytes = r.u64(fixed, "param_bytes", "fixed");
    t.grad_bytes = r.u64(fixed, "grad_bytes", "fixed");
    t.optimizer_bytes = r.u64(fixed, "optimizer_bytes", "fixed");
    double total_bytes = double(t.param_bytes) + double(t.grad_bytes) + double(t.optimizer_bytes);
    double total_ms = 0;

    std::map<std::string, uint64_t> size, version;
    const J& bufs = r.arr(j, "buffers", "trace");
    for (size_t k = 0; k < bufs.size(); ++k) {
        auto w = fmt::format("buffers[{}]", k);
        BufferInfo b{r.str(bufs[k], "id", w), r.u64(bufs[k], "bytes", w)};
        if (format_version >= 2 && bufs[k].contains("kind")) {
            b.kind = r.str(bufs[k], "kind", w);
            if (b.kind != "buffer" && b.kind != "param" && b.kind != "input")
                r.fail(fmt::format("{}.kind: '{}' is not buffer, param or input", w, b.kind));
        }
        if (size.count(b.id)) r.fail(fmt::format("{}: duplicate buffer id '{}'", w, b.id));
        size[b.id] = b.bytes;
        version[b.id] = 0;
        total_bytes += double(b.bytes);
        t.buffers.push_back(b);
    }
    const J& segs = r.arr(j, "segments", "trace");
    if (segs.empty()) r.fail("trace has no segments");
    if (segs.size() > kMaxSegments) r.fail("more than 1048576 segments");
    std::unordered_set<std::string_view> names;   // views of t.segments[k].name (reserved)
    names.reserve(segs.size());
    t.segments.reserve(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
        const J& s = segs[i];
        auto w = fmt::format("segments[{}]", i);
        Segment g;
        g.name = r.str(s, "name", w);
        if (g.name.empty() || names.count(g.name))
            r.fail(fmt::format("{}: empty or duplicate segment name '{}'", w, g.name));
        g.forward_ms = r.ms(s, "forward_ms", w);
        g.backward_ms = s.contains("backward_ms") ? r.ms(s, "backward_ms", w) : 2 * g.forward_ms;
        g.saved_bytes = r.u64(s, "saved_bytes", w);
        g.input_bytes = r.u64_or(s, "input_bytes", w, 0);
        g.output_bytes = r.u64(s, "output_bytes", w);
        g.transient_bytes = r.u64_or(s, "transient_bytes", w, 0);
        total_ms += g.forward_ms + g.backward_ms;
        total_bytes += double(g.saved_bytes) + double(g.input_bytes) + double(g.output_bytes) +
                       double(g.transient_bytes);
        const J* st = s.contains("state") ? &r.arr(s, "state", w) : nullptr;
        const size_t n_state = st ? st->size() : 0;
        for (size_t k = 0; k < n_state; ++k) {
            const J& a = (*st)[k];
            auto wa = fmt::format("{}.state[{}]", w, k);
            StateAccess acc;
            acc.buffer = r.str(a, "buffer", wa);
            if (!size.count(acc.buffer))
                r.fail(fmt::format("{}: buffer '{}' is not in the buffers list", wa, acc.buffer));
            acc.read = a.value("read", true);
            acc.version_read = r.u64(a, "version_read", wa);
            acc.bytes_read = r.u64_or(a, "bytes_read", wa, size[acc.buffer]);
            if (acc.version_read != version[acc.buffer])
                r.fail(fmt::format("{}: reads '{}' at version {} but it is at version {}", wa,
                                   acc.buffer, acc.version_read, version[acc.buffer]));
            if (acc.bytes_read != size[acc.buffer])
                r.fail(fmt::format("{}: bytes_read {} but '{}' holds {} bytes", wa,
                                   acc.bytes_read, acc.buffer, size[acc.buffer]));
            acc.written = a.contains("version_written");
            if (acc.written) {
                acc.version_written = r.u64(a, "version_written", wa);
                if (acc.version_written <= acc.version_read)
                    r.fail(wa + ": version_written must exceed version_read");
                acc.bytes_written = r.u64_or(a, "bytes_written", wa, acc.bytes_read);
                acc.regions = read_regions(r, r.arr(a, "regions", wa), wa, acc.bytes_written);
                version[acc.buffer] = acc.version_written;
                size[acc.buffer] = acc.bytes_written;
                total_bytes += double(acc.bytes_written) +
                               double(kMaxRegionMeta) * double(acc.regions.size());
            }
            total_bytes += double(acc.bytes_read);
            g.state.push_back(std::move(acc));
        }
        const J* rng = s.contains("rng") ? &r.arr(s, "rng", w) : nullptr;
        const size_t n_rng = rng ? rng->size() : 0;
        for (size_t k = 0; k < n_rng; ++k) {
            auto wr = fmt::format("{}.rng[{}]", w, k);
            g.rng.push_back({r.str((*rng)[k], "stream", wr), r.u64((*rng)[k], "state_bytes", wr)});
            total_bytes += double(g.rng.back().state_bytes);
        }
        if (total_bytes > kMaxTotalBytes)
            r.fail(fmt::format("{}: the trace's sizes add up to more than 2^60 bytes (1 EiB)", w));
        if (3 * total_bytes / t.copy_gbps > kMaxCopyNs)
            r.fail(fmt::format("{}: copying the trace's bytes at {} GB/s would take more than "
                               "4e18 ns", w, t.copy_gbps));
        if (total_ms > kMaxTotalMs)
            r.fail(fmt::format("{}: the trace's times add up to more than 1e9 ms", w));
        if (format_version >= 2 && s.contains("non_replayable")) {
            g.non_replayable = r.str(s, "non_replayable", w);
            if (g.non_replayable.empty()) r.fail(w + ".non_replayable: empty reason");
        }
        t.segments.push_back(std::move(g));
        names.insert(t.segments.back().name);   // no reallocation: reserved above
    }
    if (j.contains("backward_order")) {
        const J& bo = r.arr(j, "backward_order", "trace");
        bool reverse = bo.size() == t.segments.size();
        for (size_t k = 0; reverse && k < bo.size(); ++k)
            reverse = bo[k].is_string() &&
                      bo[k].template get<std::string>() == t.segments[t.segments.size() - 1 - k].name;
        if (!reverse)
            r.fail("backward_order must be the reverse of the forward order (the only order "
                   "this planner models)");
    }
    t.hash = trace_hash(j);
    return t;
}

}  // namespace

std::string fnv1a64_hex(const std::string& bytes) {
    return fmt::format("{:016x}", fnv1a64(kFnvOffset, bytes));
}

Trace trace_from_json(const json& j, const std::string& file) { return read_trace(j, file); }

json trace_to_json(const Trace& t) {
    json j = {{"format", kFormat},
              {"format_version", 2},
              {"source", t.source},
              {"model", t.model},
              {"device", {{"copy_gbps", t.copy_gbps}}},
              {"fixed",
               {{"param_bytes", t.param_bytes},
                {"grad_bytes", t.grad_bytes},
                {"optimizer_bytes", t.optimizer_bytes}}}};
    json bufs = json::array();
    for (const auto& b : t.buffers)
        bufs.push_back({{"id", b.id}, {"bytes", b.bytes}, {"kind", b.kind}});
    j["buffers"] = bufs;
    if (!t.fingerprint.empty()) j["fingerprint"] = {{"hash", t.fingerprint}};
    json segs = json::array(), order = json::array();
    for (const auto& s : t.segments) {
        json st = json::array();
        for (const auto& a : s.state) {
            json o = {{"buffer", a.buffer},
                      {"read", a.read},
                      {"version_read", a.version_read},
                      {"bytes_read", a.bytes_read}};
            if (a.written) {
                json rg = json::array();
                for (const auto& g : a.regions) rg.push_back({g.offset, g.length});
                o["version_written"] = a.version_written;
                o["bytes_written"] = a.bytes_written;
                o["regions"] = rg;
            }
            st.push_back(o);
        }
        json rng = json::array();
        for (const auto& u : s.rng) rng.push_back({{"stream", u.stream}, {"state_bytes", u.state_bytes}});
        json sj = {{"name", s.name},
                        {"forward_ms", s.forward_ms},
                        {"backward_ms", s.backward_ms},
                        {"saved_bytes", s.saved_bytes},
                        {"input_bytes", s.input_bytes},
                        {"output_bytes", s.output_bytes},
                        {"transient_bytes", s.transient_bytes},
                        {"state", st},
                        {"rng", rng}};
        if (!s.non_replayable.empty()) sj["non_replayable"] = s.non_replayable;
        segs.push_back(std::move(sj));
    }
    for (auto it = t.segments.rbegin(); it != t.segments.rend(); ++it) order.push_back(it->name);
    j["backward_order"] = order;
    j["segments"] = segs;
    return j;
}

namespace {
// Whole file (or pipe) as text; BadInput for a folder, an unreadable file, or more than
// kMaxFileBytes.
std::string read_text(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw BadInput(path, "is a folder, not a trace file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw BadInput(path, "cannot open file");
    std::string text;   // sized from the file's length, then whatever is left (pipes)
    in.seekg(0, std::ios::end);
    if (auto size = in.tellg(); size > 0 && in.seekg(0)) {
        if (static_cast<uint64_t>(size) > kMaxFileBytes) throw BadInput(path, "larger than 4 GiB");
        text.resize(static_cast<size_t>(size));
        in.read(text.data(), size);
        text.resize(static_cast<size_t>(in.gcount()));
    }
    in.clear(in.rdstate() & std::ios::badbit);
    char buf[1 << 16];
    while (!in.bad() && (in.read(buf, sizeof buf) || in.gcount() > 0)) {
        text.append(buf, static_cast<size_t>(in.gcount()));
        if (text.size() > kMaxFileBytes) throw BadInput(path, "larger than 4 GiB");
    }
    if (in.bad()) throw BadInput(path, "read error");
    return text;
}

// Parse, detect the kind and read. Every failure is BadInput except std::bad_alloc.
Trace load_text(std::string text, const std::string& path) {
    // Fast path for ckptkit traces: the compact tree (no per-node allocation; 100,000-segment
    // traces). Anything it rejects or does not model, valid or not, is read again below with
    // nlohmann::json, which gives the same Trace or the error message.
    if (auto tree = JsonTree::parse(text); tree && tree->root().contains("format")) {
        // A large text is not needed while the tree is read (10^6 segments: ~400 MB); it is
        // read again in the rare case the fallback needs it.
        const bool drop = text.size() > (size_t{64} << 20);
        if (drop) std::string().swap(text);
        try {
            return read_trace(tree->root(), path);
        } catch (const std::exception&) {
        }
        tree.reset();
        if (drop) text = read_text(path);
    }
    json j;
    try {
        j = json::parse(text);
    } catch (const json::parse_error& e) {
        throw BadInput(path, fmt::format("not valid JSON (byte {})", e.byte));
    } catch (const json::exception& e) {
        // out_of_range.406: a number no double holds (1e999, a 400-digit integer).
        std::string what = e.what();
        auto q = what.find('\'');
        std::string number = q == std::string::npos ? "" : what.substr(q + 1);
        if (!number.empty() && number.back() == '\'') number.pop_back();
        if (number.size() > 24) number = number.substr(0, 20) + "...";
        throw BadInput(path, number.empty() ? std::string("not valid JSON: ") + e.what()
                                            : fmt::format("number {} is out of range", number));
    }
    if (j.is_object() && j.contains("format")) {
        try {
            return trace_from_json(j, path);
        } catch (const json::exception& e) {
            throw BadInput(path, std::string("malformed trace: ") + e.what());
        }
    }
    if (j.is_object() && j.contains("schema") && j.contains("nodes")) {
        try {
            return import_execution_trace(j, path);
        } catch (const json::exception& e) {
            throw BadInput(path, std::string("malformed execution trace: ") + e.what());
        }
    }
    throw BadInput(path, "neither a ckptkit trace (no 'format') nor a PyTorch Execution Trace "
                         "(no 'schema'/'nodes')");
}
}  // namespace

Trace load_trace(const std::string& path) {
    try {
        return load_text(read_text(path), path);
    } catch (const BadInput&) {
        throw;
    } catch (const std::bad_alloc&) {
        throw BadInput(path, "out of memory while reading the trace");
    } catch (const std::exception& e) {   // nothing known reaches here; never abort
        throw BadInput(path, std::string("malformed trace: ") + e.what());
    }
}

}  // namespace ckpt::replay
