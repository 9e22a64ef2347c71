"""Folder mode on real checkpoint folders (scripts/fixtures/make_folders.py, torch 1.13's own writers).

For each layout: ckpt-compress DIR -o OUT -> ckpt-verify OUT --original DIR -> ckpt-restore
OUT -o BACK; every file but the optimizer files byte-identical; each restored optimizer file
torch.load-s, loads into torch.optim.AdamW, and one real step from it moves every parameter
like the step from the original, within tolerance * lr (plus float32 rounding slack).
DCP folders: the moment items are gathered, compressed and put back into the .distcp files;
torch's DCP load_state_dict reads the restored folder and one AdamW step from it matches. Also: tampering is caught by
verify, a SIGKILL-ed run leaves no output folder (and an existing one whole), refusals.
"""
import json
import os
import pathlib
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

import make_folders as mf
from testlib import parse_json_stdout, require_ckptkit_bin, run_tool, torch_load_pair

TOL = 0.01
EPS32 = float(np.finfo(np.float32).eps)


# HF Trainer and DeepSpeed folders are wide enough that every optimizer file is larger than
# a container's fixed overhead (smaller files are copied as is); DCP keeps the small width
# its byte counts below are written for.
WIDTH, DCP_WIDTH = 160, 64


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    return {
        "hf": mf.make_hf(str(root), WIDTH, mf.STEPS),
        "hf_adam": mf.make_hf(str(root), WIDTH, mf.STEPS, torch.optim.Adam, "hf_adam"),
        "ds2": mf.make_ds(str(root), 2, WIDTH, mf.STEPS),
        "ds4": mf.make_ds(str(root), 4, WIDTH, mf.STEPS),
        "dcp": mf.make_dcp(str(root), DCP_WIDTH, mf.STEPS),
        "dcp_packed": mf.make_dcp(str(root), DCP_WIDTH, mf.STEPS, packed=True),
        "dcp_py311": mf.make_dcp(str(root), DCP_WIDTH, mf.STEPS, py311=True),
        "dcp_sharded": mf.make_dcp_sharded(str(root), DCP_WIDTH, mf.STEPS),
        "dcp_default": mf.make_dcp(str(root), DCP_WIDTH, mf.STEPS, flatten=False),
    }


def files_of(d):
    out = []
    for base, _, names in os.walk(d):
        out += [os.path.relpath(os.path.join(base, n), d) for n in names]
    return sorted(out)


