// replay-plan: read a recorded training-step trace and emit, per GPU memory budget, a
// state-safe activation-recomputation plan (docs/design.md §5, formats/plan.md).
//
//   replay-plan TRACE --budget 44GiB [--budget ...|--sweep MIN:MAX:STEP]
//               [--planner joint|eager|stateless|all|none] [-o PLAN.json] [--svg PLOT.svg]
//               [--json] [--check] [--timing] [--force] [--version]
//
// Exit: 0 ok; 1 a budget is infeasible or --check found a violation; 2 bad input or usage.
#include <cstdio>
#include <ctime>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "common/error.h"
#include "common/file.h"
#include "common/progress.h"
#include "replay/plan_io.h"
#include "replay/planner.h"
#include "replay/simulate.h"
#include "replay/trace.h"

using namespace ckpt::replay;

namespace {

// CPU time of this process so far (ms), for --timing.
double cpu_ms() { return 1e3 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

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

void print_table(std::FILE* out, const std::vector<PlanResult>& rs, const Trace& t) {
    fmt::print(out, "{:>12}  {:>8}  {:>12}  {:>12}  {:>6}  {:>5} {:>9} {:>8} {:>9}\n", "budget",
               "feasible", "peak", "step ms", "safe", "keep", "recompute", "snapshot",
               "selective");
    for (const auto& r : rs) {
        int n[4] = {0, 0, 0, 0};
        for (Decision d : r.decisions) ++n[static_cast<int>(d)];
        if (!r.feasible) {
            fmt::print(out, "{:>12}  {:>8}  {:>12}  {:>12}  {:>6}  (needs at least {})\n",
                       human_bytes(r.budget_bytes), "no", "-", "-", "-",
                       human_bytes(r.min_peak_bytes));
            continue;
        }
        fmt::print(out, "{:>12}  {:>8}  {:>12}  {:>12.3f}  {:>6}  {:>5} {:>9} {:>8} {:>9}\n",
                   human_bytes(r.budget_bytes), "yes", human_bytes(r.peak_bytes),
                   r.step_time_ns / 1e6, r.safe ? "yes" : "UNSAFE", n[0], n[1], n[2], n[3]);
        fmt::print(out, "{:>12}  recomputed: {}\n", "", recomputed_names(t, r.decisions));
    }
}

}  // namespace

int main(int argc, char** argv) {
    ckpt::app::Cli cli("replay-plan", "replay-plan: state-safe activation recomputation plans from a step "
                       "trace. Exit 0 ok, 1 a budget is infeasible or --check failed, 2 bad input or usage.");
    CLI::App& app = cli.app;
    std::string trace_path, sweep, planner = "joint", out_path, svg_path;
    std::vector<std::string> budget_args;
    bool check = false, timing = false;
    app.add_option("trace", trace_path, "trace JSON (ckptkit, PyTorch ET 1.0.1 or Chakra)")->required();
    app.add_option("--budget", budget_args, "memory budget, e.g. 44GiB (repeatable)");
    app.add_option("--sweep", sweep, "budget sweep MIN:MAX:STEP, e.g. 24GiB:48GiB:2GiB");
    app.add_option("--planner", planner, "joint|eager|stateless|all|none")
        ->check(CLI::IsMember(planner_names()));
    app.add_option("-o,--output", out_path, "plan JSON to write");
    app.add_option("--svg", svg_path, "SVG plot of step time vs budget (every planner)");
    cli.add_force();
    app.add_flag("--check", check, "run the replay simulator over every feasible plan");
    app.add_flag("--timing", timing, "print CPU ms per phase (load, contracts, plan, output) on stderr");
    // Cli::main maps every exception (bad_alloc included) to one line and its exit code.
    return cli.main(argc, argv, trace_path, [&] {
        const bool as_json = cli.json;  // the JSON summary on stdout instead of the table
        const bool table = !as_json && !cli.quiet;  // the text summary on stdout
        std::vector<uint64_t> budgets;
        try {
            for (const auto& b : budget_args) budgets.push_back(parse_bytes(b));
            if (!sweep.empty())
                for (uint64_t b : parse_sweep(sweep)) budgets.push_back(b);
        } catch (const std::invalid_argument& e) {
            throw ckpt::BadInput("", e.what());
        }
        if (budgets.empty()) throw ckpt::app::UsageError("give at least one --budget or a --sweep");
        ckpt::check_outputs({trace_path}, {out_path, svg_path}, cli.force);

        const double t0 = cpu_ms();
        const Trace trace = load_trace(trace_path);
        const double t_load = cpu_ms();
        Problem problem(trace);
        const double t_problem = cpu_ms();

        std::vector<std::pair<std::string, std::vector<PlanResult>>> curves;
        std::vector<std::string> names = {planner};
        if (!sweep.empty() || !svg_path.empty()) {
            names = planner_names();
            std::erase(names, planner);
            names.insert(names.begin(), planner);
        }
        {
            // Progress on a terminal only (never under --json): sweeps of large traces take seconds.
            ckpt::Progress progress(cli.progress(), "replay-plan", 0, names.size(), "planners");
            for (const auto& name : names) {
                curves.emplace_back(name, make_planner(name)->plan_all(problem, budgets));
                progress.item_done();
            }
        }
        const double t_plan = cpu_ms();
        const std::vector<PlanResult>& results = curves.front().second;
        const uint64_t least = make_planner(planner)->min_peak(problem);

        int rc = ckpt::kExitOk;
        std::FILE* out = stdout;
        if (table) {
            fmt::print(out, "trace {}: {} segments, fixed memory {}, planner {}\n", trace_path,
                       trace.segments.size(), human_bytes(trace.fixed_bytes()), planner);
            const uint64_t keep_all = make_planner("none")->min_peak(problem);
            fmt::print(out, "feasible budgets for {}: >= {} ({} B, {}); >= {} ({} B) keeps every "
                            "activation\n", planner, human_bytes(least), least, least_text(planner),
                       human_bytes(keep_all), keep_all);
            for (const auto& sg : trace.segments)   // kept by every safe planner
                if (!sg.non_replayable.empty())
                    fmt::print(out, "segment {} is non-replayable (kept by every safe plan): {}\n", sg.name,
                               sg.non_replayable);
            print_table(out, results, trace);
            if (!sweep.empty()) {
                fmt::print(out, "\nbudget vs predicted step time (ms; OOM = infeasible)\n{:>12}", "budget");
                for (const auto& c : curves) fmt::print(out, "  {:>10}", c.first);
                fmt::print(out, "\n");
                for (size_t k = 0; k < budgets.size(); ++k) {
                    fmt::print(out, "{:>12}", human_bytes(budgets[k]));
                    for (const auto& c : curves) {
                        const PlanResult& r = c.second[k];
                        std::string cell = r.feasible ? fmt::format("{:.3f}{}", r.step_time_ns / 1e6, r.safe ? "" : "!") : "OOM";
                        fmt::print(out, "  {:>10}", cell);
                    }
                    fmt::print(out, "\n");
                }
                fmt::print(out, "(! = unsafe: breaks a replay contract)\n");
            }
        }
        // A check that fails (exit 1): "replay-plan: check failed: TRACE: WHAT" on stderr; the
        // first one is the JSON summary's "error".
        std::string first_failure;
        auto failed = [&](const std::string& what) {
            fmt::print(stderr, "replay-plan: check failed: {}: {}\n", trace_path, what);
            if (first_failure.empty()) first_failure = what;
            rc = ckpt::kExitCheckFailed;
        };
        size_t sweep_oom = 0;
        for (size_t k = 0; k < results.size(); ++k) {
            const PlanResult& r = results[k];
            if (!r.feasible && k >= budget_args.size()) {
                ++sweep_oom;   // sweep points may be infeasible: summarised below, exit stays 0
            } else if (!r.feasible) {
                failed(fmt::format("budget {} is infeasible for planner {}: {} needs {} ({} B)",
                                   human_bytes(r.budget_bytes), planner, least_text(planner),
                                   human_bytes(r.min_peak_bytes), r.min_peak_bytes));
            }
            if (r.feasible && !r.safe && table)
                for (const auto& u : r.unsafe) fmt::print(out, "  unsafe at {}: {}\n", human_bytes(r.budget_bytes), u);
        }
        if (sweep_oom) {   // as --budget: exit 1 (the table and the outputs are still written)
            failed(fmt::format("{} of {} sweep budgets are infeasible for planner {}: {} needs {} ({} B)",
                               sweep_oom, results.size() - budget_args.size(), planner, least_text(planner),
                               human_bytes(least), least));
        }
        if (check) {
            for (const auto& r : results) {
                if (!r.feasible) continue;
                SimReport s = simulate(problem, r.decisions);
                if (!cli.quiet) {  // -q: a failing plan gets only its check-failed line
                    fmt::print(stderr, "check {} @ {}: {} recomputes, {} recomputed reads verified: {}\n",
                               planner, human_bytes(r.budget_bytes), s.recomputes, s.reads_checked,
                               s.ok() ? "ok" : "FAILED");
                    for (const auto& v : s.violations) fmt::print(stderr, "  {}\n", v);
                }
                if (!s.ok())
                    failed(fmt::format("--check: the plan at {} has {} violations", human_bytes(r.budget_bytes),
                                       s.violations.size()));
            }
        }
        try {
            if (!out_path.empty())
                ckpt::write_text_atomic(out_path, plan_to_json(problem, trace_path, planner, results).dump(1) + "\n");
            if (!svg_path.empty())
                ckpt::write_text_atomic(svg_path, sweep_svg(curves, "replay-plan: " + (trace.model.empty() ? trace_path : trace.model)));
        } catch (const std::exception& e) {
            throw ckpt::BadInput("", e.what());  // the message names the path
        }
        if (as_json) {  // one object, as every tool prints: ok and exit_code too
            nlohmann::json j = summary_json(planner, results);
            j["tool"] = "replay-plan";
            j["file"] = trace_path;
            j["ok"] = rc == ckpt::kExitOk;
            j["exit_code"] = rc;
            if (!first_failure.empty()) j["error"] = first_failure;
            std::cout << j.dump() << "\n";
        }
        if (timing)
            fmt::print(stderr, "timing (CPU ms): load {:.1f} contracts {:.1f} plan {:.1f} output {:.1f} total {:.1f}\n",
                       t_load - t0, t_problem - t_load, t_plan - t_problem, cpu_ms() - t_plan, cpu_ms());
        return rc;
    });
}
