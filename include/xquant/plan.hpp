// Shape-only planning: each operator's checks of dtypes, shapes and options, without data.
//
// plan_<op> runs the validation the operator's call runs (the same code, in the same order, with the same
// xquant::Error) on tensors described only by dtype and shape, and returns the output shapes. Nothing is
// read or written, so it serves shape inference (the Meta kernels of the PyTorch operators, which
// FakeTensor, torch.compile and torch.export run). Not covered, because they need data or buffers: the
// checks of values (amax finite and >= 0, group_index row ends), of devices, of output buffers and of
// overlapping memory; the call makes those after the same planning.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include "xquant/acts_ulq.hpp"
#include "xquant/anti_quant.hpp"
#include "xquant/dynamic_quant.hpp"
#include "xquant/fake_quant.hpp"
#include "xquant/matmul.hpp"
#include "xquant/quantize.hpp"
#include "xquant/tensor.hpp"
#include "xquant/tile_quant.hpp"

namespace xquant {

// What planning sees of a tensor: dtype and shape (a dense row-major layout is assumed).
struct TensorSpec {
  DType dtype = DType::float32;
  Shape shape;
};
inline TensorSpec spec_of(const ConstTensorView& v) { return {v.dtype, v.shape}; }

// fake_tensor_quant / _inplace / _with_axis: the output shape (inputs' shape; dtype inputs').
Shape plan_fake_tensor_quant(const TensorSpec& inputs, const TensorSpec& amax, const FakeQuantOptions& options = {});
Shape plan_fake_tensor_quant_inplace(const TensorSpec& inputs, const TensorSpec& amax,
                                     const FakeQuantOptions& options = {});
Shape plan_fake_tensor_quant_with_axis(const TensorSpec& inputs, const TensorSpec& amax, std::int64_t axis,
                                       const FakeQuantOptions& options = {});
// The backward of either form: grad_inputs has inputs' shape and dtype, grad_amax amax's.
void plan_fake_tensor_quant_backward(const TensorSpec& grad_out, const TensorSpec& inputs, const TensorSpec& amax,
                                     std::optional<std::int64_t> axis, const FakeQuantOptions& options = {});

// quantize: the output shape (dtype storage_dtype(dtype)).
Shape plan_quantize(const TensorSpec& input, const TensorSpec& scales, const std::optional<TensorSpec>& zero_points,
                    QuantDType dtype, std::int64_t axis, bool div_mode);

// tile_quant on dense tiles: every spec must be 2-D ("out has shape [3] but expected a 2-D tile"), then
// the operator's tile checks (out: int8 for SYM, uint8 for ASYM, src's shape).
void plan_tile_quant(const TensorSpec& out, const TensorSpec& src, const TensorSpec& scale, QuantMode mode,
                     const std::optional<TensorSpec>& offset);

// dynamic_quant_asymmetric / dynamic_quant: y's dtype and shape, and the shape of scale (and offset).
struct DynamicQuantShapes {
  DType y_dtype = DType::int8;
  Shape y_shape;
  Shape param_shape;
};
DynamicQuantShapes plan_dynamic_quant_asymmetric(const TensorSpec& x, const std::optional<TensorSpec>& smooth_scales,
                                                 const std::optional<TensorSpec>& group_index, QuantDType dst_type,
                                                 DynamicQuantMode quant_mode);
DynamicQuantShapes plan_dynamic_quant(const TensorSpec& x, const std::optional<TensorSpec>& smooth_scales,
                                      const std::optional<TensorSpec>& group_index, QuantDType dst_type,
                                      DynamicQuantMode quant_mode = DynamicQuantMode::pertoken);

// anti_quant: x's logical shape (the output's; its dtype is the caller's floating dst_dtype).
Shape plan_anti_quant(const TensorSpec& x, const TensorSpec& scale, const std::optional<TensorSpec>& offset,
                      QuantDType src_dtype);

// acts_ulq: the broadcast shape of the four outputs (x's dtype).
Shape plan_acts_ulq(const TensorSpec& x, const TensorSpec& clamp_min, const TensorSpec& clamp_max, int num_bits);
// acts_ulq_backward_out with an x_grad of shape x_shape: the broadcast shape; the gradients have x_shape,
// clamp_min's and clamp_max's shapes.
Shape plan_acts_ulq_backward(const TensorSpec& y_grad, const Shape& x_shape, const TensorSpec& clamp_min,
                             const TensorSpec& clamp_max, const TensorSpec& clamp_min_mask,
                             const TensorSpec& clamp_max_mask, const TensorSpec& x_clamped_loss, int num_bits);

// quant_matmul: the output shape (dtype output_dtype). x2 is described as stored (transpose_x2: [..., N, K]).
Shape plan_quant_matmul(const TensorSpec& x1, const TensorSpec& x2, const TensorSpec& scale,
                        const std::optional<TensorSpec>& offset, const std::optional<TensorSpec>& pertoken_scale,
                        const std::optional<TensorSpec>& bias, bool transpose_x2, DType output_dtype,
                        const std::array<std::int64_t, 3>& group_sizes = {});
// weight_quant_batchmatmul: the output shape (x's dtype). weight is described as stored.
Shape plan_weight_quant_batchmatmul(const TensorSpec& x, const TensorSpec& weight, const TensorSpec& antiquant_scale,
                                    const std::optional<TensorSpec>& antiquant_offset,
                                    const std::optional<TensorSpec>& bias, std::int64_t antiquant_group_size,
                                    bool transpose_weight);
// trans_quant_param: the output shape (int64). convert_weight_to_int4pack: the output shape (int32).
Shape plan_trans_quant_param(const TensorSpec& scale, const std::optional<TensorSpec>& offset, int round_mode);
Shape plan_convert_weight_to_int4pack(const TensorSpec& weight);

}  // namespace xquant
