"""The contract runtime: a plan applied to a live model in the user's own training loop. See
ckptkit.replay.apply."""
import contextlib
import itertools
import operator
import warnings
import weakref

import torch
import torch.utils.checkpoint as tuc

from .._errors import BadInput, CkptkitWarning

from ._ops import sac_kwargs
from ._common import undo_py_scalars
from ._common import (FUNCTION_TAPE, ContractError, FunctionTape, OpsHash, ScalarSnap, ScalarTape, StalePlan,
                      buffer_owner, byte_view, cuda_streams, digest, fast_digest, function_name,
                      generator_names, model_fingerprint, py_scalar_holders, stream_state,
                      set_stream_state, tensors_in)


def _versions(tensors):
    """The tensors' version counters (None for None), by a C-level map."""
    return list(map(getattr, tensors, itertools.repeat("_version"), itertools.repeat(None)))


# module -> the Applied handle whose segment patches its forward: one plan at a time per module
_patched = weakref.WeakKeyDictionary()


class _Segment:
    """One segment of an applied plan: replaces the module's forward (an instance attribute,
    removed by remove()). Training forwards (module.training and grad enabled) of a recomputed
    segment run under torch.utils.checkpoint (use_reentrant=False, preserve_rng_state=False)
    with the replay contract; kept segments and every eval / no_grad forward call the original
    forward. A recomputed segment's first training forward is checked against the plan's ops
    hash; every one of its training forwards keeps its Python scalars and the scalar arguments
    of its ops for its recompute (_Call). Kept segments are never checked: nothing of theirs is
    replayed. What a call needs is looked up once here (watch lists, state kinds, the scalar
    holders); the output-gradient hook is set only where the contract has state to rebuild."""

    def __init__(self, handle, name, module, entry, layout):
        self.h, self.name, self.module = handle, name, module
        self.decision = entry["decision"]
        self.contract = entry.get("contract", {}) or {}
        self.ops_hash = entry.get("ops_hash") or layout["ops_hash"].get(name)
        self.layout = layout
        self.had_attr = "forward" in module.__dict__
        self.orig = module.forward
        self.recompute_on = self.decision != "keep"
        self.checked = self.ops_hash is None or not self.recompute_on
        self.py_holders = py_scalar_holders(module) if self.recompute_on else []
        restored = [r["buffer"] for r in self.contract.get("restore", [])]
        self.touched = restored + [x["buffer"] for x in self.contract.get("discard", [])
                                   if x["buffer"] not in restored]
        self.rng_streams = [g["stream"] for g in self.contract.get("rng", [])]
        self.kinds = {b: self._kind(b) for b in self.touched}
        self.owners = {}
        self.snap = ScalarSnap(self.py_holders) if self.recompute_on else None
        # the scalar tape's level, decided on the first taped forward: "function" (FunctionTape)
        # where every aten op with a Python number ran inside a torch function, else "dispatch"
        self.tape_level = None if FUNCTION_TAPE else "dispatch"
        if self.recompute_on:
            self._watch_lists()
        # op-level plans: torch's selective checkpointing saves the entry's save_ops (_ops.py)
        self.ckpt_kw = sac_kwargs(name, entry) if self.recompute_on else {}
        module.forward = self.forward

    def remove(self):
        if self.had_attr:
            self.module.forward = self.orig
        else:
            del self.module.forward

    # ---- state lookup
    def kind(self, b):
        k = self.kinds.get(b)
        return k if k is not None else self._kind(b)

    def _kind(self, b):
        for r in self.contract.get("restore", []):
            if r["buffer"] == b and r.get("kind"):
                return r["kind"]
        return self.layout["kind"].get(b, "buffer")

    def arg_pos(self, b, positions):
        k = None
        for r in self.contract.get("restore", []):
            if r["buffer"] == b and "arg" in r:
                k = r["arg"]
        if k is None:
            k = self.layout["arg"].get((self.name, b))
        return None if k is None or k >= len(positions) else positions[k]

    def current(self, b, args, positions):
        if self.kind(b) == "input":
            pos = self.arg_pos(b, positions)
            if pos is None:
                raise ContractError(self.name, f"input state {b} is not an argument of the call")
            return args[pos]
        owner, attr = self.owner_of(b)
        return getattr(owner, attr)

    def owner_of(self, b):
        """buffer_owner(model, b), looked up once per segment."""
        o = self.owners.get(b)
        if o is None:
            o = self.owners[b] = buffer_owner(self.h.model, b)
        return o

    def rebind(self, b, t):
        """Set state `b` (a module buffer) to tensor `t`: the owner's buffer entry (what
        Module.__setattr__ ends with for a registered buffer), else setattr."""
        owner, attr = self.owner_of(b)
        if attr in owner._buffers:
            owner._buffers[attr] = t
        else:
            setattr(owner, attr, t)

    # ---- forward
    def forward(self, *args, **kw):
        if not (self.module.training and torch.is_grad_enabled()):
            return self.orig(*args, **kw)
        if not self.h.noted:
            self.h.observe(self, args)
        if not self.recompute_on:
            return self.orig(*args, **kw)
        call = _Call(self, args)
        watch = self.watch_before()
        # The positional arguments stay with `call`, not torch: torch 2.x's checkpoint keeps its
        # inputs as saved tensors, version-checked when the recompute unpacks them, so an input
        # written in place after its read (by this segment or a later one) would fail before
        # the recompute restores it; torch 1.13 kept plain references, as `call` does.
        out = tuc.checkpoint(call, use_reentrant=False, preserve_rng_state=False, **self.ckpt_kw, **kw)
        self.watch_after(watch)
        if self.touched:   # state to rebuild: built and checked when the output gradient arrives
            for t in tensors_in(out):
                if t.requires_grad:
                    t.register_hook(call.before_backward)
        return out

    def run_taped(self, args, kw):
        """The segment's forward under a ScalarTape (returns (output, tape)); on its first
        training forward also under the ops hash, which must be the plan's (else StalePlan)."""
        ops = None if self.checked else OpsHash()
        check = self.h.check_scalars
        if ops is None and not check:
            return self.orig(*args, **kw), None
        if ops is None and self.tape_level == "function":
            mode = FunctionTape()
            with mode:
                out = self.orig(*args, **kw)
            return out, ("function", mode.tape)
        # the first taped forward also learns whether FunctionTape sees every Python number
        cover = FunctionTape(cover=True) if check and self.tape_level is None else None
        mode = ScalarTape(ops=ops, name=self.name, cover=cover)
        with (cover if cover is not None else contextlib.nullcontext()), mode:
            out = self.orig(*args, **kw)
        if cover is not None:
            self.tape_level = "dispatch" if mode.uncovered else "function"
        if ops is not None:
            got = ops.hexdigest(self.name)
            self.checked = True
            if got != self.ops_hash:
                raise StalePlan(self.name, f"its forward ops differ from the recorded ones (ops_hash {got}, "
                                           f"the plan has {self.ops_hash}: an op, a dtype, a flag or a string "
                                           "argument changed, or dropout was switched on or off): record and plan again")
        return out, ("dispatch", mode.tape) if check else None

    def scalar_changed(self, i, func, want, got):
        """ContractError for a recompute whose op `i` differs from its forward's: the argument
        and both values, the Python objects holding that value now, and the fix."""
        if want is None or want[0] != func:
            what = (f"its recompute runs {function_name(func)} as op {i} where its forward ran "
                    f"{function_name(want[0]) if want else 'no more ops'}: its control flow depends on Python state that "
                    "changed between the forward and the backward")
        else:
            pos, w, g = next(((k, a, b) for k, (a, b) in enumerate(zip(want[1], got[1])) if a != b),
                             ("keyword", want[2], got[2]))
            holders = _holders_of(self.module, self.name, g)
            what = (f"its recompute passes {g!r} to {function_name(func)} (argument {pos}) where its forward passed {w!r}: "
                    f"a Python scalar it reads ({', '.join(holders) if holders else 'not a numeric attribute of its modules'}) "
                    "changed between the forward and the backward, and the runtime keeps per call only the numeric "
                    "attributes of the segment's modules and the numeric globals of their Python modules")
        if getattr(getattr(self.h.model, "config", None), "use_cache", False) is True:
            # a Hugging Face model with its KV cache on: the forward and the recompute both grow it
            raise ContractError(self.name, what + "; the model's config has use_cache=True (Hugging Face), whose cache "
                                                   "the forward and the recompute both update: call the model with "
                                                   "use_cache=False when training (replay.enable() does)")
        raise ContractError(self.name, what + "; hold the value in such an attribute or in a tensor buffer "
                                               "(register_buffer), or change it only after backward()")

    def _watch_lists(self):
        """What watch_before reads, resolved once: (name, owner's buffer dict, attribute, own)
        per buffer and (name, parameter dict, attribute) per parameter outside the contract, and
        the model generators' streams it does not restore."""
        model, touched = self.h.model, set(self.touched)
        mine = {id(b) for b in self.module.buffers()}
        self.w_bufs, self.w_params = [], []
        for n, b in model.named_buffers():
            if n not in touched:
                owner, attr = buffer_owner(model, n)
                self.w_bufs.append((n, owner._buffers, attr, id(b) in mine))
        for n, _ in model.named_parameters():
            if n not in touched:
                owner, attr = buffer_owner(model, n)
                self.w_params.append((n, owner._parameters, attr))
        # the same as parallel lists, read by C-level maps per call (watch_before)
        self.w_buf_dicts = [d for _, d, _, _ in self.w_bufs]
        self.w_buf_attrs = [a for _, _, a, _ in self.w_bufs]
        self.w_own = [(n, d, a) for n, d, a, own in self.w_bufs if own]
        self.w_par_dicts = [d for _, d, _ in self.w_params]
        self.w_par_attrs = [a for _, _, a in self.w_params]
        self.w_gens = []
        for name in self.h.gen_names.values():
            if "gen:" + name not in self.rng_streams:
                owner, _, attr = name.rpartition(".")
                self.w_gens.append(("gen:" + name, model.get_submodule(owner) if owner else model, attr))

    def _rng_now(self):
        out = [] if "cpu" in self.rng_streams else [("cpu", torch.get_rng_state())]
        out += [(s, torch.cuda.get_rng_state(int(s[5:]))) for s in cuda_streams() if s not in self.rng_streams]
        return out + [(s, getattr(owner, attr).get_state()) for s, owner, attr in self.w_gens]

    @contextlib.contextmanager
    def scalars_as(self, fwd):
        """The segment's Python scalars are the forward's (`fwd`, a ScalarSnap snapshot) inside
        the block and as before it afterwards (the recompute's writes undone): py_scalars_as,
        with the common case (nothing changed) at C speed."""
        snap, holders = self.snap, self.py_holders
        before = snap.take()
        undo = {} if snap.same(before, fwd) else snap.put(fwd)
        try:
            yield
        finally:
            undo_py_scalars(holders, undo)
            if not snap.same(snap.take(), before):
                snap.put(before)

    def watch_before(self):
        """What a recomputed segment's forward must leave alone unless its contract covers it:
        its module's buffers (digests), every other buffer and parameter (object, version)
        and the RNG streams its contract does not restore."""
        bufs = list(map(dict.get, self.w_buf_dicts, self.w_buf_attrs))
        params = list(map(dict.get, self.w_par_dicts, self.w_par_attrs))
        own = [(n, d, a, fast_digest(b)) for n, d, a in self.w_own for b in (d.get(a),) if b is not None]
        return bufs, _versions(bufs), _versions(params), own, self._rng_now()

    def watch_after(self, watch):
        bufs, bver, pver, own, rng = watch
        now = list(map(dict.get, self.w_buf_dicts, self.w_buf_attrs))
        changed = [n for n, d, a, dg in own if fast_digest(d.get(a)) != dg]
        if changed or not all(map(operator.is_, bufs, now)) or _versions(now) != bver:
            for (n, _, _, _), b, t, v in zip(self.w_bufs, bufs, now, bver):
                if b is not None and (t is not b or t._version != v or n in changed):
                    raise ContractError(self.name, f"writes buffer '{n}', which its contract does not restore "
                                                   "or discard (a plain recompute would apply the write twice): "
                                                   "the plan is stale or was edited; record and plan again")
        pnow = _versions(map(dict.get, self.w_par_dicts, self.w_par_attrs))
        if pnow != pver:
            n = next(n for (n, _, _), v, w in zip(self.w_params, pver, pnow) if v is not None and v != w)
            raise ContractError(self.name, f"writes parameter '{n}' in place, which its contract does "
                                           "not restore: record and plan again")
        after = dict(self._rng_now())
        for s, st in rng:
            if not torch.equal(after[s], st):
                raise ContractError(self.name, f"draws RNG stream {s}, which its contract does not restore "
                                               "(the recompute would draw other numbers): record and plan again")


