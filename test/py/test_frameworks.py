"""The recipes of docs/python.md ("Hugging Face `Trainer`", "Lightning") against the real
frameworks: a tiny model trains a few dozen steps on the CPU, its checkpoints written through
the recipe, the run is stopped after a checkpoint and resumed from the compressed one
(`resume_from_checkpoint` / `ckpt_path`), and the resumed run is compared with an uninterrupted
one.

No code twice: the recipes' code blocks are taken from docs/python.md and exec'd as they stand
(_recipe), so the page and this test cannot drift apart. The usage blocks name `Trainer`,
`model`, `args`, ...: the test binds them, `Trainer` to the framework's own class with the test's
observers (callbacks) added and, for Lightning, the CPU-only settings of a test (_lightning).

What is asserted, for each framework:
- every checkpoint is compressed (HF: the folder ckz/checkpoint-N, no full-size checkpoint-N/
  left; Lightning: every .ckpt is a container) and ckptkit.verify passes it against the original
  the framework wrote (kept by the test's observer);
- everything but the Adam moments comes back bit for bit (HF: every file of the restored
  folder but optimizer.pt byte-identical, optimizer.pt's non-moment leaves bit-identical;
  Lightning: every non-moment leaf of the checkpoint), and ckptkit.load of a container gives
  what torch.load gives for the restored file, under each weights_only (None, True, False):
  these checkpoints load under torch's default (weights_only=True from torch 2.6 on); a
  Lightning checkpoint whose hyper-parameters hold a class outside torch's allowlist is refused
  by both under that default and loads with weights_only=False;
- the first update after the resume, proven: the resumed run starts its first step from the
  uninterrupted run's parameters (bit-equal) with its gradient (bit-equal: the data order, RNG
  and loss are restored), so only the moments differ, and ckptkit's certificate bounds that
  update by tolerance * lr: torch_step_check.compare_steps, per coordinate |Delta_resumed -
  Delta_uninterrupted| <= tolerance * lr + slack (4 ulp of |theta| + 8 eps32 * the update's size,
  float32 rounding: see scripts/torch_step_check.py);
- the next K updates, proven: after the first step the parameters differ (by <= tolerance * lr
  per coordinate), so the runs' own gradients differ and no per-update bound holds between them.
  A second resume feeds every step the uninterrupted run's gradient of the same step (in the
  optimizer's step pre-hook): the every-update certificate (--horizon all, ckptkit's default)
  then bounds each update as above, and the parameters after K steps are within the sum of the
  per-step bounds (K * tolerance * lr_max + rounding), coordinate by coordinate;
- the resumed run's own trajectory (its own gradients): its losses stay within LOSS_RTOL of
  the uninterrupted run's. An observed margin (these runs show < 2e-5), not a bound.
The certificate assumes |g| <= grad_bound = 1 per coordinate (ckptkit's default): HF clips the
gradient's norm to max_grad_norm = 1 (its default), Lightning here clips each value to 1; the
recorded gradients are checked. Weight decay is 0 (the decay term lr * wd * theta would differ
by lr * wd * (theta_r - theta_u) once the parameters differ, outside the certificate).

The frameworks are optional: transformers / lightning are in the .venv of
scripts/requirements.txt (torch 2.x line) and absent from Debian (torch 1.13): each test skips,
saying so, where its framework cannot be imported. HF_HUB_OFFLINE=1: the model is built from
a config, nothing is downloaded.
"""
import io
import os
import pathlib
import pickle
import re
import shutil
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from testlib import ROOT, import_package, torch_step_check as tsc  # noqa: E402

ckptkit, PKG = import_package()

TOL = 0.01          # ckptkit's default tolerance (the recipes use the defaults)
GRAD_BOUND = 1.0    # ckptkit's default grad_bound
LOSS_RTOL = 1e-3    # the resumed run's own losses against the uninterrupted run's (observed, not proven)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one torch thread (two threads on a shared 2-core machine wait on each other
    at every small op; every run of a test trains under the same setting)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class _Killed(Exception):
    """Ends a run where a kill would: after its checkpoint, steps later (nothing else is
    written: the checkpoint on disk is what a killed process leaves)."""


# ------------------------------------------------------------------------------ the recipes, from the page


