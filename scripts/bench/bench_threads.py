#!/usr/bin/python3
"""Issue 58's parallel fractions and thread scaling of ckpt-compress / ckpt-verify / ckpt-restore.

  /usr/bin/python3 scripts/bench/bench_threads.py [--gib 0.25 1] [--reps 7] [--bin build/apps] [--no-wall]

Per generated checkpoint (scripts/fixtures/gen_checkpoint.py, --gib GiB each):
1. Instruction shares (valgrind --tool=callgrind --separate-threads=yes, --threads 2; counts
   do not depend on the machine's load). Thread 1 is the main thread; of the others the one
   with the most instructions is the pool's worker, every other one a lane (compress's
   ordered output stage, restore's writer, read-ahead). With 2 threads the main thread runs
   its share of each parallel loop, so main-only = main - worker, pool = 2 x worker, and
   p = 1 - main-only / total. Projection to N cores (Amdahl over the critical path, the lanes
   running beside it): speedup(N) = 1 / max(main-only + pool / N, largest lane, 1 / N),
   shares of the total.
2. Wall time (unless --no-wall): --threads 1 and 2, paired and interleaved --reps times,
   medians, with `zstd -3 -T1 / -T2` of the same file as the reference, and the load average.
Prints a markdown table per part (docs/benchmarks.md, "Threads").
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORES = (2, 8, 16, 32, 64)


def _callgrind(cmd, d):
    """Instructions per thread of `cmd` under callgrind: [main, other threads...]."""
    for f in glob.glob(os.path.join(d, "cg.out*")):
        os.unlink(f)
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                    f"--callgrind-out-file={d}/cg.out.%p"] + cmd,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    per = {}
    for f in glob.glob(os.path.join(d, "cg.out.*-*")):
        tid = int(f.rsplit("-", 1)[1])
        with open(f) as fh:
            m = re.search(r"^(?:summary|totals): (\d+)", fh.read(), re.M)
        per[tid] = int(m.group(1)) if m else 0
    return [per[t] for t in sorted(per)]


def shares(counts):
    """(p, main-only, pool, largest lane) as shares of the total, from callgrind's counts."""
    total = sum(counts)
    main, others = counts[0], sorted(counts[1:], reverse=True)
    worker = others[0] if others else 0
    lanes = others[1:]
    main_only = max(0, main - worker)
    return 1 - main_only / total, main_only / total, 2 * worker / total, (max(lanes) / total if lanes else 0.0)


def speedup(main_only, pool, lane, n):
    return 1 / max(main_only + pool / n, lane, 1 / n)


def _wall(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[0.25, 1.0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--bin", default=os.environ.get("CKPTKIT_BIN", os.path.join(ROOT, "build", "apps")))
    ap.add_argument("--no-wall", action="store_true", help="instruction shares only")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="bench-threads-")
    try:
        rows, walls = [], []
        for gib in a.gib:
            src, ckz, out = (os.path.join(d, n) for n in ("g.pt", "g.ckz.h5", "r.pt"))
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "fixtures", "gen_checkpoint.py"),
                            "--gib", str(gib), "-o", src], check=True, stdout=subprocess.DEVNULL)
            tools = {
                "compress": [f"{a.bin}/ckpt-compress", src, "-o", ckz, "-q", "--force"],
                "verify": [f"{a.bin}/ckpt-verify", ckz, "-q"],
                "restore": [f"{a.bin}/ckpt-restore", ckz, "-o", out, "-q", "--force"],
            }
            subprocess.run(tools["compress"], check=True)
            for name, cmd in tools.items():
                counts = _callgrind(cmd + ["--threads", "2"], d)
                p, mo, pool, lane = shares(counts)
                rows.append((gib, name, sum(counts), len(counts), p, mo, pool, lane,
                             [speedup(mo, pool, lane, n) for n in CORES]))
            if not a.no_wall:
                t = {(n, k): [] for n in tools for k in (1, 2)}
                z = {1: [], 2: []}
                for _ in range(a.reps):
                    for name, cmd in tools.items():
                        for k in (1, 2):
                            t[(name, k)].append(_wall(cmd + ["--threads", str(k)]))
                    for k in (1, 2):
                        z[k].append(_wall(["zstd", "-3", f"-T{k}", "-q", "-f", src, "-o", os.path.join(d, "z.zst")]))
                med = {k: statistics.median(v) for k, v in t.items()}
                zm = {k: statistics.median(v) for k, v in z.items()}
                walls.append((gib, med, zm, os.getloadavg()))
            for f in (src, ckz, out):
                if os.path.exists(f):
                    os.unlink(f)
        print("| GiB | tool | instructions | threads seen | p | main-only | pool | largest lane | "
              + " | ".join(f"{n} cores" for n in CORES) + " |")
        print("|---" * (8 + len(CORES)) + "|")
        for gib, name, tot, nt, p, mo, pool, lane, sp in rows:
            print(f"| {gib:g} | {name} | {tot / 1e9:.2f} G | {nt} | {p:.3f} | {mo:.3f} | {pool:.3f} | {lane:.3f} | "
                  + " | ".join(f"{s:.1f}x" for s in sp) + " |")
        for gib, med, zm, load in walls:
            print(f"\nwall, {gib:g} GiB, medians of {a.reps} paired runs, load average {load[0]:.2f} / {load[1]:.2f}:")
            for name in ("compress", "verify", "restore"):
                print(f"  {name}: {med[(name, 1)]:.3f} s at 1 thread, {med[(name, 2)]:.3f} s at 2: "
                      f"{med[(name, 1)] / med[(name, 2)]:.2f}x")
            print(f"  zstd -3: {zm[1]:.3f} s at -T1, {zm[2]:.3f} s at -T2: {zm[1] / zm[2]:.2f}x")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
