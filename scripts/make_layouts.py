#!/usr/bin/python3
"""Checkpoints in the layouts real training stacks write, made with real torch 1.13 objects.

Usage: /usr/bin/python3 scripts/make_layouts.py OUT_DIR     (writes every layout below)
Imported by test/py/test_layouts.py, which round-trips each one through ckptkit.

Every optimizer state here is made by a real torch optimizer (torch.optim.Adam / AdamW)
taking real steps on a real model; the surrounding structure follows the writers' source:
- torch2.pt      torch 2.x param_groups (torch/optim/adamw.py, optimizer.py): `param_names`,
                 `decoupled_weight_decay`, `fused`, `capturable`, `differentiable`, and a 0-d
                 tensor `lr` (capturable / compiled optimizers). Pickled by torch 1.13.
- lightning.ckpt Lightning's `_CheckpointConnector.dump_checkpoint`
                 (src/lightning/pytorch/trainer/connectors/checkpoint_connector.py):
                 epoch, global_step, pytorch-lightning_version, state_dict (keys prefixed by
                 the LightningModule attribute, here `model.`), loops, callbacks,
                 optimizer_states (a LIST: two optimizers, GAN-style), lr_schedulers,
                 hparams_name, hyper_parameters (an `AttributeDict`, pickled under its real
                 module name `lightning.fabric.utilities.data`).
- zero_pp_rank_R_mp_rank_00_optim_states.pt  DeepSpeed ZeRO-2
                 (deepspeed/runtime/zero/stage_1_and_2.py `state_dict`, engine.py
                 `_save_zero_checkpoint`): optimizer_state_dict {loss_scaler (a
                 `deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler`), dynamic_loss_scale,
                 overflow, clip_grad, base_optimizer_state (the torch optimizer over this
                 rank's flat fp32 partition), single_partition_of_fp32_groups, zero_stage (a
                 `ZeroStageEnum`), group_paddings, partition_count, ds_version,
                 param_slice_mappings}, ds_config, ds_version. Two ranks; the partitions are
                 real slices of the flattened model, trained by a real torch.optim.AdamW.
- zero_fused.pt  the same shard with DeepSpeed FusedAdam's param_groups (lr, bias_correction,
                 betas, eps, weight_decay, step in the group; state without step) and
                 ds_config optimizer type AdamW (deepspeed/ops/adam/fused_adam.py).
- fsdp_full.pt   an FSDP full optimizer state dict: state and params keyed by parameter FQN
                 (torch/distributed/fsdp/_optim_utils.py).
- gan.pt         two models and two optimizers in one dict.
Faithfulness: the objects' classes and key names are the writers' own; the stand-in classes
(AttributeDict, DynamicLossScaler, ZeroStageEnum, fragment_address) are empty Python classes
registered under the real module paths, so the pickle's GLOBAL names are the real ones but
their attributes are only those listed here. torch.load needs `register_standins()` first.
"""
import collections
import enum
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_folders import _module  # noqa: E402  (modules registered under their real names)

SEED = 7


def _standin(module, name, base=object, **attrs):
    cls = type(name, (base,), attrs)
    cls.__module__ = module
    cls.__qualname__ = name
    setattr(_module(module), name, cls)
    return cls


def register_standins():
    """Register the stand-in classes under their real module names (idempotent)."""
    g = globals()
    if "AttributeDict" in g:
        return
    g["AttributeDict"] = _standin("lightning.fabric.utilities.data", "AttributeDict", dict)
    g["DynamicLossScaler"] = _standin("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler")
    g["fragment_address"] = _standin("deepspeed.utils.tensor_fragment", "fragment_address")
    zse = enum.IntEnum("ZeroStageEnum", {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3})
    zse.__module__ = "deepspeed.runtime.zero.config"
    setattr(_module("deepspeed.runtime.zero.config"), "ZeroStageEnum", zse)
    g["ZeroStageEnum"] = zse


