"""CLI behaviour users rely on (issue 11), for all four tools (ckpt-compress, ckpt-verify,
ckpt-restore, replay-plan):

  * never clobber: an output that is the input (same path, symlink, hard link, "..") or an
    existing output without --force is exit 2, checked before any work;
  * exit codes: 0 ok, 1 a check failed, 2 bad input or bad usage (every CLI11 parse error),
    one stderr line "TOOL: error: ... (run 'TOOL --help')"; --help and --version exit 0;
  * --json prints one object on stdout, also on failure ({"ok": false, "error", "exit_code"});
  * --tolerance outside (0, 1] is exit 2; ckpt-verify holds certificates to its own
    --tolerance (default 0.01), not to the manifest's;
  * ckpt-verify / ckpt-restore on a file that is not a container say what to pass instead;
  * a progress line (tensors, bytes, rate, ETA) on stderr when it is a terminal.

Every test asserts the exact exit code, the exact stderr line and that the inputs are
byte-identical afterwards (sha256). Binaries come from $CKPTKIT_BIN (FAIL, never skip).
Run: CKPTKIT_BIN=build/apps /usr/bin/python3 -m pytest -q test/py/test_cli.py
"""
import hashlib
import json
import os
import stat
import pty
import re
import shutil
import subprocess

import pytest

from testlib import require_ckptkit_bin  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "data")
TRACE = os.path.join(DATA, "traces", "bn.trace.json")
TOOLS = ("ckpt-compress", "ckpt-verify", "ckpt-restore", "replay-plan")
VERSION = re.search(r"project\(ckptkit VERSION ([0-9.]+)", open(os.path.join(ROOT, "CMakeLists.txt")).read()).group(1)


def exe(tool):
    """Path of one tool in $CKPTKIT_BIN; pytest.fail when it is missing."""
    path = os.path.join(require_ckptkit_bin(), tool)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path}: missing or not executable", pytrace=False)
    return path


