"""The recorder: one real training step of a live model, recorded as a ckptkit trace
(formats/trace.md, format 2). See ckptkit.replay.record."""
import collections
import contextlib
import inspect
import os
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, record_function
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode_temporarily

from ._common import (COMPILED, OpsHash, RecordError, buffer_owner, compiled, byte_view, generator_by_stream,
                      generator_names, model_fingerprint, ptr, py_scalar_holders, py_scalars,
                      py_scalars_as, rng_states, set_py_scalars, set_rng_states, storage_of,
                      tensor_bytes, tensors_in)

FORMAT = "ckptkit-trace"
FORMAT_VERSION = 2
MERGE_GAP_BYTES = 16          # two written runs closer than one region's metadata are merged
_MARK = "ckpt.mem:"


def diff_regions(before, after, itemsize):
    """Byte regions [offset, length] of `after` that differ from `before` (flat uint8),
    element granular, runs closer than MERGE_GAP_BYTES merged; bytes past the end of `before`
    count as written."""
    n = min(before.numel(), after.numel()) // itemsize * itemsize
    regions = []
    if n > 0:
        a = before[:n].reshape(-1, itemsize)
        b = after[:n].reshape(-1, itemsize)
        changed = (a != b).any(dim=1).nonzero().flatten().tolist()
        start = prev = None
        for e in changed:
            if start is None:
                start = prev = e
            elif (e - prev - 1) * itemsize < MERGE_GAP_BYTES:
                prev = e
            else:
                regions.append([start * itemsize, (prev - start + 1) * itemsize])
                start = prev = e
        if start is not None:
            regions.append([start * itemsize, (prev - start + 1) * itemsize])
    if after.numel() > n:
        if regions and regions[-1][0] + regions[-1][1] + MERGE_GAP_BYTES > n:
            regions[-1][1] = after.numel() - regions[-1][0]
        else:
            regions.append([n, after.numel() - n])
    return regions


def write_extent(t, base):
    """[offset, length]: the bytes of `base` (flat) an in-place write to its view `t` may
    reach, whatever the data (an index_copy_ or a scatter reaches the whole view, so do
    add_s that change a few elements): t's span where it is one run inside a contiguous base,
    else the whole base."""
    isz = base.element_size()
    whole = [0, base.numel() * isz]
    if not base.is_contiguous() or t.element_size() != isz or any(st < 0 for st in t.stride()):
        return whole
    start = t.storage_offset() - base.storage_offset()
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
    lo, hi = start * isz, (start + span) * isz
    return [lo, hi - lo] if 0 <= lo and hi <= whole[1] else whole


def merge_regions(regions):
    """Sorted [offset, length] regions, those that overlap or lie closer than MERGE_GAP_BYTES
    merged."""
    out = []
    for o, n in sorted(r for r in regions if r[1] > 0):
        if out and o <= out[-1][0] + out[-1][1] + MERGE_GAP_BYTES - 1:
            out[-1][1] = max(out[-1][0] + out[-1][1], o + n) - out[-1][0]
        else:
            out.append([o, n])
    return out


def _equal_values(a, b):
    ta, tb = tensors_in(a), tensors_in(b)
    if len(ta) != len(tb):
        return False
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(byte_view(x), byte_view(y))
               for x, y in zip(ta, tb))


class SavedState:
    """Everything a recording may change, put back exactly by restore(): parameter bytes,
    gradients (objects and bytes, or None), buffers (objects and bytes), train/eval flags, every
    RNG stream, the optimizer's state and param_groups, and the Python scalars the runtime
    keeps per call (numeric module attributes, numeric globals of the models' Python modules:
    a step counter the recorded steps advance)."""

    def __init__(self, model, optimizer=None):
        self.model, self.opt = model, optimizer
        with torch.no_grad():
            self.params = [(p, p.detach().clone()) for p in model.parameters()]
            self.grads = [(p, p.grad, None if p.grad is None else p.grad.detach().clone())
                          for p, _ in self.params]
            self.buffers = [(m, k, b, None if b is None else b.detach().clone())
                            for m in model.modules() for k, b in m._buffers.items()]
        self.training = [(m, m.training) for m in model.modules()]
        self.rng = rng_states(model)
        self.py_holders = py_scalar_holders(model)
        self.py = py_scalars(self.py_holders, nones=True)
        if optimizer is not None:
            self.opt_state = {p: {k: (v, v.detach().clone()) if torch.is_tensor(v) else (v, None)
                                  for k, v in s.items()} for p, s in optimizer.state.items()}
            self.groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]

    def restore(self):
        with torch.no_grad():
            for p, v in self.params:
                p.data.copy_(v)
            for p, g, v in self.grads:
                p.grad = g
                if g is not None:
                    g.copy_(v)
            for m, k, b, v in self.buffers:
                m._buffers[k] = b
                if b is not None:
                    b.copy_(v)
        for m, t in self.training:
            m.training = t
        set_rng_states(self.model, self.rng)
        set_py_scalars(self.py_holders, self.py)
        if self.opt is not None:
            with torch.no_grad():
                for p in list(self.opt.state):
                    if p not in self.opt_state:
                        del self.opt.state[p]
                for p, s in self.opt_state.items():
                    new = {}
                    for k, (v, c) in s.items():
                        if c is not None:
                            v.copy_(c)
                        new[k] = v
                    self.opt.state[p] = new
            for g, s in zip(self.opt.param_groups, self.groups):
                g.update(s)


