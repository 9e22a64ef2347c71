#!/bin/sh
# Configure and build into build/ (Release with debug info). Usage: scripts/build.sh [cmake args]
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "$(nproc)"
# The Python package (build/python/ckptkit, built when pybind11-dev is found): a ckptkit.pth in
# /usr/bin/python3's site folder makes `import ckptkit` work without PYTHONPATH. Skipped when
# that folder is not writable, or with CKPTKIT_NO_PTH=1.
if [ -d build/python/ckptkit ] && [ "${CKPTKIT_NO_PTH:-0}" != 1 ]; then
  site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
  if [ -n "$site" ] && mkdir -p "$site" 2>/dev/null && [ -w "$site" ]; then
    echo "$(pwd)/build/python" > "$site/ckptkit.pth"
  fi
fi
