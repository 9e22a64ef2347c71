// Contracts, cost model and planners. The joint planner is proven optimal against brute force
// on every example trace and on seeded random traces (every breakpoint budget).
#include <algorithm>
#include <random>
#include <set>

#include <doctest/doctest.h>

#include "helpers.h"
#include "replay/planner.h"
#include "replay/planner_impl.h"
#include "replay/simulate.h"

using namespace ckpt::replay;
using replay_test::finish;
using replay_test::seg;
using replay_test::trace_path;

namespace {

// Every budget at which some safe plan's feasibility changes (the peaks of all plans), plus
// one byte below each: the joint planner must match brute force at all of them.
std::vector<uint64_t> breakpoints(const Problem& p) {
    std::vector<std::vector<Decision>> options;
    for (size_t i = 0; i < p.size(); ++i) options.push_back(p.safe_options(i));
    std::set<uint64_t> peaks;
    std::vector<size_t> idx(p.size(), 0);
    std::vector<Decision> d(p.size());
    while (true) {
        for (size_t i = 0; i < p.size(); ++i) d[i] = options[i][idx[i]];
        uint64_t pk = evaluate(p, d).peak_bytes;
        peaks.insert(pk);
        peaks.insert(pk - 1);
        size_t k = 0;
        while (k < p.size() && ++idx[k] == options[k].size()) idx[k++] = 0;
        if (k == p.size()) break;
    }
    return {peaks.begin(), peaks.end()};
}

void check_joint_is_optimal(const Problem& p) {
    auto joint = make_planner("joint"), brute = make_planner("brute");
    for (uint64_t b : breakpoints(p)) {
        PlanResult j = joint->plan(p, b), r = brute->plan(p, b);
        CAPTURE(b);
        REQUIRE(j.feasible == r.feasible);
        CHECK(j.exact);
        if (!j.feasible) continue;
        CHECK(j.step_time_ns == r.step_time_ns);
        CHECK(j.peak_bytes <= b);
        const Evaluation e = evaluate(p, j.decisions);   // the DP's own (need, time) is exact
        CHECK(j.peak_bytes == e.peak_bytes);
        CHECK(j.step_time_ns == e.step_time_ns);
        CHECK(j.safe);
    }
}

// A random trace: n segments, buffers written and read at random, random RNG use.
Trace random_trace(std::mt19937_64& rng, size_t n) {
    auto u = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
    Trace t;
    t.param_bytes = u(0, 1000);
    t.copy_gbps = 0.5;
    size_t nb = u(0, 3);
    std::vector<uint64_t> size(nb), version(nb, 0);
    for (size_t b = 0; b < nb; ++b) {
        size[b] = u(1, 64) * 8;
        t.buffers.push_back({"b" + std::to_string(b), size[b]});
    }
    for (size_t i = 0; i < n; ++i) {
        Segment s = seg("s" + std::to_string(i), static_cast<double>(u(1, 50)) / 10, u(0, 4000), u(0, 500), u(0, 1000));
        for (size_t b = 0; b < nb; ++b) {
            if (u(0, 2) != 0) continue;
            StateAccess a;
            a.buffer = t.buffers[b].id;
            a.read = u(0, 3) != 0;
            a.version_read = version[b];
            a.bytes_read = size[b];
            a.written = u(0, 1) == 1;
            if (a.written) {
                a.version_written = ++version[b];
                uint64_t grow = u(0, 3) == 0 ? u(1, 8) * 8 : 0;
                a.bytes_written = size[b] + grow;
                uint64_t off = u(0, size[b] / 8 - 1) * 8;
                a.regions.push_back({off, std::min<uint64_t>(u(1, 4) * 8, a.bytes_written - off)});
                if (grow) a.regions = region_union(a.regions, {{size[b], grow}}, a.bytes_written);
                size[b] = a.bytes_written;
            }
            s.state.push_back(a);
        }
        if (u(0, 4) == 0) s.rng.push_back({"cpu", 5056});
        t.segments.push_back(s);
    }
    return finish(t);
}

}  // namespace

