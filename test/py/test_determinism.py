"""Containers are a function of the input and the flags only: byte-identical for every
--threads count, and reports identical too.

The codec (lib/codec, built with -ffp-contract=off) has a single scalar code path on the
CPU: there is no ISA dispatch whose output could differ, so thread count is the axis to
test. ckpt-verify's dense-grid kernel has AVX-512 / AVX2 / baseline clones, but only its
report depends on it, and that report is compared across thread counts here.
"""
import hashlib
import json
import subprocess

import pytest

from testlib import ROOT, parse_json_stdout, require_ckptkit_bin, run_tool


@pytest.fixture(scope="module")
def big_tensors(tmp_path_factory):
    """A generated torch.save checkpoint with 400k-value tensors (several 16k-coordinate
    thread ranges per chunk, and several 2^18-value chunks per tensor)."""
    d = tmp_path_factory.mktemp("det")
    out = d / "g.pt"
    subprocess.run(["/usr/bin/python3", f"{ROOT}/scripts/gen_checkpoint.py", "--gib", "0.02",
                    "--numel-per-tensor", "400000", "-o", str(out)], check=True, capture_output=True)
    return out


def sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("codec", ["vlog", "log8", "blockwise8", "bf16"])
def test_container_bytes_do_not_depend_on_threads(tmp_path, big_tensors, codec):
    b = require_ckptkit_bin()
    digests, reports = [], []
    for t in (1, 2, 3):
        out = tmp_path / f"t{t}.ckz.h5"
        r = run_tool(b, "ckpt-compress", big_tensors, "-o", out, "--codec", codec, "--threads", str(t), "--json",
                     timeout=600)
        assert r.returncode == 0, r.stderr
        digests.append(sha(out))
        rep = parse_json_stdout(r)
        reports.append(json.dumps(rep["tensors"], sort_keys=True))
    assert digests[0] == digests[1] == digests[2]
    assert reports[0] == reports[1] == reports[2]


def test_verify_report_does_not_depend_on_threads(tmp_path, big_tensors):
    b = require_ckptkit_bin()
    out = tmp_path / "c.ckz.h5"
    assert run_tool(b, "ckpt-compress", big_tensors, "-o", out).returncode == 0
    reps = []
    for t in (1, 2):
        v = run_tool(b, "ckpt-verify", out, "--original", big_tensors, "--threads", str(t), "--json", timeout=600)
        assert v.returncode == 0, v.stdout + v.stderr
        rep = parse_json_stdout(v)
        rep.pop("seconds", None)
        reps.append(rep)
    assert reps[0] == reps[1]
