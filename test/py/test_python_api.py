"""The Python package `ckptkit` (python/ckptkit, built into <build>/python by the normal CMake
build) with real torch: save -> load on every fixture (every non-moment leaf bit-exact, storage
sharing kept, one real optimizer step of the fixture's class within tolerance), load of plain
files equal to torch.load, background saves byte-identical to synchronous ones and safe while
training goes on, a training loop that saves in the background and resumes, the CLI's jobs on
a folder, and bad input (one-line BadInput / CheckFailed, nothing partial left, no code run).

The package is found at $CKPTKIT_PYTHONPATH, else next to $CKPTKIT_BIN (<build>/apps ->
<build>/python). It is optional in the build (pybind11-dev): when <build>/python/ckptkit is
absent the module is skipped, saying so.
"""
import copy
import threading
import io
import os
import re
import pickle
import subprocess
import sys

import pytest
import torch

from testlib import ROOT, ckpt_models, fixture_path, import_package, moment_count, torch_step_check as tsc

TOL = 0.01
ckptkit, PKG = import_package()

TORCH_FIXTURES = [f for f in ckpt_models.FIXTURES if f.endswith(".pt")]


def _opts(fixture):
    # an optimizer-only file has no parameters for Adam L2's domain: name the class (AdamW)
    return {"optimizer": "adamw"} if fixture == "lm_optimizer_only.pt" else {}


def _weights(fixture):
    w = ckpt_models.WEIGHTS_OF.get(fixture)
    return fixture_path(w) if w else None


def _one_line(e):
    s = str(e)
    assert "\n" not in s and s, s
    return s


def _no_temporaries(folder):
    left = [n for n in os.listdir(folder) if ".tmp-" in n]
    assert not left, f"temporaries left behind: {left}"


def _assert_same_step(fixture, orig, rest, path):
    errors = tsc.compare_checkpoints(orig, rest)
    assert not errors, f"{fixture}: non-moment differences: {errors[:10]}"
    o_sd = tsc.split_state(orig, path, _weights(fixture))
    r_sd = tsc.split_state(rest, path, _weights(fixture))
    res = tsc.step_check(fixture, o_sd, r_sd, TOL, 1.0)
    bad = {k: r for k, r in res.items() if not r["ok"]}
    assert not bad, f"{fixture}: update differs by more than tolerance*lr: {bad}"


# ------------------------------------------------------------------------------ save / load


@pytest.mark.parametrize("fixture", TORCH_FIXTURES)
def test_save_load_fixture(tmp_path, fixture):
    path = fixture_path(fixture)
    obj = torch.load(path)
    out = tmp_path / "ckpt.ckz.h5"
    rep = ckptkit.save(obj, out, **_opts(fixture))
    assert isinstance(rep, ckptkit.Report) and rep.ok and rep["ok"]
    for k in ("moment_reduction", "escapes", "moment_bytes_fp32", "moment_bytes_out", "max_bound_lr", "tensors",
              "horizon"):
        assert k in rep, k
    assert rep.max_bound_lr <= TOL
    assert rep.moment_values == moment_count(path)
    _no_temporaries(tmp_path)
    # the container is a ckptkit one: verify passes, restore gives torch.save(obj)'s bytes
    assert ckptkit.verify(out).ok
    loaded = ckptkit.load(out)
    _assert_same_step(fixture, obj, loaded, path)
    # ckpt-restore of the same container gives what load gave
    ckptkit.restore(out, tmp_path / "back.pt")
    assert not tsc.compare_checkpoints(loaded, torch.load(tmp_path / "back.pt"), check_zeros=True)


def test_restored_bytes_are_torch_save_bytes(tmp_path):
    """What ckpt-restore gives back for a saved object is torch.save(obj, buffer)'s bytes,
    moments aside: same length, and only moment storage bytes (and their zip CRC-32 fields)
    differ."""
    import numpy as np
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    ckptkit.save(obj, tmp_path / "c.ckz.h5")
    ckptkit.restore(tmp_path / "c.ckz.h5", tmp_path / "r.pt")
    buf = io.BytesIO()
    torch.save(obj, buf)
    ref = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    got = np.frombuffer((tmp_path / "r.pt").read_bytes(), dtype=np.uint8)
    assert len(ref) == len(got)
    moments = [t for st in obj["optimizer"]["state"].values() for k, t in st.items() if k in tsc.MOMENT_KEYS]
    allowed = sum(t.numel() * t.element_size() + 12 for t in moments)
    assert 0 < int((ref != got).sum()) <= allowed
    first = int(np.argmax(ref != got))
    assert first > 64


