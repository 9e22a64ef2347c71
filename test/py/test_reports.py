"""What the reports say (issue "CLI behaviour"): parameter names, one byte accounting for
compress / verify / restore, the certified param groups, the escape warning, verify's
labels. Real fixtures from data/ and real torch files."""
import copy
import json
import sys
import os

import pytest
import torch

from testlib import fixture_path, parse_json_stdout, require_ckptkit_bin, run_tool

TENSOR_KEYS = {"name", "shape", "values", "escapes", "moment_bytes_fp32", "moment_bytes_out",
               "moment_reduction", "max_bound_lr", "note", "ulp_regime"}


def _three(tmp_path, src, *flags):
    b = require_ckptkit_bin()
    out = tmp_path / "c.ckz.h5"
    c = run_tool(b, "ckpt-compress", src, "-o", out, "--json", *flags)
    assert c.returncode == 0, c.stderr
    v = run_tool(b, "ckpt-verify", out, "--json", "--original", src)
    assert v.returncode == 0, v.stdout
    r = run_tool(b, "ckpt-restore", out, "-o", tmp_path / ("r" + os.path.splitext(str(src))[1]), "--json")
    assert r.returncode == 0, r.stderr
    return parse_json_stdout(c), parse_json_stdout(v), parse_json_stdout(r)


def test_tensors_named_by_parameter_and_one_accounting(tmp_path):
    c, v, r = _three(tmp_path, fixture_path("lm_adamw.pt"))
    names = [t["name"] for t in c["tensors"]]
    assert names[:3] == ["tok.weight", "pos.weight", "blocks.0.ln1.weight"]
    assert not any(n.startswith("optimizer/state/") for n in names)
    for t in c["tensors"]:
        assert set(t) == TENSOR_KEYS
        assert t["moment_bytes_fp32"] == 4 * t["values"]
        assert abs(t["moment_reduction"] - (1 - t["moment_bytes_out"] / t["moment_bytes_fp32"])) < 1e-12
    assert c["tensors"][0]["shape"] == [128, 64]  # tok.weight: vocabulary x width
    strip = lambda rep: [(t["name"], t["values"], t["escapes"], t["moment_bytes_out"]) for t in rep["tensors"]]  # noqa: E731
    assert strip(c) == strip(v) == strip(r)
    assert sum(t["moment_bytes_out"] for t in c["tensors"]) - c["moment_bytes_out"] in range(-len(names), len(names) + 1)


def test_certified_param_groups_are_reported(tmp_path):
    c, v, _ = _three(tmp_path, fixture_path("cnn_adamw.pt"), "--optimizer", "adamw")
    groups = c["param_groups"]
    assert groups == v["param_groups"]
    assert sum(g["tensors"] for g in groups) == len(c["tensors"])
    for g in groups:
        assert set(g) == {"optimizer", "domain", "lr", "betas", "eps", "weight_decay", "step", "amsgrad",
                          "maximize", "tensors"}
        assert g["domain"] == "every update, any gradient sequence" and g["step"] == 200  # --horizon all
    b = require_ckptkit_bin()
    t = run_tool(b, "ckpt-compress", fixture_path("cnn_adamw.pt"), "-o", tmp_path / "t.h5", "--optimizer", "adamw",
                 "--horizon", "1")
    assert any(line.startswith("certified: ") and "adamw: |g| <= 1, lr=" in line for line in t.stdout.splitlines())


def test_verify_names_the_original_as_original(tmp_path):
    b = require_ckptkit_bin()
    src = fixture_path("cnn_adamw.pt")
    assert run_tool(b, "ckpt-compress", src, "-o", tmp_path / "c.h5").returncode == 0
    v = run_tool(b, "ckpt-verify", tmp_path / "c.h5", "--original", src)
    assert v.stdout.splitlines()[0].startswith(f"ckpt-verify: {tmp_path / 'c.h5'} (original: {src})  codec=vlog")
    j = parse_json_stdout(run_tool(b, "ckpt-verify", tmp_path / "c.h5", "--json"))
    assert j["original"] is None and "output" not in j


