// CUDA backend: npu_anti_quant (SPEC 7).
// Per-element math from src/params/ (the XQ_HD code the reference runs), loads / stores / saturation and
// the launch helpers from cuda/common.cuh. Compiled with -fmad=false --prec-div=true --prec-sqrt=true
// --ftz=false (CMakeLists.txt): every float operation is the single IEEE operation of the reference.
#include "cuda/common.cuh"
#include "cuda/cuda.hpp"

namespace xquant::detail::cuda {

namespace {

// npu_anti_quant (SPEC 7).
__global__ void anti_quant_kernel(QuantDType src, const void* x, DType dt, void* out, ChannelLayout l,
                                  const AntiQuantParams* params) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int q = src == QuantDType::quint4x2 ? d_load_int4(static_cast<const std::int32_t*>(x), i)
                                              : static_cast<const std::int8_t*>(x)[i];
    hd_store_float(dt, out, i, anti_quant_value(static_cast<float>(q), params[chan(l, i)]));
  }
}

}  // namespace

void anti_quant(const AntiQuantArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<AntiQuantParams> params(a.params, a.layout.channels, "anti_quant parameters");
  anti_quant_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a.src, a.x, a.dt, a.out, a.layout, params.get());
  check_launch("anti_quant_kernel");
}

}  // namespace xquant::detail::cuda