def _recipe(title):
    """The ```python blocks of docs/python.md's recipe `title` (the bold line starting it, up
    to the next bold recipe title or section), in order."""
    text = open(os.path.join(ROOT, "docs", "python.md"), encoding="utf-8").read()
    start = text.index(f"\n**{title}**")
    nxt = re.compile(r"\n\*\*[^*\n]+\*\*:|\n#{1,3} ").search(text, start + 1)
    section = text[start:nxt.start() if nxt else len(text)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, f"docs/python.md: no code in the recipe {title!r}"
    return blocks


def _exec(code, ns, where):
    exec(compile(code, f"docs/python.md ({where})", "exec"), ns)


# ------------------------------------------------------------------------------ observing the optimizer


class _Steps:
    """Every optimizer step of a framework's training loop, seen through torch's optimizer step
    hooks (both frameworks call the torch optimizer's step): per step s (1-based: Adam's step
    count + 1) the loss, the .grad Adam sees (after the framework's clipping; Lightning calls
    step(closure): the gradient is taken once the closure has run) and the records of
    torch_step_check.step_records. With `replay` (another run's steps), each step's .grad is
    then replaced by that run's gradient of the same step ("natural" keeps the run's own)."""

    def __init__(self, replay=None):
        self.steps, self.replay, self.opt, self.loss_of, self.cur = {}, replay, None, None, None

    def attach(self, opt, loss_of):
        if self.opt is None:
            self.opt, self.loss_of = opt, loss_of
            opt.register_step_pre_hook(self._pre)
            opt.register_step_post_hook(self._post)
        assert self.opt is opt, "one optimizer per run"

    def _pre(self, opt, args, kwargs):
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)   # args: (optimizer, closure)
        if closure is None:   # HF: forward, backward and clipping are done
            self._capture(opt)
            return None

        def after_closure():  # Lightning: step(closure) runs them inside the step
            loss = closure()
            self._capture(opt)
            return loss
        return args[:1], {**kwargs, "closure": after_closure}

    def _capture(self, opt):
        ps = tsc._params(opt)
        st = opt.state.get(ps[0][0]) or {}
        s = int(float(st["step"])) + 1 if "step" in st else 1
        natural = [p.grad.detach().clone() for p, _ in ps]
        if self.replay is not None and s in self.replay.steps:
            for (p, _), g in zip(ps, self.replay.steps[s]["grads"]):
                p.grad.copy_(g)
        before = [(p.detach().clone(), opt.state[p]["exp_avg"].clone() if "exp_avg" in opt.state[p]
                   else torch.zeros_like(p)) for p, _ in ps]
        self.cur = dict(step=s, loss=float(self.loss_of()), natural=natural,
                        grads=[p.grad.detach().clone() for p, _ in ps], before=before)

    def _post(self, opt, args, kwargs):
        c, self.cur = self.cur, None
        c["recs"] = tsc.step_records(opt, c.pop("before"), c["grads"])
        self.steps[c["step"]] = c

    def params(self, s):
        """The parameters after step s."""
        return [r["theta1"] for r in self.steps[s]["recs"]]


def _compare_resumed(base, resumed, replayed, first, last):
    """The assertions on the steps first..last of a resumed run (its own gradients) and of a
    replayed one (base's gradients), against the uninterrupted run `base`."""
    for run in (base, resumed, replayed):
        assert set(range(first, last + 1)) <= set(run.steps), sorted(run.steps)
        worst = max(float(g.abs().max()) for s in range(first, last + 1) for g in run.steps[s]["grads"])
        assert worst <= GRAD_BOUND, f"gradient {worst} outside the certified [-{GRAD_BOUND}, {GRAD_BOUND}]"
    u, r = base.steps[first], resumed.steps[first]
    # the first step after the resume: same parameters, same gradient, same loss, bit for bit
    for (o, n) in zip(u["recs"], r["recs"]):
        assert torch.equal(o["theta0"], n["theta0"]), "the resumed run starts from other weights"
    for a, b in zip(u["natural"], r["natural"]):
        assert torch.equal(a, b), "the resumed run's first gradient differs (data order / RNG / loss not restored)"
    assert u["loss"] == r["loss"]
    res = tsc.compare_steps(u["recs"], r["recs"], TOL)
    assert res["ok"], f"first update after the resume: {res}"
    assert res["max_lr"] > 0, "the moments were not compressed at all?"
    print(f"first update after resume: max |dDelta| = {res['max_lr']:.3e} lr (bound {TOL} lr + rounding)")
    # the same gradients for K steps (replayed): every update within its bound, the parameters
    # within the sum of the bounds
    total = None
    for s in range(first, last + 1):
        res = tsc.compare_steps(base.steps[s]["recs"], replayed.steps[s]["recs"], TOL, limits=True)
        assert res["ok"], f"update {s} with the uninterrupted run's gradients: {res}"
        total = res["limits"] if total is None else [t + l for t, l in zip(total, res["limits"])]
    drift = 0.0
    for a, b, lim in zip(base.params(last), replayed.params(last), total):
        d = (a.double() - b.double()).abs()
        assert bool((d <= lim).all()), f"parameters after {last - first + 1} steps: {float((d - lim).max())} past the bound"
        drift = max(drift, float((d / lim).max()))
    print(f"{last - first + 1} replayed steps: max |theta_r - theta_u| = {drift:.3f} of the summed bound")
    # the resumed run's own trajectory: losses close (observed)
    rel = max(abs(resumed.steps[s]["loss"] - base.steps[s]["loss"]) / abs(base.steps[s]["loss"])
              for s in range(first, last + 1))
    print(f"resumed run's own losses: max relative difference {rel:.3e} (asserted <= {LOSS_RTOL})")
    assert rel <= LOSS_RTOL, rel


