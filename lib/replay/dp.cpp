// Exact Pareto-frontier DP over segments (see min_time_plan in planner.h).
//
// The DP runs backward (last segment first) over R_i, the headroom above the held prefix
// that segments i..n-1 need: R_n = 0, R_i = max(W_i, H_i + R_{i+1}), and the predicted peak
// of a plan is fixed + R_0 (the same max over prefix + W_i and the total held as evaluate()).
// R_i is monotone in R_{i+1}, so (R, time) states with more R and more time are dominated,
// and the frontier at segment 0 does not depend on the budget: one DP answers every budget of
// a sweep (min time among states with R_0 <= budget - fixed). States with R beyond the room of
// interest are dropped (R only grows going backward).
#include <algorithm>
#include <memory>

#include "replay/planner.h"

namespace ckpt::replay {
namespace {
struct State {
    uint64_t need;   // R: headroom needed above the held prefix
    int64_t time;
    int32_t parent;  // index in the previous (later-segment) frontier
    Decision d;
};
struct Link {
    int32_t parent;
    Decision d;
};
struct Opt {
    uint64_t held, work;
    int64_t time;
    Decision d;
};

// A solved frontier: per segment the links of its frontier states, and the final frontier
// (segment 0) sorted by need ascending, time strictly descending.
struct Frontier {
    std::vector<Link> links;                // state k of segment i: links[start[i] + k]
    std::vector<size_t> start;              // (flat: one allocation, sequential backtrack)
    std::vector<uint64_t> need;             // final frontier
    std::vector<int64_t> time;
    uint64_t quantum = 0;
    bool empty() const { return need.empty(); }
};

// The option costs of every segment, flat: segment i's options are opt[start[i], start[i+1]).
struct Costs {
    std::vector<Opt> opt;
    std::vector<size_t> start;
    size_t size() const { return start.size() - 1; }
    const Opt* begin(size_t i) const { return opt.data() + start[i]; }
    const Opt* end(size_t i) const { return opt.data() + start[i + 1]; }
};

Costs option_costs(const Problem& p, const std::vector<std::vector<Decision>>& options) {
    Costs c;
    c.start.reserve(p.size() + 1);
    c.opt.reserve(std::size(kAllDecisions) * p.size());
    c.start.push_back(0);
    for (size_t i = 0; i < p.size(); ++i) {
        for (Decision d : options[i]) {
            OptionCost o = p.cost(i, d);
            c.opt.push_back({o.held, o.work, o.time_ns, d});
        }
        c.start.push_back(c.opt.size());
    }
    return c;
}

// Drop dominated states of v (sorted by (need, time), ties in option order): keep a state only
// if it is strictly faster than every state needing no more.
void prune(std::vector<State>& v) {
    size_t w = 0;
    for (size_t r = 0; r < v.size(); ++r)
        if (w == 0 || v[r].time < v[w - 1].time) {
            if (w > 0 && v[w - 1].need == v[r].need) --w;   // same need, faster: replace
            v[w++] = v[r];
        }
    v.resize(w);
}

Frontier solve(const Costs& costs, uint64_t room, size_t max_states) {
    Frontier f;
    const size_t n = costs.size();
    f.start.assign(n, 0);
    std::vector<State> cur(1, State{0, 0, -1, Decision::Keep}), next, part, merged;
    const auto less = [](const State& a, const State& b) {
        return a.need != b.need ? a.need < b.need : a.time < b.time;
    };
    for (size_t i = n; i-- > 0;) {
        next.clear();
        for (const Opt* op = costs.begin(i); op != costs.end(i); ++op) {
            const Opt& o = *op;
            // need' = max(work, held + need): sorted in need, so successors stay sorted.
            part.clear();
            if (o.work > room || o.held > room) continue;   // never fits
            part.reserve(cur.size());
            for (size_t k = 0; k < cur.size(); ++k) {
                if (cur[k].need > room - o.held) break;
                part.push_back({std::max(o.work, o.held + cur[k].need), cur[k].time + o.time,
                                static_cast<int32_t>(k), o.d});
            }
            merged.clear();
            merged.reserve(next.size() + part.size());
            std::merge(next.begin(), next.end(), part.begin(), part.end(),
                       std::back_inserter(merged), less);
            next.swap(merged);
        }
        prune(next);
        if (next.size() > max_states) {
            // Thin the frontier (no rounding: every kept state is a real plan with its true
            // need, so plans stay feasible and the smallest need is kept exactly): in each
            // window [a, a + q) of need keep only the fastest state (the last); the first state
            // is always kept. A dropped state has a kept one at most q more need and no more
            // time; need' = max(W, H + need) is 1-Lipschitz, so over n segments the answer is
            // no slower than the exact optimum for budget - n*q.
            uint64_t q = std::max<uint64_t>(1, (next.back().need - next.front().need) / max_states);
            size_t w = 1;
            for (size_t r = 1; r < next.size();) {
                const uint64_t end = next[r].need + q;   // window [need_r, need_r + q)
                size_t last = r;
                while (last + 1 < next.size() && next[last + 1].need < end) ++last;
                next[w++] = next[last];
                r = last + 1;
            }
            next.resize(w);
            f.quantum = std::max(f.quantum, q);
        }
        if (next.empty()) {
            f.need.clear();
            return f;
        }
        f.start[i] = f.links.size();
        for (size_t k = 0; k < next.size(); ++k) f.links.push_back({next[k].parent, next[k].d});
        cur.swap(next);
    }
    f.need.resize(cur.size());
    f.time.resize(cur.size());
    for (size_t k = 0; k < cur.size(); ++k) {
        f.need[k] = cur[k].need;
        f.time[k] = cur[k].time;
    }
    return f;
}

// The fastest plan of f with need <= room; *need_time = its (need, time) when given.
std::optional<std::vector<Decision>> pick(const Frontier& f, uint64_t room,
                                          std::pair<uint64_t, int64_t>* need_time = nullptr) {
    if (f.empty()) return std::nullopt;
    // need ascending, time strictly descending: the last state with need <= room is fastest.
    auto it = std::upper_bound(f.need.begin(), f.need.end(), room);
    if (it == f.need.begin()) return std::nullopt;
    int32_t k = static_cast<int32_t>(it - f.need.begin()) - 1;
    if (need_time) *need_time = {f.need[static_cast<size_t>(k)], f.time[static_cast<size_t>(k)]};
    std::vector<Decision> d(f.start.size());
    for (size_t i = 0; i < d.size(); ++i) {
        const Link& l = f.links[f.start[i] + static_cast<size_t>(k)];
        d[i] = l.d;
        k = l.parent;
    }
    return d;
}
}  // namespace

std::optional<std::vector<Decision>> min_time_plan(
    const Problem& p, uint64_t budget, const std::vector<std::vector<Decision>>& options,
    uint64_t* quantum, size_t max_states) {
    if (quantum) *quantum = 0;
    if (p.peak(0) > budget) return std::nullopt;
    const uint64_t room = budget - p.fixed();
    Frontier f = solve(option_costs(p, options), room, std::max<size_t>(1, max_states));
    if (quantum) *quantum = f.quantum;
    return pick(f, room);
}

struct FrontierSweep::Impl {
    Frontier f;
    uint64_t fixed = 0, floor = 0;
};

FrontierSweep::FrontierSweep(const Problem& p, const std::vector<std::vector<Decision>>& options,
                             size_t max_stored_states, size_t max_states)
    : impl_(std::make_unique<Impl>()) {
    const size_t n = std::max<size_t>(1, p.size());
    const size_t cap = std::clamp<size_t>(max_stored_states / n, 1, std::max<size_t>(1, max_states));
    const Costs costs = option_costs(p, options);
    // Room of interest: the largest need any plan can have (no state is dropped).
    uint64_t room = 0;
    for (size_t i = costs.size(); i-- > 0;) {
        uint64_t r = 0;
        for (const Opt* o = costs.begin(i); o != costs.end(i); ++o)
            r = std::max(r, std::max(o->work, o->held + room));
        room = r;
    }
    impl_->f = solve(costs, room, cap);
    impl_->fixed = p.fixed();
    impl_->floor = p.floor();
}

FrontierSweep::~FrontierSweep() = default;

std::optional<std::vector<Decision>> FrontierSweep::plan(uint64_t budget, Evaluation* e) const {
    if (impl_->fixed + impl_->floor > budget) return std::nullopt;
    std::pair<uint64_t, int64_t> nt;
    auto d = pick(impl_->f, budget - impl_->fixed, &nt);
    if (d && e) *e = {impl_->fixed + std::max(nt.first, impl_->floor), nt.second};
    return d;
}

uint64_t FrontierSweep::quantum() const { return impl_->f.quantum; }

std::vector<PlanResult> FrontierSweep::plan_all(const Problem& p, const std::string& planner,
                                                const std::vector<uint64_t>& budgets, uint64_t least) const {
    std::vector<PlanResult> out;
    out.reserve(budgets.size());
    for (uint64_t b : budgets) {
        Evaluation e;
        auto d = plan(b, &e);
        PlanResult r = finish_plan(p, planner, b, d ? std::move(*d) : std::vector<Decision>{}, least,
                                   d ? &e : nullptr);
        r.exact = quantum() == 0;
        r.quantum_bytes = quantum();
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace ckpt::replay
