// xquant._core: the nanobind bridge between Python arrays and the xquant C++ operators.
//
// Deliberately thin. Every function takes its outputs as arrays allocated by the Python layer (which
// knows whether the caller wants NumPy or torch results), wraps every argument as an xquant view without
// copying (DLPack / buffer protocol through nb::ndarray), releases the GIL and calls the C++ out-variant,
// which validates everything before writing anything. Argument names and operator names in the messages
// below match the C++ library's, so the Python user sees one vocabulary.
//
// Dtypes: DLPack float32 / float16 / bfloat16 / int8 / uint8 / int32 / int64 map to xquant::DType. xquant
// has no uint16 dtype, so uint16 storage is read as bfloat16 bits: that is how the Python layer passes
// NumPy arrays of ml_dtypes.bfloat16 (viewed as uint16), after rejecting genuine uint16 user input.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::device::cpu>;             // written by the operator
using ConstArray = nb::ndarray<nb::ro, nb::device::cpu>;  // only read
using xquant::ConstTensorView;
using xquant::DType;
using xquant::Shape;
using xquant::TensorView;

std::string prefix(const char* op) { return std::string("xquant::") + op + ": "; }

std::string dlpack_dtype_str(nb::dlpack::dtype dt) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
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
      default: break;
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

template <class A>
void require_dense(const A& a, const char* op, const char* arg) {
  if (!is_dense(a))
    throw nb::value_error((prefix(op) + arg + " is not C-contiguous but expected a dense row-major array").c_str());
}

ConstTensorView cview(const ConstArray& a, const char* op, const char* arg) {
  const DType dt = to_dtype(a.dtype(), op, arg);
  require_dense(a, op, arg);
  return {a.data(), dt, shape_of(a)};
}

TensorView wview(const Array& a, const char* op, const char* arg) {
  const DType dt = to_dtype(a.dtype(), op, arg);
  require_dense(a, op, arg);
  return {a.data(), dt, shape_of(a)};
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
    throw nb::value_error((prefix(op) + arg + " has shape " + xquant::shape_str(shape_of(a)) +
                           " but expected a 2-D tile")
                              .c_str());
  const auto rows = static_cast<std::int64_t>(a.shape(0));
  const auto cols = static_cast<std::int64_t>(a.shape(1));
  if (cols > 1 && rows > 0 && a.stride(1) != 1)
    throw nb::value_error((prefix(op) + arg + " has a column stride of " + std::to_string(a.stride(1)) +
                           " elements but expected 1 (row-major rows, possibly padded)")
                              .c_str());
  // A single row (or an empty tile) has no meaningful row stride: its pitch is its width.
  const std::int64_t pitch = rows > 1 && cols > 0 ? a.stride(0) : cols;
  return {a.data(), dt, rows, cols, pitch};
}

int to_int(std::int64_t v, const char* op, const char* arg) {
  if (v < INT_MIN || v > INT_MAX)
    throw nb::value_error((prefix(op) + arg + " is " + std::to_string(v) + " which does not fit in 32 bits").c_str());
  return static_cast<int>(v);
}

xquant::QuantDType to_quant_dtype(int code, const char* op, const char* arg) {
  if (code < 0 || code > static_cast<int>(xquant::QuantDType::quint4x2))
    throw nb::value_error((prefix(op) + arg + " code is " + std::to_string(code) + " but expected 0..3").c_str());
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
                       std::optional<std::int64_t> axis, std::int64_t num_bits, bool is_unsigned,
                       bool narrow_range) {
  const char* op = axis ? "fake_tensor_quant_with_axis" : "fake_tensor_quant";
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const ConstTensorView x = cview(inputs, op, "inputs");
  const ConstTensorView a = cview(amax, op, "amax");
  const TensorView y = wview(out, op, "out");
  nb::gil_scoped_release nogil;
  if (axis) xquant::fake_tensor_quant_with_axis_out(y, x, a, *axis, o);
  else xquant::fake_tensor_quant_out(y, x, a, o);
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
  const xquant::TileView out_tile{out.data(), o.dtype, o.rows, o.cols, o.row_pitch};
  nb::gil_scoped_release nogil;
  xquant::tile_quant(out_tile, s, sc, asym ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM, off);
}

// ---- npu_dynamic_quant_asymmetric -----------------------------------------------------------------------

void dynamic_quant_asymmetric(const Array& y, const Array& scale, const Array& offset, const ConstArray& x,
                              const std::optional<ConstArray>& smooth_scales,
                              const std::optional<ConstArray>& group_index, int dst_type, bool per_tensor) {
  const char* op = "dynamic_quant_asymmetric";
  const xquant::QuantDType q = to_quant_dtype(dst_type, op, "dst_type");
  const ConstTensorView xv = cview(x, op, "x");
  const std::optional<ConstTensorView> sm = opt_cview(smooth_scales, op, "smooth_scales");
  const std::optional<ConstTensorView> gi = opt_cview(group_index, op, "group_index");
  const TensorView yv = wview(y, op, "y");
  const TensorView sv = wview(scale, op, "scale");
  const TensorView ov = wview(offset, op, "offset");
  nb::gil_scoped_release nogil;
  xquant::dynamic_quant_asymmetric_out(yv, sv, ov, xv, sm, gi, q,
                                       per_tensor ? xquant::DynamicQuantMode::pertensor
                                                  : xquant::DynamicQuantMode::pertoken);
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

// ---- runtime settings -------------------------------------------------------------------------------------

void set_num_threads(std::int64_t n) { xquant::set_num_threads(to_int(n, "set_num_threads", "n")); }

void set_backend(const std::string& name) {
  if (name == "cpu") xquant::set_backend(xquant::Backend::cpu);
  else if (name == "reference") xquant::set_backend(xquant::Backend::reference);
  else
    throw nb::value_error(
        ("xquant::set_backend: backend is '" + name + "' but expected 'cpu' or 'reference'").c_str());
}

std::string get_backend() { return xquant::get_backend() == xquant::Backend::cpu ? "cpu" : "reference"; }

}  // namespace

