// The stateless baseline (docs/design.md §5): the 0-1 knapsack of torch's activation memory budget,
// keep or plain recompute per segment, state ignored. Solved exactly (thinned beyond the link
// cap, as the joint planner) with FrontierSweep, one DP for every budget of a plan_all call;
// plans that recompute a stateful segment are reported unsafe (finish_plan).
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {
namespace {
std::vector<std::vector<Decision>> keep_or_recompute(const Problem& p) {
    return std::vector<std::vector<Decision>>(p.size(), {Decision::Keep, Decision::Recompute});
}
}  // namespace

std::string StatelessPlanner::name() const { return "stateless"; }

PlanResult StatelessPlanner::plan(const Problem& p, uint64_t budget) const {
    return plan_all(p, {budget}).front();
}

std::vector<PlanResult> StatelessPlanner::plan_all(const Problem& p,
                                                   const std::vector<uint64_t>& budgets) const {
    const auto options = keep_or_recompute(p);
    const uint64_t least = min_peak_over(p, options);
    return FrontierSweep(p, options).plan_all(p, name(), budgets, least);
}

uint64_t StatelessPlanner::min_peak(const Problem& p) const {
    return min_peak_over(p, keep_or_recompute(p));
}

}  // namespace ckpt::replay
