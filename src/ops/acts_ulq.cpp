// ActsULQ operators (SPEC section 5): validate every argument, build the BroadcastPlan, dispatch.
//
// Shapes broadcast NumPy style (aligned right; per dim equal or 1; a 0 dim broadcasts only with 0 or 1),
// each rank <= kMaxRank. x, clamp_min, clamp_max share one floating dtype; every forward output and every
// backward input or output has that dtype too. Outputs may not overlap any input or each other.
#include "xquant/acts_ulq.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "core/kernels.hpp"
#include "ops/spec.hpp"
#include "xquant/plan.hpp"

namespace xquant {

namespace {

using detail::check_dtype;
using detail::check_floating;
using detail::check_no_overlap;
using detail::check_num_bits;
using detail::check_output;
using detail::check_shape;
using detail::check_view;
using detail::fail;
using detail::kMaxRank;

constexpr std::string_view kOp = "acts_ulq";
constexpr std::string_view kOpBackward = "acts_ulq_backward";
constexpr std::string_view kBroadcastWhat = "the broadcast shape of x, clamp_min and clamp_max";

// A shape given without data (x_shape of the allocating backward): no negative dim, numel fits int64.
void check_shape_value(std::string_view op, std::string_view arg, const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0)
      fail(ErrorCode::shape_mismatch, op, arg,
           std::string(arg) + " is " + shape_str(shape) + " with a negative dimension");
    if (d != 0 && n > INT64_MAX / d)
      fail(ErrorCode::shape_mismatch, op, arg,
           std::string(arg) + " is " + shape_str(shape) + " whose element count overflows int64");
    n *= d;
  }
}

void check_rank(std::string_view op, std::string_view arg, const Shape& shape) {
  if (shape.size() > static_cast<std::size_t>(kMaxRank))
    fail(ErrorCode::shape_mismatch, op, arg,
         std::string(arg) + " has shape " + shape_str(shape) + " of rank " + std::to_string(shape.size()) +
             " but expected a rank of at most " + std::to_string(kMaxRank));
}

// NumPy broadcast of two shapes; false if some aligned pair of dims differs and neither is 1.
bool broadcast_pair(const Shape& a, const Shape& b, Shape& out) {
  const std::size_t rank = std::max(a.size(), b.size());
  out.assign(rank, 1);
  for (std::size_t i = 0; i < rank; ++i) {  // i counts from the right
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out[rank - 1 - i] = da == 1 ? db : da;
  }
  return true;
}

// Broadcasts `arg` (of shape `shape`) into `acc`, the broadcast shape of the operands named `acc_what` so
// far; fails naming `arg` if it does not fit or the result has more than INT64_MAX elements.
void broadcast_into(std::string_view op, std::string_view arg, const Shape& shape, Shape& acc,
                    std::string_view acc_what) {
  Shape out;
  if (!broadcast_pair(acc, shape, out))
    fail(ErrorCode::shape_mismatch, op, arg,
         std::string(arg) + " has shape " + shape_str(shape) + " which does not broadcast with " +
             std::string(acc_what) + " " + shape_str(acc));
  std::int64_t n = 1;
  for (std::int64_t d : out) {
    if (d != 0 && n > INT64_MAX / d)
      fail(ErrorCode::shape_mismatch, op, arg,
           std::string(arg) + " has shape " + shape_str(shape) + " whose broadcast with " + std::string(acc_what) +
               " " + shape_str(acc) + " has more than INT64_MAX elements");
    n *= d;
  }
  acc = std::move(out);
}

