#!/usr/bin/python3
"""Record one real training step of MODEL.py as a ckptkit trace (formats/trace.md, version 2).

Usage: record_trace.py MODEL.py -o TRACE.json [--et ET.json [--chakra CHAKRA.json]]
                       [--copy-gbps G] [--quiet]

The MODEL.py contract: build() -> (model, batch, loss_fn[, segments]). MODEL.py defines
build(), which returns
    (model, batch, loss_fn)            or    (model, batch, loss_fn, segments)
model is a torch.nn.Module, batch anything loss_fn accepts, and loss_fn(model, batch) returns
the scalar loss of one step; the step recorded is loss_fn(model, batch).backward(), with
torch.manual_seed(0) before build(). segments (optional) names the modules to plan (each must
be called exactly once per step, in forward order); without it the segments are the model's
top-level children in call order. Private torch.Generator objects must be attributes of a
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
means state no log sees (a Python global, a C++ extension, a non-tensor attribute) and the
segment is marked non_replayable with the reason. --et also records the same step (same seed)
with torch's ExecutionGraphObserver, one record_function label "ckpt.segment:NAME" per
segment. Prints a one-line summary on stderr (--quiet: none).

The helpers here (load_build, segment_modules, buffer_owner, byte_view, diff_regions,
generator_names, model_fingerprint) are shared with scripts/apply_plan.py.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FORMAT = "ckptkit-trace"
FORMAT_VERSION = 2
SEGMENT_LABEL = "ckpt.segment:"
MERGE_GAP_BYTES = 16   # two written runs closer than one region's metadata are merged


class RecordError(Exception):
    """A model or step the recorder cannot describe (message names the cause)."""


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
    names = list(out[3]) if len(out) == 4 else None
    return model, batch, loss_fn, names


def segment_modules(model, names):
    """Segment name -> module. names None: the top-level children (name = child name)."""
    mods = dict(model.named_modules())
    if names is None:
        return dict(model.named_children())
    missing = [n for n in names if n not in mods]
    if missing:
        raise RecordError(f"unknown segment module(s): {missing}")
    return {n: mods[n] for n in names}


def buffer_owner(model, fqn):
    """(module, attribute) owning buffer `fqn` (e.g. '2.cache')."""
    owner, _, attr = fqn.rpartition(".")
    return (model.get_submodule(owner) if owner else model), attr


def byte_view(t):
    """Flat uint8 view of a tensor's contents (contiguous copy if needed)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def diff_regions(before, after, itemsize):
    """Byte regions [offset, length] of `after` that differ from `before` (flat uint8
    tensors), element granular, runs closer than MERGE_GAP_BYTES merged; bytes past the end
    of `before` count as written."""
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


def storage_of(t):
    """(storage key, storage bytes) of a tensor: views share their base's storage, and a saved
    view keeps the whole storage alive."""
    st = t.storage()
    return st.data_ptr(), st.nbytes()


