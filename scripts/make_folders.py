#!/usr/bin/python3
"""Real checkpoint folders for folder mode, made with Debian's torch 1.13 (run with /usr/bin/python3).

Usage: /usr/bin/python3 scripts/make_folders.py OUT_DIR [--width 64] [--steps 5]
Writes, under OUT_DIR:
  hf/checkpoint-5/,       HF Trainer layout (transformers trainer.py _save_checkpoint):
                          model.safetensors (tiny strict writer), optimizer.pt (torch.optim.AdamW
                          state_dict), scheduler.pt (LambdaLR state_dict), rng_state.pth (python /
                          numpy / cpu RNG states), trainer_state.json, config.json,
                          training_args.bin (a pickled stand-in of transformers.TrainingArguments
                          with optim=OptimizerNames.ADAMW_TORCH);
  hf_adam/checkpoint-5/   the same with torch.optim.Adam (L2 weight decay)
  ds2/, ds4/              DeepSpeed ZeRO-1/2 with 2 and 4 data-parallel ranks: latest ("global_step5"),
                          global_step5/mp_rank_00_model_states.pt and
                          zero_pp_rank_R_mp_rank_00_optim_states.pt (keys of deepspeed
                          runtime/zero/stage_1_and_2.py state_dict and engine.py _save_zero_checkpoint;
                          base optimizer torch.optim.AdamW over flat fp32 partitions, one per group)
  dcp/, dcp_packed/,      torch 1.13 torch.distributed._shard.checkpoint FileSystemWriter folders
                          (one item per .distcp file; single_file_per_rank=True: all items of the
                          rank in __0_0.distcp at offsets), keys flattened as in DCP:
                          model.<fqn>, optim.state.<fqn>.exp_avg, optim.param_groups.<fqn>.lr;
  dcp_sharded/            model and moments as ShardedTensors of 2 row chunks (one item per chunk);
  dcp_py311/              enum members pickled as Python <= 3.10 does (cls(value)), except in
                          dcp_py311/ (Python 3.11's getattr(cls, name), which the reader refuses)
The stand-in classes (TrainingArguments, DynamicLossScaler, ZeroStageEnum, fragment_address) are
registered under their real module names so pickle and torch.load find them (import this file).
"""
import argparse
import copy
import dataclasses
import enum
import json
import os
import random
import struct
import sys
import types
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn

STEPS = 5


# ---------------------------------------------------------------- stand-ins under real module names

def _module(name):
    """A (possibly nested) module registered in sys.modules."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[n])
    return sys.modules[name]


def _register(cls, module):
    cls.__module__ = module
    setattr(_module(module), cls.__name__, cls)
    return cls


class OptimizerNames(str, enum.Enum):
    """transformers.training_args.OptimizerNames (an ExplicitEnum of str)."""
    ADAMW_HF = "adamw_hf"
    ADAMW_TORCH = "adamw_torch"
    ADAFACTOR = "adafactor"


@dataclasses.dataclass
class TrainingArguments:
    """The fields of transformers.TrainingArguments that a checkpoint folder's reader looks at."""
    output_dir: str = "out"
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optim: OptimizerNames = OptimizerNames.ADAMW_TORCH
    save_steps: int = 5
    seed: int = 42


class DynamicLossScaler:
    """deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler (attributes only)."""

    def __init__(self):
        self.cur_scale = 65536.0
        self.cur_iter = STEPS
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = 1000
        self.min_scale = 1.0
        self.delayed_shift = 1
        self.cur_hysteresis = 1
        self.consecutive_hysteresis = False
        self.raise_error_at_min_scale = True
        self.dtype = torch.float16


class ZeroStageEnum(int, enum.Enum):
    """deepspeed.runtime.zero.config.ZeroStageEnum."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    """deepspeed.utils.tensor_fragment.fragment_address."""
    numel: int
    start: int


def _reduce_by_value(self, proto):
    """How Python <= 3.10 pickles an enum member: cls(value) (REDUCE). Python 3.11 writes
    getattr(cls, name), a builtins.getattr call that ckptkit's reader refuses in every mode."""
    return self.__class__, (self._value_,)


def py310_enum_pickles(*classes):
    """Pickle members of `classes` in the Python <= 3.10 form (as most clusters' checkpoints)."""
    for c in classes:
        c.__reduce_ex__ = _reduce_by_value


