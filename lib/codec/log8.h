// log8: 8-bit logarithmic moment codes with a per-block scale (docs/design.md §4, seed 003).
//
// Grid: values are 2^(e/64) for integer e ("1/64 octave" units), so decoding is a table
// lookup and an exact power-of-two scaling: bit-identical on every host and device.
// Per block and moment, two int32 parameters: e_top (exponent of the top code) and the
// step s >= 1 (1/64 octaves between codes). Code K (=255 unsigned, 127 signed magnitude)
// is 2^(e_top/64); code k is 2^((e_top - (K-k)*s)/64); code 0 is an exact zero.
// exp_avg_sq / max_exp_avg_sq are logarithmic as above (K = 255). exp_avg is linear in
// m / sqrt(v~) (v~ = the decoded exp_avg_sq of the same coordinate), because the guard's
// m-term is |m - m~| / sqrt(v): a sign bit (so -0.0 stays exact) and magnitude k <= 127,
// m~ = k * 2^(e/64) * sqrt(v~), one int32 e per block. Rounding is per moment to the
// nearest code. Values outside the coded range have no code: they are escapes.
#pragma once
#include <cmath>
#include <cstdint>

#include "codec/guard.h"
#include "codec/hd.h"

namespace ckpt::codec {

/// 2^(j/64) rounded to float, j = 0..64 (Log8::table).
#define CKPT_LOG8_TABLE {0x1.0000000000000p+0, 0x1.02c9a40000000p+0, 0x1.059b0e0000000p+0, 0x1.0874520000000p+0, 0x1.0b55860000000p+0, 0x1.0e3ec40000000p+0, 0x1.11301e0000000p+0, 0x1.1429aa0000000p+0, 0x1.172b840000000p+0, 0x1.1a35be0000000p+0, 0x1.1d48740000000p+0, 0x1.2063b80000000p+0, 0x1.2387a60000000p+0, 0x1.26b4560000000p+0, 0x1.29e9e00000000p+0, 0x1.2d285a0000000p+0, 0x1.306fe00000000p+0, 0x1.33c08c0000000p+0, 0x1.371a740000000p+0, 0x1.3a7db40000000p+0, 0x1.3dea640000000p+0, 0x1.4160a20000000p+0, 0x1.44e0860000000p+0, 0x1.486a2c0000000p+0, 0x1.4bfdae0000000p+0, 0x1.4f9b280000000p+0, 0x1.5342b60000000p+0, 0x1.56f4740000000p+0, 0x1.5ab07e0000000p+0, 0x1.5e76f20000000p+0, 0x1.6247ec0000000p+0, 0x1.6623880000000p+0, 0x1.6a09e60000000p+0, 0x1.6dfb240000000p+0, 0x1.71f75e0000000p+0, 0x1.75feb60000000p+0, 0x1.7a11480000000p+0, 0x1.7e2f340000000p+0, 0x1.82589a0000000p+0, 0x1.868d9a0000000p+0, 0x1.8ace540000000p+0, 0x1.8f1aea0000000p+0, 0x1.93737c0000000p+0, 0x1.97d82a0000000p+0, 0x1.9c49180000000p+0, 0x1.a0c6680000000p+0, 0x1.a5503c0000000p+0, 0x1.a9e6b60000000p+0, 0x1.ae89fa0000000p+0, 0x1.b33a2c0000000p+0, 0x1.b7f7700000000p+0, 0x1.bcc1ea0000000p+0, 0x1.c199be0000000p+0, 0x1.c67f120000000p+0, 0x1.cb720e0000000p+0, 0x1.d072d40000000p+0, 0x1.d5818e0000000p+0, 0x1.da9e600000000p+0, 0x1.dfc9740000000p+0, 0x1.e502ee0000000p+0, 0x1.ea4afa0000000p+0, 0x1.efa1be0000000p+0, 0x1.f507660000000p+0, 0x1.fa7c180000000p+0, 0x1.0000000000000p+1}
#if defined(__CUDACC__)
static __constant__ float kLog8TableDev[65] = CKPT_LOG8_TABLE;
#endif

/// Which optimizer moment a stream holds.
enum class Role : int { ExpAvg = 0, ExpAvgSq = 1, MaxExpAvgSq = 2 };

struct Log8 {
    static constexpr int kCodeBytes = 1;    ///< bytes per value
    static constexpr int kParams = 2;       ///< int16 per block: (e_top, s) for v; (e, 0) for m
    static constexpr int kMaxStep = kLog8MaxStep;  ///< largest step, 1/64 octaves (~30% apart)

