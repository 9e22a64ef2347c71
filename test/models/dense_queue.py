"""Queue buffer rewritten wholesale each step (MoCo-style dense-queue pattern): the new keys
are pushed in front and every row shifts, so every byte of the queue changes. Selective
preservation would copy the whole queue plus index metadata: a whole snapshot is cheaper."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class KeyQueue(nn.Module):
    def __init__(self, d, rows=1024):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.register_buffer("queue", torch.randn(rows, d))

    def forward(self, x):
        f = self.proj(x)
        logits = f @ self.queue.t()
        out = f + torch.softmax(logits, -1) @ self.queue
        with torch.no_grad():
            self.queue = torch.cat([f.detach(), self.queue[:-f.shape[0]]], 0)
        return out


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), KeyQueue(common.D), common.mlp(), KeyQueue(common.D),
                              common.mlp()])
