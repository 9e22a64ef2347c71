"""Helpers shared by the recorder (_record.py) and the contract runtime (_runtime.py): byte
views and storages, the RNG streams (default CPU / CUDA generators and the model's private
torch.Generator attributes), sizes, the model fingerprint and the per-segment op hash."""
import contextlib
import itertools
import json
import numbers
import operator

import torch
import torch.nn as nn
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode

try:   # torch >= 2: the runtime's scalar tape at the torch-function level (FunctionTape)
    from torch.overrides import TorchFunctionMode
    FUNCTION_TAPE = int(torch.__version__.split(".")[0]) >= 2
except ImportError:   # pragma: no cover
    TorchFunctionMode, FUNCTION_TAPE = object, False

from .._errors import BadInput, CkptkitError

HASH_ALGORITHM = "xxh3-64"


class RecordError(BadInput):
    """A model or step the recorder cannot describe; one line ("ckptkit.replay: ..."),
    `reason` without the prefix (a BadInput, so a ValueError)."""

    def __init__(self, reason):
        super().__init__(f"ckptkit.replay: {reason}", None, reason)


def compiled(model):
    """Whether `model` is what torch.compile(module) returns (an OptimizedModule: the module
    itself is its _orig_mod)."""
    return type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module)


def compiling():
    """Whether this code runs while torch.compile traces it (False where torch has no compiler)."""
    c = getattr(torch, "compiler", None)
    if c is not None and hasattr(c, "is_compiling"):
        return bool(c.is_compiling())
    d = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return bool(d()) if d is not None else False


COMPILED = ("the model is torch.compile()'d: record / enable the module it wraps (model._orig_mod) and compile "
            "after the plan is applied (apply() then torch.compile works)")


class ContractError(CkptkitError, RuntimeError):
    """A replay contract cannot be honoured (a recomputed segment writes state or draws an RNG
    stream its contract does not cover, or the state it read is not what the plan recorded):
    one line "ckptkit.replay: segment NAME: ...", raised at the step where it happens;
    `segment` names the segment."""

    def __init__(self, segment, what):
        where = f"segment {segment}: " if segment is not None else ""
        super().__init__(f"ckptkit.replay: {where}{what}", None, what)
        self.segment = segment


class StalePlan(ContractError):
    """The plan was made for another model (fingerprint: parameter and buffer names, shapes,
    dtypes; checked by apply()) or another forward (a segment's op sequence hash, checked on the
    first training step): record and plan again."""


def byte_view(t):
    """Flat uint8 view of a tensor's contents (a contiguous copy only when it is not)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def digest(t):
    """XXH3-64 of a tensor's bytes, shape and dtype (host tensors hashed in place)."""
    h = xxhash.xxh3_64()
    b = byte_view(t)
    if b.device.type != "cpu":
        b = b.cpu()
    if b.numel():
        h.update(b.numpy())
    h.update(repr((tuple(t.shape), str(t.dtype))).encode())
    return h.intdigest()


def ptr(t):
    """The storage's data pointer (0: no storage to track, e.g. sparse / meta): the tensor's
    data pointer less its storage offset (t.storage() would build a Python storage object per
    call)."""
    try:
        return t.data_ptr() - t.storage_offset() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return 0


def storage_of(t):
    """(storage key, storage bytes): views share their base's storage, and a saved view keeps
    the whole storage alive."""
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()   # TypedStorage is deprecated in 2.x
    return st.data_ptr(), st.nbytes()


def tensors_in(obj):
    """The tensors of a (nested) value in order: tensors, lists, tuples, dicts, dataclasses and
    objects with tensor attributes (one level: model outputs such as HF ModelOutput)."""
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    if hasattr(obj, "__dataclass_fields__"):
        return [t for k in obj.__dataclass_fields__ for t in tensors_in(getattr(obj, k, None))]
    return []


def tensor_bytes(obj):
    """Total bytes of the tensors in a (nested) value."""
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def buffer_owner(model, fqn):
    """(module, attribute) owning buffer `fqn` (e.g. '2.cache')."""
    owner, _, attr = fqn.rpartition(".")
    return (model.get_submodule(owner) if owner else model), attr


def generator_names(model):
    """id(generator) -> name ("MODULE.ATTR", or "ATTR" on the root) of every torch.Generator
    that is an attribute of a module of the model; its RNG stream is "gen:" + name."""
    out = {}
    for mname, m in model.named_modules():
        for attr, v in vars(m).items():
            if isinstance(v, torch.Generator) and id(v) not in out:
                out[id(v)] = f"{mname}.{attr}" if mname else attr
    return out


