#!/usr/bin/python3
"""Train small real models on real data and write the ckptkit checkpoint fixtures.

Usage: /usr/bin/python3 scripts/make_fixtures.py [--out data/]

Deterministic (fixed seeds, 2 CPU threads, deterministic algorithms), CPU only, well under
3 minutes on 2 cores. Models, data and optimizer recipes come from scripts/ckpt_models.py.
Writes the files listed in ckpt_models.FIXTURES and data/README.md.
"""
import argparse
import json
import os
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_models as cm  # noqa: E402

ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
             torch.uint8: "U8", torch.int8: "I8", torch.bool: "BOOL"}


def write_safetensors(path, tensors, metadata):
    """Write `tensors` (name -> tensor, in order) and string `metadata` as a safetensors file.

    Layout: u64 little-endian header length N, N bytes of JSON (padded with spaces to a
    multiple of 8), then the little-endian row-major tensor bytes, tiled without gaps.
    """
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * (-len(js) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def train(run):
    """Train the model of `run` for its number of steps; return (model, optimizer, losses)."""
    spec = cm.RUNS[run]
    mname = spec["model"]
    model = cm.build(run)
    model.train()
    opt = cm.make_optimizer(run, model)
    losses = []
    kill = spec.get("kill")
    for step in range(spec["steps"]):
        if kill and step == kill["at"]:  # dead units: their ReLU never fires again
            with torch.no_grad():
                bias = getattr(model, kill["module"]).bias
                bias[: int(bias.numel() * kill["frac"])] = -1000.0
        xb, yb = cm.batch(mname, step)
        opt.zero_grad(set_to_none=True)
        loss = cm.loss_fn(mname, model, xb, yb)
        objective = -loss if spec.get("maximize") else loss  # maximize=True climbs -loss
        objective.backward()
        opt.step()
        losses.append(float(loss))
    return model, opt, losses


def epochs_of(run):
    """Whole epochs of training data seen by `run` (samples or tokens seen / dataset size)."""
    spec = cm.RUNS[run]
    if spec["model"] == "cnn":
        return spec["steps"] * 64 // cm.digits_data()[0].shape[0]
    return spec["steps"] * 8 * 64 // cm.text_data().numel()


def save_fixture(out, fname, run, layout, model, opt):
    """Write one fixture file `fname` of `layout` from a trained (model, opt) of `run`."""
    path = os.path.join(out, fname)
    if layout == "full":
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "epoch": epochs_of(run)}, path)
    elif layout == "optimizer_only":
        torch.save(opt.state_dict(), path)
    elif layout == "safetensors":
        osd = opt.state_dict()
        tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
        for idx in sorted(osd["state"]):
            st = osd["state"][idx]
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                if key in st:
                    tensors[f"state.{idx}.{key}"] = st[key]
            tensors[f"state.{idx}.step"] = torch.as_tensor(st["step"], dtype=torch.float32)
        names = [f"model.{n}" for n in cm.optimizer_param_names(run, model)]
        meta = {"optimizer": cm.RUNS[run]["optimizer"],
                "param_groups": json.dumps(osd["param_groups"]),
                "param_names": json.dumps(names)}
        write_safetensors(path, tensors, meta)
    else:
        raise ValueError(layout)
    return path


def describe(run, spec):
    """One-line description of the optimizer settings of `run` for the README."""
    cls = "AdamW" if spec["optimizer"] == "adamw" else "Adam"
    hp = ", ".join(f"{k}={v}" for k, v in spec["hp"].items())
    groups = " (2 groups: weight_decay=0 for biases/norm params)" \
        if spec.get("groups") == "decay_split" else ""
    return f"torch.optim.{cls}({hp}){groups}"


