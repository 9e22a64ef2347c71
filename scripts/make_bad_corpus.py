#!/usr/bin/env python3
"""Write the hostile-input corpus test/corpus/bad/* (every file must be rejected with
ckpt::BadInput), test/corpus/bad_expected.json (file -> substring of the expected error
line) and test/corpus/bad/README.md. Needs only the standard library and data/io/*.pt
(made by scripts/make_io_samples.py). Run: python3 scripts/make_bad_corpus.py
"""
import io
import json
import os
import random
import struct
import zipfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "test", "corpus", "bad")
SAMPLES = os.path.join(ROOT, "data", "io")
CORPUS = []   # (name, bytes, what it violates, expected error substring)
GOOD = []     # (name, bytes): valid hand-made files -> test/corpus/good/


def add(name, data, why, expect):
    CORPUS.append((name, data, why, expect))


# ---------------------------------------------------------------- pickle assembly
def bu(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def glob(module, name):
    return b"c" + f"{module}\n{name}\n".encode()


def pint(n):
    return b"J" + struct.pack("<i", n) if -2**31 <= n < 2**31 else b"\x8a\x08" + struct.pack("<q", n)


def tup(xs):
    return b"(" + b"".join(pint(x) for x in xs) + b"t"


def storage(cls, key, numel, legacy=False):
    return (b"(" + bu("storage") + glob("torch", cls) + bu(key) + bu("cpu") + pint(numel) +
            (b"N" if legacy else b"") + b"tQ")


def tensor(cls, key, numel, offset, size, stride, legacy=False):
    return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + storage(cls, key, numel, legacy) + pint(offset) +
            tup(size) + tup(stride) + b"\x89" + glob("collections", "OrderedDict") + b")R" + b"tR")


def pdict(items):
    return b"\x80\x02}(" + b"".join(bu(k) + v for k, v in items) + b"u."


def torch_zip(pkl, storages=None, prefix="archive", compress=False, extra=None):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        for k, v in (storages or {}).items():
            z.writestr(f"{prefix}/data/{k}", v)
        for k, v in (extra or {}).items():
            z.writestr(f"{prefix}/{k}", v)
        z.writestr(f"{prefix}/version", b"3\n")
    return buf.getvalue()


def sample(name):
    with open(os.path.join(SAMPLES, name), "rb") as f:
        return f.read()


# ---------------------------------------------------------------- zip structure helpers
def eocd_pos(data):
    return data.rindex(b"PK\x05\x06")