TEST_CASE("contracts: hazards, region unions, appended bytes dropped, versions in the id") {
    Trace t;
    t.buffers = {{"x", 200}};
    Segment a = seg("a", 1, 100, 10, 0), b = seg("b", 1, 100, 10, 0), c = seg("c", 1, 100, 10, 0);
    a.state.push_back({"x", true, true, 0, 1, 200, 200, {{0, 8}}});
    b.state.push_back({"x", false, true, 1, 2, 200, 300, {{100, 50}, {200, 100}}});
    c.state.push_back({"x", true, false, 2, 0, 300, 0, {}});
    t.segments = {a, b, c};
    Trace tt = finish(t);
    auto cs = derive_contracts(tt);
    REQUIRE(cs[0].restore.size() == 1);
    CHECK(cs[0].restore[0].version == 0);
    CHECK(cs[0].restore[0].bytes == 200);
    CHECK(cs[0].restore[0].regions == std::vector<Region>{{0, 8}, {100, 50}});   // [200,300) dropped
    CHECK(cs[0].discard.size() == 1);
    CHECK(cs[1].restore.empty());             // b does not read x
    CHECK(cs[1].discard.size() == 1);
    CHECK(cs[2].restore.empty());             // nothing writes x after c reads it
    CHECK(!cs[2].stateful());
    CHECK(cs[0].id == tt.hash + ":a:x@0");
    CHECK(region_union({{0, 10}}, {{5, 10}, {30, 5}}, 32) == std::vector<Region>{{0, 15}, {30, 2}});
    CHECK(coalesce_regions({{0, 8}, {20, 4}, {40, 8}}, 16) == std::vector<Region>{{0, 24}, {40, 8}});
}

TEST_CASE("cost model: exact peak and time by hand") {
    // Two segments; s1 stateful (buffer of 1000 bytes, 40 bytes of regions in 2 runs).
    Trace t;
    t.param_bytes = 500;
    t.copy_gbps = 1.0;   // 1 byte per ns
    t.buffers = {{"m", 1000}};
    Segment s0 = seg("s0", 1.0, 4000, 100, 50), s1 = seg("s1", 2.0, 6000, 200, 300);
    s1.state.push_back({"m", true, true, 0, 1, 1000, 1000, {{0, 16}, {100, 24}}});
    t.segments = {s0, s1};
    Problem p(t = finish(t));
    const uint64_t fixed = 500 + 1000;
    CHECK(p.fixed() == fixed);
    // keep, keep: prefix peaks 0+4050, 4000+6300; final 10000.
    Evaluation kk = evaluate(p, {Decision::Keep, Decision::Keep});
    CHECK(kk.peak_bytes == fixed + 10300);
    CHECK(kk.step_time_ns == 3'000'000 + 6'000'000);
    // keep, snapshot: held 200 + 1000; work = held + 6000 + 300 + stash 1000.
    Evaluation ks = evaluate(p, {Decision::Keep, Decision::Snapshot});
    CHECK(ks.peak_bytes == fixed + 4000 + 1200 + 6000 + 300 + 1000);
    CHECK(ks.step_time_ns == 3'000'000 + 6'000'000 + 2'000'000 + (2 * 1000 + 1000));
    // keep, selective: preserved 40 + 2*16 metadata = 72.
    Evaluation kl = evaluate(p, {Decision::Keep, Decision::Selective});
    CHECK(kl.peak_bytes == fixed + 4000 + 272 + 6000 + 300 + 1000);
    CHECK(kl.step_time_ns == 3'000'000 + 6'000'000 + 2'000'000 + (2 * 72 + 1000));
    // recompute, keep: s0 holds 100.
    Evaluation rk = evaluate(p, {Decision::Recompute, Decision::Keep});
    CHECK(rk.peak_bytes == fixed + 100 + 6000 + 300);
    CHECK(p.safe_options(0) == std::vector<Decision>{Decision::Keep, Decision::Recompute});
    CHECK(p.safe_options(1) == std::vector<Decision>{Decision::Keep, Decision::Snapshot, Decision::Selective});
}

TEST_CASE("joint planner = brute force on every example trace, at every breakpoint budget") {
    for (const auto& name : replay_test::model_traces()) {
        CAPTURE(name);
        Trace t = load_trace(trace_path(name));
        check_joint_is_optimal(Problem(t));
    }
    for (const char* name : {"bn.et.json", "dropout.et.json"}) {
        Trace t = load_trace(trace_path(name));
        check_joint_is_optimal(Problem(t));
    }
}

TEST_CASE("joint planner = brute force on 300 seeded random traces") {
    std::mt19937_64 rng(20260101);
    for (int k = 0; k < 300; ++k) {
        Trace t = random_trace(rng, 1 + k % 7);
        CAPTURE(k);
        Problem p(t);
        check_joint_is_optimal(p);
        for (size_t i = 0; i < p.size(); ++i)   // gap merging: selective <= snapshot + metadata
            if (!p.contracts[i].restore.empty())
                CHECK(p.cost(i, Decision::Selective).preserved <=
                      p.cost(i, Decision::Snapshot).preserved + kRegionMetaBytes * p.contracts[i].restore.size());
    }
}

