"""ckptkit.replay: state-safe activation recomputation in your own training loop.

    from ckptkit import replay
    trace = replay.record(model, batch, loss_fn, optimizer=opt)   # one real step, state restored
    plan = replay.plan(trace, activation_budget="64MiB")            # the C++ planner
    with replay.apply(model, plan):                                 # every training step follows it
        for batch in loader:
            loss_fn(model, batch).backward(); opt.step(); opt.zero_grad()

record() runs one real step of loss_fn(model, batch).backward() under an op log, a replay
probe and the profiler's memory events, and writes a trace (formats/trace.md); plan() calls
the C++ planner (replay-plan's library) and returns the plan (formats/plan.md); apply() makes
every training forward / backward of the model follow one of the plan's entries with the replay
contracts (docs/replay.md). Errors: RecordError (a BadInput) for models the recorder cannot
describe, ContractError for a contract violated at run time, StalePlan (a ContractError) for a
plan made for another model or forward.
"""
import json
import os
import subprocess
import tempfile
import warnings

import xxhash

from .. import _ckptkit
from .._errors import BadInput, CheckFailed, CkptkitWarning
from ._common import (ContractError, RecordError, StalePlan, model_fingerprint, parse_bytes)
from ._record import Recorder
from ._runtime import Applied, check_fingerprint

from ._enable import Enabled, enable

__all__ = ["record", "plan", "apply", "enable", "ReplayCallback", "Plan", "Enabled", "ContractError", "StalePlan",
           "RecordError", "parse_bytes", "model_fingerprint"]


def __getattr__(name):
    """ReplayCallback (a Lightning Callback: _enable.make_callback_class), built on first use so
    that ckptkit.replay imports without Lightning."""
    if name == "ReplayCallback":
        from ._enable import make_callback_class
        cls = globals()["ReplayCallback"] = make_callback_class()
        return cls
    raise AttributeError(f"module 'ckptkit.replay' has no attribute {name!r}")

PLAN_FORMAT_VERSION = 2


def _write_atomic(text, path, force=False):
    path = os.fspath(path)
    if os.path.exists(path) and not force:
        raise BadInput(f"ckptkit.replay: error: {path}: output already exists; pass force=True to overwrite it",
                       path, "output already exists; pass force=True to overwrite it")
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + ".", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path