def _same_load(container, plain):
    """ckptkit.load(container) gives what torch.load(plain) gives (the restored file), under
    each weights_only: the same leaves, bit for bit, or a refusal (torch: UnpicklingError,
    ckptkit: BadInput) where torch refuses. Returns the weights_only values refused."""
    refused = []
    for wo in (None, True, False):
        try:
            want = torch.load(plain, map_location="cpu", weights_only=wo)
        except pickle.UnpicklingError:
            with pytest.raises(ckptkit.BadInput):
                ckptkit.load(container, map_location="cpu", weights_only=wo)
            refused.append(wo)
            continue
        got = ckptkit.load(container, map_location="cpu", weights_only=wo)
        assert not tsc.compare_checkpoints(want, got, check_zeros=True), wo
        for (pa, a), (pb, b) in zip(tsc._walk(want), tsc._walk(got)):
            assert pa == pb and (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), pa
    return refused


pytestmark = pytest.mark.usefixtures("real_frameworks")   # conftest.py: stand-in modules out of the way


# ------------------------------------------------------------------------------ Hugging Face Trainer

HF_STEPS, HF_SAVE, HF_KILL = 23, 8, 19   # checkpoints at 8, 16 (and 23, the end); killed at 19; resumed from 16


def _hf_parts():
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (the .venv of scripts/requirements.txt has it)")
    pytest.importorskip("accelerate", reason="accelerate (Trainer needs it) is not installed")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

    class Data(torch.utils.data.Dataset):
        """Random token sequences (fixed), the labels the inputs (causal LM)."""

        def __init__(self, n=96, length=16, vocab=64):
            self.x = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    def model():
        """A 2-layer GPT-2 from a config (no download), dropout on (the RNG state matters)."""
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                          bos_token_id=0, eos_token_id=0))

    def args(out):
        return TrainingArguments(
            output_dir=str(out), max_steps=HF_STEPS, save_steps=HF_SAVE, per_device_train_batch_size=8,
            learning_rate=1e-3, lr_scheduler_type="linear", weight_decay=0.0, max_grad_norm=GRAD_BOUND,
            optim="adamw_torch", use_cpu=True, report_to=[], seed=0, data_seed=0, logging_steps=HF_STEPS,
            disable_tqdm=True, dataloader_num_workers=0)

    class Observe(TrainerCallback):
        """The test's observer: records the steps (optimizer hooks, the loss from the model's
        output); `keep` copies each checkpoint-N/ as Trainer wrote it, before the recipe's
        callback (after this one) compresses and removes it; `kill` ends the run at that step."""

        def __init__(self, steps, keep=None, kill=None):
            self.rec, self.keep, self.kill, self.loss = steps, keep, kill, None

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            if self.rec.opt is None:
                model.register_forward_hook(lambda m, i, out: setattr(self, "loss", out.loss.detach()))
                self.rec.attach(getattr(optimizer, "optimizer", optimizer), lambda: self.loss)

        def on_save(self, args, state, control, **kwargs):
            if self.keep:
                name = f"checkpoint-{state.global_step}"
                shutil.copytree(os.path.join(args.output_dir, name), os.path.join(self.keep, name))

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.kill:
                raise _Killed()

    return transformers, Data(), model, args, Observe


