// Correctly rounded conversions between float32 and the 16-bit float formats.
// float -> 16 bit rounds to nearest, ties to even, for every input: subnormal results, overflow to Inf,
// NaN stays NaN (quieted, sign and top payload bits kept). 16 bit -> float is exact.
#pragma once
#include <cstdint>

namespace xquant {

float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;
float bfloat16_to_float(std::uint16_t b) noexcept;
std::uint16_t float_to_bfloat16(float f) noexcept;

}  // namespace xquant
