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

unsigned char* ContainerWriter::raw_room(std::size_t& n) {
    if (!raw_) throw std::logic_error("/raw appended after end_raw");
    return raw_->room_bytes(n);
}

void ContainerWriter::raw_commit(std::size_t n) {
    raw_->commit_bytes(n);
}

bool ContainerWriter::raw_stageable() const {
    return raw_ && raw_->direct();
}

void ContainerWriter::stage_raw(const void* data, std::size_t n) {
    if (!raw_) throw std::logic_error("/raw appended after end_raw");
    raw_->stage_bytes(data, n);
}

void ContainerWriter::settle_raw() {
    if (raw_) raw_->settle();
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
    if (nm < roles) {   // aligned filler for roles this parameter lacks
        zero_codes_.assign(co.codes[0].size(), 0);
        zero_params_.assign(co.params[0].size(), 0);
    }
    auto codes_of = [&](int k) { return k < nm ? co.codes[std::size_t(k)].data() : zero_codes_.data(); };
    auto params_of = [&](int k) { return k < nm ? co.params[std::size_t(k)].data() : zero_params_.data(); };
    if (segmented_) {
        std::vector<std::vector<std::vector<uint8_t>>> segs = encode_segments(i0, n, codes_of, params_of);
        for (int k = 0; k < roles; ++k) {
            for (const auto& bytes : segs[std::size_t(k)]) put_segment(k, bytes);
            params_[std::size_t(k)]->append(params_of(k), co.params[0].size());
        }
    } else {
        for (int k = 0; k < roles; ++k) {
            codes_[std::size_t(k)]->append(codes_of(k), co.codes[0].size());
            params_[std::size_t(k)]->append(params_of(k), co.params[0].size());
        }
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

std::vector<std::vector<std::vector<uint8_t>>> ContainerWriter::encode_segments(
    uint64_t i0, std::size_t n, const std::function<const uint8_t*(int)>& codes_of,
    const std::function<const int16_t*(int)>& params_of) {
    const uint64_t seg = codec::kSegment;
    if (i0 % seg != 0 || (n % seg != 0 && i0 + n != cur_->numel))
        throw std::logic_error("entropy-coded chunk not aligned to segments");
    const int roles = int(codes_.size());
    const std::size_t per = (n + seg - 1) / seg;   // segments per role in this chunk
    std::vector<std::vector<std::vector<uint8_t>>> out(static_cast<std::size_t>(roles));
    for (auto& r : out) r.resize(per);
    std::size_t first = 0;   // role 1's segments before this one are coded already
    if (i0 == 0 && roles > 1 && per > 0 && row_length(*cur_) > 0) {
        // the parameter's first exp_avg_sq segment decides, coded both ways, the smaller wins;
        // every later exp_avg_sq segment follows (codec::vlog_rows with vlog_row)
        const std::size_t len = std::min<std::size_t>(seg, n);
        std::vector<uint16_t> c(len);
        codec::codes_from_bytes(codes_of(1), len, c.data());
        std::vector<uint8_t> plain, alt;
        codec::segment_encode(c.data(), len, plain);
        codec::vlog_rows(c.data(), len, params_of(1), std::size_t(row_length(*cur_)), true);
        codec::segment_encode(c.data(), len, alt);
        cur_->row_predict = alt.size() < plain.size();
        out[1][0] = cur_->row_predict ? std::move(alt) : std::move(plain);
        first = 1;
    }
    // every other segment of every role is independent: coded in the worker pool, two at a
    // time per worker (codec::segment_encode2: their rANS rounds overlap)
    std::vector<std::pair<int, std::size_t>> jobs;   // (role, segment index)
    for (int k = 0; k < roles; ++k)
        for (std::size_t j = (k == 1 ? first : 0); j < per; ++j) jobs.push_back({k, j});
    const std::size_t row = std::size_t(vlog_row(*cur_));
    codec::parallel_items((jobs.size() + 1) / 2, [&](unsigned, std::size_t p0, std::size_t p1) {
        std::vector<uint16_t> c[2];
        for (std::size_t p = p0; p < p1; ++p) {
            const uint16_t* sc[2];
            std::size_t len[2];
            std::vector<uint8_t>* dst[2];
            const int cnt = 2 * p + 1 < jobs.size() ? 2 : 1;
            for (int a = 0; a < cnt; ++a) {
                const auto [k, j] = jobs[2 * p + std::size_t(a)];
                const std::size_t sa = j * seg;
                len[a] = std::min<std::size_t>(seg, n - sa);
                c[a].resize(len[a]);
                codec::codes_from_bytes(codes_of(k) + 2 * sa, len[a], c[a].data());
                if (k == 1) codec::vlog_rows(c[a].data(), len[a], params_of(k) + 2 * (sa / codec::kBlock), row, true);
                sc[a] = c[a].data();
                dst[a] = &out[std::size_t(k)][j];
            }
            if (cnt == 2) codec::segment_encode2(sc, len, dst);
            else codec::segment_encode(sc[0], len[0], *dst[0]);
        }
    });
    return out;
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
