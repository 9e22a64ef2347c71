"""Shared pieces of the failure-pattern models: a stateless MLP block and the classifier
wrapper (batch of 256 x 32 inputs, 8 classes, cross-entropy). build() of every model returns
common.classifier([...blocks...]); the segments are the classifier's top-level children."""
import torch
from torch import nn

D = 64


def mlp():
    """Stateless block: saves ~4 x 64 KiB of activations at batch 256."""
    return nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D), nn.ReLU())


def classifier(blocks):
    """(model, batch, loss_fn) with model = Linear(32, D), *blocks, Linear(D, 8); seeded."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, D), *blocks, nn.Linear(D, 8))
    batch = (torch.randn(256, 32), torch.randint(0, 8, (256,)))

    def loss_fn(m, b):
        return nn.functional.cross_entropy(m(b[0]), b[1])

    return model, batch, loss_fn
