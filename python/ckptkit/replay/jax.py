"""ckptkit.replay.jax: replay plans for JAX training steps (optional: needs jax, and torch as
all of ckptkit.replay does; the rest of ckptkit imports without jax).

    from ckptkit.replay import jax as rj
    trace = rj.record(loss_fn, params, state, batch, key, optimizer=tx)  # trace file (formats/trace.md)
    plan = rj.plan(trace, activation_budget="4MiB")                        # the same C++ planner as torch
    loss_fn = rj.apply(loss_fn, plan)                                      # same signature, plan applied

`loss_fn(params, state, batch, key) -> (loss, aux)` (or just `loss`) is the differentiated
part of a step: `jax.value_and_grad(loss_fn, has_aux=True)(params, state, batch, key)`, then the
optimizer. Segments are the Flax modules (or `jax.named_scope`s) called directly under the
root, found from the name stack of the traced step; a segment's ops must be contiguous. JAX
state is explicit: the recorded contract of a segment is the state leaves (`batch_stats`) and
PRNG keys it reads, never a write (new statistics are new arrays), so every segment is offered
keep and recompute and a recompute is exact by construction. apply() re-traces loss_fn and runs
each recomputed segment under jax.checkpoint (nothing_saveable) or, on XLA:CPU, under a custom
VJP that recomputes it behind a host identity (see apply).
"""
import json
import os
import re
import statistics
import time

import jax
import numpy as np
import xxhash
from jax._src import core as _core
from jax._src import source_info_util as _siu

from . import Plan, _write_trace, plan, select_entry
from .._errors import BadInput
from ._common import RecordError, StalePlan, parse_bytes

__all__ = ["record", "record_trace", "plan", "apply", "Plan", "step_memory", "segments_of",
           "parse_bytes"]

_WRAP = re.compile(r"^[A-Za-z_]+\((.*)\)$")


def _scope(eqn):
    """The eqn's name stack as a tuple of scope names, transform wrappers (jvp(...),
    transpose(...)) removed; an eqn holding a jaxpr (nn.remat's checkpoint, a jit) gets the
    scopes its inner eqns share appended (Flax names a remat'ed module only inside)."""
    out = _own_scope(eqn)
    inner = eqn.params.get("jaxpr")
    inner = getattr(inner, "jaxpr", inner)
    if isinstance(inner, _core.Jaxpr) and inner.eqns:
        common = None
        for e in inner.eqns:
            sc = _scope(e)
            if common is None:
                common = sc
            k = 0
            while k < min(len(common), len(sc)) and common[k] == sc[k]:
                k += 1
            common = common[:k]
        out = out + (common or ())
    return out


def _own_scope(eqn):
    out = []
    for part in str(eqn.source_info.name_stack).split("/"):
        m = _WRAP.match(part)
        while m:
            part = m.group(1)
            m = _WRAP.match(part)
        if part:
            out.append(part)
    return tuple(out)


def _nbytes(aval):
    """Bytes of an abstract value (0 for tokens and opaque types without a size)."""
    try:
        return int(np.prod(aval.shape, dtype=np.int64)) * int(np.dtype(aval.dtype).itemsize)
    except TypeError:   # PRNG key types: their raw data (2 x uint32 for threefry)
        return int(np.prod(aval.shape, dtype=np.int64)) * 8


def _is_var(a):
    return not isinstance(a, _core.Literal)