// Validity and rank of the three shapes, then their broadcast shape. The names say which argument carries
// each shape (x's shape is "x" in the forward, "x_grad" / "x_shape" in the backward). In the backward the
// two clamp tensors are broadcast first, so that a bad x shape is blamed on the argument that carries it.
Shape broadcast_three(std::string_view op, std::string_view x_name, const Shape& x, const Shape& clamp_min,
                      const Shape& clamp_max, bool x_first) {
  check_rank(op, x_name, x);
  check_rank(op, "clamp_min", clamp_min);
  check_rank(op, "clamp_max", clamp_max);
  Shape acc;
  if (x_first) {
    acc = x;
    broadcast_into(op, "clamp_min", clamp_min, acc, std::string(x_name) + "'s shape");
    // Pairwise compatibility is joint compatibility, so blame the pair that fails.
    Shape tmp = x;
    broadcast_into(op, "clamp_max", clamp_max, tmp, std::string(x_name) + "'s shape");
    tmp = clamp_min;
    broadcast_into(op, "clamp_max", clamp_max, tmp, "clamp_min's shape");
    broadcast_into(op, "clamp_max", clamp_max, acc, "the broadcast shape of " + std::string(x_name) + " and clamp_min");
  } else {
    acc = clamp_min;
    broadcast_into(op, "clamp_max", clamp_max, acc, "clamp_min's shape");
    Shape tmp = clamp_min;
    broadcast_into(op, x_name, x, tmp, "clamp_min's shape");
    tmp = clamp_max;
    broadcast_into(op, x_name, x, tmp, "clamp_max's shape");
    broadcast_into(op, x_name, x, acc, "the broadcast shape of clamp_min and clamp_max");
  }
  return acc;
}

// The operand's element strides over the output: shape left-padded with 1s; stride 0 on every dim where
// the padded operand dim is 1 (broadcast), row-major element strides otherwise.
void fill_strides(const Shape& out, const Shape& operand, std::int64_t* stride) {
  const std::size_t rank = out.size();
  const std::size_t pad = rank - operand.size();
  std::int64_t acc = 1;
  for (std::size_t d = rank; d-- > 0;) {
    const std::int64_t dim = d < pad ? 1 : operand[d - pad];
    stride[d] = dim == 1 ? 0 : acc;
    acc *= dim;
  }
}

detail::BroadcastPlan make_plan(const Shape& out, const Shape& x, const Shape& clamp_min, const Shape& clamp_max) {
  detail::BroadcastPlan plan{};
  plan.rank = static_cast<int>(out.size());
  for (std::size_t d = 0; d < out.size(); ++d) plan.shape[d] = out[d];
  fill_strides(out, x, plan.stride_x);
  fill_strides(out, clamp_min, plan.stride_min);
  fill_strides(out, clamp_max, plan.stride_max);
  return plan;
}

// Forward inputs: views, dtypes, ranks, broadcast, num_bits. Returns the output shape.
Shape validate_forward_inputs(const ConstTensorView& x, const ConstTensorView& clamp_min,
                              const ConstTensorView& clamp_max, int num_bits) {
  check_view(kOp, "x", x);
  check_view(kOp, "clamp_min", clamp_min);
  check_view(kOp, "clamp_max", clamp_max);
  check_floating(kOp, "x", x.dtype);
  check_dtype(kOp, "clamp_min", clamp_min.dtype, x.dtype);
  check_dtype(kOp, "clamp_max", clamp_max.dtype, x.dtype);
  Shape out = broadcast_three(kOp, "x", x.shape, clamp_min.shape, clamp_max.shape, /*x_first=*/true);
  check_num_bits(kOp, num_bits, 2, 16);
  return out;
}