def _write_trace(trace, path, force):
    """A trace dict as JSON: into `path` (atomically; BadInput when it exists without force),
    or into a new temporary file when path is None. Returns the path (record()'s, both front ends)."""
    text = json.dumps(trace, indent=1)
    if path is None:
        fd, path = tempfile.mkstemp(prefix="ckptkit-", suffix=".trace.json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path
    return _write_atomic(text, path, force)


def record_trace(model, batch, loss_fn, *, segments=None, optimizer=None, copy_gbps=10.0, model_name=None,
                 source="ckptkit.replay", ops=False):
    """As record(), but returns the trace as a dict and writes nothing; `timing` (seconds per
    phase) is added under the key "_timing" only in the returned dict's attribute-free copy:
    use Recorder directly for it."""
    trace = Recorder(model, batch, loss_fn, segments, optimizer, copy_gbps, model_name, source).record()
    if ops:
        from ._ops import record_ops
        record_ops(model, batch, loss_fn, trace, optimizer)
    return trace


def record(model, batch, loss_fn, *, segments=None, path=None, optimizer=None, copy_gbps=10.0, force=False,
           ops=False):
    """Record one training step of a live model as a trace; returns the trace file's path.

    The step is `loss_fn(model, batch).backward()` (loss_fn returns a scalar tensor; the model's
    output may be any type: tensors, tuples, dicts, dataclasses, (logits, loss)). It runs for
    real (in train mode), then the model's parameters, gradients, buffers, train/eval flags,
    every RNG stream (default CPU, CUDA defaults in use, private torch.Generator attributes) and
    the optimizer's state are put back exactly as before the call.

    segments: module names (model.named_modules()), each called exactly once per step, in
      forward order; None: the modules the forward calls, in call order, at the shallowest
      level, looking into modules never called themselves (nn.ModuleList, nn.ModuleDict) or
      called repeatedly, and into nn.Sequential blocks only while fewer than 4 segments result
      (nanoGPT: transformer.wte, transformer.wpe, transformer.drop, transformer.h.0, ...,
      transformer.ln_f, lm_head; ResNet-18: conv1, ..., layer1, ..., layer4, avgpool, fc). If RNG is drawn or state written outside
      them, RecordError says so and asks for segments=[...]. Finding them runs the forward
      once without gradients: state outside torch that it changes is put back only where it
      is a numeric module attribute or a numeric global of the model's Python modules (a
      counter in a plain object is not), so name the segments for such models.
    path: where to write the trace (JSON, formats/trace.md, format 2), atomically; None: a new
      file in the temporary directory (tempfile.mkstemp, suffix ".trace.json"; yours to delete).
      An existing file is refused unless force=True.
    optimizer: the optimizer of the loop; its state's bytes (after one step) and the temporaries
      of optimizer.step() are measured (step run once on the recorded gradients and undone).
      None: the optimizer state is counted as 2 x the gradients (Adam), no step temporaries.
    copy_gbps: device copy bandwidth (GB/s) the planner uses to cost snapshot copies.
    ops: also record each segment's op table (`ops[]`: every aten op of its forward with its
      output bytes and time, and why it must stay recomputed where it must), for op-level plans
      (plan(..., planner="ops")); costs three more forwards.

    Memory (bytes): per segment saved_bytes (saved-tensor hooks) and transient_bytes (profiler
    memory events: the peak above what segments keep, forward and backward, incoming
    gradient and a recompute on top of the backward's live set included); fixed.outside_bytes
    (the batch, buffers no segment touches), fixed.optimizer_bytes, fixed.step_bytes.
    Raises RecordError (a BadInput) for a step the recorder cannot describe.
    """
    return _write_trace(record_trace(model, batch, loss_fn, segments=segments, optimizer=optimizer,
                                     copy_gbps=copy_gbps, ops=ops), path, force)


class Plan(dict):
    """A plan (formats/plan.md) as a dict of its JSON, with:
    `entries` (the budgets' entries, the list under "budgets"), `range` (the feasible range,
    bytes: min_peak_bytes, keep_all_peak_bytes, min_activation_bytes,
    keep_all_activation_bytes; {} for plans without it), `fingerprint` (the model's, copied
    from the trace) and save(path, force=False)."""

    def __init__(self, data, trace=None):
        super().__init__(data)
        self._trace = trace

    @property
    def entries(self):
        return self.get("budgets", [])

    @property
    def range(self):
        return self.get("range", {})

    @property
    def fingerprint(self):
        return self.get("fingerprint") or (self._trace or {}).get("fingerprint")

    def save(self, path, force=False):
        """Write the plan JSON to path (temporary name, fsync, rename); an existing file is
        refused (BadInput) unless force=True. Returns the path."""
        return _write_atomic(json.dumps(self, indent=1), path, force)

    @classmethod
    def load(cls, path):
        """Read a plan file (BadInput when it is not a ckptkit plan of format_version 2)."""
        path = os.fspath(path)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise BadInput(f"ckptkit.replay: error: {path}: {e}", path, str(e)) from None
        if not isinstance(data, dict) or data.get("format") != "ckptkit-plan":
            raise BadInput(f"ckptkit.replay: error: {path}: not a ckptkit plan", path, "not a ckptkit plan")
        if data.get("format_version") != PLAN_FORMAT_VERSION:
            what = (f"a plan of format_version {data.get('format_version')}: plan again with "
                    "ckptkit.replay.plan(trace, ...) or replay-plan TRACE --budget ... -o PLAN --force")
            raise BadInput(f"ckptkit.replay: error: {path}: {what}", path, what)
        return cls(data)


def _sizes(v, what):
    if v is None:
        return []
    vals = v if isinstance(v, (list, tuple)) else [v]
    out = []
    for x in vals:
        try:
            out.append(parse_bytes(x))
        except ValueError as e:
            raise BadInput(f"ckptkit.replay: error: {what}: {e}", None, f"{what}: {e}") from None
    return out


def _replay_plan_binary():
    for d in (os.environ.get("CKPTKIT_BIN"),
              os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "apps")):
        if d and os.path.exists(os.path.join(d, "replay-plan")):
            return os.path.join(d, "replay-plan")
    return None


