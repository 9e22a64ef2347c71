// Trace reading: example traces (recorder, ET 1.0.1, Chakra), bad input, budget parsing.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "common/error.h"
#include "helpers.h"
#include "replay/contract.h"
#include "replay/plan_io.h"
#include "replay/trace.h"

using namespace ckpt::replay;
using replay_test::trace_path;

namespace {
std::string bad_input_message(const std::string& text) {
    std::string path = "/tmp/replay_unit_bad_" + std::to_string(std::hash<std::string>{}(text)) + ".json";
    { std::ofstream(path) << text; }
    std::string msg;
    try {
        load_trace(path);
    } catch (const ckpt::BadInput& e) {
        CHECK(e.file == path);
        msg = e.what();
    }
    std::remove(path.c_str());
    return msg;
}

// The bytes of a file.
std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

const StateAccess* access(const Trace& t, const std::string& seg, const std::string& buf) {
    for (const auto& s : t.segments)
        if (s.name == seg)
            for (const auto& a : s.state)
                if (a.buffer == buf) return &a;
    return nullptr;
}
}  // namespace

TEST_CASE("recorder traces: segments, buffers, versions and regions") {
    Trace bn = load_trace(trace_path("bn.trace.json"));
    CHECK(bn.segments.size() == 7);
    CHECK(bn.buffers.size() == 6);
    const StateAccess* rm = access(bn, "2", "2.1.running_mean");
    REQUIRE(rm);
    CHECK(rm->read);
    CHECK(rm->written);
    CHECK(rm->version_read == 0);
    CHECK(rm->version_written == 1);
    CHECK(rm->regions == std::vector<Region>{{0, 256}});

    Trace kv = load_trace(trace_path("kvcache.trace.json"));
    const StateAccess* c = access(kv, "2", "2.cache");
    REQUIRE(c);
    CHECK(c->bytes_read == 2048);                       // 8 rows x 64 fp32
    CHECK(c->bytes_written == 2048 + 256 * 64 * 4);     // + one batch of keys appended
    CHECK(c->regions == std::vector<Region>{{2048, 65536}});

    Trace sw = load_trace(trace_path("sparse_write.trace.json"));
    const StateAccess* bank = access(sw, "4", "4.bank");
    REQUIRE(bank);
    CHECK(bank->bytes_read == 2048 * 64 * 4);
    CHECK(bank->regions == std::vector<Region>{{0, 16 * 64 * 4}});   // 16 rows written

    Trace dq = load_trace(trace_path("dense_queue.trace.json"));
    CHECK(access(dq, "2", "2.queue")->regions == std::vector<Region>{{0, 262144}});

    Trace dr = load_trace(trace_path("dropout.trace.json"));
    CHECK(dr.segments[2].rng.size() == 1);
    CHECK(dr.segments[2].rng[0].state_bytes == 5056);
    CHECK(dr.segments[3].rng.empty());
    for (const auto& name : replay_test::model_traces()) CHECK(load_trace(trace_path(name)).segments.size() == 7);
}

TEST_CASE("Execution Trace import (schema 1.0.1 and Chakra) finds the BatchNorm writes") {
    for (const char* f : {"bn.et.json", "bn.chakra.json"}) {
        CAPTURE(f);
        Trace t = load_trace(trace_path(f));
        REQUIRE(t.segments.size() == 7);
        CHECK(t.buffers.size() == 6);
        for (size_t i = 0; i < 7; ++i) {
            size_t writes = 0;
            for (const auto& a : t.segments[i].state) writes += a.written;
            CHECK(writes == ((i == 2 || i == 4) ? 3u : 0u));   // running_mean/var, num_batches
        }
        uint64_t sizes = 0;
        for (const auto& b : t.buffers) sizes += b.bytes;
        CHECK(sizes == 2 * (256 + 256 + 8));
    }
    Trace a = load_trace(trace_path("bn.et.json")), b = load_trace(trace_path("bn.chakra.json"));
    CHECK(trace_to_json(a)["segments"] == trace_to_json(b)["segments"]);
    Trace d = load_trace(trace_path("dropout.et.json"));
    for (size_t i = 0; i < 7; ++i) CHECK(d.segments[i].rng.size() == ((i == 2 || i == 4) ? 1u : 0u));
}

