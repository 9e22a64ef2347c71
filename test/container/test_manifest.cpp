// Manifest::parse / validate / from_json, source_spans and stream_bytes on small
// manifests built in memory: the round trip, and every rejection with its exact message.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "container/manifest.h"

using namespace ckpt;
using namespace ckpt::container;
using nlohmann::json;

namespace {

/// Source of 64 bytes: raw storage 0 at [0, 8), param "w" (4 F32 values, Adam) with
/// exp_avg at [20, 36) and exp_avg_sq at [40, 56), raw storage 3 (theta, F32) at [56, 60).
Manifest small() {
    Manifest m;
    m.tool_version = "test";
    m.source_format = "torch-zip";
    m.source_name = "x.pt";
    m.source_size = 64;
    m.storages = {{0, 8, 11, -1, -1, {4}}, {20, 16, 22, 0, 0, {}}, {40, 16, 33, 0, 1, {}}, {56, 4, 44, -1, -1, {}}};
    ParamEntry p;
    p.name = "w";
    p.numel = 4;
    p.shape = {2, 2};
    p.dtype = DType::F32;
    p.hyper.lr = 1e-3;
    p.hyper.beta1 = 0.9;
    p.hyper.beta2 = 0.999;
    p.hyper.eps = 1e-8;
    p.hyper.weight_decay = 0.01;
    p.hyper.step = 10;
    p.domain.l2 = true;
    p.domain.plain = false;
    p.domain.grad_bound = 1.0;
    p.domain.weight_decay = 0.01;
    p.theta_storage = 3;
    p.theta_dtype = DType::F32;
    p.escapes = 1;
    p.max_bound = 0.005;
    p.storage[0] = 1;
    p.storage[1] = 2;
    m.params.push_back(p);
    m.kept.push_back({"k", 6, 24, "kept exact: NAdam state (not Adam)"});
    return m;
}

/// from_json's error for the manifest JSON after `edit`.
std::string rejection(void (*edit)(json&)) {
    json j = json::parse(small().to_json());
    edit(j);
    try {
        Manifest::from_json(j.dump());
    } catch (const std::runtime_error& e) {
        return e.what();
    }
    return "accepted";
}

}  // namespace

TEST_CASE("manifest: to_json -> from_json keeps every field") {
    const Manifest a = small();
    const Manifest b = Manifest::from_json(a.to_json());
    CHECK(b.to_json() == a.to_json());
    CHECK(b.source_size == 64);
    REQUIRE(b.storages.size() == 4);
    CHECK(b.storages[0].crc_offsets == std::vector<uint64_t>{4});
    CHECK(b.storages[2].xxh3 == 33);
    CHECK(b.storages[2].param == 0);
    CHECK(b.storages[2].role == 1);
    REQUIRE(b.params.size() == 1);
    const ParamEntry& p = b.params[0];
    CHECK(p.name == "w");
    CHECK(p.dtype == DType::F32);
    REQUIRE(p.theta_dtype.has_value());
    CHECK(*p.theta_dtype == DType::F32);
    CHECK(p.shape == std::vector<int64_t>{2, 2});
    CHECK(p.hyper.beta2 == 0.999);
    CHECK(p.domain.grad_bound == 1.0);          // from the manifest's grad_bound
    CHECK(p.domain.weight_decay == 0.01);       // from the hyper-parameters
    CHECK(p.moments() == 2);
    CHECK(p.storage[2] == -1);
    REQUIRE(b.kept.size() == 1);
    CHECK(b.kept[0].note == "kept exact: NAdam state (not Adam)");
    // dtypes are spelled only in the JSON
    const json j = json::parse(a.to_json());
    CHECK(j["params"][0]["dtype"] == "F32");
    CHECK(j["params"][0]["theta_dtype"] == "F32");
}

