// The replay-plan job, shared by apps/replay_plan.cpp and the Python package
// (ckptkit.replay.plan): read a trace, plan it for whole-step and activation budgets with one
// planner (every planner too, for a sweep table or plot), simulate the plans on request, and
// render the table, the plan file and the --json summary (formats/plan.md).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "replay/planner.h"
#include "replay/trace.h"

namespace ckpt::replay {

/// What to plan. Budgets in bytes: `budgets` include the fixed memory (params, grads,
/// optimizer state, buffers, memory outside segments); `activation_budgets` are bytes above
/// it (the job adds Trace::fixed_bytes). Both are named by the user: an infeasible one is a
/// failure (PlanJob::failures). `sweep` points may be infeasible (counted in one failure).
struct PlanRequest {
    std::vector<uint64_t> budgets;
    std::vector<uint64_t> activation_budgets;
    std::vector<uint64_t> sweep;
    std::string planner = "joint";   ///< a name from planner_names()
    bool every_planner = false;      ///< also plan with every other planner (sweep table, SVG)
    bool check = false;              ///< run the replay simulator over every feasible plan
    bool progress = false;           ///< a progress line on a terminal (common/progress.h)
};

/// A finished job: the trace, its Problem, per planner the results over the same budgets
/// (curves[0] is the requested planner), what failed, and the CPU time of each phase.
struct PlanJob {
    std::unique_ptr<const Trace> trace;
    std::unique_ptr<const Problem> problem;
    std::string trace_name;     ///< names the trace in messages and in the plan's trace.path
    std::string planner;
    std::vector<std::pair<std::string, std::vector<PlanResult>>> curves;
    size_t named = 0;           ///< results [0, named) were named budgets, the rest sweep points
    uint64_t least = 0;         ///< the planner's smallest reachable peak (bytes)
    uint64_t keep_all = 0;      ///< the peak when every activation is kept (bytes)
    std::vector<std::string> failures;     ///< one line per failed check (exit 1), in order
    std::vector<std::string> check_lines;  ///< the simulator's report lines (--check)
    double ms_load = 0, ms_contracts = 0, ms_plan = 0;   ///< CPU milliseconds per phase

    const std::vector<PlanResult>& results() const { return curves.front().second; }
    /// The plan file (formats/plan.md).
    nlohmann::json plan_json() const;
    /// The --json summary: planner, range, per budget feasibility, peaks and decisions.
    nlohmann::json summary_json() const;
    /// The text report: trace line, feasible range (whole-step and activation budgets),
    /// non-replayable segments, one row per budget, unsafe lines, the sweep table when
    /// several planners ran.
    std::string table() const;
    /// SVG plot of predicted step time against budget, one line per planner.
    std::string svg() const;
};

/// CPU time of this process so far (ms): the clock of PlanJob's phase times.
double cpu_ms();

/// Run the job on the trace held in `text` (either trace kind, see parse_trace); `name` names
/// it. Throws BadInput (unreadable trace, unknown planner, no budget at all).
PlanJob run_plan(std::string_view text, const std::string& name, const PlanRequest& req);

/// As run_plan for the trace file at `path` (read with load_trace).
PlanJob run_plan_file(const std::string& path, const PlanRequest& req);

}  // namespace ckpt::replay
