"""Shared helpers for the ckptkit end-to-end round trips (stock torch), imported by the tests
(`from testlib import ...`; a plain module, so test/py/replay/conftest.py cannot shadow it).

The CLI tools are located through the environment variable CKPTKIT_BIN (a directory holding
ckpt-compress, ckpt-verify and ckpt-restore). Missing tools are a test FAILURE, never a skip:
the round trip is the product's proof and must not silently disappear.
Run with /usr/bin/python3 -m pytest test/py (Debian's torch 1.13) and .venv/bin/python -m
pytest test/py (torch 2.13, scripts/setup.sh makes .venv): CTest runs both.
"""
import json
import os
import pickle
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "data")
sys.path.insert(0, os.path.join(ROOT, "scripts"))               # torch_step_check
sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))   # ckpt_models, make_*

import ckpt_models  # noqa: E402,F401  (re-exported for the tests)
import torch_step_check  # noqa: E402,F401

TOOLS = ("ckpt-compress", "ckpt-verify", "ckpt-restore")


def torch_load_pair(orig, restored):
    """torch.load of an original checkpoint and its restored copy with torch's default
    weights_only (True from torch 2.6 on) where the original loads that way, and then the
    restored file must load too. An original whose pickle names classes outside torch's
    allowlist (DeepSpeed's loss scaler, Lightning's AttributeDict) is refused by that
    default: the restored file must be refused the same way, and both load with
    weights_only=False."""
    import torch
    try:
        a = torch.load(orig)
    except pickle.UnpicklingError:
        with pytest.raises(pickle.UnpicklingError):
            torch.load(restored)
        return torch.load(orig, weights_only=False), torch.load(restored, weights_only=False)
    return a, torch.load(restored)


def require_ckptkit_bin():
    """Directory of the ckptkit CLI tools from $CKPTKIT_BIN; FAIL the calling test when absent.

    Called inside each test body (not as a pytest fixture) so a missing tool is reported as
    a FAILED test, not as a setup ERROR and never as a skip.
    """
    d = os.environ.get("CKPTKIT_BIN")
    if not d:
        pytest.fail("CKPTKIT_BIN is not set: export CKPTKIT_BIN=<build dir with "
                    "ckpt-compress, ckpt-verify, ckpt-restore> (e.g. build/apps)", pytrace=False)
    missing = [t for t in TOOLS if not os.access(os.path.join(d, t), os.X_OK)]
    if missing:
        pytest.fail(f"CKPTKIT_BIN={d}: missing or not executable: {', '.join(missing)}",
                    pytrace=False)
    return d


def package_dir():
    """Where the built Python package lives: $CKPTKIT_PYTHONPATH, else next to $CKPTKIT_BIN
    (<build>/apps -> <build>/python), else build/python."""
    d = os.environ.get("CKPTKIT_PYTHONPATH")
    if not d:
        bin_dir = os.environ.get("CKPTKIT_BIN") or os.path.join(ROOT, "build", "apps")
        d = os.path.join(os.path.dirname(os.path.abspath(bin_dir)), "python")
    return d


def import_package(module="ckptkit"):
    """Import `module` (ckptkit or one of its submodules) from package_dir(), or skip the
    calling test module when the package is not built (it is optional in the build, and
    absent from the sanitizer and fuzz builds); returns (module, the package folder)."""
    import importlib
    d = package_dir()
    if not os.path.isfile(os.path.join(d, *module.split("."), "__init__.py")) and \
            not os.path.isfile(os.path.join(d, *module.split(".")) + ".py"):
        pytest.skip(f"{d}/{module.replace('.', '/')} not built (pybind11-dev missing at configure time?)",
                    allow_module_level=True)
    sys.path.insert(0, d)
    return importlib.import_module(module), d


def run_tool(bin_dir, tool, *args, timeout=120):
    """Run one CLI tool; return CompletedProcess (text mode, stdout/stderr captured)."""
    return subprocess.run([os.path.join(bin_dir, tool), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def parse_json_stdout(proc):
    """Parse the single JSON object printed on stdout by a `--json` run."""
    try:
        return json.loads(proc.stdout)
    except ValueError as e:
        raise AssertionError(f"stdout is not one JSON object ({e}): {proc.stdout[:500]!r}")


def fixture_path(name):
    """Absolute path of a checkpoint fixture in data/."""
    return os.path.join(DATA, name)


def moment_count(path):
    """Number of moment values (exp_avg, exp_avg_sq, max_exp_avg_sq elements) in a fixture."""
    obj = torch_step_check.load_any(path)
    _, osd = torch_step_check.split_state(obj, path)
    return sum(t.numel() for st in osd["state"].values()
               for k, t in st.items() if k in torch_step_check.MOMENT_KEYS)


def folder_files(d):
    """Every file under folder d (a pathlib.Path), as sorted relative paths."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def walk_leaves(a, b, path, moments, names=("exp_avg", "exp_avg_sq")):
    """Every leaf of two loaded checkpoints a and b (dicts, lists, tuples, objects' __dict__):
    float32 tensors under a key in `names` go into moments as (a, b) pairs, any other leaf must
    be equal (tensors by torch.equal)."""
    import torch
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            walk_leaves(a[k], b[k], path + [k], moments, names)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            walk_leaves(x, y, path + [i], moments, names)
    elif torch.is_tensor(a):
        if path and path[-1] in names:
            assert a.shape == b.shape and a.dtype == b.dtype == torch.float32, path
            moments.append((a, b))
        else:
            assert torch.equal(a, b), path
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        walk_leaves(vars(a), vars(b), path + ["__dict__"], moments, names)
    else:
        assert a == b, path