def same_bytes(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def roundtrip(tmp_path, src, *flags):
    """compress --json -> verify --original -> restore; returns (compress report, out, back)."""
    b = require_ckptkit_bin()
    out, back = tmp_path / "out", tmp_path / "back"
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--json", *flags, timeout=600)
    assert c.returncode == 0, c.stderr + c.stdout
    rep = parse_json_stdout(c)
    assert rep["folder"] and rep["ok"] and rep["max_bound_lr"] <= TOL
    v = run_tool(b, "ckpt-verify", out, "--original", src, "--json", timeout=600)
    assert v.returncode == 0, v.stdout + v.stderr
    assert parse_json_stdout(v)["ok"]
    r = run_tool(b, "ckpt-restore", out, "-o", back, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    assert files_of(src) == files_of(back)
    return rep, out, back


def step_deltas(params, opt_sd, groups_kw, grads, opt_cls=torch.optim.AdamW):
    """Parameter changes of one real optimizer step (opt_cls) from opt_sd with the gradients."""
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = opt_cls([dict(params=[ps[i] for i in g], **kw) for g, kw in groups_kw])
    opt.load_state_dict(opt_sd)
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    opt.step()
    return [(p.detach() - q).double() for p, q in zip(ps, params)]


def assert_same_step(params, orig_sd, rest_sd, groups_kw, lr, opt_cls=torch.optim.AdamW):
    """One AdamW step from the original and the restored state, for random, zero and +-G
    gradients: every coordinate within tolerance * lr + float32 slack."""
    gen = torch.Generator().manual_seed(7)
    kinds = [[torch.rand(p.shape, generator=gen) * 2 - 1 for p in params],
             [torch.zeros_like(p) for p in params], [torch.ones_like(p) for p in params],
             [-torch.ones_like(p) for p in params]]
    for grads in kinds:
        do = step_deltas(params, orig_sd, groups_kw, grads, opt_cls)
        dr = step_deltas(params, rest_sd, groups_kw, grads, opt_cls)
        for p, a, b in zip(params, do, dr):
            ulp = torch.abs(p.double()) * EPS32 * 4
            slack = ulp + 8 * EPS32 * (a.abs() + b.abs())
            assert bool(((a - b).abs() <= TOL * lr + slack).all()), float((a - b).abs().max())


def non_moment_equal(orig_sd, rest_sd):
    """Everything but exp_avg / exp_avg_sq identical (param_groups, step)."""
    assert orig_sd["param_groups"] == rest_sd["param_groups"]
    for k, st in orig_sd["state"].items():
        for name, v in st.items():
            if name not in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(rest_sd["state"][k][name]))


@pytest.mark.parametrize("name,opt_cls", [("hf", torch.optim.AdamW), ("hf_adam", torch.optim.Adam)])
def test_hf_trainer_folder(tmp_path, folders, name, opt_cls):
    """optimizer.pt holds no parameters: under --horizon 1 the L2 domain of Adam (certified
    with AdamW's under --optimizer auto) takes |theta| <= max |model.safetensors|; a real step
    of either class. (--horizon all, the default, needs no domain: test_hf_trainer_default.)"""
    src = folders[name]
    top = os.path.dirname(src)
    rep, out, back = roundtrip(tmp_path, top, "--horizon", "1")
    assert [(l["kind"], l["dir"]) for l in rep["layouts"]] == [("hf-trainer", "checkpoint-5")]
    rows = {r["file"]: r for r in rep["files"]}
    assert rows["checkpoint-5/optimizer.pt"]["action"] == "compressed"
    note = rows["checkpoint-5/optimizer.pt"]["note"]
    groups = torch.load(os.path.join(src, "optimizer.pt"))["param_groups"]
    if all(g.get("decoupled_weight_decay") for g in groups):   # torch 2.x's AdamW says it is AdamW
        assert "|theta|" not in note
    else:
        assert "|theta| <= " in note and "from model.safetensors" in note
    assert (out / "checkpoint-5" / "optimizer.pt.ckz.h5").is_file()
    for f in files_of(top):
        if f != "checkpoint-5/optimizer.pt":
            assert rows[f]["action"] == "copied"
            assert same_bytes(os.path.join(top, f), back / f), f
    orig = torch.load(os.path.join(src, "optimizer.pt"))
    rest = torch.load(back / "checkpoint-5" / "optimizer.pt")
    non_moment_equal(orig, rest)
    model = mf.read_safetensors(os.path.join(src, "model.safetensors"))
    net = mf.Net(WIDTH)
    net.load_state_dict(model)
    params = [p.detach() for p in net.parameters()]
    g = orig["param_groups"][0]
    kw = {k: v for k, v in g.items() if k != "params"}
    assert_same_step(params, orig, rest, [(list(range(len(params))), kw)], g["lr"], opt_cls)


@pytest.mark.parametrize("world", [2, 4])
def test_deepspeed_folder(tmp_path, folders, world):
    top = folders[f"ds{world}"]
    rep, out, back = roundtrip(tmp_path, top)
    kinds = sorted((l["kind"], l["dir"]) for l in rep["layouts"])
    assert kinds == [("deepspeed-zero", ""), ("deepspeed-zero", "global_step5")]
    shards = [f for f in files_of(top) if f.endswith("optim_states.pt")]
    assert len(shards) == world
    rows = {r["file"]: r for r in rep["files"]}
    for f in files_of(top):
        assert rows[f]["action"] == ("compressed" if f in shards else "copied"), f
        if f not in shards:
            assert same_bytes(os.path.join(top, f), back / f), f
    for f in shards:
        o, r = (x["optimizer_state_dict"] for x in torch_load_pair(os.path.join(top, f), back / f))
        for a, b in zip(o["single_partition_of_fp32_groups"], r["single_partition_of_fp32_groups"]):
            assert torch.equal(a, b)
        assert o["param_slice_mappings"] == r["param_slice_mappings"]
        osd, rsd = o["base_optimizer_state"], r["base_optimizer_state"]
        non_moment_equal(osd, rsd)
        params = o["single_partition_of_fp32_groups"]
        groups = [([i], {k: v for k, v in g.items() if k != "params"}) for i, g in enumerate(osd["param_groups"])]
        assert_same_step(params, osd, rsd, groups, osd["param_groups"][0]["lr"])


def load_dcp(dcp, path, sharded=False):
    """The DCP folder at `path` loaded by torch's own DCP reader into a same-keyed template
    (ShardedTensors of 2 chunks when `sharded`); returns full tensors."""
    net, opt = mf.train_adamw(DCP_WIDTH, 1)   # same keys, other values
    got = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in mf.dcp_state_dict(net, opt).items()}
    if sharded:
        got = {k: (mf.to_sharded(v) if torch.is_tensor(v) and v.dim() >= 1 else v) for k, v in got.items()}
        dcp.load_state_dict(got, dcp.FileSystemReader(str(path)))
        return {k: (mf.from_sharded(v) if hasattr(v, "local_shards") else v) for k, v in got.items()}
    dcp.load_state_dict(got, dcp.FileSystemReader(str(path)), no_dist=True)
    return got


