"""End-to-end proof with stock torch: compress -> verify -> restore -> torch.load -> one step.

For every fixture in data/ (see data/README.md) and codec x gradient bound G, the test
  1. runs `ckpt-compress --json` and checks its byte accounting is self-consistent and exact
     (moment_values = elements of exp_avg/exp_avg_sq/max_exp_avg_sq in the file,
     moment_bytes_fp32 = 4 * moment_values, moment_reduction = 1 - out/fp32,
     max_bound_lr <= tolerance, ok);
  2. runs `ckpt-verify` (exit 0) with and without `--original`;
  3. runs `ckpt-restore`, loads the result with stock torch (weights_only allowlist) or the
     strict safetensors reader, and asserts every non-moment value is bit-identical (dtype,
     shape, stride, offset, bytes; step; param_groups; epoch; tied-weight storage sharing);
  4. rebuilds model + optimizer (scripts/fixtures/ckpt_models.py) from the original and from the
     restored file, applies the same gradients (real next batch, 0, +-G, uniform in [-G, G],
     +-sqrt(v_hat), near sqrt(v_hat)) and asserts, per coordinate,
     |dTheta_restored - dTheta_original| <= tolerance * lr + slack (slack: float32 rounding
     of the parameter update itself, see scripts/torch_step_check.py).
The checker's own sensitivity is tested first, without the tools (identity gives exactly 0;
a moment perturbation beyond the tolerance, a flipped weight bit and untied weights fail).
"""
import hashlib
import math
import os

import pytest
import torch

from testlib import (DATA, ckpt_models, fixture_path, moment_count, parse_json_stdout,
                      require_ckptkit_bin, run_tool, torch_step_check as tsc)

TOL = 0.01
FIXTURES = list(ckpt_models.FIXTURES)
KIND = {f: ckpt_models.RUNS[run]["optimizer"] for f, (run, _) in ckpt_models.FIXTURES.items()}

# vlog (the default) at both bounds; log8 and the guarded baselines at one bound each (time
# budget); the explicit --optimizer kind once for the two weight-decay fixtures (auto is the
# default).
def _kind(f, g):
    """An optimizer-only file has no parameters, so Adam L2 cannot be certified at finite G:
    name the optimizer (the fixture is AdamW); test_l2_needs_parameters covers 'auto'."""
    return "adamw" if f == "lm_optimizer_only.pt" and g != "inf" else "auto"


COMBOS = ([(f, "vlog", g, _kind(f, g)) for f in FIXTURES for g in ("1.0", "inf")]
          + [(f, "log8", "1.0", _kind(f, "1.0")) for f in FIXTURES]
          + [(f, "bf16", "1.0", _kind(f, "1.0")) for f in FIXTURES]
          + [(f, "blockwise8", "inf", "auto") for f in FIXTURES]
          + [("cnn_adam_l2.pt", "vlog", "1.0", "adam"), ("cnn_adamw.pt", "vlog", "1.0", "adamw")])

JSON_KEYS = {"moment_values", "escapes", "moment_bytes_fp32", "moment_bytes_out",
             "moment_reduction", "max_bound_lr", "tolerance", "grad_bound", "codec", "ok"}


def _as_float(v):
    """JSON number, or a string such as "inf"/"Infinity", as a Python float (None -> inf)."""
    return math.inf if v is None else float(v)


def _restored_name(fixture):
    """Output name for ckpt-restore, keeping the fixture's extension."""
    return "restored.safetensors" if fixture.endswith(".safetensors") else "restored.pt"


def _assert_step_ok(errors, results, label):
    """Fail with a readable table unless there are no bit errors and every kind passes."""
    assert not errors, f"{label}: non-moment differences: {errors[:10]}"
    bad = {k: r for k, r in results.items() if not r["ok"]}
    table = ", ".join(f"{k}={r['max_lr']:.3e}" for k, r in results.items())
    assert not bad, f"{label}: update differs by more than tolerance*lr: {bad}; all: {table}"


