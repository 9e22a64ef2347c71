"""ckptkit.replay's op-level plans against torch's selective activation checkpointing (SAC) and
torch.compile's activation_memory_budget on a nanoGPT-style model, one run (issue 53).

For the same activation budgets (fractions 0, 0.25, 0.5, 0.75 of the range between the
smallest plan and keep-all, from the joint planner's range) it prints per configuration the
measured peak (bytes alive before the step + the peak of torch.profiler's CPU memory events
over forward, backward and Adam's step, as test_replay_api.py measures) and the step's CPU
time (time.process_time: one torch thread, which also runs the CPU backward, so time spent
waiting for a core on the shared machine is left out; the fastest of --steps steps), each as
a ratio to no checkpointing measured in the same run: the eager configurations take their
steps in turn (one step each per round, so the machine's load falls on all alike), each
compiled one in turn with a plain model of its own:
  none             no checkpointing
  ckptkit segment  plan(..., planner="joint") at each budget (whole segments)
  ckptkit ops      plan(..., planner="ops") at each budget (single ops saved inside them)
  torch AC         torch.utils.checkpoint of every transformer block (use_reentrant=False)
  torch SAC mm     the same with the "save matmuls" policy (create_selective_checkpoint_contexts:
                   MUST_SAVE aten.mm / addmm / bmm, PREFER_RECOMPUTE the rest)
  compile amb=F    torch.compile with torch._functorch.config.activation_memory_budget = F, the
                   same fraction of its own range (min-cut: inputs only .. its default choice);
                   --compile-backend aot_eager_decomp_partition (default: min-cut partitioner,
                   eager kernels, so the times compare with the eager lines) or inductor.

  .venv/bin/python scripts/bench/bench_replay_ops.py [--embd 256 --block 128 --layers 4 --batch 8]
(PYTHONPATH=build/python). One thread (torch.set_num_threads(1)); the model's dropout is 0.1.
"""
import argparse
import functools
import json
import os
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "models"))
sys.path.insert(0, str(ROOT / "test" / "py" / "replay"))
import nanogpt  # noqa: E402
from test_replay_api import measure_peak  # noqa: E402  (the tests' peak measurement)

from ckptkit import replay  # noqa: E402

MATMULS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")


class Config:
    """One configuration's model, optimizer and setup: start() (2 warm-up steps, then the peak:
    one step under the profiler), step() (one Adam step, its process CPU ms), stop() (cleanup)."""

    def __init__(self, build, setup):
        self.build, self.setup, self.times = build, setup, []

    def start(self):
        self.model, self.batch, self.loss_fn = self.build()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.fwd, self.done = self.setup(self.model)
        for _ in range(2):
            self.step()
        self.times = []
        self.peak = measure_peak(self.fwd, self.opt, self.batch, self.loss_fn, True)
        return self

    def step(self):
        t0 = time.process_time()
        self.loss_fn(self.fwd, self.batch).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.times.append((time.process_time() - t0) * 1e3)

    def stop(self):
        self.done()
        del self.model, self.fwd, self.opt


def interleaved(configs, steps):
    """Start every config, then `steps` rounds of one step each in turn (the shared machine's
    load falls on all alike); stop them."""
    for c in configs:
        c.start()
    for _ in range(steps):
        for c in configs:
            c.step()
    for c in configs:
        c.stop()


def blocks_checkpointed(context_fn=None):
    """setup(): every transformer block under torch.utils.checkpoint (with context_fn: SAC)."""
    import torch.utils.checkpoint as tuc

    def setup(model):
        olds = []
        for b in model.transformer.h:
            kw = {"context_fn": context_fn} if context_fn else {}
            f = b.forward
            b.forward = (lambda f, kw: lambda x: tuc.checkpoint(f, x, use_reentrant=False, **kw))(f, kw)
            olds.append(b)

        def done():
            for b in olds:
                del b.forward
        return model, done
    return setup


def save_matmuls():
    import torch.utils.checkpoint as tuc

    def policy(ctx, func, *args, **kwargs):
        return (tuc.CheckpointPolicy.MUST_SAVE if str(func) in MATMULS
                else tuc.CheckpointPolicy.PREFER_RECOMPUTE)
    return functools.partial(tuc.create_selective_checkpoint_contexts, policy)


def applied(plan, budget):
    def setup(model):
        h = replay.apply(model, plan, budget)
        return model, h.remove
    return setup


