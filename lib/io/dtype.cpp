#include "io/dtype.h"

namespace ckpt {

namespace {
struct DTypeRow { DType t; const char* name; std::size_t size; };
constexpr DTypeRow kDTypes[] = {
    {DType::F64, "F64", 8},  {DType::F32, "F32", 4},   {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8},  {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},  {DType::I8, "I8", 1},     {DType::U8, "U8", 1},
    {DType::Bool, "BOOL", 1}, {DType::C64, "C64", 8},  {DType::C128, "C128", 16},
    {DType::F8_E5M2, "F8_E5M2", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::U16, "U16", 2},
    {DType::U32, "U32", 4},  {DType::U64, "U64", 8},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 1}, {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 1},
    {DType::F8_E8M0, "F8_E8M0", 1}, {DType::F4_E2M1X2, "F4_E2M1X2", 1}, {DType::C32, "C32", 4},
    {DType::QI8, "QI8", 1}, {DType::QU8, "QU8", 1}, {DType::QI32, "QI32", 4}, {DType::QU4X2, "QU4X2", 1},
    {DType::QU2X4, "QU2X4", 1}, {DType::Bits8, "BITS8", 1}, {DType::Bits16, "BITS16", 2},
    {DType::Bits1x8, "BITS1X8", 1}, {DType::Bits2x4, "BITS2X4", 1}, {DType::Bits4x2, "BITS4X2", 1},
    {DType::U1_7, "U1_7", 1}, {DType::I1_7, "I1_7", 1}};
const DTypeRow& row(DType t) {
    for (const auto& r : kDTypes)
        if (r.t == t) return r;
    return kDTypes[0];   // unreachable: every enumerator has a row
}
}  // namespace

std::size_t dtype_size(DType t) { return row(t).size; }
const char* dtype_name(DType t) { return row(t).name; }
std::optional<DType> dtype_from_name(const std::string& s) {
    for (const auto& r : kDTypes)
        if (s == r.name && (r.t <= DType::U64 || r.t == DType::F8_E8M0)) return r.t;   // safetensors' own
    return std::nullopt;
}
std::size_t float_dtype_size(DType t) {
    return t == DType::F32 ? 4 : (t == DType::F16 || t == DType::BF16) ? 2 : 0;
}

}  // namespace ckpt
