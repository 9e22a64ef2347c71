#!/usr/bin/python3
"""Stock-torch check of a restored checkpoint against its original (the torch side of ckptkit).

Usage: /usr/bin/python3 scripts/torch_step_check.py ORIG RESTORED [--tolerance 0.01]
           [--grad-bound G] [--fixture NAME] [--weights FILE] [--steps N]

Loads both files with stock torch (or, for .safetensors, with the tiny strict reader below),
checks that every non-moment value is bit-identical, rebuilds the model and optimizer of the
fixture (scripts/fixtures/ckpt_models.py) twice, loads the original state into one pair and the
restored state into the other, applies the SAME gradient g to both and calls
`optimizer.step()` once on each, for several gradient kinds:
  real       the real next gradient (next training batch, on the original model), clipped to G
  zero       g = 0
  +G / -G    every coordinate at the bound (only when G is finite)
  uniform    random in [-G, G]; for G = inf heavy-tailed: sign * 10^U(-8, 6)
  +sqrt_vhat / -sqrt_vhat / near_sqrt_vhat
             effective gradient at +-sqrt(v_hat) (x U(0.5, 2) for "near"), v_hat =
             exp_avg_sq / (1 - beta2^step) of the ORIGINAL, clipped to [-G, G]
With --steps N, gradient sequences of N steps (sequence_kinds: ramps aligned with exp_avg,
a spike after a zero run, alternating signs, noise) are fed to both pairs, the same
gradient as Adam sees it in both runs, and every step's Delta is checked as below (the
--horizon all certificate).
For Adam in L2 mode (weight_decay != 0, not AdamW) torch adds wd*theta to `.grad` itself, so
the raw gradient stays in [-G, G] and the certified domain is shifted, as in docs/design.md §1.

Pass criterion per coordinate i, with Delta = theta_after - theta_before of each run:
  |Delta_restored_i - Delta_original_i| <= tolerance * lr + slack_i
  slack_i = 4 ulp32(max|theta_i|)  +  8 eps32 * (A_orig_i + A_rest_i)
  A = (lr / bc1) * (b1 |m| + (1 - b1) |g_eff|) / (sqrt(vm' / bc2) + eps)
Justification: each run ends with one float32 rounding of theta - u (<= 0.5 ulp of the
result, 1 ulp for the two runs; 4 ulp covers results in a neighbouring binade); and each run
computes u in float32 from m' = b1 m + (1-b1) g (two roundings, absolute error <= 2u_r of
b1|m| + (1-b1)|g|, u_r = 2^-24), v', sqrt, /sqrt(bc2), +eps, divide, scale (<= ~8 further
relative roundings of |u| <= A): in total < 12 u_r * A = 6 eps32 * A per run, bounded here by
8 eps32 * A. This is about 1e-5 of tolerance * lr for typical coordinates.
Exit status: 0 all checks hold, 1 a check failed, 2 bad input.
"""
import argparse
import copy
import json
import math
import os
import pickle
import struct
import sys
from collections import OrderedDict

import numpy as np
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "fixtures"))   # ckpt_models
sys.path.insert(0, os.path.join(_HERE, "bench"))      # train_bench_models (the bench checkpoints)
import ckpt_models as cm  # noqa: E402

MOMENT_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
EPS32 = float(np.finfo(np.float32).eps)


class BadInput(Exception):
    """A file could not be read as a checkpoint (exit status 2)."""


# ---------------------------------------------------------------------------- loading


def _allowed_globals():
    """The torch.load(weights_only=True) allowlist of this torch, plus `_codecs.encode`."""
    from torch import _weights_only_unpickler as wou

    allowed = dict(wou._get_allowed_globals())
    import _codecs

    allowed["_codecs.encode"] = _codecs.encode
    return allowed