def compiled(amb, backend):
    def setup(model):
        import torch._functorch.config as fc
        torch._dynamo.reset()
        fc.activation_memory_budget = amb
        return torch.compile(model, backend=backend), lambda: setattr(fc, "activation_memory_budget", 1.0)
    return setup


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--fractions", default="0,0.25,0.5,0.75")
    ap.add_argument("--compile-backend", default="aot_eager_decomp_partition",
                    help="aot_eager_decomp_partition | inductor | none")
    ap.add_argument("--json", help="write the rows as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    nanogpt.EMBD, nanogpt.HEADS, nanogpt.BLOCK = a.embd, a.heads, a.block
    nanogpt.LAYERS, nanogpt.VOCAB = a.layers, a.vocab

    def build():
        torch.manual_seed(0)
        return nanogpt.GPT(0.1), nanogpt.batch(a.batch), nanogpt.loss_fn

    model, batch, loss_fn = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    tr = replay.record_trace(model, batch, loss_fn, optimizer=opt, ops=True)
    rec_s = time.perf_counter() - t0
    text = json.dumps(tr)
    rng = replay.plan(text).range
    lo, hi = rng["min_activation_bytes"], rng["keep_all_activation_bytes"]
    fracs = [float(x) for x in a.fractions.split(",")]
    budgets = [lo + int(f * (hi - lo)) for f in fracs]
    plans = {n: replay.plan(text, activation_budget=budgets, planner=n) for n in ("joint", "ops")}
    nops = sum(len(s.get("ops", [])) for s in tr["segments"])
    print(f"nanoGPT-style: embd {a.embd}, heads {a.heads}, block {a.block}, layers {a.layers}, vocab {a.vocab}, "
          f"batch {a.batch}, dropout 0.1; torch {torch.__version__}, 1 thread; record(ops=True) {rec_s:.1f} s, "
          f"{nops} ops; fixed {rng['min_peak_bytes'] - lo} B; activation range {lo}..{hi} B")
    rows = []

    def row(name, frac, c, base, predicted=None, extra=""):
        ms, med = min(c.times), statistics.median(c.times)
        rows.append({"config": name, "fraction": frac, "peak_bytes": c.peak, "step_ms": ms, "median_ms": med,
                     "none_step_ms": min(base.times), "predicted_peak_bytes": predicted, "note": extra})
        print(f"{name:<18} {'' if frac is None else f'{frac:.2f}':>5} {c.peak / 2**20:9.3f} MiB "
              f"{c.peak / base.peak:6.3f}x  {ms:8.2f} ms {ms / min(base.times):6.3f}x (median {med:.1f})"
              f"{'' if predicted is None else f'  predicted {predicted / 2**20:.3f} MiB'}{extra}", flush=True)

    print(f"{'config':<18} {'frac':>5} {'peak':>13} {'ratio':>7}  {'step':>11} {'ratio':>7}")
    plain = lambda m: (m, lambda: None)   # noqa: E731
    none = Config(build, plain)
    eager = [("none", None, none, None, "")]
    for i, f in enumerate(fracs):
        for n, label in (("joint", "ckptkit segment"), ("ops", "ckptkit ops")):
            e = plans[n].entries[i]
            saved = sum(len(s.get("save_ops", [])) for s in e["segments"])
            rec = sum(s["decision"] != "keep" for s in e["segments"])
            eager.append((label, f, Config(build, applied(plans[n], e["budget_bytes"])), e["peak_bytes"],
                          f", {rec} segments recomputed" + (f", {saved} ops saved" if n == "ops" else "")))
    eager.append(("torch AC", None, Config(build, blocks_checkpointed()), None, ""))
    eager.append(("torch SAC mm", None, Config(build, blocks_checkpointed(save_matmuls())), None, ""))
    interleaved([x[2] for x in eager], a.steps)
    for name, f, c, pred, extra in eager:
        row(name, f, c, none, pred, extra)
    if a.compile_backend != "none":
        try:
            for f in fracs + [1.0]:   # each compiled model against a plain one, interleaved
                c, ref = Config(build, compiled(f, a.compile_backend)), Config(build, plain)
                interleaved([ref, c], a.steps)
                row(f"compile amb={f:g}", f, c, ref, extra=f", {a.compile_backend} (vs none alongside)")
        except Exception as e:   # report, keep the rows measured
            print(f"torch.compile ({a.compile_backend}) failed on this machine: {type(e).__name__}: {e}"[:400])
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
