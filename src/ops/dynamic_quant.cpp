// npu_dynamic_quant_asymmetric (SPEC section 4) and npu_dynamic_quant (SPEC section 6, symmetric):
// validation, normalization to rows, dispatch.
//
// Both operators validate every argument before anything is written (SPEC rule 6) with the same code
// (the symmetric one is the asymmetric one's pertoken form without offset), normalize x to
// [S rows, H cols], convert group_index to int64 row ends and hand the problem to the active
// dynamic_quant kernel.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "core/kernels.hpp"
#include "ops/spec.hpp"
#include "xquant/dynamic_quant.hpp"
#include "xquant/plan.hpp"

namespace xquant {

namespace {

using detail::fail;

constexpr std::string_view kAsymmetricOp = "dynamic_quant_asymmetric";
constexpr std::string_view kSymmetricOp = "dynamic_quant";

// The normalized, validated problem.
struct Plan {
  std::int64_t rows = 0;  // S: product of every dimension of x but the last
  std::int64_t cols = 0;  // H: the last dimension of x
  bool per_tensor = false;
  bool per_channel = false;
  std::int64_t channel_batches = 0;  // perchannel: B = prod(x.shape[:-2]) ...
  std::int64_t channel_rows = 0;     // ... and S = x.shape[-2]
  DType y_dtype = DType::int8;
  Shape y_shape;
  Shape param_shape;                     // x.shape[:-1] (pertoken), [1] (pertensor), x.shape[:-2] + [H] (perchannel)
  std::vector<std::int64_t> group_ends;  // empty when group_index is absent
};

std::string str(std::int64_t v) { return std::to_string(v); }

// group_index values widened to int64 (dtype already checked).
std::vector<std::int64_t> read_group_index(const ConstTensorView& g_view) {
  const detail::HostCopy host(g_view);  // read on the host (a CUDA group_index is copied)
  const ConstTensorView& g = host.view();
  std::vector<std::int64_t> ends(static_cast<std::size_t>(g.numel()));
  for (std::size_t i = 0; i < ends.size(); ++i)
    ends[i] = g.dtype == DType::int32 ? static_cast<std::int64_t>(g.ptr<std::int32_t>()[i]) : g.ptr<std::int64_t>()[i];
  return ends;
}

Plan validate_inputs(std::string_view op, const ConstTensorView& x, const std::optional<ConstTensorView>& smooth_scales,
                     const std::optional<ConstTensorView>& group_index, QuantDType dst_type,
                     DynamicQuantMode quant_mode, bool read_values = true) {
  // x: floating, rank >= 2.
  detail::check_view(op, "x", x);
  detail::check_floating(op, "x", x.dtype);
  if (x.dim() < 2)
    fail(ErrorCode::shape_mismatch, op, "x",
         "x has shape " + shape_str(x.shape) + " (rank " + str(x.dim()) + ") but expected rank >= 2");

  // dst_type: qint8, quint4x2 (int4 needs H % 8 == 0), float8_e4m3fn or float8_e5m2.
  if (dst_type != QuantDType::qint8 && dst_type != QuantDType::quint4x2 && dst_type != QuantDType::float8_e4m3fn &&
      dst_type != QuantDType::float8_e5m2)
    fail(ErrorCode::invalid_argument, op, "dst_type",
         "dst_type is " + std::string(quant_dtype_name(dst_type)) +
             " but expected qint8, quint4x2, float8_e4m3fn or float8_e5m2");
  if (quant_mode != DynamicQuantMode::pertoken && quant_mode != DynamicQuantMode::pertensor &&
      quant_mode != DynamicQuantMode::perchannel)
    fail(ErrorCode::invalid_argument, op, "quant_mode",
         "quant_mode is " + str(static_cast<std::int64_t>(quant_mode)) +
             " but expected pertoken, pertensor or perchannel");

  Plan p;
  p.cols = x.shape.back();
  p.per_tensor = quant_mode == DynamicQuantMode::pertensor;
  p.per_channel = quant_mode == DynamicQuantMode::perchannel;
  if (p.per_channel && dst_type == QuantDType::quint4x2)
    fail(ErrorCode::invalid_argument, op, "dst_type",
         "dst_type is quint4x2 with quant_mode perchannel but expected qint8, float8_e4m3fn or float8_e5m2 "
         "(perchannel packs no int4)");
  if (p.per_channel && group_index)
    fail(ErrorCode::invalid_argument, op, "group_index",
         "group_index is given with quant_mode perchannel but expected none (perchannel has no experts)");
  // check_view bounds the element count, which is 0 when H == 0 whatever the leading dimensions are: the
  // row count of such an x can still overflow int64 (found by fuzz_ops).
  p.rows = 1;
  for (std::size_t d = 0; d + 1 < x.shape.size(); ++d) {
    if (__builtin_mul_overflow(p.rows, x.shape[d], &p.rows)) {
      if (!p.per_tensor)  // pertoken: scale and offset would have that many elements
        fail(ErrorCode::shape_mismatch, op, "x",
             "x has shape " + shape_str(x.shape) + " whose row count overflows int64");
      p.rows = 0;  // pertensor over an empty x: no rows to visit, outputs [1]
      break;
    }
  }
  p.y_dtype = storage_dtype(dst_type);
  p.y_shape = x.shape;
  if (dst_type == QuantDType::quint4x2) {
    if (p.cols % 8 != 0)
      fail(ErrorCode::shape_mismatch, op, "x",
           "x has shape " + shape_str(x.shape) + " whose last dimension " + str(p.cols) +
               " is not a multiple of 8, but expected a multiple of 8 for dst_type quint4x2");
    p.y_shape.back() = p.cols / 8;
  }
  if (p.per_tensor) {
    p.param_shape = Shape{1};
  } else if (p.per_channel) {
    p.param_shape = Shape(x.shape.begin(), x.shape.end() - 2);
    p.param_shape.push_back(p.cols);
    p.channel_rows = x.shape[x.shape.size() - 2];
    p.channel_batches = 1;
    for (std::size_t d = 0; d + 2 < x.shape.size(); ++d)
      if (__builtin_mul_overflow(p.channel_batches, x.shape[d], &p.channel_batches))
        fail(ErrorCode::shape_mismatch, op, "x",
             "x has shape " + shape_str(x.shape) + " whose batch count overflows int64");
    std::int64_t params = 0;
    if (__builtin_mul_overflow(p.channel_batches, p.cols, &params))
      fail(ErrorCode::shape_mismatch, op, "x",
           "x has shape " + shape_str(x.shape) + " whose scale count (batches x H) overflows int64");
  } else {
    p.param_shape = Shape(x.shape.begin(), x.shape.end() - 1);
  }

  // Option combinations.
  if (group_index && !smooth_scales)
    fail(ErrorCode::invalid_argument, op, "group_index",
         "group_index is given without smooth_scales but expected smooth_scales [E, H] with it");
  if (smooth_scales && p.per_tensor)
    fail(ErrorCode::invalid_argument, op, "quant_mode",
         "quant_mode is pertensor with smooth_scales but expected pertoken (smooth_scales supports only pertoken)");

  // smooth_scales: floating, [H] without group_index, [E, H] with it; perchannel: [S].
  if (smooth_scales && p.per_channel) {
    const ConstTensorView& s = *smooth_scales;
    detail::check_view(op, "smooth_scales", s);
    detail::check_floating(op, "smooth_scales", s.dtype);
    detail::check_shape(op, "smooth_scales", s.shape, Shape{p.channel_rows},
                        "the second-to-last dimension of x, quant_mode perchannel");
  } else if (smooth_scales) {
    const ConstTensorView& s = *smooth_scales;
    detail::check_view(op, "smooth_scales", s);
    detail::check_floating(op, "smooth_scales", s.dtype);
    if (!group_index) {
      if (s.dim() != 1)
        fail(ErrorCode::shape_mismatch, op, "smooth_scales",
             "smooth_scales has shape " + shape_str(s.shape) + " but expected [" + str(p.cols) +
                 "] (1-D, the last dimension of x; 2-D [E, H] needs group_index)");
      detail::check_shape(op, "smooth_scales", s.shape, Shape{p.cols}, "the last dimension of x");
    } else {
      if (s.dim() != 2)
        fail(ErrorCode::shape_mismatch, op, "smooth_scales",
             "smooth_scales has shape " + shape_str(s.shape) + " but expected [E, " + str(p.cols) +
                 "] (2-D, one row per expert, because group_index is given)");
      if (s.shape[1] != p.cols)
        fail(ErrorCode::shape_mismatch, op, "smooth_scales",
             "smooth_scales has shape " + shape_str(s.shape) + " but expected [E, " + str(p.cols) +
                 "] (its last dimension must equal the last dimension of x)");
    }
  }

  // group_index: int32 / int64 [E], E >= 1, non-decreasing row ends in [0, S], last == S.
  if (group_index) {
    const ConstTensorView& g = *group_index;
    detail::check_view(op, "group_index", g);
    if (g.dtype != DType::int32 && g.dtype != DType::int64)
      fail(ErrorCode::dtype_mismatch, op, "group_index",
           "group_index has dtype " + std::string(dtype_name(g.dtype)) + " but expected int32 or int64");
    const std::int64_t experts = smooth_scales->shape[0];
    detail::check_shape(op, "group_index", g.shape, Shape{experts}, "E, the first dimension of smooth_scales");
    if (experts < 1)
      fail(ErrorCode::shape_mismatch, op, "group_index",
           "group_index has shape " + shape_str(g.shape) + " but expected at least 1 expert");
    if (!read_values) return p;  // planning: the row ends are values
    p.group_ends = read_group_index(g);
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::int64_t v = p.group_ends[static_cast<std::size_t>(e)];
      if (v < 0 || v > p.rows)
        fail(ErrorCode::invalid_argument, op, "group_index",
             "group_index[" + str(e) + "] is " + str(v) + " but expected a value in [0, " + str(p.rows) +
                 "] (S, the number of rows of x)");
      if (e > 0 && v < p.group_ends[static_cast<std::size_t>(e - 1)])
        fail(ErrorCode::invalid_argument, op, "group_index",
             "group_index[" + str(e) + "] is " + str(v) + " but expected >= group_index[" + str(e - 1) +
                 "] = " + str(p.group_ends[static_cast<std::size_t>(e - 1)]) + " (non-decreasing row ends)");
    }
    if (p.group_ends.back() != p.rows)
      fail(ErrorCode::invalid_argument, op, "group_index",
           "group_index[" + str(experts - 1) + "] is " + str(p.group_ends.back()) + " but expected " + str(p.rows) +
               " (S, the number of rows of x: the last row end covers every row)");
  }
  return p;
}

// offset: nullptr for the symmetric operator (it has none).
void validate_outputs(std::string_view op, const Plan& p, const TensorView& y, const TensorView& scale,
                      const TensorView* offset, const ConstTensorView& x,
                      const std::optional<ConstTensorView>& smooth_scales,
                      const std::optional<ConstTensorView>& group_index) {
  detail::check_output(op, "y", y, p.y_dtype, p.y_shape,
                       p.y_dtype != DType::int32 ? "the shape of x" : "the shape of x with the last dimension / 8");
  const std::string_view param_what =
      p.per_tensor ? "pertensor" : (p.per_channel ? "x.shape[:-2] + [H], perchannel" : "x.shape[:-1], pertoken");
  detail::check_output(op, "scale", scale, DType::float32, p.param_shape, param_what);
  if (offset != nullptr) detail::check_output(op, "offset", *offset, DType::float32, p.param_shape, param_what);

  struct Buf {
    std::string_view name;
    const void* data;
    std::size_t bytes;
  };
  std::vector<Buf> inputs{{"x", x.data, x.nbytes()}};
  if (smooth_scales) inputs.push_back({"smooth_scales", smooth_scales->data, smooth_scales->nbytes()});
  if (group_index) inputs.push_back({"group_index", group_index->data, group_index->nbytes()});
  std::vector<Buf> outputs{{"y", y.data, y.nbytes()}, {"scale", scale.data, scale.nbytes()}};
  if (offset != nullptr) outputs.push_back({"offset", offset->data, offset->nbytes()});
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    for (const Buf& in : inputs)
      detail::check_no_overlap(op, outputs[o].name, outputs[o].data, outputs[o].bytes, in.name, in.data, in.bytes);
    for (std::size_t k = 0; k < o; ++k)
      detail::check_no_overlap(op, outputs[o].name, outputs[o].data, outputs[o].bytes, outputs[k].name, outputs[k].data,
                               outputs[k].bytes);
  }
}