def dcp_params_and_state(sd):
    """Model parameters and an AdamW state_dict (one group per parameter) from DCP keys."""
    names = [n for n, _ in mf.Net(DCP_WIDTH).named_parameters()]
    params = [sd["model." + n] for n in names]
    state = {i: {k: sd[f"optim.state.{n}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq")} for i, n in enumerate(names)}
    groups = []
    for i, n in enumerate(names):
        g = {k.rsplit(".", 1)[1]: v for k, v in sd.items() if k.startswith(f"optim.param_groups.{n}.")}
        groups.append(dict(g, params=[i]))
    return params, {"state": state, "param_groups": groups}, [([i], {k: v for k, v in g.items() if k != "params"}) for i, g in enumerate(groups)]


@pytest.mark.parametrize("name", ["dcp", "dcp_packed", "dcp_sharded", "dcp_py311"])
def test_dcp_folder(tmp_path, folders, name):
    """Moment items gathered, compressed and put back (shells); everything else exact;
    torch's DCP load_state_dict reads the restored folder; one real AdamW step from it
    matches the original within tolerance * lr. A .metadata pickled by Python 3.11 (enum
    members as getattr(cls, 'NAME')) is read the same way."""
    src = folders[name]
    rep, out, back = roundtrip(tmp_path, src)
    (layout,) = rep["layouts"]
    assert layout["kind"] == "dcp"
    rows = {r["file"]: r for r in rep["files"]}
    sharded = name == "dcp_sharded"
    assert ("16 moment items" if sharded else "8 moment items") in layout["note"]
    moments = rows["ckptkit-dcp-moments-0.safetensors"]
    assert moments["action"] == "compressed"
    assert f"moments of {8 if sharded else 4} parameter chunks" in moments["note"]
    assert moments["moment_values"] == sum(p.numel() for p in mf.Net(DCP_WIDTH).parameters()) * 2
    assert moments["virtual_input"] and rep["file_bytes_in"] == sum(os.path.getsize(os.path.join(src, f)) for f in files_of(src))
    shells = [f for f, r in rows.items() if r["action"] == "shell"]
    assert len(shells) == {"dcp_packed": 1, "dcp": 8, "dcp_py311": 8, "dcp_sharded": 16}[name]
    assert (out / (shells[0] + ".ckz-shell")).is_file()
    for f in files_of(src):
        if f not in shells:
            assert same_bytes(os.path.join(src, f), back / f), f
    dcp = mf.import_dcp()
    orig, rest = load_dcp(dcp, src, sharded), load_dcp(dcp, back, sharded)
    for k, v in orig.items():
        if torch.is_tensor(v) and not k.endswith(("exp_avg", "exp_avg_sq")):
            assert torch.equal(v, rest[k]), k
        elif not torch.is_tensor(v):
            assert v == rest[k], k
    params, osd, groups = dcp_params_and_state(orig)
    _, rsd, _ = dcp_params_and_state(rest)
    assert any(not torch.equal(osd["state"][i]["exp_avg"], rsd["state"][i]["exp_avg"]) for i in osd["state"])
    assert_same_step(params, osd, rsd, groups, 1e-3)


def test_hf_trainer_default(tmp_path, folders):
    """--horizon all (the default) certifies every update for any gradients: optimizer.pt of
    an Adam + L2 run is compressed without reading the model's parameters."""
    rep, out, back = roundtrip(tmp_path, os.path.dirname(folders["hf_adam"]))
    row = {r["file"]: r for r in rep["files"]}["checkpoint-5/optimizer.pt"]
    assert row["action"] == "compressed" and "|theta|" not in row["note"], row


