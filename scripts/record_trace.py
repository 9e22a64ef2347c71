#!/usr/bin/python3
"""Record one real training step of MODEL.py as a ckptkit trace (formats/trace.md, version 2).

Usage: record_trace.py MODEL.py -o TRACE.json [--et ET.json [--chakra CHAKRA.json]]
                       [--copy-gbps G] [--quiet]

A thin wrapper over the package's command line, `python -m ckptkit.replay record`
(python/ckptkit/replay/_cli.py: the MODEL.py contract, the method, the messages; --help prints
them). The package is imported from $CKPTKIT_PYTHONPATH, <$CKPTKIT_BIN>/../python or
build/python, unless it is importable already (scripts/build.sh's ckptkit.pth).
"""
import os
import sys


def package_path():
    """Make `import ckptkit` work from a source checkout: $CKPTKIT_PYTHONPATH, else the python
    folder next to $CKPTKIT_BIN, else build/python (first one holding ckptkit/)."""
    here = os.path.dirname(os.path.abspath(__file__))
    bin_dir = os.environ.get("CKPTKIT_BIN")
    for d in (os.environ.get("CKPTKIT_PYTHONPATH"),
              bin_dir and os.path.join(os.path.dirname(os.path.abspath(bin_dir)), "python"),
              os.path.join(here, "..", "build", "python")):
        if d and os.path.isdir(os.path.join(d, "ckptkit")):
            sys.path.insert(0, d)
            return


package_path()   # also for apply_plan.py and fixtures/synth_trace.py, which import this file

if __name__ == "__main__":
    from ckptkit.replay._cli import record_main
    sys.exit(record_main(prog="record_trace", source="record_trace.py"))
