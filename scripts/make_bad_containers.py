#!/usr/bin/python3
"""Hostile .ckz.h5 variants built from one real container (h5py, Debian; zstd chunks via libzstd).

    /usr/bin/python3 scripts/make_bad_containers.py GOOD.ckz.h5 OUTDIR

Writes OUTDIR/<name>.ckz.h5 for every variant below and OUTDIR/expected.json mapping each
name to its description. Every variant must make ckpt-verify and ckpt-restore exit 1 or 2
with one clear line (never a crash, never exit 0): wrong dataset sizes (with their `count`
and `xxh3` attributes recomputed, so only the size is wrong), wrong dtypes and ranks,
missing datasets and attributes, a missing/garbage/mistyped `/manifest` dataset, and
manifest fields out of range (each a single edit of the real manifest), a kept tensor's
bytes changed in /raw with /raw's checksum recomputed, and two object-header bytes that
crash libhdf5 itself.
Nothing big is committed: the test builds GOOD from data/lm_adamw.pt at test time.
"""
import json
import os
import shutil
import sys

import h5py
import numpy as np

def _load_xxh3():
    """XXH3_64bits from the system libxxhash (the tools' own hash), via ctypes."""
    import ctypes
    import ctypes.util
    for name in (ctypes.util.find_library("xxhash"), "libxxhash.so.0", "libxxhash.so"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = lib.XXH3_64bits
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        return lambda b: int(fn(b, len(b)))
    return None  # then replaced datasets carry a stale (wrong) checksum: still hostile


xxh3 = _load_xxh3()
U64_MAX = (1 << 64) - 1
DATASETS = ["manifest", "raw", "moments/codes/exp_avg", "moments/codes/exp_avg_sq",
            "moments/params/exp_avg", "moments/params/exp_avg_sq",
            "moments/escapes/exp_avg", "moments/escapes/exp_avg_sq", "moments/escapes/index"]


def _load_zstd_decompress():
    """ZSTD_decompress from the system libzstd via ctypes (Debian's hdf5plugin has no zstd)."""
    import ctypes
    import ctypes.util
    lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]

    def dec(src, cap):
        dst = ctypes.create_string_buffer(cap)
        n = lib.ZSTD_decompress(dst, cap, src, len(src))
        if lib.ZSTD_isError(n):
            raise ValueError("zstd chunk does not decompress")
        return dst.raw[:n]
    return dec


_zstd_dec = _load_zstd_decompress()


def read_dataset(ds):
    """All elements of a 1-D dataset written by the tools (zstd filter 32015 chunks decoded
    by hand through libzstd, then HDF5's byte shuffle (filter 2, /raw since format 3)
    undone; unfiltered datasets read by h5py)."""
    plist = ds.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    if 32015 not in filters:
        return ds[...]
    zi, si = filters.index(32015), (filters.index(2) if 2 in filters else None)
    n, c, size = ds.shape[0], ds.chunks[0], ds.dtype.itemsize
    parts = []
    for i0 in range(0, n, c):
        mask, raw = ds.id.read_direct_chunk((i0,))  # bit i of mask: filter i was skipped
        data = _zstd_dec(raw, c * size) if not mask >> zi & 1 else raw
        if si is not None and not mask >> si & 1 and size > 1:
            data = np.frombuffer(data, np.uint8).reshape(size, -1).T.tobytes()
        parts.append(np.frombuffer(data, dtype=ds.dtype)[:min(c, n - i0)])
    return np.concatenate(parts) if parts else np.zeros(0, ds.dtype)


def _replace(f, path, data, keep_attrs=True, chunks=True):
    """Replace dataset `path` by `data` (chunked, unfiltered), attrs carried over with `count`
    updated and `xxh3` recomputed (system libxxhash), so only the size/type/rank is wrong."""
    attrs = dict(f[path].attrs) if keep_attrs else {}
    del f[path]
    data = np.asarray(data)
    ds = f.create_dataset(path, data=data, chunks=chunks if data.ndim and data.size else None)
    for k, val in attrs.items():
        ds.attrs[k] = val
    if keep_attrs:
        ds.attrs["count"] = np.uint64(data.size)
        if xxh3 is not None:
            ds.attrs["xxh3"] = np.uint64(xxh3(np.ascontiguousarray(data).tobytes()))
    return ds


def get_manifest(f):
    """The manifest JSON (the u8 dataset /manifest, formats/container.md) as a dict."""
    return json.loads(read_dataset(f["manifest"]).tobytes().decode())


