// Conversions between a moment storage's bytes and float values (FP32, F16, BF16), and
// the progress line (common/progress.h). Shared by compress, verify and restore.
#pragma once
#include <cstdint>
#include <string>

#include "common/progress.h"  // Progress (moved to lib/common for every tool)

namespace ckpt {

/// Element size in bytes of "F32" | "F16" | "BF16" (0 for anything else).
std::size_t float_dtype_size(const std::string& dtype);
/// Decode n elements of `dtype` (little-endian) into floats (exact for all three).
void bytes_to_float(const std::string& dtype, const uint8_t* in, std::size_t n, float* out);
/// Encode n floats into `dtype` bytes (values are already representable).
void float_to_bytes(const std::string& dtype, const float* in, std::size_t n, uint8_t* out);
/// Raw bits of element i (zero-extended for 2-byte types).
uint32_t element_bits(const std::string& dtype, const uint8_t* in, std::size_t i);
void store_bits(const std::string& dtype, uint32_t bits, uint8_t* out, std::size_t i);

}  // namespace ckpt
