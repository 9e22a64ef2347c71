"""The guarantee's edge cases (issue "close every hole"), each on a real torch file.

Each case builds a real model and a real torch optimizer, trains it a few steps, shapes the
optimizer state as the case needs, saves it with torch.save, and runs compress -> verify
--original -> restore -> torch.load. It then asserts the exact outcome (a coordinate
escaped or the state kept exact: restored bit for bit; a refusal: exit 2 and its message;
a container that restores) and one real `optimizer.step()` of the optimizer's own class,
on the original and on the restored state with the same gradient: every parameter moves by
the same amount within tolerance * lr (plus the float32 rounding slack of the parameter
update itself, scripts/torch_step_check.py).
"""
import copy
import json
import math
import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn as nn

from testlib import parse_json_stdout, require_ckptkit_bin, run_tool

TOL = 0.01
MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class Net(nn.Module):
    """Two linear layers of equal shape (so the parameter mapping is ambiguous by shape)."""

    def __init__(self, width=64):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def train(opt_cls, groups_fn=None, steps=60, seed=0, **kw):
    """A Net and a real optimizer of opt_cls after `steps` real steps."""
    torch.manual_seed(seed)
    net = Net()
    params = groups_fn(net) if groups_fn else net.parameters()
    opt = opt_cls(params, **kw)
    for _ in range(steps):  # a fresh random batch each step: noisy gradients, as in training
        x, y = torch.randn(32, 64), torch.randn(32, 64)
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    return net, opt


def save(path, net, opt, extra=None):
    obj = {"model": net.state_dict(), "optimizer": opt.state_dict()}
    obj.update(extra or {})
    torch.save(obj, path)
    return path


def roundtrip(tmp_path, src, *flags, expect_verify=0):
    """compress -> verify --original -> restore; returns (compress JSON, restored object)."""
    b = require_ckptkit_bin()
    out, back = tmp_path / "c.ckz.h5", tmp_path / "back.pt"
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--json", *flags)
    assert c.returncode == 0, c.stderr + c.stdout
    rep = parse_json_stdout(c)
    assert rep["ok"] and rep["max_bound_lr"] <= TOL
    v = run_tool(b, "ckpt-verify", out, "--original", src, timeout=600)
    assert v.returncode == expect_verify, v.stdout + v.stderr
    r = run_tool(b, "ckpt-restore", out, "-o", back, *(["--force"] if "--force" in flags else []))
    assert r.returncode == 0, r.stderr
    return rep, torch.load(back)


def one_step(opt_cls, groups_fn, kw, model_sd, opt_sd, grads):
    """Parameter change of one real step from the given state with the given gradients."""
    net = Net()
    net.load_state_dict(model_sd)
    opt = opt_cls(groups_fn(net) if groups_fn else net.parameters(), **kw)
    opt.load_state_dict(copy.deepcopy(opt_sd))
    before = [p.detach().clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), grads):
        p.grad = g.clone()
    opt.step()
    return [p.detach() - b0 for p, b0 in zip(net.parameters(), before)]


def assert_step_close(opt_cls, orig, back, grads, groups_fn=None, **kw):
    """One real step from the original and from the restored state agree within tau*lr."""
    d0 = one_step(opt_cls, groups_fn, kw, orig["model"], orig["optimizer"], grads)
    d1 = one_step(opt_cls, groups_fn, kw, back["model"], back["optimizer"], grads)
    lrs = [g["lr"] for g in orig["optimizer"]["param_groups"] for _ in g["params"]]
    order = [i for g in orig["optimizer"]["param_groups"] for i in g["params"]]
    lr_of = dict(zip(order, lrs))
    for i, (a, b) in enumerate(zip(d0, d1)):
        both_nan = torch.isnan(a) & torch.isnan(b)
        diff = (a - b).abs().double()
        diff[both_nan] = 0
        slack = 8 * torch.finfo(torch.float32).eps * (a.abs() + b.abs()).double() + 1e-30
        assert torch.all(diff <= TOL * lr_of[i] + slack), (i, float(diff.max()), lr_of[i])


def moved_by_step(net, opt, grads):
    """Each parameter's change in one real step of `opt` with the given gradients."""
    before = [p.detach().clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), grads):
        p.grad = g.clone()
    opt.step()
    return [p.detach() - b0 for p, b0 in zip(net.parameters(), before)]


def assert_moved_close(d0, d1, lr, what=None):
    """Two runs' parameter changes agree within tolerance * lr (and FP32 rounding)."""
    for a, b in zip(d0, d1):
        slack = 8 * torch.finfo(torch.float32).eps * (a.abs() + b.abs()).double() + 1e-30
        assert torch.all((a - b).abs().double() <= TOL * lr + slack), (what, float((a - b).abs().max()))


def grads_like(net, scale=1.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [scale * (2 * torch.rand(p.shape, generator=g) - 1) for p in net.parameters()]


def state_bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.int32 if a.element_size() == 4 else torch.int16), b.view(-1).view(torch.int32 if b.element_size() == 4 else torch.int16))


# ---------------------------------------------------------------------------- 1. overflow