def test_many_escapes_warn_with_a_sampled_suggestion(tmp_path):
    """An early-training state (consistent gradients, |m|/sqrt(v) ~ 1) escapes > 5% under
    log8 at the default tolerance: one warning line on stderr with sampled rates for larger
    tolerances and for bf16. The default vlog steps follow the guard and escape < 0.5%."""
    b = require_ckptkit_bin()
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    for _ in range(60):
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "e.pt")
    c = run_tool(b, "ckpt-compress", tmp_path / "e.pt", "-o", tmp_path / "e.h5", "--json", "--codec", "log8")
    assert c.returncode == 0
    rep = parse_json_stdout(c)
    assert rep["escapes"] > 0.05 * rep["moment_values"]
    d = run_tool(b, "ckpt-compress", tmp_path / "e.pt", "-o", tmp_path / "d.h5", "--json")
    assert d.returncode == 0 and "escaped" not in d.stderr
    assert parse_json_stdout(d)["escapes"] < 0.005 * rep["moment_values"]
    warn = [line for line in c.stderr.splitlines() if "of the moment values escaped (more than 5%" in line]
    assert len(warn) == 1
    assert warn[0].startswith(f"ckpt-compress: warning: {tmp_path / 'e.pt'}: ")
    assert "; on a sample: --tolerance 0.02 escapes " in warn[0] and "--codec bf16 escapes " in warn[0]
    causes = parse_json_stdout(c)["escape_causes"]
    assert (f"by cause: {causes['no_code']} no code (a value the block's codes cannot represent), "
            f"{causes['certificate']} certificate (coded, but the guard could not prove") in warn[0]
    # the package names its own keyword arguments, not the CLI's flags
    import ckptkit
    with pytest.warns(ckptkit.CkptkitWarning) as got:
        ckptkit.compress(tmp_path / "e.pt", tmp_path / "p.h5", codec="log8")
    pw = [str(w.message) for w in got if "of the moment values escaped" in str(w.message)]
    assert len(pw) == 1 and "tolerance=0.02 escapes " in pw[0] and "codec='bf16' escapes " in pw[0], pw
    assert "--tolerance" not in pw[0] and "--codec" not in pw[0]


def test_nanogpt_tied_weights_and_mask_buffers_are_named(tmp_path):
    """A nanoGPT-style model (transformer.wte.weight = lm_head.weight, a causal-mask buffer
    `attn.bias` per block) saved by torch 1.13 without param_names: every report row is named
    by its parameter, the tied one once, as model.parameters() lists it."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, d=32, t=16):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = nn.Module()
            self.attn.c_attn = nn.Linear(d, 3 * d)
            self.attn.c_proj = nn.Linear(d, d)
            self.attn.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))
            self.mlp = nn.Linear(d, d)

        def forward(self, x):
            q, k, v = self.attn.c_attn(self.ln_1(x)).chunk(3, -1)
            t = x.shape[1]
            a = (q @ k.transpose(-1, -2)).masked_fill(self.attn.bias[0, 0, :t, :t] == 0, float("-inf")).softmax(-1)
            return x + self.mlp(self.attn.c_proj(a @ v))

    class GPT(nn.Module):
        def __init__(self, vocab=64, d=32, t=16, n=2):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab, d), wpe=nn.Embedding(t, d),
                                                  h=nn.ModuleList([Block(d, t) for _ in range(n)]), ln_f=nn.LayerNorm(d)))
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT

        def forward(self, idx):
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
            for blk in self.transformer.h:
                x = blk(x)
            return self.lm_head(self.transformer.ln_f(x))

    torch.manual_seed(0)
    m = GPT()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
    for _ in range(5):
        opt.zero_grad()
        idx = torch.randint(0, 64, (4, 16))
        torch.nn.functional.cross_entropy(m(idx).flatten(0, 1), idx.flatten()).backward()
        opt.step()
    src = tmp_path / "gpt.pt"
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, src)
    c, v, _ = _three(tmp_path, src)
    names = [t["name"] for t in c["tensors"]]
    assert names == [n for n, _ in m.named_parameters()], names
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    assert [t["name"] for t in v["tensors"]] == names


class _Net(torch.nn.Module):
    """Four same-shape layers and a root float buffer of that shape (saved first in the
    state_dict, before every parameter): the shape alone cannot tell buffer from parameter."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(16, 16))
        self.emb = torch.nn.Embedding(50, 16)
        self.l1 = torch.nn.Linear(16, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.l2 = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, x):
        return self.head(self.l2(self.ln(self.l1(self.emb(x)) @ self.mask)))