def plan(trace, budget=None, *, activation_budget=None, planner="joint"):
    """Plan recomputation for a recorded trace with the C++ planner; returns a Plan.

    trace: a trace file's path (str / os.PathLike), or the trace's JSON text (str starting with
      "{") or bytes.
    budget: whole-step budget(s) (params + grads + optimizer + buffers + outside + activations):
      an int (bytes), a size string ("1.5MiB", "44GiB", "32GB") or a list of them.
    activation_budget: budget(s) for the activations alone (bytes above the fixed memory).
    Neither: one entry with every activation kept. planner: joint (default), eager, stateless,
    all, none, ops (op-level plans: joint's segments, then single ops of the recomputed ones
    saved, torch's selective checkpointing; needs a trace recorded with ops=True and torch >= 2.4
    at apply()). When no budget asked for is feasible, raises ckptkit.CheckFailed naming the
    smallest feasible budget (replay-plan's exit 1; the plan is its `.report`); in a list with
    feasible ones, an infeasible budget is an entry with feasible False. plan.range gives the
    feasible range. Bad input raises ckptkit.BadInput with replay-plan's one-line message.
    """
    name = "<trace>"
    if isinstance(trace, bytes):
        data = trace
    elif isinstance(trace, str) and trace.lstrip().startswith("{"):
        data = trace.encode()
    else:
        name = os.fspath(trace)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BadInput(f"replay-plan: error: {name}: cannot open file: {e.strerror}", name,
                           f"cannot open file: {e.strerror}") from None
    budgets = _sizes(budget, "budget")
    abudgets = _sizes(activation_budget, "activation_budget")
    if not budgets and not abudgets:
        budgets = [1 << 60]
    fn = getattr(_ckptkit, "replay_plan", None)
    if fn is not None:
        text = fn(data, name, budgets, abudgets, planner)
    else:   # an extension built before the binding: the replay-plan tool next to it
        exe = _replay_plan_binary()
        if exe is None or abudgets:
            raise BadInput("ckptkit.replay: error: this build's extension has no replay_plan binding "
                           "(rebuild the package)", None, "no replay_plan binding")
        with tempfile.TemporaryDirectory() as d:
            tp, pp = os.path.join(d, "t.json"), os.path.join(d, "p.json")
            with open(tp, "wb") as f:
                f.write(data)
            args = [exe, tp, "--planner", planner, "-o", pp, "-q"]
            for b in budgets:
                args += ["--budget", str(b)]
            r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode == 2 or not os.path.exists(pp):
                line = (r.stderr.strip().splitlines() or ["replay-plan: error: failed"])[0]
                raise BadInput(line.replace(tp, name), name, line)
            with open(pp) as f:
                text = f.read()
    try:
        tr = json.loads(data)
    except ValueError:
        tr = None
    p = Plan(json.loads(text), tr if isinstance(tr, dict) else None)
    r = p.range
    if r and r.get("min_peak_bytes") == r.get("keep_all_peak_bytes"):
        segs = [x.get("name") for x in (tr or {}).get("segments", [])] if isinstance(tr, dict) else []
        warnings.warn(f"ckptkit.replay: {name}: recomputation saves nothing with these segments "
                      f"({', '.join(segs[:6])}{', ...' if len(segs) > 6 else ''}): the smallest plan keeps "
                      "everything; record with segments=[...] naming smaller modules (the layers inside "
                      "an encoder, the blocks of a stage)", CkptkitWarning, stacklevel=2)
    if p.entries and not any(e.get("feasible") for e in p.entries):
        r = p.range
        what = (f"no budget asked for is feasible for planner {planner}: the smallest feasible is "
                f"budget={r.get('min_peak_bytes')} bytes (activation_budget={r.get('min_activation_bytes')})")
        raise CheckFailed(f"ckptkit.replay: check failed: {name}: {what}", name, what, p)
    return p


def _layout(plan_obj):
    tr = getattr(plan_obj, "_trace", None) or {}
    kinds = {b["id"]: b.get("kind", "buffer") for b in tr.get("buffers", [])}
    args = {(s["name"], a["buffer"]): a["arg"] for s in tr.get("segments", [])
            for a in s.get("state", []) if "arg" in a}
    ops = {s["name"]: s.get("ops_hash") for s in tr.get("segments", []) if s.get("ops_hash")}
    shapes = {s["name"]: s["input_shapes"] for s in tr.get("segments", []) if "input_shapes" in s}
    return {"kind": kinds, "arg": args, "ops_hash": ops, "input_shapes": shapes,
            "optimizer": tr.get("optimizer", "?") if "segments" in tr else "?"}


