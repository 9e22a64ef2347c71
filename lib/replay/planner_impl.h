// The planner strategies (one per planner_*.cpp file), registered in planner_registry.cpp.
#pragma once
#include <cstddef>

#include "replay/planner.h"

namespace ckpt::replay {

#define CKPT_REPLAY_PLANNER(Class)                                              \
    class Class : public Planner {                                              \
    public:                                                                     \
        std::string name() const override;                                      \
        PlanResult plan(const Problem& p, uint64_t budget) const override;      \
        uint64_t min_peak(const Problem& p) const override;                     \
    };
CKPT_REPLAY_PLANNER(AllPlanner)        ///< recompute everything
CKPT_REPLAY_PLANNER(NonePlanner)       ///< keep everything
CKPT_REPLAY_PLANNER(BrutePlanner)      ///< enumeration, for tests
#undef CKPT_REPLAY_PLANNER

/// A planner with its own plan_all (work shared by every budget of a sweep).
#define CKPT_REPLAY_SWEEP_PLANNER(Class)                                                     \
    class Class : public Planner {                                                           \
    public:                                                                                  \
        std::string name() const override;                                                   \
        PlanResult plan(const Problem& p, uint64_t budget) const override;                   \
        std::vector<PlanResult> plan_all(const Problem& p,                                   \
                                         const std::vector<uint64_t>& budgets) const override; \
        uint64_t min_peak(const Problem& p) const override;                                  \
    };
/// Knapsack ignoring state (unsafe plans flagged); plan_all builds the keep/recompute option
/// lists once for every budget.
CKPT_REPLAY_SWEEP_PLANNER(StatelessPlanner)
/// Greedy, whole snapshots (seed baseline). The greedy sequence does not depend on the
/// budget, so plan_all computes the peak after each greedy step once (a lazy segment tree
/// over the prefix + work terms, O(n log n)) and answers every budget by binary search.
CKPT_REPLAY_SWEEP_PLANNER(EagerPlanner)

/// Op-level plans (planner_ops.cpp): the joint planner's segment plans, then, inside the
/// recomputed segments, the recorded ops (Segment::ops) an op plan may save, greedily by
/// recompute time saved per byte held while the predicted peak stays within the budget; the
/// fastest result over joint's plans at budgets from its least to the budget. Same contracts
/// (ops on RNG, state, in-place writes and views are never saved), same min_peak as joint.
CKPT_REPLAY_SWEEP_PLANNER(OpsPlanner)
#undef CKPT_REPLAY_SWEEP_PLANNER

/// Exact optimum over all four decisions. When a frontier had to be thinned (more than
/// max_stored_states / segments states) the plan is compared with eager's at the same
/// budget and eager's is returned if faster (PlanResult::fallback), so joint is never
/// slower than eager.
class JointPlanner : public Planner {
public:
    /// max_stored_states: links kept for backtracking, all segments together (tests lower it
    /// to force thinning).
    explicit JointPlanner(size_t max_stored_states = size_t{1} << 22)
        : max_stored_(max_stored_states) {}
    std::string name() const override;
    PlanResult plan(const Problem& p, uint64_t budget) const override;
    std::vector<PlanResult> plan_all(const Problem& p,
                                     const std::vector<uint64_t>& budgets) const override;
    uint64_t min_peak(const Problem& p) const override;

private:
    size_t max_stored_;
};

}  // namespace ckpt::replay
