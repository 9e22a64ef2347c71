// bf16 baseline: guarded round-to-nearest-even bfloat16 (docs/design.md §4). Two bytes per value,
// no block parameters. Nonzero values that round to zero or to infinity are escapes.
#pragma once
#include <cstdint>
#include <cstring>

#include "codec/guard.h"
#include "codec/hd.h"
#include "codec/log8.h"

namespace ckpt::codec {

struct BF16 {
    static constexpr int kCodeBytes = 2;
    static constexpr int kVariants = 1;  ///< no alternative block parameters
    CKPT_HD static bool vary(int16_t*, int) { return false; }
    static constexpr int kParams = 0;

    CKPT_HD static uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
    CKPT_HD static double from_code(uint32_t c) {
        const uint32_t u = c << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    /// Round-to-nearest-even to the upper 16 bits (x finite).
    CKPT_HD static uint16_t rne(float x) {
        const uint32_t u = bits(x);
        return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    /// Whether a code stands for a value other than +-0 (a nonzero magnitude): block.h
    /// code_in_range (infinities, NaNs and negative second moments have no code).
    CKPT_HD static bool used(uint16_t code, Role) { return (code & 0x7fffu) != 0; }
    static constexpr bool kUsedMayDecodeZero = false;
    CKPT_HD static bool encode(float x, Role r, const int16_t*, double, uint16_t* code) {
        if (!isfinite(x) || (r != Role::ExpAvg && signbit(x) && x != 0)) return false;
        const uint16_t c = rne(x);
        const double d = from_code(c);
        if ((d == 0) != (x == 0) || !isfinite(d)) return false;
        *code = c;
        return true;
    }
    CKPT_HD static Cell cell(uint16_t code, Role, const int16_t*, double) {
        Cell c;
        c.dec = from_code(code);
        if (c.dec == 0) return c;  // only exact zeros map here
        const uint32_t mag = code & 0x7fffu, sign = code & 0x8000u;
        const double a = from_code(mag);
        const double below = (a + from_code(mag - 1)) / 2;  // mag >= 1
        const double above = (a + from_code(mag + 1)) / 2;  // 0x7f80 is inf: never encoded
        if (sign) { c.lo = -above; c.hi = -below; } else { c.lo = below; c.hi = above; }
        return c;
    }
    CKPT_HD static void choose(const float*, int, Role, const double*, const GuardConst&, int16_t*) {}
};

}  // namespace ckpt::codec
