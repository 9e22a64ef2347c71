// The eager baseline (the seed's planner, SPEC §3.3): start from keep-all, then greedily turn
// segments into recomputes (whole snapshots for stateful ones) in decreasing order of bytes
// freed per ns of added time, until the predicted peak fits the budget.
#include <algorithm>

#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string EagerPlanner::name() const { return "eager"; }

PlanResult EagerPlanner::plan(const Problem& p, uint64_t budget) const {
    std::vector<Decision> d(p.size(), Decision::Keep);
    struct Cand {
        size_t i;
        Decision o;
        double ratio;
    };
    std::vector<Cand> cands;
    for (size_t i = 0; i < p.size(); ++i) {
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
    return finish_plan(p, name(), budget, d);
}

}  // namespace ckpt::replay