class _RestrictedPickle:
    """A `pickle_module` for torch.load whose Unpickler resolves only allowlisted globals."""

    class Unpickler(pickle.Unpickler):
        """pickle.Unpickler that refuses every global outside the weights_only allowlist."""

        def find_class(self, module, name):
            """Return the allowlisted global `module.name`, else raise UnpicklingError."""
            allowed = _allowed_globals()
            key = f"{module}.{name}"
            if key in allowed:
                return allowed[key]
            raise pickle.UnpicklingError(f"global {key} is not in the weights_only allowlist")

    load = pickle.load
    Unpickler = Unpickler


def safe_torch_load(path):
    """torch.load(path, weights_only=True), with a same-allowlist fallback for torch 1.13.

    torch 1.13's weights_only unpickler lacks the BINFLOAT opcode ("Unsupported operand 71"),
    so it refuses every optimizer state_dict (lr, betas, eps are floats; fixed in torch 2.0).
    Only in that case the file is loaded with the standard unpickler restricted to the very
    same allowlist of globals, which executes nothing else either.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported operand 71" not in str(e):
            raise BadInput(f"{path}: torch.load(weights_only=True) refused: {e}") from None
    except Exception as e:  # noqa: BLE001 - not a zip, truncated, ...: bad input
        raise BadInput(f"{path}: torch.load failed: {str(e).splitlines()[0]}") from None
    try:
        return torch.load(path, map_location="cpu", pickle_module=_RestrictedPickle)
    except Exception as e:  # noqa: BLE001 - report any failure as bad input
        raise BadInput(f"{path}: restricted torch.load failed: {e}") from None


ST_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
            "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """Parse a safetensors file strictly; return (OrderedDict name -> tensor, metadata dict).

    Checks: header length within the file and <= 100,000,000; JSON object; no duplicate keys;
    known dtypes; e - b == numel * itemsize; entries sorted by offset tile the buffer from 0
    with no gap or overlap and end exactly at end of file.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise BadInput(f"{path}: safetensors header too small")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > 100_000_000 or 8 + n > len(raw):
        raise BadInput(f"{path}: safetensors header length {n} past end of file")

    def no_dups(pairs):
        """JSON object hook rejecting duplicate keys."""
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise BadInput(f"{path}: duplicate key in safetensors header")
        return dict(pairs)

    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=no_dups)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadInput(f"{path}: bad safetensors header JSON: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    buf = raw[8 + n:]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    pos = 0
    out = OrderedDict()
    for name, e in entries:
        if e.get("dtype") not in ST_TORCH:
            raise BadInput(f"{path}: {name}: unsupported dtype {e.get('dtype')}")
        dt = ST_TORCH[e["dtype"]]
        b, end = e["data_offsets"]
        numel = math.prod(e["shape"])
        if b != pos or end - b != numel * torch.tensor([], dtype=dt).element_size():
            raise BadInput(f"{path}: {name}: invalid data_offsets {e['data_offsets']}")
        pos = end
        t = torch.frombuffer(bytearray(buf[b:end]), dtype=torch.uint8) if end > b \
            else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dt).reshape(e["shape"]).clone()
    if pos != len(buf):
        raise BadInput(f"{path}: safetensors buffer not fully covered ({pos} of {len(buf)})")
    return OrderedDict((k, out[k]) for k in header), meta


def load_any(path):
    """Load a checkpoint: .safetensors -> {"tensors": ..., "metadata": ...}, else torch."""
    if not os.path.isfile(path):
        raise BadInput(f"{path}: no such file")
    if path.endswith(".safetensors"):
        tensors, meta = read_safetensors(path)
        # header order carries no meaning in safetensors: compare by sorted name
        return {"tensors": OrderedDict(sorted(tensors.items())),
                "metadata": OrderedDict(sorted(meta.items()))}
    return safe_torch_load(path)


