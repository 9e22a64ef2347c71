#!/usr/bin/env python3
"""Benchmark of ckptkit.replay.jax (issue 54): per model (scripts/fixtures/jax_models.py: cnn,
transformer, rnn), the compiled training step's peak memory by XLA's own analysis
(memory_analysis(): arguments + outputs - aliased + temporaries; params, Adam state and
batch_stats donated) and its median step time, for no remat, full remat (the `all` planner's
plan: every segment recomputed, by jax.checkpoint(nothing_saveable) and by apply's default
remat) and ckptkit's joint plans at 5 budgets from the smallest feasible to keep-everything
(apply's default remat: "callback" on CPU); next to the plan's predicted peak.

    PYTHONPATH=build/python .venv/bin/python scripts/bench/bench_replay_jax.py [--scale 4]
        [--steps 20] [--memory-scheduler] [--json out.json] [--svg-dir docs/replay_jax]

--memory-scheduler sets XLA_FLAGS=--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED
(before jax is imported); XLA:CPU's default scheduler is concurrency-optimized. Prints a
markdown table (MiB; ratio = XLA / predicted)."""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sweep_svg(text, name, lo, hi, folder):
    """replay-plan TRACE --sweep lo:hi:(hi-lo)/24 --svg folder/NAME.svg on the recorded trace."""
    import subprocess
    os.makedirs(folder, exist_ok=True)
    tp = os.path.join(folder, f"{name}.trace.json")
    with open(tp, "w") as f:
        f.write(text)
    exe = os.path.join(os.environ.get("CKPTKIT_BIN") or os.path.join(ROOT, "build", "apps"), "replay-plan")
    step = max(1, (hi - lo) // 24)
    subprocess.run([exe, tp, "--sweep", f"{lo}:{hi + step}:{step}", "--svg", os.path.join(folder, f"{name}.svg"),
                    "--force", "-q"], check=False, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=4, help="batch multiplier of the fixture models (default 4)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per configuration (median)")
    ap.add_argument("--memory-scheduler", action="store_true", help="XLA:CPU's memory-optimized scheduler")
    ap.add_argument("--models", default="cnn,transformer,rnn")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--svg-dir", help="write each model's trace and replay-plan's sweep plot (step time vs "
                                      "budget, every planner: the torch sweeps' plot) here as NAME.trace.json / "
                                      "NAME.svg; needs CKPTKIT_BIN or build/apps")
    a = ap.parse_args()
    if a.memory_scheduler:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED").strip()
    sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
    import jax
    import optax
    import jax_models
    from ckptkit.replay import jax as rj

    mib = 1 << 20
    rows = []
    print("| model | config | predicted peak MiB | XLA peak MiB | XLA / predicted | XLA temp MiB | step ms "
          "| recomputed |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        loss_fn, params, state, batch = jax_models.MODELS[name](scale=a.scale)
        tx = optax.adam(1e-3)
        key = jax.random.PRNGKey(3)
        text = json.dumps(rj.record_trace(loss_fn, params, state, batch, key, optimizer=tx, model_name=name))
        r = rj.plan(text).range
        lo, hi = r["min_peak_bytes"], r["keep_all_peak_bytes"]
        budgets = [lo + k * (hi - lo) // 4 for k in range(5)]
        joint = rj.plan(text, budget=budgets)
        if a.svg_dir:
            _sweep_svg(text, name, lo, hi, a.svg_dir)
        full = rj.plan(text, planner="all")
        configs = [("no remat", loss_fn, hi, [])]
        e = full.entries[0]
        every = [s["name"] for s in e["segments"] if s["decision"] != "keep"]
        configs.append(("full remat, jax.checkpoint", rj.apply(loss_fn, full, remat="checkpoint"), e["peak_bytes"],
                        every))
        configs.append(("full remat, ckptkit", rj.apply(loss_fn, full), e["peak_bytes"], every))
        for k, e in enumerate(joint.entries):
            configs.append((f"plan {k * 25}% ({e['budget_bytes'] / mib:.2f})",
                            rj.apply(loss_fn, joint, e["budget_bytes"]), e["peak_bytes"],
                            [s["name"] for s in e["segments"] if s["decision"] != "keep"]))
        for label, fn, predicted, rc in configs:
            step = jax_models.train_step(fn, tx, batch, donate=True)
            o = tx.init(params)
            comp = step.lower(params, o, state, key).compile()
            peak = rj.step_memory(comp)
            temp = comp.memory_analysis().temp_size_in_bytes
            p, st = jax.tree.map(lambda x: x.copy(), params), jax.tree.map(lambda x: x.copy(), state)
            ts = []
            for _ in range(a.steps + 2):
                t0 = time.perf_counter()
                p, o, st, loss = comp(p, o, st, key)
                jax.block_until_ready(loss)
                ts.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(ts[2:])
            row = {"model": name, "config": label, "predicted_bytes": predicted, "xla_bytes": peak,
                   "xla_temp_bytes": temp, "step_ms": ms, "recomputed": rc}
            rows.append(row)
            print(f"| {name} | {label} | {predicted / mib:.2f} | {peak / mib:.2f} | {peak / predicted:.2f} | "
                  f"{temp / mib:.2f} | {ms:.2f} | {','.join(rc) or '-'} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
