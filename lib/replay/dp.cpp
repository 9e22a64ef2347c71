// Exact Pareto-frontier DP over segments (see min_time_plan in planner.h).
#include <algorithm>
#include <iterator>

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
// Input sorted by (held, time).
void prune(std::vector<State>& v) {
    size_t w = 0;
    for (size_t r = 0; r < v.size(); ++r)
        if (w == 0 || v[r].time < v[w - 1].time) v[w++] = v[r];
    v.resize(w);
}
}  // namespace

std::optional<std::vector<Decision>> min_time_plan(
    const Problem& p, uint64_t budget, const std::vector<std::vector<Decision>>& options,
    uint64_t* quantum, size_t max_states) {
    if (quantum) *quantum = 0;
    if (p.fixed() > budget) return std::nullopt;
    const uint64_t room = budget - p.fixed();
    std::vector<std::vector<State>> layers(1, {State{0, 0, -1, Decision::Keep}});
    for (size_t i = 0; i < p.size(); ++i) {
        std::vector<OptionCost> costs;
        for (Decision d : options[i]) costs.push_back(p.cost(i, d));
        // The frontier is sorted by held, so each option's successors are sorted too: merge
        // them pairwise (linear) instead of sorting, then drop dominated states.
        std::vector<State> next;
        const auto& cur = layers.back();
        for (size_t o = 0; o < costs.size(); ++o) {
            std::vector<State> part;
            part.reserve(cur.size());
            for (size_t k = 0; k < cur.size(); ++k) {
                if (costs[o].work > room || cur[k].held > room - costs[o].work) break;
                part.push_back({cur[k].held + costs[o].held, cur[k].time + costs[o].time_ns,
                                static_cast<int32_t>(k), options[i][o]});
            }
            std::vector<State> merged;
            merged.reserve(next.size() + part.size());
            std::merge(next.begin(), next.end(), part.begin(), part.end(),
                       std::back_inserter(merged), [](const State& a, const State& b) {
                           return a.held != b.held ? a.held < b.held : a.time < b.time;
                       });
            next.swap(merged);
        }
        prune(next);
        if (next.size() > max_states) {
            // Quantise held bytes upward: constraints stay conservative (plans stay feasible).
            uint64_t q = std::max<uint64_t>(1, room / max_states);
            for (auto& s : next) s.held = (s.held + q - 1) / q * q;   // order is kept
            std::stable_sort(next.begin(), next.end(), [](const State& a, const State& b) {
                return a.held != b.held ? a.held < b.held : a.time < b.time;
            });
            prune(next);
            if (quantum) *quantum = q;
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
