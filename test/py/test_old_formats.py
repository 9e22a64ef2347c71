"""Older container formats stay readable. data/cnn_adamw.v1.ckz.h5 was written by
ckpt-compress before format 2 (log8, 2026-12-01); data/cnn_adamw.v2.ckz.h5 before format 3
(vlog, two-state rANS segments: mode 0, 2026-12-02); data/cnn_adamw.v3.ckz.h5 before
format 4 (four-state byte-wise rANS segments: mode 2, 2026-12-03); data/cnn_adamw.v4.ckz.h5
before format 5 (first-update certificates, no horizon in the manifest);
data/cnn_adamw.v5.ckz.h5 before format 6 (exp_avg_sq's eps form and subnormal states,
2026-12-07: decoded and certified by format 5's rules); all from data/cnn_adamw.pt. Today's
ckpt-verify proves each against the original and ckpt-restore gives back a file stock torch
loads, whose first real AdamW step agrees with the original's within the tolerance."""
import os

import h5py
import pytest

from testlib import DATA, parse_json_stdout, require_ckptkit_bin, run_tool, torch_step_check as tsc
import make_bad_containers as mbc  # scripts/fixtures/ (testlib): reads zstd-filtered datasets without our plugin

SRC = os.path.join(DATA, "cnn_adamw.pt")
OLD = {1: ("cnn_adamw.v1.ckz.h5", "log8"), 2: ("cnn_adamw.v2.ckz.h5", "vlog"), 3: ("cnn_adamw.v3.ckz.h5", "vlog"),
       4: ("cnn_adamw.v4.ckz.h5", "vlog"), 5: ("cnn_adamw.v5.ckz.h5", "vlog")}


def segment_modes(f):
    """The mode byte of every vlog segment (formats/container.md, "vlog segments")."""
    modes = set()
    for role in f["moments/segments"]:
        ends = [int(e) for e in mbc.read_dataset(f["moments/segments"][role])]
        codes = mbc.read_dataset(f["moments/codes"][role])
        modes |= {int(codes[s]) for s in [0] + ends[:-1]}
    return modes


@pytest.mark.parametrize("version", sorted(OLD))
def test_old_fixture_has_its_format(version):
    with h5py.File(os.path.join(DATA, OLD[version][0]), "r") as f:
        assert int(f.attrs["format_version"]) == version
        assert f["raw"].dtype == ("<u4" if version >= 3 else "u1")
        assert ("horizon" in mbc.get_manifest(f)) == (version >= 5)  # format 5's
        if version == 1:
            assert "moments/segments" not in f
        elif version == 2:  # two-state rANS (mode 0) and raw (mode 1) segments
            assert segment_modes(f) == {0, 1}
        elif version == 3:  # four-state byte-wise rANS (mode 2) and raw segments, never mode 3
            assert segment_modes(f) == {1, 2}
        else:  # sixteen-state rANS (mode 3), as format 6
            assert 3 in segment_modes(f)


def test_new_container_is_format_6(tmp_path):
    """Format 6 (format 5's layout; its rules: formats/container.md): the manifest records the horizon ("all" by default, 1 with --horizon 1) and
    each parameter's step dtype; as in format 4, sixteen-state word-wise rANS segments
    (mode 3) and /raw (as in format 3) as byte-shuffled little-endian u32 holding exactly the
    source's non-moment bytes (its `bytes` attribute), the last element padded with zeros."""
    b = require_ckptkit_bin()
    out = tmp_path / "new.ckz.h5"
    r = run_tool(b, "ckpt-compress", SRC, "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    assert parse_json_stdout(r)["horizon"] == "all"
    one = run_tool(b, "ckpt-compress", SRC, "-o", tmp_path / "one.ckz.h5", "--horizon", "1", "--json")
    assert one.returncode == 0 and parse_json_stdout(one)["horizon"] == 1
    v = run_tool(b, "ckpt-verify", tmp_path / "one.ckz.h5", "--original", SRC, "--json")
    assert v.returncode == 0 and parse_json_stdout(v)["horizon"] == 1, v.stdout + v.stderr
    with h5py.File(out, "r") as f:
        assert int(f.attrs["format_version"]) == 6
        man = mbc.get_manifest(f)
        assert man["horizon"] == "all" and {p["hyper"]["step_dtype"] for p in man["params"]} == {"F32"}
        assert 3 in segment_modes(f) and 0 not in segment_modes(f)  # mode 2 only for short segments where smaller
        raw = f["raw"]
        plist = raw.id.get_create_plist()
        assert [plist.get_filter(i)[0] for i in range(plist.get_nfilters())] == [2, 32015]  # shuffle, zstd
        assert raw.dtype == "<u4"
        data = mbc.read_dataset(raw).view("<u1")  # libhdf5's own shuffle agrees: test/container/test_h5.cpp
        n = int(raw.attrs["bytes"])
        assert len(data) - 4 < n <= len(data) and not data[n:].any()
        manifest = mbc.get_manifest(f)
        moments = sum(s["nbytes"] for s in manifest["storages"] if s["param"] >= 0)
        assert n == os.path.getsize(SRC) - moments
        with open(SRC, "rb") as src:
            head = src.read(64)
        assert data[:64].tobytes() == head  # the zip's first local header, as in the source


@pytest.mark.parametrize("version", sorted(OLD))
def test_old_format_verifies_and_restores_for_stock_torch(tmp_path, version):
    b = require_ckptkit_bin()
    path, codec = os.path.join(DATA, OLD[version][0]), OLD[version][1]
    v = run_tool(b, "ckpt-verify", path, "--original", SRC, "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    rep = parse_json_stdout(v)
    assert rep["codec"] == codec and rep["ok"] and rep["max_bound_lr"] <= 0.01
    assert rep["horizon"] == (1 if version < 5 else "all")  # formats 1-4 certify the first update
    out = tmp_path / "restored.pt"
    r = run_tool(b, "ckpt-restore", path, "-o", out)
    assert r.returncode == 0, r.stderr
    errors, steps = tsc.check_pair(SRC, str(out), tolerance=0.01, grad_bound=1.0, fixture="cnn_adamw.pt")
    assert errors == []
    assert steps and all(s["ok"] for s in steps.values()), steps
