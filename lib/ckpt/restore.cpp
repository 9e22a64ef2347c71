// ckpt-restore: the source file rebuilt in its own format. Raw bytes are written in file
// order, moment storages are decoded chunk by chunk and written in place, zip CRC-32
// fields of changed entries are recomputed (ISA-L's crc32_gzip_refl: zlib's crc32, with
// carry-less multiplication) and patched.
#include <isa-l/crc.h>


#include <algorithm>
#include <memory>

#include "container/reader.h"
#include "ckpt/pipeline.h"
#include "container/values.h"
#include "common/error.h"
#include "common/file.h"
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
/// and the zip CRC-32 fields of those storages recomputed.
void restore_moments(const ContainerReader& cr, FileWriter& w, Progress& prog) {
    const auto& man = cr.manifest();
    std::vector<uint8_t> bytes[3];
    ContainerReader::Chunk chunk;  // reused by every parameter
    w.flush_buffered();  // from here on only pwrite: one per role at a time, on several threads
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        const auto& e = man.params[j];
        const std::size_t es = float_dtype_size(e.dtype);
        uint32_t crc[3] = {0, 0, 0};  // zip's CRC-32 (ISO-HDLC), chained over the chunks
        auto write = [&](ContainerReader::Chunk& c) {  // a role per thread: its bytes, write and CRC
            codec::parallel_items(std::size_t(e.moments()), [&](unsigned, std::size_t k0, std::size_t k1) {
                for (std::size_t k = k0; k < k1; ++k) {
                    const uint8_t* out = ContainerReader::storage_bytes(e.dtype, c, int(k), bytes[k]);
                    const auto& st = man.storages[std::size_t(e.storage[k])];
                    w.pwrite(st.offset + c.begin * es, out, c.n * es);
                    crc[k] = crc32_gzip_refl(crc[k], out, c.n * es);
                }
            });
            prog.advance(c.n * es * std::size_t(e.moments()));
        };
        cr.for_each_chunk(j, ContainerReader::default_decode_chunk(), ContainerReader::Want::Values, write, &chunk);
        for (int k = 0; k < e.moments(); ++k) {
            const uint32_t v = uint32_t(crc[k]);
            const uint8_t le[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
            for (uint64_t off : man.storages[std::size_t(e.storage[k])].crc_offsets) w.pwrite(off, le, 4);
        }
        prog.item_done();
    }
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
