#!/bin/sh
# Install, build, then run the main job on the bundled real checkpoint and trace:
# compress -> verify -> restore -> one real torch optimizer step against the original,
# then a replay-plan sweep on a recorded training-step trace.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
B=build/apps
OUT=${OUT:-out}
mkdir -p "$OUT"
CKPT=data/lm_adamw.pt
echo "== ckpt-compress $CKPT"
$B/ckpt-compress "$CKPT" -o "$OUT/lm_adamw.ckz.h5" --tolerance 0.01 --grad-bound 1.0 --force
echo "== ckpt-verify (with the original)"
$B/ckpt-verify "$OUT/lm_adamw.ckz.h5" --original "$CKPT" --tolerance 0.01
echo "== ckpt-restore"
$B/ckpt-restore "$OUT/lm_adamw.ckz.h5" -o "$OUT/lm_adamw.restored.pt" --force
echo "== stock torch: load, load_state_dict, one optimizer.step() per gradient kind, then 200 steps of gradient sequences"
/usr/bin/python3 scripts/torch_step_check.py "$CKPT" "$OUT/lm_adamw.restored.pt" --tolerance 0.01 --grad-bound 1.0 --steps 200
echo "== Python: ckptkit.save / ckptkit.load (no full-size file), equal to torch.load outside the moments"
PYTHONPATH=build/python /usr/bin/python3 - "$CKPT" "$OUT" <<'PY'
import sys, torch, ckptkit
src, out = sys.argv[1], sys.argv[2]
orig = torch.load(src)
rep = ckptkit.save(orig, f"{out}/lm_adamw.py.ckz.h5")
back = ckptkit.load(f"{out}/lm_adamw.py.ckz.h5")
same = all(torch.equal(v, back["model"][k]) for k, v in orig["model"].items())
print(f"saved: moment reduction {100 * rep.moment_reduction:.1f}%, max bound {rep.max_bound_lr:.4f} lr; "
      f"model tensors identical after load: {same}")
sys.exit(0 if same and rep.ok else 1)
PY
TRACE=data/traces/bn.trace.json
echo "== replay-plan $TRACE (a real recorded step of test/models/bn.py, BatchNorm running stats)"
$B/replay-plan "$TRACE" --budget 1.5MiB --budget 1.7MiB -o "$OUT/bn.plan.json" --check --force
echo "== apply the plan in real torch: gradients, loss, outputs and buffers byte-identical"
/usr/bin/python3 scripts/apply_plan.py test/models/bn.py "$TRACE" "$OUT/bn.plan.json" --budget 1.5MiB
echo "== budget sweep from the smallest feasible budget (1.40 MiB) up: $OUT/bn.sweep.json (joint's plans), every planner on one plot in $OUT/bn.sweep.svg"
$B/replay-plan "$TRACE" --sweep 1.5MiB:2.0MiB:0.1MiB --planner joint -o "$OUT/bn.sweep.json" --svg "$OUT/bn.sweep.svg" --force > "$OUT/bn.sweep.txt"
tail -n 9 "$OUT/bn.sweep.txt"
echo "== ckptkit.replay in a training loop: record, plan at the smallest activation budget, 5 Adam steps bitwise equal to no recomputation"
PYTHONPATH=build/python /usr/bin/python3 - <<'PY'
import copy, sys
import torch
sys.path.insert(0, "test/models")
import bn
from ckptkit import replay
model, batch, loss_fn = bn.build()
twin = copy.deepcopy(model)
opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (model, twin)]
trace = replay.record(model, batch, loss_fn, optimizer=opts[0])
rng = replay.plan(trace, budget=1 << 40).range
plan = replay.plan(trace, activation_budget=rng["min_activation_bytes"])
entry = plan.entries[0]
print(f"plan: {rng['min_activation_bytes']} B of activations (keeping all: {rng['keep_all_activation_bytes']} B), "
      f"recomputed: {[s['name'] for s in entry['segments'] if s['decision'] != 'keep']}")
losses = [[], []]
state = torch.get_rng_state()
for k, (m, opt) in enumerate(zip((model, twin), opts)):
    torch.set_rng_state(state)
    handle = replay.apply(m, plan) if k == 0 else None
    for _ in range(5):
        loss = loss_fn(m, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses[k].append(loss.detach())
    if handle:
        handle.remove()
same = all(torch.equal(a, b) for a, b in zip(losses[0], losses[1])) and all(
    torch.equal(a, b) for a, b in zip(list(model.state_dict().values()), list(twin.state_dict().values())))
print("losses, parameters and buffers after 5 steps bitwise equal:", same)
sys.exit(0 if same else 1)
PY
