// Writing a container (formats/container.md), the counterpart of ContainerReader
// (reader.h): /raw (the source bytes outside moment storages, in file order), the
// moment streams of every role (codes, block parameters, escape rows, escape index) with
// each parameter's stream offsets, then the manifest and the root attributes. /raw may
// still grow while parameters are encoded (their chunks then interleave in the file); the
// datasets are created in a fixed order, so the same calls give the same container bytes.
// Errors: std::runtime_error from HDF5 (the caller names the output).
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "container/h5.h"
#include "container/manifest.h"

namespace ckpt::container {

class ContainerWriter {
public:
    /// Create (truncate) the HDF5 file `path` and its /raw dataset.
    explicit ContainerWriter(const std::string& path);
    ~ContainerWriter();
    ContainerWriter(const ContainerWriter&) = delete;
    ContainerWriter& operator=(const ContainerWriter&) = delete;

    /// Append n source bytes to /raw (until end_raw; before or after begin_moments: compress
    /// appends a parameter's theta storage to /raw while it encodes that parameter).
    void append_raw(const void* data, std::size_t n);
    /// append_raw without a copy (Appender::room_bytes / commit_bytes): room for up to n
    /// bytes of /raw (n set to what fits); write them there, then raw_commit(n).
    unsigned char* raw_room(std::size_t& n);
    void raw_commit(std::size_t n);
    /// Whether stage_raw may be used (/raw's chunks are written directly: Appender::direct).
    bool raw_stageable() const;
    /// append_raw from another thread than the one calling libhdf5 (Appender::stage_bytes:
    /// no libhdf5 call; nothing else on /raw meanwhile); that thread then calls settle_raw().
    void stage_raw(const void* data, std::size_t n);
    void settle_raw();
    /// Close /raw (finish() does when not called); returns its stored bytes.
    uint64_t end_raw();
    /// Create the moment streams: 3 roles when any parameter of `m` keeps max_exp_avg_sq
    /// (amsgrad), else 2, for m.codec. Once, before the first begin_param.
    void begin_moments(const Manifest& m);
    /// Start parameter e: its code_offset (values; segments for an entropy-coded codec),
    /// block_offset (blocks; 0 for codecs
    /// without block parameters) and escape_offset (rows) become the streams' current ends;
    /// escapes and max_bound restart at 0. e must stay alive until the next begin_param.
    void begin_param(ParamEntry& e);
    /// Append one encoded chunk of the current parameter, starting at its coordinate i0:
    /// codes and block parameters of its e.moments() roles, zeros of the same size in the
    /// roles it lacks (so every role stays aligned with the offsets), and one escape row per
    /// co.escapes entry (chunk-local coordinates, ascending): the delta-coded coordinate in
    /// the index, and escape_bits[k][q] (raw bits of role k, q-th escape) per role, 0 in the
    /// roles it lacks. Adds to e.escapes and e.escape_causes and raises e.max_bound to
    /// co.max_bound. Entropy-coded codecs: i0 must be a multiple of codec::kSegment and every
    /// chunk but a parameter's last a whole number of segments (std::logic_error otherwise).
    void append_chunk(uint64_t i0, const codec::ChunkOut& co, const std::array<std::vector<uint32_t>, 3>& escape_bits);
    /// Close the streams, write `m` as /manifest and the root attributes format and
    /// format_version, flush and close the file (reporting disk-full and the like). Returns
    /// the xxh3 of the manifest's text (read_manifest's `written_xxh3`).
    uint64_t finish(const Manifest& m);

private:
    // declared in this order so they close in the order the container always had
    Handle file_;
    std::unique_ptr<Appender> raw_;
    std::vector<std::unique_ptr<Appender>> codes_, params_, escv_;   ///< per role
    std::vector<std::unique_ptr<Appender>> segs_;                    ///< per role, entropy-coded codecs
    bool segmented_ = false;
    /// Entropy-code the chunk's codes (n per role, little-endian bytes, from coordinate i0,
    /// a multiple of kSegment; params_of(k): role k's block parameters) segment by segment:
    /// out[k][j] the bytes of role k's j-th segment; exp_avg_sq row-predicted
    /// (codec::vlog_rows), its first segment deciding cur_->row_predict at i0 = 0. Every
    /// other segment is coded in the worker pool (codec::parallel_items): the bytes do not
    /// depend on the thread count.
    std::vector<std::vector<std::vector<uint8_t>>> encode_segments(uint64_t i0, std::size_t n,
                                                                   const std::function<const uint8_t*(int)>& codes_of,
                                                                   const std::function<const int16_t*(int)>& params_of);
    /// One coded segment of role k into /moments/codes, its end into /moments/segments.
    void put_segment(int k, const std::vector<uint8_t>& bytes);
    std::unique_ptr<Appender> escidx_;
    int code_bytes_ = 1, params_per_block_ = 0;
    ParamEntry* cur_ = nullptr;
    uint64_t last_escape_ = 0;                                     ///< coordinate of cur_'s last escape
    std::vector<uint8_t> zero_codes_;
    std::vector<int16_t> zero_params_;
};

}  // namespace ckpt::container
