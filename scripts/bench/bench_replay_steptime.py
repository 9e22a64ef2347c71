#!/usr/bin/python3
"""Predicted against measured step time of ckptkit.replay plans (issue 53: the predictions were
3.7x the measured step on CPU). Per model: record() once, plan keep-everything and the smallest
feasible budget; the measured step is the median of --steps forward + backward passes of the
user's loop (after 2 warm-ups) with the plan applied (check_scalars True, and False at the
smallest: the runtime's scalar tape off); the predicted
one is the plan's step_time; "logged" is what the trace's times were before calibration (the
op-logged step's forward times, its backward split in proportion), from the same recording.
Ratios predicted / measured.

--overhead (issue 53: the runtime within 1.05x of plain checkpoint): per model of the issue
(test/models/issue53.py, nanoGPT beside them) and per budget (the smallest feasible, and halfway
to keep-everything), one paired run of forward + backward steps in rounds: each round runs
every configuration in turn (rotating which goes first), a warm-up step then --per timed steps:
no recomputation, plain torch.utils.checkpoint(use_reentrant=False) wrapped around the very
segments the plan recomputes, and ckptkit.replay.apply with check_scalars True and False.
Step time = process CPU time (one torch thread runs forward and backward, so the shared box's
waits are left out); medians over every timed step; ratios apply / plain.

Usage: bench_replay_steptime.py [--threads N] [--steps N]
       bench_replay_steptime.py --overhead [--rounds N] [--per N] [--models a,b]
       (package from $CKPTKIT_PYTHONPATH or build/python)
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.utils.checkpoint as tuc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("CKPTKIT_PYTHONPATH") or os.path.join(HERE, "..", "..", "build", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "models"))
from ckptkit import replay  # noqa: E402
from ckptkit.replay import _record  # noqa: E402
import nanogpt  # noqa: E402


def models():
    m, b, lf = nanogpt.build()
    yield "nanoGPT test model (2 layers, 32 wide) batch 8 x 16", m, b, lf
    try:
        import transformers as tr
    except ImportError:
        return
    torch.manual_seed(0)
    cfg = tr.GPT2Config(vocab_size=512, n_positions=128, n_embd=128, n_layer=4, n_head=4, bos_token_id=0,
                        eos_token_id=0, use_cache=False)
    ids = torch.randint(0, 512, (8, 128))
    yield "HF GPT-2 (4 layers, 128 wide) batch 8 x 128", tr.GPT2LMHeadModel(cfg), ids, \
        lambda m, b: m(input_ids=b, labels=b).loss
    torch.manual_seed(0)
    cfg = tr.BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=512, max_position_embeddings=128)
    yield "HF BERT (4 layers, 128 wide) batch 8 x 128", tr.BertModel(cfg), ids, \
        lambda m, b: m(input_ids=b).last_hidden_state.square().mean()


def measured(model, batch, loss_fn, steps):
    out = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        loss_fn(model, batch).backward()
        out.append((time.perf_counter() - t0) * 1e3)
        model.zero_grad(set_to_none=True)
    return statistics.median(out[2:])


def overhead_models(only):
    """(name, build) of the issue's models that build beside this torch, and nanoGPT."""
    import issue53
    for name, build in list(issue53.BUILDERS.items()) + [("nanogpt", lambda: nanogpt.build())]:
        if only and name not in only:
            continue
        try:
            build()
        except ImportError as e:
            print(f"{name}: skipped ({e})", flush=True)
            continue
        yield name, build


class PlainCheckpoint:
    """torch.utils.checkpoint(use_reentrant=False) around the forwards of the named modules
    (instance attributes, removed by remove())."""

    def __init__(self, model, names):
        self.mods = [model.get_submodule(n) for n in names]
        for m in self.mods:
            m.forward = (lambda f: lambda *a, **k: tuc.checkpoint(f, *a, use_reentrant=False, **k))(m.forward)

    def remove(self):
        for m in self.mods:
            del m.forward