# segment calls with keyword arguments (Hugging Face layers) are seen where hooks get them
_WITH_KWARGS = {"with_kwargs": True} if "with_kwargs" in inspect.signature(nn.Module.register_forward_pre_hook).parameters else {}
TIME_REPEATS = 3    # plain steps timed per recording (the median is the trace's)
MIN_SEGMENTS = 4   # fewer default segments than this: the nn.Sequential ones are opened
# Counted as memory outside segments: small allocations of a step that vary between runs of
# the same step (0-dim tensors, autograd and allocator bookkeeping; docs/benchmarks.md).
SMALL_ALLOC_SLACK = 4096


def discover_segments(model, batch, loss_fn):
    """Default segments: the modules the forward calls, in call order, at the shallowest level
    that covers the step: the root's children, looking into modules never called themselves
    (nn.ModuleList, nn.ModuleDict) and modules called more than once per step (a leaf called
    twice stays outside every segment). An nn.Sequential called once is one segment (recomputing
    a whole block frees what its layers save, where a single layer saves little more than its
    input), unless the level has fewer than MIN_SEGMENTS: then every such nn.Sequential is
    opened into its children, again while too few. Before that, a level of fewer than
    MIN_SEGMENTS opens every segment other than an nn.Sequential holding a stack of layers (see stack(): GPT-2's
    `transformer`, BERT's and torchvision ViT's `encoder`) down to the stack's layers. Runs
    the forward once without gradients
    (the caller restores the state)."""
    calls = collections.Counter()
    first = {}
    names = {}
    for n, m in model.named_modules():
        names.setdefault(id(m), n)

    def pre(mod, inputs):
        n = names[id(mod)]
        calls[n] += 1
        first.setdefault(n, len(first))

    hooks = [m.register_forward_pre_hook(pre) for m in model.modules() if m is not model]
    try:
        with torch.no_grad():
            loss_fn(model, batch)
    finally:
        for h in hooks:
            h.remove()
    mods = dict(model.named_modules())

    def openable(full):
        child = mods[full]
        return type(child) is nn.Sequential and calls.get(full, 0) == 1 and any(True for _ in child.children())

    def level(mod, prefix):
        out = []
        for cname, child in mod.named_children():
            full = prefix + cname
            c = calls.get(full, 0)
            if c != 1 and any(True for _ in child.children()):
                out += level(child, full + ".")   # never called itself, or called repeatedly
            elif c == 1:
                out.append(full)
        return out

    def stack(full):
        """A stack of layers: an nn.Sequential called once, or a module never called itself
        (nn.ModuleList, nn.ModuleDict), with at least 2 children, each a module with children
        of its own called once (transformer blocks: transformer.h, encoder.layer, encoder.layers)."""
        m = mods[full]
        c = calls.get(full, 0)
        if not (type(m) is nn.Sequential and c == 1) and c != 0:
            return False
        kids = list(m.named_children())
        return len(kids) >= 2 and all(calls.get(full + "." + k, 0) == 1 and any(True for _ in v.children())
                                      for k, v in kids)

    def has_stack(full):
        return any(stack(d) for d in mods if d.startswith(full + ".")) or stack(full)

    def open_stacks(full):
        """A segment holding a stack of layers (a transformer's `transformer` / `encoder`,
        neither nn.Sequential nor nn.ModuleList) opened down to the layers of its stacks."""
        if stack(full):
            return level(mods[full], full + ".")
        out = []
        for n in level(mods[full], full + "."):
            out += open_stacks(n) if has_stack(n) else [n]
        return out

    segs = level(model, "")
    def opens(n):   # nn.Sequential segments are opened by the loop below, as before
        return type(mods[n]) is not nn.Sequential and has_stack(n)

    if 0 < len(segs) < MIN_SEGMENTS and any(opens(n) for n in segs):
        segs = [x for n in segs for x in (open_stacks(n) if opens(n) else [n])]
    while 0 < len(segs) < MIN_SEGMENTS and any(openable(n) for n in segs):
        segs = [x for n in segs for x in (level(mods[n], n + ".") if openable(n) else [n])]
    segs = sorted(segs, key=lambda n: first[n])
    if not segs:
        raise RecordError("the model calls no submodule once per step: pass segments=[names]")
    return segs