def split_state(obj, path, weights=None):
    """Return (model state_dict or None, optimizer state_dict) from a loaded checkpoint.

    Handles {"model","optimizer",...}, a bare optimizer state_dict (model weights then come
    from `weights`, a full checkpoint of the same run) and the safetensors flattening.
    """
    if isinstance(obj, dict) and "tensors" in obj and "metadata" in obj:
        ts, meta = obj["tensors"], obj["metadata"]
        if "param_groups" not in meta:
            raise BadInput(f"{path}: safetensors __metadata__ lacks param_groups")
        model_sd = OrderedDict((k[len("model."):], v) for k, v in ts.items()
                               if k.startswith("model."))
        state = {}
        for k, v in ts.items():
            if k.startswith("state."):
                _, idx, key = k.split(".", 2)
                if not idx.isdigit():
                    raise BadInput(f"{path}: {k}: expected state.<idx>.<key>")
                state.setdefault(int(idx), {})[key] = v
        groups = json.loads(meta["param_groups"])
        for g in groups:
            if isinstance(g.get("betas"), list):
                g["betas"] = tuple(g["betas"])
        return model_sd, {"state": state, "param_groups": groups}
    if isinstance(obj, dict) and "state" in obj and "param_groups" in obj:
        model_sd = None
        if weights is not None:
            model_sd = split_state(load_any(weights), weights)[0]
        return model_sd, obj
    if isinstance(obj, dict) and "optimizer" in obj:
        return obj.get("model"), obj["optimizer"]
    raise BadInput(f"{path}: no optimizer state_dict found")


# ---------------------------------------------------------------------------- bit identity


def _is_moment(path):
    """True when the key path names an Adam moment (…state.<idx>.exp_avg etc.)."""
    last = path[-1]
    if isinstance(last, str) and last.startswith("state.") and last.split(".")[-1] in MOMENT_KEYS:
        return True
    return len(path) >= 3 and path[-3] == "state" and last in MOMENT_KEYS


def _tensor_bytes(t):
    """The raw bytes of a tensor's elements in row-major order."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _walk(obj, path=()):
    """Yield (path, leaf) for every leaf of nested dicts/lists/tuples."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (k,))
    elif isinstance(obj, (list, tuple)) and any(isinstance(x, (dict, torch.Tensor)) for x in obj):
        for i, v in enumerate(obj):
            yield from _walk(v, path + (i,))
    else:
        yield path, obj


def compare_checkpoints(orig, rest, check_zeros=False):
    """List every difference between two loaded checkpoints that is not allowed.

    Non-moment tensors: same dtype, shape, stride, storage offset and bytes (bit-identical).
    Moments: same dtype and shape, finite, exp_avg_sq/max_exp_avg_sq >= 0, and with
    `check_zeros` exact zeros stay exact zeros. Non-tensor leaves (step ints, epoch,
    param_groups values, safetensors metadata): equal with the same type. The structure
    (keys, their order for dicts) must be the same, and tensors that share a storage in the
    original (tied weights) must share one, with the same data_ptr pattern, in the restored.
    """
    errs = []
    a = dict(_walk(orig))
    b = dict(_walk(rest))
    if list(a) != list(b):
        errs.append(f"structure differs: only in original {sorted(map(str, set(a) - set(b)))}, "
                    f"only in restored {sorted(map(str, set(b) - set(a)))}, or key order")
    for p in a:
        if p not in b:
            continue
        x, y = a[p], b[p]
        name = "/".join(map(str, p))
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            errs.append(f"{name}: tensor vs non-tensor")
            continue
        if not isinstance(x, torch.Tensor):
            if type(x) is not type(y) or x != y:
                errs.append(f"{name}: {x!r} != {y!r}")
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            errs.append(f"{name}: dtype/shape {x.dtype}{tuple(x.shape)} != {y.dtype}{tuple(y.shape)}")
            continue
        if _is_moment(p):
            if not torch.isfinite(y).all():
                errs.append(f"{name}: restored moment has non-finite values")
            if p[-1] != "exp_avg" and not str(p[-1]).endswith(".exp_avg") and (y < 0).any():
                errs.append(f"{name}: restored second moment has negative values")
            if check_zeros and ((x == 0) & (y != 0)).any():
                errs.append(f"{name}: exact zeros not kept")
            continue
        if x.stride() != y.stride() or x.storage_offset() != y.storage_offset():
            errs.append(f"{name}: stride/offset {x.stride()}+{x.storage_offset()} != "
                        f"{y.stride()}+{y.storage_offset()}")
        if _tensor_bytes(x) != _tensor_bytes(y):
            errs.append(f"{name}: values differ (bit level)")
        elif not torch.equal(x, y) and not (x.is_floating_point() and x.isnan().any()):
            errs.append(f"{name}: torch.equal is false")  # same bits: only NaN may differ
    errs += _compare_sharing(a, b)
    return errs