def test_load_plain_files_equal_torch_load(tmp_path):
    for fixture in TORCH_FIXTURES:
        path = fixture_path(fixture)
        a, b = torch.load(path), ckptkit.load(path)
        assert not tsc.compare_checkpoints(a, b, check_zeros=True), fixture
    a = torch.load(fixture_path("lm_adamw.pt"), map_location="cpu")
    b = ckptkit.load(fixture_path("lm_adamw.pt"), map_location="cpu", weights_only=True)
    assert not tsc.compare_checkpoints(a, b, check_zeros=True)


def test_safetensors(tmp_path):
    path = fixture_path("cnn_adamw.safetensors")
    tensors, meta = tsc.read_safetensors(path)
    plain = ckptkit.load(path)
    assert list(plain) == list(tensors)
    assert all(torch.equal(plain[k], tensors[k]) and plain[k].dtype == tensors[k].dtype for k in tensors)
    rep = ckptkit.compress(path, tmp_path / "st.ckz.h5")
    assert rep.ok and rep.moment_reduction > 0
    loaded = ckptkit.load(tmp_path / "st.ckz.h5")
    assert list(loaded) == list(tensors)
    orig = {"tensors": dict(sorted(tensors.items())), "metadata": dict(sorted(meta.items()))}
    rest = {"tensors": dict(sorted(loaded.items())), "metadata": dict(sorted(meta.items()))}
    _assert_same_step("cnn_adamw.safetensors", orig, rest, path)


# ------------------------------------------------------------------------------ background


def test_background_bytes_equal_sync_and_snapshot(tmp_path):
    obj = torch.load(fixture_path("lm_adamw.pt"))
    want = copy.deepcopy(obj)
    ckptkit.save(obj, tmp_path / "sync.ckz.h5")
    fut = ckptkit.save(obj, tmp_path / "bg.ckz.h5", background=True)
    # training goes on: every tensor changes in place while the save runs
    with torch.no_grad():
        for _, t in tsc._walk(obj):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.mul_(0.5).add_(1.0)
    rep = fut.result(timeout=300)
    assert rep.ok
    assert (tmp_path / "bg.ckz.h5").read_bytes() == (tmp_path / "sync.ckz.h5").read_bytes()
    _assert_same_step("lm_adamw.pt", want, ckptkit.load(tmp_path / "bg.ckz.h5"), fixture_path("lm_adamw.pt"))


def test_background_snapshot_copies_storages_not_the_pickle(tmp_path, monkeypatch):
    """Issue 58: a background save of plain containers (dicts, OrderedDicts with _metadata,
    lists, tuples) of host tensors blocks the caller only for a copy of the storages: torch's
    serialisation (pickle walk, CRC-32) runs in the worker thread. Views and tied tensors keep
    sharing their storage's copy; Parameters stay Parameters; the container is the synchronous
    save's bytes, also after every tensor changed in place. An object the snapshot does not
    take (an argparse.Namespace) is staged serialised, as before, with the same bytes."""
    import argparse
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 64))
    model[2].weight = model[0].weight   # tied
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    w = model[0].weight.detach()
    obj = {"model": model.state_dict(), "optimizer": opt.state_dict(), "views": (w, w[3:], w.t()),
           "params": list(model.parameters()), "lr": torch.tensor(1e-3), "step": 1}
    w0 = w.clone()
    ckptkit.save(obj, tmp_path / "sync.ckz.h5")
    callers = []
    real = ckptkit._serialize
    monkeypatch.setattr(ckptkit, "_serialize", lambda o, borrow: callers.append(threading.current_thread()) or real(o, borrow))
    fut = ckptkit.save(obj, tmp_path / "bg.ckz.h5", background=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert fut.result(timeout=300).ok
    assert callers and threading.main_thread() not in callers
    assert (tmp_path / "bg.ckz.h5").read_bytes() == (tmp_path / "sync.ckz.h5").read_bytes()
    back = ckptkit.load(tmp_path / "bg.ckz.h5", weights_only=False)
    assert back["views"][1].untyped_storage().data_ptr() == back["views"][0].untyped_storage().data_ptr() \
        if hasattr(torch.Tensor, "untyped_storage") else back["views"][1].storage().data_ptr() == back["views"][0].storage().data_ptr()
    assert isinstance(back["params"][0], torch.nn.Parameter) and torch.equal(back["views"][2], w0.t())
    callers.clear()
    obj["args"] = argparse.Namespace(lr=1e-3)
    ckptkit.save(obj, tmp_path / "sync2.ckz.h5")
    fut = ckptkit.save(obj, tmp_path / "bg2.ckz.h5", background=True)
    assert threading.main_thread() in callers[1:]   # serialised on the caller's thread (staged whole)
    assert fut.result(timeout=300).ok
    assert (tmp_path / "bg2.ckz.h5").read_bytes() == (tmp_path / "sync2.ckz.h5").read_bytes()


def test_staging_arenas_are_private_huge_page_mappings():
    """Issue 58: a background save's staging arena is a private anonymous mapping advised as
    transparent huge pages (smaps: "rw-p", VmFlags "hg"), so the snapshot's first touch
    faults 2 MiB at a time where THP is "madvise"; mmap's default (shared: shmem) would fault
    4 KiB pages. Given back and taken again, it is the same arena."""
    import ctypes
    a = ckptkit._staging.take(1 << 20)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(a))
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
        def span(line):   # (start, end) of a mapping's header line ("start-end perms ..."), else None
            first = line.split()[0] if line.strip() else ":"
            return None if first.endswith(":") else tuple(int(x, 16) for x in first.split("-"))
        head = next(i for i, line in enumerate(lines) if (sp := span(line)) and sp[0] <= addr < sp[1])
        assert lines[head].split()[1] == "rw-p", lines[head]
        flags = next(line for line in lines[head + 1:] if line.startswith("VmFlags:")).split()[1:]
        assert "hg" in flags and "sh" not in flags, flags
        assert len(a) == ckptkit._Staging.ARENA
        ckptkit._staging.give([a])
        assert ckptkit._staging.take(1 << 20) is a
    finally:
        ckptkit.release_staging()


