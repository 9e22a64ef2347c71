// Streaming access to a container (the reader beside writer.h): the manifest, raw bytes by
// source offset, one parameter's decoded moments chunk by chunk with its escapes applied
// (decoded by the backend of codec::decode_device(), codec/backend.h), and the stored bytes
// the report figures share out (ckpt/report.h). Used by ckpt-verify and ckpt-restore.
// Errors: BadInput naming the container and the part.
#pragma once
#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "common/error.h"
#include "common/xxh3.h"
#include "container/h5.h"
#include "container/manifest.h"

namespace ckpt::container {

class ContainerReader {
public:
    /// `written`, `written_xxh3`: the manifest the caller wrote into this container and the
    /// hash of its text (container::read_manifest's).
    explicit ContainerReader(const std::string& path, const container::Manifest* written = nullptr,
                             uint64_t written_xxh3 = 0);
    const container::Manifest& manifest() const { return man_; }
    const std::string& path() const { return path_; }
    /// Read source bytes [off, off+n) that lie outside moment storages (from /raw).
    void read_raw(uint64_t off, uint64_t n, void* out) const;
    /// Stream source bytes [from, to) that lie outside moment storages (a span of
    /// container::source_spans that is not a moment) from /raw, in pieces of at most 1 MiB:
    /// fn(uint64_t source_offset, const uint8_t* bytes, std::size_t n), each piece inside
    /// one /raw chunk and handed over in place (no copy), or copied where
    /// /raw has no direct chunk path. Throws BadInput.
    template <class Fn>
    void for_each_raw_piece(uint64_t from, uint64_t to, Fn fn) const;
    /// What scan_source found in /raw.
    struct SourceScan {
        bool raw_read = false;     ///< every byte of /raw read (false: unreadable; the scan stopped)
        bool raw_ok = false;       ///< read, and /raw's checksum matches
        uint64_t tensors = 0;      ///< kept tensors (storages outside the moments) hashed
        uint64_t bad_tensors = 0;  ///< of those, how many do not match their manifest hash
        int64_t first_bad = -1;    ///< the first such, an index into manifest().storages
    };
    /// One pass over the source as /raw keeps it, in source order: piece(const uint8_t*
    /// bytes, std::size_t n) for the bytes outside moment storages, in pieces of at most
    /// 1 MiB, and hole(uint64_t n) for each moment storage (bytes /raw does not hold).
    /// Every byte of /raw is read once; its checksum and each kept tensor's hash are taken
    /// on the way. A /raw that cannot be read ends the scan (raw_read false). piece and hole
    /// must not throw BadInput (theirs would read as an unreadable /raw).
    template <class Piece, class Hole>
    SourceScan scan_source(Piece piece, Hole hole) const;
    /// The checksums of every dataset but /raw (scan_source checks that one); returns the
    /// paths that fail.
    std::vector<std::string> damaged_datasets() const;
    /// CheckFailed naming the damaged datasets (`bad`, else every one damaged_datasets()
    /// finds); returns when there are none.
    void check_damage(std::vector<std::string> bad = {}) const;
    /// Tensor setup (codec, hyper-parameters, domain) of parameter j.
    codec::TensorSetup setup(std::size_t j) const;
    /// Stored (compressed) bytes of all moment datasets plus the manifest's params part:
    /// role_bytes over the roles plus shared_bytes.
    uint64_t moment_bytes() const;
    /// Stored bytes of role k's moment datasets (0 exp_avg, 1 exp_avg_sq, 2 max_exp_avg_sq):
    /// codes, block parameters, escape values and, for entropy-coded codecs, the segment
    /// index; 0 for a role the container does not store.
    uint64_t role_bytes(std::size_t k) const;
    /// Stored bytes every role shares: the escape index and the manifest's params part.
    uint64_t shared_bytes() const;
    /// Stored bytes of parameter j's segments, all roles (its share of /moments/codes);
    /// 0 for a codec without entropy coding.
    uint64_t coded_bytes(std::size_t j) const;

