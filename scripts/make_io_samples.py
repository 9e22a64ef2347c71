#!/usr/bin/python3
"""Write the small reader test files in data/io/ with Debian's torch 1.13, plus an
expected-<name>.json per file describing what torch itself sees (dtypes, shapes, strides,
offsets, storage sharing, raw storage bytes, zip CRCs). Files with foreign objects
(argparse.Namespace, numpy scalars, a custom class, a whole nn.Module) are written by torch 1.13
at pickle protocols 2, 4 and 5; torch 2.x forms that 1.13 cannot write are pickled by hand with
the module/class names of torch 2.x's own source (torch/_utils.py, torch/_tensor.py,
torch/serialization.py) and zipped like torch 2.x does (see data/README.md).
Run: /usr/bin/python3 scripts/make_io_samples.py
"""
import argparse
import collections
import io
import pickle
import json
import os
import struct
import sys
import zipfile
import zlib

import numpy
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "io")
DT = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
      torch.bool: "BOOL", torch.complex64: "C64", torch.complex128: "C128"}
PLAIN = (dict, collections.OrderedDict, list, tuple, torch.Size, set, frozenset)


def tensors_in(obj, path="", seen=None):
    """(path, tensor) in the reader's walk order, each pickled object once (the pickler memoizes
    by identity): dicts in insertion order, lists/tuples/sets by index, and any other object as
    its __reduce_ex__(2) says: '@args/i' (NEWOBJ drops copyreg.__newobj__'s class argument),
    '@state' and '@dict/k' (ckpt::Value::for_each_child). A bare storage is a 1-d tensor over it."""
    seen = set() if seen is None else seen
    join = (lambda k: f"{path}/{k}" if path else str(k))
    if id(obj) in seen and not isinstance(obj, (str, int, float, bool, bytes, type(None))):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor) and obj.is_sparse:   # _rebuild_sparse_tensor(layout, (indices, values, ...))
        yield from tensors_in(obj._indices(), join("@args/1/0"), seen)
        yield from tensors_in(obj._values(), join("@args/1/1"), seen)
    elif isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, torch.storage.TypedStorage):
        yield path, torch.tensor([], dtype=obj.dtype).set_(obj)
    elif isinstance(obj, dict) and type(obj) in PLAIN:
        for k, v in obj.items():
            yield from tensors_in(v, join(k), seen)
    elif type(obj) in PLAIN:
        for i, v in enumerate(obj):
            yield from tensors_in(v, join(i), seen)
    elif not isinstance(obj, (str, int, float, bool, bytes, bytearray, type(None), type, complex)) \
            and hasattr(obj, "__reduce_ex__") and not isinstance(obj, torch.dtype):
        red = obj.__reduce_ex__(2)
        if isinstance(red, str):
            return
        func, args = red[0], red[1]
        if getattr(func, "__name__", "") == "__newobj__":
            args = args[1:]
        for i, v in enumerate(args):
            yield from tensors_in(v, join(f"@args/{i}"), seen)
        if len(red) > 2 and red[2] is not None:
            yield from tensors_in(red[2], join("@state"), seen)
        if len(red) > 4 and red[4] is not None:
            for k, v in red[4]:
                yield from tensors_in(v, join(f"@dict/{k}"), seen)


def describe(obj):
    """Tensors and storages as torch sees them; storages numbered by first appearance."""
    seen, storages, tensors = {}, [], []
    for path, t in tensors_in(obj):
        st = t.storage()
        ptr = st.data_ptr()
        if ptr not in seen:
            seen[ptr] = len(storages)
            raw = bytes(st.untyped().tolist())
            storages.append({"dtype": DT[t.dtype], "numel": st.size(), "nbytes": len(raw), "hex": raw.hex()})
        tensors.append({"path": path, "dtype": DT[t.dtype], "shape": list(t.shape), "stride": list(t.stride()),
                        "offset": t.storage_offset(), "storage": seen[ptr]})
    return storages, tensors


