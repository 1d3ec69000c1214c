// npu_anti_quant (SPEC 7): dequantization of int8 or packed int4 values.
//
//   out = narrow((float(x) + offset) * scale)      (a float32 add, then a float32 multiply; no FMA)
//
// x: int8 (src_dtype qint8), or int32 words of eight int4 each (src_dtype quint4x2: element 8k + j in bits
// [4j, 4j + 3] of word k, two's complement), rank >= 1; the logical last dimension H of packed input is 8
// times the stored one. scale: 1-D [1] or [H], float32 or bfloat16. offset: optional, the same shape and
// dtype as scale (absent: 0). out has x's logical shape and dtype float16 (default), bfloat16 or float32
// (an extension of the NPU operator). A NaN result is the canonical quiet NaN.
#pragma once
#include <optional>

#include "xquant/dtype.hpp"
#include "xquant/tensor.hpp"

namespace xquant {

// out's dtype (float16, bfloat16 or float32) is the dst_dtype; out has x's logical shape.
void anti_quant_out(TensorView out, ConstTensorView x, ConstTensorView scale,
                    std::optional<ConstTensorView> offset = std::nullopt, QuantDType src_dtype = QuantDType::qint8);
Tensor anti_quant(ConstTensorView x, ConstTensorView scale, std::optional<ConstTensorView> offset = std::nullopt,
                  DType dst_dtype = DType::float16, QuantDType src_dtype = QuantDType::qint8);

}  // namespace xquant
