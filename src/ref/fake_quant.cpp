// Reference: fake tensor quantization (SPEC section 1).
#include <cmath>
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

FakeQuantParams fake_quant_params(float amax, int num_bits, bool is_unsigned, bool narrow_range) {
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
  p.zero = !std::isfinite(p.scale) || p.scale == 0.0f;
  // Straight-through window [min_bound / scale, max_bound / scale] and the PACT ratio min_bound / max_bound.
  p.grad_lo = p.min_bound / p.scale;
  p.grad_hi = p.max_bound / p.scale;
  p.ratio = p.min_bound / p.max_bound;
  return p;
}

// out = clamp(rint(x * scale), min_bound, max_bound) / scale
static float fake_quant_element(float x, const FakeQuantParams& p) {
  if (p.zero) return std::isnan(x) ? x : 0.0f;
  float q = round_half_even(x * p.scale);  // x * scale: one float32 multiply; +-Inf stays +-Inf
  // clamp without std::min/max so that NaN passes through (rule 4); +-Inf saturates to the bounds.
  if (q < p.min_bound) q = p.min_bound;
  if (q > p.max_bound) q = p.max_bound;
  return q / p.scale;
}

void fake_quant(DType dt, const void* x, void* y, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                const FakeQuantParams* params) {
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t c = 0; c < channels; ++c) {
      const FakeQuantParams& p = params[c];
      const std::int64_t base = (o * channels + c) * inner;
      for (std::int64_t i = 0; i < inner; ++i) store_float(dt, y, base + i, fake_quant_element(load_float(dt, x, base + i), p));
    }
}

// grad_in = grad_out where grad_lo <= x <= grad_hi, else 0 (straight-through estimator with clipping).
// grad_amax term = grad_out * (x > grad_hi ? 1 : x < grad_lo ? min_bound / max_bound : 0).
// The comparisons are false for NaN x and for a NaN window (scale == 0), which then contributes 0.
// The reduction pass runs before the elementwise pass, so grad_in may be the buffer of x or grad_out
// (each element is read before it is written).
void fake_quant_backward(DType dt, const void* grad_out, const void* x, void* grad_in, std::int64_t outer,
                         std::int64_t channels, std::int64_t inner, const FakeQuantParams* params, float* grad_amax) {
  if (grad_amax != nullptr) {
    // Channel c sums its terms in (o, i) order, the canonical blocked order of rule 5.
    for (std::int64_t c = 0; c < channels; ++c) {
      const FakeQuantParams& p = params[c];
      CanonicalSum sum;
      for (std::int64_t o = 0; o < outer; ++o) {
        const std::int64_t base = (o * channels + c) * inner;
        for (std::int64_t i = 0; i < inner; ++i) {
          const float g = load_float(dt, grad_out, base + i);
          const float v = load_float(dt, x, base + i);
          const float factor = v > p.grad_hi ? 1.0f : v < p.grad_lo ? p.ratio : 0.0f;
          sum.add(g * factor);
        }
      }
      grad_amax[c] = sum.result();
    }
  }
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t c = 0; c < channels; ++c) {
      const FakeQuantParams& p = params[c];
      const std::int64_t base = (o * channels + c) * inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        const float g = load_float(dt, grad_out, base + i);
        const float v = load_float(dt, x, base + i);
        const bool inside = v >= p.grad_lo && v <= p.grad_hi;
        store_float(dt, grad_in, base + i, inside ? g : 0.0f);
      }
    }
}

}  // namespace xquant::detail::ref
