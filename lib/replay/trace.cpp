// Trace reading, validation and serialisation (formats/trace.md). Reading goes through
// simdjson's DOM (trace_json.h); writing through nlohmann::json.
#include "replay/trace.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <unordered_set>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "common/error.h"
#include "replay/trace_json.h"

namespace ckpt::replay {

namespace {

using json = nlohmann::json;
using simdjson::dom::element;
namespace dom = simdjson::dom;

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
// Largest trace file read (simdjson's DOM: 32-bit offsets).
constexpr uint64_t kMaxFileBytes = kMaxJsonBytes;

// An array's elements; an empty array for anything else (callers check the type first). A
// default dom::array is no empty range (it has no document), hence the parsed "[]".
dom::array empty_array() {
    static const dom::array kEmpty = [] {
        static dom::parser p;
        return p.parse("[]", 2).get_array().value_unsafe();
    }();
    return kEmpty;
}
dom::array elements(element v) {
    dom::array a;
    return v.get(a) == simdjson::SUCCESS ? a : empty_array();
}

// Field access with a clear message (the path of the field) on a missing or mistyped field.
struct Reader {
    const std::string& file;
    [[noreturn]] void fail(const std::string& what) const { throw BadInput(file, what); }
    element field(element o, const char* key, const std::string& where) const {
        if (!o.is_object()) fail(where + ": expected an object");
        auto m = member(o, key);
        if (!m) fail(fmt::format("{}: missing field '{}'", where, key));
        return *m;
    }
    bool has(element o, const char* key) const { return member(o, key).has_value(); }
    uint64_t u64(element o, const char* key, const std::string& where) const {
        const element v = field(o, key, where);
        uint64_t x = 0;
        if (!is_integer(v) || v.get_uint64().get(x) != simdjson::SUCCESS)
            fail(fmt::format("{}.{}: expected a non-negative integer", where, key));
        if (x > kMaxValue)
            fail(fmt::format("{}.{}: {} is implausibly large (limit 2^44)", where, key, x));
        return x;
    }
    uint64_t u64_or(element o, const char* key, const std::string& where, uint64_t d) const {
        return has(o, key) ? u64(o, key, where) : d;
    }
    double ms(element o, const char* key, const std::string& where) const {
        const element v = field(o, key, where);
        double d = 0;
        if (!v.is_number() || v.get_double().get(d) != simdjson::SUCCESS)
            fail(fmt::format("{}.{}: expected a number", where, key));
        if (!std::isfinite(d) || d < 0 || d > 1e7)
            fail(fmt::format("{}.{}: expected a finite non-negative time", where, key));
        return d;
    }
    std::string str(element o, const char* key, const std::string& where) const {
        std::string_view s;
        if (field(o, key, where).get_string().get(s) != simdjson::SUCCESS)
            fail(fmt::format("{}.{}: expected a string", where, key));
        return std::string(s);
    }
    std::string str_or(element o, const char* key, const std::string& where, const char* d) const {
        return has(o, key) ? str(o, key, where) : d;
    }
    bool boolean_or(element o, const char* key, const std::string& where, bool d) const {
        if (!has(o, key)) return d;
        bool b = d;
        if (field(o, key, where).get_bool().get(b) != simdjson::SUCCESS)
            fail(fmt::format("{}.{}: expected true or false", where, key));
        return b;
    }
    dom::array arr(element o, const char* key, const std::string& where) const {
        const element v = field(o, key, where);
        if (!v.is_array()) fail(fmt::format("{}.{}: expected an array", where, key));
        return elements(v);
    }
    /// arr(), or an empty array when the field is absent.
    dom::array arr_or_empty(element o, const char* key, const std::string& where) const {
        return has(o, key) ? arr(o, key, where) : empty_array();
    }
};

// A non-negative integer that simdjson holds as int64 (as the old reader: not above 2^63-1).
bool non_negative_int64(element v, uint64_t& out) {
    int64_t x = 0;
    if (!v.is_int64() || v.get_int64().get(x) != simdjson::SUCCESS || x < 0) return false;
    out = static_cast<uint64_t>(x);
    return true;
}

std::vector<Region> read_regions(const Reader& r, dom::array a, const std::string& where,
                                 uint64_t size) {
    std::vector<Region> out;
    out.reserve(a.size());
    uint64_t prev_end = 0;
    size_t k = 0;
    for (element p : a) {
        auto w = [&] { return fmt::format("{}.regions[{}]", where, k); };   // on failure only
        Region g;
        dom::array pair;
        if (p.get(pair) != simdjson::SUCCESS || pair.size() != 2 ||
            !non_negative_int64(pair.at(0).value_unsafe(), g.offset) ||
            !non_negative_int64(pair.at(1).value_unsafe(), g.length))
            r.fail(w() + ": expected [offset, length]");
        if (g.length == 0 || g.offset > size || g.length > size - g.offset)
            r.fail(fmt::format("{}: [{}, {}] outside the buffer's {} bytes", w(), g.offset,
                               g.length, size));
        if (k > 0 && g.offset < prev_end) r.fail(w() + ": regions overlap or are not sorted");
        prev_end = g.offset + g.length;
        out.push_back(g);
        ++k;
    }
    return out;
}

}  // namespace

Trace read_ckptkit_trace(element j, const std::string& file) {
    Reader r{file};
    if (!j.is_object()) r.fail("expected a JSON object");
    if (r.str(j, "format", "trace") != kFormat)
        r.fail(fmt::format("format is not '{}'", kFormat));
    const uint64_t format_version = r.u64(j, "format_version", "trace");
    if (format_version != 1 && format_version != 2)
        r.fail(fmt::format("unsupported format_version {} (this tool reads 1 and 2)", format_version));
    Trace t;
    t.format_version = static_cast<int>(format_version);
    if (format_version >= 2 && r.has(j, "fingerprint"))
        t.fingerprint = r.str(r.field(j, "fingerprint", "trace"), "hash", "fingerprint");
    t.source = r.str_or(j, "source", "trace", "");
    t.model = r.str_or(j, "model", "trace", "");
    if (r.has(j, "device")) {
        const element d = r.field(j, "device", "trace");
        if (r.has(d, "copy_gbps")) {
            t.copy_gbps = r.ms(d, "copy_gbps", "device");
            if (t.copy_gbps < 1e-3) r.fail("device.copy_gbps must be at least 0.001");
        }
    }
    const element fixed = r.field(j, "fixed", "trace");
    t.param_bytes = r.u64(fixed, "param_bytes", "fixed");
    t.grad_bytes = r.u64(fixed, "grad_bytes", "fixed");
    t.optimizer_bytes = r.u64(fixed, "optimizer_bytes", "fixed");
    if (format_version >= 2) {
        t.outside_bytes = r.u64_or(fixed, "outside_bytes", "fixed", 0);
        t.step_bytes = r.u64_or(fixed, "step_bytes", "fixed", 0);
    }
    double total_bytes = double(t.param_bytes) + double(t.grad_bytes) + double(t.optimizer_bytes) +
                         double(t.outside_bytes) + double(t.step_bytes);
    double total_ms = 0;

    std::map<std::string, uint64_t> size, version;
    std::set<std::string> keys;   // kind "key": a JAX PRNG key, an immutable input
    size_t k = 0;
    for (element buf : r.arr(j, "buffers", "trace")) {
        auto w = fmt::format("buffers[{}]", k++);
        BufferInfo b{r.str(buf, "id", w), r.u64(buf, "bytes", w)};
        if (format_version >= 2 && r.has(buf, "kind")) {
            b.kind = r.str(buf, "kind", w);
            if (b.kind != "buffer" && b.kind != "param" && b.kind != "input" && b.kind != "key")
                r.fail(fmt::format("{}.kind: '{}' is not buffer, param, input or key", w, b.kind));
        }
        if (size.count(b.id)) r.fail(fmt::format("{}: duplicate buffer id '{}'", w, b.id));
        size[b.id] = b.bytes;
        version[b.id] = 0;
        if (b.kind == "key") keys.insert(b.id);
        total_bytes += double(b.bytes);
        t.buffers.push_back(b);
    }
    const dom::array segs = r.arr(j, "segments", "trace");
    const size_t n_segs = segs.size();
    if (n_segs == 0) r.fail("trace has no segments");
    if (n_segs > kMaxSegments) r.fail("more than 1048576 segments");
    std::unordered_set<std::string_view> names;   // views of t.segments[k].name (reserved)
    names.reserve(n_segs);
    t.segments.reserve(n_segs);
    size_t i = 0;
    for (element s : segs) {
        auto w = fmt::format("segments[{}]", i++);
        Segment g;
        g.name = r.str(s, "name", w);
        if (g.name.empty() || names.count(g.name))
            r.fail(fmt::format("{}: empty or duplicate segment name '{}'", w, g.name));
        g.forward_ms = r.ms(s, "forward_ms", w);
        g.backward_ms = r.has(s, "backward_ms") ? r.ms(s, "backward_ms", w) : 2 * g.forward_ms;
        g.saved_bytes = r.u64(s, "saved_bytes", w);
        g.input_bytes = r.u64_or(s, "input_bytes", w, 0);
        g.output_bytes = r.u64(s, "output_bytes", w);
        g.transient_bytes = r.u64_or(s, "transient_bytes", w, 0);
        total_ms += g.forward_ms + g.backward_ms;
        total_bytes += double(g.saved_bytes) + double(g.input_bytes) + double(g.output_bytes) +
                       double(g.transient_bytes);
        size_t ka = 0;
        for (element a : r.arr_or_empty(s, "state", w)) {
            auto wa = fmt::format("{}.state[{}]", w, ka++);
            StateAccess acc;
            acc.buffer = r.str(a, "buffer", wa);
            if (!size.count(acc.buffer))
                r.fail(fmt::format("{}: buffer '{}' is not in the buffers list", wa, acc.buffer));
            acc.read = r.boolean_or(a, "read", wa, true);
            acc.version_read = r.u64(a, "version_read", wa);
            acc.bytes_read = r.u64_or(a, "bytes_read", wa, size[acc.buffer]);
            if (acc.version_read != version[acc.buffer])
                r.fail(fmt::format("{}: reads '{}' at version {} but it is at version {}", wa,
                                   acc.buffer, acc.version_read, version[acc.buffer]));
            if (acc.bytes_read != size[acc.buffer])
                r.fail(fmt::format("{}: bytes_read {} but '{}' holds {} bytes", wa,
                                   acc.bytes_read, acc.buffer, size[acc.buffer]));
            if (format_version >= 2 && r.has(a, "arg")) {
                const uint64_t arg = r.u64(a, "arg", wa);
                if (arg >= kMaxSegments) r.fail(wa + ".arg: more than 2^20 arguments");
                acc.arg = static_cast<int64_t>(arg);
            }
            acc.written = r.has(a, "version_written");
            if (acc.written && keys.count(acc.buffer))
                r.fail(fmt::format("{}: writes '{}', a PRNG key (kind key: an immutable input)", wa,
                                   acc.buffer));
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
        size_t kr = 0;
        for (element u : r.arr_or_empty(s, "rng", w)) {
            auto wr = fmt::format("{}.rng[{}]", w, kr++);
            g.rng.push_back({r.str(u, "stream", wr), r.u64(u, "state_bytes", wr)});
            total_bytes += double(g.rng.back().state_bytes);
        }
        if (total_bytes > kMaxTotalBytes)
            r.fail(fmt::format("{}: the trace's sizes add up to more than 2^60 bytes (1 EiB)", w));
        if (3 * total_bytes / t.copy_gbps > kMaxCopyNs)
            r.fail(fmt::format("{}: copying the trace's bytes at {} GB/s would take more than "
                               "4e18 ns", w, t.copy_gbps));
        if (total_ms > kMaxTotalMs)
            r.fail(fmt::format("{}: the trace's times add up to more than 1e9 ms", w));
        if (format_version >= 2 && r.has(s, "non_replayable")) {
            g.non_replayable = r.str(s, "non_replayable", w);
            if (g.non_replayable.empty()) r.fail(w + ".non_replayable: empty reason");
        }
        if (format_version >= 2 && r.has(s, "ops_hash")) {
            g.ops_hash = r.str(s, "ops_hash", w);
            if (g.ops_hash.size() != 16 ||
                g.ops_hash.find_first_not_of("0123456789abcdef") != std::string::npos)
                r.fail(w + ".ops_hash: expected 16 lowercase hex digits");
        }
        if (format_version >= 2 && r.has(s, "ops")) {
            t.op_tables = true;
            size_t ko = 0;
            const dom::array ops = r.arr(s, "ops", w);
            if (ops.size() > kMaxSegments) r.fail(w + ".ops: more than 2^20 ops");
            g.ops.reserve(ops.size());
            double op_ms = 0;
            for (element o : ops) {
                auto wo = fmt::format("{}.ops[{}]", w, ko++);
                OpCost c;
                c.op = r.str(o, "op", wo);
                if (c.op.empty()) r.fail(wo + ".op: empty op name");
                c.k = r.u64(o, "k", wo);
                c.bytes = r.u64(o, "bytes", wo);
                c.ms = r.ms(o, "ms", wo);
                c.fixed = r.str_or(o, "fixed", wo, "");
                total_bytes += double(c.bytes);
                op_ms += c.ms;
                g.ops.push_back(std::move(c));
            }
            if (total_bytes > kMaxTotalBytes)
                r.fail(fmt::format("{}.ops: the trace's sizes add up to more than 2^60 bytes (1 EiB)", w));
            if (op_ms > kMaxTotalMs) r.fail(fmt::format("{}.ops: the op times add up to more than 1e9 ms", w));
        }
        t.segments.push_back(std::move(g));
        names.insert(t.segments.back().name);   // no reallocation: reserved above
    }
    if (r.has(j, "backward_order")) {
        const dom::array bo = r.arr(j, "backward_order", "trace");
        bool reverse = bo.size() == t.segments.size();
        size_t kb = 0;
        for (element name : bo) {
            std::string_view v;
            if (!reverse) break;
            reverse = name.get_string().get(v) == simdjson::SUCCESS &&
                      v == t.segments[t.segments.size() - 1 - kb].name;
            ++kb;
        }
        if (!reverse)
            r.fail("backward_order must be the reverse of the forward order (the only order "
                   "this planner models)");
    }
    return t;
}

std::string trace_hash(std::string_view bytes) {
    return fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

json trace_to_json(const Trace& t) {
    json j = {{"format", kFormat},
              {"format_version", 2},
              {"source", t.source},
              {"model", t.model},
              {"device", {{"copy_gbps", t.copy_gbps}}},
              {"fixed",
               {{"param_bytes", t.param_bytes},
                {"grad_bytes", t.grad_bytes},
                {"optimizer_bytes", t.optimizer_bytes},
                {"outside_bytes", t.outside_bytes},
                {"step_bytes", t.step_bytes}}}};
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
            if (a.arg >= 0) o["arg"] = a.arg;
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
        if (!s.ops_hash.empty()) sj["ops_hash"] = s.ops_hash;
        if (!s.ops.empty()) {
            json ops = json::array();
            for (const auto& o : s.ops) {
                json oj = {{"op", o.op}, {"k", o.k}, {"bytes", o.bytes}, {"ms", o.ms}};
                if (!o.fixed.empty()) oj["fixed"] = o.fixed;
                ops.push_back(std::move(oj));
            }
            sj["ops"] = std::move(ops);
        }
        segs.push_back(std::move(sj));
    }
    for (auto it = t.segments.rbegin(); it != t.segments.rend(); ++it) order.push_back(it->name);
    j["backward_order"] = order;
    j["segments"] = segs;
    return j;
}

namespace {
// Whole file (or pipe) as text, followed by kJsonPadding zero bytes (simdjson reads them;
// they are not part of the file). BadInput for a folder, an unreadable file, or more than
// kMaxFileBytes.
std::string read_padded(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw BadInput(path, "is a folder, not a trace file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw BadInput(path, "cannot open file");
    std::string text;   // sized from the file's length, then whatever is left (pipes)
    in.seekg(0, std::ios::end);
    if (auto size = in.tellg(); size > 0 && in.seekg(0)) {
        if (static_cast<uint64_t>(size) > kMaxFileBytes) throw BadInput(path, "larger than 4 GiB");
        text.reserve(static_cast<size_t>(size) + kJsonPadding);
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
    text.resize(text.size() + kJsonPadding, '\0');
    return text;
}

// What a trace text is, from its top-level object's members.
enum class TraceKind { Ckptkit, ExecutionTrace };
TraceKind kind_of(element root, const std::string& file) {
    if (member(root, "format")) return TraceKind::Ckptkit;
    if (member(root, "schema") && member(root, "nodes")) return TraceKind::ExecutionTrace;
    throw BadInput(file, "neither a ckptkit trace (no 'format') nor a PyTorch Execution Trace "
                         "(no 'schema'/'nodes')");
}

// Hash, parse, detect the kind and read `padded` (the text + kJsonPadding zero bytes; freed
// once parsed: the DOM holds its own copy of every value). Every failure is BadInput except
// std::bad_alloc. `want`: the kind the caller requires (nullptr: either).
Trace read_padded_text(std::string padded, const std::string& file, const TraceKind* want) {
    const size_t len = padded.size() - kJsonPadding;
    const std::string hash = trace_hash(std::string_view(padded).substr(0, len));
    JsonDoc doc;
    parse_trace_json(doc, padded, len, file);
    std::string().swap(padded);
    const TraceKind kind = kind_of(doc.root, file);
    if (want && kind != *want)
        throw BadInput(file, *want == TraceKind::Ckptkit ? "not a ckptkit trace (no 'format')"
                                                         : "not a PyTorch Execution Trace");
    Trace t = kind == TraceKind::Ckptkit ? read_ckptkit_trace(doc.root, file)
                                         : read_execution_trace(doc.root, file);
    t.hash = hash;
    return t;
}

std::string padded_copy(std::string_view text) {
    std::string s;
    s.reserve(text.size() + kJsonPadding);
    s.append(text);
    s.resize(text.size() + kJsonPadding, '\0');
    return s;
}

// Every exception but BadInput as BadInput (bad_alloc: "out of memory"); never abort.
template <class F>
Trace as_bad_input(const std::string& file, F&& read) {
    try {
        return read();
    } catch (const BadInput&) {
        throw;
    } catch (const std::bad_alloc&) {
        throw BadInput(file, "out of memory while reading the trace");
    } catch (const std::exception& e) {   // nothing known reaches here
        throw BadInput(file, std::string("malformed trace: ") + e.what());
    }
}
}  // namespace

Trace load_trace(const std::string& path) {
    return as_bad_input(path, [&] { return read_padded_text(read_padded(path), path, nullptr); });
}

Trace parse_trace(std::string_view text, const std::string& file) {
    return as_bad_input(file, [&] { return read_padded_text(padded_copy(text), file, nullptr); });
}

Trace trace_from_json(const json& j, const std::string& file) {
    static const TraceKind kWant = TraceKind::Ckptkit;
    return as_bad_input(file, [&] { return read_padded_text(padded_copy(j.dump()), file, &kWant); });
}

Trace import_execution_trace(const json& j, const std::string& file) {
    static const TraceKind kWant = TraceKind::ExecutionTrace;
    return as_bad_input(file, [&] { return read_padded_text(padded_copy(j.dump()), file, &kWant); });
}

}  // namespace ckpt::replay
