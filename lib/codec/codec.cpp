#include "codec/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "codec/block.h"

namespace ckpt::codec {

Kind kind_from_name(const std::string& s) {
    if (s == "log8") return Kind::Log8;
    if (s == "bf16") return Kind::BF16;
    if (s == "blockwise8") return Kind::Blockwise8;
    throw std::invalid_argument("unknown codec '" + s + "' (log8, bf16, blockwise8)");
}
const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Log8: return "log8";
        case Kind::BF16: return "bf16";
        case Kind::Blockwise8: return "blockwise8";
    }
    return "?";
}
int code_bytes(Kind k) { return k == Kind::BF16 ? BF16::kCodeBytes : 1; }
int params_per_block(Kind k) {
    return k == Kind::Log8 ? Log8::kParams : k == Kind::BF16 ? BF16::kParams : Blockwise8::kParams;
}

double round_to(MomentType t, double x) { return round_to_type(t, x); }

void gradient_domain(const DomainRule& d, const float* theta, std::size_t i, double& lo, double& hi) {
    gradient_domain_hd(d, theta, i, lo, hi);
}

namespace {

// The loops over blocks and coordinates; the bodies are block.h's (shared with cuda/).
template <class Q>
ChunkOut encode_impl(const TensorSetup& s, const ChunkIn& in) {
    const int nm = s.moments();
    const std::size_t n = in.n, blocks = (n + kBlock - 1) / kBlock;
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    const float* src[3] = {in.m, in.v, in.vmax};
    ChunkOut out;
    for (int k = 0; k < nm; ++k) {
        out.codes[k].assign(n * Q::kCodeBytes, 0);
        out.params[k].assign(blocks * Q::kParams, 0);
    }
    BlockWork<Q> w;
    for (std::size_t b = 0; b < blocks; ++b) {
        const std::size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
        const int bn = int(i1 - i0);
        const BlockTrial<Q>& best = encode_block<Q>(s, gc, src, in.theta, i0, bn, w);
        for (int k = 0; k < nm; ++k)
            std::copy(best.p[k], best.p[k] + Q::kParams, out.params[k].data() + b * Q::kParams);
        for (int j = 0; j < bn; ++j) {
            const std::size_t i = i0 + std::size_t(j);
            if (!best.keep[j]) { out.escapes.push_back(uint32_t(i)); continue; }
            out.max_bound = std::max(out.max_bound, best.bound[j]);
            for (int k = 0; k < nm; ++k) store_code(out.codes[k].data(), Q::kCodeBytes, i, best.code[k][j]);
        }
    }
    return out;
}

template <class Q>
void decode_impl(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                 const std::array<const int16_t*, 3>& params, std::size_t n,
                 std::array<float*, 3> out, const float* theta, double* bounds) {
    const GuardConst gc = make_guard_const(s.hyper, s.tolerance);
    for (std::size_t i = 0; i < n; ++i)
        decode_coord<Q>(s, gc, codes.data(), params.data(), i, out.data(), theta, bounds);
}

}  // namespace

ChunkOut encode_chunk(const TensorSetup& s, const ChunkIn& in) {
    switch (s.kind) {
        case Kind::Log8: return encode_impl<Log8>(s, in);
        case Kind::BF16: return encode_impl<BF16>(s, in);
        case Kind::Blockwise8: return encode_impl<Blockwise8>(s, in);
    }
    throw std::logic_error("codec kind");
}

void decode_chunk(const TensorSetup& s, const std::array<const uint8_t*, 3>& codes,
                  const std::array<const int16_t*, 3>& params, std::size_t n,
                  std::array<float*, 3> out, const float* theta, double* bounds) {
    switch (s.kind) {
        case Kind::Log8: return decode_impl<Log8>(s, codes, params, n, out, theta, bounds);
        case Kind::BF16: return decode_impl<BF16>(s, codes, params, n, out, theta, bounds);
        case Kind::Blockwise8: return decode_impl<Blockwise8>(s, codes, params, n, out, theta, bounds);
    }
}

}  // namespace ckpt::codec
