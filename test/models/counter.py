"""Stateful neuron and step counter (failure pattern: `self.v = self.v + x` and an in-place
counter advanced twice by a plain recompute; the output reads both)."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Neuron(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.inner = common.mlp()
        self.register_buffer("v", torch.zeros(d))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        h = self.lin(x)
        self.v = self.v * 0.5 + h.detach().mean(0)     # rebinding update
        self.steps.add_(1)                              # in-place counter
        return self.inner(torch.tanh(h + self.v) * (1.0 + 0.1 * self.steps.float()))


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), Neuron(common.D), common.mlp(), Neuron(common.D),
                              common.mlp()])