def _trained(opt_of, net=None, steps=3):
    """A seeded _Net (or `net`) and its optimizer opt_of(net) after `steps` real steps."""
    torch.manual_seed(0)
    net = net or _Net()
    opt = opt_of(net)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randint(0, 50, (4, 8))
        torch.nn.functional.cross_entropy(net(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
    return net, opt


def _names(tmp_path, obj, name):
    """torch.save(obj); the row names of ckpt-compress --json, equal to ckpt-verify --json's
    and ckpt-restore --json's."""
    (tmp_path / name).mkdir()
    src = tmp_path / name / name
    torch.save(obj, src)
    c, v, r = _three(tmp_path / name, src)
    names = [t["name"] for t in c["tensors"]]
    assert [t["name"] for t in v["tensors"]] == [t["name"] for t in r["tensors"]] == names
    return names


def test_names_by_parameter_order_past_same_shape_buffers_and_frozen_parameters(tmp_path):
    """Issue 55 item 8: an optimizer state_dict saved next to its model's state_dict (no
    param_names: torch 1.x, or an optimizer built from model.parameters()) is named by
    parameter order, as Optimizer.state_dict numbers them, even where a float buffer has a
    parameter's shape or a parameter is frozen, as long as one order fits; two param groups
    (decay / no decay, as HF Trainer builds them) interleave."""
    params = [n for n, _ in _Net().named_parameters()]
    net, opt = _trained(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3))
    assert _names(tmp_path, {"model": net.state_dict(), "optimizer": opt.state_dict()}, "one.pt") == params
    decay = lambda n: n.endswith("weight") and not n.startswith("ln")  # noqa: E731
    net, opt = _trained(lambda m: torch.optim.AdamW(
        [{"params": [p for n, p in m.named_parameters() if decay(n)], "weight_decay": 0.1},
         {"params": [p for n, p in m.named_parameters() if not decay(n)], "weight_decay": 0.0}], lr=1e-3))
    assert _names(tmp_path, {"model_state_dict": net.state_dict(), "optimizer_state_dict": opt.state_dict()},
                  "two.pt") == [n for n in params if decay(n)] + [n for n in params if not decay(n)]
    frozen = _Net()
    frozen.emb.weight.requires_grad_(False)
    del frozen.mask   # no buffer of a parameter's shape: the frozen embedding is skipped
    frozen.register_buffer("mask", torch.ones(16, 16), persistent=False)
    net, opt = _trained(lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-3), frozen)
    assert _names(tmp_path, {"model": net.state_dict(), "optimizer": opt.state_dict()}, "frozen.pt") == params[1:]


def test_names_with_an_ema_copy_and_two_models(tmp_path):
    """Several module state_dicts in one file: a model and its EMA copy (same keys) name the
    rows; a GAN's two models and two optimizers: each optimizer by the one model it fits."""
    net, opt = _trained(lambda m: torch.optim.Adam(m.parameters(), lr=1e-3))
    ema = {k: v.clone() for k, v in net.state_dict().items()}
    params = [n for n, _ in net.named_parameters()]
    assert _names(tmp_path, {"model": net.state_dict(), "ema": ema, "optimizer": opt.state_dict()}, "ema.pt") == params
    torch.manual_seed(1)
    disc = torch.nn.Sequential(torch.nn.Linear(50, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Linear(16, 1))
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    for _ in range(2):
        opt_d.zero_grad()
        disc(torch.randn(4, 50)).pow(2).mean().backward()
        opt_d.step()
    gan = {"G": net.state_dict(), "D": disc.state_dict(), "opt_G": opt.state_dict(), "opt_D": opt_d.state_dict()}
    assert _names(tmp_path, gan, "gan.pt") == params + [n for n, _ in disc.named_parameters()]


def test_unnamed_rows_say_why(tmp_path):
    """Where no name can be known the row is the state's path and why: an optimizer
    state_dict alone (HF Trainer's optimizer.pt), and a frozen parameter next to a buffer of a
    parameter's shape (two orders fit: the buffer could be l1.weight)."""
    net, opt = _trained(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3))
    assert _names(tmp_path, opt.state_dict(), "alone.pt") == \
        [f"state/{i} (no parameter names in the file)" for i in range(9)]
    frozen = _Net()
    frozen.emb.weight.requires_grad_(False)
    net, opt = _trained(lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-3), frozen)
    names = _names(tmp_path, {"model": net.state_dict(), "optimizer": opt.state_dict()}, "ambiguous.pt")
    assert names == [f"optimizer/state/{i} (same-shape tensors fit the param groups in more than one way)"
                     for i in range(7)] + ["head.bias"]   # the only [50] tensor: named by its shape