    /// What a chunk read decodes: the codes only (entropy decoding and row prediction
    /// undone: compress's self-check compares them with what it encoded), the values too
    /// (restore), the values and every coordinate's re-derived certificate (verify with the
    /// original), or the certificates without the values (verify alone: no value is stored).
    enum class Want { Codes, Values, Bounds, Certificates };
    /// One decoded chunk of parameter j, coordinates [begin, begin + n): codes per role
    /// (code_bytes per value, escaped coordinates 0), values per role (escapes applied; with
    /// Want::Values and Want::Bounds only), the chunk's escaped coordinates (chunk-local)
    /// with their exact bits, and with Want::Bounds / Certificates the re-derived certificate
    /// of every coordinate. codes[k] and values[k] (where decoded) are valid up to n: their
    /// buffers only grow, so they may be longer.
    struct Chunk {
        uint64_t begin = 0;
        std::size_t n = 0;
        std::array<std::vector<uint8_t>, 3> codes;
        std::array<std::vector<float>, 3> values;
        std::vector<uint32_t> escaped;
        std::array<std::vector<uint32_t>, 3> escaped_bits;
        std::vector<double> bounds;
        std::vector<float> theta;
        /// decode's scratch, reused chunk after chunk: each role's block parameters, and
        /// theta's storage bytes
        std::array<std::vector<int16_t>, 3> params;
        std::vector<uint8_t> theta_bytes;
        /// Where decode puts role k's values (Want::Values): into(k, begin, n), when set, may
        /// return memory for the chunk's n floats (a destination tensor's, so that no copy
        /// follows), else nullptr for values[k].
        std::function<float*(int k, uint64_t begin, std::size_t n)> into;
        /// Role k's decoded values, escapes in place once storage_bytes ran: into's memory or
        /// values[k]'s.
        std::array<float*, 3> at{};
    };
    /// Role k's storage bytes (`dtype`: the parameter's moment type) of the decoded chunk
    /// `c` (Want::Values): the values as `dtype`, each escaped coordinate's exact bits in
    /// place. Returns c.n elements: c's own values for F32 (changed in place), else `scratch`.
    static uint8_t* storage_bytes(DType dtype, Chunk& c, int k, std::vector<uint8_t>& scratch);
    /// The decode chunk for this process: the chunk of the backend chunks are decoded
    /// with (codec/backend.h, codec::decode_device()).
    static std::size_t default_decode_chunk();
    /// Iterate parameter j in chunks of `chunk` coordinates; calls fn(Chunk&) (fn may
    /// change the chunk's buffers: restore applies escapes in place). `scratch`, when given,
    /// holds the chunk, so a caller that passes the same one for every parameter reuses
    /// its buffers (they only grow: no allocation and zero-fill per parameter).
    template <class Fn>
    void for_each_chunk(std::size_t j, std::size_t chunk, Want want, Fn fn, Chunk* scratch = nullptr) const;

private:
    void decode(std::size_t j, uint64_t begin, std::size_t n, Want want, Chunk& c,
                uint64_t& esc_row, uint64_t& esc_pos) const;
    std::string path_;
    container::Handle file_;
    container::Manifest man_;
    uint64_t manifest_stored_ = 0, manifest_text_ = 0;  ///< /manifest: stored (compressed) and JSON bytes
    /// The params' share of /manifest's stored bytes (container::param_metadata_bytes, which
    /// dumps every param entry again: computed once, on first use).
    uint64_t param_metadata_bytes() const;
    mutable std::optional<uint64_t> param_metadata_;
    std::unique_ptr<container::DatasetReader> raw_, escidx_;
    std::vector<std::unique_ptr<container::DatasetReader>> codes_, params_, escv_, segs_;
    /// Entropy-coded codecs: per role, the end byte (in /moments/codes/<role>) of every
    /// segment, validated ascending and ending at the dataset's size.
    std::vector<std::vector<uint64_t>> seg_end_;
    mutable std::vector<uint8_t> seg_buf_;
    /// Decode role k's codes of parameter e's coordinates [begin, begin + n) (begin a
    /// multiple of kSegment) into `codes` as little-endian uint16 (2-byte aligned: on a
    /// little-endian host they are decoded in place); `params`: role k's block
    /// parameters of those coordinates (exp_avg_sq's row prediction needs them).
    void read_segments(const container::ParamEntry& e, int k, uint64_t begin, std::size_t n, uint8_t* codes,
                       const int16_t* params) const;
    /// Source offsets of the moment storages (sorted) and the moment bytes up to and
    /// including each one, for read_raw's source -> /raw offset in O(log storages).
    std::vector<uint64_t> moment_at_, moment_through_;
    /// Escape rows [buf_begin_, buf_begin_ + buf_idx_.size()) read in blocks.
    mutable uint64_t buf_begin_ = 0;
    mutable std::vector<uint64_t> buf_idx_;
    mutable std::array<std::vector<uint32_t>, 3> buf_bits_;
    mutable ChunkBuffer raw_buf_;   ///< for_each_raw_piece's piece where /raw cannot be viewed
    /// /raw's byte offset of source offset `off` (outside moment storages).
    uint64_t raw_offset(uint64_t off) const;
    /// raw_->view_bytes(at, n), its errors as read_raw's (BadInput naming the container).
    const void* raw_view(uint64_t at, std::size_t n) const;
    void load_escapes(uint64_t row, uint64_t end_row, int moments) const;
};

template <class Piece, class Hole>
ContainerReader::SourceScan ContainerReader::scan_source(Piece piece, Hole hole) const {
    SourceScan r;
    const Xxh3State h = make_xxh3();
    try {
        for (const container::SourceSpan& sp : container::source_spans(man_)) {
            if (sp.moment) {
                hole(sp.size());
                continue;
            }
            for_each_raw_piece(sp.begin, sp.end, [&](uint64_t, const uint8_t* p, std::size_t n) {
                if (sp.storage < 0 || n < (std::size_t(1) << 16)) {
                    if (sp.storage >= 0) XXH3_64bits_update(h.get(), p, n);
                    piece(p, n);
                    return;
                }
                // the tensor's hash on a worker beside piece() (restore's write) on this thread
                codec::parallel_items(2, [&](unsigned, std::size_t i0, std::size_t i1) {
                    for (std::size_t i = i0; i < i1; ++i) {
                        if (i == 0) piece(p, n);
                        else XXH3_64bits_update(h.get(), p, n);
                    }
                });
            });
            if (sp.storage < 0) continue;
            ++r.tensors;
            if (XXH3_64bits_digest(h.get()) != man_.storages[std::size_t(sp.storage)].xxh3 && !r.bad_tensors++)
                r.first_bad = sp.storage;
            XXH3_64bits_reset(h.get());
        }
    } catch (const BadInput&) {
        return r;
    }
    r.raw_read = true;
    try {
        r.raw_ok = raw_->checksum_ok();  // the bytes were hashed as read: only the padding is read again
    } catch (const std::exception&) {
        r.raw_ok = false;
    }
    return r;
}

template <class Fn>
void ContainerReader::for_each_raw_piece(uint64_t from, uint64_t to, Fn fn) const {
    constexpr uint64_t kPiece = 1 << 20;
    for (uint64_t off = from; off < to;) {
        const uint64_t at = raw_offset(off);  // the span is outside moments: contiguous in /raw
        const uint64_t in_chunk = raw_->bytes_to_chunk_end(at);
        const std::size_t n = std::size_t(std::min({kPiece, to - off, in_chunk ? in_chunk : kPiece}));
        const void* p = raw_view(at, n);
        if (!p) {
            raw_buf_.resize(n);
            read_raw(off, n, raw_buf_.data());
            p = raw_buf_.data();
        }
        fn(off, static_cast<const uint8_t*>(p), n);
        off += n;
    }
}

template <class Fn>
void ContainerReader::for_each_chunk(std::size_t j, std::size_t chunk, Want want, Fn fn, Chunk* scratch) const {
    const auto& e = man_.params.at(j);
    const std::size_t unit = codec::entropy_coded(man_.codec) ? codec::kSegment : codec::kBlock;  // chunks start on segments
    chunk = std::max<std::size_t>(unit, chunk / unit * unit);
    uint64_t esc_row = e.escape_offset, esc_pos = 0;
    Chunk own;
    Chunk& c = scratch ? *scratch : own;
    for (uint64_t i0 = 0; i0 < e.numel; i0 += chunk) {
        decode(j, i0, std::size_t(std::min<uint64_t>(chunk, e.numel - i0)), want, c, esc_row, esc_pos);
        fn(c);
    }
}

}  // namespace ckpt::container
