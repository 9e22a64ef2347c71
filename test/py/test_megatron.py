"""Megatron-LM's legacy distributed-optimizer checkpoint (iter_0000003/mp_rank_00/distrib_optim.pt
beside model_optim_rng.pt) written by megatron-core's own DistributedOptimizer code on 2 CPU
data-parallel ranks (scripts/fixtures/make_megatron.py, one torch.distributed.run; Megatron's
CUDA-only buffer allocation and __init__ are rebuilt on the CPU there, as it says), through
ckpt-compress -> ckpt-verify --original -> ckpt-restore, and read back by Megatron's
load_parameter_state (load_parameter_state_from_dp_zero's gloo scatter).

Asserted: distrib_optim.pt compressed with 0 escapes with the hyper-parameters and step of
model_optim_rng.pt (2 param groups, weight decay 0.1 and 0 under AdamW), verified against the
original; the restored folder byte-identical but distrib_optim.pt, in which every leaf but
exp_avg / exp_avg_sq is identical (the fp32 main params "param" among them); one step after
Megatron loads each folder: the same main params before it, every coordinate after it within
tolerance * lr (+ float32 slack). Bad inputs: distrib_optim.pt without model_optim_rng.pt and
param groups that differ in lr are copied exact with a note; a model_optim_rng.pt changed in the
compressed folder (its manifest row updated) fails ckpt-verify.

The torch_dist (DCP) format, the test_torch_dist_* tests: megatron-core's dist_checkpointing.save
of the same training (make_megatron.py --format torch_dist), its optimizer.state.exp_avg.<param> /
exp_avg_sq.<param> items coded with common.pt's hyper-parameters and step, theta the
optimizer.state.param.<param> items; the restored folder identical but the moment items;
dist_checkpointing.load of both folders and one step within tolerance * lr; common.pt's groups
differing in lr keep the moments exact; a changed common.pt fails ckpt-verify. The test_dp_reshardable_*
tests: the same with Megatron-LM's default sharding, dp_reshardable (flat per-bucket items B.exp_avg /
B.exp_avg_sq / B.param, the param groups in a ShardedObject item). Runs where megatron-core imports
(.venv: scripts/requirements.txt; it needs torch >= 2.6); skipped, saying so, elsewhere.
"""
import importlib.machinery
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

if importlib.machinery.PathFinder.find_spec("megatron") is None:
    pytest.skip("megatron-core is not installed here (it is in .venv, scripts/requirements.txt)", allow_module_level=True)

from testlib import ROOT, folder_files, parse_json_stdout, require_ckptkit_bin, run_tool, walk_leaves  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "fixtures", "make_megatron.py")
TOL, EPS32 = 0.01, 2.0 ** -23
REL = "iter_0000003/mp_rank_00"


def _make(tmp_path_factory, name, *args):
    """make_megatron.py ARGS ROOT on 2 gloo ranks (None without the tools: _root skips)."""
    root = tmp_path_factory.mktemp(name)
    b = os.environ.get("CKPTKIT_BIN", "")
    if not os.access(os.path.join(b, "ckpt-compress"), os.X_OK):
        return None
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        SCRIPT, *args, str(root)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1", CKPTKIT_BIN=os.path.abspath(b)))
    assert p.returncode == 0, f"make_megatron.py {' '.join(args)}: exit {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
    return root


@pytest.fixture(scope="session")
def mg(tmp_path_factory):
    return _make(tmp_path_factory, "megatron")


def _root(mg):
    require_ckptkit_bin()
    return mg


