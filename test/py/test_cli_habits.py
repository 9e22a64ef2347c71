"""Habits users bring from zstd and gzip (issue 43), on checkpoints made here by real torch:

  * -q / --quiet on every tool: nothing on stdout or stderr on success (no table, warning or
    progress line, also on a terminal); errors stay one line with their exit code, and
    --json still prints its object.

Binaries come from $CKPTKIT_BIN (FAIL, never skip).
Run: CKPTKIT_BIN=build/apps /usr/bin/python3 -m pytest -q test/py/test_cli_habits.py
"""
import json
import os

import pytest
import torch
import torch.nn as nn

from test_cli import TRACE, assert_error, exe, hashes, run, run_on_tty


def _train(model, opt, steps=3, seed=0):
    """A few real optimizer steps of `model` on random data (MSE to a random target)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), torch.randn(8, 4, generator=g)).backward()
        opt.step()


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.fixture(scope="module")
def warned_ckpt(tmp_path_factory):
    """A torch.save checkpoint with an AdamW state (compressed) and an SGD-momentum state (kept
    exact, with a warning line on stderr): a run that is not silent unless asked."""
    model, head = _mlp(0), _mlp(1)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sgd = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)
    _train(model, adamw)
    _train(head, sgd, seed=1)
    path = tmp_path_factory.mktemp("quiet") / "two_opts.pt"
    torch.save({"model": model.state_dict(), "optimizer": adamw.state_dict(),
                "head": head.state_dict(), "head_optimizer": sgd.state_dict()}, path)
    return path


def _argv(tool, src, ckz, out_dir):
    """A successful command line of `tool` (outputs in out_dir)."""
    return {"ckpt-compress": [src, "-o", out_dir / "o.ckz.h5"],
            "ckpt-verify": [ckz, "--original", src],
            "ckpt-restore": [ckz, "-o", out_dir / "o.pt"],
            "replay-plan": [TRACE, "--sweep", "1536KiB:2MiB:64KiB", "--check"]}[tool]


def _clear(out_dir):
    for f in ("o.ckz.h5", "o.pt"):
        if (out_dir / f).exists():
            os.unlink(out_dir / f)


@pytest.fixture(scope="module")
def warned_container(warned_ckpt):
    ckz = warned_ckpt.parent / "two_opts.ckz.h5"
    p = run("ckpt-compress", warned_ckpt, "-o", ckz)
    assert p.returncode == 0, p.stderr
    assert "kept exact: SGD state" in p.stderr   # the warning --quiet must silence
    return ckz


@pytest.mark.parametrize("flag", ["-q", "--quiet"])
@pytest.mark.parametrize("tool", ["ckpt-compress", "ckpt-verify", "ckpt-restore", "replay-plan"])
def test_quiet_prints_nothing_on_success(tmp_path, warned_ckpt, warned_container, tool, flag):
    argv = _argv(tool, warned_ckpt, warned_container, tmp_path)
    inputs = [a for a in argv if a in (warned_ckpt, warned_container, TRACE)]
    before = hashes(*inputs)
    rc, out, err = run_on_tty([exe(tool), *argv])   # without it: a table, and progress on a terminal
    assert rc == 0 and out.strip() and err.strip(), (out, err)
    _clear(tmp_path)
    rc, out, err = run_on_tty([exe(tool), *argv, flag])
    assert (rc, out, err) == (0, "", "")
    written = {"ckpt-compress": "o.ckz.h5", "ckpt-restore": "o.pt"}.get(tool)
    assert written is None or (tmp_path / written).is_file()   # the output is still written
    assert hashes(*inputs) == before


def test_quiet_folder_mode(tmp_path, warned_ckpt):
    """Folder mode (its own summary and per-file lines) is silent under -q too."""
    src = tmp_path / "run"
    src.mkdir()
    (src / "last.pt").write_bytes(warned_ckpt.read_bytes())
    (src / "config.json").write_text("{}")
    rc, out, err = run_on_tty([exe("ckpt-compress"), src, "-o", tmp_path / "run.ckz"])
    assert rc == 0 and "last.pt" in out and "kept exact: SGD state" in err, (out, err)
    for tool, argv in (("ckpt-compress", [src, "-o", tmp_path / "q.ckz"]),
                       ("ckpt-verify", [tmp_path / "q.ckz", "--original", src]),
                       ("ckpt-restore", [tmp_path / "q.ckz", "-o", tmp_path / "back"])):
        rc, out, err = run_on_tty([exe(tool), *argv, "-q"])
        assert (rc, out, err) == (0, "", ""), tool
    assert (tmp_path / "back" / "config.json").read_text() == "{}"


@pytest.mark.parametrize("tool", ["ckpt-compress", "ckpt-verify", "ckpt-restore"])
def test_quiet_json_prints_only_the_object(tmp_path, warned_ckpt, warned_container, tool):
    argv = _argv(tool, warned_ckpt, warned_container, tmp_path)
    p = run(tool, *argv, "--json", "-q")
    assert (p.returncode, p.stderr) == (0, "")
    rep = json.loads(p.stdout)
    assert rep["ok"] is True and rep["exit_code"] == 0 and rep["tool"] == tool


def test_quiet_keeps_the_error_line(tmp_path, warned_ckpt, warned_container):
    """Bad usage, bad input and a failed check under -q: exactly the usual one line."""
    out = tmp_path / "o.ckz.h5"
    out.write_bytes(b"precious")
    p = run("ckpt-compress", warned_ckpt, "-o", out, "-q")
    assert_error(p, f"ckpt-compress: error: {out}: output already exists; pass --force to overwrite it")
    assert out.read_bytes() == b"precious"
    p = run("ckpt-restore", warned_container, "-q")
    assert_error(p, "ckpt-restore: error: --output is required (run 'ckpt-restore --help')")
    p = run("ckpt-verify", warned_ckpt, "--quiet")
    assert_error(p, f"ckpt-verify: error: {warned_ckpt}: not a ckptkit container; pass the container (.ckz.h5), "
                    "and the checkpoint with --original")
    # a failed check (another checkpoint as --original): exit 1, one line, no table
    other = tmp_path / "other.pt"
    model = _mlp(2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, other)
    p = run("ckpt-verify", warned_container, "--original", other, "-q")
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"ckpt-verify: check failed: {warned_container}: ")
    p = run("replay-plan", TRACE, "--budget", "1KiB", "-q")
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"replay-plan: check failed: {TRACE}: budget 1KiB is infeasible")
