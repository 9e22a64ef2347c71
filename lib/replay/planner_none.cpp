// The `none` baseline (docs/design.md §5): keep every activation.
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string NonePlanner::name() const { return "none"; }

PlanResult NonePlanner::plan(const Problem& p, uint64_t budget) const {
    return finish_plan(p, name(), budget, std::vector<Decision>(p.size(), Decision::Keep),
                       min_peak(p));
}

uint64_t NonePlanner::min_peak(const Problem& p) const {
    return evaluate(p, std::vector<Decision>(p.size(), Decision::Keep)).peak_bytes;
}

}  // namespace ckpt::replay