py310_enum_pickles(OptimizerNames, ZeroStageEnum)
_register(OptimizerNames, "transformers.training_args")
_register(TrainingArguments, "transformers.training_args")
_register(DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler")
_register(ZeroStageEnum, "deepspeed.runtime.zero.config")
_register(fragment_address, "deepspeed.utils.tensor_fragment")


# ---------------------------------------------------------------- the model and its training

class Net(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width // 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def batches(width, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, width, generator=g), torch.randn(32, width // 4, generator=g)) for _ in range(steps + 1)]


def grads_of(net, batch):
    """Gradients of the loss on one batch, by parameter name."""
    net.zero_grad()
    x, y = batch
    ((net(x) - y) ** 2).mean().backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters()}


def train_adamw(width, steps, wd=0.01, opt_cls=torch.optim.AdamW):
    """A Net and its optimizer (AdamW, or opt_cls) after `steps` real steps."""
    torch.manual_seed(0)
    net = Net(width)
    opt = opt_cls(net.parameters(), lr=1e-3, weight_decay=wd)
    for b in batches(width, steps)[:steps]:
        grads_of(net, b)
        opt.step()
    return net, opt


# ---------------------------------------------------------------- safetensors (tiny strict writer)

_ST = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata=None):
    """safetensors format: u64 header length, JSON header (dtype, shape, data_offsets), data."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": _ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """The tensors of a safetensors file (F32 only, as write_safetensors writes them here)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = OrderedDict()
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        assert h["dtype"] == "F32"
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float32).copy()).reshape(h["shape"])
    return out


# ---------------------------------------------------------------- HF Trainer checkpoint-N/

def make_hf(root, width, steps, opt_cls=torch.optim.AdamW, name="hf"):
    """checkpoint-N/ under root/name; opt_cls torch.optim.Adam gives Adam's L2 weight decay
    (Trainer(optimizers=...) keeps optim=adamw_torch in training_args.bin all the same)."""
    d = os.path.join(root, name, f"checkpoint-{steps}")
    os.makedirs(d, exist_ok=True)
    net, opt = train_adamw(width, steps, opt_cls=opt_cls)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    write_safetensors(os.path.join(d, "model.safetensors"), net.state_dict(), {"format": "pt"})
    torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
    torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
    random.seed(0)
    np.random.seed(0)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
               os.path.join(d, "rng_state.pth"))
    torch.save(TrainingArguments(), os.path.join(d, "training_args.bin"))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"best_metric": None, "epoch": 1.0, "global_step": steps, "log_history": [
            {"loss": 1.0 - 0.1 * i, "step": i + 1} for i in range(steps)], "max_steps": 100}, f, indent=2)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Net"], "hidden_size": width, "model_type": "toy"}, f, indent=2)
    return d


# ---------------------------------------------------------------- DeepSpeed ZeRO-1/2 global_stepN/

def ds_groups(net):
    """Param groups as DeepSpeed users build them: decayed weights, undecayed biases."""
    named = list(net.named_parameters())
    return [[(n, p) for n, p in named if n.endswith("weight")], [(n, p) for n, p in named if n.endswith("bias")]]


