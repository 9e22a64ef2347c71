"""The contract runtime: a plan applied to a live model in the user's own training loop. See
ckptkit.replay.apply."""
import weakref

import torch
import torch.utils.checkpoint as tuc

from .._errors import BadInput

from ._common import (ContractError, OpsHash, SegmentOpsMode, StalePlan, all_streams, buffer_owner,
                      byte_view, digest, generator_names, model_fingerprint, stream_state,
                      set_stream_state, tensors_in)


# module -> the Applied handle whose segment patches its forward: one plan at a time per module
_patched = weakref.WeakKeyDictionary()


class _Segment:
    """One segment of an applied plan: replaces the module's forward (an instance attribute,
    removed by remove()). Training forwards (module.training and grad enabled) of a recomputed
    segment run under torch.utils.checkpoint (use_reentrant=False, preserve_rng_state=False)
    with the replay contract; kept segments and every eval / no_grad forward call the original
    forward. The first training forward of every segment is checked against the plan's ops
    hash."""

    def __init__(self, handle, name, module, entry, layout):
        self.h, self.name, self.module = handle, name, module
        self.decision = entry["decision"]
        self.contract = entry.get("contract", {}) or {}
        self.ops_hash = entry.get("ops_hash") or layout["ops_hash"].get(name)
        self.layout = layout
        self.had_attr = "forward" in module.__dict__
        self.orig = module.forward
        self.checked = self.ops_hash is None
        self.recompute_on = self.decision != "keep"
        restored = [r["buffer"] for r in self.contract.get("restore", [])]
        self.touched = restored + [x["buffer"] for x in self.contract.get("discard", [])
                                   if x["buffer"] not in restored]
        self.rng_streams = [g["stream"] for g in self.contract.get("rng", [])]
        module.forward = self.forward

    def remove(self):
        if self.had_attr:
            self.module.forward = self.orig
        else:
            del self.module.forward

    # ---- state lookup
    def kind(self, b):
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
        owner, attr = buffer_owner(self.h.model, b)
        return getattr(owner, attr)

    # ---- forward
    def forward(self, *args, **kw):
        if not (self.module.training and torch.is_grad_enabled()):
            return self.orig(*args, **kw)
        if not self.recompute_on:
            return self.run_checked(self.orig, args, kw)
        call = _Call(self, args)
        watch = self.watch_before()
        # The positional arguments stay with `call`, not torch: torch 2.x's checkpoint keeps its
        # inputs as saved tensors, version-checked when the recompute unpacks them, so an input
        # written in place after its read (by this segment or a later one) would fail before
        # the recompute restores it; torch 1.13 kept plain references, as `call` does.
        out = tuc.checkpoint(call, use_reentrant=False, preserve_rng_state=False, **kw)
        self.watch_after(watch)
        for t in tensors_in(out):
            if t.requires_grad:
                t.register_hook(call.before_backward)
        return out

    def run_checked(self, fn, args, kw):
        """fn(*args, **kw); on the segment's first training forward under the ops hash, which
        must be the plan's (else StalePlan)."""
        if self.checked:
            return fn(*args, **kw)
        ops = OpsHash()
        with SegmentOpsMode(lambda: self.name, ops):
            out = fn(*args, **kw)
        got = ops.hexdigest(self.name)
        self.checked = True
        if got != self.ops_hash:
            raise StalePlan(self.name, f"its forward ops differ from the recorded ones (ops_hash {got}, "
                                       f"the plan has {self.ops_hash}: an op, a dtype or a scalar argument "
                                       "such as dropout p changed): record and plan again")
        return out

    def watch_before(self):
        """What a recomputed segment's forward must leave alone unless its contract covers it:
        its module's buffers (digests), every other buffer and parameter (object, version)
        and the RNG streams its contract does not restore."""
        model = self.h.model
        mine = {id(b) for b in self.module.buffers()}
        bufs = {}
        for n, b in model.named_buffers():
            if n in self.touched:
                continue
            bufs[n] = (b, b._version, digest(b) if id(b) in mine else None)
        params = {n: (p, p._version) for n, p in model.named_parameters() if n not in self.touched}
        rng = {s: stream_state(model, s) for s in all_streams(model, self.h.gen_names)
               if s not in self.rng_streams}
        return bufs, params, rng

    def watch_after(self, watch):
        bufs, params, rng = watch
        model = self.h.model
        for n, (b, v, d) in bufs.items():
            owner, attr = buffer_owner(model, n)
            now = getattr(owner, attr)
            if now is not b or now._version != v or (d is not None and digest(now) != d):
                raise ContractError(self.name, f"writes buffer '{n}', which its contract does not restore "
                                               "or discard (a plain recompute would apply the write twice): "
                                               "the plan is stale or was edited; record and plan again")
        for n, (p, v) in params.items():
            if p._version != v:
                raise ContractError(self.name, f"writes parameter '{n}' in place, which its contract does "
                                               "not restore: record and plan again")
        for s, st in rng.items():
            if not torch.equal(stream_state(model, s), st):
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
            e = {"shape": t.shape, "dtype": t.dtype, "digest": digest(t)}
            if r["mode"] == "whole":
                e["whole"] = t.detach().clone()
            else:
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
            return self.seg.run_checked(self.seg.orig, self.args, k)
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
                if e is not None and digest(tmp) != e["digest"]:
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
                    owner, attr = buffer_owner(model, b)
                    rebound[b] = cur
                    setattr(owner, attr, tmp)
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
            return seg.orig(*a, **k)
        finally:
            with torch.no_grad():
                for b, cur in rebound.items():
                    owner, attr = buffer_owner(model, b)
                    setattr(owner, attr, cur)
                for b, (cur, now) in overwritten.items():
                    cur.data.copy_(now)
            for s, st in outer.items():
                set_stream_state(model, s, st)


class Applied:
    """The handle apply() returns: the plan entry in force (`entry`, `budget_bytes`), the
    recomputed segments (`recomputed`); remove() (or leaving the `with` block) gives every
    segment its own forward back."""

    def __init__(self, model, plan, entry, layout):
        self.model, self.plan, self.entry = model, plan, entry
        self.budget_bytes = entry.get("budget_bytes")
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
