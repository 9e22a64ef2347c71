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
means state no log sees (a Python global, a C++ extension, a non-tensor attribute) and the
segment is marked non_replayable with the reason. --et also records the same step (same seed)
with torch's ExecutionGraphObserver, one record_function label "ckpt.segment:NAME" per
segment. Prints a one-line summary on stderr (--quiet: none).

A thin command-line wrapper over the package: the recorder is ckptkit.replay (python/ckptkit/replay,
importable after scripts/build.sh, or from $CKPTKIT_PYTHONPATH / <build>/python).
"""
import argparse
import importlib.util
import json
import os
import sys

import torch


def _package_path():
    """Make `import ckptkit` work from a source checkout: $CKPTKIT_PYTHONPATH, else the build's
    python folder (build/python), unless the package is importable already (ckptkit.pth)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.environ.get("CKPTKIT_PYTHONPATH"),
              os.environ.get("CKPTKIT_BIN") and os.path.join(os.path.dirname(os.path.abspath(os.environ["CKPTKIT_BIN"])), "python"),
              os.path.join(here, "..", "build", "python")):
        if d and os.path.isdir(os.path.join(d, "ckptkit")):
            sys.path.insert(0, d)
            return


_package_path()
from ckptkit.replay import RecordError  # noqa: E402
from ckptkit.replay import _record  # noqa: E402

SEGMENT_LABEL = "ckpt.segment:"


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
    """Segment name -> module, for the named segments (a trace's or a plan's)."""
    mods = dict(model.named_modules())
    missing = [n for n in names if n not in mods]
    if missing:
        raise RecordError(f"unknown segment module(s): {missing}")
    return {n: mods[n] for n in names}


def record(model_path, copy_gbps=10.0):
    """Record one step of MODEL.py (seeded with torch.manual_seed(0) before build()); returns
    the trace dict (formats/trace.md). Raises RecordError."""
    torch.manual_seed(0)
    model, batch, loss_fn, names = load_build(model_path)
    return _record.Recorder(model, batch, loss_fn, names, None, copy_gbps,
                            os.path.basename(model_path), "record_trace.py").record()


def record_et(model_path, out_path, names):
    """Record the same step (same seed) with torch 1.13's ExecutionGraphObserver, one
    record_function label per segment (`names`: the recorded trace's); writes schema 1.0.1
    JSON to out_path."""
    from torch.profiler import ExecutionGraphObserver
    torch.manual_seed(0)
    model, batch, loss_fn, _ = load_build(model_path)
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
            record_et(a.model, a.et, [s["name"] for s in trace["segments"]])
            if a.chakra:
                with open(a.et) as f:
                    write_json_atomic(et_to_chakra(json.load(f)), a.chakra)
    except RecordError as e:
        print(f"record_trace: error: {e.reason}", file=sys.stderr)
        return 2
    except (OSError, ImportError, SyntaxError, RuntimeError, ValueError, TypeError) as e:
        # MODEL.py that does not import / build / run: one line, not a traceback
        print(f"record_trace: error: {a.model}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
