// The joint planner (docs/design.md §5): minimum predicted step time subject to predicted peak <=
// budget over keep / recompute / recompute+snapshot / recompute+selective, honouring every
// contract. Exact (Pareto DP, FrontierSweep: one budget-independent DP per plan_all call,
// every budget of a sweep answered from it); proven against brute force in
// test/replay/test_planners.cpp.
//
// Never slower than eager: eager's plans use only keep, recompute (stateless segments) and
// recompute+snapshot (stateful ones), all safe options, so they lie in the DP's search space
// and the exact DP is never slower. A thinned DP (more than max_stored / segments frontier
// states) has no such guarantee (only "no slower than the exact optimum at budget - n*q"),
// so when any answer is not exact the eager plans of the same budgets are computed and the
// faster one is returned (fallback = true when eager's was).
#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string JointPlanner::name() const { return "joint"; }

PlanResult JointPlanner::plan(const Problem& p, uint64_t budget) const {
    return plan_all(p, {budget}).front();
}

std::vector<PlanResult> JointPlanner::plan_all(const Problem& p,
                                               const std::vector<uint64_t>& budgets) const {
    const uint64_t least = min_peak(p);
    const FrontierSweep sweep(p, p.safe_options(), max_stored_);
    std::vector<PlanResult> out = sweep.plan_all(p, name(), budgets, least);
    if (sweep.quantum() == 0) return out;
    std::vector<PlanResult> eager = EagerPlanner().plan_all(p, budgets);
    for (size_t k = 0; k < out.size(); ++k) {
        PlanResult& e = eager[k];
        if (!e.feasible || (out[k].feasible && out[k].step_time_ns <= e.step_time_ns)) continue;
        e.planner = name();   // eager's plan is safe and costed by the same finish_plan
        e.exact = false;
        e.quantum_bytes = sweep.quantum();
        e.fallback = true;
        out[k] = std::move(e);
    }
    return out;
}

uint64_t JointPlanner::min_peak(const Problem& p) const { return min_peak_over(p, p.safe_options()); }

}  // namespace ckpt::replay
