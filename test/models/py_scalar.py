"""Python-side float scalars (issue 53.1), no tensor state: segment 2 is scaled by an annealed
attribute `self.alpha` that its own forward lowers after use (`alpha *= 0.97`) and by
`1 + 0.01 * (calls % 4)` with a call counter attribute `self.calls`, segment 4 by the same
factor with a call counter kept in a plain object (`self.state.calls`). The op log sees
none of them. Segment 2's recompute must get the alpha and calls its forward got (the
runtime keeps numeric module attributes per call) and leave them as the forward left them;
segment 4's counter is out of the runtime's reach, so the replay probe marks it
non-replayable and every safe plan keeps it, and a kept segment must not be checked for the
scalar (its ops hash with 1.02 differs from the recorded one with 1.01)."""
import os
import sys
import types

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Annealed(nn.Module):
    """An MLP block scaled by `alpha`, which every training forward anneals by 0.97, and by
    1 + 0.01 * (calls % 4), `calls` counting its forwards."""

    def __init__(self):
        super().__init__()
        self.inner = common.mlp()
        self.alpha = 1.0
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.inner(x * (1 + 0.01 * (self.calls % 4))) * self.alpha
        if self.training:
            self.alpha *= 0.97
        return y


class Counted(nn.Module):
    """An MLP block scaled by 1 + 0.01 * (calls % 4), `state.calls` counting its forwards."""

    def __init__(self):
        super().__init__()
        self.inner = common.mlp()
        self.state = types.SimpleNamespace(calls=0)

    def forward(self, x):
        self.state.calls += 1
        return self.inner(x) * (1 + 0.01 * (self.state.calls % 4))


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), Annealed(), common.mlp(), Counted(), common.mlp()])
