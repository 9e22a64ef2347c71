// The planner strategies (one per planner_*.cpp file), registered in planner_registry.cpp.
#pragma once
#include "replay/planner.h"

namespace ckpt::replay {

#define CKPT_REPLAY_PLANNER(Class)                                              \
    class Class : public Planner {                                              \
    public:                                                                     \
        std::string name() const override;                                      \
        PlanResult plan(const Problem& p, uint64_t budget) const override;      \
    };
CKPT_REPLAY_PLANNER(JointPlanner)      ///< exact optimum over all four decisions
CKPT_REPLAY_PLANNER(EagerPlanner)      ///< greedy, whole snapshots (seed baseline)
CKPT_REPLAY_PLANNER(StatelessPlanner)  ///< knapsack ignoring state (unsafe plans flagged)
CKPT_REPLAY_PLANNER(AllPlanner)        ///< recompute everything
CKPT_REPLAY_PLANNER(NonePlanner)       ///< keep everything
CKPT_REPLAY_PLANNER(BrutePlanner)      ///< enumeration, for tests
#undef CKPT_REPLAY_PLANNER

}  // namespace ckpt::replay
