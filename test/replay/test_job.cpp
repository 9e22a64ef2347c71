// The replay-plan job (lib/replay/job.h): activation budgets, the feasible range in both
// forms, memory outside segments and the optimizer step's floor in every planner's peak, and
// what a plan carries for a runtime (ops_hash, state kind and argument index).
#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include "common/error.h"
#include "helpers.h"
#include "replay/job.h"
#include "replay/planner.h"

using namespace ckpt::replay;
using replay_test::finish;
using replay_test::seg;

namespace {
// Three stateless segments (saved 1000, 2000, 3000 B; transient 10 B; input 100 B) and one
// that writes a buffer passed to it as argument 0; fixed: params 100, grads 100, optimizer
// 200, outside 50, buffer 8; the optimizer step needs `step` bytes.
Trace example(uint64_t step) {
    Trace t;
    t.param_bytes = 100;
    t.grad_bytes = 100;
    t.optimizer_bytes = 200;
    t.outside_bytes = 50;
    t.step_bytes = step;
    t.fingerprint = "00000000000000aa";
    t.buffers.push_back({"3.count", 8, "buffer"});
    for (int i = 0; i < 3; ++i) {
        t.segments.push_back(seg(std::to_string(i), 1.0, 1000u * (i + 1), 100, 10));
        t.segments.back().ops_hash = "000000000000000" + std::to_string(i);
    }
    Segment s = seg("3", 1.0, 4000, 100, 10);
    StateAccess a;
    a.buffer = "3.count";
    a.version_read = 0;
    a.bytes_read = 8;
    a.written = true;
    a.version_written = 1;
    a.bytes_written = 8;
    a.regions = {{0, 8}};
    a.arg = 0;
    s.state.push_back(a);
    t.segments.push_back(s);
    return finish(t);
}

PlanJob job_for(const Trace& t, PlanRequest req) {
    return run_plan(trace_to_json(t).dump(), "<example>", req);
}
}  // namespace

TEST_CASE("fixed memory includes memory outside segments; the trace keeps the new fields") {
    const Trace t = example(0);
    CHECK(t.fixed_bytes() == 100 + 100 + 200 + 50 + 8);
    CHECK(t.segments[3].state[0].arg == 0);
    CHECK(t.segments[1].ops_hash == "0000000000000001");
    nlohmann::json j = trace_to_json(t);
    CHECK(j["fixed"]["outside_bytes"] == 50);
    j["segments"][0]["ops_hash"] = "XYZ";
    CHECK_THROWS_WITH_AS(trace_from_json(j, "<t>"), "segments[0].ops_hash: expected 16 lowercase hex digits",
                         ckpt::BadInput);
}

TEST_CASE("activation budgets are bytes above the fixed memory; the range is given in both forms") {
    const Trace t = example(0);
    const uint64_t fixed = t.fixed_bytes();
    PlanRequest req;
    req.activation_budgets = {1u << 20, 0};
    const PlanJob job = job_for(t, req);
    REQUIRE(job.results().size() == 2);
    CHECK(job.results()[0].budget_bytes == fixed + (1u << 20));
    CHECK(job.results()[0].feasible);
    // keep everything: the last segment runs on 1000+2000+3000 held, saves 4000, 10 transient
    CHECK(job.keep_all == fixed + 10010);
    CHECK(job.results()[0].peak_bytes == job.keep_all);
    CHECK_FALSE(job.results()[1].feasible);
    REQUIRE(job.failures.size() == 1);
    CHECK(job.failures[0].find("activation budget 0 B is infeasible for planner joint") == 0);
    const nlohmann::json plan = job.plan_json();
    CHECK(plan["fixed_bytes"] == fixed);
    CHECK(plan["range"]["keep_all_activation_bytes"] == 10010);
    CHECK(plan["range"]["min_activation_bytes"] == job.least - fixed);
    CHECK(plan["budgets"][0]["activation_budget_bytes"] == 1u << 20);
    CHECK(plan["budgets"][0]["activation_peak_bytes"] == 10010);
    CHECK(plan["fingerprint"] == "00000000000000aa");
    CHECK(plan["budgets"][0]["segments"][2]["ops_hash"] == "0000000000000002");
    const nlohmann::json summary = job.summary_json();
    CHECK(summary["range"] == plan["range"]);
    CHECK(summary["budgets"][1]["activation_peak_bytes"].is_null());
    CHECK(job.table().find("as activation budgets (above the fixed memory): >= ") != std::string::npos);
}

TEST_CASE("a plan's restore entries carry the state's kind and argument index") {
    const Trace t = example(0);
    PlanRequest req;
    req.planner = "all";   // recompute everything: segment 3 under its contract
    req.budgets = {1u << 30};
    const nlohmann::json plan = job_for(t, req).plan_json();
    const nlohmann::json& c = plan["budgets"][0]["segments"][3]["contract"];
    REQUIRE(c["restore"].size() == 1);
    CHECK(c["restore"][0]["kind"] == "buffer");
    CHECK(c["restore"][0]["arg"] == 0);
    CHECK(c["discard"][0]["arg"] == 0);
}

TEST_CASE("the optimizer step's temporaries are a floor under every planner's peak") {
    const uint64_t step = 50000;   // above every activation peak
    const Trace t = example(step);
    const uint64_t fixed = t.fixed_bytes();
    for (const auto& name : planner_names()) {
        CAPTURE(name);
        Problem p(t);
        auto planner = make_planner(name);
        CHECK(planner->min_peak(p) == fixed + step);
        const PlanResult below = planner->plan(p, fixed + step - 1);
        CHECK_FALSE(below.feasible);
        const PlanResult at = planner->plan(p, fixed + step);
        CHECK(at.feasible);
        CHECK(at.peak_bytes == fixed + step);
        CHECK(evaluate(p, at.decisions).peak_bytes == fixed + step);
    }
}

TEST_CASE("bad requests: unknown planner, no budget, planner ops without op tables") {
    const Trace t = example(0);
    PlanRequest req;
    req.budgets = {1u << 30};
    req.planner = "fastest";
    CHECK_THROWS_WITH_AS(job_for(t, req), doctest::Contains("unknown planner 'fastest' (joint, eager, stateless, all, none, ops)"),
                         ckpt::BadInput);
    req.planner = "ops";   // a trace recorded without ops=True: refused, not a quiet segment plan
    CHECK_FALSE(t.op_tables);
    CHECK_THROWS_WITH_AS(job_for(t, req), doctest::Contains("planner 'ops' needs each segment's op table: record the "
                                                            "trace with ops=True"),
                         ckpt::BadInput);
    req = PlanRequest{};
    CHECK_THROWS_AS(job_for(t, req), ckpt::BadInput);
}