def _set_manifest_bytes(f, b):
    _replace(f, "manifest", np.frombuffer(b, dtype=np.uint8).copy())


def _manifest_edit(fn):
    """One edit of the manifest; the dataset's count and xxh3 are recomputed, so the only
    thing wrong is the edited field."""
    def edit(f):
        m = get_manifest(f)
        fn(m)
        _set_manifest_bytes(f, json.dumps(m, sort_keys=True).encode())
    return edit


def _manifest_bytes(fn):
    def edit(f):
        _set_manifest_bytes(f, fn(read_dataset(f["manifest"]).tobytes()))
    return edit


def _set_attr(name, value):
    def edit(f):
        f.attrs[name] = value
    return edit


def _del_attr(name, obj="/"):
    def edit(f):
        del f[obj].attrs[name]
    return edit


def variants():
    v = {}

    # ---- dataset sizes (count and xxh3 consistent, size wrong)
    for path in DATASETS:
        short = path.replace("moments/", "").replace("/", "_")

        def shorter(f, path=path):
            d = read_dataset(f[path])
            _replace(f, path, d[:-1] if d.size else np.zeros(0, d.dtype))

        def longer(f, path=path):
            d = read_dataset(f[path])
            _replace(f, path, np.concatenate([d, np.zeros(1, d.dtype)]))

        def missing(f, path=path):
            del f[path]

        def as_group(f, path=path):
            del f[path]
            f.create_group(path)

        v[f"size_short_{short}"] = (shorter, f"{path} one element short")
        v[f"missing_{short}"] = (missing, f"{path} deleted")
        v[f"group_instead_{short}"] = (as_group, f"{path} is a group")
        if path in ("raw", "moments/codes/exp_avg", "moments/params/exp_avg", "moments/escapes/index"):
            v[f"size_long_{short}"] = (longer, f"{path} one element too many")
        v[f"no_xxh3_{short}"] = (_del_attr("xxh3", path), f"{path} without its xxh3 attribute")
        v[f"bad_xxh3_{short}"] = (
            lambda f, path=path: f[path].attrs.__setitem__("xxh3", np.uint64(12345)),
            f"{path} xxh3 attribute wrong")
        v[f"no_count_{short}"] = (_del_attr("count", path), f"{path} without its count attribute")
        v[f"bad_count_{short}"] = (
            lambda f, path=path: f[path].attrs.__setitem__("count", np.uint64(f[path].size + 1)),
            f"{path} count attribute one too many")

    # ---- dtypes and ranks
    for path, dt in [("raw", np.uint16), ("raw", np.int8), ("raw", np.float32),
                     ("moments/codes/exp_avg", np.float32), ("moments/codes/exp_avg_sq", np.uint16),
                     ("moments/params/exp_avg", np.int64), ("moments/params/exp_avg", np.float32),
                     ("moments/params/exp_avg_sq", np.int32),
                     ("moments/escapes/exp_avg", np.uint64), ("moments/escapes/exp_avg_sq", np.float32),
                     ("moments/escapes/index", np.uint32), ("moments/escapes/index", np.float64),
                     ("manifest", np.uint16)]:
        short = path.replace("moments/", "").replace("/", "_")

        def retype(f, path=path, dt=dt):
            _replace(f, path, read_dataset(f[path]).astype(dt))

        v[f"dtype_{short}_{np.dtype(dt).name}"] = (retype, f"{path} stored as {np.dtype(dt).name}")
    for path in ("manifest", "raw", "moments/codes/exp_avg", "moments/escapes/index"):
        short = path.replace("moments/", "").replace("/", "_")

        def rank2(f, path=path):
            d = read_dataset(f[path])
            _replace(f, path, d.reshape(-1, 1))

        def scalar(f, path=path):
            d = read_dataset(f[path])
            _replace(f, path, d[0] if d.size else d.dtype.type(0), chunks=None)

        v[f"rank2_{short}"] = (rank2, f"{path} is 2-D (n, 1)")
        v[f"scalar_{short}"] = (scalar, f"{path} is a scalar")

    # ---- manifest dataset content (count and xxh3 consistent with the bad content)
    v["manifest_empty"] = (_manifest_bytes(lambda b: b""), "manifest is empty")
    v["manifest_garbage"] = (_manifest_bytes(lambda b: b"\x00\xff garbage {{{"), "manifest is garbage")
    v["manifest_truncated"] = (_manifest_bytes(lambda b: b[:len(b) // 2]), "manifest JSON cut in half")
    v["manifest_json_array"] = (_manifest_bytes(lambda b: b"[1, 2, 3]"), "manifest is a JSON array")
    v["manifest_json_null"] = (_manifest_bytes(lambda b: b"null"), "manifest is JSON null")
    v["manifest_trailing"] = (_manifest_bytes(lambda b: b + b" }"), "manifest JSON with trailing garbage")
    v["manifest_nul_inside"] = (_manifest_bytes(lambda b: b[:20] + b"\x00" + b[21:]), "a NUL byte inside the JSON")
    v["manifest_deep"] = (_manifest_bytes(lambda b: b"[" * 100000 + b"]" * 100000), "JSON nested 100000 deep")
    v["manifest_int32"] = (
        lambda f: _replace(f, "manifest", read_dataset(f["manifest"]).astype(np.int32)),
        "manifest stored as int32")

    # ---- manifest fields out of range (one edit each)
    def M(name, fn, what):
        v[name] = (_manifest_edit(fn), what)

    def target(m):  # the first parameter with escapes (so escape edits matter), else 0
        return next((i for i, p in enumerate(m["params"]) if p["escapes"] > 0), 0)

    def p0(fn):
        return lambda m: fn(m["params"][target(m)])

    def st(i, fn):
        return lambda m: fn(m["storages"][i])

    def moment_storage(m):  # index of the target parameter's exp_avg storage
        return m["params"][target(m)]["storage"][0]

    M("m_format_version_6", lambda m: m.__setitem__("format_version", 6), "format_version 6")
    M("m_codec_unknown", lambda m: m.__setitem__("codec", "zip"), "codec 'zip'")
    M("m_codec_number", lambda m: m.__setitem__("codec", 3), "codec is a number")
    M("m_block_0", lambda m: m.__setitem__("block", 0), "block 0")
    M("m_block_256", lambda m: m.__setitem__("block", 256), "block 256 (the codec's is 64)")
    M("m_block_huge", lambda m: m.__setitem__("block", 1 << 40), "block 2^40")
    M("m_tolerance_neg", lambda m: m.__setitem__("tolerance", -1.0), "tolerance -1")
    M("m_tolerance_string", lambda m: m.__setitem__("tolerance", "0.01"), "tolerance a string")
    M("m_grad_bound_0", lambda m: m.__setitem__("grad_bound", 0), "grad_bound 0")
    M("m_no_storages", lambda m: m.pop("storages"), "storages missing")
    M("m_params_object", lambda m: m.__setitem__("params", {}), "params an object")
    M("m_storages_empty", lambda m: m.__setitem__("storages", []), "storages empty")
    M("m_params_empty", lambda m: m.__setitem__("params", []), "params empty (moment storages orphaned)")
    M("m_source_size_plus1", lambda m: m["source"].__setitem__("size", m["source"]["size"] + 1), "source size +1")
    M("m_source_size_minus1", lambda m: m["source"].__setitem__("size", m["source"]["size"] - 1), "source size -1")
    M("m_source_size_max", lambda m: m["source"].__setitem__("size", U64_MAX), "source size 2^64-1")
    M("m_source_size_neg", lambda m: m["source"].__setitem__("size", -1), "source size -1 (negative)")
    M("m_numel_0", p0(lambda p: p.__setitem__("numel", 0)), "params[0].numel 0")
    M("m_numel_plus1", p0(lambda p: p.__setitem__("numel", p["numel"] + 1)), "params[0].numel +1")
    M("m_numel_wrap", p0(lambda p: p.__setitem__("numel", (1 << 62) + p["numel"])),
      "params[0].numel 2^62 + n (numel*4 wraps to 4n)")
    M("m_numel_max", p0(lambda p: p.__setitem__("numel", U64_MAX)), "params[0].numel 2^64-1")
    M("m_dtype_f64", p0(lambda p: p.__setitem__("dtype", "F64")), "params[0].dtype F64")
    M("m_dtype_f16", p0(lambda p: p.__setitem__("dtype", "F16")), "params[0].dtype F16 (size mismatch)")
    M("m_code_offset_max", p0(lambda p: p.__setitem__("code_offset", U64_MAX)), "code_offset 2^64-1")
    M("m_code_offset_past", p0(lambda p: p.__setitem__("code_offset", 1 << 40)), "code_offset 2^40")
    M("m_block_offset_max", p0(lambda p: p.__setitem__("block_offset", U64_MAX)), "block_offset 2^64-1")
    M("m_block_offset_past", p0(lambda p: p.__setitem__("block_offset", 1 << 40)), "block_offset 2^40")
    M("m_escape_offset_max", p0(lambda p: p.__setitem__("escape_offset", U64_MAX)), "escape_offset 2^64-1")
    M("m_escape_offset_past", p0(lambda p: p.__setitem__("escape_offset", 1 << 40)), "escape_offset 2^40")
    M("m_escapes_more_than_numel", p0(lambda p: p.__setitem__("escapes", p["numel"] + 1)), "escapes > numel")
    M("m_escapes_max", p0(lambda p: p.__setitem__("escapes", U64_MAX)), "escapes 2^64-1")
    M("m_escapes_plus1", p0(lambda p: p.__setitem__("escapes", p["escapes"] + 1)),
      "escapes +1 (rows belong to the next param)")
    M("m_storage_index_oob", p0(lambda p: p["storage"].__setitem__(0, 10 ** 6)), "storage index 10^6")
    M("m_storage_index_neg", p0(lambda p: p["storage"].__setitem__(1, -2)), "storage index -2")
    M("m_storage_index_int_overflow", p0(lambda p: p["storage"].__setitem__(0, 1 << 40)), "storage index 2^40")
    M("m_storage_list_short", p0(lambda p: p.__setitem__("storage", p["storage"][:2])), "storage list of 2")
    M("m_storage_third_role", p0(lambda p: p["storage"].__setitem__(2, 0)), "a third storage without amsgrad")
    M("m_theta_storage_oob", p0(lambda p: p.__setitem__("theta_storage", 10 ** 6)), "theta_storage 10^6")
    M("m_theta_storage_moment", lambda m: m["params"][target(m)].__setitem__("theta_storage", moment_storage(m)),
      "theta_storage is a moment storage")
    M("m_theta_dtype_bad", p0(lambda p: p.__setitem__("theta_dtype", "Q7")), "theta_dtype Q7")
    M("m_hyper_missing", p0(lambda p: p.pop("hyper")), "params[0].hyper missing")
    M("m_hyper_lr_string", p0(lambda p: p["hyper"].__setitem__("lr", "big")), "lr a string")
    M("m_hyper_beta2_huge", p0(lambda p: p["hyper"].__setitem__("beta2", 1e308)),
      "beta2 1e308")
    M("m_hyper_eps_neg", p0(lambda p: p["hyper"].__setitem__("eps", -1.0)), "eps -1")
    M("m_hyper_beta1_2", p0(lambda p: p["hyper"].__setitem__("beta1", 2.0)), "beta1 2")
    M("m_hyper_beta2_1", p0(lambda p: p["hyper"].__setitem__("beta2", 1.0)), "beta2 1 (bias correction 0)")
    M("m_hyper_step_frac", p0(lambda p: p["hyper"].__setitem__("step", 2.5)), "step 2.5 (not a whole count)")
    M("m_hyper_step_neg", p0(lambda p: p["hyper"].__setitem__("step", -5.0)), "step -5")
    M("m_hyper_lr_0", p0(lambda p: p["hyper"].__setitem__("lr", 0.0)), "lr 0")
    M("m_hyper_amsgrad_true", p0(lambda p: p["hyper"].__setitem__("amsgrad", True)),
      "amsgrad true without a third stream")
    M("m_domain_missing", p0(lambda p: p.pop("domain")), "domain missing")
    M("m_param_not_object", lambda m: m["params"].__setitem__(0, 5), "params[0] is a number")
    M("m_storage_not_object", lambda m: m["storages"].__setitem__(0, "x"), "storages[0] is a string")
    M("m_storages_unsorted", lambda m: m["storages"].reverse(), "storages in reverse order")
    M("m_storage_overlap", st(1, lambda s: s.__setitem__("offset", s["offset"] - 1)), "storages[1] overlaps [0]")
    M("m_storage_nbytes_max", st(0, lambda s: s.__setitem__("nbytes", U64_MAX)), "storages[0].nbytes 2^64-1")
    M("m_storage_offset_max", st(0, lambda s: s.__setitem__("offset", U64_MAX)), "storages[0].offset 2^64-1")
    M("m_storage_param_oob", lambda m: m["storages"][moment_storage(m)].__setitem__("param", 10 ** 6),
      "moment storage's param 10^6")
    M("m_storage_role_3", lambda m: m["storages"][moment_storage(m)].__setitem__("role", 3), "role 3")
    M("m_storage_orphan_role", st(0, lambda s: s.__setitem__("role", 1)), "raw storage with a role")
    M("m_storage_moment_unclaimed", lambda m: m["storages"][moment_storage(m)].update(param=-1, role=-1),
      "params[0]'s exp_avg storage marked raw")
    M("m_crc_offset_past", st(0, lambda s: s.__setitem__("crc_offsets", [U64_MAX])), "crc offset 2^64-1")
    M("m_crc_offset_end", lambda m: m["storages"][0].__setitem__("crc_offsets", [m["source"]["size"] - 2]),
      "crc offset 2 bytes before the end")
    M("m_crc_offsets_string", st(0, lambda s: s.__setitem__("crc_offsets", "0")), "crc_offsets a string")
    M("m_xxh3_string", st(0, lambda s: s.__setitem__("xxh3", "abc")), "storages[0].xxh3 a string")
    M("m_raw_xxh3_wrong", lambda m: next(s for s in m["storages"] if s["param"] < 0).__setitem__(
        "xxh3", 1), "first raw storage's xxh3 wrong")

    # ---- root attributes
    v["format_other"] = (_set_attr("format", np.bytes_(b"other-container")), "format attribute 'other-container'")
    v["format_version_99"] = (_set_attr("format_version", np.uint64(99)), "format_version attribute 99")
    v["format_missing"] = (_del_attr("format"), "format attribute missing")
    # ---- a kept tensor's bytes changed in /raw, /raw's checksum recomputed: only the
    # tensor's own hash in the manifest can tell
    def kept_tensor_edited(f):
        st = get_manifest(f)["storages"]
        kept = [s for s in st if s["param"] < 0 and s["nbytes"] > 0][1]
        before = sum(s["nbytes"] for s in st if s["param"] >= 0 and s["offset"] < kept["offset"])
        d = read_dataset(f["raw"]).copy()
        d.view(np.uint8)[kept["offset"] - before + kept["nbytes"] // 2] ^= 0x10
        _replace(f, "raw", d)

    v["raw_kept_tensor_edited"] = (kept_tensor_edited, "a byte of the second kept tensor flipped in /raw "
                                   "(its checksum recomputed)")
    # ---- malformed object headers that crash libhdf5 (SIGFPE in its chunk-index setup when
    # the dataset is opened, Debian's 1.10.8; found by mutating a container, 2026-12-04): the
    # tools must still exit 2 with one line and write nothing (common/cleanup.h)
    v["hdf5_layout_rank_0"] = (_layout_patch("manifest", 2, 0), "/manifest's chunked layout message: dimensionality 0")
    v["hdf5_layout_version_1"] = (_layout_patch("manifest", 0, 1), "/manifest's chunked layout message: version 1")
    return v


def _layout_patch(path, at, value):
    """A raw-bytes edit (make() passes the file's path): in the object header of dataset
    `path`, the chunked layout message (version 3, class 2, dimensionality rank + 1, the
    chunk index address, then the chunk's dimensions and the element size as 4-byte
    little-endian numbers) gets byte `at` of the message set to `value`."""
    import re

    def edit(file_path):
        with h5py.File(file_path, "r") as f:
            ds = f[path]
            addr = h5py.h5o.get_info(ds.id).addr
            dims = list(ds.chunks) + [ds.dtype.itemsize]
        with open(file_path, "r+b") as fh:
            fh.seek(addr)
            header = fh.read(1024)
            body = b"".join(int(d).to_bytes(4, "little") for d in dims)
            m = re.search(re.escape(bytes([3, 2, len(dims)])) + b".{8}" + re.escape(body), header, re.DOTALL)
            assert m, f"no chunked layout message found for {path}"
            fh.seek(addr + m.start() + at)
            fh.write(bytes([value]))
    edit.raw_bytes = True
    return edit


def make(good, outdir):
    os.makedirs(outdir, exist_ok=True)
    with h5py.File(good, "r") as f:
        m = get_manifest(f)
    assert any(p["escapes"] > 0 for p in m["params"]), "need a good container with escapes"
    out = {}
    for name, (edit, what) in variants().items():
        path = os.path.join(outdir, name + ".ckz.h5")
        shutil.copyfile(good, path)
        if getattr(edit, "raw_bytes", False):
            edit(path)
        else:
            with h5py.File(path, "r+") as f:
                edit(f)
        out[name] = what
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out = make(sys.argv[1], sys.argv[2])
    print(f"{len(out)} hostile containers in {sys.argv[2]}", file=sys.stderr)


if __name__ == "__main__":
    main()