def _compare_sharing(a, b):
    """Check that tensors sharing storage / data_ptr in `a` do the same in `b`."""
    errs = []
    ta = [(p, t) for p, t in a.items() if isinstance(t, torch.Tensor) and p in b
          and isinstance(b[p], torch.Tensor)]
    for i in range(len(ta)):
        for j in range(i + 1, len(ta)):
            (p, x), (q, y) = ta[i], ta[j]
            if x.numel() == 0 or y.numel() == 0:
                continue
            same_ptr = x.data_ptr() == y.data_ptr()
            same_sto = x.storage().data_ptr() == y.storage().data_ptr()
            u, v = b[p], b[q]
            if same_ptr and u.data_ptr() != v.data_ptr():
                errs.append(f"{'/'.join(map(str, p))} and {'/'.join(map(str, q))}: "
                            "shared data_ptr in original, not in restored")
            elif same_sto and u.storage().data_ptr() != v.storage().data_ptr():
                errs.append(f"{'/'.join(map(str, p))} and {'/'.join(map(str, q))}: "
                            "shared storage in original, not in restored")
    return errs


# ---------------------------------------------------------------------------- step check


def build_pair(fixture, model_sd, optim_sd):
    """Fresh model + optimizer of `fixture` (a data/ fixture, or a bench checkpoint of
    scripts/bench/train_bench_models.py: resnet18_adamw.pt, lm10m_adamw.pt) with `model_sd` and
    `optim_sd` loaded (stock API)."""
    if fixture in BENCH_FILES:
        import train_bench_models
        model, opt = train_bench_models.model_and_optimizer(fixture)
    else:
        model = cm.build(fixture)
        opt = None
    if model_sd is not None:
        model.load_state_dict(model_sd)
    if opt is None:
        opt = cm.make_optimizer(cm.FIXTURES[fixture][0], model)
    # torch 2.x's load_state_dict keeps the given tensors where dtype and device already fit
    # (1.13 deep-copied them): the steps taken here must not change the caller's state
    opt.load_state_dict(copy.deepcopy(optim_sd))
    return model, opt


def _params(opt):
    """Parameters in optimizer index order, each with its param group."""
    return [(p, g) for g in opt.param_groups for p in g["params"]]


def _bc(beta, step):
    """Bias correction 1 - beta**step."""
    return 1.0 - beta ** step


def _is_l2(opt, group):
    """True for Adam (not AdamW) with weight_decay != 0: g_eff = g + wd*theta."""
    return not isinstance(opt, torch.optim.AdamW) and group["weight_decay"] != 0


def real_gradient(fixture, model_sd, optim_sd):
    """Gradient of the next training batch on a third copy of the ORIGINAL model."""
    run = cm.FIXTURES[fixture][0]
    spec = cm.RUNS[run]
    model, opt = build_pair(fixture, model_sd, optim_sd)
    model.train()
    step = int(float(next(iter(opt.state.values()))["step"]))
    xb, yb = cm.batch(spec["model"], step)
    loss = cm.loss_fn(spec["model"], model, xb, yb)
    (-loss if spec.get("maximize") else loss).backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p, _ in _params(opt)]


