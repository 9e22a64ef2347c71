// The eager baseline (the seed's planner, docs/design.md §5): start from keep-all, then greedily turn
// segments into recomputes (whole snapshots for stateful ones) in decreasing order of bytes
// freed per ns of added time, until the predicted peak fits the budget.
//
// The greedy order does not depend on the budget, so the answer for budget B is the first
// prefix of the order whose peak fits B (or the whole order, infeasible, when none does).
// plan_all evaluates every prefix once: the peak is max(total held, max_i (P_i + W_i)) with
// P_i the held prefix before segment i; one greedy step changes H_i and W_i, i.e. adds
// dH to every P_j (j > i) and the total, and dW to P_i + W_i: a range add + point add on a
// max segment tree, O(log n) per step, O(n log n) for the whole order instead of the seed's
// O(n) evaluation per step (quadratic in all:
// docs/benchmarks.md, "Measurements behind the code's choices").
#include <algorithm>
#include <cstdint>

#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {
namespace {

// Max segment tree with lazy range add over int64 values (bytes fit: the reader bounds sums
// to 2^50).
class MaxTree {
public:
    explicit MaxTree(const std::vector<int64_t>& v) : n_(std::max<size_t>(1, v.size())) {
        size_ = 1;
        while (size_ < n_) size_ <<= 1;
        max_.assign(2 * size_, INT64_MIN / 2);
        add_.assign(2 * size_, 0);
        for (size_t i = 0; i < v.size(); ++i) max_[size_ + i] = v[i];
        for (size_t k = size_; k-- > 1;) max_[k] = std::max(max_[2 * k], max_[2 * k + 1]);
    }
    // Add x to positions [lo, hi).
    void add(size_t lo, size_t hi, int64_t x) { add(1, 0, size_, lo, hi, x); }
    int64_t max() const { return max_[1]; }

private:
    void add(size_t k, size_t a, size_t b, size_t lo, size_t hi, int64_t x) {
        if (hi <= a || b <= lo) return;
        if (lo <= a && b <= hi) {
            max_[k] += x;
            add_[k] += x;
            return;
        }
        size_t m = (a + b) / 2;
        add(2 * k, a, m, lo, hi, x);
        add(2 * k + 1, m, b, lo, hi, x);
        max_[k] = add_[k] + std::max(max_[2 * k], max_[2 * k + 1]);
    }
    size_t n_, size_ = 1;
    std::vector<int64_t> max_, add_;   // max_[k] includes add_[k] (pending for the children)
};

struct Step {
    size_t i;
    Decision o;
};

// The greedy order (most bytes freed per added ns first; stable, as the seed).
std::vector<Step> greedy_order(const Problem& p) {
    struct Cand {
        size_t i;
        Decision o;
        double ratio;
    };
    std::vector<Cand> cands;
    for (size_t i = 0; i < p.size(); ++i) {
        if (!p.contracts[i].replayable) continue;   // always kept
        Decision o = p.contracts[i].stateful() ? Decision::Snapshot : Decision::Recompute;
        OptionCost k = p.cost(i, Decision::Keep), c = p.cost(i, o);
        if (c.held >= k.held) continue;
        double dt = static_cast<double>(std::max<int64_t>(1, c.time_ns - k.time_ns));
        cands.push_back({i, o, static_cast<double>(k.held - c.held) / dt});
    }
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Cand& a, const Cand& b) { return a.ratio > b.ratio; });
    std::vector<Step> out(cands.size());
    for (size_t k = 0; k < cands.size(); ++k) out[k] = {cands[k].i, cands[k].o};
    return out;
}

// [k] = evaluate() after the first k greedy steps: predicted peak (bytes, fixed included)
// and step time (ns, a running sum).
std::vector<Evaluation> prefix_peaks(const Problem& p, const std::vector<Step>& order) {
    const size_t n = p.size();
    std::vector<int64_t> v(n);
    int64_t prefix = 0;
    for (size_t i = 0; i < n; ++i) {
        OptionCost o = p.cost(i, Decision::Keep);
        v[i] = prefix + static_cast<int64_t>(o.work);
        prefix += static_cast<int64_t>(o.held);
    }
    MaxTree tree(v);
    int64_t total = prefix, time = 0;
    for (size_t i = 0; i < n; ++i) time += p.cost(i, Decision::Keep).time_ns;
    const int64_t fixed = static_cast<int64_t>(p.fixed()), floor = static_cast<int64_t>(p.floor());
    std::vector<Evaluation> peaks;
    peaks.reserve(order.size() + 1);
    auto now = [&] {
        return Evaluation{static_cast<uint64_t>(fixed + std::max({total, tree.max(), floor})), time};
    };
    peaks.push_back(now());
    for (const Step& s : order) {
        OptionCost k = p.cost(s.i, Decision::Keep), c = p.cost(s.i, s.o);
        const int64_t dh = static_cast<int64_t>(c.held) - static_cast<int64_t>(k.held);
        const int64_t dw = static_cast<int64_t>(c.work) - static_cast<int64_t>(k.work);
        tree.add(s.i, s.i + 1, dw);
        tree.add(s.i + 1, n, dh);
        total += dh;
        time += c.time_ns - k.time_ns;
        peaks.push_back(now());
    }
    return peaks;
}

}  // namespace

std::string EagerPlanner::name() const { return "eager"; }

PlanResult EagerPlanner::plan(const Problem& p, uint64_t budget) const {
    return plan_all(p, {budget}).front();
}

std::vector<PlanResult> EagerPlanner::plan_all(const Problem& p,
                                               const std::vector<uint64_t>& budgets) const {
    const std::vector<Step> order = greedy_order(p);
    const std::vector<Evaluation> peaks = prefix_peaks(p, order);
    // running minimum: first k with peaks[k] <= B is the first k with runmin[k] <= B.
    std::vector<uint64_t> runmin(peaks.size());
    for (size_t k = 0; k < runmin.size(); ++k)
        runmin[k] = k ? std::min(runmin[k - 1], peaks[k].peak_bytes) : peaks[k].peak_bytes;
    std::vector<PlanResult> out;
    out.reserve(budgets.size());
    for (uint64_t b : budgets) {
        // runmin is non-increasing: binary search for the first entry <= b.
        auto it = std::partition_point(runmin.begin(), runmin.end(),
                                       [&](uint64_t x) { return x > b; });
        size_t steps = it == runmin.end() ? order.size() : static_cast<size_t>(it - runmin.begin());
        std::vector<Decision> d(p.size(), Decision::Keep);
        for (size_t k = 0; k < steps; ++k) d[order[k].i] = order[k].o;
        out.push_back(finish_plan(p, name(), b, std::move(d), runmin.back(), &peaks[steps]));
    }
    return out;
}

uint64_t EagerPlanner::min_peak(const Problem& p) const {
    uint64_t least = UINT64_MAX;
    for (const Evaluation& e : prefix_peaks(p, greedy_order(p))) least = std::min(least, e.peak_bytes);
    return least;
}

}  // namespace ckpt::replay
