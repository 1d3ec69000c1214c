// CUDA kernels of the quantized matmuls (docs/semantics.md section 9), bit-identical to src/ref/matmul.cpp.
//
// One thread per output element, a grid-stride loop; 64-bit indices. quant_matmul sums the int32
// products modulo 2^32 (exact, any order) and runs params/matmul.hpp's quant_matmul_finish, the
// reference's epilogue. weight_quant_batchmatmul dequantizes each weight element with the reference's
// weight_antiquant_value and sums acc + x * w over k in increasing order with separate rounded multiply
// and add (the file is compiled with -fmad=false), the reference's order. These are straightforward
// kernels, correct by construction; tiling them (shared memory, or tensor-core int8 MMA for the integer
// product, which is exact in any order) is future work.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/kernels.hpp"
#include "cuda/common.cuh"
#include "cuda/matmul.hpp"
#include "xquant/device.hpp"

namespace xquant::detail::cuda {

namespace {

// stream(), Upload and check_launch: cuda/common.cuh.

__device__ inline int d_load_q(bool int4, const void* base, std::int64_t e) {
  return int4 ? d_load_int4(static_cast<const std::int32_t*>(base), e) : static_cast<const std::int8_t*>(base)[e];
}

__global__ void quant_matmul_kernel(bool int4, const void* x1, const void* x2, bool transpose_x2, std::int64_t batch,
                                    std::int64_t M, std::int64_t K, std::int64_t N, const std::int64_t* off1,
                                    const std::int64_t* off2, void* out, QuantMatmulEpilogue e) {
  const std::int64_t total = batch * M * N;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t n = i % N, m = (i / N) % M, b = i / (M * N);
    const std::int64_t o1 = off1[b] + m * K, o2 = off2[b];
    std::int32_t acc = 0;
    for (std::int64_t k = 0; k < K; ++k)
      acc = wrap_add(
          acc, wrap_mul(d_load_q(int4, x1, o1 + k), d_load_q(int4, x2, o2 + (transpose_x2 ? n * K + k : k * N + n))));
    quant_matmul_finish(e, out, i, b, m, n, acc);
  }
}

// A8W4 per-group mode (9.3.1): the reference's loop, per output element.
__global__ void quant_matmul_a8w4_kernel(const std::int8_t* x1, const void* x2, bool transpose_x2, std::int64_t M,
                                         std::int64_t K, std::int64_t N, std::int64_t G, const float* group_scale,
                                         void* out, QuantMatmulEpilogue e) {
  const std::int64_t total = M * N;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t n = i % N, m = i / N;
    float sum_hi = 0.0f, sum_lo = 0.0f;
    for (std::int64_t g = 0; g < K / G; ++g) {
      std::int32_t hi = 0, lo = 0;
      for (std::int64_t k = g * G; k < (g + 1) * G; ++k) {
        const int x = x1[m * K + k];
        const int w = d_load_q(true, x2, transpose_x2 ? n * K + k : k * N + n);
        hi += a8w4_hi(x) * w;
        lo += a8w4_lo(x) * w;
      }
      sum_hi = a8w4_group_step(sum_hi, hi, group_scale[g * N + n]);
      sum_lo = a8w4_group_step(sum_lo, lo, group_scale[g * N + n]);
    }
    a8w4_finish(e, out, i, m, n, sum_hi, sum_lo);
  }
}

__global__ void weight_quant_matmul_kernel(DType dt, const void* x, std::int64_t M, std::int64_t K, std::int64_t N,
                                           bool int4, bool transpose_weight, const void* weight, const float* scale,
                                           const float* offset, std::int64_t group_size, const float* bias, void* out) {
  const std::int64_t total = M * N;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t n = i % N, m = i / N;
    float acc = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) {  // increasing k: the reference's order
      const std::int64_t p = (k / group_size) * N + n;
      const float w = weight_antiquant_value(dt, d_load_q(int4, weight, transpose_weight ? n * K + k : k * N + n),
                                             scale[p], offset != nullptr, offset != nullptr ? offset[p] : 0.0f);
      acc = weight_matmul_step(acc, hd_load_float(dt, x, m * K + k), w);
    }
    weight_matmul_finish(dt, out, i, acc, bias, n);
  }
}

}  // namespace

void quant_matmul(const QuantMatmulArgs& a) {
  const std::int64_t total = a.batch * a.M * a.N;
  if (total == 0) return;
  const QuantMatmulEpilogue& h = a.epilogue;
  const std::int64_t bias_rows = h.bias_stride != 0 ? a.batch : 1;
  Upload<std::int64_t> off1(a.x1_offsets, a.batch, "quant_matmul x1 offsets");
  Upload<std::int64_t> off2(a.x2_offsets, a.batch, "quant_matmul x2 offsets");
  Upload<float> scale(h.scale, a.N, "quant_matmul scale");
  Upload<float> offset(h.offset, a.N, "quant_matmul offset");
  Upload<float> pertoken(h.pertoken, a.M, "quant_matmul pertoken_scale");
  Upload<std::int32_t> bias_i(h.bias_int, bias_rows * a.N, "quant_matmul bias");
  Upload<float> bias_f(h.bias_float, bias_rows * a.N, "quant_matmul bias");
  QuantMatmulEpilogue d = h;
  if (a.group_k > 0) {  // A8W4 per-group mode: one batch, no bias
    Upload<float> gscale(a.group_scale, (a.K / a.group_k) * a.N, "quant_matmul scale");
    d.offset = offset.get();
    d.pertoken = pertoken.get();
    quant_matmul_a8w4_kernel<<<grid_for(total, kBlock), kBlock, 0, stream()>>>(
        static_cast<const std::int8_t*>(a.x1), a.x2, a.transpose_x2, a.M, a.K, a.N, a.group_k, gscale.get(), a.out, d);
    check_launch("quant_matmul_a8w4_kernel");
    return;
  }
  d.scale = scale.get();
  d.offset = offset.get();
  d.pertoken = pertoken.get();
  d.bias_int = bias_i.get();
  d.bias_float = bias_f.get();
  quant_matmul_kernel<<<grid_for(total, kBlock), kBlock, 0, stream()>>>(
      a.int4, a.x1, a.x2, a.transpose_x2, a.batch, a.M, a.K, a.N, off1.get(), off2.get(), a.out, d);
  check_launch("quant_matmul_kernel");
}

void weight_quant_matmul(const WeightQuantMatmulArgs& a) {
  const std::int64_t total = a.M * a.N;
  if (total == 0) return;
  const std::int64_t G = (a.K + a.group_size - 1) / a.group_size;
  const std::int64_t rows = G > 0 ? G : 1;
  Upload<float> scale(a.scale, rows * a.N, "weight_quant_batchmatmul antiquant_scale");
  Upload<float> offset(a.offset, rows * a.N, "weight_quant_batchmatmul antiquant_offset");
  Upload<float> bias(a.bias, a.N, "weight_quant_batchmatmul bias");
  weight_quant_matmul_kernel<<<grid_for(total, kBlock), kBlock, 0, stream()>>>(
      a.dt, a.x, a.M, a.K, a.N, a.int4, a.transpose_weight, a.weight, scale.get(), offset.get(), a.group_size,
      bias.get(), a.out);
  check_launch("weight_quant_matmul_kernel");
}

}  // namespace xquant::detail::cuda