def select_entry(p, budget=None):
    """The plan entry apply() uses: the feasible one whose budget_bytes or
    activation_budget_bytes equals `budget`; budget None: the only feasible one (BadInput when
    there are several or none)."""
    feasible = [e for e in p.entries if e.get("feasible")]
    if budget is None:
        if len(feasible) == 1:
            return feasible[0]
        if not feasible:
            raise BadInput("ckptkit.replay: error: the plan has no feasible entry", None, "no feasible entry")
        sizes = ", ".join(str(e["budget_bytes"]) for e in feasible)
        raise BadInput(f"ckptkit.replay: error: the plan has {len(feasible)} feasible entries (budgets {sizes} "
                       "bytes): pass budget= to pick one", None, "several feasible entries")
    b = _sizes(budget, "budget")[0]
    for e in feasible:
        if e.get("budget_bytes") == b or e.get("activation_budget_bytes") == b:
            return e
    raise BadInput(f"ckptkit.replay: error: no feasible entry for budget {b} bytes in the plan", None,
                   f"no feasible entry for budget {b} bytes")


def apply(model, plan, budget=None, *, optimizer=None, check_scalars=True):
    """Make every training step of `model` follow a plan; returns a handle (remove(), or use it
    as a context manager).

    plan: a Plan or a plan file's path. budget: which entry (int bytes or a size string, its
    budget_bytes or activation_budget_bytes); needed only when the plan has several feasible
    entries. From then on each training forward (model in train mode, gradients enabled) of a
    recomputed segment runs under torch.utils.checkpoint with its replay contract: the state it
    reads is preserved (whole or by regions) with the RNG streams it draws (default CPU, CUDA,
    private generators) and rebuilt for the recompute, whose writes and draws are discarded.
    Eval-mode and no_grad forwards are untouched; gradient accumulation and other batch sizes
    work (the recorded regions must still cover what a step writes: a selective contract whose
    writes move with the batch raises ContractError).

    Raises StalePlan at apply() when the model's fingerprint (parameter and buffer names,
    shapes, dtypes) is not the plan's, or a segment is missing; on a segment's first training
    forward when its ops hash (aten op names, tensor dtypes and ranks, float / bool / string
    arguments such as dropout p or eps; integers and sizes left out, so a smaller last batch
    passes) is not the recorded one. ContractError (one line, "ckptkit.replay: segment NAME:
    ...") at the step where a recomputed segment writes a buffer or parameter or draws an RNG
    stream its contract does not cover, its state cannot be rebuilt at the read version, or its
    recompute gets another Python scalar than its forward got (one the runtime does not keep:
    not a numeric attribute of the segment's modules nor a numeric global of their modules).

    check_scalars: compare every recompute call by call with its forward's Python numbers: a
    FunctionTape (a Python torch-function mode: torch.*, Tensor methods, torch.nn.functional,
    torch.ops calls) over the recomputed segments' forwards and recomputes, or a ScalarTape (a
    dispatch mode: every aten op) for a segment whose first forward passes a Python number to
    an aten op outside any torch function (a TorchScript function, a C++ extension) and on
    torch 1.13; the runtime's largest cost on models of small ops. False: only the numeric
    module attributes and globals are kept per call (and the replay probe's verdict), so a
    number held elsewhere that changes between a forward and its backward goes unnoticed.

    optimizer: the loop's optimizer, compared with the recording's. One CkptkitWarning per
    handle, at the first difference, says the plan's prediction (peak, step time) no longer
    holds: another optimizer class, a training step whose segment inputs have other shapes
    (another batch or sequence length), or segments run in another order (one bypassed or
    called twice). The step itself still follows the contracts. Needs the plan's trace (a Plan
    from plan()): a Plan loaded from a file gives no note (nothing recorded to compare with).
    """
    if not isinstance(plan, Plan):
        plan = Plan.load(plan)
    entry = select_entry(plan, budget)
    check_fingerprint(model, plan.fingerprint)
    return Applied(model, plan, entry, _layout(plan), optimizer, check_scalars)
