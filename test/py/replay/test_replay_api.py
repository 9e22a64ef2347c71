"""ckptkit.replay (python/ckptkit/replay) with real torch: record() on live models leaves them
exactly as they were; default segments; plan() through the extension; apply() in a user's own
loop stays bitwise equal to no recomputation (losses, parameters, buffers, optimizer state, RNG)
with gradient accumulation, a smaller last batch and eval passes between steps, where plain
torch.utils.checkpoint changes BatchNorm buffers; broken contracts and stale plans are refused;
the measured peak of a training iteration (profiler memory events + what lives before it) never
exceeds the plan's predicted peak.

The package comes from $CKPTKIT_PYTHONPATH, else next to $CKPTKIT_BIN (<build>/apps ->
<build>/python); the module is skipped when it is absent (the ASan build has none)."""
import importlib
import json
import os
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]


sys.path.insert(0, str(ROOT / "test" / "py"))
from testlib import import_package  # noqa: E402
replay, _ = import_package("ckptkit.replay")
ckptkit = importlib.import_module("ckptkit")
sys.path.insert(0, str(ROOT / "test" / "models"))
import nanogpt  # noqa: E402

torch.set_num_threads(1)    # bitwise comparisons and stable timings on the shared cores


# ----------------------------------------------------------------------------- helpers
def state_of(model, opt=None):
    """Everything a step may change, copied: params, grads, buffers, optimizer state, RNG."""
    out = {"p": {n: p.detach().clone() for n, p in model.named_parameters()},
           "g": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
           "b": {n: b.clone() for n, b in model.named_buffers()},
           "rng": torch.get_rng_state()}
    if opt is not None:
        out["o"] = [{k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
                    for g in opt.param_groups for p in g["params"]]
    return out


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            assert x.keys() == y.keys(), k
            for n in x:
                if x[n] is None or y[n] is None:
                    assert x[n] is None and y[n] is None, (k, n)
                else:
                    assert x[n].dtype == y[n].dtype and torch.equal(x[n], y[n]), (k, n)
        elif isinstance(x, list):
            assert len(x) == len(y)
            for s, t in zip(x, y):
                assert s.keys() == t.keys()
                for n in s:
                    assert torch.equal(s[n], t[n]) if torch.is_tensor(s[n]) else s[n] == t[n], (k, n)
        else:
            assert torch.equal(x, y), k


def vision(name, seed=0):
    """A torchvision model (the test skips, saying so, where torchvision is absent: PyPI's does not
    import beside torch 2.13's CPU build, Debian's goes with torch 1.13)."""
    tv = pytest.importorskip("torchvision", reason="torchvision is not installed beside this torch")
    torch.manual_seed(seed)
    model = getattr(tv.models, name)(num_classes=10)
    g = torch.Generator().manual_seed(seed)
    batch = (torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
    return model, batch, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])


def measure_peak(model, opt, batch, loss_fn, set_to_none):
    """Bytes alive before the iteration (params, buffers, grads, optimizer state, batch, each
    storage once) + the peak of the profiler's CPU memory events over forward, backward and
    optimizer.step."""
    from torch.profiler import ProfilerActivity, profile
    seen, pre = set(), 0
    ts = list(model.parameters()) + list(model.buffers()) + [p.grad for p in model.parameters()]
    ts += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    ts += [t for t in batch if torch.is_tensor(t)]
    for t in ts:
        if t is not None and t.storage().data_ptr() not in seen:
            seen.add(t.storage().data_ptr())
            pre += t.storage().nbytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_fn(model, batch).backward()
        opt.step()
    live = peak = 0
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            live += e.nbytes()
            peak = max(peak, live)
    opt.zero_grad(set_to_none=set_to_none)
    return pre + peak


