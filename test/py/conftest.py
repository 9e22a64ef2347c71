"""pytest configuration of test/py: keeps torch on at most 2 threads. The helpers the tests
import live in testlib.py."""
import pytest

import testlib  # noqa: F401  (puts scripts/ and scripts/fixtures/ on sys.path for every test)


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    """Keep torch on at most 2 threads so the suite behaves the same on small CI machines."""
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