def run(tool, *args, timeout=120):
    """Run a tool with stdout/stderr captured (text)."""
    return subprocess.run([exe(tool), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def hashes(*paths):
    return [sha256(p) for p in paths]


def copy_fixture(tmp_path, name):
    """A private copy of data/NAME (tests may try to clobber it)."""
    dst = tmp_path / name
    shutil.copyfile(os.path.join(DATA, name), dst)
    return dst


def assert_error(p, line, code=2, stdout=""):
    """Exit `code`, stderr exactly `line` (one line), stdout exactly `stdout`."""
    assert (p.returncode, p.stderr) == (code, line + "\n"), (p.returncode, p.stderr)
    assert p.stdout == stdout, p.stdout


def json_error(p):
    """The one JSON error object on stdout."""
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    """(checkpoint, container) of data/cnn_adamw.pt, made once."""
    d = tmp_path_factory.mktemp("ckz")
    src = d / "cnn_adamw.pt"
    shutil.copyfile(os.path.join(DATA, "cnn_adamw.pt"), src)
    ckz = d / "cnn_adamw.ckz.h5"
    p = run("ckpt-compress", src, "-o", ckz)
    assert p.returncode == 0, p.stderr
    return src, ckz


# 1. never clobber ---------------------------------------------------------------------------

def _aliases(tmp_path, src):
    """Ways to name `src` again: itself, via "..", a symlink, a hard link."""
    sub = tmp_path / "sub"
    sub.mkdir(exist_ok=True)
    link, hard = tmp_path / "link", tmp_path / "hard"
    if not link.exists():
        os.symlink(src, link)
        os.link(src, hard)
    return {"same": src, "dotdot": sub / ".." / src.name, "symlink": link, "hardlink": hard}


@pytest.mark.parametrize("alias", ["same", "dotdot", "symlink", "hardlink"])
def test_compress_refuses_output_that_is_the_input(tmp_path, alias):
    src = copy_fixture(tmp_path, "lm_adamw.pt")
    out = _aliases(tmp_path, src)[alias]
    before = sha256(src)
    p = run("ckpt-compress", src, "-o", out, "--force")   # --force never allows it
    assert_error(p, f"ckpt-compress: error: {out}: output is the input {src}; write the output to another path")
    assert sha256(src) == before


def test_restore_refuses_output_that_is_the_input(tmp_path, container):
    _, ckz = container
    before = sha256(ckz)
    out = _aliases(tmp_path, ckz)["symlink"]
    p = run("ckpt-restore", ckz, "-o", out, "--force")
    assert_error(p, f"ckpt-restore: error: {out}: output is the input {ckz}; write the output to another path")
    assert sha256(ckz) == before


@pytest.mark.parametrize("flag", ["-o", "--svg"])
def test_replay_plan_refuses_output_that_is_the_trace(tmp_path, flag):
    trace = tmp_path / "bn.trace.json"
    shutil.copyfile(TRACE, trace)
    out = _aliases(tmp_path, trace)["dotdot"]
    before = sha256(trace)
    p = run("replay-plan", trace, "--budget", "1GiB", flag, out, "--force")
    assert_error(p, f"replay-plan: error: {out}: output is the input {trace}; write the output to another path")
    assert sha256(trace) == before


def test_replay_plan_refuses_one_path_for_two_outputs(tmp_path):
    out = tmp_path / "p.json"
    before = sha256(TRACE)
    p = run("replay-plan", TRACE, "--budget", "1GiB", "-o", out, "--svg", out)
    assert_error(p, f"replay-plan: error: {out}: also given for another output ({out}); give each output its own path")
    assert not out.exists() and sha256(TRACE) == before


@pytest.mark.parametrize("tool", ["ckpt-compress", "ckpt-restore", "replay-plan"])
def test_existing_output_needs_force(tmp_path, container, tool):
    src, ckz = container
    inp, args = {"ckpt-compress": (src, ()), "ckpt-restore": (ckz, ()),
                 "replay-plan": (TRACE, ("--budget", "1GiB"))}[tool]
    out = tmp_path / ("out.pt" if tool == "ckpt-restore" else "out")
    out.write_bytes(b"precious")
    before = hashes(inp, out)
    p = run(tool, inp, *args, "-o", out)
    assert_error(p, f"{tool}: error: {out}: output already exists; pass --force to overwrite it")
    assert hashes(inp, out) == before
    p = run(tool, inp, *args, "-o", out, "--force")
    assert p.returncode == 0, p.stderr
    assert sha256(inp) == before[0] and out.read_bytes() != b"precious"


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_output_folder_or_device_refused_even_with_force(tmp_path, kind):
    """A folder or a special file (here a FIFO: replacing it is harmless if the check ever
    breaks, unlike /dev/null as root) is never an output."""
    src = copy_fixture(tmp_path, "cnn_adamw.pt")
    if kind == "folder":
        out, what = tmp_path, "output is a folder; give a file name"
    else:
        out, what = tmp_path / "fifo", "output is not a regular file; give a file name"
        os.mkfifo(out)
    before = sha256(src)
    p = run("ckpt-compress", src, "-o", out, "--force")
    assert_error(p, f"ckpt-compress: error: {out}: {what}")
    assert sha256(src) == before
    if kind != "folder":
        assert stat.S_ISFIFO(os.stat(out).st_mode)


def test_clobber_is_checked_before_any_work(tmp_path):
    """An unreadable input behind an existing output: the output is refused first, so no
    parsing (and no temporary file) happens."""
    bad = tmp_path / "garbage.pt"
    bad.write_bytes(b"not a checkpoint at all")
    out = tmp_path / "out.ckz.h5"
    out.write_bytes(b"x")
    before = hashes(bad, out)
    p = run("ckpt-compress", bad, "-o", out)
    assert_error(p, f"ckpt-compress: error: {out}: output already exists; pass --force to overwrite it")
    assert hashes(bad, out) == before and sorted(os.listdir(tmp_path)) == ["garbage.pt", "out.ckz.h5"]


# 2. exit codes, --help, --version -----------------------------------------------------------

USAGE = [
    ("ckpt-compress", ["IN", "-o", "OUT", "--optimizer", "sgd"], "--optimizer: sgd not in {auto,adam,adamw}"),
    ("ckpt-compress", ["IN"], "--output is required"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--grad-bound", "-3"], "--grad-bound: not a positive number or inf: -3"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--grad-bound", "foo"], "--grad-bound: not a positive number or inf: foo"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--grad-bound", "1e400"],
     "--grad-bound: too large for a double: 1e400 (write inf for no bound)"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--param-bound", "-3"], "--param-bound: -3 is not a finite number >= 0"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--param-bound", "inf"], "--param-bound: inf is not a finite number >= 0"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--param-bound", "nan"], "--param-bound: nan is not a finite number >= 0"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--chunk", "0"], "--chunk: Value 0 not in range 64 to 1073741824"),
    # overrides torch.optim.Adam itself refuses: a usage error, before the file is read
    ("ckpt-compress", ["IN", "-o", "OUT", "--lr", "-1"], "--lr: -1 is < 0"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--beta2", "1"], "--beta2: 1 is outside [0, 1)"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--beta1", "-0.5"], "--beta1: -0.5 is outside [0, 1)"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--eps", "nan"], "--eps: nan is not a finite number"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--weight-decay", "-0.1"], "--weight-decay: -0.1 is < 0"),
    ("ckpt-compress", ["IN", "-o", "OUT", "--lr", "x"], "--lr: not a number: x"),
    ("ckpt-verify", ["IN", "--grid", "1"], "--grid: Value 1 not in range 5 to 1048576"),
    ("ckpt-verify", ["IN", "--bogus"], "The following argument was not expected: --bogus"),
    ("ckpt-verify", [], "input is required"),
    ("ckpt-restore", ["IN", "-o", "OUT", "--device", "tpu"], "--device: tpu not in {cpu,cuda,auto}"),
    ("replay-plan", ["IN", "--planner", "magic"], "--planner: magic not in {joint,eager,stateless,all,none,ops}"),
    ("replay-plan", ["IN"], "give at least one --budget, --activation-budget or a --sweep"),
]