def test_dcp_default_optimizer_form(tmp_path, folders):
    """get_state_dict without flatten_optimizer_state_dict (DCP's default): group items
    optim.param_groups.<i>.<key> and the FQN list optim.param_groups.<i>.params. The moments
    are gathered with their group's hyper-parameters and coded (not left exact); torch's DCP
    reader loads the restored folder, and one real AdamW step matches the original's."""
    src = folders["dcp_default"]
    rep, out, back = roundtrip(tmp_path, src)
    rows = {r["file"]: r for r in rep["files"]}
    moments = rows["ckptkit-dcp-moments-0.safetensors"]
    assert moments["action"] == "compressed" and "moments of 4 parameter chunks" in moments["note"], moments
    assert "left exact" not in rep["layouts"][0]["note"], rep["layouts"]
    dcp = mf.import_dcp()
    names = [n for n, _ in mf.Net(DCP_WIDTH).named_parameters()]

    def load(path):
        net, opt = mf.train_adamw(DCP_WIDTH, 1)
        got = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in mf.dcp_state_dict(net, opt, False).items()}
        dcp.load_state_dict(got, dcp.FileSystemReader(str(path)), no_dist=True)
        return got

    orig, rest = load(src), load(back)
    for k, v in orig.items():
        if not (torch.is_tensor(v) and k.endswith(("exp_avg", "exp_avg_sq"))):
            assert (torch.equal(v, rest[k]) if torch.is_tensor(v) else v == rest[k]), k
    params = [orig["model." + n] for n in names]
    g = {k.rsplit(".", 1)[1]: v for k, v in orig.items() if k.startswith("optim.param_groups.0.") and not k.endswith(".params")}

    def osd(sd):
        st = {i: {k: sd[f"optim.state.{n}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq")} for i, n in enumerate(names)}
        return {"state": st, "param_groups": [dict(g, params=list(range(len(names))))]}

    o, r = osd(orig), osd(rest)
    assert any(not torch.equal(o["state"][i]["exp_avg"], r["state"][i]["exp_avg"]) for i in o["state"])
    assert_same_step(params, o, r, [(list(range(len(names))), {k: v for k, v in g.items()})], g["lr"])


def test_verify_catches_tampering(tmp_path, folders):
    b = require_ckptkit_bin()
    top = folders["ds2"]
    out = tmp_path / "out"
    assert run_tool(b, "ckpt-compress", top, "-o", out).returncode == 0
    latest = out / "latest"
    latest.write_text("global_step6")
    v = run_tool(b, "ckpt-verify", out)
    assert v.returncode == 1 and "latest" in v.stdout, v.stdout
    latest.write_text("global_step5")
    assert run_tool(b, "ckpt-verify", out).returncode == 0
    (out / "extra.txt").write_text("x")
    v = run_tool(b, "ckpt-verify", out)
    assert v.returncode == 1 and "extra.txt: not in the manifest" in v.stdout
    # the one stderr line names the folder and the first failure, also under -q (nothing else)
    q = run_tool(b, "ckpt-verify", out, "-q")
    assert (q.returncode, q.stdout) == (1, ""), q.stdout
    assert q.stderr == f"ckpt-verify: check failed: {out}: extra.txt: not in the manifest\n", q.stderr
    (out / "extra.txt").unlink()
    shard = out / "global_step5" / "zero_pp_rank_1_mp_rank_00_optim_states.pt.ckz.h5"
    shard.unlink()
    v = run_tool(b, "ckpt-verify", out, "--json")
    assert v.returncode == 1 and not parse_json_stdout(v)["ok"]
    r = run_tool(b, "ckpt-restore", out, "-o", tmp_path / "back")
    assert r.returncode == 2 and "zero_pp_rank_1" in r.stderr and not (tmp_path / "back").exists()


def test_refusals(tmp_path, folders):
    b = require_ckptkit_bin()
    top = folders["ds2"]
    out = tmp_path / "out"
    assert run_tool(b, "ckpt-compress", top, "-o", out).returncode == 0
    c = run_tool(b, "ckpt-compress", top, "-o", out)
    assert c.returncode == 2 and "already exists; pass --force" in c.stderr
    assert run_tool(b, "ckpt-compress", top, "-o", out, "--force").returncode == 0
    c = run_tool(b, "ckpt-compress", top, "-o", os.path.join(top, "inside"))
    assert c.returncode == 2 and "inside" in c.stderr
    c = run_tool(b, "ckpt-verify", top)
    assert c.returncode == 2 and "not a ckptkit folder" in c.stderr
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", top, str(bad)], check=True)
    shard = bad / "global_step5" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    os.truncate(shard, 4000)
    c = run_tool(b, "ckpt-compress", bad, "-o", tmp_path / "bad_out", "--json")
    assert c.returncode == 2 and str(shard) in c.stderr
    assert parse_json_stdout(c)["ok"] is False
    assert not (tmp_path / "bad_out").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".bad_out.tmp")]


