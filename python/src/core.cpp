// xquant._core: the nanobind bridge between NumPy arrays (and other DLPack producers of host memory) and the
// xquant C++ operators. It needs no torch: torch tensors go through the torch extension xquant._torch_ext
// (python/src/torch_ext.cpp), which reaches the library held here through the capsule of core_api.hpp.
//
// Deliberately thin. Every function takes its outputs as arrays allocated by the Python layer, wraps every argument as
// an xquant view without copying (DLPack / buffer protocol through nb::ndarray), releases the GIL and calls the C++
// out-variant, which validates everything before writing anything. Argument names and operator names in the messages
// below match the C++ library's, so the Python user sees one vocabulary.
//
// Dtypes: DLPack float32 / float16 / bfloat16 / int8 / uint8 / int32 / int64 map to xquant::DType. xquant
// has no uint16 dtype, so uint16 storage is read as bfloat16 bits: that is how the Python layer passes
// NumPy arrays of ml_dtypes.bfloat16 (viewed as uint16), after rejecting genuine uint16 user input.
//
// Devices: host memory only (device_of).
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core_api.hpp"
#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace nb = nanobind;

namespace {

// Arrays in host memory; device_of() refuses the others.
using Array = nb::ndarray<>;             // written by the operator
using ConstArray = nb::ndarray<nb::ro>;  // only read
using xquant::ConstTensorView;
using xquant::Device;
using xquant::DType;
using xquant::Shape;
using xquant::TensorView;

std::string prefix(const char* op) { return std::string("xquant::") + op + ": "; }

std::string dlpack_dtype_str(nb::dlpack::dtype dt) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      break;
  }
  return kind + std::to_string(static_cast<int>(dt.bits));
}

DType to_dtype(nb::dlpack::dtype dt, const char* op, const char* arg) {
  if (dt.lanes == 1) {
    switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
      case nb::dlpack::dtype_code::Float:
        if (dt.bits == 32) return DType::float32;
        if (dt.bits == 16) return DType::float16;
        break;
      case nb::dlpack::dtype_code::Bfloat:
        if (dt.bits == 16) return DType::bfloat16;
        break;
      case nb::dlpack::dtype_code::Int:
        if (dt.bits == 8) return DType::int8;
        if (dt.bits == 32) return DType::int32;
        if (dt.bits == 64) return DType::int64;
        break;
      case nb::dlpack::dtype_code::UInt:
        if (dt.bits == 8) return DType::uint8;
        if (dt.bits == 16) return DType::bfloat16;  // ml_dtypes.bfloat16 viewed as uint16 (see top)
        break;
      default:
        break;
    }
  }
  throw nb::type_error((prefix(op) + arg + " has dtype " + dlpack_dtype_str(dt) +
                        " which xquant does not support (float32, float16, bfloat16, int8, uint8, int32, int64)")
                           .c_str());
}