class _Layout:
    """Which top-level scope (segment) every eqn of a jaxpr belongs to.

    root: the scopes every eqn shares (the Flax root module's name); segments: names relative to
    it, given (paths "block0" or "encoder/layer_0") or the scopes directly under the root in
    first-use order. seg[i]: the segment of eqn i (None: outside every segment)."""

    def __init__(self, eqns, segments=None, root=None):
        scopes = [_scope(e) for e in eqns]
        if root is None:
            # the scopes every named op shares (the linearized step's ops hoisted out of a scan
            # body have stacks of their own: _residuals passes the forward's root instead)
            nonempty = [s for s in scopes if s]
            root = nonempty[0] if nonempty else ()
            for s in nonempty:
                k = 0
                while k < min(len(root), len(s)) and root[k] == s[k]:
                    k += 1
                root = root[:k]
            if nonempty and all(len(s) == len(root) for s in nonempty):
                root = root[:-1]   # a single scope under everything: segment at its level
        self.root = root
        rel = [s[len(root):] if s[:len(root)] == root else None for s in scopes]
        if segments is None:
            names = []
            for r in rel:
                if r and r[0] not in names:
                    names.append(r[0])
            wanted = [(n,) for n in names]
        else:
            wanted = [tuple(p for p in str(n).split("/") if p) for n in segments]
        self.names = ["/".join(w) for w in wanted]
        self.seg = []
        for r in rel:
            hit = None
            if r:
                for k, w in enumerate(wanted):
                    if r[:len(w)] == w:
                        hit = k
                        break
            self.seg.append(hit)
        found = set(x for x in self.seg if x is not None)
        self.missing = [self.names[k] for k in range(len(wanted)) if k not in found]
        # contiguous runs: (segment index or None, [eqn indices])
        self.runs = []
        for i, s in enumerate(self.seg):
            if self.runs and self.runs[-1][0] == s:
                self.runs[-1][1].append(i)
            else:
                self.runs.append((s, [i]))
        seen = set()
        self.split = []
        for s, _ in self.runs:
            if s is not None:
                if s in seen and self.names[s] not in self.split:
                    self.split.append(self.names[s])
                seen.add(s)


def segments_of(loss_fn, params, state, batch, key):
    """The default segments of a step (names of the scopes directly under the root, forward
    order), as record() would find them."""
    closed = jax.make_jaxpr(loss_fn)(params, state, batch, key)
    return _Layout(closed.jaxpr.eqns).names


def _sig(v):
    """What the ops hash keeps of an eqn parameter (as the torch front end: floats, bools and
    strings exactly, integers only as a marker, sub-jaxprs by their own ops)."""
    if isinstance(v, (_core.ClosedJaxpr, _core.Jaxpr)):
        return "{" + _ops_text((v.jaxpr if isinstance(v, _core.ClosedJaxpr) else v).eqns) + "}"
    if isinstance(v, bool) or v is None or isinstance(v, (float, str)):
        return repr(v)
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
            return f"ints[{len(v)}]"
        return "[" + ",".join(_sig(x) for x in v) + "]"
    if isinstance(v, np.dtype):
        return str(v)
    if callable(v):   # a remat policy, a custom rule: by name (or repr, for policy objects)
        return getattr(v, "__qualname__", None) or re.sub(r" at 0x[0-9a-f]+", "", repr(v))
    return type(v).__name__


def _ops_text(eqns):
    lines = []
    for e in eqns:
        parts = [e.primitive.name]
        for a in e.invars:
            if _is_var(a):
                parts.append(f"T{a.aval.dtype}/{len(getattr(a.aval, 'shape', ()))}")
            else:
                val = np.asarray(a.val)
                x = val.item() if val.ndim == 0 and val.dtype.kind in "fb" else None
                # an integral float literal is a size (a mean's element count): like an int
                parts.append(f"L{val.dtype}" if x is None or (isinstance(x, float) and x.is_integer())
                             else repr(x))
        parts += [f"{k}={_sig(v)}" for k, v in sorted(e.params.items())
                  if k not in ("name", "debug_info", "source_info")]
        lines.append("|".join(parts))
    return "\n".join(lines)


def _ops_hash(eqns):
    """XXH3-64 (16 hex digits) of a segment's primitives: names, operand dtypes and ranks, float
    / bool / string literals and parameters (dropout rate, epsilon), sub-jaxprs recursively;
    integers, sizes and integral float literals (a mean's element count) left out, so another
    batch size hashes the same."""
    return xxhash.xxh3_64_hexdigest(_ops_text(eqns).encode())