def generator_by_stream(model, stream):
    """The generator of RNG stream "gen:NAME" (see generator_names)."""
    owner, _, attr = stream[len("gen:"):].rpartition(".")
    try:
        g = getattr(model.get_submodule(owner) if owner else model, attr)
    except AttributeError:
        g = None
    if not isinstance(g, torch.Generator):
        raise RecordError(f"RNG stream {stream}: no torch.Generator of that name in the model")
    return g


def cuda_streams():
    """"cuda:N" for every visible device when CUDA is initialised, else none."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def stream_state(model, stream):
    """State tensor of an RNG stream: "cpu", "cuda:N" or "gen:NAME"."""
    if stream == "cpu":
        return torch.get_rng_state()
    if stream.startswith("cuda:"):
        return torch.cuda.get_rng_state(int(stream[5:]))
    return generator_by_stream(model, stream).get_state()


def set_stream_state(model, stream, state):
    """Restore one RNG stream (see stream_state)."""
    if stream == "cpu":
        torch.set_rng_state(state)
    elif stream.startswith("cuda:"):
        torch.cuda.set_rng_state(state, int(stream[5:]))
    else:
        generator_by_stream(model, stream).set_state(state)


def all_streams(model, gen_names=None):
    gen_names = generator_names(model) if gen_names is None else gen_names
    return ["cpu"] + cuda_streams() + ["gen:" + n for n in gen_names.values()]


def rng_states(model, gen_names=None):
    """stream -> state of every stream (default CPU, CUDA defaults in use, model generators)."""
    return {st: stream_state(model, st) for st in all_streams(model, gen_names)}


def set_rng_states(model, states):
    for stream, st in states.items():
        set_stream_state(model, stream, st)


def parse_bytes(s):
    """A size in bytes: an int (or a float holding a whole number: 6.5e6), or a string '44GiB' / '1.5MiB' / '32GB' / '123' (replay-plan's
    units, any case, read by the same C++ function: _ckptkit.parse_bytes). ValueError for
    anything else."""
    if isinstance(s, bool):
        raise ValueError(f"not a size: {s!r}")
    if isinstance(s, float) and s.is_integer() and 0 <= s < 2.0 ** 63:
        s = int(s)   # 6.5e6
    if isinstance(s, int):
        if s < 0:
            raise ValueError(f"not a size: {s}")
        return s
    if isinstance(s, float):
        raise ValueError(f"not a size: {s!r} (a float must be a whole number of bytes)")
    if not isinstance(s, str):
        raise ValueError(f"not a size: {s!r}")
    from .. import _ckptkit
    try:
        return _ckptkit.parse_bytes(s.strip())
    except ValueError:
        raise ValueError(f"not a size: {s}") from None


def fingerprint_items(model):
    items = [["param", n, list(p.shape), str(p.dtype)] for n, p in model.named_parameters()]
    items += [["buffer", n, list(b.shape), str(b.dtype)] for n, b in model.named_buffers()]
    return items


def model_fingerprint(model):
    """{"hash", "params", "buffers"}: XXH3-64 of the compact JSON list [[kind, name, shape,
    dtype], ...] of every parameter then buffer, and the counts."""
    items = fingerprint_items(model)
    return {"hash": xxhash.xxh3_64_hexdigest(json.dumps(items, separators=(",", ":")).encode()),
            "params": sum(1 for i in items if i[0] == "param"),
            "buffers": sum(1 for i in items if i[0] == "buffer")}


def _scalar_sig(v):
    """What the op hash keeps of a non-tensor argument: bools, strings, dtypes and enums
    exactly; floats only as 'float' and integers and integer lists only as 'int' / their
    length (sizes and indices follow the batch; a float may be a Python scalar that changes
    every step, an annealed coefficient: the runtime checks those values per call, against the
    segment's own forward, where a segment is recomputed)."""
    if torch.is_tensor(v):
        return f"T{v.dtype}/{v.dim()}"
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return repr(v)
    if isinstance(v, float):
        return "float"
    if isinstance(v, int):
        return "int"
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return f"ints[{len(v)}]"
        return "[" + ",".join(_scalar_sig(x) for x in v) + "]"
    if isinstance(v, torch.Generator):
        return "gen"
    return type(v).__name__ + ":" + str(v)


def op_signature(func, args, kwargs):
    """One op of the ops hash: its name, its tensor arguments' dtypes and ranks, its other
    arguments as _scalar_sig keeps them."""
    parts = [str(func)] + [_scalar_sig(a) for a in args]
    parts += [f"{k}={_scalar_sig(v)}" for k, v in sorted((kwargs or {}).items())]
    return "|".join(parts)


class OpsHash:
    """The running ops hash of each segment: XXH3-64 of its forward's op signatures."""

    def __init__(self):
        self.h = {}

    # autograd's own aliases (a saved output is detached unless saved-tensor hooks are set)
    SKIP = frozenset({"aten.detach.default", "aten.alias.default"})

    def add(self, seg, func, args, kwargs):
        if str(func) in self.SKIP:
            return
        h = self.h.get(seg)
        if h is None:
            h = self.h[seg] = xxhash.xxh3_64()
        h.update(op_signature(func, args, kwargs).encode())
        h.update(b"\n")

    def hexdigest(self, seg):
        h = self.h.get(seg)
        return (h or xxhash.xxh3_64()).hexdigest()


# ---- Python-side scalars (issue 53.1)
_NUMBER = (int, float, bool)


def py_scalar_holders(module):
    """The dicts whose numeric entries a segment's forward may read or write outside torch: the
    instance __dict__ of every module of its subtree and the globals its modules' forward
    methods see (their Python modules, however imported; torch's own excluded). A step
    counter, an annealed coefficient, a module-level global."""
    out, seen = [], set()
    for m in module.modules():
        for d in (vars(m), getattr(getattr(type(m), "forward", None), "__globals__", None)):
            if d is not None and id(d) not in seen and not (d is not vars(m) and
                                                           d.get("__name__", "").startswith("torch.")):
                seen.add(id(d))
                out.append(d)
    return out


def py_scalars(holders, nones=False):
    """{(holder index, key): value} of every int / float / bool entry of the holders; with
    `nones`, the None entries too, so that set_py_scalars gives an attribute that was None and
    holds a number since (`self.k = None`, set in forward) back as None rather than removing it."""
    return {(i, k): v for i, d in enumerate(holders) for k, v in d.items()
            if type(v) in _NUMBER or (nones and v is None)}


def set_py_scalars(holders, values):
    """Put the holders' numeric entries back to `values` (py_scalars): numeric entries
    `values` has not are removed. Returns what it replaced ({(i, key): old value})."""
    undo = {}
    for (i, k) in py_scalars(holders).keys() - values.keys():
        undo[(i, k)] = holders[i].pop(k)
    for (i, k), v in values.items():
        old = holders[i].get(k, _MISSING)
        if old is not v:
            undo[(i, k)] = old
            holders[i][k] = v
    return undo


@contextlib.contextmanager
def py_scalars_as(holders, values):
    """The holders' numeric entries are `values` inside the block; afterwards every entry is as
    before it (what the block wrote undone, entries it set to other types too)."""
    before = py_scalars(holders, nones=True)
    undo = set_py_scalars(holders, values)
    try:
        yield
    finally:
        undo_py_scalars(holders, undo)
        set_py_scalars(holders, before)


_MISSING = object()


def undo_py_scalars(holders, undo):
    """Put back what set_py_scalars (or ScalarSnap.put) replaced: `undo` {(i, key): old value,
    _MISSING where there was none}."""
    for (i, k), v in undo.items():
        if v is _MISSING:
            holders[i].pop(k, None)
        else:
            holders[i][k] = v


def _value(v, found):
    """A non-tensor argument as the per-call tape compares it (tensors: None); appends to
    `found` when it holds a Python number."""
    t = type(v)
    if t in _WRAPPED:
        found.append(True)
        return v
    if t is list or t is tuple:
        return tuple(_value(x, found) for x in v)
    if isinstance(v, torch.Tensor):
        return None
    if t is dict:
        return tuple((k, _value(x, found)) for k, x in sorted(v.items()))
    if isinstance(v, torch.Generator):
        return "gen"
    return v


def _same(a, b):
    """Tape values equal (repr: NaN equals NaN)."""
    return a == b or repr(a) == repr(b)


_WRAPPED = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_SKIPPED = {}   # op -> str(op) in OpsHash.SKIP


class ScalarTape(TorchDispatchMode):
    """The non-tensor arguments of every aten op with a Python number among them (scalars,
    sizes, dims, flags) that a segment's forward runs, in order (`tape`); with `check` (the forward's tape) it compares the recompute's op by
    op instead and calls `mismatch(index, func, want, got)` at the first difference. With `ops`
    it also feeds an OpsHash under `name` (the first training forward's check)."""

    def __init__(self, check=None, mismatch=None, ops=None, name=None, cover=None):
        super().__init__()
        self.tape, self.check, self.mismatch, self.ops, self.name = [], check, mismatch, ops, name
        self.i = 0
        self.cover, self.uncovered = cover, []
        self.error = None

    def fail(self, func, want, got):
        """mismatch() for the current op; its error is kept in `error` too (code between the op
        and the caller, the TorchScript interpreter, may replace it with a bare RuntimeError)."""
        try:
            self.mismatch(self.i - 1, func, want, got)
        except BaseException as e:
            self.error = e
            raise

    def take(self, func, vals):
        """The forward: append `vals` (func, args, kwargs values) to the tape. The recompute:
        compare them with the forward's next entry, fail() at the first difference."""
        if self.check is None:
            self.tape.append(vals)
        else:
            want = self.check[self.i] if self.i < len(self.check) else None
            self.i += 1
            if want is None or want[0] != func or not (_same(want[1], vals[1]) and _same(want[2], vals[2])):
                self.fail(func, want, vals)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        skip = _SKIPPED.get(func)
        if skip is None:
            skip = _SKIPPED[func] = str(func) in OpsHash.SKIP
        if skip:
            if args and type(args[0]) in _WRAPPED:
                # torch 1.13 hands a mode a saved Python-scalar operand (a wrapped number, which
                # checkpoint's recompute detaches) as the number itself: its 0-dim tensor
                return torch.tensor(args[0], dtype=_WRAPPED[type(args[0])])
            return func(*args, **kwargs)
        if self.ops is not None:
            self.ops.add(self.name, func, args, kwargs)
        found = []
        vals = (func, _value(args, found), _value(kwargs, found) if kwargs else ())
        if not found:   # no Python number (the casts autocast caches run in one pass and not the other)
            return func(*args, **kwargs)
        if self.cover is not None and not self.cover.depth:
            self.uncovered.append(str(func))
        self.take(func, vals)
        return func(*args, **kwargs)


def fast_digest(t):
    """XXH3-64 of a tensor's bytes alone (host tensors read in place; see digest): for comparing
    one tensor object with itself, as the runtime's watch does."""
    if t.device.type == "cpu" and t.is_contiguous():
        try:
            return xxhash.xxh3_64_intdigest(t.detach().numpy().reshape(-1).view("u1").data)
        except (TypeError, RuntimeError, ValueError):
            pass
    return digest(t)


def _getter(keys):
    """A function giving the tuple of a dict's values at `keys` (operator.itemgetter, C speed)."""
    if len(keys) > 1:
        return operator.itemgetter(*keys)
    if keys:
        k = keys[0]
        return lambda d: (d[k],)
    return lambda d: ()


class ScalarSnap:
    """Snapshots of the numeric entries of a segment's Python-scalar holders
    (py_scalar_holders) at C speed, for the runtime. take() reads the entries that held a
    number or None when the holders' keys last changed (itemgetters); two snapshots are
    `same()` when taken under the same layout and every such entry is the same object. Only
    where they differ does the runtime go through numeric() and set_py_scalars, so the common
    step, where nothing changed, costs no Python per entry. A snapshot holds numbers and None
    only (an entry that now holds anything else is kept as a marker). Not seen: an entry that
    held something else (a tensor, a string) when the keys last changed and holds a number now."""

    _OTHER = object()

    def __init__(self, holders):
        self.holders = holders
        self.refresh()

    def refresh(self):
        self.sizes = [len(d) for d in self.holders]
        cand = [tuple(k for k, v in d.items() if v is None or type(v) in _NUMBER) for d in self.holders]
        self.getters = [_getter(k) for k in cand]
        self.layout = tuple((i, k) for i, ks in enumerate(cand) for k in ks)
        self.keysets = [frozenset(d) for d in self.holders]

    def take(self):
        """(layout, the values of the entries that may hold a number)."""
        try:
            if list(map(len, self.holders)) != self.sizes:
                raise KeyError
            vals = tuple(itertools.chain.from_iterable([g(d) for g, d in zip(self.getters, self.holders)]))
        except KeyError:   # keys added or removed
            self.refresh()
            vals = tuple(itertools.chain.from_iterable([g(d) for g, d in zip(self.getters, self.holders)]))
        if not all(map(_NUMBER_OR_NONE.__contains__, map(type, vals))):
            vals = tuple(v if type(v) in _NUMBER_OR_NONE else self._OTHER for v in vals)
        return self.layout, vals, self.keysets

    def put(self, snap):
        """Make the holders' entries the snapshot's (numbers and None; numeric entries whose key
        did not exist then are removed); returns what it replaced ({(i, key): old value or
        _MISSING}), as set_py_scalars."""
        layout, vals, keysets = snap
        undo = {}
        for (i, k), v in zip(layout, vals):
            if v is not self._OTHER:
                old = self.holders[i].get(k, _MISSING)
                if old is not v:
                    undo[(i, k)] = old
                    self.holders[i][k] = v
        for (i, k) in py_scalars(self.holders):
            if k not in keysets[i]:
                undo[(i, k)] = self.holders[i].pop(k)
        return undo

    @staticmethod
    def same(a, b):
        """Every entry the same object, under the same layout."""
        return a[0] is b[0] and all(map(operator.is_, a[1], b[1]))

    @staticmethod
    def numeric(snap):
        """The snapshot's numbers as py_scalars gives them: {(holder index, key): value}."""
        return {p: v for p, v in zip(snap[0], snap[1]) if type(v) in _NUMBER}


_NUMBER_OR_NONE = frozenset((int, float, bool, type(None)))


def _fvalue(v, found):
    """A torch function's non-tensor argument as the FunctionTape compares it (tensors: None);
    appends to `found` when it holds a Python number (numbers in lists, tuples, torch.Size,
    dicts and slices included)."""
    t = type(v)
    if t in _WRAPPED:
        found.append(True)
        return v
    if t is list or t is tuple:
        return tuple(_fvalue(x, found) for x in v)
    if v is None or t is str:
        return v
    if isinstance(v, torch.Tensor):
        return None
    if t is slice:
        return ("slice", _fvalue(v.start, found), _fvalue(v.stop, found), _fvalue(v.step, found))
    if isinstance(v, tuple):
        return tuple(_fvalue(x, found) for x in v)
    if t is dict:
        return tuple((k, _fvalue(x, found)) for k, x in sorted(v.items()))
    if isinstance(v, torch.Generator):
        return "gen"
    if isinstance(v, numbers.Number):
        found.append(True)
    return v


_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _fargs(args):
    """(_fvalue of each argument as a tuple, whether one holds a Python number): _fvalue with
    the common flat cases (numbers, tensors, None, strings) inline."""
    out, found = [], False
    for v in args:
        t = type(v)
        if t in _WRAPPED:
            found = True
            out.append(v)
        elif t in _TENSOR_TYPES:
            out.append(None)
        elif v is None or t is str:
            out.append(v)
        else:
            f = []
            out.append(_fvalue(v, f))
            found = found or bool(f)
    return tuple(out), found


def function_name(func):
    """A torch function as the FunctionTape's messages name it: "aten.mul.Tensor" (torch.ops),
    "Tensor.mul", "torch.nn.functional.dropout"."""
    if isinstance(func, torch._ops.OpOverload if hasattr(torch, "_ops") else ()):
        return str(func)
    q = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    if q.startswith("TensorBase.") or q.startswith("Tensor."):
        return "Tensor." + q.split(".", 1)[1]
    mod = getattr(func, "__module__", None)
    if q.startswith("_VariableFunctionsClass."):
        return "torch." + q.split(".", 1)[1]
    return f"{mod}.{q}" if mod else q


class FunctionTape(TorchFunctionMode):
    """The runtime's scalar tape at the torch-function level (torch >= 2): the non-tensor
    arguments of every torch function (torch.*, Tensor methods, torch.nn.functional, torch.ops)
    with a Python number among them that a segment's forward calls, in order (`tape`); with
    `check` (the forward's tape) it compares the recompute's call by call and calls
    `mismatch(index, func, want, got)` at the first difference. Functions called inside a
    taped one are not seen (one call for F.linear, where ScalarTape sees its aten ops), so it
    costs a fraction of ScalarTape. With `cover=True` it records nothing and counts how deep
    the forward is inside taped calls (`depth`), so a ScalarTape beside it can tell which aten
    ops with Python numbers run outside any (a C++ extension's: the runtime then keeps
    ScalarTape for that segment)."""

    def __init__(self, check=None, mismatch=None, cover=False):
        super().__init__()
        self.tape, self.check, self.mismatch, self.cover = [], check, mismatch, cover
        self.i = self.depth = 0
        self.error = None

    fail = ScalarTape.fail
    take = ScalarTape.take

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.cover:
            self.depth += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.depth -= 1
        a, found = _fargs(args)
        if kwargs:
            k, kfound = _fargs(kwargs[x] for x in sorted(kwargs))
            k, found = tuple(zip(sorted(kwargs), k)), found or kfound
        else:
            k = ()
        if found:
            self.take(func, (func, a, k))
        return func(*args, **kwargs)
