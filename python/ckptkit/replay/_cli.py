"""The command line over MODEL.py files (`python -m ckptkit.replay record|apply`, and the thin
wrappers scripts/record_trace.py, scripts/apply_plan.py): record one real step of a model file
as a trace, and apply a plan to the real model proving the step byte-identical.

The MODEL.py contract: build() -> (model, batch, loss_fn[, segments]). MODEL.py defines
build(), which returns
    (model, batch, loss_fn)            or    (model, batch, loss_fn, segments)
model is a torch.nn.Module, batch anything loss_fn accepts, and loss_fn(model, batch) returns
the scalar loss of one step; the step recorded is loss_fn(model, batch).backward(), with
torch.manual_seed(0) before build(). segments (optional) names the modules to plan (each must
be called exactly once per step, in forward order); without it the segments are
ckptkit.replay.record's default (the modules the forward calls, at the root's level, looking
into ModuleList / ModuleDict, and into nn.Sequential blocks while fewer than 4). Private torch.Generator objects must be attributes of a
module of the model (so a plan can name and restore them).

Method (docs/design.md §5, formats/trace.md "How the recorder measures"): forward hooks time each
segment; saved-tensor hooks attribute bytes kept for backward; a TorchDispatchMode logs every
aten op of the step with its schema's alias annotations ((a!) = written) and its generator=
argument, so the storages each segment reads and writes are known, whoever owns them
(parameters, buffers of any module, tensors received from earlier segments); module buffers,
parameters and segment inputs are compared byte for byte at every segment boundary (versions,
byte regions written, rebinding); the default CPU generator and every torch.Generator
attribute of the model are compared before/after each segment. Then a replay probe re-runs
every segment's forward from its recorded state (buffers, parameters, inputs, generators
restored) and compares outputs, written state and generator states bit for bit: a difference
means state no log sees and the runtime does not keep (a C++ extension, Python state other
than numeric module attributes and globals) and the
segment is marked non_replayable with the reason. --et also records the same step (same seed)
with torch's ExecutionGraphObserver, one record_function label "ckpt.segment:NAME" per
segment. Prints a one-line summary on stderr (--quiet: none).
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import torch
import torch.utils.checkpoint as tuc
import xxhash

from . import PLAN_FORMAT_VERSION, Plan, _write_atomic, apply, record_trace, select_entry
from .._errors import BadInput
from ._common import (HASH_ALGORITHM, ContractError, RecordError, cuda_streams, generator_names,
                      model_fingerprint, parse_bytes, storage_of, stream_state, tensors_in)

SEGMENT_LABEL = "ckpt.segment:"
RECORD_DOC = "Record one real training step of MODEL.py as a ckptkit trace (formats/trace.md, version 2)."
APPLY_DOC = "Apply a replay-plan plan to the real torch model and prove it byte-identical."
APPLY_EPILOG = """\
Runs one training step (loss_fn(model, batch).backward(), build() seeded as the recorder does)
twice: without recomputation (reference) and with the plan applied, and compares loss, model
output, every parameter gradient, every buffer after the step and the RNG state with
torch.equal. Several --budget entries share one reference step; --json prints one object per
budget. Exit 0 when all are byte-identical, 1 with the differences listed, 2 on bad input
(unreadable plan, plan for another trace, stale contract versions, infeasible entry).

