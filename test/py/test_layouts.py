"""The layouts real training stacks write (scripts/fixtures/make_layouts.py), each round-tripped:
compress -> verify --original -> restore -> torch.load -> every non-moment leaf
bit-identical -> one real step of each optimizer (its own torch class) from the original and
the restored state, within tolerance * lr where coded."""
import copy
import os
import sys

import pytest
import torch
import torch.nn as nn

from testlib import ROOT, parse_json_stdout, require_ckptkit_bin, run_tool, torch_load_pair

sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
import make_layouts as ml  # noqa: E402

TOL = 0.01
MOMENTS = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}


def _same_leaves(a, b, path=""):
    """Every leaf except moment tensors is identical (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        if path.rsplit("/", 1)[-1] not in MOMENTS:
            assert torch.equal(a.view(torch.uint8) if a.dim() else a.reshape(1).view(torch.uint8),
                               b.view(torch.uint8) if b.dim() else b.reshape(1).view(torch.uint8)), path
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), path
        for k in a:
            _same_leaves(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same_leaves(x, y, f"{path}/{i}")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert type(a) is type(b), path
        _same_leaves(vars(a), vars(b), path + "/@")
    else:
        assert a == b or (a != a and b != b), path


def _torch_group(g):
    """A param group as torch.optim.Adam/AdamW's step reads it: lr as a float, the keys a
    DeepSpeed FusedAdam group lacks filled with torch's defaults."""
    g = dict(g)
    if isinstance(g["lr"], torch.Tensor):
        g["lr"] = float(g["lr"])
    for k, v in (("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
                 ("differentiable", False), ("fused", None)):
        g.setdefault(k, v)
    return g


def _torch_state(osd):
    """FusedAdam keeps `step` in the group; torch wants it per state entry."""
    osd = copy.deepcopy(osd)
    osd["param_groups"] = [_torch_group(g) for g in osd["param_groups"]]
    for g in osd["param_groups"]:
        step = g.pop("step", None)
        if step is not None:
            for i in g["params"]:
                osd["state"][i].setdefault("step", torch.tensor(float(step)))
    return osd


def _step(cls, thetas, osd, grads):
    params = {i: nn.Parameter(thetas[i].detach().clone()) for i in thetas}
    groups = [{"params": [params[i] for i in g["params"]]} for g in osd["param_groups"]]
    opt = cls(groups, lr=1e-3)
    opt.load_state_dict(osd)
    for i, p in params.items():
        p.grad = grads[i].clone()
    opt.step()
    return {i: params[i].detach() - thetas[i] for i in params}


def _step_close(cls, thetas, osd_a, osd_b, exact=False):
    a, b = _torch_state(osd_a), _torch_state(osd_b)
    gen = torch.Generator().manual_seed(5)
    grads = {i: 2 * torch.rand(t.shape, generator=gen) - 1 for i, t in thetas.items()}
    da, db = _step(cls, thetas, a, grads), _step(cls, thetas, b, grads)
    lr = {i: g["lr"] for g in a["param_groups"] for i in g["params"]}
    for i in thetas:
        diff = (da[i] - db[i]).abs().double()
        if exact:
            assert torch.equal(da[i], db[i]), i
        slack = 8 * torch.finfo(torch.float32).eps * (da[i].abs() + db[i].abs()).double()
        assert torch.all(diff <= TOL * lr[i] + slack + 1e-30), (i, float(diff.max()))


def _model_thetas(sd, names, prefix=""):
    return {n: sd[prefix + n] for n in names}


def _in_order(sd, prefix, osd):
    """Index ids of osd's groups -> the module's parameters in state_dict order."""
    keys = [k for k in sd if k.startswith(prefix)]
    ids = [i for g in osd["param_groups"] for i in g["params"]]
    assert len(keys) == len(ids)
    return dict(zip(ids, (sd[k] for k in keys)))


def _views(name, obj):
    """(optimizer class, theta per param id, optimizer state_dict) for every optimizer."""
    if name == "torch2.pt":
        osd = obj["optimizer"]
        th = {i: obj["model"][n] for g in osd["param_groups"] for i, n in zip(g["params"], g["param_names"])}
        return [(torch.optim.AdamW, th, osd)]
    if name == "lightning.ckpt":
        sd = obj["state_dict"]
        og, od = obj["optimizer_states"]
        return [(torch.optim.Adam, _in_order(sd, "model.gen.", og), og),
                (torch.optim.AdamW, _in_order(sd, "model.disc.", od), od)]
    if name in ("zero_fused.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        o = obj["optimizer_state_dict"]
        base = o["base_optimizer_state"]
        return [(torch.optim.AdamW, {0: o["single_partition_of_fp32_groups"][0]}, base)]
    if name == "fsdp_full.pt":
        osd = obj["optim"]
        return [(torch.optim.Adam, {n: obj["model"][n] for n in osd["state"]}, osd)]
    if name == "gan.pt":
        return [(torch.optim.Adam, _in_order(obj["G"], "", obj["opt_G"]), obj["opt_G"]),
                (torch.optim.Adam, _in_order(obj["D"], "", obj["opt_D"]), obj["opt_D"])]
    raise AssertionError(name)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    ml.register_standins()
    return ml.write_all(str(tmp_path_factory.mktemp("layouts")))


NAMES = ["torch2.pt", "lightning.ckpt", "zero_fused.pt", "fsdp_full.pt", "gan.pt",
         "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
KIND = {"fsdp_full.pt": ["--optimizer", "adam"]}  # Adam L2: theta is mapped by FQN


@pytest.mark.parametrize("name", NAMES)
def test_layout_roundtrip(layouts, tmp_path, name):
    b = require_ckptkit_bin()
    src = next(p for p in layouts if os.path.basename(p) == name)
    before = open(src, "rb").read()
    out, back = tmp_path / "c.h5", tmp_path / ("back" + os.path.splitext(name)[1])
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--json", *KIND.get(name, []))
    assert c.returncode == 0, c.stderr
    rep = parse_json_stdout(c)
    assert rep["ok"] and all(not t["note"] for t in rep["tensors"]), rep["tensors"]
    assert rep["escapes"] < 0.5 * rep["moment_values"]
    v = run_tool(b, "ckpt-verify", out, "--original", src)
    assert v.returncode == 0, v.stdout
    assert run_tool(b, "ckpt-restore", out, "-o", back).returncode == 0
    assert open(src, "rb").read() == before
    orig, rest = torch_load_pair(src, back)
    _same_leaves(orig, rest)
    for (cls, th, oa), (_, _, ob) in zip(_views(name, orig), _views(name, rest)):
        _step_close(cls, th, oa, ob)


def test_layout_names_and_detection(layouts, tmp_path):
    """Parameter names where the file gives them (param_names, FQN keys, Lightning's
    `model.` keys), DeepSpeed's flat groups by their state path and why, and FusedAdam identified
    from ds_config as AdamW."""
    b = require_ckptkit_bin()
    by = {os.path.basename(p): p for p in layouts}

    def rep(name, *flags):
        c = run_tool(b, "ckpt-compress", by[name], "-o", tmp_path / (name + ".h5"), "--json", *flags)
        assert c.returncode == 0, c.stderr
        return parse_json_stdout(c)

    assert [t["name"] for t in rep("torch2.pt")["tensors"]][:2] == ["inp.weight", "h1.weight"]
    assert [t["name"] for t in rep("fsdp_full.pt", "--optimizer", "adam")["tensors"]][:2] == ["inp.weight", "inp.bias"]
    assert rep("lightning.ckpt")["tensors"][0]["name"] == "model.gen.inp.weight"
    z = rep("zero_fused.pt")
    assert z["tensors"][0]["name"] == ("optimizer_state_dict/base_optimizer_state/state/0 "
                                       "(a DeepSpeed flat partition of many parameters)")
    assert [g["optimizer"] for g in z["param_groups"]] == ["adamw"]


def test_fused_adam_without_ds_config_is_kept_exact(layouts, tmp_path):
    b = require_ckptkit_bin()
    src = next(p for p in layouts if p.endswith("zero_fused.pt"))
    obj = torch.load(src, weights_only=False)   # DeepSpeed's classes: outside torch's allowlist
    del obj["ds_config"]
    torch.save(obj, tmp_path / "nocfg.pt")
    c = run_tool(b, "ckpt-compress", tmp_path / "nocfg.pt", "-o", tmp_path / "o.h5", "--json")
    assert c.returncode == 0
    notes = {t["note"] for t in parse_json_stdout(c)["tensors"]}
    assert notes == {"kept exact: DeepSpeed FusedAdam state without ds_config.optimizer (adam_w_mode unknown)"}


def test_transformer_with_float_buffers_needs_no_flags(tmp_path):
    """A transformer-like model with a float causal-mask buffer and int position_ids,
    trained with Adam + L2 weight decay, compresses with no flags (auto certifies the union
    of Adam's and AdamW's domains; theta from the model's same-shape tensors)."""
    b = require_ckptkit_bin()

    class Block(nn.Module):
        def __init__(self, t=8, d=16):
            super().__init__()
            self.register_buffer("mask", torch.tril(torch.ones(t, t)))
            self.register_buffer("position_ids", torch.arange(t))
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, x):
            a = (self.q(x) @ self.k(x).transpose(-1, -2)).masked_fill(self.mask == 0, -1e9).softmax(-1)
            return a @ self.v(x)

    torch.manual_seed(0)
    m = Block()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=0.01)
    for s in range(30):
        opt.zero_grad()
        (m(torch.randn(4, 8, 16)) ** 2).mean().backward()
        opt.step()
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "tf.pt")
    c = run_tool(b, "ckpt-compress", tmp_path / "tf.pt", "-o", tmp_path / "tf.h5", "--json", "--horizon", "1")
    assert c.returncode == 0, c.stderr
    rep = parse_json_stdout(c)
    assert rep["ok"] and all(not t["note"] for t in rep["tensors"])
    assert all("shifted by wd*theta" in g["domain"] for g in rep["param_groups"])
    assert run_tool(b, "ckpt-verify", tmp_path / "tf.h5", "--original", tmp_path / "tf.pt").returncode == 0