TEST_CASE("manifest: to_json is nlohmann's dump of the same tree, byte for byte") {
    Manifest a = small();
    const double values[] = {0.0, -0.0, 1e-08, 0.9, 200.0, 1.0 / 3, 1e300, 5e-324, 123456789012345678.0, -2.5e-5};
    for (double x : values) {
        CAPTURE(x);
        a.params[0].hyper.eps = x;
        a.params[0].max_bound = -x;
        a.params[0].domain.theta_bound = x * 3;
        const std::string text = a.to_json();
        CHECK(json::parse(text).dump() == text);
    }
    a = small();
    for (const char* name : {"blocks.0.attn.weight", "a\"b", "back\\slash", "tab\t", "\u00e9t\u00e9", "del\x7f", ""}) {
        CAPTURE(name);
        a.params[0].name = name;
        const std::string text = a.to_json();
        CHECK(json::parse(text).dump() == text);
        CHECK(Manifest::from_json(text).params[0].name == name);
    }
}

TEST_CASE("manifest: parse reads keys in any order, exactly one object, escaped names") {
    Manifest a = small();
    a.params[0].name = "blocks.0.\"q\\k\"\n\u00e9";  // quotes, backslash, control char, UTF-8
    const std::string text = a.to_json();
    // the writer sorts keys; the reader looks them up in that order but takes any order
    nlohmann::ordered_json reordered;
    const json j = json::parse(text);
    for (auto it = j.rbegin(); it != j.rend(); ++it) {
        if (it.key() != "params") { reordered[it.key()] = *it; continue; }
        nlohmann::ordered_json ps = nlohmann::ordered_json::array();
        for (const auto& p : *it) {
            nlohmann::ordered_json q;
            for (auto f = p.rbegin(); f != p.rend(); ++f) q[f.key()] = *f;
            ps.push_back(q);
        }
        reordered["params"] = ps;
    }
    CHECK(reordered.dump() != text);
    CHECK(Manifest::from_json(reordered.dump()).to_json() == text);
    CHECK(Manifest::from_json(text).params[0].name == a.params[0].name);
    CHECK(Manifest::from_json(text + " \n\t").to_json() == text);  // trailing whitespace is JSON
    for (const std::string& bad : {text + " }", text + "{}", text.substr(0, text.size() - 1), text + "x"}) {
        const std::string why = [&] {
            try { Manifest::from_json(bad); } catch (const std::runtime_error& e) { return std::string(e.what()); }
            return std::string("accepted");
        }();
        CHECK(why.rfind("manifest is not valid JSON: ", 0) == 0);
    }
}

TEST_CASE("manifest: BF16 moments without theta spell theta_dtype empty") {
    Manifest m = small();
    m.params[0].dtype = DType::BF16;
    m.params[0].theta_storage = -1;
    m.params[0].theta_dtype.reset();
    m.storages[1].nbytes = 8;
    m.storages[2].nbytes = 8;
    const json j = json::parse(m.to_json());
    CHECK(j["params"][0]["dtype"] == "BF16");
    CHECK(j["params"][0]["theta_dtype"] == "");
    const Manifest b = Manifest::from_json(m.to_json());
    CHECK(b.params[0].dtype == DType::BF16);
    CHECK(!b.params[0].theta_dtype.has_value());
    CHECK(moment_type(b.params[0].dtype) == codec::MomentType::BF16);
    CHECK(moment_type(DType::F16) == codec::MomentType::F16);
    CHECK(moment_type(DType::F32) == codec::MomentType::F32);
}

