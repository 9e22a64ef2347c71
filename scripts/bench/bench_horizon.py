#!/usr/bin/python3
"""--horizon all against --horizon 1: moment reduction, compress CPU time, and real-torch
gradient sequences of many steps from each restored checkpoint (docs/benchmarks.md).

Usage: /usr/bin/python3 scripts/bench/bench_horizon.py [--bin build/apps] [--steps 1000]
           [--reps 3] [--models DIR] [--bench-steps 100] [--only NAME ...] [--out FILE.md]

For every bundled fixture (data/, each with the model and optimizer class that made it:
Adam + L2, AdamW, maximize, amsgrad, dead units, safetensors) and, when present, the two
bench models in --models (scripts/bench/train_bench_models.py; their gradient sequences run for
--bench-steps steps: an 11M-parameter step is ~10^3 times a fixture's):
compress with --horizon 1 and all (vlog, tau 0.01,
G 1), the reduction of each and the CPU-time ratio all / 1 (median of --reps runs, both in
the same loop); then for --horizon all at G = 1 and G = inf: ckpt-verify --original, and
scripts/torch_step_check.py --steps N (the fixture's own optimizer class, the same gradient
sequences for original and restored: aligned ramps, a spike after a zero run, alternating
signs, noise) - every step's parameter change within tolerance * lr, or a violation.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "data")
sys.path.insert(0, os.path.dirname(HERE))   # scripts/: torch_step_check
import torch_step_check as tsc  # noqa: E402

FIXTURES = ["cnn_adam_l2.pt", "cnn_adamw.pt", "cnn_dead.pt", "cnn_maximize.pt", "lm_adamw.pt",
            "lm_amsgrad.pt", "lm_sparse_l2.pt", "cnn_adamw.safetensors"]


def cpu_run(cmd):
    """Run cmd; return (completed process, child CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compress(bin_dir, src, out, horizon, G="1.0"):
    """ckpt-compress --json --threads 1; (report, cpu seconds)."""
    p, t = cpu_run([os.path.join(bin_dir, "ckpt-compress"), src, "-o", out, "--force", "--json", "--threads", "1",
                    "--horizon", horizon, "--grad-bound", G])
    if p.returncode != 0:
        raise SystemExit(f"ckpt-compress {src}: {p.stdout}{p.stderr}")
    return json.loads(p.stdout), t


def bench_sequences(a, src, out, tmp, name, G):
    """A bench checkpoint through the gradient sequences (--bench-steps steps, grad bound G,
    its own AdamW from train_bench_models.model_and_optimizer); one table row."""
    compress(a.bin, src, out, "all", G)
    v = subprocess.run([os.path.join(a.bin, "ckpt-verify"), out, "--original", src], capture_output=True, text=True)
    back = os.path.join(tmp, "r.pt")
    subprocess.run([os.path.join(a.bin, "ckpt-restore"), out, "-o", back, "--force"], check=True, capture_output=True)
    o_sd, r_sd = tsc.split_state(tsc.load_any(src), src), tsc.split_state(tsc.load_any(back), back)
    res = tsc.multi_step_check(name, o_sd, r_sd, 0.01, float(G), a.bench_steps)
    worst = max(r["max_lr"] for r in res.values())
    bad = sum(not r["ok"] for r in res.values())
    return (f"| {name} | {G} | {'pass' if v.returncode == 0 else 'FAIL'} | {worst:.3e} | "
            f"{len(res)} x {a.bench_steps} | {bad} |")


def main():
    """Print the two tables (and write them to --out)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/apps")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/ckptkit-bench"))
    ap.add_argument("--bench-steps", type=int, default=100)
    ap.add_argument("--only", action="append", help="checkpoint file name to run (repeatable)")
    ap.add_argument("--out")
    a = ap.parse_args()
    tsc.fast_malloc()
    files = [os.path.join(DATA, f) for f in FIXTURES]
    files += [os.path.join(a.models, f) for f in tsc.BENCH_FILES if os.path.exists(os.path.join(a.models, f))]
    if a.only:
        files = [f for f in files if os.path.basename(f) in a.only]
    red = ["| checkpoint | reduction, horizon 1 | reduction, horizon all | escapes (all) | compress CPU all / 1 |",
           "|---|---:|---:|---:|---:|"]
    seq = ["| fixture | G | verify --original | worst step max abs(dTheta)/lr | sequences x steps | violations |",
           "|---|---|---|---:|---|---:|"]
    tot = {"1": [0, 0], "all": [0, 0]}
    with tempfile.TemporaryDirectory() as tmp:
        for src in files:
            name = os.path.basename(src)
            out = os.path.join(tmp, "c.ckz.h5")
            times = {"1": [], "all": []}
            reps = {}
            for _ in range(a.reps):
                for h in ("1", "all"):
                    reps[h], t = compress(a.bin, src, out, h)
                    times[h].append(t)
            for h in ("1", "all"):
                tot[h][0] += reps[h]["moment_bytes_fp32"]
                tot[h][1] += reps[h]["moment_bytes_out"]
            ratio = statistics.median(times["all"]) / max(1e-9, statistics.median(times["1"]))
            red.append(f"| {name} | {100 * reps['1']['moment_reduction']:.1f}% | {100 * reps['all']['moment_reduction']:.1f}% "
                       f"| {reps['all']['escapes']} | {ratio:.3f}x |")
            if name not in FIXTURES:
                for G in ("1.0", "inf") if a.bench_steps else ():
                    seq.append(bench_sequences(a, src, out, tmp, name, G))
                    print(seq[-1], flush=True)
                continue
            for G in ("1.0", "inf"):
                compress(a.bin, src, out, "all", G)
                v = subprocess.run([os.path.join(a.bin, "ckpt-verify"), out, "--original", src], capture_output=True, text=True)
                back = os.path.join(tmp, "r" + os.path.splitext(src)[1])
                subprocess.run([os.path.join(a.bin, "ckpt-restore"), out, "-o", back, "--force"], check=True,
                               capture_output=True)
                errors, res = tsc.check_pair(src, back, tolerance=0.01, grad_bound=float(G), fixture=name, steps=a.steps)
                multi = {k: r for k, r in res.items() if k.endswith(f"x{a.steps}")}
                worst = max(r["max_lr"] for r in multi.values())
                bad = sum(not r["ok"] for r in res.values()) + len(errors)
                seq.append(f"| {name} | {G} | {'pass' if v.returncode == 0 else 'FAIL'} | {worst:.3e} | "
                           f"{len(multi)} x {a.steps} (+{len(res) - len(multi)} single) | {bad} |")
                print(seq[-1], flush=True)
    agg = {h: 1 - o / f for h, (f, o) in tot.items()}
    red.append(f"| all of the above | {100 * agg['1']:.1f}% | {100 * agg['all']:.1f}% | | |")
    text = "\n".join(red) + "\n\n" + "\n".join(seq) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