class _Call:
    """One training forward of a recomputed segment: the state its contract preserves (whole
    copies or byte regions, with a digest of what the segment read) and the RNG states; called
    by torch.utils.checkpoint for the forward, then for the recompute."""

    def __init__(self, seg, args):
        self.seg = seg
        self.args = args   # the segment's positional arguments (torch.utils.checkpoint gets none: _Seg.forward)
        self.positions = [i for i, x in enumerate(args) if torch.is_tensor(x)]
        self.kept = {}
        for r in seg.contract.get("restore", []):
            t = seg.current(r["buffer"], args, self.positions)
            e = {"shape": t.shape, "dtype": t.dtype}
            if r["mode"] == "whole":   # rebuilt from this copy alone: nothing to check it against
                e["whole"] = t.detach().clone()
            else:
                e["digest"] = digest(t)
                bv = byte_view(t)
                e["regions"] = [(o, n, bv[o:o + n].clone()) for o, n in r["regions"]]
            self.kept[r["buffer"]] = e
        self.rng = {s: stream_state(seg.h.model, s) for s in seg.rng_streams}
        self.calls = 0
        self.scratch = None

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == 1:
            self.args_for_build = list(self.args)
            self.py = self.seg.snap.take()   # the Python scalars the forward reads
            out, self.tape = self.seg.run_taped(self.args, k)
            return out
        return self.recompute(list(self.args), k)

    def build(self, a):
        """Scratch copies of every touched state at the version the segment read, checked
        against the digests taken at forward (ContractError otherwise)."""
        seg, out = self.seg, {}
        with torch.no_grad():
            for b in seg.touched:
                cur = seg.current(b, a, self.positions)
                e = self.kept.get(b)
                if e is None:
                    tmp = cur.detach().clone()
                elif "whole" in e:
                    tmp = e["whole"].clone()
                else:
                    nbytes = e["shape"].numel() * torch.empty((), dtype=e["dtype"]).element_size()
                    tb = byte_view(cur)[:nbytes].clone()
                    for o, n, chunk in e["regions"]:
                        tb[o:o + n] = chunk
                    tmp = tb.view(e["dtype"]).reshape(e["shape"])
                if e is not None and "digest" in e and digest(tmp) != e["digest"]:
                    raise ContractError(seg.name, f"state '{b}' cannot be rebuilt at the version the segment "
                                                  "read (its preserved regions do not cover what was written "
                                                  "since): the plan does not fit this step; record and plan again")
                out[b] = tmp
        return out

    def before_backward(self, grad):
        """Output-gradient hook (runs before the segment's backward, where torch keeps the
        exception type): builds and checks the scratch state now."""
        if self.scratch is None and self.calls == 1:
            self.scratch = self.build(self.args_for_build)
        return None

    def recompute(self, a, k):
        seg = self.seg
        model = seg.h.model
        scratch = self.scratch if self.scratch is not None else self.build(a)
        self.scratch = None
        rebound, overwritten = {}, {}
        with torch.no_grad():
            for b, tmp in scratch.items():
                cur = seg.current(b, a, self.positions)
                kind = seg.kind(b)
                if kind == "param":
                    overwritten[b] = (cur, cur.detach().clone())
                    cur.data.copy_(tmp)
                    continue
                if kind == "buffer":
                    rebound[b] = cur
                    seg.rebind(b, tmp)
                pos = seg.arg_pos(b, self.positions)
                if pos is not None:
                    if cur.requires_grad:
                        with torch.enable_grad():
                            tmp = tmp.detach().requires_grad_(True).clone()
                    a[pos] = tmp
        outer = {s: stream_state(model, s) for s in self.rng}
        for s, st in self.rng.items():
            set_stream_state(model, s, st)
        try:
            with seg.scalars_as(self.py):   # the forward's values; the recompute's writes undone
                if self.tape is None:
                    return seg.orig(*a, **k)
                level, tape = self.tape
                mode = FunctionTape if level == "function" else ScalarTape
                with mode(check=tape, mismatch=lambda *m: seg.scalar_changed(*m)) as m:
                    try:
                        return seg.orig(*a, **k)
                    except RuntimeError as e:
                        if m.error is None or e is m.error:
                            raise
                        raise m.error from e   # wrapped on its way out (a TorchScript function)
        finally:
            with torch.no_grad():
                for b, cur in rebound.items():
                    seg.rebind(b, cur)
                for b, (cur, now) in overwritten.items():
                    cur.data.copy_(now)
            for s, st in outer.items():
                set_stream_state(model, s, st)


