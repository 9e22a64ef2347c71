#!/usr/bin/python3
"""Predicted against measured step time of ckptkit.replay plans (issue 53: the predictions were
3.7x the measured step on CPU). Per model: record() once, plan keep-everything and the smallest
feasible budget; the measured step is the median of --steps forward + backward passes of the
user's loop (after 2 warm-ups) with the plan applied (check_scalars True, and False at the
smallest: the runtime's scalar tape off); the predicted
one is the plan's step_time; "logged" is what the trace's times were before calibration (the
op-logged step's forward times, its backward split in proportion), from the same recording.
Ratios predicted / measured.

Usage: bench_replay_steptime.py [--threads N] [--steps N]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=9)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
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
