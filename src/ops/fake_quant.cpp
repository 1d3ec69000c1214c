// Operators: fake tensor quantization (SPEC section 1). Validate -> normalize to [outer, channels, inner]
// -> per-channel parameters -> kernel.
#include "xquant/fake_quant.hpp"

#include <cmath>
#include <cstdio>
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
using detail::FakeQuantParams;

// The validated, normalized problem.
struct FakeQuantProblem {
  ChannelLayout split;
  std::vector<FakeQuantParams> params;  // one per channel
};

std::string float_str(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// Checks inputs / amax / options; axis == nullopt is the per-tensor form. read_values = false: shapes
// only (plan_*: amax's values are neither checked nor turned into parameters).
FakeQuantProblem plan(const char* op, const ConstTensorView& inputs, const ConstTensorView& amax,
                      std::optional<std::int64_t> axis, const FakeQuantOptions& o, bool read_values = true) {
  detail::check_view(op, "inputs", inputs);
  detail::check_floating(op, "inputs", inputs.dtype);
  detail::check_view(op, "amax", amax);
  detail::check_floating(op, "amax", amax.dtype);
  detail::check_num_bits(op, o.num_bits, 1, 32);
  FakeQuantProblem pb;
  if (!axis) {
    if (amax.numel() != 1)
      fail(ErrorCode::shape_mismatch, op, "amax",
           "amax has shape " + shape_str(amax.shape) + " (" + std::to_string(amax.numel()) +
               " elements) but expected exactly one element for per-tensor quantization");
    pb.split = {1, 1, inputs.numel()};
  } else {
    const std::int64_t ax = detail::normalize_axis(op, "axis", *axis, inputs.dim());
    if (amax.dim() != 1 || amax.shape[0] != inputs.shape[static_cast<std::size_t>(ax)])
      fail(ErrorCode::shape_mismatch, op, "amax",
           "amax has shape " + shape_str(amax.shape) + " but inputs has " +
               std::to_string(inputs.shape[static_cast<std::size_t>(ax)]) + " channels on axis " + std::to_string(ax) +
               " (expected a 1-D amax of that length)");
    pb.split = detail::split_at_axis(inputs.shape, ax);
  }
  if (!read_values) return pb;
  // amax must be finite and >= 0; name the first bad channel. (Read on the host: a CUDA amax is copied.)
  const detail::HostCopy amax_host(amax);
  const ConstTensorView& amax_h = amax_host.view();
  const std::int64_t channels = amax.numel();
  const bool half = inputs.dtype == DType::float16;
  pb.params.resize(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) {
    const float a = detail::load_float(amax_h.dtype, amax_h.data, c);
    if (!std::isfinite(a) || a < 0.0f)
      fail(ErrorCode::invalid_argument, op, "amax",
           "amax[" + std::to_string(c) + "] is " + float_str(a) + " but expected a finite value >= 0");
    // float16 inputs compute in float16 (SPEC 1): the kernel's amax is a float16 value.
    if (half && detail::hd_round_to_half(a) != a)
      fail(ErrorCode::invalid_argument, op, "amax",
           "amax[" + std::to_string(c) + "] is " + float_str(a) +
               " but float16 inputs need an amax that float16 represents exactly (the NPU kernel computes in "
               "float16; round amax to float16 first)");
    pb.params[static_cast<std::size_t>(c)] =
        detail::init_fake_quant_params(a, o.num_bits, o.is_unsigned, o.narrow_range, half);
  }
  return pb;
}

void check_grad_out(const char* op, const ConstTensorView& grad_out, const ConstTensorView& inputs) {
  detail::check_view(op, "grad_out", grad_out);
  detail::check_dtype(op, "grad_out", grad_out.dtype, inputs.dtype);
  detail::check_shape(op, "grad_out", grad_out.shape, inputs.shape, "the shape of inputs");
}

// Allocating forms: inputs and amax on one device, which can run the forward kernel.
void check_devices(const char* op, const ConstTensorView& inputs, const ConstTensorView& amax) {
  const Device dev = detail::common_device(op, {{"inputs", inputs.device}, {"amax", amax.device}});
  (void)detail::kernels_for(op, "inputs", dev);  // fails here, before allocating, if the device cannot run it
}

// out_name: "out", or "inputs" for the in-place form (whose output is its input).
void run_forward(const char* op, const char* out_name, TensorView out, const ConstTensorView& inputs,
                 const ConstTensorView& amax, std::optional<std::int64_t> axis, const FakeQuantOptions& o) {
  const Device dev =
      detail::common_device(op, {{"inputs", inputs.device}, {"amax", amax.device}, {out_name, out.device}});
  const auto kernel = detail::kernels_for(op, "inputs", dev).fake_quant;
  FakeQuantProblem pb = plan(op, inputs, amax, axis, o);
  detail::check_output(op, out_name, out, inputs.dtype, inputs.shape, "the shape of inputs");
  detail::check_same_or_disjoint(op, out_name, out.data, out.nbytes(), "inputs", inputs.data, inputs.nbytes());
  detail::check_no_overlap(op, out_name, out.data, out.nbytes(), "amax", amax.data, amax.nbytes());
  if (inputs.numel() == 0) return;
  detail::FakeQuantArgs args{};
  args.dt = inputs.dtype;
  args.x = inputs.data;
  args.y = out.data;
  args.layout = pb.split;
  args.params = pb.params.data();
  kernel(args);
}

}  // namespace

