#!/bin/bash
# Build everything with -fsanitize=address,undefined (build-asan) and run the whole CTest
# suite there: the C++ units and the pytest round trips (which call the sanitized binaries
# as subprocesses; python itself is not instrumented, so nothing is preloaded).
#
#   scripts/test_sanitize.sh [CTEST ARGS...]     e.g. scripts/test_sanitize.sh -R io
#   env: JOBS (default 2), BUILD (default build-asan), CC/CXX (default the system gcc)
#
# Any sanitizer report makes the process exit non-zero (halt_on_error, no recovery for
# UBSan), so the test that ran it fails. Leak checking is on.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BUILD:-$ROOT/build-asan}
JOBS=${JOBS:-2}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f "$B/build.ninja" ]; then
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
fi
ninja -C "$B" -j"$JOBS"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$B"
ctest --output-on-failure -j"$JOBS" "$@"
