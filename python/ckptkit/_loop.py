"""Checkpoint folders a training loop writes: ckptkit.latest(folder) finds the newest complete
checkpoint, and save(..., keep_last=N) removes the loop's older ones once the new one is in
place. The loop's names are the saved file's name with its step (the last run of digits
before the extensions) as any number: "step000120.ckz.h5" -> step\\d+\\.ckz\\.h5 in the same
folder; nothing else is ever removed (other names, hidden files, ckptkit's temporaries,
folders, symbolic links)."""
import fnmatch
import logging
import os
import re
import stat

from . import _ckptkit, _paths

_log = logging.getLogger("ckptkit")
_DIGITS = re.compile(r"\d+")


_EXT = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,11}\Z")


def _stem(name):
    """The name without its extensions (".ckz.h5", ".pt", ".safetensors", ".ckpt", ...), where
    the step is: "step11.ckz.h5" -> "step11"."""
    while True:
        m = _EXT.search(name)
        if not m or m.start() == 0:
            return name
        name = name[:m.start()]


def step_of(name):
    """The step of a file name: the last run of digits before its extensions, as an int
    ("step-0120.ckz.h5" -> 120); None when there is none."""
    m = _DIGITS.findall(_stem(name))
    return int(m[-1]) if m else None


def name_pattern(path):
    """The loop's names for a checkpoint saved at `path`: a regex over file names in its
    folder, its step (step_of: the last run of digits before the extensions) standing for
    any number. ValueError when the name holds no step (keep_last needs it in the name)."""
    base = os.path.basename(path)
    found = list(_DIGITS.finditer(_stem(base)))
    if not found:
        raise ValueError(f"keep_last: the file name {base!r} has no step number "
                         "(name each checkpoint with its step, e.g. f'step{step}.ckz.h5')")
    m = found[-1]
    return re.compile(re.escape(base[:m.start()]) + r"(\d+)" + re.escape(base[m.end():]) + r"\Z")


def _regular_files(folder, match):
    """(name, step, mtime_ns) of the regular files (not symbolic links, not hidden) in
    `folder` whose names `match` accepts."""
    out = []
    with os.scandir(folder) as it:
        for e in it:
            if e.name.startswith(".") or not match(e.name):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue   # removed meanwhile
            if stat.S_ISREG(st.st_mode):
                out.append((e.name, step_of(e.name), st.st_mtime_ns))
    return out


def prune(path, keep_last):
    """After a save of `path` has succeeded (its container renamed into place): remove the
    loop's older checkpoints in its folder so that `keep_last` remain: `path` itself and the
    keep_last - 1 others with the highest step (then the newest mtime). Only names of the
    loop's pattern (name_pattern) are removed. Returns the removed paths."""
    folder = os.path.dirname(path) or "."
    pat = name_pattern(path)
    me = os.path.basename(path)
    others = [f for f in _regular_files(folder, pat.match) if f[0] != me]
    others.sort(key=lambda f: (f[1], f[2]), reverse=True)
    removed = []
    for name, _step, _mtime in others[keep_last - 1:]:
        p = os.path.join(folder, name)
        try:
            os.unlink(p)
        except FileNotFoundError:
            continue   # removed meanwhile
        _log.info("ckptkit.save: keep_last=%d: removed %s", keep_last, p)
        removed.append(p)
    return removed


def _complete(path):
    """Whether a checkpoint file is whole: not empty; a container (a name ending in .h5, or
    an HDF5 signature) at least the size its superblock states."""
    try:
        if os.path.getsize(path) == 0:
            return False
        sizes = _ckptkit.hdf5_extent(path)
    except OSError:
        return False
    if sizes is None:
        return not path.endswith(".h5")
    return sizes[1] is None or sizes[0] >= sizes[1]


def latest(folder, pattern="*.ckz.h5"):
    """The newest complete checkpoint a loop saved in `folder`, as a path; None when there is
    none. Candidates: the regular files whose names match the glob `pattern` (hidden files,
    hence ckptkit's temporaries, never; nor folders or symbolic links). Newest: the largest
    step, the last run of digits in the name before its extensions ("step-1200.ckz.h5" after
    "step-900.ckz.h5", whatever the padding), then the latest modification time; names
    without a number come after every numbered one. A file that is not complete (empty; a
    name ending in .h5 without the HDF5 signature; a container shorter than its HDF5
    superblock states: a copy cut short) is passed over for the next one."""
    folder = os.fspath(folder)
    try:
        files = _regular_files(folder, lambda n: fnmatch.fnmatchcase(n, pattern))
    except OSError as e:
        raise _paths.os_error("ckptkit.latest", folder, e.errno,
                              "no such folder" if isinstance(e, FileNotFoundError) else
                              f"cannot list: {os.strerror(e.errno)}") from None
    files.sort(key=lambda f: (f[1] is not None, f[1] or 0, f[2]), reverse=True)
    for name, _step, _mtime in files:
        p = os.path.join(folder, name)
        if _complete(p):
            return p
        _log.info("ckptkit.latest: passed over %s: not complete", p)
    return None
