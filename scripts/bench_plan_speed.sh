#!/bin/bash
# Joint-planner solve time vs trace size and sweep size (docs/benchmarks_planner.md). Usage:
#   scripts/bench_plan_speed.sh BUILD_DIR [OUT_DIR] [SIZES] [SWEEPS]
# SIZES (default "10 100 1000 10000 100000") segments of scripts/synth_trace.py
# --pattern sparse-write --segments N; SWEEPS (default "1 8 64") budgets per run, spread evenly
# strictly between the recompute-everything peak and the keep-everything peak of the trace.
# For each (N, M): wall time of `replay-plan T --planner joint --budget ... (M) --json` and of
# the same command with `--planner none` (parse + contracts + output: the reference), median
# of REPEAT (default 3) runs; planner time = joint - none. Prints a Markdown table on stdout.
# Environment: REPEAT, TIMEOUT_S (per run, default 120; a run past it is reported as "> T s").
set -euo pipefail
BUILD=${1:?usage: bench_plan_speed.sh BUILD_DIR [OUT_DIR] [SIZES] [SWEEPS]}
OUT=${2:-$(mktemp -d)}
SIZES=${3:-"10 100 1000 10000 100000"}
SWEEPS=${4:-"1 8 64"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RP=$(cd "$BUILD" && pwd)/apps/replay-plan
PY=/usr/bin/python3
mkdir -p "$OUT"
echo "machine: $(nproc) CPUs, $(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
echo
echo "| segments | budgets | reference (none) s | joint s | planner s (joint - none) | planner ms per budget | joint / reference |"
echo "|---|---|---|---|---|---|---|"
for n in $SIZES; do
  T=$OUT/sw$n.json
  [ -s "$T" ] || $PY "$ROOT/scripts/synth_trace.py" --pattern sparse-write --segments "$n" -o "$T"
  for m in $SWEEPS; do
    $PY - "$RP" "$T" "$n" "$m" "${REPEAT:-3}" "${TIMEOUT_S:-120}" <<'PYEOF'
import json, statistics, subprocess, sys, time
rp, t, n, m, rep, tmo = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
def js(pl, budgets):
    a = [rp, t, "--planner", pl, "--json"]
    for b in budgets: a += ["--budget", str(b)]
    return json.loads(subprocess.run(a, capture_output=True, text=True).stdout)["budgets"]
hi = js("none", [1 << 62])[0]["peak_bytes"]
lo = js("all", [1 << 62])[0]["peak_bytes"]
budgets = [lo + (hi - lo) * (k + 1) // (m + 1) for k in range(m)]
def timed(pl):
    a = [rp, t, "--planner", pl, "--json"]
    for b in budgets: a += ["--budget", str(b)]
    ts, out = [], None
    for _ in range(rep):
        t0 = time.perf_counter()
        try:
            r = subprocess.run(a, capture_output=True, text=True, timeout=tmo)
        except subprocess.TimeoutExpired:
            return None, None
        ts.append(time.perf_counter() - t0)
        out = r.stdout
    return statistics.median(ts), json.loads(out)["budgets"] if out.strip() else None
ref, _ = timed("none")
jt, res = timed("joint")
if jt is None:
    print(f"| {n} | {m} | {ref:.3f} | > {tmo:.0f} | > {tmo - ref:.0f} | - | - |")
    sys.exit(0)
pt = max(0.0, jt - ref)
print(f"| {n} | {m} | {ref:.3f} | {jt:.3f} | {pt:.3f} | {pt / m * 1e3:.2f} | {jt / ref:.2f} |")
PYEOF
  done
done
