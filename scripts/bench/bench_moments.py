#!/usr/bin/python3
"""Write the raw FP32 Adam moments of a checkpoint to one flat file (bench_codec.sh helper).

  /usr/bin/python3 scripts/bench/bench_moments.py CHECKPOINT OUT.bin

Concatenates, in optimizer state order, every `exp_avg`, `exp_avg_sq` and `max_exp_avg_sq`
as little-endian float32 (exactly the values ckpt-compress counts as `moment_values`), so
zstd and a plain copy can be timed over the very same bytes the codec encodes.
Prints `{"moment_values": N, "bytes": 4N}` as JSON on stdout.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # scripts/: torch_step_check
from torch_step_check import read_safetensors, safe_torch_load  # noqa: E402

MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def moment_tensors(path):
    """Yield the moment tensors of a torch.save or safetensors checkpoint."""
    if path.endswith(".safetensors"):
        tensors, _ = read_safetensors(path)
        for name, t in tensors.items():
            if name.startswith("state.") and name.rsplit(".", 1)[-1] in MOMENTS:
                yield t
        return
    obj = safe_torch_load(path)
    opt = obj.get("optimizer", obj) if isinstance(obj, dict) else None
    if not isinstance(opt, dict) or "state" not in opt:
        raise SystemExit(f"{path}: no optimizer state found")
    for _, st in opt["state"].items():
        for k in MOMENTS:
            if k in st:
                yield st[k]


def main():
    """Extract and write the moments; print the count."""
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    n = 0
    with open(sys.argv[2], "wb") as f:
        for t in moment_tensors(sys.argv[1]):
            a = t.detach().float().contiguous().numpy().astype("<f4", copy=False)
            a.tofile(f)
            n += a.size
    print(json.dumps({"moment_values": n, "bytes": 4 * n}))


if __name__ == "__main__":
    main()
