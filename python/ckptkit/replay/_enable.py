"""One-line integrations (issue 53): ckptkit.replay.enable(model, budget=...) for a model whose
forward computes the loss (a Hugging Face PreTrainedModel called with labels=) or any module
with loss_fn=, and ReplayCallback for a Lightning Trainer. Both record on the first training
batch, plan with the C++ planner and apply the plan; remove() gives the model back as it was.
"""
import inspect
import json
import warnings
import weakref

import torch

from .._errors import BadInput
from ._common import COMPILED, compiled, compiling

_enabled = weakref.WeakKeyDictionary()   # model -> its live Enabled / ReplayCallback


def default_loss(out):
    """The loss of a forward's output: `.loss` / ["loss"] (a Hugging Face ModelOutput, a
    Lightning training_step's dict) or the output itself when it is a scalar tensor; None
    otherwise."""
    if torch.is_tensor(out):
        return out if out.numel() == 1 else None
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    return loss if torch.is_tensor(loss) and loss.numel() == 1 else None


def _record_plan_apply(model, batch, step_loss, *, budget, activation_budget, segments, optimizer, planner,
                       check_scalars):
    """Record one step (step_loss(model, batch) -> scalar), plan it at `budget` /
    `activation_budget` (neither: the smallest feasible whole-step budget) and apply it.
    Returns (Applied, Plan, trace dict)."""
    from . import apply, plan, record_trace
    trace = record_trace(model, batch, step_loss, segments=segments, optimizer=optimizer, ops=planner == "ops")
    text = json.dumps(trace)
    if budget is None and activation_budget is None:   # the range only: its warnings come with the plan below
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            budget = plan(text, planner=planner).range.get("min_peak_bytes")
    p = plan(text, budget, activation_budget=activation_budget, planner=planner)
    return apply(model, p, optimizer=optimizer, check_scalars=check_scalars), p, trace


def _claim(model, owner):
    if model in _enabled:
        raise BadInput("ckptkit.replay: error: replay is already applied to this model (enable() or "
                       "ReplayCallback): remove() that handle first", None, "already applied")
    _enabled[model] = owner


class _Once:
    """What enable() and ReplayCallback share: the arguments, the handle of the applied plan
    (`applied`, None before the first training batch), `plan` and `trace` (dict) once recorded."""

    def _init(self, budget, activation_budget, segments, optimizer, planner, check_scalars):
        self.opts = dict(budget=budget, activation_budget=activation_budget, segments=segments,
                         planner=planner, check_scalars=check_scalars)
        self.optimizer = optimizer
        self.applied = self.plan = self.trace = None
        self.recording = False

    def _run(self, model, batch, step_loss, optimizer):
        self.recording = True
        try:
            self.applied, self.plan, self.trace = _record_plan_apply(
                model, batch, step_loss, optimizer=optimizer, **self.opts)
        finally:
            self.recording = False

    @property
    def recomputed(self):
        """The segments the plan in force recomputes ([] before the first training batch)."""
        return list(self.applied.recomputed) if self.applied is not None else []


