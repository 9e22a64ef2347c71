#!/bin/bash
# Issue 15's speed targets on real checkpoints, as ratios of CPU seconds (user + sys) in one
# run, --threads 1: compress / `zstd -3 -T1` of the raw FP32 moments; restore / (`zstd -d
# -T1` of them + `cp` of a file as large as the other bytes); verify / restore; verify
# --original / compress. Each command runs REPS times, interleaved with the others (a drift
# of the machine's speed hits all alike), and the median is taken. Below the table, one line
# per checkpoint: compress's and restore's ratios of user seconds alone, and the system
# seconds (median total - median user) of each.
# Every command runs pinned to one CPU (CKPTKIT_BENCH_CPU, default 0): on a VM one virtual
# CPU can run 30% slower than the other for minutes (host contention; measured 2026-12-04),
# and unpinned commands land on either, which skews a ratio of two of them either way.
# Usage: scripts/bench/bench_ratios.sh [REPS=7] CKPT...   (default CKPTs: the two cached bench
# models, scripts/bench/train_bench_models.py); needs build/apps (or CKPTKIT_BIN), zstd, taskset, /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=7
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then REPS=$1; shift; fi
B=${CKPTKIT_BIN:-build/apps}
CPU=${CKPTKIT_BENCH_CPU:-0}
CACHE=${CKPTKIT_BENCH_DIR:-$HOME/.cache/ckptkit-bench}
[ $# -gt 0 ] || set -- "$CACHE/lm10m_adamw.pt" "$CACHE/resnet18_adamw.pt"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
# warm: fill and free WARM_MIB of tmpfs (untimed), so that every command finds free pages
# the host backs. On a VM with free page reporting (virtio-balloon: /sys/module/page_reporting)
# the host takes back pages the guest left free for ~2 s, and whichever command touches them
# first pays their refault as system time: 0.2-1.5 s per GiB written, measured 2026-12-04,
# landing on one command or the other by chance.
WARM_MIB=$(awk '/MemAvailable/ {m = int($2 / 1024 / 4); print (m < 2048 ? m : 2048)}' /proc/meminfo)
warm() {
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    dd if=/dev/zero of=/dev/shm/ckptkit-bench-warm bs=1M count="$WARM_MIB" status=none 2>/dev/null || true
    rm -f /dev/shm/ckptkit-bench-warm
  fi
}
cpu() {  # cpu CMD...: CPU seconds of one run (after a sync: no run pays for another's writeback)
  sync
  warm
  # user and system seconds of the command from getrusage (microseconds; /usr/bin/time
  # prints hundredths, too coarse for the 0.15 s restores of the bench models)
  /usr/bin/python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write("%.6f %.6f\n" % (u.ru_utime, u.ru_stime))' "$W/t" taskset -c "$CPU" "$@"
  awk '{print $1 + $2}' "$W/t"
  awk '{print $1}' "$W/t" >> "$W/user"   # (the user part alone, for the second table)
}
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "| checkpoint | compress / zstd -3 | restore / (zstd -d + cp) | verify / restore | verify --original / compress | compress s | restore s | verify s | verify --original s |"
echo "|---|---|---|---|---|---|---|---|---|"
for ck in "$@"; do
  /usr/bin/python3 scripts/bench/bench_moments.py "$ck" "$W/m.raw" >/dev/null
  other=$(( $(stat -c %s "$ck") - $(stat -c %s "$W/m.raw") ))
  head -c "$other" /dev/zero > "$W/other.bin"
  zstd -3 -T1 -q -f "$W/m.raw" -o "$W/m.zst"
  "$B/ckpt-compress" "$ck" -o "$W/c.h5" --force --threads 1 >/dev/null
  : > "$W/c" ; : > "$W/z" ; : > "$W/r" ; : > "$W/d" ; : > "$W/v" ; : > "$W/o"
  : > "$W/cu" ; : > "$W/zu" ; : > "$W/ru" ; : > "$W/du"
  for _ in $(seq "$REPS"); do
    # each output is removed (untimed) before the command that writes it: overwriting it
    # instead favours a tool that truncates (it refills the page-cache pages it just freed)
    # over one that writes a temporary and renames (ours: fresh pages, which on a VM with
    # free page reporting the host may have to fault in again; measured 2026-12-04)
    rm -f "$W/c2.h5"; cpu "$B/ckpt-compress" "$ck" -o "$W/c2.h5" --threads 1 >> "$W/c"; tail -1 "$W/user" >> "$W/cu"
    rm -f "$W/z.zst"; cpu zstd -3 -T1 -q -f "$W/m.raw" -o "$W/z.zst" >> "$W/z"; tail -1 "$W/user" >> "$W/zu"
    rm -f "$W/r.pt"; cpu "$B/ckpt-restore" "$W/c.h5" -o "$W/r.pt" --threads 1 >> "$W/r"; tail -1 "$W/user" >> "$W/ru"
    rm -f "$W"/d.*; cpu sh -c "zstd -d -T1 -q -f '$W/m.zst' -o '$W/d.raw' && cp '$W/other.bin' '$W/d.other'" >> "$W/d"; tail -1 "$W/user" >> "$W/du"
    cpu "$B/ckpt-verify" "$W/c.h5" --threads 1 >> "$W/v"
    cpu "$B/ckpt-verify" "$W/c.h5" --original "$ck" --threads 1 >> "$W/o"
  done
  c=$(median < "$W/c"); z=$(median < "$W/z"); r=$(median < "$W/r"); d=$(median < "$W/d")
  v=$(median < "$W/v"); o=$(median < "$W/o")
  awk -v n="$(basename "$ck")" -v c="$c" -v z="$z" -v r="$r" -v d="$d" -v v="$v" -v o="$o" '
    function ratio(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "n/a (too fast to time)" }
    BEGIN { printf "| `%s` | %s | %s | %s | %s | %.3f | %.3f | %.3f | %.3f |\n", n, ratio(c, z), ratio(r, d), ratio(v, r), ratio(o, c), c, r, v, o }'
  # user seconds alone: the system part (page cache, page faults, fsync) swings from run to
  # run on a VM (docs/history/benchmarks-rounds.md, round 17), the user part is the tools' own work
  awk -v n="$(basename "$ck")" -v c="$(median < "$W/cu")" -v z="$(median < "$W/zu")" -v r="$(median < "$W/ru")" \
      -v d="$(median < "$W/du")" -v ca="$c" -v za="$z" -v ra="$r" -v da="$d" '
    function ratio(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "n/a" }
    BEGIN { printf "user %s: compress / zstd -3 %s; restore / (zstd -d + cp) %s; system s (approx.): compress %.2f, zstd -3 %.2f, restore %.2f, zstd -d + cp %.2f\n",
            n, ratio(c, z), ratio(r, d), ca - c, za - z, ra - r, da - d }' >> "$W/users"
  rm -f "$W"/*.h5 "$W"/*.pt "$W"/*.raw "$W"/*.zst "$W"/d.* "$W/other.bin"
done
echo
cat "$W/users"
echo
echo "Targets: compress <= 1.0x zstd -3; restore <= 1.0x (zstd -d + cp); verify <= 1.5x restore; verify --original <= 3x compress."
