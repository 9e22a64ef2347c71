#include "container/writer.h"

#include <algorithm>
#include <stdexcept>

#include "codec/rans.h"
#include "codec/vlog.h"

namespace ckpt::container {

ContainerWriter::ContainerWriter(const std::string& path) : file_(create_file(path)) {
    // The raw bytes (weights, buffers, the pickle) as little-endian 4-byte elements,
    // byte-shuffled before zstd level 1 (format 3): FP32 exponent bytes then sit together,
    // smaller and faster both ways than the bytes as they are; level 3 is no smaller than
    // level 1 either way. Matches shorter than 7 bytes are refused and the hash table has
    // 2^6 entries (fits L1): in the mantissa bytes short matches are noise that costs more
    // than the literals, so this is smaller and faster (a smaller table or shorter matches
    // were larger and slower). The low mantissa planes of float weights are incompressible:
    // stored as zstd raw blocks without a compressor pass (ZstdMatch::planes), where their
    // entropy says zstd would store them raw anyway (container/h5.cpp plane_incompressible).
    // Each measured on the bench models' and a generated checkpoint's weights:
    // docs/benchmarks.md, "Measurements behind the code's choices".
    raw_ = std::make_unique<Appender>(file_.get(), kRaw, H5T_STD_U32LE, 4, 1 << 20, 1, true, ZstdMatch{6, 7, 4});
}

ContainerWriter::~ContainerWriter() = default;

void ContainerWriter::append_raw(const void* data, std::size_t n) {
    if (!raw_) throw std::logic_error("/raw appended after end_raw");
    raw_->append_bytes(data, n);
}

uint64_t ContainerWriter::end_raw() {
    if (!raw_) throw std::logic_error("/raw closed twice");
    const uint64_t stored = raw_->finish();
    raw_.reset();
    return stored;
}

void ContainerWriter::begin_moments(const Manifest& m) {
    if (escidx_) throw std::logic_error("moment streams begun twice");
    const int roles = std::any_of(m.params.begin(), m.params.end(), [](const ParamEntry& p) { return p.hyper.amsgrad; }) ? 3 : 2;
    code_bytes_ = codec::code_bytes(m.codec);
    params_per_block_ = codec::params_per_block(m.codec);
    segmented_ = codec::entropy_coded(m.codec);
    // the escape and segment tables are small (8 bytes a segment of 16384 coordinates; an
    // escape each): 64 KiB chunks, so a reader holds no 1 MiB chunk of them, mostly zeros
    constexpr std::size_t kTableChunk = 1 << 16;
    escidx_ = std::make_unique<Appender>(file_.get(), kEscapeIndex, H5T_NATIVE_UINT64, 8, kTableChunk);
    for (int r = 0; r < roles; ++r) {
        // entropy-coded codes are incompressible: stored as they are (kZstdStore), not
        // framed by zstd for nothing (docs/benchmarks.md, "Measurements behind the code's choices")
        codes_.push_back(std::make_unique<Appender>(file_.get(), codes_path(r), H5T_NATIVE_UINT8, 1, 1 << 20,
                                                    segmented_ ? kZstdStore : 3));
        params_.push_back(std::make_unique<Appender>(file_.get(), params_path(r), H5T_NATIVE_INT16, 2));
        escv_.push_back(std::make_unique<Appender>(file_.get(), escapes_path(r), H5T_NATIVE_UINT32, 4, kTableChunk));
        if (segmented_)
            segs_.push_back(std::make_unique<Appender>(file_.get(), segments_path(r), H5T_NATIVE_UINT64, 8, kTableChunk));
    }
}

void ContainerWriter::begin_param(ParamEntry& e) {
    e.code_offset = segmented_ ? segs_[0]->count() : codes_[0]->count() / uint64_t(code_bytes_);
    e.block_offset = params_per_block_ == 0 ? 0 : params_[0]->count() / uint64_t(params_per_block_);
    e.escape_offset = escidx_->count();
    e.escapes = 0;
    e.escape_causes = {};
    e.row_predict = false;
    e.max_bound = 0;
    cur_ = &e;
    last_escape_ = 0;
}

void ContainerWriter::append_chunk(uint64_t i0, const codec::ChunkOut& co, const std::array<std::vector<uint32_t>, 3>& escape_bits) {
    ParamEntry& e = *cur_;
    const int nm = e.moments(), roles = int(codes_.size());
    const std::size_t n = co.codes[0].size() / std::size_t(code_bytes_);
    for (int k = 0; k < roles; ++k) {
        const uint8_t* codes = co.codes[k].data();
        const int16_t* params = co.params[k].data();
        if (k >= nm) {  // aligned filler for roles this parameter lacks
            zero_codes_.assign(co.codes[0].size(), 0);
            zero_params_.assign(co.params[0].size(), 0);
            codes = zero_codes_.data();
            params = zero_params_.data();
        }
        if (segmented_) append_segments(k, i0, codes, n, params);
        else codes_[std::size_t(k)]->append(codes, co.codes[0].size());
        params_[std::size_t(k)]->append(params, co.params[0].size());
    }
    for (std::size_t q = 0; q < co.escapes.size(); ++q) {
        const uint64_t gi = i0 + co.escapes[q];
        const uint64_t delta = gi - last_escape_;
        last_escape_ = gi;
        escidx_->append(&delta, 1);
        for (int k = 0; k < roles; ++k) {
            const uint32_t b = k < nm ? escape_bits[std::size_t(k)][q] : 0;
            escv_[std::size_t(k)]->append(&b, 1);
        }
    }
    e.escapes += co.escapes.size();
    for (std::size_t c = 0; c < 3; ++c) e.escape_causes[c] += co.causes[c];
    e.max_bound = std::max(e.max_bound, co.max_bound);
}

void ContainerWriter::append_segments(int k, uint64_t i0, const uint8_t* codes, std::size_t n, const int16_t* params) {
    const uint64_t seg = codec::kSegment;
    if (i0 % seg != 0 || (n % seg != 0 && i0 + n != cur_->numel))
        throw std::logic_error("entropy-coded chunk not aligned to segments");
    for (std::size_t s0 = 0; s0 < n;) {
        if (k == 1 && i0 + s0 == 0 && row_length(*cur_) > 0) {
            // the parameter's first exp_avg_sq segment decides, coded both ways, the smaller wins
            const std::size_t len = std::min<std::size_t>(seg, n - s0);
            seg_codes_[0].resize(len);
            codec::codes_from_bytes(codes + 2 * s0, len, seg_codes_[0].data());
            seg_bytes_[0].clear();
            codec::segment_encode(seg_codes_[0].data(), len, seg_bytes_[0]);
            std::vector<uint16_t> pred = seg_codes_[0];
            codec::vlog_rows(pred.data(), len, params, std::size_t(row_length(*cur_)), true);  // s0 = 0
            std::vector<uint8_t> alt;
            codec::segment_encode(pred.data(), len, alt);
            cur_->row_predict = alt.size() < seg_bytes_[0].size();
            if (cur_->row_predict) seg_bytes_[0].swap(alt);
            put_segment(k, seg_bytes_[0]);
            s0 += len;
            continue;
        }
        // two segments at a time (codec::segment_encode2: their rANS rounds overlap)
        const int cnt = s0 + seg < n ? 2 : 1;
        const uint16_t* sc[2];
        std::size_t len[2];
        std::vector<uint8_t>* out[2] = {&seg_bytes_[0], &seg_bytes_[1]};
        for (int a = 0; a < cnt; ++a) {
            const std::size_t sa = s0 + std::size_t(a) * seg;
            len[a] = std::min<std::size_t>(seg, n - sa);
            seg_codes_[a].resize(len[a]);
            codec::codes_from_bytes(codes + 2 * sa, len[a], seg_codes_[a].data());
            if (k == 1)
                codec::vlog_rows(seg_codes_[a].data(), len[a], params + 2 * (sa / codec::kBlock), std::size_t(vlog_row(*cur_)), true);
            sc[a] = seg_codes_[a].data();
            out[a]->clear();
        }
        if (cnt == 2) codec::segment_encode2(sc, len, out);
        else codec::segment_encode(sc[0], len[0], *out[0]);
        for (int a = 0; a < cnt; ++a) put_segment(k, *out[a]);
        s0 += len[0] + (cnt == 2 ? len[1] : 0);
    }
}

void ContainerWriter::put_segment(int k, const std::vector<uint8_t>& bytes) {
    codes_[std::size_t(k)]->append(bytes.data(), bytes.size());
    const uint64_t end = codes_[std::size_t(k)]->count();
    segs_[std::size_t(k)]->append(&end, 1);
}

uint64_t ContainerWriter::finish(const Manifest& m) {
    if (raw_) end_raw();
    if (!escidx_) begin_moments(m);  // no moments written: the streams still exist, empty
    for (std::size_t r = 0; r < codes_.size(); ++r) {
        codes_[r]->finish();
        params_[r]->finish();
        escv_[r]->finish();
        if (segmented_) segs_[r]->finish();
    }
    escidx_->finish();
    const uint64_t text_xxh3 = write_manifest(file_.get(), m);
    set_attr(file_.get(), "format", std::string("ckptkit-container"));
    set_attr(file_.get(), "format_version", uint64_t(kFormatVersion));
    file_.close_checked();
    return text_xxh3;
}

}  // namespace ckpt::container
