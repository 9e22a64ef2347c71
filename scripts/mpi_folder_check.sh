#!/bin/sh
# CTest mpi_folder: `mpirun -n 3` folder mode on a real 4-rank DeepSpeed folder
# (scripts/make_folders.py) gives the same output folder, byte for byte, as one process, for
# compress and for restore; and one bad shard makes every rank exit non-zero naming it, with
# no output folder left. Exit 77 (CTest skip) when mpirun or the MPI build is absent.
# Usage: CKPTKIT_BIN=build/apps scripts/mpi_folder_check.sh [RANKS]
set -eu
RANKS=${1:-3}
B=${CKPTKIT_BIN:?set CKPTKIT_BIN to the folder holding ckpt-compress}
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
"$B/ckpt-compress" --help | grep -q mpirun || { echo "built without MPI (CKPTKIT_MPI): skipped"; exit 77; }
MPIRUN="mpirun --oversubscribe -n $RANKS"
[ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe -n $RANKS"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
/usr/bin/python3 "$(dirname "$0")/make_folders.py" "$T" --only ds >/dev/null
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
echo "mpi_folder: $RANKS ranks == 1 process (compress, restore); a bad shard fails every rank, nothing left"