# ---------------------------------------------------------------------------- the checker


def _save_modified(src, dst, edit):
    """Load `src` (torch), apply `edit(obj)` in place, torch.save to `dst` (sharing kept)."""
    obj = tsc.safe_torch_load(src)
    edit(obj)
    torch.save(obj, dst)
    return dst


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_loads_with_stock_torch(fixture):
    """Every fixture loads, rebuilds its model/optimizer and resumes at the recorded step."""
    path = fixture_path(fixture)
    model_sd, osd = tsc.split_state(tsc.load_any(path), path,
                                    os.path.join(DATA, ckpt_models.WEIGHTS_OF[fixture])
                                    if fixture in ckpt_models.WEIGHTS_OF else None)
    run = ckpt_models.FIXTURES[fixture][0]
    model, opt = tsc.build_pair(fixture, model_sd, osd)
    steps = {float(st["step"]) for st in opt.state.values()}
    assert steps == {float(ckpt_models.RUNS[run]["steps"])}
    n_params = sum(1 for g in opt.param_groups for _ in g["params"])
    assert len(opt.state) == n_params  # every parameter has moments (past warm-up)
    if ckpt_models.RUNS[run]["hp"].get("amsgrad"):
        assert all("max_exp_avg_sq" in st for st in opt.state.values())
    if isinstance(model, ckpt_models.ByteLM):
        assert model.tok.weight.data_ptr() == model.head.weight.data_ptr()
        if model_sd is not None and fixture.endswith(".pt") and fixture not in ckpt_models.WEIGHTS_OF:
            assert model_sd["tok.weight"].data_ptr() == model_sd["head.weight"].data_ptr()


@pytest.mark.parametrize("fixture", ["cnn_adam_l2.pt", "lm_amsgrad.pt", "cnn_adamw.safetensors"])
def test_checker_identity_is_exactly_zero(fixture):
    """A file checked against itself: no differences, every update difference exactly 0."""
    path = fixture_path(fixture)
    errors, res = tsc.check_pair(path, path, TOL, math.inf, check_zeros=True)
    assert errors == []
    assert all(r["max_lr"] == 0.0 and r["ok"] for r in res.values()), res


def test_checker_flags_moment_perturbation(tmp_path):
    """exp_avg scaled by 1.5 moves the first update by far more than 0.01 lr: must fail."""
    src = fixture_path("cnn_adamw.pt")

    def edit(obj):
        """Scale every exp_avg by 1.5."""
        for st in obj["optimizer"]["state"].values():
            st["exp_avg"].mul_(1.5)

    dst = _save_modified(src, str(tmp_path / "cnn_adamw.pt"), edit)
    errors, res = tsc.check_pair(src, dst, TOL, 1.0, fixture="cnn_adamw.pt")
    assert errors == []  # only moments changed
    assert not res["real"]["ok"] and not res["+sqrt_vhat"]["ok"]
    assert res["zero"]["max_lr"] > TOL


def test_checker_accepts_tiny_moment_change(tmp_path):
    """exp_avg scaled by (1 + 2^-20) changes u by ~1e-6 relative: far inside 0.01 lr."""
    src = fixture_path("lm_adamw.pt")

    def edit(obj):
        """Scale every exp_avg by 1 + 2^-20."""
        for st in obj["optimizer"]["state"].values():
            st["exp_avg"].mul_(1 + 2.0 ** -20)

    dst = _save_modified(src, str(tmp_path / "lm_adamw.pt"), edit)
    errors, res = tsc.check_pair(src, dst, TOL, math.inf, fixture="lm_adamw.pt")
    assert errors == []
    assert all(r["ok"] for r in res.values()), res
    assert 0.0 < res["real"]["max_lr"] < 1e-4


