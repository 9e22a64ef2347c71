#!/usr/bin/env python3
"""DCP async_save / load through torch's FileSystemWriter, torch's writer with its ZStandard
extension, and ckptkit.dcp.FileSystemWriter: 4 ranks, one model + AdamW state.

  .venv/bin/python scripts/bench/bench_dcp_writer.py [--width 2048] [--depth 10] [--out DIR]

4 gloo ranks on this machine's cores (oversubscribed on 2 cores: the table says how many),
FSDP2 (fully_shard per Linear and the root) over nn.Sequential(depth x Linear(width, width)),
AdamW (lr 1e-3, weight decay 0.01) trained --steps (3) steps on random data, then per writer in fresh
processes: dcp.async_save(get_state_dict(..., flatten_optimizer_state_dict=True)) with a second
gloo group, timed from the call to its return (blocking) and to fut.result() (total); the folder's
bytes; dcp.load of it into the same ranks' state dict (torch's reader, or ckptkit's); per rank the
growth of peak RSS (ru_maxrss) over the peak before the save, through the save and through the
load. Figures: the slowest rank's times, the largest rank's RSS growth; ratios to torch's writer
in the same run; --load-reps N loads each folder N times (median of the slowest rank's). Prints one
markdown table (docs/benchmarks.md).
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts", "fixtures"))
WRITERS = ("torch", "torch+zstd", "ckptkit")
WORLD = 4


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rank(rank, world, store, kind, folder, outdir, width, depth, steps, load_reps=1):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn as nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    import ckptkit.dcp
    import make_dcp_torch2 as m2
    m2._init_pg(rank, world, store)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
    mesh = init_device_mesh("cpu", (world,))
    fully_shard = m2._fully_shard()
    for m in model:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, width, generator=g)
        (model(x) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    msd, osd = get_state_dict(model, opt, options=options)
    sd = {"model": msd, "optim": osd}
    pg = dist.new_group(backend="gloo")
    if kind == "ckptkit":
        writer, reader = ckptkit.dcp.FileSystemWriter(folder), ckptkit.dcp.FileSystemReader(folder)
    else:
        from torch.distributed.checkpoint._extension import ZStandard
        ext = [ZStandard()] if kind == "torch+zstd" else None
        writer, reader = dcp.FileSystemWriter(folder, _extensions=ext), dcp.FileSystemReader(folder)
    dist.barrier()
    r0 = _rss_mib()
    t0 = time.perf_counter()
    fut = dcp.async_save(sd, storage_writer=writer, process_group=pg)
    t_block = time.perf_counter() - t0
    fut.result()
    t_total = time.perf_counter() - t0
    r1 = _rss_mib()
    dist.barrier()
    msd, osd = get_state_dict(model, opt, options=options)
    sd = {"model": msd, "optim": osd}
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(sd, storage_reader=reader)
    t_load = time.perf_counter() - t0
    r2 = _rss_mib()
    loads = [t_load]
    for _ in range(load_reps - 1):   # --load-reps: the same load again
        msd, osd = get_state_dict(model, opt, options=options)
        sd = {"model": msd, "optim": osd}
        reader.reset(folder)
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(sd, storage_reader=reader)
        loads.append(time.perf_counter() - t0)
    with open(os.path.join(outdir, f"{kind}.{rank}.json"), "w") as f:
        json.dump({"block": t_block, "total": t_total, "load": t_load, "rss_save": r1 - r0, "rss_load": r2 - r1,
                   "loads": loads, "params": sum(p.numel() for p in model.parameters())}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3, help="AdamW steps before the saves")
    ap.add_argument("--writers", default=",".join(WRITERS), help="comma-separated subset of " + ",".join(WRITERS))
    ap.add_argument("--load-reps", type=int, default=1, help="loads per writer (the median of the slowest rank's is printed)")
    ap.add_argument("--out", default=None, help="folder for the checkpoints (default: a temporary one)")
    a = ap.parse_args()
    import make_dcp_torch2 as m2
    out = a.out or tempfile.mkdtemp(prefix="bench-dcp-")
    os.makedirs(out, exist_ok=True)
    rows = {}
    for kind in a.writers.split(","):
        folder = os.path.join(out, kind.replace("+", "_"))
        shutil.rmtree(folder, ignore_errors=True)
        m2.ranks(_rank, WORLD, out, kind, folder, out, a.width, a.depth, a.steps, a.load_reps)
        per = [json.load(open(os.path.join(out, f"{kind}.{r}.json"))) for r in range(WORLD)]
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
        row = {k: max(p[k] for p in per) for k in ("block", "total", "load", "rss_save", "rss_load")}
        row["bytes"] = size
        row["load_med"] = statistics.median(max(p["loads"][i] for p in per) for i in range(a.load_reps))
        if kind == "ckptkit":
            man = json.load(open(os.path.join(folder, "ckptkit-folder.json")))
            row["moment_bytes"] = sum(f["size"] for f in man["files"] if f.get("virtual"))
        rows[kind] = row
        if kind != "ckptkit":
            shutil.rmtree(folder, ignore_errors=True)
    p = per[0]["params"]   # DTensor numel is the global count
    state_mb = 12 * p / 1e6
    t = rows["torch"]
    print(f"{WORLD} ranks on {os.cpu_count()} cores; {p / 1e6:.1f}M fp32 parameters + AdamW: a {state_mb:.0f} MB state "
          f"(moments {8 * p / 1e6:.0f} MB)\n")
    print("| writer | async_save blocking s | total s | folder MB | bytes / torch | load s | load / torch | "
          "peak RSS growth per rank, save / load MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, r in rows.items():
        print(f"| {kind} | {r['block']:.2f} ({r['block'] / t['block']:.2f}x) | {r['total']:.2f} | {r['bytes'] / 1e6:.1f} | "
              f"{r['bytes'] / t['bytes']:.3f} | {r['load']:.2f} | {r['load'] / t['load']:.2f}x | "
              f"{r['rss_save']:.0f} / {r['rss_load']:.0f} |")
    if a.load_reps > 1:
        print(f"\nload, median of {a.load_reps}: " + ", ".join(f"{k} {r['load_med']:.3f} s ({r['load_med'] / t['load_med']:.2f}x)"
                                                         for k, r in rows.items()))
    c = rows["ckptkit"]
    print(f"\nckptkit: moments {c['moment_bytes'] / 1e6:.1f} MB = {c['moment_bytes'] / (8 * p):.3f}x of their fp32 bytes")


if __name__ == "__main__":
    main()
