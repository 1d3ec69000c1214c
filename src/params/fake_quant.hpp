// Fake tensor quantization (SPEC 1): the per-channel parameters and the per-element math, shared by the
// reference, the SIMD kernels (which vectorize the same formulas) and device code.
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace xquant::detail {

struct FakeQuantParams {
  float scale;      // max_bound / amax
  float min_bound;  // exact integers in float32
  float max_bound;
  float grad_lo;    // min_bound / scale: lower end of the straight-through window
  float grad_hi;    // max_bound / scale
  float ratio;      // min_bound / max_bound (learnable-amax gradient below the window)
  bool zero;        // scale not finite or 0: forward output is 0 (NaN stays NaN)
};

XQ_HD inline FakeQuantParams init_fake_quant_params(float amax, int num_bits, bool is_unsigned,
                                                    bool narrow_range) noexcept {
  // bound = 2^(num_bits - 1 + is_unsigned) - 1, exactly, in 64-bit integers (num_bits <= 32).
  const std::int64_t bound = (std::int64_t{1} << (num_bits - 1 + (is_unsigned ? 1 : 0))) - 1;
  // max_bound = bound; min_bound = is_unsigned ? 0 : -(bound + (narrow_range ? 0 : 1)).
  // (SPEC: unsigned clamps at 0, as the seed's prose says and NVIDIA's reference does.)
  const std::int64_t max_bound = bound;
  const std::int64_t min_bound = is_unsigned ? 0 : -(bound + (narrow_range ? 0 : 1));
  FakeQuantParams p{};
  p.min_bound = static_cast<float>(min_bound);  // exact integers converted to float32 once
  p.max_bound = static_cast<float>(max_bound);
  // scale = float(max_bound) / amax   (float32 division)
  p.scale = p.max_bound / amax;
  // Where scale is not finite or is 0, the channel's output is 0 (no NaN from 0 * Inf or 0 / 0).
  p.zero = !hd_isfinite(p.scale) || p.scale == 0.0f;
  // Straight-through window [min_bound / scale, max_bound / scale] and the PACT ratio min_bound / max_bound.
  p.grad_lo = p.min_bound / p.scale;
  p.grad_hi = p.max_bound / p.scale;
  p.ratio = p.min_bound / p.max_bound;
  return p;
}

// out = clamp(rint(x * scale), min_bound, max_bound) / scale
XQ_HD inline float fake_quant_value(float x, const FakeQuantParams& p) noexcept {
  if (p.zero) return hd_isnan(x) ? x : 0.0f;
  float q = hd_rint(x * p.scale);  // x * scale: one float32 multiply; +-Inf stays +-Inf
  // clamp without min/max so that NaN passes through (rule 4); +-Inf saturates to the bounds.
  if (q < p.min_bound) q = p.min_bound;
  if (q > p.max_bound) q = p.max_bound;
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
