// Device work over device-resident slices: encode + certify, escape compaction and
// decode. Shared by gpu_codec.cu (chunked host<->device pipeline) and bench_gpu.cu.
// First correct version: one thread per block of kBlock coordinates for the encoder
// (the block's parameter choice and trials are sequential in block.h), one thread per
// coordinate for the decoder.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "codec/codec.h"

namespace ckpt::gpu::detail {

inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
#define CKPT_CUDA(x) ::ckpt::gpu::detail::check((x), #x)

/// Device pointers of one encode slice (n coordinates, chunk-local indices 0..n-1).
struct EncodeArgs {
    const float* src[3];    ///< m, v, vmax (vmax only with amsgrad)
    const float* theta;     ///< may be null
    uint8_t* codes[3];      ///< n * code_bytes each; escaped coordinates get code 0
    int16_t* params[3];     ///< blocks * params_per_block each
    uint32_t* flags;        ///< n: 1 for an escaped coordinate
    double* block_max;      ///< blocks: largest kept certificate (0 when none)
    std::size_t n;
};

/// Escape table of a slice: chunk-local index and the exact FP32 bits of each moment.
struct CompactArgs {
    const uint32_t* flags;
    const uint32_t* pos;    ///< exclusive prefix sum of flags
    const float* src[3];
    int nm;
    uint32_t* idx;
    uint32_t* bits[3];
    uint32_t* count;        ///< total escapes (written by the last thread)
    std::size_t n;
};

/// Device pointers of one decode slice; codes/params are slice-based (the slice starts
/// on a block boundary).
struct DecodeArgs {
    const uint8_t* codes[3];
    const int16_t* params[3];
    float* out[3];          ///< null entries are not written
    const float* theta;     ///< may be null
    double* bounds;         ///< may be null
    /// may be null: the lowest slice-local block with a used code outside the float range
    /// (block.h code_in_range) is atomicMin-ed into it (the caller sets it to ~0 first)
    unsigned long long* bad;
    std::size_t n;
};

/// Enqueue the encoder / compaction / decoder for one device-resident slice on stream st
/// (defined in kernels.cu, the only translation unit holding the kernels).
void launch_encode(const codec::TensorSetup&, const codec::GuardConst&, const EncodeArgs&, cudaStream_t);
void launch_compact(const CompactArgs&, cudaStream_t);
void launch_decode(const codec::TensorSetup&, const codec::GuardConst&, const DecodeArgs&, cudaStream_t);
/// Temporary device storage that scan_flags / reduce_max need for n items.
std::size_t scan_temp_bytes(std::size_t n);
/// pos = exclusive prefix sum of flags (cub::DeviceScan), n < 2^31.
void scan_flags(void* temp, std::size_t temp_bytes, const uint32_t* flags, uint32_t* pos, std::size_t n, cudaStream_t);
/// *out = max of x[0..n) (cub::DeviceReduce), n >= 1.
void reduce_max(void* temp, std::size_t temp_bytes, const double* x, double* out, std::size_t n, cudaStream_t);

}  // namespace ckpt::gpu::detail
