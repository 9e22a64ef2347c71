"""Storages off the host (CUDA) in ckptkit.save: read in pieces of CHUNK bytes, never whole.

torch's serializer (torch.serialization._save) copies each storage that is not in host
memory to the host whole (`storage.cpu()`) before it writes the storage's zip record. While
ckptkit.save serialises, `cpu_hook()` makes that call return a `DeviceRecord` instead: the
zip writer is handed a read-only zero mapping of the record's size (it writes the record's
headers with the CRC-32 of those zeros), and the save reads the storage itself in pieces:
a synchronous save gives the compressor a (fill, size) part that copies the pieces the
compressor asks for, a background save copies them into its staging memory. The record's
CRC-32 fields (in its data descriptor, where torch's writer puts it, or its local header;
and in its central-directory entry) are then set to the storage's own (`local_crc_field`,
`descriptor_crc_field`, `fix_central_directory`; layout: PKWARE APPNOTE 4.3.7, 4.3.9,
4.3.12, 4.3.14-16, 4.5.3).
"""
import contextlib
import ctypes
import mmap
import struct
import threading
import zlib

CHUNK = 64 << 20   # bytes per device -> host copy
_tls = threading.local()


def device_bytes(storage):
    """The untyped storage `storage` (any device) as a flat uint8 tensor on its device."""
    import torch
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def copy_pieces(src, off, dst):
    """Copy src[off:off + len(dst)] (a uint8 tensor) into the writable buffer dst, CHUNK
    bytes at a time."""
    import torch
    n = len(dst)
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        torch.frombuffer(dst[a:b], dtype=torch.uint8).copy_(src[off + a:off + b])


