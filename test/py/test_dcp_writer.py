"""ckptkit.dcp.FileSystemWriter / FileSystemReader in REAL torch >= 2.4 processes (gloo, CPU).

scripts/fixtures/make_dcp_torch2.py save-writer: 4 FSDP2 ranks train make_dcp_torch2's Net
(AdamW, 2 groups; the 25-row layer in chunks of 7, 6, 6, 6) and save the same state with
torch's FileSystemWriter (plain), ckptkit's writer (ck), ckptkit's writer under
dcp.async_save while the ranks train on (ck_async), and ckptkit's writer with rank 3 failing
after its files are written (ck_failed). Then fresh processes load ck with ckptkit's reader on
1, 2 and 4 ranks, and torch's reader loads plain and ckpt-restore's plain folder. Skipped
under torch < 2.4.
"""
import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch

from test_dcp_torch2 import _moment_ranges, _script, _version, assert_state_close  # noqa: E402

if _version(torch.__version__) < (2, 4):
    pytest.skip(f"torch {torch.__version__} < 2.4: no DCP storage writer API to subclass; these tests run "
                "under .venv/bin/python (torch 2.x)", allow_module_level=True)

import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptkit  # noqa: E402
import ckptkit.dcp  # noqa: E402
import make_dcp_torch2 as m2  # noqa: E402
from testlib import parse_json_stdout, require_ckptkit_bin, run_tool  # noqa: E402

WORLDS = (1, 2, 4)


@pytest.fixture(scope="session")
def wr(tmp_path_factory):
    """The folders, ckpt-verify / ckpt-restore runs and the loads, done once; tests assert."""
    b = os.environ.get("CKPTKIT_BIN", "")
    root = tmp_path_factory.mktemp("dcp_writer")
    res = {"root": root, "save": _script("save-writer", root)}
    if res["save"].returncode != 0 or not os.access(os.path.join(b, "ckpt-verify"), os.X_OK):
        return res
    for d in ("ck", "ck_async", "ck_async_process"):
        res["verify_" + d] = run_tool(b, "ckpt-verify", root / d, "--original", root / "plain", "--json", timeout=300)
    res["restore"] = run_tool(b, "ckpt-restore", root / "ck", "-o", root / "ck.back", timeout=300)
    res["verify_failed"] = run_tool(b, "ckpt-verify", root / "ck_failed", timeout=300)
    spec = {"1": [["flat", str(root / "plain"), str(root / "plain.1.pt")],
                  ["flat", str(root / "ck.back"), str(root / "back.1.pt")]]}
    for w in WORLDS:
        spec.setdefault(str(w), []).append(["flat", str(root / "ck"), str(root / f"ck.{w}.pt")])
    with open(root / "load.json", "w") as f:
        json.dump(spec, f)
    res["load"] = _script("load", root / "load.json")
    return res


def _ok(wr, *keys):
    require_ckptkit_bin()
    for k in ("save",) + keys:
        p = wr[k]
        assert p.returncode == 0, f"{k}: exit {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
    return wr["root"]


def _loaded(wr, name):
    _ok(wr, "load")
    return torch.load(wr["root"] / f"{name}.pt", weights_only=True)


def _same_state(a, b):
    """{"model", "optim"} states equal: every tensor torch.equal, param_groups ==."""
    assert list(a["model"]) == list(b["model"])
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert a["optim"]["param_groups"] == b["optim"]["param_groups"]
    assert sorted(a["optim"]["state"]) == sorted(b["optim"]["state"])
    for i, st in a["optim"]["state"].items():
        assert sorted(st) == sorted(b["optim"]["state"][i])
        for k, v in st.items():
            assert torch.equal(v, b["optim"]["state"][i][k]), (i, k)


def _save_dir(d):
    """The folder of the save in the ckptkit.dcp folder `d` (its manifest's save_dir)."""
    return d / json.loads((d / "ckptkit-folder.json").read_text())["save_dir"]