TEST_CASE("manifest: parse rejects malformed fields with the exact reason") {
    CHECK(rejection([](json& j) { j["params"][0]["dtype"] = "I64"; }) == "param w: bad dtype");
    CHECK(rejection([](json& j) { j["params"][0]["dtype"] = "F64"; }) == "param w: bad dtype");
    CHECK(rejection([](json& j) { j["params"][0]["theta_dtype"] = "U8"; }) == "param w: bad theta_dtype");
    CHECK(rejection([](json& j) { j["params"][0]["theta_dtype"] = ""; }) == "param w: bad theta_dtype");
    CHECK(rejection([](json& j) { j["params"][0]["theta_storage"] = -1; }) == "param w: bad theta_dtype");
    CHECK(rejection([](json& j) { j["format_version"] = 7; }) == "container format version 7 is not supported");
    CHECK(rejection([](json& j) { j["format_version"] = 0; }) == "container format version 0 is not supported");
    CHECK(rejection([](json& j) { j["codec"] = "vlog"; j["format_version"] = 1; }) == "codec vlog needs container format version 2");
    CHECK(rejection([](json& j) { j["params"][0]["escape_causes"]["certificate"] = 99; }).find("escape_causes") != std::string::npos);
    CHECK(rejection([](json& j) { j["params"][0]["row_predict"] = 1; }) == "param w: row_predict is not a boolean");
    CHECK(rejection([](json& j) { j["format"] = "other"; }) == "manifest is not a ckptkit container manifest");
    CHECK(rejection([](json& j) { j["block"] = 32; }) == "unsupported block size 32");
    CHECK(rejection([](json& j) { j["tolerance"] = 0; }) == "manifest tolerance/grad_bound must be positive");
    CHECK(rejection([](json& j) { j.erase("storages"); }) == "manifest lacks 'storages' or 'params'");
    CHECK(rejection([](json& j) { j["params"][0].erase("numel"); }) == "manifest field 'numel' is missing or not a count");
    CHECK(rejection([](json& j) { j["params"][0]["hyper"]["beta1"] = 1.0; }) ==
          "param w: hyper-parameters out of range (lr >= 0, 0 <= betas < 1, eps >= 0, integer step >= 0)");
    CHECK(rejection([](json& j) { j["params"][0]["hyper"]["lr"] = "inf"; }) == "param w: non-finite hyper-parameter");
    CHECK(rejection([](json& j) { j["params"][0]["shape"] = {3}; }) == "param w: shape does not match numel");
    CHECK(rejection([](json& j) { j["params"][0]["escapes"] = 5; }) == "param w: more escapes than values");
    CHECK(rejection([](json& j) { j["params"][0]["storage"] = {1, 2}; }) == "param w: storage list malformed");
    CHECK(rejection([](json& j) { j["storages"][0]["crc_offsets"] = {-1}; }) == "storage crc offset out of range");
    CHECK(rejection([](json& j) { j["kept"] = 3; }) == "manifest field 'kept' is not a list");
    // integers are range-checked, never wrapped: 2^32 + 1 would read as format version 1
    CHECK(rejection([](json& j) { j["format_version"] = (int64_t(1) << 32) + 1; }) == "manifest field 'format_version' is out of range");
    CHECK(rejection([](json& j) { j["storages"][0]["param"] = (int64_t(1) << 32); }) == "manifest field 'param' is out of range");
    CHECK(rejection([](json& j) { j["block"] = uint64_t(1) << 63; }) == "manifest field 'block' is out of range");
    CHECK(rejection([](json& j) { j["params"][0]["storage"] = {(int64_t(1) << 32) + 1, 1, -1}; }) == "param w: storage index malformed");
    const std::string not_json = [] {
        try { Manifest::from_json("{"); } catch (const std::runtime_error& e) { return std::string(e.what()); }
        return std::string("accepted");
    }();
    CHECK(not_json.rfind("manifest is not valid JSON: ", 0) == 0);
}

