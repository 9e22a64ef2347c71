#!/bin/sh
# Configure and build into build/ (Release with debug info). Usage: scripts/build.sh [cmake args]
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$(nproc)"
