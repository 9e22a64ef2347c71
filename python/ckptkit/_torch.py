"""The torch interfaces ckptkit.save and ckptkit.load use: one adapter per torch version
range, each tested in the matrix (Debian's torch 1.13, torch 2.13 and 2.14), and a public
fallback that `PUBLIC = True` (or CKPTKIT_TORCH_PUBLIC=1 in the environment) forces, tested too.

save (`serialize`): torch.save(obj, sink) itself always runs, so the bytes are torch's in every
version (pickle protocol, CRC-32 options, storage alignment, byteorder record).
  - torch 1.13 - 2.x (`torch.serialization._open_zipfile_writer` returns an opener whose
    `file_like` is torch._C.PyTorchFileWriter): while torch.save runs, the writer it opens
    for `sink` is wrapped (`observe`) so that each `write_record` tells the sink which storage
    the data is (1.13 hands the record its address, 2.x the UntypedStorage itself), and the
    sink can read it where it is instead of copying it;
  - otherwise, or forced: torch.save(obj, sink) alone; every byte is copied by the sink.
load (`load_restored`), of a torch zip restored into a memfd-backed buffer:
  - torch >= 2.1 (torch.load takes `mmap`): public torch.load of /proc/self/fd/N with
    mmap=True unless the caller says mmap=False: the storages map the restored pages (no copy),
    weights_only and map_location exactly as torch defines them;
  - torch 1.13 (no `mmap`): torch.serialization._load over an in-memory zip reader whose
    storages are views of the buffer (no copy);
  - otherwise, or forced: torch.load of a file object over the buffer (a copy).
"""
import functools
import inspect
import io
import os
import pickle
import threading

PUBLIC = os.environ.get("CKPTKIT_TORCH_PUBLIC") == "1"

_tls = threading.local()
_install_lock = threading.Lock()
_installed = False


def version():
    """torch's (major, minor) as ints."""
    import torch
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


class _Writer:
    """torch._C.PyTorchFileWriter wrapped: each write_record first tells `on_record(data,
    size)` what the record's data is (an address, an UntypedStorage or a _device record),
    which returns the data to hand torch's writer; every other call goes to torch's."""

    def __init__(self, w, on_record, on_done):
        self.w, self.on_record, self.on_done = w, on_record, on_done

    def write_record(self, name, data, size):
        data = self.on_record(data, size)
        try:
            self.w.write_record(name, data, size)
        finally:
            self.on_done()

    def __getattr__(self, key):
        return getattr(self.w, key)


@functools.lru_cache(maxsize=None)
def _observable():
    """True when this torch's zip-writer opener can be observed (see the module's doc)."""
    import torch.serialization as ts
    opener = getattr(ts, "_open_zipfile_writer", None)
    return opener is not None and list(inspect.signature(opener).parameters) == ["name_or_buffer"]


def _install():
    """Wrap torch.serialization._open_zipfile_writer once: for the sink this thread is
    saving into (and only that one), the opener's writer becomes a _Writer."""
    global _installed
    import torch.serialization as ts
    with _install_lock:
        if _installed:
            return
        orig = ts._open_zipfile_writer

        def _open_zipfile_writer(name_or_buffer):
            opened = orig(name_or_buffer)
            hooks = getattr(_tls, "hooks", None)
            if hooks is not None and name_or_buffer is hooks[0]:
                opened.file_like = _Writer(opened.file_like, hooks[1], hooks[2])
            return opened

        _open_zipfile_writer.__wrapped__ = orig
        ts._open_zipfile_writer = _open_zipfile_writer
        _installed = True


def serialize(obj, sink, on_record, on_done):
    """torch.save(obj, sink), telling on_record(data, size) about each zip record's data
    before torch's writer writes it (and on_done() after) where this torch allows (returns
    True), else a plain torch.save (returns False)."""
    import torch
    observed = not PUBLIC and _observable()
    if observed:
        _install()
        _tls.hooks = (sink, on_record, on_done)
    try:
        torch.save(obj, sink)
    finally:
        _tls.hooks = None
    return observed


def record_address(data):
    """The host address of a record's data as write_record gets it (1.13: an int; 2.x: an
    UntypedStorage on the host), or None (a string record, or a storage off the host)."""
    if isinstance(data, int):
        return data
    import torch
    if isinstance(data, torch.UntypedStorage) and data.device.type == "cpu":
        return data.data_ptr()
    return None


# ------------------------------------------------------------------------------ load

@functools.lru_cache(maxsize=None)
def has_mmap():
    """torch.load takes mmap= (torch >= 2.1)."""
    import torch
    return "mmap" in inspect.signature(torch.load).parameters


def default_weights_only():
    """What torch.load(weights_only=None) means in this torch: True from 2.6 on (unless
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set, as torch reads it), False before."""
    import torch.serialization as ts
    f = getattr(ts, "_default_to_weights_only", None)
    if f is None:
        return False
    try:
        return bool(f(pickle))
    except TypeError:
        return bool(f())


def load_kwargs(map_location, weights_only, mmap):
    """torch.load's keyword arguments for this torch (1.13 has no mmap, and no None for
    weights_only)."""
    kw = {"map_location": map_location}
    if has_mmap():
        kw["weights_only"] = weights_only
        if mmap is not None:
            kw["mmap"] = mmap
    else:
        kw["weights_only"] = bool(weights_only)
    return kw


