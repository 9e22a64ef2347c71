#!/bin/sh
# A torch 2.x line of the test matrix: runs "$@" (PYTHON -m pytest ...) when PYTHON, from a
# virtual environment scripts/setup.sh makes (.venv: torch 2.13; .venv-tv: torch 2.14.1 +
# torchvision, opt-in), exists; otherwise says so and exits 77 (CTest: skipped).
if [ ! -x "$1" ]; then
  echo "pytest_torch2.sh: $1 not found (run scripts/setup.sh): the torch 2.x line is skipped"
  exit 77
fi
exec "$@"
