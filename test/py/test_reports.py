"""What the reports say (issue "CLI behaviour"): parameter names, one byte accounting for
compress / verify / restore, the certified param groups, the escape warning, verify's
labels. Real fixtures from data/ and real torch files."""
import copy
import sys
import os

import torch

from testlib import fixture_path, parse_json_stdout, require_ckptkit_bin, run_tool

TENSOR_KEYS = {"name", "shape", "values", "escapes", "moment_bytes_fp32", "moment_bytes_out",
               "moment_reduction", "max_bound_lr", "note"}


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
    warn = [line for line in c.stderr.splitlines() if "of the moment values escaped (more than 5%)" in line]
    assert len(warn) == 1
    assert warn[0].startswith(f"ckpt-compress: warning: {tmp_path / 'e.pt'}: ")
    assert "; on a sample: --tolerance 0.02 escapes " in warn[0] and "--codec bf16 escapes " in warn[0]


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
