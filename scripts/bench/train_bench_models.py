#!/usr/bin/python3
"""Train the two larger REAL benchmark checkpoints for scripts/bench/bench_codec.sh (CPU, Debian torch).

  /usr/bin/python3 scripts/bench/train_bench_models.py [--out DIR] [--force] [--resnet-steps N] [--lm-steps N]

Writes (skipping any file already present unless --force), into DIR (default
~/.cache/ckptkit-bench/, outside git because the files are ~130 MB each):

- `resnet18_adamw.pt`: ResNet-18 (torchvision layout re-declared here: BasicBlock x [2,2,2,2],
  widths 64..512, BatchNorm after every conv, CIFAR-style 3x3 stem without max-pool, 1 input
  channel, 10 classes; 11.17M parameters) trained on sklearn's bundled `load_digits`
  (1797 real 8x8 handwritten digits, no download) bilinearly upsampled to 16x16, batch 8,
  torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05), decay / no-decay groups.
  CIFAR is not available offline, so the digits stand in as the real image data.
  Batches are deliberately small (the LM sees 64 bytes per step): the bench machine has 2
  shared CPU cores; the two runs can go in parallel with `--only resnet` / `--only lm`.
- `lm10m_adamw.pt`: `ckpt_models.ByteLM` (the fixture LM class, reused) scaled up to vocab 256,
  d=384, 6 layers, 6 heads, d_ff=1536, ctx 64, tied embeddings: 10.8M parameters, trained on
  the concatenation of every file in /usr/share/common-licenses/ (Debian base-files licences)
  followed by the top-level Python 3.11 standard-library sources (/usr/lib/python3.11/*.py),
  byte by byte, batch 1 x 64 bytes, torch.optim.AdamW(lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
  weight_decay=0.1).

Both are saved as torch.save({"model": state_dict, "optimizer": opt.state_dict(), "epoch": n}).
A `DIR/train_log.json` records parameters, steps, wall time and loss for docs/benchmarks.md.
"""
import argparse
import glob
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import ckpt_models  # noqa: E402  (reuse the fixture LM class and the digits loader)

SEED = 1234
DEFAULT_OUT = os.path.expanduser("~/.cache/ckptkit-bench")


