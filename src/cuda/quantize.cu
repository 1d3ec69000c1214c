// CUDA backend: npu_quantize (SPEC 2).
// Per-element math from src/params/ (the XQ_HD code the reference runs), loads / stores / saturation and
// the launch helpers from cuda/common.cuh. Compiled with -fmad=false --prec-div=true --prec-sqrt=true
// --ftz=false (CMakeLists.txt): every float operation is the single IEEE operation of the reference.
#include "cuda/common.cuh"
#include "cuda/cuda.hpp"

namespace xquant::detail::cuda {

namespace {

// npu_quantize (SPEC 2). quint4x2: one thread per output word (8 consecutive flat elements).
__global__ void quantize_kernel(DType dt, const void* x, QuantDType q, void* y, ChannelLayout l,
                                const QuantizeParams* params, bool div_mode) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  const std::int64_t items = q == QuantDType::quint4x2 ? n / 8 : n;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < items;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (q == QuantDType::quint4x2) {
      std::uint32_t w = 0;
      for (int j = 0; j < 8; ++j) {
        const std::int64_t i = t * 8 + j;
        const float v = quantize_value(hd_load_float(dt, x, i), params[chan(l, i)], div_mode);
        w |= d_nibble(hd_rint(v)) << (4 * j);
      }
      static_cast<std::uint32_t*>(y)[t] = w;
    } else {
      const float v = quantize_value(hd_load_float(dt, x, t), params[chan(l, t)], div_mode);
      d_store_q(q, y, t, hd_rint(v));
    }
  }
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<QuantizeParams> params(a.params, a.layout.channels, "quantize parameters");
  quantize_kernel<<<grid_for(a.q == QuantDType::quint4x2 ? n / 8 : n, kBlock), kBlock, 0, stream()>>>(
      a.dt, a.x, a.q, a.y, a.layout, params.get(), a.div_mode);
  check_launch("quantize_kernel");
}

}  // namespace xquant::detail::cuda
