// Conversions between a moment storage's bytes and float values (F32, F16, BF16), for the
// container reader and the compress / verify / restore jobs. Every function takes one of
// the three moment floats (io/dtype.h float_dtype_size != 0); any other DType is treated
// as F16. In namespace ckpt, as io/dtype.h.
#pragma once
#include <cstdint>
#include <vector>

#include "io/dtype.h"   // DType, float_dtype_size

namespace ckpt {

/// Decode n elements of `dtype` (little-endian) into floats (exact for all three).
void bytes_to_float(DType dtype, const uint8_t* in, std::size_t n, float* out);
/// Encode n floats into `dtype` bytes (values are already representable).
void float_to_bytes(DType dtype, const float* in, std::size_t n, uint8_t* out);
/// Raw bits of element i (zero-extended for 2-byte types).
uint32_t element_bits(DType dtype, const uint8_t* in, std::size_t i);
/// Store raw bits (the low 16 for 2-byte types) as element i.
void store_bits(DType dtype, uint32_t bits, uint8_t* out, std::size_t i);

/// The largest |x| over the finite values of x[0..n) as float bits (sign cleared), or -1
/// when none is finite (n = 0 included): infinities and NaNs are left out. For those bits
/// integer order is numeric order, so one integer max gives it (it vectorises; a float max
/// with NaN tracking did not).
int32_t max_finite_abs_bits(const float* x, std::size_t n);

/// v.data() with room for n elements, whose contents the caller overwrites: when shorter,
/// replaced by n zeros (the old contents are not copied over), never shrunk, so a buffer
/// reused across chunks and parameters is filled once, not per chunk.
template <class T>
T* room(std::vector<T>& v, std::size_t n) {
    if (v.size() < n) {
        v.clear();  // resize then relocates nothing
        v.resize(n);
    }
    return v.data();
}

/// Where the `dtype` bytes of values[0..n) live: for F32 the values themselves (a
/// little-endian host: bytes_to_float / float_to_bytes are copies there, so there is
/// nothing to convert), else `scratch` (grown to n elements; the caller converts).
inline uint8_t* element_bytes(DType dtype, float* values, std::size_t n, std::vector<uint8_t>& scratch) {
    return dtype == DType::F32 ? reinterpret_cast<uint8_t*>(values) : room(scratch, n * float_dtype_size(dtype));
}

}  // namespace ckpt