def zip_layout(path):
    """Storage-record data offsets and CRCs read with Python's zipfile (handles prepended bytes)."""
    out = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset)
            h = f.read(30)
            nlen, xlen = struct.unpack("<HH", h[26:30])
            out[info.filename] = {"offset": info.header_offset + 30 + nlen + xlen, "crc": info.CRC,
                                  "size": info.file_size}
    return out


def save_expected(name, fmt, obj, extra=None):
    storages, tensors = describe(obj)
    exp = {"file": name, "format": fmt, "storages": storages, "tensors": tensors}
    if fmt == "torch-zip":
        layout = zip_layout(os.path.join(OUT, name))
        prefix = next(iter(layout)).split("/")[0]
        exp["prefix"] = prefix
        for i, s in enumerate(storages):
            rec = layout[f"{prefix}/data/{i}"]
            s["key"] = str(i)
            s["file_offset"] = rec["offset"]
            s["crc"] = rec["crc"]
            assert rec["size"] == s["nbytes"]
    exp.update(extra or {})
    with open(os.path.join(OUT, f"expected-{name}.json"), "w") as f:
        json.dump(exp, f, indent=1)


def hand_zip(entries, descriptor_sig, zip64=True):
    """A stored zip written by hand, every field in ZIP64 form: flag bit 3 with a data descriptor
    (with or without its 0x08074b50 signature), 'FB' padding so data is 64-byte aligned,
    central-directory sizes/offsets only in ZIP64 extra fields, ZIP64 end record + locator,
    and an archive comment. zip64=False: the layout torch 2.x's PyTorchStreamWriter (miniz)
    writes for small files instead: descriptor with signature and 32-bit sizes, plain central
    directory and end record, no comment."""
    if not zip64:
        return torch_style_zip(entries)
    out, cd = bytearray(), bytearray()
    for name, data in entries:
        nb = name.encode()
        off = len(out)
        pad = (-(off + 30 + len(nb) + 4)) % 64
        extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 8, 0, 0, 0x21, 0, 0, 0, len(nb), len(extra)) + nb + extra
        out += data
        crc = zlib.crc32(data)
        out += (struct.pack("<I", 0x08074B50) if descriptor_sig else b"") + struct.pack("<III", crc, len(data),
                                                                                        len(data))
        z64 = struct.pack("<HHQQQ", 1, 24, len(data), len(data), off)
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 8, 0, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                          len(nb), len(z64), 0, 0, 0, 0, 0xFFFFFFFF) + nb + z64
    cd_off = len(out)
    out += cd
    z64_off = len(out)
    n = len(entries)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(cd), cd_off)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64_off, 1)
    comment = b"written by make_io_samples.py"
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, len(comment)) + comment
    return bytes(out)


def torch_style_zip(entries):
    """Stored entries as torch 2.x writes them (caffe2/serialize/inline_container.cc via miniz):
    local header with flag 0x08 and zero CRC/sizes, 'FB' extra padding data to 64 bytes, a data
    descriptor with signature after the data, then a plain central directory and end record."""
    out, cd = bytearray(), bytearray()
    for name, data in entries:
        nb = name.encode()
        off = len(out)
        pad = (-(off + 30 + len(nb) + 4)) % 64
        extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, 8, 0, 0, 0x21, 0, 0, 0, len(nb), len(extra)) + nb + extra
        out += data
        crc = zlib.crc32(data)
        out += struct.pack("<IIII", 0x08074B50, crc, len(data), len(data))
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, 8, 0, 0, 0x21, crc, len(data), len(data),
                          len(nb), 0, 0, 0, 0, 0, off) + nb
    cd_off = len(out)
    out += cd
    n = len(entries)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(cd), cd_off, 0)
    return bytes(out)


# ---------------------------------------------------------------- torch 2.x forms, pickled by hand

