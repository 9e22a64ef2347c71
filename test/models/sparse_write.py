"""Large memory bank where each step writes a few rows (sparse-write pattern): the segment
overwrites 16 of 2048 rows, then reads the whole bank. Selective preservation keeps only those
rows (4 KiB + index metadata); a whole snapshot keeps the full 512 KiB bank."""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class MemoryBank(nn.Module):
    def __init__(self, d, rows=2048, writes=16):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.writes = writes
        self.register_buffer("bank", torch.randn(rows, d))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        f = self.proj(x)
        with torch.no_grad():
            idx = (self.ptr + torch.arange(self.writes)) % self.bank.shape[0]
            self.bank.index_copy_(0, idx, f[:self.writes].detach())   # writes a few rows
            self.ptr.add_(self.writes)
        logits = f @ self.bank.t()                                   # reads the whole bank
        return f + torch.softmax(logits, -1) @ self.bank


def build():
    torch.manual_seed(0)
    return common.classifier([common.mlp(), MemoryBank(common.D), common.mlp(),
                              MemoryBank(common.D), common.mlp()])
