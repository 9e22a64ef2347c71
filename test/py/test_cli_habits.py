"""Habits users bring from zstd and gzip (issue 43), on checkpoints made here by real torch:

  * -q / --quiet on every tool: nothing on stdout or stderr on success (no table, warning or
    progress line, also on a terminal); errors stay one line with their exit code, and
    --json still prints its object;
  * --rm on ckpt-compress and ckpt-restore: the input file is removed only after a run that
    succeeded (output written, fsynced, renamed, checked); kept on every failure and signal;
    a folder input is refused (exit 2);
  * restore's summary says what happened ("restored 983,699 bytes from a 450,802-byte
    container"), not a ratio above 100% that reads as a failure.

Binaries come from $CKPTKIT_BIN (FAIL, never skip).
Run: CKPTKIT_BIN=build/apps /usr/bin/python3 -m pytest -q test/py/test_cli_habits.py
"""
import hashlib
import json
import os
import signal

import pytest
import torch
import torch.nn as nn

from test_cli import TRACE, assert_error, exe, hashes, run, run_on_tty
from test_hardening import _interrupt


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
    assert p.stderr.startswith(f"replay-plan: check failed: {TRACE}: budget 1.00 KiB is infeasible")


# --rm ----------------------------------------------------------------------------------------

def _l2_ckpt(path, seed=0):
    """A torch.save checkpoint of a small MLP after three Adam + L2 steps; returns its sha256."""
    model = _mlp(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)
    _train(model, opt)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rm_removes_the_input_after_success(tmp_path):
    src, ckz, back = tmp_path / "m.pt", tmp_path / "m.ckz.h5", tmp_path / "back.pt"
    _l2_ckpt(src)
    keep = tmp_path / "orig.pt"                   # a copy to verify against
    keep.write_bytes(src.read_bytes())
    p = run("ckpt-compress", src, "-o", ckz, "--rm")
    assert p.returncode == 0, p.stderr
    assert not src.exists() and ckz.is_file()
    p = run("ckpt-verify", ckz, "--original", keep)
    assert p.returncode == 0, p.stderr
    p = run("ckpt-restore", ckz, "-o", back, "--rm", "-q")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert not ckz.exists() and back.is_file()
    sd = torch.load(back)
    assert set(sd) == {"model", "optimizer"} and sd["optimizer"]["state"]