def _read_st(path):
    """The tensors of a safetensors file (scripts/torch_step_check.py's strict reader)."""
    import torch_step_check as tsc
    return tsc.read_safetensors(str(path))[0]


@pytest.mark.parametrize("stated", ["all", "beta1_beta2", "lr_only"])
def test_safetensors_flat_optimizer_metadata(tmp_path, stated):
    """safetensors with `state.<name>.exp_avg|exp_avg_sq|step` keys and `__metadata__`
    holding `optimizer`, `lr`, `betas` (or `beta1` and `beta2`), `eps`, `weight_decay` as
    separate strings (no param_groups): coded, not kept exact; what the file does not state
    comes from the flags, and a hyper-parameter stated nowhere keeps the state exact with a
    note naming the flag, and ckpt-verify passes that container (it keeps those states exact
    too). The restored moments give a real AdamW step within tolerance."""
    import make_fixtures as mf
    b = require_ckptkit_bin()
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 6))
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, betas=(0.9, 0.99), eps=1e-7, weight_decay=0.02)
    for _ in range(30):
        opt.zero_grad()
        ((net(torch.randn(16, 24)) - torch.randn(16, 6)) ** 2).mean().backward()
        opt.step()
    names = [n for n, _ in net.named_parameters()]
    tensors = {n: t for n, t in net.state_dict().items()}
    for i, n in enumerate(names):
        st = opt.state_dict()["state"][i]
        for k in ("exp_avg", "exp_avg_sq", "step"):
            tensors[f"state.{n}.{k}"] = st[k].reshape(()) if k == "step" else st[k]
    meta = {"optimizer": "adamw", "lr": "0.002"}
    if stated == "all":
        meta.update(betas="(0.9, 0.99)", eps="1e-07", weight_decay="0.02")
    elif stated == "beta1_beta2":
        meta.update(beta1="0.9", beta2="0.99", eps="1e-07", weight_decay="0.02")
    src = tmp_path / "flat.safetensors"
    mf.write_safetensors(str(src), tensors, meta)
    out = tmp_path / "flat.ckz.h5"
    r = run_tool(b, "ckpt-compress", src, "-o", out, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = parse_json_stdout(r)["tensors"]
    if stated == "lr_only":  # betas, eps, weight_decay stated nowhere: exact, the note names the flag
        assert all(t["note"].startswith("kept exact: __metadata__ states no beta1 (pass --beta1)") for t in rows), rows
        v = run_tool(b, "ckpt-verify", out, "--original", src)
        assert v.returncode == 0, v.stdout + v.stderr
        r = run_tool(b, "ckpt-compress", src, "-o", out, "--force", "--json", "--beta1", "0.9", "--beta2", "0.99",
                     "--eps", "1e-7", "--weight-decay", "0.02")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = parse_json_stdout(r)["tensors"]
    assert sorted(t["name"] for t in rows) == sorted(names) and all(t["note"] == "" for t in rows), rows
    bad = run_tool(b, "ckpt-compress", src, "-o", tmp_path / "x.h5", "--lr", "0.5")
    assert bad.returncode == 2 and "contradicts the file's lr" in bad.stderr
    assert run_tool(b, "ckpt-verify", out, "--original", src).returncode == 0
    if stated == "all":   # betas and a beta1 that disagrees: refused, naming both
        two = tmp_path / "two.safetensors"
        mf.write_safetensors(str(two), tensors, dict(meta, beta1="0.8"))
        bad = run_tool(b, "ckpt-compress", two, "-o", tmp_path / "y.h5")
        assert bad.returncode == 2 and f"{two}: __metadata__ 'betas' (0.9, 0.99) and 'beta1' 0.8 differ" in bad.stderr, bad.stderr
    back = tmp_path / "back.safetensors"
    assert run_tool(b, "ckpt-restore", out, "-o", back).returncode == 0
    a, c = _read_st(src), _read_st(back)
    osd = {"state": {}, "param_groups": [dict(opt.state_dict()["param_groups"][0])]}
    osd_b = copy.deepcopy(osd)
    for i, n in enumerate(names):
        osd["state"][i] = {k: a[f"state.{n}.{k}"] for k in ("exp_avg", "exp_avg_sq", "step")}
        osd_b["state"][i] = {k: c[f"state.{n}.{k}"] for k in ("exp_avg", "exp_avg_sq", "step")}
        assert torch.equal(a[n], c[n]) and torch.equal(a[f"state.{n}.step"], c[f"state.{n}.step"])
    _step_close(torch.optim.AdamW, {i: a[n] for i, n in enumerate(names)}, osd, osd_b)


def test_number_step_is_certified_as_torch_loads_it(tmp_path):
    """issue 52: a Python-int `step` (torch < 1.12 and bitsandbytes-style state dicts) becomes
    a float32 tensor when torch's Adam / AdamW load it (__setstate__: 16777217 becomes
    16777216) and counts on in float32: the certificate is for that count (step 16777216,
    step_dtype F32 in the manifest and the report), and a real Adam step from the restored
    file (which still holds the int) agrees with the original's within tolerance."""
    import make_bad_containers as mbc  # scripts/fixtures/: reads the manifest without our plugin
    import h5py
    b = require_ckptkit_bin()
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.9, 0.999))
    for _ in range(5):
        opt.zero_grad()
        (m(torch.randn(8, 16)) ** 2).mean().backward()
        opt.step()
    osd = opt.state_dict()
    for st in osd["state"].values():
        st["step"] = 16777217
    src, ckz, back = tmp_path / "int_step.pt", tmp_path / "int_step.ckz.h5", tmp_path / "back.pt"
    torch.save({"model": m.state_dict(), "optimizer": osd}, src)
    c = run_tool(b, "ckpt-compress", src, "-o", ckz, "--json")
    assert c.returncode == 0, c.stderr
    rep = parse_json_stdout(c)
    assert rep["ok"] and all(not t["note"] for t in rep["tensors"]) and len(rep["tensors"]) == 4
    assert {g["step"] for g in rep["param_groups"]} == {16777216.0}
    with h5py.File(ckz, "r") as f:
        man = mbc.get_manifest(f)
    assert {(p["hyper"]["step"], p["hyper"]["step_dtype"]) for p in man["params"]} == {(16777216.0, "F32")}
    v = run_tool(b, "ckpt-verify", ckz, "--original", src)
    assert v.returncode == 0, v.stdout + v.stderr
    assert run_tool(b, "ckpt-restore", ckz, "-o", back).returncode == 0
    a, r = torch_load_pair(src, back)
    assert {st["step"] for st in r["optimizer"]["state"].values()} == {16777217}  # the file's own value, kept
    names = [k for k in a["model"]]
    thetas = dict(zip(range(len(names)), (a["model"][n] for n in names)))
    _step_close(torch.optim.Adam, thetas, a["optimizer"], r["optimizer"])


