#!/bin/sh
# The whole test suite: install packages, build, run every doctest unit and the real-torch
# pytest round trips through CTest.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build && ctest --output-on-failure -j 2
