#!/usr/bin/python3
"""Stream a large synthetic torch.save-compatible checkpoint to disk in bounded memory.

  /usr/bin/python3 scripts/gen_checkpoint.py --gib N -o FILE [--numel-per-tensor K] [--seed S]

Writes `{"model": OrderedDict, "optimizer": {"state", "param_groups"}, "epoch": 0}` (AdamW,
torch 1.13 layout: 0-d float `step` = 200, exp_avg, exp_avg_sq; lr 1e-3, betas (0.9, 0.95), weight decay 0.1 as
the LM recipes) as an uncompressed ZIP64 archive
with `FILE-stem/data.pkl`, `data/<key>` and `version`, the same entries torch.save writes, so
`torch.load` and ckpt-compress read it. Every entry's data starts on a 64-byte boundary, padded
with an "FB" extra field as torch.save's writer pads it (caffe2/serialize/inline_container.cc,
kFieldAlignment; every real torch file in data/ has it). Values are generated chunk by chunk (4 Mi floats at a
time) and never held whole: parameters ~ N(0, 0.02), exp_avg_sq log-normal around
3e-7 * s^2 (sigma 1.5 in ln), exp_avg = sqrt(exp_avg_sq) * clip(N(0, 0.2^2), -0.6, 0.6) (m and v
of a coordinate drawn from the same stream; median v and |m|/sqrt(v) as in data/lm_adamw.pt)
with a per-tensor scale s in [0.1, 10]. The total file size is N GiB (+ headers):
N * 2^30 / 12 parameters, each with a weight, exp_avg and exp_avg_sq.
Used by scripts/bench_codec.sh for the peak-RSS rows (a bench helper, not a fixture).
"""
import argparse
import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np
import torch

CHUNK = 1 << 22


class _StorageRef:
    """Placeholder pickled as a persistent id ('storage', FloatStorage, key, 'cpu', numel)."""

    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class _TensorRef:
    """Placeholder pickled as torch._utils._rebuild_tensor_v2(storage, 0, size, stride, ...)."""

    def __init__(self, storage, shape):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce__(self):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.insert(0, acc)
            acc *= d
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(stride), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    """Pickler that emits torch's persistent storage ids for _StorageRef objects."""

    def persistent_id(self, obj):
        """Return torch's storage tuple for placeholders, None for everything else."""
        if isinstance(obj, _StorageRef):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None


def aligned_entry(zf, name, zip64):
    """ZipInfo for entry `name`, about to be written at zf's position, whose data starts on a
    64-byte boundary: an "FB" extra field of 'Z' bytes after the fixed header (30 bytes), the
    name and, for a ZIP64 entry, the zip64 extra field that zipfile adds (20 bytes)."""
    zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    zi.compress_type = zipfile.ZIP_STORED
    start = zf.fp.tell() + 30 + len(name.encode()) + (20 if zip64 else 0) + 4
    pad = -start % 64
    zi.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    return zi


def plan(gib, per_tensor):
    """List of parameter shapes whose weights + 2 moments total `gib` GiB of FP32."""
    total = int(gib * (1 << 30)) // 12
    shapes = []
    while total > 0:
        n = min(per_tensor, total)
        cols = 8192 if n % 8192 == 0 else 1
        shapes.append((n // cols, cols) if cols > 1 else (n,))
        total -= n
    return shapes


def main():
    """Build the pickle from placeholders, then stream every storage into the zip."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--numel-per-tensor", type=int, default=1 << 26)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    shapes = plan(a.gib, a.numel_per_tensor)
    storages = []  # (key, numel, kind, param index)

    def tensor(shape, kind, idx):
        numel = int(np.prod(shape)) if shape else 1
        ref = _StorageRef(str(len(storages)), numel)
        storages.append((ref.key, numel, kind, idx))
        return _TensorRef(ref, shape)

    model = collections.OrderedDict()
    for i, s in enumerate(shapes):
        model[f"layers.{i}.weight"] = tensor(s, "param", i)
    state = {}
    for i, s in enumerate(shapes):
        state[i] = {"step": tensor((), "step", i), "exp_avg": tensor(s, "m", i),
                    "exp_avg_sq": tensor(s, "v", i)}
    groups = [{"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
               "params": list(range(len(shapes)))}]
    obj = {"model": model, "optimizer": {"state": state, "param_groups": groups}, "epoch": 0}
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    prefix = os.path.splitext(os.path.basename(a.output))[0]
    tmp = a.output + ".tmp"
    scale = np.random.default_rng(a.seed).uniform(-1, 1, len(shapes))
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr(aligned_entry(zf, f"{prefix}/data.pkl", False), buf.getvalue())
        for key, numel, kind, idx in storages:
            rng = np.random.default_rng([a.seed, idx])  # m and v of a param share the stream
            s = 10.0 ** scale[idx]
            with zf.open(aligned_entry(zf, f"{prefix}/data/{key}", True), "w", force_zip64=True) as f:
                if kind == "step":
                    f.write(np.array([200.0], "<f4").tobytes())
                    continue
                if kind == "param":
                    rng = np.random.default_rng([a.seed, idx, 7])
                for off in range(0, numel, CHUNK):
                    n = min(CHUNK, numel - off)
                    if kind == "param":
                        x = rng.standard_normal(n, np.float32) * np.float32(0.02)
                    else:
                        # v log-normal around 3e-7 * s^2; m = sqrt(v) * clip(N(0, 0.2^2), +-0.6)
                        v = np.exp(rng.standard_normal(n, np.float32) * np.float32(1.5)) \
                            * np.float32(3e-7 * s * s)
                        m = np.sqrt(v) * np.clip(rng.standard_normal(n, np.float32)
                                                 * np.float32(0.2), -0.6, 0.6)
                        x = m if kind == "m" else v
                    f.write(x.astype("<f4", copy=False).tobytes())
        zf.writestr(aligned_entry(zf, f"{prefix}/version", False), "3\n")
    os.replace(tmp, a.output)
    print(f"{a.output}: {os.path.getsize(a.output)} bytes, {len(shapes)} parameters "
          f"({sum(int(np.prod(s)) for s in shapes)} values each for weight/exp_avg/exp_avg_sq)")


if __name__ == "__main__":
    main()
