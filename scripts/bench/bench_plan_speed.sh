#!/bin/bash
# Planner speed (and peak RSS) vs trace size and sweep size (docs/benchmarks.md, planner part). Usage:
#   scripts/bench/bench_plan_speed.sh BUILD_DIR [OUT_DIR] [SIZES] [SWEEPS]
# SIZES (default "10 100 1000 10000 100000") segments of scripts/fixtures/synth_trace.py
# --pattern sparse-write --segments N; SWEEPS (default "1 8 64") budgets per run, spread evenly
# strictly between the recompute-everything and the keep-everything peak of the trace.
# For each (N, M), `replay-plan T --planner joint --budget ... (M) --json --timing` and the same
# command with `--planner none` (the reference, measured in this script: parse + contracts +
# evaluation + output): CPU seconds (user + sys of the process, the machine is shared) end to
# end, and the plan phase of --timing (joint: the joint solve of all M budgets incl. finishing
# the plans), median of REPEAT (default 3) runs; joint / reference = end-to-end ratio.
# Prints a Markdown table on stdout. Environment: REPEAT, TIMEOUT_S (per run, default 120),
# PLANNERS (default "joint"; e.g. "joint eager stateless all none": one row per planner, each
# with its peak RSS, max over the repeats, from wait4).
set -euo pipefail
BUILD=${1:?usage: bench_plan_speed.sh BUILD_DIR [OUT_DIR] [SIZES] [SWEEPS]}
OUT=${2:-$(mktemp -d)}
SIZES=${3:-"10 100 1000 10000 100000"}
SWEEPS=${4:-"1 8 64"}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RP=$(cd "$BUILD" && pwd)/apps/replay-plan
PY=/usr/bin/python3
mkdir -p "$OUT"
echo "machine: $(nproc) CPUs, $(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
echo
echo "| segments | budgets | planner | reference (none) end-to-end CPU s | end-to-end CPU s | solve CPU s (plan phase) | load / contracts CPU s | / reference | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in $SIZES; do
  T=$OUT/sw$n.json
  [ -s "$T" ] || $PY "$ROOT/scripts/fixtures/synth_trace.py" --pattern sparse-write --segments "$n" -o "$T"
  for m in $SWEEPS; do
    $PY - "$RP" "$T" "$n" "$m" "${REPEAT:-3}" "${TIMEOUT_S:-120}" "${PLANNERS:-joint}" <<'PYEOF'
import json, os, re, statistics, subprocess, sys, time
rp, t, n, m, rep, tmo = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
planners = sys.argv[7].split()
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
        pr = subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while True:   # wait4 gives this child's own CPU time and peak RSS
            pid, status, ru = os.wait4(pr.pid, os.WNOHANG)
            if pid:
                break
            if time.time() - t0 > tmo:
                pr.kill()
                os.wait4(pr.pid, 0)
                return None
            time.sleep(0.02)
        err = pr.stderr.read()
        cpu = ru.ru_utime + ru.ru_stime
        ph = dict(re.findall(r"(\w+) ([0-9.]+)", err.split("timing (CPU ms):")[-1]))
        runs.append((cpu, float(ph["plan"]) / 1e3, float(ph["load"]) / 1e3, float(ph["contracts"]) / 1e3, ru.ru_maxrss / 1024))
    return [statistics.median(x[k] for x in runs) for k in range(4)] + [max(x[4] for x in runs)]
ref = timed("none")
for pl in planners:
    jt = timed(pl)
    if jt is None or ref is None:
        print(f"| {n} | {m} | {pl} | {'-' if ref is None else f'{ref[0]:.3f}'} | > {tmo:.0f} (wall) | - | - | - | - |")
        continue
    print(f"| {n} | {m} | {pl} | {ref[0]:.3f} | {jt[0]:.3f} | {jt[1]:.3f} | {jt[2]:.3f} / {jt[3]:.3f} | {jt[0] / ref[0]:.2f} | {jt[4]:.0f} |")
PYEOF
  done
done
