// Quantized matrix multiplication (docs/semantics.md section 9): the operators a W8A8 / W4A8 / W8A16 /
// W4A16 linear layer runs after quantizing its activations.
//
// quant_matmul (torch_npu.npu_quant_matmul): int8 x int8 or int4 x int4 (int32 words of eight), exact
// int32 accumulation (modulo 2^32), then, per element and in this order (float32, no FMA):
//
//   a = acc + bias                     (int32 bias; int32 output stops here: out = a)
//   v = float(a) * scale[n]            (scale float32 / bfloat16, or the int64 form of trans_quant_param)
//   v = v * pertoken_scale[m]          (when given)
//   v = v + bias[n]                    (float bias)
//   v = v + offset[n]                  (offset, or the one carried by an int64 scale)
//   out = int8: sat(rint(v)) | float16 / bfloat16: narrow(v)
//
// weight_quant_batchmatmul (torch_npu.npu_weight_quant_batchmatmul): float16 / bfloat16 x int8 or int4
// weights, w = narrow_x(narrow_x(q + antiquant_offset) * antiquant_scale), y = narrow_x(sum_k x * w + bias)
// with the float32 sum taken in increasing k (one fixed order on every backend: bit-identical).
//
// trans_quant_param: float32 scale (+ offset) -> int64 words: (bits & 0xFFFFE000) | 1 << 46 | (offset9 << 37).
// convert_weight_to_int4pack: int32 values in [-8, 7] -> int32 words, element 8k + j in bits [4j, 4j + 3].
//
// Matrices are dense row-major; a transposed weight is passed as its storage ([N, K]) with the flag.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include "xquant/dtype.hpp"
#include "xquant/tensor.hpp"

namespace xquant {

// ---- npu_quant_matmul ----
struct QuantMatmulOptions {
  std::optional<ConstTensorView> offset;          // float32 [1] or [N]; int8 output only
  std::optional<ConstTensorView> pertoken_scale;  // float32 [M]
  std::optional<ConstTensorView> bias;            // int32 / float32 / float16 / bfloat16, [N] or [B, 1, N]
  bool transpose_x2 = false;                      // x2 is stored [..., N, K] (int4: [..., N, K / 8])
  // [group_m, group_n, group_k]; all 0 but for the A8W4 per-group mode (int8 x1, int4 x2): group_k > 0
  // divides K, group_m / group_n are 0 or 1 (per row / per column).
  std::array<std::int64_t, 3> group_sizes{};
};

// x1: int8 [B1..., M, K] or int32 [B1..., M, K / 8]; x2: int8 [B2..., K, N] or int32 [B2..., K, N / 8]
// (transpose_x2: [B2..., N, K] / [B2..., N, K / 8]); scale: float32 / bfloat16 / int64, [1], [N], [1, 1]
// or [1, N]. out: int8, float16, bfloat16 or int32, [broadcast(B1, B2)..., M, N].
// A8W4 per-group mode (docs/semantics.md 9.3.1): x1 int8 [M, K], x2 int32 [K, N / 8] (transpose_x2:
// [N, K / 8]), group_sizes[2] = G; scale float32 / int64 [K / G, N]; offset float32 [1] / [N] added before
// pertoken_scale (float32 [M] or [M, 1]); no bias; out float16 / bfloat16 [M, N]. The two int4 halves of x1
// are multiplied per k group and the scaled group terms summed in float16, as the Ascend kernel does.
void quant_matmul_out(TensorView out, ConstTensorView x1, ConstTensorView x2, ConstTensorView scale,
                      const QuantMatmulOptions& options = {});
Tensor quant_matmul(ConstTensorView x1, ConstTensorView x2, ConstTensorView scale,
                    const QuantMatmulOptions& options = {}, DType output_dtype = DType::int8);
// The output shape, after every check the operator makes (nothing is computed or allocated).
Shape quant_matmul_output_shape(ConstTensorView x1, ConstTensorView x2, ConstTensorView scale,
                                const QuantMatmulOptions& options = {}, DType output_dtype = DType::int8);

// ---- npu_weight_quant_batchmatmul ----
struct WeightQuantMatmulOptions {
  std::optional<ConstTensorView> antiquant_offset;  // antiquant_scale's dtype and shape
  std::optional<ConstTensorView> bias;              // float16 / bfloat16 / float32, [N] or [1, N]
  std::int64_t antiquant_group_size = 0;            // 0, or a multiple of 32 in [32, K - 1] (per-group scale)
  bool transpose_weight = false;                    // weight is stored [N, K] (int4: [N, K / 8])
};

// x: float16 / bfloat16 [..., M, K]; weight: int8 [K, N] or int32 [K, N / 8] (transpose_weight: [N, K] /
// [N, K / 8]); antiquant_scale: x's dtype, [1], [1, 1], [N], [1, N] or [ceil(K / group), N].
// out: x's dtype, [..., M, N].
void weight_quant_batchmatmul_out(TensorView out, ConstTensorView x, ConstTensorView weight,
                                  ConstTensorView antiquant_scale, const WeightQuantMatmulOptions& options = {});
Tensor weight_quant_batchmatmul(ConstTensorView x, ConstTensorView weight, ConstTensorView antiquant_scale,
                                const WeightQuantMatmulOptions& options = {});
Shape weight_quant_batchmatmul_output_shape(ConstTensorView x, ConstTensorView weight, ConstTensorView antiquant_scale,
                                            const WeightQuantMatmulOptions& options = {});

// ---- npu_trans_quant_param ----
// scale: float32 [t] or [1, n]; offset: float32, [t'] (t == t' or one of them 1) or scale's 2-D shape.
// out: int64, scale's shape ([max(t, t')] for 1-D inputs). round_mode: 0 (truncate) or 1 (round).
void trans_quant_param_out(TensorView out, ConstTensorView scale, std::optional<ConstTensorView> offset = std::nullopt,
                           int round_mode = 0);
Tensor trans_quant_param(ConstTensorView scale, std::optional<ConstTensorView> offset = std::nullopt,
                         int round_mode = 0);

// ---- npu_convert_weight_to_int4pack ----
// weight: int32 [..., C] with C % 8 == 0 and values in [-8, 7]; out: int32 [..., C / 8].
void convert_weight_to_int4pack_out(TensorView out, ConstTensorView weight);
Tensor convert_weight_to_int4pack(ConstTensorView weight);

}  // namespace xquant
