// Replay simulator: contract-honouring plans pass; plain recomputes and incomplete contracts
// are caught with the exact segment and buffer.
#include <doctest/doctest.h>

#include "helpers.h"
#include "replay/plan_io.h"
#include "replay/simulate.h"

using namespace ckpt::replay;
using replay_test::trace_path;

namespace {
bool mentions(const SimReport& r, const std::string& what) {
    for (const auto& v : r.violations)
        if (v.find(what) != std::string::npos) return true;
    return false;
}
}  // namespace

TEST_CASE("every joint, eager and all plan of every example trace replays cleanly") {
    for (const auto& name : replay_test::model_traces()) {
        CAPTURE(name);
        Trace t = load_trace(trace_path(name));
        Problem p(t);
        uint64_t none = evaluate(p, std::vector<Decision>(p.size(), Decision::Keep)).peak_bytes;
        size_t recomputes = 0;
        for (uint64_t b = p.fixed(); b <= none; b += (none - p.fixed()) / 50)
            for (const char* pl : {"joint", "eager", "all"}) {
                PlanResult r = make_planner(pl)->plan(p, b);
                if (!r.feasible) continue;
                SimReport s = simulate(p, r.decisions);
                CHECK(s.ok());
                recomputes += s.recomputes;
            }
        CHECK(recomputes > 0);
        // Snapshot and selective on every stateful segment: both replay cleanly.
        for (Decision d : {Decision::Snapshot, Decision::Selective}) {
            std::vector<Decision> all(p.size(), Decision::Recompute);
            for (size_t i = 0; i < p.size(); ++i)
                if (p.contracts[i].stateful()) all[i] = d;
            CHECK(simulate(p, all).ok());
        }
    }
}

TEST_CASE("plain recompute breaks the contract where the failure pattern says") {
    auto plain = [](const std::string& name) {
        static std::vector<Trace> keep;
        keep.push_back(load_trace(trace_path(name)));
        Problem p(keep.back());
        return simulate(p, std::vector<Decision>(p.size(), Decision::Recompute));
    };
    SimReport bn = plain("bn.trace.json");
    CHECK(mentions(bn, "segment 2: recompute leaks a write to '2.1.running_mean'"));
    CHECK(mentions(bn, "segment 4: recompute reads '4.1.num_batches_tracked' but does not see version 0"));
    CHECK(mentions(plain("dropout.trace.json"), "segment 2: recompute draws RNG stream 'cpu' at position 2 instead of 0"));
    CHECK(mentions(plain("kvcache.trace.json"), "recompute reads '2.cache' but does not see version 0"));
    CHECK(mentions(plain("counter.trace.json"), "recompute leaks a write to '4.steps'"));
    CHECK(mentions(plain("ema.trace.json"), "recompute reads '2.ema'"));
    CHECK(mentions(plain("sparse_write.trace.json"), "recompute reads '2.bank'"));
    CHECK(mentions(plain("dense_queue.trace.json"), "recompute reads '4.queue'"));
}

TEST_CASE("an incomplete selective contract is caught") {
    Trace t = load_trace(trace_path("sparse_write.trace.json"));
    Problem p(t);
    std::vector<Decision> d(p.size(), Decision::Keep);
    d[2] = Decision::Selective;
    CHECK(simulate(p, d).ok());
    REQUIRE(p.contracts[2].restore.size() == 2);
    p.contracts[2].restore[0].regions.back().length -= 4;   // forget the last 4 bytes
    SimReport r = simulate(p, d);
    CHECK(r.violations.size() == 1);
    CHECK(mentions(r, "segment 2: recompute reads '2.bank' but does not see version 0"));
}

TEST_CASE("kv-cache append: selective preserves nothing and truncates") {
    Trace t = load_trace(trace_path("kvcache.trace.json"));
    Problem p(t);
    REQUIRE(p.contracts[2].restore.size() == 1);
    CHECK(p.contracts[2].restore[0].regions.empty());
    CHECK(p.cost(2, Decision::Selective).preserved == 0);
    CHECK(p.cost(2, Decision::Snapshot).preserved == 2048);
    std::vector<Decision> d(p.size(), Decision::Keep);
    d[2] = d[4] = Decision::Selective;
    CHECK(simulate(p, d).ok());
}

TEST_CASE("sweep SVG has one curve per planner") {
    Trace t = load_trace(trace_path("bn.trace.json"));
    Problem p(t);
    std::vector<std::pair<std::string, std::vector<PlanResult>>> curves;
    for (const auto& name : planner_names()) {
        std::vector<PlanResult> rs;
        for (uint64_t b : {p.fixed() * 2, p.fixed() * 3}) rs.push_back(make_planner(name)->plan(p, b));
        curves.emplace_back(name, rs);
    }
    std::string svg = sweep_svg(curves, "t");
    size_t lines = 0;
    for (size_t k = svg.find("<polyline"); k != std::string::npos; k = svg.find("<polyline", k + 1)) ++lines;
    CHECK(lines == planner_names().size());
    CHECK(svg.rfind("</svg>") != std::string::npos);
}