def test_hf_trainer_recipe(tmp_path):
    transformers, data, model, hf_args, Observe = _hf_parts()
    # Trainer also saves at max_steps, where the linear schedule's lr is 0: tolerance * lr = 0,
    # every moment of that checkpoint is kept exact and ckptkit warns so (expected here)
    warnings.filterwarnings("ignore", message=rf"warning: .*/checkpoint-{HF_STEPS}/optimizer\.pt: .*escaped",
                            category=ckptkit.CkptkitWarning)
    callback, train, resume = _recipe("Hugging Face `Trainer`")
    ns = {"__name__": "docs_python_md_hf"}
    _exec(callback, ns, "CkptkitCallback")

    def run(block, out, observer, **names):
        def Trainer(callbacks=(), **kw):   # the framework's Trainer, the test's observer first
            return transformers.Trainer(callbacks=[observer, *callbacks], **kw)
        ns.update(Trainer=Trainer, model=model(), args=hf_args(out), train_dataset=data, **names)
        _exec(block, ns, "Trainer")

    base = _Steps()   # the uninterrupted run
    run(train, tmp_path / "base", Observe(base))
    assert sorted(base.steps) == list(range(1, HF_STEPS + 1))
    # the run that is killed after checkpoint-16
    out, keep = tmp_path / "run", tmp_path / "as_written"
    with pytest.raises(_Killed):
        run(train, out, Observe(_Steps(), keep=str(keep), kill=HF_KILL))
    assert not [n for n in os.listdir(out) if n.startswith("checkpoint-")], os.listdir(out)
    saved = [HF_SAVE * i for i in range(1, HF_KILL // HF_SAVE + 1)]
    assert sorted(os.listdir(out / "ckz")) == sorted(f"checkpoint-{n}" for n in saved)
    for n in saved:
        rep = ckptkit.verify(out / "ckz" / f"checkpoint-{n}", original=keep / f"checkpoint-{n}")
        assert rep.ok
        assert (out / "ckz" / f"checkpoint-{n}" / "optimizer.pt.ckz.h5").is_file()
    step = saved[-1]
    # the user's resume (the recipe): restore, then Trainer(...).train(resume_from_checkpoint=...)
    resumed = _Steps()
    run(resume, out, Observe(resumed), step=step)
    orig, back = keep / f"checkpoint-{step}", out / f"checkpoint-{step}"
    assert sorted(os.listdir(orig)) == sorted(os.listdir(back))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= \
        set(os.listdir(orig))
    for name in os.listdir(orig):
        if name != "optimizer.pt":   # weights, scheduler, RNG states, trainer state, args: byte-identical
            assert (orig / name).read_bytes() == (back / name).read_bytes(), name
    o_opt = torch.load(orig / "optimizer.pt", weights_only=True)
    assert not tsc.compare_checkpoints(o_opt, torch.load(back / "optimizer.pt", weights_only=True))
    _same_load(out / "ckz" / f"checkpoint-{step}" / "optimizer.pt.ckz.h5", back / "optimizer.pt")
    # the same resume on a copy of the compressed folder, each step fed the uninterrupted run's gradient
    other = tmp_path / "replay"
    shutil.copytree(out / "ckz", other / "ckz")
    replayed = _Steps(replay=base)
    run(resume, other, Observe(replayed), step=step)
    _compare_resumed(base, resumed, replayed, step + 1, HF_STEPS)


# ------------------------------------------------------------------------------ Lightning

L_EPOCH = 8                                 # steps per epoch (64 samples, batches of 8)
L_STEPS, L_EVERY, L_KILL = 24, 8, 19        # checkpoints at 8, 16, 24 (epoch ends); killed at 19; resumed from 16


def _lightning():
    pytest.importorskip("lightning", reason="lightning is not installed (the .venv of scripts/requirements.txt has it)")
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Net(pl.LightningModule):
        """A small MLP regression with Adam; the loss of the step kept for the observer."""

        def __init__(self, hidden=64, lr=1e-3):
            super().__init__()
            self.save_hyperparameters()   # hyper_parameters in the checkpoint, as most modules have
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 4))
            self.last_loss = None

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.last_loss = loss.detach()
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    def loader():
        # epoch-end checkpoints and a fixed order: Lightning resumes a plain DataLoader at an
        # epoch's start (a mid-epoch checkpoint would need a stateful loader)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(L_EPOCH * 8, 16, generator=g)
        y = torch.sin(x[:, :4] * 3) + 0.1 * torch.randn(L_EPOCH * 8, 4, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=False)

    class Observe(pl.Callback):
        """The test's observer: records the steps (optimizer hooks); `kill` ends the run there."""

        def __init__(self, steps, kill=None):
            self.rec, self.kill = steps, kill

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.rec.attach(trainer.optimizers[0], lambda: pl_module.last_loss)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == self.kill:
                raise _Killed()

    return pl, ModelCheckpoint, Net, loader, Observe