class G:
    """Stand-in for a global of torch 2.x (pickled as GLOBAL 'module name' by Torch2Pickler)."""
    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):   # pickle's save_reduce wants a callable; never called
        raise TypeError("stand-in")


class R:
    """Stand-in for an object whose __reduce__ is (fn, args[, state])."""
    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


class S:
    """Stand-in for a storage: raw bytes, torch 2.x storage class (torch.storage.UntypedStorage
    counts bytes; torch.<X>Storage counts elements), location."""
    def __init__(self, raw, cls="UntypedStorage", esize=1, location="cuda:0"):
        self.raw, self.cls, self.esize, self.location = raw, cls, esize, location


V2 = G("torch._utils", "_rebuild_tensor_v2")
V3 = G("torch._utils", "_rebuild_tensor_v3")
HOOKS = collections.OrderedDict


def t2(storage, size, stride, offset=0, dtype=None, metadata=None, dname=None):
    """A tensor as torch 2.x Tensor._reduce_ex_internal pickles it: _rebuild_tensor_v3 for the
    dtypes in torch.storage._new_dtypes (UntypedStorage), _rebuild_tensor_v2 otherwise
    (metadata appended when get_tensor_metadata is not empty)."""
    if dtype is not None:
        args = (storage, offset, tuple(size), tuple(stride), False, HOOKS(), G("torch", dtype))
    else:
        args = (storage, offset, tuple(size), tuple(stride), False, HOOKS())
    if metadata:
        args = args + (metadata,)
    r = R(V3 if dtype is not None else V2, args)
    r.expect = {"dtype": dname, "shape": list(size), "stride": list(stride), "offset": offset, "storage": storage}
    return r


class Torch2Pickler(pickle._Pickler):
    """Pure-Python pickler that writes G stand-ins as GLOBAL and S as torch's persistent id
    ('storage', storage class, key, location, numel) (torch/serialization.py _save persistent_id)."""
    def __init__(self, f, protocol=2):
        super().__init__(f, protocol=protocol)
        self.keys = {}

    def persistent_id(self, obj):
        if isinstance(obj, S):
            key = self.keys.setdefault(id(obj), (str(len(self.keys)), obj))[0]
            module = "torch.storage" if obj.cls == "UntypedStorage" else "torch"
            return ("storage", G(module, obj.cls), key, obj.location, len(obj.raw) // obj.esize)
        return None

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, G):
            if id(obj) in self.memo:
                self.write(self.get(self.memo[id(obj)][0]))
                return
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
            self.memoize(obj)
            return
        super().save(obj, save_persistent_id)


