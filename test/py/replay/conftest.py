"""Fixtures for the replay pytest: the replay-plan binary comes from $CKPTKIT_BIN (set by CTest
to <build>/apps); standalone runs must set it too."""
import os
import pathlib

import pytest


@pytest.fixture(scope="session")
def replay_plan():
    bin_dir = os.environ.get("CKPTKIT_BIN")
    if not bin_dir:
        pytest.fail("set CKPTKIT_BIN to the folder holding replay-plan (e.g. build/apps)")
    exe = pathlib.Path(bin_dir) / "replay-plan"
    if not exe.exists():
        pytest.fail(f"{exe} not found (build the replay-plan target)")
    return str(exe)