// Validated: runs the kernel (offset == nullptr: the symmetric operator).
// The device of every argument (outputs: nullptr for the allocating forms).
Device call_device(std::string_view op, const ConstTensorView& x, const std::optional<ConstTensorView>& smooth_scales,
                   const std::optional<ConstTensorView>& group_index, const TensorView* y, const TensorView* scale,
                   const TensorView* offset) {
  return detail::common_device(op, {{"x", x.device},
                                    {"smooth_scales", smooth_scales ? smooth_scales->device : x.device},
                                    {"group_index", group_index ? group_index->device : x.device},
                                    {"y", y ? y->device : x.device},
                                    {"scale", scale ? scale->device : x.device},
                                    {"offset", offset ? offset->device : x.device}});
}

detail::DynamicQuantFn kernel_of(std::string_view op, Device dev) {
  return detail::kernels_for(op, "x", dev).dynamic_quant;
}

void run(detail::DynamicQuantFn kernel, const Plan& p, const TensorView& y, const TensorView& scale,
         const TensorView* offset, const ConstTensorView& x, const std::optional<ConstTensorView>& smooth_scales,
         QuantDType dst_type) {
  // Nothing to write: pertoken over zero rows. (H == 0 with S > 0, and pertensor over zero elements,
  // still produce parameters: rowMax = rowMin = 0.)
  if (!p.per_tensor && !p.per_channel && p.rows == 0) return;
  if (p.per_channel && (p.channel_batches == 0 || p.cols == 0)) return;
  detail::DynamicQuantArgs args{};
  args.dt = x.dtype;
  args.x = x.data;
  args.rows = p.rows;
  args.cols = p.cols;
  args.smooth_dt = smooth_scales ? smooth_scales->dtype : DType::float32;
  args.smooth = smooth_scales ? smooth_scales->data : nullptr;
  args.group_ends = p.group_ends.empty() ? nullptr : p.group_ends.data();
  args.num_groups = static_cast<std::int64_t>(p.group_ends.size());
  args.dst = dst_type;
  args.symmetric = offset == nullptr;
  args.per_tensor = p.per_tensor;
  args.per_channel = p.per_channel;
  args.channel_batches = p.channel_batches;
  args.channel_rows = p.channel_rows;
  args.y = y.data;
  args.scale = static_cast<float*>(scale.data);
  args.offset = offset != nullptr ? static_cast<float*>(offset->data) : nullptr;
  kernel(args);
}

}  // namespace