def gradient_kinds(fixture, model_sd, optim_sd, G, seed=0):
    """Return OrderedDict kind -> list of raw gradients (optimizer order), all within [-G, G]."""
    model, opt = build_pair(fixture, model_sd, optim_sd)
    gen = torch.Generator().manual_seed(seed)
    finite = math.isfinite(G)
    clip = (lambda t: t.clamp(-G, G)) if finite else (lambda t: t)
    ps = _params(opt)
    kinds = OrderedDict()
    kinds["real"] = [clip(g) for g in real_gradient(fixture, model_sd, optim_sd)]
    kinds["zero"] = [torch.zeros_like(p) for p, _ in ps]
    if finite:
        kinds["+G"] = [torch.full_like(p, G) for p, _ in ps]
        kinds["-G"] = [torch.full_like(p, -G) for p, _ in ps]
        kinds["uniform"] = [(torch.rand(p.shape, generator=gen) * 2 - 1) * G for p, _ in ps]
    else:
        kinds["uniform"] = [
            torch.sign(torch.rand(p.shape, generator=gen) - 0.5)
            * 10.0 ** (torch.rand(p.shape, generator=gen) * 14 - 8) for p, _ in ps]
    for name, fac in (("+sqrt_vhat", 1.0), ("-sqrt_vhat", -1.0), ("near_sqrt_vhat", None)):
        gs = []
        for p, group in ps:
            st = opt.state[p]
            b2 = group["betas"][1]
            vhat = st["exp_avg_sq"].double() / _bc(b2, float(st["step"]))
            target = vhat.sqrt()
            if fac is None:
                sign = torch.sign(torch.rand(p.shape, generator=gen) - 0.5).double()
                target = target * sign * (0.5 + 1.5 * torch.rand(p.shape, generator=gen).double())
            else:
                target = target * fac
            if group["maximize"]:
                target = -target  # torch negates .grad first; aim g_eff at the target
            if _is_l2(opt, group):  # raw g so that g + wd*theta lands on the target
                target = target - group["weight_decay"] * p.detach().double() * (
                    -1.0 if group["maximize"] else 1.0)
            gs.append(clip(target.float()))
        kinds[name] = gs
    return kinds


def step_records(opt, before, grads):
    """Per-parameter records for the bound of one optimizer.step() of `opt` (torch Adam/AdamW)
    that has just run: `before` the [(theta, exp_avg)] of each parameter before it, `grads`
    the raw .grad it saw, both in _params(opt) order; the parameters and state are read now.
    Any caller that steps a real optimizer (a framework's training loop) records with this."""
    recs = []
    for (p, group), (theta0, m0), g in zip(_params(opt), before, grads):
        st = opt.state[p]
        geff = g.double() * (-1.0 if group["maximize"] else 1.0)
        if _is_l2(opt, group):
            geff = geff + group["weight_decay"] * theta0.double()
        A = _bound_A(st, group, m0, geff)
        recs.append(dict(theta0=theta0, theta1=p.detach().clone(), A=A, lr=group["lr"]))
    return recs


def _one_step(fixture, model_sd, optim_sd, grads):
    """Apply one optimizer.step() with `grads`; return per-param records for the bound."""
    model, opt = build_pair(fixture, model_sd, optim_sd)
    ps = _params(opt)
    before = [(p.detach().clone(), opt.state[p]["exp_avg"].clone()) for p, _ in ps]
    for (p, _), g in zip(ps, grads):
        p.grad = g.clone()
    opt.step()
    return step_records(opt, before, grads)


def _ulp32(x):
    """Float32 ulp of |x| (elementwise), as float64."""
    a = np.abs(x.numpy().astype(np.float32))
    return torch.from_numpy(np.spacing(a).astype(np.float64))


def step_check(fixture, orig_sd, rest_sd, tolerance, G, seed=0):
    """Run every gradient kind on both pairs; return OrderedDict kind -> result dict.

    result: max_lr = max |Delta_r - Delta_o| / lr, excess = max(|Delta_r - Delta_o| -
    (tolerance*lr + slack)) (<= 0 means pass), ok, worst = (param index, flat index).
    """
    kinds = gradient_kinds(fixture, orig_sd[0], orig_sd[1], G, seed)
    out = OrderedDict()
    for kind, grads in kinds.items():
        ro = _one_step(fixture, orig_sd[0], orig_sd[1], grads)
        rr = _one_step(fixture, rest_sd[0], rest_sd[1], grads)
        out[kind] = compare_steps(ro, rr, tolerance)
    return out


