"""KV cache appended in forward (failure pattern: a plain recompute appends twice, so the
cache doubles and the recomputed attention reads the wrong cache)."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class CachedAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.k = nn.Linear(d, d)
        self.register_buffer("cache", torch.randn(8, d))

    def forward(self, x):
        k = self.k(x)
        self.cache = torch.cat([self.cache, k.detach()], 0)   # append (rebinds the buffer)
        att = torch.softmax(k @ self.cache.t() / 8.0, dim=-1)
        return x + att @ self.cache


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), CachedAttention(common.D), common.mlp(),
                              CachedAttention(common.D), common.mlp()])