def test_rm_keeps_the_input_on_failure(tmp_path):
    src, ckz = tmp_path / "m.pt", tmp_path / "m.ckz.h5"
    digest = _l2_ckpt(src)
    ckz.write_bytes(b"precious")                  # output exists, no --force
    p = run("ckpt-compress", src, "-o", ckz, "--rm")
    assert_error(p, f"ckpt-compress: error: {ckz}: output already exists; pass --force to overwrite it")
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest and ckz.read_bytes() == b"precious"
    bad = tmp_path / "bad.pt"                     # a bad input
    bad.write_bytes(b"PK\x03\x04 not a zip")
    p = run("ckpt-compress", bad, "-o", tmp_path / "bad.ckz.h5", "--rm")
    assert p.returncode == 2 and p.stderr.startswith(f"ckpt-compress: error: {bad}: "), p.stderr
    assert bad.read_bytes() == b"PK\x03\x04 not a zip" and not (tmp_path / "bad.ckz.h5").exists()
    # Adam + L2 without the model: the parameter cannot be located (exit 2), input kept
    lone = tmp_path / "lone.pt"
    torch.save({"optimizer": torch.load(src)["optimizer"]}, lone)
    before = lone.read_bytes()
    p = run("ckpt-compress", lone, "-o", tmp_path / "lone.ckz.h5", "--rm", "--horizon", "1")
    assert p.returncode == 2 and "cannot locate the parameter" in p.stderr, p.stderr
    assert lone.read_bytes() == before
    # restore: output exists; a wrong output format; a damaged container: all keep it
    assert run("ckpt-compress", src, "-o", ckz, "--force").returncode == 0
    ct = ckz.read_bytes()
    (tmp_path / "r.pt").write_bytes(b"x")
    p = run("ckpt-restore", ckz, "-o", tmp_path / "r.pt", "--rm")
    assert_error(p, f"ckpt-restore: error: {tmp_path / 'r.pt'}: output already exists; pass --force to overwrite it")
    p = run("ckpt-restore", ckz, "-o", tmp_path / "r.safetensors", "--rm")
    assert p.returncode == 2 and "restore writes the source format" in p.stderr, p.stderr
    assert ckz.read_bytes() == ct
    damaged = tmp_path / "damaged.ckz.h5"
    damaged.write_bytes(ct[:len(ct) // 2])        # truncated
    p = run("ckpt-restore", damaged, "-o", tmp_path / "d.pt", "--rm")
    assert p.returncode in (1, 2) and p.stderr.count("\n") == 1, p.stderr
    assert damaged.read_bytes() == ct[:len(ct) // 2] and not (tmp_path / "d.pt").exists()


def test_rm_refuses_a_folder(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    _l2_ckpt(d / "last.pt")
    p = run("ckpt-compress", d, "-o", tmp_path / "run.ckz", "--rm")
    assert_error(p, f"ckpt-compress: error: {d}: --rm removes input files only, never a folder; run without --rm")
    assert os.listdir(d) == ["last.pt"] and not (tmp_path / "run.ckz").exists()
    assert run("ckpt-compress", d, "-o", tmp_path / "run.ckz").returncode == 0
    p = run("ckpt-restore", tmp_path / "run.ckz", "-o", tmp_path / "back", "--rm")
    assert_error(p, f"ckpt-restore: error: {tmp_path / 'run.ckz'}: --rm removes input files only, never a folder; "
                    "run without --rm")
    assert (tmp_path / "run.ckz").is_dir() and not (tmp_path / "back").exists()
    for tool in ("ckpt-compress", "ckpt-restore"):
        h = run(tool, "--help").stdout
        assert "--rm" in h and "a folder input is refused" in h, h


@pytest.fixture(scope="module")
def big_ckpt(tmp_path_factory):
    """A ~48 MB checkpoint of a real torch model after one Adam + L2 step (a run long enough
    to interrupt), and its container."""
    d = tmp_path_factory.mktemp("big")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.Linear(2048, 1024))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)
    model(torch.randn(4, 1024)).square().mean().backward()
    opt.step()
    src = d / "big.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, src)
    ckz = d / "big.ckz.h5"
    assert run("ckpt-compress", src, "-o", ckz).returncode == 0
    return src, ckz


@pytest.mark.parametrize("tool", ["ckpt-compress", "ckpt-restore"])
def test_rm_keeps_the_input_on_a_signal(tool, big_ckpt, tmp_path):
    src, ckz = big_ckpt
    inp = tmp_path / ("in.pt" if tool == "ckpt-compress" else "in.ckz.h5")
    where = tmp_path / "out"
    interrupted = 0
    for trial in range(4):
        inp.write_bytes((src if tool == "ckpt-compress" else ckz).read_bytes())
        if where.exists():
            for f in os.listdir(where):
                os.unlink(where / f)
        else:
            where.mkdir()
        out = where / ("o.ckz.h5" if tool == "ckpt-compress" else "o.pt")
        rc, err, left = _interrupt([exe(tool), inp, "-o", out, "--rm"], str(where), signal.SIGTERM)
        if rc == 0:                                # finished before the signal: removed
            assert not inp.exists() and out.is_file()
            continue
        interrupted += 1
        assert rc == -signal.SIGTERM and not left and not out.exists(), (rc, err)
        assert inp.is_file()                       # kept
    assert interrupted >= 2, f"only {interrupted} of 4 runs interrupted"


# restore's summary ------------------------------------------------------------------------------

def test_restore_summary_says_what_happened(tmp_path):
    src, ckz, back = tmp_path / "m.pt", tmp_path / "m.ckz.h5", tmp_path / "back.pt"
    _l2_ckpt(src)
    p = run("ckpt-compress", src, "-o", ckz)
    assert p.returncode == 0, p.stderr
    sizes = os.path.getsize(src), os.path.getsize(ckz)
    assert f"file: {sizes[0]} bytes in, {sizes[1]} bytes out (" in p.stdout   # compress: as before
    p = run("ckpt-restore", ckz, "-o", back)
    assert p.returncode == 0, p.stderr
    line = f"restored {os.path.getsize(back):,} bytes from a {sizes[1]:,}-byte container"
    assert os.path.getsize(back) >= 1000 and "," in line                      # the grouping is shown
    assert line + "\n" in p.stdout and "% of input" not in p.stdout, p.stdout
    assert p.stdout.endswith("ok\n")