// Backward inputs (x's shape named `x_name`): views, dtypes (all equal to clamp_min's), ranks, broadcast,
// num_bits, and y_grad / masks / loss of the broadcast shape. Returns that shape.
Shape validate_backward_inputs(std::string_view x_name, const Shape& x_shape, const ConstTensorView& y_grad,
                               const ConstTensorView& clamp_min, const ConstTensorView& clamp_max,
                               const ConstTensorView& clamp_min_mask, const ConstTensorView& clamp_max_mask,
                               const ConstTensorView& x_clamped_loss, int num_bits) {
  check_view(kOpBackward, "y_grad", y_grad);
  check_view(kOpBackward, "clamp_min", clamp_min);
  check_view(kOpBackward, "clamp_max", clamp_max);
  check_view(kOpBackward, "clamp_min_mask", clamp_min_mask);
  check_view(kOpBackward, "clamp_max_mask", clamp_max_mask);
  check_view(kOpBackward, "x_clamped_loss", x_clamped_loss);
  check_floating(kOpBackward, "clamp_min", clamp_min.dtype);
  const DType dt = clamp_min.dtype;
  check_dtype(kOpBackward, "clamp_max", clamp_max.dtype, dt);
  check_dtype(kOpBackward, "y_grad", y_grad.dtype, dt);
  check_dtype(kOpBackward, "clamp_min_mask", clamp_min_mask.dtype, dt);
  check_dtype(kOpBackward, "clamp_max_mask", clamp_max_mask.dtype, dt);
  check_dtype(kOpBackward, "x_clamped_loss", x_clamped_loss.dtype, dt);
  Shape out = broadcast_three(kOpBackward, x_name, x_shape, clamp_min.shape, clamp_max.shape, /*x_first=*/false);
  check_shape(kOpBackward, "y_grad", y_grad.shape, out, kBroadcastWhat);
  check_shape(kOpBackward, "clamp_min_mask", clamp_min_mask.shape, out, kBroadcastWhat);
  check_shape(kOpBackward, "clamp_max_mask", clamp_max_mask.shape, out, kBroadcastWhat);
  check_shape(kOpBackward, "x_clamped_loss", x_clamped_loss.shape, out, kBroadcastWhat);
  check_num_bits(kOpBackward, num_bits, 2, 16);
  return out;
}

struct NamedView {
  std::string_view name;
  const void* data;
  std::size_t bytes;
};

// Every output must be disjoint from every input and from every other output.
template <std::size_t NO, std::size_t NI>
void check_disjoint(std::string_view op, const NamedView (&outs)[NO], const NamedView (&ins)[NI]) {
  for (std::size_t i = 0; i < NO; ++i) {
    for (const NamedView& in : ins)
      check_no_overlap(op, outs[i].name, outs[i].data, outs[i].bytes, in.name, in.data, in.bytes);
    for (std::size_t j = 0; j < i; ++j)
      check_no_overlap(op, outs[i].name, outs[i].data, outs[i].bytes, outs[j].name, outs[j].data, outs[j].bytes);
  }
}

NamedView named(std::string_view name, const ConstTensorView& v) { return {name, v.data, v.nbytes()}; }

}  // namespace

Shape acts_ulq_output_shape(const Shape& x, const Shape& clamp_min, const Shape& clamp_max) {
  check_shape_value(kOp, "x", x);
  check_shape_value(kOp, "clamp_min", clamp_min);
  check_shape_value(kOp, "clamp_max", clamp_max);
  return broadcast_three(kOp, "x", x, clamp_min, clamp_max, /*x_first=*/true);
}

void acts_ulq_out(TensorView y, TensorView clamp_min_mask, TensorView clamp_max_mask, TensorView x_clamped_loss,
                  ConstTensorView x, ConstTensorView clamp_min, ConstTensorView clamp_max, bool fixed_min,
                  int num_bits) {
  const Device dev = detail::common_device(kOp, {{"x", x.device},
                                                 {"clamp_min", clamp_min.device},
                                                 {"clamp_max", clamp_max.device},
                                                 {"y", y.device},
                                                 {"clamp_min_mask", clamp_min_mask.device},
                                                 {"clamp_max_mask", clamp_max_mask.device},
                                                 {"x_clamped_loss", x_clamped_loss.device}});
  const auto kernel = detail::kernels_for(kOp, "x", dev).acts_ulq;
  const Shape out = validate_forward_inputs(x, clamp_min, clamp_max, num_bits);
  check_output(kOp, "y", y, x.dtype, out, kBroadcastWhat);
  check_output(kOp, "clamp_min_mask", clamp_min_mask, x.dtype, out, kBroadcastWhat);
  check_output(kOp, "clamp_max_mask", clamp_max_mask, x.dtype, out, kBroadcastWhat);
  check_output(kOp, "x_clamped_loss", x_clamped_loss, x.dtype, out, kBroadcastWhat);
  const NamedView outs[] = {named("y", y), named("clamp_min_mask", clamp_min_mask),
                            named("clamp_max_mask", clamp_max_mask), named("x_clamped_loss", x_clamped_loss)};
  const NamedView ins[] = {named("x", x), named("clamp_min", clamp_min), named("clamp_max", clamp_max)};
  check_disjoint(kOp, outs, ins);
  if (shape_numel(out) == 0) return;

  detail::ActsUlqArgs args{};
  args.dt = x.dtype;
  args.plan = make_plan(out, x.shape, clamp_min.shape, clamp_max.shape);
  args.x = x.data;
  args.clamp_min = clamp_min.data;
  args.clamp_max = clamp_max.data;
  args.fixed_min = fixed_min;
  args.num_bits = num_bits;
  args.y = y.data;
  args.clamp_min_mask = clamp_min_mask.data;
  args.clamp_max_mask = clamp_max_mask.data;
  args.x_clamped_loss = x_clamped_loss.data;
  kernel(args);
}

