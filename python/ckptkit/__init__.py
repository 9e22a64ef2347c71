"""ckptkit from Python: compressed checkpoints one line away from torch.save / torch.load.

    import ckptkit
    ckptkit.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ckpt.ckz.h5")
    state = ckptkit.load("ckpt.ckz.h5")          # what torch.load gives for torch.save(obj)

`save` serialises the object as torch.save does and compresses it in memory (no full-size
file), `load` decodes a container in memory and torch.loads it (a plain torch or
safetensors file loads as well); `compress`, `verify` and `restore` are the CLI's jobs for
files and folders, with the same reports. Everything runs in the same C++ library as the
tools (lib/ckpt), with the GIL released. Errors: BadInput (a ValueError) and CheckFailed,
with the CLI's one-line messages.
"""
import concurrent.futures
import io
import json
import math
import os
import pickle
import threading
import warnings

from . import _ckptkit
from . import _device
from . import _safetensors
from . import _torch
from ._errors import BadInput, CheckFailed, CkptkitError, CkptkitWarning

__all__ = ["save", "load", "compress", "verify", "restore", "release_staging", "Report", "BadInput", "CheckFailed",
           "CkptkitError", "CkptkitWarning", "__version__"]
__version__ = _ckptkit.__version__


class Report(dict):
    """A job's report: the CLI's --json object as a dict (keys also as attributes:
    r.moment_reduction, r.escapes, r.moment_bytes_fp32, r.moment_bytes_out, r.max_bound_lr,
    r.ok, r.tensors, r.horizon, ...), its table (`r.table`, also str(r)) and the library's
    warning lines (`r.warnings`)."""

    def __init__(self, data, table="", warnings_=()):
        super().__init__(data)
        self.table = table
        self.warnings = list(warnings_)

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __str__(self):
        return self.table or json.dumps(self)


def _report(json_text, table, lines):
    return Report(json.loads(json_text), table, lines)


def _warn(rep):
    """The library's warning lines as CkptkitWarning, attributed to the caller of the public
    function that calls this."""
    for line in rep.warnings:
        warnings.warn(line, CkptkitWarning, stacklevel=3)
    return rep


# ------------------------------------------------------------------------------ options

_CODECS = ("vlog", "log8", "bf16", "blockwise8")
_OPTIMIZERS = ("auto", "adam", "adamw")
_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")


def _bad(tool, what, file=None):
    msg = f"{tool}: error: {file}: {what}" if file else f"{tool}: error: {what}"
    return BadInput(msg, file, what)


def _path(p, what="path"):
    if isinstance(p, (str, os.PathLike)):
        return os.fspath(p)
    raise TypeError(f"{what} must be a str or os.PathLike, not {type(p).__name__}")


def _threads(tool, threads):
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise _bad(tool, f"--threads: {threads!r} is not a count in [1, 1024]")
    return threads