def test_lightning_recipe(tmp_path):
    pl, ModelCheckpoint, Net, loader, Observe = _lightning()
    plugin, train, resume = _recipe("Lightning")
    ns = {"__name__": "docs_python_md_lightning"}
    _exec(plugin, ns, "CkptkitCheckpointIO")
    recipe_io = ns["CkptkitCheckpointIO"]

    class KeepingIO(recipe_io):
        """The recipe's plugin, also keeping torch.save of what Lightning hands it (the
        original, for the comparison): the killed run's."""

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            buf = io.BytesIO()   # as ckptkit.save serialises: torch.save to a buffer (records under archive/)
            torch.save(checkpoint, buf)
            os.makedirs(tmp_path / "as_written", exist_ok=True)
            (tmp_path / "as_written" / os.path.basename(path)).write_bytes(buf.getvalue())
            super().save_checkpoint(checkpoint, path, storage_options)

    def run(block, root, observer, plugin_class=recipe_io, **names):
        def Trainer(callbacks=(), **kw):   # Lightning's Trainer, CPU-only test settings, the observer
            return pl.Trainer(callbacks=[observer, *callbacks], accelerator="cpu", devices=1, logger=False,
                              enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
                              gradient_clip_val=GRAD_BOUND, gradient_clip_algorithm="value", **kw)
        ns.update(Trainer=Trainer, ModelCheckpoint=ModelCheckpoint, model=Net(), loader=loader(),
                  max_steps=L_STEPS, every=L_EVERY, CkptkitCheckpointIO=plugin_class, **names)
        _exec(block, ns, "Lightning")

    # expected: the resume writes into the killed run's checkpoints/, the replay into another root
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message="The dirpath has changed from")
    base = _Steps()
    run(train, tmp_path / "base", Observe(base))
    assert sorted(base.steps) == list(range(1, L_STEPS + 1))
    with pytest.raises(_Killed):
        run(train, tmp_path / "run", Observe(_Steps(), kill=L_KILL), plugin_class=KeepingIO)
    ckpts = tmp_path / "run" / "checkpoints"
    names = sorted(os.listdir(ckpts))
    assert names == [f"epoch={e}-step={L_EVERY * (e + 1)}.ckpt" for e in range(L_KILL // L_EVERY)], names
    for name in names:   # every .ckpt is a container, the original's non-moment state bit for bit
        path, orig = ckpts / name, tmp_path / "as_written" / name
        assert ckptkit.verify(path, original=orig).ok
        assert not tsc.compare_checkpoints(torch.load(orig, weights_only=False), ckptkit.load(path, weights_only=False))
        ckptkit.restore(path, tmp_path / f"{name}.pt")
        assert _same_load(path, tmp_path / f"{name}.pt") == []   # loads under torch's default weights_only
    # hyper-parameters outside torch's weights_only allowlist (here a Path): torch.load refuses
    # the file under weights_only=True (its default from torch 2.6 on), and so does ckptkit.load
    # of the container; both load it with weights_only=False (docs/python.md, "Lightning")
    ckpt = torch.load(tmp_path / f"{names[0]}.pt")
    ckpt["hyper_parameters"]["data"] = pathlib.PurePosixPath("/data/train")
    recipe_io().save_checkpoint(ckpt, str(tmp_path / "hp.ckpt"))
    ckptkit.restore(tmp_path / "hp.ckpt", tmp_path / "hp.pt")
    default_refuses = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 6)   # weights_only=None
    assert _same_load(tmp_path / "hp.ckpt", tmp_path / "hp.pt") == ([None, True] if default_refuses else [True])
    assert recipe_io().load_checkpoint(tmp_path / "hp.ckpt", weights_only=False)["hyper_parameters"]["data"] == \
        pathlib.PurePosixPath("/data/train")
    ckpt_path = str(ckpts / names[-1])
    step = L_EVERY * len(names)
    resumed = _Steps()
    run(resume, tmp_path / "run", Observe(resumed), ckpt_path=ckpt_path)
    replayed = _Steps(replay=base)
    run(resume, tmp_path / "replay", Observe(replayed), ckpt_path=ckpt_path)
    _compare_resumed(base, resumed, replayed, step + 1, L_STEPS)