TEST_CASE("bad input: one message naming what is wrong") {
    CHECK(bad_input_message("{\"format\": \"ckptkit-trace\", ") .find("not valid JSON") == 0);
    CHECK(bad_input_message("[1,2]").find("neither a ckptkit trace") == 0);
    CHECK(bad_input_message(R"({"format":"other","format_version":1})").find("format is not") == 0);
    const std::string head = R"({"format":"ckptkit-trace","format_version":1,"fixed":{"param_bytes":1,"grad_bytes":1,"optimizer_bytes":1},)";
    CHECK(bad_input_message(head + R"("buffers":[]})") == "trace: missing field 'segments'");
    CHECK(bad_input_message(head + R"("buffers":[],"segments":[]})") == "trace has no segments");
    CHECK(bad_input_message(head + R"("buffers":[],"segments":[{"name":"a","forward_ms":-1,"saved_bytes":0,"output_bytes":0}]})") ==
          "segments[0].forward_ms: expected a finite non-negative time");
    CHECK(bad_input_message(head + R"("buffers":[{"id":"x","bytes":8}],"segments":[{"name":"a","forward_ms":1,"saved_bytes":0,"output_bytes":0,
        "state":[{"buffer":"x","version_read":3}]}]})") == "segments[0].state[0]: reads 'x' at version 3 but it is at version 0");
    CHECK(bad_input_message(head + R"("buffers":[{"id":"x","bytes":8}],"segments":[{"name":"a","forward_ms":1,"saved_bytes":0,"output_bytes":0,
        "state":[{"buffer":"x","version_read":0,"version_written":1,"regions":[[4,8]]}]}]})") ==
          "segments[0].state[0].regions[0]: [4, 8] outside the buffer's 8 bytes");
    CHECK(bad_input_message(head + R"("buffers":[],"segments":[{"name":"a","forward_ms":1,"saved_bytes":0,"output_bytes":0}],"backward_order":["b"]})")
              .find("backward_order must be the reverse") == 0);
    CHECK(bad_input_message(R"({"schema":"1.0.1","nodes":[{"id":1,"name":"aten::add"}]})").find("no record_function labels") == 0);
    CHECK(bad_input_message(R"({"schema":"0.9","nodes":[]})").find("unsupported Execution Trace schema") == 0);
    CHECK_THROWS_AS(load_trace("/nonexistent/trace.json"), ckpt::BadInput);
}

TEST_CASE("budget parsing") {
    CHECK(parse_bytes("44GiB") == 47244640256ull);
    CHECK(parse_bytes("32GB") == 32000000000ull);
    CHECK(parse_bytes("512MiB") == 536870912ull);
    CHECK(parse_bytes("1.5KiB") == 1536);
    CHECK(parse_bytes("123") == 123);
    CHECK_THROWS_AS(parse_bytes("lots"), std::invalid_argument);
    CHECK_THROWS_AS(parse_bytes("-1GiB"), std::invalid_argument);
    CHECK_THROWS_AS(parse_bytes("4 parsecs"), std::invalid_argument);
    CHECK(parse_bytes("1.5mib") == 1572864);   // units in any case, spaces around them
    CHECK(parse_bytes("8 MiB ") == 8388608);
    CHECK(parse_bytes("2gb") == 2000000000ull);
    CHECK_THROWS_AS(parse_bytes("8 M iB"), std::invalid_argument);
    CHECK(parse_sweep("1GiB:3GiB:1GiB") == std::vector<uint64_t>{1ull << 30, 2ull << 30, 3ull << 30});
    CHECK_THROWS_AS(parse_sweep("3GiB:1GiB:1GiB"), std::invalid_argument);
    CHECK_THROWS_AS(parse_sweep("1GiB:3GiB"), std::invalid_argument);
    CHECK(human_bytes(1536) == "1.50 KiB");
}

