"""A nanoGPT-style GPT (Karpathy's model.py, shrunk): token + position embeddings, dropout,
causal self-attention with a causal-mask buffer holding -inf above the diagonal, tied
wte / lm_head weights, a ModuleDict holding a ModuleList of blocks, and a (logits, loss)
output. build(dropout=...) for the replay API tests; MODEL.py contract: build() ->
(model, batch, loss_fn)."""
import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, BLOCK, LAYERS, HEADS, EMBD = 64, 16, 2, 2, 32


class CausalSelfAttention(nn.Module):
    def __init__(self, dropout, act_twice=False):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.full((BLOCK, BLOCK), float("-inf")).triu(1)
        self.register_buffer("bias", mask.view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(EMBD, dim=2)
        q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att + self.bias[:, :, :T, :T], dim=-1)
        att = self.attn_dropout(att)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, dropout, act="gelu"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD)
        self.attn = CausalSelfAttention(dropout)
        self.ln_2 = nn.LayerNorm(EMBD)
        self.c_fc = nn.Linear(EMBD, 4 * EMBD)
        self.c_proj = nn.Linear(4 * EMBD, EMBD)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.dropout(self.c_proj(self.act(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self, dropout=0.1, act="gelu"):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, EMBD), wpe=nn.Embedding(BLOCK, EMBD), drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(dropout, act) for _ in range(LAYERS)]), ln_f=nn.LayerNorm(EMBD)))
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight      # tied

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n, BLOCK + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def loss_fn(model, b):
    return model(b[0], b[1])[1]


def build(dropout=0.1, act="gelu"):
    torch.manual_seed(0)
    return GPT(dropout, act), batch(), loss_fn