def run_steps(build, plan=None, budget=None, steps=3, accumulate=1, evals=False, last_small=False, lr=1e-2,
              **apply_kw):
    """A user's loop: Adam, `steps` optimizer steps of `accumulate` micro-batches, an eval pass
    between steps, the last batch smaller; the plan applied when given (with apply_kw).
    Returns (losses, state)."""
    model, batch, loss_fn = build()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(1)
    losses = []
    handle = replay.apply(model, plan, budget, **apply_kw) if plan is not None else None
    try:
        for step in range(steps):
            for micro in range(accumulate):
                b = batch
                if last_small and step == steps - 1:
                    b = tuple(t[: t.shape[0] // 2] for t in batch)
                loss = loss_fn(model, b) / accumulate
                loss.backward()
                losses.append(loss.detach())
            opt.step()
            opt.zero_grad(set_to_none=True)
            if evals:
                model.eval()
                with torch.no_grad():
                    losses.append(loss_fn(model, batch).detach())
                model.train()
    finally:
        if handle is not None:
            handle.remove()
    return torch.stack(losses), state_of(model, opt)


def tight_plan(model, batch, loss_fn, opt=None, **kw):
    trace = replay.record(model, batch, loss_fn, optimizer=opt, **kw)
    try:
        loose = replay.plan(trace)
        lo = loose.range["min_peak_bytes"]
        p = replay.plan(trace, [lo, loose.range["keep_all_peak_bytes"]])
        p.every = replay.plan(trace, planner="all")    # recompute every replayable segment
    finally:
        os.unlink(trace)
    assert [e["feasible"] for e in p.entries] == [True, True]
    return p, lo


# ----------------------------------------------------------------------------- tests
def test_record_leaves_model_grads_buffers_rng_and_optimizer_as_they_were(tmp_path):
    model, batch, loss_fn = vision("resnet18")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn(model, batch).backward()
    opt.step()                                     # state exists; grads kept (not zeroed)
    model.layer1.eval()                            # a mixed train / eval flag survives too
    before = state_of(model, opt)
    flags = [m.training for m in model.modules()]
    path = replay.record(model, batch, loss_fn, optimizer=opt, path=tmp_path / "r.trace.json")
    assert path == str(tmp_path / "r.trace.json")
    assert_same(before, state_of(model, opt))
    assert flags == [m.training for m in model.modules()]
    t = json.load(open(path))
    assert t["format_version"] == 2 and t["fingerprint"] == replay.model_fingerprint(model)
    # the real state: exp_avg + exp_avg_sq + a float32 step per parameter (Adam, torch 1.13)
    assert t["fixed"]["optimizer_bytes"] == 2 * t["fixed"]["grad_bytes"] + 4 * len(list(model.parameters()))
    with pytest.raises(ckptkit.BadInput, match="already exists"):
        replay.record(model, batch, loss_fn, path=path)


def test_default_segments_nanogpt():
    model, batch, loss_fn = nanogpt.build()
    p = replay.plan(replay.record(model, batch, loss_fn))
    names = [s["name"] for s in p.entries[0]["segments"]]
    assert names == ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0",
                     "transformer.h.1", "transformer.ln_f", "lm_head"]


def test_default_segments_torchvision():
    model, batch, loss_fn = vision("resnet18")
    t = json.load(open(replay.record(model, batch, loss_fn)))
    assert [s["name"] for s in t["segments"]] == ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2",
                                                  "layer3", "layer4", "avgpool", "fc"]
    model, batch, loss_fn = vision("efficientnet_b0")   # 3 top-level children: features opened
    t = json.load(open(replay.record(model, batch, loss_fn)))
    assert [s["name"] for s in t["segments"]] == [f"features.{i}" for i in range(9)] + [
        "avgpool", "classifier.0", "classifier.1"]


def vit():
    """torchvision's VisionTransformer, small (4 layers, 64 wide, 32 x 32 images, patch 4)."""
    pytest.importorskip("torchvision", reason="torchvision is not installed beside this torch")
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    model = VisionTransformer(image_size=32, patch_size=4, num_layers=4, num_heads=2, hidden_dim=64, mlp_dim=128,
                              num_classes=10, dropout=0.1)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))
    return model, batch, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])


def test_default_segments_torchvision_vit(tmp_path):
    """Issue 53: torchvision's ViT got segments conv_proj, encoder, heads.head (the smallest plan
    kept everything); now the encoder's layers, a real range (activations less than half of
    keep-all), and 3 Adam steps at the smallest plan (3 layers recomputed, dropout on) bitwise
    equal to no recomputation."""
    model, batch, loss_fn = vit()
    tr = replay.record(model, batch, loss_fn, optimizer=torch.optim.Adam(model.parameters()),
                       path=tmp_path / "t.json")
    assert [s["name"] for s in json.load(open(tr))["segments"]] == ["conv_proj", "encoder.dropout"] + [
        f"encoder.layers.encoder_layer_{i}" for i in range(4)] + ["encoder.ln", "heads"]
    r = replay.plan(tr).range
    assert r["min_activation_bytes"] < r["keep_all_activation_bytes"] / 2
    plan = replay.plan(tr, r["min_peak_bytes"])
    rec = [s["name"] for s in plan.entries[0]["segments"] if s["decision"] != "keep"]
    assert len(rec) >= 3 and all(n.startswith("encoder.layers.encoder_layer_") for n in rec)
    ref_losses, ref = run_steps(vit, steps=3)
    got_losses, got = run_steps(vit, plan, steps=3)
    assert torch.equal(ref_losses, got_losses)
    assert_same(ref, got)