def compare_steps(ro, rr, tolerance, limits=False):
    """The pass criterion (module docstring) of one update, the same gradient in both runs:
    records `ro` (original) and `rr` (restored) of step_records. Returns dict(max_lr, excess,
    ok, worst = (param index, flat index)); with `limits`, also limits = [tolerance * lr +
    slack per coordinate] (float64, one tensor per parameter), the bound each |Delta_r -
    Delta_o| was held to."""
    max_lr, excess, worst, lims = 0.0, -math.inf, None, []
    for i, (o, r) in enumerate(zip(ro, rr)):
        d = ((r["theta1"].double() - r["theta0"].double())
             - (o["theta1"].double() - o["theta0"].double())).abs()
        big = torch.maximum(torch.maximum(o["theta0"].abs(), o["theta1"].abs()),
                            r["theta1"].abs())
        slack = 4 * _ulp32(big) + 8 * EPS32 * (o["A"] + r["A"])
        ex = d - (tolerance * o["lr"] + slack)
        if limits:
            lims.append(tolerance * o["lr"] + slack)
        max_lr = max(max_lr, float(d.max()) / o["lr"]) if d.numel() else max_lr
        if d.numel() and float(ex.max()) > excess:
            excess, worst = float(ex.max()), (i, int(ex.argmax()))
    out = dict(max_lr=max_lr, excess=excess, ok=excess <= 0.0, worst=worst)
    if limits:
        out["limits"] = lims
    return out


def sequence_kinds(fixture, model_sd, optim_sd, G, steps, seed=0):
    """OrderedDict kind -> function(s) giving the raw gradients of step s (1-based, optimizer
    order), each built to stress the every-update certificate (docs/design.md §1, "Every
    later update"), scaled per coordinate by sqrt(v0) of the ORIGINAL exp_avg_sq and clipped
    to [-G, G]:
      ramp10 / ramp100  a ramp aligned with exp_avg, c sqrt(v0 b2^P) (b1/b2)^(P-s), c = 10,
                        peaking at step P, zeros after
      spike             zeros for steps/3 steps (a long zero run), one 10 sqrt(v0 b2^s) step, zeros
      alternating       +-sqrt(v0) in turn
      noise             N(0, v0) each step
    Float32 gradients. The gradient is the one Adam sees (torch's grad after maximize's negation and Adam's
    L2 term); _multi_step turns it into each run's own .grad."""
    model, opt = build_pair(fixture, model_sd, optim_sd)
    ps = _params(opt)
    base = []
    for p, group in ps:
        st = opt.state[p]
        b1, b2 = group["betas"]
        sv = st["exp_avg_sq"].float().sqrt()
        sign = torch.where(st["exp_avg"] < 0, -1.0, 1.0)
        base.append((sv, sign * sv, b1, b2))   # sqrt(v0), sqrt(v0) signed as exp_avg
    finite = math.isfinite(G)
    clip = (lambda t: t.clamp(-G, G)) if finite else (lambda t: t)
    gen = torch.Generator().manual_seed(seed)
    noise_draws = {}
    zeros = [torch.zeros_like(sv) for sv, *_ in base]

    def ramp(P):
        def f(s):
            if s > P:
                return zeros
            return [clip(ssv * (10 * b2 ** (P / 2) * (b1 / b2) ** (P - s))) for sv, ssv, b1, b2 in base]
        return f

    def spike(s):
        at = steps // 3 + 1
        return [clip(ssv * (10 * b2 ** (s / 2))) for sv, ssv, b1, b2 in base] if s == at else zeros

    def alternating(s):
        return [clip(ssv if s % 2 else -ssv) for sv, ssv, *_ in base]

    def noise(s):
        if s not in noise_draws:
            noise_draws[s] = [clip(torch.randn(sv.shape, generator=gen) * sv)
                              for sv, *_ in base]
        return noise_draws.pop(s)

    return OrderedDict([("ramp10", ramp(10)), ("ramp100", ramp(100)), ("spike", spike),
                        ("alternating", alternating), ("noise", noise)])