class Tiny(nn.Module):
    """A small MLP with LayerNorm; distinct shapes except the two hidden weights."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.h1 = nn.Linear(32, 32)
        self.h2 = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.norm(torch.tanh(self.h2(torch.tanh(self.h1(torch.tanh(self.inp(x))))))))


def _loss(model, step):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)
    return ((model(x) - y) ** 2).mean()


def train(model, opts, steps=40):
    """Real steps of every optimizer in `opts` on fresh random batches."""
    for s in range(steps):
        for o in opts:
            o.zero_grad()
        _loss(model, s).backward()
        for o in opts:
            o.step()


def torch2(path):
    torch.manual_seed(SEED)
    m = Tiny()
    named = list(m.named_parameters())
    decay = [(n, p) for n, p in named if p.dim() > 1]
    rest = [(n, p) for n, p in named if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": [p for _, p in decay]}, {"params": [p for _, p in rest], "weight_decay": 0.0}],
                            lr=2e-3, weight_decay=0.05)
    train(m, [opt])
    sd = opt.state_dict()
    for grp, names in zip(sd["param_groups"], ([n for n, _ in decay], [n for n, _ in rest])):
        grp.update(param_names=names, decoupled_weight_decay=True, fused=None, differentiable=False,
                   capturable=False, lr=torch.tensor(grp["lr"]))
    torch.save({"model": m.state_dict(), "optimizer": sd, "epoch": 3}, path)
    return path


class _GanModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.ModuleDict({"gen": Tiny(), "disc": nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))})


def lightning(path):
    register_standins()
    torch.manual_seed(SEED)
    lm = _GanModule()
    gen, disc = lm.model["gen"], lm.model["disc"]
    og = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
    od = torch.optim.AdamW(disc.parameters(), lr=4e-4, weight_decay=0.01)
    for s in range(40):
        og.zero_grad(); od.zero_grad()
        g = torch.Generator().manual_seed(s)
        x = torch.randn(32, 16, generator=g)
        (disc(gen(x)).mean() + 0.1 * (gen(x) ** 2).mean()).backward()
        og.step(); od.step()
    ckpt = {
        "epoch": 1, "global_step": 80, "pytorch-lightning_version": "2.4.0",
        "state_dict": lm.state_dict(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 2, "completed": 1}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None, 'mode': 'min'}": {"best_model_score": None, "dirpath": "/ckpt"}},
        "optimizer_states": [og.state_dict(), od.state_dict()],
        "lr_schedulers": [{"base_lrs": [1e-3], "last_epoch": 1, "_step_count": 2, "verbose": False}],
        "hparams_name": "kwargs",
        "hyper_parameters": AttributeDict(lr_g=1e-3, lr_d=4e-4, width=32),
    }
    torch.save(ckpt, path)
    return path


def _flat_partitions(model, ranks):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    pad = (-flat.numel()) % ranks
    flat = torch.cat([flat, torch.zeros(pad)])
    n = flat.numel() // ranks
    return [nn.Parameter(flat[r * n:(r + 1) * n].clone()) for r in range(ranks)], pad, n


def _zero_shards(ranks=2, steps=40):
    """A real ZeRO-2 run in one process: each rank's torch.optim.AdamW owns one slice of the
    flattened fp32 model; after each step the slices are written back into the model."""
    torch.manual_seed(SEED)
    m = Tiny()
    parts, pad, n = _flat_partitions(m, ranks)
    opts = [torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1) for p in parts]
    for s in range(steps):
        m.zero_grad()
        _loss(m, s).backward()
        g = torch.cat([p.grad.reshape(-1) for p in m.parameters()] + [torch.zeros(pad)])
        for r, (p, o) in enumerate(zip(parts, opts)):
            p.grad = g[r * n:(r + 1) * n].clone()
            o.step()
        flat = torch.cat([p.detach() for p in parts])
        off = 0
        with torch.no_grad():
            for q in m.parameters():
                q.copy_(flat[off:off + q.numel()].view_as(q))
                off += q.numel()
    return m, parts, opts, pad


def _shard(rank, ranks, part, opt, pad, base=None, ds_opt="AdamW"):
    register_standins()
    scaler = DynamicLossScaler()
    scaler.cur_scale, scaler.scale_factor, scaler.scale_window = 65536.0, 2.0, 1000
    mapping = collections.OrderedDict()
    fa = fragment_address()
    fa.numel, fa.start = part.numel(), 0
    mapping[f"flat_partition_{rank}"] = fa
    return {
        "optimizer_state_dict": {
            "loss_scaler": scaler, "dynamic_loss_scale": True, "overflow": False, "clip_grad": 1.0,
            "base_optimizer_state": base if base is not None else opt.state_dict(),
            "single_partition_of_fp32_groups": [part.detach()],
            "zero_stage": ZeroStageEnum.gradients, "group_paddings": [pad if rank == ranks - 1 else 0],
            "partition_count": [ranks], "ds_version": "0.14.4", "param_slice_mappings": [mapping],
        },
        "ds_config": {"train_batch_size": 64, "zero_optimization": {"stage": 2},
                      "optimizer": {"type": ds_opt, "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}}},
        "ds_version": "0.14.4",
    }


def deepspeed(out_dir, ranks=2):
    """global_step40/ with one optim_states shard per rank; returns the shard paths."""
    _, parts, opts, pad = _zero_shards(ranks)
    d = os.path.join(out_dir, "global_step40")
    os.makedirs(d, exist_ok=True)
    paths = []
    for r in range(ranks):
        p = os.path.join(d, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        torch.save(_shard(r, ranks, parts[r], opts[r], pad), p)
        paths.append(p)
    with open(os.path.join(out_dir, "latest"), "w") as f:
        f.write("global_step40")
    return paths


def deepspeed_fused(path):
    """Rank 0 of the same run, its state rewritten as DeepSpeed FusedAdam keeps it."""
    _, parts, opts, pad = _zero_shards(2)
    sd = opts[0].state_dict()
    step = int(sd["state"][0]["step"])
    groups = [{"lr": g["lr"], "bias_correction": True, "betas": g["betas"], "eps": g["eps"],
               "weight_decay": g["weight_decay"], "step": step, "params": g["params"]} for g in sd["param_groups"]]
    state = {i: {"exp_avg": s["exp_avg"], "exp_avg_sq": s["exp_avg_sq"]} for i, s in sd["state"].items()}
    torch.save(_shard(0, 2, parts[0], opts[0], pad, base={"state": state, "param_groups": groups}), path)
    return path


def fsdp_full(path):
    torch.manual_seed(SEED)
    m = Tiny()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=1e-4)  # Adam L2: theta matters
    train(m, [opt])
    sd = opt.state_dict()
    names = [n for n, _ in m.named_parameters()]
    state = {names[i]: s for i, s in sd["state"].items()}
    groups = [dict(g, params=[names[i] for i in g["params"]]) for g in sd["param_groups"]]
    torch.save({"model": m.state_dict(), "optim": {"state": state, "param_groups": groups}}, path)
    return path


def gan(path):
    torch.manual_seed(SEED)
    G, D = Tiny(), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    og, od = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999)), torch.optim.Adam(D.parameters(), lr=2e-4)
    for s in range(40):
        og.zero_grad(); od.zero_grad()
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(s))
        (D(G(x)).mean()).backward()
        og.step(); od.step()
    torch.save({"G": G.state_dict(), "D": D.state_dict(), "opt_G": og.state_dict(), "opt_D": od.state_dict()}, path)
    return path


def write_all(out):
    os.makedirs(out, exist_ok=True)
    paths = [torch2(os.path.join(out, "torch2.pt")), lightning(os.path.join(out, "lightning.ckpt")),
             deepspeed_fused(os.path.join(out, "zero_fused.pt")), fsdp_full(os.path.join(out, "fsdp_full.pt")),
             gan(os.path.join(out, "gan.pt"))]
    return paths + deepspeed(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for p in write_all(sys.argv[1]):
        print(p)
