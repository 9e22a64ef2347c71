// CKPT_HD marks math shared by the CPU path and the CUDA kernels (docs/design.md §4): the CPU
// tests run every line the GPU runs. Keep these functions free of host-only calls and
// of operations whose rounding differs between host and device (no exp2/log2 in
// anything that decides a code or a certificate; plain IEEE + - * / sqrt only).
#pragma once
#if defined(__CUDACC__)
#define CKPT_HD __host__ __device__ inline
#define CKPT_HD_FORCE __host__ __device__ __forceinline__
#else
#define CKPT_HD inline
/// CKPT_HD, always inlined: the small functions a vectorised loop calls (a call left in
/// the loop stops the vectoriser).
#define CKPT_HD_FORCE __attribute__((always_inline)) inline
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#if !defined(__CUDACC__)
namespace ckpt::codec {
using std::fabs;  // float overloads too (block.h vlog_sens<float>)
using std::isfinite;
using std::signbit;
using std::sqrt;
}  // namespace ckpt::codec
#endif

namespace ckpt::codec {

/// fmax / fmin with their NaN rule (a NaN operand gives the other one), inline: without
/// -ffinite-math-only the compiler calls libm's for std::fmax (a call per value).
/// One select on an OR of two compares (a select between booleans does not vectorise).
CKPT_HD_FORCE double fmax_hd(double a, double b) { return ((a > b) | (b != b)) ? a : b; }
CKPT_HD_FORCE double fmin_hd(double a, double b) { return ((a < b) | (b != b)) ? a : b; }

/// a > b ? a : b: b when either is NaN (a NaN b propagates; std::fmax would drop it).
/// One compare and select, which vectorises (certify_closed); cells made from codes are
/// never NaN, and a NaN that propagates only makes a certificate fail.
CKPT_HD_FORCE double max_hd(double a, double b) { return a > b ? a : b; }

/// 1.0 where c holds, else 0.0. The block loops keep their flags as such doubles and
/// blend with them arithmetically: GCC 12 vectorises that on every x86 level, where
/// selects between booleans or chains of selects leave control flow in the loop.
CKPT_HD_FORCE double flag_hd(bool c) { return c ? 1.0 : 0.0; }

/// x, hidden from the optimiser (an empty asm on the host): a clamp to such a bound cannot
/// be folded into a constant result, which GCC would branch to (control flow in a loop
/// stops its vectoriser). The value is unchanged.
CKPT_HD_FORCE double opaque_hd(double x) {
#if !defined(__CUDA_ARCH__) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(x));
#endif
    return x;
}

/// 2^q as a double, exact, for |q| <= 1022 (built from the exponent bits: ldexp's exact
/// result without the libm call).
CKPT_HD_FORCE double pow2i(int q) {
    const uint64_t bits = uint64_t(q + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/// Block reductions the CPU compiler leaves scalar when written as plain loops: GCC 12 turns
/// `c > m ? c : m` into scalar compares and moves, even over arrays of lane maxima
/// (docs/benchmarks.md, "Measurements behind the code's choices"), as it may not treat the
/// select as a max (NaN rules). On the host these run on GCC vector types of 4 doubles (one
/// ymm register under the AVX2 / AVX-512 clones, two SSE registers at baseline), on the
/// device as scalar loops. Each lane does the same IEEE operations as the scalar loop (no
/// FMA: built with -ffp-contract=off), and the maximum of a set does not depend on the order
/// it is taken in (a NaN never wins a strict compare; every result is >= +0), so both give
/// the same values bit for bit.
#if !defined(__CUDACC__)
typedef double Vec4d __attribute__((vector_size(32)));
#endif

/// The largest of acc's R x 4 lane maxima, per row, into out[0..R) (strict compares from m0).
template <int R>
CKPT_HD_FORCE void lanes_max(const double (&acc)[R][4], double m0, double* out) {
    for (int k = 0; k < R; ++k) {
        double m = m0;
        for (int l = 0; l < 4; ++l) m = acc[k][l] > m ? acc[k][l] : m;
        out[k] = m;
    }
}

/// The largest x[j] over j < n (n a multiple of 4), or +0 when none is larger (NaN ignored).
/// Four accumulators: one compare-and-select chain through a block is a serial dependency,
/// each step waiting on the one before (the vlog plan takes four maxima a block).
CKPT_HD_FORCE double block_max(const double* x, int n) {
#if !defined(__CUDACC__)
    Vec4d acc[4] = {};
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int k = 0; k < 4; ++k) {
            Vec4d c;
            memcpy(&c, x + j + 4 * k, sizeof c);
            acc[k] = c > acc[k] ? c : acc[k];
        }
    for (; j < n; j += 4) {
        Vec4d c;
        memcpy(&c, x + j, sizeof c);
        acc[0] = c > acc[0] ? c : acc[0];
    }
    acc[0] = acc[1] > acc[0] ? acc[1] : acc[0];
    acc[2] = acc[3] > acc[2] ? acc[3] : acc[2];
    acc[0] = acc[2] > acc[0] ? acc[2] : acc[0];
    double lanes[1][4], m;
    memcpy(lanes[0], &acc[0], sizeof acc[0]);
    lanes_max<1>(lanes, 0.0, &m);
    return m;
#else
    double m = 0;
    for (int j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    return m;
#endif
}

/// out[k] = the largest A[j] * r[k] + B[j] over j < n (n a multiple of 4), or +0 when none
/// is larger (NaN ignored), for the R ratios r[0..R).
template <int R>
CKPT_HD_FORCE void block_max_affine(const double* A, const double* B, int n, const double* r, double* out) {
#if !defined(__CUDACC__)
    Vec4d acc[R] = {};
    for (int j = 0; j < n; j += 4) {
        Vec4d a, b;
        memcpy(&a, A + j, sizeof a);
        memcpy(&b, B + j, sizeof b);
        for (int k = 0; k < R; ++k) {
            const Vec4d c = a * r[k] + b;
            acc[k] = c > acc[k] ? c : acc[k];
        }
    }
    double lanes[R][4];
    memcpy(lanes, acc, sizeof acc);
    lanes_max<R>(lanes, 0.0, out);
#else
    for (int k = 0; k < R; ++k) {
        double m = 0;
        for (int j = 0; j < n; ++j) {
            const double c = A[j] * r[k] + B[j];
            m = c > m ? c : m;
        }
        out[k] = m;
    }
#endif
}

/// Whether every x[j], j < n, is nonzero (a NaN counts as nonzero), on vector types where
/// the host allows (see block_max); the block loops' 0/1 flags.
CKPT_HD_FORCE bool block_all_nonzero(const double* x, int n) {
    int j = 0;
    bool all = true;
#if !defined(__CUDACC__)
    typedef long long Vec4l __attribute__((vector_size(32)));
    Vec4l acc = {-1, -1, -1, -1};
    const Vec4d zero = {};
    for (; j + 4 <= n; j += 4) {
        Vec4d c;
        memcpy(&c, x + j, sizeof c);
        acc &= c != zero;
    }
    all = (acc[0] & acc[1] & acc[2] & acc[3]) != 0;
#endif
    for (; j < n; ++j) all &= x[j] != 0;
    return all;
}

/// bool arrays 8 at a time, as words of 0/1 bytes (a bool is one byte, 0 or 1): GCC 12
/// leaves loops that mix bools with doubles or negate bools scalar.
CKPT_HD_FORCE uint64_t load_flags8(const bool* p) {
    uint64_t w;
    memcpy(&w, p, sizeof w);
    return w;
}
CKPT_HD_FORCE void store_flags8(bool* p, uint64_t w) { memcpy(p, &w, sizeof w); }
/// The number of 1 bytes in a word of 0/1 bytes (their sum lands in the top byte).
CKPT_HD_FORCE int count_flags8(uint64_t w) { return int((w * 0x0101010101010101ull) >> 56); }

/// x = mant * 2^ex with mant in [1, 2), for finite x > 0 (frexp's result times 2, exact;
/// subnormal doubles go through frexp).
CKPT_HD double mantissa(double x, int& ex) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    const int e = int((bits >> 52) & 0x7ff);
    if (e == 0) {
        const double f = frexp(x, &ex) * 2;
        --ex;
        return f;
    }
    ex = e - 1023;
    bits = (bits & ((uint64_t(1) << 52) - 1)) | (uint64_t(1023) << 52);
    double m;
    memcpy(&m, &bits, sizeof m);
    return m;
}

}  // namespace ckpt::codec
