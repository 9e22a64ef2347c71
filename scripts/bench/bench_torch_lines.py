#!/usr/bin/env python3
"""The data/ fixtures written by each torch line of the test matrix, compressed side by side.

  python3 scripts/bench/bench_torch_lines.py [--reps 3] [--out DIR]

For each interpreter (Debian's /usr/bin/python3 with torch 1.13; .venv/bin/python with torch
2.13, made by scripts/setup.sh) scripts/fixtures/make_fixtures.py writes the fixtures afresh
(same models, data and seeds) under DIR/<line>/; each file is compressed by build/apps/ckpt-compress
(vlog, tau 0.01, every update: the defaults) and its raw FP32 moments (scripts/bench/bench_moments.py)
by `zstd -3 -T1`. Printed as one markdown table: moment reduction, escapes, and the CPU time
of ckpt-compress over that of zstd on the same moments (median of --reps runs, both measured
here, the child processes' user + sys time).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LINES = (("torch 1.13 (Debian)", "/usr/bin/python3"), ("torch 2.13 (.venv)", os.path.join(ROOT, ".venv", "bin", "python")))


def cpu(cmd, **kw):
    """Run cmd; (its CPU seconds, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p.stdout


def line_rows(name, py, out, reps):
    d = os.path.join(out, name.split(" (")[0].replace(" ", ""))
    os.makedirs(d, exist_ok=True)
    subprocess.run([py, os.path.join(ROOT, "scripts", "fixtures", "make_fixtures.py"), "--out", d], check=True,
                   stdout=subprocess.DEVNULL)
    version = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], check=True, stdout=subprocess.PIPE,
                             text=True).stdout.strip()
    tool = os.path.join(ROOT, "build", "apps", "ckpt-compress")
    rows = []
    for f in sorted(os.listdir(d)):
        if not f.endswith((".pt", ".safetensors")):
            continue
        src = os.path.join(d, f)
        raw = os.path.join(d, f + ".moments.bin")
        subprocess.run([py, os.path.join(ROOT, "scripts", "bench", "bench_moments.py"), src, raw], check=True,
                       stdout=subprocess.DEVNULL)
        ours, ref, rep = [], [], None
        for _ in range(reps):
            t, js = cpu([tool, src, "-o", src + ".ckz.h5", "--force", "--json", "--threads", "1"])
            ours.append(t)
            rep = json.loads(js)
            ref.append(cpu(["zstd", "-3", "-T1", "-q", "-f", raw, "-o", raw + ".zst"])[0])
        rows.append((version, f, rep["moment_reduction"], rep["escapes"], rep["moment_values"],
                     statistics.median(ours) / max(statistics.median(ref), 1e-3)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/ckptkit-bench-torch-lines")
    a = ap.parse_args()
    print("| torch | fixture | moment reduction | escapes | compress / zstd -3 (CPU) |")
    print("|---|---|---|---|---|")
    for name, py in LINES:
        if not os.path.exists(py):
            print(f"bench_torch_lines.py: {py} not found (scripts/setup.sh makes .venv)", file=sys.stderr)
            continue
        for version, f, red, esc, n, ratio in line_rows(name, py, a.out, a.reps):
            print(f"| {version} | {f} | {100 * red:.1f}% | {esc} of {n} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
