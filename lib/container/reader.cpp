#include "container/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "container/values.h"
#include "codec/rans.h"
#include "codec/vlog.h"
#include "common/error.h"
#include "codec/backend.h"

namespace ckpt::container {

std::size_t ContainerReader::default_decode_chunk() { return codec::backend(codec::decode_device()).chunk; }

namespace ct = ::ckpt::container;

ContainerReader::ContainerReader(const std::string& path, const ct::Manifest* written, uint64_t written_xxh3)
    : path_(path) {
    try {
        file_ = ct::open_file(path);
        ct::ManifestSizes ms;
        man_ = ct::read_manifest(file_.get(), written, written_xxh3, &ms);
        manifest_stored_ = ms.stored;
        manifest_text_ = ms.text;
        // /raw: bytes (formats 1 and 2), little-endian 4-byte elements holding the bytes (3)
        if (man_.format_version >= 3) raw_ = std::make_unique<ct::DatasetReader>(file_.get(), ct::kRaw, H5T_STD_U32LE, 4);
        else raw_ = std::make_unique<ct::DatasetReader>(file_.get(), ct::kRaw, H5T_NATIVE_UINT8, 1);
        uint64_t moment_bytes = 0;
        for (const auto& s : man_.storages)
            if (s.param >= 0) {
                moment_bytes += s.nbytes;
                moment_at_.push_back(s.offset);  // storages are sorted by offset (validated)
                moment_through_.push_back(moment_bytes);
            }
        if (raw_->bytes() + moment_bytes != man_.source_size)
            throw std::runtime_error("/raw holds " + std::to_string(raw_->bytes()) + " bytes, the manifest needs " +
                                     std::to_string(man_.source_size - moment_bytes));
        if (man_.params.empty()) return;
        int roles = 2;
        for (const auto& p : man_.params) if (p.hyper.amsgrad) roles = 3;
        for (int r = 0; r < roles; ++r) {
            codes_.push_back(std::make_unique<ct::DatasetReader>(file_.get(), ct::codes_path(r), H5T_NATIVE_UINT8, 1));
            params_.push_back(std::make_unique<ct::DatasetReader>(file_.get(), ct::params_path(r), H5T_NATIVE_INT16, 2));
            escv_.push_back(std::make_unique<ct::DatasetReader>(file_.get(), ct::escapes_path(r), H5T_NATIVE_UINT32, 4));
        }
        escidx_ = std::make_unique<ct::DatasetReader>(file_.get(), ct::kEscapeIndex, H5T_NATIVE_UINT64, 8);
        const bool segmented = codec::entropy_coded(man_.codec);
        for (int r = 0; segmented && r < roles; ++r) {
            segs_.push_back(std::make_unique<ct::DatasetReader>(file_.get(), ct::segments_path(r), H5T_NATIVE_UINT64, 8));
            const ct::DatasetReader& d = *segs_.back();
            if (d.count() > (uint64_t(1) << 32)) throw std::runtime_error("too many segments");
            std::vector<uint64_t> ends(std::size_t(d.count()));
            d.read(0, d.count(), ends.data());
            uint64_t prev = 0;
            for (uint64_t e : ends) {
                if (e <= prev) throw std::runtime_error("segment offsets are not ascending");
                prev = e;
            }
            if (prev != codes_[std::size_t(r)]->count())
                throw std::runtime_error("segments do not end at the size of " + ct::codes_path(r));
            seg_end_.push_back(std::move(ends));
        }
        const uint64_t cb = uint64_t(codec::code_bytes(man_.codec)), pb = uint64_t(codec::params_per_block(man_.codec));
        for (const auto& p : man_.params) {
            const uint64_t blocks = (p.numel + codec::kBlock - 1) / codec::kBlock;
            for (int r = 0; r < p.moments(); ++r) {
                const bool codes_past = segmented ? p.code_offset + ct::segments_of(p.numel) > seg_end_[std::size_t(r)].size()
                                                  : (p.code_offset + p.numel) * cb > codes_[std::size_t(r)]->count();
                if (codes_past ||
                    (p.block_offset + blocks) * pb > params_[std::size_t(r)]->count())
                    throw std::runtime_error("param " + p.name + " runs past the code streams");
                if (p.escape_offset + p.escapes > escv_[std::size_t(r)]->count())
                    throw std::runtime_error("param " + p.name + " runs past the escape table");
            }
            if (p.escapes > escidx_->count() || p.escape_offset > escidx_->count() - p.escapes)  // overflow-safe
                throw std::runtime_error("param " + p.name + " runs past the escape index");
        }
    } catch (const BadInput&) {
        throw;
    } catch (const std::exception& e) {
        throw BadInput(path, std::string("container: ") + e.what());
    }
}

uint64_t ContainerReader::raw_offset(uint64_t off) const {
    // the moment storages that start before `off` are not in /raw
    const auto k = std::lower_bound(moment_at_.begin(), moment_at_.end(), off) - moment_at_.begin();
    return off - (k == 0 ? 0 : moment_through_[std::size_t(k - 1)]);
}

void ContainerReader::read_raw(uint64_t off, uint64_t n, void* out) const {
    try {
        raw_->read_bytes(raw_offset(off), n, out);
    } catch (const std::exception& e) {
        throw BadInput(path_, std::string("container: ") + e.what());
    }
}

const void* ContainerReader::raw_view(uint64_t at, std::size_t n) const {
    try {
        return raw_->view_bytes(at, n);
    } catch (const std::exception& e) {
        throw BadInput(path_, std::string("container: ") + e.what());
    }
}

std::vector<std::string> ContainerReader::damaged_datasets() const {
    std::vector<std::string> bad;
    std::vector<const ct::DatasetReader*> all;
    if (escidx_) all.push_back(escidx_.get());
    for (auto* v : {&codes_, &params_, &escv_, &segs_})
        for (auto& d : *v) all.push_back(d.get());
    for (auto* d : all) {
        bool ok = false;
        try { ok = d->checksum_ok(); } catch (const std::exception&) { ok = false; }
        if (!ok) bad.push_back(d->path());
    }
    return bad;
}

void ContainerReader::check_damage(std::vector<std::string> bad) const {
    if (bad.empty()) bad = damaged_datasets();
    if (bad.empty()) return;
    std::string s;
    for (auto& b : bad) s += (s.empty() ? "" : ", ") + b;
    throw CheckFailed(path_ + ": damaged dataset(s), checksum mismatch: " + s);
}

uint8_t* ContainerReader::storage_bytes(DType dtype, Chunk& c, int k, std::vector<uint8_t>& scratch) {
    // F32: the values are the bytes (element_bytes), escapes go in place
    float* const v = c.at[std::size_t(k)];
    uint8_t* out = element_bytes(dtype, v, c.n, scratch);
    if (dtype != DType::F32) float_to_bytes(dtype, v, c.n, out);
    for (std::size_t q = 0; q < c.escaped.size(); ++q) store_bits(dtype, c.escaped_bits[std::size_t(k)][q], out, c.escaped[q]);
    return out;
}

void ContainerReader::load_escapes(uint64_t row, uint64_t end_row, int) const {
    const uint64_t n = std::min<uint64_t>(end_row - row, 1 << 16);
    buf_begin_ = row;
    buf_idx_.resize(n);
    escidx_->read(row, n, buf_idx_.data());
    for (std::size_t k = 0; k < escv_.size(); ++k) {
        buf_bits_[k].resize(n);
        escv_[k]->read(row, n, buf_bits_[k].data());
    }
}

uint64_t ContainerReader::param_metadata_bytes() const {
    if (!param_metadata_) param_metadata_ = ct::param_metadata_bytes(man_, manifest_stored_, manifest_text_);
    return *param_metadata_;
}

uint64_t ContainerReader::role_bytes(std::size_t k) const {
    if (k >= codes_.size()) return 0;
    uint64_t b = codes_[k]->stored_bytes() + params_[k]->stored_bytes() + escv_[k]->stored_bytes();
    if (k < segs_.size()) b += segs_[k]->stored_bytes();
    return b;
}

uint64_t ContainerReader::shared_bytes() const { return (escidx_ ? escidx_->stored_bytes() : 0) + param_metadata_bytes(); }

uint64_t ContainerReader::moment_bytes() const {
    uint64_t b = shared_bytes();
    for (std::size_t k = 0; k < codes_.size(); ++k) b += role_bytes(k);
    return b;
}

uint64_t ContainerReader::coded_bytes(std::size_t j) const {
    if (seg_end_.empty()) return 0;
    const auto& e = man_.params[j];
    uint64_t b = 0;
    for (int k = 0; k < e.moments(); ++k) {
        const auto& ends = seg_end_[std::size_t(k)];
        const uint64_t s0 = e.code_offset, s1 = e.code_offset + ct::segments_of(e.numel);
        if (s1 > s0) b += ends[s1 - 1] - (s0 == 0 ? 0 : ends[s0 - 1]);
    }
    return b;
}

void ContainerReader::read_segments(const ct::ParamEntry& e, int k, uint64_t begin, std::size_t n, uint8_t* codes,
                                    const int16_t* params) const {
    if (begin % codec::kSegment != 0) throw std::logic_error("segment read not aligned");
    const auto& ends = seg_end_[std::size_t(k)];
    const uint64_t g0 = e.code_offset + begin / codec::kSegment;   // validated < ends.size() at open
    const std::size_t count = std::size_t((n + codec::kSegment - 1) / codec::kSegment);
    if (count == 0) return;
    // the chunk's segments lie next to each other in the stream: one view (no copy inside an
    // HDF5 chunk) or one read serves them all
    const uint64_t from = g0 == 0 ? 0 : ends[g0 - 1], to = ends[g0 + count - 1];
    for (std::size_t s = 0; s < count; ++s) {
        const uint64_t ga = g0 + s;
        if (ends[ga] - (ga == 0 ? 0 : ends[ga - 1]) > 2 * uint64_t(codec::kSegment) + 1024)
            throw std::runtime_error("param " + e.name + ": segment larger than any valid one");
    }
    const uint8_t* base = static_cast<const uint8_t*>(codes_[std::size_t(k)]->view(from, to - from));
    if (!base) {
        seg_buf_.resize(std::size_t(to - from));
        codes_[std::size_t(k)]->read(from, to - from, seg_buf_.data());
        base = seg_buf_.data();
    }
    // on a little-endian host the chunk's code bytes are the uint16 codes themselves: decoded
    // in place (the buffer is operator new's, even offsets), else through a per-worker buffer;
    // segments are independent: decoded in the worker pool, two at a time per worker
    // (codec::segment_decode2: their rANS rounds overlap)
    constexpr bool in_place = std::endian::native == std::endian::little;
    const std::size_t pairs = (count + 1) / 2;
    codec::parallel_items(pairs, [&](unsigned, std::size_t p0, std::size_t p1) {
        std::vector<uint16_t> tmp[2];
        for (std::size_t p = p0; p < p1; ++p) {
            const int cnt = 2 * p + 1 < count ? 2 : 1;
            const uint8_t* seg[2];
            std::size_t size[2], len[2];
            uint16_t* dst[2];
            for (int a = 0; a < cnt; ++a) {
                const std::size_t s = 2 * p + std::size_t(a);
                const uint64_t ia = begin + s * codec::kSegment, ga = g0 + s;
                const uint64_t lo = ga == 0 ? 0 : ends[ga - 1];
                seg[a] = base + (lo - from);
                size[a] = std::size_t(ends[ga] - lo);
                len[a] = std::size_t(std::min<uint64_t>(codec::kSegment, e.numel - ia));
                if (!in_place) tmp[a].resize(len[a]);
                dst[a] = in_place ? reinterpret_cast<uint16_t*>(codes + 2 * (ia - begin)) : tmp[a].data();
            }
            try {
                if (cnt == 2) codec::segment_decode2(seg, size, len, dst);
                else codec::segment_decode(seg[0], size[0], len[0], dst[0]);
            } catch (const std::runtime_error& x) {
                throw std::runtime_error("param " + e.name + " " + ct::kRoleNames[k] + ": " + x.what());
            }
            for (int a = 0; a < cnt; ++a) {
                const uint64_t ia = begin + (2 * p + std::size_t(a)) * codec::kSegment;
                if (k == 1) codec::vlog_rows(dst[a], len[a], params + 2 * ((ia - begin) / codec::kBlock), std::size_t(ct::vlog_row(e)), false);
                if (!in_place) codec::codes_to_bytes(dst[a], len[a], codes + 2 * (ia - begin));
            }
        }
    });
}

codec::TensorSetup ContainerReader::setup(std::size_t j) const {
    return ct::tensor_setup(man_.params.at(j), man_.codec, man_.tolerance, man_.format_version);
}

void ContainerReader::decode(std::size_t j, uint64_t begin, std::size_t n, Want want, Chunk& c,
                             uint64_t& esc_row, uint64_t& esc_pos) const {
    const bool with_bounds = want == Want::Bounds || want == Want::Certificates,
               values = want == Want::Values || want == Want::Bounds;
    const auto& e = man_.params[j];
    const int nm = e.moments();
    const std::size_t cb = std::size_t(codec::code_bytes(man_.codec)), pb = std::size_t(codec::params_per_block(man_.codec));
    const std::size_t blocks = (n + codec::kBlock - 1) / codec::kBlock;
    c.begin = begin;
    c.n = n;
    auto& codes = c.codes;
    auto& params = c.params;
    std::array<const uint8_t*, 3> cp{};
    std::array<const int16_t*, 3> pp{};
    std::array<float*, 3> out{};
    try {
        for (int k = 0; k < nm; ++k) {
            room(params[k], blocks * pb + 1);
            if (pb) params_[std::size_t(k)]->read((e.block_offset + begin / codec::kBlock) * pb, blocks * pb, params[k].data());
            const char* rule = nullptr;
            if (const std::size_t b = codec::invalid_block_param(man_.codec, k, params[k].data(), blocks, &rule); b != SIZE_MAX) {
                const int16_t* p = params[k].data() + 2 * b;
                float absmax;  // blockwise8's pair is a float's bits
                std::memcpy(&absmax, p, 4);
                throw std::runtime_error(fmt::format("param {} {}: block {} has {} (the format requires {})", e.name, ct::kRoleNames[k],
                                                     begin / codec::kBlock + b,
                                                     man_.codec == codec::Kind::Blockwise8 ? fmt::format("absmax {}", absmax)
                                                                                           : fmt::format("parameters ({}, {})", p[0], p[1]),
                                                     rule));
            }
            room(codes[k], n * cb);  // grown, never shrunk (Chunk)
            if (!seg_end_.empty()) read_segments(e, k, begin, n, codes[k].data(), params[k].data());
            else codes_[std::size_t(k)]->read((e.code_offset + begin) * cb, n * cb, codes[k].data());
            out[k] = values && c.into ? c.into(k, begin, n) : nullptr;
            if (values && !out[k]) out[k] = room(c.values[k], n);
            c.at[std::size_t(k)] = out[k];
            cp[k] = codes[k].data();
            pp[k] = params[k].data();
        }
        c.theta.clear();
        const bool need_theta = ((e.domain.l2 && std::isfinite(e.domain.grad_bound)) || e.hyper.bound_param) && e.theta_storage >= 0;
        if (with_bounds && need_theta) {
            const auto& ts = man_.storages[std::size_t(e.theta_storage)];
            const DType td = e.theta_dtype.value_or(DType::U8);
            const std::size_t es = float_dtype_size(td);
            if (es == 0 || ts.nbytes != e.numel * es) throw std::runtime_error("param " + e.name + ": theta storage size mismatch");
            read_raw(ts.offset + begin * es, n * es, room(c.theta_bytes, n * es));
            c.theta.resize(n);
            bytes_to_float(td, c.theta_bytes.data(), n, c.theta.data());
        }
        // every coordinate's bound is written by the decode (no zero-fill per chunk)
        if (with_bounds) c.bounds.resize(n);
        else c.bounds.clear();
        if (values || with_bounds) {
            const std::size_t bad = codec::backend(codec::decode_device())
                .decode(setup(j), cp, pp, n, out, c.theta.empty() ? nullptr : c.theta.data(), with_bounds ? c.bounds.data() : nullptr);
            if (bad != SIZE_MAX)
                throw std::runtime_error(fmt::format("block {} of {}: a nonzero code decodes outside the float range (corrupted or "
                                                     "forged block parameters)", begin / codec::kBlock + bad, e.name));
        }
        // escapes of this chunk
        c.escaped.clear();
        for (auto& b : c.escaped_bits) b.clear();
        const uint64_t end_row = e.escape_offset + e.escapes;
        while (esc_row < end_row) {
            if (esc_row < buf_begin_ || esc_row >= buf_begin_ + buf_idx_.size()) load_escapes(esc_row, end_row, nm);
            const uint64_t delta = buf_idx_[esc_row - buf_begin_];
            const uint64_t pos = esc_pos + delta;
            if (pos < esc_pos || pos >= e.numel || (esc_row > e.escape_offset && delta == 0))
                throw std::runtime_error("param " + e.name + ": escape index out of order or out of range");
            if (pos >= begin + n) break;
            if (pos < begin) throw std::runtime_error("param " + e.name + ": escape index out of order");
            c.escaped.push_back(uint32_t(pos - begin));
            for (int k = 0; k < nm; ++k) {
                const uint32_t bits = buf_bits_[k][esc_row - buf_begin_];
                c.escaped_bits[k].push_back(bits);
                if (!values) continue;
                uint8_t tmp[4];
                store_bits(e.dtype, bits, tmp, 0);
                float v;
                bytes_to_float(e.dtype, tmp, 1, &v);
                c.at[std::size_t(k)][pos - begin] = v;
            }
            esc_pos = pos;
            ++esc_row;
        }
    } catch (const BadInput&) {
        throw;
    } catch (const std::exception& ex) {
        throw BadInput(path_, std::string("container: ") + ex.what());
    }
}

}  // namespace ckpt::container
