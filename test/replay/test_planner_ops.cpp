// The ops planner (planner_ops.cpp, issue 53 op-level plans): the trace's ops[] round trip and
// its bad input, the greedy fill of saved ops under the budget with exact figures, and the
// contract rule (ops with a `fixed` reason are never saved).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "helpers.h"
#include "replay/job.h"
#include "replay/plan_io.h"
#include "replay/planner.h"

using namespace ckpt::replay;
using namespace replay_test;

namespace {
// Three stateless segments (keep: held 1000, work 1050, 6 ms; recompute: held 100, work 1150,
// 8 ms), each with a matmul (100 B, 1 ms), a GELU (100 B, 0.01 ms) and two ops that must stay
// recomputed: an in-place add and a dropout draw (both 100 B, 5 ms: the best ratio).
Trace three() {
    Trace t;
    t.model = "ops";
    for (int i = 0; i < 3; ++i) {
        Segment s = seg("s" + std::to_string(i), 2, 1000, 100, 50);
        s.ops = {{"aten.mm.default", 0, 100, 1.0, ""},
                 {"aten.gelu.default", 0, 100, 0.01, ""},
                 {"aten.add_.Tensor", 0, 100, 5.0, "inplace"},
                 {"aten.bernoulli_.float", 0, 100, 5.0, "random"}};
        t.segments.push_back(s);
    }
    return finish(t);
}
}  // namespace

TEST_CASE("trace ops[]: round trip and bad input") {
    const Trace t = three();
    REQUIRE(t.segments[1].ops.size() == 4);
    CHECK(t.segments[1].ops[2].fixed == "inplace");
    CHECK(t.segments[1].ops[0].saveable());
    CHECK_FALSE(t.segments[1].ops[3].saveable());
    nlohmann::json j = trace_to_json(t);
    CHECK(trace_from_json(j, "t.json").op_tables);   // read back: the planner 'ops' may plan it
    CHECK(j["segments"][0]["ops"][0] == nlohmann::json({{"op", "aten.mm.default"}, {"k", 0}, {"bytes", 100}, {"ms", 1.0}}));
    j["segments"][2]["ops"][1].erase("k");
    CHECK_THROWS_WITH_AS(trace_from_json(j, "t.json"), doctest::Contains("segments[2].ops[1]: missing field 'k'"),
                         ckpt::BadInput);
    j["segments"][2]["ops"][1]["k"] = 0;
    j["segments"][2]["ops"][1]["ms"] = -1;
    CHECK_THROWS_WITH_AS(trace_from_json(j, "t.json"),
                         doctest::Contains("segments[2].ops[1].ms: expected a finite non-negative time"),
                         ckpt::BadInput);
}

TEST_CASE("ops planner: saved ops fill the budget, never the fixed ones, never slower than joint") {
    const Trace t = three();
    Problem p(t);
    auto ops = make_planner("ops");
    auto joint = make_planner("joint");
    CHECK(ops->min_peak(p) == 1250);   // s0, s1 recomputed, s2 kept
    CHECK(joint->min_peak(p) == 1250);
    const auto rs = ops->plan_all(p, {1249, 1250, 1350, uint64_t{1} << 40});
    CHECK_FALSE(rs[0].feasible);
    CHECK(rs[0].min_peak_bytes == 1250);
    // At the least budget there is no room for any saved op: joint's plan, 22 ms.
    CHECK(rs[1].feasible);
    CHECK(rs[1].saved_ops.empty());
    CHECK(rs[1].step_time_ns == 22'000'000);
    // 100 B more: s0's matmul saved (s1's would lift s1's recompute to 1450 B), 21 ms, where
    // joint's best at 1350 is still 22 ms.
    CHECK(joint->plan(p, 1350).step_time_ns == 22'000'000);
    CHECK(rs[2].feasible);
    CHECK(rs[2].decisions == std::vector<Decision>{Decision::Recompute, Decision::Recompute, Decision::Keep});
    CHECK(rs[2].saved_ops == std::vector<std::vector<uint32_t>>{{0}, {}, {}});
    CHECK(rs[2].peak_bytes == 1350);
    CHECK(rs[2].step_time_ns == 21'000'000);
    const Evaluation e = op_level_eval(p, rs[2].decisions, rs[2].saved_ops);
    CHECK(e.peak_bytes == rs[2].peak_bytes);
    CHECK(e.step_time_ns == rs[2].step_time_ns);
    // Everything fits: keep-all (18 ms) is fastest, nothing saved.
    CHECK(rs[3].step_time_ns == 18'000'000);
    CHECK(rs[3].saved_ops.empty());
    // The plan JSON lists the saved op with its key, and the segment's held bytes include it.
    const nlohmann::json pj = plan_to_json(p, "t.json", "ops", {rs[2]}, {1250, 3050});
    const auto& s0 = pj["budgets"][0]["segments"][0];
    CHECK(s0["save_ops"] == nlohmann::json::parse(R"([{"op":"aten.mm.default","k":0,"bytes":100,"ms":1.0}])"));
    CHECK(s0["held_bytes"] == 200);
    CHECK_FALSE(pj["budgets"][0]["segments"][1].contains("save_ops"));
    // Over a sweep: never slower than joint, never above the budget, fixed ops never saved.
    for (uint64_t b = 1250; b <= 3200; b += 25) {
        const PlanResult r = ops->plan(p, b), j = joint->plan(p, b);
        REQUIRE(r.feasible);
        CHECK(r.peak_bytes <= b);
        CHECK(r.step_time_ns <= j.step_time_ns);
        for (size_t i = 0; i < r.saved_ops.size(); ++i)
            for (uint32_t k : r.saved_ops[i]) CHECK(t.segments[i].ops[k].saveable());
    }
}

TEST_CASE("replay-plan --planner ops: the table names the saved ops per segment") {
    PlanRequest req;
    req.planner = "ops";
    req.budgets = {1350};
    const PlanJob job = run_plan(trace_to_json(three()).dump(), "t.json", req);
    CHECK(job.table().find("              saved ops: s0 (1)\n") != std::string::npos);
    req.budgets = {1250};
    CHECK(run_plan(trace_to_json(three()).dump(), "t.json", req).table().find("saved ops") == std::string::npos);
}
