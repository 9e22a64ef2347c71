"""In-place write into a tensor a segment received as input, a view of the previous segment's
output (pytorch#36383 family): segment 3 reads its input (a row sum) and then scales it in
place. A recompute of segment 3 sees the scaled bytes unless its input is restored; plain
torch.utils.checkpoint keeps the input tensor itself, so its recompute is wrong."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Producer(nn.Module):
    """Returns a view of a Linear output (Linear saves its input, not its output, so the
    consumer may write the output in place)."""

    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x).view(x.shape[0], -1)


class InplaceConsumer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.inner = common.mlp()

    def forward(self, x):
        s = x.sum(dim=1, keepdim=True)      # reads the input (saves nothing)
        x.mul_(0.5)                          # writes the received view in place
        return self.inner(x + torch.tanh(s))


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), Producer(common.D), InplaceConsumer(common.D),
                              common.mlp(), common.mlp()])
