"""Low precision. Moments stored as bfloat16 / float16 next to float32 parameters (torch
casts loaded moments to the parameter's dtype, so the step runs in float32): compressed,
verified against the original, restored; moments stay in their dtype, every other byte is
identical, and the first update computed in float64 from the restored state is within
tolerance x lr of the original's. A bfloat16 *parameter* (torch steps it in bfloat16, its
update rounds to a bfloat16 ulp of the parameter) is kept exact with one note, and so are
low-precision moments with no parameter in the file (torch creates moments in the
parameter's dtype)."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from testlib import require_ckptkit_bin, run_tool, torch_load_pair  # noqa: E402

TOL = 0.01


def _update(m, v, g, group, step):
    """First restored Adam update in lr units, float64 (torch 1.13 _single_tensor_adam)."""
    b1, b2 = group["betas"]
    t = step + 1
    m2 = b1 * m + (1 - b1) * g
    v2 = b2 * v + (1 - b2) * g * g
    return m2 / (1 - b1 ** t) / ((v2 / (1 - b2 ** t)).sqrt() + group["eps"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_moments(tmp_path, dtype):
    """Real training in low precision; bound checked on a gradient grid in [-1, 1]."""
    bin_dir = require_ckptkit_bin()
    torch.manual_seed(0)
    work = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    # CPU torch 1.13 has no half addcmul: float16 state is trained in float32 and cast, as a
    # GPU float16 run would store it; bfloat16 runs the real low-precision optimizer.
    run_dtype = dtype if dtype == torch.bfloat16 else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(run_dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4)
    x, y = torch.randn(256, 32), torch.randn(256, 8)
    for _ in range(50):  # CPU torch 1.13 has no half matmul: fp32 forward, low-precision state
        with torch.no_grad():
            for w, p in zip(work.parameters(), model.parameters()):
                w.copy_(p.float())
        work.zero_grad()
        torch.nn.functional.mse_loss(work(x), y).backward()
        for w, p in zip(work.parameters(), model.parameters()):
            p.grad = w.grad.to(run_dtype)
        opt.step()
    model.float()  # the parameters torch will step: float32
    for st in opt.state.values():
        for k in ("exp_avg", "exp_avg_sq"):
            st[k] = st[k].to(dtype)
    src = tmp_path / "lp.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, src)
    ckz, out = tmp_path / "lp.ckz.h5", tmp_path / "restored.pt"
    r = run_tool(bin_dir, "ckpt-compress", src, "-o", ckz, "--tolerance", TOL, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)  # every state coded (float32 parameters), none kept exact
    assert rep["tensors"] and all(t["note"] == "" for t in rep["tensors"]), rep["tensors"]
    v = run_tool(bin_dir, "ckpt-verify", ckz, "--original", src)
    assert v.returncode == 0, v.stdout + v.stderr
    assert run_tool(bin_dir, "ckpt-restore", ckz, "-o", out).returncode == 0
    a, b = torch.load(src), torch.load(out)
    for k, t in a["model"].items():
        assert torch.equal(t, b["model"][k]) and t.dtype == b["model"][k].dtype
    group = a["optimizer"]["param_groups"][0]
    grid = torch.cat([torch.zeros(1), torch.logspace(-6, 0, 61), -torch.logspace(-6, 0, 61)]).double()
    worst = 0.0
    for idx, st in a["optimizer"]["state"].items():
        rt = b["optimizer"]["state"][idx]
        assert rt["exp_avg"].dtype == dtype and rt["exp_avg_sq"].dtype == dtype
        assert torch.equal(st["step"], rt["step"])
        m0, v0 = st["exp_avg"].double().flatten(), st["exp_avg_sq"].double().flatten()
        m1, v1 = rt["exp_avg"].double().flatten(), rt["exp_avg_sq"].double().flatten()
        step = float(st["step"])
        for g in grid:
            d = (_update(m0, v0, g, group, step) - _update(m1, v1, g, group, step)).abs().max().item()
            worst = max(worst, d)
    assert worst <= TOL * (1 + 1e-6), worst


def _bf16_run(steps=20):
    """A real Adam run on bfloat16 parameters (CPU torch 1.13 steps bfloat16 in bfloat16)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 16).to(torch.bfloat16), torch.randn(64, 4).to(torch.bfloat16)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x).float(), y.float()).backward()
        opt.step()
    return model, opt


