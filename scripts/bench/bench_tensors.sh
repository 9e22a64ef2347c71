#!/bin/bash
# ckpt-compress cost against tensor count: generated checkpoints (scripts/fixtures/gen_checkpoint.py)
# of 64-value tensors, N and 4N tensors, and 10^5 tensors; CPU seconds (user + sys) at
# --threads 1, CPU ns per moment value, peak RSS, and the 4N / N ratio (linear: 4.0).
# Usage: scripts/bench/bench_tensors.sh [N=6000]   (needs build/apps and /usr/bin/time)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-6000}
B=${CKPTKIT_BIN:-build/apps}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
gib() { awk -v n="$1" 'BEGIN { printf "%.6f", n * 3 * 64 * 4 / 2^30 }'; }  # weight + 2 moments
echo "| tensors | moment values | CPU s | ns / value | peak RSS MiB |"
echo "|---|---|---|---|---|"
declare -A cpu
for n in "$N" $((4 * N)) 100000; do
  /usr/bin/python3 scripts/fixtures/gen_checkpoint.py --gib "$(gib "$n")" --numel-per-tensor 64 -o "$W/t.pt" >/dev/null
  /usr/bin/time -f "%U %S %M" -o "$W/time" "$B/ckpt-compress" "$W/t.pt" -o "$W/t.h5" --force --threads 1 >/dev/null
  read -r u s m < "$W/time"
  values=$("$B/ckpt-verify" "$W/t.h5" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["moment_values"])')
  tensors=$((values / 128))
  cpu[$n]=$(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }')
  awk -v t="$tensors" -v v="$values" -v c="${cpu[$n]}" -v m="$m" \
    'BEGIN { printf "| %d | %d | %.2f | %.0f | %.0f |\n", t, v, c, 1e9 * c / v, m / 1024 }'
  rm -f "$W/t.pt" "$W/t.h5"
done
awk -v a="${cpu[$N]}" -v b="${cpu[$((4 * N))]}" 'BEGIN { printf "\n4x the tensors: %.2fx the CPU time (linear: 4.00; target <= 4.40)\n", b / a }'
