"""Dropout (failure pattern: masks redrawn when the RNG state is not restored)."""
import os
import sys

from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def drop_block():
    return nn.Sequential(nn.Linear(common.D, common.D), nn.ReLU(), nn.Dropout(0.3), common.mlp())


def build():
    common.torch.manual_seed(0)
    return common.classifier([common.mlp(), drop_block(), common.mlp(), drop_block(), common.mlp()])
