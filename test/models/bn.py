"""BatchNorm running stats (failure pattern: running_mean/var and num_batches_tracked
updated twice by a plain recompute)."""
import os
import sys

from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def bn_block():
    return nn.Sequential(nn.Linear(common.D, common.D), nn.BatchNorm1d(common.D), nn.ReLU(),
                         common.mlp())


def build():
    common.torch.manual_seed(0)
    return common.classifier([common.mlp(), bn_block(), common.mlp(), bn_block(), common.mlp()])
