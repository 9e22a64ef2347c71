"""DCP folders written and read by REAL torch >= 2.4 processes (scripts/fixtures/make_dcp_torch2.py).

The folders of test_folders.py are hand-built with torch 1.13's legacy writer; these are
written by torch 2.x's public API from real processes (gloo, a file:// store, CPU):
  fsdp2_flat     2 FSDP2 ranks (fully_shard), get_state_dict(model, opt,
                 options=StateDictOptions(flatten_optimizer_state_dict=True)) + dcp.save
  fsdp2_default  the same ranks, get_state_dict's default (unflattened) optimizer form
  plain          1 process, dcp.save({"model": model.state_dict(), "optim": opt.state_dict()})
                 (int state ids)
  plain_tlr      the same with lr=torch.tensor(...): each group's lr a 0-d tensor item
The model is nn.Sequential (FQNs 0.weight, 2.bias, ...: digits like the group and state
indices), AdamW with 2 groups (decayed weights lr 1e-3, undecayed biases lr 2e-3); its last
layer has 25 rows, so FSDP2 chunks are uneven (13 + 12).
Each folder goes through ckpt-compress --json -> ckpt-verify --original -> ckpt-restore; torch's
own DCP (dcp.load + set_state_dict, in fresh processes) loads the original and the restored
folder with 1 rank (the FSDP2 folders were saved by 2) and the restored folders again with 2
FSDP2 ranks (the plain ones were saved by 1); real AdamW steps from both states match within
tolerance * lr. Skipped under torch < 2.4 (Debian's torch 1.13 runs the same suite).
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch


def _version(v):
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:2])


if _version(torch.__version__) < (2, 4):
    pytest.skip(f"torch {torch.__version__} < 2.4: no torch 2.x DCP writers (fully_shard, get_state_dict, "
                "dcp.save); these tests run under .venv/bin/python (torch 2.x)", allow_module_level=True)

import make_dcp_torch2 as m2  # noqa: E402  (scripts/fixtures, on sys.path through testlib)
from test_folders import EPS32, TOL, files_of, same_bytes, step_deltas  # noqa: E402
from testlib import ROOT, parse_json_stdout, require_ckptkit_bin, run_tool  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "fixtures", "make_dcp_torch2.py")
FORMS = ("fsdp2_flat", "fsdp2_default", "plain", "plain_tlr")
LOAD_FORM = {"fsdp2_flat": "flat", "fsdp2_default": "default", "plain": "plain", "plain_tlr": "plain_tlr"}
RANKS = {"fsdp2_flat": 2, "fsdp2_default": 2, "plain": 1, "plain_tlr": 1}   # processes that saved the folder
NAMES = m2.param_names()    # model.state_dict() order
IDS = m2.state_names()      # the FQN of each optimizer state id (through the groups)
N_PARAMS = sum(p.numel() for p in m2.Net().parameters())
MOMENTS = ("exp_avg", "exp_avg_sq")


def _script(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """The folders of FORMS, their compress / verify / restore runs and torch's loads of them
    (1 rank: original and restored; 2 ranks: restored), done once per session; the tests
    assert on the results."""
    b = os.environ.get("CKPTKIT_BIN", "")
    if not all(os.access(os.path.join(b, t), os.X_OK) for t in ("ckpt-compress", "ckpt-verify", "ckpt-restore")):
        return {}   # each test fails on require_ckptkit_bin()
    root = tmp_path_factory.mktemp("dcp_torch2")
    save = _script("save", root)
    res = {"save": save}
    if save.returncode != 0:
        return res
    spec = {"1": [], "2": []}
    for form in FORMS:
        src, out, back = root / form, root / (form + ".ckz"), root / (form + ".back")
        r = res[form] = {"src": src, "out": out, "back": back}
        r["compress"] = run_tool(b, "ckpt-compress", src, "-o", out, "--json", timeout=600)
        if r["compress"].returncode != 0:
            continue
        r["verify"] = run_tool(b, "ckpt-verify", out, "--original", src, "--json", timeout=600)
        r["restore"] = run_tool(b, "ckpt-restore", out, "-o", back, timeout=600)
        if r["restore"].returncode != 0:
            continue
        for key, world, d in (("orig1", 1, src), ("back1", 1, back), ("back2", 2, back)):
            r[key] = root / f"{form}.{key}.pt"
            spec[str(world)].append([LOAD_FORM[form], str(d), str(r[key])])
    with open(root / "load.json", "w") as f:
        json.dump(spec, f)
    res["load"] = _script("load", root / "load.json")
    return res


def _get(runs, form, *keys):
    """The results of `form` up to keys[-1]; a failed earlier stage fails the test, naming it."""
    require_ckptkit_bin()
    save = runs["save"]
    assert save.returncode == 0, "make_dcp_torch2.py save failed:\n" + save.stdout + save.stderr
    r = runs[form]
    loads = [k for k in keys if k not in ("compress", "verify", "restore")]
    last = 2 if loads else max(("compress", "verify", "restore").index(k) for k in keys)
    for stage in ("compress", "verify", "restore")[:last + 1]:
        p = r[stage]
        assert p.returncode == 0, f"ckpt-{stage} {form}: exit {p.returncode}\n{p.stdout}{p.stderr}"
    if loads:
        load = runs["load"]
        assert load.returncode == 0, "make_dcp_torch2.py load failed:\n" + load.stdout + load.stderr
        return [torch.load(r[k], weights_only=True) for k in keys]
    return r


def _moment_ranges(folder):
    """{file: [(offset, end)]} of the moment items of a DCP folder, from its .metadata."""
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(folder)).read_metadata()
    out = {}
    for idx, info in md.storage_data.items():
        if idx.fqn.endswith(MOMENTS):
            out.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
    return out


@pytest.mark.parametrize("form", FORMS)
def test_compress_report(runs, form):
    """The moments are gathered and compressed: one or more virtual moments containers, all
    "compressed", holding 2 x the parameter count (exp_avg and exp_avg_sq of every
    parameter, FSDP2's 2 chunks each), nothing left exact; every .distcp file holds moments
    (a shell), .metadata is copied."""
    r = _get(runs, form, "compress")
    rep = parse_json_stdout(r["compress"])
    assert rep["folder"] and rep["ok"] and rep["max_bound_lr"] <= TOL, rep
    (layout,) = rep["layouts"]
    chunks = len(NAMES) * RANKS[form]
    assert layout["kind"] == "dcp" and f"; {2 * chunks} moment items" in layout["note"], layout
    assert "left exact" not in layout["note"], layout
    src = r["src"]
    rows = {row["file"]: row for row in rep["files"]}
    assert not [row["note"] for row in rows.values() if "left exact" in row["note"]]
    virtual = [row for f, row in rows.items() if re.fullmatch(r"ckptkit-dcp-moments-\d+\.safetensors", f)]
    assert virtual and all(v["action"] == "compressed" and v["virtual_input"] for v in virtual), virtual
    assert sum(v["moment_values"] for v in virtual) == 2 * N_PARAMS, virtual
    noted = [re.search(r"moments of (\d+) parameter chunks", v["note"]) for v in virtual]
    assert all(noted) and sum(int(n.group(1)) for n in noted) == chunks, virtual
    assert all(0 < v["moment_bytes_out"] < v["moment_bytes_fp32"] == 4 * v["moment_values"] for v in virtual)
    real = files_of(src)
    assert sorted(f for f in rows if f not in {v["file"] for v in virtual}) == real
    assert len([f for f in real if f.endswith(".distcp")]) == RANKS[form]
    for f in real:
        assert rows[f]["action"] == ("shell" if f.endswith(".distcp") else "copied"), rows[f]
    assert rep["file_bytes_in"] == sum(os.path.getsize(src / f) for f in real)


@pytest.mark.parametrize("form", FORMS)
def test_report_rows_named_by_parameter(runs, form):
    """Issue 55 item 8: compress --json and verify --json name every moment row by its
    parameter: the FSDP2 forms by FQN and chunk offset, the plain forms (int state ids; the
    folder has no param_names) by parameter order over the model items of .metadata (state
    ids run through the groups: weights, then biases), not "state.3"."""
    r = _get(runs, form, "verify")
    rows = lambda rep: [t["name"] for f in rep["files"] for t in (f.get("report") or {}).get("tensors", [])]  # noqa: E731
    names = rows(parse_json_stdout(r["compress"]))
    if form.startswith("plain"):
        assert names == IDS
    else:   # 2 FSDP2 chunks per parameter, by rows: the 64-row layers at 0 and 32, the 25-row one at 0 and 13
        half = {"0": 32, "2": 32, "4": 13}
        assert names == sorted(f"{n}@{c}" + (",0" if n.endswith("weight") else "")
                               for n in NAMES for c in (0, half[n.split(".")[0]]))
    assert rows(parse_json_stdout(r["verify"])) == names


@pytest.mark.parametrize("form", FORMS)
def test_verify_restore_bytes(runs, form):
    """ckpt-verify --original exit 0; ckpt-restore gives back the same files: the copied ones
    byte-identical, each .distcp file the same size and identical outside its moment items'
    byte ranges (from .metadata), which differ (lossy moments)."""
    r = _get(runs, form, "verify", "restore")
    assert parse_json_stdout(r["verify"])["ok"]
    src, back = r["src"], r["back"]
    assert files_of(src) == files_of(back)
    rows = {row["file"]: row for row in parse_json_stdout(r["compress"])["files"]}
    ranges = _moment_ranges(src)
    assert sorted(ranges) == sorted(f for f in files_of(src) if f.endswith(".distcp"))
    for f in files_of(src):
        if rows[f]["action"] == "copied":
            assert same_bytes(src / f, back / f), f
            continue
        a, b = (src / f).read_bytes(), (back / f).read_bytes()
        assert len(a) == len(b), f
        keep, pos = [], 0
        for lo, hi in sorted(ranges[f]):
            keep.append((pos, lo))
            pos = hi
        keep.append((pos, len(a)))
        assert all(a[lo:hi] == b[lo:hi] for lo, hi in keep), f"{f}: bytes outside the moment items differ"
        assert a != b, f"{f}: moments restored bit-exact (nothing was compressed?)"


def _groups_kw(osd):
    return [(g["params"], {k: v for k, v in g.items() if k != "params"}) for g in osd["param_groups"]]


def _lr_of(osd):
    return {i: float(g["lr"]) for g in osd["param_groups"] for i in g["params"]}


def _same_groups(a, b):
    """param_groups equal, tensor values (lr=torch.tensor(...)) included."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k, v in x.items():
            w = y[k]
            assert (torch.is_tensor(w) and torch.equal(v, w)) if torch.is_tensor(v) else v == w, k


def _check_deltas(params, lrs, do, dr, what):
    for i, (p, a, b) in enumerate(zip(params, do, dr)):
        slack = torch.abs(p.double()) * EPS32 * 4 + 8 * EPS32 * (a.abs() + b.abs())
        excess = float(((a - b).abs() - TOL * lrs[i] - slack).max())
        assert excess <= 0, f"{what}: {IDS[i]}: |update difference| exceeds tolerance * lr by {excess:.3g}"


def _sequence_deltas(params, osd, groups_kw, grad_seq):
    """Per-step parameter changes of real AdamW steps from osd, fed the gradients in turn."""
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = torch.optim.AdamW([dict(params=[ps[i] for i in g], **kw) for g, kw in groups_kw])
    opt.load_state_dict(osd)
    out = []
    for grads in grad_seq:
        before = [p.detach().clone() for p in ps]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        opt.step()
        out.append([before, [(p.detach() - q).double() for p, q in zip(ps, before)]])
    return out


@pytest.mark.parametrize("form", FORMS)
def test_torch_loads_restored(runs, form):
    """torch's DCP (1 fresh process; the FSDP2 folders were saved by 2) loads the original and
    the restored folder: assert_state_close."""
    o, r = _get(runs, form, "orig1", "back1")
    assert_state_close(o, r, form)


def assert_state_close(o, r, form):
    """{"model", "optim"} o (original) and r (restored, int state ids) of make_dcp_torch2's
    Net: model parameters, step and param_groups identical, every parameter's moments
    changed (coded) but close: the zero-gradient update they make moves by <= tolerance *
    lr; one real AdamW step from each state, for random, zero, +-1 and 1e3 gradients, and a
    4-step gradient sequence: every update within tolerance * lr (of the parameter's group)
    + float32 slack."""
    assert list(o["model"]) == list(r["model"]) == NAMES
    for n in NAMES:
        assert torch.equal(o["model"][n], r["model"][n]), n
    _same_groups(o["optim"]["param_groups"], r["optim"]["param_groups"])
    groups = o["optim"]["param_groups"]
    lr = [float(torch.tensor(x)) if form == "plain_tlr" else x for x in (1e-3, 2e-3)]   # a float32 tensor's value
    assert [(float(g["lr"]), g["weight_decay"]) for g in groups] == [(lr[0], 0.01), (lr[1], 0.0)]
    assert all(torch.is_tensor(g["lr"]) == (form == "plain_tlr") for g in groups)
    so, sr = o["optim"]["state"], r["optim"]["state"]
    assert sorted(so) == sorted(sr) == list(range(len(NAMES)))
    for i in so:
        assert torch.equal(so[i]["step"], sr[i]["step"]) and float(so[i]["step"]) == m2.STEPS
        for k in MOMENTS:
            a, b = so[i][k], sr[i][k]
            assert a.shape == b.shape == o["model"][IDS[i]].shape and a.dtype == b.dtype == torch.float32
            assert bool(torch.isfinite(b).all()) and (k == "exp_avg" or bool((b >= 0).all()))
        # the codec's error, in the guarantee's terms: the next update for a zero gradient,
        # lr * b1 m / bc1' / (sqrt(b2 v / bc2') + eps) (+ weight decay, the same in both),
        # moves by at most tolerance * lr (float64 here; the float32 steps are below)
        b1, b2, t = 0.9, 0.999, m2.STEPS + 1
        uo, ur = ((b1 * st["exp_avg"].double() / (1 - b1 ** t))
                  / ((b2 * st["exp_avg_sq"].double() / (1 - b2 ** t)).sqrt() + 1e-8) for st in (so[i], sr[i]))
        assert float((uo - ur).abs().max()) <= TOL * (1 + 1e-5), IDS[i]
        assert not all(torch.equal(so[i][k], sr[i][k]) for k in MOMENTS), f"{IDS[i]}: moments restored bit-exact"

    params = [o["model"][n] for n in IDS]
    groups_kw, lrs = _groups_kw(o["optim"]), _lr_of(o["optim"])
    gen = torch.Generator().manual_seed(7)

    def rnd(scale=1.0):
        return [(torch.rand(p.shape, generator=gen) * 2 - 1) * scale for p in params]

    kinds = {"random": rnd(), "zeros": [torch.zeros_like(p) for p in params],
             "ones": [torch.ones_like(p) for p in params], "-ones": [-torch.ones_like(p) for p in params],
             "1e3": [torch.sign(g) * 1e3 for g in rnd()]}
    for kind, grads in kinds.items():
        do = step_deltas(params, o["optim"], groups_kw, grads)
        dr = step_deltas(params, r["optim"], groups_kw, grads)
        _check_deltas(params, lrs, do, dr, f"{form}, one step, {kind} gradients")
    seq = [rnd(), [torch.zeros_like(p) for p in params], rnd(1e3), kinds["-ones"]]
    for t, ((po, do), (_, dr)) in enumerate(zip(_sequence_deltas(params, o["optim"], groups_kw, seq),
                                                _sequence_deltas(params, r["optim"], groups_kw, seq))):
        _check_deltas(po, lrs, do, dr, f"{form}, sequence step {t + 1}")


def test_restored_reshards_on_two_ranks(runs):
    """Every restored folder loaded by 2 FSDP2 ranks (dcp.load into DTensor shards, then the
    full state gathered; the plain folder was saved by 1 process, the FSDP2 ones by 2 and
    read above by 1) gives exactly what 1 process read from it."""
    for form in FORMS:
        one, two = _get(runs, form, "back1", "back2")
        assert list(two["model"]) == NAMES
        for n in NAMES:
            assert torch.equal(one["model"][n], two["model"][n]), (form, n)
        _same_groups(one["optim"]["param_groups"], two["optim"]["param_groups"])
        assert sorted(one["optim"]["state"]) == sorted(two["optim"]["state"]), form
        for i, st in one["optim"]["state"].items():
            for k, v in st.items():
                assert torch.equal(v, two["optim"]["state"][i][k]), (form, IDS[i], k)
