// The joint planner (SPEC §3.3): minimum predicted step time subject to predicted peak <=
// budget over keep / recompute / recompute+snapshot / recompute+selective, honouring every
// contract. Exact (Pareto DP, min_time_plan_sweep: one budget-independent DP per problem,
// every budget of a sweep answered from it); proven against brute force in
// test/replay/test_planners.cpp.
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string JointPlanner::name() const { return "joint"; }

PlanResult JointPlanner::plan(const Problem& p, uint64_t budget) const {
    uint64_t quantum = 0;
    auto d = min_time_plan_sweep(p, budget, p.safe_options(), &quantum);
    PlanResult r = finish_plan(p, name(), budget, d ? *d : std::vector<Decision>{});
    r.exact = quantum == 0;
    r.quantum_bytes = quantum;
    return r;
}

}  // namespace ckpt::replay
