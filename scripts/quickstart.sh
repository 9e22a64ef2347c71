#!/bin/sh
# Install, build, then run the main job on the bundled real checkpoint and trace:
# compress -> verify -> restore -> one real torch optimizer step against the original,
# then a replay-plan sweep on a recorded training-step trace.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
B=build/apps
OUT=${OUT:-out}
mkdir -p "$OUT"
CKPT=data/lm_adamw.pt
echo "== ckpt-compress $CKPT"
$B/ckpt-compress "$CKPT" -o "$OUT/lm_adamw.ckz.h5" --tolerance 0.01 --grad-bound 1.0
echo "== ckpt-verify (with the original)"
$B/ckpt-verify "$OUT/lm_adamw.ckz.h5" --original "$CKPT"
echo "== ckpt-restore"
$B/ckpt-restore "$OUT/lm_adamw.ckz.h5" -o "$OUT/lm_adamw.restored.pt"
echo "== stock torch: load, load_state_dict, one optimizer.step() per gradient kind"
/usr/bin/python3 scripts/torch_step_check.py "$CKPT" "$OUT/lm_adamw.restored.pt" --tolerance 0.01 --grad-bound 1.0
TRACE=$(ls data/traces/*.json 2>/dev/null | head -1 || true)
if [ -n "$TRACE" ]; then
  echo "== replay-plan $TRACE"
  $B/replay-plan "$TRACE" --sweep 1MiB:64MiB:8MiB -o "$OUT/plan.json" --svg "$OUT/plan.svg" || true
fi