def test_bf16_parameters_kept_exact(tmp_path):
    """bfloat16 parameters: one real step rounds each update to a bfloat16 ulp of the
    parameter, so no certificate in lr units holds: kept exact with one note, and a real
    step from the restored state equals the original's bit for bit."""
    bin_dir = require_ckptkit_bin()
    model, opt = _bf16_run()
    assert next(iter(opt.state.values()))["exp_avg"].dtype == torch.bfloat16
    for what, obj in (("model", {"model": model.state_dict(), "optimizer": opt.state_dict()}),
                      ("optimizer-only", {"optimizer": opt.state_dict()})):
        src = tmp_path / f"bf16_{what}.pt"
        torch.save(obj, src)
        ckz, out = tmp_path / f"bf16_{what}.ckz.h5", tmp_path / f"bf16_{what}.restored.pt"
        r = run_tool(bin_dir, "ckpt-compress", src, "-o", ckz, "--json")
        if r.returncode == 2:  # nothing to code at all: the tool says so
            assert "no Adam" in r.stdout + r.stderr or "nothing" in r.stdout + r.stderr, r.stdout + r.stderr
            continue
        assert r.returncode == 0, r.stdout + r.stderr
        assert "kept exact: bfloat16 parameter" in r.stdout + r.stderr, r.stdout + r.stderr
        assert run_tool(bin_dir, "ckpt-verify", ckz, "--original", src).returncode == 0
        assert run_tool(bin_dir, "ckpt-restore", ckz, "-o", out).returncode == 0
        a, b = torch.load(src), torch.load(out)
        for i, st in a["optimizer"]["state"].items():
            for k in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(st[k], b["optimizer"]["state"][i][k]) and st[k].dtype == b["optimizer"]["state"][i][k].dtype
        if what == "model":  # one real bfloat16 step from each: identical
            thetas = []
            for sd in (a, b):
                m2, o2 = _bf16_run(0)
                m2.load_state_dict(sd["model"])
                o2.load_state_dict(sd["optimizer"])
                for p in m2.parameters():
                    p.grad = torch.full_like(p, 0.5)
                o2.step()
                thetas.append([p.detach().clone() for p in m2.parameters()])
            assert all(torch.equal(u, w) for u, w in zip(*thetas))


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "BF16"), (torch.float16, "F16"), (torch.float32, "F32")])
def test_step_dtype_is_recorded(tmp_path, dtype, name):
    """torch adds 1 to the step in the step tensor's own dtype (a bfloat16 step of 256 stays
    256: torch 1.13 `step_t += 1`), so the certificate's bias corrections use that count:
    the container records the step dtype, verify re-derives it from the source and checks
    the certificates, and a real step from the restored file keeps the step where torch does."""
    import h5py
    from testlib import torch_step_check  # noqa: F401 (puts scripts/ and scripts/fixtures/ on the path)
    import make_bad_containers as mbc
    bin_dir = require_ckptkit_bin()
    torch.manual_seed(2)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 16)).square().mean().backward()
        opt.step()
    for st in opt.state.values():
        st["step"] = torch.tensor(256.0, dtype=dtype)
    src = tmp_path / "s.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, src)
    ckz, out = tmp_path / "s.ckz.h5", tmp_path / "r.pt"
    assert run_tool(bin_dir, "ckpt-compress", src, "-o", ckz).returncode == 0
    with h5py.File(ckz, "r") as f:
        hyper = [p["hyper"] for p in mbc.get_manifest(f)["params"]]
    assert {h["step_dtype"] for h in hyper} == {name} and {h["step"] for h in hyper} == {256.0}
    v = run_tool(bin_dir, "ckpt-verify", ckz, "--original", src)
    assert v.returncode == 0, v.stdout + v.stderr
    assert run_tool(bin_dir, "ckpt-restore", ckz, "-o", out).returncode == 0
    m2 = torch.nn.Linear(16, 8)
    o2 = torch.optim.Adam(m2.parameters(), lr=1e-3)
    sd = torch.load(out)
    m2.load_state_dict(sd["model"])
    o2.load_state_dict(sd["optimizer"])
    for p in m2.parameters():
        p.grad = torch.ones_like(p)
    o2.step()
    steps = {float(s["step"]) for s in o2.state.values()}
    assert steps == ({256.0} if dtype == torch.bfloat16 else {257.0})  # BF16: 256 + 1 rounds back to 256


