"""A Python global read by segment 2 and bumped by segment 4 (a step counter kept outside
torch). No tensor log can see it: the recorder's replay probe re-runs segment 2 after the
step, gets a different output and marks it non-replayable, so no planner may recompute it
safely (stateless plans that do are UNSAFE and really differ)."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

STEP = 0


class ReadsGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = common.mlp()

    def forward(self, x):
        return self.inner(x) * (1.0 + 0.25 * STEP)


class BumpsGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = common.mlp()

    def forward(self, x):
        global STEP
        STEP += 1
        return self.inner(x)


def build():
    """The segments are named: finding the default ones runs the forward once, which would
    bump STEP before the recorded step (state outside torch is not restored)."""
    global STEP
    STEP = 0
    torch.manual_seed(0)
    model, batch, loss_fn = common.classifier([common.mlp(), ReadsGlobal(), common.mlp(), BumpsGlobal(),
                                               common.mlp()])
    return model, batch, loss_fn, [n for n, _ in model.named_children()]