def make_ds(root, world, width, steps, name=None):
    """One global_step folder with `world` data-parallel optimizer shards and its `latest`."""
    top = os.path.join(root, name or f"ds{world}")
    d = os.path.join(top, f"global_step{steps}")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    net = Net(width)
    groups = ds_groups(net)
    hyper = [dict(lr=1e-3, weight_decay=0.01), dict(lr=1e-3, weight_decay=0.0)]
    flat = [torch.cat([p.detach().reshape(-1) for _, p in g]) for g in groups]
    for f in flat:
        assert f.numel() % world == 0, "choose a width whose groups split evenly (no DP padding)"
    parts = [[nn.Parameter(f.chunk(world)[r].clone()) for f in flat] for r in range(world)]
    opts = [torch.optim.AdamW([dict(params=[parts[r][gi]], **hyper[gi]) for gi in range(len(groups))])
            for r in range(world)]
    for b in batches(width, steps)[:steps]:
        # the data-parallel step: every rank reduces the full gradient, updates its partition
        g = grads_of(net, b)
        for r in range(world):
            for gi, grp in enumerate(groups):
                parts[r][gi].grad = torch.cat([g[n].reshape(-1) for n, _ in grp]).chunk(world)[r].clone()
            opts[r].step()
        with torch.no_grad():   # all-gather the updated partitions into the model
            for gi, grp in enumerate(groups):
                full = torch.cat([parts[r][gi].detach() for r in range(world)])
                off = 0
                for _, p in grp:
                    p.copy_(full[off:off + p.numel()].view_as(p))
                    off += p.numel()
    ds_config = {"train_batch_size": 32 * world, "zero_optimization": {"stage": 2},
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    for r in range(world):
        mappings = []
        for gi, grp in enumerate(groups):
            per = flat[gi].numel() // world
            lo, hi, off, m = r * per, (r + 1) * per, 0, OrderedDict()
            for n, p in grp:
                a, b = max(lo, off), min(hi, off + p.numel())
                if a < b:
                    m[n] = fragment_address(numel=b - a, start=a - lo)
                off += p.numel()
            mappings.append(m)
        osd = {
            "loss_scaler": DynamicLossScaler(),
            "dynamic_loss_scale": True,
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": opts[r].state_dict(),
            "single_partition_of_fp32_groups": [p.detach().clone() for p in parts[r]],
            "zero_stage": ZeroStageEnum.gradients,
            "group_paddings": [0 for _ in groups],
            "partition_count": [world for _ in groups],
            "ds_version": "0.9.5",
            "param_slice_mappings": mappings,
        }
        torch.save({"optimizer_state_dict": osd, "ds_config": ds_config, "ds_version": "0.9.5"},
                   os.path.join(d, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    torch.save({"module": net.state_dict(), "buffer_names": [], "optimizer": None,
                "param_shapes": [OrderedDict((n, p.shape) for n, p in g) for g in groups],
                "frozen_param_shapes": None, "shared_params": {}, "lr_scheduler": None,
                "sparse_tensor_module_names": [], "skipped_steps": 0, "global_steps": steps,
                "global_samples": steps * 32 * world, "dp_world_size": world, "mp_world_size": 1,
                "ds_config": ds_config, "ds_version": "0.9.5"},
               os.path.join(d, "mp_rank_00_model_states.pt"))
    with open(os.path.join(top, "latest"), "w") as f:
        f.write(f"global_step{steps}")
    return top


# ---------------------------------------------------------------- torch 1.13 DCP

def import_dcp():
    """torch.distributed._shard.checkpoint on Python 3.11: its sharded_tensor metadata dataclass
    has a field (tensor_properties) with a mutable dataclass default, which 3.11 refuses; give
    that one field a default_factory while the import runs. Nothing else changes."""
    orig = dataclasses._get_field

    def patched(cls, a_name, a_type, *rest):
        f = cls.__dict__.get(a_name, dataclasses.MISSING)
        if a_name == "tensor_properties" and isinstance(f, dataclasses.Field) and f.default is not dataclasses.MISSING:
            default = f.default   # field(default=TensorProperties()) -> field(default_factory=...)
            setattr(cls, a_name, dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d)))
        return orig(cls, a_name, a_type, *rest)

    dataclasses._get_field = patched
    try:
        import torch.distributed._shard.checkpoint as dcp
    finally:
        dataclasses._get_field = orig
    return dcp


def dcp_state_dict(net, opt, flatten=True):
    """The model and optimizer as DCP keys, as torch >= 2's get_state_dict + dcp.save write
    them: with flatten_optimizer_state_dict (flatten) optim.param_groups.<fqn>.<key>; without
    it (torch's default) optim.param_groups.<i>.<key> and optim.param_groups.<i>.params, the
    list of the group's FQNs kept as one item (torch/distributed/checkpoint/_traverse.py
    keeps a list of plain values whole)."""
    sd = OrderedDict(("model." + n, t) for n, t in net.state_dict().items())
    names = [n for n, _ in net.named_parameters()]
    osd = opt.state_dict()
    for idx, st in osd["state"].items():
        for k, v in st.items():
            sd[f"optim.state.{names[idx]}.{k}"] = v
    for gi, g in enumerate(osd["param_groups"]):
        if not flatten:
            for k, v in g.items():
                sd[f"optim.param_groups.{gi}.{k}"] = [names[i] for i in v] if k == "params" else v
            continue
        for idx in g["params"]:
            for k, v in g.items():
                if k != "params":
                    sd[f"optim.param_groups.{names[idx]}.{k}"] = v
    return sd


def make_dcp(root, width, steps, packed=False, py311=False, flatten=True):
    """A DCP folder; its .metadata pickles TensorProperties' memory-format enum as Python <= 3.10
    does, unless py311 (then as this interpreter: getattr(MEM_FORMAT_ENCODING, name))."""
    dcp = import_dcp()
    from torch.distributed._shard.sharded_tensor import metadata as stm
    enc = stm.MEM_FORMAT_ENCODING
    saved = enc.__dict__.get("__reduce_ex__")
    if not py311:
        py310_enum_pickles(enc)
    d = os.path.join(root, "dcp_py311" if py311 else "dcp_packed" if packed else "dcp" if flatten else "dcp_default")
    os.makedirs(d, exist_ok=True)
    net, opt = train_adamw(width, steps)
    try:
        dcp.save_state_dict(dcp_state_dict(net, opt, flatten), dcp.FileSystemWriter(d, single_file_per_rank=packed),
                            no_dist=True)
    finally:
        if saved is None:
            enc.__reduce_ex__ = enum.Enum.__reduce_ex__
        else:
            enc.__reduce_ex__ = saved
    return d


def ensure_process_group():
    """A one-rank gloo process group (ShardedTensors and DCP's distributed save need one)."""
    import tempfile
    import torch.distributed as dist
    if not dist.is_initialized():
        fd, path = tempfile.mkstemp(prefix="ckptkit-pg-")
        os.close(fd)
        os.unlink(path)
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)


