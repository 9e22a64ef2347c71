// The replay-plan job (see job.h): planning, checks and the rendering of its outputs.
#include "replay/job.h"

#include <ctime>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/progress.h"
#include "replay/plan_io.h"
#include "replay/simulate.h"

namespace ckpt::replay {

double cpu_ms() { return 1e3 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

namespace {

// What a planner's smallest plan is, for messages ("... needs X").
std::string least_text(const std::string& planner) {
    if (planner == "none") return "keeping every activation";
    if (planner == "all") return "recomputing every segment";
    if (planner == "eager") return "eager's smallest plan";
    return "its smallest plan";
}

// The names of the segments d recomputes, comma separated (the first 12, then a count).
std::string recomputed_names(const Trace& t, const std::vector<Decision>& d) {
    std::string s;
    size_t n = 0;
    for (size_t i = 0; i < d.size(); ++i)
        if (d[i] != Decision::Keep && ++n <= 12) s += (n > 1 ? ", " : "") + t.segments[i].name;
    if (n > 12) s += fmt::format(" and {} more", n - 12);
    return n ? s : "none";
}

PlanJob plan(std::unique_ptr<const Trace> trace, const std::string& name, const PlanRequest& req,
             double t0) {
    PlanJob job;
    job.trace = std::move(trace);
    job.trace_name = name;
    job.planner = req.planner;
    const double t_load = cpu_ms();
    std::unique_ptr<Planner> chosen;
    try {
        chosen = make_planner(req.planner);
    } catch (const std::invalid_argument& e) {
        throw BadInput("", e.what());
    }
    if (req.planner == "ops" && !job.trace->op_tables)
        throw BadInput("", "planner 'ops' needs each segment's op table: record the trace with ops=True "
                           "(replay.record(..., ops=True))");
    job.problem = std::make_unique<const Problem>(*job.trace);
    const Problem& problem = *job.problem;
    const double t_problem = cpu_ms();

    const uint64_t fixed = problem.fixed();
    std::vector<uint64_t> budgets = req.budgets;
    for (uint64_t a : req.activation_budgets) {
        if (a > UINT64_MAX - fixed) throw BadInput("", fmt::format("activation budget {} B is too large", a));
        budgets.push_back(fixed + a);
    }
    job.named = budgets.size();
    budgets.insert(budgets.end(), req.sweep.begin(), req.sweep.end());
    if (budgets.empty()) throw BadInput("", "no budget to plan");

    std::vector<std::string> names = {req.planner};
    if (req.every_planner) {
        names = planner_names();
        std::erase(names, req.planner);
        names.insert(names.begin(), req.planner);
    }
    {
        Progress progress(req.progress, "replay-plan", 0, names.size(), "planners");
        for (const auto& n : names) {
            job.curves.emplace_back(n, make_planner(n)->plan_all(problem, budgets));
            progress.item_done();
        }
    }
    job.least = chosen->min_peak(problem);
    job.keep_all = make_planner("none")->min_peak(problem);
    const double t_plan = cpu_ms();

    const auto& results = job.results();
    size_t sweep_oom = 0;
    for (size_t k = 0; k < results.size(); ++k) {
        const PlanResult& r = results[k];
        if (r.feasible) continue;
        if (k >= job.named) {
            ++sweep_oom;   // summarised below
            continue;
        }
        const bool activation = k >= req.budgets.size();
        job.failures.push_back(fmt::format(
            "{} is infeasible for planner {}: {} needs {} ({} B{})",
            activation ? fmt::format("activation budget {}", human_bytes(r.budget_bytes - fixed))
                       : fmt::format("budget {}", human_bytes(r.budget_bytes)),
            req.planner, least_text(req.planner),
            activation ? human_bytes(r.min_peak_bytes - fixed) : human_bytes(r.min_peak_bytes),
            activation ? r.min_peak_bytes - fixed : r.min_peak_bytes,
            activation ? " above the fixed memory" : ""));
    }
    if (sweep_oom)
        job.failures.push_back(fmt::format(
            "{} of {} sweep budgets are infeasible for planner {}: {} needs {} ({} B)", sweep_oom,
            req.sweep.size(), req.planner, least_text(req.planner), human_bytes(job.least), job.least));
    if (req.check)
        for (const auto& r : results) {
            if (!r.feasible) continue;
            SimReport s = simulate(problem, r.decisions);
            job.check_lines.push_back(fmt::format("check {} @ {}: {} recomputes, {} recomputed reads verified: {}",
                                                  req.planner, human_bytes(r.budget_bytes), s.recomputes,
                                                  s.reads_checked, s.ok() ? "ok" : "FAILED"));
            for (const auto& v : s.violations) job.check_lines.push_back("  " + v);
            if (!s.ok())
                job.failures.push_back(fmt::format("--check: the plan at {} has {} violations",
                                                   human_bytes(r.budget_bytes), s.violations.size()));
        }
    job.ms_load = t_load - t0;
    job.ms_contracts = t_problem - t_load;
    job.ms_plan = t_plan - t_problem;
    return job;
}

}  // namespace

PlanJob run_plan(std::string_view text, const std::string& name, const PlanRequest& req) {
    const double t0 = cpu_ms();
    return plan(std::make_unique<const Trace>(parse_trace(text, name)), name, req, t0);
}

PlanJob run_plan_file(const std::string& path, const PlanRequest& req) {
    const double t0 = cpu_ms();
    return plan(std::make_unique<const Trace>(load_trace(path)), path, req, t0);
}

nlohmann::json PlanJob::plan_json() const {
    return plan_to_json(*problem, trace_name, planner, results(), {least, keep_all});
}

nlohmann::json PlanJob::summary_json() const {
    return replay::summary_json(*problem, planner, results(), {least, keep_all});
}

std::string PlanJob::svg() const {
    return sweep_svg(curves, "replay-plan: " + (trace->model.empty() ? trace_name : trace->model));
}

std::string PlanJob::table() const {
    const Trace& t = *trace;
    const uint64_t fixed = problem->fixed();
    std::string out = fmt::format("trace {}: {} segments, fixed memory {}, planner {}\n", trace_name,
                                  t.segments.size(), human_bytes(fixed), planner);
    out += fmt::format("feasible budgets for {}: >= {} ({} B, {}); >= {} ({} B) keeps every activation\n",
                       planner, human_bytes(least), least, least_text(planner), human_bytes(keep_all), keep_all);
    out += fmt::format("as activation budgets (above the fixed memory): >= {} ({} B); >= {} ({} B) keeps "
                       "every activation\n", human_bytes(least - fixed), least - fixed,
                       human_bytes(keep_all - fixed), keep_all - fixed);
    for (const auto& sg : t.segments)   // kept by every safe planner
        if (!sg.non_replayable.empty())
            out += fmt::format("segment {} is non-replayable (kept by every safe plan): {}\n", sg.name,
                               sg.non_replayable);
    out += fmt::format("{:>12}  {:>8}  {:>12}  {:>12}  {:>6}  {:>5} {:>9} {:>8} {:>9}\n", "budget",
                       "feasible", "peak", "step ms", "safe", "keep", "recompute", "snapshot", "selective");
    for (const auto& r : results()) {
        int n[4] = {0, 0, 0, 0};
        for (Decision d : r.decisions) ++n[static_cast<int>(d)];
        if (!r.feasible) {
            out += fmt::format("{:>12}  {:>8}  {:>12}  {:>12}  {:>6}  (needs at least {})\n",
                               human_bytes(r.budget_bytes), "no", "-", "-", "-", human_bytes(r.min_peak_bytes));
            continue;
        }
        out += fmt::format("{:>12}  {:>8}  {:>12}  {:>12.3f}  {:>6}  {:>5} {:>9} {:>8} {:>9}\n",
                           human_bytes(r.budget_bytes), "yes", human_bytes(r.peak_bytes), r.step_time_ns / 1e6,
                           r.safe ? "yes" : "UNSAFE", n[0], n[1], n[2], n[3]);
        out += fmt::format("{:>12}  recomputed: {}\n", "", recomputed_names(t, r.decisions));
        std::string saved;   // op-level plans: the ops each recomputed segment saves
        for (size_t i = 0; i < r.saved_ops.size(); ++i)
            if (!r.saved_ops[i].empty())
                saved += fmt::format("{}{} ({})", saved.empty() ? "" : ", ", t.segments[i].name, r.saved_ops[i].size());
        if (!saved.empty()) out += fmt::format("{:>12}  saved ops: {}\n", "", saved);
    }
    if (curves.size() > 1 && named < results().size()) {   // a sweep: every planner's times
        out += fmt::format("\nbudget vs predicted step time (ms; OOM = infeasible)\n{:>12}", "budget");
        for (const auto& c : curves) out += fmt::format("  {:>10}", c.first);
        out += "\n";
        for (size_t k = 0; k < results().size(); ++k) {
            out += fmt::format("{:>12}", human_bytes(results()[k].budget_bytes));
            for (const auto& c : curves) {
                const PlanResult& r = c.second[k];
                std::string cell = r.feasible ? fmt::format("{:.3f}{}", r.step_time_ns / 1e6, r.safe ? "" : "!") : "OOM";
                out += fmt::format("  {:>10}", cell);
            }
            out += "\n";
        }
        out += "(! = unsafe: breaks a replay contract)\n";
    }
    for (const auto& r : results())
        if (r.feasible && !r.safe)
            for (const auto& u : r.unsafe) out += fmt::format("  unsafe at {}: {}\n", human_bytes(r.budget_bytes), u);
    return out;
}

}  // namespace ckpt::replay
