#include "container/manifest.h"

#include <fmt/compile.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>

namespace ckpt::container {

const char* const kRoleNames[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
std::string codes_path(int r) { return std::string("/moments/codes/") + kRoleNames[r]; }
std::string params_path(int r) { return std::string("/moments/params/") + kRoleNames[r]; }
std::string escapes_path(int r) { return std::string("/moments/escapes/") + kRoleNames[r]; }
std::string segments_path(int r) { return std::string("/moments/segments/") + kRoleNames[r]; }

using nlohmann::json;

namespace {
json num(double x) { return std::isfinite(x) ? json(x) : json(x > 0 ? "inf" : "-inf"); }

// Reading: simdjson's On-Demand API (the manifest of 10^5 parameters is ~100 MB of JSON;
// nlohmann's tree, then simdjson's DOM tape, was most of a many-tensor verify's time and
// memory). Values are read as they are looked up, with the keys in the order the writer
// puts them (sorted), so each lookup moves forward. Each getter refuses a missing field or
// a wrong type with the field's name; integers are range-checked, never wrapped or
// rounded; any other simdjson error (malformed text) is "not valid JSON".
namespace od = simdjson::ondemand;
[[noreturn]] void not_json(simdjson::error_code e) {
    throw std::runtime_error(std::string("manifest is not valid JSON: ") + simdjson::error_message(e));
}
[[noreturn]] void bad_field(const char* k, const char* what) {
    throw std::runtime_error(std::string("manifest field '") + k + "' " + what);
}
/// Whether `e` says the value has another type or range (the caller names the field), else
/// not_json.
bool type_error(simdjson::error_code e) {
    if (e == simdjson::INCORRECT_TYPE || e == simdjson::NUMBER_OUT_OF_RANGE) return true;
    if (e) not_json(e);
    return false;
}
/// Field k of object o into v; false when absent.
bool field(od::object& o, const char* k, od::value& v) {
    const simdjson::error_code e = o.find_field_unordered(k).get(v);
    if (e == simdjson::NO_SUCH_FIELD) return false;
    if (e) not_json(e);
    return true;
}
/// A number value, or the string "inf"; `k` names it in errors.
double num_value(od::value& v, const char* k) {
    od::json_type t;
    if (type_error(v.type().get(t))) bad_field(k, "is not a number");
    if (t == od::json_type::number) {
        double d;
        if (type_error(v.get_double().get(d))) bad_field(k, "is not a number");
        return d;
    }
    std::string_view sv;
    if (t == od::json_type::string && !type_error(v.get_string().get(sv)) && sv == "inf") return INFINITY;
    bad_field(k, "is not a number");
}
double get_num(od::object& o, const char* k) {
    od::value v;
    if (!field(o, k, v)) bad_field(k, "is missing");
    return num_value(v, k);
}
uint64_t get_u64(od::object& o, const char* k) {
    od::value v;
    uint64_t x = 0;
    if (!field(o, k, v) || type_error(v.get_uint64().get(x))) bad_field(k, "is missing or not a count");
    return x;
}
/// An integer value (any sign) that fits int64; `k` names it in errors.
int64_t int_value(od::value& v, const char* k) {
    od::number_type t;
    if (type_error(v.get_number_type().get(t)) ||
        (t != od::number_type::signed_integer && t != od::number_type::unsigned_integer))
        bad_field(k, "is missing or not an integer");
    int64_t x = 0;
    if (type_error(v.get_int64().get(x))) bad_field(k, "is out of range");  // above 2^63 - 1
    return x;
}
int64_t get_i64(od::object& o, const char* k) {
    od::value v;
    if (!field(o, k, v)) bad_field(k, "is missing or not an integer");
    return int_value(v, k);
}
/// An integer value or field that must fit an int (indices, versions, sizes in blocks): a
/// larger value is refused, never wrapped into range.
int int32_value(od::value& v, const char* k) {
    const int64_t x = int_value(v, k);
    if (x < INT32_MIN || x > INT32_MAX) bad_field(k, "is out of range");
    return int(x);
}
int get_int(od::object& o, const char* k) {
    od::value v;
    if (!field(o, k, v)) bad_field(k, "is missing or not an integer");
    return int32_value(v, k);
}
std::string get_str(od::object& o, const char* k) {
    od::value v;
    std::string_view sv;
    if (!field(o, k, v) || type_error(v.get_string().get(sv))) bad_field(k, "is missing or not a string");
    return std::string(sv);
}
bool get_bool(od::object& o, const char* k) {
    od::value v;
    bool x = false;
    if (!field(o, k, v) || type_error(v.get_bool().get(x))) bad_field(k, "is missing or not a boolean");
    return x;
}
/// Field k as an object, false when absent or not an object.
bool get_object(od::object& o, const char* k, od::object& out) {
    od::value v;
    return field(o, k, v) && !type_error(v.get_object().get(out));
}
/// Field k as an array, false when absent or not an array.
bool get_array(od::object& o, const char* k, od::array& out) {
    od::value v;
    return field(o, k, v) && !type_error(v.get_array().get(out));
}
/// The moment float type spelled `s` (F32, F16, BF16); nullopt for any other spelling.
std::optional<DType> moment_dtype(const std::string& s) {
    const std::optional<DType> d = dtype_from_name(s);
    if (d && float_dtype_size(*d) != 0) return d;
    return std::nullopt;
}
}  // namespace

codec::MomentType moment_type(DType d) {
    return d == DType::F32 ? codec::MomentType::F32 : d == DType::F16 ? codec::MomentType::F16 : codec::MomentType::BF16;
}

codec::TensorSetup tensor_setup(const ParamEntry& e, codec::Kind kind, double tolerance, int format_version) {
    codec::TensorSetup s;
    s.format6 = format_version >= 6;
    s.kind = kind;
    s.hyper = e.hyper;
    s.tolerance = tolerance;
    s.domain = e.domain;
    s.type = moment_type(e.dtype);
    return s;
}

namespace {

/// A double as nlohmann's dump writes it, without a json value: the shortest round-trip
/// digits of nlohmann::detail::to_chars (what its serializer::dump_float calls), "null" for
/// a non-finite one.
class JsonDouble {
public:
    explicit JsonDouble(double x) {
        if (!std::isfinite(x)) {
            n_ = 4;
            std::memcpy(buf_, "null", 4);
        } else {
            n_ = std::size_t(nlohmann::detail::to_chars(buf_, buf_ + sizeof buf_, x) - buf_);
        }
    }
    std::string_view view() const { return {buf_, n_}; }

private:
    char buf_[64];  // nlohmann's number_buffer size
    std::size_t n_;
};

/// A string as nlohmann's dump writes it: quoted as it is when it holds only printable
/// ASCII other than '"' and '\\' (no escape applies), else by nlohmann itself (escapes,
/// UTF-8 check).
std::string json_string(std::string_view s) {
    for (const char c : s)
        if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') return json(std::string(s)).dump();
    std::string out;
    out.reserve(s.size() + 2);
    out += '"';
    out += s;
    out += '"';
    return out;
}

/// The manifest's name of a step dtype (AdamHyper::step_bits).
const char* step_dtype_name(int bits) { return bits == 24 ? "F32" : bits == 11 ? "F16" : bits == 8 ? "BF16" : "exact"; }

/// One "params" entry as compact JSON with sorted keys: byte for byte nlohmann's dump of
/// the same object (numbers and strings formatted as nlohmann does), without building its
/// tree, and with a format string parsed at compile time (the manifest of 10^5 parameters
/// is written once per compress and sized once per report).
std::string param_json(const ParamEntry& p) {
    const auto& h = p.hyper;
    auto b = [](bool x) { return x ? "true" : "false"; };
    auto d = [](double x) { return JsonDouble(x); };
    std::string shape = "[";
    for (std::size_t i = 0; i < p.shape.size(); ++i) fmt::format_to(std::back_inserter(shape), FMT_COMPILE("{}{}"), i ? "," : "", p.shape[i]);
    shape += "]";
    return fmt::format(
        FMT_COMPILE("{{\"block_offset\":{},\"code_offset\":{},\"domain\":{{\"l2\":{},\"plain\":{},\"theta_bound\":{}}},"
                    "\"dtype\":{},\"escape_causes\":{{\"certificate\":{},\"no_code\":{},\"non_finite\":{}}},"
                    "\"escape_offset\":{},\"escapes\":{},\"hyper\":{{\"amsgrad\":{},\"beta1\":{},\"beta2\":{},\"eps\":{},"
                    "\"lr\":{},\"maximize\":{},\"step\":{},\"step_dtype\":{},\"weight_decay\":{}}},\"max_bound\":{},\"name\":{},\"numel\":{},"
                    "\"row_predict\":{},\"shape\":{},\"storage\":[{},{},{}],\"theta_candidates\":{},\"theta_dtype\":{},"
                    "\"theta_storage\":{}}}"),
        p.block_offset, p.code_offset, b(p.domain.l2), b(p.domain.plain), d(p.domain.theta_bound).view(),
        json_string(dtype_name(p.dtype)), p.escape_causes[1], p.escape_causes[0], p.escape_causes[2], p.escape_offset,
        p.escapes, b(h.amsgrad), d(h.beta1).view(), d(h.beta2).view(), d(h.eps).view(), d(h.lr).view(), b(h.maximize),
        d(h.step).view(), json_string(step_dtype_name(h.step_bits)), d(h.weight_decay).view(), d(p.max_bound).view(), json_string(p.name), p.numel,
        b(p.row_predict), shape, p.storage[0], p.storage[1], p.storage[2], p.theta_candidates,
        json_string(p.theta_dtype ? dtype_name(*p.theta_dtype) : ""), p.theta_storage);
}

/// One "storages" entry likewise (integers only).
std::string storage_json(const StorageEntry& s) {
    std::string crc = "[";
    for (std::size_t i = 0; i < s.crc_offsets.size(); ++i) fmt::format_to(std::back_inserter(crc), FMT_COMPILE("{}{}"), i ? "," : "", s.crc_offsets[i]);
    crc += "]";
    return fmt::format(FMT_COMPILE("{{\"crc_offsets\":{},\"nbytes\":{},\"offset\":{},\"param\":{},\"role\":{},\"xxh3\":{}}}"),
                       crc, s.nbytes, s.offset, s.param, s.role, s.xxh3);
}

}  // namespace

void Manifest::write_json(const std::function<void(std::string_view)>& sink) const {
    // The header as one small object with empty arrays, then the three arrays' entries
    // written where nlohmann's (sorted-key, compact) dump put "[]": byte for byte the dump
    // of the whole tree, in memory of one entry at a time. A string value cannot hold
    // `"params":[]` (its quotes would be escaped), so each pattern occurs exactly once.
    json j;
    j["format"] = "ckptkit-container";
    j["format_version"] = format_version;
    j["tool_version"] = tool_version;
    j["source"] = {{"format", source_format}, {"name", source_name}, {"size", source_size}};
    j["codec"] = codec::kind_name(codec);
    j["block"] = block;
    j["tolerance"] = tolerance;
    j["grad_bound"] = num(grad_bound);
    j["optimizer"] = optimizer;
    j["param_bound"] = param_bound;
    if (format_version >= 5) j["horizon"] = horizon == 0 ? json("all") : json(horizon);
    if (bound_param) j["bound"] = "param";
    j["storages"] = json::array();
    j["params"] = json::array();
    j["kept"] = json::array();
    const std::string text = j.dump();
    std::size_t from = 0;
    auto array = [&](const char* key, const auto& items, auto entry_json) {  // in the text's (sorted) key order
        const std::string pattern = std::string("\"") + key + "\":[]";
        const std::size_t close = text.find(pattern) + pattern.size() - 1;  // its ']'
        sink(std::string_view(text).substr(from, close - from));
        for (std::size_t i = 0; i < items.size(); ++i) {
            if (i) sink(",");
            sink(entry_json(items[i]));
        }
        from = close;
    };
    array("kept", kept, [](const KeptEntry& k) {
        return json{{"name", k.name}, {"values", k.values}, {"nbytes", k.nbytes}, {"note", k.note}}.dump();
    });
    array("params", params, param_json);
    array("storages", storages, storage_json);
    sink(std::string_view(text).substr(from));
}

std::string Manifest::to_json() const {
    std::string text;
    write_json([&](std::string_view piece) { text.append(piece); });
    return text;
}

namespace {

/// The optional list of states kept exact.
void parse_kept(od::array& a, Manifest& m) {
    for (auto item : a) {
        od::object k;
        if (type_error(item.get_object().get(k))) throw std::runtime_error("manifest kept entry is not an object");
        KeptEntry e;
        e.name = get_str(k, "name");
        e.nbytes = get_u64(k, "nbytes");
        e.note = get_str(k, "note");
        e.values = get_u64(k, "values");
        m.kept.push_back(std::move(e));
    }
}

/// Adam's hyper-parameters: finite, and in torch.optim.Adam's own argument ranges.
codec::AdamHyper parse_hyper(od::object& h, const std::string& name) {
    codec::AdamHyper hy;
    hy.amsgrad = get_bool(h, "amsgrad");
    hy.beta1 = get_num(h, "beta1");
    hy.beta2 = get_num(h, "beta2");
    hy.eps = get_num(h, "eps");
    hy.lr = get_num(h, "lr");
    hy.maximize = get_bool(h, "maximize");
    hy.step = get_num(h, "step");
    od::value sd;
    if (field(h, "step_dtype", sd)) {  // format 5
        std::string_view t;
        if (type_error(sd.get_string().get(t))) bad_field("step_dtype", "is not a string");
        hy.step_bits = t == "F32" ? 24 : t == "F16" ? 11 : t == "BF16" ? 8 : t == "exact" ? 0 : -1;
        if (hy.step_bits < 0) throw std::runtime_error("param " + name + ": unknown step_dtype");
    }
    hy.weight_decay = get_num(h, "weight_decay");
    for (double x : {hy.lr, hy.beta1, hy.beta2, hy.eps, hy.weight_decay, hy.step})
        if (!std::isfinite(x)) throw std::runtime_error("param " + name + ": non-finite hyper-parameter");
    // torch.optim.Adam's own argument checks, and a state exists only after a step
    if (!(hy.lr >= 0) || !(hy.beta1 >= 0 && hy.beta1 < 1) ||
        !(hy.beta2 >= 0 && hy.beta2 < 1) || !(hy.eps >= 0) ||
        !(hy.step >= 0) || hy.step != std::floor(hy.step))
        throw std::runtime_error("param " + name + ": hyper-parameters out of range (lr >= 0, 0 <= betas < 1, eps >= 0, integer step >= 0)");
    return hy;
}

/// One params entry, each field checked on its own (cross-references: Manifest::validate).
/// The name first (errors name the parameter), then the fields in the writer's order.
ParamEntry parse_param(od::value& pv) {
    od::object p;
    if (type_error(pv.get_object().get(p))) throw std::runtime_error("manifest param entry is not an object");
    ParamEntry e;
    e.name = get_str(p, "name");
    const std::string& name = e.name;
    e.block_offset = get_u64(p, "block_offset");
    e.code_offset = get_u64(p, "code_offset");
    od::object domain, hyper, causes;
    if (!get_object(p, "domain", domain)) throw std::runtime_error("param " + name + ": hyper/domain missing");
    e.domain.l2 = get_bool(domain, "l2");
    e.domain.plain = get_bool(domain, "plain");
    e.domain.theta_bound = get_num(domain, "theta_bound");
    const std::optional<DType> dtype = moment_dtype(get_str(p, "dtype"));
    if (!dtype) throw std::runtime_error("param " + name + ": bad dtype");
    e.dtype = *dtype;
    od::value v;
    const bool has_causes = field(p, "escape_causes", v);
    if (has_causes) {
        if (type_error(v.get_object().get(causes))) throw std::runtime_error("param " + name + ": escape_causes malformed");
        e.escape_causes[1] = get_u64(causes, "certificate");
        e.escape_causes[0] = get_u64(causes, "no_code");
        e.escape_causes[2] = get_u64(causes, "non_finite");
    }
    e.escape_offset = get_u64(p, "escape_offset");
    e.escapes = get_u64(p, "escapes");
    if (!get_object(p, "hyper", hyper)) throw std::runtime_error("param " + name + ": hyper/domain missing");
    e.hyper = parse_hyper(hyper, name);
    e.domain.weight_decay = e.hyper.weight_decay;
    e.max_bound = get_num(p, "max_bound");
    e.numel = get_u64(p, "numel");
    if (field(p, "row_predict", v) && type_error(v.get_bool().get(e.row_predict)))
        throw std::runtime_error("param " + name + ": row_predict is not a boolean");
    od::array arr;
    if (field(p, "shape", v)) {  // optional: integers in [0, 2^40] whose product is numel
        if (type_error(v.get_array().get(arr))) throw std::runtime_error("param " + name + ": shape malformed");
        int64_t n = 1;
        for (auto item : arr) {
            od::value d;
            int64_t x = 0;
            if (item.get(d) || type_error(d.get_int64().get(x)) || x < 0 || x > (int64_t(1) << 40))
                throw std::runtime_error("param " + name + ": shape malformed");
            e.shape.push_back(x);
            n = std::min<int64_t>(n * x, int64_t(1) << 62);
        }
        if (uint64_t(n) != e.numel) throw std::runtime_error("param " + name + ": shape does not match numel");
    }
    if (!get_array(p, "storage", arr)) throw std::runtime_error("param " + name + ": storage list malformed");
    int r = 0;
    for (auto item : arr) {
        od::value x;
        int64_t idx = 0;
        if (r == 3 || item.get(x) || type_error(x.get_int64().get(idx)) || idx < INT32_MIN || idx > INT32_MAX)
            throw std::runtime_error("param " + name + ": storage " + (r == 3 ? "list malformed" : "index malformed"));
        e.storage[r++] = int(idx);
    }
    if (r != 3) throw std::runtime_error("param " + name + ": storage list malformed");
    if (field(p, "theta_candidates", v)) e.theta_candidates = int32_value(v, "theta_candidates");
    const std::string theta_dtype = get_str(p, "theta_dtype");
    e.theta_storage = get_i64(p, "theta_storage");
    if (!theta_dtype.empty()) e.theta_dtype = moment_dtype(theta_dtype);
    if (e.theta_storage >= 0 ? !e.theta_dtype : !theta_dtype.empty())
        throw std::runtime_error("param " + name + ": bad theta_dtype");
    if (has_causes) {
        uint64_t sum = 0;
        for (uint64_t c : e.escape_causes) {
            if (c > e.escapes) throw std::runtime_error("param " + name + ": escape_causes exceed escapes");
            sum += c;
        }
        if (sum > e.escapes) throw std::runtime_error("param " + name + ": escape_causes add up to more than escapes");
    }
    if (e.escapes > e.numel) throw std::runtime_error("param " + name + ": more escapes than values");
    return e;
}

/// One storages entry, its fields' types (ranges and indices: Manifest::validate).
StorageEntry parse_storage(od::value& sv) {
    od::object s;
    if (type_error(sv.get_object().get(s))) throw std::runtime_error("manifest storage entry is not an object");
    StorageEntry e;
    od::array a;
    if (!get_array(s, "crc_offsets", a)) throw std::runtime_error("storage crc_offsets malformed");
    for (auto item : a) {
        od::value c;
        uint64_t v = 0;
        if (item.get(c) || type_error(c.get_uint64().get(v))) throw std::runtime_error("storage crc offset out of range");
        e.crc_offsets.push_back(v);
    }
    e.nbytes = get_u64(s, "nbytes");
    e.offset = get_u64(s, "offset");
    e.param = get_int(s, "param");
    e.role = get_int(s, "role");
    e.xxh3 = get_u64(s, "xxh3");
    return e;
}

}  // namespace

Manifest Manifest::parse(const std::string& text) {
    // the text is parsed in place when its buffer has simdjson's padding (read_manifest
    // reserves it), else from a padded copy
    std::optional<simdjson::padded_string> copy;
    if (text.capacity() - text.size() < simdjson::SIMDJSON_PADDING) copy.emplace(text);
    const simdjson::padded_string_view in =
        copy ? simdjson::padded_string_view(*copy) : simdjson::padded_string_view(text.data(), text.size(), text.capacity());
    od::parser parser;
    od::document doc;
    if (const auto e = parser.iterate(in).get(doc)) not_json(e);
    od::object j;
    std::string_view format;
    od::value v;
    if (type_error(doc.get_object().get(j)) || !field(j, "format", v) || type_error(v.get_string().get(format)) ||
        format != "ckptkit-container")
        throw std::runtime_error("manifest is not a ckptkit container manifest");
    Manifest m;
    m.format_version = get_int(j, "format_version");
    if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion)
        throw std::runtime_error("container format version " + std::to_string(m.format_version) + " is not supported");
    // the rest in the writer's (sorted) key order; cross-field checks once all is read
    if (field(j, "bound", v)) {  // format 6: "param" or "update"
        std::string_view t;
        if (m.format_version < 6 || type_error(v.get_string().get(t)) || (t != "param" && t != "update"))
            throw std::runtime_error("manifest bound is not \"param\" or \"update\" (format 6)");
        m.bound_param = t == "param";
    }
    m.grad_bound = get_num(j, "grad_bound");
    if (field(j, "horizon", v)) {  // format 5: "all" or 1
        od::json_type jt = od::json_type::null;
        std::string_view t;
        uint64_t k = 0;
        if (type_error(v.type().get(jt))) jt = od::json_type::null;
        if (jt == od::json_type::string && !type_error(v.get_string().get(t)) && t == "all") m.horizon = 0;
        else if (jt == od::json_type::number && !type_error(v.get_uint64().get(k)) && k == 1) m.horizon = 1;
        else throw std::runtime_error("manifest horizon is not \"all\" or 1");
    }
    od::array arr;
    if (field(j, "kept", v)) {
        if (type_error(v.get_array().get(arr))) throw std::runtime_error("manifest field 'kept' is not a list");
        parse_kept(arr, m);
    }
    m.optimizer = get_str(j, "optimizer");
    if (field(j, "param_bound", v)) {
        m.param_bound = num_value(v, "param_bound");
        if (!(m.param_bound == -1 || m.param_bound >= 0)) throw std::runtime_error("manifest param_bound is invalid");
    }
    if (!get_array(j, "params", arr)) throw std::runtime_error("manifest lacks 'storages' or 'params'");
    for (auto item : arr) {
        od::value pv;
        if (const auto e = item.get(pv)) not_json(e);
        m.params.push_back(parse_param(pv));
        m.params.back().domain.grad_bound = m.grad_bound;
        m.params.back().hyper.horizon = m.horizon;
        m.params.back().hyper.bound_param = m.bound_param;
    }
    od::object src;
    if (!get_object(j, "source", src)) throw std::runtime_error("manifest field 'source' is missing");
    m.source_format = get_str(src, "format");
    m.source_name = get_str(src, "name");
    m.source_size = get_u64(src, "size");
    if (!get_array(j, "storages", arr)) throw std::runtime_error("manifest lacks 'storages' or 'params'");
    for (auto item : arr) {
        od::value sv;
        if (const auto e = item.get(sv)) not_json(e);
        m.storages.push_back(parse_storage(sv));
    }
    m.tolerance = get_num(j, "tolerance");
    m.tool_version = get_str(j, "tool_version");
    m.block = get_int(j, "block");
    try {
        m.codec = codec::kind_from_name(get_str(j, "codec"));
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(e.what());
    }
    if (codec::entropy_coded(m.codec) && m.format_version < 2)
        throw std::runtime_error(std::string("codec ") + codec::kind_name(m.codec) + " needs container format version 2");
    if (m.block != codec::kBlock) throw std::runtime_error("unsupported block size " + std::to_string(m.block));
    if (!(m.tolerance > 0) || !(m.grad_bound > 0)) throw std::runtime_error("manifest tolerance/grad_bound must be positive");
    // the text is exactly one object: its extent (nesting walked once more, values
    // skipped), then nothing but JSON whitespace
    doc.rewind();
    std::string_view whole;
    if (const auto e = doc.raw_json().get(whole)) not_json(e);
    const std::size_t end = std::size_t(whole.data() - in.data()) + whole.size();
    if (end > text.size() || text.find_first_not_of(" \t\r\n", end) != std::string::npos)
        not_json(simdjson::TRAILING_CONTENT);
    return m;
}

void Manifest::validate() const {
    // storages: sorted, non-overlapping, inside the source, referring to known params/roles
    uint64_t end = 0;
    for (const auto& e : storages) {
        for (uint64_t c : e.crc_offsets)
            if (c > source_size || source_size - c < 4) throw std::runtime_error("storage crc offset out of range");
        if (e.offset < end || e.offset > source_size || e.nbytes > source_size - e.offset)
            throw std::runtime_error("manifest storage ranges overlap or run past the source size");
        end = e.offset + e.nbytes;
        if (e.param >= int(params.size()) || e.param < -1 || e.role < -1 || e.role > 2 || (e.param < 0) != (e.role < 0))
            throw std::runtime_error("manifest storage refers to an unknown param/role");
    }
    // parameters tile the code, block-parameter and escape streams in order, exactly
    uint64_t codes = 0, blocks = 0, escapes = 0;
    const bool has_blocks = codec::params_per_block(codec) > 0;  // bf16 has no block params
    const bool segmented = codec::entropy_coded(codec);
    for (const auto& p : params) {
        if (p.code_offset != codes || p.block_offset != (has_blocks ? blocks : 0) || p.escape_offset != escapes)
            throw std::runtime_error("param " + p.name + ": stream offsets do not follow the previous parameter");
        codes += segmented ? segments_of(p.numel) : p.numel;
        blocks += (p.numel + codec::kBlock - 1) / codec::kBlock;
        escapes += p.escapes;
    }
    // each moment storage belongs to its parameter and role and holds exactly its values
    for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        for (int r = 0; r < 3; ++r) {
            if (r >= p.moments()) { if (p.storage[r] != -1) throw std::runtime_error("param " + p.name + ": unexpected storage"); continue; }
            if (p.storage[r] < 0 || p.storage[r] >= int(storages.size())) throw std::runtime_error("param " + p.name + ": storage index out of range");
            const auto& s = storages[std::size_t(p.storage[r])];
            const uint64_t es = float_dtype_size(p.dtype);
            if (s.param != int(i) || s.role != r || s.nbytes != p.numel * es)
                throw std::runtime_error("param " + p.name + ": storage does not match its moments");
        }
        if (p.theta_storage < -1 || p.theta_storage >= int64_t(storages.size()) ||
            (p.theta_storage >= 0 && storages[std::size_t(p.theta_storage)].param >= 0))
            throw std::runtime_error("param " + p.name + ": theta storage invalid");
    }
}

