"""ckptkit.replay.jax (issue 54): JAX steps recorded, planned by the same C++ planner as torch,
and applied with jax.checkpoint. Runs under .venv (jax, flax, optax pinned in
scripts/requirements.txt); skipped when jax is not importable."""
import json

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (the .venv JAX line, scripts/requirements.txt)")
pytest.importorskip("flax", reason="flax is not installed (the .venv JAX line, scripts/requirements.txt)")
optax = pytest.importorskip("optax", reason="optax is not installed (the .venv JAX line, scripts/requirements.txt)")

import ckptkit  # noqa: E402
import jax_models  # noqa: E402  (scripts/fixtures, on sys.path through testlib)
from ckptkit.replay import jax as rj  # noqa: E402

STEPS = 50
KEY = jax.random.PRNGKey(3)


def _leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.fixture(scope="module", params=["cnn", "transformer", "rnn"])
def recorded(request, tmp_path_factory):
    """(name, model, trace path, plan at the smallest and a middle budget, the two budgets)."""
    name = request.param
    model = jax_models.MODELS[name]()
    loss_fn, params, state, batch = model
    tx = optax.adam(1e-3)
    path = rj.record(loss_fn, params, state, batch, KEY, optimizer=tx,
                     path=tmp_path_factory.mktemp(name) / "t.json", model_name=name)
    r = rj.plan(path).range
    lo = r["min_peak_bytes"]
    mid = (lo + r["keep_all_peak_bytes"]) // 2
    return name, model, path, rj.plan(path, budget=[lo, mid]), (lo, mid)


def test_trace_describes_the_step(recorded):
    """Segments are the modules under the root in forward order; the BatchNorm statistics and
    the dropout key are read-only state of the segments that read them; no RNG streams."""
    name, model, path, _, _ = recorded
    t = json.load(open(path))
    assert t["framework"] == "jax" and t["format_version"] == 2
    segs = [s["name"] for s in t["segments"]]
    assert segs == {"cnn": ["block0", "block1", "block2", "head"],
                    "transformer": ["embed", "block0", "block1", "block2", "ln_f", "head"],
                    "rnn": ["embed", "rnn0", "rnn1", "head"]}[name]
    kinds = {b["id"]: b["kind"] for b in t["buffers"]}
    reads = {s["name"]: [a["buffer"] for a in s["state"]] for s in t["segments"]}
    if name == "cnn":
        assert kinds == {f"state/batch_stats/block{i}/BatchNorm_0/{v}": "buffer"
                         for i in range(3) for v in ("mean", "var")}
        assert reads["block1"] == ["state/batch_stats/block1/BatchNorm_0/mean",
                                   "state/batch_stats/block1/BatchNorm_0/var"]
    elif name == "transformer":
        assert kinds == {"key": "key"}
        assert [s for s, r in reads.items() if r] == ["block0", "block1", "block2"]
    else:
        assert kinds == {}
    for s in t["segments"]:
        assert s["rng"] == [] and all("version_written" not in a for a in s["state"])
        assert s["output_bytes"] > 0
    assert sum(s["saved_bytes"] for s in t["segments"][1:]) > 0
    fixed = t["fixed"]
    params = model[1]
    assert fixed["param_bytes"] == sum(x.nbytes for x in jax.tree.leaves(params))
    assert fixed["optimizer_bytes"] == 2 * fixed["param_bytes"] + 4   # Adam mu, nu + int32 count


def test_fifty_steps_bitwise_at_smallest_and_middle_budget(recorded):
    """50 optax steps under the plan at the smallest and a middle budget: params, Adam state
    and batch statistics bitwise equal to the same steps without recomputation; the smallest
    plan recomputes something (else the test would prove nothing)."""
    name, (loss_fn, params, state, batch), _, p, budgets = recorded
    tx = optax.adam(1e-3)
    ref = jax_models.train(loss_fn, params, state, batch, tx, STEPS)
    recomputed = []
    for b in budgets:
        e = rj.select_entry(p, b)
        assert e["feasible"] and e["safe"]
        recomputed.append([s["name"] for s in e["segments"] if s["decision"] != "keep"])
        assert all(s["decision"] in ("keep", "recompute") for s in e["segments"])   # no JAX hazard
        got = jax_models.train(rj.apply(loss_fn, p, b), params, state, batch, tx, STEPS)
        assert _leaves_equal(ref, got), f"{name} at budget {b}: not bitwise equal"
    assert recomputed[0], f"{name}: the smallest plan recomputes nothing"