void fake_tensor_quant_out(TensorView out, ConstTensorView inputs, ConstTensorView amax,
                           const FakeQuantOptions& options) {
  run_forward("fake_tensor_quant", "out", std::move(out), inputs, amax, std::nullopt, options);
}

Tensor fake_tensor_quant(ConstTensorView inputs, ConstTensorView amax, const FakeQuantOptions& options) {
  check_devices("fake_tensor_quant", inputs, amax);
  plan("fake_tensor_quant", inputs, amax, std::nullopt, options);  // validate before allocating
  Tensor out(inputs.dtype, inputs.shape, inputs.device);
  fake_tensor_quant_out(out, inputs, amax, options);
  return out;
}

void fake_tensor_quant_inplace(TensorView inputs, ConstTensorView amax, const FakeQuantOptions& options) {
  run_forward("fake_tensor_quant_inplace", "inputs", inputs, inputs, amax, std::nullopt, options);
}

void fake_tensor_quant_with_axis_out(TensorView out, ConstTensorView inputs, ConstTensorView amax, std::int64_t axis,
                                     const FakeQuantOptions& options) {
  run_forward("fake_tensor_quant_with_axis", "out", std::move(out), inputs, amax, axis, options);
}

Tensor fake_tensor_quant_with_axis(ConstTensorView inputs, ConstTensorView amax, std::int64_t axis,
                                   const FakeQuantOptions& options) {
  check_devices("fake_tensor_quant_with_axis", inputs, amax);
  plan("fake_tensor_quant_with_axis", inputs, amax, axis, options);
  Tensor out(inputs.dtype, inputs.shape, inputs.device);
  fake_tensor_quant_with_axis_out(out, inputs, amax, axis, options);
  return out;
}

void fake_tensor_quant_backward_out(TensorView grad_inputs, std::optional<TensorView> grad_amax,
                                    ConstTensorView grad_out, ConstTensorView inputs, ConstTensorView amax,
                                    std::optional<std::int64_t> axis, const FakeQuantOptions& options) {
  const char* op = "fake_tensor_quant_backward";
  const Device dev = detail::common_device(op, {{"inputs", inputs.device},
                                                {"amax", amax.device},
                                                {"grad_out", grad_out.device},
                                                {"grad_inputs", grad_inputs.device},
                                                {"grad_amax", grad_amax ? grad_amax->device : inputs.device}});
  // Before anything else: the CUDA backend has no backward kernel yet (nothing is read or written).
  const detail::KernelTable& kt = detail::kernels_for(op, "inputs", dev);
  const auto backward = kt.fake_quant_backward;
  FakeQuantProblem pb = plan(op, inputs, amax, axis, options);
  check_grad_out(op, grad_out, inputs);
  detail::check_output(op, "grad_inputs", grad_inputs, inputs.dtype, inputs.shape, "the shape of inputs");
  // grad_inputs is written while grad_out and inputs are still read: the same buffer is fine (each
  // element is read before it is written), a partial overlap is not.
  detail::check_same_or_disjoint(op, "grad_inputs", grad_inputs.data, grad_inputs.nbytes(), "grad_out", grad_out.data,
                                 grad_out.nbytes());
  detail::check_same_or_disjoint(op, "grad_inputs", grad_inputs.data, grad_inputs.nbytes(), "inputs", inputs.data,
                                 inputs.nbytes());
  detail::check_no_overlap(op, "grad_inputs", grad_inputs.data, grad_inputs.nbytes(), "amax", amax.data, amax.nbytes());
  if (grad_amax) {
    detail::check_output(op, "grad_amax", *grad_amax, amax.dtype, amax.shape, "the shape of amax");
    const std::size_t gb = grad_amax->nbytes();
    detail::check_no_overlap(op, "grad_amax", grad_amax->data, gb, "grad_inputs", grad_inputs.data,
                             grad_inputs.nbytes());
    detail::check_no_overlap(op, "grad_amax", grad_amax->data, gb, "grad_out", grad_out.data, grad_out.nbytes());
    detail::check_no_overlap(op, "grad_amax", grad_amax->data, gb, "inputs", inputs.data, inputs.nbytes());
    detail::check_no_overlap(op, "grad_amax", grad_amax->data, gb, "amax", amax.data, amax.nbytes());
  }
  std::vector<float> gsum(grad_amax ? static_cast<std::size_t>(pb.split.channels) : 0);
  // On a CUDA device the kernel sums into device memory; the sums come back to the host to be narrowed to
  // grad_amax's dtype (channels values) and go out again.
  Tensor dev_gsum;
  if (grad_amax && dev.is_cuda()) dev_gsum = Tensor(DType::float32, Shape{pb.split.channels}, dev);
  if (inputs.numel() > 0) {
    detail::FakeQuantBackwardArgs args{};
    args.dt = inputs.dtype;
    args.grad_out = grad_out.data;
    args.x = inputs.data;
    args.grad_in = grad_inputs.data;
    args.layout = pb.split;
    args.params = pb.params.data();
    args.grad_amax = grad_amax ? (dev.is_cuda() ? dev_gsum.data<float>() : gsum.data()) : nullptr;
    backward(args);
    if (grad_amax && dev.is_cuda() && !gsum.empty())
      detail::device_to_host(dev, gsum.data(), dev_gsum.data(), gsum.size() * sizeof(float), current_cuda_stream());
  }
  if (grad_amax && dev.is_cuda()) {
    std::vector<unsigned char> narrowed(grad_amax->nbytes());
    for (std::size_t c = 0; c < gsum.size(); ++c)
      detail::store_float(grad_amax->dtype, narrowed.data(), static_cast<std::int64_t>(c), gsum[c]);
    if (!narrowed.empty())
      detail::host_to_device(dev, grad_amax->data, narrowed.data(), narrowed.size(), current_cuda_stream());
  } else if (grad_amax) {
    for (std::size_t c = 0; c < gsum.size(); ++c)
      detail::store_float(grad_amax->dtype, grad_amax->data, static_cast<std::int64_t>(c), gsum[c]);
  }
}

