// Fake tensor quantization for quantization-aware training (seed 01, mx_driving.npu_fake_tensor_quant*).
//
//   bound     = 2^(num_bits - 1 + is_unsigned) - 1
//   min_bound = is_unsigned ? 0 : -(bound + (narrow_range ? 0 : 1)),  max_bound = bound
//   scale     = max_bound / amax                      (float32)
//   out       = clamp(rint(x * scale), min_bound, max_bound) / scale
//
// inputs: float32 / float16 / bfloat16, any shape (empty allowed). amax: a floating tensor of one
// element (per-tensor) or 1-D of inputs.shape[axis] elements (per-axis); finite and >= 0. Where scale is
// not finite or is 0 (amax == 0, num_bits == 1 signed) the output is 0; NaN inputs give NaN.
#pragma once
#include <cstdint>
#include <optional>

#include "xquant/tensor.hpp"

namespace xquant {

struct FakeQuantOptions {
  int num_bits = 8;  // [1, 32]
  bool is_unsigned = false;
  bool narrow_range = true;
};

// Per-tensor. Out-variant: `out` has inputs' dtype and shape (it may be inputs itself).
void fake_tensor_quant_out(TensorView out, ConstTensorView inputs, ConstTensorView amax,
                           const FakeQuantOptions& options = {});
Tensor fake_tensor_quant(ConstTensorView inputs, ConstTensorView amax, const FakeQuantOptions& options = {});

// Per-tensor, in place: writes into inputs. On error nothing is modified.
void fake_tensor_quant_inplace(TensorView inputs, ConstTensorView amax, const FakeQuantOptions& options = {});

// Per-axis: amax is 1-D with inputs.shape[axis] elements; axis may be negative (Python style).
void fake_tensor_quant_with_axis_out(TensorView out, ConstTensorView inputs, ConstTensorView amax, std::int64_t axis,
                                     const FakeQuantOptions& options = {});
Tensor fake_tensor_quant_with_axis(ConstTensorView inputs, ConstTensorView amax, std::int64_t axis,
                                   const FakeQuantOptions& options = {});

// Backward of either form (axis == nullopt: per-tensor).
//   grad_inputs = grad_out where min_bound/scale <= x <= max_bound/scale, else 0   (straight-through)
//   grad_amax   = sum(grad_out * (x > max_bound/scale ? 1 : x < min_bound/scale ? min_bound/max_bound : 0))
// grad_amax is reduced per channel for the per-axis form, has amax's shape and dtype, and is summed with
// xquant's deterministic blocked order (docs/semantics.md). grad_out has inputs' dtype and shape.
struct FakeQuantGrads {
  Tensor grad_inputs;
  Tensor grad_amax;  // default-constructed (no data, numel 0) when not requested
};
void fake_tensor_quant_backward_out(TensorView grad_inputs, std::optional<TensorView> grad_amax,
                                    ConstTensorView grad_out, ConstTensorView inputs, ConstTensorView amax,
                                    std::optional<std::int64_t> axis, const FakeQuantOptions& options = {});
FakeQuantGrads fake_tensor_quant_backward(ConstTensorView grad_out, ConstTensorView inputs, ConstTensorView amax,
                                          std::optional<std::int64_t> axis, const FakeQuantOptions& options = {},
                                          bool want_grad_amax = true);

}  // namespace xquant
