"""Container format 1 stays readable: data/cnn_adamw.v1.ckz.h5 was written by ckpt-compress
before format 2 (log8, 2026-12-01, from data/cnn_adamw.pt). Today's ckpt-verify proves it
against the original and ckpt-restore gives back a file stock torch loads, whose first real
AdamW step agrees with the original's within the tolerance."""
import os

import h5py

from testlib import DATA, parse_json_stdout, require_ckptkit_bin, run_tool, torch_step_check as tsc

V1 = os.path.join(DATA, "cnn_adamw.v1.ckz.h5")
SRC = os.path.join(DATA, "cnn_adamw.pt")


def test_v1_fixture_is_format_1():
    with h5py.File(V1, "r") as f:
        assert int(f.attrs["format_version"]) == 1
        assert "moments/segments" not in f


def test_v1_verifies_and_restores_for_stock_torch(tmp_path):
    b = require_ckptkit_bin()
    v = run_tool(b, "ckpt-verify", V1, "--original", SRC, "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    rep = parse_json_stdout(v)
    assert rep["codec"] == "log8" and rep["ok"] and rep["max_bound_lr"] <= 0.01
    out = tmp_path / "restored.pt"
    r = run_tool(b, "ckpt-restore", V1, "-o", out)
    assert r.returncode == 0, r.stderr
    errors, steps = tsc.check_pair(SRC, str(out), tolerance=0.01, grad_bound=1.0, fixture="cnn_adamw.pt")
    assert errors == []
    assert steps and all(s["ok"] for s in steps.values()), steps