ActsUlqResult acts_ulq(ConstTensorView x, ConstTensorView clamp_min, ConstTensorView clamp_max, bool fixed_min,
                       int num_bits) {
  const Shape out = validate_forward_inputs(x, clamp_min, clamp_max, num_bits);
  const Device dev =
      detail::common_device(kOp, {{"x", x.device}, {"clamp_min", clamp_min.device}, {"clamp_max", clamp_max.device}});
  (void)detail::kernels_for(kOp, "x", dev);  // fails here, before allocating, if the device cannot run it
  ActsUlqResult r{Tensor(x.dtype, out, dev), Tensor(x.dtype, out, dev), Tensor(x.dtype, out, dev),
                  Tensor(x.dtype, out, dev)};
  acts_ulq_out(r.y, r.clamp_min_mask, r.clamp_max_mask, r.x_clamped_loss, x, clamp_min, clamp_max, fixed_min, num_bits);
  return r;
}

void acts_ulq_backward_out(TensorView x_grad, TensorView clamp_min_grad, TensorView clamp_max_grad,
                           ConstTensorView y_grad, ConstTensorView clamp_min, ConstTensorView clamp_max,
                           ConstTensorView clamp_min_mask, ConstTensorView clamp_max_mask,
                           ConstTensorView x_clamped_loss, bool fixed_min, int num_bits) {
  const Device dev = detail::common_device(kOpBackward, {{"y_grad", y_grad.device},
                                                         {"clamp_min", clamp_min.device},
                                                         {"clamp_max", clamp_max.device},
                                                         {"clamp_min_mask", clamp_min_mask.device},
                                                         {"clamp_max_mask", clamp_max_mask.device},
                                                         {"x_clamped_loss", x_clamped_loss.device},
                                                         {"x_grad", x_grad.device},
                                                         {"clamp_min_grad", clamp_min_grad.device},
                                                         {"clamp_max_grad", clamp_max_grad.device}});
  const auto kernel = detail::kernels_for(kOpBackward, "y_grad", dev).acts_ulq_backward;
  // x_grad's view carries x's shape, so it is checked as a view before the shapes are broadcast.
  check_view(kOpBackward, "x_grad", x_grad);
  const Shape out = validate_backward_inputs("x_grad", x_grad.shape, y_grad, clamp_min, clamp_max, clamp_min_mask,
                                             clamp_max_mask, x_clamped_loss, num_bits);
  const DType dt = clamp_min.dtype;
  check_dtype(kOpBackward, "x_grad", x_grad.dtype, dt);
  check_output(kOpBackward, "clamp_min_grad", clamp_min_grad, dt, clamp_min.shape, "the shape of clamp_min");
  check_output(kOpBackward, "clamp_max_grad", clamp_max_grad, dt, clamp_max.shape, "the shape of clamp_max");
  const NamedView outs[] = {named("x_grad", x_grad), named("clamp_min_grad", clamp_min_grad),
                            named("clamp_max_grad", clamp_max_grad)};
  const NamedView ins[] = {named("y_grad", y_grad),
                           named("clamp_min", clamp_min),
                           named("clamp_max", clamp_max),
                           named("clamp_min_mask", clamp_min_mask),
                           named("clamp_max_mask", clamp_max_mask),
                           named("x_clamped_loss", x_clamped_loss)};
  check_disjoint(kOpBackward, outs, ins);
  // No early return on an empty output: a gradient can be non-empty while the output is empty (x [2] with
  // clamp_min [0, 1]); its elements are then empty sums, +0. The kernel handles that.

  detail::ActsUlqBackwardArgs args{};
  args.dt = dt;
  args.plan = make_plan(out, x_grad.shape, clamp_min.shape, clamp_max.shape);
  args.y_grad = y_grad.data;
  args.clamp_min = clamp_min.data;
  args.clamp_max = clamp_max.data;
  args.clamp_min_mask = clamp_min_mask.data;
  args.clamp_max_mask = clamp_max_mask.data;
  args.x_clamped_loss = x_clamped_loss.data;
  args.fixed_min = fixed_min;
  args.num_bits = num_bits;
  args.x_grad = x_grad.data;
  args.clamp_min_grad = clamp_min_grad.data;
  args.clamp_max_grad = clamp_max_grad.data;
  kernel(args);
}

