#!/bin/bash
# Benchmarks for docs/replay.md (measured, not promised). Usage:
#   scripts/bench/bench_plan.sh BUILD_DIR [OUT_DIR]
# 1. per failure-pattern model: record a trace, plan at loose/medium/tight budgets with joint,
#    eager and stateless, apply every feasible plan in torch (apply_plan.py --repeat 3:
#    median step time, held bytes from saved-tensor hooks, byte-identical or not);
# 2. synthetic H100-scale sparse-write trace: joint vs eager at 44 GiB and 32 GiB, plus the
#    smallest feasible budget of each on a 0.5 GiB grid;
# 3. dense-queue: memory of selective preservation vs whole snapshot (real model trace and
#    synthetic queues), and the joint planner's choice.
# Prints Markdown tables on stdout. CPU timings: the machine is shared; ratios matter.
set -euo pipefail
BUILD=${1:?usage: bench_plan.sh BUILD_DIR [OUT_DIR]}
OUT=${2:-$(mktemp -d)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RP=$BUILD/apps/replay-plan
PY=/usr/bin/python3
mkdir -p "$OUT"

echo "## Failure-pattern models (CPU, torch $($PY -c 'import torch; print(torch.__version__)'))"
echo
echo "| model | budget | planner | feasible | predicted peak | predicted step ms | predicted held | measured held | measured step ms (ref) | byte-identical |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for m in bn dropout kvcache counter ema sparse_write dense_queue; do
  T=$OUT/$m.trace.json
  $PY "$ROOT/scripts/record_trace.py" "$ROOT/test/models/$m.py" -o "$T"
  # loose / medium / tight exactly as test/py/replay/test_replay.py chooses them
  read -r LOOSE MED TIGHT < <($PY - "$RP" "$T" <<'EOF'
import json, subprocess, sys
rp, t = sys.argv[1], sys.argv[2]
def js(args):
    return json.loads(subprocess.run([rp, t, "--json"] + args, capture_output=True, text=True).stdout)
loose = js(["--planner", "none", "--budget", str(1 << 50)])["budgets"][0]["peak_bytes"]
lo = sum(json.load(open(t))["fixed"].values())
grid = [lo + (loose - lo) * k // 200 for k in range(201)]
args = []
for b in grid: args += ["--budget", str(b)]
tight = min(b["budget_bytes"] for b in js(args)["budgets"] if b["feasible"])
print(loose, (tight + loose) // 2, tight)
EOF
)
  for pl in joint eager stateless; do
    P=$OUT/$m.$pl.plan.json
    $RP "$T" --planner $pl --budget "$LOOSE" --budget "$MED" --budget "$TIGHT" -o "$P" --force >/dev/null 2>&1 || true
    for b in "$LOOSE" "$MED" "$TIGHT"; do
      case $b in "$LOOSE") name=loose;; "$MED") name=medium;; *) name=tight;; esac
      $PY - "$ROOT" "$m" "$T" "$P" "$b" "$pl" "$name" <<'EOF'
import json, subprocess, sys
root, m, t, p, b, pl, name = sys.argv[1:]
e = [x for x in json.load(open(p))["budgets"] if x["budget_bytes"] == int(b)][0]
kib = lambda v: f"{v / 1024:.1f} KiB"
if not e["feasible"]:
    print(f"| {m} | {name} {kib(int(b))} | {pl} | OOM | - | - | - | - | - | - |")
    sys.exit(0)
r = subprocess.run(["/usr/bin/python3", f"{root}/scripts/apply_plan.py", f"{root}/test/models/{m}.py",
                    t, p, "--budget", b, "--repeat", "3", "--json"], capture_output=True, text=True)
a = json.loads(r.stdout.splitlines()[0])
ident = "yes" if a["identical"] else "**no**"
if a["step_ms_plan"] is None:   # the recomputed step raised (e.g. a doubled KV cache)
    ident = "**no** (step raised)"
safe = "" if e["safe"] else " (unsafe)"
print(f"| {m} | {name} {kib(int(b))} | {pl}{safe} | yes | {kib(e['peak_bytes'])} | {e['step_time_ms']:.2f} | "
      f"{kib(a['predicted_held_bytes'])} | {kib(a['held_bytes_plan']) if a['held_bytes_plan'] else '-'} | "
      f"{a['step_ms_plan'] or 0:.2f} ({a['step_ms_reference']:.2f}) | {ident} |")