void dynamic_quant_asymmetric_out(TensorView y, TensorView scale, TensorView offset, ConstTensorView x,
                                  std::optional<ConstTensorView> smooth_scales,
                                  std::optional<ConstTensorView> group_index, QuantDType dst_type,
                                  DynamicQuantMode quant_mode) {
  const Device dev = call_device(kAsymmetricOp, x, smooth_scales, group_index, &y, &scale, &offset);
  const detail::DynamicQuantFn kernel = kernel_of(kAsymmetricOp, dev);
  const Plan p = validate_inputs(kAsymmetricOp, x, smooth_scales, group_index, dst_type, quant_mode);
  validate_outputs(kAsymmetricOp, p, y, scale, &offset, x, smooth_scales, group_index);
  run(kernel, p, y, scale, &offset, x, smooth_scales, dst_type);
}

DynamicQuantResult dynamic_quant_asymmetric(ConstTensorView x, std::optional<ConstTensorView> smooth_scales,
                                            std::optional<ConstTensorView> group_index, QuantDType dst_type,
                                            DynamicQuantMode quant_mode) {
  const Device dev = call_device(kAsymmetricOp, x, smooth_scales, group_index, nullptr, nullptr, nullptr);
  kernel_of(kAsymmetricOp, dev);
  const Plan p = validate_inputs(kAsymmetricOp, x, smooth_scales, group_index, dst_type, quant_mode);
  DynamicQuantResult r{Tensor(p.y_dtype, p.y_shape, dev), Tensor(DType::float32, p.param_shape, dev),
                       Tensor(DType::float32, p.param_shape, dev)};
  dynamic_quant_asymmetric_out(r.y, r.scale, r.offset, x, smooth_scales, group_index, dst_type, quant_mode);
  return r;
}