class OpLog(TorchDispatchMode):
    """Logs every aten op of the recorded step into the current segment's record: storages
    read, written ((a!) arguments, copied before the first write when they are tracked state:
    copy on write; the bytes each write may reach: write_extent), born, the generator= argument
    and the op hash. Outside segments a write to tracked state is an error."""

    def __init__(self, rec):
        super().__init__()
        self.rec = rec
        self.gens = {name: generator_by_stream(rec.model, "gen:" + name) for name in rec.gen_names.values()}

    def which_generator(self, v):
        state = v.get_state()
        for name, g in self.gens.items():
            s = g.get_state()
            if not torch.equal(s, state):
                continue
            g.manual_seed(g.initial_seed() + 1)
            follows = torch.equal(v.get_state(), g.get_state())
            g.set_state(s)
            if follows:
                return name
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        R = self.rec
        cur = R.current
        r = R.records.get(cur) if cur is not None else None
        if r is not None:
            R.ops.add(cur, func, args, kwargs)
        ins = set()
        schema = func._schema.arguments
        for i, a in enumerate(schema):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            written = a.alias_info is not None and a.alias_info.is_write
            if r is not None or written:
                for t in tensors_in(v):
                    p = ptr(t)
                    if not p:
                        continue
                    ins.add(p)
                    if r is None:
                        if p in R.tracked_ptr:
                            raise RecordError(f"state written outside any segment: {R.tracked_ptr[p][0]} "
                                              f"({func}); make the module that writes it a segment")
                        continue
                    r["reads"].add(p)
                    if written:
                        r["writes"].add(p)
                        for name in R.tracked_ptr.get(p, ()):
                            if name not in r["cow"] and R.kind[name] != "buffer":
                                r["cow"][name] = byte_view(R.tensor(name)).clone()
                            r["extents"].setdefault(name, []).append(write_extent(t, R.tensor(name)))
            if r is not None and "Generator" in str(a.type):
                if v is None:
                    dev = next((t.device for t in tensors_in(list(args)) if t.device.type != "cpu"),
                               torch.device(kwargs.get("device") or "cpu"))
                    if dev.type == "cuda":
                        r["generators"].add(f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}")
                    else:
                        r["generators"].add("cpu")
                else:
                    g = self.which_generator(v)
                    if g is None:
                        r["unknown_generator"] = str(func)
        out = func(*args, **kwargs)
        if r is not None:
            for t in tensors_in(out):
                p = ptr(t)
                if p and p not in ins:
                    r["born"].add(p)
        return out


@contextlib.contextmanager
def _unlogged():
    """Ops run here bypass the active op log (the recorder's own snapshots and copies in its
    segment hooks are not the model's work, and logging them cost most of a recording)."""
    if _get_current_dispatch_mode() is None:
        yield
        return
    with _pop_mode_temporarily():
        yield


def _start_us(e):
    """A kineto event's start in whole microseconds (torch 1.13: start_us(); torch 2.x:
    start_ns() only, truncated to the same microsecond grid, so ties order as before)."""
    return e.start_us() if hasattr(e, "start_us") else e.start_ns() // 1000


def _duration_us(e):
    """A kineto event's duration in whole microseconds (see _start_us)."""
    return e.duration_us() if hasattr(e, "duration_us") else e.duration_ns() // 1000


