// Scalar helpers that compile as host code and, under nvcc, as __host__ __device__ code too. The
// per-family parameter headers (src/params/) are built from these only: no std:: call that CUDA device
// code lacks, plain float arithmetic otherwise.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define XQ_HD __host__ __device__
#else
#define XQ_HD
#endif

namespace xquant::detail {

// The bits of a float32 and back.
XQ_HD inline std::uint32_t hd_float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
XQ_HD inline float hd_bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// NaN test without <cmath> (the build never uses -ffast-math, so v != v holds exactly for NaN).
XQ_HD inline bool hd_isnan(float v) noexcept { return v != v; }
// Finite: v - v is +0 for every finite v, NaN for +-Inf and NaN.
XQ_HD inline bool hd_isfinite(float v) noexcept { return (v - v) == 0.0f; }

// The canonical quiet NaN, bits 0x7FC00000.
XQ_HD inline float hd_qnan() noexcept {
#if defined(__CUDA_ARCH__)
  return __int_as_float(0x7FC00000);
#else
  return std::numeric_limits<float>::quiet_NaN();
#endif
}

// SPEC rule 1: round half to even (the default rounding mode, which xquant never changes).
XQ_HD inline float hd_rint(float v) noexcept {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::rint(v);
#endif
}

// SPEC rule 4: min / max that propagate NaN from either operand (as the canonical quiet NaN).
XQ_HD inline float hd_nan_min(float a, float b) noexcept {
  if (hd_isnan(a) || hd_isnan(b)) return hd_qnan();
  return b < a ? b : a;
}
XQ_HD inline float hd_nan_max(float a, float b) noexcept {
  if (hd_isnan(a) || hd_isnan(b)) return hd_qnan();
  return b > a ? b : a;
}
// NaN (any payload) -> the canonical quiet NaN; every other value unchanged.
XQ_HD inline float hd_canonical_nan(float v) noexcept { return hd_isnan(v) ? hd_qnan() : v; }

// SPEC rule 3 for a small signed range: `r` already rounded; NaN -> 0, below lo -> lo, above hi -> hi.
XQ_HD inline int hd_saturate_range(float r, int lo, int hi) noexcept {
  if (hd_isnan(r)) return 0;
  if (r < static_cast<float>(lo)) return lo;
  if (r > static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

}  // namespace xquant::detail
