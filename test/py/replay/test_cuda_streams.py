"""CUDA generators in the replay contract, without a GPU: torch.cuda's RNG functions are
replaced by a fake two-device CUDA whose states are plain tensors, so the recorder's and
ckptkit.replay's stream plumbing ("cuda:N" streams saved, restored, compared) is exercised
exactly as on a GPU machine. (On a real GPU the same functions are torch's.)"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import import_package  # noqa: E402
streams, _ = import_package("ckptkit.replay._common")   # the RNG stream helpers


@pytest.fixture
def fake_cuda(monkeypatch):
    states = {0: torch.arange(16, dtype=torch.uint8), 1: torch.arange(16, 32, dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=0: states[int(device)].clone())

    def set_state(state, device=0):
        states[int(device)] = state.clone()
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    return states


def test_cuda_default_generators_are_streams(fake_cuda):
    model = torch.nn.Linear(2, 2)
    assert streams.cuda_streams() == ["cuda:0", "cuda:1"]
    states = streams.rng_states(model, {})
    assert sorted(states) == ["cpu", "cuda:0", "cuda:1"]
    assert torch.equal(states["cuda:1"], torch.arange(16, 32, dtype=torch.uint8))
    # a segment consumed device 1's generator: the contract restores exactly that state
    fake_cuda[1] = torch.full((16,), 7, dtype=torch.uint8)
    assert not torch.equal(streams.stream_state(model, "cuda:1"), states["cuda:1"])
    streams.set_stream_state(model, "cuda:1", states["cuda:1"])
    assert torch.equal(fake_cuda[1], torch.arange(16, 32, dtype=torch.uint8))
    assert torch.equal(fake_cuda[0], torch.arange(16, dtype=torch.uint8))  # device 0 untouched


def test_no_cuda_streams_without_cuda():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised on this machine")
    assert streams.cuda_streams() == []
    assert list(streams.rng_states(torch.nn.Linear(2, 2), {})) == ["cpu"]
