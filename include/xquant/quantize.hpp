// Static quantization (seed 02, torch_npu.npu_quantize).
//
//   div_mode = true : y = sat(rint(x / scale + zero_point))   dtype qint8, quint8 or qint32
//   div_mode = false: y = sat(rint(x * scale + offset))       dtype qint8 or quint4x2
//
// input: float32 / float16 / bfloat16. div_mode = true: scales is 1-D with 1 element (per-tensor, axis
// ignored) or input.shape[axis] elements; axis wraps Python style; zero_points (optional) has scales'
// shape, dtype int8 / uint8 / int32 / float32 / float16 / bfloat16. div_mode = false: axis == -2 selects
// the second-to-last dimension, any axis in (-2, rank) the last one, axis < -2 is an error; scales is 1-D
// (1 or axis-length elements) or has input's rank with every dimension 1 except axis; zero_points
// (offset) matches scales in shape and dtype. quint4x2 packs eight int4 per int32 word (element 8k+j in
// bits [4j, 4j+3] of word k); the last dimension must be divisible by 8 and the output's last dimension
// is divided by 8. NaN -> 0, +-Inf and out-of-range values saturate.
#pragma once
#include <cstdint>
#include <optional>

#include "xquant/tensor.hpp"

namespace xquant {

// Output shape and storage dtype of quantize() for these arguments (throws on bad dtype/shape).
Shape quantize_output_shape(const Shape& input_shape, QuantDType dtype);

void quantize_out(TensorView out, ConstTensorView input, ConstTensorView scales,
                  std::optional<ConstTensorView> zero_points, QuantDType dtype, std::int64_t axis = 1,
                  bool div_mode = true);
Tensor quantize(ConstTensorView input, ConstTensorView scales, std::optional<ConstTensorView> zero_points,
                QuantDType dtype, std::int64_t axis = 1, bool div_mode = true);

}  // namespace xquant
