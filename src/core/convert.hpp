// float32 <-> float16 / bfloat16 with round-to-nearest-even, and the dtype-dispatched scalar load / store
// of SPEC rule 2, written once on the bit patterns so that the result depends on neither the compiler,
// the SIMD target, the FPU's flush-to-zero setting nor the device: the host (core/half.cpp,
// core/numeric.hpp) and the CUDA kernels (src/cuda/) compile these same functions.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/float8.hpp"
#include "core/hd.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail {

XQ_HD inline float hd_half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return hd_bits_float(sign | 0x7F800000u | (mant << 13));  // Inf / NaN
  if (exp != 0) return hd_bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return hd_bits_float(sign);
  // Subnormal: mant * 2^-24, renormalized (exact).
  std::uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return hd_bits_float(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

XQ_HD inline std::uint16_t hd_float_to_half(float f) noexcept {
  const std::uint32_t x = hd_float_bits(f);
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

XQ_HD inline float hd_bfloat16_to_float(std::uint16_t b) noexcept {
  return hd_bits_float(static_cast<std::uint32_t>(b) << 16);
}

XQ_HD inline std::uint16_t hd_float_to_bfloat16(float f) noexcept {
  const std::uint32_t x = hd_float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  // Same exponent range as float: rounding the 16 dropped bits to nearest even is correct for normals
  // and subnormals alike, and a carry out of the largest finite value gives Inf.
  const std::uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// Rule 2: every input is widened to float32 ...
XQ_HD inline float hd_load_float(DType dt, const void* base, std::int64_t i) noexcept {
  switch (dt) {
    case DType::float16:
      return hd_half_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bfloat16:
      return hd_bfloat16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::int8:
      return static_cast<float>(static_cast<const std::int8_t*>(base)[i]);
    case DType::uint8:
      return static_cast<float>(static_cast<const std::uint8_t*>(base)[i]);
    case DType::int32:
      return static_cast<float>(static_cast<const std::int32_t*>(base)[i]);
    case DType::int64:
      return static_cast<float>(static_cast<const std::int64_t*>(base)[i]);
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:
      return hd_float8_to_float(static_cast<const std::uint8_t*>(base)[i], dt);
    case DType::float32:
      break;
  }
  return static_cast<const float*>(base)[i];
}

// ... and floating results are narrowed once, round-to-nearest-even (float16 / bfloat16 / float8).
XQ_HD inline void hd_store_float(DType dt, void* base, std::int64_t i, float v) noexcept {
  switch (dt) {
    case DType::float16:
      static_cast<std::uint16_t*>(base)[i] = hd_float_to_half(v);
      return;
    case DType::bfloat16:
      static_cast<std::uint16_t*>(base)[i] = hd_float_to_bfloat16(v);
      return;
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:  // torch's cast: no saturation (core/float8.hpp)
      static_cast<std::uint8_t*>(base)[i] = hd_float_to_float8(v, dt, false);
      return;
    default:
      static_cast<float*>(base)[i] = v;
      return;
  }
}

}  // namespace xquant::detail
