#!/usr/bin/python3
"""Apply a replay-plan plan to the real torch model and prove it byte-identical.

Usage: apply_plan.py MODEL.py TRACE.json PLAN.json [--budget B ...]
                     [--mode contract|plain|plain-norng] [--repeat N] [--json]

Runs one training step (loss_fn(model, batch).backward(), build() seeded as in
record_trace.py) twice: without recomputation (reference) and with the plan applied, and compares
loss, model output, every parameter gradient, every buffer after the step and the RNG state
with torch.equal. Several --budget entries share one reference step; --json prints one object
per budget. Exit 0 when all are byte-identical, 1 with the differences listed, 2 on bad input
(unreadable plan, plan for another trace, stale contract versions, infeasible entry).

Modes (docs/design.md §5, §3.4 (b)):
  contract     the plan's recomputed segments run under torch.utils.checkpoint
               (use_reentrant=False, preserve_rng_state=False) plus our contract: at forward
               the hazardous buffers are copied (whole for recompute+snapshot, the contract's
               byte regions for recompute+selective) with the RNG state; before the recompute
               each contract buffer is rebound to a scratch copy rebuilt at the version read
               (checked against a digest taken at forward), the RNG state is restored; after it
               the original buffers and RNG state are put back, discarding the recompute's
               writes and draws.
  plain        plain torch.utils.checkpoint over EVERY segment (preserve_rng_state=True), no
               contract: the baseline whose state bugs the contract fixes.
  plain-norng  as plain with preserve_rng_state=False (custom checkpoint helpers).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.utils.checkpoint as tuc
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_trace import load_build, segment_modules  # noqa: E402  (also puts ckptkit on sys.path)
from ckptkit.replay import ContractError, Plan, RecordError, apply  # noqa: E402
from ckptkit.replay._common import (cuda_streams, generator_names, model_fingerprint,  # noqa: E402
                                    parse_bytes as _parse_bytes, storage_of, stream_state, tensors_in)


class PlanError(Exception):
    """Bad or mismatched input (exit 2)."""


def parse_bytes(s):
    """'44GiB' / '32GB' / '512MiB' / '123' -> bytes (same units as replay-plan)."""
    try:
        return _parse_bytes(s)
    except ValueError:
        raise PlanError(f"not a size: {s}") from None


PLAN_FORMAT_VERSION = 2          # formats/plan.md; 1 carried the old FNV-1a trace hash
TRACE_HASH_ALGORITHM = "xxh3-64"


def trace_hash(data):
    """The trace hash plans carry (formats/trace.md): XXH3-64 (seed 0) of the trace file's
    bytes, 16 hex digits, as replay-plan computes it."""
    return xxhash.xxh3_64_hexdigest(data)


def load_plan(trace_path, plan_path, budgets):
    """Read trace + plan, check the plan matches the trace, return (trace, entries): the
    entries for `budgets` (bytes; all must be feasible), or the first feasible one. A plan
    from before format_version 2 (another trace hash) must be made again (PlanError)."""
    try:
        with open(trace_path, "rb") as f:
            trace_bytes = f.read()
        trace = json.loads(trace_bytes)
        with open(plan_path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(str(e))
    if plan.get("format") != "ckptkit-plan" or trace.get("format") != "ckptkit-trace":
        raise PlanError("expected a ckptkit plan and a ckptkit trace")
    algorithm = plan.get("trace", {}).get("hash_algorithm")
    if plan.get("format_version") != PLAN_FORMAT_VERSION or algorithm != TRACE_HASH_ALGORITHM:
        raise PlanError(f"{plan_path} is a plan of format_version {plan.get('format_version')} "
                        f"(trace hash {algorithm or 'FNV-1a of the canonical JSON'}); this tool "
                        f"reads format_version {PLAN_FORMAT_VERSION} ({TRACE_HASH_ALGORITHM} of the "
                        f"trace file's bytes): re-plan with replay-plan {trace_path} --budget ... "
                        f"-o {plan_path} --force")
    want = trace_hash(trace_bytes)
    if plan.get("trace", {}).get("hash") != want:
        raise PlanError(f"{plan_path} was made for another trace (hash "
                        f"{plan.get('trace', {}).get('hash')}, {trace_path} is {want})")
    feasible = [e for e in plan.get("budgets", []) if e["feasible"]]
    if budgets:
        entries = []
        for b in budgets:
            match = [e for e in feasible if e["budget_bytes"] == b]
            if not match:
                raise PlanError(f"no feasible plan for budget {b} bytes in {plan_path}")
            entries.append(match[0])
    else:
        entries = feasible[:1]
    if not entries:
        raise PlanError("no feasible plan in " + plan_path)
    for entry in entries:
        check_entry(trace, entry)
    return trace, entries


def check_model(model_path, trace, trace_path):
    """Refuse a model file that is not the one the trace was recorded from: its fingerprint
    (parameter and buffer names, shapes, dtypes; record_trace.model_fingerprint) must equal the
    trace's (v2 traces; v1 traces carry none and are not checked). Building it must work."""
    try:
        torch.manual_seed(0)
        model = load_build(model_path)[0]
    except Exception as e:   # a broken model file is bad input: one line, never a traceback
        raise PlanError(f"{model_path}: cannot build the model: {type(e).__name__}: {e}")
    want = trace.get("fingerprint")
    if not want:
        return
    got = model_fingerprint(model)
    if got["hash"] != want.get("hash"):
        raise PlanError(f"{model_path} is not the model {trace_path} was recorded from "
                        f"(fingerprint {got['hash']}: {got['params']} parameters, "
                        f"{got['buffers']} buffers; the trace has {want.get('hash')}: "
                        f"{want.get('params')} parameters, {want.get('buffers')} buffers)")


