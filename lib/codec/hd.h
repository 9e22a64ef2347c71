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
using std::isfinite;
using std::signbit;
}  // namespace ckpt::codec
#endif

namespace ckpt::codec {

/// fmax / fmin with their NaN rule (a NaN operand gives the other one), inline: without
/// -ffinite-math-only the compiler calls libm's for std::fmax (measured 1.6% of compress).
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