template <class A>
Shape shape_of(const A& a) {
  Shape s(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<std::int64_t>(a.shape(i));
  return s;
}

// Dense row-major? (Dimensions of extent 1 may carry any stride; empty arrays are always dense.)
template <class A>
bool is_dense(const A& a) {
  for (std::size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return true;  // no elements: nothing to lay out
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    const auto n = static_cast<std::int64_t>(a.shape(i));
    if (n != 1 && a.stride(i) != expected) return false;
    expected *= n;
  }
  return true;
}

// Host memory only (kDLCPU, and kDLCUDAHost: pinned host memory): this module serves NumPy and other DLPack
// producers of host memory; torch tensors, CUDA included, go through the torch extension xquant._torch_ext.
template <class A>
Device device_of(const A& a, const char* op, const char* arg) {
  const int type = a.device_type();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return Device::cpu();
  throw nb::type_error((prefix(op) + arg + " is in memory of DLPack device type " + std::to_string(type) +
                        " but xquant's NumPy core reads host memory (1)")
                           .c_str());
}

template <class A>
void require_dense(const A& a, const char* op, const char* arg) {
  if (!is_dense(a))
    throw nb::value_error((prefix(op) + arg + " is not C-contiguous but expected a dense row-major array").c_str());
}

ConstTensorView cview(const ConstArray& a, const char* op, const char* arg) {
  const DType dt = to_dtype(a.dtype(), op, arg);
  require_dense(a, op, arg);
  return {a.data(), dt, shape_of(a), device_of(a, op, arg)};
}

TensorView wview(const Array& a, const char* op, const char* arg) {
  const DType dt = to_dtype(a.dtype(), op, arg);
  require_dense(a, op, arg);
  return {a.data(), dt, shape_of(a), device_of(a, op, arg)};
}

std::optional<ConstTensorView> opt_cview(const std::optional<ConstArray>& a, const char* op, const char* arg) {
  if (!a) return std::nullopt;
  return cview(*a, op, arg);
}

// A 2-D tile with a row pitch taken from the array's strides: columns must be unit-stride (or there is at
// most one column), rows may be padded (a slice of a wider array).
template <class A>
xquant::ConstTileView tile_of(const A& a, const char* op, const char* arg) {
  const DType dt = to_dtype(a.dtype(), op, arg);
  if (a.ndim() != 2)
    throw nb::value_error(
        (prefix(op) + arg + " has shape " + xquant::shape_str(shape_of(a)) + " but expected a 2-D tile").c_str());
  const auto rows = static_cast<std::int64_t>(a.shape(0));
  const auto cols = static_cast<std::int64_t>(a.shape(1));
  if (cols > 1 && rows > 0 && a.stride(1) != 1)
    throw nb::value_error((prefix(op) + arg + " has a column stride of " + std::to_string(a.stride(1)) +
                           " elements but expected 1 (row-major rows, possibly padded)")
                              .c_str());
  // A single row (or an empty tile) has no meaningful row stride: its pitch is its width.
  const std::int64_t pitch = rows > 1 && cols > 0 ? a.stride(0) : cols;
  return {a.data(), dt, rows, cols, pitch, device_of(a, op, arg)};
}

int to_int(std::int64_t v, const char* op, const char* arg) {
  if (v < INT_MIN || v > INT_MAX)
    throw nb::value_error((prefix(op) + arg + " is " + std::to_string(v) + " which does not fit in 32 bits").c_str());
  return static_cast<int>(v);
}

xquant::QuantDType to_quant_dtype(int code, const char* op, const char* arg) {
  if (code < 0 || code > static_cast<int>(xquant::QuantDType::float8_e5m2))
    throw nb::value_error((prefix(op) + arg + " code is " + std::to_string(code) + " but expected 0..5").c_str());
  return static_cast<xquant::QuantDType>(code);
}

xquant::FakeQuantOptions fq_options(const char* op, std::int64_t num_bits, bool is_unsigned, bool narrow_range) {
  xquant::FakeQuantOptions o;
  o.num_bits = to_int(num_bits, op, "num_bits");
  o.is_unsigned = is_unsigned;
  o.narrow_range = narrow_range;
  return o;
}

// ---- fake tensor quant ----------------------------------------------------------------------------------

void fake_tensor_quant(const Array& out, const ConstArray& inputs, const ConstArray& amax,
                       std::optional<std::int64_t> axis, std::int64_t num_bits, bool is_unsigned, bool narrow_range) {
  const char* op = axis ? "fake_tensor_quant_with_axis" : "fake_tensor_quant";
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const ConstTensorView x = cview(inputs, op, "inputs");
  const ConstTensorView a = cview(amax, op, "amax");
  const TensorView y = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  if (axis)
    xquant::fake_tensor_quant_with_axis_out(y, x, a, *axis, o);
  else
    xquant::fake_tensor_quant_out(y, x, a, o);
}

void fake_tensor_quant_inplace(const Array& inputs, const ConstArray& amax, std::int64_t num_bits, bool is_unsigned,
                               bool narrow_range) {
  const char* op = "fake_tensor_quant_inplace";
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const TensorView x = wview(inputs, op, "inputs");
  const ConstTensorView a = cview(amax, op, "amax");
  nb::gil_scoped_release nogil;
  xquant::fake_tensor_quant_inplace(x, a, o);
}

void fake_tensor_quant_backward(const Array& grad_inputs, const std::optional<Array>& grad_amax,
                                const ConstArray& grad_out, const ConstArray& inputs, const ConstArray& amax,
                                std::optional<std::int64_t> axis, std::int64_t num_bits, bool is_unsigned,
                                bool narrow_range) {
  const char* op = "fake_tensor_quant_backward";
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const TensorView gi = wview(grad_inputs, op, "grad_inputs");
  std::optional<TensorView> ga;
  if (grad_amax) ga = wview(*grad_amax, op, "grad_amax");
  const ConstTensorView go = cview(grad_out, op, "grad_out");
  const ConstTensorView x = cview(inputs, op, "inputs");
  const ConstTensorView a = cview(amax, op, "amax");
  nb::gil_scoped_release nogil;
  xquant::fake_tensor_quant_backward_out(gi, ga, go, x, a, axis, o);
}

// ---- npu_quantize ---------------------------------------------------------------------------------------

void quantize(const Array& out, const ConstArray& input, const ConstArray& scales,
              const std::optional<ConstArray>& zero_points, int dtype, std::int64_t axis, bool div_mode) {
  const char* op = "quantize";
  const xquant::QuantDType q = to_quant_dtype(dtype, op, "dtype");
  const ConstTensorView x = cview(input, op, "input");
  const ConstTensorView s = cview(scales, op, "scales");
  const std::optional<ConstTensorView> zp = opt_cview(zero_points, op, "zero_points");
  const TensorView y = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  xquant::quantize_out(y, x, s, zp, q, axis, div_mode);
}

// ---- pypto tile quant -----------------------------------------------------------------------------------

void tile_quant(const Array& out, const ConstArray& src, const ConstArray& scale, bool asym,
                const std::optional<ConstArray>& offset) {
  const char* op = "tile_quant";
  const xquant::ConstTileView o = tile_of(out, op, "out");
  const xquant::ConstTileView s = tile_of(src, op, "src");
  const xquant::ConstTileView sc = tile_of(scale, op, "scale");
  std::optional<xquant::ConstTileView> off;
  if (offset) off = tile_of(*offset, op, "offset");
  const xquant::TileView out_tile{out.data(), o.dtype, o.rows, o.cols, o.row_pitch, o.device};
  nb::gil_scoped_release nogil;
  xquant::tile_quant(out_tile, s, sc, asym ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM, off);
}

// ---- npu_dynamic_quant_asymmetric -----------------------------------------------------------------------

// quant_mode: 0 pertoken, 1 pertensor, 2 perchannel (xquant::DynamicQuantMode).
xquant::DynamicQuantMode dq_mode_of(int mode, const char* op) {
  if (mode < 0 || mode > 2)
    throw nb::value_error((prefix(op) + "quant_mode code is " + std::to_string(mode) + " but expected 0..2").c_str());
  return static_cast<xquant::DynamicQuantMode>(mode);
}
// A float8 y travels from NumPy as a uint8 view of the ml_dtypes array (same memory): its dtype is dst_type's.
void retag_float8(TensorView& y, xquant::QuantDType q) {
  if ((q == xquant::QuantDType::float8_e4m3fn || q == xquant::QuantDType::float8_e5m2) && y.dtype == DType::uint8)
    y.dtype = xquant::storage_dtype(q);
}

void dynamic_quant_asymmetric(const Array& y, const Array& scale, const Array& offset, const ConstArray& x,
                              const std::optional<ConstArray>& smooth_scales,
                              const std::optional<ConstArray>& group_index, int dst_type, int quant_mode) {
  const char* op = "dynamic_quant_asymmetric";
  const xquant::QuantDType q = to_quant_dtype(dst_type, op, "dst_type");
  const ConstTensorView xv = cview(x, op, "x");
  const std::optional<ConstTensorView> sm = opt_cview(smooth_scales, op, "smooth_scales");
  const std::optional<ConstTensorView> gi = opt_cview(group_index, op, "group_index");
  TensorView yv = wview(y, op, "y");
  retag_float8(yv, q);
  const TensorView sv = wview(scale, op, "scale");
  const TensorView ov = wview(offset, op, "offset");
  const xquant::DynamicQuantMode mode = dq_mode_of(quant_mode, op);
  nb::gil_scoped_release nogil;
  xquant::dynamic_quant_asymmetric_out(yv, sv, ov, xv, sm, gi, q, mode);
}

// ---- npu_dynamic_quant (symmetric) ----------------------------------------------------------------------

void dynamic_quant(const Array& y, const Array& scale, const ConstArray& x,
                   const std::optional<ConstArray>& smooth_scales, const std::optional<ConstArray>& group_index,
                   int dst_type, int quant_mode) {
  const char* op = "dynamic_quant";
  const xquant::QuantDType q = to_quant_dtype(dst_type, op, "dst_type");
  const ConstTensorView xv = cview(x, op, "x");
  const std::optional<ConstTensorView> sm = opt_cview(smooth_scales, op, "smooth_scales");
  const std::optional<ConstTensorView> gi = opt_cview(group_index, op, "group_index");
  TensorView yv = wview(y, op, "y");
  retag_float8(yv, q);
  const TensorView sv = wview(scale, op, "scale");
  const xquant::DynamicQuantMode mode = dq_mode_of(quant_mode, op);
  nb::gil_scoped_release nogil;
  xquant::dynamic_quant_out(yv, sv, xv, sm, gi, q, mode);
}

// ---- npu_anti_quant -------------------------------------------------------------------------------------

// out's dtype (allocated by the Python layer) is the dst_dtype.
void anti_quant(const Array& out, const ConstArray& x, const ConstArray& scale, const std::optional<ConstArray>& offset,
                int src_dtype) {
  const char* op = "anti_quant";
  const xquant::QuantDType q = to_quant_dtype(src_dtype, op, "src_dtype");
  const ConstTensorView xv = cview(x, op, "x");
  const ConstTensorView sv = cview(scale, op, "scale");
  const std::optional<ConstTensorView> ov = opt_cview(offset, op, "offset");
  const TensorView o = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  xquant::anti_quant_out(o, xv, sv, ov, q);
}

// ---- ActsULQ --------------------------------------------------------------------------------------------

void acts_ulq(const Array& y, const Array& clamp_min_mask, const Array& clamp_max_mask, const Array& x_clamped_loss,
              const ConstArray& x, const ConstArray& clamp_min, const ConstArray& clamp_max, bool fixed_min,
              std::int64_t num_bits) {
  const char* op = "acts_ulq";
  const int nbits = to_int(num_bits, op, "num_bits");
  const ConstTensorView xv = cview(x, op, "x");
  const ConstTensorView lo = cview(clamp_min, op, "clamp_min");
  const ConstTensorView hi = cview(clamp_max, op, "clamp_max");
  const TensorView yv = wview(y, op, "y");
  const TensorView m0 = wview(clamp_min_mask, op, "clamp_min_mask");
  const TensorView m1 = wview(clamp_max_mask, op, "clamp_max_mask");
  const TensorView ls = wview(x_clamped_loss, op, "x_clamped_loss");
  nb::gil_scoped_release nogil;
  xquant::acts_ulq_out(yv, m0, m1, ls, xv, lo, hi, fixed_min, nbits);
}

void acts_ulq_backward(const Array& x_grad, const Array& clamp_min_grad, const Array& clamp_max_grad,
                       const ConstArray& y_grad, const ConstArray& clamp_min, const ConstArray& clamp_max,
                       const ConstArray& clamp_min_mask, const ConstArray& clamp_max_mask,
                       const ConstArray& x_clamped_loss, bool fixed_min, std::int64_t num_bits) {
  const char* op = "acts_ulq_backward";
  const int nbits = to_int(num_bits, op, "num_bits");
  const TensorView xg = wview(x_grad, op, "x_grad");
  const TensorView g0 = wview(clamp_min_grad, op, "clamp_min_grad");
  const TensorView g1 = wview(clamp_max_grad, op, "clamp_max_grad");
  const ConstTensorView dy = cview(y_grad, op, "y_grad");
  const ConstTensorView lo = cview(clamp_min, op, "clamp_min");
  const ConstTensorView hi = cview(clamp_max, op, "clamp_max");
  const ConstTensorView m0 = cview(clamp_min_mask, op, "clamp_min_mask");
  const ConstTensorView m1 = cview(clamp_max_mask, op, "clamp_max_mask");
  const ConstTensorView ls = cview(x_clamped_loss, op, "x_clamped_loss");
  nb::gil_scoped_release nogil;
  xquant::acts_ulq_backward_out(xg, g0, g1, dy, lo, hi, m0, m1, ls, fixed_min, nbits);
}

// ---- the quantized matmuls ------------------------------------------------------------------------------
//
// NumPy has no layout flag on an array that says "transposed": the Python layer passes a transposed
// weight as its storage ([..., N, K]) with transpose_x2 / transpose_weight, as the C++ API takes it.

DType matmul_out_dtype(const std::string& name) {
  for (const DType d :
       {DType::int8, DType::float16, DType::bfloat16, DType::int32, DType::float32, DType::uint8, DType::int64})
    if (xquant::dtype_name(d) == name) return d;
  throw nb::value_error(
      (prefix("quant_matmul") + "output_dtype is '" + name + "' but expected int8, float16, bfloat16 or int32")
          .c_str());
}

xquant::QuantMatmulOptions qmm_options(const std::optional<ConstArray>& offset,
                                       const std::optional<ConstArray>& pertoken_scale,
                                       const std::optional<ConstArray>& bias, bool transpose_x2,
                                       const std::array<std::int64_t, 3>& group_sizes) {
  const char* op = "quant_matmul";
  return {.offset = opt_cview(offset, op, "offset"),
          .pertoken_scale = opt_cview(pertoken_scale, op, "pertoken_scale"),
          .bias = opt_cview(bias, op, "bias"),
          .transpose_x2 = transpose_x2,
          .group_sizes = group_sizes};
}

// The output shape after every check (the Python layer allocates out with it).
std::vector<std::int64_t> quant_matmul_shape(const ConstArray& x1, const ConstArray& x2, const ConstArray& scale,
                                             const std::optional<ConstArray>& offset,
                                             const std::optional<ConstArray>& pertoken_scale,
                                             const std::optional<ConstArray>& bias, bool transpose_x2,
                                             const std::string& output_dtype,
                                             const std::array<std::int64_t, 3>& group_sizes) {
  const char* op = "quant_matmul";
  return xquant::quant_matmul_output_shape(cview(x1, op, "x1"), cview(x2, op, "x2"), cview(scale, op, "scale"),
                                           qmm_options(offset, pertoken_scale, bias, transpose_x2, group_sizes),
                                           matmul_out_dtype(output_dtype));
}

void quant_matmul(const Array& out, const ConstArray& x1, const ConstArray& x2, const ConstArray& scale,
                  const std::optional<ConstArray>& offset, const std::optional<ConstArray>& pertoken_scale,
                  const std::optional<ConstArray>& bias, bool transpose_x2,
                  const std::array<std::int64_t, 3>& group_sizes) {
  const char* op = "quant_matmul";
  const ConstTensorView a = cview(x1, op, "x1"), b = cview(x2, op, "x2"), s = cview(scale, op, "scale");
  const xquant::QuantMatmulOptions o = qmm_options(offset, pertoken_scale, bias, transpose_x2, group_sizes);
  const TensorView ov = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  xquant::quant_matmul_out(ov, a, b, s, o);
}

xquant::WeightQuantMatmulOptions wqm_options(const std::optional<ConstArray>& antiquant_offset,
                                             const std::optional<ConstArray>& bias, std::int64_t group_size,
                                             bool transpose_weight) {
  const char* op = "weight_quant_batchmatmul";
  return {.antiquant_offset = opt_cview(antiquant_offset, op, "antiquant_offset"),
          .bias = opt_cview(bias, op, "bias"),
          .antiquant_group_size = group_size,
          .transpose_weight = transpose_weight};
}

std::vector<std::int64_t> weight_quant_batchmatmul_shape(const ConstArray& x, const ConstArray& weight,
                                                         const ConstArray& antiquant_scale,
                                                         const std::optional<ConstArray>& antiquant_offset,
                                                         const std::optional<ConstArray>& bias, std::int64_t group_size,
                                                         bool transpose_weight) {
  const char* op = "weight_quant_batchmatmul";
  return xquant::weight_quant_batchmatmul_output_shape(
      cview(x, op, "x"), cview(weight, op, "weight"), cview(antiquant_scale, op, "antiquant_scale"),
      wqm_options(antiquant_offset, bias, group_size, transpose_weight));
}

void weight_quant_batchmatmul(const Array& out, const ConstArray& x, const ConstArray& weight,
                              const ConstArray& antiquant_scale, const std::optional<ConstArray>& antiquant_offset,
                              const std::optional<ConstArray>& bias, std::int64_t group_size, bool transpose_weight) {
  const char* op = "weight_quant_batchmatmul";
  const ConstTensorView xv = cview(x, op, "x"), wv = cview(weight, op, "weight"),
                        sv = cview(antiquant_scale, op, "antiquant_scale");
  const xquant::WeightQuantMatmulOptions o = wqm_options(antiquant_offset, bias, group_size, transpose_weight);
  const TensorView ov = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  xquant::weight_quant_batchmatmul_out(ov, xv, wv, sv, o);
}

std::vector<std::int64_t> trans_quant_param_shape(const ConstArray& scale, const std::optional<ConstArray>& offset,
                                                  std::int64_t round_mode) {
  const char* op = "trans_quant_param";
  return xquant::plan_trans_quant_param(
      xquant::spec_of(cview(scale, op, "scale")),
      offset ? std::optional(xquant::spec_of(cview(*offset, op, "offset"))) : std::nullopt,
      to_int(round_mode, op, "round_mode"));
}

void trans_quant_param(const Array& out, const ConstArray& scale, const std::optional<ConstArray>& offset,
                       std::int64_t round_mode) {
  const char* op = "trans_quant_param";
  const int rm = to_int(round_mode, op, "round_mode");
  const ConstTensorView sv = cview(scale, op, "scale");
  const std::optional<ConstTensorView> ov = opt_cview(offset, op, "offset");
  const TensorView o = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  xquant::trans_quant_param_out(o, sv, ov, rm);
}

std::vector<std::int64_t> convert_weight_to_int4pack_shape(const ConstArray& weight) {
  return xquant::plan_convert_weight_to_int4pack(
      xquant::spec_of(cview(weight, "convert_weight_to_int4pack", "weight")));
}

void convert_weight_to_int4pack(const Array& out, const ConstArray& weight) {
  const char* op = "convert_weight_to_int4pack";
  const ConstTensorView wv = cview(weight, op, "weight");
  const TensorView o = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  xquant::convert_weight_to_int4pack_out(o, wv);
}

// ---- runtime settings -------------------------------------------------------------------------------------

void set_num_threads(std::int64_t n) { xquant::set_num_threads(to_int(n, "set_num_threads", "n")); }

void set_backend(const std::string& name) {
  if (name == "cpu")
    xquant::set_backend(xquant::Backend::cpu);
  else if (name == "reference")
    xquant::set_backend(xquant::Backend::reference);
  else
    throw nb::value_error(("xquant::set_backend: backend is '" + name + "' but expected 'cpu' or 'reference'").c_str());
}

std::string get_backend() { return xquant::get_backend() == xquant::Backend::cpu ? "cpu" : "reference"; }

}  // namespace

