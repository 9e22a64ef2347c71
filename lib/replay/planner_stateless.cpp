// The stateless baseline (SPEC §3.3): the 0-1 knapsack of torch's activation memory budget,
// keep or plain recompute per segment, state ignored. Solved exactly with min_time_plan;
// plans that recompute a stateful segment are reported unsafe (finish_plan).
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string StatelessPlanner::name() const { return "stateless"; }

PlanResult StatelessPlanner::plan(const Problem& p, uint64_t budget) const {
    std::vector<std::vector<Decision>> options(p.size(), {Decision::Keep, Decision::Recompute});
    uint64_t quantum = 0;
    auto d = min_time_plan(p, budget, options, &quantum);
    PlanResult r = finish_plan(p, name(), budget, d ? *d : std::vector<Decision>{});
    r.exact = quantum == 0;
    r.quantum_bytes = quantum;
    return r;
}

}  // namespace ckpt::replay