def test_replay_plan_cli_reads_jax_traces(recorded, tmp_path):
    """replay-plan reads the JAX trace like a torch one: the same plan as plan() (the binding)."""
    import os
    import subprocess
    name, _, path, p, (lo, mid) = recorded
    exe = os.path.join(os.environ.get("CKPTKIT_BIN", ""), "replay-plan")
    if not os.path.exists(exe):
        pytest.fail("set CKPTKIT_BIN to the folder holding replay-plan (e.g. build/apps)")
    out = tmp_path / "p.json"
    r = subprocess.run([exe, str(path), "--budget", str(lo), "--budget", str(mid),
                        "-o", str(out), "--check", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cli = json.load(open(out))
    assert [[(s["name"], s["decision"]) for s in e["segments"]] for e in cli["budgets"]] == \
        [[(s["name"], s["decision"]) for s in e["segments"]] for e in p.entries]


@pytest.fixture(scope="module")
def cnn_plan(tmp_path_factory):
    loss_fn, params, state, batch = jax_models.cnn()
    path = rj.record(loss_fn, params, state, batch, KEY, path=tmp_path_factory.mktemp("cnn") / "t.json")
    r = rj.plan(path).range
    return rj.plan(path, budget=r["min_peak_bytes"])


def test_remat_checkpoint_is_bitwise_too_and_remat_is_checked(cnn_plan):
    """remat="checkpoint" (plain jax.checkpoint, the default off CPU) gives the same bits over 50
    steps as no remat and as the CPU default ("callback"); another remat is BadInput."""
    loss_fn, params, state, batch = jax_models.cnn()
    tx = optax.adam(1e-3)
    ref = jax_models.train(loss_fn, params, state, batch, tx, STEPS)
    assert _leaves_equal(ref, jax_models.train(rj.apply(loss_fn, cnn_plan, remat="checkpoint"),
                                               params, state, batch, tx, STEPS))
    with pytest.raises(ckptkit.BadInput, match=r"^ckptkit\.replay\.jax: error: remat must be 'auto', "
                                               r"'checkpoint' or 'callback', not 'x'$"):
        rj.apply(loss_fn, cnn_plan, remat="x")


def _call(fn, model):
    loss_fn, params, state, batch = model
    return jax.value_and_grad(fn, has_aux=True)(params, state, batch, KEY)


def test_plan_for_another_model_or_shape_is_refused(cnn_plan):
    """StalePlan at the first call: another model, another width (shapes); one line (JAX adds
    its traceback note as a PEP 678 note, not to the message)."""
    for other in (jax_models.rnn(), jax_models.cnn(width=24)):
        with pytest.raises(rj.StalePlan, match=r"^ckptkit\.replay: the plan was made for another model "
                                               r"\(fingerprint [0-9a-f]{16}, this step's params and state "
                                               r"give [0-9a-f]{16}\): record and plan again"):
            _call(rj.apply(other[0], cnn_plan), other)
    # the same model with another batch size is the same model
    loss_fn, params, state, batch = jax_models.cnn(scale=2)
    _call(rj.apply(loss_fn, cnn_plan), (loss_fn, params, state, batch))


def test_plan_for_another_forward_or_policy_is_refused(tmp_path):
    """Same parameters, other ops: dropout 0.2 against a plan recorded with 0.1, and a block
    whose inside is remat'ed with another jax.checkpoint policy, fail the ops hash (StalePlan
    naming the segment); a torch plan is refused; a bad budget is BadInput."""
    loss_fn, params, state, batch = jax_models.transformer(rate=0.1)
    path = rj.record(loss_fn, params, state, batch, KEY, path=tmp_path / "t.json")
    p = rj.plan(path, budget=rj.plan(path).range["min_peak_bytes"])
    other = jax_models.transformer(rate=0.2)
    with pytest.raises(rj.StalePlan, match=r"^ckptkit\.replay: segment block0: ops hash [0-9a-f]{16} is not "
                                           r"the plan's [0-9a-f]{16}: the segment computes something else now; "
                                           r"record and plan again"):
        _call(rj.apply(other[0], p), other)

    # block1 under nn.remat with dots_saveable, applied to the same model with nothing_saveable
    a = jax_models.cnn(policy=jax.checkpoint_policies.dots_saveable)
    pa = rj.plan(rj.record(*a, KEY, path=tmp_path / "a.json"))
    b = jax_models.cnn(policy=jax.checkpoint_policies.nothing_saveable)
    with pytest.raises(rj.StalePlan, match="^ckptkit.replay: segment block1: ops hash"):
        _call(rj.apply(b[0], pa), b)
    _call(rj.apply(a[0], pa), a)
    with pytest.raises(ckptkit.BadInput, match="no feasible entry for budget 1 bytes"):
        rj.apply(loss_fn, p, budget=1)


def test_parity_with_the_torch_front_end(tmp_path):
    """One model in torch and in JAX (16 -> 3 blocks of [Linear w, Linear w], w = 32, 64, 48 ->
    Linear 10, batch 256), recorded by both front ends: the same segments and the same input,
    output and saved bytes per segment (each block keeps its input and its hidden array for the
    weight gradients; a boundary array counts in its consumer; the batch is outside every
    segment in both). Their clocks (torch hooks vs jitted XLA) and transients (profiler vs XLA
    temporaries) are different instruments: with those set alike (time and transient from the
    bytes), the planner makes the same decision for every segment at every budget of a 40-point
    activation grid. (With tanh, JAX would also keep tanh's derivative 1 - y^2 where torch
    keeps y, shared with the next Linear: one more array per block; such blocks differ.)"""
    import torch
    from ckptkit import replay
    import flax.linen as nn

    widths = (32, 64, 48)
    torch.manual_seed(0)
    dims = (16,) + widths
    tm = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dims[i], widths[i]),
                                                   torch.nn.Linear(widths[i], widths[i])) for i in range(3)],
                             torch.nn.Linear(widths[-1], 10))
    xb = torch.randn(256, 16)
    yb = torch.arange(256) % 10
    tt = json.load(open(replay.record(tm, (xb, yb), lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                                      segments=["0", "1", "2", "3"], path=tmp_path / "torch.json")))

    class Blk(nn.Module):
        w: int

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.w)(nn.Dense(self.w)(x))

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i, w in enumerate(widths):
                x = Blk(w, name=str(i))(x)
            return nn.Dense(10, name="3")(x)
    m = MLP()
    x = jax.numpy.asarray(xb.numpy())
    y = jax.numpy.asarray(yb.numpy())
    params = m.init(jax.random.PRNGKey(0), x)["params"]

    def loss_fn(params, state, batch, key):
        return optax.softmax_cross_entropy_with_integer_labels(m.apply({"params": params}, batch[0]),
                                                               batch[1]).mean(), state
    tj = json.load(open(rj.record(loss_fn, params, {}, (x, y), KEY, path=tmp_path / "jax.json")))
    assert [s["name"] for s in tj["segments"]] == [s["name"] for s in tt["segments"]]
    for a, b in zip(tt["segments"], tj["segments"]):
        assert (a["input_bytes"], a["output_bytes"], a["saved_bytes"]) == \
            (b["input_bytes"], b["output_bytes"], b["saved_bytes"]), a["name"]
    for t in (tt, tj):
        t["fixed"] = dict(tt["fixed"])
        for s in t["segments"]:
            s["forward_ms"] = s["saved_bytes"] / 1e5
            s["backward_ms"] = 2 * s["forward_ms"]
            s["transient_bytes"] = s["output_bytes"] + s["input_bytes"]
    rt = replay.plan(json.dumps(tt)).range
    grid = [rt["min_activation_bytes"] + k * (rt["keep_all_activation_bytes"] - rt["min_activation_bytes"]) // 39
            for k in range(40)]
    pt = replay.plan(json.dumps(tt), activation_budget=grid)
    pj = replay.plan(json.dumps(tj), activation_budget=grid)
    assert pj.range == rt
    chosen = set()
    for et, ej in zip(pt.entries, pj.entries):
        assert et["feasible"] and ej["feasible"]
        dt, dj = [s["decision"] for s in et["segments"]], [s["decision"] for s in ej["segments"]]
        assert dt == dj, et["activation_budget_bytes"]
        chosen.add(tuple(dt))
    assert len(chosen) >= 3   # the grid crosses several plans


