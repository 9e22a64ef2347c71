"""Mask buffers among the theta candidates (issue 43, item 3), on checkpoints made here by
real torch.

A transformer's causal-mask buffer of -inf with the shape of a parameter is a same-shape
"parameter candidate" when Adam's L2 domain maps theta by shape (torch 1.13 files carry no
param_names). Its non-finite values are left out of the bound |theta| <= max over the
candidates (where the parameter is +-inf or NaN, so is the update, whatever the moments
hold); its finite values still count. compress must succeed, verify --original pass, restore
give a torch.load-able file whose first Adam step is within tolerance * lr of the original's.

Binaries come from $CKPTKIT_BIN (FAIL, never skip).
Run: CKPTKIT_BIN=build/apps /usr/bin/python3 -m pytest -q test/py/test_mask_buffers.py
"""
import math
import re

import pytest
import torch
import torch.nn as nn

from testlib import parse_json_stdout, require_ckptkit_bin, run_tool

N = 16      # sequence length = model width: the mask has a Linear weight's shape
TOL = 0.01


class MaskedBlock(nn.Module):
    """One causal attention block; `mask` is -inf above the diagonal and `fill` elsewhere
    (0: the usual causal mask; a constant per row leaves softmax unchanged)."""

    def __init__(self, fill=0.0):
        super().__init__()
        self.q = nn.Linear(N, N, bias=False)
        self.k = nn.Linear(N, N, bias=False)
        self.v = nn.Linear(N, N)
        self.out = nn.Linear(N, 4)
        mask = torch.full((N, N), float(fill))
        self.register_buffer("mask", mask.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf")))

    def forward(self, x):
        att = (self.q(x) @ self.k(x).transpose(1, 2)) / math.sqrt(N) + self.mask
        return self.out((att.softmax(-1) @ self.v(x)).mean(1))


def _batch(gen):
    return torch.randn(8, N, N, generator=gen), torch.randn(8, 4, generator=gen)


def _loss(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _make(path, fill, steps=5):
    """Train MaskedBlock(fill) a few Adam + L2 steps; torch.save model and optimizer."""
    torch.manual_seed(0)
    model = MaskedBlock(fill)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        _loss(model, _batch(gen)).backward()
        opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    return model


def _first_update(sd, grads):
    """theta1 - theta0 of one torch Adam step from checkpoint `sd` with gradients `grads`."""
    model = MaskedBlock()
    model.load_state_dict(sd["model"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt.load_state_dict(sd["optimizer"])
    before = [p.detach().clone() for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    opt.step()
    return [p.detach() - b for p, b in zip(model.parameters(), before)], opt.param_groups[0]["lr"]


@pytest.mark.parametrize("horizon", ["1", "all"])   # 1: the first update, where the theta bound is what is certified
@pytest.mark.parametrize("fill", [0.0, 3.0], ids=["causal", "finite3"])
def test_mask_buffer_is_no_parameter(tmp_path, fill, horizon):
    b = require_ckptkit_bin()
    src, ckz, back = tmp_path / "block.pt", tmp_path / "block.ckz.h5", tmp_path / "back.pt"
    model = _make(src, fill)
    p = run_tool(b, "ckpt-compress", src, "-o", ckz, "--tolerance", TOL, "--horizon", horizon)
    assert p.returncode == 0, p.stderr
    if horizon == "1":   # (every update: any gradient sequence, no theta needed)
        # the (N, N) states: Adam's L2 domain over the three same-shape tensors, the mask's
        # finite values included (0 or `fill`), its -inf left out
        square = [model.q.weight, model.k.weight, model.v.weight]
        bound = max([fill] + [float(w.detach().abs().max()) for w in square])
        shown = [float(m) for m in re.findall(r"wd\*theta, \|theta\| <= ([0-9.e+-]+)", p.stdout)]
        assert shown and max(shown) == pytest.approx(bound, rel=1e-5), p.stdout
        assert set(shown) == {shown[0]} and (bound == fill) == (fill > 0), (shown, bound)  # finite3: the mask's 3
    rep = parse_json_stdout(run_tool(b, "ckpt-verify", ckz, "--original", src, "--json"))
    assert rep["ok"] is True and rep["exit_code"] == 0, rep.get("failures")
    assert rep["moment_values"] > 0 and rep["moment_reduction"] > 0.3, rep
    p = run_tool(b, "ckpt-restore", ckz, "-o", back)
    assert p.returncode == 0, p.stderr
    orig, rest = torch.load(src), torch.load(back)
    assert torch.equal(orig["model"]["mask"], rest["model"]["mask"])
    # the first update after restore, with the model's real gradient and with |g| <= 1 noise
    model.zero_grad()
    _loss(model, _batch(torch.Generator().manual_seed(7))).backward()
    gen = torch.Generator().manual_seed(8)
    for grads in ([q.grad for q in model.parameters()],
                  [2 * torch.rand(q.shape, generator=gen) - 1 for q in model.parameters()]):
        (uo, lr), (ur, _) = _first_update(orig, grads), _first_update(rest, grads)
        for a, c in zip(uo, ur):
            slack = 8 * torch.finfo(torch.float32).eps * (a.abs() + c.abs()) + 1e-30
            assert torch.all((a - c).abs() <= TOL * lr + slack), float((a - c).abs().max()) / lr


def test_no_usable_candidate_is_as_none_found(tmp_path):
    """Every same-shape tensor is non-finite (the weights saved elsewhere): as when no
    candidate was found, exit 2 naming the state, or --param-bound B certifies it (the first
    update: --horizon 1, whose L2 domain needs theta)."""
    b = require_ckptkit_bin()
    src = tmp_path / "block.pt"
    model = _make(src, 0.0)
    sd = torch.load(src)
    sd["model"] = {k: v for k, v in sd["model"].items() if v.shape != (N, N)}
    sd["model"]["mask"] = torch.full((N, N), float("-inf"))
    sd["model"]["nan"] = torch.full((N, N), float("nan"))
    lone = tmp_path / "lone.pt"
    torch.save(sd, lone)
    p = run_tool(b, "ckpt-compress", lone, "-o", tmp_path / "lone.ckz.h5", "--horizon", "1")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"ckpt-compress: error: {lone}: cannot locate the parameter of optimizer state "), p.stderr
    assert not (tmp_path / "lone.ckz.h5").exists()
    bound = max(float(w.detach().abs().max()) for w in (model.q.weight, model.k.weight, model.v.weight))
    p = run_tool(b, "ckpt-compress", lone, "-o", tmp_path / "lone.ckz.h5", "--horizon", "1", "--param-bound", bound)
    assert p.returncode == 0, p.stderr
    p = run_tool(b, "ckpt-verify", tmp_path / "lone.ckz.h5", "--original", lone)
    assert p.returncode == 0, p.stdout + p.stderr


def test_float64_tensor_of_a_parameters_shape_is_no_candidate(tmp_path):
    """A float64 buffer with a parameter's shape (a precomputed rotary table, say) cannot be
    the parameter of float32 moments (torch creates moments in the parameter's dtype): it is
    left out of the candidates instead of refusing the file ("not FP32/F16/BF16")."""
    b = require_ckptkit_bin()
    src = tmp_path / "block.pt"
    model = _make(src, 0.0)
    sd = torch.load(src)
    sd["model"]["table"] = torch.randn(N, N, dtype=torch.float64) * 1e6
    f64 = tmp_path / "f64.pt"
    torch.save(sd, f64)
    p = run_tool(b, "ckpt-compress", f64, "-o", tmp_path / "f64.ckz.h5", "--horizon", "1")
    assert p.returncode == 0, p.stderr
    bound = max(float(w.detach().abs().max()) for w in (model.q.weight, model.k.weight, model.v.weight))
    shown = [float(m) for m in re.findall(r"wd\*theta, \|theta\| <= ([0-9.e+-]+)", p.stdout)]
    assert shown and max(shown) == pytest.approx(bound, rel=1e-5), p.stdout  # not the table's 1e6
    v = run_tool(b, "ckpt-verify", tmp_path / "f64.ckz.h5", "--original", f64)
    assert v.returncode == 0, v.stdout + v.stderr
