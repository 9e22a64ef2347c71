// Recomputation planning (docs/design.md §5): decisions, the cost model, and the planner interface.
// One strategy per file (planner_*.cpp), chosen by name, as in Checkmate's solver set.
//
// Cost model (formats/plan.md "Cost model"): segments run forward in order and backward in
// reverse. H_i = bytes segment i holds from its forward to its backward; W_i = bytes live
// above H_{<i} while segment i computes (forward, or recompute and backward). Predicted
// peak = fixed + max(H_0+..+H_{n-1}, max_i (H_0+..+H_{i-1} + W_i), S), S = the optimizer
// step's temporaries (Problem::floor). Predicted step time =
// sum of forward + backward times + recompute forward times + copies at device copy bandwidth.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "replay/contract.h"
#include "replay/trace.h"

namespace ckpt::replay {

/// Per-segment decision. Names as in docs/design.md §5.
enum class Decision : uint8_t { Keep, Recompute, Snapshot, Selective };
inline constexpr Decision kAllDecisions[] = {Decision::Keep, Decision::Recompute,
                                             Decision::Snapshot, Decision::Selective};
/// "keep", "recompute", "recompute+snapshot", "recompute+selective".
const char* decision_name(Decision d);
/// Inverse of decision_name; nullopt for an unknown name.
std::optional<Decision> decision_from_name(const std::string& s);

/// Cost of one decision on one segment: held (H_i, bytes), work (W_i, bytes), time (ns).
struct OptionCost {
    uint64_t held = 0;
    uint64_t work = 0;
    int64_t time_ns = 0;
    uint64_t preserved = 0;   ///< bytes of snapshot/selective copies inside `held`
};

/// A trace with its contracts, ready for planning.
struct Problem {
    const Trace* trace = nullptr;
    std::vector<Contract> contracts;

