// Exact Pareto-frontier DP over segments (see min_time_plan in planner.h).
#include <algorithm>

#include "replay/planner.h"

namespace ckpt::replay {
namespace {
struct State {
    uint64_t held;
    int64_t time;
    int32_t parent;
    Decision d;
};

// Keep the states not dominated in (held, time); sorted by held ascending.
void prune(std::vector<State>& v) {
    std::sort(v.begin(), v.end(), [](const State& a, const State& b) {
        return a.held != b.held ? a.held < b.held : a.time < b.time;
    });
    std::vector<State> out;
    for (const auto& s : v)
        if (out.empty() || s.time < out.back().time) out.push_back(s);
    v.swap(out);
}
}  // namespace

std::optional<std::vector<Decision>> min_time_plan(
    const Problem& p, uint64_t budget, const std::vector<std::vector<Decision>>& options,
    bool* exact, size_t max_states) {
    if (exact) *exact = true;
    if (p.fixed() > budget) return std::nullopt;
    const uint64_t room = budget - p.fixed();
    std::vector<std::vector<State>> layers(1, {State{0, 0, -1, Decision::Keep}});
    for (size_t i = 0; i < p.size(); ++i) {
        std::vector<OptionCost> costs;
        for (Decision d : options[i]) costs.push_back(p.cost(i, d));
        std::vector<State> next;
        const auto& cur = layers.back();
        for (size_t k = 0; k < cur.size(); ++k)
            for (size_t o = 0; o < costs.size(); ++o) {
                if (costs[o].work > room || cur[k].held > room - costs[o].work) continue;
                next.push_back({cur[k].held + costs[o].held, cur[k].time + costs[o].time_ns,
                                static_cast<int32_t>(k), options[i][o]});
            }
        prune(next);
        if (next.size() > max_states) {
            // Quantise held bytes upward: constraints stay conservative (plans stay feasible).
            uint64_t q = std::max<uint64_t>(1, room / max_states);
            for (auto& s : next) s.held = (s.held + q - 1) / q * q;
            prune(next);
            if (exact) *exact = false;
        }
        if (next.empty()) return std::nullopt;
        layers.push_back(std::move(next));
    }
    const auto& last = layers.back();
    int32_t best = -1;
    for (size_t k = 0; k < last.size(); ++k)
        if (last[k].held <= room && (best < 0 || last[k].time < last[best].time))
            best = static_cast<int32_t>(k);
    if (best < 0) return std::nullopt;
    std::vector<Decision> d(p.size());
    for (size_t i = p.size(); i-- > 0;) {
        const State& s = layers[i + 1][best];
        d[i] = s.d;
        best = s.parent;
    }
    return d;
}

}  // namespace ckpt::replay