def load_file(f, map_location, weights_only, mmap):
    """torch.load(f) (a path or a file object) as this torch defines its arguments; on 1.13,
    weights_only=True falls back to _RestrictedPickle where 1.13's own weights_only
    unpickler refuses a valid file (it lacks BINFLOAT: every optimizer state)."""
    import torch
    kw = load_kwargs(map_location, weights_only, mmap)
    if has_mmap() or not kw["weights_only"]:
        return torch.load(f, **kw)
    try:
        return torch.load(f, **kw)
    except pickle.UnpicklingError as e:
        if "Unsupported operand 71" not in str(e):
            raise
        if hasattr(f, "seek"):
            f.seek(0)
        return torch.load(f, map_location=map_location, pickle_module=_RestrictedPickle)


def load_copy(buf, map_location, weights_only, mmap):
    """The public fallback: torch.load of a file object over `buf` (torch copies each storage)."""
    return load_file(file_object(buf), map_location, weights_only, False if mmap else mmap)


def load_restored(buf, map_location, weights_only, mmap):
    """torch.load of the torch zip in `buf` (a _ckptkit.Buffer: memory with a fileno()):
    torch >= 2.1 by path with mmap (see the module's doc); 1.13 through
    torch.serialization._load over views of the buffer (_MemoryZip); otherwise, or forced,
    load_copy."""
    import torch
    if PUBLIC:
        return load_copy(buf, map_location, weights_only, mmap)
    if has_mmap():
        path = f"/proc/self/fd/{buf.fileno()}"
        if not os.path.exists(path):
            return load_copy(buf, map_location, weights_only, mmap)
        return torch.load(path, **load_kwargs(map_location, weights_only, True if mmap is None else mmap))
    import torch.serialization as ts
    try:
        z = _MemoryZip(buf)
        ok = list(inspect.signature(ts._load).parameters)[:3] == ["zip_file", "map_location", "pickle_module"]
    except Exception:  # noqa: BLE001 - legacy format, another torch: the public path
        ok = False
    if not ok:
        return load_copy(buf, map_location, weights_only, mmap)
    if not weights_only:
        return ts._load(z, map_location, pickle, encoding="utf-8")
    try:
        from torch import _weights_only_unpickler
        return ts._load(z, map_location, _weights_only_unpickler, encoding="utf-8")
    except (pickle.UnpicklingError, RuntimeError) as e:
        if "Unsupported operand 71" not in str(e):
            raise
        return ts._load(z, map_location, _RestrictedPickle, encoding="utf-8")


class _RestrictedUnpickler(pickle.Unpickler):
    """torch 1.13: pickle.Unpickler resolving only torch.load(weights_only=True)'s allowlist
    (1.13's own weights_only unpickler lacks BINFLOAT and refuses every optimizer state)."""

    def find_class(self, module, name):
        from torch import _weights_only_unpickler as wou
        allowed = dict(wou._get_allowed_globals())
        import _codecs
        allowed["_codecs.encode"] = _codecs.encode
        key = f"{module}.{name}"
        if key in allowed:
            return allowed[key]
        raise pickle.UnpicklingError(f"global {key} is not in the weights_only allowlist")


class _RestrictedPickle:
    Unpickler = _RestrictedUnpickler
    load = pickle.load


class _MemoryZip:
    """torch 1.13: the reader torch.serialization._load takes (torch._C.PyTorchFileReader's
    get_record, has_record, get_storage_from_record), over a torch zip in a writable buffer:
    each storage is a view of the buffer (torch.frombuffer), not a copy, so the restored
    checkpoint's memory becomes the tensors'."""

    def __init__(self, buf):
        import zipfile
        self.buf = buf
        self.records = {}
        with zipfile.ZipFile(_MemoryFile(buf)) as z:
            infos = z.infolist()
        prefix = infos[0].filename.split("/", 1)[0] + "/" if infos and "/" in infos[0].filename else ""
        mv = memoryview(buf)
        for zi in infos:
            if zi.compress_type != 0 or not zi.filename.startswith(prefix):
                raise ValueError("not a stored torch zip")
            h = zi.header_offset
            if bytes(mv[h:h + 4]) != b"PK\x03\x04":
                raise ValueError("bad local header")
            start = h + 30 + int.from_bytes(mv[h + 26:h + 28], "little") + int.from_bytes(mv[h + 28:h + 30], "little")
            if start + zi.file_size > len(buf):
                raise ValueError("record past the end")
            self.records[zi.filename[len(prefix):]] = (start, zi.file_size)

    def has_record(self, name):
        return name in self.records

    def get_record(self, name):
        start, n = self.records[name]
        return bytes(memoryview(self.buf)[start:start + n])

    def get_storage_from_record(self, name, numel, _dtype):
        import torch
        start, n = self.records[name]
        if numel > n:
            raise ValueError(f"{name}: record of {n} bytes holds no {numel} bytes")
        if numel == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self.buf, dtype=torch.uint8, count=numel, offset=start)

    def get_all_records(self):
        return list(self.records)


def file_object(buf):
    """A read-only file object over `buf` (the public fallback's input)."""
    return io.BufferedReader(_MemoryFile(buf))


class SeekableReader(io.RawIOBase):
    """A read-only, seekable raw file of `size` bytes; subclasses give readinto() from `pos`."""

    def __init__(self, size):
        super().__init__()
        self.size, self.pos = size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = max(0, off + (0, self.pos, self.size)[whence])
        return self.pos


class _MemoryFile(SeekableReader):
    """A read-only raw file over a buffer, without copying it (io.BytesIO would)."""

    def __init__(self, buf):
        self.buf = memoryview(buf).cast("B")
        super().__init__(len(self.buf))

    def readinto(self, b):
        n = max(0, min(len(b), self.size - self.pos))
        b[:n] = self.buf[self.pos:self.pos + n]
        self.pos += n
        return n
