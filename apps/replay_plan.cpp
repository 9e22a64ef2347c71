// replay-plan: read a recorded training-step trace and emit, per GPU memory budget, a
// state-safe activation-recomputation plan (docs/design.md §5, formats/plan.md).
//
//   replay-plan TRACE --budget 44GiB [--budget ...|--activation-budget B ...|--sweep MIN:MAX:STEP]
//               [--planner joint|eager|stateless|all|none] [-o PLAN.json] [--svg PLOT.svg]
//               [--json] [--check] [--timing] [--force] [--version]
//
// Exit: 0 ok; 1 a budget is infeasible or --check found a violation; 2 bad input or usage.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "common/error.h"
#include "common/file.h"
#include "replay/job.h"
#include "replay/plan_io.h"

using namespace ckpt::replay;

int main(int argc, char** argv) {
    ckpt::app::Cli cli("replay-plan", "replay-plan: state-safe activation recomputation plans from a step "
                       "trace. Exit 0 ok, 1 a budget is infeasible or --check failed, 2 bad input or usage.");
    CLI::App& app = cli.app;
    std::string trace_path, sweep, out_path, svg_path;
    std::vector<std::string> budget_args, activation_args;
    PlanRequest req;
    bool timing = false;
    app.add_option("trace", trace_path, "trace JSON (ckptkit, PyTorch ET 1.0.1 or Chakra)")->required();
    app.add_option("--budget", budget_args, "whole-step memory budget (fixed memory included), e.g. 44GiB (repeatable)");
    app.add_option("--activation-budget", activation_args,
                   "budget for activations only: bytes above the fixed memory (params, grads, optimizer "
                   "state, buffers, memory outside segments), e.g. 1.5MiB (repeatable)");
    app.add_option("--sweep", sweep, "budget sweep MIN:MAX:STEP, e.g. 24GiB:48GiB:2GiB");
    app.add_option("--planner", req.planner, "joint|eager|stateless|all|none|ops (ops: op-level plans, traces with ops[])")
        ->check(CLI::IsMember(planner_names()));
    app.add_option("-o,--output", out_path, "plan JSON to write");
    app.add_option("--svg", svg_path, "SVG plot of step time vs budget (every planner)");
    cli.add_force();
    app.add_flag("--check", req.check, "run the replay simulator over every feasible plan");
    app.add_flag("--timing", timing, "print CPU ms per phase (load, contracts, plan, output) on stderr");
    // Cli::main maps every exception (bad_alloc included) to one line and its exit code.
    return cli.main(argc, argv, trace_path, [&] {
        try {
            for (const auto& b : budget_args) req.budgets.push_back(parse_bytes(b));
            for (const auto& b : activation_args) req.activation_budgets.push_back(parse_bytes(b));
            if (!sweep.empty()) req.sweep = parse_sweep(sweep);
        } catch (const std::invalid_argument& e) {
            throw ckpt::BadInput("", e.what());
        }
        if (req.budgets.empty() && req.activation_budgets.empty() && req.sweep.empty())
            throw ckpt::app::UsageError("give at least one --budget, --activation-budget or a --sweep");
        ckpt::check_outputs({trace_path}, {out_path, svg_path}, cli.force);
        req.every_planner = !sweep.empty() || !svg_path.empty();
        req.progress = cli.progress();
        const PlanJob job = run_plan_file(trace_path, req);

        const double t_out = cpu_ms();
        if (!cli.json && !cli.quiet) std::fputs(job.table().c_str(), stdout);
        if (!cli.quiet)   // -q: a failing plan gets only its check-failed line
            for (const auto& line : job.check_lines) fmt::print(stderr, "{}\n", line);
        // A check that fails (exit 1): "replay-plan: check failed: TRACE: WHAT" on stderr; the
        // first one is the JSON summary's "error".
        for (const auto& f : job.failures) fmt::print(stderr, "replay-plan: check failed: {}: {}\n", trace_path, f);
        const int rc = job.failures.empty() ? ckpt::kExitOk : ckpt::kExitCheckFailed;
        try {
            if (!out_path.empty()) ckpt::write_text_atomic(out_path, job.plan_json().dump(1) + "\n");
            if (!svg_path.empty()) ckpt::write_text_atomic(svg_path, job.svg());
        } catch (const std::exception& e) {
            throw ckpt::BadInput("", e.what());  // the message names the path
        }
        if (cli.json) {  // one object, as every tool prints: ok and exit_code too
            nlohmann::json j = job.summary_json();
            j["tool"] = "replay-plan";
            j["file"] = trace_path;
            j["ok"] = rc == ckpt::kExitOk;
            j["exit_code"] = rc;
            if (!job.failures.empty()) j["error"] = job.failures.front();
            std::cout << j.dump() << "\n";
        }
        if (timing)
            fmt::print(stderr, "timing (CPU ms): load {:.1f} contracts {:.1f} plan {:.1f} output {:.1f} total {:.1f}\n",
                       job.ms_load, job.ms_contracts, job.ms_plan, cpu_ms() - t_out,
                       cpu_ms());
        return rc;
    });
}