class _Zeros:
    """One private anonymous mapping, never written (its pages are the kernel's zero page;
    huge zero pages where THP allows): the bytes the zip writer reads for a DeviceRecord."""

    def __init__(self):
        self.maps, self.addr = [], 0   # every mapping made stays (a save may still read it): address space only
        self.lock = threading.Lock()

    def address(self, n):
        """The address of at least n zero bytes."""
        with self.lock:
            if not self.maps or len(self.maps[-1]) < n:
                m = mmap.mmap(-1, max(n, 1 << 21), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if hasattr(mmap, "MADV_HUGEPAGE"):
                    m.madvise(mmap.MADV_HUGEPAGE)
                self.maps.append(m)
                self.addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
            return self.addr


_zeros = _Zeros()


class DeviceRecord:
    """What `storage.cpu()` returns inside cpu_hook() for a storage off the host: its size,
    and as data the zero mapping (data_ptr() also marks this record as the next one the
    zip writer gets, for take())."""

    def __init__(self, storage):
        self.storage = storage
        self.n = storage.nbytes()
        self.addr = None

    def nbytes(self):
        return self.n

    def data_ptr(self):
        _tls.last = self
        self.addr = _zeros.address(self.n)
        return self.addr

    def fill(self, off, dst):
        """Part callback for the compressor: dst <- bytes [off, off + len(dst))."""
        copy_pieces(device_bytes(self.storage), off, dst)

    def crc32(self):
        """The storage's CRC-32 (zip's), read in pieces through one host buffer (this
        thread's, kept for the next record)."""
        src, crc = device_bytes(self.storage), 0
        if len(getattr(_tls, "scratch", b"")) < min(self.n, CHUNK):
            _tls.scratch = bytearray(min(self.n, CHUNK))
        buf = memoryview(_tls.scratch)
        for a in range(0, self.n, CHUNK):
            piece = buf[:min(CHUNK, self.n - a)]
            copy_pieces(src, a, piece)
            crc = zlib.crc32(piece, crc)
        return crc

    def copy_into(self, dst):
        """Copy the storage into dst (n bytes, host); its CRC-32."""
        copy_pieces(device_bytes(self.storage), 0, dst)
        return zlib.crc32(dst)


def take(data):
    """The DeviceRecord that write_record's `data` (an address or a storage object) stands
    for, or None; and the data to hand torch's zip writer."""
    if isinstance(data, DeviceRecord):   # torch 2.x hands write_record what cpu() returned
        data.addr = _zeros.address(data.n)
        return data, data.addr
    last = getattr(_tls, "last", None)
    if last is not None and isinstance(data, int) and data == last.addr:
        _tls.last = None
        return last, data
    return None, data


_hook_lock = threading.Lock()
_hook_users = 0
_orig_cpu = None


@contextlib.contextmanager
def cpu_hook():
    """While active in this thread, UntypedStorage.cpu() of a storage off the host returns a
    DeviceRecord (other threads, and host storages, get torch's own)."""
    import torch
    global _hook_users, _orig_cpu
    with _hook_lock:
        if _hook_users == 0:
            _orig_cpu = orig = torch.UntypedStorage.cpu

            def cpu(self):
                if getattr(_tls, "on", False) and type(self) is torch.UntypedStorage and self.device.type != "cpu":
                    return DeviceRecord(self)
                return orig(self)
            torch.UntypedStorage.cpu = cpu
        _hook_users += 1
    _tls.on, _tls.last = True, None
    try:
        yield
    finally:
        _tls.on, _tls.last, _tls.scratch = False, None, b""
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                torch.UntypedStorage.cpu = _orig_cpu


def _layout_error(what):
    return RuntimeError(f"ckptkit.save: torch's zip writer wrote an unexpected layout ({what})")


def local_crc_field(small):
    """Where the record whose data comes next starts and keeps its CRC-32, from `small` (the
    bytes written since the last large part, ending with that record's local header):
    (offset of the local header in `small`, offset of its CRC field, or None when the header
    defers it to a data descriptor after the data: flag bit 3, as torch's writer does)."""
    at = len(small)
    while True:
        at = small.rfind(b"PK\x03\x04", 0, at)
        if at < 0:
            raise _layout_error("no local header before a storage's data")
        if at + 30 <= len(small):
            flags, = struct.unpack_from("<H", small, at + 6)
            nl, xl = struct.unpack_from("<HH", small, at + 26)
            if at + 30 + nl + xl == len(small):
                return at, (None if flags & 8 else at + 14)


def descriptor_crc_field(small, start):
    """The offset in `small` of the CRC field of the data descriptor written from `start` on
    (its signature first, as miniz writes it)."""
    if small[start:start + 4] != b"PK\x07\x08" or len(small) < start + 16:
        raise _layout_error("no data descriptor after a storage's data")
    return start + 4


def descriptor_crc(b):
    """The CRC-32 in `b` when it is one data descriptor as torch's writer (miniz) writes it,
    signature first; else None."""
    if len(b) >= 8 and b[:4] == b"PK\x07\x08":
        return int.from_bytes(b[4:8], "little")
    return None


def hash_combine(seed, value):
    """c10::hash_combine on 64-bit size_t: torch 2.x folds each record's CRC-32 (as its data
    descriptor passes) into the second half of its .data/serialization_id record."""
    m = (1 << 64) - 1
    return (seed ^ ((value + 0x9E3779B9 + ((seed << 6) & m) + (seed >> 2)) & m)) & m


def fix_serialization_id(tail, tail_start, seen, true, crcs):
    """torch 2.x writes .data/serialization_id (20 digits of a hash of the record names, 20
    of the fold of the records' CRC-32 as its writer saw them: the zero mapping's for the
    storages read here). Where the record exists (in `tail`, before the central directory)
    and its fold is `seen`, it is set to `true` (the storages' own CRC-32), and its CRC-32
    is set in its data descriptor and recorded in `crcs` for the central directory."""
    name = b".data/serialization_id"
    at = tail.rfind(b"PK\x03\x04")
    while at >= 0:
        nl, xl = struct.unpack_from("<HH", tail, at + 26)
        if bytes(tail[at + 30:at + 30 + nl]).endswith(b"/" + name):
            break
        at = tail.rfind(b"PK\x03\x04", 0, at)
    if at < 0 or seen == true:
        return
    flags, = struct.unpack_from("<H", tail, at + 6)
    size, start = 40, at + 30 + nl + xl
    sid = bytes(tail[start:start + size])
    if size != 40 or not sid.isdigit() or int(sid[20:]) != seen:
        raise _layout_error("a serialization_id not made as torch 2.x makes it")
    new = sid[:20] + b"%020d" % true
    tail[start:start + size] = new
    crc = zlib.crc32(new)
    if flags & 8:
        d = descriptor_crc_field(tail, start + size)
        tail[d:d + 4] = crc.to_bytes(4, "little")
    else:
        tail[at + 14:at + 18] = crc.to_bytes(4, "little")
    crcs[tail_start + at] = crc


def fix_central_directory(tail, tail_start, crcs):
    """Set the CRC-32 of the central-directory entries whose local header offsets are keys
    of `crcs` ({offset: crc}); `tail` holds the file's last bytes, from offset tail_start,
    the whole central directory and end records (no archive comment, as torch writes)."""
    e = len(tail) - 22
    if e < 0 or tail[e:e + 4] != b"PK\x05\x06":
        raise _layout_error("no end of central directory record")
    count, size, cd = struct.unpack_from("<HII", tail, e + 10)
    if 0xFFFFFFFF in (size, cd) or count == 0xFFFF:   # zip64: the locator before it points at its end record
        loc = e - 20
        if loc < 0 or tail[loc:loc + 4] != b"PK\x06\x07":
            raise _layout_error("no zip64 end of central directory locator")
        z = struct.unpack_from("<Q", tail, loc + 8)[0] - tail_start
        if not 0 <= z <= loc - 56 or tail[z:z + 4] != b"PK\x06\x06":
            raise _layout_error("no zip64 end of central directory record")
        count, size, cd = struct.unpack_from("<QQQ", tail, z + 32)
    p, left = cd - tail_start, dict(crcs)
    for _ in range(count):
        if not 0 <= p <= len(tail) - 46 or tail[p:p + 4] != b"PK\x01\x02":
            raise _layout_error("a central directory entry")
        nl, xl, cl = struct.unpack_from("<HHH", tail, p + 28)
        off = struct.unpack_from("<I", tail, p + 42)[0]
        if off == 0xFFFFFFFF:   # in the zip64 extra field, after the 64-bit sizes that are also escaped
            usize, csize = struct.unpack_from("<II", tail, p + 24)[0], struct.unpack_from("<I", tail, p + 20)[0]
            x, xe = p + 46 + nl, p + 46 + nl + xl
            while x + 4 <= xe:
                hid, hl = struct.unpack_from("<HH", tail, x)
                if hid == 1:
                    k = x + 4 + 8 * ((usize == 0xFFFFFFFF) + (csize == 0xFFFFFFFF))
                    off = struct.unpack_from("<Q", tail, k)[0]
                    break
                x += 4 + hl
        if off in left:
            struct.pack_into("<I", tail, p + 16, left.pop(off))
        p += 46 + nl + xl + cl
    if left:
        raise _layout_error("a storage record missing from the central directory")