    /// 2^(j/64) rounded to float, j = 0..64.
    CKPT_HD static double table(int j) {
#if defined(__CUDA_ARCH__)
        return kLog8TableDev[j];
#else
        static constexpr float t[65] = CKPT_LOG8_TABLE;
        return t[j];
#endif
    }
    /// The float 2^(e/64) (RNE to float; 0 or inf outside float range), as double.
    /// table(r) * 2^q is exact in double (|q| <= 200), so only the float cast rounds.
    CKPT_HD static double value(int64_t e) {
        int64_t q = e >= 0 ? e / 64 : -((-e + 63) / 64);
        const int r = int(e - q * 64);
        if (q > 200) q = 200;
        if (q < -200) q = -200;
        return double(float(table(r) * pow2i(int(q))));
    }
    /// Largest e with 2^(e/64) <= |x| in float terms (x finite, nonzero): the binary
    /// exponent from the bits, then a binary search of the mantissa in table().
    CKPT_HD static int64_t log64_floor(double x) {
        int ex;
        const double mant = mantissa(fabs(x), ex);  // [1, 2), |x| = mant * 2^ex
        int lo = 0, hi = 64;                       // table(lo) <= mant < table(hi)
        while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (table(mid) <= mant) lo = mid;
            else hi = mid;
        }
        return int64_t(ex) * 64 + lo;
    }
    /// Smallest e with 2^(e/64) >= |x|.
    CKPT_HD static int64_t log64_ceil(double x) {
        const int64_t f = log64_floor(x);
        return value(f) >= fabs(x) ? f : f + 1;
    }
    CKPT_HD static int top_code(Role r) { return r == Role::ExpAvg ? 127 : 255; }

    /// Decoded magnitude of code k >= 1 under (e_top, s).
    CKPT_HD static double mag(int k, const int16_t* p, int K) {
        return value(int64_t(p[0]) - int64_t(K - k) * p[1]);
    }

    /// Rounding cell of exp_avg_sq magnitude code k (k >= 1) as [lo, hi].
    CKPT_HD static void mag_cell(int k, const int16_t* p, int K, bool down_to_zero, double& lo,
                          double& hi) {
        const double x = mag(k, p, K);
        lo = (k == 1 && down_to_zero) ? 0.0 : (x + mag(k - 1, p, K)) / 2;
        hi = (x + mag(k + 1, p, K)) / 2;  // k == K: half a step above the top code
    }

    /// exp_avg cell half-width unit: code k of a block with step exponent e decodes to
    /// k * 2^(e/64) * sqrt(v~); the cell is (k -+ 1/2) of that.
    CKPT_HD static void m_cell(int k, const int16_t* p, double scale, double& lo, double& hi) {
        const double d = value(p[0]) * scale;
        lo = (k - 0.5) * d;
        hi = (k + 0.5) * d;
        if (k == 0) lo = -hi;
    }

    /// Whether code `code` of role r stands for a value other than an exact zero (a nonzero
    /// code; for exp_avg a nonzero magnitude): block.h code_in_range.
    CKPT_HD static bool used(uint16_t code, Role r) { return (r == Role::ExpAvg ? code & 0x7f : code) != 0; }
    static constexpr bool kUsedMayDecodeZero = false;  ///< steps <= kMaxStep keep a used code's cell off 0

    /// Encode one value. `scale` is sqrt of the decoded exp_avg_sq of the same coordinate
    /// (used by exp_avg only). Returns false when x has no code (escape). Deterministic.
    CKPT_HD static bool encode(float x, Role r, const int16_t* p, double scale, uint16_t* code) {
        const int K = top_code(r);
        const bool sign = signbit(x);
        const int sbit = (r == Role::ExpAvg && sign) ? 0x80 : 0;
        // exact zeros stay exact, sign included: -0.0 exp_avg_sq has no code (an escape)
        if (x == 0 && (!sign || r == Role::ExpAvg)) { *code = uint16_t(sbit); return true; }
        if (!isfinite(x) || (sign && r != Role::ExpAvg)) return false;
        const double a = fabs(double(x));
        double lo, hi;
        if (r == Role::ExpAvg) {  // linear in m / sqrt(v~)
            if (!(scale > 0) || !isfinite(scale)) return false;
            const double d = value(p[0]) * scale;  // m_cell's unit
            const double q = a / d;
            if (!(q < K + 1)) return false;
            int k = int(q + 0.5);
            if (k > K) k = K;  // q in [K+1/2, K+1) has no code: the cell check below fails
            for (int it = 0; it < 4; ++it) {
                lo = (k - 0.5) * d;
                hi = (k + 0.5) * d;
                if (k == 0) lo = -hi;
                if (a > hi && k < K) ++k;
                else if (a < lo && k > 0) --k;
                else break;
            }
            m_cell(k, p, scale, lo, hi);
            if (!(lo <= a && a <= hi)) return false;
            *code = uint16_t(k | sbit);
            return true;
        }
        // start at the code nearest a quadratic estimate of 64*log2(|x|) (error < 0.4); the
        // loops below make the result exact whatever the start
        int ex;
        const double f = mantissa(a, ex) - 1;
        const double est = (double(p[0]) - (ex * 64.0 + 64.0 * f * (1.3465 - 0.3465 * f))) / p[1];
        int64_t k = est < 0 ? K : est > K ? 1 : K - int64_t(est + 0.5);
        if (k < 1) k = 1;
        // nearest code: move k while |x| is past the midpoint to a neighbour (the cells of
        // mag_cell; one neighbour value per step)
        double mk = mag(int(k), p, K);
        while (k < K) {
            const double up = mag(int(k) + 1, p, K);
            if (!(a > (mk + up) / 2)) break;
            ++k;
            mk = up;
        }
        while (k > 1) {
            const double dn = mag(int(k) - 1, p, K);
            if (!(a <= (mk + dn) / 2)) break;
            --k;
            mk = dn;
        }
        if (k == K && a > (mk + mag(K + 1, p, K)) / 2) return false;  // above the top cell
        if (k == 1 && a < (mk + mag(0, p, K)) / 2) return false;      // below the bottom cell
        *code = uint16_t(k);
        return true;
    }

