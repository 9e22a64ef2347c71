"""A custom autograd op that keeps a histogram buffer (the activation statistics a quantiser
collects): every forward adds the histogram of its input to `hist` in place. Which bins change
depends on the data, so the bytes one recorded step wrote are not the bytes the next step
writes: a contract must preserve what the op can write (the whole buffer), not what it changed
once."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class _Observe(torch.autograd.Function):
    """Identity in value and gradient; adds histc(x) to the histogram buffer in place."""

    @staticmethod
    def forward(ctx, x, hist):
        hist.add_(torch.histc(x.detach(), bins=hist.numel(), min=-4.0, max=4.0))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


class Observed(nn.Module):
    """An MLP block whose input passes the histogram op (32 bins over [-4, 4])."""

    def __init__(self, d):
        super().__init__()
        self.inner = common.mlp()
        self.register_buffer("hist", torch.zeros(32))

    def forward(self, x):
        return self.inner(_Observe.apply(x, self.hist))


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), Observed(common.D), common.mlp(), Observed(common.D),
                              common.mlp()])