def test_channels_last_moments_kept_exact_naming_why(tmp_path):
    """A conv trained in channels_last has moments in that memory format (whole storages, other
    element order): kept exact, the note says so (not "a view"), and restored bit for bit in
    that memory format; the contiguous biases are coded."""
    b = require_ckptkit_bin()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last)).square().mean().backward()
        opt.step()
    assert not opt.state[net[0].weight]["exp_avg"].is_contiguous()
    src = tmp_path / "cl.pt"
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, src)
    r = run_tool(b, "ckpt-compress", src, "-o", tmp_path / "cl.ckz.h5", "--json")
    assert r.returncode == 0, r.stderr
    notes = {t["name"]: t["note"] for t in parse_json_stdout(r)["tensors"]}
    assert notes["0.weight"] == "kept exact: exp_avg is not contiguous (a memory format such as channels_last)", notes
    assert notes["0.bias"] == "", notes
    assert run_tool(b, "ckpt-restore", tmp_path / "cl.ckz.h5", "-o", tmp_path / "back.pt").returncode == 0
    a, c = torch.load(src)["optimizer"]["state"], torch.load(tmp_path / "back.pt")["optimizer"]["state"]
    for i in (0, 2):   # the conv weights
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(a[i][k], c[i][k]) and c[i][k].stride() == a[i][k].stride()
    assert not torch.equal(a[1]["exp_avg"], c[1]["exp_avg"])   # a bias: coded
