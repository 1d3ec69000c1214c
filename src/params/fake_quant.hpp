// Fake tensor quantization (SPEC 1): the per-channel parameters and the per-element math, shared by the
// reference, the SIMD kernels (which vectorize the same formulas) and device code.
#pragma once
#include <cstdint>

#include "core/convert.hpp"
#include "core/hd.hpp"

namespace xquant::detail {

struct FakeQuantParams {
  float scale;      // max_bound / amax
  float min_bound;  // exact integers in float32
  float max_bound;
  float qmin;  // the forward clamp bounds: min_bound / max_bound, rounded to float16 for float16 inputs
  float qmax;
  float grad_lo;  // min_bound / scale: lower end of the straight-through window
  float grad_hi;  // max_bound / scale
  float ratio;    // min_bound / max_bound (learnable-amax gradient below the window)
  bool zero;      // scale not finite or 0: forward output is 0 (NaN stays NaN)
  bool half;      // float16 inputs: the kernel's float16 arithmetic (x * scale rounded to float16)
};

// A float32 value rounded to the nearest float16 (ties to even, beyond 65504 -> +-Inf), as float32.
XQ_HD inline float hd_round_to_half(float v) noexcept { return hd_half_to_float(hd_float_to_half(v)); }

// `half`: the inputs are float16, computed in the Ascend kernel's float16 arithmetic (SPEC 1):
// M = f16(max_bound), m = f16(min_bound), scale = f16(M / amax) (amax exact in float16).
XQ_HD inline FakeQuantParams init_fake_quant_params(float amax, int num_bits, bool is_unsigned, bool narrow_range,
                                                    bool half = false) noexcept {
  // bound = 2^(num_bits - 1 + is_unsigned) - 1, exactly, in 64-bit integers (num_bits <= 32).
  const std::int64_t bound = (std::int64_t{1} << (num_bits - 1 + (is_unsigned ? 1 : 0))) - 1;
  // max_bound = bound; min_bound = -(bound + (narrow_range ? 0 : 1)), also when is_unsigned: the seed's
  // formula and the Ascend kernel's tiling keep the lower bound negative (SPEC 1).
  const std::int64_t max_bound = bound;
  const std::int64_t min_bound = -(bound + (narrow_range ? 0 : 1));
  FakeQuantParams p{};
  p.half = half;
  p.min_bound = static_cast<float>(min_bound);  // exact integers converted to float32 once
  p.max_bound = static_cast<float>(max_bound);
  p.qmin = half ? hd_round_to_half(p.min_bound) : p.min_bound;
  p.qmax = half ? hd_round_to_half(p.max_bound) : p.max_bound;
  // scale = float(max_bound) / amax   (float32 division; float16: f16(M / amax), which equals the float16
  // division because float32 carries more than 2 * 11 + 2 bits)
  p.scale = half ? hd_round_to_half(p.qmax / amax) : p.max_bound / amax;
  // Where scale is not finite or is 0, the channel's output is 0 (no NaN from 0 * Inf or 0 / 0).
  p.zero = !hd_isfinite(p.scale) || p.scale == 0.0f;
  // Straight-through window [min_bound / scale, max_bound / scale] and the PACT ratio min_bound / max_bound.
  p.grad_lo = p.min_bound / p.scale;
  p.grad_hi = p.max_bound / p.scale;
  p.ratio = p.min_bound / p.max_bound;
  return p;
}

// out = clamp(rint(x * scale), min_bound, max_bound) / scale
// float16 (p.half): t = f16(x * scale); out = f16(clamp(rint(t), m, M) / scale); the last rounding to
// float16 is the store's narrowing (the float32 quotient narrowed once equals the float16 division).
XQ_HD inline float fake_quant_value(float x, const FakeQuantParams& p) noexcept {
  if (p.zero) return hd_isnan(x) ? x : 0.0f;
  float t = x * p.scale;  // x * scale: one float32 multiply; +-Inf stays +-Inf
  if (p.half) t = hd_round_to_half(t);
  float q = hd_rint(t);
  // clamp without min/max so that NaN passes through (rule 4); +-Inf saturates to the bounds.
  if (q < p.qmin) q = p.qmin;
  if (q > p.qmax) q = p.qmax;
  return q / p.scale;
}

// Backward: grad_in = grad_out where grad_lo <= x <= grad_hi, else 0 (false for NaN x / NaN window).
XQ_HD inline bool fake_quant_passes_grad(float x, const FakeQuantParams& p) noexcept {
  return x >= p.grad_lo && x <= p.grad_hi;
}
// grad_amax term factor: x > grad_hi ? 1 : x < grad_lo ? min_bound / max_bound : 0.
XQ_HD inline float fake_quant_amax_factor(float x, const FakeQuantParams& p) noexcept {
  return x > p.grad_hi ? 1.0f : x < p.grad_lo ? p.ratio : 0.0f;
}

}  // namespace xquant::detail