def main():
    """Train every run once, write every fixture of it, then write data/README.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    results = {}
    t_all = time.time()
    for run, spec in cm.RUNS.items():
        t0 = time.time()
        model, opt, losses = train(run)
        secs = time.time() - t0
        results[run] = (losses, secs)
        for fname, (frun, layout) in cm.FIXTURES.items():
            if frun == run:
                save_fixture(args.out, fname, run, layout, model, opt)
        print(f"{run}: {spec['steps']} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
              f"{secs:.1f}s", flush=True)
    total = time.time() - t_all
    write_readme(args.out, results, total)
    sizes = {f: os.path.getsize(os.path.join(args.out, f)) for f in cm.FIXTURES}
    print(f"total {sum(sizes.values())} bytes in {len(sizes)} fixtures, {total:.1f}s")


def write_readme(out, results, total):
    """Write data/README.md describing every fixture (model, data, optimizer, steps, loss, size)."""
    data_desc = {"cnn": "sklearn `load_digits` (1797 8x8 digits, batch 64, scaled to [0,1])",
                 "lm": f"bytes of `{cm.TEXT_PATH}` (Debian base-files, 35,149 B ASCII; "
                       "batch 8 x 64 bytes)"}
    data_desc["lm256"] = data_desc["lm"]
    model_desc = {"cnn": "DigitsCNN: 2x(conv3x3+BatchNorm+ReLU) 8/16 ch, maxpool, FC 256-32-10",
                  "lm": "ByteLM: byte-level transformer, vocab 128, d=64, 2 layers, 4 heads, "
                        "d_ff=128, ctx 64, tied tok.weight/head.weight"}
    model_desc["lm256"] = model_desc["lm"].replace("vocab 128", "vocab 256 (bytes >= 128 never occur)")
    layout_desc = {"full": '`torch.save({"model": state_dict, "optimizer": opt.state_dict(), '
                           '"epoch": n})`',
                   "optimizer_only": "`torch.save(opt.state_dict())` only (like HF Trainer "
                                     "optimizer.pt); model weights of the same run/step are "
                                     "in lm_adamw.pt",
                   "safetensors": "hand-written safetensors: `model.<name>` (full state_dict, "
                                  "incl. BN buffers), `state.<idx>.exp_avg|exp_avg_sq|step` "
                                  "(step 0-d F32), `__metadata__` optimizer/param_groups/"
                                  "param_names"}
    lines = ["# Checkpoint fixtures", "",
             "Generated by `/usr/bin/python3 scripts/make_fixtures.py --out data/` "
             f"(torch {torch.__version__}, CPU, 2 threads, seed {cm.SEED}; deterministic: "
             "a rerun gives byte-identical files). Model classes, data and optimizer recipes: "
             "`scripts/ckpt_models.py` (`build(name)`, `make_optimizer(run, model)`). "
             "Training batch number `s` is `ckpt_models.batch(model, s)`, so the real next "
             "gradient after a checkpoint of S steps uses `batch(model, S)`.", "",
             "| file | bytes | model | data | optimizer | steps | loss first -> final | layout |",
             "|---|---|---|---|---|---|---|---|"]
    for fname, (run, layout) in cm.FIXTURES.items():
        spec = cm.RUNS[run]
        losses, _ = results[run]
        size = os.path.getsize(os.path.join(out, fname))
        extra = " (maximize=True, objective -CE)" if spec.get("maximize") else ""
        if spec.get("kill"):
            k = spec["kill"]
            extra += f" (at step {k['at']} {int(k['frac'] * 100)}% of {k['module']}'s units get bias -1000: dead ReLUs)"
        lines.append(f"| `{fname}` | {size} | {model_desc[spec['model']]} | "
                     f"{data_desc[spec['model']]} | {describe(run, spec)}{extra} | "
                     f"{spec['steps']} | {losses[0]:.4f} -> {losses[-1]:.4f} | "
                     f"{layout_desc[layout]} |")
    total_b = sum(os.path.getsize(os.path.join(out, f)) for f in cm.FIXTURES)
    lines += ["", f"Total: {total_b} bytes. Loss is the training cross-entropy of the last "
              "batch (per byte for the LM; for `cnn_maximize` the optimizer maximises -CE, "
              "the CE is reported).", "",
              "Loading: torch 1.13's `torch.load(weights_only=True)` refuses every optimizer "
              "state_dict (its restricted unpickler lacks the BINFLOAT opcode used for lr/betas/"
              "eps; fixed in torch 2.0). `scripts/torch_step_check.py: safe_torch_load` tries "
              "weights_only first and only on that error falls back to the standard unpickler "
              "restricted to the same allowlist of globals.", ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
