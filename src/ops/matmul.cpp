// Quantized matmuls (docs/semantics.md section 9): validation, normalization, dispatch.
//
// Every argument is validated before anything is written (rule 1.7). quant_matmul normalizes the batch
// dimensions of x1 and x2 to one batch index with per-batch matrix offsets (broadcast batches repeat an
// offset) and widens scale / offset / pertoken_scale / bias to per-column float32 / int32 host arrays;
// weight_quant_batchmatmul flattens x's leading dimensions into rows and widens its parameters to
// [G][N] float32. trans_quant_param and convert_weight_to_int4pack are small host-side conversions
// (parameter preparation), run on the CPU; CUDA inputs are copied to the host and the result back.
#include "xquant/matmul.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "core/kernels.hpp"
#include "core/numeric.hpp"
#include "ops/spec.hpp"

namespace xquant {

namespace {

using detail::fail;

std::string str(std::int64_t v) { return std::to_string(v); }
std::string dname(DType dt) { return std::string(dtype_name(dt)); }

// A logical dimension of packed int4 storage (8 per int32 word), checked against overflow.
std::int64_t times8(std::string_view op, std::string_view arg, const ConstTensorView& v, std::int64_t d) {
  if (d > INT64_MAX / 8)
    fail(ErrorCode::shape_mismatch, op, arg,
         std::string(arg) + " has shape " + shape_str(v.shape) +
             " whose logical size (8 int4 per word) overflows int64");
  return d * 8;
}

// ============================== quant_matmul ==============================

constexpr std::string_view kQmm = "quant_matmul";

struct QmmPlan {
  bool int4 = false;
  bool a8w4 = false;          // the A8W4 per-group mode (9.3.1)
  std::int64_t group_k = 0;   // its k group size
  std::int64_t M = 0, K = 0, N = 0, batch = 1;
  Shape out_shape;
  std::vector<std::int64_t> x1_offsets, x2_offsets;  // per output batch, logical elements
  bool bias_batched = false;
};

// Per-column parameter of length [1] or [N] (or [1, 1] / [1, N] where two_d_ok): its length, or a failure.
std::int64_t param_length(std::string_view op, std::string_view arg, const ConstTensorView& v, std::int64_t N,
                          bool two_d_ok, std::string_view what) {
  const bool one_d = v.dim() == 1 && (v.shape[0] == 1 || v.shape[0] == N);
  const bool two_d = two_d_ok && v.dim() == 2 && v.shape[0] == 1 && (v.shape[1] == 1 || v.shape[1] == N);
  if (!one_d && !two_d)
    fail(ErrorCode::shape_mismatch, op, arg,
         std::string(arg) + " has shape " + shape_str(v.shape) + " but expected [1] or [" + str(N) + "]" +
             (two_d_ok ? ", [1, 1] or [1, " + str(N) + "]" : std::string()) + " (" + std::string(what) + ")");
  return v.shape.back();
}

std::string group_str(const std::array<std::int64_t, 3>& g) {
  std::string r(1, '[');  // appended piece by piece (GCC 12's -Wrestrict misfires on "[" + std::string)
  for (std::size_t i = 0; i < 3; ++i) r.append(i ? ", " : "").append(str(g[i]));
  return r.append("]");
}

// The A8W4 per-group mode (9.3.1): x1 int8 [M, K], x2 int32 [K, N / 8] (or [N, K / 8] transposed).
QmmPlan validate_a8w4(const ConstTensorView& x1, const ConstTensorView& x2, const ConstTensorView& scale,
                      const QuantMatmulOptions& o, DType out_dt) {
  QmmPlan p;
  p.a8w4 = true;
  for (const auto& [arg, v] : {std::pair<std::string_view, const ConstTensorView*>{"x1", &x1}, {"x2", &x2}})
    if (v->dim() != 2)
      fail(ErrorCode::shape_mismatch, kQmm, arg,
           std::string(arg) + " has shape " + shape_str(v->shape) + " (rank " + str(v->dim()) +
               ") but expected rank 2 (the A8W4 per-group mode: int8 x1 with int4 x2 has no batch dimensions)");
  p.M = x1.shape[0];
  p.K = x1.shape[1];
  const std::int64_t K2 = o.transpose_x2 ? times8(kQmm, "x2", x2, x2.shape[1]) : x2.shape[0];
  p.N = o.transpose_x2 ? x2.shape[0] : times8(kQmm, "x2", x2, x2.shape[1]);
  if (K2 != p.K)
    fail(ErrorCode::shape_mismatch, kQmm, "x2",
         "x2 has shape " + shape_str(x2.shape) + (o.transpose_x2 ? " (transpose_x2: [N, K / 8])" : " ([K, N / 8])") +
             " so K = " + str(K2) + " but x1 has shape " + shape_str(x1.shape) + " with K = " + str(p.K));
  p.out_shape = Shape{p.M, p.N};
  const auto& g = o.group_sizes;
  if (g[0] > 1 || g[1] > 1 || g[2] == 0 || p.K % g[2] != 0)
    fail(ErrorCode::invalid_argument, kQmm, "group_sizes",
         "group_sizes is " + group_str(g) + " but expected [0 or 1, 0 or 1, G] with G > 0 dividing K = " + str(p.K) +
             " (int8 x1 with int4 x2 is the A8W4 per-group mode)");
  p.group_k = g[2];
  if (out_dt != DType::float16 && out_dt != DType::bfloat16)
    fail(ErrorCode::invalid_argument, kQmm, "output_dtype",
         "output_dtype is " + dname(out_dt) + " but expected float16 or bfloat16 (the A8W4 per-group mode)");
  detail::check_view(kQmm, "scale", scale);
  if (scale.dtype != DType::float32 && scale.dtype != DType::int64)
    fail(ErrorCode::dtype_mismatch, kQmm, "scale",
         "scale has dtype " + dname(scale.dtype) + " but expected float32 or int64 (trans_quant_param), A8W4 mode");
  detail::check_shape(kQmm, "scale", scale.shape, Shape{p.K / p.group_k, p.N},
                      "one value per k group and column: [K / group_sizes[2], N]");
  if (o.offset) {
    detail::check_view(kQmm, "offset", *o.offset);
    detail::check_dtype(kQmm, "offset", o.offset->dtype, DType::float32);
    param_length(kQmm, "offset", *o.offset, p.N, false, "one value, or one per column N of x2");
  }
  if (o.pertoken_scale) {
    const ConstTensorView& t = *o.pertoken_scale;
    detail::check_view(kQmm, "pertoken_scale", t);
    detail::check_dtype(kQmm, "pertoken_scale", t.dtype, DType::float32);
    if (!((t.dim() == 1 && t.shape[0] == p.M) || (t.dim() == 2 && t.shape[0] == p.M && t.shape[1] == 1)))
      fail(ErrorCode::shape_mismatch, kQmm, "pertoken_scale",
           "pertoken_scale has shape " + shape_str(t.shape) + " but expected [" + str(p.M) + "] or [" + str(p.M) +
               ", 1] (one value per row M of x1)");
  }
  if (o.bias)
    fail(ErrorCode::invalid_argument, kQmm, "bias",
         "bias is given but the A8W4 per-group mode (int8 x1, int4 x2) takes none; expected bias=None (its float32 "
         "offset is added before pertoken_scale)");
  p.x1_offsets.assign(1, 0);
  p.x2_offsets.assign(1, 0);
  return p;
}

QmmPlan validate_qmm(const ConstTensorView& x1, const ConstTensorView& x2, const ConstTensorView& scale,
                     const QuantMatmulOptions& o, DType out_dt, bool out_dt_is_out) {
  QmmPlan p;
  // output dtype first: it decides which options are allowed
  if (out_dt != DType::int8 && out_dt != DType::float16 && out_dt != DType::bfloat16 && out_dt != DType::int32)
    fail(out_dt_is_out ? ErrorCode::dtype_mismatch : ErrorCode::invalid_argument, kQmm,
         out_dt_is_out ? "out" : "output_dtype",
         std::string(out_dt_is_out ? "out has dtype " : "output_dtype is ") + dname(out_dt) +
             " but expected int8, float16, bfloat16 or int32");
  // x1, x2: int8 or int32 (int4), the same dtype, rank 2..6
  detail::check_view(kQmm, "x1", x1);
  detail::check_view(kQmm, "x2", x2);
  if (x1.dtype != DType::int8 && x1.dtype != DType::int32)
    fail(ErrorCode::dtype_mismatch, kQmm, "x1",
         "x1 has dtype " + dname(x1.dtype) + " but expected int8, or int32 (words of eight int4)");
  for (std::size_t i = 0; i < 3; ++i)
    if (o.group_sizes[i] < 0)
      fail(ErrorCode::invalid_argument, kQmm, "group_sizes",
           "group_sizes is " + group_str(o.group_sizes) + " but expected non-negative [group_m, group_n, group_k]");
  const bool grouped = o.group_sizes != std::array<std::int64_t, 3>{};
  if (x1.dtype == DType::int8 && x2.dtype == DType::int32 && grouped) return validate_a8w4(x1, x2, scale, o, out_dt);
  if (x2.dtype != x1.dtype)
    fail(ErrorCode::dtype_mismatch, kQmm, "x2",
         "x2 has dtype " + dname(x2.dtype) + " but expected " + dname(x1.dtype) + " (the dtype of x1)" +
             (x1.dtype == DType::int8 ? ", or int32 (int4) with group_sizes [0, 0, G] (the A8W4 per-group mode)"
                                      : ""));
  if (grouped)
    fail(ErrorCode::invalid_argument, kQmm, "group_sizes",
         "group_sizes is " + group_str(o.group_sizes) + " with " + dname(x1.dtype) + " x1 and x2, but expected [0, 0, 0]" +
             " (per-group scales are the A8W4 mode: int8 x1 with int4 (int32) x2)");
  for (const auto& [arg, v] : {std::pair<std::string_view, const ConstTensorView*>{"x1", &x1}, {"x2", &x2}})
    if (v->dim() < 2 || v->dim() > 6)
      fail(ErrorCode::shape_mismatch, kQmm, arg,
           std::string(arg) + " has shape " + shape_str(v->shape) + " (rank " + str(v->dim()) +
               ") but expected rank 2 to 6");
  p.int4 = x1.dtype == DType::int32;
  const std::int64_t r1 = x1.dim(), r2 = x2.dim();
  p.M = x1.shape[r1 - 2];
  p.K = p.int4 ? times8(kQmm, "x1", x1, x1.shape[r1 - 1]) : x1.shape[r1 - 1];
  const std::int64_t a2 = x2.shape[r2 - 2], b2 = x2.shape[r2 - 1];
  const std::int64_t K2 = o.transpose_x2 ? (p.int4 ? times8(kQmm, "x2", x2, b2) : b2) : a2;
  p.N = o.transpose_x2 ? a2 : (p.int4 ? times8(kQmm, "x2", x2, b2) : b2);
  if (K2 != p.K)
    fail(ErrorCode::shape_mismatch, kQmm, "x2",
         "x2 has shape " + shape_str(x2.shape) + (o.transpose_x2 ? " (transpose_x2: [..., N, K" : " ([..., K, N") +
             std::string(p.int4 ? " / 8]" : "]") + ") so K = " + str(K2) + " but x1 has shape " + shape_str(x1.shape) +
             " with K = " + str(p.K));
  // batch dimensions broadcast (NumPy rules)
  const std::int64_t nb1 = r1 - 2, nb2 = r2 - 2, nb = std::max(nb1, nb2);
  Shape bshape(static_cast<std::size_t>(nb));
  for (std::int64_t i = 0; i < nb; ++i) {
    const std::int64_t d1 = i - (nb - nb1) >= 0 ? x1.shape[i - (nb - nb1)] : 1;
    const std::int64_t d2 = i - (nb - nb2) >= 0 ? x2.shape[i - (nb - nb2)] : 1;
    if (d1 != d2 && d1 != 1 && d2 != 1)
      fail(ErrorCode::shape_mismatch, kQmm, "x2",
           "x2 has shape " + shape_str(x2.shape) + " whose batch dimensions do not broadcast with those of x1 " +
               shape_str(x1.shape) + " (" + str(d2) + " vs " + str(d1) + ")");
    bshape[static_cast<std::size_t>(i)] = d1 == 1 ? d2 : d1;
  }
  p.out_shape = bshape;
  p.out_shape.push_back(p.M);
  p.out_shape.push_back(p.N);
  detail::check_view(kQmm, "out", ConstTensorView(&p, DType::int8, p.out_shape));  // the count fits int64
  p.batch = shape_numel(bshape);
  const std::int64_t numel_out = shape_numel(p.out_shape);
  // per-batch offsets (only when there is something to compute)
  if (numel_out > 0) {
    p.x1_offsets.assign(static_cast<std::size_t>(p.batch), 0);
    p.x2_offsets.assign(static_cast<std::size_t>(p.batch), 0);
    const std::int64_t mat1 = p.M * p.K, mat2 = p.K * p.N;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      std::int64_t rem = b, i1 = 0, i2 = 0, s1 = 1, s2 = 1;
      for (std::int64_t i = nb - 1; i >= 0; --i) {
        const std::int64_t d = bshape[static_cast<std::size_t>(i)];
        const std::int64_t idx = rem % d;
        rem /= d;
        const std::int64_t j1 = i - (nb - nb1), j2 = i - (nb - nb2);
        if (j1 >= 0) {
          if (x1.shape[j1] != 1) i1 += idx * s1;
          s1 *= x1.shape[j1];
        }
        if (j2 >= 0) {
          if (x2.shape[j2] != 1) i2 += idx * s2;
          s2 *= x2.shape[j2];
        }
      }
      p.x1_offsets[static_cast<std::size_t>(b)] = i1 * mat1;
      p.x2_offsets[static_cast<std::size_t>(b)] = i2 * mat2;
    }
  }

