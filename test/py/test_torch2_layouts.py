"""Checkpoints written by the running torch 2.x itself (the torch 2.x line of the test matrix;
skipped under torch 1.13, whose own files the other tests use): every optimizer layout ckptkit
claims, made by real torch.optim.Adam / AdamW objects with the flag under test and saved by
torch.save, and a safetensors checkpoint written by the `safetensors` package.

Each goes compress -> verify --original -> restore -> stock torch.load with torch 2.x's default
weights_only=True -> load_state_dict into the same optimizer class with the same flags ->
STEPS real optimizer steps from the original and from the restored state, fed the same gradient
sequence (five kinds, from 1e-6 to 1e3): every update within tolerance * lr of the original's,
plus FP32 slack (4 ulp of |theta|, 8 ulp of the updates: the parameter is written in FP32).
Flags that change torch's update arithmetic (foreach, fused, capturable, differentiable) are
certified in that arithmetic (docs/design.md, "torch 2.x's update forms"); capturable /
differentiable below lr 2^-40 are kept exact with one note.
"""
import copy
import json
import os

import pytest
import torch
import torch.nn as nn

from testlib import parse_json_stdout, require_ckptkit_bin, run_tool
import torch_step_check as tsc

if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("layouts written by torch 2.x: run by the torch 2.x line (roundtrip_pytest_torch2)",
                allow_module_level=True)

TOL = 0.01
STEPS = 3
EPS32 = torch.finfo(torch.float32).eps

# name -> (optimizer class, its keyword arguments); "named" passes named_parameters()
# (torch >= 2.6 keeps `param_names` in each group)
LAYOUTS = {
    "adam": (torch.optim.Adam, {}),
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.05}),
    "adam_l2": (torch.optim.Adam, {"weight_decay": 0.01}),
    "amsgrad": (torch.optim.AdamW, {"amsgrad": True}),
    "maximize": (torch.optim.Adam, {"maximize": True}),
    "foreach": (torch.optim.AdamW, {"foreach": True}),
    "fused": (torch.optim.AdamW, {"fused": True}),
    "fused_amsgrad": (torch.optim.Adam, {"fused": True, "amsgrad": True, "weight_decay": 0.01}),
    "capturable": (torch.optim.Adam, {}),   # CAPTURABLE below
    "differentiable": (torch.optim.AdamW, {}),   # LR_DIVIDES below
    "tensor_lr": (torch.optim.Adam, {"lr": torch.tensor(1e-3), "foreach": False}),
    "named": (torch.optim.AdamW, {"weight_decay": 0.02}),
}


# The forms that divide by lr (torch/optim/adam.py: `if capturable or differentiable`): torch
# steps capturable=True only on an accelerator and differentiable=True only on non-leaf
# parameters, so they are trained plainly and the flag is set in the groups before
# state_dict, as a GPU or meta-learning run's file states it; their steps here run that
# arithmetic through differentiable=True on parameters that do not require grad.
LR_DIVIDES = {"capturable": {"capturable": True}, "differentiable": {"differentiable": True}}
STEPS_AS = {"capturable": False, "differentiable": True}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.LayerNorm(96), nn.GELU(), nn.Linear(96, 10))


def _optimizer(name, model):
    cls, kw = LAYOUTS[name]
    kw = dict(kw)
    kw.setdefault("lr", 1e-3)
    if isinstance(kw["lr"], torch.Tensor):
        kw["lr"] = kw["lr"].clone()
    params = model.named_parameters() if name == "named" else model.parameters()
    return cls(params, **kw)


def _train(name, steps=30, lr=None):
    """A model and optimizer after `steps` real steps on fixed data."""
    model = _model()
    opt = _optimizer(name, model)
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 48, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for g in opt.param_groups:
        g.update(LR_DIVIDES.get(name, {}))
    return model, opt


def _roundtrip(tmp_path, src, *flags):
    """compress -> verify --original -> restore; the --json report and the restored path."""
    b = require_ckptkit_bin()
    out, back = tmp_path / "c.ckz.h5", tmp_path / ("back" + os.path.splitext(str(src))[1])
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--json", *flags)
    assert c.returncode == 0, c.stderr
    v = run_tool(b, "ckpt-verify", out, "--original", src)
    assert v.returncode == 0, v.stdout + v.stderr
    r = run_tool(b, "ckpt-restore", out, "-o", back)
    assert r.returncode == 0, r.stderr
    return parse_json_stdout(c), back


def _grads(kind, params, gen):
    if kind == "random":
        return [2 * torch.rand(p.shape, generator=gen) - 1 for p in params]
    if kind == "tiny":
        return [1e-6 * torch.randn(p.shape, generator=gen) for p in params]
    if kind == "large":
        return [1e3 * torch.randn(p.shape, generator=gen) for p in params]
    if kind == "zeros":
        return [torch.zeros_like(p) for p in params]
    return [torch.ones_like(p) for p in params]