def _leaf_paths(tree, prefix):
    return [("/".join(x for x in (prefix, jax.tree_util.keystr(p, simple=True, separator="/")) if x), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def fingerprint(params, state):
    """{"hash", "params", "buffers"} of a JAX model: XXH3-64 of the compact JSON list
    [[kind, path, shape, dtype], ...] of every parameter leaf ("param") then state leaf
    ("buffer"), as the torch front end's model_fingerprint."""
    items = [["param", n, list(np.shape(x)), str(x.dtype)] for n, x in _leaf_paths(params, "")]
    items += [["buffer", n, list(np.shape(x)), str(x.dtype)] for n, x in _leaf_paths(state, "")]
    return {"hash": xxhash.xxh3_64_hexdigest(json.dumps(items, separators=(",", ":")).encode()),
            "params": sum(1 for i in items if i[0] == "param"),
            "buffers": sum(1 for i in items if i[0] == "buffer")}


def _eval_eqns(eqns, env):
    """Evaluate jaxpr eqns into env (var -> value), keeping each eqn's name stack."""
    for e in eqns:
        bind_params = e.primitive.get_bind_params(e.params)
        invals = [a.val if not _is_var(a) else env[a] for a in e.invars]
        with _siu.user_context(e.source_info.traceback,
                               name_stack=_siu.current_name_stack() + e.source_info.name_stack), e.ctx.manager:
            ans = e.primitive.bind(*invals, **bind_params)
        if e.primitive.multiple_results:
            for v, a in zip(e.outvars, ans):
                env[v] = a
        else:
            env[e.outvars[0]] = ans


class _Split:
    """A traced step cut into runs: for every run its eqns, inputs (vars read, defined before)
    and outputs (vars defined in it and read later or returned)."""

    def __init__(self, closed, segments=None):
        self.closed = closed
        jp = closed.jaxpr
        self.layout = _Layout(jp.eqns, segments)
        self.runs = []
        later = set(a for a in jp.outvars if _is_var(a))
        outs_of = []
        for s, idx in reversed(self.layout.runs):
            eqns = [jp.eqns[i] for i in idx]
            defined = set(v for e in eqns for v in e.outvars)
            outs_of.append([v for e in eqns for v in e.outvars if v in later])
            ins = []
            for e in eqns:
                for a in e.invars:
                    if _is_var(a) and a not in defined and a not in ins:
                        ins.append(a)
            later |= set(ins)
            self.runs.append((s, eqns, ins))
        self.runs.reverse()
        outs_of.reverse()
        self.runs = [(s, eqns, ins, outs) for (s, eqns, ins), outs in zip(self.runs, outs_of)]


def _tree_parts(params, state, batch, key):
    """Leaf counts of the four step arguments (the order of the jaxpr's inputs)."""
    return [len(jax.tree.leaves(x)) for x in (params, state, batch, key)]


def _origins(split, counts):
    """var -> (origin, index of the input leaf or None) of every jaxpr var: origin "param",
    "state", "key", "batch", "const" or "act"; ops outside segments on keys alone stay keys (a
    split key keeps its source's index)."""
    jp = split.closed.jaxpr
    kinds = ["param"] * counts[0] + ["state"] * counts[1] + ["batch"] * counts[2] + ["key"] * counts[3]
    org = {v: (k, i) for i, (v, k) in enumerate(zip(jp.invars, kinds))}
    for v in jp.constvars:
        org[v] = ("const", None)
    for s, eqns, _, _ in split.runs:
        for e in eqns:
            ins = [org.get(a, ("act", None)) for a in e.invars if _is_var(a)]
            if s is None and ins and all(o[0] == "key" for o in ins):
                o = ins[0]
            elif s is None and ins and all(o[0] in ("param", "const") for o in ins):
                o = ("param", None)
            else:
                o = ("act", None)
            for v in e.outvars:
                org[v] = o
    return org


def _median_ms(fn, args, reps=3):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def _run_fn(eqns, ins, outs):
    def f(*vals):
        env = dict(zip(ins, vals))
        _eval_eqns(eqns, env)
        return [env[v] for v in outs]
    return f


def _diff_mask(avals):
    return [np.issubdtype(a.dtype, np.floating) for a in avals]


def _vjp_fn(f, avals):
    """f(*all) -> outs, as g(*all, *cts) -> cotangents of its float inputs (a segment's
    forward + backward, timed and measured by record())."""
    mask = _diff_mask(avals)

    def g(*args):
        n = len(avals)
        xs, cts = list(args[:n]), args[n:]
        fl = [x for x, m in zip(xs, mask) if m]

        def h(*fl_):
            it = iter(fl_)
            return f(*[next(it) if m else x for x, m in zip(xs, mask)])
        outs, vjp = jax.vjp(h, *fl)
        return vjp([c if np.issubdtype(o.dtype, np.floating) else np.zeros(o.shape, jax.dtypes.float0)
                    for o, c in zip(outs, cts)])
    return g


def _residuals(loss_fn, params, state, batch, key, names, root):
    """Bytes of what JAX saves for the backward, per segment (a boundary array saved by its
    producer and its consumer counts in the consumer, the batch in the first segment that reads
    it, as the torch recorder), and outside every segment; parameters excluded."""
    def f(p):
        out = loss_fn(p, state, batch, key)
        return out[0] if isinstance(out, tuple) else out
    pleaves, ptree = jax.tree.flatten(params)
    closed = jax.make_jaxpr(lambda *pl: jax.vjp(lambda *q: f(jax.tree.unflatten(ptree, q)), *pl),
                            return_shape=True)(*pleaves)
    cj, shape = closed
    jp = cj.jaxpr
    nres = len(jax.tree.leaves(shape[1]))
    res = [v for v in jp.outvars[len(jp.outvars) - nres:] if _is_var(v)]
    lay = _Layout(jp.eqns, names, root)
    by_name = {n: k for k, n in enumerate(names)}
    batch_ids = set(id(x) for x in jax.tree.leaves(batch))
    batch_vars = set(v for v, c in zip(jp.constvars, cj.consts) if id(c) in batch_ids)
    seg_of = {}
    consumer = {}
    for e, s in zip(jp.eqns, lay.seg):
        for v in e.outvars:
            seg_of[v] = s
        for a in e.invars:
            if _is_var(a) and s is not None and a not in consumer and (
                    seg_of.get(a, s) != s or a in batch_vars):
                consumer[a] = s
    saved = [0] * len(names)
    outside = 0
    invars = set(jp.invars)
    for v in dict.fromkeys(res):
        if v in invars:
            continue   # a parameter
        if v not in seg_of and v not in batch_vars:
            outside += _nbytes(v.aval)   # a constant, the state
            continue
        s = consumer.get(v, seg_of.get(v))
        k = by_name.get(lay.names[s]) if s is not None else None
        if k is None:
            outside += _nbytes(v.aval)
        else:
            saved[k] += _nbytes(v.aval)
    return saved, outside


def _tree_bytes(tree):
    return sum(int(np.prod(np.shape(x), dtype=np.int64)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def step_memory(compiled):
    """XLA's peak of a compiled step (bytes): arguments + outputs - aliased + temporaries, from
    compiled.memory_analysis()."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def record_trace(loss_fn, params, state, batch, key, *, segments=None, optimizer=None, copy_gbps=10.0,
                 model_name=None):
    """As record(), but returns the trace as a dict and writes nothing."""
    leaves_in = (params, state, batch, key)
    counts = _tree_parts(*leaves_in)
    closed = jax.make_jaxpr(loss_fn)(*leaves_in)
    split = _Split(closed, segments)
    lay = split.layout
    if not lay.names:
        raise RecordError("the step has no named scopes: use Flax modules or jax.named_scope, or pass segments=[...]")
    if lay.missing:
        raise RecordError(f"segment(s) {', '.join(lay.missing)} not found under scope "
                          f"'{'/'.join(lay.root) or '(none)'}' of the step; the scopes there are: "
                          f"{', '.join(_Layout(closed.jaxpr.eqns).names)}")
    if lay.split:
        raise RecordError(f"segment(s) {', '.join(lay.split)} run in several pieces (called more than "
                          "once, or interleaved with other ops): name contiguous scopes with segments=[...]")
    org = _origins(split, counts)
    paths = ([p for p, _ in _leaf_paths(params, "params")] + [p for p, _ in _leaf_paths(state, "state")]
             + [p for p, _ in _leaf_paths(batch, "batch")] + [p for p, _ in _leaf_paths(key, "key")])
    jp = closed.jaxpr
    env = dict(zip(jp.constvars, closed.consts))
    env.update(zip(jp.invars, jax.tree.leaves(leaves_in)))
    saved, outside_res = _residuals(loss_fn, params, state, batch, key, lay.names, lay.root)
    buffers, segs = {}, []
    for s, eqns, ins, outs in split.runs:
        vals = [env[v] for v in ins]
        if s is None:   # glue outside every segment: run op by op, nothing to measure
            _eval_eqns(eqns, env)
            continue
        f = _run_fn(eqns, ins, outs)
        fj = jax.jit(f)
        res = fj(*vals)
        env.update(zip(outs, res))
        name = lay.names[s]
        state_acc = []
        in_bytes = 0
        for v in ins:
            kind, i = org.get(v, ("act", None))
            if kind in ("state", "key") and i is not None:
                bid = paths[i]
                buffers.setdefault(bid, {"id": bid, "kind": "buffer" if kind == "state" else "key",
                                         "bytes": _nbytes(v.aval)})
                state_acc.append({"buffer": bid, "read": True, "version_read": 0, "bytes_read": _nbytes(v.aval)})
            elif kind in ("act", "batch"):
                in_bytes += _nbytes(v.aval)
        out_bytes = sum(_nbytes(v.aval) for v in outs)
        fwd_ms = _median_ms(fj, vals)
        avals = [v.aval for v in ins]
        g = jax.jit(_vjp_fn(f, avals))
        cts = [np.ones(o.shape, o.dtype) for o in res]
        comp = g.lower(*vals, *cts).compile()
        temp = comp.memory_analysis().temp_size_in_bytes
        bwd_ms = max(0.0, _median_ms(comp, vals + cts) - fwd_ms)
        in_grads = sum(_nbytes(a) for a, m in zip(avals, _diff_mask(avals)) if m)
        segs.append({"name": name, "forward_ms": round(fwd_ms, 4), "backward_ms": round(bwd_ms, 4),
                     "saved_bytes": saved[s], "input_bytes": in_bytes, "output_bytes": out_bytes,
                     "transient_bytes": max(out_bytes, temp + out_bytes + in_grads - saved[s]),
                     "ops_hash": _ops_hash(eqns), "state": state_acc, "rng": []})
    param_bytes = _tree_bytes(params)
    if optimizer is not None:
        opt_state = jax.eval_shape(optimizer.init, params)
        opt_bytes = _tree_bytes(opt_state)

        def upd(g, o, p):
            import optax
            u, o2 = optimizer.update(g, o, p)
            return optax.apply_updates(p, u), o2
        comp = jax.jit(upd).lower(params, opt_state, params).compile()
        step_bytes = int(comp.memory_analysis().temp_size_in_bytes) + param_bytes
    else:
        opt_bytes, step_bytes = 2 * param_bytes, 0
    out_shape = jax.eval_shape(loss_fn, *leaves_in)
    outside = (_tree_bytes(batch) + _tree_bytes(key) + _tree_bytes(out_shape) + outside_res)
    fp = fingerprint(params, state)
    return {"format": "ckptkit-trace", "format_version": 2,
            "source": f"ckptkit.replay.jax jax {jax.__version__}", "framework": "jax",
            "model": model_name or getattr(loss_fn, "__qualname__", "loss_fn"),
            "fingerprint": fp, "device": {"name": jax.default_backend(), "copy_gbps": copy_gbps},
            "fixed": {"param_bytes": param_bytes, "grad_bytes": param_bytes, "optimizer_bytes": opt_bytes,
                      "outside_bytes": outside, "step_bytes": step_bytes},
            "step_ms": round(sum(x["forward_ms"] + x["backward_ms"] for x in segs), 4),
            "backward_order": [x["name"] for x in reversed(segs)],
            "buffers": list(buffers.values()), "segments": segs}


def record(loss_fn, params, state, batch, key, *, segments=None, path=None, optimizer=None, copy_gbps=10.0,
           force=False, model_name=None):
    """Record one JAX training step as a ckptkit trace (formats/trace.md, "framework": "jax");
    returns the trace file's path.

    loss_fn(params, state, batch, key) -> loss or (loss, aux): the differentiated part of the
      step (params: the pytree differentiated; state: mutable collections such as Flax's
      batch_stats, read and returned new; batch: arrays; key: PRNG key(s)). Nothing is mutated.
    segments: scope paths relative to the root module / outermost scope ("block0",
      "encoder/layer_0"); None: the scopes directly under it in forward order. RecordError when
      a segment is missing or its ops are not contiguous.
    optimizer: an optax GradientTransformation; its state's bytes and the update's XLA
      temporaries are the trace's optimizer_bytes / step_bytes (None: 2 x params, 0).
    path: where to write (atomic; an existing file needs force=True); None: a temporary file
      (ckptkit-*.trace.json, yours to delete).
    Per segment (bytes / ms): saved_bytes = the residuals JAX keeps for its backward (parameters
    excluded), input_bytes / output_bytes = its boundary arrays, transient_bytes = XLA's
    temporaries of its compiled forward + backward + the incoming cotangent + input gradients
    less saved_bytes, forward_ms / backward_ms = medians of its jitted forward and backward,
    state = the batch_stats leaves (kind "buffer") and keys (kind "key") it reads.
    """
    return _write_trace(record_trace(loss_fn, params, state, batch, key, segments=segments, optimizer=optimizer,
                                     copy_gbps=copy_gbps, model_name=model_name), path, force)


def _host_identity(xs):
    """The arrays xs unchanged, through a host callback: XLA cannot see through it, so what is
    computed from its outputs is neither merged with the forward (CSE) nor run before they exist."""
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
    return jax.pure_callback(lambda *a: [np.asarray(v) for v in a], shapes, *xs)


def _plain(aval):
    return np.issubdtype(aval.dtype, np.number) or aval.dtype == np.bool_


def _recompute(f, avals, is_param, remat):
    """f(*inputs) -> outputs that keeps only its inputs for the backward and recomputes there.
    remat "checkpoint": jax.checkpoint(policy=nothing_saveable, prevent_cse=True). remat
    "callback": a custom VJP whose backward recomputes f from its non-parameter inputs and the
    incoming cotangents passed through _host_identity (the recompute waits for the cotangent
    and stays a recompute: XLA:CPU drops jax.checkpoint's optimization barriers before CSE and
    schedules a recompute as soon as its inputs exist, so the forward's arrays stay alive)."""
    if remat == "checkpoint":
        return jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=True)
    mask = _diff_mask(avals)
    fence = [i for i, a in enumerate(avals) if _plain(a) and not is_param[i]]

    @jax.custom_vjp
    def g(*xs):
        return f(*xs)

    def fwd(*xs):
        return f(*xs), xs

    def bwd(xs, cts):
        cts = list(cts)
        live = [k for k, c in enumerate(cts) if np.issubdtype(c.dtype, np.floating)]
        moved = _host_identity([xs[i] for i in fence] + [cts[k] for k in live])
        xs = list(xs)
        for i, v in zip(fence, moved):
            xs[i] = v
        for k, v in zip(live, moved[len(fence):]):
            cts[k] = v
        grads = iter(_vjp_fn(f, avals)(*xs, *cts))
        return tuple(next(grads) if m else np.zeros(a.shape, jax.dtypes.float0) for a, m in zip(avals, mask))
    g.defvjp(fwd, bwd)
    return g


def apply(loss_fn, plan_obj, budget=None, *, remat="auto"):
    """A function with loss_fn's signature and values whose backward follows one entry of a plan
    made from record(): each segment the entry recomputes keeps only its inputs for the backward
    and is recomputed there (JAX functions are pure: the same keys and state give the same bits).

    plan_obj: a Plan or a plan file's path; budget: which entry (as ckptkit.replay.apply).
    remat: "checkpoint" (jax.checkpoint with the nothing_saveable policy), "callback" (a custom
    VJP whose recompute reads its inputs and the incoming cotangent through a host identity:
    XLA:CPU otherwise merges the recompute back into the forward) or "auto" (default: callback
    on the CPU backend, checkpoint elsewhere).
    Raises StalePlan on the first call (trace) when the params / state fingerprint (leaf paths,
    shapes, dtypes) is not the plan's, a planned segment is missing, or a segment's ops hash
    differs (another dropout rate, activation or remat policy inside it); BadInput for a bad
    plan, budget or remat.
    """
    if remat == "auto":
        remat = "callback" if jax.default_backend() == "cpu" else "checkpoint"
    if remat not in ("checkpoint", "callback"):
        raise BadInput(f"ckptkit.replay.jax: error: remat must be 'auto', 'checkpoint' or 'callback', not {remat!r}",
                       None, "bad remat")
    if not isinstance(plan_obj, Plan):
        plan_obj = Plan.load(plan_obj)
    entry = select_entry(plan_obj, budget)
    recompute = {s["name"] for s in entry.get("segments", []) if s.get("decision", "keep") != "keep"}
    names = [s["name"] for s in entry.get("segments", [])]
    hashes = {s["name"]: s.get("ops_hash") for s in entry.get("segments", [])}
    fp = plan_obj.fingerprint

    def applied(params, state, batch, key):
        args = (params, state, batch, key)
        mine = fingerprint(params, state)["hash"]
        if fp and mine != fp:
            raise StalePlan(None, f"the plan was made for another model (fingerprint {fp}, this step's "
                                  f"params and state give {mine}): record and plan again")
        closed, out_shape = jax.make_jaxpr(loss_fn, return_shape=True)(*args)
        split = _Split(closed, names or None)
        lay = split.layout
        if lay.missing or lay.split:
            bad = lay.missing or lay.split
            raise StalePlan(bad[0], "not found as one contiguous scope in this step: the plan was made for "
                                    "another model; record and plan again")
        jp = closed.jaxpr
        env = dict(zip(jp.constvars, closed.consts))
        env.update(zip(jp.invars, jax.tree.leaves(args)))
        params_in = set(jp.invars[:len(jax.tree.leaves(params))])
        for s, eqns, ins, outs in split.runs:
            name = lay.names[s] if s is not None else None
            if name is not None and hashes.get(name) and _ops_hash(eqns) != hashes[name]:
                raise StalePlan(name, f"ops hash {_ops_hash(eqns)} is not the plan's {hashes[name]}: "
                                      "the segment computes something else now; record and plan again")
            if name in recompute:
                f = _run_fn(eqns, ins, outs)
                is_param = [v in params_in for v in ins]
                res = _recompute(f, [v.aval for v in ins], is_param, remat)(*[env[v] for v in ins])
                env.update(zip(outs, res))
            else:
                _eval_eqns(eqns, env)
        flat = [a.val if not _is_var(a) else env[a] for a in jp.outvars]
        return jax.tree.unflatten(jax.tree.structure(out_shape), flat)
    applied.__wrapped__ = loss_fn
    return applied
