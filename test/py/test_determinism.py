"""Containers are a function of the input and the flags only: byte-identical for every
--threads count and every instruction-set level of the codec's block loops
(CKPTKIT_ISA=baseline|avx2|avx512, those this CPU has), and reports identical too.

The codec (lib/codec, built with -ffp-contract=off) compiles its block loops once per
level and picks one at run time; the IEEE operations and their order are the same in each.
ckpt-verify's dense-grid kernel has AVX-512 / AVX2 / baseline clones of its own
(target_clones), but only its report depends on it, and that report is compared across
thread counts here.
"""
import hashlib
import json
import os
import subprocess

import pytest

from testlib import ROOT, parse_json_stdout, require_ckptkit_bin, run_tool


@pytest.fixture(scope="module")
def big_tensors(tmp_path_factory):
    """A generated torch.save checkpoint with 400k-value tensors (several 16k-coordinate
    thread ranges per chunk, and several 2^18-value chunks per tensor)."""
    d = tmp_path_factory.mktemp("det")
    out = d / "g.pt"
    subprocess.run(["/usr/bin/python3", f"{ROOT}/scripts/fixtures/gen_checkpoint.py", "--gib", "0.02",
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


def isa_levels():
    """The CKPTKIT_ISA levels this CPU runs (lib/codec isa_supported)."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    levels = ["baseline"]
    if "avx2" in flags:
        levels.append("avx2")
    if {"avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags:
        levels.append("avx512")
    return levels


@pytest.mark.parametrize("codec", ["vlog", "log8"])
def test_container_bytes_do_not_depend_on_isa(tmp_path, big_tensors, codec):
    b = require_ckptkit_bin()
    levels = isa_levels()
    if len(levels) == 1:
        pytest.skip("this CPU has only the baseline level")
    digests, reports, restored = [], [], []
    for isa in levels:
        out = tmp_path / f"{isa}.ckz.h5"
        env = dict(os.environ, CKPTKIT_ISA=isa)
        r = subprocess.run([os.path.join(b, "ckpt-compress"), str(big_tensors), "-o", str(out), "--codec", codec,
                            "--json"], capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr
        digests.append(sha(out))
        reports.append(json.dumps(parse_json_stdout(r)["tensors"], sort_keys=True))
        back = tmp_path / f"{isa}.pt"
        r = subprocess.run([os.path.join(b, "ckpt-restore"), str(out), "-o", str(back)], capture_output=True,
                           text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr
        restored.append(sha(back))
    assert len(set(digests)) == 1, dict(zip(levels, digests))
    assert len(set(reports)) == 1
    assert len(set(restored)) == 1


def test_unknown_isa_is_a_clear_error(tmp_path):
    b = require_ckptkit_bin()
    env = dict(os.environ, CKPTKIT_ISA="sse9")
    r = subprocess.run([os.path.join(b, "ckpt-compress"), os.path.join(ROOT, "data", "cnn_adamw.pt"), "-o",
                        str(tmp_path / "x.ckz.h5")], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert "CKPTKIT_ISA=sse9" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.ckz.h5").exists()