@pytest.mark.parametrize("tool,args,msg", USAGE, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(USAGE)])
def test_usage_errors_exit_2_with_help_hint(tmp_path, tool, args, msg):
    src = copy_fixture(tmp_path, "cnn_adamw.pt") if tool != "replay-plan" else TRACE
    args = [src if a == "IN" else tmp_path / "out" if a == "OUT" else a for a in args]
    before = sha256(src)
    p = run(tool, *args)
    assert_error(p, f"{tool}: error: {msg} (run '{tool} --help')")
    assert sha256(src) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("tool", TOOLS)
def test_help_and_version_exit_0(tool):
    p = run(tool, "--help")
    assert (p.returncode, p.stderr) == (0, "") and "Usage:" in p.stdout and "--version" in p.stdout
    p = run(tool, "--version")
    assert (p.returncode, p.stderr, p.stdout) == (0, "", f"{tool} ckptkit {VERSION}\n")


def test_check_failed_exit_1(tmp_path, container):
    """verify against another checkpoint: exit 1, the report says NOT OK."""
    _, ckz = container
    other = copy_fixture(tmp_path, "cnn_adam_l2.pt")
    before = hashes(ckz, other)
    p = run("ckpt-verify", ckz, "--original", other)
    assert p.returncode == 1, p.stderr
    assert p.stdout.endswith("NOT OK\n")
    first = next(line[len("FAILED: "):] for line in p.stdout.splitlines() if line.startswith("FAILED: "))
    assert p.stderr == f"ckpt-verify: check failed: {ckz}: {first}\n"  # one line, the first failure
    assert hashes(ckz, other) == before


# 3. --json: one object, also on failure ----------------------------------------------------

@pytest.mark.parametrize("tool", TOOLS)
def test_json_usage_error_object(tmp_path, tool):
    src = copy_fixture(tmp_path, "cnn_adamw.pt")
    before = sha256(src)
    p = run(tool, src, "--json", "--bogus")
    msg = "The following argument was not expected: --bogus" if tool in ("ckpt-verify", "replay-plan") \
        else "--output is required"
    err = f"{msg} (run '{tool} --help')"
    assert p.returncode == 2 and p.stderr == f"{tool}: error: {err}\n", p.stderr
    assert json_error(p) == {"ok": False, "tool": tool, "error": err, "exit_code": 2}
    assert sha256(src) == before


def test_json_bad_input_object(tmp_path):
    src = copy_fixture(tmp_path, "cnn_adamw.pt")
    out = tmp_path / "out.ckz.h5"
    out.write_bytes(b"x")
    before = hashes(src, out)
    p = run("ckpt-compress", src, "-o", out, "--json")
    what = "output already exists; pass --force to overwrite it"
    assert p.returncode == 2 and p.stderr == f"ckpt-compress: error: {out}: {what}\n"
    assert json_error(p) == {"ok": False, "tool": "ckpt-compress", "file": str(out), "error": what, "exit_code": 2}
    assert hashes(src, out) == before