  // scale: float32 / bfloat16 / int64, [1], [N], [1, 1] or [1, N]
  detail::check_view(kQmm, "scale", scale);
  if (scale.dtype != DType::float32 && scale.dtype != DType::bfloat16 && scale.dtype != DType::int64)
    fail(ErrorCode::dtype_mismatch, kQmm, "scale",
         "scale has dtype " + dname(scale.dtype) + " but expected float32, bfloat16 or int64 (trans_quant_param)");
  param_length(kQmm, "scale", scale, p.N, true, "one value, or one per column N of x2");
  const bool is_int = out_dt == DType::int32;
  // offset: float32 [1] / [N], int8 output and a float scale only
  if (o.offset) {
    detail::check_view(kQmm, "offset", *o.offset);
    detail::check_dtype(kQmm, "offset", o.offset->dtype, DType::float32);
    param_length(kQmm, "offset", *o.offset, p.N, false, "one value, or one per column N of x2");
    if (out_dt != DType::int8)
      fail(ErrorCode::invalid_argument, kQmm, "offset",
           "offset is given but the output dtype is " + dname(out_dt) + "; expected int8 output for an offset");
    if (scale.dtype == DType::int64)
      fail(ErrorCode::invalid_argument, kQmm, "offset",
           "offset is given but scale is int64, which carries its own offset (trans_quant_param); expected no offset");
  }
  // pertoken_scale: float32 [M], not with int32 output
  if (o.pertoken_scale) {
    detail::check_view(kQmm, "pertoken_scale", *o.pertoken_scale);
    detail::check_dtype(kQmm, "pertoken_scale", o.pertoken_scale->dtype, DType::float32);
    detail::check_shape(kQmm, "pertoken_scale", o.pertoken_scale->shape, Shape{p.M}, "one value per row M of x1");
    if (is_int)
      fail(ErrorCode::invalid_argument, kQmm, "pertoken_scale",
           "pertoken_scale is given but the output dtype is int32 (no scaling); expected int8, float16 or bfloat16 "
           "output");
  }
  // bias: int32 / float32 / float16 / bfloat16, [N] or [B, 1, N] (3-D output)
  if (o.bias) {
    const ConstTensorView& bv = *o.bias;
    detail::check_view(kQmm, "bias", bv);
    if (bv.dtype != DType::int32 && !is_floating(bv.dtype))
      fail(ErrorCode::dtype_mismatch, kQmm, "bias",
           "bias has dtype " + dname(bv.dtype) + " but expected int32, float32, float16 or bfloat16");
    if (is_floating(bv.dtype) && out_dt != DType::float16 && out_dt != DType::bfloat16)
      fail(ErrorCode::invalid_argument, kQmm, "bias",
           "bias has dtype " + dname(bv.dtype) + " but the output dtype is " + dname(out_dt) +
               "; a float bias needs float16 or bfloat16 output (else an int32 bias)");
    const bool flat = bv.dim() == 1 && bv.shape[0] == p.N;
    const bool batched = p.out_shape.size() == 3 && bv.dim() == 3 && bv.shape[0] == p.out_shape[0] &&
                         bv.shape[1] == 1 && bv.shape[2] == p.N;
    if (!flat && !batched)
      fail(ErrorCode::shape_mismatch, kQmm, "bias",
           "bias has shape " + shape_str(bv.shape) + " but expected [" + str(p.N) + "]" +
               (p.out_shape.size() == 3 ? " or [" + str(p.out_shape[0]) + ", 1, " + str(p.N) + "]" : std::string()) +
               " (one value per column N" + (p.out_shape.size() == 3 ? ", optionally per batch)" : ")"));
    p.bias_batched = batched && !flat;
  }
  return p;
}

Shape qmm_shape_checked(const ConstTensorView& x1, const ConstTensorView& x2, const ConstTensorView& scale,
                        const QuantMatmulOptions& o, DType out_dt) {
  return validate_qmm(x1, x2, scale, o, out_dt, false).out_shape;
}

// ============================== weight_quant_batchmatmul ==============================

constexpr std::string_view kWqm = "weight_quant_batchmatmul";

struct WqmPlan {
  bool int4 = false;
  std::int64_t M = 0, K = 0, N = 0, G = 1;
  bool per_tensor = false;
  Shape out_shape;
};

WqmPlan validate_wqm(const ConstTensorView& x, const ConstTensorView& w, const ConstTensorView& scale,
                     const WeightQuantMatmulOptions& o) {
  WqmPlan p;
  detail::check_view(kWqm, "x", x);
  if (x.dtype != DType::float16 && x.dtype != DType::bfloat16)
    fail(ErrorCode::dtype_mismatch, kWqm, "x", "x has dtype " + dname(x.dtype) + " but expected float16 or bfloat16");
  if (x.dim() < 2)
    fail(ErrorCode::shape_mismatch, kWqm, "x",
         "x has shape " + shape_str(x.shape) + " (rank " + str(x.dim()) + ") but expected rank >= 2 ([..., M, K])");
  detail::check_view(kWqm, "weight", w);
  if (w.dtype != DType::int8 && w.dtype != DType::int32)
    fail(ErrorCode::dtype_mismatch, kWqm, "weight",
         "weight has dtype " + dname(w.dtype) + " but expected int8, or int32 (words of eight int4)");
  if (w.dim() != 2)
    fail(ErrorCode::shape_mismatch, kWqm, "weight",
         "weight has shape " + shape_str(w.shape) + " (rank " + str(w.dim()) + ") but expected rank 2");
  p.int4 = w.dtype == DType::int32;
  p.K = x.shape.back();
  const std::int64_t wk =
      o.transpose_weight ? (p.int4 ? times8(kWqm, "weight", w, w.shape[1]) : w.shape[1]) : w.shape[0];
  p.N = o.transpose_weight ? w.shape[0] : (p.int4 ? times8(kWqm, "weight", w, w.shape[1]) : w.shape[1]);
  if (wk != p.K)
    fail(ErrorCode::shape_mismatch, kWqm, "weight",
         "weight has shape " + shape_str(w.shape) + (o.transpose_weight ? " (transpose_weight: [N, K" : " ([K, N") +
             std::string(p.int4 ? " / 8]" : "]") + ") so K = " + str(wk) + " but x has shape " + shape_str(x.shape) +
             " with K = " + str(p.K));
  p.out_shape = x.shape;
  p.out_shape.back() = p.N;
  detail::check_view(kWqm, "out", ConstTensorView(&p, DType::int8, p.out_shape));  // the count fits int64
  p.M = p.K == 0 ? shape_numel(Shape(x.shape.begin(), x.shape.end() - 1)) : x.numel() / p.K;

  // antiquant_group_size: 0, or a multiple of 32 in [32, K - 1]
  const std::int64_t gs = o.antiquant_group_size;
  if (gs != 0 && (gs < 32 || gs % 32 != 0 || gs > p.K - 1))
    fail(ErrorCode::invalid_argument, kWqm, "antiquant_group_size",
         "antiquant_group_size is " + str(gs) +
             " but expected 0, or a multiple of 32 in [32, K - 1] with K = " + str(p.K));
  // antiquant_scale: x's dtype; [1], [1, 1], [N], [1, N] or [ceil(K / gs), N]
  detail::check_view(kWqm, "antiquant_scale", scale);
  if (scale.dtype != x.dtype)
    fail(ErrorCode::dtype_mismatch, kWqm, "antiquant_scale",
         "antiquant_scale has dtype " + dname(scale.dtype) + " but expected " + dname(x.dtype) + " (the dtype of x)");
  if (gs != 0) {
    p.G = (p.K + gs - 1) / gs;
    detail::check_shape(kWqm, "antiquant_scale", scale.shape, Shape{p.G, p.N},
                        "per group: [ceil(K / antiquant_group_size), N]");
  } else {
    param_length(kWqm, "antiquant_scale", scale, p.N, true,
                 "per tensor or per column N; a per-group scale needs antiquant_group_size");
    p.per_tensor = scale.shape.back() == 1 && p.N != 1;
  }
  if (o.antiquant_offset) {
    detail::check_view(kWqm, "antiquant_offset", *o.antiquant_offset);
    detail::check_dtype(kWqm, "antiquant_offset", o.antiquant_offset->dtype, scale.dtype);
    detail::check_shape(kWqm, "antiquant_offset", o.antiquant_offset->shape, scale.shape,
                        "the shape of antiquant_scale");
  }
  if (o.bias) {
    detail::check_view(kWqm, "bias", *o.bias);
    detail::check_floating(kWqm, "bias", o.bias->dtype);
    const ConstTensorView& b = *o.bias;
    if (!((b.dim() == 1 && b.shape[0] == p.N) || (b.dim() == 2 && b.shape[0] == 1 && b.shape[1] == p.N)))
      fail(ErrorCode::shape_mismatch, kWqm, "bias",
           "bias has shape " + shape_str(b.shape) + " but expected [" + str(p.N) + "] or [1, " + str(p.N) + "]");
  }
  return p;
}

// Widened float32 copy of n values of a (host) view.
std::vector<float> widen(const ConstTensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  for (std::int64_t i = 0; i < v.numel(); ++i)
    out[static_cast<std::size_t>(i)] = detail::load_float(v.dtype, v.data, i);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------

Shape quant_matmul_output_shape(ConstTensorView x1, ConstTensorView x2, ConstTensorView scale,
                                const QuantMatmulOptions& options, DType output_dtype) {
  return qmm_shape_checked(x1, x2, scale, options, output_dtype);
}

void quant_matmul_out(TensorView out, ConstTensorView x1, ConstTensorView x2, ConstTensorView scale,
                      const QuantMatmulOptions& o) {
  const Device dev =
      detail::common_device(kQmm, {{"x1", x1.device},
                                   {"x2", x2.device},
                                   {"scale", scale.device},
                                   {"offset", o.offset ? o.offset->device : x1.device},
                                   {"pertoken_scale", o.pertoken_scale ? o.pertoken_scale->device : x1.device},
                                   {"bias", o.bias ? o.bias->device : x1.device},
                                   {"out", out.device}});
  const auto kernel = detail::kernels_for(kQmm, "x1", dev).quant_matmul;
  detail::check_view(kQmm, "out", out);
  const QmmPlan p = validate_qmm(x1, x2, scale, o, out.dtype, true);
  detail::check_shape(kQmm, "out", out.shape, p.out_shape, "broadcast batch dimensions of x1 and x2, then [M, N]");
  const std::size_t ob = out.nbytes();
  detail::check_no_overlap(kQmm, "out", out.data, ob, "x1", x1.data, x1.nbytes());
  detail::check_no_overlap(kQmm, "out", out.data, ob, "x2", x2.data, x2.nbytes());
  detail::check_no_overlap(kQmm, "out", out.data, ob, "scale", scale.data, scale.nbytes());
  if (o.offset) detail::check_no_overlap(kQmm, "out", out.data, ob, "offset", o.offset->data, o.offset->nbytes());
  if (o.pertoken_scale)
    detail::check_no_overlap(kQmm, "out", out.data, ob, "pertoken_scale", o.pertoken_scale->data,
                             o.pertoken_scale->nbytes());
  if (o.bias) detail::check_no_overlap(kQmm, "out", out.data, ob, "bias", o.bias->data, o.bias->nbytes());
  if (out.numel() == 0) return;

  // Parameters, widened on the host (CUDA parameters are copied first).
  const std::int64_t N = p.N, M = p.M;
  const detail::HostCopy sh(scale);
  std::vector<float> s(static_cast<std::size_t>(p.a8w4 ? (p.K / p.group_k) * N : N)), off;
  const bool one = scale.numel() == 1;
  if (p.a8w4) {  // [K / G][N]: float32, or the scale value of each int64 word (its offset field is not used)
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(s.size()); ++i) {
      if (scale.dtype == DType::int64) {
        std::uint64_t w;
        std::memcpy(&w, static_cast<const std::uint64_t*>(sh.view().data) + i, 8);
        s[static_cast<std::size_t>(i)] = detail::int64_scale_value(w);
      } else {
        s[static_cast<std::size_t>(i)] = detail::load_float(DType::float32, sh.view().data, i);
      }
    }
  } else if (scale.dtype == DType::int64) {
    off.resize(static_cast<std::size_t>(N));  // an int64 scale always carries an offset (0 when none was given)
    for (std::int64_t n = 0; n < N; ++n) {
      std::uint64_t w;
      std::memcpy(&w, static_cast<const std::uint64_t*>(sh.view().data) + (one ? 0 : n), 8);
      s[static_cast<std::size_t>(n)] = detail::int64_scale_value(w);
      off[static_cast<std::size_t>(n)] = detail::int64_scale_offset(w);
    }
  } else {
    for (std::int64_t n = 0; n < N; ++n)
      s[static_cast<std::size_t>(n)] = detail::load_float(scale.dtype, sh.view().data, one ? 0 : n);
  }
  if (o.offset) {
    const detail::HostCopy oh(*o.offset);
    off.resize(static_cast<std::size_t>(N));
    const bool o1 = o.offset->numel() == 1;
    for (std::int64_t n = 0; n < N; ++n)
      off[static_cast<std::size_t>(n)] = detail::load_float(DType::float32, oh.view().data, o1 ? 0 : n);
  }
  std::vector<float> pt;
  if (o.pertoken_scale) {
    const detail::HostCopy ph(*o.pertoken_scale);
    pt.resize(static_cast<std::size_t>(M));
    if (M > 0) std::memcpy(pt.data(), ph.view().data, static_cast<std::size_t>(M) * sizeof(float));
  }
  std::vector<std::int32_t> bias_i;
  std::vector<float> bias_f;
  if (o.bias) {
    const detail::HostCopy bh(*o.bias);
    const std::int64_t nb = o.bias->numel();
    if (o.bias->dtype == DType::int32) {
      bias_i.resize(static_cast<std::size_t>(nb));
      std::memcpy(bias_i.data(), bh.view().data, static_cast<std::size_t>(nb) * 4);
    } else {
      bias_f = widen(bh.view());
    }
  }
  detail::QuantMatmulArgs a{};
  a.int4 = p.int4;
  a.x1 = x1.data;
  a.x2 = x2.data;
  a.transpose_x2 = o.transpose_x2;
  a.batch = p.batch;
  a.M = M;
  a.K = p.K;
  a.N = N;
  a.x1_offsets = p.x1_offsets.data();
  a.x2_offsets = p.x2_offsets.data();
  a.out = out.data;
  a.epilogue.out_dt = out.dtype;
  a.epilogue.scale = s.data();
  a.epilogue.offset = off.empty() ? nullptr : off.data();
  a.epilogue.pertoken = o.pertoken_scale ? pt.data() : nullptr;
  a.epilogue.bias_int = bias_i.empty() ? nullptr : bias_i.data();
  a.epilogue.bias_float = bias_f.empty() ? nullptr : bias_f.data();
  a.epilogue.bias_stride = p.bias_batched ? N : 0;
  if (p.a8w4) {
    a.epilogue.scale = nullptr;
    a.group_k = p.group_k;
    a.group_scale = s.data();
  }
  kernel(a);
}

Tensor quant_matmul(ConstTensorView x1, ConstTensorView x2, ConstTensorView scale, const QuantMatmulOptions& o,
                    DType output_dtype) {
  const Shape shape = qmm_shape_checked(x1, x2, scale, o, output_dtype);  // validate before allocating
  const Device dev =
      detail::common_device(kQmm, {{"x1", x1.device},
                                   {"x2", x2.device},
                                   {"scale", scale.device},
                                   {"offset", o.offset ? o.offset->device : x1.device},
                                   {"pertoken_scale", o.pertoken_scale ? o.pertoken_scale->device : x1.device},
                                   {"bias", o.bias ? o.bias->device : x1.device}});
  Tensor out(output_dtype, shape, dev);
  quant_matmul_out(out, x1, x2, scale, o);
  return out;
}

// ---------------------------------------------------------------------------------------------------------

Shape weight_quant_batchmatmul_output_shape(ConstTensorView x, ConstTensorView weight, ConstTensorView antiquant_scale,
                                            const WeightQuantMatmulOptions& options) {
  return validate_wqm(x, weight, antiquant_scale, options).out_shape;
}

void weight_quant_batchmatmul_out(TensorView out, ConstTensorView x, ConstTensorView weight,
                                  ConstTensorView antiquant_scale, const WeightQuantMatmulOptions& o) {
  const Device dev =
      detail::common_device(kWqm, {{"x", x.device},
                                   {"weight", weight.device},
                                   {"antiquant_scale", antiquant_scale.device},
                                   {"antiquant_offset", o.antiquant_offset ? o.antiquant_offset->device : x.device},
                                   {"bias", o.bias ? o.bias->device : x.device},
                                   {"out", out.device}});
  const auto kernel = detail::kernels_for(kWqm, "x", dev).weight_quant_matmul;
  const WqmPlan p = validate_wqm(x, weight, antiquant_scale, o);
  detail::check_output(kWqm, "out", out, x.dtype, p.out_shape, "x's leading dimensions, then N");
  const std::size_t ob = out.nbytes();
  detail::check_no_overlap(kWqm, "out", out.data, ob, "x", x.data, x.nbytes());
  detail::check_no_overlap(kWqm, "out", out.data, ob, "weight", weight.data, weight.nbytes());
  detail::check_no_overlap(kWqm, "out", out.data, ob, "antiquant_scale", antiquant_scale.data,
                           antiquant_scale.nbytes());
  if (o.antiquant_offset)
    detail::check_no_overlap(kWqm, "out", out.data, ob, "antiquant_offset", o.antiquant_offset->data,
                             o.antiquant_offset->nbytes());
  if (o.bias) detail::check_no_overlap(kWqm, "out", out.data, ob, "bias", o.bias->data, o.bias->nbytes());
  if (out.numel() == 0) return;

  // [G][N] float32 parameters (per tensor: expanded to [1][N])
  const std::int64_t N = p.N, G = p.G;
  auto expand = [&](const ConstTensorView& v) {
    const detail::HostCopy h(v);
    std::vector<float> r(static_cast<std::size_t>(G * N));
    const bool one = v.numel() == 1;
    for (std::int64_t i = 0; i < G * N; ++i)
      r[static_cast<std::size_t>(i)] = detail::load_float(v.dtype, h.view().data, one ? 0 : i);
    return r;
  };
  const std::vector<float> s = expand(antiquant_scale);
  const std::vector<float> off = o.antiquant_offset ? expand(*o.antiquant_offset) : std::vector<float>{};
  std::vector<float> bias;
  if (o.bias) {
    const detail::HostCopy bh(*o.bias);
    bias = widen(bh.view());
  }
  detail::WeightQuantMatmulArgs a{};
  a.dt = x.dtype;
  a.x = x.data;
  a.M = p.M;
  a.K = p.K;
  a.N = N;
  a.int4 = p.int4;
  a.transpose_weight = o.transpose_weight;
  a.weight = weight.data;
  a.scale = s.data();
  a.offset = o.antiquant_offset ? off.data() : nullptr;
  a.group_size = o.antiquant_group_size != 0 ? o.antiquant_group_size : std::max<std::int64_t>(p.K, 1);
  a.bias = o.bias ? bias.data() : nullptr;
  a.out = out.data;
  kernel(a);
}

Tensor weight_quant_batchmatmul(ConstTensorView x, ConstTensorView weight, ConstTensorView antiquant_scale,
                                const WeightQuantMatmulOptions& o) {
  const WqmPlan p = validate_wqm(x, weight, antiquant_scale, o);
  const Device dev =
      detail::common_device(kWqm, {{"x", x.device},
                                   {"weight", weight.device},
                                   {"antiquant_scale", antiquant_scale.device},
                                   {"antiquant_offset", o.antiquant_offset ? o.antiquant_offset->device : x.device},
                                   {"bias", o.bias ? o.bias->device : x.device}});
  Tensor out(x.dtype, p.out_shape, dev);
  weight_quant_batchmatmul_out(out, x, weight, antiquant_scale, o);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// trans_quant_param

namespace {
constexpr std::string_view kTqp = "trans_quant_param";

Shape validate_tqp(const ConstTensorView& scale, const std::optional<ConstTensorView>& offset, int round_mode) {
  if (round_mode != 0 && round_mode != 1)
    fail(ErrorCode::invalid_argument, kTqp, "round_mode",
         "round_mode is " + std::to_string(round_mode) + " but expected 0 (truncate) or 1 (round)");
  detail::check_view(kTqp, "scale", scale);
  detail::check_dtype(kTqp, "scale", scale.dtype, DType::float32);
  if (!(scale.dim() == 1 || (scale.dim() == 2 && scale.shape[0] == 1)))
    fail(ErrorCode::shape_mismatch, kTqp, "scale",
         "scale has shape " + shape_str(scale.shape) + " but expected 1-D [t] or 2-D [1, n]");
  Shape out = scale.shape;
  if (offset) {
    detail::check_view(kTqp, "offset", *offset);
    detail::check_dtype(kTqp, "offset", offset->dtype, DType::float32);
    if (scale.dim() == 2) {
      detail::check_shape(kTqp, "offset", offset->shape, scale.shape, "the shape of a 2-D scale");
    } else {
      const std::int64_t t = scale.shape[0];
      if (offset->dim() != 1 || !(offset->shape[0] == t || offset->shape[0] == 1 || t == 1))
        fail(ErrorCode::shape_mismatch, kTqp, "offset",
             "offset has shape " + shape_str(offset->shape) + " but expected 1-D [" + str(t) + "] or [1]" +
                 (t == 1 ? " or any 1-D length (scale has one value)" : ""));
      out = Shape{std::max(t, offset->shape[0])};
      if (t == 0 || offset->shape[0] == 0) out = Shape{0};
    }
  }
  return out;
}
}  // namespace

void trans_quant_param_out(TensorView out, ConstTensorView scale, std::optional<ConstTensorView> offset,
                           int round_mode) {
  const Device dev = detail::common_device(
      kTqp, {{"scale", scale.device}, {"offset", offset ? offset->device : scale.device}, {"out", out.device}});
  const Shape shape = validate_tqp(scale, offset, round_mode);
  detail::check_output(kTqp, "out", out, DType::int64, shape, "the shape of scale, broadcast with offset");
  detail::check_no_overlap(kTqp, "out", out.data, out.nbytes(), "scale", scale.data, scale.nbytes());
  if (offset) detail::check_no_overlap(kTqp, "out", out.data, out.nbytes(), "offset", offset->data, offset->nbytes());
  const std::int64_t n = shape_numel(shape);
  if (n == 0) return;
  const detail::HostCopy sh(scale);
  std::optional<detail::HostCopy> oh;
  if (offset) oh.emplace(*offset);
  std::vector<std::uint64_t> words(static_cast<std::size_t>(n));
  const auto* s = static_cast<const float*>(sh.view().data);
  const float* of = offset ? static_cast<const float*>(oh->view().data) : nullptr;
  const bool s1 = scale.numel() == 1, o1 = offset && offset->numel() == 1;
  for (std::int64_t i = 0; i < n; ++i)
    words[static_cast<std::size_t>(i)] =
        detail::trans_quant_param_word(s[s1 ? 0 : i], of != nullptr, of != nullptr ? of[o1 ? 0 : i] : 0.0f, round_mode);
  if (dev.is_cuda()) {
    detail::host_to_device(dev, out.data, words.data(), words.size() * 8, current_cuda_stream());
  } else {
    std::memcpy(out.data, words.data(), words.size() * 8);
  }
}

Tensor trans_quant_param(ConstTensorView scale, std::optional<ConstTensorView> offset, int round_mode) {
  const Shape shape = validate_tqp(scale, offset, round_mode);
  const Device dev =
      detail::common_device(kTqp, {{"scale", scale.device}, {"offset", offset ? offset->device : scale.device}});
  Tensor out(DType::int64, shape, dev);
  trans_quant_param_out(out, scale, offset, round_mode);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// convert_weight_to_int4pack

namespace {
constexpr std::string_view kPack = "convert_weight_to_int4pack";

Shape validate_pack(const ConstTensorView& w) {
  detail::check_view(kPack, "weight", w);
  detail::check_dtype(kPack, "weight", w.dtype, DType::int32);
  if (w.dim() < 1)
    fail(ErrorCode::shape_mismatch, kPack, "weight",
         "weight has shape " + shape_str(w.shape) + " (rank 0) but expected rank >= 1");
  if (w.shape.back() % 8 != 0)
    fail(ErrorCode::shape_mismatch, kPack, "weight",
         "weight has shape " + shape_str(w.shape) + " but expected a last dimension that is a multiple of 8");
  Shape out = w.shape;
  out.back() /= 8;
  return out;
}
}  // namespace

void convert_weight_to_int4pack_out(TensorView out, ConstTensorView weight) {
  const Device dev = detail::common_device(kPack, {{"weight", weight.device}, {"out", out.device}});
  const Shape shape = validate_pack(weight);
  detail::check_output(kPack, "out", out, DType::int32, shape, "weight's shape with the last dimension / 8");
  detail::check_no_overlap(kPack, "out", out.data, out.nbytes(), "weight", weight.data, weight.nbytes());
  const std::int64_t n = weight.numel();
  if (n == 0) return;
  const detail::HostCopy wh(weight);
  const auto* v = static_cast<const std::int32_t*>(wh.view().data);
  for (std::int64_t i = 0; i < n; ++i)  // every value checked before anything is written
    if (v[i] < -8 || v[i] > 7)
      fail(ErrorCode::invalid_argument, kPack, "weight",
           "weight has the value " + std::to_string(v[i]) + " at flat index " + str(i) +
               " but expected every value in [-8, 7] (int4)");
  std::vector<std::int32_t> words(static_cast<std::size_t>(n / 8));
  for (std::int64_t k = 0; k < n / 8; ++k) {
    std::uint32_t w = 0;
    for (int j = 0; j < 8; ++j)
      w |= (static_cast<std::uint32_t>(v[8 * k + j]) & 0xFu) << (4 * j);  // element 8k + j -> bits [4j, 4j + 3]
    words[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(w);
  }
  if (dev.is_cuda()) {
    detail::host_to_device(dev, out.data, words.data(), words.size() * 4, current_cuda_stream());
  } else {
    std::memcpy(out.data, words.data(), words.size() * 4);
  }
}

Tensor convert_weight_to_int4pack(ConstTensorView weight) {
  const Shape shape = validate_pack(weight);
  Tensor out(DType::int32, shape, weight.device);
  convert_weight_to_int4pack_out(out, weight);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// planning (xquant/plan.hpp): the same validation on dtypes and shapes

Shape plan_quant_matmul(const TensorSpec& x1, const TensorSpec& x2, const TensorSpec& scale,
                        const std::optional<TensorSpec>& offset, const std::optional<TensorSpec>& pertoken_scale,
                        const std::optional<TensorSpec>& bias, bool transpose_x2, DType output_dtype,
                        const std::array<std::int64_t, 3>& group_sizes) {
  const QuantMatmulOptions o{.offset = detail::spec_view(offset),
                             .pertoken_scale = detail::spec_view(pertoken_scale),
                             .bias = detail::spec_view(bias),
                             .transpose_x2 = transpose_x2,
                             .group_sizes = group_sizes};
  return qmm_shape_checked(detail::spec_view(x1), detail::spec_view(x2), detail::spec_view(scale), o, output_dtype);
}

Shape plan_weight_quant_batchmatmul(const TensorSpec& x, const TensorSpec& weight, const TensorSpec& antiquant_scale,
                                    const std::optional<TensorSpec>& antiquant_offset,
                                    const std::optional<TensorSpec>& bias, std::int64_t antiquant_group_size,
                                    bool transpose_weight) {
  const WeightQuantMatmulOptions o{.antiquant_offset = detail::spec_view(antiquant_offset),
                                   .bias = detail::spec_view(bias),
                                   .antiquant_group_size = antiquant_group_size,
                                   .transpose_weight = transpose_weight};
  return weight_quant_batchmatmul_output_shape(detail::spec_view(x), detail::spec_view(weight),
                                               detail::spec_view(antiquant_scale), o);
}

Shape plan_trans_quant_param(const TensorSpec& scale, const std::optional<TensorSpec>& offset, int round_mode) {
  return validate_tqp(detail::spec_view(scale), detail::spec_view(offset), round_mode);
}

Shape plan_convert_weight_to_int4pack(const TensorSpec& weight) { return validate_pack(detail::spec_view(weight)); }

}  // namespace xquant