def test_overflow_edge_escapes_and_real_step_agrees(tmp_path):
    """exp_avg_sq near 1e36 with G = inf: the coordinates whose FP32 update could overflow
    in one state and not the other escape (restored bit for bit); one real step at
    g = 6e20 (where b2*v + (1-b2)*g^2 crosses FLT_MAX) agrees within tolerance."""
    net, opt = train(torch.optim.Adam, lr=1e-3)
    st = opt.state_dict()["state"]
    huge = torch.tensor([1e36, 3.3e38, 2e30, 1.5e30])
    st[0]["exp_avg_sq"].view(-1)[:4] = huge
    st[0]["exp_avg"].view(-1)[:4] = torch.tensor([1e17, -1e18, 1e14, 1e14])
    src = save(tmp_path / "ovf.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src, "--grad-bound", "inf")
    for k in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(back["optimizer"]["state"][0][k].view(-1)[:4], orig["optimizer"]["state"][0][k].view(-1)[:4])
    assert rep["escapes"] >= 8
    for gscale in (6e20, 5.8e20, 1.0, 1e25):
        assert_step_close(torch.optim.Adam, orig, back, grads_like(net, gscale), lr=1e-3)


def test_overflow_edge_l2_shift(tmp_path):
    """Adam L2 with wd*theta on the overflow edge at g = 0 (theta ~ 1e19, wd = 1): kept
    coordinates agree in one real step at g = 0."""
    kw = dict(lr=1e-3, weight_decay=1.0)
    net, opt = train(torch.optim.Adam, **kw)
    with torch.no_grad():
        net.a.weight.view(-1)[:4] = torch.tensor([5.8e20, 1e19, -3e20, 2e18])
    st = opt.state_dict()["state"]
    st[0]["exp_avg_sq"].view(-1)[:4] = torch.tensor([1e36, 1e35, 2e37, 1e30])
    src = save(tmp_path / "l2ovf.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src, "--optimizer", "adam", "--horizon", "1")  # the first update's L2 domain
    zero = [torch.zeros_like(p) for p in net.parameters()]
    assert_step_close(torch.optim.Adam, orig, back, zero, **kw)
    assert_step_close(torch.optim.Adam, orig, back, grads_like(net), **kw)


# ---------------------------------------------------------------------------- 2. subnormal

@pytest.mark.parametrize("beta2", [0.5, 0.9, 0.999])
def test_subnormal_exp_avg_sq_escapes(tmp_path, beta2):
    """exp_avg_sq of a few hundred subnormal ulps: fl(b2*v) rounds absolutely, so such
    coordinates escape (restored bit for bit) and a real step at g = 0 agrees."""
    kw = dict(lr=1e-3, betas=(0.9, beta2), eps=0.0)
    net, opt = train(torch.optim.Adam, **kw)
    st = opt.state_dict()["state"]
    ulp = 1.401298464324817e-45
    v = st[0]["exp_avg_sq"].view(-1)
    m = st[0]["exp_avg"].view(-1)
    g = torch.Generator().manual_seed(3)
    v[:64] = ulp * torch.randint(200, 800, (64,), generator=g).float()  # one whole block
    m[:64] = 2.5 * v[:64].double().sqrt().float() * torch.sign(torch.rand(64, generator=g) - 0.5)
    v[64:68] = torch.tensor([1e-39, 2e-38, 1.2e-38, 1e-37])
    src = save(tmp_path / "sub.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src, "--grad-bound", "inf")
    bv = back["optimizer"]["state"][0]["exp_avg_sq"].view(-1)
    assert torch.equal(bv[:64], v[:64])  # fl(b2 * v) subnormal: escaped, exact
    zero = [torch.zeros_like(p) for p in net.parameters()]
    assert_step_close(torch.optim.Adam, orig, back, zero, **kw)
    assert_step_close(torch.optim.Adam, orig, back, grads_like(net, 1e-21), **kw)


# ---------------------------------------------------------------------------- 3. theta mapping

def test_param_group_order_unlike_model_is_certified_over_both(tmp_path):
    """An Adam-L2 group listing [b.weight, a.weight] (same shapes) in another order than the
    model: theta comes from the union of both candidates, never from the wrong one. The
    weights sit at [-1, 1] and [39, 41]; a real step with |g| <= G agrees."""
    kw = dict(lr=1e-3, weight_decay=0.5)

    def groups(net):
        return [{"params": [net.b.weight, net.a.weight]}, {"params": [net.a.bias, net.b.bias]}]

    net, opt = train(torch.optim.Adam, groups, **kw)
    with torch.no_grad():
        net.a.weight.uniform_(39, 41)
        net.b.weight.uniform_(-1, 1)
    src = save(tmp_path / "order.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src, "--optimizer", "adam", "--horizon", "1")  # the first update's L2 domain
    doms = {g["domain"] for g in rep["param_groups"]}
    assert any("|theta| <= 4" in d for d in doms), doms  # bound over both weights (max ~41)
    for s in (1.0, 0.5, 0.01):
        assert_step_close(torch.optim.Adam, orig, back, grads_like(net, s), groups, **kw)


def test_theta_in_file_order_and_out_of_it(tmp_path):
    """Adam-L2 with param_groups [b.*], [a.*] over a model of distinct shapes: compress reads
    b's weights once, into /raw and for the gradient domain (they come next in the file),
    and a's again (/raw has them already). Every theta hash and certificate verifies against
    the original, the weights restore bit for bit, and one real Adam step agrees."""
    kw = dict(lr=1e-3, weight_decay=0.5)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 64))
    groups = lambda m: [{"params": list(m[2].parameters())}, {"params": list(m[0].parameters())}]
    opt = torch.optim.Adam(groups(net), **kw)
    for _ in range(30):
        opt.zero_grad()
        ((net(torch.randn(32, 64)) - torch.randn(32, 64)) ** 2).mean().backward()
        opt.step()
    src = save(tmp_path / "order.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src, "--optimizer", "adam", "--horizon", "1")  # the first update's L2 domain
    assert {g["domain"] for g in rep["param_groups"]} == {"|g| <= 1 shifted by wd*theta"}
    for k, t in orig["model"].items():
        assert state_bits_equal(t, back["model"][k]), k
    g = torch.Generator().manual_seed(1)
    grads = [2 * torch.rand(p.shape, generator=g) - 1 for p in net.parameters()]
    moved = []
    for sd in (orig, back):
        m = nn.Sequential(nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 64))
        m.load_state_dict(sd["model"])
        o = torch.optim.Adam(groups(m), **kw)
        o.load_state_dict(copy.deepcopy(sd["optimizer"]))
        moved.append(moved_by_step(m, o, grads))
    assert_moved_close(*moved, kw["lr"])


# ---------------------------------------------------------------------------- 4. overrides

@pytest.mark.parametrize("flag,value,key", [("--eps", "0.01", "eps"), ("--beta2", "0.9", "beta2"),
                                            ("--lr", "0.5", "lr"), ("--weight-decay", "0.1", "weight_decay")])
def test_override_contradicting_the_file_is_refused(tmp_path, flag, value, key):
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.Adam, lr=1e-3)
    src = save(tmp_path / "h.pt", net, opt)
    before = open(src, "rb").read()
    r = run_tool(b, "ckpt-compress", src, "-o", tmp_path / "o.h5", flag, value)
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"ckpt-compress: error: {src}: {flag} {value} contradicts the file's {key} = ")
    assert not (tmp_path / "o.h5").exists() and open(src, "rb").read() == before