ActsUlqGrads acts_ulq_backward(ConstTensorView y_grad, const Shape& x_shape, ConstTensorView clamp_min,
                               ConstTensorView clamp_max, ConstTensorView clamp_min_mask,
                               ConstTensorView clamp_max_mask, ConstTensorView x_clamped_loss, bool fixed_min,
                               int num_bits) {
  check_shape_value(kOpBackward, "x_shape", x_shape);
  validate_backward_inputs("x_shape", x_shape, y_grad, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask,
                           x_clamped_loss, num_bits);
  const DType dt = clamp_min.dtype;
  const Device dev = detail::common_device(kOpBackward, {{"y_grad", y_grad.device},
                                                         {"clamp_min", clamp_min.device},
                                                         {"clamp_max", clamp_max.device},
                                                         {"clamp_min_mask", clamp_min_mask.device},
                                                         {"clamp_max_mask", clamp_max_mask.device},
                                                         {"x_clamped_loss", x_clamped_loss.device}});
  (void)detail::kernels_for(kOpBackward, "y_grad", dev);  // fails here, before allocating, if the device cannot run it
  ActsUlqGrads g{Tensor(dt, x_shape, dev), Tensor(dt, clamp_min.shape, dev), Tensor(dt, clamp_max.shape, dev)};
  acts_ulq_backward_out(g.x_grad, g.clamp_min_grad, g.clamp_max_grad, y_grad, clamp_min, clamp_max, clamp_min_mask,
                        clamp_max_mask, x_clamped_loss, fixed_min, num_bits);
  return g;
}

Shape plan_acts_ulq(const TensorSpec& x, const TensorSpec& clamp_min, const TensorSpec& clamp_max, int num_bits) {
  return validate_forward_inputs(detail::spec_view(x), detail::spec_view(clamp_min), detail::spec_view(clamp_max),
                                 num_bits);
}

Shape plan_acts_ulq_backward(const TensorSpec& y_grad, const Shape& x_shape, const TensorSpec& clamp_min,
                             const TensorSpec& clamp_max, const TensorSpec& clamp_min_mask,
                             const TensorSpec& clamp_max_mask, const TensorSpec& x_clamped_loss, int num_bits) {
  check_view(kOpBackward, "x_grad", detail::spec_view(TensorSpec{clamp_min.dtype, x_shape}));
  return validate_backward_inputs("x_grad", x_shape, detail::spec_view(y_grad), detail::spec_view(clamp_min),
                                  detail::spec_view(clamp_max), detail::spec_view(clamp_min_mask),
                                  detail::spec_view(clamp_max_mask), detail::spec_view(x_clamped_loss), num_bits);
}

}  // namespace xquant