def test_record_error_explains_uncovered_rng():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(torch.nn.functional.dropout(self.a(x), 0.5))   # RNG outside the children

    with pytest.raises(replay.RecordError) as e:
        replay.record(Net(), torch.randn(2, 4), lambda m, x: m(x).sum())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("ckptkit.replay: RNG stream cpu consumed outside segments "
                                              "before segment b; the default segments (a, b)")

    class Twice(torch.nn.Module):   # T5's layout: one dropout module called at both ends
        def __init__(self):
            super().__init__()
            self.a, self.b, self.drop = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.b(self.a(self.drop(x))))

    with pytest.raises(replay.RecordError) as e:
        replay.record(Twice(), torch.randn(2, 4), lambda m, x: m(x).sum())
    assert str(e.value).startswith("ckptkit.replay: RNG stream cpu consumed outside segments before segment a (modules "
                                   "outside every segment that draw random numbers: drop: put them inside a segment, "
                                   "e.g. name their parent module)"), str(e.value)
    with pytest.raises(replay.RecordError, match=r"segment drop called more than once per step: a module used twice "
                                                 r"in a step .* name a module that calls it once \(its parent\)"):
        replay.record(Twice(), torch.randn(2, 4), lambda m, x: m(x).sum(), segments=["drop", "a", "b"])


def test_nanogpt_50_steps_bitwise_with_accumulation_evals_and_small_last_batch():
    model, batch, loss_fn = nanogpt.build()
    plan, lo = tight_plan(model, batch, loss_fn)
    entry = plan.entries[0]
    recomputed = [s["name"] for s in entry["segments"] if s["decision"] != "keep"]
    assert "transformer.h.0" in recomputed or "transformer.h.1" in recomputed
    kw = dict(steps=50, accumulate=2, evals=True, last_small=True)
    ref_losses, ref = run_steps(nanogpt.build, **kw)
    got_losses, got = run_steps(nanogpt.build, plan, lo, **kw)
    assert torch.equal(ref_losses, got_losses)
    assert_same(ref, got)
    with pytest.raises(ckptkit.BadInput, match="2 feasible entries"):
        replay.apply(model, plan)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "efficientnet_b0"])
def test_torchvision_bitwise_and_peak_bound(name):
    model, batch, loss_fn = vision(name)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plan, lo = tight_plan(model, batch, loss_fn, opt)
    tight = plan.entries[0]
    assert tight["decisions"]["recompute+snapshot"] + tight["decisions"]["recompute+selective"] >= 1
    build = lambda: vision(name)   # noqa: E731
    ref_losses, ref = run_steps(build, steps=50, evals=True, last_small=True)
    got_losses, got = run_steps(build, plan, lo, steps=50, evals=True, last_small=True)
    assert torch.equal(ref_losses, got_losses)
    assert_same(ref, got)
    if name == "resnet18":   # plain checkpointing over the same segments changes BN buffers
        model, batch, loss_fn = vision(name)
        for s in tight["segments"]:
            if s["decision"] != "keep":
                m = model.get_submodule(s["name"])
                m.forward = (lambda f: lambda *a: torch.utils.checkpoint.checkpoint(f, *a, use_reentrant=False))(m.forward)
        loss_fn(model, batch).backward()
        plain = state_of(model)
        model, batch, loss_fn = vision(name)
        loss_fn(model, batch).backward()
        differ = [n for n, b in state_of(model)["b"].items() if not torch.equal(b, plain["b"][n])]
        assert len(differ) >= 3 and all("running" in n or "num_batches" in n for n in differ)
    check_peaks(build, plan)


def check_peaks(build, plan):
    """measured <= predicted for every entry, with zero_grad(set_to_none=True) and False."""
    for entry in plan.entries:
        for set_to_none in (True, False):
            model, batch, loss_fn = build()
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            if not set_to_none:
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
            with replay.apply(model, plan, entry["budget_bytes"]):
                got = measure_peak(model, opt, batch, loss_fn, set_to_none)
            PEAKS.append((build.__name__ if hasattr(build, "__name__") else "?", entry["budget_bytes"],
                          set_to_none, got, entry["peak_bytes"]))
            assert got <= entry["peak_bytes"], (entry["budget_bytes"], set_to_none, got, entry["peak_bytes"])


PEAKS = []
PATTERNS = ["bn", "dropout", "counter", "ema", "kvcache", "root_buffer", "private_gen", "shared_weight",
            "inplace_input", "sparse_write", "dense_queue"]


