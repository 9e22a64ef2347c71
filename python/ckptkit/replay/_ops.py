"""Op-level plans (issue 53): the op table a trace carries per segment (record(ops=True),
formats/trace.md `ops[]`) and the selective-checkpointing policy apply() hands torch for a
recomputed segment whose plan entry lists `save_ops` (planner "ops", formats/plan.md).

An op is keyed as torch's selective activation checkpointing (SAC) keys it: its aten overload
(`aten.mm.default`) and its occurrence k among that overload's calls in one call of the
segment (torch.utils.checkpoint's _CachingTorchDispatchMode counts per op the same way). The
runtime's policy returns MUST_SAVE for the plan's saved ops and PREFER_RECOMPUTE for every
other op, so all other ops stay under the segment's replay contract (RNG, state, in-place
writes rebuilt exactly as for a whole-segment recompute)."""
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .._errors import BadInput
from ._common import RecordError, storage_of, tensors_in

# ops torch's SAC never asks the policy about (torch.utils.checkpoint.SAC_IGNORED_OPS)
_SAC_IGNORED = ("aten.detach.default", "prim.device.default")


def sac_available():
    """Whether this torch has the selective checkpointing API op-level plans go through
    (torch.utils.checkpoint.create_selective_checkpoint_contexts and CheckpointPolicy,
    torch >= 2.4)."""
    import torch.utils.checkpoint as tuc
    return hasattr(tuc, "create_selective_checkpoint_contexts") and hasattr(tuc, "CheckpointPolicy")


def sac_kwargs(name, entry):
    """The extra torch.utils.checkpoint arguments of a recomputed segment: {} for a whole-segment
    recompute; {"context_fn": ...} when its plan entry saves ops. BadInput (one line) on a torch
    without the selective checkpointing API (torch 1.13)."""
    save = entry.get("save_ops") or []
    if not save:
        return {}
    if not sac_available():
        what = (f"segment {name}: the plan saves single ops (planner 'ops'), which needs torch's selective "
                f"activation checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts, "
                f"torch >= 2.4); this is torch {torch.__version__}: plan with planner='joint' (whole segments)")
        raise BadInput(f"ckptkit.replay: error: {what}", None, what)
    import torch.utils.checkpoint as tuc
    keys = frozenset((o["op"], int(o["k"])) for o in save)
    must, recompute = tuc.CheckpointPolicy.MUST_SAVE, tuc.CheckpointPolicy.PREFER_RECOMPUTE

    def context_fn():
        counts = ({}, {})   # forward, recompute: torch < 2.5 asks the policy in both

        def policy(ctx, func, *args, **kwargs):
            c = counts[1 if ctx.is_recompute else 0]
            op = str(func)
            k = c.get(op, 0)
            c[op] = k + 1
            # a key that now falls on an op writing, aliasing or drawing RNG (the forward took
            # another path than the recorded one) is recomputed: the contract replays it
            return must if (op, k) in keys and not _never_saved(func) else recompute
        return tuc.create_selective_checkpoint_contexts(policy)
    return {"context_fn": context_fn}


_NEVER = {}


def _never_saved(func):
    """Whether an op may never be saved whatever the plan says: it writes an argument, returns
    an alias of one, or draws RNG (its schema and tags; cached per op)."""
    v = _NEVER.get(func)
    if v is None:
        sch = func._schema
        v = _NEVER[func] = (any(a.alias_info is not None and a.alias_info.is_write for a in sch.arguments)
                            or any(r.alias_info is not None for r in sch.returns)
                            or any("Generator" in str(a.type) for a in sch.arguments)
                            or _seeded(func))
    return v


def _seeded(func):
    tag = getattr(getattr(torch, "Tag", None), "nondeterministic_seeded", None)
    return tag is not None and tag in getattr(func, "tags", ())


