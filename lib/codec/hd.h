// CKPT_HD marks math shared by the CPU path and the CUDA kernels (SPEC §2.4): the CPU
// tests run every line the GPU runs. Keep these functions free of host-only calls and
// of operations whose rounding differs between host and device (no exp2/log2 in
// anything that decides a code or a certificate; plain IEEE + - * / sqrt only).
#pragma once
#if defined(__CUDACC__)
#define CKPT_HD __host__ __device__ inline
#else
#define CKPT_HD inline
#endif

#include <cmath>
#if !defined(__CUDACC__)
namespace ckpt::codec {
using std::isfinite;
using std::signbit;
}  // namespace ckpt::codec
#endif