EOF
    done
  done
done

echo
echo "## Synthetic H100-scale sparse-write trace (scripts/fixtures/synth_trace.py --pattern sparse-write)"
echo
S=$OUT/synth_sparse.json
$PY "$ROOT/scripts/fixtures/synth_trace.py" --pattern sparse-write -o "$S"
$PY - "$RP" "$S" <<'EOF'
import json, subprocess, sys
rp, s = sys.argv[1], sys.argv[2]
G = 1 << 30
def plan(pl, budgets):
    args = [rp, s, "--planner", pl, "--json"]
    for b in budgets: args += ["--budget", str(b)]
    return json.loads(subprocess.run(args, capture_output=True, text=True).stdout)["budgets"]
print("| budget | joint step ms | eager step ms | joint vs eager | joint decisions | eager decisions |")
print("|---|---|---|---|---|---|")
for gib in (44, 32):
    j, e = plan("joint", [gib * G])[0], plan("eager", [gib * G])[0]
    fmt = lambda x: f"{x['step_time_ms']:.1f}" if x["feasible"] else "OOM"
    cmp = f"{(1 - j['step_time_ms'] / e['step_time_ms']) * 100:.2f}% lower" if j["feasible"] and e["feasible"] else "-"
    dec = lambda x: ", ".join(f"{k} {v}" for k, v in x["decisions"].items() if v) if x["feasible"] else "-"
    print(f"| {gib} GiB | {fmt(j)} | {fmt(e)} | {cmp} | {dec(j)} | {dec(e)} |")
grid = [int(g * 2 * G) // 2 for g in [x / 2 for x in range(40, 141)]]
for pl in ("joint", "eager", "stateless"):
    ok = [b["budget_bytes"] for b in plan(pl, grid) if b["feasible"]]
    print(f"\nsmallest feasible budget on a 0.5 GiB grid, {pl}: {min(ok) / G:.1f} GiB" if ok else f"\n{pl}: never feasible")
EOF

echo
echo "## Dense-queue: selective preservation vs whole snapshot"
echo
echo "| trace | queue bytes | snapshot preserved | selective preserved | selective overhead | joint picks |"
echo "|---|---|---|---|---|---|"
for spec in "real:$OUT/dense_queue.trace.json" "synth-64-56:64:56" "synth-32-24:32:24" "synth-64-64:64:64"; do
  name=${spec%%:*}
  if [ "$name" = real ]; then T=${spec#real:}; else
    IFS=: read -r _ row field <<<"$spec"
    T=$OUT/$name.json
    $PY "$ROOT/scripts/fixtures/synth_trace.py" --pattern dense-queue --row-bytes "$row" --field-bytes "$field" -o "$T"
  fi
  P=$OUT/$name.plan.json
  $RP "$T" --planner all --budget 1000TiB -o "$P" >/dev/null 2>&1 || true
  $PY - "$RP" "$T" "$P" "$name" <<'EOF'
import json, subprocess, sys
rp, t, p, name = sys.argv[1:]
tr = json.load(open(t))
segs = json.load(open(p))["budgets"][0]["segments"]
q = next(s for s in segs if "recompute+selective" in s["options"])
snap = q["options"]["recompute+snapshot"]["preserved_bytes"]
sel = q["options"]["recompute+selective"]["preserved_bytes"]
qbytes = next(b["bytes"] for b in tr["buffers"] if b["id"].endswith("queue"))
# the joint planner's choice for this segment at the tightest feasible budget on a 200-point grid
none = json.loads(subprocess.run([rp, t, "--planner", "none", "--budget", str(1 << 62), "--json"], capture_output=True, text=True).stdout)["budgets"][0]["peak_bytes"]
lo = sum(tr["fixed"].values()) + sum(b["bytes"] for b in tr["buffers"])
args = [rp, t, "--json"]
for k in range(201): args += ["--budget", str(lo + (none - lo) * k // 200)]
ok = [b for b in json.loads(subprocess.run(args, capture_output=True, text=True).stdout)["budgets"] if b["feasible"]]
d = ok[0]["decisions"] if ok else {}
pick = "snapshot" if d.get("recompute+snapshot") else ("selective" if d.get("recompute+selective") else "keep")
print(f"| {name} | {qbytes} | {snap} | {sel} | {(sel / snap - 1) * 100:+.2f}% | {pick} |")
EOF
done
