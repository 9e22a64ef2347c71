// blockwise8 baseline: bitsandbytes-style dynamic 8-bit map with an absmax scale per
// block of 256 (SPEC §2.3; bitsandbytes functional.create_dynamic_map, signed map for
// exp_avg, unsigned for exp_avg_sq). Guarded by the same certificate as log8.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "codec/guard.h"
#include "codec/hd.h"
#include "codec/log8.h"

namespace ckpt::codec {

/// The 256-entry dynamic map, sorted ascending (bitsandbytes create_dynamic_map with
/// max_exponent_bits = 7, total_bits = 8), computed in double and rounded to float.
struct DynamicMap {
    float v[256];
    explicit DynamicMap(bool is_signed);
};

struct Blockwise8 {
    static constexpr int kCodeBytes = 1;
    static constexpr int kVariants = 1;  ///< no alternative block parameters
    static bool vary(int16_t*, int) { return false; }
    static constexpr int kParams = 2;  ///< absmax, float bits in two int16

    static const DynamicMap& map(Role r);

    static float absmax(const int16_t* p) { float f; memcpy(&f, p, 4); return f; }
    static double dec(int k, Role r, const int16_t* p) {
        return double(map(r).v[k] * absmax(p));
    }
    static bool encode(float x, Role r, const int16_t* p, double, uint16_t* code);
    static Cell cell(uint16_t code, Role r, const int16_t* p, double = 0);
    static void choose(const float* x, int n, Role, const double*, const GuardConst&, int16_t* p);
};

}  // namespace ckpt::codec