def test_compress_verify(mg):
    """distrib_optim.pt compressed (0 escapes, > 70% moment reduction, both model chunks' buffers)
    with model_optim_rng.pt's hyper-parameters and step; the other files copied; verify ok."""
    d = _root(mg)
    rep = json.loads((d / "compress.json").read_text())
    assert rep["ok"] and rep["max_bound_lr"] <= TOL, rep
    assert [(l["kind"], l["dir"]) for l in rep["layouts"]] == [("megatron", REL)]
    rows = {r["file"]: r for r in rep["files"]}
    assert set(rows) == {f"{REL}/distrib_optim.pt", f"{REL}/model_optim_rng.pt", "latest_checkpointed_iteration.txt"}
    r = rows[f"{REL}/distrib_optim.pt"]
    assert r["action"] == "compressed" and r["escapes"] == 0 and r["moment_reduction"] > 0.7, r
    assert "from model_optim_rng.pt" in r["note"], r
    groups = r["report"]["param_groups"]
    saved = torch.load(d / "orig" / REL / "model_optim_rng.pt", weights_only=False)["optimizer"]["optimizer"]["param_groups"]
    assert len(saved) == 2 and {g["weight_decay"] for g in saved} == {0.1, 0.0}
    assert [(g["optimizer"], g["lr"], g["step"], g["betas"], g["eps"], g["tensors"]) for g in groups] == \
        [("adamw", saved[0]["lr"], saved[0]["step"], list(saved[0]["betas"]), saved[0]["eps"], 2)], groups
    names = [t["name"] for t in r["report"]["tensors"]]
    assert names == [f"distrib_optim/{i}/(torch.bfloat16, torch.float32)" for i in (0, 1)], names
    for f in (f"{REL}/model_optim_rng.pt", "latest_checkpointed_iteration.txt"):
        assert rows[f]["action"] == "copied", rows[f]
    v = json.loads((d / "verify.json").read_text())
    assert v["ok"], v


def test_restored_folder(mg):
    """The restored folder: the same files, byte-identical but distrib_optim.pt; in it every leaf
    but the moments identical (the fp32 main params, numel_unpadded, the dtype keys), every
    moment changed by the codec."""
    d = _root(mg)
    orig, back = d / "orig", d / "back"
    assert folder_files(orig) == folder_files(back)
    for f in folder_files(orig):
        if not f.endswith("distrib_optim.pt"):
            assert (orig / f).read_bytes() == (back / f).read_bytes(), f
    moments = []
    walk_leaves(torch.load(orig / REL / "distrib_optim.pt"), torch.load(back / REL / "distrib_optim.pt"), [], moments)
    assert len(moments) == 4 and all(not torch.equal(a, b) for a, b in moments)


def test_megatron_resumes_within_tolerance(mg):
    """Megatron's load_parameter_state of the original and of the restored folder on 2 ranks, one
    step with the same gradients: every rank's fp32 main shards identical before the step, after
    it every coordinate within tolerance * lr + float32 slack of the original run's."""
    _resumes_within_tolerance(_root(mg))


def test_distrib_optim_alone_copied_exact(mg, tmp_path):
    """A distrib_optim.pt without model_optim_rng.pt beside it: copied exact with one note (the
    layout says so too); verify and restore give the same bytes."""
    d = _root(mg)
    b = os.environ["CKPTKIT_BIN"]
    src = tmp_path / "alone" / REL
    src.mkdir(parents=True)
    shutil.copy(d / "orig" / REL / "distrib_optim.pt", src)
    p = run_tool(b, "ckpt-compress", tmp_path / "alone", "-o", tmp_path / "z", "--json")
    assert p.returncode == 0, p.stderr
    rep = parse_json_stdout(p)
    note = ("no model_optim_rng.pt beside distrib_optim.pt: its hyper-parameters and step are unknown, "
            "the file is copied exact")
    assert [(l["kind"], l["note"]) for l in rep["layouts"]] == [("megatron", note)]
    (row,) = rep["files"]
    assert (row["action"], row["note"]) == ("copied", note), row
    assert run_tool(b, "ckpt-verify", tmp_path / "z", "--original", tmp_path / "alone").returncode == 0
    assert run_tool(b, "ckpt-restore", tmp_path / "z", "-o", tmp_path / "back").returncode == 0
    assert (tmp_path / "back" / REL / "distrib_optim.pt").read_bytes() == (src / "distrib_optim.pt").read_bytes()


def test_groups_differing_in_lr_kept_exact(mg, tmp_path):
    """Param groups with different lr (Megatron's lr_mult / decoupled_lr): which buffer coordinate
    is whose is in neither file, so distrib_optim.pt is copied exact, saying why."""
    d = _root(mg)
    src = tmp_path / "lr" / REL
    shutil.copytree(d / "orig", tmp_path / "lr")
    sd = torch.load(src / "model_optim_rng.pt", weights_only=False)
    sd["optimizer"]["optimizer"]["param_groups"][1]["lr"] *= 0.5
    torch.save(sd, src / "model_optim_rng.pt")
    p = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-compress", tmp_path / "lr", "-o", tmp_path / "z", "--json")
    assert p.returncode == 0, p.stderr
    row = {r["file"]: r for r in parse_json_stdout(p)["files"]}[f"{REL}/distrib_optim.pt"]
    assert row["action"] == "copied", row
    assert row["note"] == ("distrib_optim.pt kept exact: the param groups of model_optim_rng.pt differ in lr: a "
                           "distrib_optim.pt buffer mixes their parameters and neither file says which coordinate is whose")



