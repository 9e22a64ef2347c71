#!/usr/bin/python3
"""Write a synthetic H100-scale ckptkit trace (formats/trace.md) for planner benchmarks.

Usage: synth_trace.py --pattern sparse-write|dense-queue -o TRACE.json [--layers N]
                      [--state-every K] [--seed S] [--row-bytes R --field-bytes F]
                      [--segments N]

--segments N (planner speed benchmarks): exactly N segments in all, the same layer/state
pattern continued (or cut) as needed; overrides --layers.

Sizes (defaults; all documented in docs/replay.md):
  fixed memory  1.3e9 parameters, bf16 weights + bf16 grads + fp32 master/m/v (12 B):
                2.6e9 + 2.6e9 + 15.6e9 bytes (19.37 GiB).
  layer segment (N = 32): hidden state 8 x 2048 x 1536 bf16 = 48 MiB in/out, 0.75 GiB saved
                activations, 0.25 GiB transient, forward 4 ms, backward 8 ms; every time
                scaled by a seeded factor in [0.8, 1.2] (layers are not all equal).
  state segment (after every K = 4 layers, 8 in all): a retrieval layer over its own
                buffer; saved 2.5 GiB (attention scores against the buffer), forward 3 ms,
                backward 6 ms, 0.25 GiB transient;
    sparse-write: reads its own 1 GiB memory bank, writes 4096 rows of 3 KiB (12 MiB) at a
                  ring pointer (4 regions of 1024 contiguous rows) + an 8-byte pointer;
    dense-queue:  reads its own 16 MiB queue of R-byte rows and rewrites every row's first F
                  bytes (the key; the rest of the row, e.g. a sample id, is unchanged), so the
                  written regions are one per row.
  device: copy bandwidth 1000 GB/s (H100 device-to-device copies).
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_trace import write_json_atomic  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20


def synth(pattern, layers=32, state_every=4, seed=0, row_bytes=64, field_bytes=56,
          segments_total=None):
    """Return the trace dict. Deterministic for a given seed. segments_total: exactly that
    many segments (layers as needed, the pattern cut after the last one)."""
    if segments_total is not None:
        layers = segments_total
    rng = random.Random(seed)
    hidden = 8 * 2048 * 1536 * 2
    segments, buffers = [], []
    n_state = 0
    for i in range(layers):
        f = rng.uniform(0.8, 1.2)
        segments.append({"name": f"layer{i}", "forward_ms": round(4.0 * f, 4),
                         "backward_ms": round(8.0 * f, 4), "saved_bytes": int(0.75 * GiB * f),
                         "input_bytes": hidden, "output_bytes": hidden,
                         "transient_bytes": GiB // 4, "state": [], "rng": []})
        if (i + 1) % state_every:
            continue
        name = f"{'bank' if pattern == 'sparse-write' else 'queue'}{n_state}"
        seg = {"name": name, "forward_ms": 3.0, "backward_ms": 6.0, "saved_bytes": 5 * GiB // 2,
               "input_bytes": hidden, "output_bytes": hidden, "transient_bytes": GiB // 4,
               "state": [], "rng": []}
        if pattern == "sparse-write":
            size, row = GiB, 3 * 1024
            rows = size // row
            start = (n_state * 37 * 1024) % rows
            regions = []
            for k in range(4):      # 4 runs of 1024 rows, ring-wrapped
                r0 = (start + k * 8192) % rows
                r0 = min(r0, rows - 1024)   # a run never crosses the end (many banks)
                regions.append([r0 * row, 1024 * row])
            regions.sort()
            buffers += [{"id": f"{name}.mem", "bytes": size}, {"id": f"{name}.ptr", "bytes": 8}]
            seg["state"] = [
                {"buffer": f"{name}.mem", "read": True, "version_read": 0, "version_written": 1,
                 "bytes_read": size, "bytes_written": size, "regions": regions},
                {"buffer": f"{name}.ptr", "read": True, "version_read": 0, "version_written": 1,
                 "bytes_read": 8, "bytes_written": 8, "regions": [[0, 8]]}]
        else:
            size = 16 * MiB
            regions = [[r * row_bytes, field_bytes] for r in range(size // row_bytes)]
            buffers.append({"id": f"{name}.queue", "bytes": size})
            seg["state"] = [{"buffer": f"{name}.queue", "read": True, "version_read": 0,
                             "version_written": 1, "bytes_read": size, "bytes_written": size,
                             "regions": regions}]
        segments.append(seg)
        n_state += 1
    if segments_total is not None:
        segments = segments[:segments_total]
        used = {a["buffer"] for s in segments for a in s["state"]}
        buffers = [b for b in buffers if b["id"] in used]
    return {"format": "ckptkit-trace", "format_version": 1,
            "source": f"synth_trace.py {pattern} layers={layers} seed={seed}",
            "model": f"synthetic-{pattern}-h100", "device": {"name": "H100 (synthetic)", "copy_gbps": 1000.0},
            "fixed": {"param_bytes": 2_600_000_000, "grad_bytes": 2_600_000_000,
                      "optimizer_bytes": 15_600_000_000},
            "backward_order": [s["name"] for s in reversed(segments)],
            "buffers": buffers, "segments": segments}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pattern", choices=["sparse-write", "dense-queue"], required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--state-every", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row-bytes", type=int, default=64, help="dense-queue row size")
    ap.add_argument("--field-bytes", type=int, default=56, help="dense-queue bytes rewritten per row")
    ap.add_argument("--segments", type=int, default=None,
                    help="exactly N segments in all (overrides --layers; speed benchmarks)")
    a = ap.parse_args()
    if not 0 < a.field_bytes <= a.row_bytes:
        print("synth_trace: error: need 0 < field-bytes <= row-bytes", file=sys.stderr)
        return 2
    if a.segments is not None and a.segments < 1:
        print("synth_trace: error: need --segments >= 1", file=sys.stderr)
        return 2
    write_json_atomic(synth(a.pattern, a.layers, a.state_every, a.seed, a.row_bytes,
                            a.field_bytes, a.segments), a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