def test_folder_and_verify(wr):
    """Each rank's moments are one container, each .distcp file a shell; ckpt-verify --original
    (a plain DCP save of the same state) passes: every certificate within tolerance, the
    shells rebuild torch's own bytes, .metadata maps the same items."""
    root = _ok(wr, "verify_ck")
    save = _save_dir(root / "ck")
    assert sorted(os.listdir(root / "ck")) == sorted([".metadata", "ckptkit-folder.json", save.name])
    names = sorted(os.listdir(save))
    assert names == sorted([f"__{r}_0.distcp.ckz-shell" for r in range(4)]
                           + [f"ckptkit-dcp-moments-{r}-0.safetensors.ckz.h5" for r in range(4)]), names
    rep = parse_json_stdout(wr["verify_ck"])
    assert rep["ok"] and rep["max_bound_lr"] <= 0.01, rep
    rows = {r["file"]: r for r in rep["files"]}
    assert rows[".metadata"]["note"] == "storage_data the same as the original's"
    virtual = [r for r in rows.values() if r["virtual_input"]]
    assert len(virtual) == 4 and sum(v["moment_values"] for v in virtual) == 2 * sum(
        p.numel() for p in m2.Net().parameters()), virtual
    assert all(0 < v["moment_bytes_out"] < v["moment_bytes_fp32"] == 4 * v["moment_values"] for v in virtual), virtual


@pytest.mark.parametrize("name", ["ck_async", "ck_async_process"])
def test_async_save_is_the_state_at_the_call(wr, name):
    """dcp.async_save with ckptkit's writer (thread mode, the ranks training on while it
    writes; process mode) gives the bytes of the synchronous save of the state at the call
    (all but .metadata's save_id / checkpoint_id and the manifest's row of it)."""
    root = _ok(wr, "verify_" + name)
    assert parse_json_stdout(wr["verify_" + name])["ok"]
    a, b = _save_dir(root / "ck"), _save_dir(root / name)
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for f in os.listdir(a):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    rows = [{r["path"]: dict(r, stored=os.path.basename(r["stored"]))
             for r in json.loads((d.parent / "ckptkit-folder.json").read_text())["files"]} for d in (a, b)]
    assert {k: v for k, v in rows[0].items() if k != ".metadata"} == {k: v for k, v in rows[1].items()
                                                                      if k != ".metadata"}


def test_restore_gives_the_plain_folder(wr):
    """ckpt-restore gives torch's plain folder: each .distcp file identical to the plain
    save's outside its moment items, .metadata's storage_data the same; torch's own reader
    loads it into exactly what ckptkit's reader gives."""
    root = _ok(wr, "restore")
    back, plain = root / "ck.back", root / "plain"
    assert sorted(os.listdir(back)) == sorted(os.listdir(plain))
    ranges = _moment_ranges(plain)
    assert _moment_ranges(back) == ranges
    for f, rs in ranges.items():
        x, y = (plain / f).read_bytes(), (back / f).read_bytes()
        assert len(x) == len(y) and x != y, f
        pos = 0
        for lo, hi in sorted(rs) + [(len(x), len(x))]:
            assert x[pos:lo] == y[pos:lo], f"{f}: bytes outside the moment items differ"
            pos = hi
    _same_state(_loaded(wr, "back.1"), _loaded(wr, "ck.1"))


@pytest.mark.parametrize("world", WORLDS)
def test_reader_reshards(wr, world):
    """ckptkit's reader on 1, 2 and 4 ranks (saved by 4) gives the same state each time, and
    against the plain save's: model, step and param_groups identical, moments within their
    certificates (real AdamW steps within tolerance * lr: assert_state_close)."""
    o, r, one = _loaded(wr, "plain.1"), _loaded(wr, f"ck.{world}"), _loaded(wr, "ck.1")
    _same_state(one, r)
    assert_state_close(o, r, "fsdp2_flat")   # (its optimizer steps change r's step in place)