def test_training_loop_saves_in_background_and_resumes(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x, y = torch.randn(512, 64), torch.randn(512, 16)
    futures, snapshots = [], {}
    for step in range(1, 41):
        i = (step * 32) % 512
        loss = torch.nn.functional.mse_loss(model(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            snapshots[step] = copy.deepcopy(state)
            futures.append(ckptkit.save(state, tmp_path / f"step{step}.ckz.h5", background=True))
    reports = [f.result(timeout=300) for f in futures]
    assert all(r.ok and r.moment_reduction > 0.5 for r in reports)
    for step, want in snapshots.items():
        got = ckptkit.load(tmp_path / f"step{step}.ckz.h5")
        assert got["step"] == step
        assert not tsc.compare_checkpoints(want["model"], got["model"], check_zeros=True)
    # resume from the last one: the same next step as from the in-memory state, within tolerance
    got = ckptkit.load(tmp_path / "step40.ckz.h5")
    moved = []
    for sd in (snapshots[40], got):
        m = copy.deepcopy(model)
        m.load_state_dict(sd["model"])
        o = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
        o.load_state_dict(sd["optimizer"])
        before = [p.detach().clone() for p in m.parameters()]
        for p in m.parameters():
            p.grad = torch.empty_like(p).uniform_(-1, 1, generator=torch.Generator().manual_seed(p.numel()))
        o.step()
        moved.append([(p.detach() - b).double() for p, b in zip(m.parameters(), before)])
    worst = max(float((a - b).abs().max()) for a, b in zip(*moved))
    assert worst <= TOL * 1e-3 + 1e-8, worst


# ------------------------------------------------------------------------------ the CLI's jobs


def test_folder_compress_verify_restore(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
    import make_folders as mf
    src = mf.make_hf(str(tmp_path / "in"), 160, mf.STEPS)
    top = os.path.dirname(src)
    out, back = tmp_path / "out", tmp_path / "back"
    rep = ckptkit.compress(top, out)
    assert rep.ok and [l["kind"] for l in rep.layouts] == ["hf-trainer"]
    assert (out / "checkpoint-5" / "optimizer.pt.ckz.h5").is_file()
    assert ckptkit.verify(out, original=top).ok
    ckptkit.restore(out, back)
    orig = torch.load(os.path.join(src, "optimizer.pt"))
    assert not tsc.compare_checkpoints(orig, torch.load(back / "checkpoint-5" / "optimizer.pt"))
    assert not tsc.compare_checkpoints(orig, ckptkit.load(out / "checkpoint-5" / "optimizer.pt.ckz.h5"))
    with pytest.raises(ckptkit.BadInput, match="already exists"):
        ckptkit.compress(top, out)
    assert ckptkit.compress(top, out, force=True).ok


def test_file_jobs_and_reports(tmp_path):
    src = fixture_path("cnn_adam_l2.pt")
    rep = ckptkit.compress(src, tmp_path / "c.ckz.h5", codec="log8", horizon=1, threads=1)
    assert rep.codec == "log8" and rep.horizon in (1, "1") and rep.ok
    assert "moment" in str(rep)
    assert ckptkit.verify(tmp_path / "c.ckz.h5", original=src).ok
    r = ckptkit.restore(tmp_path / "c.ckz.h5", tmp_path / "r.pt")
    assert r.file_bytes_out == os.path.getsize(src)


def test_verify_original_saved_under_another_name(tmp_path):
    """ckptkit.save's source is torch.save to a file object (zip records under 'archive/');
    torch.save(obj, "t.pt") puts them under 't/': verify --original with that copy fails
    saying so and what to compare with instead; a copy saved to a file object verifies."""
    import io
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    ckz = tmp_path / "c.ckz.h5"
    ckptkit.save(obj, ckz)
    torch.save(obj, tmp_path / "t.pt")
    with pytest.raises(ckptkit.CheckFailed) as e:
        ckptkit.verify(ckz, original=tmp_path / "t.pt")
    assert "its zip records are under 't/', the source's under 'archive/'" in str(e.value), str(e.value)
    assert _one_line(e.value)
    buf = io.BytesIO()
    torch.save(obj, buf)
    (tmp_path / "a.pt").write_bytes(buf.getvalue())
    assert ckptkit.verify(ckz, original=tmp_path / "a.pt").ok


def test_verify_tolerance(tmp_path):
    """issue 52: ckptkit.verify holds certificates to its own tolerance (0.01 by default), as
    ckpt-verify --tolerance, whatever the container's manifest says."""
    src = fixture_path("cnn_adamw.pt")
    ckz = tmp_path / "c.ckz.h5"
    assert ckptkit.compress(src, ckz, tolerance=0.05).ok
    with pytest.raises(ckptkit.CheckFailed, match="pass tolerance=0.05 to accept it") as e:
        ckptkit.verify(ckz)
    assert _one_line(e.value)
    assert not e.value.report.ok
    assert ckptkit.verify(ckz, tolerance=0.05).ok
    assert ckptkit.verify(ckz, original=src, tolerance=0.05).ok
    with pytest.raises(ckptkit.CheckFailed, match="pass tolerance=0.05"):
        ckptkit.verify(ckz, original=src, tolerance=0.02)
    for bad in (0, 2, "0.05", None):
        with pytest.raises(ckptkit.BadInput, match=f"^ckpt-verify: error: tolerance={bad!r}: "):
            ckptkit.verify(ckz, tolerance=bad)


# ------------------------------------------------------------------------------ bad input


def test_bad_options():
    obj = {"x": torch.ones(3)}
    # the keywords as the caller wrote them (`tolerance=5`), not the CLI's flags
    for kw, what in (({"tolerance": 5}, "tolerance=5: outside (0, 1]"), ({"codec": "zip"}, "codec='zip': not one of"),
                     ({"optimizer": "sgd"}, "optimizer='sgd': not one of"), ({"horizon": 2}, "horizon=2: not 'all' or 1"),
                     ({"threads": 0}, "threads=0: not a count"), ({"grad_bound": -1}, "grad_bound=-1: not a positive"),
                     ({"lr": -1}, "lr=-1: -1 is < 0"), ({"beta2": "x"}, "beta2='x': not a number")):
        with pytest.raises(ckptkit.BadInput, match=re.escape(what)) as e:
            ckptkit.save(obj, "/tmp/never.ckz.h5", **kw)
        assert _one_line(e.value).startswith("ckptkit.save: error:")
        assert isinstance(e.value, ValueError)
    with pytest.raises(TypeError):
        ckptkit.save(obj, "/tmp/never.ckz.h5", beta3=0.9)
    assert not os.path.exists("/tmp/never.ckz.h5")


def test_nothing_to_compress_and_unwritable(tmp_path):
    # no optimizer state: stored exactly, one warning (test_python_habits.py); compress refuses it as the CLI
    with pytest.warns(ckptkit.CkptkitWarning, match="nothing was coded"):
        ckptkit.save({"w": torch.ones(10)}, tmp_path / "x.ckz.h5")
    torch.save({"w": torch.ones(10)}, tmp_path / "w.pt")
    with pytest.raises(ckptkit.BadInput) as e:
        ckptkit.compress(tmp_path / "w.pt", tmp_path / "w.ckz.h5")
    assert _one_line(e.value).startswith("ckpt-compress: error: ")
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    with pytest.raises(ckptkit.BadInput) as e:
        ckptkit.save(obj, tmp_path / "no" / "such" / "dir.ckz.h5")
    assert str(tmp_path / "no" / "such" / "dir.ckz.h5") in _one_line(e.value)
    assert isinstance(e.value, FileNotFoundError)
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        if os.access(ro, os.W_OK):   # root: use a path that is a folder instead
            target = tmp_path
        else:
            target = ro / "x.ckz.h5"
        with pytest.raises(ckptkit.BadInput):
            ckptkit.save(obj, target)
    finally:
        os.chmod(ro, 0o755)
    assert os.listdir(ro) == []
    _no_temporaries(tmp_path)


def test_truncated_and_non_containers(tmp_path):
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    good = tmp_path / "good.ckz.h5"
    ckptkit.save(obj, good)
    data = good.read_bytes()
    trunc = tmp_path / "trunc.ckz.h5"
    trunc.write_bytes(data[:len(data) // 2])
    for fn in (ckptkit.load, ckptkit.verify):
        with pytest.raises((ckptkit.BadInput, ckptkit.CheckFailed)) as e:
            fn(trunc)
        _one_line(e.value)
    with pytest.raises(ckptkit.BadInput):
        ckptkit.restore(trunc, tmp_path / "t.pt")
    assert not (tmp_path / "t.pt").exists()
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(ckptkit.BadInput) as e:
        ckptkit.load(junk)
    assert _one_line(e.value).startswith(f"ckptkit.load: error: {junk}: ")
    with pytest.raises(ckptkit.BadInput, match="not a ckptkit container"):
        ckptkit.verify(fixture_path("cnn_adamw.pt"))
    with pytest.raises(ckptkit.BadInput, match="same|input"):   # output is the input
        ckptkit.compress(fixture_path("cnn_adamw.pt"), fixture_path("cnn_adamw.pt"), force=True)
    with pytest.raises(ckptkit.BadInput, match="already exists"):
        ckptkit.restore(good, junk)
    _no_temporaries(tmp_path)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_never_runs(tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"x": torch.ones(2), "evil": _Evil(marker)}, evil)
    with pytest.raises(ckptkit.BadInput) as e:
        ckptkit.load(evil)
    _one_line(e.value)
    with pytest.raises(ckptkit.BadInput):
        ckptkit.save({"x": torch.ones(2), "evil": _Evil(marker)}, tmp_path / "e.ckz.h5")
    assert not marker.exists()
    # a plain pickle that is not a torch file at all
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(ckptkit.BadInput):
        ckptkit.load(raw)
    assert not marker.exists()
    _no_temporaries(tmp_path)


HOSTILE = r"""
import os, sys, random
sys.path.insert(0, sys.argv[1])
import ckptkit
data = open(sys.argv[2], "rb").read()
rng = random.Random(int(sys.argv[3]))
path = sys.argv[4]
for i in range(int(sys.argv[5])):
    b = bytearray(data)
    for _ in range(rng.choice((1, 4, 32))):
        p = rng.randrange(len(b))
        b[p] ^= 1 << rng.randrange(8)
    open(path, "wb").write(bytes(b))
    try:
        ckptkit.load(path)
    except (ckptkit.BadInput, ckptkit.CheckFailed) as e:
        assert "\n" not in str(e), str(e)
print("done")
"""


def test_hostile_containers_raise_never_crash(tmp_path):
    """Bit flips anywhere in a container: load raises BadInput / CheckFailed or (a flip in
    unused bytes) gives the checkpoint back; the interpreter survives (run in a child, so a
    crash is a failure of this test, not of the suite)."""
    good = tmp_path / "good.ckz.h5"
    ckptkit.save(torch.load(fixture_path("cnn_adamw.pt")), good)
    p = subprocess.run([sys.executable, "-c", HOSTILE, PKG, str(good), "1", str(tmp_path / "bad.ckz.h5"), "60"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "done" in p.stdout, (p.returncode, p.stderr[-2000:])


def test_libhdf5_crash_ends_only_the_reader(tmp_path):
    """Two object-header bytes that make libhdf5 itself die (SIGFPE in H5D__chunk_set_info on
    /manifest's chunked layout: dimensionality 0, or layout version 1;
    scripts/fixtures/make_bad_containers.py): load, verify and restore read containers in the
    helper process ckptkit-reader (python/ckptkit/reader.h), so each raises BadInput with the tools' line, leaves no
    output, and this interpreter goes on (the next load works)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
    import make_bad_containers
    good = tmp_path / "good.ckz.h5"
    ckptkit.save(torch.load(fixture_path("cnn_adamw.pt")), good)
    out = tmp_path / "out"
    out.mkdir()
    for at, value in ((2, 0), (0, 1)):
        bad = tmp_path / f"bad{at}{value}.ckz.h5"
        bad.write_bytes(good.read_bytes())
        make_bad_containers._layout_patch("manifest", at, value)(str(bad))
        before = bad.read_bytes()
        calls = {"ckptkit.load": lambda: ckptkit.load(bad),
                 "ckpt-verify": lambda: ckptkit.verify(bad),
                 "ckpt-restore": lambda: ckptkit.restore(bad, out / "r.pt")}
        for tool, call in calls.items():
            with pytest.raises(ckptkit.BadInput) as e:
                call()
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"{tool}: error: {bad}: "), msg
            assert msg.endswith(": fatal signal SIGFPE while processing it (a malformed container can crash "
                                "libhdf5); no output was written"), msg
            assert e.value.file == str(bad)
            assert os.listdir(out) == [], (tool, os.listdir(out))
        assert bad.read_bytes() == before
    assert set(ckptkit.load(good)["model"]) == set(torch.load(fixture_path("cnn_adamw.pt"))["model"])


def test_load_container_decodes_in_place(tmp_path, monkeypatch):
    """A container's torch zip is loaded with its storages as views of the restored buffer
    (no torch.load of a second copy), also under weights_only=True; storage sharing kept."""
    obj = torch.load(fixture_path("lm_adamw.pt"))
    ckptkit.save(obj, tmp_path / "c.ckz.h5")

    def no_copy(*a, **k):
        raise AssertionError("fell back to torch.load(io.BytesIO(...))")

    monkeypatch.setattr(ckptkit, "_torch_load", no_copy)
    for wo in (False, True):
        got = ckptkit.load(tmp_path / "c.ckz.h5", map_location="cpu", weights_only=wo)
        assert not tsc.compare_checkpoints(obj["model"], got["model"], check_zeros=True)
        assert got["optimizer"]["param_groups"] == obj["optimizer"]["param_groups"]
    tied = [k for k in got["model"] if k.endswith("weight")]
    ptrs = {}
    for k in tied:
        ptrs.setdefault(got["model"][k].data_ptr(), []).append(k)
    want = {}
    for k in tied:
        want.setdefault(obj["model"][k].data_ptr(), []).append(k)
    assert sorted(ptrs.values()) == sorted(want.values())


def test_background_error_is_the_futures(tmp_path):
    """A background save that fails raises from its Future (one line), leaves nothing, and
    gives its staging memory back for the next one."""
    import pathlib   # a global outside torch.load(weights_only=True)'s allowlist: strict refuses it
    fut = ckptkit.save({"w": torch.ones(100000), "p": pathlib.PurePosixPath("x")}, tmp_path / "x.ckz.h5",
                       background=True, strict=True)
    with pytest.raises(ckptkit.BadInput) as e:
        fut.result(timeout=300)
    _one_line(e.value)
    assert not (tmp_path / "x.ckz.h5").exists()
    _no_temporaries(tmp_path)
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    assert ckptkit.save(obj, tmp_path / "y.ckz.h5", background=True).result(timeout=300).ok
    ckptkit.release_staging()


def test_bad_corpus_raises_one_line(tmp_path):
    """Every malformed or hostile file of test/corpus/bad (truncated zips and pickles, os.system
    and eval globals, expansion bombs, bad safetensors headers, views past their storage):
    ckptkit.load raises BadInput with one line naming the file; none loads, nothing runs."""
    bad = os.path.join(ROOT, "test", "corpus", "bad")
    files = sorted(f for f in os.listdir(bad) if not f.endswith(".md"))
    assert len(files) > 50
    for f in files:
        path = os.path.join(bad, f)
        with pytest.raises(ckptkit.BadInput) as e:
            ckptkit.load(path)
        assert _one_line(e.value).startswith(f"ckptkit.load: error: {path}: "), f


def test_warnings_reach_python(tmp_path):
    """The library's warning lines (a state kept exact) come as CkptkitWarning and in
    Report.warnings, for synchronous and background saves."""
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    m = torch.nn.Linear(4, 4)
    nadam = torch.optim.NAdam(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    nadam.step()
    obj["nadam"] = nadam.state_dict()
    with pytest.warns(ckptkit.CkptkitWarning, match="kept exact: NAdam state"):
        rep = ckptkit.save(obj, tmp_path / "a.ckz.h5")
    assert any("NAdam" in w for w in rep.warnings)
    with pytest.warns(ckptkit.CkptkitWarning, match="kept exact: NAdam state"):
        ckptkit.save(obj, tmp_path / "b.ckz.h5", background=True).result(timeout=300)
    got = ckptkit.load(tmp_path / "b.ckz.h5")
    assert not tsc.compare_checkpoints(obj["nadam"], got["nadam"], check_zeros=True)   # kept exact: bit-equal


def test_legacy_format_container(tmp_path):
    """A legacy (_use_new_zipfile_serialization=False) checkpoint compressed by the CLI's job
    loads back through torch's own legacy reader, also under weights_only=True."""
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    torch.save(obj, tmp_path / "leg.pt", _use_new_zipfile_serialization=False)
    assert ckptkit.compress(tmp_path / "leg.pt", tmp_path / "leg.ckz.h5").ok
    for wo in (False, True):
        _assert_same_step("cnn_adamw.pt", obj, ckptkit.load(tmp_path / "leg.ckz.h5", weights_only=wo),
                          fixture_path("cnn_adamw.pt"))


def test_gpu_storages_are_read_in_pieces(tmp_path, monkeypatch):
    """Storages off the host (no GPU here: every storage of the fixture reports device
    cuda:0, so torch pickles it with location 'cuda:0' and its serializer asks for a
    whole-storage `storage.cpu()`, as for a real CUDA tensor; python/ckptkit/_device.py
    reads it through `device_bytes`, here its host memory): save never makes the whole
    copy, reads in pieces of at most CHUNK bytes, and writes what torch.save writes,
    CRC-32 fields included (the restored file equals the restore of torch.save(obj,
    buffer)'s bytes compressed by ckpt-compress, byte for byte; every zip CRC checks); a
    background save is the same container; the state loads (map_location='cpu') within
    tolerance of one real AdamW step."""
    import zipfile
    from ckptkit import _device
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    fake = set()
    sizes = []
    for path, t in tsc._walk(obj):
        if isinstance(t, torch.Tensor):
            fake.add(t.untyped_storage()._cdata if hasattr(t, "untyped_storage") else t.storage()._storage._cdata)
            sizes.append(t.storage().nbytes())
    real_device, real_cpu = torch._C.StorageBase.device, torch.UntypedStorage.cpu
    monkeypatch.setattr(torch.UntypedStorage, "device", property(
        lambda st: torch.device("cuda", 0) if st._cdata in fake else real_device.__get__(st)))
    buf = io.BytesIO()
    torch.save(obj, buf)   # the reference: torch's own whole-storage copies
    assert buf.getvalue().count(b"cuda:0") == len(fake)
    (tmp_path / "ref.pt").write_bytes(buf.getvalue())

    def no_whole_copy(st):
        assert st._cdata not in fake, "a whole-storage copy to the host"
        return real_cpu(st)
    pieces = []

    class Device:   # a storage's bytes "on the device": records each piece read
        def __init__(self, st):
            self.t = torch.empty(0, dtype=torch.uint8).set_(st)

        def __getitem__(self, s):
            pieces.append(s.stop - s.start)
            return self.t[s]
    monkeypatch.setattr(torch.UntypedStorage, "cpu", no_whole_copy)
    monkeypatch.setattr(_device, "device_bytes", Device)
    monkeypatch.setattr(_device, "CHUNK", 4096)
    rep = ckptkit.save(obj, tmp_path / "a.ckz.h5")
    assert rep.ok and rep.moment_reduction > 0.5
    assert max(pieces) == 4096 and sum(pieces) >= 2 * sum(sizes)   # the CRC pass, then the compressor's reads
    assert ckptkit.save(obj, tmp_path / "b.ckz.h5", background=True).result().ok
    assert (tmp_path / "b.ckz.h5").read_bytes() == (tmp_path / "a.ckz.h5").read_bytes()
    assert ckptkit.verify(tmp_path / "a.ckz.h5", original=tmp_path / "ref.pt").ok
    ckptkit.restore(tmp_path / "a.ckz.h5", tmp_path / "a.pt")
    ckptkit.compress(tmp_path / "ref.pt", tmp_path / "ref.ckz.h5")
    ckptkit.restore(tmp_path / "ref.ckz.h5", tmp_path / "ref_r.pt")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "ref_r.pt").read_bytes()
    assert zipfile.ZipFile(tmp_path / "a.pt").testzip() is None
    monkeypatch.undo()
    _assert_same_step("cnn_adamw.pt", obj, ckptkit.load(tmp_path / "a.ckz.h5", map_location="cpu"),
                      fixture_path("cnn_adamw.pt"))


def test_error_inside_torch_writer_raises_without_abort(tmp_path):
    """An exception while torch's zip writer writes into the save (here MemoryError on its
    third write) is raised by save, nothing is left at the path, and the interpreter goes on
    and exits normally (torch's writer, left unfinished, would abort the process in its
    destructor: the sink keeps the error and lets torch finish)."""
    code = f"""
import gc, sys, torch
sys.path.insert(0, {PKG!r})
import ckptkit
obj = torch.load({fixture_path("cnn_adamw.pt")!r})
calls = [0]
orig = ckptkit._Sink._write
def failing(self, b):
    calls[0] += 1
    if calls[0] == 3:
        raise MemoryError("injected")
    return orig(self, b)
ckptkit._Sink._write = failing
try:
    ckptkit.save(obj, {str(tmp_path / "x.ckz.h5")!r})
except MemoryError as e:
    print("raised", e)
gc.collect()
ckptkit._Sink._write = orig
print("then", ckptkit.save(obj, {str(tmp_path / "y.ckz.h5")!r}).ok)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split("\n")[:2] == ["raised injected", "then True"], r.stdout
    assert sorted(os.listdir(tmp_path)) == ["y.ckz.h5"]



def test_public_fallbacks_forced_give_the_same(tmp_path, monkeypatch):
    """python/ckptkit/_torch.py's public fallbacks, forced (PUBLIC, as CKPTKIT_TORCH_PUBLIC=1
    sets it): torch.save into the sink copying every byte (nothing read in place) and torch.load
    of a file object over the restored bytes give the same container, byte for byte, and the
    same loaded checkpoint as this torch's adapter (which does read storages in place)."""
    from ckptkit import _torch
    obj = torch.load(fixture_path("lm_adamw.pt"))
    obj["ema"] = torch.randn(1 << 15)   # a storage of >= 64 KiB: read in place by the adapter
    assert ckptkit._serialize(obj, borrow=True).borrowed == 1 << 17
    ckptkit.save(obj, tmp_path / "a.ckz.h5")
    a = ckptkit.load(tmp_path / "a.ckz.h5")
    monkeypatch.setattr(_torch, "PUBLIC", True)
    copies = []
    load_copy = _torch.load_copy
    monkeypatch.setattr(_torch, "load_copy", lambda *x: copies.append(1) or load_copy(*x))
    assert ckptkit._serialize(obj, borrow=True).borrowed == 0
    ckptkit.save(obj, tmp_path / "b.ckz.h5")
    assert (tmp_path / "b.ckz.h5").read_bytes() == (tmp_path / "a.ckz.h5").read_bytes()
    b = ckptkit.load(tmp_path / "b.ckz.h5")
    assert copies
    assert not tsc.compare_checkpoints(a, b, check_zeros=True)


def test_load_arguments_mean_what_torch_load_makes_them_mean(tmp_path):
    """ckptkit.load(container, map_location, weights_only, mmap) equals torch.load of the
    restored file with the same arguments, for each argument form this torch has (torch 1.13:
    no mmap, weights_only False or True)."""
    import inspect
    obj = torch.load(fixture_path("cnn_adamw.pt"))
    ckptkit.save(obj, tmp_path / "c.ckz.h5")
    ckptkit.restore(tmp_path / "c.ckz.h5", tmp_path / "r.pt")
    has_mmap = "mmap" in inspect.signature(torch.load).parameters
    cases = [dict(), dict(map_location="cpu"), dict(map_location=lambda storage, loc: storage),
             dict(map_location={"cpu": "cpu"}), dict(weights_only=True), dict(weights_only=False)]
    if has_mmap:
        cases += [dict(mmap=True), dict(mmap=False), dict(mmap=True, weights_only=False, map_location="cpu")]
    for kw in cases:
        got = ckptkit.load(tmp_path / "c.ckz.h5", **kw)
        # torch 1.13's own weights_only unpickler refuses every optimizer state (no BINFLOAT);
        # ckptkit's allowlist check stands in for it there (docs/python.md)
        want_kw = kw if has_mmap or not kw.get("weights_only") else {**kw, "weights_only": False}
        want = torch.load(str(tmp_path / "r.pt"), **want_kw)
        assert not tsc.compare_checkpoints(want, got, check_zeros=True), kw


class _NotAllowlisted:
    pass


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2, reason="torch 1.13: ckptkit's own weights_only reader")
def test_load_weights_only_refusal_is_one_line_with_the_global(tmp_path):
    """torch.load(weights_only=True) refusing a global: one line, no terminal escapes, naming
    the global and the two ways on (torch's own message spans 8 lines)."""
    path = tmp_path / "obj.pt"
    torch.save({"a": torch.zeros(2), "o": _NotAllowlisted()}, path)
    with pytest.raises(ckptkit.BadInput) as e:
        ckptkit.load(path, weights_only=True)
    msg = str(e.value)
    assert "\n" not in msg and "\x1b" not in msg, msg
    assert msg.startswith(f"ckptkit.load: error: {path}: torch.load(weights_only=True) refused it: Unsupported global: "
                          f"GLOBAL {__name__}._NotAllowlisted was not an allowed global by default; if you trust the "
                          "file, pass weights_only=False or allowlist the global"), msg
    assert ckptkit.load(path, weights_only=False)["a"].equal(torch.zeros(2))
