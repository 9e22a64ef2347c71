// GPU encode + certify + escape compaction and decode (docs/design.md §4): the CUDA row of
// the backend table (codec/backend.h), which the pipeline goes through. The math is
// lib/codec/block.h, shared with the CPU loops, so the output is byte-identical to
// codec::encode_chunk / codec::decode_chunk. Built when nvcc is found (CKPTKIT_CUDA);
// otherwise a stub (gpu_stub.cpp) answers gpu_available() == false and the GPU calls throw.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "codec/codec.h"

namespace ckpt::gpu {

/// True when the library was built with CUDA and a device can be used; otherwise false
/// with the reason in *why (when non-null). The answer is cached after the first call.
bool gpu_available(std::string* why = nullptr);

/// Same semantics and byte-identical output as codec::encode_chunk. Throws
/// std::runtime_error when no device is available or a CUDA call fails.
codec::ChunkOut encode_chunk_gpu(const codec::TensorSetup&, const codec::ChunkIn&);

/// Exact FP32 bits of each escaped coordinate's moments, per role, in escape order.
using EscapeBits = std::array<std::vector<uint32_t>, 3>;

/// encode_chunk_gpu that also returns the escape table's exact bits from the device's
/// compaction (bits may be null).
codec::ChunkOut encode_chunk_gpu_ex(const codec::TensorSetup&, const codec::ChunkIn&, EscapeBits* bits);

/// Same semantics and output as codec::decode_chunk (the first block with a used code
/// outside the float range, or SIZE_MAX).
std::size_t decode_chunk_gpu(const codec::TensorSetup&, const std::array<const uint8_t*, 3>& codes,
                      const std::array<const int16_t*, 3>& params, std::size_t n, std::array<float*, 3> out,
                      const float* theta, double* bounds);

}  // namespace ckpt::gpu