def tensor_bytes(obj):
    """Total bytes of the tensors in a (nested) output."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(o) for o in obj.values())
    return 0


def generator_names(model):
    """id(generator) -> name ("MODULE.ATTR", or "ATTR" on the root) of every torch.Generator
    that is an attribute of a module of the model; its RNG stream is "gen:" + name."""
    out = {}
    for mname, m in model.named_modules():
        for attr, v in vars(m).items():
            if isinstance(v, torch.Generator) and id(v) not in out:
                out[id(v)] = f"{mname}.{attr}" if mname else attr
    return out


def generator_by_stream(model, stream):
    """The generator of RNG stream "gen:NAME" (see generator_names); RecordError if none."""
    owner, _, attr = stream[len("gen:"):].rpartition(".")
    try:
        g = getattr(model.get_submodule(owner) if owner else model, attr)
    except AttributeError:
        g = None
    if not isinstance(g, torch.Generator):
        raise RecordError(f"RNG stream {stream}: no torch.Generator of that name in the model")
    return g


def fnv1a64(data):
    """FNV-1a 64 of bytes, 16 hex digits (the trace hash's function)."""
    h = 1469598103934665603
    for c in data:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def model_fingerprint(model):
    """{"hash", "params", "buffers"}: FNV-1a 64 of the JSON list of (kind, name, shape, dtype)
    of every parameter and buffer (taken right after build(), before the step), and the
    counts. apply_plan.py refuses a model whose fingerprint differs."""
    items = [["param", n, list(p.shape), str(p.dtype)] for n, p in model.named_parameters()]
    items += [["buffer", n, list(b.shape), str(b.dtype)] for n, b in model.named_buffers()]
    return {"hash": fnv1a64(json.dumps(items, separators=(",", ":")).encode()),
            "params": sum(1 for i in items if i[0] == "param"),
            "buffers": sum(1 for i in items if i[0] == "buffer")}


def tensors_in(obj):
    """The tensors of a (nested) value, in order."""
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


def _ptr(t):
    try:
        return t.storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # sparse / meta: no storage to track
        return 0


class OpLog(TorchDispatchMode):
    """Logs every aten op: storages read, written ((a!) arguments) and born (outputs not
    among the inputs), and the generator= argument of random ops, into the current segment's
    record (recorder.current is None outside segments: only generator use is checked there)."""

    def __init__(self, recorder, records, gen_names, model):
        super().__init__()
        self.recorder, self.records, self.gen_names = recorder, records, gen_names
        self.gens = {name: generator_by_stream(model, "gen:" + name) for name in gen_names.values()}

    def which_generator(self, v):
        """The model generator name that the generator v (a new Python wrapper of the same
        C++ generator, so not `is`) stands for, or None: a candidate whose state equals v's
        is reseeded for a moment; v is that generator exactly when its state follows."""
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
        cur = self.recorder.current
        rec = self.records.get(cur) if cur is not None else None
        ins = set()
        for i, a in enumerate(func._schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            if rec is not None:
                written = a.alias_info is not None and a.alias_info.is_write
                for t in tensors_in(v):
                    p = _ptr(t)
                    if p:
                        ins.add(p)
                        rec["reads"].add(p)
                        if written:
                            rec["writes"].add(p)
            if "Generator" in str(a.type) and rec is not None:
                if v is None:  # the default generator of the op's device
                    dev = next((t.device for t in tensors_in(list(args)) if t.device.type != "cpu"),
                               torch.device(kwargs.get("device") or "cpu"))
                    if dev.type == "cuda":
                        rec["generators"].add(f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}")
                    else:
                        rec["generators"].add("cpu")
                elif self.which_generator(v) is not None:
                    rec["generators"].add("gen:" + self.which_generator(v))
                else:
                    rec["unknown_generator"] = str(func)
        out = func(*args, **kwargs)
        if rec is not None:
            for t in tensors_in(out):
                p = _ptr(t)
                if p and p not in ins:
                    rec["born"].add(p)
        return out


def cuda_streams():
    """RNG streams of the CUDA default generators ("cuda:N", one per visible device) when
    CUDA is initialised; none on a machine without CUDA."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def stream_state(model, stream):
    """State tensor of one RNG stream: "cpu" (the default CPU generator), "cuda:N" (device
    N's default CUDA generator: Philox seed + offset) or "gen:NAME" (a model generator)."""
    if stream == "cpu":
        return torch.get_rng_state()
    if stream.startswith("cuda:"):
        return torch.cuda.get_rng_state(int(stream[5:]))
    return generator_by_stream(model, stream).get_state()


def set_stream_state(model, stream, state):
    """Restore one RNG stream (see stream_state)."""
    if stream == "cpu":
        torch.set_rng_state(state)
    elif stream.startswith("cuda:"):
        torch.cuda.set_rng_state(state, int(stream[5:]))
    else:
        generator_by_stream(model, stream).set_state(state)


def _rng_states(model, gen_names):
    """stream -> state tensor: the default CPU generator, the CUDA default generators (when
    CUDA is in use) and every model generator."""
    streams = ["cpu"] + cuda_streams() + ["gen:" + name for name in gen_names.values()]
    return {st: stream_state(model, st) for st in streams}


def _set_rng_states(model, states):
    for stream, st in states.items():
        set_stream_state(model, stream, st)


class State:
    """The tensors the recorder tracks, by name: module buffers (looked up at each use, so a
    rebinding is seen), parameters, and the tensor inputs of every segment so far
    ("SEG.input[k]"), with snapshots (object id, _version, bytes, itemsize, shape)."""

    def __init__(self, model):
        self.model = model
        self.kind = {}
        self.fixed = {}    # name -> tensor object (params, inputs)
        for n, _ in model.named_buffers():
            self.kind[n] = "buffer"
        for n, p in model.named_parameters():
            self.kind[n] = "param"
            self.fixed[n] = p

    def add_input(self, name, t):
        self.kind[name] = "input"
        self.fixed[name] = t

    def tensor(self, name):
        if self.kind[name] == "buffer":
            owner, attr = buffer_owner(self.model, name)
            return getattr(owner, attr)
        return self.fixed[name]

    def snap(self):
        out = {}
        for n in self.kind:
            t = self.tensor(n)
            if t is None:
                continue
            out[n] = (id(t), t._version, byte_view(t).clone(), t.element_size(), list(t.shape))
        return out

    def by_ptr(self):
        """storage ptr -> name (buffers and parameters before inputs)."""
        out = {}
        for n in sorted(self.kind, key=lambda n: self.kind[n] == "input"):
            t = self.tensor(n)
            if t is not None and _ptr(t):
                out.setdefault(_ptr(t), n)
        return out


def _changed(before, after):
    """True when a tracked tensor was written or rebound between two snapshots."""
    oid, over, obytes, _, oshape = before
    bid, bver, bbytes, _, bshape = after
    return oid != bid or over != bver or oshape != bshape or not torch.equal(obytes, bbytes)


def _equal_values(a, b):
    """Bit-for-bit equality of two (nested) outputs."""
    ta, tb = tensors_in(a), tensors_in(b)
    if len(ta) != len(tb):
        return False
    return all(x.shape == y.shape and x.dtype == y.dtype and
               torch.equal(byte_view(x), byte_view(y)) for x, y in zip(ta, tb))


class Recorder:
    """Records one seeded training step of MODEL.py as a ckptkit trace (formats/trace.md).
    Phases (record() runs them in order): run_step (segment hooks, op log, saved-tensor hook),
    find_non_replayable (op log + replay probe), state_accesses (per segment, logical
    versions), count_saved, then trace() assembles the dict. Raises RecordError."""

    def __init__(self, model_path, copy_gbps=10.0):
        self.model_path, self.copy_gbps = model_path, copy_gbps
        torch.manual_seed(0)
        self.model, self.batch, self.loss_fn, names = load_build(model_path)
        self.model.train()
        self.fingerprint = model_fingerprint(self.model)
        self.segs = segment_modules(self.model, names)
        self.seg_of = {id(m): n for n, m in self.segs.items()}
        self.gen_names = generator_names(self.model)
        self.st = State(self.model)
        self.order, self.info, self.records = [], {}, {}
        self.current = None      # the segment whose forward runs now (None: outside)
        self.probing = False     # the replay probe runs: the hooks stay out
        self.last_snap = self.st.snap()   # tracked state / RNG at the last segment boundary
        self.last_rng = _rng_states(self.model, self.gen_names)
        self.initial = dict(self.last_snap)
        self.packed = {}   # storage ptr -> (segment, bytes); first segment that saves it owns it
        self.times = None  # (t0, t1, t2): step start, forward end, backward end (perf_counter)

    def record(self):
        """The trace dict of the step."""
        self.run_step()
        non_replayable = self.find_non_replayable()
        self.state_accesses()
        self.count_saved()
        return self.trace(non_replayable)

    # ---- phase 1: the step, with segment hooks, the op log and the saved-tensor hook
    def outside_writes(self, before, after):
        bad = [n for n in after if n in before and _changed(before[n], after[n])]
        bad += [n for n in after if n not in before and self.st.kind[n] == "buffer"]
        return bad

    def pre(self, mod, inputs):
        """Forward pre-hook of a segment: checks nothing changed since the last boundary,
        names its tensor arguments, snapshots the tracked state and RNG."""
        if self.probing:
            return
        st, name = self.st, self.seg_of[id(mod)]
        if name in self.info:
            raise RecordError(f"segment {name} called more than once per step")
        bad = self.outside_writes(self.last_snap, st.snap())
        if bad:
            raise RecordError(f"state written outside any segment (before segment {name}): {sorted(bad)}")
        rng = _rng_states(self.model, self.gen_names)
        for stream, s0 in self.last_rng.items():
            if not torch.equal(rng[stream], s0):
                raise RecordError(f"RNG stream {stream} consumed outside segments before segment {name}")
        args = [x for x in inputs if torch.is_tensor(x)]
        arg_names = []
        for k, x in enumerate(args):
            existing = st.by_ptr().get(_ptr(x))
            if existing is not None and st.kind[existing] != "input":
                arg_names.append(existing)   # a buffer or parameter passed as an argument
            else:
                n = f"{name}.input[{k}]"
                st.add_input(n, x)
                arg_names.append(n)
        snap = st.snap()
        self.order.append(name)
        self.records[name] = {"reads": set(), "writes": set(), "born": set(), "generators": set()}
        self.info[name] = {
            "snap": snap, "rng": rng, "saved": 0, "by_ptr": st.by_ptr(),
            "input_bytes": tensor_bytes(inputs), "arg_names": arg_names,
            "input_keys": {storage_of(x)[0] for x in args},
            "probe_inputs": [x.detach().clone() if torch.is_tensor(x) else x for x in inputs],
            "probe_pre": {n: st.tensor(n).detach().clone() for n in st.kind
                          if st.kind[n] != "input" and st.tensor(n) is not None},
            "autocast": (torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())}
        self.current = name
        self.info[name]["t0"] = time.perf_counter()

    def post(self, mod, inputs, output):
        """Forward hook of a segment: its time, the state and RNG after it, its output."""
        if self.probing:
            return
        t1 = time.perf_counter()
        name = self.seg_of[id(mod)]
        d = self.info[name]
        d["forward_ms"] = (t1 - d.pop("t0")) * 1e3
        self.current = None
        d["after"] = self.st.snap()
        d["rng_after"] = _rng_states(self.model, self.gen_names)
        d["output_bytes"] = tensor_bytes(output)
        d["probe_output"] = [t.detach().clone() for t in tensors_in(output)]
        self.last_snap, self.last_rng = d["after"], d["rng_after"]

    def pack(self, t):
        """Saved-tensor hook. A boundary tensor saved by both its producer and its consumer
        belongs to the consumer: it stays alive while the consumer is kept, whatever the
        producer does."""
        key, nbytes = storage_of(t)
        cur = self.current
        if cur is not None and (key not in self.packed or key in self.info[cur]["input_keys"]):
            self.packed[key] = (cur, nbytes)
        return t

    def run_step(self):
        """One step, loss_fn(model, batch).backward(), under the hooks; checks every segment
        ran once and no state changed outside segments."""
        handles = [m.register_forward_pre_hook(self.pre) for m in self.segs.values()]
        handles += [m.register_forward_hook(self.post) for m in self.segs.values()]
        self.handles = handles
        t0 = time.perf_counter()
        with OpLog(self, self.records, self.gen_names, self.model):
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
                loss = self.loss_fn(self.model, self.batch)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.times = (t0, t1, t2)
        bad = self.outside_writes(self.last_snap, self.st.snap())
        if bad:
            raise RecordError(f"state written outside any segment (after the last one): {sorted(bad)}")
        missing = [n for n in self.segs if n not in self.info]
        if missing:
            self.remove_hooks()
            raise RecordError(f"segment(s) never called: {missing}")

    def remove_hooks(self):
        for h in self.handles:
            h.remove()

    # ---- phase 2: segments no contract can make exact
    def find_non_replayable(self):
        """segment -> why it is non-replayable: an unknown generator or a write to an untracked
        tensor (op log), else a replay probe difference. Removes the hooks."""
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
        for n, why in self.probe().items():
            non_replayable.setdefault(n, why)
        self.remove_hooks()
        return non_replayable

    def probe(self):
        """Replay probe: re-run every segment's forward from its recorded state (module buffers
        rebound to copies, parameters' bytes put back, inputs and generator states as recorded,
        the same CPU autocast state) and compare its output, the tracked state after it and the
        generator states bit for bit with the recorded run. Returns segment -> reason for the
        segments that differ; the model's state is restored after each probe."""
        failures = {}
        self.probing = True
        try:
            for n in self.order:
                why = self.probe_segment(n)
                if why:
                    failures[n] = (f"replay probe: re-running the forward from the recorded state "
                                   f"changed {why} (state no log sees: a Python global, a C++ "
                                   "extension or a non-tensor attribute)")
        finally:
            self.probing = False
        return failures

    def probe_segment(self, n):
        """What re-running segment n from its recorded state changed ("its output", "'X' after
        it", "RNG stream S after it"), or None."""
        model, st, d = self.model, self.st, self.info[n]
        saved_bufs = {b: st.tensor(b) for b in st.kind if st.kind[b] == "buffer"}
        saved_params = {p: st.tensor(p).detach().clone() for p in st.kind if st.kind[p] == "param"}
        saved_rng = _rng_states(model, self.gen_names)
        try:
            with torch.no_grad():
                for name, pre in d["probe_pre"].items():
                    if st.kind[name] == "buffer":
                        owner, attr = buffer_owner(model, name)
                        setattr(owner, attr, pre.clone())
                    else:
                        st.tensor(name).data.copy_(pre)
            _set_rng_states(model, d["rng"])
            # inputs as recorded; an argument that is a buffer or parameter is passed as
            # the (restored) live tensor, as the step passes it
            args, k = [], 0
            for x in d["probe_inputs"]:
                if torch.is_tensor(x):
                    an = d["arg_names"][k]
                    k += 1
                    x = st.tensor(an) if st.kind[an] != "input" else x.clone()
                args.append(x)
            enabled, dtype = d["autocast"]
            with torch.autocast("cpu", dtype=dtype, enabled=enabled):
                out = self.segs[n](*args)
            if not _equal_values(out, d["probe_output"]):
                return "its output"
            after = st.snap()
            for name, a in d["after"].items():
                if st.kind[name] == "input":
                    continue
                if name in after and not torch.equal(after[name][2], a[2]):
                    return f"'{name}' after it"
            now = _rng_states(model, self.gen_names)
            for stream, s1 in d["rng_after"].items():
                if not torch.equal(now[stream], s1):
                    return f"RNG stream {stream} after it"
            return None
        finally:
            with torch.no_grad():
                for b, t in saved_bufs.items():
                    owner, attr = buffer_owner(model, b)
                    setattr(owner, attr, t)
                for p, v in saved_params.items():
                    st.tensor(p).data.copy_(v)
            _set_rng_states(model, saved_rng)

    # ---- phase 3: state accesses with logical versions
    def state_accesses(self):
        """Per segment (info[n]["state"], ["rng_use"]): every tracked tensor it reads (subtree
        buffers and parameters, its own inputs, any storage the op log saw it read) or writes
        (snapshot diff), with logical versions and written regions; RNG streams it consumed.
        Sets self.used (the tracked tensors any access names)."""
        st = self.st
        written_ever = set()
        per_seg = {}
        for n in self.order:
            d = self.info[n]
            before, after = d["snap"], d["after"]
            mod = self.segs[n]
            subtree = {n + "." + b if n else b for b, _ in mod.named_buffers()}
            subtree |= {n + "." + b if n else b for b, _ in mod.named_parameters()}
            read_ptrs = self.records[n]["reads"]
            reads = {name for ptr, name in d["by_ptr"].items() if ptr in read_ptrs}
            reads |= set(d["arg_names"])
            writes = {}
            for name, a in after.items():
                b = before.get(name)
                if b is not None and _changed(b, a):
                    writes[name] = (b, a)
                    written_ever.add(name)
            per_seg[n] = (subtree, reads, writes)
        versions = {}
        self.used = set()
        for n in self.order:
            d = self.info[n]
            subtree, reads, writes = per_seg[n]
            accesses = []
            for name in st.kind:
                if name not in d["snap"]:
                    continue
                kind = st.kind[name]
                w = name in writes
                r = name in reads or (kind == "buffer" and name in subtree) or (kind == "param" and name in subtree)
                if not w and not r:
                    continue
                if kind != "buffer" and name not in written_ever:
                    continue   # a parameter / input nobody writes: no hazard to describe
                oid, over, obytes, isz, _ = d["snap"][name]
                acc = {"buffer": name, "read": bool(r), "version_read": versions.get(name, 0),
                       "bytes_read": obytes.numel(), "torch_version_before": over}
                if name in d["arg_names"]:
                    acc["arg"] = d["arg_names"].index(name)
                if w:
                    b, a = writes[name]
                    versions[name] = versions.get(name, 0) + 1
                    acc.update({"version_written": versions[name], "bytes_written": a[2].numel(),
                                "torch_version_after": a[1], "rebound": b[0] != a[0],
                                "regions": diff_regions(b[2], a[2], isz)})
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
        """info[n]["saved"]: saved tensors that are not parameters or buffers at the end of
        the step are activations (a buffer rebound during the step, e.g. a queue, leaves its
        old tensor to autograd)."""
        persistent = {storage_of(t)[0] for t in list(self.model.parameters()) + list(self.model.buffers())}
        for ptr, (seg, nbytes) in self.packed.items():
            if ptr not in persistent:
                self.info[seg]["saved"] += nbytes

    # ---- the trace
    def trace(self, non_replayable):
        """The trace dict (formats/trace.md, format 2) from what the phases found."""
        model, st, order, info = self.model, self.st, self.order, self.info
        t0, t1, t2 = self.times
        fwd_total = sum(info[n]["forward_ms"] for n in order) or 1.0
        bwd_ms = (t2 - t1) * 1e3
        pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        gbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        first_snap = {}
        for n in order:   # inputs appear at their segment; everything else is in `initial`
            for name, v in info[n]["snap"].items():
                first_snap.setdefault(name, v)
        buffers = []
        for name in st.kind:
            if name in self.used:
                v = self.initial.get(name, first_snap.get(name))
                buffers.append({"id": name, "kind": st.kind[name], "bytes": v[2].numel()})
        segments = []
        for n in order:
            d = info[n]
            seg = {
                "name": n,
                "forward_ms": round(d["forward_ms"], 6),
                "backward_ms": round(bwd_ms * d["forward_ms"] / fwd_total, 6),
                "saved_bytes": d["saved"],
                "input_bytes": d["input_bytes"],
                "output_bytes": d["output_bytes"],
                "transient_bytes": d["output_bytes"],
                "state": d["state"],
                "rng": d["rng_use"],
            }
            if n in non_replayable:
                seg["non_replayable"] = non_replayable[n]
            segments.append(seg)
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "source": "record_trace.py torch " + torch.__version__,
            "model": os.path.basename(self.model_path),
            "fingerprint": self.fingerprint,
            "device": {"name": "cpu", "copy_gbps": self.copy_gbps},
            "fixed": {"param_bytes": pbytes, "grad_bytes": gbytes, "optimizer_bytes": 2 * gbytes},
            "step_ms": round((t2 - t0) * 1e3, 6),
            "backward_order": list(reversed(order)),
            "buffers": buffers,
            "segments": segments,
        }


def record(model_path, copy_gbps=10.0):
    """Record one step; returns the trace dict (formats/trace.md). Raises RecordError."""
    return Recorder(model_path, copy_gbps).record()


def record_et(model_path, out_path):
    """Record the same step (same seed) with torch 1.13's ExecutionGraphObserver, one
    record_function label per segment; writes schema 1.0.1 JSON to out_path."""
    from torch.profiler import ExecutionGraphObserver
    torch.manual_seed(0)
    model, batch, loss_fn, names = load_build(model_path)
    model.train()
    segs = segment_modules(model, names)
    open_rf = {}

    def pre(mod, inputs):
        rf = torch.autograd.profiler.record_function(SEGMENT_LABEL + seg_name[id(mod)])
        rf.__enter__()
        open_rf[id(mod)] = rf

    def post(mod, inputs, output):
        open_rf.pop(id(mod)).__exit__(None, None, None)

    seg_name = {id(m): n for n, m in segs.items()}
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
        attrs = [{"name": k, "type": "string" if isinstance(n.get(k), str) else "uint64",
                  "value": n[k]} for k in ("fw_parent", "seq_id", "scope", "tid", "fw_tid",
                                           "op_schema") if k in n]
        nodes.append({"id": n["id"], "name": n["name"], "ctrl_deps": n.get("parent", -1),
                      "inputs": {"values": n.get("inputs", []), "shapes": n.get("input_shapes", []),
                                 "types": n.get("input_types", [])},
                      "outputs": {"values": n.get("outputs", []), "shapes": n.get("output_shapes", []),
                                  "types": n.get("output_types", [])},
                      "attrs": attrs})
    return {"schema": "1.0.2-chakra.0.0.4", "pid": et.get("pid"), "time": et.get("time"),
            "start_ts": et.get("start_ts"), "finish_ts": et.get("finish_ts"), "nodes": nodes}


def summary_line(trace, path):
    """One line: segments, those that touch state or draw RNG, state by kind, RNG streams,
    non-replayable segments, the output path."""
    segs = trace["segments"]
    kinds = {}
    for b in trace["buffers"]:
        kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
    streams = sorted({r["stream"] for s in segs for r in s["rng"]})
    stateful = sum(1 for s in segs if s["state"] or s["rng"])
    nr = [s["name"] for s in segs if "non_replayable" in s]
    return (f"record_trace: {trace['model']}: {len(segs)} segments, {stateful} touch state or RNG; state "
            + (", ".join(f"{v} {k}{'s' if v > 1 else ''}" for k, v in sorted(kinds.items())) or "none")
            + f"; RNG streams {', '.join(streams) or 'none'}; non-replayable: "
            + (", ".join(nr) or "none") + f" -> {path}")


def write_json_atomic(obj, path):
    """Write JSON to path via a temporary name and rename."""
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog=__doc__[__doc__.index("The MODEL.py contract"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="MODEL.py defining build() -> (model, batch, loss_fn[, segments])")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--et", help="also record a PyTorch Execution Trace to this path")
    ap.add_argument("--chakra", help="also write the --et trace in the Chakra nested schema")
    ap.add_argument("--copy-gbps", type=float, default=10.0,
                    help="device copy bandwidth used for snapshot costs (GB/s)")
    ap.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    a = ap.parse_args()
    try:
        trace = record(a.model, a.copy_gbps)
        write_json_atomic(trace, a.output)
        if not a.quiet:
            print(summary_line(trace, a.output), file=sys.stderr)
        if a.et:
            record_et(a.model, a.et)
            if a.chakra:
                with open(a.et) as f:
                    write_json_atomic(et_to_chakra(json.load(f)), a.chakra)
    except RecordError as e:
        print(f"record_trace: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ImportError, SyntaxError, RuntimeError, ValueError, TypeError) as e:
        # MODEL.py that does not import / build / run: one line, not a traceback
        print(f"record_trace: error: {a.model}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