def _assert_updates_close(name, model_sd, osd_a, osd_b):
    """STEPS real steps of LAYOUTS[name]'s optimizer from osd_a and from osd_b with the same
    gradient sequence: each update (parameter after - before) within TOL * lr + slack."""
    for kind in ("random", "tiny", "large", "zeros", "ones"):
        runs = []
        for osd in (osd_a, osd_b):
            m = _model()
            m.load_state_dict(model_sd)
            o = _optimizer(name, m)
            o.load_state_dict(copy.deepcopy(osd))
            for g in o.param_groups:
                g.update(STEPS_AS if name in LR_DIVIDES else {})
            m.requires_grad_(False)   # gradients are set by hand; differentiable steps them in place
            runs.append((m, o))
        gen = torch.Generator().manual_seed(7)
        for step in range(STEPS):
            grads = _grads(kind, list(runs[0][0].parameters()), gen)
            deltas = []
            for m, o in runs:
                before = [p.detach().clone() for p in m.parameters()]
                for p, g in zip(m.parameters(), grads):
                    p.grad = g.clone()
                o.step()
                deltas.append([p.detach() - b for p, b in zip(m.parameters(), before)])
            lr = float(runs[0][1].param_groups[0]["lr"])
            for (pname, p), da, db in zip(runs[0][0].named_parameters(), *deltas):
                diff = (da - db).abs().double()
                slack = 4 * EPS32 * p.detach().abs().double() + 8 * EPS32 * (da.abs() + db.abs()).double()
                worst = float((diff - slack).max())
                assert worst <= TOL * lr, f"{name} {kind} step {step + 1} {pname}: {worst / lr:.3g} lr"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_torch2_layout_roundtrip(tmp_path, name):
    model, opt = _train(name)
    src = tmp_path / f"{name}.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, src)
    rep, back = _roundtrip(tmp_path, src)
    assert rep["escapes"] < 0.2 * rep["moment_values"], rep["escapes"]
    assert all(t["note"] == "" for t in rep["tensors"]), [t["note"] for t in rep["tensors"] if t["note"]]
    assert rep["moment_reduction"] > 0.5 and rep["max_bound_lr"] <= TOL
    orig = torch.load(src, weights_only=True)
    rest = torch.load(back, weights_only=True)    # torch 2.x's default, stated
    assert not tsc.compare_checkpoints(orig, rest, check_zeros=True)
    if name == "named":
        assert orig["optimizer"]["param_groups"][0]["param_names"] == [n for n, _ in model.named_parameters()]
    _assert_updates_close(name, orig["model"], orig["optimizer"], rest["optimizer"])


@pytest.mark.parametrize("name", ["capturable", "differentiable"])
def test_lr_divisor_forms_below_2_pow_minus_40_are_kept_exact(tmp_path, name):
    """torch's capturable / differentiable Adam divides by lr / (1 - beta1^t): below lr 2^-40
    one run's denominator can overflow where the other's does not, so such states are kept
    exact, with the reason in the report, and restore bit-identical."""
    model, opt = _train(name, steps=5, lr=1e-13)
    src = tmp_path / f"{name}.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, src)
    rep, back = _roundtrip(tmp_path, src)
    notes = {t["note"] for t in rep["tensors"]}
    assert rep["tensors"] and all("divides by lr" in n for n in notes), notes
    orig, rest = torch.load(src, weights_only=True), torch.load(back, weights_only=True)
    for k, st in orig["optimizer"]["state"].items():
        for key, t in st.items():
            assert torch.equal(t, rest["optimizer"]["state"][k][key]), (k, key)


def test_safetensors_package_checkpoint(tmp_path):
    """A checkpoint written by safetensors.torch.save_file (model and optimizer tensors, the
    param_groups as __metadata__ JSON): compressed, verified, restored to a file the
    safetensors package loads with the same metadata, and AdamW steps within tolerance."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    model, opt = _train("adamw")
    osd = opt.state_dict()
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, st in osd["state"].items():
        for k, v in st.items():
            tensors[f"state.{i}.{k}"] = v.reshape(1) if v.dim() == 0 else v
    groups = [{k: v for k, v in g.items()} for g in osd["param_groups"]]
    meta = {"optimizer": "adamw", "param_groups": json.dumps(groups),
            "param_names": json.dumps([f"model.{n}" for n, _ in model.named_parameters()])}
    src = tmp_path / "ckpt.safetensors"
    save_file(tensors, str(src), metadata=meta)
    rep, back = _roundtrip(tmp_path, src)
    assert rep["moment_reduction"] > 0.5 and all(t["note"] == "" for t in rep["tensors"])
    with safe_open(str(back), "pt") as f:
        assert f.metadata() == meta
    a, b = load_file(str(src)), load_file(str(back))
    assert list(a) == list(b)

    def as_osd(t):
        state = {i: {k: t[f"state.{i}.{k}"].reshape(()) if k == "step" else t[f"state.{i}.{k}"] for k in st}
                 for i, st in osd["state"].items()}
        return {"state": state, "param_groups": copy.deepcopy(osd["param_groups"])}
    for k in a:
        if not k.endswith(("exp_avg", "exp_avg_sq")):
            assert torch.equal(a[k], b[k]), k
    _assert_updates_close("adamw", model.state_dict(), as_osd(a), as_osd(b))
