#!/usr/bin/python3
"""Write the small reader test files in data/io/ with Debian's torch 1.13, plus an
expected-<name>.json per file describing what torch itself sees (dtypes, shapes, strides,
offsets, storage sharing, raw storage bytes, zip CRCs). Run: /usr/bin/python3 scripts/make_io_samples.py
"""
import io
import json
import os
import struct
import sys
import zipfile
import zlib

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "io")
DT = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
      torch.bool: "BOOL", torch.complex64: "C64", torch.complex128: "C128"}


def tensors_in(obj, path=""):
    """(path, tensor) in pickle order: dicts in insertion order, lists/tuples by index."""
    join = (lambda k: f"{path}/{k}" if path else str(k))
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors_in(v, join(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors_in(v, join(i))


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


def hand_zip(entries, descriptor_sig):
    """A stored zip written by hand, every field in ZIP64 form: flag bit 3 with a data descriptor
    (with or without its 0x08074b50 signature), 'FB' padding so data is 64-byte aligned,
    central-directory sizes/offsets only in ZIP64 extra fields, ZIP64 end record + locator,
    and an archive comment."""
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

    # Sanity: torch loads what it wrote.
    for name in ["nested.pt", "optim_only.pt", "dtypes.pt", "handzip.pt", "rezipped.pt", "legacy.pt"]:
        torch.load(os.path.join(OUT, name))


if __name__ == "__main__":
    sys.exit(main())
