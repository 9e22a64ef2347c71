#!/bin/bash
# Folder-mode figures for docs/benchmarks.md: ckpt-compress of whole folders (made by
# scripts/fixtures/make_folders.py) against `tar -I 'zstd -3 -T0'` of the same folder, and over 1, 2
# and 4 MPI ranks (one thread each) with each rank's peak RSS (/usr/bin/time -f %M around
# every rank); every output folder is checked identical to the one-process one.
# Usage: CKPTKIT_BIN=build/apps scripts/bench/bench_folders.sh [WIDTH] [WORKDIR]
# Prints markdown table rows on stdout. Wall-clock seconds, best of one run each.
set -eu
W=${1:-4096}
T=${2:-$(mktemp -d)}
B=${CKPTKIT_BIN:?set CKPTKIT_BIN}
MPI="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPI="mpirun --allow-run-as-root --oversubscribe"
now() { date +%s.%N; }
mkdir -p "$T"
[ -d "$T/ds4" ] || /usr/bin/python3 "$(dirname "$0")/../fixtures/make_folders.py" "$T" --only ds --only hf --width "$W" --steps 3 >/dev/null
[ -d "$T/dcp_packed" ] || /usr/bin/python3 "$(dirname "$0")/../fixtures/make_folders.py" "$T" --only dcp --width "$W" --steps 3 >/dev/null
echo "| folder | input MiB | tar+zstd -3 -T0: s, MiB | ckpt-compress 1 proc (all cores): s, MiB | 1 proc --threads 1: s | mpirun -n 1 / 2 / 4, --threads 1 per rank: s | peak RSS per rank (MiB), n = 4 |"
echo "|---|---|---|---|---|---|---|"
for f in hf/checkpoint-3 ds4 dcp dcp_packed; do
  in_mib=$(du -sm --apparent-size "$T/$f" | cut -f1)
  rm -f "$T/x.tar.zst"; t0=$(now)
  tar -C "$T" -I 'zstd -3 -T0' -cf "$T/x.tar.zst" "$f"; t1=$(now)
  tar_s=$(awk "BEGIN{print $t1 - $t0}"); tar_mib=$(du -sm --apparent-size "$T/x.tar.zst" | cut -f1)
  rm -rf "$T/out"; t0=$(now)
  "$B/ckpt-compress" "$T/$f" -o "$T/out" >/dev/null; t1=$(now)
  one_s=$(awk "BEGIN{print $t1 - $t0}"); out_mib=$(du -sm --apparent-size "$T/out" | cut -f1)
  rm -rf "$T/out_t1"; t0=$(now)
  "$B/ckpt-compress" "$T/$f" -o "$T/out_t1" --threads 1 >/dev/null; t1=$(now)
  t1_s=$(awk "BEGIN{print $t1 - $t0}")
  diff -r "$T/out" "$T/out_t1" >/dev/null || { echo "output of --threads 1 differs" >&2; exit 1; }
  ranks=""
  for n in 1 2 4; do
    rm -rf "$T/out$n" "$T"/rss.*; t0=$(now)
    $MPI -n $n sh -c '/usr/bin/time -f %M -o "$0/rss.$OMPI_COMM_WORLD_RANK" "$1" "$2" -o "$3" --threads 1 >/dev/null' \
      "$T" "$B/ckpt-compress" "$T/$f" "$T/out$n"
    t1=$(now)
    diff -r "$T/out" "$T/out$n" >/dev/null || { echo "output of $n ranks differs" >&2; exit 1; }
    ranks="$ranks$(printf '%.2f' "$(awk "BEGIN{print $t1 - $t0}")") / "
    [ $n = 4 ] && rss=$(for r in 0 1 2 3; do echo $(( $(cat "$T/rss.$r") / 1024 )); done | paste -sd/ -)
  done
  printf '| %s | %s | %.2f, %s | %.2f, %s | %.2f | %s | %s |\n' "$f" "$in_mib" "$tar_s" "$tar_mib" "$one_s" "$out_mib" "$t1_s" "${ranks% / }" "$rss"
done
