"""The models of issue 53 (tried "as a new user would"), at sizes whose CPU step is tens of
milliseconds: a ViT with drop-path, an RReLU + Dropout2d + BatchNorm CNN, a decoder with a
K/V projection shared by its layers and a step-counter buffer read in forward, an LSTM / GRU
language model, and MobileNetV3-small (torchvision, where it imports). The issue's MLP with
Python-side state is py_scalar.py. Each builder returns (model, batch, loss_fn), seeded; the
segments are the default ones (record()'s). BUILDERS names them for the overhead benchmark
(scripts/bench/bench_replay_steptime.py --overhead) and the tests."""
import math

import torch
from torch import nn
from torch.nn import functional as F


class DropPath(nn.Module):
    """Stochastic depth (timm's drop_path): zeroes whole samples of a residual branch with
    probability `p` in training, the rest scaled by 1 / (1 - p) (a Python float)."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


class ViTBlock(nn.Module):
    def __init__(self, d, heads, drop_path):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * d, d))
        self.drop_path = DropPath(drop_path)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.drop_path(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop_path(self.mlp(self.ln2(x)))


class ViT(nn.Module):
    """Patch 4 on 32 x 32 images (64 tokens + a class token), `depth` blocks with drop-path
    rates rising linearly to 0.1, as timm's ViTs."""

    def __init__(self, d=96, depth=6, heads=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 65, d) * 0.02)
        self.blocks = nn.ModuleList([ViTBlock(d, heads, 0.1 * i / (depth - 1)) for i in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


def _images(n, size, classes=10):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, classes, (n,), generator=g)


def _ce(m, b):
    return F.cross_entropy(m(b[0]), b[1])


def vit_droppath():
    torch.manual_seed(0)
    return ViT(), _images(16, 32), _ce


def rrelu_cnn():
    """4 blocks of conv 3x3 + BatchNorm + RReLU (random slopes in training) + Dropout2d, then
    pooling and a linear head; batch 16 of 32 x 32."""
    torch.manual_seed(0)
    chans = [3, 32, 64, 64, 128]
    blocks = [nn.Sequential(nn.Conv2d(a, b, 3, padding=1, stride=1 if i < 2 else 2), nn.BatchNorm2d(b),
                            nn.RReLU(), nn.Dropout2d(0.1))
              for i, (a, b) in enumerate(zip(chans, chans[1:]))]
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(chans[-1], 10))
    return model, _images(16, 32), _ce


class DecoderBlock(nn.Module):
    """Causal attention whose keys and values come from one projection shared by every layer
    (`kv`, owned by the model), and a step counter buffer (`steps`) advanced by each training
    forward and read by it (a residual scale 1 + 0.01 * (steps % 4))."""

    def __init__(self, d, heads, kv):
        super().__init__()
        self.heads, self.kv = heads, kv
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.proj = nn.Linear(d, d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.steps.add_(1)
        B, T, C = x.shape
        h = self.ln1(x)
        q = self.q(h).view(B, T, self.heads, -1).transpose(1, 2)
        k, v = self.kv(h).view(B, T, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y) * (1 + 0.01 * (self.steps % 4))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, vocab=512, d=96, layers=4, heads=4, ctx=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.kv = nn.Linear(d, 2 * d)
        self.layers = nn.ModuleList([DecoderBlock(d, heads, self.kv) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for b in self.layers:
            x = b(x)
        return self.head(self.ln(x))


def _lm_batch(n, t, vocab=512):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (n, t + 1), generator=g)


def _lm_loss(m, b):
    logits = m(b[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))


def shared_kv_decoder():
    torch.manual_seed(0)
    return Decoder(), _lm_batch(16, 64), _lm_loss


class _First(nn.Module):
    """An RNN's output sequence (its states dropped)."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


class RnnLM(nn.Module):
    """Embedding, a 2-layer LSTM (dropout 0.1 between its layers), a GRU, a linear head."""

    def __init__(self, vocab=512, d=64, hidden=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = _First(nn.LSTM(d, hidden, num_layers=2, dropout=0.1, batch_first=True))
        self.drop = nn.Dropout(0.1)
        self.gru = _First(nn.GRU(hidden, hidden, batch_first=True))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        return self.head(self.gru(self.drop(self.lstm(self.emb(ids)))))


def rnn_lm():
    torch.manual_seed(0)
    return RnnLM(), _lm_batch(16, 32), _lm_loss


def mobilenet_v3_small():
    """torchvision's MobileNetV3-small (in-place Hardswish, squeeze-excitation, BatchNorm),
    batch 16 of 64 x 64; ImportError where torchvision does not import beside this torch."""
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.mobilenet_v3_small(num_classes=10), _images(16, 64), _ce


def py_state_mlp():
    """The issue's MLP with Python-side state: py_scalar.py."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import py_scalar
    return py_scalar.build()


BUILDERS = {"mobilenet_v3_small": mobilenet_v3_small, "vit_droppath": vit_droppath, "rrelu_cnn": rrelu_cnn,
            "shared_kv_decoder": shared_kv_decoder, "rnn_lm": rnn_lm, "py_state_mlp": py_state_mlp}
