#!/bin/bash
# Sanitizer stage: build everything with -fsanitize=address,undefined in build-asan and run
# the whole CTest suite there (except rss_4gib): every doctest unit, the fuzz-target regression replays
# (fuzz_regress_*), and the pytest round trips (roundtrip_pytest = test/py, replay_pytest =
# test/py/replay, run by /usr/bin/python3 -m pytest with CKPTKIT_BIN=build-asan/apps, so
# every ckpt-compress / ckpt-verify / ckpt-restore / replay-plan they start is the sanitized
# binary). Python itself is not instrumented and loads no instrumented library, so nothing
# is preloaded and no python/torch leak can be reported.
#
#   scripts/ci/test_sanitize.sh [CTEST ARGS...]     e.g. scripts/ci/test_sanitize.sh -R io
#   env: JOBS (default 2), BUILD (default build-asan), CC/CXX (default the system gcc)
#
# Any report fails: halt_on_error for ASan and UBSan (-fno-sanitize-recover=undefined; GCC
# leaves float-cast-overflow out of "undefined", so it is named: clang's fuzz build has it),
# leak checking on, and exit code 99 for every sanitizer, so a report can never pass for a
# tool's own exit 1 (check failed) or 2 (bad input) in the pytest checks.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build-asan}
JOBS=${JOBS:-2}
SAN="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow -fno-omit-frame-pointer"
t0=$(date +%s)
if [ ! -f "$B/build.ninja" ]; then
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTKIT_CUDA=OFF \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined,float-cast-overflow" >/dev/null
else
  cmake "$B" >/dev/null   # pick up new regression folders under test/corpus/fuzz/
fi
ninja -C "$B" -j"$JOBS"
t1=$(date +%s)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=99:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:exitcode=99}
export CKPTKIT_SANITIZED=1   # test_replay.py: torch-only round trips run in stage 1, one here
export LSAN_OPTIONS=${LSAN_OPTIONS:-exitcode=99:print_suppressions=0:suppressions=$ROOT/test/lsan.supp}  # HDF5 after a failed write
cd "$B"
rc=0
# The torch 2.x pytest line (*_torch2) runs in stage 1 only: it drives the same tools.
# rss_4gib (4 GiB through the tools, ~5 min unsanitized) runs in stage 1 only: under ASan it
# would take ~3x longer and measure the sanitizer's shadow memory, not ours.
# replay_jax_pytest (.venv's JAX through the package) too: this build has no package module
# (an ASan extension does not load into a plain interpreter), and the planner it calls is
# sanitized through replay-plan in replay_pytest.
ctest --output-on-failure -j"$JOBS" -E '^rss_4gib$|_torch2$|_torchvision$|^replay_jax_pytest$' "$@" || rc=$?
t2=$(date +%s)
echo "test_sanitize.sh: build $((t1 - t0)) s, tests $((t2 - t1)) s, ctest exit $rc"
exit $rc