def patch(data, off, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def make():
    pwn = "/tmp/ckpt_pwned_"
    nested = sample("nested.pt")
    legacy = sample("legacy.pt")
    z64 = eocd_pos(nested) - 20 - 56            # torch writes a zip64 end record before the locator
    cd = struct.unpack_from("<Q", nested, z64 + 48)[0]

    # ---- not a checkpoint at all
    add("empty.bin", b"", "zero bytes", "too small")
    add("tiny.bin", b"PK", "two bytes", "too small")
    rnd = random.Random(7)
    add("garbage.bin", bytes(rnd.randrange(256) for _ in range(1000)).replace(b"PK", b"pk").replace(b"{", b"["),
        "1000 random bytes, no zip/legacy/safetensors signature", "not a torch.save zip")

    # ---- zip container
    add("zip_truncated_half.pt", nested[:len(nested) // 2], "torch zip cut in half (no end record)",
        "no zip end-of-central-directory record")
    add("zip_truncated_tail.pt", nested[:-10], "torch zip missing its last 10 bytes",
        "no zip end-of-central-directory record")
    add("zip_bad_cd_offset.pt", patch(nested, z64 + 48, "<Q", 2**62), "zip64 central directory offset 2^62",
        "central directory")
    add("zip_bad_cd_size.pt", patch(nested, z64 + 40, "<Q", 2**40), "zip64 central directory size 2^40",
        "central directory")
    add("zip_huge_entry_count.pt", patch(nested, z64 + 32, "<Q", 2**40), "zip64 entry count 2^40 (limit 2^20)",
        "more than the limit")
    add("zip_bad_local_offset.pt", patch(nested, cd + 42, "<I", 0x7FFFFFF0),
        "first central directory record's local header offset points past the file", "local header offset")
    add("zip_local_not_header.pt", patch(nested, cd + 42, "<I", 7),
        "local header offset points at bytes that are not a local header", "no local header")
    add("zip_huge_entry_size.pt", patch(patch(nested, cd + 20, "<I", 0x7FFFFFFF), cd + 24, "<I", 0x7FFFFFFF),
        "data.pkl sizes 2 GiB in a 9 KB file", "runs into the central directory")
    add("zip_bad_cd_signature.pt", patch(nested, cd, "<I", 0x12345678), "central directory record signature broken",
        "is malformed")
    small = torch_zip(pdict([("a", pint(1))]), {"0": b"\0" * 8})
    scd = struct.unpack_from("<I", small, eocd_pos(small) + 16)[0]
    size = struct.unpack_from("<I", small, scd + 24)[0]
    add("zip_entries_overlap.pt", patch(patch(small, scd + 20, "<I", size + 40), scd + 24, "<I", size + 40),
        "data.pkl's size grown by 40 bytes so it covers the next entry's local header", "overlap")
    add("zip_compressed.pt", torch_zip(pdict([("a", pint(1))]), compress=True), "deflated entries",
        "is compressed")
    add("zip_no_data_pkl.pt", patch(torch_zip(pdict([])), 0, "<I", 0x04034b50).replace(b"data.pkl", b"data.pkX"),
        "archive without <prefix>/data.pkl", "no 'archive/data.pkl' record")
    add("zip_no_prefix.pt", torch_zip(pdict([]), prefix="").replace(b"/data.pkl", b"_data.pkl"),
        "first entry is not inside a folder", "not inside an archive folder")
    add("zip_big_endian.pt", torch_zip(pdict([]), extra={"byteorder": b"big"}), "byteorder record says big",
        "only little-endian")

    # ---- hostile pickles inside a valid torch zip
    def evil(name, pkl, why, expect):
        add(name, torch_zip(pkl), why, expect)
    evil("pickle_os_system.pt", b"\x80\x02" + glob("os", "system") + b"(" + bu(f"touch {pwn}os") + b"tR.",
         "calls os.system('touch /tmp/ckpt_pwned_os')", "pickle global os.system is not allowed")
    evil("pickle_posix_system.pt", b"\x80\x02" + glob("posix", "system") + b"(" + bu(f"touch {pwn}posix") + b"tR.",
         "calls posix.system", "pickle global posix.system is not allowed")
    evil("pickle_builtins_eval.pt", b"\x80\x02" + glob("builtins", "eval") + b"(" +
         bu(f"__import__('os').system('touch {pwn}eval')") + b"tR.", "calls builtins.eval",
         "pickle global builtins.eval is not allowed")
    evil("pickle_builtin_getattr.pt", b"\x80\x02" + glob("__builtin__", "getattr") + b"(" + glob("torch", "Size") +
         bu("__reduce__") + b"tR.", "calls __builtin__.getattr", "pickle global __builtin__.getattr is not allowed")
    evil("pickle_stack_global_os.pt", b"\x80\x04" + b"\x8c\x02os\x8c\x06system\x93" + b"\x8c" +
         bytes([len(f"touch {pwn}stack")]) + f"touch {pwn}stack".encode() + b"\x85R.",
         "protocol 4 STACK_GLOBAL os.system", "pickle global os.system is not allowed")
    evil("pickle_torch_load.pt", b"\x80\x02" + glob("torch", "load") + b"(" + bu("/etc/passwd") + b"tR.",
         "calls torch.load (not in the weights_only allowlist)", "pickle global torch.load is not allowed")
    evil("pickle_call_storage_class.pt", b"\x80\x02" + glob("torch", "FloatStorage") + b")R.",
         "calls a storage class directly", "is not a callable")
    evil("pickle_bad_opcode.pt", b"\x80\x02\xff.", "opcode 0xff", "opcode 0xff is not supported")
    evil("pickle_inst_opcode.pt", b"\x80\x02(ios\nsystem\n" + bu("x") + b".",
         "protocol-0 INST opcode (would call os.system)", "opcode 0x69 is not supported")
    evil("pickle_truncated.pt", b"\x80\x02}(" + bu("abcdef")[:-3], "ends inside a BINUNICODE", "exceeds the 3 bytes left")
    evil("pickle_no_stop.pt", b"\x80\x02}", "no STOP opcode", "truncated")
    evil("pickle_huge_binunicode.pt", b"\x80\x02X\xff\xff\xff\xffabc.", "BINUNICODE length 4 GiB",
         "BINUNICODE length 4294967295 exceeds")
    evil("pickle_huge_binunicode8.pt", b"\x80\x04\x8d" + struct.pack("<Q", 2**63) + b"abc.",
         "BINUNICODE8 length 2^63", "BINUNICODE8 length")
    evil("pickle_huge_long4.pt", b"\x80\x02\x8b\xff\xff\xff\x7f.", "LONG4 length 2 GiB", "LONG4 length")
    evil("pickle_negative_binstring.pt", b"\x80\x02T\xff\xff\xff\xff.", "BINSTRING length -1",
         "negative length")
    evil("pickle_stack_underflow.pt", b"\x80\x02s.", "SETITEM on an empty stack", "stack underflow")
    evil("pickle_reduce_underflow.pt", b"\x80\x02R.", "REDUCE on an empty stack", "stack underflow")
    evil("pickle_tuple_without_mark.pt", b"\x80\x02K\x01t.", "TUPLE with no MARK", "needs a MARK")
    evil("pickle_stop_open_mark.pt", b"\x80\x02}(.", "STOP with an open MARK", "STOP with an open MARK")
    evil("pickle_stop_two_objects.pt", b"\x80\x02}}.", "two objects left at STOP", "STOP with 2 objects")
    evil("pickle_memo_missing.pt", b"\x80\x02h\x05.", "BINGET of a memo slot never written",
         "memo key 5 was never stored")
    evil("pickle_append_to_dict.pt", b"\x80\x02}K\x01a.", "APPEND to a dict", "not a list")
    evil("pickle_unhashable_key.pt", b"\x80\x02}]K\x01s.", "list used as a dict key", "unhashable")
    evil("pickle_build_on_list.pt", b"\x80\x02]}b.", "BUILD on a list", "BUILD on an object")
    evil("pickle_cycle.pt", b"\x80\x02]q\x00h\x00a.", "list containing itself", "or a cycle")
    evil("pickle_deep_nesting.pt", b"\x80\x02" + b"(" * 20000 + b"t" * 20000 + b".", "20000 nested tuples",
         "nesting deeper")
    bomb = b"\x80\x02]q\x00"
    for i in range(1, 40):  # list i = [list i-1, list i-1]: 2^40 nodes once expanded
        bomb += b"(h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"lq" + bytes([i]) + b"0"
    bomb += b"0h\x27."
    evil("pickle_expansion_bomb.pt", bomb, "shared lists doubling 40 times (2^40 nodes when expanded)",
         "too large after expanding")
    evil("pickle_proto_99.pt", b"\x80\x63}.", "pickle protocol 99", "unsupported pickle protocol 99")
    evil("pickle_persid_short.pt", b"\x80\x02(" + bu("storage") + b"tQ.", "persistent id with 1 field",
         "persistent id has 1 fields")
    evil("pickle_persid_not_storage_class.pt", b"\x80\x02(" + bu("storage") + glob("collections", "OrderedDict") +
         bu("0") + bu("cpu") + pint(1) + b"tQ.", "persistent id whose type is OrderedDict",
         "not a torch storage class")
    evil("pickle_codecs_bad_encoding.pt", b"\x80\x02" + glob("_codecs", "encode") + b"(" + bu("x") + bu("rot13") +
         b"tR.", "_codecs.encode with encoding rot13", "encoding 'rot13' is not allowed")
    evil("pickle_rebuild_wrong_args.pt", b"\x80\x02" + glob("torch._utils", "_rebuild_tensor_v2") + b")R.",
         "_rebuild_tensor_v2 with no arguments", "called with 0 arguments")

    # ---- torch-level storage/view violations
    f32 = struct.pack("<6f", *range(6))
    add("tensor_view_past_storage.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [10], [1]))]),
                                                 {"0": f32}),
        "tensor of 10 elements on a 6-element storage (stock torch 1.13 loads it)", "past the end of its storage")
    add("tensor_offset_past_storage.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 5, [2], [1]))]),
                                                   {"0": f32}),
        "offset 5 + 2 elements on a 6-element storage", "past the end of its storage")
    add("tensor_stride_past_storage.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [2, 3], [4, 1]))]),
                                                   {"0": f32}),
        "shape (2,3) stride (4,1) needs 7 elements of 6", "past the end of its storage")
    add("tensor_negative_stride.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 5, [6], [-1]))]),
                                               {"0": f32}), "negative stride", "negative stride")
    add("tensor_negative_size.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [-2], [1]))]),
                                             {"0": f32}), "negative size", "negative size")
    add("tensor_negative_offset.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, -1, [2], [1]))]),
                                               {"0": f32}), "negative storage offset", "negative storage offset")
    add("tensor_extent_overflow.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [2**62, 4],
                                                                   [2**62, 1]))]), {"0": f32}),
        "shape/stride whose extent overflows 64 bits", "overflows 64 bits")
    add("tensor_rank_mismatch.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [2, 3], [1]))]),
                                             {"0": f32}), "size has 2 dims, stride 1", "but stride has 1")
    add("storage_short_record.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [6], [1]))]),
                                             {"0": f32[:16]}),
        "storage of 6 floats whose record has 16 bytes (stock torch 1.13 loads it)",
        "storage record 'archive/data/0' has 16 bytes, expected 24")
    add("storage_long_record.pt", torch_zip(pdict([("w", tensor("FloatStorage", "0", 6, 0, [6], [1]))]),
                                            {"0": f32 + b"\0" * 4}),
        "storage record longer than numel", "has 28 bytes, expected 24")
    add("storage_missing_record.pt", torch_zip(pdict([("w", tensor("FloatStorage", "1", 6, 0, [6], [1]))]),
                                               {"0": f32}),
        "tensor names storage '1', absent from the archive", "storage record 'archive/data/1' is missing")
    add("storage_conflicting_declarations.pt",
        torch_zip(pdict([("a", tensor("FloatStorage", "0", 6, 0, [6], [1])),
                         ("b", tensor("FloatStorage", "0", 3, 0, [3], [1]))]), {"0": f32}),
        "storage '0' declared with 6 and with 3 elements", "declared twice")
    add("storage_numel_overflow.pt", torch_zip(pdict([("w", tensor("DoubleStorage", "0", 2**62, 0, [1], [1]))]),
                                               {"0": f32}),
        "storage numel 2^62 doubles (byte size overflows)", "overflows")

    # ---- legacy format
    # magic + protocol + sys_info pickles of a torch 1.13 legacy file end at byte 137.
    hdr_end = 137   # verified below by re-parsing offsets of STOP opcodes
    assert legacy[hdr_end - 1:hdr_end] == b"." and legacy[hdr_end:hdr_end + 2] == b"\x80\x02"
    header = legacy[:hdr_end]
    add("legacy_truncated.pt", legacy[:-20], "legacy file missing the end of its last storage",
        "runs past end of file")
    add("legacy_trailing_bytes.pt", legacy + b"\0" * 5, "5 bytes after the last storage", "5 unexpected bytes")
    add("legacy_bad_protocol.pt", legacy[:15] + b"\x80\x02M\xe8\x03." + legacy[21:],
        "protocol version 1000", "protocol version is not 1001")
    add("legacy_os_system.pt", header + b"\x80\x02" + glob("os", "system") + b"(" + bu(f"touch {pwn}legacy") +
        b"tR." + b"\x80\x02]." , "legacy main pickle calls os.system", "pickle global os.system is not allowed")
    one = pdict([("w", tensor("FloatStorage", "k", 6, 0, [6], [1], legacy=True))])
    keys = b"\x80\x02]" + bu("k") + b"a."
    add("legacy_short_numel.pt", header + one + keys + struct.pack("<q", 5) + f32[:20],
        "raw storage says 5 elements, the pickle 6", "has 5 elements, the pickle says 6")
    add("legacy_unknown_key.pt", header + one + b"\x80\x02](" + bu("k") + bu("zz") + b"e." + struct.pack("<q", 6) + f32,
        "key list names an unused storage",
        "not used by any tensor")
    add("legacy_view_past_storage.pt",
        header + pdict([("w", tensor("FloatStorage", "k", 6, 4, [3], [1], legacy=True))]) + keys +
        struct.pack("<q", 6) + f32, "legacy tensor view past its storage", "past the end of its storage")

    # ---- safetensors: one file per rule of the reference reader
    def st(header_obj=None, buf=b"", raw_header=None, n=None, pad=True):
        js = raw_header if raw_header is not None else json.dumps(header_obj).encode()
        if pad:
            js += b" " * (-len(js) % 8)
        return struct.pack("<Q", len(js) if n is None else n) + js + buf
    t4 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    add("st_header_too_large.safetensors", st(raw_header=b'{"a":1}', n=200_000_000),
        "header length 200,000,000 > 100,000,000", "exceeds the limit of 100000000 bytes")
    add("st_header_past_eof.safetensors", st(raw_header=b'{"a":1}', n=9999999999 % 100_000_000),
        "header length runs past end of file", "runs past end of file")
    add("st_header_utf8.safetensors", st(raw_header=b'{"\xff\xfe":{}}'), "header is not UTF-8",
        "not valid UTF-8")
    add("st_header_bad_json.safetensors", st(raw_header=b'{"a": {"dtype": '), "truncated JSON", "not valid JSON")
    add("st_header_trailing_garbage.safetensors", st(raw_header=b'{}xyz'), "non-space bytes after the JSON object",
        "not valid JSON")
    add("st_header_not_object.safetensors", st(raw_header=b'{}', n=2, pad=False)[:8] + b"[]",
        "header starts with '[' (not a JSON object)", "not a torch.save zip")
    add("st_duplicate_key.safetensors", st(raw_header=b'{"a":' + json.dumps(t4).encode() + b',"a":' +
                                           json.dumps(t4).encode() + b"}", buf=b"\0" * 4),
        "tensor name appears twice", "duplicate key 'a'")
    add("st_gap.safetensors", st({"a": t4, "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}},
                                 b"\0" * 12), "4-byte gap between tensors", "gap")
    add("st_overlap.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
        "tensors overlap", "overlap")
    add("st_size_mismatch.safetensors", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                                           b"\0" * 8), "F32 [3] stored in 8 bytes", "hold 8 bytes, but 3 x F32 needs 12")
    add("st_not_covered.safetensors", st({"a": t4}, b"\0" * 10), "6 bytes after the last tensor",
        "file not fully covered")
    add("st_past_eof.safetensors", st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
        "tensor extends past end of file", "file not fully covered")
    add("st_offsets_reversed.safetensors", st({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}},
                                              b"\0" * 8), "end offset before begin", "end before they begin")
    add("st_offsets_not_pair.safetensors", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4),
        "data_offsets has 1 entry", "array of 2 integers")
    add("st_negative_offset.safetensors", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}},
                                             b"\0" * 4), "negative offset", "non-negative integers")
    add("st_overflow.safetensors", st({"a": {"dtype": "F64", "shape": [2**32, 2**32], "data_offsets": [0, 8]}},
                                      b"\0" * 8), "element count 2^64 overflows", "overflows")
    add("st_bytes_overflow.safetensors", st({"a": {"dtype": "F64", "shape": [2**62], "data_offsets": [0, 8]}},
                                            b"\0" * 8), "2^62 F64 = 2^65 bytes overflows", "byte size overflows")
    add("st_negative_shape.safetensors", st({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
                                            b"\0" * 4), "negative dimension", "non-negative integers")
    add("st_unknown_dtype.safetensors", st({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "dtype F99", "unsupported dtype 'F99'")
    add("st_missing_dtype.safetensors", st({"a": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "entry without dtype", "missing or non-string dtype")
    add("st_entry_not_object.safetensors", st({"a": 5}, b""), "entry is a number", "entry is not an object")
    add("st_metadata_not_string.safetensors", st({"__metadata__": {"epoch": 3}}, b""),
        "__metadata__ value is a number", "is not a string")
    add("st_metadata_not_object.safetensors", st({"__metadata__": ["x"]}, b""), "__metadata__ is a list",
        "__metadata__ is not an object")
    add("st_name_with_newline.safetensors", st({"a\nb": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                                               b"\0" * 8), "bad tensor whose name holds a newline (error stays one line)",
        "tensor 'a?b'")
    add("st_header_len_too_small.safetensors", st(raw_header=b"{", n=1, pad=False) + b"\0" * 8,
        "header length 1", "too small for a JSON object")


def make_good():
    """Hand-made VALID files for reader paths torch 1.13 does not write by default (checked value by
    value in test/io/test_io.cpp): allowlisted globals, _rebuild_tensor_v3, _rebuild_parameter, protocol 4."""
    od = glob("collections", "OrderedDict") + b")R"
    items = [
        ("size", glob("torch", "Size") + b"(" + tup([2, 3]) + b"tR"),
        ("dev", glob("torch", "device") + b"(" + bu("cuda") + pint(1) + b"tR"),
        ("dt", glob("torch", "bfloat16")),
        ("set", glob("builtins", "set") + b"(]" + b"(" + pint(1) + pint(2) + b"e" + b"tR"),
        ("cplx", glob("builtins", "complex") + b"(G" + struct.pack(">d", 1.5) + b"G" + struct.pack(">d", -2.0) + b"tR"),
        ("ba", glob("__builtin__", "bytearray") + b"(" + glob("_codecs", "encode") + b"(" + bu("a\u00ff") +
         bu("latin1") + b"tRtR"),
        ("big", b"\x8a\x09" + (2**64).to_bytes(9, "little")),
        ("neg", b"\x8a\x01\xff"),
        ("od", glob("collections", "OrderedDict") + b"(((" + bu("k") + pint(1) + b"t(" + bu("j") + b"N" + b"tl" + b"tR"),
    ]
    GOOD.append(("globals.pt", torch_zip(pdict(items))))
    # protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL; v3 tensor on an UntypedStorage
    # (numel in bytes) wrapped in _rebuild_parameter.
    def sbu(t):
        return b"\x8c" + bytes([len(t)]) + t.encode()
    def sg(m, n):
        return sbu(m) + b"\x94" + sbu(n) + b"\x94\x93\x94"
    body = (b"}\x94" + sbu("p") + b"\x94" + sg("torch._utils", "_rebuild_parameter") + b"(" +
            sg("torch._utils", "_rebuild_tensor_v3") + b"(" +
            b"(" + sbu("storage") + sg("torch", "UntypedStorage") + sbu("0") + sbu("cpu") + pint(12) + b"tQ" +
            pint(1) + tup([2]) + tup([1]) + b"\x89" + od + sg("torch", "float32") + b"tR" +
            b"\x88" + od + b"tR" + b"s.")
    pkl = b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body
    GOOD.append(("v3_param.pt", torch_zip(pkl, {"0": struct.pack("<3f", 1.0, 2.0, 3.0)})))


def main():
    make()
    make_good()
    good_dir = os.path.join(OUT, "..", "good")
    os.makedirs(good_dir, exist_ok=True)
    for name, data in GOOD:
        with open(os.path.join(good_dir, name), "wb") as f:
            f.write(data)
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    names = set()
    expected = {}
    lines = ["# Hostile-input corpus", "",
             "Written by `scripts/make_bad_corpus.py`. Every file must make `ckpt::read_checkpoint` throw",
             "`ckpt::BadInput` (one clear line; no crash, no other exception, nothing executed).",
             "`../bad_expected.json` maps each file to a substring of its expected error.", "",
             "| file | violates |", "|---|---|"]
    for name, data, why, expect in CORPUS:
        assert name not in names, name
        names.add(name)
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        expected[name] = expect
        lines.append(f"| `{name}` | {why} |")
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(OUT, "..", "bad_expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    print(f"{len(CORPUS)} files, {sum(len(d) for _, d, _, _ in CORPUS)} bytes")


if __name__ == "__main__":
    main()
