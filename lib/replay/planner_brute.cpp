// Brute force over every combination of safe options (reference for the joint planner's
// optimality proof; refuses more than 2^24 combinations).
#include <stdexcept>

#include "replay/planner.h"
#include "replay/planner_impl.h"

namespace ckpt::replay {

std::string BrutePlanner::name() const { return "brute"; }

PlanResult BrutePlanner::plan(const Problem& p, uint64_t budget) const {
    std::vector<std::vector<Decision>> options;
    double combos = 1;
    for (size_t i = 0; i < p.size(); ++i) {
        options.push_back(p.safe_options(i));
        combos *= static_cast<double>(options.back().size());
    }
    if (combos > double(1 << 24)) throw std::invalid_argument("brute: too many combinations");
    std::vector<size_t> idx(p.size(), 0);
    std::vector<Decision> d(p.size()), best;
    Evaluation be;
    while (true) {
        for (size_t i = 0; i < p.size(); ++i) d[i] = options[i][idx[i]];
        Evaluation e = evaluate(p, d);
        if (e.peak_bytes <= budget &&
            (best.empty() || e.step_time_ns < be.step_time_ns ||
             (e.step_time_ns == be.step_time_ns && e.peak_bytes < be.peak_bytes))) {
            best = d;
            be = e;
        }
        size_t k = 0;
        while (k < p.size() && ++idx[k] == options[k].size()) idx[k++] = 0;
        if (k == p.size()) break;
    }
    return finish_plan(p, name(), budget, best, min_peak(p));
}

uint64_t BrutePlanner::min_peak(const Problem& p) const { return min_peak_over(p, p.safe_options()); }

}  // namespace ckpt::replay
