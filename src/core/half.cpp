// float32 <-> float16 / bfloat16 with round-to-nearest-even, written on the bit patterns so that the
// result does not depend on the compiler, the SIMD target or the FPU's flush-to-zero settings.
#include "xquant/half.hpp"

#include <bit>
#include <cstdint>

namespace xquant {

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // Inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal: mant * 2^-24, renormalized (exact).
  std::uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u)  // NaN: quiet it, keep the top payload bits
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65536 (and Inf)
  const std::uint32_t e = a >> 23;
  if (e >= 113) {
    // Normal half (or rounds up into Inf): drop 13 mantissa bits, ties to even; the carry may ripple
    // into the exponent, which is exactly the right result (up to 0x7C00 = Inf).
    const std::uint32_t rebased = a - (112u << 23);
    const std::uint32_t keep = rebased >> 13;
    const std::uint32_t rest = rebased & 0x1FFFu;
    const std::uint32_t up = (rest > 0x1000u || (rest == 0x1000u && (keep & 1u))) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | (keep + up));
  }
  if (e < 101) return sign;  // below 2^-25: rounds to (signed) zero
  // Subnormal half: value = M * 2^(e - 150) with M the 24-bit significand; half units are 2^-24, so
  // the result is M >> (126 - e) rounded to nearest even (it may round up to the smallest normal).
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // 14 .. 25
  const std::uint32_t keep = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half_ulp = 1u << (shift - 1u);
  const std::uint32_t up = (rest > half_ulp || (rest == half_ulp && (keep & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (keep + up));
}

float bfloat16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::uint16_t float_to_bfloat16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  // Same exponent range as float: rounding the 16 dropped bits to nearest even is correct for normals
  // and subnormals alike, and a carry out of the largest finite value gives Inf.
  const std::uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

}  // namespace xquant
