"""pytest configuration of test/py: keeps torch on at most 2 threads. The helpers the tests
import live in testlib.py."""
import sys

import pytest

import testlib  # noqa: F401  (puts scripts/ and scripts/fixtures/ on sys.path for every test)


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    """Keep torch on at most 2 threads so the suite behaves the same on small CI machines."""
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def real_frameworks():
    """The fixture makers of test/py register stand-in modules under the real names
    (transformers, lightning, deepspeed: scripts/fixtures/make_folders.py _module) so that their
    pickles name the real classes; tests that import the frameworks themselves
    (test_frameworks.py, test_deepspeed.py) take this fixture: the stand-ins are out of
    sys.modules while they run (a stand-in 'transformers' would shadow the installed one, a
    'deepspeed' without a spec breaks Lightning's probe), and back afterwards."""
    fakes = {n: m for n, m in sys.modules.items() if getattr(m, "__ckptkit_standin__", False)}
    for n in fakes:
        del sys.modules[n]
    try:
        yield
    finally:
        sys.modules.update(fakes)
