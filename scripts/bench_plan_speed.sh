#!/bin/bash
# Joint-planner speed vs trace size and sweep size (docs/benchmarks.md, planner part). Usage:
#   scripts/bench_plan_speed.sh BUILD_DIR [OUT_DIR] [SIZES] [SWEEPS]
# SIZES (default "10 100 1000 10000 100000") segments of scripts/synth_trace.py
# --pattern sparse-write --segments N; SWEEPS (default "1 8 64") budgets per run, spread evenly
# strictly between the recompute-everything and the keep-everything peak of the trace.
# For each (N, M), `replay-plan T --planner joint --budget ... (M) --json --timing` and the same
# command with `--planner none` (the reference, measured in this script: parse + contracts +
# evaluation + output): CPU seconds (user + sys of the process, the machine is shared) end to
# end, and the plan phase of --timing (joint: the joint solve of all M budgets incl. finishing
# the plans), median of REPEAT (default 3) runs; joint / reference = end-to-end ratio.
# Prints a Markdown table on stdout. Environment: REPEAT, TIMEOUT_S (per run, default 120).
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
echo "| segments | budgets | reference (none) end-to-end CPU s | joint end-to-end CPU s | joint solve CPU s (plan phase) | joint load / contracts CPU s | joint / reference | < 1 s end to end |"
echo "|---|---|---|---|---|---|---|---|"
for n in $SIZES; do
  T=$OUT/sw$n.json
  [ -s "$T" ] || $PY "$ROOT/scripts/synth_trace.py" --pattern sparse-write --segments "$n" -o "$T"
  for m in $SWEEPS; do
    $PY - "$RP" "$T" "$n" "$m" "${REPEAT:-3}" "${TIMEOUT_S:-120}" <<'PYEOF'
import json, re, resource, statistics, subprocess, sys
rp, t, n, m, rep, tmo = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
def js(pl, budgets):
    a = [rp, t, "--planner", pl, "--json"]
    for b in budgets: a += ["--budget", str(b)]
    return json.loads(subprocess.run(a, capture_output=True, text=True).stdout)["budgets"]
hi = js("none", [1 << 62])[0]["peak_bytes"]
lo = js("all", [1 << 62])[0]["peak_bytes"]
budgets = [lo + (hi - lo) * (k + 1) // (m + 1) for k in range(m)]
def timed(pl):
    a = [rp, t, "--planner", pl, "--json", "--timing"]
    for b in budgets: a += ["--budget", str(b)]
    runs = []
    for _ in range(rep):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            r = subprocess.run(a, capture_output=True, text=True, timeout=tmo)
        except subprocess.TimeoutExpired:
            return None
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        ph = dict(re.findall(r"(\w+) ([0-9.]+)", r.stderr.split("timing (CPU ms):")[-1]))
        runs.append((cpu, float(ph["plan"]) / 1e3, float(ph["load"]) / 1e3, float(ph["contracts"]) / 1e3))
    return [statistics.median(x[k] for x in runs) for k in range(4)]
ref = timed("none")
jt = timed("joint")
if jt is None or ref is None:
    print(f"| {n} | {m} | {'-' if ref is None else f'{ref[0]:.3f}'} | > {tmo:.0f} (wall) | - | - | - | no |")
    sys.exit(0)
print(f"| {n} | {m} | {ref[0]:.3f} | {jt[0]:.3f} | {jt[1]:.3f} | {jt[2]:.3f} / {jt[3]:.3f} | {jt[0] / ref[0]:.2f} | {'yes' if jt[0] < 1 else 'no'} |")
PYEOF
  done
done