def pattern(name):
    mod = importlib.import_module(name)
    return lambda: mod.build()[:3]


GROWING = ("kvcache", "sparse_write", "dense_queue")   # state grows every step: 10 steps (CI time)


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_models_bitwise_and_peak_bound(name):
    build = pattern(name)
    model, batch, loss_fn = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    plan, lo = tight_plan(model, batch, loss_fn, opt)
    every = plan.every
    assert sum(s["decision"].startswith("recompute+") for s in every.entries[0]["segments"]) >= 1
    steps = 10 if name in GROWING else 50
    ref_losses, ref = run_steps(build, steps=steps, evals=True)
    got_losses, got = run_steps(build, every, None, steps=steps, evals=True)
    assert torch.equal(ref_losses, got_losses)
    assert_same(ref, got)
    check_peaks(build, plan)


def test_broken_contract_raises_contract_error():
    model, batch, loss_fn = pattern("bn")()
    p = replay.plan(replay.record(model, batch, loss_fn, segments=["0", "1", "2", "3", "4", "5", "6"]),
                    planner="all")
    entry = p.entries[0]
    seg = next(s for s in entry["segments"] if s["name"] == "2")
    assert seg["decision"] == "recompute+snapshot"
    seg["contract"] = {"restore": [], "rng": [], "discard": []}       # the BN buffers forgotten
    with replay.apply(model, p):
        with pytest.raises(replay.ContractError) as e:
            loss_fn(model, batch)
    assert str(e.value) == ("ckptkit.replay: segment 2: writes buffer '2.1.running_mean', which its contract "
                            "does not restore or discard (a plain recompute would apply the write twice): the "
                            "plan is stale or was edited; record and plan again")
    # the RNG of a dropout segment forgotten
    model, batch, loss_fn = pattern("dropout")()
    p = replay.plan(replay.record(model, batch, loss_fn, segments=["0", "1", "2", "3", "4", "5", "6"]),
                    planner="all")
    for s in p.entries[0]["segments"]:
        if s["name"] == "2":
            assert s["contract"]["rng"]
            s["contract"]["rng"] = []
    with replay.apply(model, p), pytest.raises(replay.ContractError, match=r"segment 2: draws RNG stream cpu"):
        loss_fn(model, batch)


def test_stale_plans_refused():
    model, batch, loss_fn = nanogpt.build(dropout=0.0)
    p = replay.plan(replay.record(model, batch, loss_fn), planner="all")
    for variant, seg in ((dict(dropout=0.1), "transformer.drop"), (dict(dropout=0.0, act="relu"), "transformer.h.0")):
        m, b, lf = nanogpt.build(**variant)
        assert replay.model_fingerprint(m) == replay.model_fingerprint(model)   # same params and buffers
        with replay.apply(m, p):
            m.eval()
            lf(m, b)                                                   # eval passes are untouched
            m.train()
            with pytest.raises(replay.StalePlan) as e:
                lf(m, b)
        assert str(e.value).startswith(f"ckptkit.replay: segment {seg}: its forward ops differ from the recorded ones")
    m, b, lf = vision("resnet18")
    with pytest.raises(replay.StalePlan, match="the plan was made for another model"):
        replay.apply(m, p)
    with replay.apply(model, p):     # the recorded model itself passes
        loss_fn(model, batch).backward()


def test_plan_api_save_range_and_sizes(tmp_path):
    model, batch, loss_fn = pattern("bn")()
    trace = replay.record(model, batch, loss_fn, path=tmp_path / "t.json")
    text = open(trace).read()
    a = replay.plan(text, ["1.5MiB", 10**9], activation_budget="200KiB")
    assert [e["budget_bytes"] for e in a.entries] == [1572864, 10**9, a["fixed_bytes"] + 204800]
    assert a.entries[2]["activation_budget_bytes"] == 204800
    r = a.range
    assert r["keep_all_peak_bytes"] - r["keep_all_activation_bytes"] == a["fixed_bytes"]
    out = a.save(tmp_path / "p.json")
    assert replay.Plan.load(out) == a
    with pytest.raises(ckptkit.BadInput, match="already exists"):
        a.save(out)
    a.save(out, force=True)
    with pytest.raises(ckptkit.BadInput, match="not a size"):
        replay.plan(trace, "lots")
    with pytest.raises(ckptkit.BadInput) as e:
        replay.plan(b"{not json")
    assert "\n" not in str(e.value)


def test_zz_report_peaks():
    """The margins (for docs/benchmarks.md): printed with -s."""
    for row in PEAKS:
        print("peak", *row, f"margin {row[4] - row[3]}")


