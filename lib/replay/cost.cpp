// Cost model shared by every planner: per-segment option costs, the Problem a trace becomes,
// evaluation of a decision vector and a finished plan (see planner.h; the registry of
// planners by name is planner_registry.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include <fmt/format.h>

#include "replay/planner.h"

namespace ckpt::replay {

const char* decision_name(Decision d) {
    switch (d) {
        case Decision::Keep: return "keep";
        case Decision::Recompute: return "recompute";
        case Decision::Snapshot: return "recompute+snapshot";
        case Decision::Selective: return "recompute+selective";
    }
    return "?";
}

std::optional<Decision> decision_from_name(const std::string& s) {
    for (Decision d : kAllDecisions)
        if (s == decision_name(d)) return d;
    return std::nullopt;
}

namespace {
int64_t ms_to_ns(double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); }
// Copy time of `bytes` at `gbps` GB/s (1 GB/s = 1 byte/ns), rounded up.
int64_t copy_ns(uint64_t bytes, double gbps) {
    return static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / gbps));
}

// Runtime cost of decision d on segment s with contract c (see Problem::cost).
OptionCost option_cost(const Segment& s, const Contract& c, Decision d, double copy_gbps) {
    int64_t base = ms_to_ns(s.forward_ms) + ms_to_ns(s.backward_ms);
    OptionCost o;
    if (d == Decision::Keep) {
        o.held = s.saved_bytes;
        o.work = s.saved_bytes + s.transient_bytes;
        o.time_ns = base;
        return o;
    }
    o.held = s.input_bytes;
    o.time_ns = base + ms_to_ns(s.forward_ms);
    if (d == Decision::Recompute) {
        o.work = o.held + s.saved_bytes + s.transient_bytes;
        return o;
    }
    // Preserved at forward, held to backward: whole buffers or hazardous regions + metadata.
    uint64_t preserved = 0, stash = 0;
    for (const auto& r : c.restore) {
        preserved += d == Decision::Snapshot
                         ? r.bytes
                         : r.region_bytes() + kRegionMetaBytes * r.regions.size();
        stash += r.bytes;   // the buffer rebuilt at the read version for the recompute
    }
    for (const auto& w : c.discard) {
        bool restored = false;
        for (const auto& r : c.restore) restored = restored || r.buffer == w.buffer;
        if (!restored) stash += w.bytes;   // scratch copy the recompute writes into
    }
    for (const auto& g : c.rng) preserved += g.state_bytes;
    o.preserved = preserved;
    o.held += preserved;
    o.work = o.held + s.saved_bytes + s.transient_bytes + stash;
    o.time_ns += copy_ns(2 * preserved + stash, copy_gbps);
    return o;
}
}  // namespace

Problem::Problem(const Trace& t)
    : trace(&t), contracts(derive_contracts(t)), fixed_(t.fixed_bytes()), floor_(t.step_bytes),
      costs_(t.segments.size()), safe_(t.segments.size()), flags_(t.segments.size(), 0) {
    for (size_t i = 0; i < costs_.size(); ++i) {
        for (Decision d : kAllDecisions)
            costs_[i][static_cast<size_t>(d)] =
                option_cost(t.segments[i], contracts[i], d, t.copy_gbps);
        const Contract& c = contracts[i];
        flags_[i] = static_cast<uint8_t>((c.stateful() ? kStateful : 0) | (c.replayable ? 0 : kNotReplayable));
        if (!c.replayable) safe_[i] = {Decision::Keep};
        else if (!c.stateful()) safe_[i] = {Decision::Keep, Decision::Recompute};
        else if (c.restore.empty()) safe_[i] = {Decision::Keep, Decision::Snapshot};
        else safe_[i] = {Decision::Keep, Decision::Snapshot, Decision::Selective};
    }
}

uint64_t min_peak_over(const Problem& p, const std::vector<std::vector<Decision>>& options) {
    uint64_t need = 0;
    for (size_t i = p.size(); i-- > 0;) {
        uint64_t best = UINT64_MAX;
        for (Decision d : options.at(i)) {
            OptionCost o = p.cost(i, d);
            best = std::min(best, std::max(o.work, o.held + need));
        }
        need = best;
    }
    return p.peak(need);
}

std::vector<PlanResult> Planner::plan_all(const Problem& p,
                                          const std::vector<uint64_t>& budgets) const {
    std::vector<PlanResult> out;
    out.reserve(budgets.size());
    for (uint64_t b : budgets) out.push_back(plan(p, b));
    return out;
}

Evaluation evaluate(const Problem& p, const std::vector<Decision>& d) {
    if (d.size() != p.size()) throw std::invalid_argument("decision count != segment count");
    Evaluation e;
    uint64_t prefix = 0, peak = 0;
    for (size_t i = 0; i < d.size(); ++i) {
        OptionCost o = p.cost(i, d[i]);
        peak = std::max(peak, prefix + o.work);
        prefix += o.held;
        e.step_time_ns += o.time_ns;
    }
    e.peak_bytes = p.peak(std::max(peak, prefix));
    return e;
}

PlanResult finish_plan(const Problem& p, const std::string& planner, uint64_t budget,
                       std::vector<Decision> d, uint64_t min_peak, const Evaluation* known) {
    PlanResult r;
    r.planner = planner;
    r.budget_bytes = budget;
    Evaluation e;
    if (!d.empty() && (e = known ? *known : evaluate(p, d)).peak_bytes > budget) d.clear();
    if (d.empty()) {
        r.min_peak_bytes = min_peak;
        return r;
    }
    r.peak_bytes = e.peak_bytes;
    r.step_time_ns = e.step_time_ns;
    r.feasible = true;
    size_t unsafe_segments = 0;
    for (size_t i = 0; i < d.size(); ++i)
        if (d[i] != Decision::Keep &&
            ((d[i] == Decision::Recompute && p.stateful(i)) || !p.replayable(i))) {
            r.safe = false;
            if (++unsafe_segments > kMaxUnsafeListed) continue;
            for (const auto& h : p.contracts[i].hazards)
                r.unsafe.push_back(fmt::format("{}: {}", p.trace->segments[i].name, h));
        }
    if (unsafe_segments > kMaxUnsafeListed)
        r.unsafe.push_back(fmt::format("... and {} more unsafe segments",
                                       unsafe_segments - kMaxUnsafeListed));
    r.decisions = std::move(d);
    return r;
}

}  // namespace ckpt::replay
