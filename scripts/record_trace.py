#!/usr/bin/python3
"""Record one real training step of MODEL.py as a ckptkit trace (formats/trace.md).

Usage: record_trace.py MODEL.py -o TRACE.json [--et ET.json [--chakra CHAKRA.json]]
                       [--copy-gbps G]

MODEL.py defines build() -> (model, batch, loss_fn[, segment_names]). One training step is
loss_fn(model, batch).backward(). Segments are the model's top-level children in call order,
or the named modules given as the fourth element (each must be called once per step).

Method (SPEC §3.1): forward hooks time each segment; saved-tensor hooks
(torch.autograd.graph.saved_tensors_hooks) attribute bytes kept for backward; every model
buffer is cloned before and after each segment and compared (identity, `_version`, bytes) to
find writes and the exact byte regions written; torch.get_rng_state() before/after detects RNG
consumption. --et also records the same step (same seed) with torch's ExecutionGraphObserver,
with one record_function label "ckpt.segment:NAME" per segment.

The helpers here (load_build, segment_modules, buffer_owner, byte_view, diff_regions) are
shared with scripts/apply_plan.py.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import torch

FORMAT = "ckptkit-trace"
FORMAT_VERSION = 1
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


def _snap(model):
    return {n: (id(b), b._version, byte_view(b).clone(), b.element_size(), str(b.dtype).replace("torch.", ""), list(b.shape))
            for n, b in model.named_buffers()}


def record(model_path, copy_gbps=10.0):
    """Record one step; returns the trace dict (formats/trace.md). Raises RecordError."""
    torch.manual_seed(0)
    model, batch, loss_fn, names = load_build(model_path)
    model.train()
    segs = segment_modules(model, names)
    seg_of = {id(m): n for n, m in segs.items()}
    order, info = [], {}
    cur = [None]
    versions = {n: 0 for n, _ in model.named_buffers()}
    state = {"snap": _snap(model), "rng": torch.get_rng_state()}
    initial = state["snap"]
    unsegmented = []

    def compare(before, after, seg, subtree):
        accesses = []
        for n, (bid, bver, bbytes, isz, dtype, shape) in after.items():
            if n not in before:
                if seg is None:
                    unsegmented.append(n)
                continue
            oid, over, obytes, _, _, oshape = before[n]
            written = (oid != bid or over != bver or oshape != shape or not torch.equal(obytes, bbytes))
            if seg is None:
                if written:
                    unsegmented.append(n)
                continue
            if not written and n not in subtree:
                continue
            acc = {"buffer": n, "read": n in subtree, "version_read": versions[n],
                   "bytes_read": obytes.numel(), "torch_version_before": over}
            if written:
                versions[n] += 1
                acc.update({"version_written": versions[n], "bytes_written": bbytes.numel(),
                            "torch_version_after": bver,
                            "rebound": oid != bid,
                            "regions": diff_regions(obytes, bbytes, isz)})
            accesses.append(acc)
        return accesses

    def pre(mod, inputs):
        name = seg_of[id(mod)]
        if name in info:
            raise RecordError(f"segment {name} called more than once per step")
        snap = _snap(model)
        compare(state["snap"], snap, None, set())   # writes between segments are errors
        rng = torch.get_rng_state()
        if not torch.equal(rng, state["rng"]):
            raise RecordError(f"RNG consumed outside segments before segment {name}")
        order.append(name)
        info[name] = {"snap": snap, "rng": rng, "saved": 0,
                      "input_bytes": tensor_bytes(inputs),
                      "input_keys": {storage_of(x)[0] for x in inputs if torch.is_tensor(x)}}
        cur[0] = name
        info[name]["t0"] = time.perf_counter()

    def post(mod, inputs, output):
        t1 = time.perf_counter()
        name = seg_of[id(mod)]
        d = info[name]
        d["forward_ms"] = (t1 - d.pop("t0")) * 1e3
        cur[0] = None
        after = _snap(model)
        subtree = {name + "." + n if name else n for n, _ in mod.named_buffers()}
        d["state"] = compare(d.pop("snap"), after, name, subtree)
        rng = torch.get_rng_state()
        d["rng"] = ([{"stream": "cpu", "device": "cpu", "state_bytes": rng.numel()}]
                    if not torch.equal(rng, d["rng"]) else [])
        d["output_bytes"] = tensor_bytes(output)
        state["snap"], state["rng"] = after, rng

    packed = {}   # storage ptr -> (segment, bytes); first segment that saves it owns it

    def pack(t):
        # A boundary tensor saved by both its producer and its consumer belongs to the
        # consumer: it stays alive while the consumer is kept, whatever the producer does.
        key, nbytes = storage_of(t)
        if cur[0] is not None and (key not in packed or key in info[cur[0]]["input_keys"]):
            packed[key] = (cur[0], nbytes)
        return t

    handles = [m.register_forward_pre_hook(pre) for m in segs.values()]
    handles += [m.register_forward_hook(post) for m in segs.values()]
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, batch)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    for h in handles:
        h.remove()
    compare(state["snap"], _snap(model), None, set())
    if unsegmented:
        raise RecordError(f"buffer(s) written outside any segment: {sorted(set(unsegmented))}")
    missing = [n for n in segs if n not in info]
    if missing:
        raise RecordError(f"segment(s) never called: {missing}")

    # Saved tensors that are not parameters or buffers at the end of the step are activations
    # (a buffer rebound during the step, e.g. a queue, leaves its old tensor to autograd).
    persistent = {storage_of(t)[0] for t in list(model.parameters()) + list(model.buffers())}
    for ptr, (seg, nbytes) in packed.items():
        if ptr not in persistent:
            info[seg]["saved"] += nbytes
    fwd_total = sum(info[n]["forward_ms"] for n in order) or 1.0
    bwd_ms = (t2 - t1) * 1e3
    buffers = {n: {"id": n, "dtype": v[4], "bytes": v[2].numel()}     # sizes before the step
               for n, v in initial.items()}
    used = {a["buffer"] for n in order for a in info[n]["state"]}
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    segments = []
    for n in order:
        d = info[n]
        segments.append({
            "name": n,
            "forward_ms": round(d["forward_ms"], 6),
            "backward_ms": round(bwd_ms * d["forward_ms"] / fwd_total, 6),
            "saved_bytes": d["saved"],
            "input_bytes": d["input_bytes"],
            "output_bytes": d["output_bytes"],
            "transient_bytes": d["output_bytes"],
            "state": d["state"],
            "rng": d["rng"],
        })
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "source": "record_trace.py torch " + torch.__version__,
        "model": os.path.basename(model_path),
        "device": {"name": "cpu", "copy_gbps": copy_gbps},
        "fixed": {"param_bytes": pbytes, "grad_bytes": gbytes, "optimizer_bytes": 2 * gbytes},
        "step_ms": round((t2 - t0) * 1e3, 6),
        "backward_order": list(reversed(order)),
        "buffers": [buffers[n] for n in buffers if n in used],
        "segments": segments,
    }


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


def write_json_atomic(obj, path):
    """Write JSON to path via a temporary name and rename."""
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--et", help="also record a PyTorch Execution Trace to this path")
    ap.add_argument("--chakra", help="also write the --et trace in the Chakra nested schema")
    ap.add_argument("--copy-gbps", type=float, default=10.0,
                    help="device copy bandwidth used for snapshot costs (GB/s)")
    a = ap.parse_args()
    try:
        trace = record(a.model, a.copy_gbps)
        write_json_atomic(trace, a.output)
        if a.et:
            record_et(a.model, a.et)
            if a.chakra:
                with open(a.et) as f:
                    write_json_atomic(et_to_chakra(json.load(f)), a.chakra)
    except RecordError as e:
        print(f"record_trace: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