def _verify_with_bumped_step(root, tmp_path, rel):
    """Copy root's compressed folder, add 1 to every param group's step in its copied file `rel`
    (model_optim_rng.pt or common.pt; the manifest row updated to match) and run ckpt-verify --json."""
    import xxhash
    z = tmp_path / "ckz"
    shutil.copytree(root / "ckz", z)
    f = z / rel
    sd = torch.load(f, weights_only=False)
    for g in sd["optimizer"]["optimizer"]["param_groups"]:
        g["step"] += 1
    torch.save(sd, f)
    man = json.loads((z / "ckptkit-folder.json").read_text())
    h = xxhash.xxh3_64_hexdigest(f.read_bytes())
    for e in man["files"]:
        if e["path"] == rel:
            e.update(size=f.stat().st_size, source_size=f.stat().st_size, xxh3=h, source_xxh3=h)
    (z / "ckptkit-folder.json").write_text(json.dumps(man))
    return run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", z, "--json")

def test_verify_checks_model_optim_rng(mg, tmp_path):
    """ckpt-verify compares the container's step and hyper-parameters with the copied
    model_optim_rng.pt beside it: a step changed there (its manifest row updated to match) fails."""
    d, z = _root(mg), tmp_path / "ckz"
    p = _verify_with_bumped_step(d, tmp_path, f"{REL}/model_optim_rng.pt")
    assert p.returncode == 1, p.stdout + p.stderr
    rep = parse_json_stdout(p)
    assert any("step (3 vs 4) differs" in x for x in rep["failures"]), rep["failures"]
    shutil.copy(d / "ckz" / REL / "model_optim_rng.pt", z / REL / "model_optim_rng.pt")   # the original sibling back: its row's hash fails only
    p = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", z, "--json")
    assert p.returncode == 1 and not any("step (" in x for x in parse_json_stdout(p)["failures"])


def test_te_fused_adam_groups(mg, tmp_path):
    """Megatron with Transformer Engine's (or Apex's) FusedAdam, which needs CUDA: its param groups
    as DistributedOptimizer.state_dict() writes them (TE fused_adam.py defaults lr,
    bias_correction, betas, eps, weight_decay; Megatron's own keys; step = int(group['step']),
    an exact count) replace the torch ones. Compressed with the exact step 3, verified (also
    under --horizon 1); with bias_correction False, copied exact (not Adam)."""
    d = _root(mg)
    b = os.environ["CKPTKIT_BIN"]
    for bc in (True, False):
        root = tmp_path / f"te{bc}"
        shutil.copytree(d / "orig", root)
        f = root / REL / "model_optim_rng.pt"
        sd = torch.load(f, weights_only=False)
        groups = sd["optimizer"]["optimizer"]["param_groups"]
        keep = ("is_expert_parallel", "default_config", "wd_mult", "lr_mult", "is_decoupled_lr", "max_lr", "min_lr",
                "lr", "betas", "eps", "weight_decay")
        sd["optimizer"]["optimizer"]["param_groups"] = [
            dict({k: g[k] for k in keep}, bias_correction=bc, step=int(g["step"])) for g in groups]
        torch.save(sd, f)
        p = run_tool(b, "ckpt-compress", root, "-o", tmp_path / f"z{bc}", "--json")
        assert p.returncode == 0, p.stderr
        row = {r["file"]: r for r in parse_json_stdout(p)["files"]}[f"{REL}/distrib_optim.pt"]
        if not bc:
            assert (row["action"], row["note"]) == ("copied", "distrib_optim.pt kept exact: FusedAdam without bias "
                                                              "correction (not Adam)"), row
            continue
        assert row["action"] == "compressed" and row["escapes"] == 0 and row["moment_reduction"] > 0.7, row
        (g,) = row["report"]["param_groups"]
        assert (g["step"], g["lr"], g["tensors"]) == (3, groups[0]["lr"], 2), g
        assert run_tool(b, "ckpt-verify", tmp_path / f"z{bc}", "--original", root).returncode == 0
        # --horizon 1 needs the gradient domain: AdamW vs Adam is in neither file (args has no
        # decoupled_weight_decay), the groups' weight decay is 0.1 or 0: the union of the plain
        # domain and the one shifted by 0.1 * theta, theta the buffer's fp32 "param"
        p = run_tool(b, "ckpt-compress", root, "-o", tmp_path / "h1", "--horizon", "1", "--json")
        assert p.returncode == 0, p.stderr
        row = {r["file"]: r for r in parse_json_stdout(p)["files"]}[f"{REL}/distrib_optim.pt"]
        (g,) = row["report"]["param_groups"]
        assert (g["optimizer"], g["domain"], g["weight_decay"]) == ("adam|adamw", "|g| <= 1, and shifted by wd*theta", 0.1), g
        assert row["escapes"] == 0 and row["moment_reduction"] > 0.7, row
        assert run_tool(b, "ckpt-verify", tmp_path / "h1", "--original", root).returncode == 0