def check_entry(trace, entry):
    """Refuse a plan entry whose segments or contract versions do not match the trace."""
    names = [s["name"] for s in trace["segments"]]
    if [s["name"] for s in entry["segments"]] != names:
        raise PlanError("plan segments do not match the trace's (plan for another trace)")
    read_version = {(s["name"], a["buffer"]): a["version_read"]
                    for s in trace["segments"] for a in s.get("state", [])}
    for s in entry["segments"]:
        for r in s.get("contract", {}).get("restore", []):
            if read_version.get((s["name"], r["buffer"])) != r["version"]:
                raise PlanError(f"stale contract for segment {s['name']}: {r['buffer']}")


class StepMeter:
    """What one step measures besides its results: the model output (forward hook), the bytes
    autograd saved (saved-tensor hook), the checkpointed segments' inputs and the bytes the
    contracts preserved."""

    def __init__(self):
        self.out = None
        self.held = {}          # storage key -> bytes, saved for backward
        self.inputs = {}        # storage key -> bytes, inputs a checkpointed segment holds
        self.preserved = 0      # bytes the contracts copied at forward

    def pack(self, t):
        key, nbytes = storage_of(t)
        self.held[key] = nbytes
        return t

    def hold_inputs(self, args):
        for a in args:
            if torch.is_tensor(a):
                key, nbytes = storage_of(a)
                self.inputs[key] = nbytes


def plain_checkpoint(module, mode, meter):
    """Plain torch.utils.checkpoint over a segment, no contract (modes plain, plain-norng)."""
    orig = module.forward

    def forward(*args, **kw):
        meter.hold_inputs(args)
        return tuc.checkpoint(orig, *args, use_reentrant=False,
                              preserve_rng_state=(mode == "plain"), **kw)

    module.forward = forward


def run_step(model_path, plan=None, entry=None, mode="contract"):
    """One seeded training step: without recomputation (plan None), with the plan entry applied
    through ckptkit.replay.apply (contract mode) or with plain torch.utils.checkpoint over every
    segment (plain, plain-norng). Returns (result dict, step seconds, measured held bytes)."""
    torch.manual_seed(0)
    model, batch, loss_fn, _ = load_build(model_path)
    model.train()
    segs = segment_modules(model, [s["name"] for s in entry["segments"]]) if entry else {}
    gens = generator_names(model)
    meter = StepMeter()
    fixed = {storage_of(p)[0] for p in model.parameters()}
    handle = None
    if plan is not None and mode == "contract":
        handle = apply(model, plan, entry["budget_bytes"])
    elif plan is not None:
        for name in segs:
            plain_checkpoint(segs[name], mode, meter)
    model.register_forward_hook(lambda m, i, o: setattr(meter, "out", o))
    t0 = time.perf_counter()
    try:
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
            loss = loss_fn(model, batch)
        loss.backward()
    finally:
        if handle is not None:
            handle.remove()
    secs = time.perf_counter() - t0
    bufptrs = {storage_of(b)[0] for b in model.buffers()}
    held = {p: n for p, n in {**meter.held, **meter.inputs}.items()
            if p not in fixed and p not in bufptrs}
    result = {"loss": loss.detach(), "output": [t.detach() for t in tensors_in(meter.out)],   # any output type
              "grads": {n: p.grad for n, p in model.named_parameters()},
              "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
              "params": {n: p.detach().clone() for n, p in model.named_parameters()},
              "generators": {st: stream_state(model, st)
                             for st in cuda_streams() + ["gen:" + g for g in gens.values()]},
              "rng": torch.get_rng_state()}
    return result, secs, sum(held.values()) + meter.preserved


