// Planner lookup by name.
#include <stdexcept>

#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::vector<std::string> planner_names() { return {"joint", "eager", "stateless", "all", "none", "ops"}; }

std::unique_ptr<Planner> make_planner(const std::string& name) {
    if (name == "joint") return std::make_unique<JointPlanner>();
    if (name == "eager") return std::make_unique<EagerPlanner>();
    if (name == "stateless") return std::make_unique<StatelessPlanner>();
    if (name == "all") return std::make_unique<AllPlanner>();
    if (name == "none") return std::make_unique<NonePlanner>();
    if (name == "ops") return std::make_unique<OpsPlanner>();
    if (name == "brute") return std::make_unique<BrutePlanner>();
    throw std::invalid_argument("unknown planner '" + name + "' (joint, eager, stateless, all, none, ops)");
}

}  // namespace ckpt::replay