# ---------------------------------------------------------------- torch_dist (a DCP folder)
# make_megatron.py --format torch_dist: the same training saved by megatron-core's
# dist_checkpointing.save (iter_0000003/: .metadata, __R_I.distcp, common.pt, metadata.json) with
# the distributed optimizer's sharded_state_dict (fully_reshardable: 0.16.1 refuses to save
# fully_sharded_model_space, whose items are named the same way), loaded back with
# dist_checkpointing.load and load_parameter_state_from_fully_reshardable.
ITER_DIR = "iter_0000003"


@pytest.fixture(scope="session")
def mgd(tmp_path_factory):
    return _make(tmp_path_factory, "megatron_torch_dist", "--format", "torch_dist")


def _dcp_items(d):
    """(fqn, chunk offset) -> (file, offset, length) of a DCP folder's .metadata."""
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(d)).read_metadata()
    return {(k.fqn, tuple(k.offset) if k.offset is not None else None): (v.relative_path, v.offset, v.length)
            for k, v in md.storage_data.items()}


def test_torch_dist_compress_verify(mgd):
    """Megatron's optimizer.state.exp_avg.<param> / exp_avg_sq items gathered and coded (0
    escapes, > 70% moment reduction, every moment value of the 8 parameters: 2 x their numel),
    with lr, betas, eps and step 3 of common.pt's param groups (weight decay 0.1 and 0 under
    AdamW: one group), theta the optimizer.state.param.<param> items (the ulp regime counted);
    the two .distcp files holding them kept as shells, every other file copied; verify ok."""
    d = _root(mgd)
    rep = json.loads((d / "compress.json").read_text())
    assert rep["ok"] and rep["max_bound_lr"] <= TOL, rep
    assert [(l["kind"], l["dir"], l["evidence"]) for l in rep["layouts"]] == \
        [("dcp", ITER_DIR, ".metadata + *.distcp + Megatron common.pt")]
    rows = {r["file"]: r for r in rep["files"]}
    moments = f"{ITER_DIR}/ckptkit-dcp-moments-0.safetensors"
    assert {f: r["action"] for f, r in rows.items()} == {
        f"{ITER_DIR}/.metadata": "copied", f"{ITER_DIR}/__0_0.distcp": "shell", f"{ITER_DIR}/__0_1.distcp": "shell",
        f"{ITER_DIR}/__1_0.distcp": "copied", f"{ITER_DIR}/common.pt": "copied", f"{ITER_DIR}/metadata.json": "copied",
        "latest_checkpointed_iteration.txt": "copied", moments: "compressed"}, rows
    r = rows[moments]
    numel = sum(t.numel() for k, t in torch.load(d / "orig.after.rank0.pt")["model"].items())
    assert r["moment_values"] == rep["moment_values"] == 2 * numel == 206880, r
    assert r["escapes"] == 0 and r["moment_reduction"] > 0.7, r
    assert "hyper-parameters and step of 8 from common.pt (Megatron)" in r["note"], r["note"]
    common = torch.load(d / "orig" / ITER_DIR / "common.pt", weights_only=False)
    saved = common["optimizer"]["optimizer"]["param_groups"]
    assert common["optimizer"]["param_state_sharding_type"] == "fully_reshardable"
    assert len(saved) == 2 and {g["weight_decay"] for g in saved} == {0.1, 0.0} and saved[0]["step"] == 3
    (g,) = r["report"]["param_groups"]
    assert (g["optimizer"], g["step"], g["tensors"]) == ("adamw", 3, 8), g
    assert (g["lr"], g["betas"], g["eps"]) == (saved[0]["lr"], list(saved[0]["betas"]), saved[0]["eps"]), g
    params = {k for (k, _) in _dcp_items(d / "orig" / ITER_DIR) if "." in k and not k.startswith(("optimizer", "rng"))}
    assert {t["name"] for t in r["report"]["tensors"]} == params and len(params) == 8
    assert all(t["ulp_regime"] == 0 and t["escapes"] == 0 for t in r["report"]["tensors"]), r["report"]["tensors"]
    assert json.loads((d / "verify.json").read_text())["ok"]


