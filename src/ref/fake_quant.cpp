// Reference: fake tensor quantization (SPEC section 1).
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

// out = clamp(rint(x * scale), min_bound, max_bound) / scale   (params/fake_quant.hpp)
void fake_quant(const FakeQuantArgs& a) {
  const DType dt = a.dt;
  const std::int64_t outer = a.layout.outer, channels = a.layout.channels, inner = a.layout.inner;
  const FakeQuantParams* params = a.params;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t c = 0; c < channels; ++c) {
      const FakeQuantParams& p = params[c];
      const std::int64_t base = (o * channels + c) * inner;
      for (std::int64_t i = 0; i < inner; ++i)
        store_float(dt, a.y, base + i, fake_quant_value(load_float(dt, a.x, base + i), p));
    }
}

// grad_in = grad_out where grad_lo <= x <= grad_hi, else 0 (straight-through estimator with clipping).
// grad_amax term = grad_out * (x > grad_hi ? 1 : x < grad_lo ? min_bound / max_bound : 0).
// The comparisons are false for NaN x and for a NaN window (scale == 0), which then contributes 0.
// The reduction pass runs before the elementwise pass, so grad_in may be the buffer of x or grad_out
// (each element is read before it is written).
void fake_quant_backward(const FakeQuantBackwardArgs& a) {
  const DType dt = a.dt;
  const std::int64_t outer = a.layout.outer, channels = a.layout.channels, inner = a.layout.inner;
  const FakeQuantParams* params = a.params;
  const void* grad_out = a.grad_out;
  const void* x = a.x;
  void* grad_in = a.grad_in;
  float* grad_amax = a.grad_amax;
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
          sum.add(g * fake_quant_amax_factor(v, p));
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
        store_float(dt, grad_in, base + i, fake_quant_passes_grad(v, p) ? g : 0.0f);
      }
    }
}

}  // namespace xquant::detail::ref
