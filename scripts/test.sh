#!/bin/bash
# The whole test suite, in three stages (CI runs this through .ci/run):
#  1. install packages (and .venv, the torch 2.13 line: scripts/requirements.txt), build
#     (build/), run every doctest unit, the fuzz regression replays and the real-torch pytest
#     round trips under Debian's torch 1.13 and under torch 2.13 (*_torch2) through CTest;
#  2. scripts/ci/test_sanitize.sh: the same CTest suite built with ASan + UBSan (build-asan);
#  3. scripts/ci/fuzz.sh FUZZ_SECONDS (default 60) for every libFuzzer target (build-fuzz).
# Every stage runs; the exit status is non-zero when any failed. Stage times are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
declare -a names=() results=() times=()
stage() {  # stage NAME CMD...: run, record exit status and seconds
  local name=$1 t0 rc
  shift
  echo "=== test.sh: $name" >&2
  t0=$(date +%s)
  "$@"
  rc=$?
  names+=("$name"); results+=("$rc"); times+=("$(( $(date +%s) - t0 ))")
}
stage "build + ctest" sh -c 'scripts/build.sh && cd build && ctest --output-on-failure -j 2'
stage "sanitizers (build-asan)" scripts/ci/test_sanitize.sh
stage "fuzz ${FUZZ_SECONDS:-60}s x 6 targets (build-fuzz)" scripts/ci/fuzz.sh "${FUZZ_SECONDS:-60}"
fail=0
for i in "${!names[@]}"; do
  printf 'test.sh: %-40s exit %-3s %5s s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" >&2
  [ "${results[$i]}" = 0 ] || fail=1
done
exit $fail
