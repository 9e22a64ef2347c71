"""Op-level plans (issue 53): record(ops=True) gives each segment its op table; plan(...,
planner="ops") saves single ops of the recomputed segments (matmuls first: most recompute time
per byte), applied through torch's selective activation checkpointing. On the nanoGPT-style
model (dropout on: RNG and in-place ops inside the recomputed blocks) 20 Adam steps stay
bitwise equal to no recomputation and the measured peak never exceeds the predicted one;
on torch 1.13 (no selective checkpointing API) apply() refuses an op-level plan in one line."""
import json
import sys

import pytest
import torch

import ckptkit

from test_replay_api import ROOT, assert_same, check_peaks, replay, run_steps  # noqa: F401

sys.path.insert(0, str(ROOT / "test" / "models"))
import nanogpt  # noqa: E402

ops_mod = pytest.importorskip("ckptkit.replay._ops")


def op_plan():
    """nanoGPT's trace with ops and the ops planner's plan at the least budget, a middle one and
    keep-all; returns (trace dict, plan)."""
    model, batch, loss_fn = nanogpt.build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    tr = replay.record_trace(model, batch, loss_fn, optimizer=opt, ops=True)
    joint = replay.plan(json.dumps(tr))
    lo, hi = joint.range["min_peak_bytes"], joint.range["keep_all_peak_bytes"]
    return tr, replay.plan(json.dumps(tr), [lo, (lo + hi) // 2, hi], planner="ops")


def test_op_table_marks_what_stays_under_replay():
    tr, p = op_plan()
    block = next(s for s in tr["segments"] if s["name"] == "transformer.h.0")
    fixed = {(o["op"], o["k"]): o.get("fixed") for o in block["ops"]}
    assert fixed[("aten.bernoulli_.float", 0)] == "inplace"        # dropout's draw
    assert fixed[("aten.empty_like.default", 0)] == "mutated"     # the mask it draws into
    assert fixed[("aten.view.default", 0)] == "view"
    assert fixed[("aten.add.Tensor", 0)] == "state"                # reads the causal-mask buffer
    assert fixed[("aten.detach.default", 0)] == "ignored"
    assert fixed[("aten.addmm.default", 0)] is None
    # the same key sequence as torch's SAC counts: per op overload, in call order
    for n in {o["op"] for o in block["ops"]}:
        assert [o["k"] for o in block["ops"] if o["op"] == n] == list(range(sum(o["op"] == n for o in block["ops"])))
    mid = p.entries[1]
    saved = [(s["name"], o["op"], o["k"]) for s in mid["segments"] for o in s.get("save_ops", [])]
    assert saved, "the middle budget saves ops"
    tables = {s["name"]: {(o["op"], o["k"]): o for o in s["ops"]} for s in tr["segments"]}
    for name, op, k in saved:
        o = tables[name][(op, k)]
        assert "fixed" not in o and o["bytes"] > 0
    assert all(s["decision"] != "keep" for s in mid["segments"] if s.get("save_ops"))
    assert mid["peak_bytes"] <= mid["budget_bytes"]


@pytest.mark.skipif(not ops_mod.sac_available(), reason="torch without selective checkpointing (1.13)")
def test_op_plan_bitwise_20_adam_steps_and_peak_bound():
    _, p = op_plan()
    mid = p.entries[1]
    assert any(s.get("save_ops") for s in mid["segments"])
    build = lambda: nanogpt.build()   # noqa: E731
    ref_losses, ref = run_steps(build, steps=20, evals=True, last_small=True)
    got_losses, got = run_steps(build, p, mid["budget_bytes"], steps=20, evals=True, last_small=True)
    assert torch.equal(ref_losses, got_losses)
    assert_same(ref, got)
    check_peaks(build, p)


@pytest.mark.skipif(ops_mod.sac_available(), reason="this torch has selective checkpointing")
def test_op_plan_refused_without_selective_checkpointing():
    tr, p = op_plan()
    mid = p.entries[1]
    name = next(s["name"] for s in mid["segments"] if s.get("save_ops"))
    model, batch, loss_fn = nanogpt.build()
    with pytest.raises(ckptkit.BadInput) as e:
        replay.apply(model, p, mid["budget_bytes"])
    assert str(e.value) == (
        f"ckptkit.replay: error: segment {name}: the plan saves single ops (planner 'ops'), which needs torch's "
        "selective activation checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts, "
        f"torch >= 2.4); this is torch {torch.__version__}: plan with planner='joint' (whole segments)")
    # nothing stays patched, and the segment-level plan of the same budget applies and trains
    assert all("forward" not in m.__dict__ for m in model.modules())
    joint = replay.plan(json.dumps(tr), [mid["budget_bytes"]])
    assert any(s["decision"] != "keep" for s in joint.entries[0]["segments"])
    with replay.apply(model, joint):
        loss_fn(model, batch).backward()


@pytest.mark.skipif(not ops_mod.sac_available(), reason="torch without selective checkpointing (1.13)")
def test_saved_ops_are_not_recomputed():
    """The backward runs each saved op exactly once less than the same plan without save_ops
    (whole-segment recompute of the same segments), every other op as often."""
    import collections
    import copy
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[str(func)] += 1
            return func(*args, **(kwargs or {}))

    _, p = op_plan()
    mid = p.entries[1]
    whole = copy.deepcopy(p)
    whole._trace = p._trace
    for s in whole.entries[1]["segments"]:
        s.pop("save_ops", None)
    counts = []
    for plan in (p, whole):
        model, batch, loss_fn = nanogpt.build()
        with replay.apply(model, plan, mid["budget_bytes"]):
            loss = loss_fn(model, batch)
            with Count() as c:
                loss.backward()
        counts.append(c.n)
    saved = collections.Counter(o["op"] for s in mid["segments"] for o in s.get("save_ops", []))
    assert sum(saved.values()) >= 2
    assert counts[0] == counts[1] - saved


def test_ops_planner_needs_op_tables():
    """planner='ops' on a trace recorded without ops=True is refused naming the fix (it gave a
    segment plan with no saved op, quietly); enable(planner='ops') records the op tables."""
    model, batch, loss_fn = nanogpt.build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    tr = replay.record_trace(model, batch, loss_fn, optimizer=opt)
    assert all("ops" not in s for s in tr["segments"])
    with pytest.raises(ckptkit.BadInput, match=r"planner 'ops' needs each segment's op table: record the trace "
                                               r"with ops=True \(replay.record\(\.\.\., ops=True\)\)"):
        replay.plan(json.dumps(tr), planner="ops")
    from ckptkit.replay._enable import _record_plan_apply
    applied, p, tr2 = _record_plan_apply(model, batch, loss_fn, budget=None, activation_budget=None, segments=None,
                                         optimizer=opt, planner="ops", check_scalars=True)
    try:
        assert all("ops" in s for s in tr2["segments"])
    finally:
        applied.remove()
