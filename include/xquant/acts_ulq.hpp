// ActsULQ: learnable-clip fake quantization with masks and a quantization loss (seed 05).
//
//   LEVELS = 2^num_bits - 1, EPS = 1.192092896e-7
//   ori_min = fixed_min ? 0 : min(clamp_min, 0);     ori_max = max(clamp_max, LEVELS * EPS)
//   s = (ori_max - ori_min) / LEVELS;                off = rint(ori_min / s)
//   clip_lo = s * off;  clip_hi = s * (off + LEVELS); xc = min(max(x, clip_lo), clip_hi)
//   clamp_min_mask = x >= clip_lo;                   clamp_max_mask = x <= clip_hi
//   raw = xc / s;  rx = rint(raw);                   y = rx * s
//   x_clamped_loss = masks both 1 ? (rx - raw) / LEVELS : (rint(ori_min / s) - ori_min / s) / LEVELS
//
// x, clamp_min, clamp_max: the same floating dtype, shapes broadcast NumPy style (rank <= 8). All four
// outputs have the broadcast shape and x's dtype. num_bits in [2, 16] (the NPU documents 8 only).
#pragma once
#include "xquant/tensor.hpp"

namespace xquant {

struct ActsUlqResult {
  Tensor y;
  Tensor clamp_min_mask;
  Tensor clamp_max_mask;
  Tensor x_clamped_loss;
};

// Broadcast shape of the three inputs (throws if they do not broadcast).
Shape acts_ulq_output_shape(const Shape& x, const Shape& clamp_min, const Shape& clamp_max);

void acts_ulq_out(TensorView y, TensorView clamp_min_mask, TensorView clamp_max_mask, TensorView x_clamped_loss,
                  ConstTensorView x, ConstTensorView clamp_min, ConstTensorView clamp_max, bool fixed_min = false,
                  int num_bits = 8);
ActsUlqResult acts_ulq(ConstTensorView x, ConstTensorView clamp_min, ConstTensorView clamp_max, bool fixed_min = false,
                       int num_bits = 8);

// Backward (the CANN gradient ops, made exact):
//   x_grad         = y_grad * clamp_min_mask * clamp_max_mask
//   clamp_min_grad = sum(y_grad * ((1 - clamp_min_mask) - x_clamped_loss)), 0 where fixed_min or clamp_min > 0
//   clamp_max_grad = sum(y_grad * (x_clamped_loss + (1 - clamp_max_mask))),   0 where clamp_max < LEVELS * EPS
// y_grad and the forward outputs have the broadcast shape; each gradient is summed (deterministic blocked
// order) down to the shape of its input: x_grad to x's shape (given by x_grad's view / x_shape),
// clamp_*_grad to clamp_*'s shape. All in x's dtype.
struct ActsUlqGrads {
  Tensor x_grad;
  Tensor clamp_min_grad;
  Tensor clamp_max_grad;
};

void acts_ulq_backward_out(TensorView x_grad, TensorView clamp_min_grad, TensorView clamp_max_grad,
                           ConstTensorView y_grad, ConstTensorView clamp_min, ConstTensorView clamp_max,
                           ConstTensorView clamp_min_mask, ConstTensorView clamp_max_mask,
                           ConstTensorView x_clamped_loss, bool fixed_min = false, int num_bits = 8);
ActsUlqGrads acts_ulq_backward(ConstTensorView y_grad, const Shape& x_shape, ConstTensorView clamp_min,
                               ConstTensorView clamp_max, ConstTensorView clamp_min_mask,
                               ConstTensorView clamp_max_mask, ConstTensorView x_clamped_loss, bool fixed_min = false,
                               int num_bits = 8);

}  // namespace xquant