    /// Derives the contracts of `t` (which must outlive the Problem) and the cost of every
    /// decision on every segment (planners ask for them once per budget; later edits of
    /// `contracts` are seen by the simulator, not by cost()).
    explicit Problem(const Trace& t);
    size_t size() const { return contracts.size(); }
    /// Params + grads + optimizer + outside + buffers (bytes), as Trace::fixed_bytes.
    uint64_t fixed() const { return fixed_; }
    /// The optimizer step's temporaries (Trace::step_bytes): no plan peaks below
    /// fixed() + floor(), whatever it recomputes.
    uint64_t floor() const { return floor_; }
    /// Predicted peak (bytes) of a plan whose activations peak at `activation` bytes above
    /// the fixed memory: fixed() + max(activation, floor()).
    uint64_t peak(uint64_t activation) const { return fixed_ + std::max(activation, floor_); }
    /// Runtime cost of decision d on segment i (std::out_of_range for i >= size()). Recompute
    /// on a stateful segment is costed as a plain recompute (what an unsafe plan would do).
    OptionCost cost(size_t i, Decision d) const { return costs_.at(i)[static_cast<size_t>(d)]; }
    /// Decisions that honour segment i's contract: keep and recompute when it is stateless;
    /// keep, recompute+snapshot and (when it has buffers to restore) recompute+selective;
    /// keep only when it is not replayable.
    const std::vector<Decision>& safe_options(size_t i) const { return safe_.at(i); }
    /// safe_options(i) of every segment (index = segment), computed once.
    const std::vector<std::vector<Decision>>& safe_options() const { return safe_; }
    /// contracts[i].stateful() / .replayable, from a compact per-segment array (hot loops).
    bool stateful(size_t i) const { return flags_[i] & kStateful; }
    bool replayable(size_t i) const { return !(flags_[i] & kNotReplayable); }

private:
    uint64_t fixed_ = 0, floor_ = 0;
    std::vector<std::array<OptionCost, 4>> costs_;   ///< [segment][Decision]
    std::vector<std::vector<Decision>> safe_;
    static constexpr uint8_t kStateful = 1, kNotReplayable = 2;
    std::vector<uint8_t> flags_;
};

/// Predicted peak (bytes, fixed memory included) and step time (ns) of a decision vector.
struct Evaluation {
    uint64_t peak_bytes = 0;
    int64_t step_time_ns = 0;
};
/// Evaluate decisions (size must equal p.size(), else std::invalid_argument).
Evaluation evaluate(const Problem& p, const std::vector<Decision>& d);

/// Unsafe segments whose hazards a PlanResult lists one by one (10^6-segment traces would
/// otherwise carry millions of strings per budget).
inline constexpr size_t kMaxUnsafeListed = 100;

/// One planner's answer for one budget.
struct PlanResult {
    std::string planner;
    uint64_t budget_bytes = 0;
    bool feasible = false;
    bool exact = true;                  ///< false only if the DP had to thin a frontier
    uint64_t quantum_bytes = 0;         ///< not exact: the widest need window thinned (bytes);
                                        ///< the plan is then at least as fast as the optimum
                                        ///< for budget - segments * quantum_bytes
    uint64_t peak_bytes = 0;            ///< predicted (0 when infeasible)
    int64_t step_time_ns = 0;           ///< predicted (0 when infeasible)
    std::vector<Decision> decisions;    ///< empty when infeasible
    bool safe = true;                   ///< every decision honours its contract
    std::vector<std::string> unsafe;    ///< "segment: hazard" per broken contract (the first
                                        ///< kMaxUnsafeListed segments, then "... and N more")
    uint64_t min_peak_bytes = 0;        ///< infeasible: the smallest peak this planner can
                                        ///< reach on the trace (Planner::min_peak, bytes)
    bool fallback = false;              ///< joint only: the thinned DP was slower than eager,
                                        ///< eager's plan is returned instead
    /// ops planner only: per segment, the indices (into Segment::ops) of the ops a recomputed
    /// segment saves instead of recomputing (torch's selective checkpointing applies them);
    /// empty, or one list per segment. peak_bytes / step_time_ns include them (op_level_eval).
    std::vector<std::vector<uint32_t>> saved_ops;
};

/// Held bytes and recompute time an op-level plan adds to / removes from decision d on
/// segment i when it saves the ops `saved` (indices into Segment::ops): held and work grow
/// by their bytes (counted on top of the segment's saved and transient bytes: a bound), the
/// step time shrinks by their forward times (never below keep's). planner_ops.cpp.
OptionCost op_level_cost(const Problem& p, size_t i, Decision d, const std::vector<uint32_t>& saved);
/// evaluate() of decisions d with saved ops (saved.size() == d.size(), or empty for none).
Evaluation op_level_eval(const Problem& p, const std::vector<Decision>& d,
                         const std::vector<std::vector<uint32_t>>& saved);

/// Fill peak, time, feasibility and safety for `d` (empty d = infeasible; then
/// min_peak_bytes = min_peak, the planner's smallest reachable peak in bytes). known: the
/// planner's own evaluate(p, d) when it has it (the DP, eager's running sums), else nullptr.
PlanResult finish_plan(const Problem& p, const std::string& planner, uint64_t budget,
                       std::vector<Decision> d, uint64_t min_peak,
                       const Evaluation* known = nullptr);

/// The smallest predicted peak (bytes, fixed included) over every combination of `options`
/// (one list per segment): R_i = min over options of max(W, H + R_{i+1}), exact because the
/// need is monotone in R_{i+1}; O(segments x options).
uint64_t min_peak_over(const Problem& p, const std::vector<std::vector<Decision>>& options);

/// A planning strategy.
class Planner {
public:
    virtual ~Planner() = default;
    virtual std::string name() const = 0;
    /// Plan for `budget` bytes (fixed memory included). Never throws for infeasibility.
    virtual PlanResult plan(const Problem& p, uint64_t budget) const = 0;
    /// plan() for every budget (same results, in order). Planners that share work across the
    /// budgets of a sweep (eager, joint) override it; the tool calls this.
    virtual std::vector<PlanResult> plan_all(const Problem& p,
                                             const std::vector<uint64_t>& budgets) const;
    /// The smallest predicted peak (bytes, fixed included) of any plan this planner can make
    /// on p: a budget is feasible for it exactly when it is at least this (joint, stateless:
    /// the least need over their options; eager: the lowest peak along its greedy sequence;
    /// all / none: their single plan's peak). Computed without planning any budget.
    virtual uint64_t min_peak(const Problem& p) const = 0;
};

/// The planner called `name` (joint, eager, stateless, all, none, brute); throws
/// std::invalid_argument for other names.
std::unique_ptr<Planner> make_planner(const std::string& name);
/// Names accepted by the tool's --planner, in plot order.
std::vector<std::string> planner_names();

/// Exact minimum-time DP shared by the joint and stateless planners: over segments in backward
/// order with a Pareto frontier of (headroom needed above the held prefix, time); states
/// needing more and taking longer are dominated because the need is monotone (dp.cpp). Exact
/// unless a frontier exceeds max_states; then it is thinned: per need window of width
/// q = (need range) / max_states only the fastest state is kept, plus the smallest need
/// (*quantum = the largest q). Kept states are real plans, so the plan stays feasible, and it
/// is no slower than the exact optimum for budget - n*q (each of n thinnings costs < q of
/// need). Returns nullopt when no plan fits.
std::optional<std::vector<Decision>> min_time_plan(
    const Problem& p, uint64_t budget,
    const std::vector<std::vector<Decision>>& options, uint64_t* quantum,
    size_t max_states = 50000);

/// min_time_plan for sweeps (joint and stateless planners): the DP's final frontier does not
/// depend on the budget, so it is solved once at construction and every budget is answered
/// from it (binary search + O(n) backtrack). Exact unless some frontier exceeds
/// min(max_states, max_stored_states / segments) states (the links of every frontier are
/// stored for backtracking); then it is thinned as in min_time_plan, with the same guarantee.
class FrontierSweep {
public:
    FrontierSweep(const Problem& p, const std::vector<std::vector<Decision>>& options,
                  size_t max_stored_states = size_t{1} << 22, size_t max_states = 50000);
    ~FrontierSweep();
    FrontierSweep(const FrontierSweep&) = delete;
    FrontierSweep& operator=(const FrontierSweep&) = delete;
    /// The fastest plan with predicted peak <= budget (bytes), nullopt when none fits; *e (when
    /// given) = its peak (fixed + the DP's need) and time, equal to evaluate() of the plan.
    std::optional<std::vector<Decision>> plan(uint64_t budget, Evaluation* e = nullptr) const;
    /// 0 when exact, else the widest need window thinned (bytes).
    uint64_t quantum() const;

    /// Every budget's PlanResult from this sweep, as `planner` (least = its min_peak).
    std::vector<PlanResult> plan_all(const Problem& p, const std::string& planner,
                                     const std::vector<uint64_t>& budgets, uint64_t least) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::replay
