#!/usr/bin/python3
"""Recording time of ckptkit.replay.record against one plain training step (issue 46: at most
5x a plain step plus the replay probe). Per model: the median forward + backward and the
median training step (forward + backward + Adam's step: record() runs the optimizer's step
too), 3 runs after a warm-up; record()'s total and its phases (segment discovery, the
op-logged step, the probe, the memory step with optimizer.step), and (total - probe) over each.

Usage: bench_replay_record.py [--threads N]   (package from $CKPTKIT_PYTHONPATH or build/python)
"""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("CKPTKIT_PYTHONPATH") or os.path.join(HERE, "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "models"))
from ckptkit.replay import _record  # noqa: E402
import nanogpt  # noqa: E402


def models():
    import torchvision
    F = torch.nn.functional
    for name, bs in (("resnet18", 16), ("mobilenet_v2", 16), ("efficientnet_b0", 16)):
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)(num_classes=10)
        b = (torch.randn(bs, 3, 32, 32), torch.randint(0, 10, (bs,)))
        yield f"{name} batch {bs} 32x32", m, b, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    m, b, lf = nanogpt.build()
    yield "nanoGPT (2 layers, 32 wide) batch 8 x 16", m, b, lf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print("| model | fwd+bwd ms | + Adam step ms | record s | segments / op-logged step / probe / memory+opt s "
          "| (record - probe) / fwd+bwd | / training step |")
    print("|---|---|---|---|---|---|---|")
    for name, model, batch, loss_fn in models():
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn(model, batch).backward()
        opt.step()   # the Adam state exists, as in training (record() restores the model after)
        fb, full = [], []
        for _ in range(3):
            t = time.perf_counter()
            loss_fn(model, batch).backward()
            t1 = time.perf_counter()
            opt.step()
            opt.zero_grad()
            t2 = time.perf_counter()
            fb.append(t1 - t)
            full.append(t2 - t)
        step, train = statistics.median(fb), statistics.median(full)
        rec = _record.Recorder(model, batch, loss_fn, None, opt)
        rec.record()
        tm = rec.timing
        work = tm["total"] - tm["probe"]
        print(f"| {name} | {step * 1e3:.1f} | {train * 1e3:.1f} | {tm['total']:.2f} | {tm['segments']:.2f} / "
              f"{tm['step']:.2f} / {tm['probe']:.2f} / {tm['memory']:.2f} | {work / step:.1f}x | {work / train:.1f}x |",
              flush=True)


if __name__ == "__main__":
    main()
