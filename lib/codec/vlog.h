// vlog: the default codec (container format 2, docs/design.md §4). Variable-rate
// logarithmic codes whose steps follow the guard, entropy-coded afterwards (codec/rans.h).
//
// Grid: 2^(e/1024) for integer e ("1/1024 octave" units), a 1025-entry float table
// (vlog_table.h, generated, part of the format) times an exact power of two, so decoding is
// bit-identical on every host and device.
//  - exp_avg_sq, max_exp_avg_sq: block params (a, s): anchor a in 1/64 octaves, step s >= 1
//    in 1/1024 octaves. Code 0 = exact +0; code c >= 1 is index j = unzigzag(c - 1) in
//    [-32767, 32767], value 2^((16a + j*s)/1024). No fixed range: a block with a wide
//    exp_avg_sq range gets more distinct codes, not a coarser step.
//  - max_exp_avg_sq (amsgrad): on exp_avg_sq's grid, relative to its index (vmax_cell);
//    its own block params are (0, 0).
//  - exp_avg: block param (e, 0): linear in units of sqrt(v~) (v~ = the decoded second
//    moment, as log8): m~ = q * 2^(e/1024) * sqrt(v~), code = 2|q| + sign (so -0.0 stays
//    exact), |q| <= 32767.
// Rounding is to the nearest code (cells end at the midpoints between neighbouring values).
// The steps are not fixed: block.h vlog_plan picks, per block, the coarsest pair that the guard's
// closed form (guard.h closed_bound) still certifies for every coordinate, with outliers
// left to escape when that is cheaper in bits.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "codec/guard.h"
#include "codec/hd.h"
#include "codec/log8.h"
#include "codec/vlog_table.h"

namespace ckpt::codec {

#if defined(__CUDACC__)
static __constant__ float kVlogTableDev[1025] = CKPT_VLOG_TABLE;
#endif

/// log2(x) for finite x > 0 from IEEE + and * only (host and device give the same bits):
/// the binary exponent, plus a degree-6 least-squares polynomial in f = mantissa - 1 on
/// [0, 1) (|error| < 1e-5 octave). Used where vlog derives a block parameter or a first
/// guess (the encoder corrects the guess exactly); never for a cell.
CKPT_HD_FORCE double log2_poly(double ex, double f) {
    return ex + f * (1.44246470364867 +
                     f * (-0.7173406013100603 +
                          f * (0.45488395028849676 +
                               f * (-0.27418608342608064 + f * (0.11966064109034355 + f * -0.025489833115085236)))));
}
CKPT_HD double log2_hd(double x) {
    int ex;
    const double f = mantissa(x, ex) - 1;
    return log2_poly(ex, f);
}

/// log2_hd(x) for a positive finite float x, else 0: a float is a normal double, so the
/// exponent and mantissa come from the bits without mantissa()'s subnormal branch
/// (block loops vectorise it). The same value as log2_hd(x).
CKPT_HD_FORCE double log2_float(float x) {
    const double d = x;
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    const int32_t e = int32_t(uint32_t(b >> 32) >> 20) & 0x7ff;
    const uint64_t mb = (b & ((uint64_t(1) << 52) - 1)) | (uint64_t(1023) << 52);
    double mant;
    memcpy(&mant, &mb, sizeof mant);
    const double lg = log2_poly(double(e - 1023), mant - 1);
    return ((d > 0) & (d < INFINITY)) ? lg : 0.0;
}

struct VLog {
    static constexpr int kCodeBytes = 2;    ///< uint16 per value before entropy coding
    static constexpr int kParams = 2;       ///< int16 per block: (a, s) for v; (e, 0) for m
    static constexpr int kMaxIndex = 32767; ///< |j| (v) and |q| (m)
    // block.h's encode_block<VLog> picks the steps (vlog_plan); no choose()/vary().