Manifest Manifest::from_json(const std::string& text) {
    Manifest m = parse(text);
    m.validate();
    return m;
}

uint64_t write_manifest(hid_t file, const Manifest& m) {
    // zstd level 1: smaller and faster than level 3 on manifests (docs/benchmarks.md,
    // "Measurements behind the code's choices")
    Appender a(file, kManifestPath, H5T_NATIVE_UINT8, 1, 1 << 20, 1);
    m.write_json([&](std::string_view piece) { a.append(piece.data(), piece.size()); });
    a.finish();
    return a.xxh3();
}

Manifest read_manifest(hid_t file, const Manifest* written, uint64_t written_xxh3, ManifestSizes* sizes) {
    if (!exists(file, "/") || get_attr_string(file, "format") != "ckptkit-container")
        throw std::runtime_error("root attribute 'format' is not ckptkit-container");
    const uint64_t version = get_attr_u64(file, "format_version");
    if (version < uint64_t(kOldestFormatVersion) || version > uint64_t(kFormatVersion))
        throw std::runtime_error("container format_version " + std::to_string(version) + " is not supported (1 to " +
                                 std::to_string(kFormatVersion) + ")");
    DatasetReader r(file, kManifestPath, H5T_NATIVE_UINT8, 1);
    if (r.count() > (256u << 20)) throw std::runtime_error("manifest is larger than 256 MiB");
    if (sizes) *sizes = {r.stored_bytes(), r.count()};
    Manifest m;
    // the caller's own text: checksummed chunk by chunk (never held whole), and known by its hash
    if (written && r.checksum_ok() && r.stored_xxh3() == written_xxh3) {
        written->validate();
        m = *written;
    } else {
        std::string j;
        j.reserve(r.count() + simdjson::SIMDJSON_PADDING);  // room for simdjson's padding: no copy of the text
        j.resize(r.count());
        r.read(0, r.count(), j.data());
        if (!r.checksum_ok()) throw std::runtime_error("manifest checksum mismatch (damaged)");  // hashed as read
        m = Manifest::from_json(j);
    }
    if (uint64_t(m.format_version) != version)
        throw std::runtime_error("manifest format_version differs from the root attribute");
    // the moment streams hold exactly what the parameters need
    if (m.params.empty()) return m;
    uint64_t values = 0, blocks = 0, escapes = 0, segments = 0;
    int roles = 2;
    for (const auto& p : m.params) {
        values += p.numel;
        segments += segments_of(p.numel);
        blocks += (p.numel + codec::kBlock - 1) / codec::kBlock;
        escapes += p.escapes;
        if (p.hyper.amsgrad) roles = 3;
    }
    const uint64_t cb = uint64_t(codec::code_bytes(m.codec)), pb = uint64_t(codec::params_per_block(m.codec));
    auto expect = [&](const std::string& path, hid_t type, std::size_t elem, uint64_t n) {
        if (DatasetReader(file, path, type, elem).count() != n)
            throw std::runtime_error("dataset " + path + " does not hold exactly what the manifest needs");
    };
    const bool segmented = codec::entropy_coded(m.codec);
    for (int r = 0; r < roles; ++r) {
        if (segmented) expect(segments_path(r), H5T_NATIVE_UINT64, 8, segments);  // codes: checked per segment
        else expect(codes_path(r), H5T_NATIVE_UINT8, 1, values * cb);
        expect(params_path(r), H5T_NATIVE_INT16, 2, blocks * pb);
        expect(escapes_path(r), H5T_NATIVE_UINT32, 4, escapes);
    }
    expect(kEscapeIndex, H5T_NATIVE_UINT64, 8, escapes);
    return m;
}

