// Scalar numeric building blocks shared by the reference kernels and the operator layer. Each mirrors one
// sentence of SPEC.md "Rules that hold for every operator".
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/convert.hpp"
#include "core/hd.hpp"
#include "xquant/dtype.hpp"
#include "xquant/half.hpp"

namespace xquant::detail {

// Rule 1: round half to even. std::rint honours the current rounding mode, which xquant never changes
// (the default is to-nearest-even). (The device-safe scalar helpers live in core/hd.hpp.)
inline float round_half_even(float v) noexcept { return hd_rint(v); }

// Rule 2: every floating input is widened to float32, and floating results are narrowed once,
// round-to-nearest-even (core/convert.hpp: the same code on the host and on CUDA devices).
inline float load_float(DType dt, const void* base, std::int64_t i) noexcept { return hd_load_float(dt, base, i); }
inline void store_float(DType dt, void* base, std::int64_t i, float v) noexcept { hd_store_float(dt, base, i, v); }

// Rule 3: integer outputs saturate, NaN -> 0, +-Inf -> max / min. The comparison happens in float before
// any conversion: a hardware float->int conversion of an out-of-range value is undefined in C++ (and
// cvttps2dq returns INT_MIN). `r` must already be rounded to an integer value (or be Inf / NaN).
template <typename Int>
inline Int saturate_rounded(float r) noexcept {
  constexpr float lo = static_cast<float>(std::numeric_limits<Int>::min());  // exact: -2^k
  // The first value above the range, exact in float for every width (128, 256, 2^31).
  constexpr float above =
      std::numeric_limits<Int>::is_signed ? -lo : static_cast<float>(std::numeric_limits<Int>::max()) + 1.0f;
  if (std::isnan(r)) return 0;
  if (r < lo) return std::numeric_limits<Int>::min();
  if (r >= above) return std::numeric_limits<Int>::max();
  return static_cast<Int>(r);
}

// Saturate to an arbitrary small signed range [lo, hi] (int4: [-8, 7]); NaN -> 0.
inline int saturate_rounded_range(float r, int lo, int hi) noexcept { return hd_saturate_range(r, lo, hi); }

// Packed int4 (quint4x2): element 8k + j goes to bits [4j, 4j + 3] of word k, two's complement nibble.
inline void store_int4(std::int32_t* words, std::int64_t i, int v) noexcept {
  const std::uint32_t nib = static_cast<std::uint32_t>(v) & 0xFu;
  const int shift = static_cast<int>(i & 7) * 4;
  auto* w = reinterpret_cast<std::uint32_t*>(words) + (i >> 3);
  *w = (*w & ~(0xFu << shift)) | (nib << shift);
}
inline int load_int4(const std::int32_t* words, std::int64_t i) noexcept {
  const std::uint32_t w = reinterpret_cast<const std::uint32_t*>(words)[i >> 3];
  const int nib = static_cast<int>((w >> ((i & 7) * 4)) & 0xFu);
  return nib >= 8 ? nib - 16 : nib;
}

// Rule 4 helpers: min / max that propagate NaN from either operand (std::min/max do not).
inline float nan_min(float a, float b) noexcept { return hd_nan_min(a, b); }
inline float nan_max(float a, float b) noexcept { return hd_nan_max(a, b); }

// Rule 5: the canonical deterministic sum of a sequence of float32 terms t[0], t[1], ...
//   - the sequence is cut into chunks of kSumChunk consecutive terms;
//   - within a chunk, term n goes to double lane (n % 16): lane[n % 16] += (double)t[n], in order;
//   - a chunk's value is its 16 lanes folded by halving: lane[i] += lane[i + 8] (i < 8), then + 4, + 2, + 1;
//   - chunk values are added in order into a double total, which is rounded once to float32.
// Lanes and total start at -0.0, the exact additive identity, so that a sum of one term is that term
// bit for bit (-0 included); an empty sum is +0. A NaN result is returned as the canonical quiet NaN
// (0x7FC00000): which NaN an addition propagates depends on operand order, which compilers treat as
// commutative, so NaN payloads and signs could not be reproduced across backends. Neither thread count nor SIMD width
// changes this order: a backend may give chunks to threads and lanes to vector registers but must combine them exactly
// so.
inline constexpr std::int64_t kSumLanes = 16;
inline constexpr std::int64_t kSumChunk = 1024;

class CanonicalSum {
 public:
  void add(float t) noexcept {
    lanes_[n_ % kSumLanes] += static_cast<double>(t);
    if (++n_ % kSumChunk == 0) flush();
  }
  // The sum of the terms added so far; resets the accumulator.
  float result() noexcept {
    if (n_ == 0) return 0.0f;
    if (n_ % kSumChunk != 0) flush();
    const double t = total_;
    n_ = 0;
    total_ = -0.0;
    if (std::isnan(t)) return std::numeric_limits<float>::quiet_NaN();
    return static_cast<float>(t);
  }

 private:
  void flush() noexcept {
    for (std::int64_t w = kSumLanes / 2; w >= 1; w /= 2)
      for (std::int64_t i = 0; i < w; ++i) lanes_[i] += lanes_[i + w];
    total_ += lanes_[0];
    for (double& l : lanes_) l = -0.0;
  }
  double lanes_[kSumLanes] = {-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0,
                              -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0, -0.0};
  double total_ = -0.0;
  std::int64_t n_ = 0;
};

}  // namespace xquant::detail