    /// 2^(j/1024) rounded to float, j = 0..1024.
    CKPT_HD_FORCE static double table(int j) {
#if defined(__CUDA_ARCH__)
        return kVlogTableDev[j];
#else
        static constexpr float t[1025] = CKPT_VLOG_TABLE;
        return t[j];
#endif
    }
    /// The float 2^(e/1024) (0 or inf outside float range), as double; exact product.
    CKPT_HD_FORCE static double value(int64_t e) {
        // beyond +-2^30 the exponent saturates anyway (value32 clamps it to +-200: inf or 0 for every r)
        return value32(int32_t(e < -(int64_t(1) << 30) ? -(int64_t(1) << 30) : e > (int64_t(1) << 30) ? (int64_t(1) << 30) : e));
    }
    /// value() for an int32 exponent, in int32 arithmetic (block loops vectorise it).
    CKPT_HD_FORCE static double value32(int32_t e) {
        int32_t q = e >> 10;  // floor(e / 1024): arithmetic shift
        const int32_t r = e & 1023;
        q = q > 200 ? 200 : q;  // two selects, not a chain (a chain leaves control flow for the vectoriser)
        q = q < -200 ? -200 : q;
        return double(float(table(r) * pow2i(q)));
    }
    /// Signed index <-> code order 0, -1, 1, -2, 2, ... (branch-free: signs are random).
    CKPT_HD static uint32_t zigzag(int32_t j) { return (uint32_t(j) << 1) ^ uint32_t(j >> 31); }
    CKPT_HD static int32_t unzigzag(uint32_t z) { return int32_t(z >> 1) ^ -int32_t(z & 1); }

    /// exp_avg_sq value of index j under block params p.
    CKPT_HD_FORCE static double vval(const int16_t* p, int64_t j) { return value(int64_t(p[0]) * 16 + j * p[1]); }

    /// Whether code `code` of role r stands for a value other than an exact zero (a nonzero
    /// code; for exp_avg a nonzero |q|): such a code must decode inside the float range
    /// (block.h code_in_range).
    CKPT_HD_FORCE static bool used(uint16_t code, Role r) { return (r == Role::ExpAvg ? code >> 1 : code) != 0; }
    static constexpr bool kUsedMayDecodeZero = false;  ///< a used code never decodes to 0 (the encoder's cells hold it away)

    /// Encode one value (see Log8::encode for the contract); `scale` = sqrt of the decoded
    /// denominator state (exp_avg only).
    CKPT_HD static bool encode(float x, Role r, const int16_t* p, double scale, uint16_t* code) {
        if (r == Role::ExpAvg) return encode_m_value(x, value(p[0]) * scale, code);
        if (x == 0 && !signbit(x)) { *code = 0; return true; }
        if (!isfinite(x) || signbit(x)) return false;
        const double a = double(x);
        return encode_v(a, log2_hd(a), p, code);
    }

    /// exp_avg code of x in units d = 2^(e/1024) sqrt(v~): exact +-0 whatever d; otherwise
    /// encode_m (false for non-finite x or d). encode() and block.h's block loop share it.
    CKPT_HD static bool encode_m_value(float x, double d, uint16_t* code) {
        if (x == 0) { *code = signbit(x) ? 1 : 0; return true; }
        return isfinite(x) && encode_m(fabs(double(x)), signbit(x), d, code);
    }

    /// exp_avg code of |m| = a > 0 (finite) with sign `sign`, in units d = 2^(e/1024) sqrt(v~).
    CKPT_HD static bool encode_m(double a, bool sign, double d, uint16_t* code) {
        if (!(d > 0) || !(d < INFINITY)) return false;
        const double qf = a / d;
        if (!(qf < kMaxIndex + 0.5)) return false;
        int q = int(qf + 0.5);
        for (int it = 0; it < 4; ++it) {  // nearest in the cells of cell(): (q -+ 1/2) d
            if (a > (q + 0.5) * d && q < kMaxIndex) ++q;
            else if (q > 0 && a < (q - 0.5) * d) --q;
            else break;
        }
        if (!(a <= (q + 0.5) * d) || !(q == 0 || a >= (q - 0.5) * d)) return false;
        *code = uint16_t((q << 1) | (sign ? 1 : 0));
        return true;
    }

