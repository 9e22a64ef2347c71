// The `all` baseline (SPEC §3.3): recompute every segment, plain when stateless, whole
// snapshot when stateful.
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string AllPlanner::name() const { return "all"; }

PlanResult AllPlanner::plan(const Problem& p, uint64_t budget) const {
    std::vector<Decision> d(p.size());
    for (size_t i = 0; i < p.size(); ++i)
        d[i] = p.contracts[i].stateful() ? Decision::Snapshot : Decision::Recompute;
    return finish_plan(p, name(), budget, d);
}

}  // namespace ckpt::replay