// ---- the library for xquant._torch_ext (core_api.hpp) ------------------------------------------------------

namespace api {
using xquant::TensorSpec;
using xquant_py::OptSpec;
using xquant_py::OptView;
using xquant_py::Status;

template <class F>
void guarded(Status& st, F&& f) noexcept {
  try {
    f();
    st.code = Status::ok;
  } catch (const xquant::Error& e) {
    st.code = e.code() == xquant::ErrorCode::dtype_mismatch ? Status::type_error : Status::value_error;
    st.message = e.what();
  } catch (const std::bad_alloc&) {
    st.code = Status::no_memory;
  } catch (const std::exception& e) {
    st.code = Status::runtime_error;
    st.message = e.what();
  }
}

std::optional<std::int64_t> opt_axis(const std::int64_t* axis) {
  return axis ? std::optional<std::int64_t>(*axis) : std::nullopt;
}

void fake_tensor_quant(Status& st, const TensorView& out, const ConstTensorView& x, const ConstTensorView& amax,
                       const std::int64_t* axis, const xquant::FakeQuantOptions& o) {
  guarded(st, [&] {
    if (axis)
      xquant::fake_tensor_quant_with_axis_out(out, x, amax, *axis, o);
    else
      xquant::fake_tensor_quant_out(out, x, amax, o);
  });
}
void fake_tensor_quant_inplace(Status& st, const TensorView& x, const ConstTensorView& amax,
                               const xquant::FakeQuantOptions& o) {
  guarded(st, [&] { xquant::fake_tensor_quant_inplace(x, amax, o); });
}
void fake_tensor_quant_backward(Status& st, const TensorView& gi, const std::optional<TensorView>& ga,
                                const ConstTensorView& go, const ConstTensorView& x, const ConstTensorView& amax,
                                const std::int64_t* axis, const xquant::FakeQuantOptions& o) {
  guarded(st, [&] { xquant::fake_tensor_quant_backward_out(gi, ga, go, x, amax, opt_axis(axis), o); });
}
void quantize(Status& st, const TensorView& out, const ConstTensorView& x, const ConstTensorView& scales,
              const OptView& zp, xquant::QuantDType q, std::int64_t axis, bool div_mode) {
  guarded(st, [&] { xquant::quantize_out(out, x, scales, zp, q, axis, div_mode); });
}
void tile_quant(Status& st, const xquant::TileView& out, const xquant::ConstTileView& src,
                const xquant::ConstTileView& scale, xquant::QuantMode mode,
                const std::optional<xquant::ConstTileView>& offset) {
  guarded(st, [&] { xquant::tile_quant(out, src, scale, mode, offset); });
}
xquant::DynamicQuantMode dq_mode(int mode) { return static_cast<xquant::DynamicQuantMode>(mode); }
void dynamic_quant_asymmetric(Status& st, const TensorView& y, const TensorView& scale, const TensorView& offset,
                              const ConstTensorView& x, const OptView& sm, const OptView& gi, xquant::QuantDType q,
                              int mode) {
  guarded(st, [&] { xquant::dynamic_quant_asymmetric_out(y, scale, offset, x, sm, gi, q, dq_mode(mode)); });
}
void dynamic_quant(Status& st, const TensorView& y, const TensorView& scale, const ConstTensorView& x,
                   const OptView& sm, const OptView& gi, xquant::QuantDType q, int mode) {
  guarded(st, [&] { xquant::dynamic_quant_out(y, scale, x, sm, gi, q, dq_mode(mode)); });
}
void anti_quant(Status& st, const TensorView& out, const ConstTensorView& x, const ConstTensorView& scale,
                const OptView& offset, xquant::QuantDType q) {
  guarded(st, [&] { xquant::anti_quant_out(out, x, scale, offset, q); });
}
void acts_ulq(Status& st, const TensorView& y, const TensorView& m0, const TensorView& m1, const TensorView& loss,
              const ConstTensorView& x, const ConstTensorView& lo, const ConstTensorView& hi, bool fixed_min,
              int num_bits) {
  guarded(st, [&] { xquant::acts_ulq_out(y, m0, m1, loss, x, lo, hi, fixed_min, num_bits); });
}
void acts_ulq_backward(Status& st, const TensorView& xg, const TensorView& g0, const TensorView& g1,
                       const ConstTensorView& dy, const ConstTensorView& lo, const ConstTensorView& hi,
                       const ConstTensorView& m0, const ConstTensorView& m1, const ConstTensorView& loss,
                       bool fixed_min, int num_bits) {
  guarded(st, [&] { xquant::acts_ulq_backward_out(xg, g0, g1, dy, lo, hi, m0, m1, loss, fixed_min, num_bits); });
}

void plan_fake_tensor_quant(Status& st, Shape& out, int form, const TensorSpec& x, const TensorSpec& amax,
                            std::int64_t axis, const xquant::FakeQuantOptions& o) {
  guarded(st, [&] {
    out = form == 2   ? xquant::plan_fake_tensor_quant_with_axis(x, amax, axis, o)
          : form == 1 ? xquant::plan_fake_tensor_quant_inplace(x, amax, o)
                      : xquant::plan_fake_tensor_quant(x, amax, o);
  });
}
void plan_fake_tensor_quant_backward(Status& st, const TensorSpec& go, const TensorSpec& x, const TensorSpec& amax,
                                     const std::int64_t* axis, const xquant::FakeQuantOptions& o) {
  guarded(st, [&] { xquant::plan_fake_tensor_quant_backward(go, x, amax, opt_axis(axis), o); });
}
void plan_quantize(Status& st, Shape& out, const TensorSpec& x, const TensorSpec& scales, const OptSpec& zp,
                   xquant::QuantDType q, std::int64_t axis, bool div_mode) {
  guarded(st, [&] { out = xquant::plan_quantize(x, scales, zp, q, axis, div_mode); });
}
void plan_tile_quant(Status& st, const TensorSpec& out, const TensorSpec& src, const TensorSpec& scale,
                     xquant::QuantMode mode, const OptSpec& offset) {
  guarded(st, [&] { xquant::plan_tile_quant(out, src, scale, mode, offset); });
}
void plan_dynamic_quant(Status& st, xquant::DynamicQuantShapes& out, bool symmetric, const TensorSpec& x,
                        const OptSpec& sm, const OptSpec& gi, xquant::QuantDType q, int mode) {
  guarded(st, [&] {
    out = symmetric ? xquant::plan_dynamic_quant(x, sm, gi, q, dq_mode(mode))
                    : xquant::plan_dynamic_quant_asymmetric(x, sm, gi, q, dq_mode(mode));
  });
}
void plan_anti_quant(Status& st, Shape& out, const TensorSpec& x, const TensorSpec& scale, const OptSpec& offset,
                     xquant::QuantDType q) {
  guarded(st, [&] { out = xquant::plan_anti_quant(x, scale, offset, q); });
}
void plan_acts_ulq(Status& st, Shape& out, const TensorSpec& x, const TensorSpec& lo, const TensorSpec& hi,
                   int num_bits) {
  guarded(st, [&] { out = xquant::plan_acts_ulq(x, lo, hi, num_bits); });
}
void plan_acts_ulq_backward(Status& st, Shape& out, const TensorSpec& dy, const Shape& x_shape, const TensorSpec& lo,
                            const TensorSpec& hi, const TensorSpec& m0, const TensorSpec& m1, const TensorSpec& loss,
                            int num_bits) {
  guarded(st, [&] { out = xquant::plan_acts_ulq_backward(dy, x_shape, lo, hi, m0, m1, loss, num_bits); });
}

void quant_matmul(Status& st, const TensorView& out, const ConstTensorView& x1, const ConstTensorView& x2,
                  const ConstTensorView& scale, const xquant::QuantMatmulOptions& o) {
  guarded(st, [&] { xquant::quant_matmul_out(out, x1, x2, scale, o); });
}
void weight_quant_batchmatmul(Status& st, const TensorView& out, const ConstTensorView& x, const ConstTensorView& w,
                              const ConstTensorView& s, const xquant::WeightQuantMatmulOptions& o) {
  guarded(st, [&] { xquant::weight_quant_batchmatmul_out(out, x, w, s, o); });
}
void trans_quant_param(Status& st, const TensorView& out, const ConstTensorView& scale, const OptView& offset,
                       int round_mode) {
  guarded(st, [&] { xquant::trans_quant_param_out(out, scale, offset, round_mode); });
}
void convert_weight_to_int4pack(Status& st, const TensorView& out, const ConstTensorView& weight) {
  guarded(st, [&] { xquant::convert_weight_to_int4pack_out(out, weight); });
}
void plan_quant_matmul(Status& st, Shape& out, const TensorSpec& x1, const TensorSpec& x2, const TensorSpec& scale,
                       const OptSpec& offset, const OptSpec& pertoken_scale, const OptSpec& bias, bool transpose_x2,
                       DType output_dtype, const std::array<std::int64_t, 3>& group_sizes) {
  guarded(st, [&] {
    out = xquant::plan_quant_matmul(x1, x2, scale, offset, pertoken_scale, bias, transpose_x2, output_dtype,
                                    group_sizes);
  });
}
void plan_weight_quant_batchmatmul(Status& st, Shape& out, const TensorSpec& x, const TensorSpec& w,
                                   const TensorSpec& s, const OptSpec& off, const OptSpec& bias,
                                   std::int64_t group_size, bool transpose_weight) {
  guarded(st, [&] { out = xquant::plan_weight_quant_batchmatmul(x, w, s, off, bias, group_size, transpose_weight); });
}
void plan_trans_quant_param(Status& st, Shape& out, const TensorSpec& scale, const OptSpec& offset, int round_mode) {
  guarded(st, [&] { out = xquant::plan_trans_quant_param(scale, offset, round_mode); });
}
void plan_convert_weight_to_int4pack(Status& st, Shape& out, const TensorSpec& weight) {
  guarded(st, [&] { out = xquant::plan_convert_weight_to_int4pack(weight); });
}

void* new_tensor(Status& st, DType dt, const Shape& shape, void** data) {
  xquant::Tensor* t = nullptr;
  guarded(st, [&] { t = new xquant::Tensor(dt, shape); });
  if (t) *data = t->data();
  return t;
}
void free_tensor(void* owner) noexcept { delete static_cast<xquant::Tensor*>(owner); }
bool cuda_available() noexcept { return xquant::cuda_available(); }
void cuda_unavailable_reason(std::string& out) { out = xquant::cuda_unavailable_reason(); }
void* push_cuda_stream(void* stream) { return new xquant::CudaStreamGuard(stream); }
void pop_cuda_stream(void* guard) noexcept { delete static_cast<xquant::CudaStreamGuard*>(guard); }

const xquant_py::CoreApi kApi = {xquant_py::kCoreApiVersion,
                                 sizeof(xquant_py::CoreApi),
                                 &fake_tensor_quant,
                                 &fake_tensor_quant_inplace,
                                 &fake_tensor_quant_backward,
                                 &quantize,
                                 &tile_quant,
                                 &dynamic_quant_asymmetric,
                                 &dynamic_quant,
                                 &anti_quant,
                                 &acts_ulq,
                                 &acts_ulq_backward,
                                 &plan_fake_tensor_quant,
                                 &plan_fake_tensor_quant_backward,
                                 &plan_quantize,
                                 &plan_tile_quant,
                                 &plan_dynamic_quant,
                                 &plan_anti_quant,
                                 &plan_acts_ulq,
                                 &plan_acts_ulq_backward,
                                 &new_tensor,
                                 &free_tensor,
                                 &cuda_available,
                                 &cuda_unavailable_reason,
                                 &push_cuda_stream,
                                 &pop_cuda_stream,
                                 &quant_matmul,
                                 &weight_quant_batchmatmul,
                                 &trans_quant_param,
                                 &convert_weight_to_int4pack,
                                 &plan_quant_matmul,
                                 &plan_weight_quant_batchmatmul,
                                 &plan_trans_quant_param,
                                 &plan_convert_weight_to_int4pack};
}  // namespace api

