"""ckptkit from Python: compressed checkpoints one line away from torch.save / torch.load.

    import ckptkit
    ckptkit.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "ckpt.ckz.h5")
    state = ckptkit.load("ckpt.ckz.h5")          # what torch.load gives for torch.save(obj)

`save` serialises the object as torch.save does and compresses it in memory (no full-size
file), `load` decodes a container in memory and torch.loads it (a plain torch or
safetensors file loads as well); `compress`, `verify` and `restore` are the CLI's jobs for
files and folders, with the same reports. Everything runs in the same C++ library as the
tools (lib/ckpt), with the GIL released. Errors: BadInput (a ValueError) and CheckFailed,
with the CLI's one-line messages; path mistakes are also the OSError subclass Python users
catch (FileNotFound is a FileNotFoundError, ...). `latest(folder)` and save's `keep_last`
serve a training loop's checkpoint folder; the logger "ckptkit" gets INFO records at the
start and end of each call (and `progress=` a callable, the same events).
"""
import concurrent.futures
import io
import json
import logging
import math
import mmap
import operator
import os
import re
import pickle
import shutil
import tempfile
import threading
import time
import warnings

from . import _ckptkit
from . import _device
from . import _loop
from . import _paths
from . import _safetensors
from . import _torch
from ._errors import (BadInput, CheckFailed, CkptkitError, CkptkitWarning, FileNotFound, IsADirectory,
                      NotADirectory, OSBadInput, PermissionDenied)
from ._loop import latest

__all__ = ["save", "load", "compress", "verify", "restore", "latest", "release_staging", "Report", "BadInput",
           "CheckFailed", "CkptkitError", "CkptkitWarning", "FileNotFound", "PermissionDenied", "IsADirectory",
           "NotADirectory", "OSBadInput", "__version__"]
__version__ = _ckptkit.__version__

#: INFO records at the start and the end of each save, load, compress, verify and restore
#: (sizes, seconds; the event dict also as the record's attribute `ckptkit`)
_log = logging.getLogger("ckptkit")


class Report(dict):
    """A job's report: the CLI's --json object as a dict (keys also as attributes:
    r.moment_reduction, r.escapes, r.moment_bytes_fp32, r.moment_bytes_out, r.max_bound_lr,
    r.ok, r.tensors, r.horizon, ...), the library's warning lines (`r.warnings`), a short
    summary (`str(r)`, `r.summary()`: what was coded, the reduction, escapes, max bound, what
    was kept exact and why) and the CLI's per-tensor table (`r.table`: one line per tensor)."""

    def __init__(self, data, table="", warnings_=()):
        super().__init__(data)
        self.table = table
        self.warnings = list(warnings_)

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def summary(self):
        """A few lines whatever the model's size (report.table has one line per tensor)."""
        return _summary(self)

    def __str__(self):
        return self.summary()