TEST_CASE("manifest: validate rejects broken cross-references with the exact reason") {
    CHECK(rejection([](json& j) { j["storages"][0]["crc_offsets"] = {61}; }) == "storage crc offset out of range");
    CHECK(rejection([](json& j) { j["storages"][1]["offset"] = 4; }) ==
          "manifest storage ranges overlap or run past the source size");
    CHECK(rejection([](json& j) { j["storages"][3]["nbytes"] = 9; }) ==
          "manifest storage ranges overlap or run past the source size");
    CHECK(rejection([](json& j) { j["storages"][1]["param"] = 1; }) == "manifest storage refers to an unknown param/role");
    CHECK(rejection([](json& j) { j["storages"][1]["role"] = -1; }) == "manifest storage refers to an unknown param/role");
    CHECK(rejection([](json& j) { j["params"][0]["code_offset"] = 1; }) ==
          "param w: stream offsets do not follow the previous parameter");
    CHECK(rejection([](json& j) { j["params"][0]["storage"] = {1, 2, 0}; }) == "param w: unexpected storage");
    CHECK(rejection([](json& j) { j["params"][0]["storage"] = {1, 7, -1}; }) == "param w: storage index out of range");
    CHECK(rejection([](json& j) { j["params"][0]["storage"] = {2, 1, -1}; }) == "param w: storage does not match its moments");
    CHECK(rejection([](json& j) { j["params"][0]["dtype"] = "F16"; }) == "param w: storage does not match its moments");
    CHECK(rejection([](json& j) { j["params"][0]["theta_storage"] = 1; }) == "param w: theta storage invalid");

    // validate() on its own: a manifest built in code
    Manifest m = small();
    CHECK_NOTHROW(m.validate());
    m.params[0].escape_offset = 3;
    CHECK_THROWS_WITH_AS(m.validate(), "param w: stream offsets do not follow the previous parameter", std::runtime_error);
    // parse() alone leaves the cross-references to validate()
    json j = json::parse(small().to_json());
    j["storages"][1]["offset"] = 4;
    CHECK_NOTHROW(Manifest::parse(j.dump()));
}

TEST_CASE("source_spans: storages and the non-empty gaps in file order") {
    const std::vector<SourceSpan> s = source_spans(small());
    REQUIRE(s.size() == 7);
    const uint64_t want[7][4] = {{0, 8, 0, 0}, {8, 20, uint64_t(-1), 0}, {20, 36, 1, 1}, {36, 40, uint64_t(-1), 0},
                                 {40, 56, 2, 1}, {56, 60, 3, 0}, {60, 64, uint64_t(-1), 0}};
    for (int i = 0; i < 7; ++i) {
        CAPTURE(i);
        CHECK(s[std::size_t(i)].begin == want[i][0]);
        CHECK(s[std::size_t(i)].end == want[i][1]);
        CHECK(uint64_t(int64_t(s[std::size_t(i)].storage)) == want[i][2]);
        CHECK(s[std::size_t(i)].moment == (want[i][3] == 1));
    }
    // an empty storage is a span too, and a source that ends in a storage has no last gap
    Manifest m = small();
    m.storages[3] = {56, 0, 0, -1, -1, {}};
    m.source_size = 56;
    const std::vector<SourceSpan> t = source_spans(m);
    REQUIRE(t.size() == 6);
    CHECK(t.back().begin == 56);
    CHECK(t.back().size() == 0);
    CHECK(t.back().storage == 3);
}

TEST_CASE("stream_bytes: codes, block parameters and escape rows of a parameter") {
    ParamEntry p = small().params[0];
    p.numel = 100;   // 2 blocks of 64
    p.escapes = 3;
    const uint64_t cb = uint64_t(codec::code_bytes(codec::Kind::Log8)), pb = uint64_t(codec::params_per_block(codec::Kind::Log8));
    CHECK(cb == 1);
    CHECK(stream_bytes(p, codec::Kind::Log8) == 2 * (100 * cb + 2 * pb * 2) + 3 * (8 + 4 * 2));
    CHECK(codec::params_per_block(codec::Kind::BF16) == 0);
    CHECK(stream_bytes(p, codec::Kind::BF16) == 2 * 100 * uint64_t(codec::code_bytes(codec::Kind::BF16)) + 3 * 16);
    p.hyper.amsgrad = true;   // three moments
    CHECK(stream_bytes(p, codec::Kind::BF16) == 3 * 100 * uint64_t(codec::code_bytes(codec::Kind::BF16)) + 3 * 20);
}
