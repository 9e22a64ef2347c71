"""torch.distributed.checkpoint (DCP) storage with compressed Adam/AdamW moments (torch >= 2.4).

    import torch.distributed.checkpoint as dcp
    import ckptkit.dcp
    dcp.save(state, storage_writer=ckptkit.dcp.FileSystemWriter(path, tolerance=0.01))
    dcp.async_save(state, storage_writer=ckptkit.dcp.FileSystemWriter(path))
    dcp.load(state, storage_reader=ckptkit.dcp.FileSystemReader(path))

The writer and the reader are torch's FileSystemWriter / FileSystemReader, so DCP itself
plans, dedups, stages (async_save), writes `.metadata` and reshards on load. What changes:
each rank, in `write_data`, lets torch write its `.distcp` files into a private staging folder,
then compresses them as `ckpt-compress` compresses a DCP folder (the same library call, one
process per rank): the moment items (`exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` of a
parameter chunk, with its `step` and `param_groups` items) become one container
`ckptkit-dcp-moments-<rank>-<n>.safetensors.ckz.h5`, each `.distcp` file that held them a
shell (`<name>.ckz-shell`, the file without those bytes); every other byte is torch's. The
coordinator moves the ranks' files into `ckptkit-<tag>/` (one folder per save), writes
`ckptkit-folder.json` and then `.metadata` (torch's own, the storage_data of a plain save),
so a save that did not finish has no `.metadata`, and one over an existing checkpoint leaves
it whole until then (its files are removed after). The folder is a
compressed folder of formats/folder.md: `ckpt-verify` proves it (with `--original`, against
a plain DCP save of the same state), `ckpt-restore` gives the plain folder stock `dcp.load`
reads. The reader hands every item but the moments to torch's reader (a shell's bytes read
in place); a rank's moment read items are decoded in one library call (in this process),
only the parameters they name, straight from their containers, and copied into DCP's
destination tensors: no `.distcp` file is rebuilt.
"""
import bisect
import contextlib
import dataclasses
import errno
import math
import json
import os
import pickle
import re
import shutil
import uuid
import warnings

import torch
from torch.distributed.checkpoint import filesystem as _fs
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, SavePlan

from . import _ckptkit, _compress_opts, _paths, _report, _threads
from ._errors import BadInput, CkptkitWarning, FileNotFound, NotADirectory
from ._torch import SeekableReader

__all__ = ["FileSystemWriter", "FileSystemReader"]

_MANIFEST = "ckptkit-folder.json"
_TOOL = "ckptkit.dcp"


@dataclasses.dataclass
class _Prefix(_fs._StoragePrefix):
    """torch's per-rank file prefix ("__<rank>_") and the save's tag (names the staging and
    part folders, so that a killed earlier save's leftovers are never taken)."""
    tag: str = ""


def _hyper_fqn(fqn):
    """True for the items the certificate needs beside the moments: step and param_groups."""
    return ".param_groups" in fqn or (".state." in fqn and fqn.endswith(".step"))


def _rank_threads(threads):
    """The CPU threads a rank's library call uses: `threads` when given (> 0), else this process's
    cores shared among the ranks on its node (LOCAL_WORLD_SIZE, which torchrun sets; all of
    them when unset), at least 1. Ranks that each took every core would oversubscribe the
    node: the same work, more switching."""
    if threads:
        return threads
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(local)) if local.isdigit() and int(local) > 0 else 0