# ------------------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv+BN, identity or 1x1-conv+BN shortcut."""

    def __init__(self, cin, cout, stride):
        """Create the convolutions, batch norms and (when shapes change) the projection."""
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        """relu(bn2(conv2(relu(bn1(conv1 x)))) + shortcut(x))."""
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """ResNet-18 with a CIFAR-style stem (3x3 conv, no max-pool) for small images."""

    def __init__(self, in_ch=1, num_classes=10):
        """Stem, four stages of two BasicBlocks (64, 128, 256, 512 channels) and a linear head."""
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for i, (cout, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)]):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        """Map images [B,C,H,W] to logits [B,num_classes]."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def digits_images():
    """sklearn digits upsampled (bilinear) to [1797,1,16,16], normalised to [-1,1], and labels.

    16x16, not the native 8x8: at 8x8 the last stage runs at 1x1 and its 3x3 kernels receive
    gradient only at the centre tap, which leaves ~62% of all Adam moments exactly zero, an
    unrealistically easy checkpoint to compress. At 16x16 the last stage is 2x2 and every tap
    of every kernel gets gradient.
    """
    x, y = ckpt_models.digits_data()
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    return (x - 0.5) / 0.5, y


# ------------------------------------------------------------------------- text


def text_bytes():
    """Real text on every Debian 12 machine: all common licences, then stdlib sources."""
    paths = sorted(glob.glob("/usr/share/common-licenses/*"))
    paths += sorted(glob.glob("/usr/lib/python3.11/*.py"))
    raw = b"".join(open(p, "rb").read() for p in paths if os.path.isfile(p))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64), len(paths)


# ------------------------------------------------------------------------- training


def decay_groups(model, wd):
    """AdamW groups: weight decay on matrices/kernels, none on biases and norm params."""
    params = list(model.named_parameters())
    return [{"params": [p for _, p in params if p.dim() > 1], "weight_decay": wd},
            {"params": [p for _, p in params if p.dim() <= 1], "weight_decay": 0.0}]


FILES = {"resnet": "resnet18_adamw.pt", "lm": "lm10m_adamw.pt"}


def model_and_optimizer(kind):
    """A freshly seeded model of `kind` ("resnet" / "lm", or its file name in FILES) and its
    AdamW optimizer, as train() starts them (scripts/torch_step_check.py builds the bench
    checkpoints' pairs with it)."""
    kind = {f: k for k, f in FILES.items()}.get(kind, kind)
    torch.manual_seed(SEED)
    if kind == "resnet":
        model = ResNet18()
        return model, torch.optim.AdamW(decay_groups(model, 0.05), lr=1e-3, betas=(0.9, 0.999))
    model = ckpt_models.ByteLM(vocab=256, d=384, n_layers=6, n_heads=6, d_ff=1536, ctx=64)
    return model, torch.optim.AdamW(decay_groups(model, 0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8)


def train(kind, steps, out_path):
    """Train one model for `steps` AdamW steps; save the checkpoint; return a log dict."""
    model, opt = model_and_optimizer(kind)
    g = torch.Generator().manual_seed(SEED)
    if kind == "resnet":
        x, y = digits_images()
        bs, data_desc = 8, "sklearn load_digits (1797 real 8x8 digits) upsampled to 16x16, batch 8"
    else:
        text, nfiles = text_bytes()
        bs, ctx = 1, 64
        data_desc = (f"{text.numel()} bytes: /usr/share/common-licenses/* + "
                     f"/usr/lib/python3.11/*.py ({nfiles} files), batch 1 x 64 bytes")
    nparams = sum(p.numel() for p in model.parameters())
    print(f"{kind}: {nparams} parameters, {steps} steps; {data_desc}", flush=True)
    model.train()
    t0 = time.time()
    first = last = None
    for s in range(steps):
        if kind == "resnet":
            idx = torch.randint(0, x.shape[0], (bs,), generator=g)
            loss = F.cross_entropy(model(x[idx]), y[idx])
        else:
            st = torch.randint(0, text.numel() - ctx - 1, (bs,), generator=g).tolist()
            xb = torch.stack([text[i:i + ctx] for i in st])
            yb = torch.stack([text[i + 1:i + ctx + 1] for i in st])
            out = model(xb)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if kind == "lm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = float(loss)
        first = last if first is None else first
        if s % 25 == 0 or s == steps - 1:
            print(f"  step {s + 1}/{steps} loss {last:.4f} {time.time() - t0:.0f}s", flush=True)
    wall = time.time() - t0
    tmp = out_path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": steps}, tmp)
    os.replace(tmp, out_path)
    return dict(file=os.path.basename(out_path), params=nparams, steps=steps,
                wall_s=round(wall, 1), loss_first=round(first, 4), loss_final=round(last, 4),
                data=data_desc, bytes=os.path.getsize(out_path),
                optimizer=type(opt).__name__ + repr({k: v for k, v in opt.defaults.items()
                                                     if k in ("lr", "betas", "eps")})
                + " weight_decay " + "/".join(str(gr["weight_decay"]) for gr in opt.param_groups)
                + " (decay / no-decay groups)",
                torch=torch.__version__, threads=torch.get_num_threads())


def main():
    """Parse arguments and train whatever is missing from the cache."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="retrain even if the file exists")
    ap.add_argument("--resnet-steps", type=int, default=100)
    ap.add_argument("--lm-steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=("resnet", "lm"), help="train just one of the two")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, "train_log.json")
    for kind, name, steps in (("resnet", "resnet18_adamw.pt", a.resnet_steps),
                              ("lm", "lm10m_adamw.pt", a.lm_steps)):
        if a.only and kind != a.only:
            continue
        path = os.path.join(a.out, name)
        if os.path.exists(path) and not a.force:
            print(f"{path}: present, skipped")
            continue
        entry = train(kind, steps, path)
        log = json.load(open(log_path)) if os.path.exists(log_path) else {}
        log[name] = entry
        json.dump(log, open(log_path + ".tmp", "w"), indent=1)
        os.replace(log_path + ".tmp", log_path)
        print(f"{path}: {log[name]}", flush=True)


if __name__ == "__main__":
    main()