class _OpTable(TorchDispatchMode):
    """Logs every aten op of a forward into the current segment's table: its key (op,
    occurrence), the bytes of the fresh storages it outputs, its time, and why a plan may not
    save it (`fixed`): inplace (writes an argument), random (draws RNG), view (output aliases
    an input), state (reads a module buffer), mutated (its output is written in place later),
    ignored (torch's SAC does not ask about it)."""

    def __init__(self, buffer_ptrs):
        super().__init__()
        self.current = None
        self.tables = {}     # segment -> [entry]
        self.counts = {}     # segment -> {op: calls}
        self.born = {}       # storage key -> entry whose output it is
        self.buffer_ptrs = buffer_ptrs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        seg = self.current
        if seg is None:
            out = func(*args, **kwargs)
            self.note_writes(func, args, kwargs)
            return out
        op = str(func)
        fixed = ""
        schema = func._schema
        ins = set()
        for i, a in enumerate(schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            for t in tensors_in(v):
                k = storage_of(t)[0]
                ins.add(k)
                if k in self.buffer_ptrs and not fixed:
                    fixed = "state"
            if "Generator" in str(a.type):
                fixed = "random"
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            fixed = "inplace"
        elif _seeded(func):
            fixed = "random"
        elif any(r.alias_info is not None for r in schema.returns):
            fixed = fixed or "view"
        if op in _SAC_IGNORED:
            fixed = "ignored"
        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        ns = time.perf_counter_ns() - t0
        self.note_writes(func, args, kwargs)
        seen, nbytes = set(), 0
        for t in tensors_in(out):
            k, nb = storage_of(t)
            if k and k not in ins and k not in seen:
                seen.add(k)
                nbytes += nb
        c = self.counts.setdefault(seg, {})
        k = c.get(op, 0)
        c[op] = k + 1
        e = {"op": op, "k": k, "bytes": nbytes, "ms": ns / 1e6}
        if fixed:
            e["fixed"] = fixed
        self.tables.setdefault(seg, []).append(e)
        for key in seen:
            self.born[key] = e
        return out

    def note_writes(self, func, args, kwargs):
        """An op writing a storage an earlier op output: that op's output cannot be kept (torch's
        SAC refuses a cached tensor mutated later; ckptkit replays the write instead)."""
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                for t in tensors_in(v):
                    e = self.born.get(storage_of(t)[0])
                    if e is not None:
                        e["fixed"] = "mutated"


def record_ops(model, batch, loss_fn, trace, optimizer=None, runs=3):
    """Add `ops` (the op table, formats/trace.md) to every segment of a torch trace dict: the
    training forward run `runs` times (the first a warm-up; times: the smallest of the others),
    each with every state put back afterwards (the recorder's SavedState: parameters, buffers,
    RNG streams, Python scalars, optimizer). RecordError when the runs' op sequences differ."""
    from ._record import SavedState
    names = [s["name"] for s in trace["segments"]]
    mods = dict(model.named_modules())
    saved = SavedState(model, optimizer)
    buffer_ptrs = {storage_of(b)[0] for b in model.buffers()}
    tables = []
    try:
        model.train()
        for _ in range(max(2, runs)):
            log = _OpTable(buffer_ptrs)

            def pre(mod, inputs, n=None):
                log.current = n

            def post(mod, inputs, output):
                log.current = None
            hs = []
            for n in names:
                hs.append(mods[n].register_forward_pre_hook(lambda m, i, n=n: pre(m, i, n)))
                hs.append(mods[n].register_forward_hook(post))
            try:
                with log:
                    loss = loss_fn(model, batch)
                del loss
            finally:
                for h in hs:
                    h.remove()
            saved.restore()
            model.train()
            tables.append(log.tables)
    finally:
        saved.restore()
    first = tables[0]
    for t in tables[1:]:
        for n in names:
            a, b = first.get(n, []), t.get(n, [])
            if [(e["op"], e["k"]) for e in a] != [(e["op"], e["k"]) for e in b]:
                raise RecordError(f"segment {n}: its forward ran other ops in another run (data-dependent "
                                  "control flow): record without ops=True")
    for s in trace["segments"]:
        n = s["name"]
        rows = tables[1].get(n, [])
        for i, e in enumerate(rows):
            e["ms"] = round(min(t[n][i]["ms"] for t in tables[1:]), 6)
        s["ops"] = rows
    return trace