    /// exp_avg_sq / max_exp_avg_sq code of a > 0 (finite) whose log2 is lg (any estimate:
    /// the result is the nearest code whatever it is; within 8 steps a short walk finds it,
    /// else a bisection over the cells, which are ordered: in the subnormal range many
    /// indices round to one float, and only the lowest of such a run has a nonempty cell);
    /// also its cell when `cell` is given.
    CKPT_HD static bool encode_v(double a, double lg, const int16_t* p, uint16_t* code, Cell* cell = nullptr) {
        const double est = (lg * 1024 - double(p[0]) * 16) / p[1];
        if (!(est > -kMaxIndex - 2) || !(est < kMaxIndex + 2)) return false;
        int64_t j = int64_t(est < 0 ? est - 0.5 : est + 0.5);
        if (j > kMaxIndex) j = kMaxIndex;
        if (j < -kMaxIndex) j = -kMaxIndex;
        double xj = vval(p, j), up = vval(p, j + 1), dn = vval(p, j - 1);
        for (int it = 0; it < 8; ++it) {  // nearest: ties go to the lower index, as in cell()
            if (a > (xj + up) / 2 && j < kMaxIndex) { ++j; dn = xj; xj = up; up = vval(p, j + 1); }
            else if (a <= (xj + dn) / 2 && j > -kMaxIndex) { --j; up = xj; xj = dn; dn = vval(p, j - 1); }
            else break;
        }
        double lo = (xj + dn) / 2, hi = (xj + up) / 2;
        if (!(a > lo && a <= hi)) {  // the smallest j whose cell's upper end reaches a
            int64_t l = -kMaxIndex, h = kMaxIndex;
            if (!(a <= (vval(p, h) + vval(p, h + 1)) / 2)) return false;
            while (l < h) {
                const int64_t mid = l + (h - l) / 2;
                if (a <= (vval(p, mid) + vval(p, mid + 1)) / 2) h = mid;
                else l = mid + 1;
            }
            j = l;
            xj = vval(p, j);
            dn = vval(p, j - 1);
            up = vval(p, j + 1);
            lo = (xj + dn) / 2;
            hi = (xj + up) / 2;
        }
        if (!(xj > 0) || !(hi < INFINITY) || !(a > lo && a <= hi)) return false;
        *code = uint16_t(1 + zigzag(int32_t(j)));
        if (cell) *cell = {xj, lo, hi};  // = cell(*code, ...): the same three grid values
        return true;
    }

    /// Decoded value (rounded to float) and rounding cell of one code.
    CKPT_HD static Cell cell(uint16_t code, Role r, const int16_t* p, double scale) {
        if (r == Role::ExpAvg) return m_cell(code, value(p[0]) * scale);
        if (code == 0) return Cell{};  // exact zero
        return index_cell(p, unzigzag(uint32_t(code) - 1));
    }

    /// Index j of an exp_avg_sq code (0 for the exact zero: then max_exp_avg_sq is coded
    /// relative to the anchor).
    CKPT_HD static int64_t index_of(uint16_t vcode) { return vcode == 0 ? 0 : unzigzag(uint32_t(vcode) - 1); }
    /// Value and cell of index j on the grid of params p.
    CKPT_HD static Cell index_cell(const int16_t* p, int64_t j) {
        Cell c;
        c.dec = vval(p, j);
        c.lo = (c.dec + vval(p, j - 1)) / 2;
        c.hi = (c.dec + vval(p, j + 1)) / 2;
        return c;
    }
    /// max_exp_avg_sq (amsgrad) is coded on exp_avg_sq's grid (params pv) relative to its
    /// index: code 0 = exact +0, else 1 + zigzag(j2 - index_of(vcode)). amsgrad keeps
    /// max_exp_avg_sq >= exp_avg_sq and often equal, so the difference is small.
    CKPT_HD static Cell vmax_cell(uint16_t code, uint16_t vcode, const int16_t* pv) {
        if (code == 0) return Cell{};
        return index_cell(pv, index_of(vcode) + unzigzag(uint32_t(code) - 1));
    }

    /// Cell of exp_avg code `code` in units d = 2^(e/1024) sqrt(v~) (cell()'s exp_avg case).
    CKPT_HD static Cell m_cell(uint16_t code, double d) {
        Cell c;
        const int q = code >> 1;
        const bool neg = code & 1;
        const double lo = q == 0 ? -0.5 * d : (q - 0.5) * d, hi = (q + 0.5) * d;
        const double x = q == 0 ? 0.0 : double(float(q * d));
        if (neg) { c.dec = -x; c.lo = -hi; c.hi = -lo; } else { c.dec = x; c.lo = lo; c.hi = hi; }
        if (q == 0) { c.dec = neg ? -0.0 : 0.0; c.lo = -0.5 * d; c.hi = 0.5 * d; }
        return c;
    }

