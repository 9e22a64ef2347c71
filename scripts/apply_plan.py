#!/usr/bin/python3
"""Apply a replay-plan plan to the real torch model and prove it byte-identical.

Usage: apply_plan.py MODEL.py TRACE.json PLAN.json [--budget B ...]
                     [--mode contract|plain|plain-norng] [--repeat N] [--json]

A thin wrapper over the package's command line, `python -m ckptkit.replay apply`
(python/ckptkit/replay/_cli.py; --help says what is compared, the modes and the exit codes:
0 byte-identical, 1 different, 2 bad input). The package is found as record_trace.py finds it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_trace  # noqa: E402,F401  (puts ckptkit on sys.path)
from ckptkit.replay._cli import apply_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(apply_main(prog="apply_plan"))
