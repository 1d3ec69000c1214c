// Dynamic quantization per token: asymmetric (seed 04, torch_npu.npu_dynamic_quant_asymmetric) and
// symmetric (torch_npu.npu_dynamic_quant, SPEC 6), with the same x, smooth_scales, group_index and y.
//
// Asymmetric:
//
//   x'     = smooth_scales ? x * smooth[expert(row)] : x                          (float32)
//   scale  = max((rowMax(x') - rowMin(x')) / (DST_MAX - DST_MIN), 1e-12)
//   offset = DST_MAX - rowMax(x') / scale
//   y      = sat(rint(x' / scale + offset))
//
// x: float32 / float16 / bfloat16, rank >= 2, S rows (all dims but the last) of H elements. Rows are
// tokens (pertoken) or the whole tensor is one row (pertensor). smooth_scales: floating [H], or [E, H]
// together with group_index (int32 / int64 [E], non-decreasing cumulative row ends, last == S; row r
// uses the first expert e with group_index[e] > r). dst_type qint8 (int8 [-128, 127]), float8 (below) or quint4x2
// (int4 [-8, 7] packed in int32, H % 8 == 0). scale / offset: float32 with shape x.shape[:-1]
// (pertoken) or [1] (pertensor). A row containing NaN gets NaN scale and offset and y = 0.
//
// Symmetric (no offset):
//   scale  = rowMax(|x'|) / DST_MAX                                                (float32 division)
//   y      = sat(rint(x' / scale))
// scale: float32 with shape x.shape[:-1] (pertoken) or [1] (pertensor). A row of zeros gets scale 0 and
// y = 0 (0 / 0 converts to 0); a row containing NaN gets a NaN scale and y = 0. A NaN scale or offset is
// always 0x7FC00000.
//
// Both operators, the op-plugin 26.x forms:
//   dst_type float8_e4m3fn / float8_e5m2: DST = [-448, 448] / [-57344, 57344] and y = float8(v) for the
//     same v (x' / scale [+ offset]), one round-to-nearest-even conversion without saturation (NaN v and
//     out-of-range v give NaN (e4m3fn) / +-Inf (e5m2); a NaN element is 0x7F); y has x's shape.
//   quant_mode perchannel (x of rank >= 2 seen as [B, S, H], B = prod(x.shape[:-2])): the rows of the
//     formulas are the columns: one scale (offset) per (batch, h) over the S elements x'[b, :, h],
//     shaped x.shape[:-2] + [H]; smooth_scales is then 1-D [S] (x'[b, s, h] = x * smooth[s]); no
//     group_index; dst_type qint8 or a float8 type.
#pragma once
#include <optional>

#include "xquant/tensor.hpp"

namespace xquant {

enum class DynamicQuantMode { pertoken, pertensor, perchannel };

struct DynamicQuantResult {
  Tensor y;
  Tensor scale;
  Tensor offset;
};

void dynamic_quant_asymmetric_out(TensorView y, TensorView scale, TensorView offset, ConstTensorView x,
                                  std::optional<ConstTensorView> smooth_scales = std::nullopt,
                                  std::optional<ConstTensorView> group_index = std::nullopt,
                                  QuantDType dst_type = QuantDType::qint8,
                                  DynamicQuantMode quant_mode = DynamicQuantMode::pertoken);
DynamicQuantResult dynamic_quant_asymmetric(ConstTensorView x,
                                            std::optional<ConstTensorView> smooth_scales = std::nullopt,
                                            std::optional<ConstTensorView> group_index = std::nullopt,
                                            QuantDType dst_type = QuantDType::qint8,
                                            DynamicQuantMode quant_mode = DynamicQuantMode::pertoken);

struct DynamicQuantSymmetricResult {
  Tensor y;
  Tensor scale;
};

void dynamic_quant_out(TensorView y, TensorView scale, ConstTensorView x,
                       std::optional<ConstTensorView> smooth_scales = std::nullopt,
                       std::optional<ConstTensorView> group_index = std::nullopt,
                       QuantDType dst_type = QuantDType::qint8,
                       DynamicQuantMode quant_mode = DynamicQuantMode::pertoken);
DynamicQuantSymmetricResult dynamic_quant(ConstTensorView x,
                                          std::optional<ConstTensorView> smooth_scales = std::nullopt,
                                          std::optional<ConstTensorView> group_index = std::nullopt,
                                          QuantDType dst_type = QuantDType::qint8,
                                          DynamicQuantMode quant_mode = DynamicQuantMode::pertoken);

}  // namespace xquant
