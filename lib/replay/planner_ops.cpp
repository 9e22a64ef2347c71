// The ops planner (issue 53, op-level plans): within a recomputed segment, save single ops
// (their outputs held from the forward to the backward, as torch's selective activation
// checkpointing does with MUST_SAVE) instead of recomputing them.
//
// Segment decisions come from the joint planner's exact frontier (FrontierSweep over the safe
// options, so every contract holds as in joint's plans). For a budget B the planner takes
// joint's plans at kStarts budgets spread from joint's least peak to min(B, keep-all peak),
// and fills each greedily: over every recomputed segment's saveable ops (Segment::ops with
// no `fixed` reason: no RNG draw, no state read, no in-place write, no view, output not
// written later), most recompute time saved per byte held first, an op is saved when the
// predicted peak with it stays <= B. The fastest filled plan is the answer. Saving only adds
// held bytes, so the least feasible peak is joint's.
//
// Cost of a saved op (op_level_cost): its output bytes are added to the segment's held and
// work bytes (a bound: an output autograd saves anyway is counted twice), its forward time
// is taken off the recompute. The greedy check is O(1) per op with prefix / suffix maxima of
// (held prefix + work), rebuilt in O(segments) per op saved.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

namespace {
constexpr int kStarts = 24;

int64_t op_ns(const OpCost& o) { return static_cast<int64_t>(std::llround(o.ms * 1e6)); }

struct Filled {
    std::vector<Decision> d;
    std::vector<std::vector<uint32_t>> saved;
    Evaluation e;
};

// Greedy fill of decisions d (feasible at `budget`) with saved ops, most ns per byte first.
Filled fill(const Problem& p, std::vector<Decision> d, uint64_t budget) {
    const size_t n = p.size();
    const auto& segs = p.trace->segments;
    struct Cand {
        size_t i;
        uint32_t j;
        double ratio;
    };
    std::vector<Cand> cands;
    for (size_t i = 0; i < n; ++i) {
        if (d[i] == Decision::Keep) continue;
        for (uint32_t j = 0; j < segs[i].ops.size(); ++j) {
            const OpCost& o = segs[i].ops[j];
            if (!o.saveable() || op_ns(o) <= 0) continue;
            cands.push_back({i, j, static_cast<double>(op_ns(o)) / static_cast<double>(o.bytes)});
        }
    }
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Cand& a, const Cand& b) { return a.ratio > b.ratio; });
    Filled f{std::move(d), std::vector<std::vector<uint32_t>>(n), {}};
    std::vector<OptionCost> c(n);
    std::vector<int64_t> gain_left(n);   // recompute time still above keep's
    for (size_t i = 0; i < n; ++i) {
        c[i] = p.cost(i, f.d[i]);
        gain_left[i] = std::max<int64_t>(0, c[i].time_ns - p.cost(i, Decision::Keep).time_ns);
    }
    const uint64_t fixed = p.fixed(), floor = p.floor();
    // pre[i] = max_{j<i}(P_j + W_j), suf[i] = max_{j>=i}(P_j + W_j), total = sum H.
    std::vector<uint64_t> pre(n + 1), suf(n + 1);
    uint64_t total = 0;
    auto rebuild = [&] {
        uint64_t prefix = 0;
        std::vector<uint64_t> v(n);
        for (size_t i = 0; i < n; ++i) {
            v[i] = prefix + c[i].work;
            prefix += c[i].held;
        }
        total = prefix;
        pre[0] = 0;
        for (size_t i = 0; i < n; ++i) pre[i + 1] = std::max(pre[i], v[i]);
        suf[n] = 0;
        for (size_t i = n; i-- > 0;) suf[i] = std::max(suf[i + 1], v[i]);
    };
    rebuild();
    for (const Cand& k : cands) {
        const OpCost& o = segs[k.i].ops[k.j];
        if (gain_left[k.i] <= 0) continue;
        const uint64_t e = o.bytes;
        const uint64_t act = std::max({total + e, pre[k.i], suf[k.i] + e});
        if (fixed + std::max(act, floor) > budget) continue;
        f.saved[k.i].push_back(k.j);
        c[k.i].held += e;
        c[k.i].work += e;
        gain_left[k.i] -= op_ns(o);
        rebuild();
    }
    for (auto& s : f.saved) std::sort(s.begin(), s.end());
    f.e = op_level_eval(p, f.d, f.saved);
    return f;
}
}  // namespace

