// ckpt-restore: the source file rebuilt in its own format. Raw bytes are written in file
// order, moment storages are decoded chunk by chunk and written in place, zip CRC-32
// fields of changed entries are recomputed (ISA-L's crc32_gzip_refl: zlib's crc32, with
// carry-less multiplication) and patched.
#include <isa-l/crc.h>


#include <algorithm>
#include <array>
#include <future>
#include <memory>

#include "container/reader.h"
#include "ckpt/pipeline.h"
#include "container/values.h"
#include "common/error.h"
#include "common/file.h"
#include "common/lane.h"
#include "common/progress.h"
#include "io/file.h"

namespace ckpt {

using container::ContainerReader;

namespace {

namespace ct = container;

/// Every byte outside moment storages from /raw, in file order, in one pass that also
/// checks /raw's checksum (damaged: CheckFailed, as an unreadable /raw) and each kept
/// tensor against its hash (CheckFailed); moment storages are left as holes for
/// restore_moments.
void restore_raw(const ContainerReader& cr, FileWriter& w, Progress& prog) {
    const auto scan = cr.scan_source(
        [&](const uint8_t* p, std::size_t n) {
            w.write(p, n);
            prog.advance(n);
        },
        [&](uint64_t n) { w.skip(n); });  // filled in place by restore_moments
    if (!scan.raw_ok) cr.check_damage({ct::kRaw});
    if (scan.bad_tensors)
        throw CheckFailed(cr.path() + ": stored tensor bytes at source offset " +
                          std::to_string(cr.manifest().storages[std::size_t(scan.first_bad)].offset) +
                          " do not match their hash");
}

/// Every coded parameter decoded chunk by chunk (escapes exact) into its moment storages,
/// and the zip CRC-32 fields of those storages recomputed. Two stages: the caller and the
/// pool decode chunk c+1 while a lane writes chunk c and chains its CRC-32s (pwrite from one
/// thread: concurrent writes to one file only queue on its inode lock); the same bytes at
/// the same offsets as one thread writes them.
void restore_moments(const ContainerReader& cr, FileWriter& w, Progress& prog) {
    const auto& man = cr.manifest();
    ContainerReader::Chunk chunk;       // decoded into (reused by every parameter)
    ContainerReader::Chunk written[2];  // swapped out of `chunk`, each written by the lane
    std::vector<uint8_t> bytes[2][3];
    std::vector<std::array<uint32_t, 3>> crc(man.params.size(), {0, 0, 0});   // zip's CRC-32 (ISO-HDLC), chained
    std::future<void> pending[2];
    std::vector<std::future<void>> patched;
    w.flush_buffered();  // from here on only pwrite
    SerialLane lane(codec::cpu_threads() > 1);   // declared after the buffers: its tasks end first
    int next = 0;
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        const auto& e = man.params[j];
        const std::size_t es = float_dtype_size(e.dtype);
        auto write = [&](ContainerReader::Chunk& c) {
            const int b = next;
            next ^= 1;
            if (pending[b].valid()) pending[b].get();   // the lane is done with this buffer (rethrows its error)
            std::swap(c, written[b]);
            pending[b] = lane.submit([&, b, j, es] {
                const auto& e = man.params[j];
                ContainerReader::Chunk& d = written[b];
                for (int k = 0; k < e.moments(); ++k) {
                    const uint8_t* out = ContainerReader::storage_bytes(e.dtype, d, k, bytes[b][k]);
                    w.pwrite(man.storages[std::size_t(e.storage[k])].offset + d.begin * es, out, d.n * es);
                    crc[j][std::size_t(k)] = crc32_gzip_refl(crc[j][std::size_t(k)], out, d.n * es);
                }
            });
            prog.advance(written[b].n * es * std::size_t(e.moments()));
        };
        cr.for_each_chunk(j, ContainerReader::default_decode_chunk(), ContainerReader::Want::Values, write, &chunk);
        patched.push_back(lane.submit([&, j] {   // after the parameter's last chunk
            const auto& e = man.params[j];
            for (int k = 0; k < e.moments(); ++k) {
                const uint32_t v = crc[j][std::size_t(k)];
                const uint8_t le[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
                for (uint64_t off : man.storages[std::size_t(e.storage[k])].crc_offsets) w.pwrite(off, le, 4);
            }
        }));
        prog.item_done();
    }
    for (auto& f : pending)
        if (f.valid()) f.get();
    for (auto& f : patched) f.get();
}
}  // namespace

namespace {

/// What both restores report before writing anything.
Report restore_report(const ContainerReader& cr, const std::string& path, const std::string& out) {
    const auto& man = cr.manifest();
    Report rep("ckpt-restore", path, out, codec::kind_name(man.codec), man.tolerance, man.grad_bound);
    rep.horizon = man.horizon;
    rep.file_bytes_in = io::InputFile(path).size();
    rep.rows = tensor_rows(cr);
    rep.bits = moment_bits(cr);
    rep.escape_causes = escape_causes(cr);
    return rep;
}

/// The source rebuilt into `w` (a file or a descriptor), every check made; closes `w`. Errors
/// other than BadInput and CheckFailed are BadInput naming `out`.
void restore_into(const ContainerReader& cr, FileWriter& w, const std::string& out, const RestoreOptions& o) {
    const auto& man = cr.manifest();
    try {
        Progress prog(o.progress, "ckpt-restore", man.source_size, man.params.size());
        restore_raw(cr, w, prog);  // checks /raw as it reads it
        // the moment datasets' checksums are taken as they are read (DatasetReader): checked
        // after, before the rename; a decode that fails on damage is reported as the damage
        try {
            restore_moments(cr, w, prog);
        } catch (const std::runtime_error&) {
            cr.check_damage();
            throw;
        }
        cr.check_damage();
        w.close();
    } catch (const std::runtime_error& e) {
        if (dynamic_cast<const BadInput*>(&e) || dynamic_cast<const CheckFailed*>(&e)) throw;
        throw BadInput(out, e.what());
    }
}

}  // namespace

Report restore(const std::string& path, const std::string& out, const RestoreOptions& o) {
    const ContainerReader cr(path);
    const auto& man = cr.manifest();
    const bool st_out = out.ends_with(".safetensors");
    if (st_out != (man.source_format == "safetensors"))
        throw BadInput(out, "the source was " + man.source_format +
                                "; restore writes the source format (name the output accordingly)");
    Report rep = restore_report(cr, path, out);
    AtomicOutput atomic(out);
    {
        std::unique_ptr<FileWriter> w;
        try {
            w = std::make_unique<FileWriter>(atomic.temp_path());
        } catch (const std::runtime_error& e) {
            throw BadInput(out, e.what());
        }
        restore_into(cr, *w, out, o);
    }
    atomic.commit();
    rep.file_bytes_out = io::InputFile(out).size();
    return rep;
}

Report restore_to_fd(const std::string& path, int fd, const RestoreOptions& o) {
    const ContainerReader cr(path);
    Report rep = restore_report(cr, path, "");
    const uint64_t n = cr.manifest().source_size;
    FileWriter w(fd, n, path + " (restored into memory)");
    restore_into(cr, w, path, o);
    rep.file_bytes_out = n;
    return rep;
}

}  // namespace ckpt
