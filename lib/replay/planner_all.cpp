// The `all` baseline (docs/design.md §5): recompute every segment, plain when stateless, whole
// snapshot when stateful; a non-replayable segment is kept.
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {
namespace {
std::vector<Decision> all_recomputed(const Problem& p) {
    std::vector<Decision> d(p.size());
    for (size_t i = 0; i < p.size(); ++i)
        d[i] = !p.contracts[i].replayable ? Decision::Keep
               : p.contracts[i].stateful() ? Decision::Snapshot
                                           : Decision::Recompute;
    return d;
}
}  // namespace

std::string AllPlanner::name() const { return "all"; }

PlanResult AllPlanner::plan(const Problem& p, uint64_t budget) const {
    return finish_plan(p, name(), budget, all_recomputed(p), min_peak(p));
}

uint64_t AllPlanner::min_peak(const Problem& p) const {
    return evaluate(p, all_recomputed(p)).peak_bytes;
}

}  // namespace ckpt::replay
