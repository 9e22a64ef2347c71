// The stateless baseline (SPEC §3.3): the 0-1 knapsack of torch's activation memory budget,
// keep or plain recompute per segment, state ignored. Solved exactly with min_time_plan;
// plans that recompute a stateful segment are reported unsafe (finish_plan).
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string StatelessPlanner::name() const { return "stateless"; }

PlanResult StatelessPlanner::plan(const Problem& p, uint64_t budget) const {
    std::vector<std::vector<Decision>> options(p.size(), {Decision::Keep, Decision::Recompute});
    bool exact = true;
    auto d = min_time_plan(p, budget, options, &exact);
    PlanResult r = finish_plan(p, name(), budget, d ? *d : std::vector<Decision>{});
    r.exact = exact;
    return r;
}

}  // namespace ckpt::replay