def _bound_A(st, group, m0, geff):
    """A of the slack (module docstring) for one parameter after its step: state `st`, exp_avg
    before the step `m0`, the effective gradient `geff` (float64); float64, elementwise."""
    b1, b2 = group["betas"]
    t = float(st["step"])
    vm = st["max_exp_avg_sq"] if group["amsgrad"] else st["exp_avg_sq"]
    denom = (vm.double() / _bc(b2, t)).sqrt() + group["eps"]
    return (group["lr"] / _bc(b1, t)) * (b1 * m0.double().abs() + (1 - b1) * geff.abs()) / denom


def _multi_step(pairs, grads_of, steps, tolerance):
    """Step both (model, optimizer) pairs `steps` times with the same effective gradients;
    return (max |Delta_r - Delta_o| / lr, max excess over tolerance * lr + slack, worst).
    The slack (>= 0) is evaluated only for a parameter whose |Delta_r - Delta_o| exceeds
    tolerance * lr at that step, so a failing check reports its exact excess and place; a
    parameter within tolerance * lr contributes max |Delta_r - Delta_o| - tolerance * lr
    (<= 0, an upper bound of its exact excess). The differences are float64 (exact: a float32
    difference of nearby values)."""
    (mo, oo), (mr, orr) = pairs
    po, pr = _params(oo), _params(orr)
    max_lr, excess, worst = 0.0, -math.inf, None
    for s in range(1, steps + 1):
        geff = grads_of(s)
        before = []
        for ps, opt in ((po, oo), (pr, orr)):
            before.append([(p.detach().clone(), opt.state[p]["exp_avg"].clone()) for p, _ in ps])
            for (p, group), g in zip(ps, geff):
                raw = g
                if _is_l2(opt, group):  # the same g_eff for both runs, whatever their theta
                    raw = raw - group["weight_decay"] * p.detach().double()
                if group["maximize"]:
                    raw = -raw
                p.grad = raw.to(p.dtype, copy=True)   # (the optimizer may not write into g)
            opt.step()
        for i, ((p_o, group), (p_r, _), g, (o0, mo0), (r0, mr0)) in enumerate(zip(po, pr, geff, *before)):
            if not o0.numel():
                continue
            o1, r1 = p_o.detach(), p_r.detach()
            d = r1.double().sub_(r0.double()).sub_(o1.double().sub_(o0.double())).abs_()   # (one dtype: fast)
            lr = group["lr"]
            lim = tolerance * lr
            dmax = float(d.max())
            max_lr = max(max_lr, dmax / lr)
            if dmax <= lim:
                if dmax - lim > excess:
                    excess, worst = dmax - lim, (s, i, int(d.argmax()))
                continue
            big = torch.maximum(torch.maximum(o0.abs(), o1.abs()), r1.abs())
            slack = 4 * _ulp32(big.float()) + 8 * EPS32 * (
                _bound_A(oo.state[p_o], group, mo0, g) + _bound_A(orr.state[p_r], group, mr0, g))
            ex = d - (lim + slack)
            if float(ex.max()) > excess:
                excess, worst = float(ex.max()), (s, i, int(ex.argmax()))
    return max_lr, excess, worst


