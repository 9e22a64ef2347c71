"""Folder mode on real checkpoint folders (scripts/make_folders.py, torch 1.13's own writers).

For each layout: ckpt-compress DIR -o OUT -> ckpt-verify OUT --original DIR -> ckpt-restore
OUT -o BACK; every file but the optimizer files byte-identical; each restored optimizer file
torch.load-s, loads into torch.optim.AdamW, and one real step from it moves every parameter
like the step from the original, within tolerance * lr (plus float32 rounding slack).
DCP folders are copied exact (moment compression inside .distcp files is not implemented)
and torch's DCP load_state_dict reads the restored folder back. Also: tampering is caught by
verify, a SIGKILL-ed run leaves no output folder (and an existing one whole), refusals.
"""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

import make_folders as mf
from conftest import parse_json_stdout, require_ckptkit_bin, run_tool

TOL = 0.01
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    return {
        "hf": mf.make_hf(str(root), 64, mf.STEPS),
        "hf_adam": mf.make_hf(str(root), 64, mf.STEPS, torch.optim.Adam, "hf_adam"),
        "ds2": mf.make_ds(str(root), 2, 64, mf.STEPS),
        "ds4": mf.make_ds(str(root), 4, 64, mf.STEPS),
        "dcp": mf.make_dcp(str(root), 64, mf.STEPS),
        "dcp_packed": mf.make_dcp(str(root), 64, mf.STEPS, packed=True),
        "dcp_py311": mf.make_dcp(str(root), 64, mf.STEPS, py311=True),
    }


def files_of(d):
    out = []
    for base, _, names in os.walk(d):
        out += [os.path.relpath(os.path.join(base, n), d) for n in names]
    return sorted(out)


def same_bytes(a, b):
    with open(a, "rb") as f, open(b, "rb") as g:
        return f.read() == g.read()


def roundtrip(tmp_path, src):
    """compress --json -> verify --original -> restore; returns (compress report, out, back)."""
    b = require_ckptkit_bin()
    out, back = tmp_path / "out", tmp_path / "back"
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--json", timeout=600)
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
    """optimizer.pt holds no parameters: the L2 domain of Adam (certified with AdamW's under
    --optimizer auto) takes |theta| <= max |model.safetensors|; a real step of either class."""
    src = folders[name]
    top = os.path.dirname(src)
    rep, out, back = roundtrip(tmp_path, top)
    assert [(l["kind"], l["dir"]) for l in rep["layouts"]] == [("hf-trainer", "checkpoint-5")]
    rows = {r["file"]: r for r in rep["files"]}
    assert rows["checkpoint-5/optimizer.pt"]["action"] == "compressed"
    assert "|theta| <= " in rows["checkpoint-5/optimizer.pt"]["note"]
    assert "from model.safetensors" in rows["checkpoint-5/optimizer.pt"]["note"]
    assert (out / "checkpoint-5" / "optimizer.pt.ckz.h5").is_file()
    for f in files_of(top):
        if f != "checkpoint-5/optimizer.pt":
            assert rows[f]["action"] == "copied"
            assert same_bytes(os.path.join(top, f), back / f), f
    orig = torch.load(os.path.join(src, "optimizer.pt"))
    rest = torch.load(back / "checkpoint-5" / "optimizer.pt")
    non_moment_equal(orig, rest)
    model = mf.read_safetensors(os.path.join(src, "model.safetensors"))
    net = mf.Net(64)
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
        o = torch.load(os.path.join(top, f))["optimizer_state_dict"]
        r = torch.load(back / f)["optimizer_state_dict"]
        for a, b in zip(o["single_partition_of_fp32_groups"], r["single_partition_of_fp32_groups"]):
            assert torch.equal(a, b)
        assert o["param_slice_mappings"] == r["param_slice_mappings"]
        osd, rsd = o["base_optimizer_state"], r["base_optimizer_state"]
        non_moment_equal(osd, rsd)
        params = o["single_partition_of_fp32_groups"]
        groups = [([i], {k: v for k, v in g.items() if k != "params"}) for i, g in enumerate(osd["param_groups"])]
        assert_same_step(params, osd, rsd, groups, osd["param_groups"][0]["lr"])


@pytest.mark.parametrize("name", ["dcp", "dcp_packed", "dcp_py311"])
def test_dcp_folder_copied_exact_and_loads(tmp_path, folders, name):
    src = folders[name]
    rep, out, back = roundtrip(tmp_path, src)
    (layout,) = rep["layouts"]
    assert layout["kind"] == "dcp"
    if name == "dcp_py311":
        assert "unreadable" in layout["note"] and "getattr" in layout["note"]
    else:
        assert "8 moment items" in layout["note"] and "not implemented" in layout["note"]
    assert all(r["action"] == "copied" for r in rep["files"])
    for f in files_of(src):
        assert same_bytes(os.path.join(src, f), back / f), f
    dcp = mf.import_dcp()
    torch.manual_seed(123)
    net, opt = mf.train_adamw(64, 1)   # a template of the same keys, other values
    want = mf.dcp_state_dict(*mf.train_adamw(64, mf.STEPS))
    got = mf.dcp_state_dict(net, opt)
    got = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in got.items()}
    dcp.load_state_dict(got, dcp.FileSystemReader(str(back)), no_dist=True)
    for k, v in want.items():
        if torch.is_tensor(v):
            assert torch.equal(got[k], v), k


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
    src = mf.make_hf(str(tmp_path / "big"), 1024, 2)   # ~1.3 M parameters: a run of about a second
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
