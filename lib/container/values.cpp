#include "container/values.h"

#include <cstdio>
#include <cstring>

#include "codec/bf16.h"

namespace ckpt {

void bytes_to_float(DType d, const uint8_t* in, std::size_t n, float* out) {
    if (d == DType::F32) { std::memcpy(out, in, n * 4); return; }
    const bool bf16 = d == DType::BF16;
    for (std::size_t i = 0; i < n; ++i) {
        const uint16_t u = uint16_t(in[2 * i] | (in[2 * i + 1] << 8));
        if (bf16) out[i] = float(codec::BF16::from_code(u));
        else { _Float16 h; std::memcpy(&h, &u, 2); out[i] = float(h); }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
int32_t max_finite_abs_bits(const float* x, std::size_t n) {
    int32_t top = -1;  // signed: with the sign cleared every value is >= 0 (SSE2 has a signed compare)
    for (std::size_t i = 0; i < n; ++i) {
        int32_t u;
        std::memcpy(&u, x + i, 4);
        u &= 0x7fffffff;
        u = u < 0x7f800000 ? u : -1;  // +-inf and NaN: left out
        top = u > top ? u : top;
    }
    return top;
}

void float_to_bytes(DType d, const float* in, std::size_t n, uint8_t* out) {
    if (d == DType::F32) { std::memcpy(out, in, n * 4); return; }
    const bool bf16 = d == DType::BF16;
    for (std::size_t i = 0; i < n; ++i) {
        uint16_t u;
        if (bf16) u = uint16_t(codec::BF16::bits(in[i]) >> 16);  // exact: value is a bf16
        else { const _Float16 h = _Float16(in[i]); std::memcpy(&u, &h, 2); }
        out[2 * i] = uint8_t(u);
        out[2 * i + 1] = uint8_t(u >> 8);
    }
}

uint32_t element_bits(DType d, const uint8_t* in, std::size_t i) {
    if (d == DType::F32) { uint32_t u; std::memcpy(&u, in + 4 * i, 4); return u; }
    return uint32_t(in[2 * i] | (in[2 * i + 1] << 8));
}

void store_bits(DType d, uint32_t bits, uint8_t* out, std::size_t i) {
    if (d == DType::F32) { std::memcpy(out + 4 * i, &bits, 4); return; }
    out[2 * i] = uint8_t(bits);
    out[2 * i + 1] = uint8_t(bits >> 8);
}

}  // namespace ckpt