def test_checker_flags_weight_bit_flip_and_untying(tmp_path):
    """One flipped bit in a weight and an untied head.weight are both reported."""
    src = fixture_path("lm_adamw.pt")

    def edit(obj):
        """Flip the lowest mantissa bit of one weight and untie head.weight."""
        w = obj["model"]["blocks.0.fc1.weight"]
        w.view(torch.int32).view(-1)[7] ^= 1
        obj["model"]["head.weight"] = obj["model"]["head.weight"].clone()

    dst = _save_modified(src, str(tmp_path / "lm_adamw.pt"), edit)
    errors = tsc.compare_checkpoints(tsc.load_any(src), tsc.load_any(dst))
    assert any("blocks.0.fc1.weight: values differ" in e for e in errors), errors
    assert any("head.weight" in e and "shared" in e for e in errors), errors


def test_checker_flags_step_and_param_group_change(tmp_path):
    """A changed step or lr is a non-moment difference."""
    src = fixture_path("cnn_maximize.pt")

    def edit(obj):
        """Advance one step counter and change lr."""
        obj["optimizer"]["state"][0]["step"] += 1
        obj["optimizer"]["param_groups"][0]["lr"] = 2e-3

    dst = _save_modified(src, str(tmp_path / "cnn_maximize.pt"), edit)
    errors = tsc.compare_checkpoints(tsc.load_any(src), tsc.load_any(dst))
    assert any("state/0/step" in e for e in errors), errors
    assert any("param_groups/0/lr" in e for e in errors), errors


def test_safetensors_reader_rejects_gap(tmp_path):
    """The test's own safetensors reader refuses a header whose entries leave a gap."""
    src = fixture_path("cnn_adamw.safetensors")
    raw = open(src, "rb").read()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(raw + b"\0\0\0\0")  # buffer longer than the tensors cover
    with pytest.raises(tsc.BadInput, match="not fully covered"):
        tsc.read_safetensors(str(bad))