def test_one_plan_at_a_time_and_any_removal_order_restores():
    """A second apply() on modules a plan already patches is refused ("already applied"), not
    stacked; removing the handle (once or twice, in any order with others) gives every module
    its own forward back, and the model trains as before."""
    model, batch, loss_fn = pattern("bn")()
    plan, lo = tight_plan(model, batch, loss_fn)
    every = plan.every
    h1 = replay.apply(model, every)
    assert any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(ckptkit.BadInput, match="already applied"):
        replay.apply(model, every)
    h1.remove()
    h1.remove()
    assert not any("forward" in m.__dict__ for m in model.modules())
    h2 = replay.apply(model, every)
    with replay.apply(nanogpt.build()[0], replay.plan(replay.record(*nanogpt.build()))) as h3:
        h2.remove()   # another model's handle, removed out of order
        assert not any("forward" in m.__dict__ for m in model.modules())
        assert h3.recomputed is not None
    ref_losses, ref = run_steps(pattern("bn"), steps=3)
    got_losses, got = run_steps(pattern("bn"), every, None, steps=3)
    assert torch.equal(ref_losses, got_losses)
    assert_same(ref, got)


def test_infeasible_budget_raises_with_the_smallest_feasible():
    """plan() with no feasible budget raises CheckFailed naming the smallest feasible budget
    (the plan is its report); with a feasible one beside it, the infeasible one is an entry."""
    model, batch, loss_fn = pattern("bn")()
    trace = replay.record(model, batch, loss_fn)
    try:
        with pytest.raises(ckptkit.CheckFailed, match="the smallest feasible is budget=") as e:
            replay.plan(trace, activation_budget=1)
        lo = e.value.report.range["min_activation_bytes"]
        assert f"activation_budget={lo})" in str(e.value)
        p = replay.plan(trace, activation_budget=["1b", lo])   # units in any case
        assert [x["feasible"] for x in p.entries] == [False, True]
    finally:
        os.unlink(trace)


