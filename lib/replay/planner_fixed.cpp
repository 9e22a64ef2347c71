// The two fixed baselines (SPEC §3.3): `none` keeps every activation; `all` recomputes every
// segment (plain recompute when stateless, whole snapshot when stateful).
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string NonePlanner::name() const { return "none"; }

PlanResult NonePlanner::plan(const Problem& p, uint64_t budget) const {
    return finish_plan(p, name(), budget, std::vector<Decision>(p.size(), Decision::Keep));
}

std::string AllPlanner::name() const { return "all"; }

PlanResult AllPlanner::plan(const Problem& p, uint64_t budget) const {
    std::vector<Decision> d(p.size());
    for (size_t i = 0; i < p.size(); ++i)
        d[i] = p.contracts[i].stateful() ? Decision::Snapshot : Decision::Recompute;
    return finish_plan(p, name(), budget, d);
}

}  // namespace ckpt::replay
