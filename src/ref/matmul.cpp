// Reference kernels of the quantized matmuls (docs/semantics.md section 9), scalar, one formula per line.
//
//   quant_matmul:             acc = sum_k x1[m][k] * x2[k][n]     (int32, modulo 2^32)
//                             out = epilogue(acc)                  (params/matmul.hpp quant_matmul_finish)
//   weight_quant_batchmatmul: w   = narrow_x(narrow_x(q + offset) * scale)
//                             acc = +0; for k ascending: acc = acc + x[m][k] * w[k][n]
//                             y   = narrow_x(acc + bias)
#include <cstdint>
#include <vector>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

namespace {

// Logical element e of an int8 matrix or of packed int4 words.
int load_q(bool int4, const void* base, std::int64_t e) {
  return int4 ? load_int4(static_cast<const std::int32_t*>(base), e) : static_cast<const std::int8_t*>(base)[e];
}

// A8W4 per-group mode (9.3.1): per group the exact products of x1's two int4 halves, folded in float16.
void quant_matmul_a8w4(const QuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N, G = a.group_k;
  const auto* x1 = static_cast<const std::int8_t*>(a.x1);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float sum_hi = 0.0f, sum_lo = 0.0f;
      for (std::int64_t g = 0; g < K / G; ++g) {
        std::int32_t hi = 0, lo = 0;
        for (std::int64_t k = g * G; k < (g + 1) * G; ++k) {
          const int x = x1[m * K + k];
          const int w = load_q(true, a.x2, a.transpose_x2 ? n * K + k : k * N + n);
          hi += a8w4_hi(x) * w;  // |hi| <= 8 * 8 * 65535: no overflow
          lo += a8w4_lo(x) * w;
        }
        const float s = a.group_scale[g * N + n];
        sum_hi = a8w4_group_step(sum_hi, hi, s);  // float16 running sums, group by group
        sum_lo = a8w4_group_step(sum_lo, lo, s);
      }
      a8w4_finish(a.epilogue, a.out, m * N + n, m, n, sum_hi, sum_lo);
    }
}

}  // namespace

void quant_matmul(const QuantMatmulArgs& a) {
  if (a.group_k > 0) return quant_matmul_a8w4(a);
  const std::int64_t M = a.M, K = a.K, N = a.N;
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        std::int32_t acc = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const int q1 = load_q(a.int4, a.x1, a.x1_offsets[b] + m * K + k);
          const int q2 = load_q(a.int4, a.x2, a.x2_offsets[b] + (a.transpose_x2 ? n * K + k : k * N + n));
          acc = wrap_add(acc, wrap_mul(q1, q2));  // exact products, sum modulo 2^32
        }
        quant_matmul_finish(a.epilogue, a.out, (b * M + m) * N + n, b, m, n, acc);
      }
}

void weight_quant_matmul(const WeightQuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  // w[k][n] = narrow_x(narrow_x(float(q) + offset[g][n]) * scale[g][n]), g = k / group_size
  std::vector<float> w(static_cast<std::size_t>(K * N));
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t e = a.transpose_weight ? n * K + k : k * N + n;
      const std::int64_t p = (k / a.group_size) * N + n;
      w[static_cast<std::size_t>(k * N + n)] = weight_antiquant_value(
          a.dt, load_q(a.int4, a.weight, e), a.scale[p], a.offset != nullptr, a.offset != nullptr ? a.offset[p] : 0.0f);
    }
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k)  // increasing k: acc = acc + x * w
        acc = weight_matmul_step(acc, load_float(a.dt, a.x, m * K + k), w[static_cast<std::size_t>(k * N + n)]);
      weight_matmul_finish(a.dt, a.out, m * N + n, acc, a.bias, n);  // + bias, narrow once
    }
}

}  // namespace xquant::detail::ref
