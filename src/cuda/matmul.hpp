// CUDA kernels of the quantized matmuls (docs/semantics.md section 9), registered in the CUDA kernel
// table (cuda/kernels.cu). Host-only declarations.
#pragma once
#include "core/kernels.hpp"

namespace xquant::detail::cuda {

void quant_matmul(const QuantMatmulArgs& args);
void weight_quant_matmul(const WeightQuantMatmulArgs& args);

}  // namespace xquant::detail::cuda