def stand_in_tensors(obj, path="", seen=None):
    """(path, R tensor) in the reader's walk order for a tree of stand-ins: rebuilds that return
    their tensor argument (_rebuild_parameter*) are that tensor, other R are objects."""
    seen = set() if seen is None else seen
    join = (lambda k: f"{path}/{k}" if path else str(k))
    if isinstance(obj, R) and hasattr(obj, "expect"):
        if id(obj) not in seen:
            seen.add(id(obj))
            yield path, obj
    elif isinstance(obj, R) and obj.fn.name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
        yield from stand_in_tensors(obj.args[0], path, seen)
    elif isinstance(obj, R):
        for i, v in enumerate(obj.args):
            yield from stand_in_tensors(v, join(f"@args/{i}"), seen)
        if obj.state is not None:
            yield from stand_in_tensors(obj.state, join("@state"), seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from stand_in_tensors(v, join(k), seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from stand_in_tensors(v, join(i), seen)


def write_torch2(name, obj, protocol=2):
    """Pickle `obj` with Torch2Pickler and zip it like torch 2.x torch.save: data.pkl,
    .format_version, .storage_alignment, byteorder, data/<key>..., version, .data/serialization_id
    (torch/serialization.py _save and caffe2/serialize/inline_container.cc); expected JSON alongside."""
    buf = io.BytesIO()
    p = Torch2Pickler(buf, protocol)
    p.dump(obj)
    prefix = "archive"
    entries = [(f"{prefix}/data.pkl", buf.getvalue()), (f"{prefix}/.format_version", b"1"),
               (f"{prefix}/.storage_alignment", b"64"), (f"{prefix}/byteorder", b"little")]
    for key, st in sorted(p.keys.values(), key=lambda ks: int(ks[0])):
        entries.append((f"{prefix}/data/{key}", st.raw))
    entries += [(f"{prefix}/version", b"3\n"), (f"{prefix}/.data/serialization_id", b"1234567890123456789012345678901234567890")]
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(torch_style_zip(entries))
    layout = zip_layout(path)
    storages, tensors, index = [], [], {}
    for tpath, r in stand_in_tensors(obj):
        e = r.expect
        st = e["storage"]
        if id(st) not in index:
            index[id(st)] = len(storages)
            key = p.keys[id(st)][0]
            rec = layout[f"{prefix}/data/{key}"]
            sdt = "U8" if st.cls == "UntypedStorage" else e["dtype"]
            storages.append({"dtype": sdt, "numel": len(st.raw) // st.esize, "nbytes": len(st.raw),
                             "hex": st.raw.hex(), "key": key, "file_offset": rec["offset"], "crc": rec["crc"]})
        tensors.append({"path": tpath, "dtype": e["dtype"], "shape": e["shape"], "stride": e["stride"],
                        "offset": e["offset"], "storage": index[id(st)]})
    with open(os.path.join(OUT, f"expected-{name}.json"), "w") as f:
        json.dump({"file": name, "format": "torch-zip", "prefix": prefix, "storages": storages,
                   "tensors": tensors}, f, indent=1)


def torch2_sample():
    """Every torch 2.x reader form: v3 tensors of the new dtypes over UntypedStorage (numel in
    bytes), v2 with metadata, Parameter with state (Megatron attributes), sparse COO via
    _get_layout, torch.device/Size, 'cuda:N' locations, a 0-d lr and 2.x param_group keys."""
    f32 = lambda vals: struct.pack(f"<{len(vals)}f", *vals)
    w = S(f32([0.5, -1.0, 2.0, 3.0, 4.0, 5.0]), "FloatStorage", 4, "cuda:0")
    exp_avg = S(f32([0.1] * 6), "FloatStorage", 4, "cuda:1")
    exp_avg_sq = S(f32([0.01] * 6), "FloatStorage", 4, "cuda:1")
    step = S(f32([3.0]), "FloatStorage", 4, "cpu")
    lr = S(f32([1e-3]), "FloatStorage", 4, "cpu")
    f8 = S(bytes(range(8)))
    u16 = S(struct.pack("<4H", 1, 2, 65535, 7))
    u32 = S(struct.pack("<2I", 1, 2 ** 32 - 1))
    u64 = S(struct.pack("<2Q", 1, 2 ** 64 - 1))
    c32 = S(struct.pack("<4e", 1.0, 0.0, -1.0, 2.0))
    fnuz = S(bytes([1, 2, 3]))
    cplx = S(struct.pack("<4f", 1.0, 2.0, 3.0, 4.0), "ComplexFloatStorage", 8)
    idx = S(struct.pack("<4q", 0, 1, 1, 2), "LongStorage", 8, "cpu")
    val = S(f32([7.0, 8.0]), "FloatStorage", 4, "cpu")
    param = R(G("torch._utils", "_rebuild_parameter"), (t2(w, [2, 3], [3, 1], dname="F32"), True, HOOKS()))
    meg = R(G("torch._utils", "_rebuild_parameter_with_state"),
            (t2(w, [3], [1], offset=3, dname="F32"), True, HOOKS(),
             {"tensor_model_parallel": True, "partition_dim": 0}))
    sparse = R(G("torch._utils", "_rebuild_sparse_tensor"),
               (R(G("torch.serialization", "_get_layout"), ("torch.sparse_coo",)),
                (t2(idx, [2, 2], [2, 1], dname="I64"), t2(val, [2], [1], dname="F32"),
                 R(G("torch", "Size"), ((3, 3),)), True)))
    return {
        "model": collections.OrderedDict([
            ("w", param), ("w_tp", meg),
            ("f8", t2(f8, [2, 4], [4, 1], dtype="float8_e4m3fn", dname="F8_E4M3")),
            ("u16", t2(u16, [4], [1], dtype="uint16", dname="U16")),
            ("u32", t2(u32, [2], [1], dtype="uint32", dname="U32")),
            ("u64", t2(u64, [1], [1], offset=1, dtype="uint64", dname="U64")),
            ("c32", t2(c32, [2], [1], dtype="complex32", dname="C32")),
            ("fnuz", t2(fnuz, [3], [1], dtype="float8_e5m2fnuz", dname="F8_E5M2FNUZ")),
            ("conj", t2(cplx, [2], [1], metadata={"conj": True}, dname="C64")),
        ]),
        "sparse": sparse,
        "device": R(G("torch", "device"), ("cuda", 0)),
        "size": R(G("torch", "Size"), ((2, 3),)),
        "optimizer": {
            "state": {0: {"step": t2(step, [], [], dname="F32"), "exp_avg": t2(exp_avg, [2, 3], [3, 1], dname="F32"),
                          "exp_avg_sq": t2(exp_avg_sq, [2, 3], [3, 1], dname="F32")}},
            "param_groups": [{"lr": t2(lr, [], [], dname="F32"), "betas": (0.9, 0.999), "eps": 1e-8,
                              "weight_decay": 0.01, "amsgrad": False, "foreach": None, "maximize": False,
                              "capturable": True, "differentiable": False, "fused": None,
                              "decoupled_weight_decay": True, "param_names": ["w"], "params": [0]}],
        },
    }


# ---------------------------------------------------------------- foreign objects, written by torch 1.13

class Holder:
    """A custom class instance holding tensors (pickled as NEWOBJ __main__.Holder + BUILD __dict__)."""
    def __init__(self, w, extra):
        self.w, self.extra = w, extra


def foreign_objects():
    """What real training scripts put next to the state dicts: argparse.Namespace (torchvision
    references, fairseq), numpy scalars (best_acc), a custom object holding tensors, a whole
    nn.Module (ultralytics 'ema'), sets, bytes, a bare storage, a huge int."""
    m, opt = model_and_optim(amsgrad=False)
    ema = torch.nn.Sequential(torch.nn.Linear(2, 2))
    return {
        "model": m.state_dict(),
        "optimizer": opt.state_dict(),
        "args": argparse.Namespace(lr=1e-3, arch="mlp", layers=[4, 3, 2], amp=False),
        "best_acc": numpy.float64(0.9375),
        "epoch_np": numpy.int64(7),
        "holder": Holder(torch.arange(3.0), [torch.ones(2, dtype=torch.float16), 3]),
        "ema": ema,
        "tags": {"a", "b"},
        "frozen": frozenset([1, 2]),
        "raw": b"\x00\xffbytes",
        "ba": bytearray(b"xy"),
        "storage": torch.arange(4, dtype=torch.int32).storage(),
        "huge": 2 ** 2100,
    }


class KwNew:
    """Needs keyword arguments to __new__: protocol 4 pickles it with NEWOBJ_EX."""
    def __new__(cls, *, size=1):
        obj = super().__new__(cls)
        obj.size = size
        return obj

    def __getnewargs_ex__(self):
        return (), {"size": self.size}


class TaggedDict(dict):
    """A dict subclass: NEWOBJ + SETITEMS + BUILD __dict__."""


class TaggedList(list):
    """A list subclass: NEWOBJ + APPENDS + BUILD __dict__."""


def write_fuzz_seeds(out):
    """Raw pickles with opaque objects for the fuzz_pickle seeds (test/corpus/good/opaque_*.pkl):
    the data.pkl of the foreign-object and torch 2.x files, and CPython's own pickles of
    NEWOBJ_EX, dict/list subclasses with state, and a slotted object."""
    for name in ["foreign.pt", "foreign_p5.pt", "torch2_p4.pt"]:
        with zipfile.ZipFile(os.path.join(OUT, name)) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            with open(os.path.join(out, "opaque_" + name.replace(".pt", ".pkl")), "wb") as f:
                f.write(z.read(pkl))
    d = TaggedDict(a=1, b=[2.5, None])
    d.tag = "x"
    lst = TaggedList([1, (2, 3)])
    lst.note = {"k": b"v"}
    obj = {"kw": KwNew(size=3), "d": d, "l": lst, "ns": argparse.Namespace(x=1), "od": collections.OrderedDict(z=1)}
    for proto in (2, 4, 5):
        with open(os.path.join(out, f"opaque_python_p{proto}.pkl"), "wb") as f:
            f.write(pickle.dumps(obj, protocol=proto))


def model_and_optim(amsgrad):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, amsgrad=amsgrad)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    return m, opt


def dtype_zoo():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    d = {
        "base": x,
        "view": x[1:, 2::2],            # offset 8, stride (6, 2), shares x's storage
        "transposed": x.t(),            # stride (1, 6)
        "elem": x[2, 3],                # 0-d view, offset 15
        "scalar": torch.tensor(2.5),    # 0-d own storage
        "empty": torch.zeros(0, 3),
        "long_tail": torch.arange(10, dtype=torch.int64)[3:],
        "bytes": b"ab\xff\x00",
        "nested": [1, 2.5, None, True, "s", (3, "t")],
    }
    for dt in [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
               torch.uint8, torch.bool, torch.complex64, torch.complex128]:
        d[DT[dt].lower()] = (torch.arange(6) % 3).to(dt).reshape(2, 3)
    return d


def main():
    os.makedirs(OUT, exist_ok=True)
    # 1. nested {"model", "optimizer", "epoch"} saved to a path (prefix = basename), steps are 0-d tensors.
    m, opt = model_and_optim(amsgrad=True)
    nested = {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}
    torch.save(nested, os.path.join(OUT, "nested.pt"))
    save_expected("nested.pt", "torch-zip", nested)

    # 2. optimizer-only state dict with int steps (pre-1.12 / bitsandbytes style).
    m, opt = model_and_optim(amsgrad=False)
    sd = opt.state_dict()
    for st in sd["state"].values():
        st["step"] = int(st["step"].item())
    torch.save(sd, os.path.join(OUT, "optim_only.pt"))
    save_expected("optim_only.pt", "torch-zip", sd)

    # 3. every dtype, views, shared storage, 0-d, saved to a stream (prefix 'archive').
    zoo = dtype_zoo()
    buf = io.BytesIO()
    torch.save(zoo, buf)
    with open(os.path.join(OUT, "dtypes.pt"), "wb") as f:
        f.write(buf.getvalue())
    save_expected("dtypes.pt", "torch-zip", zoo)

    # 4. the nested archive with 100 bytes prepended (offsets inside the zip stay relative).
    with open(os.path.join(OUT, "nested.pt"), "rb") as f:
        data = f.read()
    with open(os.path.join(OUT, "prepended.pt"), "wb") as f:
        f.write(b"#" * 100 + data)
    save_expected("prepended.pt", "torch-zip", nested)

    # 4b. the dtype zoo re-zipped by hand: ZIP64 extras, descriptors without signature, comment.
    with zipfile.ZipFile(os.path.join(OUT, "dtypes.pt")) as z:
        entries = [(i.filename, z.read(i)) for i in z.infolist()]
    with open(os.path.join(OUT, "handzip.pt"), "wb") as f:
        f.write(hand_zip(entries, descriptor_sig=False))
    save_expected("handzip.pt", "torch-zip", zoo)
    # 4c. re-zipped by Python's zipfile: no data descriptor, CRCs in the local headers.
    with zipfile.ZipFile(os.path.join(OUT, "rezipped.pt"), "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            z.writestr(name, data)
    save_expected("rezipped.pt", "torch-zip", zoo)

    # 5. legacy (non-zip) format.
    torch.save(zoo, os.path.join(OUT, "legacy.pt"), _use_new_zipfile_serialization=False)
    save_expected("legacy.pt", "torch-legacy", zoo)

    # 6. safetensors written by hand: u64 header length + JSON (padded to 8) + buffer.
    tens = {"state.0.exp_avg": torch.linspace(-1, 1, 6).reshape(2, 3),
            "state.0.exp_avg_sq": torch.linspace(0, 1, 6).reshape(2, 3).to(torch.float16),
            "state.0.step": torch.tensor(7.0),
            "empty": torch.zeros(0, dtype=torch.int32),
            "mask": torch.tensor([True, False, True])}
    header, blobs, off = {"__metadata__": {"format": "pt", "note": "ckptkit"}}, [], 0
    for name, t in tens.items():
        raw = bytes(t.contiguous().storage().untyped().tolist())[:t.numel() * t.element_size()]
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(os.path.join(OUT, "tensors.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))
    storages, tensors = [], []
    for i, (name, t) in enumerate(tens.items()):
        lo, hi = header[name]["data_offsets"]
        storages.append({"key": name, "dtype": DT[t.dtype], "numel": t.numel(), "nbytes": hi - lo,
                         "file_offset": 8 + len(js) + lo, "hex": blobs[i].hex()})
        tensors.append({"path": name, "dtype": DT[t.dtype], "shape": list(t.shape),
                        "stride": list(t.contiguous().stride()), "offset": 0, "storage": i})
    with open(os.path.join(OUT, "expected-tensors.safetensors.json"), "w") as f:
        json.dump({"file": "tensors.safetensors", "format": "safetensors", "storages": storages,
                   "tensors": tensors}, f, indent=1)

    # 7. foreign objects (opaque to the reader) at pickle protocols 2, 4 and 5, by torch 1.13.
    fo = foreign_objects()
    for name, proto in [("foreign.pt", 2), ("foreign_p4.pt", 4), ("foreign_p5.pt", 5)]:
        torch.save(fo, os.path.join(OUT, name), pickle_protocol=proto)
        save_expected(name, "torch-zip", fo)
    # 7b. a sparse COO tensor (torch._utils._rebuild_sparse_tensor + torch.serialization._get_layout).
    x = torch.zeros(3, 3)
    x[1][1], x[0][2] = 1.0, 2.0
    sp = {"sparse": x.to_sparse(), "p": torch.nn.Parameter(torch.ones(2))}
    torch.save(sp, os.path.join(OUT, "sparse.pt"))
    save_expected("sparse.pt", "torch-zip", sp)

    # 8. torch 2.x forms pickled by hand with torch 2.x names, zipped like torch 2.x.
    write_torch2("torch2.pt", torch2_sample())
    write_torch2("torch2_p4.pt", torch2_sample(), protocol=4)

    # 9. raw-pickle fuzz seeds with opaque objects.
    write_fuzz_seeds(os.path.join(os.path.dirname(OUT), "..", "test", "corpus", "good"))

    # Sanity: torch loads what it wrote.
    for name in ["nested.pt", "optim_only.pt", "dtypes.pt", "handzip.pt", "rezipped.pt", "legacy.pt",
                 "foreign.pt", "foreign_p4.pt", "foreign_p5.pt", "sparse.pt"]:
        torch.load(os.path.join(OUT, name))


if __name__ == "__main__":
    sys.exit(main())
