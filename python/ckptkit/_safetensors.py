"""A strict safetensors reader over bytes (moved from scripts/torch_step_check.py): the
header within the buffer and <= 100,000,000 bytes, a JSON object without duplicate keys,
known dtypes, e - b == numel * itemsize, entries that tile the data from 0 with no gap or
overlap and end exactly at the end."""
import json
import math
from collections import OrderedDict

import torch

from ._errors import BadInput

ST_TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
            "U8": torch.uint8, "BOOL": torch.bool}


def parse(raw, name, tool="ckptkit.load"):
    """(OrderedDict name -> tensor in header order, metadata dict) of the safetensors bytes
    `raw`; BadInput "TOOL: error: NAME: what" on anything malformed."""
    def bad(what):
        return BadInput(f"{tool}: error: {name}: {what}", name, what)

    raw = memoryview(raw).cast("B")
    if len(raw) < 8:
        raise bad("safetensors header too small")
    n = int.from_bytes(raw[:8], "little")
    if n > 100_000_000 or 8 + n > len(raw):
        raise bad(f"safetensors header length {n} past end of file")

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise bad("duplicate key in safetensors header")
        return dict(pairs)

    try:
        header = json.loads(bytes(raw[8:8 + n]).decode("utf-8"), object_pairs_hook=no_dups)
    except (UnicodeDecodeError, ValueError) as e:
        if isinstance(e, BadInput):
            raise
        raise bad(f"bad safetensors header JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(header, dict):
        raise bad("safetensors header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    buf = raw[8 + n:]
    try:
        entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    except (TypeError, KeyError, IndexError):
        raise bad("safetensors entry without data_offsets") from None
    pos = 0
    out = {}
    for key, e in entries:
        dt = ST_TORCH.get(e.get("dtype"))
        if dt is None:
            raise bad(f"{key}: unsupported dtype {e.get('dtype')}")
        try:
            b, end = (int(x) for x in e["data_offsets"])
            shape = [int(d) for d in e["shape"]]
        except (TypeError, KeyError, ValueError):
            raise bad(f"{key}: bad shape or data_offsets") from None
        if any(d < 0 for d in shape) or b != pos or end - b != math.prod(shape) * torch.empty(0, dtype=dt).element_size():
            raise bad(f"{key}: invalid data_offsets {e['data_offsets']}")
        pos = end
        t = torch.frombuffer(bytearray(buf[b:end]), dtype=torch.uint8) if end > b else torch.empty(0, dtype=torch.uint8)
        out[key] = t.view(dt).reshape(shape)
    if pos != len(buf):
        raise bad(f"safetensors buffer not fully covered ({pos} of {len(buf)})")
    return OrderedDict((k, out[k]) for k in header), meta
