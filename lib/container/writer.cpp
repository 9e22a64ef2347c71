#include "container/writer.h"

#include <algorithm>

namespace ckpt::container {

ContainerWriter::ContainerWriter(const std::string& path) : file_(create_file(path)) {
    raw_ = std::make_unique<Appender>(file_.get(), kRaw, H5T_NATIVE_UINT8, 1);
}

ContainerWriter::~ContainerWriter() = default;

void ContainerWriter::append_raw(const void* data, std::size_t n) { raw_->append(data, n); }

uint64_t ContainerWriter::begin_moments(const Manifest& m) {
    const uint64_t stored = raw_->finish();
    raw_.reset();
    const int roles = std::any_of(m.params.begin(), m.params.end(), [](const ParamEntry& p) { return p.hyper.amsgrad; }) ? 3 : 2;
    code_bytes_ = codec::code_bytes(m.codec);
    params_per_block_ = codec::params_per_block(m.codec);
    escidx_ = std::make_unique<Appender>(file_.get(), kEscapeIndex, H5T_NATIVE_UINT64, 8);
    for (int r = 0; r < roles; ++r) {
        codes_.push_back(std::make_unique<Appender>(file_.get(), codes_path(r), H5T_NATIVE_UINT8, 1));
        params_.push_back(std::make_unique<Appender>(file_.get(), params_path(r), H5T_NATIVE_INT16, 2));
        escv_.push_back(std::make_unique<Appender>(file_.get(), escapes_path(r), H5T_NATIVE_UINT32, 4));
    }
    return stored;
}

void ContainerWriter::begin_param(ParamEntry& e) {
    e.code_offset = codes_[0]->count() / uint64_t(code_bytes_);
    e.block_offset = params_per_block_ == 0 ? 0 : params_[0]->count() / uint64_t(params_per_block_);
    e.escape_offset = escidx_->count();
    e.escapes = 0;
    e.max_bound = 0;
    cur_ = &e;
    last_escape_ = 0;
}

void ContainerWriter::append_chunk(uint64_t i0, const codec::ChunkOut& co, const std::array<std::vector<uint32_t>, 3>& escape_bits) {
    ParamEntry& e = *cur_;
    const int nm = e.moments(), roles = int(codes_.size());
    for (int k = 0; k < nm; ++k) {
        codes_[std::size_t(k)]->append(co.codes[k].data(), co.codes[k].size());
        params_[std::size_t(k)]->append(co.params[k].data(), co.params[k].size());
    }
    for (int k = nm; k < roles; ++k) {  // aligned filler for roles this parameter lacks
        zero_codes_.assign(co.codes[0].size(), 0);
        zero_params_.assign(co.params[0].size(), 0);
        codes_[std::size_t(k)]->append(zero_codes_.data(), zero_codes_.size());
        params_[std::size_t(k)]->append(zero_params_.data(), zero_params_.size());
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
    e.max_bound = std::max(e.max_bound, co.max_bound);
}

void ContainerWriter::finish(const Manifest& m) {
    if (raw_) begin_moments(m);  // no moments written: the streams still exist, empty
    for (std::size_t r = 0; r < codes_.size(); ++r) { codes_[r]->finish(); params_[r]->finish(); escv_[r]->finish(); }
    escidx_->finish();
    write_manifest(file_.get(), m);
    set_attr(file_.get(), "format", std::string("ckptkit-container"));
    set_attr(file_.get(), "format_version", uint64_t(kFormatVersion));
    file_.close_checked();
}

}  // namespace ckpt::container