// A torch tensor over an xquant::Tensor allocation (owned through a capsule): large outputs get
// huge-page-backed, 2 MiB-aligned memory that xquant's allocation cache reuses across calls, instead of
// fresh 4 KiB pages that fault and are zero-filled on first touch (xquant/runtime.hpp).
nb::ndarray<nb::pytorch, nb::device::cpu> empty_torch(const std::vector<std::int64_t>& shape, const std::string& dtype) {
  DType dt;
  nb::dlpack::dtype code;
  if (dtype == "float32") { dt = DType::float32; code = nb::dtype<float>(); }
  else if (dtype == "float16") { dt = DType::float16; code = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1}; }
  else if (dtype == "bfloat16") { dt = DType::bfloat16; code = {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1}; }
  else if (dtype == "int8") { dt = DType::int8; code = nb::dtype<std::int8_t>(); }
  else if (dtype == "uint8") { dt = DType::uint8; code = nb::dtype<std::uint8_t>(); }
  else if (dtype == "int32") { dt = DType::int32; code = nb::dtype<std::int32_t>(); }
  else throw nb::type_error(("xquant::empty: dtype " + dtype + " is not supported").c_str());
  auto* t = new xquant::Tensor(dt, Shape(shape.begin(), shape.end()));
  nb::capsule owner(t, [](void* p) noexcept { delete static_cast<xquant::Tensor*>(p); });
  std::vector<std::size_t> dims(shape.begin(), shape.end());
  return nb::ndarray<nb::pytorch, nb::device::cpu>(t->data(), dims.size(), dims.data(), owner, nullptr, code);
}

NB_MODULE(_core, m) {
  m.doc() = "xquant's compiled core: thin out-variant bindings used by xquant.npu (not a public API).";
  m.attr("__version__") = xquant::kVersion;
  m.attr("QINT8") = static_cast<int>(xquant::QuantDType::qint8);
  m.attr("QUINT8") = static_cast<int>(xquant::QuantDType::quint8);
  m.attr("QINT32") = static_cast<int>(xquant::QuantDType::qint32);
  m.attr("QUINT4X2") = static_cast<int>(xquant::QuantDType::quint4x2);

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
  m.def("fake_tensor_quant_inplace", &fake_tensor_quant_inplace, "inputs"_a, "amax"_a, "num_bits"_a,
        "is_unsigned"_a, "narrow_range"_a);
  m.def("fake_tensor_quant_backward", &fake_tensor_quant_backward, "grad_inputs"_a, "grad_amax"_a.none(),
        "grad_out"_a, "inputs"_a, "amax"_a, "axis"_a.none(), "num_bits"_a, "is_unsigned"_a, "narrow_range"_a);
  m.def("quantize", &quantize, "out"_a, "input"_a, "scales"_a, "zero_points"_a.none(), "dtype"_a, "axis"_a,
        "div_mode"_a);
  m.def("tile_quant", &tile_quant, "out"_a, "src"_a, "scale"_a, "asym"_a, "offset"_a.none());
  m.def("dynamic_quant_asymmetric", &dynamic_quant_asymmetric, "y"_a, "scale"_a, "offset"_a, "x"_a,
        "smooth_scales"_a.none(), "group_index"_a.none(), "dst_type"_a, "per_tensor"_a);
  m.def("acts_ulq", &acts_ulq, "y"_a, "clamp_min_mask"_a, "clamp_max_mask"_a, "x_clamped_loss"_a, "x"_a,
        "clamp_min"_a, "clamp_max"_a, "fixed_min"_a, "num_bits"_a);
  m.def("empty_torch", &empty_torch, "shape"_a, "dtype"_a);
  m.def("set_memory_cache_limit", &xquant::set_memory_cache_limit, "bytes"_a);
  m.def("get_memory_cache_limit", &xquant::get_memory_cache_limit);
  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.def("get_num_threads", &xquant::get_num_threads);
  m.def("set_backend", &set_backend, "backend"_a);
  m.def("get_backend", &get_backend);
  m.def("simd_target", &xquant::simd_target);
  m.def("acts_ulq_backward", &acts_ulq_backward, "x_grad"_a, "clamp_min_grad"_a, "clamp_max_grad"_a, "y_grad"_a,
        "clamp_min"_a, "clamp_max"_a, "clamp_min_mask"_a, "clamp_max_mask"_a, "x_clamped_loss"_a, "fixed_min"_a,
        "num_bits"_a);
}