uint64_t param_metadata_bytes(const Manifest& m, uint64_t stored, uint64_t text_bytes) {
    if (m.params.empty() || text_bytes == 0) return 0;
    // the text of a manifest holding only the params: an empty one's plus each param's
    // dump and the commas between them (the dump is compact)
    uint64_t params_text = Manifest().to_json().size() + (m.params.size() - 1);
    for (const auto& p : m.params) params_text += param_json(p).size();
    const double share = double(params_text) / double(text_bytes);
    return uint64_t(std::llround(double(stored) * std::min(1.0, share)));
}

std::vector<SourceSpan> source_spans(const Manifest& m) {
    std::vector<SourceSpan> out;
    uint64_t pos = 0;
    for (std::size_t i = 0; i < m.storages.size(); ++i) {
        const StorageEntry& s = m.storages[i];
        if (s.offset > pos) out.push_back({pos, s.offset, -1, false});
        out.push_back({s.offset, s.offset + s.nbytes, int(i), s.param >= 0});
        pos = s.offset + s.nbytes;
    }
    if (m.source_size > pos) out.push_back({pos, m.source_size, -1, false});
    return out;
}

uint64_t stream_bytes(const ParamEntry& p, codec::Kind kind, uint64_t coded) {
    const uint64_t cb = uint64_t(codec::code_bytes(kind)), pb = uint64_t(codec::params_per_block(kind));
    const uint64_t nm = uint64_t(p.moments()), blocks = (p.numel + codec::kBlock - 1) / codec::kBlock;
    const uint64_t codes = codec::entropy_coded(kind) ? coded : nm * p.numel * cb;
    return codes + nm * blocks * pb * 2 + p.escapes * (8 + 4 * nm);
}

}  // namespace ckpt::container
