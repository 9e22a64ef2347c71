#!/bin/sh
# CTest mpi_folder: `mpirun -n 3` folder mode on real DCP folders and a real 4-rank DeepSpeed folder
# (scripts/fixtures/make_folders.py) gives the same output folder, byte for byte, as one process, for
# compress and for restore; and one bad shard makes every rank exit non-zero naming it, with
# no output folder left; a rank SIGKILL-ed mid-run leaves no output folder, or the previous
# one whole. Exit 77 (CTest skip) when mpirun or the MPI build is absent.
# Usage: CKPTKIT_BIN=build/apps scripts/ci/mpi_folder_check.sh [RANKS]
set -eu
RANKS=${1:-3}
B=${CKPTKIT_BIN:?set CKPTKIT_BIN to the folder holding ckpt-compress}
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
"$B/ckpt-compress" --help | grep -q mpirun || { echo "built without MPI (CKPTKIT_MPI): skipped"; exit 77; }
# Under the sanitizer stage (ASAN_OPTIONS set, scripts/ci/test_sanitize.sh) the ranks run without
# leak detection: Open MPI's dlopened components leave allocations at MPI_Finalize whose frames
# name no module, so LSan suppressions cannot match them. The one-process runs still check leaks.
MPIRUN="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 mpirun --oversubscribe -n $RANKS"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
/usr/bin/python3 "$(dirname "$0")/../fixtures/make_folders.py" "$T" --only ds --only dcp >/dev/null
for d in dcp dcp_packed dcp_sharded; do   # DCP: the gathered moments and shells, one unit per folder
  "$B/ckpt-compress" "$T/$d" -o "$T/$d.one" >/dev/null
  $MPIRUN "$B/ckpt-compress" "$T/$d" -o "$T/$d.many" >/dev/null
  diff -r "$T/$d.one" "$T/$d.many"
  "$B/ckpt-compress" "$T/$d" -o "$T/$d.one0" --dcp-unit-mib 0 >/dev/null   # many units, shared among ranks
  $MPIRUN "$B/ckpt-compress" "$T/$d" -o "$T/$d.many0" --dcp-unit-mib 0 >/dev/null
  diff -r "$T/$d.one0" "$T/$d.many0"
  $MPIRUN "$B/ckpt-restore" "$T/$d.many" -o "$T/$d.back" >/dev/null
  "$B/ckpt-restore" "$T/$d.one" -o "$T/$d.back1" >/dev/null
  diff -r "$T/$d.back" "$T/$d.back1"
done
"$B/ckpt-compress" "$T/ds4" -o "$T/one" --json >"$T/one.json"
$MPIRUN "$B/ckpt-compress" "$T/ds4" -o "$T/many" --json >"$T/many.json"
diff -r "$T/one" "$T/many"
grep -q '"ranks":3' "$T/many.json" || grep -q "\"ranks\":$RANKS" "$T/many.json"
$MPIRUN "$B/ckpt-verify" "$T/many" --original "$T/ds4" >/dev/null
"$B/ckpt-restore" "$T/one" -o "$T/back1" >/dev/null
$MPIRUN "$B/ckpt-restore" "$T/many" -o "$T/backn" >/dev/null
diff -r "$T/back1" "$T/backn"
cp -r "$T/ds4" "$T/bad"
truncate -s 4000 "$T/bad/global_step5/zero_pp_rank_2_mp_rank_00_optim_states.pt"
if $MPIRUN "$B/ckpt-compress" "$T/bad" -o "$T/bad_out" >"$T/bad.out" 2>"$T/bad.err"; then
  echo "FAIL: a bad shard did not fail the MPI run"; exit 1
fi
n=$(grep -c "ckpt-compress: error: .*zero_pp_rank_2_mp_rank_00_optim_states.pt" "$T/bad.err" || true)
[ "$n" = "$RANKS" ] || { echo "FAIL: $n of $RANKS ranks named the bad shard"; cat "$T/bad.err"; exit 1; }
[ ! -e "$T/bad_out" ] || { echo "FAIL: partial output folder left"; exit 1; }
ls -a "$T" | grep -q '^\.bad_out\.tmp' && { echo "FAIL: temporary folder left"; exit 1; }
# SIGKILL one rank mid-run (a larger folder, one thread a rank, killed as soon as the
# temporary folder appears: each rank's share takes ~0.2 s, and a rank killed after it had
# finished let the run commit): mpirun ends the others; no output folder is left, and with
# --force the previous one stays whole.
/usr/bin/python3 "$(dirname "$0")/../fixtures/make_folders.py" "$T/big" --only ds --width 2048 --steps 2 >/dev/null
for existing in no yes; do
  force=""
  if [ $existing = yes ]; then "$B/ckpt-compress" "$T/big/ds4" -o "$T/kill_out" >/dev/null; force=--force; fi
  [ $existing = yes ] && cp "$T/kill_out/ckptkit-folder.json" "$T/before.json"
  rm -rf "$T"/.kill_out.tmp-*   # what the killed run of the first round left
  $MPIRUN "$B/ckpt-compress" "$T/big/ds4" -o "$T/kill_out" $force --threads 1 >/dev/null 2>&1 &
  mp=$!
  i=0
  while ! ls -a "$T" | grep -q '^\.kill_out\.tmp-' && [ $i -lt 3000 ]; do sleep 0.01; i=$((i + 1)); done
  victim=""
  for p in $(ps -o pid= --ppid $mp); do
    [ "$(ps -o comm= -p "$p")" = ckpt-compress ] && victim=$p
  done
  [ -n "$victim" ] || { echo "FAIL: the run ended before a rank could be killed"; exit 1; }
  kill -9 "$victim"
  wait $mp && { echo "FAIL: mpirun exited 0 after a rank was killed"; exit 1; }
  if [ $existing = yes ]; then
    cmp "$T/before.json" "$T/kill_out/ckptkit-folder.json" || { echo "FAIL: previous output changed"; exit 1; }
    "$B/ckpt-verify" "$T/kill_out" >/dev/null || { echo "FAIL: previous output no longer verifies"; exit 1; }
  else
    [ ! -e "$T/kill_out" ] || { echo "FAIL: output folder left after a rank was killed"; exit 1; }
  fi
done
echo "mpi_folder: $RANKS ranks == 1 process (compress, restore); a bad shard fails every rank, nothing left;"
echo "  a rank killed mid-run leaves no output folder, or the previous one whole"