TEST_CASE("duplicate keys are refused at any depth, naming the key and where it is") {
    CHECK(bad_input_message(R"({"format":"x","format":"ckptkit-trace","format_version":3})") ==
          "duplicate key 'format' in the top-level object");
    std::string text = file_bytes(trace_path("bn.trace.json"));
    const auto pos = text.find("\"version_read\"");
    REQUIRE(pos != std::string::npos);
    text.insert(pos, "\"version_read\": 7, ");   // a second version_read in one state entry
    const std::string msg = bad_input_message(text);
    CHECK(msg.rfind("duplicate key 'version_read' in segments[", 0) == 0);
    CHECK(msg.find("].state[0]") != std::string::npos);
    CHECK(bad_input_message(R"({"schema":"1.0.1","nodes":[{"id":1,"name":"a","id":2}]})") ==
          "duplicate key 'id' in nodes[0]");
    CHECK(bad_input_message(R"([{"a":[{"b":1,"c":2,"b":3}]}])") == "duplicate key 'b' in [0].a[0]");
    CHECK(bad_input_message(R"({"format":"ckptkit-trace","a":{"":1,"":2}})") == "duplicate key '' in a");
}

TEST_CASE("the trace hash is XXH3-64 of the file's bytes (apply_plan.py: xxhash.xxh3_64_hexdigest)") {
    CHECK(trace_hash("") == "2d06800538d394c2");   // XXH3_64bits of no bytes, seed 0
    CHECK(trace_hash("abc") == "78af5f94892f3950");
    const std::string text = file_bytes(trace_path("bn.trace.json"));
    const Trace t = load_trace(trace_path("bn.trace.json"));
    CHECK(t.hash == trace_hash(text));
    CHECK(parse_trace(text, "<mem>").hash == t.hash);
    // the bytes count, not the JSON value: another spacing is another trace file
    const Trace spaced = parse_trace(text + "\n", "<mem>");
    CHECK(spaced.hash != t.hash);
    CHECK(trace_to_json(spaced) == trace_to_json(t));
    // an Execution Trace is hashed as its own file, not as the converted trace
    CHECK(load_trace(trace_path("bn.et.json")).hash == trace_hash(file_bytes(trace_path("bn.et.json"))));
}

TEST_CASE("numbers: out of range is one BadInput naming the number; floats are no integers") {
    const std::string head = R"({"format":"ckptkit-trace","format_version":1,"fixed":{"param_bytes":1,"grad_bytes":1,"optimizer_bytes":1},"buffers":[],"segments":[{"name":"a","forward_ms":1,"output_bytes":0,"saved_bytes":)";
    CHECK(bad_input_message(head + "1e999}]}") == "number 1e999 is out of range");
    CHECK(bad_input_message(head + "18446744073709551616}]}") == "number 18446744073709551616 is out of range");
    CHECK(bad_input_message(head + "-9223372036854775809}]}") == "number -9223372036854775809 is out of range");
    CHECK(bad_input_message(head + "1" + std::string(400, '0') + "}]}") ==
          "number 10000000000000000000... is out of range");
    CHECK(bad_input_message(head + "2.0}]}") == "segments[0].saved_bytes: expected a non-negative integer");
    CHECK(bad_input_message(head + "1e300}]}") == "segments[0].saved_bytes: expected a non-negative integer");
    CHECK(bad_input_message(head + "-1}]}") == "segments[0].saved_bytes: expected a non-negative integer");
    CHECK(bad_input_message(head + "1e-999}]}") == "segments[0].saved_bytes: expected a non-negative integer");
    CHECK(bad_input_message(head + "01}]}").rfind("not valid JSON: ", 0) == 0);
    CHECK(bad_input_message(R"({"schema":"1.0.1","nodes":[{"id":1.5,"name":"a"}]})") == "nodes[0].id: expected an int64");
    CHECK(bad_input_message(R"({"schema":"1.0.1","nodes":[{"id":9223372036854775808,"name":"a"}]})") ==
          "nodes[0].id: expected an int64");
    CHECK(bad_input_message(R"({"schema":"1.0.1","nodes":[{"id":1,"name":7}]})") == "nodes[0].name: expected a string");
    // a UTF-8 byte-order mark is skipped, as before
    CHECK(bad_input_message("\xEF\xBB\xBF[1]").find("neither a ckptkit trace") == 0);
}