OptionCost op_level_cost(const Problem& p, size_t i, Decision d, const std::vector<uint32_t>& saved) {
    OptionCost o = p.cost(i, d);
    if (d == Decision::Keep || saved.empty()) return o;
    const auto& ops = p.trace->segments.at(i).ops;
    uint64_t bytes = 0;
    int64_t ns = 0;
    for (uint32_t j : saved) {
        bytes += ops.at(j).bytes;
        ns += op_ns(ops[j]);
    }
    o.held += bytes;
    o.work += bytes;
    o.time_ns = std::max(p.cost(i, Decision::Keep).time_ns, o.time_ns - ns);
    return o;
}

Evaluation op_level_eval(const Problem& p, const std::vector<Decision>& d,
                         const std::vector<std::vector<uint32_t>>& saved) {
    if (saved.empty()) return evaluate(p, d);
    if (d.size() != p.size() || saved.size() != d.size())
        throw std::invalid_argument("decision / saved-op count != segment count");
    Evaluation e;
    uint64_t prefix = 0, peak = 0;
    for (size_t i = 0; i < d.size(); ++i) {
        OptionCost o = op_level_cost(p, i, d[i], saved[i]);
        peak = std::max(peak, prefix + o.work);
        prefix += o.held;
        e.step_time_ns += o.time_ns;
    }
    e.peak_bytes = p.peak(std::max(peak, prefix));
    return e;
}

std::string OpsPlanner::name() const { return "ops"; }

PlanResult OpsPlanner::plan(const Problem& p, uint64_t budget) const {
    return plan_all(p, {budget}).front();
}

std::vector<PlanResult> OpsPlanner::plan_all(const Problem& p,
                                             const std::vector<uint64_t>& budgets) const {
    const uint64_t least = min_peak(p);
    const uint64_t keep_all = evaluate(p, std::vector<Decision>(p.size(), Decision::Keep)).peak_bytes;
    const FrontierSweep sweep(p, p.safe_options());
    std::vector<PlanResult> out;
    out.reserve(budgets.size());
    for (uint64_t b : budgets) {
        std::optional<Filled> best;
        if (b >= least) {
            const uint64_t hi = std::min(b, keep_all);
            std::set<std::vector<Decision>> seen;
            for (int k = 0; k <= kStarts; ++k) {
                const uint64_t start = hi <= least ? hi
                    : least + static_cast<uint64_t>(static_cast<double>(hi - least) * k / kStarts);
                auto d = sweep.plan(k == kStarts ? b : start);
                if (!d || !seen.insert(*d).second) continue;
                Filled f = fill(p, std::move(*d), b);
                if (f.e.peak_bytes <= b && (!best || f.e.step_time_ns < best->e.step_time_ns))
                    best = std::move(f);
            }
        }
        PlanResult r;
        if (!best) {
            r = finish_plan(p, name(), b, {}, least);
        } else {
            const bool any = std::any_of(best->saved.begin(), best->saved.end(),
                                         [](const auto& s) { return !s.empty(); });
            r = finish_plan(p, name(), b, best->d, least, &best->e);
            if (any) r.saved_ops = std::move(best->saved);
        }
        if (sweep.quantum()) {
            r.exact = false;
            r.quantum_bytes = sweep.quantum();
        }
        out.push_back(std::move(r));
    }
    return out;
}

uint64_t OpsPlanner::min_peak(const Problem& p) const { return min_peak_over(p, p.safe_options()); }

}  // namespace ckpt::replay