def test_torch_dist_restored_folder(mgd):
    """The restored folder: the same files, byte-identical but the two .distcp files holding
    moments; in those every item but the moments byte-identical (the bf16 model, the fp32 main
    params 'optimizer.state.param.*', the RNG state), each moment item of the same length, its
    tensor changed by the codec and torch.load-able."""
    d = _root(mgd)
    moments = ("optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq.")
    assert _compare_restored(d, ("__0_0.distcp", "__0_1.distcp"), lambda fqn: fqn.startswith(moments)) == (16, 0)
    orig, back = d / "orig", d / "back"
    assert all((orig / ITER_DIR / f).stat().st_size == (back / ITER_DIR / f).stat().st_size for f in ("__0_0.distcp", "__0_1.distcp"))


def _compare_restored(d, shells, is_moment):
    """orig vs back of a torch_dist fixture: the same files, byte-identical but the .distcp
    files whose names end in `shells`; in those every item byte-identical but the moment items
    (is_moment(fqn)), each torch.load-able as a float32 tensor of the original's shape. Returns
    how many moment items the codec changed and how many it left as they were."""
    import io
    orig, back = d / "orig", d / "back"
    assert folder_files(orig) == folder_files(back)
    for f in folder_files(orig):
        if not f.endswith(shells):
            assert (orig / f).read_bytes() == (back / f).read_bytes(), f
    items = _dcp_items(orig / ITER_DIR)
    assert items == _dcp_items(back / ITER_DIR)
    changed = same = 0
    for (fqn, _), (f, off, n) in items.items():
        a = (orig / ITER_DIR / f).read_bytes()[off:off + n]
        b = (back / ITER_DIR / f).read_bytes()[off:off + n]
        if is_moment(fqn):
            ta, tb = torch.load(io.BytesIO(a)), torch.load(io.BytesIO(b))
            assert ta.shape == tb.shape and ta.dtype == tb.dtype == torch.float32, fqn
            changed, same = (changed, same + 1) if torch.equal(ta, tb) else (changed + 1, same)
        else:
            assert a == b, fqn
    return changed, same


def test_torch_dist_megatron_resumes_within_tolerance(mgd):
    """Megatron's dist_checkpointing.load of the original and of the restored folder on 2 ranks,
    the distributed optimizer's state set from it, one step with the same gradients: the loaded
    bf16 model and every rank's fp32 main shards identical before the step, after it every
    coordinate within tolerance * lr + float32 slack of the original run's."""
    _resumes_within_tolerance(_root(mgd), "fully_reshardable")


def _resumes_within_tolerance(d, sharding=None):
    """The fixture's orig / back.after.rank<R>.pt: the main shards before the step identical,
    after it within tolerance * lr + float32 slack; for torch_dist (`sharding`, the type the
    loads report) the loaded bf16 model identical too."""
    for rank in (0, 1):
        a = torch.load(d / f"orig.after.rank{rank}.pt")
        b = torch.load(d / f"back.after.rank{rank}.pt")
        if sharding is not None:
            assert a["sharding_type"] == b["sharding_type"] == sharding
            assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        assert a["lr"] == b["lr"] and len(a["before"]) == len(b["before"]) > 0
        lr = max(a["lr"])
        for i in a["before"]:
            p0 = a["before"][i].double()
            assert torch.equal(a["before"][i], b["before"][i]), (rank, i)
            ua, ub = a["after"][i].double() - p0, b["after"][i].double() - p0
            assert float(ua.abs().max()) > 0, "the step changed nothing"
            slack = 4 * EPS32 * p0.abs() + 8 * EPS32 * (ua.abs() + ub.abs())
            excess = float(((ua - ub).abs() - TOL * lr - slack).max())
            assert excess <= 0, f"rank {rank} shard {i}: update difference exceeds tolerance * lr by {excess:.3g}"