NB_MODULE(_core, m) {
  m.doc() = "xquant's compiled core: thin out-variant bindings used by xquant.npu (not a public API).";
  m.attr("__version__") = xquant::kVersion;
  m.attr("QINT8") = static_cast<int>(xquant::QuantDType::qint8);
  m.attr("QUINT8") = static_cast<int>(xquant::QuantDType::quint8);
  m.attr("QINT32") = static_cast<int>(xquant::QuantDType::qint32);
  m.attr("QUINT4X2") = static_cast<int>(xquant::QuantDType::quint4x2);
  m.attr("FLOAT8_E4M3FN") = static_cast<int>(xquant::QuantDType::float8_e4m3fn);
  m.attr("FLOAT8_E5M2") = static_cast<int>(xquant::QuantDType::float8_e5m2);
  // The library for xquant._torch_ext (core_api.hpp; PyCapsule_Import("xquant._core._api")).
  m.attr("_api") = nb::capsule(static_cast<const void*>(&api::kApi), xquant_py::kCoreApiCapsule);

  // xquant::Error -> TypeError (dtype_mismatch) or ValueError (everything else), same message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const xquant::Error& e) {
      PyErr_SetString(e.code() == xquant::ErrorCode::dtype_mismatch ? PyExc_TypeError : PyExc_ValueError, e.what());
    }
  });

  using namespace nb::literals;
  m.def("fake_tensor_quant", &fake_tensor_quant, "out"_a, "inputs"_a, "amax"_a, "axis"_a.none(), "num_bits"_a,
        "is_unsigned"_a, "narrow_range"_a);
  m.def("fake_tensor_quant_inplace", &fake_tensor_quant_inplace, "inputs"_a, "amax"_a, "num_bits"_a, "is_unsigned"_a,
        "narrow_range"_a);
  m.def("fake_tensor_quant_backward", &fake_tensor_quant_backward, "grad_inputs"_a, "grad_amax"_a.none(), "grad_out"_a,
        "inputs"_a, "amax"_a, "axis"_a.none(), "num_bits"_a, "is_unsigned"_a, "narrow_range"_a);
  m.def("quantize", &quantize, "out"_a, "input"_a, "scales"_a, "zero_points"_a.none(), "dtype"_a, "axis"_a,
        "div_mode"_a);
  m.def("tile_quant", &tile_quant, "out"_a, "src"_a, "scale"_a, "asym"_a, "offset"_a.none());
  m.def("dynamic_quant_asymmetric", &dynamic_quant_asymmetric, "y"_a, "scale"_a, "offset"_a, "x"_a,
        "smooth_scales"_a.none(), "group_index"_a.none(), "dst_type"_a, "quant_mode"_a);
  m.def("dynamic_quant", &dynamic_quant, "y"_a, "scale"_a, "x"_a, "smooth_scales"_a.none(), "group_index"_a.none(),
        "dst_type"_a, "quant_mode"_a);
  m.def("anti_quant", &anti_quant, "out"_a, "x"_a, "scale"_a, "offset"_a.none(), "src_dtype"_a);
  m.def("acts_ulq", &acts_ulq, "y"_a, "clamp_min_mask"_a, "clamp_max_mask"_a, "x_clamped_loss"_a, "x"_a, "clamp_min"_a,
        "clamp_max"_a, "fixed_min"_a, "num_bits"_a);
  m.def("acts_ulq_backward", &acts_ulq_backward, "x_grad"_a, "clamp_min_grad"_a, "clamp_max_grad"_a, "y_grad"_a,
        "clamp_min"_a, "clamp_max"_a, "clamp_min_mask"_a, "clamp_max_mask"_a, "x_clamped_loss"_a, "fixed_min"_a,
        "num_bits"_a);
  m.def("quant_matmul_shape", &quant_matmul_shape, "x1"_a, "x2"_a, "scale"_a, "offset"_a.none(),
        "pertoken_scale"_a.none(), "bias"_a.none(), "transpose_x2"_a, "output_dtype"_a, "group_sizes"_a);
  m.def("quant_matmul", &quant_matmul, "out"_a, "x1"_a, "x2"_a, "scale"_a, "offset"_a.none(), "pertoken_scale"_a.none(),
        "bias"_a.none(), "transpose_x2"_a, "group_sizes"_a);
  m.def("weight_quant_batchmatmul_shape", &weight_quant_batchmatmul_shape, "x"_a, "weight"_a, "antiquant_scale"_a,
        "antiquant_offset"_a.none(), "bias"_a.none(), "antiquant_group_size"_a, "transpose_weight"_a);
  m.def("weight_quant_batchmatmul", &weight_quant_batchmatmul, "out"_a, "x"_a, "weight"_a, "antiquant_scale"_a,
        "antiquant_offset"_a.none(), "bias"_a.none(), "antiquant_group_size"_a, "transpose_weight"_a);
  m.def("trans_quant_param_shape", &trans_quant_param_shape, "scale"_a, "offset"_a.none(), "round_mode"_a);
  m.def("trans_quant_param", &trans_quant_param, "out"_a, "scale"_a, "offset"_a.none(), "round_mode"_a);
  m.def("convert_weight_to_int4pack_shape", &convert_weight_to_int4pack_shape, "weight"_a);
  m.def("convert_weight_to_int4pack", &convert_weight_to_int4pack, "out"_a, "weight"_a);
  m.def("set_memory_cache_limit", &xquant::set_memory_cache_limit, "bytes"_a);
  m.def("get_memory_cache_limit", &xquant::get_memory_cache_limit);
  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.def("get_num_threads", &xquant::get_num_threads);
  m.def("set_backend", &set_backend, "backend"_a);
  m.def("get_backend", &get_backend);
  m.def("simd_target", &xquant::simd_target);
  m.def("cuda_built", &xquant::cuda_built);
  m.def("cuda_available", &xquant::cuda_available);
  m.def("cuda_unavailable_reason", &xquant::cuda_unavailable_reason);
}
