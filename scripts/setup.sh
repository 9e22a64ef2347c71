#!/bin/sh
# Install every Debian 12 package the build, the tools and the tests need (run as root);
# clang + libclang-rt-14-dev (libFuzzer, sanitizer runtimes) and llvm (llvm-symbolizer for
# sanitizer stack traces) are for the fuzz stage of scripts/test.sh; openmpi-bin +
# libopenmpi-dev build and test the optional MPI folder mode (CKPTKIT_MPI); pybind11-dev +
# python3-dev build the Python package ckptkit (python/, optional: skipped without them).
set -eu
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config \
  libcli11-dev libhdf5-dev libzstd-dev libfmt-dev libspdlog-dev doctest-dev \
  nlohmann-json3-dev libsimdjson-dev libxxhash-dev zlib1g-dev libisal-dev \
  python3 python3-torch python3-torchvision python3-numpy python3-h5py python3-hdf5plugin python3-pytest \
  python3-sklearn python3-xxhash python3-matplotlib zstd time openmpi-bin libopenmpi-dev \
  clang libclang-rt-14-dev llvm pybind11-dev python3-dev >/dev/null