Modes (docs/design.md §5, §3.4 (b)):
  contract     the plan's recomputed segments run under ckptkit.replay.apply (torch.utils.checkpoint
               with the replay contracts: state and RNG preserved at forward, rebuilt for the
               recompute, whose writes and draws are discarded).
  plain        plain torch.utils.checkpoint over EVERY segment (preserve_rng_state=True), no
               contract: the baseline whose state bugs the contract fixes.
  plain-norng  as plain with preserve_rng_state=False (custom checkpoint helpers)."""


class PlanError(Exception):
    """Bad or mismatched input to apply (exit 2)."""


def write_json(obj, path):
    """Write obj as JSON (indent 1) to path atomically (temporary name, fsync, rename),
    replacing the file there: the command line's and the fixture scripts' writer."""
    return _write_atomic(json.dumps(obj, indent=1), path, force=True)


def load_build(path):
    """Import MODEL.py and call build(); returns (model, batch, loss_fn, names or None)."""
    spec = importlib.util.spec_from_file_location("ckpt_model_" + str(abs(hash(path))), path)
    if spec is None:
        raise RecordError(f"{path}: cannot import")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "build"):
        raise RecordError(f"{path}: no build() function")
    out = mod.build()
    if not isinstance(out, tuple) or len(out) not in (3, 4):
        raise RecordError(f"{path}: build() must return (model, batch, loss_fn[, segments])")
    model, batch, loss_fn = out[:3]
    return model, batch, loss_fn, (list(out[3]) if len(out) == 4 else None)


def segment_modules(model, names):
    """Segment name -> module, for the named segments (a trace's or a plan's)."""
    mods = dict(model.named_modules())
    missing = [n for n in names if n not in mods]
    if missing:
        raise RecordError(f"unknown segment module(s): {missing}")
    return {n: mods[n] for n in names}


def record_file(model_path, copy_gbps=10.0, source="ckptkit.replay", ops=False):
    """Record one step of MODEL.py (torch.manual_seed(0) before build()); returns the trace
    dict (formats/trace.md; ops: with each segment's op table). Raises RecordError."""
    torch.manual_seed(0)
    model, batch, loss_fn, names = load_build(model_path)
    return record_trace(model, batch, loss_fn, segments=names, copy_gbps=copy_gbps,
                        model_name=os.path.basename(model_path), source=source, ops=ops)


def record_et(model_path, out_path, names):
    """Record the same step (same seed) with torch 1.13's ExecutionGraphObserver, one
    record_function label per segment (`names`: the recorded trace's); writes schema 1.0.1
    JSON to out_path."""
    from torch.profiler import ExecutionGraphObserver
    torch.manual_seed(0)
    model, batch, loss_fn, _ = load_build(model_path)
    model.train()
    segs = segment_modules(model, names)
    seg_name = {id(m): n for n, m in segs.items()}
    open_rf = {}

    def pre(mod, inputs):
        rf = torch.autograd.profiler.record_function(SEGMENT_LABEL + seg_name[id(mod)])
        rf.__enter__()
        open_rf[id(mod)] = rf

    def post(mod, inputs, output):
        open_rf.pop(id(mod)).__exit__(None, None, None)

    handles = [m.register_forward_pre_hook(pre) for m in segs.values()]
    handles += [m.register_forward_hook(post) for m in segs.values()]
    eg = ExecutionGraphObserver()
    eg.register_callback(out_path)
    eg.start()
    loss_fn(model, batch).backward()
    eg.stop()
    eg.unregister_callback()
    for h in handles:
        h.remove()


def et_to_chakra(et):
    """Rewrite a schema 1.0.1 Execution Trace in the Chakra-style nested schema
    ("1.0.2-chakra.0.0.4": inputs/outputs objects, parent in ctrl_deps, op_schema and the other
    scalar fields in attrs). torch 1.13 cannot emit that schema itself; this keeps the same
    recorded step so the importer can be checked on both layouts."""
    nodes = []
    for n in et["nodes"]:
        attrs = [{"name": k, "type": "string" if isinstance(n.get(k), str) else "uint64", "value": n[k]}
                 for k in ("fw_parent", "seq_id", "scope", "tid", "fw_tid", "op_schema") if k in n]
        nodes.append({"id": n["id"], "name": n["name"], "ctrl_deps": n.get("parent", -1),
                      "inputs": {"values": n.get("inputs", []), "shapes": n.get("input_shapes", []),
                                 "types": n.get("input_types", [])},
                      "outputs": {"values": n.get("outputs", []), "shapes": n.get("output_shapes", []),
                                  "types": n.get("output_types", [])},
                      "attrs": attrs})
    return {"schema": "1.0.2-chakra.0.0.4", "pid": et.get("pid"), "time": et.get("time"),
            "start_ts": et.get("start_ts"), "finish_ts": et.get("finish_ts"), "nodes": nodes}


def summary_line(trace, path, prog="record"):
    """One line: segments, those that touch state or draw RNG, state by kind, RNG streams,
    non-replayable segments, the output path."""
    segs = trace["segments"]
    kinds = {}
    for b in trace["buffers"]:
        kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
    streams = sorted({r["stream"] for s in segs for r in s["rng"]})
    stateful = sum(1 for s in segs if s["state"] or s["rng"])
    nr = [s["name"] for s in segs if "non_replayable" in s]
    return (f"{prog}: {trace['model']}: {len(segs)} segments, {stateful} touch state or RNG; state "
            + (", ".join(f"{v} {k}{'s' if v > 1 else ''}" for k, v in sorted(kinds.items())) or "none")
            + f"; RNG streams {', '.join(streams) or 'none'}; non-replayable: "
            + (", ".join(nr) or "none") + f" -> {path}")


def record_main(argv=None, prog="record", source="ckptkit.replay", usage_name=None):
    """`record MODEL.py -o TRACE.json [--et ET.json [--chakra C.json]] [--copy-gbps G] [--ops] [--quiet]`;
    errors are one line "PROG: error: ...", exit 2 (usage_name: --help's program name, default
    the script's). Returns the exit code."""
    ap = argparse.ArgumentParser(prog=usage_name, description=RECORD_DOC, epilog=__doc__[__doc__.index("The MODEL.py contract"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="MODEL.py defining build() -> (model, batch, loss_fn[, segments])")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--et", help="also record a PyTorch Execution Trace to this path")
    ap.add_argument("--chakra", help="also write the --et trace in the Chakra nested schema")
    ap.add_argument("--copy-gbps", type=float, default=10.0,
                    help="device copy bandwidth used for snapshot costs (GB/s)")
    ap.add_argument("--ops", action="store_true",
                    help="also record each segment's op table, for op-level plans (replay-plan --planner ops)")
    ap.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    a = ap.parse_args(argv)
    try:
        trace = record_file(a.model, a.copy_gbps, source, a.ops)
        write_json(trace, a.output)
        if not a.quiet:
            print(summary_line(trace, a.output, prog), file=sys.stderr)
        if a.et:
            record_et(a.model, a.et, [s["name"] for s in trace["segments"]])
            if a.chakra:
                with open(a.et) as f:
                    write_json(et_to_chakra(json.load(f)), a.chakra)
    except RecordError as e:
        print(f"{prog}: error: {e.reason}", file=sys.stderr)
        return 2
    except (OSError, ImportError, SyntaxError, RuntimeError, ValueError, TypeError) as e:
        # MODEL.py that does not import / build / run: one line, not a traceback
        print(f"{prog}: error: {a.model}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        return 2
    return 0


def load_plan(trace_path, plan_path, budgets):
    """Read trace + plan, check the plan matches the trace (format_version, XXH3-64 of the trace
    file's bytes, segments, contract versions); returns (trace, Plan, entries): the entries
    for `budgets` (bytes; each must be feasible), or the first feasible one. Raises PlanError."""
    try:
        with open(trace_path, "rb") as f:
            trace_bytes = f.read()
        trace = json.loads(trace_bytes)
        with open(plan_path) as f:
            plan = Plan(json.load(f), trace)
    except (OSError, ValueError) as e:
        raise PlanError(str(e))
    if plan.get("format") != "ckptkit-plan" or trace.get("format") != "ckptkit-trace":
        raise PlanError("expected a ckptkit plan and a ckptkit trace")
    algorithm = plan.get("trace", {}).get("hash_algorithm")
    if plan.get("format_version") != PLAN_FORMAT_VERSION or algorithm != HASH_ALGORITHM:
        raise PlanError(f"{plan_path} is a plan of format_version {plan.get('format_version')} "
                        f"(trace hash {algorithm or 'FNV-1a of the canonical JSON'}); this tool "
                        f"reads format_version {PLAN_FORMAT_VERSION} ({HASH_ALGORITHM} of the "
                        f"trace file's bytes): re-plan with replay-plan {trace_path} --budget ... "
                        f"-o {plan_path} --force")
    want = xxhash.xxh3_64_hexdigest(trace_bytes)
    if plan.get("trace", {}).get("hash") != want:
        raise PlanError(f"{plan_path} was made for another trace (hash "
                        f"{plan.get('trace', {}).get('hash')}, {trace_path} is {want})")
    try:
        entries = [select_entry(plan, b) for b in budgets] or [e for e in plan.entries if e["feasible"]][:1]
    except BadInput as e:
        raise PlanError(f"{plan_path}: {e.reason}") from None
    if not entries:
        raise PlanError("no feasible plan in " + plan_path)
    for entry in entries:
        check_entry(trace, entry)
    return trace, plan, entries


def check_model(model_path, trace, trace_path):
    """Refuse a model file that is not the one the trace was recorded from: its fingerprint
    (parameter and buffer names, shapes, dtypes) must equal the trace's (v2 traces; v1 traces
    carry none and are not checked). Building it must work."""
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
    autograd saved (saved-tensor hook) and the checkpointed segments' inputs."""

    def __init__(self):
        self.out = None
        self.held = {}          # storage key -> bytes, saved for backward
        self.inputs = {}        # storage key -> bytes, inputs a checkpointed segment holds

    def pack(self, t):
        """saved_tensors_hooks pack: count the tensor's storage, keep the tensor."""
        key, nbytes = storage_of(t)
        self.held[key] = nbytes
        return t

    def hold_inputs(self, args):
        """Count the storages of a checkpointed segment's tensor inputs."""
        for a in args:
            if torch.is_tensor(a):
                key, nbytes = storage_of(a)
                self.inputs[key] = nbytes


def plain_checkpoint(module, mode, meter):
    """Plain torch.utils.checkpoint over a segment, no contract (modes plain, plain-norng)."""
    orig = module.forward

    def forward(*args, **kw):
        meter.hold_inputs(args)
        return tuc.checkpoint(orig, *args, use_reentrant=False, preserve_rng_state=(mode == "plain"), **kw)

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
    held = {p: n for p, n in {**meter.held, **meter.inputs}.items() if p not in fixed and p not in bufptrs}
    result = {"loss": loss.detach(), "output": [t.detach() for t in tensors_in(meter.out)],   # any output type
              "grads": {n: p.grad for n, p in model.named_parameters()},
              "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
              "params": {n: p.detach().clone() for n, p in model.named_parameters()},
              "generators": {st: stream_state(model, st) for st in cuda_streams() + ["gen:" + g for g in gens.values()]},
              "rng": torch.get_rng_state()}
    return result, secs, sum(held.values())


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


def apply_main(argv=None, prog="apply", usage_name=None):
    """`apply MODEL.py TRACE.json PLAN.json [--budget B ...] [--mode M] [--repeat N] [--json]`:
    exit 0 byte-identical, 1 different, 2 bad input (one line "PROG: error: ..."; usage_name as
    record_main's)."""
    ap = argparse.ArgumentParser(prog=usage_name, description=APPLY_DOC, epilog=APPLY_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("trace")
    ap.add_argument("plan")
    ap.add_argument("--budget", action="append", help="plan entry to apply (repeatable; default: the first feasible one)")
    ap.add_argument("--mode", choices=["contract", "plain", "plain-norng"], default="contract")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each step (median)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per budget")
    a = ap.parse_args(argv)
    try:
        try:
            budgets = [parse_bytes(b) for b in a.budget or []]
        except ValueError as e:
            raise PlanError(str(e)) from None
        try:
            trace, plan, entries = load_plan(a.trace, a.plan, budgets)
        except (KeyError, TypeError, AttributeError, IndexError) as e:   # a field missing / mistyped
            raise PlanError(f"{a.plan} or {a.trace}: malformed ({type(e).__name__}: {e})")
        check_model(a.model, trace, a.trace)
    except PlanError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    med = lambda v: sorted(v)[len(v) // 2] * 1e3 if v else None   # noqa: E731
    ref_times = []
    for _ in range(max(1, a.repeat)):   # the reference step, shared by every budget
        ref, t_ref, held_ref = run_step(a.model)
        ref_times.append(t_ref)
    all_identical = True
    for entry in entries:
        if a.mode == "contract":
            recomputed = [s["name"] for s in entry["segments"] if s["decision"] != "keep"]
        else:
            recomputed = [s["name"] for s in trace["segments"]]
        got_times, got, error, held_got = [], None, None, None
        for _ in range(max(1, a.repeat)):
            try:
                got, t_got, held_got = run_step(a.model, plan, entry, a.mode)
                got_times.append(t_got)
            except (RuntimeError, PlanError, RecordError, ContractError, BadInput) as e:
                error = str(e).split("\n")[0]
                break
        diffs = [f"step failed: {error}"] if error else compare(ref, got)
        all_identical = all_identical and not diffs
        res = {"identical": not diffs, "mode": a.mode, "budget_bytes": entry["budget_bytes"],
               "recomputed": sorted(recomputed), "differences": diffs,
               "step_ms_reference": med(ref_times), "step_ms_plan": med(got_times),
               "held_bytes_reference": held_ref, "held_bytes_plan": None if error else held_got,
               "predicted_peak_bytes": entry["peak_bytes"], "predicted_step_ms": entry["step_time_ms"],
               "predicted_held_bytes": sum(s["held_bytes"] for s in entry["segments"])}
        if a.json:
            print(json.dumps(res))
        else:
            print(f"{prog}: budget {entry['budget_bytes']} B, {a.mode}, {len(recomputed)} "
                  "segment(s) recomputed: " + ("byte-identical" if not diffs else "DIFFERENT"))
            for d in diffs:
                print("  " + d)
    return 0 if all_identical else 1