def test_names_of_a_model_pickled_whole(tmp_path):
    """torch.save({"model": model, ...}) pickles the nn.Module itself: its parameter tree
    (own parameters, then each child's, as model.parameters() lists them) names the rows, a
    frozen parameter skipped, where its state_dict next to a buffer of a parameter's shape
    would fit two ways (test_unnamed_rows_say_why)."""
    frozen = _Net()
    frozen.emb.weight.requires_grad_(False)
    net, opt = _trained(lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-3), frozen)
    assert _names(tmp_path, {"model": net, "optimizer": opt.state_dict()}, "whole.pt") == \
        ["l1.weight", "l1.bias", "ln.weight", "ln.bias", "l2.weight", "l2.bias", "head.weight", "head.bias"]


def test_safetensors_without_param_names_say_why(tmp_path):
    """A safetensors optimizer file (state.<i>.<field> tensors, param_groups in __metadata__)
    without param_names: its keys are stored sorted, so there is no parameter order to name
    by; every row says so, except the one state whose shape only one model tensor has."""
    save_file = pytest.importorskip("safetensors.torch").save_file   # the .venv line has it, Debian's not
    net, opt = _trained(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3))
    osd = opt.state_dict()
    tensors = {f"model.{k}": v.contiguous() for k, v in net.state_dict().items()}
    for i, st in osd["state"].items():
        for k, v in st.items():
            tensors[f"state.{i}.{k}"] = v.reshape(1) if v.dim() == 0 else v
    src = tmp_path / "opt.safetensors"
    save_file(tensors, str(src), metadata={"optimizer": "adamw", "param_groups": json.dumps(osd["param_groups"])})
    c, v, _ = _three(tmp_path, src)
    names = [t["name"] for t in c["tensors"]]
    assert names == [f"state.{i} (no param_names in __metadata__)" for i in range(8)] + ["model.head.bias"]
    assert [t["name"] for t in v["tensors"]] == names


def test_real_lightning_checkpoint_rows_named(tmp_path, real_frameworks):
    """Lightning's own Trainer.save_checkpoint (the .venv line has lightning): state_dict keys
    prefixed by the module attribute, BatchNorm statistics and a float buffer with a bias's
    shape between the parameters; the optimizer over self.parameters() (no param_names): every
    row is named by its parameter."""
    L = pytest.importorskip("lightning")
    import warnings
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.bn, self.h, self.out = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 16), nn.Linear(16, 1)
            self.register_buffer("scale", torch.ones(16))

        def forward(self, x):
            return self.out(torch.relu(self.h(self.bn(self.inp(x)) * self.scale)))

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Net()

        def training_step(self, batch, i):
            return nn.functional.mse_loss(self.model(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    module = Module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, data)
    (tmp_path / "l").mkdir()
    trainer.save_checkpoint(tmp_path / "l" / "last.ckpt")
    c, v, _ = _three(tmp_path / "l", tmp_path / "l" / "last.ckpt")
    names = [t["name"] for t in c["tensors"]]
    assert names == [f"model.{n}" for n, _ in module.model.named_parameters()]
    assert [t["name"] for t in v["tensors"]] == names