class FileSystemWriter(_fs.FileSystemWriter):
    """torch's FileSystemWriter (same arguments) whose ranks compress their Adam/AdamW
    moments before the checkpoint is complete. `options`: ckpt-compress's (tolerance=0.01
    in units of lr, grad_bound=1.0, codec="vlog", optimizer="auto", threads=None, lr, beta1,
    beta2, eps, weight_decay, ...; hyper-parameters the state dict lacks; threads=None: the
    node's cores shared among its ranks, LOCAL_WORLD_SIZE as torchrun sets it). Checked here
    (BadInput). `reports`: this rank's compress Reports of its saves. A state without
    Adam/AdamW moments is written exactly, with a CkptkitWarning."""

    def __init__(self, path, single_file_per_rank=True, sync_files=True, thread_count=1,
                 per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False, overwrite=True, **options):
        super().__init__(path, single_file_per_rank=single_file_per_rank, sync_files=sync_files,
                         thread_count=thread_count, per_thread_copy_ahead=per_thread_copy_ahead,
                         cache_staged_state_dict=cache_staged_state_dict, overwrite=overwrite)
        self._opts = _compress_opts(_TOOL, **options)
        self._opts["threads"] = _rank_threads(self._opts["threads"])
        self._local_items = []
        self._tag = ""
        self.reports = []

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if not self.use_collectives:
            raise BadInput(f"{_TOOL}: error: {self.path}: use_collectives=False (a .metadata per rank) is not "
                           "supported; save with collectives", os.fspath(self.path), "use_collectives=False")

    def prepare_local_plan(self, plan):
        self._local_items = list(plan.items)   # before DCP's dedup: this rank's step / param_groups items
        return super().prepare_local_plan(plan)

    def prepare_global_plan(self, plans):
        self._tag = uuid.uuid4().hex[:16]
        return [dataclasses.replace(p, storage_data=_Prefix(p.storage_data.prefix, self._tag))
                for p in super().prepare_global_plan(plans)]

    def storage_meta(self):
        meta = super().storage_meta()
        meta.checkpoint_id = getattr(self, "_root", None) or self.path
        return meta

    def _in(self, folder, fn):
        """fn() with torch writing into `folder` (self.path for the call)."""
        root, self._root = self.path, self.path
        self.path = folder
        try:
            return fn()
        finally:
            self.path, self._root = root, None

    def write_data(self, plan, planner):
        root = os.fspath(self.path)
        prefix = plan.storage_data.prefix
        tag = getattr(plan.storage_data, "tag", "") or uuid.uuid4().hex[:16]
        rank = prefix.strip("_")
        stage = os.path.join(root, f".ckptkit-stage-{tag}-{rank}")
        part = os.path.join(root, f".ckptkit-part-{tag}-{rank}")
        os.makedirs(stage)
        try:
            results = self._in(stage, lambda: super(FileSystemWriter, self).write_data(plan, planner).value())
            # step and param_groups items that DCP's dedup gave another rank: staged here too
            # (not part of the checkpoint), so that this rank's moments have their hyper-parameters
            planned = {it.index for it in plan.items}
            hyper = [it for it in self._local_items if it.index not in planned and _hyper_fqn(it.index.fqn)]
            extra = []
            if hyper:
                hp_plan = SavePlan(hyper, storage_data=_fs._StoragePrefix(".ckptkit-hp-"))
                extra = self._in(stage, lambda: _fs._FileSystemWriter.write_data(self, hp_plan, planner).value())
            md = Metadata(state_dict_metadata={})
            md.storage_data = {r.index: r.storage_data for r in results + extra}
            with open(os.path.join(stage, ".metadata"), "wb") as f:
                pickle.dump(md, f)
            opts = dict(self._opts, dcp_unit_tag=f"{rank}-", serial=True, force=False)
            try:
                rep = _report(*_ckptkit.compress(stage, part, opts))
            except BadInput as e:   # named after the checkpoint and the rank, not the staging paths
                what = e.reason if isinstance(e.reason, str) and e.reason else str(e)
                e.message = f"{_TOOL}: error: {root}: rank {rank}: {what}"
                e.args, e.file = (e.message,), root
                raise
            self.reports.append(rep)
            staging = re.compile(re.escape(root) + r"/\.{1,2}ckptkit-[^/:]*(?:/\.ckptkit-[^/:]*)*/")
            for line in rep.warnings:   # named after the checkpoint and the rank, not the staging paths
                warnings.warn(staging.sub(f"{root}: rank {rank}: ", line), CkptkitWarning, stacklevel=2)
            # its files stay in `part` until the coordinator commits the save (finish)
        except BaseException:
            shutil.rmtree(part, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        fut = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        root = os.fspath(self.path)
        tag = self._tag
        parts = [os.path.join(root, f".ckptkit-part-{tag}-{i}") for i in range(len(results))]
        missing = [p for p in parts if not os.path.isdir(p)]
        if missing:
            raise BadInput(f"{_TOOL}: error: {missing[0]}: a rank's compressed files are missing; the save did not "
                           "finish", missing[0], "missing part")
        stage = os.path.join(root, f".ckptkit-meta-{tag}")
        os.makedirs(stage, exist_ok=True)
        try:
            self._in(stage, lambda: super(FileSystemWriter, self).finish(metadata, results))
            # the ranks' files into ckptkit-<tag>/, the manifest, .metadata last (a save is
            # readable only when whole), then what the checkpoint it replaces left
            _ckptkit.commit_dcp_save(root, parts, os.path.join(stage, ".metadata"), tag)
            with open(os.path.join(root, _MANIFEST)) as f:   # one note for the save, not one per rank
                if not any(r.get("virtual") for r in json.load(f)["files"]):
                    warnings.warn(f"{_TOOL}: {root}: no Adam/AdamW moments compressed (no rank's state has any); the "
                                  "files are written exactly", CkptkitWarning, stacklevel=2)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            for p in parts:
                shutil.rmtree(p, ignore_errors=True)


class _RestoredFile(SeekableReader):
    """A `.distcp` file stored as a shell, read as the original where a read item overlaps a
    moment storage the reader does not decode straight into DCP's tensors (a region that is
    not a whole cut): at the first read the library rebuilds the whole file in memory (the
    unit decoded, hashes checked), and every read comes from there. Items outside the cuts
    are read from the shell itself (FileSystemReader.set_up_storage_reader)."""

    def __init__(self, root, rel, size):
        self._root, self._rel = root, rel
        super().__init__(size)
        self._full = None

    def readinto(self, b):
        n = max(0, min(len(b), self.size - self.pos))
        if n:
            if self._full is None:
                buf = _ckptkit.restore_bytes(self._root, {}, _TOOL, self._rel)[0]
                self._full = os.fdopen(os.dup(buf.fileno()), "rb")
            n = os.preadv(self._full.fileno(), [memoryview(b)[:n]], self.pos)
        self.pos += n
        return n

    def close(self):
        if self._full is not None:
            self._full.close()
        super().close()


def _check_pieces(root, row, spans):
    """Check the pieces of `xxh3_unit` bytes of the stored file of manifest `row` that the byte
    ranges `spans` ((offset, length) in the stored file; None: the whole file) touch against
    the manifest's `xxh3_units`, in one library call per run of consecutive pieces."""
    unit, want = int(row["xxh3_unit"]), row["xxh3_units"]
    pieces = set(range(len(want))) if spans is None else \
        {k for off, n in spans if n > 0 for k in range(off // unit, (off + n - 1) // unit + 1)}
    run = []
    for k in sorted(pieces) + [None]:
        if run and (k is None or k != run[-1] + 1):
            _ckptkit.check_stored_units(root, row["stored"], int(row["size"]), unit, want, run[0], len(run))
            run = []
        if k is not None:
            run.append(k)


class _RestoringFileSystem(_fs.FileSystem):
    """torch's FileSystem, except that a file stored otherwise than under its name opens as its
    original bytes: a shell as a _RestoredFile, a container restored in memory; a file read
    in place (a copy, or a shell under its stored name) is checked against the manifest's
    XXH3 first: the pieces of `xxh3_units` the reader's read items touch (the whole file for
    a read it did not plan), or the whole file where the manifest lists no `xxh3_units`."""

    def __init__(self, reader):
        super().__init__()
        self._reader = reader

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        root = os.fspath(self._reader.path)
        rows = self._reader._rows()
        rel = os.path.relpath(os.fspath(path), root)
        row = rows.get(rel) or self._reader._shells().get(rel)
        if mode == "rb" and row is not None and not row["container"] and (not row.get("shell") or row["stored"] == rel):
            if "xxh3_units" in row:   # read in place: the pieces this rank's reads touch checked first
                _check_pieces(root, row, self._reader._spans.get(rel))
            else:   # a manifest before xxh3_units: the whole file checked first
                _ckptkit.check_stored(root, row["path"])
        if mode != "rb" or row is None or row["stored"] == rel:
            with super().create_stream(path, mode) as s:
                yield s
            return
        if row.get("shell"):
            size = os.path.getsize(os.path.join(root, row["stored"])) + sum(c["length"] for c in row["cuts"])
            with _RestoredFile(root, rel, size) as f:
                yield f
            return
        buf = _ckptkit.restore_bytes(root, {}, _TOOL, rel)[0]
        with os.fdopen(os.dup(buf.fileno()), "rb") as f:
            del buf
            yield f


def _span(sizes, offsets, lengths):
    """(first element, count) of the region `offsets`/`lengths` of a row-major tensor of
    `sizes` when its elements are contiguous, else None."""
    d = next((i for i, n in enumerate(lengths) if n != 1), len(sizes) - 1)
    if any(lengths[i] != sizes[i] for i in range(d + 1, len(sizes))):
        return None
    first, stride = 0, 1
    for i in reversed(range(len(sizes))):
        first += offsets[i] * stride
        stride *= sizes[i]
    return first, math.prod(lengths)


class FileSystemReader(_fs.FileSystemReader):
    """torch's FileSystemReader for folders ckptkit.dcp.FileSystemWriter (or ckpt-compress)
    wrote, and for plain DCP folders: DCP gets exactly the tensors a plain folder gives,
    whatever the loading world size. Each rank decodes the moment chunks its read items
    name (checksums checked) into DCP's tensors; torch's reader reads the rest. BadInput (an OSError for path errors) for
    a folder without `.metadata` (not a checkpoint, or a save that did not finish) or
    with a damaged or missing file. `threads`: the decode's CPU threads (None: the node's
    cores shared among its ranks, as the writer's)."""

    def __init__(self, path, *, threads=None):
        super().__init__(path)
        self.fs = _RestoringFileSystem(self)
        self._threads = _rank_threads(_threads(_TOOL, threads))
        self._manifest = self._shell_rows = None
        self._cuts = None
        self._md = None
        self._spans = {}

    def _rows(self):
        if self._manifest is None:
            p = os.path.join(os.fspath(self.path), _MANIFEST)
            rows = {}
            if os.path.exists(p):
                with open(p) as f:
                    rows = {r["path"]: r for r in json.load(f)["files"]}
            self._manifest = rows
        return self._manifest

    def reset(self, checkpoint_id=None):
        super().reset(checkpoint_id)
        self._manifest = self._shell_rows = None
        self._cuts = None

    def _shells(self):
        """Stored name -> manifest row of each `.distcp` file stored as a shell."""
        if self._shell_rows is None:
            self._shell_rows = {r["stored"]: r for r in self._rows().values() if r.get("shell")}
        return self._shell_rows

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._md = metadata
        # items of shells outside every cut: read by torch from the shell, at their offsets there
        data, rows, per_file = dict(self.storage_data), self._rows(), {}
        for k, v in data.items():
            if rows.get(v.relative_path, {}).get("shell"):
                per_file.setdefault(v.relative_path, []).append(k)
        for rel, keys in per_file.items():
            row = rows[rel]
            at = _ckptkit.shell_offsets(json.dumps(row["cuts"]), [(data[k].offset, data[k].length) for k in keys])
            for k, o in zip(keys, at):
                if o >= 0:
                    data[k] = dataclasses.replace(data[k], relative_path=row["stored"], offset=o)
        self.storage_data = data

    def _moment_of(self, req):
        """(gathered-moments entry, gathered tensor) of a read item that is a moment cut out
        of a shell, else None (torch's reader reads it)."""
        if req.type != LoadItemType.TENSOR:
            return None
        if self._cuts is None:   # shell path -> (sorted cut offsets, cuts, moments entry)
            self._cuts = {}
            for rel, row in self._rows().items():
                if row.get("shell"):
                    cuts = sorted(row["cuts"], key=lambda c: c["offset"])
                    self._cuts[rel] = ([c["offset"] for c in cuts], cuts, row["moments"])
        info = self.storage_data[req.storage_index]
        found = self._cuts.get(info.relative_path)
        if found is None:
            return None
        offsets, cuts, moments = found
        i = bisect.bisect_left(offsets, info.offset)
        if i < len(cuts) and cuts[i]["offset"] + cuts[i]["length"] <= info.offset + info.length:
            return moments, cuts[i]["tensor"]
        return None

    def read_data(self, plan, planner):
        """torch's read_data, except that the moment items of shells are decoded by the
        library straight from their containers into DCP's tensors."""
        moments, rest = [], []
        for req in plan.items:
            m = self._moment_of(req)
            if m is None:
                rest.append(req)
            else:
                moments.append((req, m))
        if moments:
            self._read_moments(moments, planner)
        if rest:
            self._spans = {}   # stored file -> the (offset, length) torch's reader reads there
            for req in rest:
                info = self.storage_data[req.storage_index]
                self._spans.setdefault(info.relative_path, []).append((info.offset, info.length))
            try:
                super().read_data(dataclasses.replace(plan, items=rest), planner).wait()
            finally:
                self._spans = {}
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_moments(self, moments, planner):
        """Decode the moment read items (req, (entry, tensor)) into DCP's tensors: straight
        into each target when it is a contiguous run of the stored chunk with its dtype,
        else into a temporary copied over as torch's reader copies."""
        reads, later = [], []
        for req, (entry, tensor) in moments:
            idx = req.storage_index
            tmd = self._md.state_dict_metadata[idx.fqn]
            chunk = next(c for c in tmd.chunks if list(c.offsets) == list(idx.offset or [0] * len(c.offsets)))
            sizes, dtype = list(chunk.sizes), tmd.properties.dtype
            numel = math.prod(sizes)
            span = _span(sizes, list(req.storage_offsets), list(req.lengths))
            first, count = span if span is not None else (0, numel)   # not contiguous: the whole chunk
            target = planner.resolve_tensor(req).detach()
            if target.size() != torch.Size(req.lengths):
                raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {list(req.lengths)}")
            direct = span is not None and target.dtype == dtype and target.is_contiguous() and target.device.type == "cpu"
            dest = target if direct else torch.empty(count, dtype=dtype)
            reads.append((entry, tensor, first, count, numel, dtype.itemsize, dest.data_ptr()))
            later.append((req, target, None if direct else dest, sizes if span is None else None))
        _ckptkit.read_dcp_moments(os.fspath(self.path), reads, self._threads)
        for req, target, tmp, whole in later:
            if tmp is not None:
                src = tmp.view(list(req.lengths)) if whole is None else \
                    _fs.narrow_tensor_by_index(tmp.view(whole), req.storage_offsets, req.lengths)
                target.copy_(src)
            planner.commit_tensor(req, target)

    def read_metadata(self, *args, **kwargs):
        root = os.fspath(self.path)
        if not os.path.isdir(root):
            if not os.path.exists(root):
                raise FileNotFound(f"{_TOOL}: error: {root}: no such folder", root, "no such folder")
            raise NotADirectory(f"{_TOOL}: error: {root}: not a folder (a DCP checkpoint is a folder)", root, "not a folder")
        if not os.path.isfile(os.path.join(root, ".metadata")):
            what = "no .metadata: not a DCP checkpoint, or a save that did not finish"
            raise FileNotFound(f"{_TOOL}: error: {root}: {what}", root, what)
        return super().read_metadata(*args, **kwargs)
