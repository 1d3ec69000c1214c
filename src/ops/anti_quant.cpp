// npu_anti_quant (SPEC section 7): validation, normalization to [outer, channels, inner], dispatch.
//
// Every argument is validated before anything is written (SPEC rule 6). The logical elements of x (8 per
// int32 word for quint4x2) are normalized to [rows, H, 1] when scale has H elements, or to [1, 1, numel]
// for a single scale; the per-channel (scale, offset) pairs are widened to float32 once.
#include "xquant/anti_quant.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "core/kernels.hpp"
#include "core/numeric.hpp"
#include "ops/spec.hpp"
#include "xquant/plan.hpp"

namespace xquant {

namespace {

using detail::fail;

constexpr std::string_view kOp = "anti_quant";

std::string str(std::int64_t v) { return std::to_string(v); }

struct Plan {
  Shape out_shape;  // x's logical shape
  ChannelLayout layout;
};

Plan validate_inputs(const ConstTensorView& x, const ConstTensorView& scale,
                     const std::optional<ConstTensorView>& offset, QuantDType src_dtype) {
  if (src_dtype != QuantDType::qint8 && src_dtype != QuantDType::quint4x2)
    fail(ErrorCode::invalid_argument, kOp, "src_dtype",
         "src_dtype is " + std::string(quant_dtype_name(src_dtype)) + " but expected qint8 or quint4x2");
  const bool int4 = src_dtype == QuantDType::quint4x2;
  // x: int8 (qint8) or int32 words (quint4x2), rank >= 1.
  detail::check_view(kOp, "x", x);
  if (int4 && x.dtype != DType::int32)
    fail(ErrorCode::dtype_mismatch, kOp, "x",
         "x has dtype " + std::string(dtype_name(x.dtype)) +
             " but expected int32 (words of eight int4 values) for src_dtype quint4x2");
  if (!int4 && x.dtype != DType::int8)
    fail(ErrorCode::dtype_mismatch, kOp, "x",
         "x has dtype " + std::string(dtype_name(x.dtype)) + " but expected int8 for src_dtype qint8");
  if (x.dim() < 1)
    fail(ErrorCode::shape_mismatch, kOp, "x", "x has shape " + shape_str(x.shape) + " (rank 0) but expected rank >= 1");
  Plan p;
  p.out_shape = x.shape;
  if (int4) {
    if (x.shape.back() > INT64_MAX / 8)
      fail(ErrorCode::shape_mismatch, kOp, "x",
           "x has shape " + shape_str(x.shape) + " whose logical last dimension (8 int4 per word) overflows int64");
    p.out_shape.back() *= 8;
    detail::check_view(kOp, "x", ConstTensorView(x.data, DType::int8, p.out_shape));  // logical count fits
  }
  const std::int64_t H = p.out_shape.back();

  // scale: 1-D [1] or [H], float32 or bfloat16.
  detail::check_view(kOp, "scale", scale);
  if (scale.dtype != DType::float32 && scale.dtype != DType::bfloat16)
    fail(ErrorCode::dtype_mismatch, kOp, "scale",
         "scale has dtype " + std::string(dtype_name(scale.dtype)) + " but expected float32 or bfloat16");
  if (scale.dim() != 1 || (scale.shape[0] != 1 && scale.shape[0] != H))
    fail(ErrorCode::shape_mismatch, kOp, "scale",
         "scale has shape " + shape_str(scale.shape) + " but expected [1] or [" + str(H) +
             "] (1-D, one value or one per element of the logical last dimension of x)");
  // offset: the same shape and dtype as scale.
  if (offset) {
    detail::check_view(kOp, "offset", *offset);
    detail::check_dtype(kOp, "offset", offset->dtype, scale.dtype);
    detail::check_shape(kOp, "offset", offset->shape, scale.shape, "the shape of scale");
  }
  const std::int64_t numel = shape_numel(p.out_shape);
  p.layout = scale.shape[0] == 1 && H != 1 ? ChannelLayout{1, 1, numel} : ChannelLayout{H == 0 ? 0 : numel / H, H, 1};
  return p;
}

void check_dst(std::string_view arg, DType dt, bool is_out) {
  if (!is_floating(dt))
    fail(is_out ? ErrorCode::dtype_mismatch : ErrorCode::invalid_argument, kOp, arg,
         std::string(arg) + (is_out ? " has dtype " : " is ") + std::string(dtype_name(dt)) +
             " but expected float16, bfloat16 or float32");
}

}  // namespace

void anti_quant_out(TensorView out, ConstTensorView x, ConstTensorView scale, std::optional<ConstTensorView> offset,
                    QuantDType src_dtype) {
  const Device dev = detail::common_device(
      kOp,
      {{"x", x.device}, {"scale", scale.device}, {"offset", offset ? offset->device : x.device}, {"out", out.device}});
  const auto kernel = detail::kernels_for(kOp, "x", dev).anti_quant;
  const Plan p = validate_inputs(x, scale, offset, src_dtype);
  detail::check_view(kOp, "out", out);
  check_dst("out", out.dtype, true);
  detail::check_shape(
      kOp, "out", out.shape, p.out_shape,
      src_dtype == QuantDType::quint4x2 ? "the logical shape of x: its last dimension * 8" : "the shape of x");
  detail::check_no_overlap(kOp, "out", out.data, out.nbytes(), "x", x.data, x.nbytes());
  detail::check_no_overlap(kOp, "out", out.data, out.nbytes(), "scale", scale.data, scale.nbytes());
  if (offset) detail::check_no_overlap(kOp, "out", out.data, out.nbytes(), "offset", offset->data, offset->nbytes());
  if (p.layout.numel() == 0) return;

  // Parameters are read on the host (a CUDA scale / offset is copied).
  const detail::HostCopy scale_host(scale);
  std::optional<detail::HostCopy> offset_host;
  if (offset) offset_host.emplace(*offset);
  const ConstTensorView& sh = scale_host.view();
  // Small calls keep their parameters on the stack (no allocation per call).
  constexpr std::int64_t kStackChannels = 512;
  detail::AntiQuantParams stack_params[kStackChannels];
  std::unique_ptr<detail::AntiQuantParams[]> heap_params;  // default-initialized: every pair is written below
  detail::AntiQuantParams* params = stack_params;
  if (p.layout.channels > kStackChannels) {
    heap_params.reset(new detail::AntiQuantParams[static_cast<std::size_t>(p.layout.channels)]);
    params = heap_params.get();
  }
  const std::int64_t C = p.layout.channels;
  const ConstTensorView* oh = offset_host ? &offset_host->view() : nullptr;
  if (sh.dtype == DType::float32 && (!oh || oh->dtype == DType::float32)) {  // the common case, vectorizable
    const auto* s = static_cast<const float*>(sh.data);
    if (oh) {
      const auto* o = static_cast<const float*>(oh->data);
      for (std::int64_t c = 0; c < C; ++c) params[c] = detail::init_anti_quant_params(s[c], o[c]);
    } else {
      for (std::int64_t c = 0; c < C; ++c) params[c] = detail::init_anti_quant_params(s[c], 0.0f);
    }
  } else {
    for (std::int64_t c = 0; c < C; ++c)
      params[c] = detail::init_anti_quant_params(detail::load_float(sh.dtype, sh.data, c),
                                                 oh ? detail::load_float(oh->dtype, oh->data, c) : 0.0f);
  }
  detail::AntiQuantArgs args{};
  args.src = src_dtype;
  args.x = x.data;
  args.dt = out.dtype;
  args.out = out.data;
  args.layout = p.layout;
  args.params = params;
  kernel(args);
}

Tensor anti_quant(ConstTensorView x, ConstTensorView scale, std::optional<ConstTensorView> offset, DType dst_dtype,
                  QuantDType src_dtype) {
  const Plan p = validate_inputs(x, scale, offset, src_dtype);  // validate before allocating
  check_dst("dst_dtype", dst_dtype, false);
  detail::common_device(kOp,
                        {{"x", x.device}, {"scale", scale.device}, {"offset", offset ? offset->device : x.device}});
  Tensor out(dst_dtype, p.out_shape, x.device);
  anti_quant_out(out, x, scale, offset, src_dtype);
  return out;
}

Shape plan_anti_quant(const TensorSpec& x, const TensorSpec& scale, const std::optional<TensorSpec>& offset,
                      QuantDType src_dtype) {
  return validate_inputs(detail::spec_view(x), detail::spec_view(scale), detail::spec_view(offset), src_dtype)
      .out_shape;
}

}  // namespace xquant