def test_no_range_names_segments():
    """Segments whose recompute saves nothing (min == keep-all) give one CkptkitWarning that
    names them and segments=."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    trace = replay.record(model, torch.randn(2, 8), lambda m, x: m(x).sum())
    try:
        with pytest.warns(ckptkit.CkptkitWarning, match=r"saves nothing with these segments \(0\).*segments="):
            p = replay.plan(trace)
        assert p.range["min_peak_bytes"] == p.range["keep_all_peak_bytes"]
    finally:
        os.unlink(trace)


def test_package_command_line_and_thin_script_wrappers(tmp_path):
    """Issue 55 item 9: the MODEL.py command line is the package's own (`python -m
    ckptkit.replay record|apply`, ckptkit/replay/_cli.py); scripts/record_trace.py and
    apply_plan.py are thin wrappers over it (<= 80 lines). Record bn.py, plan the smallest
    budget in-process, apply it from the command line: byte-identical, exit 0; an unknown
    command is exit 2 with the usage line."""
    import subprocess
    from testlib import package_dir
    for s in ("record_trace.py", "apply_plan.py"):
        assert len((ROOT / "scripts" / s).read_text().splitlines()) <= 80, s
    env = dict(os.environ, PYTHONPATH=package_dir())
    run = lambda *a: subprocess.run([sys.executable, "-m", "ckptkit.replay", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, env=env, cwd=tmp_path)
    trace, plan_path = tmp_path / "bn.trace.json", tmp_path / "bn.plan.json"
    r = run("record", ROOT / "test" / "models" / "bn.py", "-o", trace)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == ("ckptkit.replay record: bn.py: 7 segments, 2 touch state or RNG; state "
                                         f"6 buffers; RNG streams none; non-replayable: none -> {trace}")
    assert json.loads(trace.read_text())["source"] == f"ckptkit.replay torch {torch.__version__}"
    p = replay.plan(trace)
    replay.plan(trace, activation_budget=p.range["min_activation_bytes"]).save(plan_path)
    r = run("apply", ROOT / "test" / "models" / "bn.py", trace, plan_path, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert (res["identical"], res["differences"], res["budget_bytes"]) == (True, [], p.range["min_peak_bytes"])
    r = run("bogus")
    assert (r.returncode, r.stderr) == (2, "usage: python -m ckptkit.replay {record,apply} ... (record --help, apply --help)\n")


# ----------------------------------------------------------------------------- Python-side state (issue 53.1)
PY_STATE = ["py_scalar", "py_global", "histogram"]


def budgets_of(build):
    """(plan at the smallest and a middle budget, [smallest, middle]) of a recording with
    Adam, the segments build() names or the default ones."""
    built = build()
    model, batch, loss_fn = built[:3]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    trace = replay.record(model, batch, loss_fn, optimizer=opt, segments=built[3] if len(built) > 3 else None)
    try:
        r = replay.plan(trace).range
        lo, hi = r["min_peak_bytes"], r["keep_all_peak_bytes"]
        p = replay.plan(trace, [lo, (lo + hi) // 2])
    finally:
        os.unlink(trace)
    assert [e["feasible"] for e in p.entries] == [True, True]
    return p, [e["budget_bytes"] for e in p.entries]


@pytest.mark.parametrize("name", PY_STATE)
def test_python_state_trains_bitwise_at_smallest_and_middle_budget(name):
    """An annealed float attribute and a call counter in a plain object (py_scalar), a module
    global read by one segment and bumped by another (py_global), a custom op adding a
    histogram into a buffer in place (histogram): 50 Adam steps under apply() at the smallest
    and a middle budget (and at the smallest with check_scalars=False: the module attributes
    and globals kept per call do it without the tape), losses, parameters, gradients,
    buffers, Adam state and RNG bitwise equal to the same steps without recomputation. Before issue 53.1: StalePlan on py_scalar's
    kept segment 4 (its 1 + 0.01 * (calls % 4) differs from the recording's), py_global's
    counter bumped twice by the recomputed segment 4 (parameters differ), ContractError
    "state '2.hist' cannot be rebuilt" (the contract kept the bins one step changed)."""
    build = pattern(name)
    plan, budgets = budgets_of(importlib.import_module(name).build)
    smallest = {s["name"]: s for s in plan.entries[0]["segments"]}
    recomputed = sorted(n for n, s in smallest.items() if s["decision"] != "keep")
    if name == "py_scalar":      # the annealed segment is recomputed, the counted one kept
        assert "2" in recomputed and smallest["4"]["decision"] == "keep" and "non_replayable" in smallest["4"]
    elif name == "py_global":    # the reader and the writer of the global are recomputed
        assert {"2", "4"} <= set(recomputed)
    else:                        # the histogram is preserved whole: any bin may change
        assert {"2", "4"} <= set(recomputed)
        for n in ("2", "4"):
            for r in smallest[n]["contract"]["restore"]:
                assert r["buffer"] == f"{n}.hist" and (r["mode"] == "whole" or r["regions"] == [[0, 128]]), r
    ref_losses, ref = run_steps(build, steps=50)
    for b, check in ((budgets[0], True), (budgets[1], True), (budgets[0], False)):
        got_losses, got = run_steps(build, plan, b, steps=50, check_scalars=check)
        assert torch.equal(ref_losses, got_losses), (b, check)
        assert_same(ref, got)


class _Scaled(torch.nn.Module):
    """An MLP block whose input is scaled by a module attribute (`alpha`) and by an attribute
    of a plain object (`cfg.scale`), both Python floats (the first Linear saves the scaled
    input, so a recompute must compute it as the forward did)."""

    def __init__(self):
        super().__init__()
        import common
        self.inner = common.mlp()
        self.alpha = 1.0
        self.cfg = type("Cfg", (), {})()
        self.cfg.scale = 0.75

    def forward(self, x):
        return self.inner(x * self.alpha * self.cfg.scale)


def test_recompute_gets_the_forwards_scalars_or_refuses_naming_them():
    """A recomputed segment reads two Python floats. Changed after backward (between steps) or,
    for the module attribute, between forward and backward: the recompute gets the forward's
    value, gradients bitwise equal to no recomputation. The plain object's attribute changed
    between forward and backward: ContractError naming the argument, both values, where the
    value lives and the fix."""
    import common

    def build():
        return common.classifier([common.mlp(), _Scaled(), common.mlp()])

    model, batch, loss_fn = build()
    p = replay.plan(replay.record(model, batch, loss_fn), planner="all")
    assert next(s for s in p.entries[0]["segments"] if s["name"] == "2")["decision"] == "recompute"

    def grads(m):
        return [q.grad.clone() for q in m.parameters()]

    ref, _, _ = build()
    got, _, _ = build()
    with replay.apply(got, p):
        for m in (ref, got):
            for scale, alpha in ((0.5, 1.0), (0.25, 0.9)):
                m[2].cfg.scale = scale              # between steps
                loss = loss_fn(m, batch)
                m[2].alpha = alpha                  # between forward and backward: a module attribute
                loss.backward()
        assert all(torch.equal(a, b) for a, b in zip(grads(ref), grads(got)))
        loss = loss_fn(got, batch)
        got[2].cfg.scale = 0.125                    # between forward and backward, out of reach
        with pytest.raises(RuntimeError) as e:
            loss.backward()
    line = str(e.value)
    if torch.__version__ < "2":   # torch 1.13 turns an error in checkpoint's recompute into a RuntimeError
        assert type(e.value) is RuntimeError and line.startswith("ContractError: ")
        line = line.splitlines()[0][len("ContractError: "):]
    else:
        assert type(e.value) is replay.ContractError
    # torch >= 2 tapes Python numbers at the torch-function level (FunctionTape: the Tensor method
    # the forward called), torch 1.13 at the dispatch level (the aten op)
    op = "Tensor.mul" if torch.__version__ >= "2" else "aten.mul.Tensor"
    assert line == (
        f"ckptkit.replay: segment 2: its recompute passes 0.125 to {op} (argument 1) where its forward "
        "passed 0.25: a Python scalar it reads (2.cfg.scale) changed between the forward and the backward, and "
        "the runtime keeps per call only the numeric attributes of the segment's modules and the numeric globals "
        "of their Python modules; hold the value in such an attribute or in a tensor buffer (register_buffer), "
        "or change it only after backward()")


def test_prediction_note_once_per_handle_for_shapes_optimizer_and_path():
    """Issue 53.5: one CkptkitWarning per apply() handle, at the first step whose segment input
    shapes, optimizer or segment order differ from the recording (the prediction no longer
    holds; the step still follows the plan, bitwise); none for the recorded step."""
    import warnings
    build = pattern("bn")
    model, batch, loss_fn = build()
    trace = replay.record(model, batch, loss_fn, optimizer=torch.optim.Adam(model.parameters()))
    try:
        p = replay.plan(trace, planner="all")
    finally:
        os.unlink(trace)
    head = "ckptkit.replay: the plan's predicted peak and step time no longer hold: "
    tail = ("; record such a step and plan again for a prediction (the contracts still hold; noted once per "
            "apply())")

    def notes(steps, optimizer=None, skip=None):
        """The CkptkitWarnings of `steps` (batches) under one handle; skip: a segment bypassed."""
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with replay.apply(model, p, optimizer=optimizer):
                for b in steps:
                    m = model if skip is None else torch.nn.Sequential(*[x for i, x in enumerate(model) if i != skip])
                    loss_fn(m, b).backward()
                    model.eval()
                    with torch.no_grad():
                        loss_fn(model, b)              # eval passes are not steps
                    model.train()
        return [str(x.message) for x in w if issubclass(x.category, ckptkit.CkptkitWarning)]

    half = tuple(t[:128] for t in batch)
    assert notes([batch, batch], torch.optim.Adam(model.parameters())) == []
    assert notes([batch, half, half, batch]) == [
        head + "segment 0's inputs have shapes [[128, 32]] where the recording had [[256, 32]] (another batch or "
        "sequence length)" + tail]
    assert notes([batch], torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)) == [
        head + "the optimizer is SGD where the recording had Adam" + tail]
    assert notes([batch, batch], skip=3) == [
        head + "segment 4 ran after 2 where the recording ran it after 3 (a segment bypassed, or called in another "
        "order or twice)" + tail]
    # the half batch under the plan is still bitwise equal to no recomputation
    ref_model, _, _ = build()
    loss_fn(ref_model, half).backward()
    got_model, _, _ = build()
    with warnings.catch_warnings(record=True), replay.apply(got_model, p):
        loss_fn(got_model, half).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref_model.parameters(), got_model.parameters()))


@torch.jit.script
def _scripted_scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


class _ScriptScaled(_Scaled):
    """_Scaled with its scale applied by a TorchScript function: the aten op taking the Python
    number runs outside any torch function a TorchFunctionMode sees (as a C++ extension's)."""

    def forward(self, x):
        return self.inner(_scripted_scale(x * self.alpha, self.cfg.scale))


def test_scalar_tape_level_per_segment():
    """The scalar tape runs at the torch-function level (FunctionTape, torch >= 2) only for
    segments whose first forward shows every aten op with a Python number inside a torch
    function call; a segment whose number reaches an aten op another way (a TorchScript
    function here, a C++ extension in general) keeps the dispatch-level ScalarTape, so a
    change of that number between forward and backward is still refused, naming the aten op.
    Gradients bitwise equal to no recomputation while nothing changes."""
    import common

    def build():
        return common.classifier([common.mlp(), _Scaled(), _ScriptScaled(), common.mlp()])

    model, batch, loss_fn = build()
    p = replay.plan(replay.record(model, batch, loss_fn), planner="all")
    ref, _, _ = build()
    got, _, _ = build()
    with replay.apply(got, p) as h:
        for m in (ref, got):
            for _ in range(2):
                loss_fn(m, batch).backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), got.parameters()))
        levels = {s.name: s.tape_level for s in h.segments if s.name in ("2", "3")}
        assert levels == ({"2": "function", "3": "dispatch"} if torch.__version__ >= "2" else
                          {"2": "dispatch", "3": "dispatch"})
        loss = loss_fn(got, batch)
        got[3].cfg.scale = 0.125                    # between forward and backward, out of reach
        with pytest.raises(RuntimeError) as e:
            loss.backward()
    assert str(e.value).startswith("ckptkit.replay: segment 3: its recompute passes 0.125 to aten.mul.Scalar "
                                   "(argument 1) where its forward passed 0.75") or (
        torch.__version__ < "2" and "ContractError: ckptkit.replay: segment 3: its recompute passes" in str(e.value))


# ----------------------------------------------------------------------------- the issue's models (issue 53)
def _issue53(name):
    import issue53
    build = issue53.BUILDERS[name]
    if name == "mobilenet_v3_small":
        pytest.importorskip("torchvision", reason="torchvision is not installed beside this torch")
    return lambda: build()[:3]


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "vit_droppath", "rrelu_cnn", "shared_kv_decoder", "rnn_lm"])
def test_issue53_models_bitwise_at_smallest_and_middle_budget(name):
    """The models scripts/bench/bench_replay_steptime.py --overhead times (test/models/issue53.py;
    py_scalar is the sixth): 3 Adam steps at the smallest and a middle budget, with and without
    the scalar tape, have losses, parameters, gradients, buffers, Adam state and RNG bitwise
    equal to no recomputation while the plan recomputes segments."""
    build = _issue53(name)
    plan, budgets = budgets_of(build)
    assert any(s["decision"] != "keep" for s in plan.entries[0]["segments"])
    ref_losses, ref = run_steps(build, steps=3)
    for b, check in ((budgets[0], True), (budgets[1], True), (budgets[0], False)):
        got_losses, got = run_steps(build, plan, b, steps=3, check_scalars=check)
        assert torch.equal(ref_losses, got_losses), (b, check)
        assert_same(ref, got)


class _Retyped(torch.nn.Module):
    """An MLP block scaled by `scale`, a tensor attribute when the plan is applied and a Python
    float later, and counting its calls in `calls`."""

    def __init__(self):
        super().__init__()
        import common
        self.inner = common.mlp()
        self.scale = torch.tensor(1.0)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x * self.scale)


def test_runtime_scalars_survive_an_attribute_that_becomes_a_number():
    """The runtime's scalar snapshots (ScalarSnap) track the entries that held a number or None
    when the plan was applied; an attribute that was a tensor then and is a float now is left
    in place for the recompute (not removed), and the call counter is given back as the forward
    left it: gradients and counters equal to no recomputation, with and without the tape."""
    import common

    def build():
        return common.classifier([common.mlp(), _Retyped(), common.mlp()])

    model, batch, loss_fn = build()
    p = replay.plan(replay.record(model, batch, loss_fn), planner="all")
    for check in (True, False):
        ref, _, _ = build()
        got, _, _ = build()
        with replay.apply(got, p, check_scalars=check):
            for m in (ref, got):
                for scale in (torch.tensor(1.0), 0.5, 0.25):   # the first training forward checks the ops hash
                    m[2].scale = scale
                    loss_fn(m, batch).backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), got.parameters())), check
        assert ref[2].calls == got[2].calls == 3 and got[2].scale == 0.25


class _LazyScale(torch.nn.Module):
    """An attribute that is None until the first forward sets it to a number."""

    def __init__(self):
        super().__init__()
        import common
        self.inner = common.mlp()
        self.k = None

    def forward(self, x):
        if self.k is None:
            self.k = 2
        return self.inner(x) * self.k


def test_record_gives_back_an_attribute_that_was_none():
    """record() puts the model back as it found it: an attribute that was None before the
    recorded steps and a number after them is None again (before: removed, and the next
    forward raised AttributeError); a plan of the recording then trains as the plain model."""
    import common

    def build():
        torch.manual_seed(0)
        return common.classifier([common.mlp(), _LazyScale(), common.mlp()])

    model, batch, loss_fn = build()
    trace = replay.record(model, batch, loss_fn)
    assert "k" in vars(model[2]) and model[2].k is None
    p = replay.plan(trace, planner="all")
    ref, _, _ = build()
    loss_fn(ref, batch).backward()
    with replay.apply(model, p):
        loss_fn(model, batch).backward()
    assert model[2].k == ref[2].k == 2
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), model.parameters()))
