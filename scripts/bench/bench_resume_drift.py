#!/usr/bin/python3
"""Resume drift: how far training resumed from a compressed checkpoint strays from training
resumed from the original, against bf16-cast moments and the noise floor of a one-ulp nudge.

Usage: /usr/bin/python3 scripts/bench/bench_resume_drift.py [--bin build/apps] [--save-at 200]
           [--resume 300] [--out docs/resume_drift.md]

Two real runs (scripts/fixtures/ckpt_models.py data and models): the byte-level transformer LM with
Adam + L2 (betas 0.9/0.999, weight_decay 1e-2) and the digits CNN with AdamW. Each trains
--save-at steps and is saved with torch.save; the checkpoint is compressed with ckpt-compress
(--horizon 1 and all, --tolerance 0.01 and 0.001) and restored with ckpt-restore. Then
training resumes for --resume steps (the same batches) from
  original        the saved file itself (the reference)
  ckptkit ...     each restored file
  bf16 moments    exp_avg / exp_avg_sq cast to bfloat16 and back
  1-ulp nudge     every parameter moved by one float32 ulp (the noise floor: training
                  amplifies any difference, so no state can drift less than this)
and the table reports the moment reduction, the largest |loss - loss_ref| over the resumed
steps and the relative L2 distance of the final parameters to the reference's.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import ckpt_models as cm  # noqa: E402

RUNS = {
    "lm (Adam + L2)": dict(model="lm", cls=torch.optim.Adam, hp=dict(lr=2e-3, betas=(0.9, 0.999), weight_decay=1e-2)),
    "cnn (AdamW)": dict(model="cnn", cls=torch.optim.AdamW, hp=dict(lr=2e-3, betas=(0.9, 0.999), weight_decay=5e-2)),
}


def make(run):
    """Fresh seeded model and optimizer of `run`."""
    spec = RUNS[run]
    torch.manual_seed(cm.SEED)
    model = cm.MODELS[spec["model"]]()
    return model, spec["cls"](model.parameters(), **spec["hp"])


def train(run, model, opt, first, steps):
    """Train `steps` steps on batches first.., return the losses."""
    name = RUNS[run]["model"]
    losses = []
    model.train()
    for s in range(first, first + steps):
        xb, yb = cm.batch(name, s)
        opt.zero_grad()
        loss = cm.loss_fn(name, model, xb, yb)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def resume(run, state, save_at, steps):
    """Resume from `state` ({"model", "optimizer"}) for `steps` steps: (losses, flat params)."""
    model, opt = make(run)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    losses = train(run, model, opt, save_at, steps)
    return losses, torch.cat([p.detach().flatten() for p in model.parameters()])


def compress_restore(bin_dir, src, tol, horizon, tmp):
    """ckpt-compress + ckpt-restore; returns (restored state, moment_reduction)."""
    tag = f"h{horizon}_t{tol}"
    ckz, out = os.path.join(tmp, tag + ".ckz.h5"), os.path.join(tmp, tag + ".pt")
    r = subprocess.run([os.path.join(bin_dir, "ckpt-compress"), src, "-o", ckz, "--force", "--tolerance", str(tol),
                        "--horizon", horizon, "--json"], capture_output=True, text=True, check=True)
    import json
    red = json.loads(r.stdout)["moment_reduction"]
    subprocess.run([os.path.join(bin_dir, "ckpt-restore"), ckz, "-o", out, "--force"], check=True,
                   capture_output=True)
    return torch.load(out), red


def main():
    """Print (and optionally write) the drift table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/apps")
    ap.add_argument("--save-at", type=int, default=200)
    ap.add_argument("--resume", type=int, default=300)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    lines = ["| run | resumed from | moment reduction | max abs dloss | param rel. L2 | x bf16 |",
             "|---|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for run in RUNS:
            model, opt = make(run)
            train(run, model, opt, 0, a.save_at)
            src = os.path.join(tmp, "orig.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, src)
            orig = torch.load(src)
            ref_loss, ref_theta = resume(run, orig, a.save_at, a.resume)
            starts = []
            for horizon in ("1", "all"):
                for tol in (0.01, 0.001):
                    st, red = compress_restore(a.bin, src, tol, horizon, tmp)
                    starts.append((f"ckptkit horizon {horizon}, tau {tol}", st, f"{100 * red:.1f}%"))
            bf = torch.load(src)
            for st in bf["optimizer"]["state"].values():
                for k in ("exp_avg", "exp_avg_sq"):
                    st[k] = st[k].to(torch.bfloat16).float()
            starts.append(("bf16 moments", bf, "50.0%"))
            nudge = torch.load(src)
            for k, t in nudge["model"].items():
                if t.is_floating_point():
                    nudge["model"][k] = torch.nextafter(t, torch.full_like(t, float("inf")))
            starts.append(("1-ulp parameter nudge", nudge, "-"))
            rows = []
            for name, st, red in starts:
                losses, theta = resume(run, st, a.save_at, a.resume)
                dl = max(abs(x - y) for x, y in zip(losses, ref_loss))
                dp = float((theta - ref_theta).norm() / ref_theta.norm())
                rows.append((name, red, dl, dp))
            bf_dp = next(r[3] for r in rows if r[0] == "bf16 moments")
            for name, red, dl, dp in rows:
                lines.append(f"| {run} | {name} | {red} | {dl:.2e} | {dp:.2e} | {dp / bf_dp:.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