def overhead(a):
    """The --overhead table (see the module docstring)."""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}", flush=True)
    print("| model | budget | recomputed | none ms | plain ms | apply ms (x plain) | check_scalars=False ms (x plain) |")
    print("|---|---|---|---|---|---|---|")
    for name, build in overhead_models(a.models.split(",") if a.models else None):
        model, batch, loss_fn = build()[:3]
        trace = replay.record(model, batch, loss_fn, optimizer=torch.optim.Adam(model.parameters()))
        r = replay.plan(trace).range
        lo, hi = r["min_peak_bytes"], r["keep_all_peak_bytes"]
        plan = replay.plan(trace, [lo, (lo + hi) // 2])
        os.unlink(trace)
        for label, entry in zip(("smallest", "middle"), plan.entries):
            rec = [s["name"] for s in entry["segments"] if s["decision"] != "keep"]
            configs = {"none": lambda: None,
                       "plain": lambda: PlainCheckpoint(model, rec),
                       "apply": lambda: replay.apply(model, plan, entry["budget_bytes"]),
                       "apply0": lambda: replay.apply(model, plan, entry["budget_bytes"], check_scalars=False)}
            times = {k: [] for k in configs}
            for rnd in range(a.rounds):
                keys = list(configs)
                for k in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
                    h = configs[k]()
                    try:
                        for i in range(a.per + 1):
                            t0 = time.process_time()
                            loss_fn(model, batch).backward()
                            t1 = time.process_time()
                            model.zero_grad(set_to_none=True)
                            if i:   # the first step of a round is a warm-up (apply's first forward hashes ops)
                                times[k].append((t1 - t0) * 1e3)
                    finally:
                        if h is not None:
                            h.remove()
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {name} | {label} ({entry['budget_bytes'] / 2**20:.2f} MiB) | {len(rec)} of "
                  f"{len(entry['segments'])} | {med['none']:.2f} | {med['plain']:.2f} | {med['apply']:.2f} "
                  f"({med['apply'] / med['plain']:.3f}) | {med['apply0']:.2f} ({med['apply0'] / med['plain']:.3f}) |",
                  flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--overhead", action="store_true", help="apply() against plain checkpoint (issue 53)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per", type=int, default=2, help="timed steps per configuration and round")
    ap.add_argument("--models", default="", help="comma-separated names (test/models/issue53.py BUILDERS, nanogpt)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.overhead:
        warnings.simplefilter("ignore")
        return overhead(a)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| model | plan | predicted ms | logged ms | measured ms | predicted / measured | logged / measured |")
    print("|---|---|---|---|---|---|---|")
    warnings.simplefilter("ignore")
    for name, m, b, lf in models():
        m.train()
        rec = _record.Recorder(m, b, lf)
        trace = rec.record()
        logged = dict(trace, segments=[dict(s, forward_ms=rec.logged_ms[s["name"]][0],
                                            backward_ms=rec.logged_ms[s["name"]][1]) for s in trace["segments"]])
        r = replay.plan(json.dumps(trace)).range
        for label, budget, check in (("keep all", r["keep_all_peak_bytes"], True),
                                     ("smallest", r["min_peak_bytes"], True),
                                     ("smallest, check_scalars=False", r["min_peak_bytes"], False)):
            p = replay.plan(json.dumps(trace), budget)
            q = replay.plan(json.dumps(logged), budget)
            with replay.apply(m, p, check_scalars=check):
                ms = measured(m, b, lf, a.steps)
            pred, log = p.entries[0]["step_time_ms"], q.entries[0]["step_time_ms"]
            print(f"| {name} | {label} ({sum(s['decision'] != 'keep' for s in p.entries[0]['segments'])} recomputed) | "
                  f"{pred:.2f} | {log:.2f} | {ms:.2f} | {pred / ms:.2f} | {log / ms:.2f} |")


if __name__ == "__main__":
    main()