def compare(ref, got):
    """List of differences between two step results (empty = byte-identical)."""
    diffs = []

    def eq(a, b):
        if a is None or b is None:
            return a is b
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)

    for key in ("loss", "rng"):
        if not eq(ref[key], got[key]):
            diffs.append(f"{key} differs")
    if len(ref["output"]) != len(got["output"]) or not all(eq(a, b) for a, b in zip(ref["output"], got["output"])):
        diffs.append("output differs")
    for group in ("grads", "buffers", "params", "generators"):
        for n in ref[group]:
            a, b = ref[group][n], got[group].get(n)
            if not eq(a, b):
                detail = ""
                if a is not None and b is not None and a.shape == b.shape and a.is_floating_point():
                    detail = f" (max abs diff {float((a - b).abs().max()):.3g})"
                elif a is not None and b is not None and a.shape != b.shape:
                    detail = f" (shape {tuple(a.shape)} vs {tuple(b.shape)})"
                elif a is not None and b is not None and a.numel() == 1:
                    detail = f" ({a.item()} vs {b.item()})"
                diffs.append(f"{group[:-1]} {n} differs{detail}")
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("trace")
    ap.add_argument("plan")
    ap.add_argument("--budget", action="append",
                    help="plan entry to apply (repeatable; default: the first feasible one)")
    ap.add_argument("--mode", choices=["contract", "plain", "plain-norng"], default="contract")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each step (median)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per budget")
    a = ap.parse_args()
    try:
        try:
            trace, entries = load_plan(a.trace, a.plan, [parse_bytes(b) for b in a.budget or []])
        except (KeyError, TypeError, AttributeError, IndexError) as e:   # a field missing / mistyped
            raise PlanError(f"{a.plan} or {a.trace}: malformed ({type(e).__name__}: {e})")
        check_model(a.model, trace, a.trace)
    except PlanError as e:
        print(f"apply_plan: error: {e}", file=sys.stderr)
        return 2
    med = lambda v: sorted(v)[len(v) // 2] * 1e3 if v else None
    ref_times = []
    plan_obj = Plan(json.load(open(a.plan)), trace)
    for _ in range(max(1, a.repeat)):   # the reference step, shared by every budget
        ref, t_ref, held_ref = run_step(a.model)
        ref_times.append(t_ref)
    all_identical = True
    for entry in entries:
        if a.mode == "contract":
            decisions = {s["name"]: (s["decision"], s.get("contract", {}))
                         for s in entry["segments"] if s["decision"] != "keep"}
        else:
            decisions = {s["name"]: ("recompute", {}) for s in trace["segments"]}
        problems, got_times, got, error, held_got = [], [], None, None, None
        for _ in range(max(1, a.repeat)):
            try:
                got, t_got, held_got = run_step(a.model, plan_obj, entry, a.mode)
                got_times.append(t_got)
            except (RuntimeError, PlanError, RecordError, ContractError) as e:
                error = str(e).split("\n")[0]
                break
        diffs = problems + ([f"step failed: {error}"] if error else compare(ref, got))
        all_identical = all_identical and not diffs
        res = {"identical": not diffs, "mode": a.mode, "budget_bytes": entry["budget_bytes"],
               "recomputed": sorted(decisions), "differences": diffs,
               "step_ms_reference": med(ref_times), "step_ms_plan": med(got_times),
               "held_bytes_reference": held_ref,
               "held_bytes_plan": None if error else held_got,
               "predicted_peak_bytes": entry["peak_bytes"],
               "predicted_step_ms": entry["step_time_ms"],
               "predicted_held_bytes": sum(s["held_bytes"] for s in entry["segments"])}
        if a.json:
            print(json.dumps(res))
        else:
            print(f"apply_plan: budget {entry['budget_bytes']} B, {a.mode}, {len(decisions)} "
                  "segment(s) recomputed: " + ("byte-identical" if not diffs else "DIFFERENT"))
            for d in diffs:
                print("  " + d)
    return 0 if all_identical else 1


if __name__ == "__main__":
    sys.exit(main())
