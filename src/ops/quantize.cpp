// npu_quantize (SPEC section 2): validate every argument, resolve the quantization axis to the normal form
// [outer, channels, inner], widen the per-channel scale / zero point to float32 and run the kernel.
#include "xquant/quantize.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "core/kernels.hpp"
#include "core/numeric.hpp"
#include "ops/spec.hpp"
#include "xquant/plan.hpp"

namespace xquant {

namespace {

using detail::fail;

constexpr std::string_view kOp = "quantize";

bool is_known(QuantDType q) {
  return q == QuantDType::qint8 || q == QuantDType::quint8 || q == QuantDType::qint32 || q == QuantDType::quint4x2;
}

std::string dtype_str(QuantDType q) {
  const std::string_view name = quant_dtype_name(q);
  return name.empty() || name == "unknown" ? std::to_string(static_cast<int>(q)) : std::string(name);
}

// A dtype this operator does not write: float8 (a QuantDType of dynamic quantization) or an invalid value.
[[noreturn]] void fail_dtype(QuantDType dtype) {
  const bool f8 = dtype == QuantDType::float8_e4m3fn || dtype == QuantDType::float8_e5m2;
  fail(ErrorCode::invalid_argument, kOp, "dtype",
       "dtype is " + dtype_str(dtype) + " but expected qint8, quint8, qint32 or quint4x2" +
           (f8 ? " (npu_quantize's float8 / HiFloat8 outputs exist on the Ascend 950 only and are not implemented; "
                 "dynamic_quant writes float8)"
               : ""));
}

// The output dtypes each mode accepts (seed 02 "dtype"): div_mode = true qint8 / quint8 / int32,
// div_mode = false qint8 / quint4x2.
void check_mode_dtype(QuantDType dtype, bool div_mode) {
  const bool ok = div_mode ? (dtype == QuantDType::qint8 || dtype == QuantDType::quint8 || dtype == QuantDType::qint32)
                           : (dtype == QuantDType::qint8 || dtype == QuantDType::quint4x2);
  if (!ok)
    fail(ErrorCode::invalid_argument, kOp, "dtype",
         "dtype is " + dtype_str(dtype) +
             (div_mode ? " but div_mode=true expects qint8, quint8 or qint32"
                       : " but div_mode=false expects qint8 or quint4x2"));
}

std::string str(std::int64_t v) { return std::to_string(v); }

// The normalized problem: x[outer][channels][inner], one parameter set per channel.
struct Plan {
  ChannelLayout split;
  Shape out_shape;
};

// div_mode = true: scales is 1-D; one element is per-tensor (axis ignored), otherwise axis wraps Python
// style and scales has input.shape[axis] elements.
ChannelLayout resolve_div_axis(const ConstTensorView& input, const ConstTensorView& scales, std::int64_t axis) {
  if (scales.dim() != 1)
    fail(ErrorCode::shape_mismatch, kOp, "scales",
         "scales has shape " + shape_str(scales.shape) +
             " but expected a 1-D tensor with 1 element (per-tensor) or input.shape[axis] elements");
  const std::int64_t numel = input.numel();
  if (scales.shape[0] == 1) return {1, 1, numel};
  const std::int64_t a = detail::normalize_axis(kOp, "axis", axis, input.dim());
  if (scales.shape[0] != input.shape[a])
    fail(ErrorCode::shape_mismatch, kOp, "scales",
         "scales has shape " + shape_str(scales.shape) + " but input has " + str(input.shape[a]) +
             " channels on axis " + str(a) + " (expected 1 or " + str(input.shape[a]) + " elements)");
  return detail::split_at_axis(input.shape, a);
}

// div_mode = false, the document's axis rule: axis == -2 is the second-to-last dimension, any axis in
// (-2, rank) the last one; axis < -2 and axis >= rank are errors. scales is 1-D (1 or axis-length
// elements) or has input's rank with every dimension 1 except the axis dimension (1 or axis length).
ChannelLayout resolve_mul_axis(const ConstTensorView& input, const ConstTensorView& scales, std::int64_t axis) {
  const std::int64_t rank = input.dim();
  if (rank < 1)
    fail(ErrorCode::shape_mismatch, kOp, "input",
         "input has shape " + shape_str(input.shape) + " but div_mode=false expects a tensor of rank >= 1");
  if (axis < -2)
    fail(ErrorCode::invalid_argument, kOp, "axis",
         "axis is " + str(axis) +
             " but div_mode=false expects axis >= -2 (-2: the second-to-last dimension, > -2: the last one)");
  if (axis >= rank)
    fail(ErrorCode::invalid_argument, kOp, "axis",
         "axis is " + str(axis) + " but expected a value below the input's rank " + str(rank));
  if (axis == -2 && rank < 2)
    fail(ErrorCode::invalid_argument, kOp, "axis",
         "axis is -2 (the second-to-last dimension) but input has rank " + str(rank));
  const std::int64_t d = axis == -2 ? rank - 2 : rank - 1;
  const std::int64_t len = input.shape[d];

  bool ok = false;
  if (scales.dim() == 1) {
    ok = scales.shape[0] == 1 || scales.shape[0] == len;
  } else if (scales.dim() == rank) {
    ok = scales.shape[d] == 1 || scales.shape[d] == len;
    for (std::int64_t i = 0; i < rank; ++i)
      if (i != d && scales.shape[i] != 1) ok = false;
  }
  if (!ok)
    fail(ErrorCode::shape_mismatch, kOp, "scales",
         "scales has shape " + shape_str(scales.shape) + " but input has " + str(len) + " channels on axis " + str(d) +
             " (expected 1 or " + str(len) + " elements, as a 1-D tensor or a rank-" + str(rank) +
             " tensor whose other dimensions are 1)");
  if (scales.numel() == 1) return {1, 1, input.numel()};
  return detail::split_at_axis(input.shape, d);
}

void check_zero_points(const ConstTensorView& zp, const ConstTensorView& scales, bool div_mode) {
  detail::check_view(kOp, "zero_points", zp);
  if (div_mode) {
    // Integer or floating zero points, added as float32.
    const bool ok =
        zp.dtype == DType::int8 || zp.dtype == DType::uint8 || zp.dtype == DType::int32 || is_floating(zp.dtype);
    if (!ok)
      fail(ErrorCode::dtype_mismatch, kOp, "zero_points",
           "zero_points has dtype " + std::string(dtype_name(zp.dtype)) +
               " but expected int8, uint8, int32, float32, float16 or bfloat16");
  } else if (zp.dtype != scales.dtype) {
    fail(ErrorCode::dtype_mismatch, kOp, "zero_points",
         "zero_points has dtype " + std::string(dtype_name(zp.dtype)) + " but expected " +
             std::string(dtype_name(scales.dtype)) + " (the dtype of scales)");
  }
  detail::check_shape(kOp, "zero_points", zp.shape, scales.shape, "the shape of scales");
}

// Validates every argument but the output; nothing is written.
Plan make_plan(const ConstTensorView& input, const ConstTensorView& scales,
               const std::optional<ConstTensorView>& zero_points, QuantDType dtype, std::int64_t axis, bool div_mode) {
  detail::check_view(kOp, "input", input);
  detail::check_floating(kOp, "input", input.dtype);
  if (!is_known(dtype)) fail_dtype(dtype);
  check_mode_dtype(dtype, div_mode);
  detail::check_view(kOp, "scales", scales);
  detail::check_floating(kOp, "scales", scales.dtype);
  Plan plan;
  plan.split = div_mode ? resolve_div_axis(input, scales, axis) : resolve_mul_axis(input, scales, axis);
  if (zero_points) check_zero_points(*zero_points, scales, div_mode);
  plan.out_shape = quantize_output_shape(input.shape, dtype);
  return plan;
}

// The device of every argument (out: the output's device, or input's for the allocating form).
Device call_device(Device out, const ConstTensorView& input, const ConstTensorView& scales,
                   const std::optional<ConstTensorView>& zero_points) {
  return detail::common_device(kOp, {{"input", input.device},
                                     {"scales", scales.device},
                                     {"zero_points", zero_points ? zero_points->device : input.device},
                                     {"out", out}});
}

void run(Device dev, const Plan& plan, void* out, const ConstTensorView& input, const ConstTensorView& scales_v,
         const std::optional<ConstTensorView>& zero_points_v, QuantDType dtype, bool div_mode) {
  const auto kernel = detail::kernels_for(kOp, "input", dev).quantize;
  if (input.numel() == 0) return;
  // Parameters are read on the host (CUDA scales / zero points are copied).
  const detail::HostCopy scales_host(scales_v);
  const ConstTensorView& scales = scales_host.view();
  std::optional<detail::HostCopy> zp_host;
  std::optional<ConstTensorView> zero_points;
  if (zero_points_v) zero_points = zp_host.emplace(*zero_points_v).view();
  // Per-channel parameters widened to float32 (an absent zero point is 0). Channel c is element c of
  // scales in every accepted shape (only the axis dimension may exceed 1); per-tensor uses element 0.
  std::vector<detail::QuantizeParams> params(static_cast<std::size_t>(plan.split.channels));
  for (std::int64_t c = 0; c < plan.split.channels; ++c) {
    params[static_cast<std::size_t>(c)] =
        detail::init_quantize_params(detail::load_float(scales.dtype, scales.data, c),
                                     zero_points ? detail::load_float(zero_points->dtype, zero_points->data, c) : 0.0f);
  }
  detail::QuantizeArgs args{};
  args.dt = input.dtype;
  args.x = input.data;
  args.q = dtype;
  args.y = out;
  args.layout = plan.split;
  args.params = params.data();
  args.div_mode = div_mode;
  kernel(args);
}

}  // namespace

Shape quantize_output_shape(const Shape& input_shape, QuantDType dtype) {
  if (!is_known(dtype)) fail_dtype(dtype);
  for (std::int64_t d : input_shape)
    if (d < 0)
      fail(ErrorCode::shape_mismatch, kOp, "input",
           "input has shape " + shape_str(input_shape) + " with a negative dimension");
  if (dtype != QuantDType::quint4x2) return input_shape;
  // quint4x2: eight int4 per int32 word along the last dimension.
  if (input_shape.empty() || input_shape.back() % 8 != 0)
    fail(ErrorCode::shape_mismatch, kOp, "input",
         "input has shape " + shape_str(input_shape) +
             " but dtype quint4x2 expects a last dimension divisible by 8 (eight int4 per int32)");
  Shape out = input_shape;
  out.back() /= 8;
  return out;
}

void quantize_out(TensorView out, ConstTensorView input, ConstTensorView scales,
                  std::optional<ConstTensorView> zero_points, QuantDType dtype, std::int64_t axis, bool div_mode) {
  const Device dev = call_device(out.device, input, scales, zero_points);
  const Plan plan = make_plan(input, scales, zero_points, dtype, axis, div_mode);
  detail::check_output(
      kOp, "out", out, storage_dtype(dtype), plan.out_shape,
      dtype == QuantDType::quint4x2 ? "input's shape with the last dimension divided by 8" : "the shape of input");
  detail::check_no_overlap(kOp, "out", out.data, out.nbytes(), "input", input.data, input.nbytes());
  detail::check_no_overlap(kOp, "out", out.data, out.nbytes(), "scales", scales.data, scales.nbytes());
  if (zero_points)
    detail::check_no_overlap(kOp, "out", out.data, out.nbytes(), "zero_points", zero_points->data,
                             zero_points->nbytes());
  run(dev, plan, out.data, input, scales, zero_points, dtype, div_mode);
}

Tensor quantize(ConstTensorView input, ConstTensorView scales, std::optional<ConstTensorView> zero_points,
                QuantDType dtype, std::int64_t axis, bool div_mode) {
  const Device dev = call_device(input.device, input, scales, zero_points);
  const Plan plan = make_plan(input, scales, zero_points, dtype, axis, div_mode);
  (void)detail::kernels_for(kOp, "input", dev);  // fails here, before allocating, if the device cannot run it
  Tensor out(storage_dtype(dtype), plan.out_shape, dev);
  run(dev, plan, out.data(), input, scales, zero_points, dtype, div_mode);
  return out;
}

Shape plan_quantize(const TensorSpec& input, const TensorSpec& scales, const std::optional<TensorSpec>& zero_points,
                    QuantDType dtype, std::int64_t axis, bool div_mode) {
  return make_plan(detail::spec_view(input), detail::spec_view(scales), detail::spec_view(zero_points), dtype, axis,
                   div_mode)
      .out_shape;
}

}  // namespace xquant