def test_override_equal_to_the_file_is_accepted(tmp_path):
    net, opt = train(torch.optim.Adam, lr=1e-3)
    src = save(tmp_path / "h.pt", net, opt)
    roundtrip(tmp_path, src, "--eps", "1e-8", "--lr", "0.001")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_override_compared_in_the_files_dtype(tmp_path, dtype):
    """torch 2.x keeps lr as a 0-d float32 tensor (capturable / fused): 0.001 is stored as
    0.0010000000474974513. `--lr 0.001` states the same value in that dtype: accepted, and
    the file's value is the one certified; `--lr 0.002` still contradicts it (exit 2)."""
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.Adam, lr=1e-3)
    sd = opt.state_dict()
    for g in sd["param_groups"]:
        g["lr"] = torch.tensor(1e-3, dtype=dtype)
    src = tmp_path / "t.pt"
    torch.save({"model": net.state_dict(), "optimizer": sd}, src)
    ok = run_tool(b, "ckpt-compress", src, "-o", tmp_path / "a.h5", "--lr", "0.001", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lr = parse_json_stdout(ok)["param_groups"][0]["lr"]
    assert lr == float(torch.tensor(1e-3, dtype=dtype)) and lr != 1e-3
    bad = run_tool(b, "ckpt-compress", src, "-o", tmp_path / "b.h5", "--lr", "0.002")
    assert bad.returncode == 2 and "--lr 0.002 contradicts the file's lr = " in bad.stderr, bad.stderr


def test_optimizer_flag_contradicting_decoupled_weight_decay(tmp_path):
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.AdamW, lr=1e-3)
    sd = opt.state_dict()
    for g in sd["param_groups"]:
        g["decoupled_weight_decay"] = False
    torch.save({"model": net.state_dict(), "optimizer": sd}, tmp_path / "d.pt")
    r = run_tool(b, "ckpt-compress", tmp_path / "d.pt", "-o", tmp_path / "o.h5", "--optimizer", "adamw")
    assert r.returncode == 2
    assert "--optimizer adamw contradicts the file: " in r.stderr and "decoupled_weight_decay = False" in r.stderr


def _manifest(path):
    # zstd chunks decoded by scripts/fixtures/make_bad_containers.py itself, not through our filter
    # plugin: an ASan build's plugin cannot load into a plain python
    import make_bad_containers as mbc
    with h5py.File(path, "r") as f:
        return mbc.get_manifest(f)


def _rewrite_manifest(path, m):
    import make_bad_containers as mbc  # scripts/fixtures/: recomputes the dataset's count and xxh3
    with h5py.File(path, "r+") as f:
        mbc._set_manifest_bytes(f, json.dumps(m).encode())


@pytest.mark.parametrize("edit", ["swap_storages", "eps", "step", "beta1"])
def test_verify_rereads_param_groups_and_binds_moments(tmp_path, edit):
    """A manifest edited consistently (hashes recomputed) but disagreeing with the source's
    own param_groups, step or moment-to-parameter binding fails verify (exit 1), also
    without --original."""
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.Adam, lr=1e-3)
    src = save(tmp_path / "h.pt", net, opt)
    out = tmp_path / "c.h5"
    assert run_tool(b, "ckpt-compress", src, "-o", out).returncode == 0
    m = _manifest(out)
    p0, p2 = m["params"][0], m["params"][2]  # a.weight and b.weight: same shape
    if edit == "swap_storages":
        p0["storage"], p2["storage"] = p2["storage"], p0["storage"]
        for j, p in enumerate(m["params"]):
            for r, s in enumerate(p["storage"]):
                if s >= 0:
                    m["storages"][s]["param"], m["storages"][s]["role"] = j, r
    elif edit == "eps":
        p0["hyper"]["eps"] = 1e-2
    elif edit == "step":
        p0["hyper"]["step"] += 1
    else:
        p0["hyper"]["beta1"] = 0.8
    _rewrite_manifest(out, m)
    v = run_tool(b, "ckpt-verify", out)
    assert v.returncode == 1, v.stdout + v.stderr
    assert "differs from the checkpoint's own state" in v.stdout