def test_ultralytics_half_ema_copy(tmp_path):
    """An ultralytics-style last.pt: the model pickled as a float16 copy (`ema.half()`), the
    AdamW state of the float32 parameters that were trained (three groups: biases, weights
    with decay, BatchNorm). torch creates moments as zeros_like(param) and casts loaded ones
    to the parameter's dtype, so float32 moments prove a float32 parameter: the states that no
    name maps to a float16 tensor are coded, verified and within tolerance on a gradient grid
    (ultralytics resumes from ema.float())."""
    import copy
    bin_dir = require_ckptkit_bin()
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                          nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
                          nn.Conv2d(16, 6, 1))
    groups = [[], [], []]
    for mod in model.modules():
        for pn, p in mod.named_parameters(recurse=False):
            groups[2 if pn == "bias" else 1 if isinstance(mod, nn.BatchNorm2d) else 0].append(p)
    opt = torch.optim.AdamW(groups[2], lr=0.002, betas=(0.937, 0.999), weight_decay=0.0)
    opt.add_param_group({"params": groups[0], "weight_decay": 0.0005})
    opt.add_param_group({"params": groups[1], "weight_decay": 0.0})
    for _ in range(30):
        opt.zero_grad()
        model(torch.randn(8, 3, 16, 16)).pow(2).mean().backward()
        opt.step()
    src = tmp_path / "last.pt"
    torch.save({"epoch": 3, "best_fitness": 0.1, "model": None, "ema": copy.deepcopy(model).half(),
                "updates": 30, "optimizer": opt.state_dict(), "train_args": {"lr0": 0.002}}, src)
    ckz, out = tmp_path / "last.ckz.h5", tmp_path / "restored.pt"
    r = run_tool(bin_dir, "ckpt-compress", src, "-o", ckz, "--tolerance", TOL, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    coded = [t for t in rep["tensors"] if t["note"] == ""]
    kept = [t for t in rep["tensors"] if t["note"]]
    assert len(coded) >= len(rep["tensors"]) // 2, rep["tensors"]
    assert all("float16 parameter" in t["note"] for t in kept), kept   # only where a name maps one
    v = run_tool(bin_dir, "ckpt-verify", ckz, "--original", src)
    assert v.returncode == 0, v.stdout + v.stderr
    assert run_tool(bin_dir, "ckpt-restore", ckz, "-o", out).returncode == 0
    a, b = torch_load_pair(src, out)
    grid = torch.cat([torch.zeros(1), torch.logspace(-6, 0, 61), -torch.logspace(-6, 0, 61)]).double()
    worst, changed = 0.0, 0
    for gi, group in enumerate(a["optimizer"]["param_groups"]):
        for idx in group["params"]:
            st, rt = a["optimizer"]["state"][idx], b["optimizer"]["state"][idx]
            m0, v0 = st["exp_avg"].double().flatten(), st["exp_avg_sq"].double().flatten()
            m1, v1 = rt["exp_avg"].double().flatten(), rt["exp_avg_sq"].double().flatten()
            changed += int(not torch.equal(m0, m1))
            for g in grid:
                d = (_update(m0, v0, g, group, float(st["step"])) - _update(m1, v1, g, group, float(st["step"])))
                worst = max(worst, d.abs().max().item())
    assert changed == len(coded)          # the coded states are lossy, the kept ones exact
    assert worst <= TOL * (1 + 1e-6), worst