TEST_CASE("baselines: joint is never slower; stateless is flagged unsafe; infeasible is reported") {
    Trace t = load_trace(trace_path("bn.trace.json"));
    Problem p(t);
    auto joint = make_planner("joint");
    bool stateless_unsafe_seen = false;
    for (uint64_t b : breakpoints(p)) {
        PlanResult j = joint->plan(p, b);
        for (const auto& name : planner_names()) {
            PlanResult r = make_planner(name)->plan(p, b);
            if (r.feasible && r.safe) {
                REQUIRE(j.feasible);
                CHECK(j.step_time_ns <= r.step_time_ns);
            }
            if (name == "stateless" && r.feasible && !r.safe) {
                stateless_unsafe_seen = true;
                CHECK(r.unsafe.front().find("running_mean") != std::string::npos);
            }
        }
    }
    CHECK(stateless_unsafe_seen);
    PlanResult none = make_planner("none")->plan(p, 1);
    CHECK(!none.feasible);
    CHECK(none.decisions.empty());
    CHECK(none.min_peak_bytes > 1);
    CHECK_THROWS_AS(make_planner("magic"), std::invalid_argument);
}

TEST_CASE("quantised DP: feasible and no slower than the exact optimum at budget - n*q") {
    std::mt19937_64 rng(7);
    int bounded = 0;
    for (int k = 0; k < 120; ++k) {   // the backward DP prunes more: more traces
        Trace t = random_trace(rng, 10);
        Problem p(t);
        std::vector<std::vector<Decision>> options;
        for (size_t i = 0; i < p.size(); ++i) options.push_back(p.safe_options(i));
        uint64_t none_peak = evaluate(p, std::vector<Decision>(p.size(), Decision::Keep)).peak_bytes;
        uint64_t budget = p.fixed() + (none_peak - p.fixed()) * 3 / 4;
        uint64_t q = 0;
        auto d = min_time_plan(p, budget, options, &q, 16);
        auto exact = min_time_plan(p, budget, options, nullptr);
        if (!d) continue;
        CHECK(evaluate(p, *d).peak_bytes <= budget);
        if (q == 0 || p.size() * q >= budget - p.fixed()) continue;   // bound is vacuous
        ++bounded;
        auto tighter = min_time_plan(p, budget - p.size() * q, options, nullptr);
        PlanResult bt = make_planner("brute")->plan(p, budget - p.size() * q);
        PlanResult bb = make_planner("brute")->plan(p, budget);
        CHECK(bt.feasible == tighter.has_value());
        if (tighter) CHECK(bt.step_time_ns == evaluate(p, *tighter).step_time_ns);
        if (exact) CHECK(bb.step_time_ns == evaluate(p, *exact).step_time_ns);
        if (tighter) CHECK(evaluate(p, *d).step_time_ns <= evaluate(p, *tighter).step_time_ns);
        if (exact) CHECK(evaluate(p, *d).step_time_ns >= evaluate(p, *exact).step_time_ns);
    }
    CHECK(bounded >= 10);   // the bound was exercised, not skipped
}

namespace {
// The seed's eager planner, verbatim in behaviour (O(n) evaluation per greedy step): the
// reference for EagerPlanner's O(n log n) prefix-peak version.
std::vector<Decision> seed_eager(const Problem& p, uint64_t budget) {
    std::vector<Decision> d(p.size(), Decision::Keep);
    struct Cand {
        size_t i;
        Decision o;
        double ratio;
    };
    std::vector<Cand> cands;
    for (size_t i = 0; i < p.size(); ++i) {
        if (!p.contracts[i].replayable) continue;
        Decision o = p.contracts[i].stateful() ? Decision::Snapshot : Decision::Recompute;
        OptionCost k = p.cost(i, Decision::Keep), c = p.cost(i, o);
        if (c.held >= k.held) continue;
        double dt = static_cast<double>(std::max<int64_t>(1, c.time_ns - k.time_ns));
        cands.push_back({i, o, static_cast<double>(k.held - c.held) / dt});
    }
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Cand& a, const Cand& b) { return a.ratio > b.ratio; });
    for (const auto& c : cands) {
        if (evaluate(p, d).peak_bytes <= budget) break;
        d[c.i] = c.o;
    }
    return d;
}

std::vector<Problem> example_and_random_problems(std::vector<Trace>& keep) {
    std::mt19937_64 rng(99);
    for (const auto& name : replay_test::model_traces()) keep.push_back(load_trace(trace_path(name)));
    for (int k = 0; k < 60; ++k) keep.push_back(random_trace(rng, 1 + k % 9));
    std::vector<Problem> out;
    for (const auto& t : keep) out.emplace_back(t);
    return out;
}
}  // namespace