    /// Decoded value (rounded to float) and the rounding cell of one code.
    CKPT_HD static Cell cell(uint16_t code, Role r, const int16_t* p, double scale) {
        const int K = top_code(r);
        const int k = r == Role::ExpAvg ? (code & 0x7f) : code;
        const bool neg = r == Role::ExpAvg && (code & 0x80);
        Cell c;
        double lo, hi, x;
        if (r == Role::ExpAvg) {
            m_cell(k, p, scale, lo, hi);
            x = double(float(k * (value(p[0]) * scale)));
            if (k == 0) { c.dec = neg ? -0.0 : 0.0; c.lo = lo; c.hi = hi; return c; }
        } else {
            if (k == 0) { c.dec = 0.0; return c; }
            mag_cell(k, p, K, false, lo, hi);
            x = mag(k, p, K);
        }
        if (neg) { c.dec = -x; c.lo = -hi; c.hi = -lo; } else { c.dec = x; c.lo = lo; c.hi = hi; }
        return c;
    }

    /// Alternative steps tried for a block that has escapes under choose()'s pick
    /// (coarser steps cover a wider range): for exp_avg_sq, variant 1..3 widens s by 1, 2,
    /// 4; variant -1 doubles the exp_avg step.
    CKPT_HD static bool vary(int16_t* p, int variant) {
        if (variant == -1) { p[0] += 64; return true; }
        const int widen = variant == 3 ? 4 : variant;  // {0, 1, 2, 4}[variant]
        if (variant < 1 || variant > 3 || p[1] + widen > kMaxStep) return false;
        p[1] += widen;
        return true;
    }
    static constexpr int kVariants = 4;

    /// Choose the block parameters of n values of role r.
    /// exp_avg_sq / max_exp_avg_sq: e_top covers the largest value; the step s covers the
    /// smallest nonzero value, capped where the guard's v-term would exceed ~55% of the
    /// tolerance (values below the range escape).
    /// exp_avg: step 2^(e/64) in units of sqrt(v~) (`scale`), fine enough to code the
    /// largest |m|/sqrt(v~) of the block, but never coarser than the step whose guard
    /// m-term (b1/2 * step * sqrt(bc2/b2) / bc1) is 40% of the tolerance.
    CKPT_HD static void choose(const float* x, int n, Role r, const double* scale, const GuardConst& gc,
                               int16_t* p) {
        const int K = top_code(r);
        if (r == Role::ExpAvg) {
            double rho = 0;
            for (int i = 0; i < n; ++i) {
                const double a = fabs(double(x[i]));
                if (a > 0 && isfinite(a) && scale[i] > 0 && isfinite(scale[i]))
                    rho = fmax(rho, a / scale[i]);
            }
            // the m-term factor: b1/bc1 for the first update, closed_all's h_k1 = 2 plan_ka for all
            const double target = gc.all ? 0.8 * gc.tolerance * sqrt(gc.b2) / (2 * gc.plan_ka * gc.sqrt_bc2)
                                         : 0.8 * gc.tolerance * sqrt(gc.b2) / (gc.b1 * gc.sqrt_bc2 * gc.inv_bc1);
            const double need = rho / (K + 0.5);
            int64_t e = need > 0 && need <= target ? log64_ceil(need) : log64_floor(target);
            if (e < -16000) e = -16000;  // int16 storage; far below any useful step
            if (e > 16000) e = 16000;
            p[0] = int16_t(e);
            p[1] = 0;
            return;
        }
        double mx = 0, mn = INFINITY;
        for (int i = 0; i < n; ++i) {
            const double a = double(x[i]);
            if (!(a > 0) || !isfinite(a)) continue;
            mx = fmax(mx, a);
            mn = fmin(mn, a);
        }
        if (mx == 0) { p[0] = 0; p[1] = 1; return; }
        const int64_t top = log64_ceil(mx);
        int64_t s = (top - log64_floor(mn) + (K - 2)) / (K - 1);
        const int cap = gc.log8_v_step_cap;  // make_guard_const
        if (s > cap) s = cap;
        if (s < 1) s = 1;
        p[0] = int16_t(top);
        p[1] = int16_t(s);
    }
};

}  // namespace ckpt::codec
