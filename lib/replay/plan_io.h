// Plan output (formats/plan.md): the plan JSON, the --json summary, the sweep SVG, and
// budget parsing for the command line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "replay/planner.h"

namespace ckpt::replay {

/// Plan format version written (formats/plan.md). 2: the trace hash is XXH3-64 of the trace
/// file's bytes (trace.hash_algorithm "xxh3-64"); 1 carried FNV-1a of a canonical re-dump.
inline constexpr int kPlanFormatVersion = 2;

/// The budgets a planner can meet on a trace: its smallest reachable peak and the peak that
/// keeps every activation (bytes, fixed memory included).
struct FeasibleRange {
    uint64_t least = 0;
    uint64_t keep_all = 0;
};

/// The plan file: trace identity (path, hash, hash_algorithm, model, segments, fixed bytes),
/// the model fingerprint, fixed_bytes, the feasible range (whole-step and activation bytes),
/// planner, and per budget the decisions with contracts, each segment's ops_hash and, per
/// restored state, its kind and argument index (so a runtime needs the plan only).
nlohmann::json plan_to_json(const Problem& p, const std::string& trace_path,
                            const std::string& planner, const std::vector<PlanResult>& results,
                            const FeasibleRange& range);

/// The --json summary object: planner, fixed_bytes, range, per budget budget_bytes,
/// activation_budget_bytes, feasible, peak_bytes, activation_peak_bytes, step_time_ms, safe,
/// decisions (count per kind).
nlohmann::json summary_json(const Problem& p, const std::string& planner,
                            const std::vector<PlanResult>& results, const FeasibleRange& range);

/// SVG line plot of predicted step time (ms) against budget (axis in B/KiB/MiB/GiB/TiB, the
/// largest unit under the largest budget), one polyline per planner, widest first with its
/// own dash pattern (coinciding planners stay visible); unsafe plans are open circles
/// (class "unsafe"), infeasible budgets gaps with an "x" per planner above the axis (class
/// "oom"). `curves` = (planner, results over the same budgets); `title` is plain text (XML-escaped
/// here).
std::string sweep_svg(const std::vector<std::pair<std::string, std::vector<PlanResult>>>& curves,
                      const std::string& title);

/// Parse "44GiB", "32GB", "512MiB", "1.5TiB", "123" (bytes). Binary (Ki/Mi/Gi/Ti) and decimal
/// (K/M/G/T, optional B) units, in any case, spaces allowed before and after them ("8 MiB",
/// "1.5mib"). Throws std::invalid_argument on anything else or overflow. The Python package
/// parses sizes with this function (_ckptkit.parse_bytes).
uint64_t parse_bytes(const std::string& s);

/// Parse "MIN:MAX:STEP" (each as parse_bytes) into the budgets MIN, MIN+STEP, ... <= MAX.
/// Throws std::invalid_argument (bad syntax, STEP 0, MIN > MAX, more than 10000 points).
std::vector<uint64_t> parse_sweep(const std::string& s);

/// `text` with &, <, >, " and ' replaced by XML entities (for SVG text and attributes).
std::string xml_escape(const std::string& text);

/// "43.50 GiB" style rendering (binary units, 2 decimals; bytes below 1 KiB).
std::string human_bytes(uint64_t b);

}  // namespace ckpt::replay