def to_sharded(t, chunks=2):
    """`t` as a ShardedTensor of `chunks` row chunks (ChunkShardingSpec, all on this rank),
    as FSDP / ShardedTensor state dicts hand them to DCP: one storage item per chunk."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    ensure_process_group()
    st = sharded_tensor.empty(ChunkShardingSpec(dim=0, placements=["rank:0/cpu"] * chunks), *t.shape)
    for sh in st.local_shards():
        o, n = sh.metadata.shard_offsets[0], sh.metadata.shard_sizes[0]
        sh.tensor.copy_(t[o:o + n])
    return st


def from_sharded(st):
    """The full tensor of a ShardedTensor whose shards are all local."""
    shards = sorted(st.local_shards(), key=lambda sh: sh.metadata.shard_offsets[0])
    return torch.cat([sh.tensor for sh in shards])


def make_dcp_sharded(root, width, steps):
    """A DCP folder whose model and moment tensors are ShardedTensors of 2 chunks each
    (one .distcp item per chunk, MetadataIndex offsets (0, 0) and (rows/2, 0))."""
    dcp = import_dcp()
    from torch.distributed._shard.sharded_tensor import metadata as stm
    py310_enum_pickles(stm.MEM_FORMAT_ENCODING)
    d = os.path.join(root, "dcp_sharded")
    os.makedirs(d, exist_ok=True)
    net, opt = train_adamw(width, steps)
    sd = OrderedDict((k, to_sharded(v) if torch.is_tensor(v) and v.dim() >= 1 else v)
                     for k, v in dcp_state_dict(net, opt).items())
    dcp.save_state_dict(sd, dcp.FileSystemWriter(d))
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--only", choices=["hf", "ds", "dcp"], action="append")
    a = ap.parse_args()
    only = set(a.only or ["hf", "ds", "dcp"])
    if "hf" in only:
        print(make_hf(a.out, a.width, a.steps))
        print(make_hf(a.out, a.width, a.steps, torch.optim.Adam, "hf_adam"))
    if "ds" in only:
        print(make_ds(a.out, 2, a.width, a.steps))
        print(make_ds(a.out, 4, a.width, a.steps))
    if "dcp" in only:
        print(make_dcp(a.out, a.width, a.steps))
        print(make_dcp(a.out, a.width, a.steps, packed=True))
        print(make_dcp(a.out, a.width, a.steps, py311=True))
        print(make_dcp_sharded(a.out, a.width, a.steps))


if __name__ == "__main__":
    main()
