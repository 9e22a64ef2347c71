#!/bin/bash
# Bounded memory (docs/design.md §6): compress, verify and restore a big checkpoint under
# /usr/bin/time -v and fail when any tool's peak RSS reaches the limit.
#
#   scripts/ci/rss_check.sh [GIB]        (default 4; env CKPTKIT_BIN = folder with the tools,
#                                      default build/apps; RSS_LIMIT_MIB default 1024;
#                                      WORKDIR default a fresh mktemp -d, removed afterwards)
#
# The checkpoint is written by scripts/fixtures/gen_checkpoint.py (streaming, never in memory;
# moments shaped like a trained LM's). Needs about 3.5 x GIB of free disk: with less, it
# says so and exits 77 (CTest: skipped). Prints one line per tool and a summary; exit 0 when all
# three tools exit 0, restore is byte-identical outside the moments (same size) and every peak
# RSS < limit; exit 1 otherwise.
set -euo pipefail
GIB=${1:-4}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CKPTKIT_BIN:-$ROOT/build/apps}
LIMIT_MIB=${RSS_LIMIT_MIB:-1024}
PY=/usr/bin/python3
for t in ckpt-compress ckpt-verify ckpt-restore; do
  [ -x "$BIN/$t" ] || { echo "rss_check: $BIN/$t missing (set CKPTKIT_BIN)" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "rss_check: /usr/bin/time missing (apt-get install time)" >&2; exit 1; }
if [ -n "${WORKDIR:-}" ]; then W=$WORKDIR; mkdir -p "$W"; KEEP=1; else W=$(mktemp -d /tmp/ckpt_rss.XXXXXX); KEEP=0; fi
cleanup() { [ "$KEEP" = 1 ] || rm -rf "$W"; }
trap cleanup EXIT

need_kib=$(awk -v g="$GIB" 'BEGIN {printf "%d", g * 3.5 * 1048576}')
free_kib=$(df -Pk "$W" | awk 'NR == 2 {print $4}')
if [ "$free_kib" -lt "$need_kib" ]; then
  echo "rss_check: SKIP: $W has $(( free_kib / 1048576 )) GiB free, needs $(( need_kib / 1048576 )) GiB" >&2
  exit 77
fi
BIG=$W/big.pt
if [ ! -s "$BIG" ] || [ "$KEEP" = 0 ]; then
  t0=$(date +%s)
  $PY "$ROOT/scripts/fixtures/gen_checkpoint.py" --gib "$GIB" -o "$BIG"
  echo "rss_check: generated in $(( $(date +%s) - t0 )) s"
fi
SIZE=$(stat -c %s "$BIG")

fail=0
measure() {  # name, command...
  local name=$1; shift
  local log=$W/$name.time
  local t0 rc=0
  t0=$(date +%s.%N)
  /usr/bin/time -v -o "$log" "$@" > "$W/$name.out" 2> "$W/$name.err" || rc=$?
  local secs kib mib
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
  kib=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$log")
  mib=$(( kib / 1024 ))
  printf 'rss_check: %-8s exit %d  peak RSS %5d MiB  %6.1f s\n' "$name" "$rc" "$mib" "$secs"
  if [ "$rc" != 0 ]; then echo "rss_check: $name failed:"; tail -5 "$W/$name.err"; fail=1; fi
  if [ "$mib" -ge "$LIMIT_MIB" ]; then echo "rss_check: $name peak RSS $mib MiB >= $LIMIT_MIB MiB"; fail=1; fi
}

measure compress "$BIN/ckpt-compress" "$BIG" -o "$W/big.ckz.h5" --json --force
measure verify "$BIN/ckpt-verify" "$W/big.ckz.h5" --json
measure restore "$BIN/ckpt-restore" "$W/big.ckz.h5" -o "$W/restored.pt" --json --force
if [ -f "$W/restored.pt" ]; then
  RS=$(stat -c %s "$W/restored.pt")
  if [ "$RS" != "$SIZE" ]; then echo "rss_check: restored size $RS != $SIZE"; fail=1; fi
fi
CS=$(stat -c %s "$W/big.ckz.h5" 2>/dev/null || echo 0)
echo "rss_check: input $SIZE bytes ($(awk -v s="$SIZE" 'BEGIN {printf "%.2f", s / 1073741824}') GiB), container $CS bytes, limit $LIMIT_MIB MiB"
if [ "$fail" = 0 ]; then echo "rss_check: PASS"; else echo "rss_check: FAIL"; fi
exit $fail