@contextlib.contextmanager
def _memory_events():
    """torch's CPU profiler with memory events, without torch.profiler's parse of every event
    into Python objects on exit (most of the profiled step's cost): yields a list that holds
    the raw kineto events (name(), start time, duration, nbytes(), device_type()) when the
    block ends."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.autograd import (ProfilerConfig, ProfilerState, _disable_profiler, _enable_profiler,
                                _prepare_profiler)
    cfg = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
    acts = {ProfilerActivity.CPU}
    _prepare_profiler(cfg, acts)
    _enable_profiler(cfg, acts)
    out = []
    try:
        yield out
    finally:
        out.extend(_disable_profiler().events())


class Recorder:
    """Records one training step, loss_fn(model, batch).backward(), of a live model. Phases
    (record()): segments, the op-logged step, the replay probe, the memory step (profiler memory
    events, keep everything) with the optimizer step, TIME_REPEATS plain timed steps (the
    segments' forward_ms / backward_ms), then the trace. The model, its gradients,
    buffers, RNG streams and the optimizer are restored exactly afterwards."""

    def __init__(self, model, batch, loss_fn, segments=None, optimizer=None, copy_gbps=10.0,
                 model_name=None, source="ckptkit.replay"):
        if not isinstance(model, nn.Module):
            raise RecordError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if compiled(model):
            raise RecordError(COMPILED)
        self.model, self.batch, self.loss_fn = model, batch, loss_fn
        self.names, self.opt, self.copy_gbps = segments, optimizer, float(copy_gbps)
        self.model_name = model_name or type(model).__name__
        self.source = source
        self.timing = {}
        self.owners = {}   # buffer name -> (module, attribute), found once
        self.views = {}    # buffer name -> (tensor, its flat byte view): snap's compares

    # ---- driver
    def record(self):
        """The trace dict of the step (formats/trace.md); the model is left as it was."""
        saved = SavedState(self.model, self.opt)
        t0 = time.perf_counter()
        try:
            self.model.train()
            self.fingerprint = model_fingerprint(self.model)
            if self.names is None:
                names = discover_segments(self.model, self.batch, self.loss_fn)
                saved.restore()
                self.model.train()
                self.default_segments = True
            else:
                names = list(self.names)
                self.default_segments = False
            mods = dict(self.model.named_modules())
            missing = [n for n in names if n not in mods or n == ""]
            if missing:
                raise RecordError(f"unknown segment module(s): {missing}")
            if len(set(names)) != len(names):
                raise RecordError(f"segment named twice: {names}")
            self.segs = {n: mods[n] for n in names}
            self.timing["segments"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            self.run_step()
            self.timing["step"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            non_replayable = self.find_non_replayable()
            self.timing["probe"] = time.perf_counter() - t1
            self.state_accesses()
            self.count_saved()
            saved.restore()
            self.model.train()
            t1 = time.perf_counter()
            self.measure_memory()
            self.timing["memory"] = time.perf_counter() - t1
            saved.restore()
            self.model.train()
            t1 = time.perf_counter()
            self.measure_times()
            self.timing["times"] = time.perf_counter() - t1
            return self.trace(non_replayable)
        finally:
            for h in getattr(self, "handles", []):
                h.remove()
            saved.restore()
            self.timing["total"] = time.perf_counter() - t0

    # ---- tracked state
    def owner(self, name):
        """(module, attribute) of buffer `name`, found once."""
        o = self.owners.get(name)
        if o is None:
            o = self.owners[name] = buffer_owner(self.model, name)
        return o

    def tensor(self, name):
        if self.kind[name] == "buffer":   # looked up at each use: a rebinding is seen
            return getattr(*self.owner(name))
        return self.fixed[name]

    def rebuild_ptrs(self):
        """storage pointer -> tracked names (buffers and parameters before inputs)."""
        out = {}
        for n in sorted(self.kind, key=lambda n: self.kind[n] == "input"):
            t = self.tensor(n)
            if t is not None:
                p = ptr(t)
                if p:
                    out.setdefault(p, []).append(n)
        self.tracked_ptr = out

    def snap(self, prev=None):
        """name -> (object, _version, shape, bytes or None): buffers with their bytes (the
        previous snapshot's copy reused when equal), parameters and inputs without (written
        ones are copied on write by the op log)."""
        out = {}
        for n, k in self.kind.items():
            t = self.tensor(n)
            if t is None:
                continue
            data = None
            if k == "buffer":
                old = prev.get(n) if prev else None
                view = self.views.get(n)   # a contiguous buffer's flat byte view, while it is bound
                if (view is not None and view[0] is t and view[1].data_ptr() == t.data_ptr()
                        and view[1].numel() == t.numel() * t.element_size()):   # not resized in place
                    bv = view[1]
                else:
                    bv = byte_view(t)
                    if t.is_contiguous():
                        self.views[n] = (t, bv)
                if old is not None and old[3] is not None and old[3].shape == bv.shape and torch.equal(old[3], bv):
                    data = old[3]
                else:
                    data = bv.clone()
            out[n] = (t, t._version, tuple(t.shape), data)
        return out

    @staticmethod
    def changed(b, a):
        return (b[0] is not a[0] or b[1] != a[1] or b[2] != a[2]
                or (b[3] is not None and a[3] is not None and b[3] is not a[3]))

    # ---- phase 1: the step
    def pre(self, mod, inputs, kwargs=None):
        """Forward pre-hook of a segment (the recorder's own tensor work stays out of the op log);
        kwargs: the call's keyword arguments (torch >= 2.0: with_kwargs hooks)."""
        with _unlogged():
            self._pre(mod, inputs, kwargs or {})

    def post(self, mod, inputs, output):
        """Forward hook of a segment (the recorder's own tensor work stays out of the op log)."""
        with _unlogged():
            return self._post(mod, inputs, output)

    def _pre(self, mod, inputs, kwargs):
        if self.probing:
            return
        name = self.seg_of[id(mod)]
        if name in self.info:
            raise RecordError(f"segment {name} called more than once per step: a module used twice in a step (T5's "
                              "encoder.dropout) cannot be a segment; name a module that calls it once (its parent)")
        now = self.snap(self.last_snap)
        bad = [n for n in now if n in self.last_snap and self.changed(self.last_snap[n], now[n])]
        if bad:
            raise RecordError(f"state written outside any segment (before segment {name}): {sorted(bad)}"
                              + self.hint())
        rng = rng_states(self.model, self.gen_names)
        for stream, s0 in self.last_rng.items():
            if not torch.equal(rng[stream], s0):
                raise RecordError(f"RNG stream {stream} consumed outside segments before segment {name}"
                                  + self.random_outside() + self.hint())
        args = [x for x in inputs if torch.is_tensor(x)]
        arg_names = []
        for k, x in enumerate(args):
            existing = [n for n in self.tracked_ptr.get(ptr(x), []) if self.kind[n] != "input"]
            if existing and self.tensor(existing[0]) is x:
                arg_names.append(existing[0])
            elif existing and ptr(x):
                arg_names.append(existing[0])
            else:
                n = f"{name}.input[{k}]"
                self.kind[n] = "input"
                self.fixed[n] = x
                now[n] = (x, x._version, tuple(x.shape), None)
                arg_names.append(n)
        self.rebuild_ptrs()
        self.order.append(name)
        self.records[name] = {"reads": set(), "writes": set(), "born": set(), "generators": set(), "cow": {},
                              "extents": {}}
        self.info[name] = {
            "snap": now, "rng": rng, "saved": 0, "by_ptr": {p: ns[0] for p, ns in self.tracked_ptr.items()},
            "input_bytes": tensor_bytes(inputs) + tensor_bytes(kwargs), "arg_names": arg_names,
            "kwargs": {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in kwargs.items()},
            "input_shapes": [list(x.shape) for x in args],
            "input_keys": {storage_of(x)[0] for x in args}, "inputs": list(inputs),
            "py": py_scalars(self.py_holders[name], nones=True),
            "autocast": (torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())}
        self.current = name
        self.info[name]["t0"] = time.perf_counter()

    def _post(self, mod, inputs, output):
        if self.probing:
            return
        t1 = time.perf_counter()
        name = self.seg_of[id(mod)]
        d = self.info[name]
        d["forward_ms"] = (t1 - d.pop("t0")) * 1e3
        self.current = None
        d["after"] = after = self.snap(d["snap"])
        cow = self.records[name]["cow"]
        d["before_bytes"], d["after_bytes"] = {}, {}
        for n, a in after.items():
            b = d["snap"].get(n)
            if b is None:
                continue
            if self.kind[n] == "buffer":
                if self.changed(b, a):
                    d["before_bytes"][n], d["after_bytes"][n] = b[3], a[3]
            elif n in cow or self.changed(b, a):
                d["before_bytes"][n] = cow[n] if n in cow else (
                    byte_view(b[0]).clone() if b[0] is not a[0] else None)
                d["after_bytes"][n] = byte_view(a[0]).clone()
        d["rng_after"] = rng_states(self.model, self.gen_names)
        d["output_bytes"] = tensor_bytes(output)
        d["probe_output"] = [t.detach().clone() for t in tensors_in(output)]
        self.last_snap, self.last_rng = after, d["rng_after"]

    def random_outside(self):
        """' (modules outside every segment that draw random numbers: ...)' naming the dropout /
        RReLU modules no segment holds, or ''."""
        segs = list(self.seg_of.values())
        out = [n for n, m in self.model.named_modules()
               if n and ("Dropout" in type(m).__name__ or type(m).__name__ == "RReLU")
               and not any(n == s or n.startswith(s + ".") for s in segs)]
        if not out:
            return ""
        more = f" and {len(out) - 4} more" if len(out) > 4 else ""
        return (f" (modules outside every segment that draw random numbers: {', '.join(out[:4])}{more}: put them "
                "inside a segment, e.g. name their parent module)")

    def hint(self):
        if not self.default_segments:
            return ""
        return (f"; the default segments ({', '.join(self.segs)}) do not cover the step: pass "
                "segments=[...] naming the modules that do this")

    def pack(self, t):
        key, nbytes = storage_of(t)
        cur = self.current
        if cur is not None and (key not in self.packed or key in self.info[cur]["input_keys"]):
            self.packed[key] = (cur, nbytes)
        return t

    def run_step(self):
        model = self.model
        self.seg_of = {id(m): n for n, m in self.segs.items()}
        self.py_holders = {n: py_scalar_holders(m) for n, m in self.segs.items()}
        self.gen_names = generator_names(model)
        self.kind, self.fixed = {}, {}
        for n, _ in model.named_buffers():
            self.kind[n] = "buffer"
        for n, p in model.named_parameters():
            self.kind[n] = "param"
            self.fixed[n] = p
        self.rebuild_ptrs()
        self.preexisting = set(self.tracked_ptr)
        self.preexisting |= {ptr(t) for t in tensors_in(self.batch)}
        self.preexisting |= {ptr(p.grad) for p in model.parameters() if p.grad is not None}
        self.order, self.info, self.records = [], {}, {}
        self.ops = OpsHash()
        self.current, self.probing = None, False
        self.last_snap = self.snap()
        self.initial = self.last_snap
        self.last_rng = rng_states(model, self.gen_names)
        self.packed = {}
        self.handles = [m.register_forward_pre_hook(self.pre, **_WITH_KWARGS) for m in self.segs.values()]
        self.handles += [m.register_forward_hook(self.post) for m in self.segs.values()]
        t0 = time.perf_counter()
        with OpLog(self):
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                loss = self.loss_fn(model, self.batch)
        t1 = time.perf_counter()
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise RecordError("loss_fn(model, batch) must return a scalar tensor")
        loss.backward()
        t2 = time.perf_counter()
        self.times = (t0, t1, t2)
        now = self.snap(self.last_snap)
        bad = [n for n in now if n in self.last_snap and self.changed(self.last_snap[n], now[n])]
        if bad:
            raise RecordError(f"state written outside any segment (after the last one): {sorted(bad)}" + self.hint())
        missing = [n for n in self.segs if n not in self.info]
        if missing:
            raise RecordError(f"segment(s) never called: {missing}")

    # ---- phase 2: non-replayable segments
    def find_non_replayable(self):
        non_replayable = {}
        for n in self.order:
            rec = self.records[n]
            if "unknown_generator" in rec:
                non_replayable[n] = (f"{rec['unknown_generator']} draws from a torch.Generator that is "
                                     "not an attribute of a model module (no contract can restore it)")
                continue
            by_ptr = self.info[n]["by_ptr"]
            other = [p for p in rec["writes"] if p not in by_ptr and p not in rec["born"]]
            if other:
                non_replayable[n] = (f"writes {len(other)} tensor(s) that are not parameters, buffers "
                                     "or segment inputs (no contract can restore them)")
        for h in self.handles:
            h.remove()
        self.handles = []
        self.written_ever = {x for n in self.order for x in self.info[n]["after_bytes"]}
        for n, why in self.probe().items():
            non_replayable.setdefault(n, why)
        return non_replayable

    def value_at_start(self, n, name):
        """Bytes of a parameter or input at the start of segment n: the copy taken before the
        first write at or after n, else its current bytes (None: no write after n)."""
        started = False
        for m in self.order:
            started = started or m == n
            if started and name in self.info[m]["before_bytes"]:
                return self.info[m]["before_bytes"][name]
        return None

    def probe(self):
        failures = {}
        self.probing = True
        try:
            for n in self.order:
                why = self.probe_segment(n)
                if why:
                    failures[n] = (f"replay probe: re-running the forward from the recorded state "
                                   f"changed {why} (state no log sees and the runtime does not keep: "
                                   "Python state other than numeric module attributes and globals, "
                                   "a C++ extension)")
        finally:
            self.probing = False
        return failures

    def probe_segment(self, n):
        model, d = self.model, self.info[n]
        bufs = {b: self.tensor(b) for b, k in self.kind.items() if k == "buffer"}
        params = {p: byte_view(self.tensor(p)).clone() for p in self.written_ever if self.kind[p] == "param"}
        saved_rng = rng_states(model, self.gen_names)
        py = py_scalars_as(self.py_holders[n], d["py"])   # the Python scalars it read, as the runtime gives them
        py.__enter__()
        try:
            with torch.no_grad():
                for name, e in d["snap"].items():
                    if self.kind[name] == "buffer" and e[3] is not None:
                        owner, attr = self.owner(name)
                        setattr(owner, attr, e[3].clone().view(e[0].dtype).reshape(e[2]))
                    elif self.kind[name] == "param" and name in self.written_ever:
                        v = self.value_at_start(n, name)
                        if v is not None:
                            byte_view(self.tensor(name).data).copy_(v) if self.tensor(name).is_contiguous() \
                                else self.tensor(name).data.copy_(v.view(self.tensor(name).dtype).reshape(self.tensor(name).shape))
            set_rng_states(model, d["rng"])
            args, k = [], 0
            for x in d["inputs"]:
                if torch.is_tensor(x):
                    an = d["arg_names"][k]
                    k += 1
                    if self.kind[an] != "input":
                        x = self.tensor(an)
                    else:
                        v = self.value_at_start(n, an)
                        x = x.detach().clone() if v is None else v.clone().view(x.dtype).reshape(x.shape)
                args.append(x)
            enabled, dtype = d["autocast"]
            with torch.autocast("cpu", dtype=dtype, enabled=enabled):
                out = self.segs[n](*args, **{k: v.clone() if torch.is_tensor(v) else v
                                             for k, v in d["kwargs"].items()})
            if not _equal_values(out, d["probe_output"]):
                return "its output"
            for name, a in d["after"].items():
                kind = self.kind[name]
                if kind == "buffer":
                    t = self.tensor(name)
                    if t is not None and a[3] is not None and not torch.equal(byte_view(t), a[3]):
                        return f"'{name}' after it"
                elif kind == "param" and name in d["after_bytes"]:
                    if not torch.equal(byte_view(self.tensor(name)), d["after_bytes"][name]):
                        return f"'{name}' after it"
            now = rng_states(model, self.gen_names)
            for stream, s1 in d["rng_after"].items():
                if not torch.equal(now[stream], s1):
                    return f"RNG stream {stream} after it"
            return None
        finally:
            with torch.no_grad():
                for b, t in bufs.items():
                    owner, attr = self.owner(b)
                    owner._buffers[attr] = t
                for p, v in params.items():
                    t = self.tensor(p)
                    t.data.copy_(v.view(t.dtype).reshape(t.shape))
            set_rng_states(model, saved_rng)
            py.__exit__(None, None, None)

    # ---- phase 3: state accesses with logical versions
    def state_accesses(self):
        versions = {}
        self.used = set()
        written_ever = self.written_ever
        for n in self.order:
            d = self.info[n]
            mod = self.segs[n]
            subtree = {id(t) for t in list(mod.buffers()) + list(mod.parameters())}
            read_ptrs = self.records[n]["reads"]
            reads = {name for p, name in d["by_ptr"].items() if p in read_ptrs}
            reads |= set(d["arg_names"])
            accesses = []
            for name, b in d["snap"].items():
                kind = self.kind[name]
                w = name in d["after_bytes"]
                r = name in reads or (kind != "input" and id(b[0]) in subtree)
                if not w and not r:
                    continue
                if kind != "buffer" and name not in written_ever:
                    continue
                nbytes = b[0].numel() * b[0].element_size()
                acc = {"buffer": name, "read": bool(r), "version_read": versions.get(name, 0),
                       "bytes_read": nbytes, "torch_version_before": b[1]}
                if name in d["arg_names"]:
                    acc["arg"] = d["arg_names"].index(name)
                if w:
                    a = d["after"][name]
                    before, after = d["before_bytes"][name], d["after_bytes"][name]
                    versions[name] = versions.get(name, 0) + 1
                    regions = ([[0, after.numel()]] if before is None
                               else diff_regions(before, after, a[0].element_size()))
                    if b[0] is a[0]:   # written in place: what the writes may reach, not what changed once
                        regions = merge_regions(regions + self.records[n]["extents"].get(name, []))
                    acc.update({"version_written": versions[name], "bytes_written": after.numel(),
                                "torch_version_after": a[1], "rebound": b[0] is not a[0],
                                "regions": regions})
                accesses.append(acc)
                self.used.add(name)
            rng = []
            for stream, s0 in d["rng"].items():
                if not torch.equal(s0, d["rng_after"][stream]):
                    rng.append({"stream": stream, "device": stream if stream.startswith("cuda:") else "cpu",
                                "state_bytes": s0.numel()})
            d["state"], d["rng_use"] = accesses, rng

    # ---- phase 4: saved bytes
    def count_saved(self):
        persistent = {storage_of(t)[0] for t in list(self.model.parameters()) + list(self.model.buffers())}
        self.saved_step = {n: 0 for n in self.order}   # saved bytes allocated during the step
        for p, (seg, nbytes) in self.packed.items():
            if p not in persistent:
                self.info[seg]["saved"] += nbytes
                if p not in self.preexisting:
                    self.saved_step[seg] += nbytes

    # ---- phase 5: memory (profiler memory events, every activation kept)
    def measure_memory(self):
        """One more step, every activation kept, under torch.profiler's CPU memory events
        (CUDA: the allocator's counters around each window), with the gradients allocated
        before it (so the step's own allocations are activations and temporaries): per segment
        the live bytes in its forward window, at the start of its backward and over its whole
        window (the stretch until the next segment starts, the backward until the previous
        segment's output gradient arrives); then optimizer.step under the profiler."""
        model, order = self.model, self.order
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        idx = {n: i for i, n in enumerate(order)}
        open_rf = {}
        bwd_marks = {}

        def mark(label):
            with record_function(_MARK + label):
                pass

        def pre(mod, inputs):
            n = self.seg_of[id(mod)]
            rf = record_function(_MARK + "f:" + n)
            rf.__enter__()
            open_rf[n] = rf

        def post(mod, inputs, output):
            n = self.seg_of[id(mod)]
            open_rf.pop(n).__exit__(None, None, None)
            for t in tensors_in(output):
                if t.requires_grad:
                    def hook(g, n=n):
                        if n not in bwd_marks:
                            bwd_marks[n] = True
                            mark("b:" + n)
                    t.register_hook(hook)

        handles = [m.register_forward_pre_hook(pre) for m in self.segs.values()]
        handles += [m.register_forward_hook(post) for m in self.segs.values()]
        try:
            with _memory_events() as evs:
                mark("start")
                loss = self.loss_fn(model, self.batch)
                self.loss_bytes = loss.numel() * loss.element_size()
                loss.backward()
                mark("end")
                if self.opt is not None:
                    state0 = self.opt_state_bytes()
                    mark("opt")
                    self.opt.step()
                    mark("optend")
            del loss
        finally:
            for h in handles:
                h.remove()
        marks, mems = {}, []
        for e in evs:
            nm = e.name()
            if nm == "[memory]":
                if e.device_type() == torch.device("cpu").type or str(e.device_type()).endswith("CPU"):
                    mems.append((_start_us(e), e.nbytes()))
            elif nm.startswith(_MARK):
                marks[nm[len(_MARK):]] = (_start_us(e), _start_us(e) + _duration_us(e))
        # events of one microsecond: allocations before frees, the worst order any run of
        # the same step can show (the measured peak never depends on how ties were logged)
        mems.sort(key=lambda x: (x[0], x[1] < 0))
        t_start, t_end = marks["start"][0], marks["end"][1]
        # live bytes after each event
        times, live = [], []
        cur = 0
        for t, nb in mems:
            cur += nb
            times.append(t)
            live.append(cur)

        import bisect

        def peak(a, b):
            """max live over [a, b] (including the value entering a)."""
            i = bisect.bisect_left(times, a)
            j = bisect.bisect_right(times, b)
            base = live[i - 1] if i > 0 else 0
            return max([base] + live[i:j])

        def at(t):
            i = bisect.bisect_right(times, t)
            return live[i - 1] if i > 0 else 0

        n = len(order)
        fwd = [marks.get("f:" + s) for s in order]
        bmark = [marks.get("b:" + s, (None,))[0] for s in order]
        cuts = []   # extended window of every segment
        for i, s in enumerate(order):
            a = t_start if i == 0 else fwd[i][0]
            b = fwd[i + 1][0] if i + 1 < n else None
            spans = [(a, b)]
            # backward: from this segment's output gradient (the last one: from the end of its
            # forward) to the previous segment's; a segment whose outputs get no gradient
            # (Llama's rotary_emb: cos / sin of the positions) has no backward, so no window
            bs = fwd[i][1] if i == n - 1 else bmark[i]
            if bs is not None:
                be = None
                for j in range(i - 1, -1, -1):
                    if bmark[j] is not None:
                        be = bmark[j]
                        break
                spans.append((bs, be if be is not None else t_end))
            cuts.append(spans)
        # the forward stretch of the last segment runs until the backward starts
        cuts[-1][0] = (cuts[-1][0][0], cuts[-1][1][0])
        out = {}
        for i, s in enumerate(order):
            s_a = sum(self.saved_step[order[j]] for j in range(i + 1))
            e_peak = max(peak(a, b) for a, b in cuts[i])
            f_peak = peak(*fwd[i])
            grow = f_peak - at(fwd[i][0])
            b_at = at(bmark[i]) if bmark[i] is not None else at(fwd[i][1])
            tr = max(e_peak - s_a, f_peak - s_a + self.info[s]["output_bytes"],
                     b_at - s_a + grow - self.saved_step[s], 0)
            out[s] = tr
        self.transient = out
        self.step_bytes = 0
        self.optimizer_bytes = None
        if self.opt is not None:
            o0, o1 = marks["opt"][0], marks["optend"][1]
            growth = self.opt_state_bytes() - state0
            self.step_bytes = max(0, peak(o0, o1) - at(o0) - growth)
            self.optimizer_bytes = self.opt_state_bytes()
        self.mem_timeline = (t_start, t_end, peak(t_start, t_end))

    def opt_state_bytes(self):
        seen, total = set(), 0
        for s in self.opt.state.values():
            for v in s.values():
                if torch.is_tensor(v) and v.numel() > 1:
                    k = ptr(v)
                    if k not in seen:
                        seen.add(k)
                        total += v.numel() * v.element_size()
                elif torch.is_tensor(v):
                    total += v.element_size()
        return total

    # ---- step times
    def measure_times(self, repeats=TIME_REPEATS):
        """forward_ms / backward_ms per segment from `repeats` plain steps (no op log, no
        profiler, no saved-tensor hooks: the recorder's own work is what made the op-logged
        step's times several times the loop's): the forward between the segment's pre and post
        hooks; the backward from the arrival of its output's gradient to that of the previous
        segment (the first: to the end of backward()); the median of the repeats. A segment
        whose output carries no gradient gets backward 0 (its backward is timed with the
        segment after it). The model's state is put back by record() afterwards."""
        model, order = self.model, self.order
        t = {}

        def pre(mod, inputs):
            t["f0:" + self.seg_of[id(mod)]] = time.perf_counter()

        def post(mod, inputs, output):
            n = self.seg_of[id(mod)]
            t["f1:" + n] = time.perf_counter()
            for x in tensors_in(output):
                if x.requires_grad:
                    x.register_hook(lambda g, n=n: t.setdefault("b:" + n, time.perf_counter()) and None)

        handles = [m.register_forward_pre_hook(pre) for m in self.segs.values()]
        handles += [m.register_forward_hook(post) for m in self.segs.values()]
        fwd = {n: [] for n in order}
        bwd = {n: [] for n in order}
        steps = []
        try:
            for _ in range(repeats):
                t.clear()
                t0 = time.perf_counter()
                loss = self.loss_fn(model, self.batch)
                loss.backward()
                end = time.perf_counter()
                del loss
                steps.append((end - t0) * 1e3)
                for n in order:
                    fwd[n].append((t["f1:" + n] - t["f0:" + n]) * 1e3)
                starts = [t.get("b:" + n) for n in order]
                for i, n in enumerate(order):
                    if starts[i] is None:
                        bwd[n].append(0.0)
                        continue
                    e = next((starts[j] for j in range(i - 1, -1, -1) if starts[j] is not None), end)
                    bwd[n].append(max(0.0, (e - starts[i]) * 1e3))
        finally:
            for h in handles:
                h.remove()
        med = lambda v: sorted(v)[len(v) // 2]   # noqa: E731
        self.times_ms = {n: (med(fwd[n]), med(bwd[n])) for n in order}
        self.step_ms = med(steps)

    # ---- the trace
    def trace(self, non_replayable):
        model, order, info = self.model, self.order, self.info
        _, t1, t2 = self.times
        # the op-logged step's times (several times the loop's: the op log, the saved-tensor
        # hooks), kept for comparison (scripts/bench/bench_replay_steptime.py)
        fwd_total = sum(info[n]["forward_ms"] for n in order) or 1.0
        self.logged_ms = {n: (info[n]["forward_ms"], (t2 - t1) * 1e3 * info[n]["forward_ms"] / fwd_total)
                          for n in order}
        pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        gbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        buffers = []
        for name in self.kind:
            if name in self.used:
                e = self.initial.get(name)
                if e is None:
                    e = next(info[n]["snap"][name] for n in order if name in info[n]["snap"])
                buffers.append({"id": name, "kind": self.kind[name], "bytes": e[0].numel() * e[0].element_size()})
        listed = {b["id"] for b in buffers}
        seen = set()
        outside = 0
        for t in tensors_in(self.batch):      # the batch, once per storage
            k, nb = storage_of(t)
            if k not in seen and k not in self.preexisting - {ptr(x) for x in tensors_in(self.batch)}:
                seen.add(k)
                outside += nb
        outside += getattr(self, "loss_bytes", 0)   # the loss the caller holds through the step
        outside += SMALL_ALLOC_SLACK
        for name, b in model.named_buffers():   # buffers no segment touches
            if name not in listed:
                outside += b.numel() * b.element_size()
        segments = []
        for n in order:
            d = info[n]
            seg = {
                "name": n,
                "forward_ms": round(self.times_ms[n][0], 6),
                "backward_ms": round(self.times_ms[n][1], 6),
                "saved_bytes": d["saved"],
                "input_bytes": d["input_bytes"],
                "input_shapes": d["input_shapes"],
                "output_bytes": d["output_bytes"],
                "transient_bytes": int(self.transient[n]),
                "ops_hash": self.ops.hexdigest(n),
                "state": d["state"],
                "rng": d["rng_use"],
            }
            if n in non_replayable:
                seg["non_replayable"] = non_replayable[n]
            segments.append(seg)
        fixed = {"param_bytes": pbytes, "grad_bytes": gbytes,
                 "optimizer_bytes": self.optimizer_bytes if self.optimizer_bytes is not None else 2 * gbytes,
                 "outside_bytes": outside, "step_bytes": int(self.step_bytes)}
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "source": f"{self.source} torch {torch.__version__}",
            "model": self.model_name,
            "fingerprint": self.fingerprint,
            "device": {"name": "cpu", "copy_gbps": self.copy_gbps},
            "optimizer": type(self.opt).__name__ if self.opt is not None else None,
            "fixed": fixed,
            "step_ms": round(self.step_ms, 6),
            "backward_order": list(reversed(order)),
            "buffers": buffers,
            "segments": segments,
        }