    /// m_cell(code, d).dec without the cell (restore's path).
    CKPT_HD_FORCE static double m_decoded(uint16_t code, double d) {
        const int q = code >> 1;
        const double x = q == 0 ? 0.0 : double(float(q * d));
        return (code & 1) ? -x : x;
    }

    /// cell(code, r, p, scale).dec without the cell's neighbour values (restore's path).
    CKPT_HD static double decoded(uint16_t code, Role r, const int16_t* p, double scale) {
        if (r == Role::ExpAvg) return m_decoded(code, value(p[0]) * scale);
        return code == 0 ? 0.0 : vval(p, unzigzag(uint32_t(code) - 1));
    }

    /// Block anchor of exp_avg_sq values x[0..n) (n <= 64, codec.h kBlock) with
    /// lg[i] = log2_hd(x[i]): the mean of log2 over the positive finite values, in 1/64
    /// octaves (0 when there are none). The sum runs in 8 lanes (lane l adds i = l mod 8 in order), then pairwise: one
    /// serial chain of n additions waits on each add's latency. Any anchor decodes (it is
    /// stored); every host and device add in this order, so containers stay identical. The
    /// selects come first, in a loop of their own: GCC 12.2 at -O3 vectorised the masked
    /// sum and the count fused in the 8-lane loop wrongly (test_codec checks the anchor).
    CKPT_HD static int16_t anchor(const float* x, const double* lg, int n) {
        double v[64];  // codec.h kBlock (block.h asserts kBlock <= 64; this header does not include codec.h)
        int cnt = 0;
        for (int i = 0; i < n; ++i) {
            const bool ok = (x[i] > 0) & (x[i] < INFINITY);
            v[i] = ok ? lg[i] : 0.0;
            cnt += ok;
        }
        double acc[8] = {};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; ++l) acc[l] += v[i + l];
        for (int l = 0; i < n; ++i, ++l) acc[l] += v[i];
        const double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        if (cnt == 0) return 0;
        double a = sum / cnt * 64;
        a = a < -32767 ? -32767 : a > 32767 ? 32767 : a;
        return int16_t(a < 0 ? a - 0.5 : a + 0.5);
    }
    /// The largest step s (1/1024 octaves) whose cells' upper half-width stays within
    /// relative `delta`: (2^(s/1024) - 1) / 2 <= delta; at least 1.
    CKPT_HD static int16_t v_step(double delta) {
        if (!(delta > 0)) return 1;
        const double s = 1024 * log2_hd(1 + 2 * delta) * (1 - 1e-9);
        return int16_t(s < 1 ? 1 : s > 32767 ? 32767 : int(s));
    }
    /// The largest exp_avg step exponent e (1/1024 octaves) with 2^(e/1024) <= dm.
    CKPT_HD static int16_t m_step(double dm) {
        if (!(dm > 0)) return -32767;
        const double e = 1024 * log2_hd(dm) - 1e-6;
        return int16_t(e < -32767 ? -32767 : e > 32767 ? 32767 : int(floor(e)));
    }
};


/// Row prediction of exp_avg_sq codes, applied by the container around the entropy coder
/// (formats/container.md, "vlog row prediction"). In a parameter whose rows hold `row`
/// values (numel / shape[0]; Adam's second moment has a strong per-column profile), the
/// index j of coordinate q is sent as its offset from the index that the coordinate one row
/// above (q - row, same segment, nonzero code) has on q's block grid, modulo 65535, so it
/// always fits. Codes of zero (and rows of one segment's first row) pass unchanged.
/// `codes`: one segment, n codes; `params`: its blocks' (a, s) pairs; segment-local
/// coordinate q lies in block q / 64. to_residual: absolute -> sent; else the inverse
/// (in coordinate order, so the row above is absolute again when q needs it).
void vlog_rows(uint16_t* codes, std::size_t n, const int16_t* params, std::size_t row, bool to_residual);

}  // namespace ckpt::codec
