"""EMA buffer read after it is written in place within the same forward (failure pattern:
a plain recompute reads the already-updated EMA and updates it a second time)."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class EmaNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.inner = common.mlp()
        self.register_buffer("ema", torch.ones(d))

    def forward(self, x):
        h = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * h.abs().mean(0))
        return self.inner(torch.relu(h / self.ema))


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), EmaNorm(common.D), common.mlp(), EmaNorm(common.D),
                              common.mlp()])