def test_step_check_cli_exit_codes(tmp_path, capsys):
    """scripts/torch_step_check.py: 0 for identity, 1 for perturbed moments, 2 for bad input."""
    src = fixture_path("cnn_adam_l2.pt")
    assert tsc.main([src, src, "--grad-bound", "1.0"]) == 0
    assert "PASS" in capsys.readouterr().out

    def edit(obj):
        """Halve every exp_avg_sq."""
        for st in obj["optimizer"]["state"].values():
            st["exp_avg_sq"].mul_(0.5)

    dst = _save_modified(src, str(tmp_path / "cnn_adam_l2.pt"), edit)
    assert tsc.main([src, dst, "--grad-bound", "inf"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "real" in out
    assert tsc.main([src, str(tmp_path / "missing.pt")]) == 2
    junk = tmp_path / "cnn_adam_l2_junk.pt"
    junk.write_bytes(b"PK\x03\x04 not a zip")
    assert tsc.main([src, str(junk), "--fixture", "cnn_adam_l2.pt"]) == 2


# ---------------------------------------------------------------------------- the tools


@pytest.mark.parametrize("fixture,codec,gbound,kind", COMBOS,
                         ids=[f"{f}-{c}-G{g}-{k}" for f, c, g, k in COMBOS])
def test_roundtrip(tmp_path, fixture, codec, gbound, kind):
    """compress -> verify -> restore -> stock torch: bit-exact rest, update within tolerance."""
    ckptkit_bin = require_ckptkit_bin()
    orig = fixture_path(fixture)
    digest = hashlib.sha256(open(orig, "rb").read()).hexdigest()
    ckz = tmp_path / (fixture + ".ckz.h5")
    p = run_tool(ckptkit_bin, "ckpt-compress", orig, "-o", ckz, "--tolerance", TOL,
                 "--grad-bound", gbound, "--codec", codec, "--optimizer", kind, "--json")
    assert p.returncode == 0, f"ckpt-compress rc={p.returncode}: {p.stderr}"
    rep = parse_json_stdout(p)
    assert JSON_KEYS <= set(rep), f"missing keys {JSON_KEYS - set(rep)}"
    n = moment_count(orig)
    assert rep["ok"] is True
    assert rep["codec"] == codec
    assert rep["moment_values"] == n
    assert rep["moment_bytes_fp32"] == 4 * n
    assert 0 <= rep["escapes"] <= n
    assert 0 < rep["moment_bytes_out"]
    assert rep["moment_reduction"] == pytest.approx(
        1 - rep["moment_bytes_out"] / rep["moment_bytes_fp32"], rel=0, abs=1e-12)
    assert 0 <= rep["max_bound_lr"] <= TOL
    assert _as_float(rep["tolerance"]) == TOL
    assert _as_float(rep["grad_bound"]) == float(gbound)
    assert ckz.is_file()

    for extra in ((), ("--original", orig)):
        v = run_tool(ckptkit_bin, "ckpt-verify", ckz, *extra)
        assert v.returncode == 0, f"ckpt-verify {' '.join(extra)} rc={v.returncode}: {v.stderr}"

    restored = tmp_path / _restored_name(fixture)
    r = run_tool(ckptkit_bin, "ckpt-restore", ckz, "-o", restored)
    assert r.returncode == 0, f"ckpt-restore rc={r.returncode}: {r.stderr}"
    assert restored.is_file()

    errors, res = tsc.check_pair(orig, str(restored), TOL, float(gbound), fixture=fixture,
                                 check_zeros=(codec == "log8"))
    _assert_step_ok(errors, res, f"{fixture} {codec} G={gbound}")
    assert hashlib.sha256(open(orig, "rb").read()).hexdigest() == digest  # input untouched


def test_verify_rejects_garbage_and_wrong_original(tmp_path):
    """ckpt-verify: 2 on a file that is not a container, 1 against the wrong original."""
    ckptkit_bin = require_ckptkit_bin()
    junk = tmp_path / "junk.ckz.h5"
    junk.write_bytes(b"not an hdf5 container\n" * 10)
    v = run_tool(ckptkit_bin, "ckpt-verify", junk)
    assert v.returncode == 2, f"rc={v.returncode}: {v.stderr}"
    assert v.stderr.strip(), "bad input must print an error line"

    ckz = tmp_path / "cnn_adamw.ckz.h5"
    p = run_tool(ckptkit_bin, "ckpt-compress", fixture_path("cnn_adamw.pt"), "-o", ckz)
    assert p.returncode == 0, p.stderr
    v = run_tool(ckptkit_bin, "ckpt-verify", ckz, "--original", fixture_path("cnn_adam_l2.pt"))
    assert v.returncode == 1, f"rc={v.returncode}: {v.stderr}"


def test_l2_needs_parameters(tmp_path):
    """--horizon 1, auto + weight decay + finite G without parameters: refuse (exit 2, one
    line, no file), never suggesting --optimizer adamw (which would certify another
    optimizer's domain than an Adam + L2 state's). --horizon all (the default) needs no
    gradient domain, so no parameter: it compresses, and verify --original passes."""
    ckptkit_bin = require_ckptkit_bin()
    out = tmp_path / "x.ckz.h5"
    p = run_tool(ckptkit_bin, "ckpt-compress", fixture_path("lm_optimizer_only.pt"), "-o", out, "--horizon", "1")
    assert p.returncode == 2
    assert "Adam L2" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "--optimizer" not in p.stderr and "--param-bound B" in p.stderr and "--horizon all" in p.stderr
    assert not out.exists() and not list(tmp_path.iterdir())
    assert run_tool(ckptkit_bin, "ckpt-compress", fixture_path("lm_optimizer_only.pt"), "-o", out).returncode == 0
    v = run_tool(ckptkit_bin, "ckpt-verify", out, "--original", fixture_path("lm_optimizer_only.pt"))
    assert v.returncode == 0, v.stdout + v.stderr