def test_json_replay_plan_bad_trace_object(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("not json")
    before = sha256(bad)
    p = run("replay-plan", bad, "--budget", "1GiB", "--json")
    assert p.returncode == 2 and p.stderr.startswith(f"replay-plan: error: {bad}: ") and p.stderr.count("\n") == 1
    obj = json_error(p)
    assert obj["ok"] is False and obj["exit_code"] == 2 and obj["tool"] == "replay-plan" and obj["file"] == str(bad)
    assert p.stderr == f"replay-plan: error: {bad}: {obj['error']}\n"
    assert sha256(bad) == before


def test_json_report_exit_codes(tmp_path, container):
    """Reports carry exit_code: 0 on success, 1 when a check failed."""
    src, ckz = container
    other = copy_fixture(tmp_path, "cnn_adam_l2.pt")
    before = hashes(src, ckz, other)
    ok = run("ckpt-verify", ckz, "--original", src, "--json")
    assert (ok.returncode, ok.stderr) == (0, "")
    assert json.loads(ok.stdout)["ok"] is True and json.loads(ok.stdout)["exit_code"] == 0
    bad = run("ckpt-verify", ckz, "--original", other, "--json")
    rep = json.loads(bad.stdout)  # one object: the report, with the first failure as "error"
    assert bad.returncode == 1 and rep["ok"] is False and rep["exit_code"] == 1
    assert rep["error"] == rep["failures"][0] and bad.stderr == f"ckpt-verify: check failed: {ckz}: {rep['error']}\n"
    assert hashes(src, ckz, other) == before


# 4. tolerance in (0, 1] ------------------------------------------------------------------------

@pytest.mark.parametrize("tol", ["5", "0", "-1", "nan", "1.5", "0.01x"])
def test_tolerance_outside_unit_interval_exit_2(tmp_path, tol):
    src = copy_fixture(tmp_path, "cnn_adamw.pt")
    out = tmp_path / "out.ckz.h5"
    before = sha256(src)
    p = run("ckpt-compress", src, "-o", out, "--tolerance", tol)
    what = f"not a number: {tol}" if tol.endswith("x") else f"{tol} is outside (0, 1] (units of lr)"
    assert_error(p, f"ckpt-compress: error: --tolerance: {what} (run 'ckpt-compress --help')")
    assert sha256(src) == before and not out.exists()


def test_tolerance_one_is_accepted(tmp_path):
    src = copy_fixture(tmp_path, "cnn_adamw.pt")
    p = run("ckpt-compress", src, "-o", tmp_path / "out.ckz.h5", "--tolerance", "1")
    assert p.returncode == 0, p.stderr


def test_verify_holds_certificates_to_its_own_tolerance(tmp_path):
    """issue 52: a container compressed at tolerance 0.05 (certificates above 0.01) fails
    ckpt-verify's default --tolerance 0.01 with a line that says how to accept it, and
    verifies with --tolerance 0.05; the manifest's tolerance is printed next to "ok"."""
    src = copy_fixture(tmp_path, "cnn_adamw.pt")
    ckz = tmp_path / "out.ckz.h5"
    assert run("ckpt-compress", src, "-o", ckz, "--tolerance", "0.05").returncode == 0
    before = sha256(ckz)
    p = run("ckpt-verify", ckz)
    assert p.returncode == 1 and p.stdout.endswith("NOT OK\n"), p.stdout
    line = p.stderr.splitlines()
    assert len(line) == 1 and line[0].startswith(f"ckpt-verify: check failed: {ckz}: certificates up to "), p.stderr
    assert line[0].endswith("exceed --tolerance 0.01: the container was compressed at tolerance 0.05: "
                            "pass --tolerance 0.05 to accept it"), line[0]
    j = json.loads(run("ckpt-verify", ckz, "--json").stdout)
    assert j["ok"] is False and j["tolerance"] == 0.05 and j["accepted_tolerance"] == 0.01
    for args in (["--tolerance", "0.05"], ["--tolerance", "0.2"], ["--tolerance", "0.05", "--original", src]):
        p = run("ckpt-verify", ckz, *args)
        assert p.returncode == 0, p.stdout + p.stderr
        assert re.search(r"\nok \(certificates up to [0-9.e-]+ lr, within --tolerance 0\.(05|2); "
                         r"compressed at tolerance 0\.05\)\n$", p.stdout), p.stdout[-300:]
    p = run("ckpt-verify", ckz, "--tolerance", "0.02", "--original", src)  # --original too
    assert p.returncode == 1 and "pass --tolerance 0.05 to accept it" in p.stderr, p.stderr
    for tol in ("0", "1.5", "nan"):
        assert_error(run("ckpt-verify", ckz, "--tolerance", tol),
                     f"ckpt-verify: error: --tolerance: {tol} is outside (0, 1] (units of lr) (run 'ckpt-verify --help')")
    assert sha256(ckz) == before


# 5. not a container ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lm_adamw.pt", "cnn_adamw.safetensors", "plain.txt"])
def test_verify_not_a_container(tmp_path, name):
    if name == "plain.txt":
        path = tmp_path / name
        path.write_text("hello\n" * 200)
    else:
        path = copy_fixture(tmp_path, name)
    before = sha256(path)
    p = run("ckpt-verify", path)
    assert_error(p, f"ckpt-verify: error: {path}: not a ckptkit container; pass the container (.ckz.h5), "
                    "and the checkpoint with --original")
    assert sha256(path) == before


def test_restore_not_a_container(tmp_path):
    path = copy_fixture(tmp_path, "cnn_adamw.pt")
    out = tmp_path / "r.pt"
    before = sha256(path)
    p = run("ckpt-restore", path, "-o", out)
    assert_error(p, f"ckpt-restore: error: {path}: not a ckptkit container; pass the container (.ckz.h5) "
                    "that ckpt-compress wrote")
    assert sha256(path) == before and not out.exists()


@pytest.mark.parametrize("tool", ["ckpt-verify", "ckpt-restore"])
def test_missing_or_truncated_container(tmp_path, container, tool):
    """A container path that does not exist says so (not "not an HDF5 file"); one cut short
    says how many of its bytes are there (its superblock states the size), as the package does."""
    out = ["-o", tmp_path / "r.pt"] if tool == "ckpt-restore" else []
    missing = tmp_path / "nope.ckz.h5"
    assert_error(run(tool, missing, *out), f"{tool}: error: {missing}: no such file (No such file or directory)")
    data = container[1].read_bytes()
    cut = tmp_path / "cut.ckz.h5"
    cut.write_bytes(data[:len(data) // 2])
    assert_error(run(tool, cut, *out), f"{tool}: error: {cut}: truncated ({len(data) // 2:,} of {len(data):,} bytes): "
                                       "a copy or a download cut short")
    assert not (tmp_path / "r.pt").exists()


# 6. progress on a terminal -------------------------------------------------------------------

def run_on_tty(argv, timeout=120):
    """Run with stderr on a pseudo-terminal; return (exit code, stdout, stderr text)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 4096)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    out = p.stdout.read()
    p.wait(timeout=timeout)
    return p.returncode, out.decode(), b"".join(chunks).decode()


PROGRESS = re.compile(r"(?P<tool>[a-z-]+): (?P<i>\d+)/(?P<n>\d+) (?P<unit>tensors|planners)"
                      r"(, [0-9.]+ [KMG]?i?B / [0-9.]+ [KMG]?i?B)? \(\d+%\), [0-9.]+ [^,]+/s(, ETA \d+:\d\d)?")


@pytest.mark.parametrize("tool", TOOLS)
def test_progress_on_a_terminal_only(tmp_path, container, tool):
    src, ckz = container
    argv = {"ckpt-compress": [src, "-o", tmp_path / "o.ckz.h5"],
            "ckpt-verify": [ckz, "--original", src],
            "ckpt-restore": [ckz, "-o", tmp_path / "o.pt"],
            "replay-plan": [TRACE, "--sweep", "1536KiB:2MiB:64KiB"]}[tool]
    inputs = [a for a in argv if a in (src, ckz, TRACE)]
    before = hashes(*inputs)
    rc, _, err = run_on_tty([exe(tool), *argv])
    assert rc == 0, err
    draws = [m for m in PROGRESS.finditer(err) if m["tool"] == tool]
    assert draws, err
    unit = "planners" if tool == "replay-plan" else "tensors"
    assert all(m["unit"] == unit for m in draws)
    assert any("ETA" in m.group(0) for m in draws), err           # rate and ETA while running
    assert draws[-1]["i"] == draws[-1]["n"] and ", done in " in err  # a summary at the end
    assert "B / " in draws[0].group(0) or tool == "replay-plan"     # bytes done / total
    # not a terminal, or --json: no progress at all
    for a in ([], ["--json"]):
        for f in ("o.ckz.h5", "o.pt"):
            if (tmp_path / f).exists():
                os.unlink(tmp_path / f)
        p = run(tool, *argv, *a)
        assert p.returncode == 0 and not PROGRESS.search(p.stderr), p.stderr
    if tool == "ckpt-compress":   # under --json and on a terminal: still nothing
        os.unlink(tmp_path / "o.ckz.h5")
        rc, _, err = run_on_tty([exe(tool), *argv, "--json"])
        assert rc == 0 and not PROGRESS.search(err), err
    assert hashes(*inputs) == before