def test_torch_dist_groups_differing_in_lr_kept_exact(mgd, tmp_path):
    """common.pt's param groups with different lr: which parameter is in which group is not in
    the folder, so Megatron's moment items stay exact, the .distcp files copied with one note."""
    d = _root(mgd)
    root = tmp_path / "lr"
    shutil.copytree(d / "orig", root)
    f = root / ITER_DIR / "common.pt"
    sd = torch.load(f, weights_only=False)
    sd["optimizer"]["optimizer"]["param_groups"][1]["lr"] *= 0.5
    torch.save(sd, f)
    p = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-compress", root, "-o", tmp_path / "z", "--json")
    assert p.returncode == 0, p.stderr
    rep = parse_json_stdout(p)
    assert rep["container_count"] == 0 and rep["moment_values"] == 0
    rows = {r["file"]: r for r in rep["files"]}
    why = ("DCP moments left exact: left exact: Megatron's moment items of 8 parameter "
           "chunks (the param groups of common.pt differ in lr: common.pt does not say which parameter is in which group)")
    for n in ("__0_0.distcp", "__0_1.distcp"):
        assert (rows[f"{ITER_DIR}/{n}"]["action"], rows[f"{ITER_DIR}/{n}"]["note"]) == ("copied", why), rows[f"{ITER_DIR}/{n}"]


def test_torch_dist_verify_checks_common(mgd, tmp_path):
    """ckpt-verify holds the gathered moments' container to the copied common.pt: a step changed
    there (its manifest row updated to match) fails."""
    p = _verify_with_bumped_step(_root(mgd), tmp_path, f"{ITER_DIR}/common.pt")
    assert p.returncode == 1, p.stdout + p.stderr
    assert parse_json_stdout(p)["failures"] == [
        f"{ITER_DIR}/ckptkit-dcp-moments-0.safetensors.ckz.h5: step (3 vs 4) differs from {ITER_DIR}/common.pt's"]


# ---------------------------------------------------------------- torch_dist, dp_reshardable
# make_megatron.py --format torch_dist --sharding dp_reshardable: Megatron-LM's default sharding
# for torch_dist (no --dist-ckpt-optim-fully-reshardable). Per bucket B = "optimizer.distributed.
# dp_group_idx_0.gbuf_idx_<I>.dtype_(torch.bfloat16, torch.float32).bucket_idx_<K>" the items
# B.exp_avg / B.exp_avg_sq / B.param, one chunk per parameter range and per padding (torch.empty:
# any bits), and the param groups in the ShardedObject optimizer.distributed.dp_group_idx_0.
# optimizer (common.pt holds only the sharding type); 2 buckets per model chunk here.
BUCKET = "optimizer.distributed.dp_group_idx_0.gbuf_idx_"


@pytest.fixture(scope="session")
def mgr(tmp_path_factory):
    return _make(tmp_path_factory, "megatron_dp_reshardable", "--format", "torch_dist", "--sharding", "dp_reshardable")


