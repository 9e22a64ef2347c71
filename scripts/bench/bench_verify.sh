#!/bin/bash
# ckpt-verify (with and without --original) and ckpt-restore against ckpt-compress on the
# same generated checkpoint, CPU seconds (user + sys) at --threads 1, as ratios in one run.
# Usage: scripts/bench/bench_verify.sh [GIB=0.25] [REPS=1]   (needs build/apps and /usr/bin/time)
set -euo pipefail
cd "$(dirname "$0")/../.."
GIB=${1:-0.25}; REPS=${2:-1}
B=${CKPTKIT_BIN:-build/apps}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
/usr/bin/python3 scripts/fixtures/gen_checkpoint.py --gib "$GIB" -o "$W/ck.pt" >/dev/null
cpu() {  # cpu LABEL CMD...: best CPU seconds over REPS runs
  shift; local best=""
  for _ in $(seq "$REPS"); do
    /usr/bin/time -f "%U %S" -o "$W/t" "$@" >/dev/null 2>&1
    local s; s=$(awk '{print $1 + $2}' "$W/t")
    if [ -z "$best" ] || awk "BEGIN{exit !($s < $best)}"; then best=$s; fi
  done
  echo "$best"
}
c=$(cpu compress "$B/ckpt-compress" "$W/ck.pt" -o "$W/ck.h5" --force --threads 1)
v=$(cpu verify "$B/ckpt-verify" "$W/ck.h5" --threads 1)
vo=$(cpu verify-original "$B/ckpt-verify" "$W/ck.h5" --original "$W/ck.pt" --threads 1)
r=$(cpu restore "$B/ckpt-restore" "$W/ck.h5" -o "$W/r.pt" --force --threads 1)
echo "| job | CPU s | ratio |"
echo "|---|---|---|"
awk -v c="$c" -v v="$v" -v vo="$vo" -v r="$r" 'BEGIN{
  printf "| ckpt-compress | %.2f | 1.00 x compress |\n", c;
  printf "| ckpt-verify | %.2f | %.2f x restore |\n", v, v / r;
  printf "| ckpt-verify --original | %.2f | %.2f x compress |\n", vo, vo / c;
  printf "| ckpt-restore | %.2f | %.2f x compress |\n", r, r / c }'
