"""Dropout drawn from a private torch.Generator (an attribute of the module), not the default
one: torch.utils.checkpoint's preserve_rng_state restores only the default generator, so its
recompute draws a different mask; the contract saves and restores this generator."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class GenDropout(nn.Module):
    def __init__(self, p, seed):
        super().__init__()
        self.p = p
        self.gen = torch.Generator()
        self.gen.manual_seed(seed)

    def forward(self, x):
        keep = (torch.rand(x.shape, generator=self.gen) >= self.p).to(x.dtype)
        return x * keep / (1.0 - self.p)


def drop_block(seed):
    return nn.Sequential(nn.Linear(common.D, common.D), nn.ReLU(), GenDropout(0.3, seed), common.mlp())


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), drop_block(11), common.mlp(), drop_block(12), common.mlp()])
