// The one element-type enum of ckptkit: readers produce it (torch pickle storage types and
// dtypes, safetensors header dtypes), lib/ckpt and the manifest carry it, and its spelling
// ("F32", "BF16", ...) appears only at the JSON edge (manifest, safetensors headers, reports).
#pragma once
#include <cstddef>
#include <optional>
#include <string>

namespace ckpt {

/// Element types met in torch.save and safetensors files. The first 17 are safetensors'
/// spellings; the rest are the other torch 2.x dtypes (c10/core/ScalarType.h; torch.storage's
/// _new_dtypes): fnuz/e8m0 float8, packed float4, complex32, the quantized types (their storages
/// are QInt8Storage etc.), the bit-packed shells and the sub-byte uint1..7/int1..7 shells,
/// which all take one byte per element in a storage.
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool, C64, C128,
                   F8_E5M2, F8_E4M3, U16, U32, U64,
                   F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F4_E2M1X2, C32, QI8, QU8, QI32, QU4X2, QU2X4,
                   Bits8, Bits16, Bits1x8, Bits2x4, Bits4x2, U1_7, I1_7 };
/// Bytes per element.
std::size_t dtype_size(DType);
/// safetensors spelling ("F32", "BF16", ...); ckptkit's own for dtypes safetensors lacks ("C32", "QI8").
const char* dtype_name(DType);
/// Parse a safetensors spelling (the first 17 DTypes and F8_E8M0); nullopt for any other name.
std::optional<DType> dtype_from_name(const std::string&);
/// Bytes per element of the float types the moment codecs take (F32: 4, F16 and BF16: 2);
/// 0 for every other type, so `float_dtype_size(t) != 0` asks "is it a moment float?".
std::size_t float_dtype_size(DType);

}  // namespace ckpt