def _size(n):
    """n bytes, short: 512 B, 1.5 KiB, 3.2 MiB, 7.0 GiB."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _plural(n, word):
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _summary(r):
    """Report.summary(): the head line, what was coded, what was kept exact (per reason),
    what moment_reduction counts when states were kept exact, the file sizes."""
    tool = r.get("tool", "ckptkit")
    where = str(r.get("input", ""))
    if r.get("output") and tool != "ckpt-verify":
        where += f" -> {r['output']}"
    elif r.get("original"):
        where += f" (original: {r['original']})"
    lines = [f"{tool}: {where}: {'ok' if r.get('ok', True) else 'FAILED: ' + '; '.join(r.get('failures', [])[:2])}"]
    if tool == "ckpt-restore":
        lines.append(f"restored {r.get('file_bytes_out', 0):,} bytes from a {r.get('file_bytes_in', 0):,}-byte container")
    else:
        if "files" in r:
            lines.append(f"folder: {_plural(r.get('file_count', 0), 'file')}, "
                         f"{_plural(r.get('container_count', 0), 'container')} (the others copied as they are)")
        rows = r.get("tensors")
        coded = [t for t in rows if not t.get("note")] if rows is not None else None
        kept = [t for t in rows if t.get("note")] if rows is not None else []
        if coded is None:   # a folder: the totals
            values, fp32, out, esc = (r.get(k, 0) for k in ("moment_values", "moment_bytes_fp32", "moment_bytes_out", "escapes"))
            ntext = f"{values:,} moment values"
        else:
            values = sum(t["values"] for t in coded)
            fp32 = sum(t["moment_bytes_fp32"] for t in coded)
            out = sum(t["moment_bytes_out"] for t in coded)
            esc = sum(t["escapes"] for t in coded)
            ntext = f"{_plural(len(coded), 'tensor')}, {values:,} moment values"
        if values:
            how = ", ".join(f for f in (r.get("codec"),
                                        r.get("tolerance") is not None and f"tolerance {r.get('tolerance')} lr",
                                        r.get("horizon") is not None and f"horizon {r.get('horizon')}") if f)
            lines.append(f"coded: {ntext}{f' ({how})' if how else ''}: "
                         f"{_size(fp32)} as fp32 -> {_size(out)}, {1 - out / fp32 if fp32 else 0:.1%} smaller; "
                         f"escapes {esc:,} ({esc / values:.3%}); max bound {r.get('max_bound_lr', 0):.3g} lr")
        elif kept:
            lines.append("coded: nothing (no Adam/AdamW moments that can be coded)")
        else:
            lines.append("coded: nothing: no optimizer state; the checkpoint is stored exactly")
        groups = {}
        for t in kept:
            g = groups.setdefault(t["note"], [0, 0, 0, 0])
            g[0] += 1
            g[1] += t["values"]
            g[2] += t["moment_bytes_out"]
            g[3] += t["moment_bytes_fp32"]
        for i, (note, (n, v, b, _f)) in enumerate(groups.items()):
            if i == 3:
                lines.append(f"kept exact: {len(groups) - 3} more reasons (report.table)")
                break
            why = note[len("kept exact: "):] if note.startswith("kept exact: ") else note
            lines.append(f"kept exact: {_plural(n, 'tensor')}, {v:,} values, {_size(b)}: {why}")
        kept_fp32 = sum(g[3] for g in groups.values())
        kept_out = sum(g[2] for g in groups.values())
        mr = r.get("moment_reduction", 0)
        if kept and kept_out < kept_fp32 and not values:
            lines.append(f"moment_reduction {mr:.1%} is only the kept-exact states' own dtype against fp32 "
                         f"({_size(kept_out)} vs {_size(kept_fp32)}), not coding: nothing was coded")
        elif kept and kept_out < kept_fp32:
            lines.append(f"moment_reduction {mr:.1%} includes the states kept exact at their own dtype "
                         f"({_size(kept_out)} vs {_size(kept_fp32)} as fp32, not coding); coded ones alone: "
                         f"{1 - out / fp32 if fp32 else 0:.1%}")
        elif kept and values:
            lines.append(f"moment_reduction {mr:.1%} counts the states kept exact too (coded ones alone: "
                         f"{1 - out / fp32 if fp32 else 0:.1%})")
        if r.get("file_bytes_in") or r.get("file_bytes_out"):
            lines.append(f"file: {_size(r.get('file_bytes_in', 0))} in, {_size(r.get('file_bytes_out', 0))} out")
    if r.warnings:
        lines.append(f"{_plural(len(r.warnings), 'warning')} (report.warnings)")
    if r.table and r.get("tensors"):
        lines.append("per tensor: report.table")
    return "\n".join(lines)


def _report(json_text, table, lines):
    return Report(json.loads(json_text), table, lines)


def _warn(rep):
    """The library's warning lines as CkptkitWarning, attributed to the caller of the public
    function that calls this."""
    for line in rep.warnings:
        warnings.warn(line, CkptkitWarning, stacklevel=3)
    return rep


# ------------------------------------------------------------------------------ progress

def _check_progress(progress):
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable taking one event dict, not {type(progress).__name__}")


def _event(op, stage, path, progress, t0=None, bytes_in=None, bytes_out=None):
    """One progress event: an INFO record of the "ckptkit" logger and progress(event) when
    given. event: op ("save", "load", ...), stage ("start" or "end"), path, and at the end
    bytes_in, bytes_out (None where unknown) and seconds."""
    ev = {"op": op, "stage": stage, "path": path, "bytes_in": bytes_in, "bytes_out": bytes_out,
          "seconds": None if t0 is None else time.monotonic() - t0}
    if _log.isEnabledFor(logging.INFO):
        if stage == "start":
            _log.info("ckptkit.%s: start: %s", op, path, extra={"ckptkit": ev})
        else:
            sizes = ", ".join(f"{_size(n)} {w}" for n, w in ((bytes_in, "in"), (bytes_out, "out")) if n is not None)
            _log.info("ckptkit.%s: done: %s: %s in %.2f s", op, path, sizes or "-", ev["seconds"], extra={"ckptkit": ev})
    if progress is not None:
        progress(ev)
    return ev


def _ended(op, path, progress, t0, rep):
    _event(op, "end", path, progress, t0, rep.get("file_bytes_in"), rep.get("file_bytes_out"))
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
    """A thread count as given (any integer type: int, numpy's), 0 for None."""
    if threads is None:
        return 0
    try:
        n = operator.index(threads) if not isinstance(threads, bool) else None
    except TypeError:
        n = None
    if n is None or not 1 <= n <= 1024:
        raise _bad(tool, f"threads={threads!r}: not a count in [1, 1024]")
    return n


def _number(tool, name, v):
    """v as a float; BadInput naming the keyword (`name=v`) when it is not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(tool, f"{name}={v!r}: not a number")
    return float(v)


def _compress_opts(tool, tolerance=0.01, grad_bound=1.0, codec="vlog", optimizer="auto", horizon="all",
                   bound="update", threads=None, param_bound=None, amsgrad=None, maximize=None, chunk=None, strict=False,
                   device="auto", force=False, dcp_unit_mib=256, **hyper):
    """The options of ckpt-compress, checked as its flags are; a dict for the bindings."""
    unknown = [k for k in hyper if k not in _HYPER]
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    tol = _number(tool, "tolerance", tolerance)
    if not 0 < tol <= 1:
        raise _bad(tool, f"tolerance={tolerance!r}: outside (0, 1] (units of lr)")
    if isinstance(grad_bound, str) and grad_bound.lower() == "inf":
        grad_bound = math.inf
    g = _number(tool, "grad_bound", grad_bound)
    if not g > 0:
        raise _bad(tool, f"grad_bound={grad_bound!r}: not a positive number or 'inf'")
    if codec not in _CODECS:
        raise _bad(tool, f"codec={codec!r}: not one of {_CODECS}")
    if optimizer not in _OPTIMIZERS:
        raise _bad(tool, f"optimizer={optimizer!r}: not one of {_OPTIMIZERS}")
    if horizon not in ("all", 1, "1"):
        raise _bad(tool, f"horizon={horizon!r}: not 'all' or 1")
    if device not in ("cpu", "cuda", "auto"):
        raise _bad(tool, f"device={device!r}: not 'cpu', 'cuda' or 'auto'")
    if device == "cuda":
        try:
            _ckptkit.check_device(device)
        except ValueError as e:
            raise _bad(tool, str(e)) from None
    if bound not in ("update", "param"):
        raise _bad(tool, f"bound={bound!r}: not 'update' or 'param'")
    o = {"tolerance": tol, "grad_bound": g, "codec": codec, "optimizer": optimizer, "bound": bound,
         "horizon": 0 if horizon == "all" else 1, "threads": _threads(tool, threads),
         "strict": bool(strict), "device": device, "force": bool(force), "dcp_unit_mib": int(dcp_unit_mib)}
    if param_bound is not None:
        pb = _number(tool, "param_bound", param_bound)
        if not 0 <= pb < math.inf:
            raise _bad(tool, f"param_bound={param_bound!r}: not a finite number >= 0")
        o["param_bound"] = pb
    for k, v in hyper.items():
        if v is not None:
            o[k] = _number(tool, k, v)
            why = _ckptkit.override_out_of_range(k, o[k])
            if why:
                raise _bad(tool, f"{k}={v!r}: {why}")
    for k, v in (("amsgrad", amsgrad), ("maximize", maximize)):
        if v is not None:
            o[k] = bool(v)
    if chunk is not None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 64 <= chunk <= 1 << 30:
            raise _bad(tool, f"chunk={chunk!r}: not an int in [64, 2^30]")
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


def compress(src, dst, *, progress=None, **opts):
    """ckpt-compress SRC -o DST: a checkpoint file into a container, or a checkpoint folder
    into a compressed folder. Options as the flags: tolerance=0.01, grad_bound=1.0 (or
    "inf"), codec="vlog", optimizer="auto", horizon="all" (or 1), bound="update" (or "param":
    also the parameter written at the first update), threads=None (all cores), force=False, param_bound, lr, beta1, beta2, eps, weight_decay, amsgrad, maximize, strict,
    chunk, device, dcp_unit_mib. Returns the Report (--json's fields); BadInput on bad input
    (FileNotFound for a missing SRC, ...), CheckFailed when a certificate exceeds the
    tolerance. progress: a callable given the start and end events (also logged)."""
    src, dst = _path(src, "src"), _path(dst, "dst")
    o = _compress_opts("ckpt-compress", **opts)
    _check_progress(progress)
    _paths.check_input("ckpt-compress", src, folder_ok=True)
    if not os.path.isdir(src):
        _paths.check_output("ckpt-compress", dst)
    t0 = time.monotonic()
    _event("compress", "start", src, progress)
    rep = _warn(_report(*_ckptkit.compress(src, dst, o)))
    return _ended("compress", src, progress, t0, _checked(rep, "ckpt-compress", src))


def verify(path, original=None, *, tolerance=0.01, grid=257, strict=False, threads=None, progress=None):
    """ckpt-verify PATH [--original ORIGINAL] [--tolerance T] (a container or a compressed
    folder). Returns the Report when every check holds; raises CheckFailed (its `report`
    lists every failure) when one fails, BadInput when PATH cannot be read as a container
    (FileNotFound when it is missing; "truncated (N of M bytes)" when shorter than its
    superblock states). tolerance: the largest certificate accepted (lr units; 0.01, save's
    default): a container compressed at a larger one fails unless this is raised to it,
    whatever its manifest says."""
    path = _path(path)
    original = None if original is None else _path(original, "original")
    tol = _number("ckpt-verify", "tolerance", tolerance)
    if not 0 < tol <= 1:
        raise _bad("ckpt-verify", f"tolerance={tolerance!r}: outside (0, 1] (units of lr)")
    if isinstance(grid, bool) or not isinstance(grid, int) or not 5 <= grid <= 1 << 20:
        raise _bad("ckpt-verify", f"grid={grid!r}: not an int in [5, 1048576]")
    _check_progress(progress)
    _paths.check_input("ckpt-verify", path, folder_ok=True)
    if original is not None:
        _paths.check_input("ckpt-verify", original, folder_ok=True)
    o = {"tolerance": tol, "grid": grid, "strict": bool(strict), "threads": _threads("ckpt-verify", threads)}
    t0 = time.monotonic()
    _event("verify", "start", path, progress)
    js, table, lines, ok, first = _ckptkit.verify(path, original, o)
    rep = _checked(_warn(_report(js, table, lines)), "ckpt-verify", path, ok, first)
    return _ended("verify", path, progress, t0, rep)


def restore(src, dst, *, force=False, threads=None, device="auto", progress=None):
    """ckpt-restore SRC -o DST: the checkpoint (its source format: name DST .pt or
    .safetensors as the source) or the whole folder back. Returns the Report."""
    src, dst = _path(src, "src"), _path(dst, "dst")
    if device not in ("cpu", "cuda", "auto"):
        raise _bad("ckpt-restore", f"device={device!r}: not 'cpu', 'cuda' or 'auto'")
    _check_progress(progress)
    _paths.check_input("ckpt-restore", src, folder_ok=True)
    if not os.path.isdir(src):
        _paths.check_output("ckpt-restore", dst)
    o = {"force": bool(force), "threads": _threads("ckpt-restore", threads), "device": device}
    t0 = time.monotonic()
    _event("restore", "start", src, progress)
    return _ended("restore", src, progress, t0, _warn(_report(*_ckptkit.restore(src, dst, o))))


# ------------------------------------------------------------------------------ save

# Storages of at least this many bytes are read by the encoder where the tensors are (save)
# instead of being kept as the copies torch's zip writer hands to write().
_BORROW_MIN = 64 * 1024


class _Staging:
    """Host memory a background save copies the storages into (its snapshot), kept for the
    next background save when this one is done, as DCP's async_save keeps its staging
    buffers: the copy then costs no page faults. Arenas of 64 MiB (or one record's size),
    private anonymous mappings advised as transparent huge pages: a new one costs nothing
    until the copy (on every core) first touches its pages, one fault per 2 MiB where THP
    is "madvise" or "always" (a bytearray would zero them all on the caller's thread first;
    mmap's default, a shared mapping, is shmem, whose pages are 4 KiB where shmem THP is
    off); ckptkit.release_staging() frees what is kept."""

    ARENA = 64 << 20

    def __init__(self):
        self.free = []
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            fits = [i for i, a in enumerate(self.free) if len(a) >= n]
            if fits:
                return self.free.pop(min(fits, key=lambda i: len(self.free[i])))
        a = mmap.mmap(-1, max(n, self.ARENA), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            a.madvise(mmap.MADV_HUGEPAGE)
        return a

    def give(self, arenas):
        with self.lock:
            self.free.extend(arenas)

    def clear(self):
        with self.lock:
            self.free.clear()


_staging = _Staging()


def _staged(owner, n, align=1):
    """n bytes of staging memory for `owner` (its .arenas and .arena_used: a _Sink or a
    _Snapshot), at a multiple of `align` in its arena, as a memoryview."""
    at = -(-owner.arena_used // align) * align
    if not owner.arenas or len(owner.arenas[-1]) - at < n:
        owner.arenas.append(_staging.take(n))
        at = 0
    owner.arena_used = at + n
    return memoryview(owner.arenas[-1])[at:at + n]


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
        return _staged(self, n)

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


class _NotPlain(Exception):
    """The object holds something _Snapshot does not copy."""


class _Snapshot:
    """A background save's snapshot, taken without serialising: the object's dicts
    (OrderedDicts with their attributes, as module state_dicts carry _metadata), lists and
    tuples rebuilt around copies of its host tensors; each storage is copied once, whole, into
    staging memory (tensors that share a storage keep sharing its copy, at their offsets and
    strides), all by one C++ copy on every core. Other values are immutable and shared. Then
    torch.save(snapshot) writes the bytes torch.save(obj) would (the same pickle, storages in
    the same order, the same sizes), and the pickling, torch's CRC-32 and compression run off
    the caller's thread. Raises _NotPlain for anything else (other objects, tensors off the
    host, subclasses, sparse or quantized tensors, tensors with attributes or autograd
    history): then the whole serialised checkpoint is staged instead (_Sink)."""

    _IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)

    def __init__(self, obj):
        import collections
        import torch
        self.arenas, self.arena_used = [], 0
        self._torch, self._memo, self._storages, self._spans = torch, {}, {}, []
        self._dicts = (dict, collections.OrderedDict)
        self._leaf = self._IMMUTABLE + (torch.dtype, torch.device, torch.Size)
        try:
            self.obj = self._walk(obj)
            _ckptkit.copy_spans(self._spans, _cores())
        except BaseException:
            self.release()
            raise
        finally:
            self._memo = self._storages = self._spans = None

    def _walk(self, x):
        t = type(x)
        if t in self._leaf:
            return x
        i = id(x)
        if i in self._memo:
            return self._memo[i]
        if t in self._dicts:
            y = self._memo[i] = t()
            if getattr(x, "__dict__", None):
                y.__dict__.update(x.__dict__)   # _metadata: immutable while the save runs
            for k, v in x.items():
                y[self._walk(k)] = self._walk(v)
        elif t is list:
            y = self._memo[i] = []
            y.extend(self._walk(v) for v in x)
        elif t is tuple:
            y = self._memo[i] = tuple(self._walk(v) for v in x)
        elif t is self._torch.Tensor or t is self._torch.nn.Parameter:
            y = self._memo[i] = self._tensor(x)
        else:
            raise _NotPlain(t.__name__)
        return y

    def _tensor(self, x):
        torch = self._torch
        if (x.device.type != "cpu" or x.layout != torch.strided or x.is_quantized or x.__dict__
                or (x.requires_grad and type(x) is not torch.nn.Parameter) or x.is_conj() or x.is_neg()):
            raise _NotPlain("tensor")
        st = x.untyped_storage() if hasattr(x, "untyped_storage") else x.storage()._storage
        if st.device.type != "cpu":
            raise _NotPlain("storage off the host")
        key = st._cdata
        if key not in self._storages:
            n = st.nbytes()
            if n == 0 or n % x.element_size():
                raise _NotPlain("storage")
            mv = _staged(self, n, 64)
            self._spans.append((_ckptkit_addr(mv), st.data_ptr(), n))
            self._storages[key] = (torch.frombuffer(mv, dtype=x.dtype), x.dtype)
        whole, dtype = self._storages[key]
        if dtype != x.dtype:
            raise _NotPlain("a storage viewed as two dtypes")
        y = whole.as_strided(x.size(), x.stride(), x.storage_offset())
        return torch.nn.Parameter(y, requires_grad=x.requires_grad) if type(x) is torch.nn.Parameter else y

    def release(self, keep=False):
        """Free the staging memory, or keep it for the next background save (`keep`), once
        nothing refers to the snapshot's tensors."""
        self.obj = None
        if keep:
            _staging.give(self.arenas)
        self.arenas = []


def _ckptkit_addr(mv):
    """The address of a writable memoryview's first byte."""
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _save_parts(parts, name, path, opts):
    return _report(*_ckptkit.compress_memory(name, parts, path, opts, "ckptkit.save"))


def _file_name(f):
    """How errors and reports name a file object: its name when it has a str one."""
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__}>"


def _renamed(e, old, new):
    """The library's error `e` about the temporary `old`, naming `new` instead."""
    e.message = e.message.replace(old, new)
    e.args = (e.message,)
    e.reason = e.reason.replace(old, new) if isinstance(e.reason, str) else e.reason
    if e.file == old:
        e.file = new
    return e


def _save_job(parts, name, target, opts, keep_last, progress, t0):
    """Compress `parts` into the container `target` (a path, or a file object: a temporary
    container copied into it, then removed); then keep_last's pruning and the end event.
    Returns the Report (its warnings not yet raised)."""
    if isinstance(target, str):
        rep = _save_parts(parts, name, target, opts)
        shown = target
    else:
        shown = _file_name(target)
        tmpdir = tempfile.mkdtemp(prefix="ckptkit-save-")
        tmp = os.path.join(tmpdir, "obj.ckz.h5")
        try:
            try:
                rep = _save_parts(parts, name, tmp, opts)
            except CkptkitError as e:
                raise _renamed(e, tmp, shown) from None
            with open(tmp, "rb") as src:
                shutil.copyfileobj(src, target, 1 << 20)
            if hasattr(target, "flush"):
                target.flush()
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        rep["output"] = shown
        rep.table = rep.table.replace(tmp, shown)
    if keep_last:
        rep["removed"] = _loop.prune(target, keep_last)
    return _ended("save", shown, progress, t0, rep)


def _save_snapshot(snap, keep, name, target, opts, keep_last, progress, t0):
    """A background save's job from a _Snapshot: serialise it (torch.save, reading the
    staged storages where they are), compress, then free its staging memory (or keep it)."""
    parts = None
    try:
        parts = _serialize(snap.obj, borrow=True).finish()
        snap.obj = None
        return _warn(_save_job(parts, name, target, opts, keep_last, progress, t0))
    finally:
        parts = None
        snap.release(keep)
        _pending.release()


def _save_staged(sink, keep, name, target, opts, keep_last, progress, t0):
    """A background save's job from a serialised snapshot (_Sink): compress it, then free
    its staging memory (or keep it)."""
    parts = []
    try:
        parts = sink.finish()
        return _warn(_save_job(parts, name, target, opts, keep_last, progress, t0))
    finally:
        for p in parts:
            if isinstance(p, memoryview):
                p.release()
        del parts
        if keep:
            _staging.give(sink.arenas)
        sink.arenas = []
        _pending.release()


_executor = None
_executor_lock = threading.Lock()
# background saves holding a snapshot (running or queued): a third waits for the oldest
_PENDING_MAX = 2
_pending = threading.BoundedSemaphore(_PENDING_MAX)


def _background():
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptkit-save")
        return _executor


def save(obj, path, *, tolerance=0.01, grad_bound=1.0, optimizer="auto", codec="vlog", horizon="all",
         threads=None, background=False, keep_staging=False, keep_last=None, progress=None, **hyper):
    """torch.save(obj, path), compressed: the object serialised as torch.save writes it
    (zip format, to a buffer) and its Adam/AdamW moments coded into the container `path`
    (written under a temporary name, verified, renamed; an existing file is replaced). No
    file of the full checkpoint is written. Returns the Report.

    An object with no optimizer state (model weights only, an EMA, a best-weights export)
    is stored exactly, with one CkptkitWarning saying nothing was coded; states of other
    optimizers (SGD, Adagrad, ...) are kept exact, with a warning naming them. load() gives
    back what torch.load of torch.save(obj) gives.

    `path`: a str or os.PathLike (its folder must exist and be writable: else FileNotFound,
    PermissionDenied, ... before any work; "~" is not expanded, as torch.save does not), or
    a binary file object (io.BytesIO, open(..., "wb")): the container is written to a
    temporary file (tempfile.gettempdir()), then copied into it at its position.

    keep_last=N: once this container is renamed into place, the loop's older checkpoints in
    its folder are removed so that N remain (this one and the N - 1 with the highest step):
    the loop's names are this file's name with its last run of digits as any step
    ("step120.ckz.h5" -> "step<digits>.ckz.h5"); no other file is ever removed; the removed
    paths are in report["removed"]. A failed save removes nothing.

    progress: a callable given a dict at the start and at the end (op, stage, path,
    bytes_in, bytes_out, seconds); the same events are INFO records of the logger "ckptkit".

    Memory: the storages of host tensors (>= 64 KiB) are read where they are; what is kept
    is the pickle, the zip records' headers and the storages under 64 KiB. Storages of CUDA
    tensors are never copied whole: they are read in pieces of 64 MiB as the compressor asks
    (once more before, for their zip CRC-32), so a checkpoint on the GPU takes no host copy.

    background=True: returns a concurrent.futures.Future of the Report once a snapshot is in
    host staging memory, so training may step the optimizer meanwhile: for dicts, lists and
    tuples of host tensors (state_dicts), a copy of every storage, made on every core in C++
    (torch's pickling and CRC-32 then run in the worker); for other objects, or tensors off
    the host, the serialised checkpoint (CUDA storages copied in pieces of 64 MiB). Staging
    memory: the snapshot's size (the storages' bytes, or the serialised file's), held until
    that save is done, then freed; keep_staging=True keeps it for the next background save
    (whose copy then costs no page faults; ckptkit.release_staging() frees it). At most two
    background saves hold a snapshot at a time: a third call waits for the oldest to end.
    Compression runs in one worker thread (saves queue in order) on half the cores unless
    `threads` says otherwise. The container is the same bytes as a synchronous save's.

    Options as ckpt-compress's flags; **hyper: lr, beta1, beta2, eps, weight_decay, amsgrad,
    maximize (fill in what the file does not state), param_bound, strict, chunk, device."""
    if hasattr(path, "write") and not isinstance(path, (str, os.PathLike)):
        target = path
    else:
        target = _path(path)
    opts = _compress_opts("ckptkit.save", tolerance=tolerance, grad_bound=grad_bound, optimizer=optimizer,
                          codec=codec, horizon=horizon, threads=threads, force=True, **hyper)
    opts["allow_no_state"] = True   # a model-only object: stored exactly (CompressOptions::allow_no_state)
    if keep_last is not None:
        if not isinstance(target, str):
            raise TypeError("keep_last needs a path to save to, not a file object")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise _bad("ckptkit.save", f"keep_last: {keep_last!r} is not a count >= 1")
        _loop.name_pattern(target)   # ValueError now when the name has no step
    _check_progress(progress)
    if isinstance(target, str):
        _paths.check_output("ckptkit.save", target)
    name = "torch.save(obj)"   # the source's name in errors and in the manifest (not the path: same bytes anywhere)
    t0 = time.monotonic()
    _event("save", "start", target if isinstance(target, str) else _file_name(target), progress)
    if not background:
        sink = _serialize(obj, borrow=True)
        return _warn(_save_job(sink.finish(), name, target, opts, keep_last, progress, t0))
    if threads is None:   # leave training half the cores (any count gives the same bytes)
        opts["threads"] = max(1, _cores() // 2)
    _pending.acquire()
    try:
        try:
            job = (_save_snapshot, _Snapshot(obj))
        except _NotPlain:
            job = (_save_staged, _serialize(obj, borrow=False))
        return _background().submit(job[0], job[1], bool(keep_staging), name, target, opts, keep_last, progress, t0)
    except BaseException:
        _pending.release()
        raise


# ------------------------------------------------------------------------------ load

def _load_failed(e, name):
    """BadInput for a failed torch.load: one line, without terminal escapes; for torch's
    weights_only refusal its reason (the global) and the two ways on."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"WeightsUnpickler error: (.*?)(?: Please use|\n|$)", text)
    if m:
        what = (f"torch.load(weights_only=True) refused it: {m.group(1).strip().rstrip('.')}; if you trust the file, pass "
                "weights_only=False or allowlist the global (torch.serialization.add_safe_globals)")
    else:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or type(e).__name__
        what = f"torch.load failed: {first}"
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


def _hdf5(data):
    """Whether bytes hold the HDF5 signature where HDF5 looks for it (0, 512, 1024, ...)."""
    off = 0
    while off + 8 <= len(data):
        if data[off:off + 8] == b"\x89HDF\r\n\x1a\n":
            return True
        off = 512 if off == 0 else 2 * off
    return False


def _load_path(path, map_location, weights_only, mmap, strict):
    """load() of a path (checked: it exists, is a readable file); returns (obj, bytes restored or None)."""
    if _ckptkit.is_container(path):
        raw, _js, _table, _lines = _ckptkit.restore_bytes(path, {"threads": 0}, "ckptkit.load")
        fmt = _ckptkit.check_checkpoint([raw], strict, "ckptkit.load")
        if fmt == "safetensors":
            return _safetensors_dict(raw, path, map_location), len(raw)
        if fmt == "torch-zip":
            return _torch_load_memory(raw, path, map_location, weights_only, mmap), len(raw)
        return _torch_load(_torch.file_object(raw), path, map_location, weights_only, mmap), len(raw)
    fmt = _ckptkit.check_checkpoint(path, strict, "ckptkit.load")
    if fmt == "safetensors":
        with open(path, "rb") as f:
            return _safetensors_dict(f.read(), path, map_location), None
    return _torch_load(path, path, map_location, weights_only, mmap), None


def _load_file_object(f, map_location, weights_only, mmap, strict):
    """load() of a binary file object: its bytes from its position to the end. A container
    is written to a temporary file (libhdf5 reads files) and loaded from there."""
    data = f.read()
    if isinstance(data, str):
        raise TypeError("ckptkit.load: the file object is in text mode: open it with 'rb'")
    shown = _file_name(f)
    if _hdf5(data):
        fd, tmp = tempfile.mkstemp(prefix="ckptkit-load-", suffix=".ckz.h5")
        try:
            with os.fdopen(fd, "wb") as w:
                w.write(data)
            del data
            try:
                return _load_path(tmp, map_location, weights_only, mmap, strict)
            except CkptkitError as e:
                raise _renamed(e, tmp, shown) from None
        finally:
            os.unlink(tmp)
    try:
        fmt = _ckptkit.check_checkpoint([data], strict, "ckptkit.load")
    except CkptkitError as e:
        raise _renamed(e, "<memory>", shown) from None
    if fmt == "safetensors":
        return _safetensors_dict(data, shown, map_location), None
    return _torch_load(io.BytesIO(data), shown, map_location, weights_only, mmap), None


def load(path, map_location=None, weights_only=None, mmap=None, *, progress=None):
    """torch.load(path) for a ckptkit container (decoded in memory: no file) or a plain
    torch / safetensors file, so switching is one line. Returns what torch.load returns for
    the restored checkpoint, with map_location, weights_only and mmap as this torch defines
    them (weights_only=None: torch's default, True from torch 2.6 on; False on 1.13); a
    safetensors checkpoint gives a dict name -> tensor.

    `path`: a str or os.PathLike ("~" is not expanded, as torch.load does not; a missing
    file raises FileNotFound, an unreadable one PermissionDenied, a folder IsADirectory: all
    BadInput), or a binary file object (io.BytesIO, open(..., "rb")): its bytes from its
    position on (a container goes through a temporary file in tempfile.gettempdir()).
    progress: as save's (start and end events, also INFO records of the logger "ckptkit").

    Memory: a container is restored into one buffer (a memfd) and the tensors of a torch zip
    are its pages (torch >= 2.1: torch.load(mmap=True) of it, unless mmap=False asks torch
    for copies; 1.13: views of it): no second copy; the buffer is freed when the last tensor
    is. Such tensors cannot be resized (resize_), as mmap-ed ones.

    Before torch.load sees any byte, the checkpoint is parsed by ckptkit's reader: a pickle
    naming a global that runs code (os, subprocess, eval, ...) raises BadInput and nothing
    is run; weights_only accepts only torch.load(weights_only=True)'s globals (torch 2.x:
    checked by torch's own unpickler, with what add_safe_globals allows)."""
    fileobj = hasattr(path, "read") and not isinstance(path, (str, os.PathLike))
    if not fileobj:
        path = _path(path)
    _check_progress(progress)
    if weights_only is None:
        weights_only = None if _torch.has_mmap() else False
    # torch 2.x checks weights_only itself (its allowlist, add_safe_globals); 1.13's reader: ours
    strict = bool(weights_only) and not _torch.has_mmap()
    shown = _file_name(path) if fileobj else path
    if not fileobj:
        _paths.check_input("ckptkit.load", path,
                           folder_hint="; ckptkit.restore(folder, out_folder) restores folders")
    t0 = time.monotonic()
    _event("load", "start", shown, progress)
    if fileobj:
        obj, restored = _load_file_object(path, map_location, weights_only, mmap, strict)
        size = None
    else:
        obj, restored = _load_path(path, map_location, weights_only, mmap, strict)
        size = os.path.getsize(path)
    _event("load", "end", shown, progress, t0, size, restored)
    return obj
