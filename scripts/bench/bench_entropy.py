#!/usr/bin/python3
"""vlog's entropy coder against zstd over the same integer codes (codec issue: "measure it
against zstd over the raw codes and keep what wins").

  /usr/bin/python3 scripts/bench/bench_entropy.py CHECKPOINT [CHECKPOINT ...] [--bin build/apps]

For each checkpoint: `ckpt-compress` (vlog, defaults) into a temporary container, then the
uint16 codes of every coded parameter are rebuilt in numpy from the ORIGINAL moment bytes
(read at the manifest's source offsets) and the container's block parameters, with the
rule of formats/container.md (nearest index on the 2^(e/1024) grid; a handful of float64
tie-breaks may differ from the C++ encoder, which does not matter for sizes), escaped
coordinates as code 0, exactly as the segments hold them. Sizes, per moment: the stored
rANS segments (`/moments/codes/<role>` plus `/moments/segments/<role>`), `zstd -3` and
`zstd -19` of the same codes as little-endian uint16, and the order-0 entropy per
parameter (the bound for any coder with one table per parameter). Prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import make_bad_containers as mbc  # noqa: E402

ROLES = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def zigzag(j):
    return np.where(j >= 0, 2 * j, -2 * j - 1)


def codes_of(src, man, f):
    """Per role: the concatenated uint16 codes of all coded F32 parameters, and the sum of
    per-parameter order-0 entropies (bits)."""
    st = man["storages"]
    pars = {r: mbc.read_dataset(f["moments/params/" + r]).reshape(-1, 2).astype(np.int64)
            for r in ROLES if "moments/params/" + r in f}
    idx = mbc.read_dataset(f["moments/escapes/index"]).astype(np.int64)
    out = {r: [] for r in pars}
    ent = {r: 0.0 for r in pars}
    for p in man["params"]:
        if p["dtype"] != "F32":
            continue
        n, nm = p["numel"], 3 if p["hyper"]["amsgrad"] else 2
        blk = np.arange(n) // 64 + p["block_offset"]
        esc = np.cumsum(idx[p["escape_offset"]:p["escape_offset"] + p["escapes"]])
        vals = []
        for k in range(nm):
            s = st[p["storage"][k]]
            vals.append(np.frombuffer(src, np.float32, n, s["offset"]).astype(np.float64))
        vdec, jv = None, None
        for k in ([1, 2, 0] if nm == 3 else [1, 0]):
            x = vals[k]
            pr = pars[ROLES[1 if k == 2 else k]][blk]  # max_exp_avg_sq: on exp_avg_sq's grid
            if k >= 1:
                with np.errstate(divide="ignore", invalid="ignore"):
                    j = np.rint((1024 * np.log2(x) - 16 * pr[:, 0]) / pr[:, 1])
                j = np.nan_to_num(j, nan=0, posinf=0, neginf=0).astype(np.int64)
                if k == 1:
                    jv = np.where(x > 0, j, 0)
                    c = np.where(x > 0, 1 + zigzag(j), 0)
                else:  # relative to exp_avg_sq's index
                    c = np.where(x > 0, 1 + zigzag(j - jv), 0)
                dec = np.where(x > 0, np.exp2((16 * pr[:, 0] + j * pr[:, 1]) / 1024), 0.0)
                vdec = dec if vdec is None else np.maximum(vdec, dec)
            else:
                d = np.exp2(pr[:, 0] / 1024) * np.sqrt(vdec)
                with np.errstate(divide="ignore", invalid="ignore"):
                    q = np.nan_to_num(np.rint(np.abs(x) / d), nan=0, posinf=0).astype(np.int64)
                c = 2 * q + np.signbit(x)
            c = np.clip(c, 0, 65535).astype(np.uint16)
            c[esc] = 0
            out[ROLES[k]].append(c)
            _, cnt = np.unique(c, return_counts=True)
            pr_ = cnt / cnt.sum()
            ent[ROLES[k]] += float(-(cnt * np.log2(pr_)).sum())
    return {r: np.concatenate(v) if v else np.zeros(0, np.uint16) for r, v in out.items()}, ent


def zstd_size(data, level):
    with tempfile.NamedTemporaryFile() as t:
        t.write(data.astype("<u2").tobytes())
        t.flush()
        r = subprocess.run(["zstd", f"-{level}", "-T1", "-q", "-c", t.name], capture_output=True, check=True)
        return len(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "apps"))
    a = ap.parse_args()
    rows = []
    for path in a.checkpoints:
        with tempfile.TemporaryDirectory() as d:
            ct = os.path.join(d, "c.ckz.h5")
            subprocess.run([os.path.join(a.bin, "ckpt-compress"), path, "-o", ct, "--json"], check=True,
                           capture_output=True)
            src = open(path, "rb").read()
            with h5py.File(ct, "r") as f:
                man = mbc.get_manifest(f)
                codes, ent = codes_of(src, man, f)
                for r, c in codes.items():
                    if not c.size:
                        continue
                    rans = f["moments/codes/" + r].id.get_storage_size() + f["moments/segments/" + r].id.get_storage_size()
                    z3, z19 = zstd_size(c, 3), zstd_size(c, 19)
                    n = c.size
                    rows.append(dict(input=os.path.basename(path), role=r, values=n, rans=8 * rans / n,
                                     zstd3=8 * z3 / n, zstd19=8 * z19 / n, entropy=ent[r] / n))
    print("| checkpoint | moment | values | rANS segments | zstd -3 | zstd -19 | order-0 entropy |")
    print("|---|---|---|---|---|---|---|")
    for x in rows:
        print(f"| `{x['input']}` | {x['role']} | {x['values']:,} | {x['rans']:.3f} | {x['zstd3']:.3f} | "
              f"{x['zstd19']:.3f} | {x['entropy']:.3f} |")
    print("\n(bits per value)")
    json.dump(rows, sys.stderr)


if __name__ == "__main__":
    main()
