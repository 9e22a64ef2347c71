#!/usr/bin/python3
"""Write a large torch.save-format AdamW checkpoint without holding it in memory.

    /usr/bin/python3 scripts/make_big_checkpoint.py --gib 4 -o /tmp/big.pt [--check]

Layout (what torch.save of {"model": ..., "optimizer": ..., "epoch": 1} writes in torch 1.13):
a ZIP_STORED archive "<prefix>/data.pkl", "<prefix>/data/<key>", "<prefix>/version".

How it streams: the pickle (data.pkl) is produced by torch's own serializer
(torch.serialization._save) over a skeleton whose big tensors are `torch.empty` (virtual
memory, never touched); a fake zip writer captures data.pkl and the storage names and sizes
instead of the bytes. The archive is then written with Python's zipfile (zip64 where needed),
each big storage streamed in 4 MiB chunks generated from a fixed random pool (parameters
N(0, 0.02), exp_avg N(0, 1e-3), exp_avg_sq = exp_avg^2 * U(1, 4) + 1e-12), so peak memory is a
few chunk buffers whatever --gib is. Small storages (the step counters) are the real bytes.

The total file size is >= --gib GiB (parameters + two moments, 12 bytes per coordinate).
--check loads the result with torch.load (only sensible for small --gib) and checks shapes and
a sample of values against the generator.
"""
import argparse
import ctypes
import io
import os
import sys
import zipfile

import numpy as np
import torch

CHUNK = 1 << 20           # float32 elements per generated chunk (4 MiB)
MAX_TENSOR = 1 << 26      # float32 elements per parameter (256 MiB)


class _Pool:
    """Deterministic value source: chunk i of kind k is a rolled, scaled view of a fixed pool."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.param = (rng.standard_normal(CHUNK) * 0.02).astype(np.float32)
        m = rng.standard_normal(CHUNK) * 1e-3
        self.exp_avg = m.astype(np.float32)
        self.exp_avg_sq = (m * m * rng.uniform(1, 4, CHUNK) + 1e-12).astype(np.float32)

    def chunk(self, kind, tensor_index, i, n):
        base = getattr(self, kind)
        shift = (tensor_index * 7919 + i * 104729) % CHUNK
        scale = np.float32(1.0 + 0.25 * ((tensor_index + i) % 5))
        c = np.roll(base, shift)[:n] * scale
        if kind == "exp_avg_sq":
            c = c * scale  # keep v ~ m^2 under the same scale
        return c


class _CaptureWriter:
    """Stands in for torch's PyTorchFileWriter: records what _save would write."""

    def __init__(self):
        self.records = []  # (name, data_ptr or bytes, nbytes)

    def write_record(self, name, data, nbytes):
        self.records.append((name, data, nbytes))


def plan_shapes(gib):
    """Parameter element counts so that 12 bytes per coordinate reach >= gib GiB."""
    total = int(gib * (1 << 30) + 11) // 12
    shapes = []
    while total > 0:
        n = min(MAX_TENSOR, total)
        n = max(n, 1)
        shapes.append(n)
        total -= n
    return shapes


def build_skeleton(shapes):
    """state_dict-like object whose big tensors are untouched torch.empty; returns (obj, ptrs)
    where ptrs maps each big storage's data_ptr to (kind, tensor index, numel)."""
    model, state, ptrs = {}, {}, {}
    for i, n in enumerate(shapes):
        rows = 1024 if n % 1024 == 0 else 1
        p = torch.empty((rows, n // rows), dtype=torch.float32)
        m = torch.empty((rows, n // rows), dtype=torch.float32)
        v = torch.empty((rows, n // rows), dtype=torch.float32)
        model[f"layers.{i}.weight"] = p
        state[i] = {"step": torch.tensor(1000.0), "exp_avg": m, "exp_avg_sq": v}
        for kind, t in (("param", p), ("exp_avg", m), ("exp_avg_sq", v)):
            ptrs[t.data_ptr()] = (kind, i, n)
    groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
               "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
               "params": list(range(len(shapes)))}]
    obj = {"model": model, "optimizer": {"state": state, "param_groups": groups}, "epoch": 1}
    return obj, ptrs


def write(path, gib, seed=0, prefix="archive"):
    shapes = plan_shapes(gib)
    obj, ptrs = build_skeleton(shapes)
    cap = _CaptureWriter()
    import pickle
    torch.serialization._save(obj, cap, pickle, 2)
    pool = _Pool(seed)
    tmp = path + ".tmp"
    written = 0
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, data, nbytes in cap.records + [("version", b"3\n", 2)]:
            zi = zipfile.ZipInfo(f"{prefix}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_STORED
            zi.file_size = nbytes
            with zf.open(zi, "w", force_zip64=nbytes >= (1 << 31)) as out:
                if isinstance(data, (bytes, bytearray)):
                    out.write(bytes(data[:nbytes]))
                elif data in ptrs:
                    kind, ti, n = ptrs[data]
                    assert n * 4 == nbytes, (name, n, nbytes)
                    for k, i0 in enumerate(range(0, n, CHUNK)):
                        out.write(pool.chunk(kind, ti, k, min(CHUNK, n - i0)).tobytes())
                else:  # a small real storage (step counter)
                    assert nbytes <= 1 << 16, (name, nbytes)
                    out.write(ctypes.string_at(data, nbytes))
            written += nbytes
    os.replace(tmp, path)
    return shapes


def check(path, shapes, seed=0):
    """torch.load the file and compare shapes and sampled chunks with the generator."""
    obj = torch.load(path)
    pool = _Pool(seed)
    assert sorted(obj.keys()) == ["epoch", "model", "optimizer"]
    st = obj["optimizer"]["state"]
    assert len(st) == len(shapes) == len(obj["model"])
    for i, n in enumerate(shapes):
        p = obj["model"][f"layers.{i}.weight"]
        assert p.numel() == n and p.dtype == torch.float32
        for kind, t in (("param", p), ("exp_avg", st[i]["exp_avg"]), ("exp_avg_sq", st[i]["exp_avg_sq"])):
            flat = t.reshape(-1).numpy()
            k_last = (n - 1) // CHUNK
            for k in sorted({0, k_last}):
                i0 = k * CHUNK
                want = pool.chunk(kind, i, k, min(CHUNK, n - i0))
                assert np.array_equal(flat[i0:i0 + len(want)], want), (kind, i, k)
        assert float(st[i]["step"]) == 1000.0
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0, help="total size in GiB (>= this)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="torch.load it afterwards (small --gib only)")
    a = ap.parse_args()
    if not a.gib > 0:
        ap.error("--gib must be positive")
    shapes = write(a.output, a.gib, a.seed)
    size = os.path.getsize(a.output)
    print(f"{a.output}: {size} bytes ({size / (1 << 30):.3f} GiB), {len(shapes)} parameters, "
          f"{sum(shapes)} coordinates", file=sys.stderr)
    if a.check:
        check(a.output, shapes, a.seed)
        print(f"{a.output}: torch.load ok, values match the generator", file=sys.stderr)


if __name__ == "__main__":
    main()