def test_killed_run_leaves_no_output(tmp_path):
    b = require_ckptkit_bin()
    src = mf.make_hf(str(tmp_path / "big"), 2048, 2)   # ~4.2 M parameters: a run of about a second
    top = os.path.dirname(src)
    out = tmp_path / "out"
    for existing in (False, True):
        if existing:
            assert run_tool(b, "ckpt-compress", top, "-o", out, timeout=600).returncode == 0
            before = (out / "ckptkit-folder.json").read_bytes()
        args = [os.path.join(b, "ckpt-compress"), top, "-o", str(out)] + (["--force"] if existing else [])
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while not any(n.startswith(".out.tmp-") for n in os.listdir(tmp_path)) and time.time() - t0 < 60:
            time.sleep(0.001)
        time.sleep(0.05)
        assert p.poll() is None, "the run ended before it could be killed"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        if existing:
            assert (out / "ckptkit-folder.json").read_bytes() == before
            assert run_tool(b, "ckpt-verify", out, timeout=600).returncode == 0
        else:
            assert not out.exists()


def test_dcp_shell_tampering(tmp_path, folders):
    """A changed shell or gathered-moments container fails verify (exit 1) and restore."""
    b = require_ckptkit_bin()
    out = tmp_path / "out"
    assert run_tool(b, "ckpt-compress", folders["dcp_packed"], "-o", out).returncode == 0
    shell = out / "__0_0.distcp.ckz-shell"
    data = bytearray(shell.read_bytes())
    data[100] ^= 1
    shell.write_bytes(bytes(data))
    v = run_tool(b, "ckpt-verify", out, "--original", folders["dcp_packed"])
    assert v.returncode == 1 and "__0_0.distcp.ckz-shell" in v.stdout, v.stdout
    r = run_tool(b, "ckpt-restore", out, "-o", tmp_path / "back")
    assert r.returncode == 1 and "__0_0.distcp.ckz-shell" in r.stderr and not (tmp_path / "back").exists()


@pytest.mark.parametrize("name,units", [("dcp", 4), ("dcp_packed", 1), ("dcp_sharded", 8)])
def test_dcp_units(tmp_path, folders, name, units):
    """--dcp-unit-mib 0: one gathered-moments container per group of linked .distcp files
    (torch 1.13 per-item: one per parameter chunk; packed: one per file); the restored
    folder is byte-identical to the one from a single container."""
    b = require_ckptkit_bin()
    src = folders[name]
    out, back, back1 = tmp_path / "out", tmp_path / "back", tmp_path / "back1"
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--dcp-unit-mib", "0", "--json")
    assert c.returncode == 0, c.stderr
    rep = parse_json_stdout(c)
    virtual = [r for r in rep["files"] if r["file"].startswith("ckptkit-dcp-moments-")]
    assert len(virtual) == units and all(r["action"] == "compressed" for r in virtual)
    assert run_tool(b, "ckpt-verify", out, "--original", src).returncode == 0
    assert run_tool(b, "ckpt-restore", out, "-o", back).returncode == 0
    assert run_tool(b, "ckpt-compress", src, "-o", tmp_path / "one").returncode == 0
    assert run_tool(b, "ckpt-restore", tmp_path / "one", "-o", back1).returncode == 0
    for f in files_of(src):
        assert same_bytes(back / f, back1 / f), f