TEST_CASE("malformed-trace corpus: every file is BadInput with its expected message") {
    // test/corpus/fuzz/trace/ (also replayed by fuzz_regress_trace): inputs that once aborted
    // the tool (uncaught exception, exit 134); test/corpus/bad_traces_expected.json: file ->
    // the exact message.
    const std::string dir = std::string(CKPT_SOURCE_DIR) + "/test/corpus/";
    nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir + "bad_traces_expected.json"));
    REQUIRE(expected.size() == 9);
    for (const auto& item : expected.items()) {   // no structured binding: CAPTURE (clang 14)
        const std::string name = item.key();
        const nlohmann::json& msg = item.value();
        CAPTURE(name);
        const std::string path = dir + "fuzz/trace/" + name;
        std::string got;
        try {
            load_trace(path);
        } catch (const ckpt::BadInput& e) {
            CHECK(e.file == path);
            got = e.what();
        }
        CHECK(got == msg.get<std::string>());
    }
    std::string got;
    try {
        load_trace(dir);   // a folder given as the trace
    } catch (const ckpt::BadInput& e) {
        got = e.what();
    }
    CHECK(got == "is a folder, not a trace file");
}

TEST_CASE("format v2: kinds, fingerprint, non-replayable segments; v1 traces still read") {
    // v1 (data/traces) reads as before, buffers are of kind "buffer"
    Trace v1 = load_trace(trace_path("bn.trace.json"));
    CHECK(v1.format_version == 1);
    CHECK(v1.fingerprint.empty());
    for (const auto& b : v1.buffers) CHECK(b.kind == "buffer");
    nlohmann::json j = trace_to_json(v1);   // written as v2
    CHECK(j["format_version"] == 2);
    j["fingerprint"] = {{"hash", "0123456789abcdef"}};
    j["buffers"][0]["kind"] = "param";
    j["segments"][3]["non_replayable"] = "replay probe: output differs";
    Trace v2 = trace_from_json(j, "<v2>");
    CHECK(v2.format_version == 2);
    CHECK(v2.fingerprint == "0123456789abcdef");
    CHECK(v2.buffers[0].kind == "param");
    CHECK(v2.segments[3].non_replayable == "replay probe: output differs");
    CHECK(trace_to_json(v2) == j);
    j["buffers"][0]["kind"] = "weights";
    CHECK_THROWS_WITH_AS(trace_from_json(j, "<v2>"), "buffers[0].kind: 'weights' is not buffer, param, input or key",
                         ckpt::BadInput);
}

TEST_CASE("format v2: JAX traces (kind key: a PRNG key read, never written; framework ignored)") {
    nlohmann::json j = trace_to_json(load_trace(trace_path("bn.trace.json")));
    j["framework"] = "jax";
    j["buffers"].push_back({{"id", "key"}, {"kind", "key"}, {"bytes", 8}});
    j["segments"][2]["state"].push_back({{"buffer", "key"}, {"read", true}, {"version_read", 0},
                                         {"bytes_read", 8}});
    Trace t = trace_from_json(j, "<jax>");
    CHECK(t.buffers.back().kind == "key");
    // read only: no hazard, so the stateful segment's hazards are what they were without it
    Trace plain = load_trace(trace_path("bn.trace.json"));
    CHECK(derive_contracts(t)[2].hazards == derive_contracts(plain)[2].hazards);
    j["segments"][2]["state"].back()["version_written"] = 1;
    j["segments"][2]["state"].back()["regions"] = {{0, 8}};
    CHECK_THROWS_WITH_AS(trace_from_json(j, "<jax>"),
                         "segments[2].state[3]: writes 'key', a PRNG key (kind key: an immutable input)",
                         ckpt::BadInput);
}

namespace {
nlohmann::json read_json(const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
}
// Keep-everything peak (bytes): fixed + the largest prefix of saved + transient.
uint64_t keep_all_peak(const Trace& t) {
    uint64_t prefix = 0, peak = 0;
    for (const auto& s : t.segments) {
        peak = std::max(peak, prefix + s.saved_bytes + s.transient_bytes);
        prefix += s.saved_bytes;
    }
    return t.fixed_bytes() + std::max(peak, prefix);
}
}  // namespace