def _number(tool, flag, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(tool, f"--{flag}: not a number: {v!r}")
    return float(v)


def _compress_opts(tool, tolerance=0.01, grad_bound=1.0, codec="vlog", optimizer="auto", horizon="all",
                   threads=None, param_bound=None, amsgrad=None, maximize=None, chunk=None, strict=False,
                   device="auto", force=False, dcp_unit_mib=256, **hyper):
    """The options of ckpt-compress, checked as its flags are; a dict for the bindings."""
    unknown = [k for k in hyper if k not in _HYPER]
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    tol = _number(tool, "tolerance", tolerance)
    if not 0 < tol <= 1:
        raise _bad(tool, f"--tolerance: {tolerance} is outside (0, 1] (units of lr)")
    if isinstance(grad_bound, str) and grad_bound.lower() == "inf":
        grad_bound = math.inf
    g = _number(tool, "grad-bound", grad_bound)
    if not g > 0:
        raise _bad(tool, f"--grad-bound: not a positive number or inf: {grad_bound}")
    if codec not in _CODECS:
        raise _bad(tool, f"--codec: {codec} not in {{{','.join(_CODECS)}}}")
    if optimizer not in _OPTIMIZERS:
        raise _bad(tool, f"--optimizer: {optimizer} not in {{{','.join(_OPTIMIZERS)}}}")
    if horizon not in ("all", 1, "1"):
        raise _bad(tool, f"--horizon: {horizon} not in {{all,1}}")
    if device not in ("cpu", "cuda", "auto"):
        raise _bad(tool, f"--device: {device} not in {{cpu,cuda,auto}}")
    o = {"tolerance": tol, "grad_bound": g, "codec": codec, "optimizer": optimizer,
         "horizon": 0 if horizon == "all" else 1, "threads": _threads(tool, threads),
         "strict": bool(strict), "device": device, "force": bool(force), "dcp_unit_mib": int(dcp_unit_mib)}
    if param_bound is not None:
        pb = _number(tool, "param-bound", param_bound)
        if not 0 <= pb < math.inf:
            raise _bad(tool, f"--param-bound: {param_bound} is not a finite number >= 0")
        o["param_bound"] = pb
    for k, v in hyper.items():
        if v is not None:
            o[k] = _number(tool, k.replace("_", "-"), v)
    for k, v in (("amsgrad", amsgrad), ("maximize", maximize)):
        if v is not None:
            o[k] = bool(v)
    if chunk is not None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 64 <= chunk <= 1 << 30:
            raise _bad(tool, f"--chunk: {chunk!r} is not in [64, 2^30]")
        o["chunk"] = chunk
    return o


# ------------------------------------------------------------------------------ the CLI's jobs

def _checked(rep, tool, file, ok=None, first=""):
    """Raise CheckFailed (with the report) when the job's checks failed, as the CLI exits 1."""
    if ok is None:
        ok = rep.get("ok", True)
    if not ok:
        what = first or (rep.get("failures") or ["a check failed"])[0]
        raise CheckFailed(f"{tool}: check failed: {file}: {what}", file, what, rep)
    return rep


def compress(src, dst, **opts):
    """ckpt-compress SRC -o DST: a checkpoint file into a container, or a checkpoint folder
    into a compressed folder. Options as the flags: tolerance=0.01, grad_bound=1.0 (or
    "inf"), codec="vlog", optimizer="auto", horizon="all" (or 1), threads=None (all cores),
    force=False, param_bound, lr, beta1, beta2, eps, weight_decay, amsgrad, maximize, strict,
    chunk, device, dcp_unit_mib. Returns the Report (--json's fields); BadInput on bad input,
    CheckFailed when a certificate exceeds the tolerance."""
    src, dst = _path(src, "src"), _path(dst, "dst")
    o = _compress_opts("ckpt-compress", **opts)
    rep = _warn(_report(*_ckptkit.compress(src, dst, o)))
    return _checked(rep, "ckpt-compress", src)


def verify(path, original=None, *, grid=257, strict=False, threads=None):
    """ckpt-verify PATH [--original ORIGINAL] (a container or a compressed folder). Returns the
    Report when every check holds; raises CheckFailed (its `report` lists every failure)
    when one fails, BadInput when PATH cannot be read as a container."""
    path = _path(path)
    original = None if original is None else _path(original, "original")
    if isinstance(grid, bool) or not isinstance(grid, int) or not 5 <= grid <= 1 << 20:
        raise _bad("ckpt-verify", f"--grid: {grid!r} is not in [5, 1048576]")
    o = {"grid": grid, "strict": bool(strict), "threads": _threads("ckpt-verify", threads)}
    js, table, lines, ok, first = _ckptkit.verify(path, original, o)
    return _checked(_warn(_report(js, table, lines)), "ckpt-verify", path, ok, first)


def restore(src, dst, *, force=False, threads=None, device="auto"):
    """ckpt-restore SRC -o DST: the checkpoint (its source format: name DST .pt or
    .safetensors as the source) or the whole folder back. Returns the Report."""
    src, dst = _path(src, "src"), _path(dst, "dst")
    if device not in ("cpu", "cuda", "auto"):
        raise _bad("ckpt-restore", f"--device: {device} not in {{cpu,cuda,auto}}")
    o = {"force": bool(force), "threads": _threads("ckpt-restore", threads), "device": device}
    return _warn(_report(*_ckptkit.restore(src, dst, o)))


# ------------------------------------------------------------------------------ save

# Storages of at least this many bytes are read by the encoder where the tensors are (save)
# instead of being kept as the copies torch's zip writer hands to write().
_BORROW_MIN = 64 * 1024


class _Staging:
    """Host memory a background save copies the storages into (its snapshot), kept for the
    next background save when this one is done, as DCP's async_save keeps its staging
    buffers: the copy then costs no page faults. Arenas of 64 MiB (or one record's size);
    ckptkit.release_staging() frees what is kept."""

    ARENA = 64 << 20

    def __init__(self):
        self.free = []
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            fits = [i for i, a in enumerate(self.free) if len(a) >= n]
            if fits:
                return self.free.pop(min(fits, key=lambda i: len(self.free[i])))
        return bytearray(max(n, self.ARENA))

    def give(self, arenas):
        with self.lock:
            self.free.extend(arenas)

    def clear(self):
        with self.lock:
            self.free.clear()


_staging = _Staging()


def release_staging():
    """Free the host memory kept for background saves (the size of the last checkpoint
    saved in the background); the next background save allocates it again."""
    _staging.clear()


class _Sink:
    """The file torch's zip writer (torch._C.PyTorchFileWriter) writes into. torch 1.13 hands
    write() memoryviews of its own buffers, valid during the call only: every write is
    copied (small ones gathered in bytearrays), except a storage record's data, announced by
    _Writer.write_record with its address, which is borrowed as (address, size) when
    `borrow` (after checking the view is that memory, or holds the same bytes); a
    background save copies it too (its snapshot). A storage off the host (_device) becomes
    a (fill, size) part, or a background save's copy made in pieces; its CRC-32 goes into
    its local header or data descriptor as they pass, and into the central directory in
    end(), as does torch 2.x's serialization_id, a fold of every record's CRC-32."""

    def __init__(self, borrow):
        self.borrow = borrow
        self.parts = []          # bytes-like objects and (address, size) tuples, in order
        self.small = bytearray()
        self.pending = None      # (address, size) of the record being written
        self.size = 0
        self.borrowed = 0        # bytes read where the tensors are
        self.arenas = []         # staging arenas holding the copies (background saves)
        self.arena_used = 0
        self.crcs = {}           # local header offset -> CRC-32 of each storage off the host
        self.descriptor = None   # the CRC-32 for the data descriptor written next
        self.error = None        # the first exception in write() (raised after torch's writer is done)
        # torch 2.x's serialization_id CRC fold (as torch saw the CRCs, as they are), before the
        # last data descriptor (the serialization_id record's own, the last record) and after it
        self.combined = self.folded = (0, 0)

    def _staged(self, n):
        """n bytes of staging memory (a background save's snapshot)."""
        if not self.arenas or len(self.arenas[-1]) - self.arena_used < n:
            self.arenas.append(_staging.take(n))
            self.arena_used = 0
        mv = memoryview(self.arenas[-1])[self.arena_used:self.arena_used + n]
        self.arena_used += n
        return mv

    def _copy(self, b):
        """A copy of the large write `b` (torch's view, valid during the call only)."""
        if self.borrow:
            return bytes(b)
        mv = self._staged(len(b))
        mv[:] = b
        return mv

    def _device(self, rec):
        """The data of a storage off the host (its write: the zero mapping): read in pieces."""
        header, at = _device.local_crc_field(self.small)
        header += self.size - len(self.small)   # its offset in the file
        self._flush_small()
        head = self.parts[-1]
        if self.borrow:
            crc = rec.crc32()
            self.parts.append((rec.fill, rec.n))
        else:
            mv = self._staged(rec.n)
            crc = rec.copy_into(mv)
            self.parts.append(mv)
        if at is None:
            self.descriptor = crc
        else:
            head[at:at + 4] = crc.to_bytes(4, "little")
        self.crcs[header] = crc

    def _flush_small(self):
        if self.small:
            self.parts.append(self.small)
            self.small = bytearray()

    def write(self, b):
        """torch's writer's write: never raises (an exception there leaves torch's writer
        unable to finish, and its destructor then aborts the process): the first error is
        kept, later bytes are dropped, and _serialize raises it once torch is done."""
        if self.error is None:
            try:
                self._write(b)
            except BaseException as e:  # noqa: BLE001 - re-raised by _serialize
                self.error = e
        return len(b)

    def _write(self, b):
        n = len(b)
        p = self.pending
        if isinstance(p, _device.DeviceRecord):   # its data: the zero mapping's bytes
            if n == p.n and _ckptkit.same_bytes(p.addr, b):
                self.pending = None
                self._device(p)
                self.size += n
                return
            p = None
        if p is not None and n == p[1] and n >= _BORROW_MIN:
            self.pending = None
            self._flush_small()
            if self.borrow and _ckptkit.same_bytes(p[0], b):
                self.parts.append((p[0], n))
                self.borrowed += n
            else:
                self.parts.append(self._copy(b))
        elif n >= _BORROW_MIN:
            self._flush_small()
            self.parts.append(self._copy(b))
        else:
            start = len(self.small)
            self.small += b
            seen = _device.descriptor_crc(b)
            if self.descriptor is not None:
                at = _device.descriptor_crc_field(self.small, start)
                self.small[at:at + 4] = self.descriptor.to_bytes(4, "little")
                seen = (seen, self.descriptor)
                self.descriptor = None
            elif seen is not None:
                seen = (seen, seen)
            if seen is not None:
                self.combined = self.folded
                self.folded = tuple(_device.hash_combine(c, v) for c, v in zip(self.folded, seen))
        self.size += n

    def flush(self):
        pass

    def end(self):
        """After torch's writer is done: the storages off the host get their CRC-32 in the
        central directory; the first error of write() is raised."""
        if self.error is not None:
            raise self.error
        self._flush_small()
        if self.crcs:
            tail, tail_start = self.parts[-1], self.size - len(self.parts[-1])
            _device.fix_serialization_id(tail, tail_start, *self.combined, self.crcs)
            _device.fix_central_directory(tail, tail_start, self.crcs)
            self.crcs = {}

    def finish(self):
        self._flush_small()
        return self.parts


def _serialize(obj, borrow):
    """The bytes torch.save(obj, buffer) writes, as parts (see _Sink): torch.save itself runs
    (python/ckptkit/_torch.py). With `borrow`, storages on the host of >= 64 KiB are not
    copied where this torch lets the sink know them: the parts point at the tensors' memory;
    storages off the host (CUDA) are read in pieces as the compressor asks (_device)."""
    sink = _Sink(borrow)

    def on_record(data, size):
        rec, data = _device.take(data)
        if rec is not None:
            sink.pending = rec
        else:
            addr = _torch.record_address(data)
            if addr is not None:
                sink.pending = (addr, size)
        return data

    def on_done():
        sink.pending = None

    with _device.cpu_hook():
        _torch.serialize(obj, sink, on_record, on_done)
    sink.end()
    return sink


def _save_parts(parts, name, path, opts):
    return _report(*_ckptkit.compress_memory(name, parts, path, opts, "ckptkit.save"))


def _save_staged(sink, name, path, opts):
    """A background save's job: compress the snapshot, then give its staging memory back."""
    parts = sink.finish()
    try:
        return _warn(_save_parts(parts, name, path, opts))
    finally:
        for p in parts:
            if isinstance(p, memoryview):
                p.release()
        del parts
        _staging.give(sink.arenas)


_executor = None
_executor_lock = threading.Lock()


def _background():
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptkit-save")
        return _executor


def save(obj, path, *, tolerance=0.01, grad_bound=1.0, optimizer="auto", codec="vlog", horizon="all",
         threads=None, background=False, **hyper):
    """torch.save(obj, path), compressed: the object serialised as torch.save writes it
    (zip format, to a buffer) and its Adam/AdamW moments coded into the container `path`
    (written under a temporary name, verified, renamed; an existing file is replaced). No
    file of the full checkpoint is written. Returns the Report.

    Memory: the storages of host tensors (>= 64 KiB) are read where they are; what is kept
    is the pickle, the zip records' headers and the storages under 64 KiB. Storages of CUDA
    tensors are never copied whole: they are read in pieces of 64 MiB as the compressor asks
    (once more before, for their zip CRC-32), so a checkpoint on the GPU takes no host copy.

    background=True: returns a concurrent.futures.Future of the Report once the object is
    serialised, synchronously, into host staging memory (a snapshot: one full copy of the
    serialised checkpoint, CUDA storages copied into it in pieces of 64 MiB, kept for the next background save as DCP's async_save keeps its
    staging buffers; ckptkit.release_staging() frees it), so training may step the optimizer
    meanwhile; compression runs in one worker thread (saves queue in order) on half the
    cores unless `threads` says otherwise. The container is the same bytes as a synchronous
    save's.

    Options as ckpt-compress's flags; **hyper: lr, beta1, beta2, eps, weight_decay, amsgrad,
    maximize (fill in what the file does not state), param_bound, strict, chunk, device."""
    path = _path(path)
    opts = _compress_opts("ckptkit.save", tolerance=tolerance, grad_bound=grad_bound, optimizer=optimizer,
                          codec=codec, horizon=horizon, threads=threads, force=True, **hyper)
    name = "torch.save(obj)"   # the source's name in errors and in the manifest (not the path: same bytes anywhere)
    if not background:
        sink = _serialize(obj, borrow=True)
        return _warn(_save_parts(sink.finish(), name, path, opts))
    if threads is None:   # leave training half the cores (any count gives the same bytes)
        opts["threads"] = max(1, (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2) // 2)
    sink = _serialize(obj, borrow=False)
    return _background().submit(_save_staged, sink, name, path, opts)


# ------------------------------------------------------------------------------ load

def _load_failed(e, name):
    what = f"torch.load failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return _bad("ckptkit.load", what, name)


def _torch_load(f, name, map_location, weights_only, mmap):
    """torch.load(f) of a plain file; any failure is BadInput."""
    try:
        return _torch.load_file(f, map_location, weights_only, mmap)
    except Exception as e:  # noqa: BLE001 - any failure of torch.load is bad input
        raise _load_failed(e, name) from None


def _torch_load_memory(raw, name, map_location, weights_only, mmap):
    """torch.load of a torch zip restored into `raw` (a _ckptkit.Buffer), without a copy
    where this torch allows (python/ckptkit/_torch.py); any failure is BadInput."""
    try:
        return _torch.load_restored(raw, map_location, weights_only, mmap)
    except Exception as e:  # noqa: BLE001 - any failure of torch's unpickler is bad input
        raise _load_failed(e, name) from None


def _safetensors_dict(raw, name, map_location):
    tensors, _meta = _safetensors.parse(raw, name)
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        tensors.update((k, v.to(map_location)) for k, v in tensors.items())
    return tensors


def load(path, map_location=None, weights_only=None, mmap=None):
    """torch.load(path) for a ckptkit container (decoded in memory: no file) or a plain
    torch / safetensors file, so switching is one line. Returns what torch.load returns for
    the restored checkpoint, with map_location, weights_only and mmap as this torch defines
    them (weights_only=None: torch's default, True from torch 2.6 on; False on 1.13); a
    safetensors checkpoint gives a dict name -> tensor.

    Memory: a container is restored into one buffer (a memfd) and the tensors of a torch zip
    are its pages (torch >= 2.1: torch.load(mmap=True) of it, unless mmap=False asks torch
    for copies; 1.13: views of it): no second copy; the buffer is freed when the last tensor
    is. Such tensors cannot be resized (resize_), as mmap-ed ones.

    Before torch.load sees any byte, the checkpoint is parsed by ckptkit's reader: a pickle
    naming a global that runs code (os, subprocess, eval, ...) raises BadInput and nothing
    is run; weights_only accepts only torch.load(weights_only=True)'s globals (torch 2.x:
    checked by torch's own unpickler, with what add_safe_globals allows)."""
    path = _path(path)
    if weights_only is None:
        weights_only = None if _torch.has_mmap() else False
    # torch 2.x checks weights_only itself (its allowlist, add_safe_globals); 1.13's reader: ours
    strict = bool(weights_only) and not _torch.has_mmap()
    if os.path.isdir(path):
        raise _bad("ckptkit.load", "is a folder; ckptkit.restore(folder, out_folder) restores folders", path)
    if _ckptkit.is_container(path):
        raw, _js, _table, _lines = _ckptkit.restore_bytes(path, {"threads": 0}, "ckptkit.load")
        fmt = _ckptkit.check_checkpoint([raw], strict, "ckptkit.load")
        if fmt == "safetensors":
            return _safetensors_dict(raw, path, map_location)
        if fmt == "torch-zip":
            return _torch_load_memory(raw, path, map_location, weights_only, mmap)
        return _torch_load(_torch.file_object(raw), path, map_location, weights_only, mmap)
    fmt = _ckptkit.check_checkpoint(path, strict, "ckptkit.load")
    if fmt == "safetensors":
        with open(path, "rb") as f:
            return _safetensors_dict(f.read(), path, map_location)
    return _torch_load(path, path, map_location, weights_only, mmap)