@pytest.mark.parametrize("edit", ["version_float", "size_float", "size_negative", "cut_offset_float"])
def test_manifest_numbers_are_checked(tmp_path, folders, edit):
    """A folder manifest whose numbers cannot be what they name (a float such as 1e300 for a
    size, a negative size, a float cut offset) is one clear error, exit 2: never a float
    converted to an integer (undefined behaviour) or a wrapped negative."""
    b = require_ckptkit_bin()
    src = folders["dcp_packed"] if edit.startswith("cut") else folders["ds2"]
    out = tmp_path / "out"
    assert run_tool(b, "ckpt-compress", src, "-o", out).returncode == 0
    assert run_tool(b, "ckpt-verify", out).returncode == 0  # the unedited manifest reads
    mpath = out / "ckptkit-folder.json"
    m = json.loads(mpath.read_text())
    if edit == "version_float":
        m["version"] = 1e300
    elif edit == "size_float":
        m["files"][0]["size"] = 1.5e300
    elif edit == "size_negative":
        m["files"][0]["size"] = -1
    else:
        shell = next(e for e in m["files"] if "cuts" in e)
        shell["cuts"][0]["offset"] = 1e300
    mpath.write_text(json.dumps(m))
    r = run_tool(b, "ckpt-verify", out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "ckptkit-folder.json: malformed manifest: " in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_tiny_optimizer_file_is_copied_not_grown(tmp_path):
    """An optimizer file smaller than a container's fixed overhead is copied as is (with a
    note), so no file of the output folder is larger than its source; restore gives it back."""
    b = require_ckptkit_bin()
    src = mf.make_hf(str(tmp_path), 32, 3)
    out, back = tmp_path / "out", tmp_path / "back"
    r = run_tool(b, "ckpt-compress", src, "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    rows = {f["file"]: f for f in parse_json_stdout(r)["files"]}
    opt = next(k for k in rows if k.endswith("optimizer.pt"))
    assert rows[opt]["action"] == "copied" and "its container would be" in rows[opt]["note"]
    assert not list(out.rglob("*.ckz.h5"))
    assert run_tool(b, "ckpt-verify", out, "--original", src).returncode == 0
    assert run_tool(b, "ckpt-restore", out, "-o", back).returncode == 0
    for f in pathlib.Path(src).rglob("*"):
        if f.is_file():
            assert (back / f.relative_to(src)).read_bytes() == f.read_bytes()


def test_dcp_nested_torch113_adam_l2_horizon_1(tmp_path):
    """torch 1.13's nested form, save_state_dict({"model": sd, "optimizer":
    opt.state_dict(), "step": n}), pickles each value whole into a .distcp item. Under
    --horizon 1 the Adam + L2 state's gradient domain takes |theta| <= the largest |value| of
    the folder's model item (it was refused for lack of theta); torch's DCP load_state_dict
    reads the restored folder, and one real Adam step from it matches the original's."""
    dcp = mf.import_dcp()
    net, opt = mf.train_adamw(WIDTH, 20, opt_cls=torch.optim.Adam)   # Adam, weight decay 0.01: L2
    src = tmp_path / "nested"
    dcp.save_state_dict({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": 20},
                        dcp.FileSystemWriter(str(src)), no_dist=True)
    rep, out, back = roundtrip(tmp_path, str(src), "--horizon", "1")
    (row,) = [r for r in rep["files"] if r["action"] == "compressed"]
    bound = max(float(v.abs().max()) for v in net.state_dict().values() if v.is_floating_point())
    if torch.__version__ < "2":
        assert f"Adam L2 domain with |theta| <= {bound:.6g} from the DCP folder's model items" in row["note"], row
    else:   # torch 2.x's DCP flattens the nested dict: items per tensor, groups as optimizer.param_groups.<i>.<key>
        assert f"Adam L2 domain with |theta| <= {bound:.6g} from the DCP model items" in row["note"], row
        assert "moments of 4 parameter chunks" in row["note"] and "left exact" not in row["note"], row

    def load(path):
        n2, o2 = mf.train_adamw(WIDTH, 1, opt_cls=torch.optim.Adam)   # same structure, other values
        got = {"model": n2.state_dict(), "optimizer": o2.state_dict(), "step": 0}
        dcp.load_state_dict(got, dcp.FileSystemReader(str(path)), no_dist=True)
        return got
    orig, rest = load(src), load(back)
    assert rest["step"] == 20
    for k, v in orig["model"].items():
        assert torch.equal(v, rest["model"][k]), k
    non_moment_equal(orig["optimizer"], rest["optimizer"])
    osd, rsd = orig["optimizer"], rest["optimizer"]
    assert any(not torch.equal(osd["state"][i]["exp_avg_sq"], rsd["state"][i]["exp_avg_sq"]) for i in osd["state"])
    params = list(orig["model"][n] for n, _ in mf.Net(WIDTH).named_parameters())
    groups = [(g["params"], {k: v for k, v in g.items() if k != "params"}) for g in osd["param_groups"]]
    assert_same_step(params, osd, rsd, groups, 1e-3, opt_cls=torch.optim.Adam)