# ---------------------------------------------------------------------------- 5-8. restorable

def test_mixed_amsgrad_groups(tmp_path):
    kw = dict(lr=1e-3)

    def groups(net):
        return [{"params": [net.a.weight, net.a.bias], "amsgrad": True}, {"params": [net.b.weight, net.b.bias]}]

    net, opt = train(torch.optim.Adam, groups, **kw)
    src = save(tmp_path / "ams.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src)
    assert rep["escapes"] < rep["moment_values"] // 10
    assert_step_close(torch.optim.Adam, orig, back, grads_like(net), groups, **kw)


def test_step_zero(tmp_path):
    kw = dict(lr=1e-3)
    net, opt = train(torch.optim.Adam, **kw)
    sd = opt.state_dict()
    for s in sd["state"].values():
        s["step"] = torch.tensor(0.0)
    torch.save({"model": net.state_dict(), "optimizer": sd}, tmp_path / "s0.pt")
    orig = torch.load(tmp_path / "s0.pt")
    rep, back = roundtrip(tmp_path, tmp_path / "s0.pt")
    assert rep["escapes"] < rep["moment_values"]
    assert_step_close(torch.optim.Adam, orig, back, grads_like(net), **kw)


@pytest.mark.parametrize("key,value,why", [
    ("betas", (1.0, 0.999), "beta1 = 1 outside [0, 1)"), ("betas", (-0.1, 0.999), "beta1 = -0.1 outside [0, 1)"),
    ("betas", (0.9, 1.0), "beta2 = 1 outside [0, 1)"), ("eps", -1e-8, "eps = -1e-08 < 0"),
    ("lr", -1e-3, "lr = -0.001 < 0"), ("step", -1.0, "step = -1 is not a whole count >= 0"),
    ("step", 2.5, "step = 2.5 is not a whole count >= 0")])
def test_hyper_parameters_torch_loads_but_adam_rejects_are_kept_exact(tmp_path, key, value, why):
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.Adam, lr=1e-3)
    sd = opt.state_dict()
    if key == "step":
        sd["state"][0]["step"] = torch.tensor(value)
    else:
        sd["param_groups"][0][key] = value
    torch.save({"model": net.state_dict(), "optimizer": sd}, tmp_path / "w.pt")
    orig = torch.load(tmp_path / "w.pt")
    rep, back = roundtrip(tmp_path, tmp_path / "w.pt")
    notes = {t["name"]: t["note"] for t in rep["tensors"]}
    kept = [n for n, t in notes.items() if t == "kept exact: " + why]
    assert kept, notes
    for i, s in orig["optimizer"]["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            if key != "step" or i == 0:
                assert torch.equal(back["optimizer"]["state"][i][k], s[k])


def test_max_exp_avg_sq_same_object_as_exp_avg_sq(tmp_path):
    net, opt = train(torch.optim.Adam, lr=1e-3, amsgrad=True)
    sd = opt.state_dict()
    sd["state"][0]["max_exp_avg_sq"] = sd["state"][0]["exp_avg_sq"]
    torch.save({"model": net.state_dict(), "optimizer": sd}, tmp_path / "same.pt")
    orig = torch.load(tmp_path / "same.pt")
    rep, back = roundtrip(tmp_path, tmp_path / "same.pt")
    assert any(t["note"] == "kept exact: max_exp_avg_sq is the same tensor as another moment" for t in rep["tensors"])
    s = back["optimizer"]["state"][0]
    assert s["max_exp_avg_sq"] is s["exp_avg_sq"] or s["max_exp_avg_sq"].data_ptr() == s["exp_avg_sq"].data_ptr()
    assert torch.equal(s["exp_avg_sq"], orig["optimizer"]["state"][0]["exp_avg_sq"])


def test_leaf_sharing_a_moment_is_kept_exact(tmp_path):
    net, opt = train(torch.optim.Adam, lr=1e-3)
    sd = opt.state_dict()
    extra = {"ema_of_first_moment": sd["state"][1]["exp_avg"]}
    torch.save({"model": net.state_dict(), "optimizer": sd, **extra}, tmp_path / "ema.pt")
    orig = torch.load(tmp_path / "ema.pt")
    rep, back = roundtrip(tmp_path, tmp_path / "ema.pt")
    assert any(t["note"] == "kept exact: exp_avg shares its storage with another leaf" for t in rep["tensors"])
    assert torch.equal(back["ema_of_first_moment"], orig["ema_of_first_moment"])
    assert torch.equal(back["optimizer"]["state"][1]["exp_avg"], orig["optimizer"]["state"][1]["exp_avg"])


# ---------------------------------------------------------------------------- 10. -0.0

@pytest.mark.parametrize("codec", ["vlog", "log8", "blockwise8", "bf16"])
def test_signed_zeros_stay_exact(tmp_path, codec):
    net, opt = train(torch.optim.Adam, lr=1e-3)
    st = opt.state_dict()["state"]
    m, v = st[0]["exp_avg"].view(-1), st[0]["exp_avg_sq"].view(-1)
    m[:3] = torch.tensor([-0.0, 0.0, -0.0])
    m[3:6] = 0.0  # m = 0 where v is a zero: such a coordinate keeps its codes (certificate 0)
    v[3:6] = torch.tensor([-0.0, 0.0, -0.0])
    st[2]["exp_avg"].view(-1)[:256] = 0.0  # an all-zero blockwise8 block (+0.0)
    st[2]["exp_avg_sq"].view(-1)[:256] = 1e-6
    src = save(tmp_path / "z.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src, "--codec", codec)
    for i in (0, 2):
        for k in ("exp_avg", "exp_avg_sq"):
            a, b2 = orig["optimizer"]["state"][i][k].view(-1), back["optimizer"]["state"][i][k].view(-1)
            zeros = a == 0
            assert torch.equal(torch.signbit(a[zeros]), torch.signbit(b2[zeros])), (i, k)
            assert torch.all(b2[zeros] == 0)


# ---------------------------------------------------------------------------- NAdam and friends

@pytest.mark.parametrize("cls,kw,why", [
    (torch.optim.NAdam, {}, "kept exact: NAdam state (not Adam)"),
    (torch.optim.RAdam, {}, "kept exact: param group without 'amsgrad' (RAdam or another Adam variant, not Adam)"),
    (torch.optim.Adamax, {}, "kept exact: Adamax state (not Adam)"),
    (torch.optim.SGD, {"momentum": 0.9}, "kept exact: SGD state (not Adam)")])
def test_adam_variants_are_kept_exact_not_compressed(tmp_path, cls, kw, why):
    """An NAdam (RAdam, Adamax, SGD with momentum) state is never coded as Adam: kept exact
    with one note line, exit 0, no escape warning, and one real step of its own class is
    bit-identical."""
    b = require_ckptkit_bin()
    kw = dict(lr=1e-3, **kw)
    net, opt = train(cls, **kw)
    src = save(tmp_path / "v.pt", net, opt)
    orig = torch.load(src)
    c = run_tool(b, "ckpt-compress", src, "-o", tmp_path / "o.h5", "--json")
    assert c.returncode == 0, c.stderr
    rep = parse_json_stdout(c)
    assert {t["note"] for t in rep["tensors"]} == {why} and rep["escapes"] == rep["moment_values"]
    n = len(rep["tensors"])
    assert [line for line in c.stderr.splitlines()] == [
        f"ckpt-compress: warning: {src}: {why}: {n} tensors ({', '.join(t['name'] for t in rep['tensors'][:3])}"
        + (f", ... {n - 3} more)" if n > 3 else ")")]
    # the values are the moments' own elements (the model's parameter count per moment)
    per = sum(p.numel() for p in net.parameters())
    assert rep["moment_values"] == per * len([k for k in orig["optimizer"]["state"][0] if k != "step"
                                              and torch.is_tensor(orig["optimizer"]["state"][0][k])
                                              and orig["optimizer"]["state"][0][k].dim() > 0])
    r = run_tool(b, "ckpt-restore", tmp_path / "o.h5", "-o", tmp_path / "back.pt")
    assert r.returncode == 0
    back = torch.load(tmp_path / "back.pt")
    g = grads_like(net)
    d0 = one_step(cls, None, kw, orig["model"], orig["optimizer"], g)
    d1 = one_step(cls, None, kw, back["model"], back["optimizer"], g)
    assert all(torch.equal(a, b2) for a, b2 in zip(d0, d1))


# ---------------------------------------------------------------------------- 12. NaN == NaN

def test_verify_accepts_nan_in_both_states(tmp_path):
    """m = v = 0, eps = 0, g = 0 gives NaN in torch for both states: not a violation."""
    kw = dict(lr=1e-3, eps=0.0)
    net, opt = train(torch.optim.Adam, **kw)
    st = opt.state_dict()["state"]
    st[0]["exp_avg"].view(-1)[:64] = 0.0
    st[0]["exp_avg_sq"].view(-1)[:64] = 0.0
    src = save(tmp_path / "nan.pt", net, opt)
    roundtrip(tmp_path, src)


# ---------------------------------------------------------------------------- 11. cell edges

def _log8_cells(container):
    """Per coded parameter (manifest order): decoded exp_avg_sq and the rounding cells of
    exp_avg and exp_avg_sq, recomputed from the stored log8 codes (formats/container.md)."""
    import make_bad_containers as mbc
    table = np.float32(2.0 ** (np.arange(65) / 64.0)).astype(np.float64)

    def value(e):
        e = np.asarray(e, dtype=np.int64)
        q = e // 64
        return (table[e - 64 * q] * np.power(2.0, np.clip(q, -200, 200))).astype(np.float32).astype(np.float64)

    with h5py.File(container, "r") as f:
        man = mbc.get_manifest(f)
        codes = [mbc.read_dataset(f["moments/codes/" + r]).astype(np.int64) for r in ("exp_avg", "exp_avg_sq")]
        pars = [mbc.read_dataset(f["moments/params/" + r]).reshape(-1, 2).astype(np.int64) for r in ("exp_avg", "exp_avg_sq")]
    out = []
    for p in man["params"]:
        n, c0 = p["numel"], p["code_offset"]
        blk = np.arange(n) // 64 + p["block_offset"]
        kv, et, s = codes[1][c0:c0 + n], pars[1][blk, 0], pars[1][blk, 1]
        x = lambda k: value(et - (255 - k) * s)  # noqa: E731
        vd = np.where(kv == 0, 0.0, x(kv))
        cm = codes[0][c0:c0 + n]
        km, neg = cm & 0x7F, (cm & 0x80) != 0
        d = value(pars[0][blk, 0]) * np.sqrt(vd)
        lo, hi = np.where(km == 0, -0.5 * d, (km - 0.5) * d), (km + 0.5) * d
        mlo, mhi = np.where(neg & (km > 0), -hi, lo), np.where(neg & (km > 0), -lo, hi)
        out.append((kv, (x(kv) + x(kv - 1)) / 2, (x(kv) + x(kv + 1)) / 2, mlo, mhi))
    return out


def _inward(x, lo, hi, up):
    """The float32 nearest the upper (lower) cell edge that is still inside the cell."""
    t = np.float32(hi if up else lo)
    while (float(t) > hi) if up else (float(t) < lo):
        t = np.nextafter(t, np.float32(-np.inf if up else np.inf))
    return t


@pytest.mark.parametrize("kind,kw", [("adam", dict(lr=1e-3)), ("adam", dict(lr=1e-3, weight_decay=0.1))])
def test_originals_at_both_cell_edges_verify(tmp_path, kind, kw):
    """(log8; vlog's cell edges: test/codec/test_guard.cpp) Originals pushed to the far edges of their log8 cells (each of the four corner
    combinations) still verify with --original: every per-coordinate certificate bounds
    the true error on the dense grid, and one real step agrees within tolerance."""
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.Adam, steps=100, **kw)
    src = save(tmp_path / "o.pt", net, opt)
    assert run_tool(b, "ckpt-compress", src, "-o", tmp_path / "o.h5", "--optimizer", kind, "--codec", "log8").returncode == 0
    cells = _log8_cells(tmp_path / "o.h5")
    for mup, vup in ((1, 1), (0, 0), (1, 0), (0, 1)):
        sd = torch.load(src)
        for j, (kv, vlo, vhi, mlo, mhi) in enumerate(cells):
            mn = sd["optimizer"]["state"][j]["exp_avg"].view(-1).numpy()
            vn = sd["optimizer"]["state"][j]["exp_avg_sq"].view(-1).numpy()
            for i in np.nonzero(kv)[0]:
                vn[i] = _inward(vn[i], vlo[i], vhi[i], vup)
                mn[i] = _inward(mn[i], mlo[i], mhi[i], mup)
        edge = tmp_path / f"edge{mup}{vup}.pt"
        torch.save(sd, edge)
        rep, back = roundtrip(tmp_path, edge, "--optimizer", kind, "--force", "--codec", "log8")
        assert_step_close(torch.optim.Adam, torch.load(edge), back, grads_like(net), **kw)


def test_verify_original_catches_codes_of_another_coordinate(tmp_path):
    """The dense-grid check itself: the exp_avg and exp_avg_sq codes of two kept AdamW
    coordinates of one block are swapped (dataset hashes recomputed). Every certificate is
    still one the codec made (each is the other coordinate's), so verify without the
    original passes; against the original the grid finds the update differences, exit 1."""
    import make_bad_containers as mbc
    b = require_ckptkit_bin()
    net, opt = train(torch.optim.AdamW, lr=1e-3, weight_decay=0.0)
    src = save(tmp_path / "w.pt", net, opt)
    out = tmp_path / "c.h5"
    # the first-update certificate: the dense grid of single gradients is what is tested
    assert run_tool(b, "ckpt-compress", src, "-o", out, "--codec", "log8", "--horizon", "1").returncode == 0
    with h5py.File(out, "r+") as f:
        p = mbc.get_manifest(f)["params"][0]
        assert p["escapes"] == 0 and p["numel"] >= 64
        m = mbc.read_dataset(f["moments/codes/exp_avg"]).copy()
        v = mbc.read_dataset(f["moments/codes/exp_avg_sq"]).copy()
        base = p["code_offset"]
        blk = slice(base, base + 64)
        j = base + int(np.argmax(np.abs(m[blk].astype(int) - int(m[base]))))
        assert m[j] != m[base]
        for arr in (m, v):
            arr[base], arr[j] = arr[j], arr[base]
        mbc._replace(f, "moments/codes/exp_avg", m)
        mbc._replace(f, "moments/codes/exp_avg_sq", v)
    r = run_tool(b, "ckpt-verify", out)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_tool(b, "ckpt-verify", out, "--original", src, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = parse_json_stdout(r)
    assert not rep["ok"]
    assert "grid points exceed their certificate" in json.dumps(rep)


# ------------------------------------------------------------------ every later update

@pytest.mark.parametrize("fixture,G", [("cnn_adam_l2.pt", "1.0"), ("cnn_maximize.pt", "inf"),
                                       ("lm_amsgrad.pt", "1.0"), ("cnn_adamw.safetensors", "1.0")])
def test_every_update_within_tolerance_for_gradient_sequences(tmp_path, fixture, G):
    """--horizon all (the default): from the restored fixture, 150 real optimizer steps of
    the fixture's own class (Adam + L2, maximize, amsgrad, AdamW) fed the same gradient
    sequences as the original (ramps aligned with exp_avg, a spike after a zero run,
    alternating signs, noise: scripts/torch_step_check.py sequence_kinds) move every
    parameter by the original's step within tolerance * lr at every step."""
    from testlib import DATA, torch_step_check as tsc
    b = require_ckptkit_bin()
    src = os.path.join(DATA, fixture)
    ckz, out = tmp_path / "c.ckz.h5", tmp_path / ("r" + os.path.splitext(fixture)[1])
    assert run_tool(b, "ckpt-compress", src, "-o", ckz, "--grad-bound", G).returncode == 0
    assert run_tool(b, "ckpt-restore", ckz, "-o", out).returncode == 0
    errors, res = tsc.check_pair(src, str(out), tolerance=TOL, grad_bound=float(G), fixture=fixture, steps=150)
    assert errors == []
    assert any(k.endswith("x150") for k in res)
    assert all(r["ok"] for r in res.values()), res


@pytest.mark.parametrize("cls,kw", [(torch.optim.Adam, {}), (torch.optim.AdamW, {"weight_decay": 0.01}),
                                    (torch.optim.Adam, {"amsgrad": True})])
def test_beta1_zero_is_coded(tmp_path, cls, kw):
    """betas = (0, b2) (no first-moment averaging, as StyleGAN trains): the next update
    replaces exp_avg (b1 m + (1 - b1) g = g), so it enters no certificate and the plan gives it
    the coarsest step; exp_avg_sq is coded as for any b1 (before: every value escaped, the
    container larger than its input). 30 real steps from the restored state with the
    original's gradients move every parameter by the original's step within tolerance * lr."""
    kw = dict(kw, lr=2e-3, betas=(0.0, 0.99))
    net, opt = train(cls, steps=20, **kw)
    src = save(tmp_path / "b1zero.pt", net, opt)
    orig = torch.load(src)
    rep, back = roundtrip(tmp_path, src)
    assert rep["escapes"] == 0 and rep["moment_reduction"] > 0.8, (rep["escapes"], rep["moment_reduction"])
    nets, opts = [], []
    for sd in (orig, back):
        n = Net()
        n.load_state_dict(sd["model"])
        o = cls(n.parameters(), **kw)
        o.load_state_dict(copy.deepcopy(sd["optimizer"]))
        nets.append(n)
        opts.append(o)
    for step in range(30):
        grads = grads_like(net, 10.0 ** (step % 5 - 2), seed=step)
        assert_moved_close(*[moved_by_step(n, o, grads) for n, o in zip(nets, opts)], kw["lr"], step)


def test_first_update_certificate_breaks_on_an_aligned_ramp(tmp_path):
    """The sequences can fail: with --horizon 1 (the first update only) the aligned ramp
    drives a later update of the restored Adam + L2 fixture past tolerance * lr."""
    from testlib import DATA, torch_step_check as tsc
    b = require_ckptkit_bin()
    src = os.path.join(DATA, "cnn_adam_l2.pt")
    ckz, out = tmp_path / "c.ckz.h5", tmp_path / "r.pt"
    assert run_tool(b, "ckpt-compress", src, "-o", ckz, "--horizon", "1").returncode == 0
    assert run_tool(b, "ckpt-restore", ckz, "-o", out).returncode == 0
    errors, res = tsc.check_pair(src, str(out), tolerance=TOL, grad_bound=1.0, fixture="cnn_adam_l2.pt", steps=120)
    assert errors == []
    assert all(r["ok"] for k, r in res.items() if "x120" not in k)  # the first update holds
    assert not res["ramp100 x120"]["ok"] and res["ramp100 x120"]["max_lr"] > TOL, res["ramp100 x120"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_update_low_precision_moments(tmp_path, dtype):
    """--horizon all on moments stored in bfloat16 / float16 next to float32 parameters
    (torch casts loaded moments to the parameter's dtype): the AdamW fixture with its moments
    cast, compressed, restored, then 100 real steps of each gradient sequence from both states
    stay within tolerance * lr at every step."""
    from testlib import DATA, torch_step_check as tsc
    b = require_ckptkit_bin()
    obj = torch.load(os.path.join(DATA, "cnn_adamw.pt"))
    for st in obj["optimizer"]["state"].values():
        for k in ("exp_avg", "exp_avg_sq"):
            st[k] = st[k].to(dtype)
    src, ckz, out = tmp_path / "lp.pt", tmp_path / "lp.ckz.h5", tmp_path / "r.pt"
    torch.save(obj, src)
    r = run_tool(b, "ckpt-compress", src, "-o", ckz, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(t["note"] == "" for t in json.loads(r.stdout)["tensors"])   # every state coded
    assert run_tool(b, "ckpt-restore", ckz, "-o", out).returncode == 0
    errors, res = tsc.check_pair(str(src), str(out), tolerance=TOL, grad_bound=1.0, fixture="cnn_adamw.pt", steps=100)
    assert errors == []
    assert sum(k.endswith("x100") for k in res) == 5
    assert all(r["ok"] for r in res.values()), res


# ------------------------------------------------------- moments at the bottom of float32

def test_default_init_lm_underflowed_moments_get_codes(tmp_path):
    """A tied-embedding LM with torch's default N(0, 1) embedding init saved after 16 AdamW
    steps (data/lm_default_init.pt, loss ~ 60): the unseen tokens' gradients are ~1e-30, so
    their exp_avg_sq underflowed to subnormals or to 0 while exp_avg did not. Format 5 had no
    code for those (exp_avg's unit was sqrt(v~) = 0; the grid had no subnormal cells; the FP32
    gate refused subnormal states) and escaped them all; format 6 codes them: < 0.5% of the
    values escape, verify --original passes, and 100 real AdamW steps of every gradient
    sequence from the restored state stay within tolerance * lr of the original's."""
    from testlib import DATA, torch_step_check as tsc
    b = require_ckptkit_bin()
    src = os.path.join(DATA, "lm_default_init.pt")
    state = torch.load(src)["optimizer"]["state"].values()
    coords = sum(s["exp_avg"].numel() for s in state)
    zero_v = sum(int(((s["exp_avg_sq"] == 0) & (s["exp_avg"] != 0)).sum()) for s in state)
    subnormal_v = sum(int(((s["exp_avg_sq"] > 0) & (s["exp_avg_sq"] < torch.finfo(torch.float32).tiny)).sum()) for s in state)
    assert zero_v > 0.01 * coords and subnormal_v > 0.01 * coords, (zero_v, subnormal_v, coords)  # what format 5 escaped
    ckz, out = tmp_path / "c.ckz.h5", tmp_path / "r.pt"
    r = run_tool(b, "ckpt-compress", src, "-o", ckz, "--json")
    assert r.returncode == 0, r.stderr
    rep = parse_json_stdout(r)
    values = sum(t["values"] for t in rep["tensors"])
    assert rep["escapes"] < 0.005 * values, rep["escapes"]
    v = run_tool(b, "ckpt-verify", ckz, "--original", src, timeout=600)
    assert v.returncode == 0, v.stdout + v.stderr
    assert run_tool(b, "ckpt-restore", ckz, "-o", out).returncode == 0
    errors, res = tsc.check_pair(src, str(out), tolerance=TOL, grad_bound=1.0, fixture="lm_default_init.pt", steps=100)
    assert errors == []
    assert sum(k.endswith("x100") for k in res) == 5
    assert all(r["ok"] for r in res.values()), res


# ------------------------------------------------------------ what the tolerance bounds

class NormNet(nn.Module):
    """Linear -> LayerNorm -> Linear: LayerNorm's weights start at 1 (|theta| > 2^23 tau lr at lr 5e-6)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 256)
        self.n = nn.LayerNorm(256)
        self.b = nn.Linear(256, 64)

    def forward(self, x):
        return self.b(torch.tanh(self.n(self.a(x))))


def _params_after_step(model_sd, opt_sd, grads, lr):
    """Every parameter after one real AdamW step from the given state."""
    net = NormNet()
    net.load_state_dict(model_sd)
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    opt.load_state_dict(copy.deepcopy(opt_sd))
    for p, g in zip(net.parameters(), grads):
        p.grad = g.clone()
    opt.step()
    return [p.detach().clone() for p in net.parameters()]


def test_bound_param_bounds_the_parameter_itself(tmp_path):
    """Issue 52.2. The certificate bounds the update torch subtracts; torch rounds theta - u
    once, so LayerNorm weights near 1 at lr 5e-6 (1 ulp = 6e-8 > tau lr = 5e-8) can land
    one ulp apart: with the default --bound update some parameter after a real AdamW step is
    more than tau * lr from the original's. With --bound param every parameter after the step
    is within tau * lr, without slack (the coordinates where an ulp does not fit are kept
    exact: escapes), and verify --original proves the container."""
    lr = 5e-6
    torch.manual_seed(0)
    net = NormNet()
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    for _ in range(30):
        x, y = torch.randn(32, 64), torch.randn(32, 64)
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    src = tmp_path / "norm.pt"
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, src)
    orig = torch.load(src)
    grads = [grads_like(net, s, seed) for s, seed in ((1.0, 1), (1e-3, 2), (0.0, 3))]

    def worst(back):
        out = 0.0
        for g in grads:
            a = _params_after_step(orig["model"], orig["optimizer"], g, lr)
            b = _params_after_step(back["model"], back["optimizer"], g, lr)
            out = max(out, max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b)))
        return out

    rep_u, back_u = roundtrip(tmp_path, src, "--force")
    assert rep_u["bound"] == "update"
    assert worst(back_u) > TOL * lr  # the ulp of theta, not the update
    # the report counts the coded coordinates in the ulp regime, |theta| > 2^23 tau lr (escaped
    # ones excepted: their parameter is exact)
    thr = torch.tensor(2.0 ** 23 * TOL * lr, dtype=torch.float32)
    by_name = {t["name"]: t for t in rep_u["tensors"]}
    assert set(by_name) == set(orig["model"])
    for name, theta in orig["model"].items():
        t, above = by_name[name], int((theta.abs() > thr).sum())
        assert above - t["escapes"] // 2 <= t["ulp_regime"] <= above, name
    assert by_name["n.weight"]["ulp_regime"] == 256 and by_name["n.bias"]["ulp_regime"] == 0
    assert rep_u["ulp_regime"] == sum(t["ulp_regime"] for t in rep_u["tensors"])
    rep_p, back_p = roundtrip(tmp_path, src, "--bound", "param", "--force")
    assert rep_p["bound"] == "param" and rep_p["escapes"] > rep_u["escapes"]
    assert rep_p["ulp_regime"] is None  # the parameter itself is certified
    assert worst(back_p) <= TOL * lr
    v = run_tool(require_ckptkit_bin(), "ckpt-verify", tmp_path / "c.ckz.h5", "--json")
    assert v.returncode == 0 and parse_json_stdout(v)["bound"] == "param", v.stdout + v.stderr