def test_failed_rank_leaves_no_checkpoint(wr):
    """Rank 3 raises after writing its files: DCP fails the save on every rank, finish never
    runs, so there is no .metadata and no manifest; ckptkit's reader and ckpt-verify refuse
    the folder with one line naming it (exit 2); the earlier checkpoint still verifies."""
    root = _ok(wr, "verify_ck")
    failed = (root / "failed.txt").read_text()
    assert failed.startswith("CheckpointException") and "rank 3 fails after writing its files" in failed, failed
    d = root / "ck_failed"
    assert not (d / ".metadata").exists() and not (d / "ckptkit-folder.json").exists()
    with pytest.raises(ckptkit.FileNotFound) as e:
        ckptkit.dcp.FileSystemReader(d).read_metadata()
    assert str(e.value) == f"ckptkit.dcp: error: {d}: no .metadata: not a DCP checkpoint, or a save that did not finish"
    p = wr["verify_failed"]
    assert p.returncode == 2 and p.stderr.startswith(f"ckpt-verify: error: {d}"), p.stderr


def test_killed_rank_leaves_no_checkpoint(tmp_path):
    """2 ranks; rank 1 exits at once (os._exit(9), like a SIGKILL) after writing its files:
    rank 0's save fails (gloo loses its peer), the new folder has no .metadata and is refused,
    the previous checkpoint verifies and loads."""
    require_ckptkit_bin()
    p = _script("save-killed", tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    what = (tmp_path / "killed.txt").read_text()
    assert what != "the save did not fail" and what.split(":")[0] in ("RuntimeError", "CheckpointException",
                                                                      "DistBackendError"), what
    assert not (tmp_path / "ck_killed" / ".metadata").exists()
    with pytest.raises(ckptkit.FileNotFound, match="a save that did not finish"):
        ckptkit.dcp.FileSystemReader(tmp_path / "ck_killed").read_metadata()
    v = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", tmp_path / "ck_prev", "--json", timeout=300)
    assert v.returncode == 0 and parse_json_stdout(v)["ok"], v.stdout + v.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m2.load_here([("plain", str(tmp_path / "ck_prev"), str(tmp_path / "prev.pt"))])
    prev = torch.load(tmp_path / "prev.pt", weights_only=True)
    assert sorted(prev["optim"]["state"]) == list(range(len(m2.param_names())))
    assert all(float(st["step"]) == m2.STEPS for st in prev["optim"]["state"].values())


def _single_process_load(folder, out):
    """make_dcp_torch2's 1-rank load of the flat form (ckptkit's reader), here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m2.load_here([("flat", str(folder), str(out))])


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing", "flip-moments", "flip-no-units", "units-short"])
def test_damaged_file_refused(wr, tmp_path, damage):
    """A shell with one byte flipped (checked by its manifest's xxh3_units as it is read),
    cut short, or missing, or a gathered-moments container with one byte flipped (the reader
    decodes the moments from it, no file rebuilt), or a shell flipped in a folder whose
    manifest predates xxh3_units (checked whole): the load fails naming the file."""
    root = _ok(wr)
    d = tmp_path / "ck"
    shutil.copytree(root / "ck", d)
    shell = _save_dir(d) / ("ckptkit-dcp-moments-2-0.safetensors.ckz.h5" if damage == "flip-moments" else "__2_0.distcp.ckz-shell")
    if damage == "flip-no-units":
        man = json.loads((d / "ckptkit-folder.json").read_text())
        for row in man["files"]:
            assert ("xxh3_units" in row) == (row.get("shell", False) or row["path"].endswith(".distcp")), row
            row.pop("xxh3_unit", None), row.pop("xxh3_units", None)
        (d / "ckptkit-folder.json").write_text(json.dumps(man))
    if damage == "units-short":   # a manifest whose unit hashes do not cover the shell: refused, not skipped
        man = json.loads((d / "ckptkit-folder.json").read_text())
        next(r for r in man["files"] if r["stored"].endswith("__2_0.distcp.ckz-shell"))["xxh3_units"].pop()
        (d / "ckptkit-folder.json").write_text(json.dumps(man))
    if damage.startswith("flip"):
        data = bytearray(shell.read_bytes())
        data[100] ^= 1
        shell.write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(shell, shell.stat().st_size - 1)
    else:
        shell.unlink()
    with pytest.raises(BaseException) as e:   # DCP wraps it in CheckpointException (a BaseException)
        _single_process_load(d, tmp_path / "out.pt")
    msg = str(e.value)
    size = shell.stat().st_size if shell.exists() else None
    want = {"flip": f"ckptkit.dcp: check failed: {d}: {shell}: xxh3 of bytes 0..{size} ",
            "truncate": f"ckptkit.dcp: check failed: {d}: {shell}: size {size} differs from the manifest's {size and size + 1}",
            "flip-moments": f"ckptkit.dcp: check failed: {d}: {shell}: size/xxh3",
            "missing": f"ckptkit.dcp: error: {shell}: missing (listed in the manifest)",
            "flip-no-units": f"ckptkit.dcp: check failed: {d}: {shell}: size/xxh3",
            "units-short": f"ckptkit.dcp: error: {d / 'ckptkit-folder.json'}: manifest xxh3_units of "
                           f"{shell.relative_to(d)} do not cover its size"}[damage]
    assert want in msg, msg
    assert not (tmp_path / "out.pt").exists()


def test_verify_checks_the_unit_hashes(wr, tmp_path):
    """ckpt-verify holds a shell to its manifest's xxh3_units as well as to its xxh3: one unit
    hash changed in the manifest fails the shell's row, naming the bytes; the files are as
    saved, so every other row stays ok."""
    d = tmp_path / "ck"
    shutil.copytree(_ok(wr) / "ck", d)
    man = json.loads((d / "ckptkit-folder.json").read_text())
    row = next(r for r in man["files"] if r.get("shell"))
    assert row["xxh3_unit"] == 4 << 20 and len(row["xxh3_units"]) == -(-row["size"] // row["xxh3_unit"]), row
    good = row["xxh3_units"][-1]
    row["xxh3_units"][-1] = f"{int(good, 16) ^ 1:016x}"
    (d / "ckptkit-folder.json").write_text(json.dumps(man))
    v = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", d, "--json", timeout=300)
    rep = parse_json_stdout(v)
    assert v.returncode == 1 and not rep["ok"], v.stdout
    bad = [f for f in rep["files"] if not f["ok"]]
    last = (len(row["xxh3_units"]) - 1) * row["xxh3_unit"]
    assert [f["file"] for f in bad] == [row["path"]], bad
    assert f"xxh3 of bytes {last}..{row['size']} {good} differs from the manifest's {row['xxh3_units'][-1]}" in bad[0]["note"], bad


def test_span():
    """The reader's contiguous-run test for a read item's region of a stored chunk (row-major):
    (first element, count), or None where the region is not one run."""
    assert ckptkit.dcp._span([4, 6], [1, 0], [2, 6]) == (6, 12)
    assert ckptkit.dcp._span([4, 6], [2, 3], [1, 2]) == (15, 2)
    assert ckptkit.dcp._span([4, 6, 5], [3, 1, 0], [1, 2, 5]) == (95, 10)
    assert ckptkit.dcp._span([7], [2], [3]) == (2, 3)
    assert ckptkit.dcp._span([], [], []) == (0, 1)
    assert ckptkit.dcp._span([4, 6], [0, 2], [4, 3]) is None
    assert ckptkit.dcp._span([4, 6, 5], [0, 0, 1], [1, 6, 4]) is None


def test_no_adam_state_written_exactly(tmp_path):
    """SGD with momentum (no Adam moments): one CkptkitWarning, from the coordinator for the
    whole save (not one per rank: under DDP, DCP's dedup leaves some ranks without moments
    while others compress theirs), every file torch's own bytes, ckptkit's reader gives the
    state back exactly."""
    torch.manual_seed(0)
    model = m2.Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    m2.train(model, opt, 0)
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        dcp.save(sd, storage_writer=ckptkit.dcp.FileSystemWriter(tmp_path / "ck"))
        dcp.save(sd, checkpoint_id=tmp_path / "plain")
    ours = [str(x.message) for x in w if issubclass(x.category, ckptkit.CkptkitWarning)]
    assert ours == [f"ckptkit.dcp: {tmp_path / 'ck'}: no Adam/AdamW moments compressed (no rank's state has any); "
                    "the files are written exactly"], ours
    assert (_save_dir(tmp_path / "ck") / "__0_0.distcp").read_bytes() == (tmp_path / "plain" / "__0_0.distcp").read_bytes()
    torch.manual_seed(9)
    model2 = m2.Net()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    m2._zero_step(model2, opt2)
    back = {"model": model2.state_dict(), "optim": opt2.state_dict()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(back, storage_reader=ckptkit.dcp.FileSystemReader(tmp_path / "ck"))
    _same_state(back, sd)


def test_adam_state_compressed_without_warning(tmp_path):
    """AdamW (one process): no CkptkitWarning (the "no Adam/AdamW moments" note is for states
    without them), the moments gathered into one container, a shell in place of the file."""
    torch.manual_seed(0)
    model = m2.Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    m2.train(model, opt, 0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                 storage_writer=ckptkit.dcp.FileSystemWriter(tmp_path / "ck"))
    assert [str(x.message) for x in w if issubclass(x.category, ckptkit.CkptkitWarning)] == []
    assert sorted(os.listdir(_save_dir(tmp_path / "ck"))) == [
        "__0_0.distcp.ckz-shell", "ckptkit-dcp-moments-0-0.safetensors.ckz.h5"]


def test_writer_options_checked(tmp_path):
    """The compress options are checked when the writer is made, as ckpt-compress's flags."""
    with pytest.raises(ckptkit.BadInput, match=r"^ckptkit.dcp: error: tolerance=2: outside \(0, 1\]"):
        ckptkit.dcp.FileSystemWriter(tmp_path / "x", tolerance=2)
    with pytest.raises(TypeError, match="unknown option"):
        ckptkit.dcp.FileSystemWriter(tmp_path / "x", tolerence=0.1)
    # an override torch.optim.Adam refuses: here, not when a rank's save meets the state
    for kw, msg in (({"lr": -1}, "lr=-1: -1 is < 0"), ({"beta2": 1.0}, "beta2=1.0: 1 is outside [0, 1)"),
                    ({"eps": float("inf")}, "eps=inf: inf is not a finite number"),
                    ({"weight_decay": -0.01}, "weight_decay=-0.01: -0.01 is < 0")):
        with pytest.raises(ckptkit.BadInput) as e:
            ckptkit.dcp.FileSystemWriter(tmp_path / "x", **kw)
        assert str(e.value) == f"ckptkit.dcp: error: {msg}"
    assert not (tmp_path / "x").exists()
    try:   # device="cuda": refused here, not mid-save, where no CUDA device can be used
        ckptkit._ckptkit.check_device("cuda")
        ckptkit.dcp.FileSystemWriter(tmp_path / "x", device="cuda")
    except ValueError as why:
        with pytest.raises(ckptkit.BadInput) as e:
            ckptkit.dcp.FileSystemWriter(tmp_path / "x", device="cuda")
        assert str(e.value) == f"ckptkit.dcp: error: {why}" and str(why).startswith("--device cuda: no CUDA device (")


def test_shell_offsets():
    """Where a byte range of a .distcp file lies in its shell (the file without its cuts), as
    ckpt-verify and the reader take it: its offset less the cut bytes before it, -1 where it
    overlaps a cut; every window of a small file against the bytes themselves."""
    data = bytes(range(256)) * 2
    cuts = [{"offset": 40, "length": 24, "tensor": "a", "crc_offsets": []},
            {"offset": 64, "length": 8, "tensor": "b", "crc_offsets": []},
            {"offset": 300, "length": 100, "tensor": "c", "crc_offsets": []}]
    shell = data[:40] + data[72:300] + data[400:]
    items = [(lo, n) for lo in range(0, len(data) + 1, 3) for n in (0, 1, 5, 24, 37, 600) if lo + n <= len(data)]
    got = ckptkit.dcp._ckptkit.shell_offsets(json.dumps(cuts), items)
    for (lo, n), at in zip(items, got):
        hit = any(c["offset"] < lo + n and lo < c["offset"] + c["length"] for c in cuts)
        assert (at == -1) == hit, (lo, n, at)
        if not hit:
            assert shell[at:at + n] == data[lo:lo + n], (lo, n, at)
    with pytest.raises(ValueError, match="out of order"):
        ckptkit.dcp._ckptkit.shell_offsets(json.dumps(cuts[::-1]), [(0, 1)])


def test_rank_threads(tmp_path, monkeypatch):
    """Threads per rank: the node's cores shared among LOCAL_WORLD_SIZE ranks (at least 1),
    all of them (0) when it is unset, `threads` when given; the reader checks it."""
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert ckptkit.dcp.FileSystemReader(tmp_path)._threads == 0
    assert ckptkit.dcp.FileSystemWriter(tmp_path / "w")._opts["threads"] == 0
    for local in (1, 2, 4, 64):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        assert ckptkit.dcp.FileSystemReader(tmp_path)._threads == max(1, cores // local)
        assert ckptkit.dcp.FileSystemWriter(tmp_path / "w")._opts["threads"] == max(1, cores // local)
    assert ckptkit.dcp.FileSystemReader(tmp_path, threads=3)._threads == 3
    assert ckptkit.dcp.FileSystemReader(tmp_path, threads=np.int64(2))._threads == 2   # any integer type
    assert ckptkit.dcp.FileSystemWriter(tmp_path / "w", threads=5)._opts["threads"] == 5
    with pytest.raises(ckptkit.BadInput, match=r"^ckptkit.dcp: error: threads=0: not a count"):
        ckptkit.dcp.FileSystemReader(tmp_path, threads=0)


def test_failed_save_over_a_checkpoint_keeps_it(tmp_path):
    """One process saves over a folder: first a plain torch DCP save, then ckptkit's (the
    plain .distcp files are removed once its .metadata is in place), then a save that fails
    after writing its files (write_data raised): the folder still loads the state of the
    last good save bit for bit, ckpt-verify passes with a note on the failed save's leftovers,
    and the next good save removes them and the files of the save it replaces: the folder
    then holds .metadata, the manifest and one ckptkit-<tag>/ folder."""
    import torch.distributed.checkpoint as dcp
    require_ckptkit_bin()
    d = tmp_path / "ck"
    torch.manual_seed(0)
    model = m2.Net()
    opt = m2.make_optimizer(model)
    m2.train(model, opt, 0)
    state = lambda: {"model": model.state_dict(), "optim": opt.state_dict()}   # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state(), checkpoint_id=d)
        assert (d / "__0_0.distcp").exists()
        dcp.save(state(), storage_writer=ckptkit.dcp.FileSystemWriter(d))
        good = sorted(os.listdir(d))
        m2.load_here([("plain", str(d), str(tmp_path / "good.pt"))])
        m2.train(model, opt, 0, steps=2)

        class Failing(ckptkit.dcp.FileSystemWriter):
            def write_data(self, plan, planner):
                super().write_data(plan, planner).wait()
                raise RuntimeError("the save fails after writing its files")

        with pytest.raises(BaseException, match="the save fails after writing its files"):
            dcp.save(state(), storage_writer=Failing(d))
        m2.load_here([("plain", str(d), str(tmp_path / "after_failed.pt"))])
    assert "__0_0.distcp" not in good and len([n for n in good if n.startswith("ckptkit-")]) == 2, good
    a, b = torch.load(tmp_path / "good.pt", weights_only=True), torch.load(tmp_path / "after_failed.pt", weights_only=True)
    assert _flat(a) and all(torch.equal(x, y) for x, y in zip(_flat(a), _flat(b)))
    leftovers = sorted(set(os.listdir(d)) - set(good))
    assert leftovers and all(n.startswith(".ckptkit-") for n in leftovers), leftovers
    v = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", d, "--json", timeout=300)
    rep = parse_json_stdout(v)
    assert v.returncode == 0 and rep["ok"] and rep["notes"], v.stdout + v.stderr
    assert all("left by a ckptkit.dcp save that did not finish" in n for n in rep["notes"]), rep["notes"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state(), storage_writer=ckptkit.dcp.FileSystemWriter(d))
        m2.load_here([("plain", str(d), str(tmp_path / "new.pt"))])
    names = set(os.listdir(d)) - {".metadata", "ckptkit-folder.json"}
    assert len(names) == 1 and (d / next(iter(names))).is_dir() and not names & set(good), (names, good)
    v = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", d, "--json", timeout=300)
    rep = parse_json_stdout(v)
    assert v.returncode == 0 and rep["ok"] and rep["notes"] == [], v.stdout + v.stderr
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    assert all(torch.equal(new["model"][k], model.state_dict()[k]) for k in new["model"])


def _flat(sd):
    """Every tensor of a loaded {"model", "optim"} state, in a fixed order."""
    out = [sd["model"][k] for k in sorted(sd["model"])]
    for i in sorted(sd["optim"]["state"]):
        st = sd["optim"]["state"][i]
        out += [torch.as_tensor(st[k]) for k in sorted(st)]
    return out


def test_reader_names_a_missing_or_wrong_path(tmp_path):
    """The reader's first read (read_metadata): a path that does not exist, or a file, is
    refused as such (FileNotFound / NotADirectory, both BadInput), not as a folder without
    .metadata."""
    with pytest.raises(ckptkit.FileNotFound) as e:
        ckptkit.dcp.FileSystemReader(tmp_path / "nope").read_metadata()
    assert str(e.value) == f"ckptkit.dcp: error: {tmp_path / 'nope'}: no such folder"
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ckptkit.NotADirectory, match=r"^ckptkit.dcp: error: .*/f: not a folder"):
        ckptkit.dcp.FileSystemReader(tmp_path / "f").read_metadata()


def test_rank_error_names_the_checkpoint(tmp_path):
    """An option the save's state contradicts (lr=0.5 against the state's 1e-3) fails the save
    with one line naming the checkpoint folder and the rank, not the writer's staging paths;
    nothing is left but the writer's own leftovers (no .metadata, no manifest)."""
    torch.manual_seed(0)
    model = m2.Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    m2.train(model, opt, 0)
    d = tmp_path / "ck"
    with pytest.raises(BaseException) as e:
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                 storage_writer=ckptkit.dcp.FileSystemWriter(d, lr=0.5))
    msg = str(e.value)
    assert f"ckptkit.dcp: error: {d}: rank 0: --lr 0.5 contradicts the file's lr = 0.001" in msg, msg
    assert ".ckptkit-" not in msg.split("contradicts")[0], msg
    assert not (d / ".metadata").exists() and not (d / "ckptkit-folder.json").exists()


def test_rank_warning_names_the_checkpoint(tmp_path):
    """A rank's compress warning (log8 escaping every value of this tiny state) names the
    checkpoint folder, the rank and the gathered moments file, not the staging paths."""
    torch.manual_seed(0)
    model = m2.Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    m2.train(model, opt, 0)
    d = tmp_path / "ck"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                 storage_writer=ckptkit.dcp.FileSystemWriter(d, codec="log8"))
    ours = [str(x.message) for x in w if issubclass(x.category, ckptkit.CkptkitWarning)]
    assert ours and all(m.startswith(f"warning: {d}: rank 0: ckptkit-dcp-moments-0-0.safetensors: ") and ".ckptkit-" not in m
                        for m in ours), ours


def test_shell_opened_by_its_name_reads_the_restored_file(wr):
    """A .distcp file stored as a shell, opened under its original name through the reader's
    file system (where a read item overlaps a moment storage the reader does not decode
    itself), reads exactly the file ckpt-restore writes."""
    root = _ok(wr, "restore")
    reader = ckptkit.dcp.FileSystemReader(root / "ck")
    files = sorted(_moment_ranges(root / "plain"))
    assert files
    for f in files:
        with reader.fs.create_stream(root / "ck" / f, "rb") as s:
            s.seek(7)
            head = s.read(100)
            s.seek(0)
            got = s.read()
        want = (root / "ck.back" / f).read_bytes()
        assert got == want and head == want[7:107], f
