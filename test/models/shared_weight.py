"""A shared weight renormalised in place under CPU autocast (pytorch#193338 family): segments
1 and 3 use the same Parameter through F.linear under torch.autocast("cpu", bfloat16);
segment 3 then scales the rows with norm > 0.5 down in place (max-norm renormalisation). The
forward uses autocast's cached bf16 copy of the pre-renorm weight in both segments; a
recompute of segment 1 (or 3) casts the renormalised weight unless the contract restores it."""
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Tied(nn.Module):
    def __init__(self, weight, renorm):
        super().__init__()
        self.weight = weight              # the same Parameter object in both segments
        self.renorm = renorm
        self.inner = common.mlp()

    def forward(self, x):
        h = torch.tanh(F.linear(x, self.weight))
        if self.renorm:
            with torch.no_grad():
                w = self.weight
                w.mul_((0.5 / w.float().norm(dim=1, keepdim=True)).clamp(max=1.0))
        return self.inner(h.float())


def build():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(common.D, common.D) * 0.2)
    model = nn.Sequential(nn.Linear(32, common.D), Tied(w, False), common.mlp(), Tied(w, True),
                          common.mlp(), nn.Linear(common.D, 8))
    batch = (torch.randn(256, 32), torch.randint(0, 8, (256,)))

    def loss_fn(m, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(b[0])
        return F.cross_entropy(out.float(), b[1])

    return model, batch, loss_fn
