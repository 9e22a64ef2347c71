"""A buffer owned by the root module, read by segment 1 and overwritten in place by segment
3 before backward (an annealed temperature passed to the blocks as an argument). It is not in
segment 1's module subtree, so only an op-level log sees that segment 1 reads it; plain
torch.utils.checkpoint recomputes segment 1 with the annealed value."""
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Scaled(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.inner = common.mlp()

    def forward(self, x, temperature):
        return self.inner(torch.tanh(self.lin(x) * torch.reciprocal(temperature)))


class Anneal(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = common.mlp()

    def forward(self, x, temperature):
        y = self.inner(x)
        temperature.mul_(0.9)               # the root's buffer, in place
        return y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.s0 = nn.Linear(32, common.D)
        self.s1 = Scaled(common.D)
        self.s2 = common.mlp()
        self.s3 = Anneal()
        self.s4 = Scaled(common.D)
        self.s5 = nn.Linear(common.D, 8)
        self.register_buffer("temperature", torch.full((common.D,), 2.0))

    def forward(self, x):
        h = self.s1(self.s0(x), self.temperature)
        h = self.s3(self.s2(h), self.temperature)
        return self.s5(self.s4(h, self.temperature))


def build():
    torch.manual_seed(0)
    model = Net()
    batch = (torch.randn(256, 32), torch.randint(0, 8, (256,)))
    return model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1])
