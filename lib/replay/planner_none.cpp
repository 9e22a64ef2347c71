// The `none` baseline (SPEC §3.3): keep every activation.
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string NonePlanner::name() const { return "none"; }

PlanResult NonePlanner::plan(const Problem& p, uint64_t budget) const {
    return finish_plan(p, name(), budget, std::vector<Decision>(p.size(), Decision::Keep));
}

}  // namespace ckpt::replay