def fast_malloc():
    """Keep freed heap memory for reuse (glibc mallopt: no mmap per large tensor, no trim),
    so that the checks' float64 temporaries do not page-fault afresh at every step."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's largest on 64-bit)
    libc.mallopt(-1, 1 << 62)   # M_TRIM_THRESHOLD
    libc.mallopt(-2, 1 << 28)   # M_TOP_PAD


def multi_step_check(fixture, orig_sd, rest_sd, tolerance, G, steps=1000, seed=0):
    """Every sequence kind (sequence_kinds) for `steps` steps on both pairs; OrderedDict
    kind -> dict(max_lr, excess, ok, worst = (step, param index, flat index))."""
    out = OrderedDict()
    for kind, grads_of in sequence_kinds(fixture, orig_sd[0], orig_sd[1], G, steps, seed).items():
        pairs = (build_pair(fixture, *orig_sd), build_pair(fixture, *rest_sd))
        max_lr, excess, worst = _multi_step(pairs, grads_of, steps, tolerance)
        out[kind] = dict(max_lr=max_lr, excess=excess, ok=excess <= 0.0, worst=worst)
    return out


BENCH_FILES = ("resnet18_adamw.pt", "lm10m_adamw.pt")   # scripts/bench/train_bench_models.py


def fixture_of(path):
    """The fixture file name (key of ckpt_models.FIXTURES, or a bench checkpoint's name) that
    `path` was made from."""
    base = os.path.basename(path)
    for suffix in (".ckz.h5",):
        if base.endswith(suffix):
            base = base[:-len(suffix)]
    if base in cm.FIXTURES or base in BENCH_FILES:
        return base
    raise BadInput(f"{path}: not a known fixture ({', '.join(cm.FIXTURES)}); pass --fixture")


def check_pair(orig, restored, tolerance=0.01, grad_bound=1.0, fixture=None, weights=None,
               check_zeros=False, seed=0, steps=0):
    """Full torch-side check of one (original, restored) pair.

    Returns (errors, step_results): `errors` lists non-moment differences (must be empty),
    `step_results` maps gradient kind -> dict(max_lr, excess, ok, worst).
    """
    fixture = fixture or fixture_of(orig)
    if weights is None and fixture in cm.WEIGHTS_OF:
        weights = os.path.join(os.path.dirname(os.path.abspath(orig)), cm.WEIGHTS_OF[fixture])
    o_obj, r_obj = load_any(orig), load_any(restored)
    errors = compare_checkpoints(o_obj, r_obj, check_zeros=check_zeros)
    if any("structure differs" in e or "dtype/shape" in e or "tensor vs" in e for e in errors):
        return errors, OrderedDict()  # the states cannot be loaded side by side
    o_sd = split_state(o_obj, orig, weights)
    r_sd = split_state(r_obj, restored, weights)
    # After the stock load, tied weights must still be one Parameter in the model.
    for sd in (o_sd, r_sd):
        model, _ = build_pair(fixture, *sd)
        if isinstance(model, cm.ByteLM) and model.tok.weight.data_ptr() != model.head.weight.data_ptr():
            errors.append("tied tok.weight/head.weight no longer share storage after load")
    res = step_check(fixture, o_sd, r_sd, tolerance, grad_bound, seed)
    if steps > 0:
        for kind, r in multi_step_check(fixture, o_sd, r_sd, tolerance, grad_bound, steps, seed).items():
            res[f"{kind} x{steps}"] = r
    return errors, res


def main(argv=None):
    """CLI: print the max |Delta| in lr units per gradient kind; exit 0 pass, 1 fail, 2 bad input."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("orig")
    ap.add_argument("restored")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--grad-bound", type=float, default=1.0, help="per-coordinate |g| bound, or inf")
    ap.add_argument("--fixture", help="fixture name from ckpt_models.FIXTURES (default: ORIG's name)")
    ap.add_argument("--weights", help="full checkpoint holding the model weights (optimizer-only files)")
    ap.add_argument("--check-zeros", action="store_true", help="exact zeros must stay exact (log8)")
    ap.add_argument("--steps", type=int, default=0,
                    help="also run gradient sequences of this many steps (the --horizon all certificate)")
    args = ap.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    fast_malloc()
    try:
        errors, res = check_pair(args.orig, args.restored, args.tolerance, args.grad_bound,
                                 args.fixture, args.weights, args.check_zeros, steps=args.steps)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for e in errors:
        print(f"FAIL non-moment: {e}")
    print(f"{'gradient':16s} {'max|dTheta|/lr':>16s}  tolerance={args.tolerance} G={args.grad_bound}")
    for kind, r in res.items():
        print(f"{kind:16s} {r['max_lr']:16.3e}  {'ok' if r['ok'] else 'FAIL at ' + str(r['worst'])}")
    ok = not errors and all(r["ok"] for r in res.values())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
