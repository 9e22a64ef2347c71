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
        [--peak-svg-dir docs/replay_jax [--peak-points 25]]

--memory-scheduler sets XLA_FLAGS=--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED
(before jax is imported); XLA:CPU's default scheduler is concurrency-optimized. Prints a
markdown table (MiB; ratio = XLA / predicted).

--peak-svg-dir writes DIR/NAME_peak.svg per model: peak memory against activation budget, the
plan's predicted peak and XLA's analysed peak of the compiled step for joint plans at
--peak-points activation budgets (each distinct plan compiled once; staircases, since a plan
holds until the next budget changes it), under XLA:CPU's default scheduler and its
memory-optimized one (a child run of this script with --memory-scheduler --peak-only, which
records its own trace: the budgets follow that run's recording), with XLA's no-remat and
full-remat (jax.checkpoint(nothing_saveable) on every block) peaks as horizontal lines.
--peak-only skips the table and the timing (only the peak sweep; with --peak-json, its data)."""
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


def _peak_sweep(rj, jax_models, loss_fn, params, state, batch, tx, key, text, n):
    """Predicted and XLA peaks (bytes) of the joint plans at n activation budgets from the smallest
    feasible to keep-everything, and XLA's peaks of no remat and full remat by jax.checkpoint."""
    r = rj.plan(text).range
    lo, hi = r["min_activation_bytes"], r["keep_all_activation_bytes"]
    acts = sorted({lo + k * (hi - lo) // max(1, n - 1) for k in range(n)})
    sweep = rj.plan(text, activation_budget=acts)

    def xla_peak(fn):
        step = jax_models.train_step(fn, tx, batch, donate=True)
        return rj.step_memory(step.lower(params, tx.init(params), state, key).compile())

    seen, points = {}, []
    for e in sweep.entries:
        rc = tuple((s["name"], s["decision"]) for s in e["segments"] if s["decision"] != "keep")
        if rc not in seen:
            seen[rc] = xla_peak(rj.apply(loss_fn, sweep, e["budget_bytes"]) if rc else loss_fn)
        points.append({"activation_budget_bytes": e["activation_budget_bytes"], "predicted_bytes": e["peak_bytes"],
                       "xla_bytes": seen[rc], "recomputed": [s for s, _ in rc]})
    full = rj.plan(text, planner="all")
    return {"points": points, "fixed_bytes": r["min_peak_bytes"] - r["min_activation_bytes"],
            "no_remat": {"predicted_bytes": r["keep_all_peak_bytes"], "xla_bytes": xla_peak(loss_fn)},
            "full_remat_checkpoint": {"predicted_bytes": full.entries[0]["peak_bytes"],
                                      "xla_bytes": xla_peak(rj.apply(loss_fn, full, remat="checkpoint"))}}


def _peak_svg(name, default, memory, path, scale):
    """One SVG in the style of replay-plan's sweep plot (lib/replay/plan_io.cpp sweep_svg): peak MiB
    against activation budget MiB; predicted and XLA staircases per scheduler, XLA's no-remat and
    full-remat peaks as horizontal lines, a legend on the right."""
    from xml.sax.saxutils import escape
    mib = float(1 << 20)
    W, H, L, R, T, B = 880, 460, 70, 350, 40, 60
    runs = [("default scheduler", default, "#1f77b4"), ("memory scheduler", memory, "#ff7f0e")]
    runs = [x for x in runs if x[1]]
    xs = [p["activation_budget_bytes"] / mib for _, d, _ in runs for p in d["points"]]
    ys = [v / mib for _, d, _ in runs for p in d["points"] for v in (p["predicted_bytes"], p["xla_bytes"])]
    ys += [d[k]["xla_bytes"] / mib for _, d, _ in runs for k in ("no_remat", "full_remat_checkpoint")]
    xmin, xmax = min(xs), max(xs)
    if xmax - xmin < 1e-9:
        xmax = xmin + 1
    xpad = (xmax - xmin) * 0.04
    xmin, xmax = xmin - xpad, xmax + xpad
    ymin, ymax = 0.0, max(ys) * 1.08
    X = lambda v: L + (v - xmin) / (xmax - xmin) * (W - L - R)
    Y = lambda v: H - B - (v - ymin) / (ymax - ymin) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12">', '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{L}" y="24" font-size="14">{escape(name)} (scale {scale}): peak of the jitted training step, '
           f'ckptkit predicted vs XLA:CPU memory_analysis()</text>']
    def ticks(lo, hi):   # round steps (1, 2, 2.5, 5 x 10^k), about 5 of them
        import math
        raw = (hi - lo) / 7
        e = 10 ** math.floor(math.log10(raw))
        step = min((m * e for m in (1, 2, 2.5, 5, 10) if m * e >= raw), default=10 * e)
        dec = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if step / e == 2.5 else 0))
        k = math.ceil(lo / step - 1e-9)
        while k * step <= hi + 1e-9:
            yield k * step, f"{k * step:.{dec}f}"
            k += 1
    for yv, lab in ticks(ymin, ymax):
        out.append(f'<line x1="{L}" y1="{Y(yv):.1f}" x2="{W - R}" y2="{Y(yv):.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{L - 6}" y="{Y(yv) + 4:.1f}" text-anchor="end">{lab}</text>')
    for xv, lab in ticks(xmin, xmax):
        out.append(f'<line x1="{X(xv):.1f}" y1="{H - B}" x2="{X(xv):.1f}" y2="{H - B + 5}" stroke="black"/>')
        out.append(f'<text x="{X(xv):.1f}" y="{H - B + 18}" text-anchor="middle">{lab}</text>')
    out.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>')
    out.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 15}" text-anchor="middle">activation budget of the '
               f'joint plan (MiB)</text>')
    out.append(f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
               f'text-anchor="middle">peak memory of the step (MiB)</text>')
    legend = []

    def stairs(pts, key, col, width, dash, label, marker):
        pts = sorted(pts, key=lambda p: p["activation_budget_bytes"])
        xy = []
        for i, p in enumerate(pts):
            x, y = X(p["activation_budget_bytes"] / mib), Y(p[key] / mib)
            if i:
                xy.append((x, xy[-1][1]))
            xy.append((x, y))
        out.append(f'<polyline fill="none" stroke="{col}" stroke-width="{width}" stroke-opacity="0.85" '
                   f'stroke-dasharray="{dash}" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in xy)}"/>')
        for p in pts:
            x, y = X(p["activation_budget_bytes"] / mib), Y(p[key] / mib)
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{col}"/>' if marker == "dot" else
                       f'<rect x="{x - 2.5:.1f}" y="{y - 2.5:.1f}" width="5" height="5" fill="white" '
                       f'stroke="{col}"/>')
        legend.append((col, width, dash, label))

    for i, (sched, d, col) in enumerate(runs):
        stairs(d["points"], "predicted_bytes", "#d62728" if i == 0 else "#9467bd", 2.5 if i == 0 else 1.5,
               "" if i == 0 else "6 3", f"ckptkit predicted peak ({sched[:-4]}. trace)",
               "square")
        stairs(d["points"], "xla_bytes", col, 2.5, "", f"XLA peak of the plan, {sched[:-4]}.", "dot")
    for sched, d, col in runs:
        for k, dash, what in (("no_remat", "8 4", "no remat"),
                              ("full_remat_checkpoint", "2 3", "full remat (jax.checkpoint)")):
            short = sched[:-4] + "." if k == "no_remat" else sched.split()[0]
            v = d[k]["xla_bytes"] / mib
            out.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="{col}" '
                       f'stroke-width="1.5" stroke-dasharray="{dash}"/>')
            legend.append((col, 1.5, dash, f"XLA, {what}, {short}: {v:.2f} MiB"))
    for j, (col, width, dash, label) in enumerate(legend):
        y = T + 10 + 18 * j
        out.append(f'<line x1="{W - R + 12}" y1="{y}" x2="{W - R + 40}" y2="{y}" stroke="{col}" '
                   f'stroke-width="{width}" stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{W - R + 46}" y="{y + 4}" font-size="11">{escape(label)}</text>')
    y = T + 10 + 18 * len(legend) + 10
    for line in ("XLA peak = arguments + outputs - aliased + temporaries",
                 "(params, Adam state, batch_stats donated);",
                 "predicted = the joint plan's peak_bytes;",
                 "markers: the budgets planned (each distinct plan compiled)"):
        out.append(f'<text x="{W - R + 12}" y="{y}" font-size="10">{escape(line)}</text>')
        y += 13
    out.append("</svg>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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
    ap.add_argument("--peak-svg-dir", help="write NAME_peak.svg per model here: peak memory (MiB) against activation "
                                           "budget, predicted and XLA-analysed, both XLA:CPU schedulers, no-remat "
                                           "and full-remat lines (runs this script once more with "
                                           "--memory-scheduler --peak-only)")
    ap.add_argument("--peak-points", type=int, default=25, help="activation budgets of the peak sweep (default 25)")
    ap.add_argument("--peak-only", action="store_true", help="only the peak sweep: no table, no timing")
    ap.add_argument("--peak-json", help="write the peak sweep per model as JSON here")
    a = ap.parse_args()
    memory_peaks = {}
    if a.peak_svg_dir and not a.memory_scheduler:
        import subprocess
        import tempfile
        with tempfile.TemporaryDirectory() as td:
            jp = os.path.join(td, "memory.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-scheduler", "--peak-only",
                            "--scale", str(a.scale), "--models", a.models, "--peak-points", str(a.peak_points),
                            "--peak-json", jp], check=True)
            with open(jp) as f:
                memory_peaks = json.load(f)
    if a.memory_scheduler:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED").strip()
    sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
    import jax
    import optax
    import jax_models
    from ckptkit.replay import jax as rj

    mib = 1 << 20
    rows, peaks = [], {}
    if not a.peak_only:
        print("| model | config | predicted peak MiB | XLA peak MiB | XLA / predicted | XLA temp MiB | step ms "
              "| recomputed |")
        print("|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        loss_fn, params, state, batch = jax_models.MODELS[name](scale=a.scale)
        tx = optax.adam(1e-3)
        key = jax.random.PRNGKey(3)
        text = json.dumps(rj.record_trace(loss_fn, params, state, batch, key, optimizer=tx, model_name=name))
        if a.peak_svg_dir or a.peak_json:
            peaks[name] = _peak_sweep(rj, jax_models, loss_fn, params, state, batch, tx, key, text,
                                      a.peak_points)
            if a.peak_svg_dir:
                _peak_svg(name, peaks[name], None if a.memory_scheduler else memory_peaks.get(name),
                          os.path.join(a.peak_svg_dir, f"{name}_peak.svg"), a.scale)
        if a.peak_only:
            continue
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
    if a.peak_json:
        with open(a.peak_json, "w") as f:
            json.dump(peaks, f, indent=1)
    for name, d in peaks.items():
        for lab, x in (("memory" if a.memory_scheduler else "default", d), ("memory", memory_peaks.get(name))):
            if not x:
                continue
            pts = ", ".join(f"{p['activation_budget_bytes'] / mib:.2f}: {p['predicted_bytes'] / mib:.2f} / "
                            f"{p['xla_bytes'] / mib:.2f}" for p in x["points"])
            print(f"peak sweep {name}, {lab} scheduler (MiB): no remat {x['no_remat']['xla_bytes'] / mib:.2f}, "
                  f"full remat (jax.checkpoint) {x['full_remat_checkpoint']['xla_bytes'] / mib:.2f}; "
                  f"activation budget: predicted / XLA peak: {pts}", flush=True)


if __name__ == "__main__":
    main()