class Applied:
    """The handle apply() returns: the plan entry in force (`entry`, `budget_bytes`), the
    recomputed segments (`recomputed`); remove() (or leaving the `with` block) gives every
    segment its own forward back."""

    # the optimizers a recording without optimizer= assumes (state = 2 x the gradients)
    ASSUMED_OPTIMIZERS = ("Adam", "AdamW")

    def __init__(self, model, plan, entry, layout, optimizer=None, check_scalars=True):
        self.model, self.plan, self.entry = model, plan, entry
        self.check_scalars = check_scalars
        self.budget_bytes = entry.get("budget_bytes")
        self.order = [s["name"] for s in entry["segments"]]
        # segment -> the segments the recording ran just before it (the first: none, or the last)
        self.after = {n: (None, self.order[-1]) if i == 0 else (self.order[i - 1],) for i, n in enumerate(self.order)}
        self.shapes = {n: [torch.Size(x) for x in v] for n, v in layout.get("input_shapes", {}).items()}
        self.last, self.noted = None, False
        want = layout.get("optimizer", "?")
        if optimizer is not None and want != "?":
            got = type(optimizer).__name__
            if got != want if want is not None else got not in self.ASSUMED_OPTIMIZERS:
                self.note(f"the optimizer is {got} where the recording "
                          + (f"had {want}" if want else "assumed Adam (no optimizer= given: state = 2 x the gradients)"))
        self.gen_names = generator_names(model)
        mods = dict(model.named_modules())
        missing = [s["name"] for s in entry["segments"] if s["name"] not in mods]
        if missing:
            raise StalePlan(missing[0], "no module of that name in the model: the plan was made for "
                                        "another model; record and plan again")
        busy = [s["name"] for s in entry["segments"] if mods[s["name"]] in _patched]
        if busy:
            raise BadInput(f"ckptkit.replay: error: segment {busy[0]}: a plan is already applied to this module; "
                           "remove() that handle (or leave its with block) first", None, "already applied")
        self.segments = []
        try:
            for s in entry["segments"]:
                self.segments.append(_Segment(self, s["name"], mods[s["name"]], s, layout))
                _patched[mods[s["name"]]] = self
        except BaseException:
            self.remove()
            raise
        self.recomputed = [s.name for s in self.segments if s.recompute_on]

    def observe(self, seg, args):
        """A training forward of `seg`: note() the first input shapes or segment order that
        differ from the recording."""
        prev, self.last = self.last, seg.name
        want = self.shapes.get(seg.name)
        if want is not None:
            got = [a.shape for a in args if isinstance(a, torch.Tensor)]
            if got != want:
                return self.note(f"segment {seg.name}'s inputs have shapes {[list(x) for x in got]} where the "
                                 f"recording had {[list(x) for x in want]} (another batch or sequence length)")
        after = self.after[seg.name]
        if prev not in after:
            self.note(f"segment {seg.name} ran after {prev or 'no segment'} where the recording ran it after "
                      f"{after[-1] or 'no segment'} (a segment bypassed, or called in another order or twice)")

    def note(self, why):
        """The one CkptkitWarning of this handle: the plan's prediction no longer holds."""
        self.noted = True
        warnings.warn(f"ckptkit.replay: the plan's predicted peak and step time no longer hold: {why}; record "
                      "such a step and plan again for a prediction (the contracts still hold; noted once per "
                      "apply())", CkptkitWarning, stacklevel=3)

    def remove(self):
        """Stop following the plan: every segment's forward is the module's own again."""
        while self.segments:
            seg = self.segments.pop()
            seg.remove()
            if _patched.get(seg.module) is self:
                del _patched[seg.module]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def check_fingerprint(model, want):
    """StalePlan unless the model's fingerprint hash is `want` (the hash, or the trace's
    {"hash", "params", "buffers"}); nothing to check when want is empty."""
    if not want:
        return
    want = want.get("hash") if isinstance(want, dict) else want
    got = model_fingerprint(model)
    if got["hash"] != want:
        raise StalePlan(None, f"the plan was made for another model (fingerprint {want}; this model has "
                              f"{got['hash']}: {got['params']} parameters, {got['buffers']} buffers: parameter "
                              "and buffer names, shapes, dtypes): record and plan again")


def _holders_of(module, name, value):
    """Where a segment's modules hold `value` one level below their attributes (an attribute
    of a plain object, a dict entry): "NAME.cfg.alpha", "NAME.sched['alpha']"."""
    out = []
    for mname, m in module.named_modules(prefix=name):
        for attr, v in vars(m).items():
            if isinstance(v, (torch.nn.Module, torch.Tensor)) or attr.startswith("_"):
                continue
            items = v.items() if isinstance(v, dict) else (vars(v).items() if hasattr(v, "__dict__") else ())
            for k, x in items:
                if type(x) in (int, float) and x == value:
                    out.append(f"{mname}.{attr}['{k}']" if isinstance(v, dict) else f"{mname}.{attr}.{k}")
    return out[:4]