def test_plain_jax_named_scopes_and_given_segments(tmp_path):
    """Plain JAX (no Flax): segments are the jax.named_scope names in forward order; given
    segments= paths pick nested scopes; a missing one is RecordError naming what exists; the
    plan at the smallest budget runs 5 SGD steps bitwise equal to no remat."""
    jnp = jax.numpy
    ws = [jax.random.normal(jax.random.PRNGKey(i), (32, 32)) * 0.2 for i in range(4)]
    x = jax.random.normal(jax.random.PRNGKey(9), (64, 32))

    def loss_fn(params, state, batch, key):
        h = batch
        for i, w in enumerate(params):
            with jax.named_scope(f"layer{i}"):
                with jax.named_scope("mm"):
                    h = h @ w
                h = jnp.sin(h)
        return jnp.mean(h ** 2), state
    assert rj.segments_of(loss_fn, ws, {}, x, KEY) == ["layer0", "layer1", "layer2", "layer3"]
    t = rj.record_trace(loss_fn, ws, {}, x, KEY, segments=["layer1/mm", "layer2"])
    assert [s["name"] for s in t["segments"]] == ["layer1/mm", "layer2"]
    with pytest.raises(rj.RecordError, match=r"^ckptkit\.replay: segment\(s\) layer9 not found under scope "
                                             r"'\(none\)' of the step; the scopes there are: layer0, layer1, "
                                             r"layer2, layer3$"):
        rj.record_trace(loss_fn, ws, {}, x, KEY, segments=["layer9"])
    path = rj.record(loss_fn, ws, {}, x, KEY, path=tmp_path / "t.json")
    p = rj.plan(path, budget=rj.plan(path).range["min_peak_bytes"])
    assert any(s["decision"] == "recompute" for s in p.entries[0]["segments"])
    tx = optax.sgd(0.1)
    ref = jax_models.train(loss_fn, ws, {}, x, tx, 5)
    assert _leaves_equal(ref, jax_models.train(rj.apply(loss_fn, p), ws, {}, x, tx, 5))