void dynamic_quant_out(TensorView y, TensorView scale, ConstTensorView x, std::optional<ConstTensorView> smooth_scales,
                       std::optional<ConstTensorView> group_index, QuantDType dst_type, DynamicQuantMode quant_mode) {
  const Device dev = call_device(kSymmetricOp, x, smooth_scales, group_index, &y, &scale, nullptr);
  const detail::DynamicQuantFn kernel = kernel_of(kSymmetricOp, dev);
  const Plan p = validate_inputs(kSymmetricOp, x, smooth_scales, group_index, dst_type, quant_mode);
  validate_outputs(kSymmetricOp, p, y, scale, nullptr, x, smooth_scales, group_index);
  run(kernel, p, y, scale, nullptr, x, smooth_scales, dst_type);
}

DynamicQuantSymmetricResult dynamic_quant(ConstTensorView x, std::optional<ConstTensorView> smooth_scales,
                                          std::optional<ConstTensorView> group_index, QuantDType dst_type,
                                          DynamicQuantMode quant_mode) {
  const Device dev = call_device(kSymmetricOp, x, smooth_scales, group_index, nullptr, nullptr, nullptr);
  kernel_of(kSymmetricOp, dev);
  const Plan p = validate_inputs(kSymmetricOp, x, smooth_scales, group_index, dst_type, quant_mode);
  DynamicQuantSymmetricResult r{Tensor(p.y_dtype, p.y_shape, dev), Tensor(DType::float32, p.param_shape, dev)};
  dynamic_quant_out(r.y, r.scale, x, smooth_scales, group_index, dst_type, quant_mode);
  return r;
}

DynamicQuantShapes plan_dynamic_quant_asymmetric(const TensorSpec& x, const std::optional<TensorSpec>& smooth_scales,
                                                 const std::optional<TensorSpec>& group_index, QuantDType dst_type,
                                                 DynamicQuantMode quant_mode) {
  const Plan p = validate_inputs(kAsymmetricOp, detail::spec_view(x), detail::spec_view(smooth_scales),
                                 detail::spec_view(group_index), dst_type, quant_mode, false);
  return {p.y_dtype, p.y_shape, p.param_shape};
}

DynamicQuantShapes plan_dynamic_quant(const TensorSpec& x, const std::optional<TensorSpec>& smooth_scales,
                                      const std::optional<TensorSpec>& group_index, QuantDType dst_type,
                                      DynamicQuantMode quant_mode) {
  const Plan p = validate_inputs(kSymmetricOp, detail::spec_view(x), detail::spec_view(smooth_scales),
                                 detail::spec_view(group_index), dst_type, quant_mode, false);
  return {p.y_dtype, p.y_shape, p.param_shape};
}

}  // namespace xquant
