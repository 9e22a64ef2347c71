// Conversions between a moment storage's bytes and float values (F32, F16, BF16), and
// the progress line (common/progress.h). Shared by compress, verify and restore. Every
// function takes one of the three moment floats (io/dtype.h float_dtype_size != 0);
// any other DType is treated as F16.
#pragma once
#include <cstdint>

#include "common/progress.h"  // Progress (moved to lib/common for every tool)
#include "io/dtype.h"         // DType, float_dtype_size

namespace ckpt {

/// Decode n elements of `dtype` (little-endian) into floats (exact for all three).
void bytes_to_float(DType dtype, const uint8_t* in, std::size_t n, float* out);
/// Encode n floats into `dtype` bytes (values are already representable).
void float_to_bytes(DType dtype, const float* in, std::size_t n, uint8_t* out);
/// Raw bits of element i (zero-extended for 2-byte types).
uint32_t element_bits(DType dtype, const uint8_t* in, std::size_t i);
/// Store raw bits (the low 16 for 2-byte types) as element i.
void store_bits(DType dtype, uint32_t bits, uint8_t* out, std::size_t i);

}  // namespace ckpt
