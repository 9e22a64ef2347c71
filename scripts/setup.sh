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

# The torch 2.x line of the test matrix: a virtual environment .venv (CPython 3.11, the ABI
# the package is built for: it imports in both interpreters) with the pinned
# scripts/requirements.txt (torch 2.13, transformers, Lightning, safetensors, ...). Re-installed
# only when the requirements change. CKPTKIT_NO_VENV=1 skips it (the torch 2.x tests then skip).
if [ "${CKPTKIT_NO_VENV:-0}" != 1 ]; then
  cd "$(dirname "$0")/.."
  py=${CKPTKIT_VENV_PYTHON:-python3}
  stamp=.venv/.requirements
  if ! cmp -s scripts/requirements.txt "$stamp" 2>/dev/null; then
    rm -rf .venv
    "$py" -m venv .venv
    DS_BUILD_OPS=0 .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt 2>&1 \
      | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import torch, transformers, lightning, safetensors, sklearn, jax, flax, optax"  # fails setup
    cp scripts/requirements.txt "$stamp"
  fi
fi

# The opt-in torchvision line (CKPTKIT_TORCHVISION=1): .venv-tv with torch 2.14.1 + torchvision
# 0.29.1 (scripts/requirements-torchvision.txt); CTest's package_pytest_torchvision runs there.
if [ "${CKPTKIT_TORCHVISION:-0}" = 1 ] && ! cmp -s scripts/requirements-torchvision.txt .venv-tv/.requirements 2>/dev/null; then
  rm -rf .venv-tv
  "${CKPTKIT_VENV_PYTHON:-python3}" -m venv .venv-tv
  .venv-tv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-torchvision.txt 2>&1 \
    | grep -v "^WARNING: Location" || true
  .venv-tv/bin/python -c "import torch, torchvision"
  cp scripts/requirements-torchvision.txt .venv-tv/.requirements
fi
