"""Model classes, real data and optimizer recipes shared by the ckptkit fixtures and tests.

`scripts/make_fixtures.py` trains these models and writes `data/*.pt|*.safetensors`;
`scripts/torch_step_check.py` and `test/py/test_roundtrip.py` rebuild the same model and
optimizer classes from here, so nothing is written twice.

Data (both real, both present on a fresh Debian 12 with python3):
- sklearn's bundled `load_digits` (1797 8x8 handwritten digits, no download);
- `/usr/share/common-licenses/GPL-3` (package base-files, 35,149 bytes of ASCII text),
  modelled byte by byte.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT_PATH = "/usr/share/common-licenses/GPL-3"
SEED = 1234

# ---------------------------------------------------------------------------- models


class DigitsCNN(nn.Module):
    """Small conv net with BatchNorm for 8x8 digits (about 9.9k parameters)."""

    def __init__(self):
        """Two conv+BN+ReLU blocks, a 2x2 max-pool and a two-layer classifier head."""
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        """Map a batch [B,1,8,8] to logits [B,10]."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class Block(nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention and a GELU MLP."""

    def __init__(self, d, n_heads, d_ff):
        """Create the layer norms, fused qkv projection, output projection and MLP."""
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, d_ff)
        self.fc2 = nn.Linear(d_ff, d)

    def forward(self, x):
        """Apply attention and MLP with residual connections to x [B,T,d]."""
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ByteLM(nn.Module):
    """Byte-level transformer LM with TIED input/output embeddings (head.weight is tok.weight)."""

    def __init__(self, vocab=128, d=64, n_layers=2, n_heads=4, d_ff=128, ctx=64):
        """Token + learned position embeddings, `n_layers` blocks, final norm, tied head."""
        super().__init__()
        self.ctx = ctx
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, n_heads, d_ff) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one Parameter, two state_dict keys
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2 style init: logits start near 0
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, idx):
        """Map byte ids [B,T] to next-byte logits [B,T,vocab]."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


MODELS = {"cnn": DigitsCNN, "lm": ByteLM,
          # a byte vocabulary of 256 over ASCII text: more than half of the embedding rows
          # never see a token (the wide-range exp_avg_sq pattern of codec issue 14)
          "lm256": lambda: ByteLM(vocab=256)}

# ---------------------------------------------------------------------------- data

_cache = {}


def digits_data():
    """Return (X [1797,1,8,8] float32 scaled to [0,1], y [1797] int64) from sklearn digits."""
    if "digits" not in _cache:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
        _cache["digits"] = (x, y)
    return _cache["digits"]


def text_data():
    """Return the bytes of TEXT_PATH as an int64 tensor (all values < 128: ASCII)."""
    if "text" not in _cache:
        raw = open(TEXT_PATH, "rb").read()
        t = torch.tensor(list(raw), dtype=torch.int64)
        if int(t.max()) >= 128:
            raise ValueError(f"{TEXT_PATH}: expected ASCII text")
        _cache["text"] = t
    return _cache["text"]


def batch(model_name, step, batch_size=None):
    """Deterministic training batch number `step` for `model_name` ('cnn' or 'lm').

    The batch depends only on (model_name, step), so the "next" batch after a checkpoint
    taken at step s is simply batch(model_name, s).
    """
    g = torch.Generator().manual_seed(SEED * 1000 + step)
    if model_name == "cnn":
        x, y = digits_data()
        bs = batch_size or 64
        idx = torch.randint(0, x.shape[0], (bs,), generator=g)
        return x[idx], y[idx]
    text = text_data()
    bs = batch_size or 8
    ctx = 64
    starts = torch.randint(0, text.numel() - ctx - 1, (bs,), generator=g)
    xb = torch.stack([text[s:s + ctx] for s in starts.tolist()])
    yb = torch.stack([text[s + 1:s + ctx + 1] for s in starts.tolist()])
    return xb, yb


def loss_fn(model_name, model, xb, yb):
    """Cross-entropy loss of `model` on one batch (per byte for the LM)."""
    out = model(xb)
    if model_name.startswith("lm"):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))
    return F.cross_entropy(out, yb)


# ---------------------------------------------------------------------------- recipes

# One training run per entry; several fixture files may come from the same run.
RUNS = {
    "cnn_adam_l2": dict(model="cnn", optimizer="adam", steps=200,
                        hp=dict(lr=1e-3, weight_decay=1e-4)),
    "cnn_adamw": dict(model="cnn", optimizer="adamw", steps=200, groups="decay_split",
                      hp=dict(lr=2e-3, betas=(0.9, 0.999), weight_decay=5e-2)),
    "cnn_maximize": dict(model="cnn", optimizer="adam", steps=200, maximize=True,
                         hp=dict(lr=1e-3, maximize=True)),
    "lm_adamw": dict(model="lm", optimizer="adamw", steps=200,
                     hp=dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
    "lm_amsgrad": dict(model="lm", optimizer="adam", steps=200,
                       hp=dict(lr=2e-3, amsgrad=True)),
    # Adam with L2 decay on a mostly unused vocabulary: the unseen rows are driven by the
    # decay term alone (|m|/sqrt(v) ~ 2-3), so exp_avg_sq spans many decades in one block.
    "lm_sparse_l2": dict(model="lm256", optimizer="adam", steps=200,
                         hp=dict(lr=2e-3, weight_decay=1e-2)),
    # dead units: at step 100 half of fc1's units get bias -1000 (ReLU never fires again), so
    # their exp_avg / exp_avg_sq decay geometrically for 100 steps next to live ones.
    "cnn_dead": dict(model="cnn", optimizer="adam", steps=200, kill=dict(at=100, module="fc1", frac=0.5),
                     hp=dict(lr=1e-3)),
}

# fixture file -> (run, layout). layout: "full" = {"model","optimizer","epoch"} torch.save;
# "optimizer_only" = torch.save(opt.state_dict()) (HF Trainer optimizer.pt; the model weights
# of the same run are in lm_adamw.pt); "safetensors" = flattened model.<name> / state.<idx>.*.
FIXTURES = {
    "cnn_adam_l2.pt": ("cnn_adam_l2", "full"),
    "cnn_adamw.pt": ("cnn_adamw", "full"),
    "cnn_maximize.pt": ("cnn_maximize", "full"),
    "lm_adamw.pt": ("lm_adamw", "full"),
    "lm_amsgrad.pt": ("lm_amsgrad", "full"),
    "lm_optimizer_only.pt": ("lm_adamw", "optimizer_only"),
    "cnn_adamw.safetensors": ("cnn_adamw", "safetensors"),
    "lm_sparse_l2.pt": ("lm_sparse_l2", "full"),
    "cnn_dead.pt": ("cnn_dead", "full"),
}

# Where the model weights of an optimizer-only fixture live (same run, same step).
WEIGHTS_OF = {"lm_optimizer_only.pt": "lm_adamw.pt"}


def build(name):
    """Build a freshly seeded model for a model name ('cnn'/'lm'), run name or fixture file."""
    if name in FIXTURES:
        name = FIXTURES[name][0]
    if name in RUNS:
        name = RUNS[name]["model"]
    torch.manual_seed(SEED)
    return MODELS[name]()


def param_groups(run, model):
    """Parameter groups of `run`: one group, or decay / no-decay (biases and norms) groups."""
    spec = RUNS[run]
    params = list(model.named_parameters())  # deduplicated: tied weights appear once
    if spec.get("groups") == "decay_split":
        decay = [p for n, p in params if p.dim() > 1]
        no_decay = [p for n, p in params if p.dim() <= 1]
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [{"params": [p for _, p in params]}]


def make_optimizer(run, model):
    """The optimizer (torch.optim.Adam or AdamW, with the run's hyper-parameters) over `model`."""
    spec = RUNS[run]
    cls = torch.optim.AdamW if spec["optimizer"] == "adamw" else torch.optim.Adam
    return cls(param_groups(run, model), **spec["hp"])


def optimizer_param_names(run, model):
    """Model parameter names in optimizer index order (the `params` ids of the state_dict)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in param_groups(run, model) for p in g["params"]]
