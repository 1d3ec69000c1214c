// float32 <-> float8 (OCP FP8: e4m3fn and e5m2), written once on the bit patterns for the host and the
// CUDA kernels alike (the conversion of torch's c10::Float8_e4m3fn / Float8_e5m2 and of ml_dtypes, which
// the tests compare against bit for bit).
//
//   float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN;
//                  largest finite 448 (0x7E), smallest subnormal 2^-9.
//   float8_e5m2:   1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is +-Inf,
//                  S.11111.xx (xx != 0) NaN; largest finite 57344 (0x7B), smallest subnormal 2^-16.
//
// float32 -> float8 rounds once, to nearest with ties to even, subnormals included (a float32 below half
// the smallest subnormal gives a signed zero). Out of range (|rounded value| above the largest finite):
//   saturate == false (torch's .to(), ml_dtypes' astype, the cast of the Ascend golden kernels):
//                     e4m3fn -> NaN (0x7F | sign), e5m2 -> +-Inf (0x7C | sign); +-Inf likewise.
//   saturate == true: +-largest finite (0x7E / 0x7B | sign), +-Inf included (the SATFINITE conversion).
// NaN -> 0x7F | sign in both formats, the sign bit of the float32 NaN kept (as torch does).
#pragma once
#include <cstdint>

#include "core/hd.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail {

// The two formats as parameters of the one conversion.
struct Float8Format {
  int mant_bits;             // M
  int bias;                  // B
  std::uint32_t max_finite;  // the largest finite encoding (sign clear)
  std::uint32_t overflow;    // the encoding of an out-of-range value without saturation (sign clear)
};
XQ_HD inline Float8Format float8_format(DType dt) noexcept {
  if (dt == DType::float8_e5m2) return {2, 15, 0x7Bu, 0x7Cu};
  return {3, 7, 0x7Eu, 0x7Fu};  // float8_e4m3fn
}

XQ_HD inline std::uint8_t hd_float_to_float8(float f, Float8Format fmt, bool saturate) noexcept {
  const std::uint32_t u = hd_float_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);  // NaN
  const std::uint32_t over = saturate ? fmt.max_finite : fmt.overflow;
  if (a == 0x7F800000u) return static_cast<std::uint8_t>(sign | over);  // +-Inf
  const int exp_field = static_cast<int>(a >> 23);
  // float32 subnormals (< 2^-126) are far below half of either format's smallest subnormal: zero.
  if (exp_field == 0) return static_cast<std::uint8_t>(sign);
  const int e = exp_field - 127;                               // unbiased exponent: |f| = sig * 2^(e - 23)
  const std::uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;       // 24 significant bits
  const int emin = 1 - fmt.bias;                               // exponent of the smallest normal
  const int emax = (1 << (7 - fmt.mant_bits)) - 1 - fmt.bias;  // largest exponent field value, unbiased
  if (e > emax) return static_cast<std::uint8_t>(sign | over);
  // Quantum 2^q of the target at this magnitude: q = max(e, emin) - M. The kept count n = sig / 2^s with
  // s = q - (e - 23) >= 23 - M, rounded to nearest even on the s dropped bits.
  const int s = (e < emin ? emin : e) - fmt.mant_bits - (e - 23);
  if (s > 24) return static_cast<std::uint8_t>(sign);  // |f| < 2^(q-1): below half a quantum
  const std::uint32_t keep = sig >> s;
  const std::uint32_t rest = sig & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1);
  const std::uint32_t n = keep + ((rest > half || (rest == half && (keep & 1u))) ? 1u : 0u);
  // Subnormal range: the encoding is n itself (n == 2^M carries into the smallest normal). Normal range:
  // exponent field e + B over mantissa n - 2^M (n == 2^(M+1) carries into the next exponent).
  const std::uint32_t bits =
      e < emin ? n : (static_cast<std::uint32_t>(e + fmt.bias) << fmt.mant_bits) + n - (1u << fmt.mant_bits);
  if (bits > fmt.max_finite) return static_cast<std::uint8_t>(sign | over);
  return static_cast<std::uint8_t>(sign | bits);
}

XQ_HD inline std::uint8_t hd_float_to_float8(float f, DType dt, bool saturate) noexcept {
  return hd_float_to_float8(f, float8_format(dt), saturate);
}

// float8 -> float32, exact.
XQ_HD inline float hd_float8_to_float(std::uint8_t b, DType dt) noexcept {
  const Float8Format fmt = float8_format(dt);
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t mag = b & 0x7Fu;
  const std::uint32_t mant_mask = (1u << fmt.mant_bits) - 1u;
  const std::uint32_t exp_field = mag >> fmt.mant_bits;
  const std::uint32_t mant = mag & mant_mask;
  if (dt == DType::float8_e5m2 && exp_field == 0x1Fu)
    return hd_bits_float(sign | 0x7F800000u | (mant != 0 ? 0x400000u : 0u));               // Inf / quiet NaN
  if (dt != DType::float8_e5m2 && mag == 0x7Fu) return hd_bits_float(sign | 0x7FC00000u);  // NaN
  if (exp_field != 0)
    return hd_bits_float(sign | ((exp_field - static_cast<std::uint32_t>(fmt.bias) + 127u) << 23) |
                         (mant << (23 - fmt.mant_bits)));
  // Subnormal: mant * 2^(1 - B - M), a small integer times a power of two (exact in float32).
  const float v =
      static_cast<float>(mant) * hd_bits_float(static_cast<std::uint32_t>(127 + 1 - fmt.bias - fmt.mant_bits) << 23);
  return sign != 0 ? -v : v;
}

// The largest finite value of a float8 format (448 / 57344).
XQ_HD inline float float8_max(DType dt) noexcept { return dt == DType::float8_e5m2 ? 57344.0f : 448.0f; }

}  // namespace xquant::detail