def test_dp_reshardable_compress_verify(mgr):
    """Every bucket chunk's exp_avg / exp_avg_sq coded with the hyper-parameters and step of the
    DP group's optimizer item (read again by ckpt-verify from its shell), theta the B.param chunk
    of the same offset: the 8 parameters' moment values and the padding's, escapes only in
    padding chunks, > 70% smaller; the four .distcp files kept as shells; verify ok."""
    d = _root(mgr)
    rep = json.loads((d / "compress.json").read_text())
    assert rep["ok"] and rep["max_bound_lr"] <= TOL, rep
    common = torch.load(d / "orig" / ITER_DIR / "common.pt", weights_only=False)
    assert common["optimizer"] == {"param_state_sharding_type": "dp_reshardable"}
    rows = {r["file"]: r for r in rep["files"]}
    moments = f"{ITER_DIR}/ckptkit-dcp-moments-0.safetensors"
    assert {f: r["action"] for f, r in rows.items() if r["action"] != "copied"} == {
        **{f"{ITER_DIR}/__{r}_{t}.distcp": "shell" for r in (0, 1) for t in (0, 1)}, moments: "compressed"}, rows
    r = rows[moments]
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(d / "orig" / ITER_DIR)).read_metadata()
    sizes = [math.prod(c.sizes) for k, t in md.state_dict_metadata.items() if k.startswith(BUCKET) and k.endswith(".exp_avg")
             for c in t.chunks]
    numel = sum(t.numel() for k, t in torch.load(d / "orig.after.rank0.pt")["model"].items())
    padding = sum(sizes) - numel   # the chunks between and after the parameter ranges
    assert len(sizes) == 12 and padding > 0 and r["moment_values"] == rep["moment_values"] == 2 * sum(sizes), (sizes, r)
    assert r["moment_reduction"] > 0.7, r
    assert "hyper-parameters and step of 12 from the optimizer.distributed.dp_group_idx_*.optimizer items (Megatron)" in r["note"], r["note"]
    (g,) = r["report"]["param_groups"]
    assert (g["optimizer"], g["step"], g["tensors"], g["weight_decay"]) == ("adamw", 3, 12, 0.1), g
    tensors = r["report"]["tensors"]
    assert sorted(t["values"] for t in tensors) == sorted(2 * n for n in sizes), tensors
    pads = {f"{k[:-len('.exp_avg')]}@{','.join(map(str, o))}" for rank in (0, 1)
            for k, o in json.loads((d / f"padding.rank{rank}.json").read_text())}
    assert len(pads) >= 1 and pads <= {t["name"] for t in tensors}, (pads, tensors)
    assert sum(t["values"] // 2 for t in tensors if t["name"] in pads) == padding
    # the parameter ranges: no escape, no ulp regime (the padding's bits are torch.empty's: anything)
    assert all(t["name"].startswith(BUCKET) and t["ulp_regime"] == 0 and t["escapes"] == 0
               for t in tensors if t["name"] not in pads), tensors
    assert json.loads((d / "verify.json").read_text())["ok"]


def test_dp_reshardable_restored_folder(mgr):
    """The restored folder: every file byte-identical but the four .distcp files, in which every
    item but the bucket moments is byte-identical (B.param, the bf16 model, the param groups'
    ShardedObject); each moment chunk torch.load-able, of its length and dtype."""
    changed, same = _compare_restored(_root(mgr), (".distcp",),
                                      lambda fqn: fqn.startswith(BUCKET) and fqn.endswith((".exp_avg", ".exp_avg_sq")))
    assert changed + same == 24 and changed >= 20


def test_dp_reshardable_megatron_resumes_within_tolerance(mgr):
    """Megatron's dist_checkpointing.load and load_parameter_state_from_dp_reshardable of both
    folders, one step with the same gradients: identical before, within tolerance * lr after."""
    _resumes_within_tolerance(_root(mgr), "dp_reshardable")


def test_dp_reshardable_verify_checks_group_item(mgr, tmp_path):
    """ckpt-verify reads the DP group's param groups again from the shell that holds them (at
    the offset shifted by the cuts before it): a step changed there (the same length; the
    shell's manifest row updated to match) fails."""
    import io
    import xxhash
    d = _root(mgr)
    z = tmp_path / "ckz"
    shutil.copytree(d / "ckz", z)
    ((fqn, _), (f, off, n)), = [(k, v) for k, v in _dcp_items(d / "orig" / ITER_DIR).items()
                                if k[0].startswith("optimizer.distributed.dp_group_idx_0.optimizer/")]
    man = json.loads((z / "ckptkit-folder.json").read_text())
    (e,) = [e for e in man["files"] if e["path"] == f"{ITER_DIR}/{f}"]
    assert e.get("shell") and e["stored"] != e["path"], e
    at = off - sum(c["length"] for c in e["cuts"] if c["offset"] + c["length"] <= off)
    shell = z / e["stored"]
    data = bytearray(shell.read_bytes())
    obj = torch.load(io.BytesIO(bytes(data[at:at + n])), weights_only=False)
    for g in (obj[0] if isinstance(obj, list) else obj)["param_groups"]:
        assert g["step"] == 3
        g["step"] += 1
    b = io.BytesIO()
    torch.save(obj, b)
    assert len(b.getvalue()) == n
    data[at:at + n] = b.getvalue()
    shell.write_bytes(bytes(data))
    h = xxhash.xxh3_64_hexdigest(bytes(data))
    e.update(xxh3=h)
    (z / "ckptkit-folder.json").write_text(json.dumps(man))
    p = run_tool(os.environ["CKPTKIT_BIN"], "ckpt-verify", z, "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{ITER_DIR}/ckptkit-dcp-moments-0.safetensors.ckz.h5: step (3 vs 4) differs from the " \
           f"optimizer.distributed.dp_group_idx_*.optimizer items of {ITER_DIR}" in parse_json_stdout(p)["failures"], p.stdout