TEST_CASE("eager: plan_all equals the seed's greedy at every breakpoint budget") {
    std::vector<Trace> traces;
    int compared = 0;
    for (const Problem& p : example_and_random_problems(traces)) {
        auto eager = make_planner("eager");
        const auto bs = breakpoints(p);
        const auto all = eager->plan_all(p, bs);
        REQUIRE(all.size() == bs.size());
        for (size_t k = 0; k < bs.size(); ++k) {
            CAPTURE(bs[k]);
            const auto ref = seed_eager(p, bs[k]);
            const bool fits = evaluate(p, ref).peak_bytes <= bs[k];
            REQUIRE(all[k].feasible == fits);
            if (fits) {
                CHECK(all[k].decisions == ref);
                const Evaluation e = evaluate(p, ref);   // the running sums are exact
                CHECK(all[k].peak_bytes == e.peak_bytes);
                CHECK(all[k].step_time_ns == e.step_time_ns);
            }
            ++compared;
        }
    }
    CHECK(compared > 2000);
}

TEST_CASE("min_peak: every planner is feasible exactly from its min_peak up") {
    std::vector<Trace> traces;
    for (const Problem& p : example_and_random_problems(traces))
        for (const auto& name : planner_names()) {
            CAPTURE(name);
            auto pl = make_planner(name);
            const uint64_t m = pl->min_peak(p);
            const auto rs = pl->plan_all(p, {m - 1, m, m + 1, m * 2});
            CHECK(!rs[0].feasible);
            CHECK(rs[0].min_peak_bytes == m);
            CHECK(rs[1].feasible);
            CHECK(rs[1].peak_bytes <= m);
            CHECK(rs[2].feasible);
            CHECK(rs[3].feasible);
            if (name == "none") CHECK(m == evaluate(p, std::vector<Decision>(p.size(), Decision::Keep)).peak_bytes);
        }
}

TEST_CASE("joint, thinned: never slower than eager (fallback), feasible from the same edge") {
    std::vector<Trace> traces;
    int thinned = 0, fell_back = 0;
    for (const Problem& p : example_and_random_problems(traces)) {
        const JointPlanner tiny(p.size());   // one frontier state per segment: heavy thinning
        const auto bs = breakpoints(p);
        const auto j = tiny.plan_all(p, bs), e = make_planner("eager")->plan_all(p, bs),
                   exact = make_planner("joint")->plan_all(p, bs);
        for (size_t k = 0; k < bs.size(); ++k) {
            CAPTURE(bs[k]);
            REQUIRE(j[k].feasible == exact[k].feasible);   // the smallest need is kept exactly
            if (e[k].feasible) {
                REQUIRE(j[k].feasible);
                CHECK(j[k].step_time_ns <= e[k].step_time_ns);
            }
            if (j[k].feasible) {
                CHECK(j[k].safe);
                CHECK(j[k].step_time_ns >= exact[k].step_time_ns);
                CHECK(j[k].peak_bytes <= bs[k]);
            }
            thinned += !j[k].exact;
            fell_back += j[k].fallback;
        }
    }
    CHECK(thinned > 100);
    CHECK(fell_back > 0);   // the fallback was exercised, not just possible
}

TEST_CASE("non-replayable segment: kept by every safe planner, UNSAFE when stateless recomputes it") {
    Trace t = load_trace(trace_path("counter.trace.json"));
    // a stateless segment (an MLP block) made non-replayable, as the recorder's probe marks it
    REQUIRE(t.segments[1].state.empty());
    Trace base = t;
    t.segments[1].non_replayable = "replay probe: output differs";
    t = replay_test::finish(t);
    Problem p(t), pb(base);
    CHECK(!p.contracts[1].replayable);
    CHECK(p.safe_options(1) == std::vector<Decision>{Decision::Keep});
    bool stateless_unsafe = false;
    for (uint64_t b : {p.fixed() * 2, make_planner("joint")->min_peak(p),
                       make_planner("stateless")->min_peak(p)}) {
        for (const auto& name : planner_names()) {
            CAPTURE(name);
            PlanResult r = make_planner(name)->plan(p, b);
            if (!r.feasible) continue;
            if (name == "stateless") {
                if (r.decisions[1] != Decision::Keep) {
                    stateless_unsafe = true;
                    CHECK(!r.safe);
                    const SimReport sim = simulate(p, r.decisions);   // --check fails too
                    CHECK(std::find(sim.violations.begin(), sim.violations.end(),
                                    "segment 1: recomputed but not replayable (replay probe: "
                                    "output differs)") != sim.violations.end());
                    CHECK(std::find(r.unsafe.begin(), r.unsafe.end(),
                                    "1: non-replayable: replay probe: output differs") != r.unsafe.end());
                }
                continue;
            }
            CHECK(r.decisions[1] == Decision::Keep);
            CHECK(r.safe);
        }
    }
    CHECK(stateless_unsafe);
    // the joint planner without the mark recomputes segment 1 at its tightest budget
    auto jb = make_planner("joint")->plan(pb, make_planner("joint")->min_peak(pb));
    CHECK(jb.decisions[1] == Decision::Recompute);
}