class Enabled(_Once):
    """The handle enable() returns: `applied` (the Applied handle of the plan in force, None
    until the first training forward), `plan`, `trace`, `recomputed`; remove() (or leaving a
    `with` block) restores the model: its own forwards and no hook."""

    def __init__(self, model, budget, activation_budget, loss_fn, optimizer, segments, planner, check_scalars):
        if not isinstance(model, torch.nn.Module):
            raise BadInput(f"ckptkit.replay: error: enable() needs a torch.nn.Module, not {type(model).__name__}",
                           None, "not a module")
        if _is_lightning(model):
            raise BadInput("ckptkit.replay: error: a LightningModule trains through training_step, not its "
                           "forward: pass ckptkit.replay.ReplayCallback(budget=...) to the Trainer's callbacks",
                           None, "LightningModule")
        if compiled(model):
            raise BadInput(f"ckptkit.replay: error: enable(): {COMPILED}", None, "compiled model")
        if "with_kwargs" not in inspect.signature(torch.nn.Module.register_forward_pre_hook).parameters:
            raise BadInput("ckptkit.replay: error: enable() needs torch >= 2.0 (forward pre-hooks with keyword "
                           f"arguments); this is torch {torch.__version__}: use replay.record / plan / apply",
                           None, "torch too old")
        self._init(budget, activation_budget, segments, optimizer, planner, check_scalars)
        self.model, self.loss_fn = model, loss_fn
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            params = {}
        self.no_cache = "use_cache" in params   # Hugging Face: no KV cache in training steps
        _claim(model, self)
        self.hook = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, mod, args, kwargs):
        if self.recording or not (mod.training and torch.is_grad_enabled()):
            return None
        if self.no_cache and kwargs.get("use_cache") is None:
            kwargs = dict(kwargs, use_cache=False)
        if self.applied is None:
            if compiling():
                raise BadInput("ckptkit.replay: error: enable(): the first training forward runs under "
                               "torch.compile, and recording needs an eager step: run one training step before "
                               "torch.compile(model), or use replay.record / plan / apply and compile after apply()",
                               None, "compiling")
            on = [n for n, m in mod.named_modules() if getattr(m, "gradient_checkpointing", False) is True]
            if on:
                raise BadInput("ckptkit.replay: error: enable(): Hugging Face gradient checkpointing is on "
                               f"({on[0] or 'the model'}): it would recompute what the plan keeps; call "
                               "model.gradient_checkpointing_disable() (Trainer: gradient_checkpointing=False)",
                               None, "gradient checkpointing is on")
            loss_fn = self.loss_fn

            def step_loss(m, batch):
                out = m(*batch[0], **batch[1])
                loss = loss_fn(out) if loss_fn is not None else default_loss(out)
                if loss is None:
                    raise BadInput("ckptkit.replay: error: enable(): the model's output has no loss (a Hugging "
                                   "Face model called without labels=): pass loss_fn=lambda output: ...",
                                   None, "no loss")
                return loss
            self._run(mod, (tuple(args), dict(kwargs)), step_loss, self.optimizer)
        return tuple(args), kwargs

    def remove(self):
        """Give the model back: the hook and the applied plan's forwards removed (any order,
        twice is harmless)."""
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if self.applied is not None:
            self.applied.remove()
        if _enabled.get(self.model) is self:
            del _enabled[self.model]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def enable(model, budget=None, *, activation_budget=None, loss_fn=None, optimizer=None, segments=None,
           planner="joint", check_scalars=True):
    """Replay for a model whose training forward gives the loss, in one line (a Hugging Face
    PreTrainedModel: the counterpart of gradient_checkpointing_enable()); returns an Enabled
    handle (remove(), or use it as a context manager).

    The first training forward (model.training, gradients enabled) records one step of it
    (record(): the step is run and undone, so training stays bitwise what it was), plans
    it at `budget` / `activation_budget` (int bytes or a size string; neither: the smallest
    feasible budget) and applies the plan; that forward and every later one follow it.
    loss_fn(output) -> scalar tensor: the loss of the forward's output (default: output.loss,
    output["loss"], or the output when it is a scalar). optimizer: the loop's optimizer
    (its state and step temporaries are measured; None: Adam assumed). segments: as
    record()'s (None: the default segments: GPT-2 `transformer.wte, ..., transformer.h.0,
    ..., lm_head`, BERT `embeddings, encoder.layer.0, ..., pooler`). A forward accepting
    `use_cache` gets use_cache=False in training forwards unless the caller passes it (as
    Hugging Face's checkpointing does). Errors of record / plan / apply (RecordError,
    CheckFailed naming the smallest feasible budget, ...) are raised by that first forward.
    A model already enabled is refused (BadInput, "already applied").
    """
    return Enabled(model, budget, activation_budget, loss_fn, optimizer, segments, planner, check_scalars)


def _is_lightning(model):
    for mod in ("lightning.pytorch", "pytorch_lightning"):
        try:
            lm = __import__(mod, fromlist=["LightningModule"]).LightningModule
        except ImportError:
            continue
        if isinstance(model, lm):
            return True
    return False


def _lightning_callback_base():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError("ckptkit.replay.ReplayCallback needs lightning (pip install lightning)") from None
    return Callback


def make_callback_class():
    """The ReplayCallback class, built on the installed Lightning's Callback."""

    class ReplayCallback(_lightning_callback_base(), _Once):
        """A Lightning Callback: on the first training batch (on_train_batch_start) records
        pl_module.training_step(batch, batch_idx) as one step (the loss: the returned tensor or
        its "loss"; self.log is silenced while recording; the step is undone), plans it at
        `budget` / `activation_budget` (neither: the smallest feasible) with the Trainer's
        optimizer (when it has one) and applies the plan; every training step then follows
        it. teardown() (the end of fit) or remove() gives the module back."""

        def __init__(self, budget=None, *, activation_budget=None, segments=None, planner="joint",
                     check_scalars=True):
            super().__init__()
            self._init(budget, activation_budget, segments, None, planner, check_scalars)
            self.module = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.applied is not None or self.recording:
                return
            if self.module is not pl_module:
                _claim(pl_module, self)
                self.module = pl_module
            opts = list(getattr(trainer, "optimizers", []) or [])
            opt = opts[0] if len(opts) == 1 else None

            def step_loss(m, b):
                loss = default_loss(m.training_step(b, batch_idx))
                if loss is None:
                    raise BadInput("ckptkit.replay: error: ReplayCallback: training_step returned no loss "
                                   "(a tensor or a dict with 'loss')", None, "no loss")
                return loss
            had = {k: pl_module.__dict__[k] for k in ("log", "log_dict") if k in pl_module.__dict__}
            pl_module.__dict__.update({k: (lambda *a, **kw: None) for k in ("log", "log_dict")})
            try:
                self._run(pl_module, batch, step_loss, opt)
            finally:
                for k in ("log", "log_dict"):
                    del pl_module.__dict__[k]
                pl_module.__dict__.update(had)

        def teardown(self, trainer, pl_module, stage):
            self.remove()

        def remove(self):
            """Give the module back (its own forwards); the next fit records again."""
            if self.applied is not None:
                self.applied.remove()
                self.applied = None
            if self.module is not None and _enabled.get(self.module) is self:
                del _enabled[self.module]
            self.module = None

    return ReplayCallback