TEST_CASE("Execution Trace import: memory within 0.5% of the recorder's on the same model") {
    // fixed memory equal, keep-all peak +0.4% (the ET's transient estimate); test_replay.py
    // checks fresh recordings too.
    for (const char* m : {"bn", "dropout"}) {
        CAPTURE(m);
        Trace rec = load_trace(trace_path(std::string(m) + ".trace.json"));
        Trace et = load_trace(trace_path(std::string(m) + ".et.json"));
        const double fixed = double(et.fixed_bytes()) / double(rec.fixed_bytes());
        const double peak = double(keep_all_peak(et)) / double(keep_all_peak(rec));
        CHECK(fixed > 0.9999);
        CHECK(fixed < 1.0001);   // params x 4 (+ buffers): the batch is not fixed memory
        CHECK(peak > 1.000);   // saved = produced storages the backward reads (consumer rule)
        CHECK(peak < 1.005);
        REQUIRE(et.segments.size() == rec.segments.size());
        CHECK(et.segments[0].saved_bytes == rec.segments[0].saved_bytes);   // the batch
        CHECK(et.segments[1].saved_bytes == rec.segments[1].saved_bytes);   // an MLP block
    }
}

TEST_CASE("Execution Trace import: BatchNorm with training=False writes nothing") {
    nlohmann::json j = read_json(trace_path("bn.et.json"));
    size_t flipped = 0;
    for (auto& n : j["nodes"])
        if (n["name"] == "aten::native_batch_norm") {
            REQUIRE(n["inputs"][5] == true);
            n["inputs"][5] = false;
            ++flipped;
        }
    CHECK(flipped == 2);
    Trace eval = import_execution_trace(j, "<eval>");
    // what is left is BatchNorm's own num_batches_tracked.add_ (annotated (a!)): 8 bytes each
    CHECK(eval.buffers.size() == 2);
    for (const auto& b : eval.buffers) CHECK(b.bytes == 8);
    Trace train = load_trace(trace_path("bn.et.json"));
    CHECK(train.buffers.size() == 6);   // + running_mean / running_var of the two BatchNorms
}

TEST_CASE("Execution Trace import: a random op on an explicit torch.Generator is non-replayable") {
    nlohmann::json j = read_json(trace_path("dropout.et.json"));
    size_t changed = 0;
    for (auto& n : j["nodes"])
        if (n["name"] == "aten::bernoulli_" && changed == 0) {   // the first dropout only
            auto& types = n["input_types"];
            REQUIRE(types.back() == "None");
            types.back() = "Generator";
            ++changed;
        }
    REQUIRE(changed == 1);
    Trace t = import_execution_trace(j, "<gen>");
    std::vector<std::string> nr;
    for (const auto& s : t.segments)
        if (!s.non_replayable.empty()) nr.push_back(s.name);
    CHECK(nr == std::vector<std::string>{"2"});
    CHECK(t.segments[2].non_replayable ==
          "aten::bernoulli_ draws from an explicit torch.Generator; the Execution Trace does not "
          "say which (record with scripts/record_trace.py to plan it)");
    Trace plain = load_trace(trace_path("dropout.et.json"));
    for (const auto& s : plain.segments) CHECK(s.non_replayable.empty());
    CHECK(plain.segments[2].rng.size() == 1);
}

TEST_CASE("plan output: the trace hash and its algorithm; the SVG title is XML-escaped") {
    const Trace t = load_trace(trace_path("counter.trace.json"));
    Problem p(t);
    const auto results = make_planner("joint")->plan_all(p, {1ull << 30});
    const nlohmann::json plan = plan_to_json(p, "counter.trace.json", "joint", results, {1, 2});
    CHECK(plan["format_version"] == kPlanFormatVersion);
    CHECK(plan["trace"]["hash"] == t.hash);
    CHECK(plan["trace"]["hash_algorithm"] == "xxh3-64");
    CHECK(xml_escape(R"(a<b & "c" 'd'>)") == "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
    const std::string svg = sweep_svg({{"joint", results}}, "replay-plan: <model & \"x\">");
    CHECK(svg.find(">replay-plan: &lt;model &amp; &quot;x&quot;&gt;</text>") != std::string::npos);
    CHECK(svg.find("<model") == std::string::npos);
}