FakeQuantGrads fake_tensor_quant_backward(ConstTensorView grad_out, ConstTensorView inputs, ConstTensorView amax,
                                          std::optional<std::int64_t> axis, const FakeQuantOptions& options,
                                          bool want_grad_amax) {
  const Device dev = detail::common_device(
      "fake_tensor_quant_backward", {{"inputs", inputs.device}, {"amax", amax.device}, {"grad_out", grad_out.device}});
  // fails here, before allocating, if the device cannot run it
  (void)detail::kernels_for("fake_tensor_quant_backward", "inputs", dev);
  plan("fake_tensor_quant_backward", inputs, amax, axis, options);
  FakeQuantGrads g;
  g.grad_inputs = Tensor(inputs.dtype, inputs.shape, inputs.device);
  if (want_grad_amax) g.grad_amax = Tensor(amax.dtype, amax.shape, amax.device);
  fake_tensor_quant_backward_out(g.grad_inputs,
                                 want_grad_amax ? std::optional<TensorView>(g.grad_amax.view()) : std::nullopt,
                                 grad_out, inputs, amax, axis, options);
  return g;
}

// ---- planning (xquant/plan.hpp) ------------------------------------------------------------------------

Shape plan_fake_tensor_quant(const TensorSpec& inputs, const TensorSpec& amax, const FakeQuantOptions& options) {
  plan("fake_tensor_quant", detail::spec_view(inputs), detail::spec_view(amax), std::nullopt, options, false);
  return inputs.shape;
}

Shape plan_fake_tensor_quant_inplace(const TensorSpec& inputs, const TensorSpec& amax,
                                     const FakeQuantOptions& options) {
  plan("fake_tensor_quant_inplace", detail::spec_view(inputs), detail::spec_view(amax), std::nullopt, options, false);
  return inputs.shape;
}

Shape plan_fake_tensor_quant_with_axis(const TensorSpec& inputs, const TensorSpec& amax, std::int64_t axis,
                                       const FakeQuantOptions& options) {
  plan("fake_tensor_quant_with_axis", detail::spec_view(inputs), detail::spec_view(amax), axis, options, false);
  return inputs.shape;
}

void plan_fake_tensor_quant_backward(const TensorSpec& grad_out, const TensorSpec& inputs, const TensorSpec& amax,
                                     std::optional<std::int64_t> axis, const FakeQuantOptions& options) {
  const char* op = "fake_tensor_quant_backward";
  const ConstTensorView x = detail::spec_view(inputs);
  plan(op, x, detail::spec_view(amax), axis, options, false);
  check_grad_out(op, detail::spec_view(grad_out), x);
}

}  // namespace xquant
