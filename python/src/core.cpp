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
//
// Devices: arrays in CPU memory, and torch CUDA tensors (through DLPack, or read by the t_* functions in
// strict mode), whose views carry xquant::Device::cuda(index): the C++ library runs those calls on its
// CUDA backend (or reports why it cannot), on torch's current stream (CudaScope below).
#include <nanobind/nanobind.h>
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

// Arrays of any device: CPU memory (NumPy, torch CPU tensors) or CUDA device memory (torch CUDA tensors,
// through DLPack); device_of() maps the DLPack device to an xquant::Device and refuses the others.
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

// The xquant device of a DLPack array: host memory (kDLCPU, and kDLCUDAHost: pinned host memory) is the
// CPU; kDLCUDA is CUDA device device_id(). Anything else (managed memory, other accelerators) is refused.
template <class A>
Device device_of(const A& a, const char* op, const char* arg) {
  const int type = a.device_type();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) return Device::cpu();
  if (type == nb::device::cuda::value) return Device::cuda(a.device_id());
  throw nb::type_error((prefix(op) + arg + " is in memory of DLPack device type " + std::to_string(type) +
                        " but xquant reads CPU (1) or CUDA (2) memory")
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
  return {a.data(), dt, rows, cols, pitch, device_of(a, op, arg)};
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

// ---- CUDA calls ---------------------------------------------------------------------------------------
//
// A call on CUDA tensors runs the way PyTorch's own CUDA operators do: with the tensors' device as the
// calling thread's current CUDA device (the previous one restored afterwards) and asynchronously on
// torch's current stream of that device (xquant::CudaStreamGuard), so that it is ordered with the torch
// work queued before and after it and with the caching allocator's stream of the outputs. Both are read
// from torch (the functions init_torch() receives: torch._C._cuda_getCurrentRawStream,
// torch.cuda._exchange_device / _maybe_exchange_device), so that this module needs neither the CUDA
// toolkit nor torch's C++ libraries. Constructed while holding the GIL, before the GIL is released; does
// nothing for a CPU device.
class CudaScope {
 public:
  explicit CudaScope(Device d);
  ~CudaScope();
  CudaScope(const CudaScope&) = delete;
  CudaScope& operator=(const CudaScope&) = delete;

 private:
  std::optional<xquant::CudaStreamGuard> stream_;
  long previous_device_ = -1;
  bool active_ = false;
};

// ---- fake tensor quant ----------------------------------------------------------------------------------

void fake_tensor_quant(const Array& out, const ConstArray& inputs, const ConstArray& amax,
                       std::optional<std::int64_t> axis, std::int64_t num_bits, bool is_unsigned,
                       bool narrow_range) {
  const char* op = axis ? "fake_tensor_quant_with_axis" : "fake_tensor_quant";
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const ConstTensorView x = cview(inputs, op, "inputs");
  const ConstTensorView a = cview(amax, op, "amax");
  const TensorView y = wview(out, op, "out");
  const CudaScope cuda(x.device);
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
  const CudaScope cuda(x.device);
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
  const CudaScope cuda(x.device);
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
  const CudaScope cuda(x.device);
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
  const CudaScope cuda(s.device);
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
  const CudaScope cuda(xv.device);
  nb::gil_scoped_release nogil;
  xquant::dynamic_quant_asymmetric_out(yv, sv, ov, xv, sm, gi, q,
                                       per_tensor ? xquant::DynamicQuantMode::pertensor
                                                  : xquant::DynamicQuantMode::pertoken);
}

// ---- npu_dynamic_quant (symmetric) ----------------------------------------------------------------------

void dynamic_quant(const Array& y, const Array& scale, const ConstArray& x,
                   const std::optional<ConstArray>& smooth_scales, const std::optional<ConstArray>& group_index,
                   int dst_type) {
  const char* op = "dynamic_quant";
  const xquant::QuantDType q = to_quant_dtype(dst_type, op, "dst_type");
  const ConstTensorView xv = cview(x, op, "x");
  const std::optional<ConstTensorView> sm = opt_cview(smooth_scales, op, "smooth_scales");
  const std::optional<ConstTensorView> gi = opt_cview(group_index, op, "group_index");
  const TensorView yv = wview(y, op, "y");
  const TensorView sv = wview(scale, op, "scale");
  const CudaScope cuda(xv.device);
  nb::gil_scoped_release nogil;
  xquant::dynamic_quant_out(yv, sv, xv, sm, gi, q);
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
  const CudaScope cuda(xv.device);
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
  const CudaScope cuda(xv.device);
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
  const CudaScope cuda(dy.device);
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


// ---- torch tensors without DLPack ---------------------------------------------------------------------------
//
// The functions t_* below take torch tensors as plain Python objects and read what xquant needs (data
// pointer, dtype, shape, layout, device, contiguity, neg bit, requires_grad) through the CPython API from the
// torch objects that xquant._torch_ops hands over once (init_torch): no torch headers, no DLPack capsule per
// argument (torch's Tensor.__dlpack__ costs several microseconds per tensor). They allocate their outputs
// with torch.empty / torch.empty_like (xquant's own huge-page allocation from 2 MiB on) and return them.
//
// Two modes:
//  - lenient (the eager fast path of xquant.npu): anything unusual (a tensor subclass, a non-contiguous,
//    sparse, meta, CUDA or neg-bit tensor, an unsupported dtype, a Python value of an unexpected type, an
//    argument that requires grad while grad mode is on, an active torch dispatch / function mode, functorch
//    transform, JIT trace or profiler) returns None without raising, and the caller takes the full path
//    (torch.library custom operators), which validates and reports. Errors of the C++ library itself are
//    raised as usual: they are the same on both paths. The operators with autograd return NotImplemented
//    when the only obstacle is autograd recording (see autograd_verdict).
//  - strict (inside the custom operators, whose Python layer has already checked and densified the
//    arguments): an unsupported dtype raises TypeError, anything else unexpected ValueError. CUDA tensors
//    are read here (their outputs allocated by torch.empty on their device: torch's caching allocator).
//
// Adding an operator: write t_<op>(..., bool strict) after the pattern of t_quantize (targ() per tensor,
// opt_targ() for optional ones, alloc() for outputs, call the C++ out-variant under run_maybe_nogil()),
// register it in NB_MODULE, and call it from the Python fast path (xquant/npu.py) and the custom operator's
// implementation (xquant/_torch_ops.py).

struct TorchApi {
  bool ready = false;    // init_torch ran: strict calls work
  bool lenient = false;  // and every mode probe exists: lenient calls may compute (else they return None)
  PyObject* tensor_type = nullptr;     // torch.Tensor
  PyObject* parameter_type = nullptr;  // torch.nn.Parameter
  PyObject* strided = nullptr;         // torch.strided
  PyObject* empty = nullptr;           // torch.empty
  PyObject* empty_like = nullptr;      // torch.empty_like
  PyObject* is_grad_enabled = nullptr;
  PyObject* increment_version = nullptr;  // torch._C._increment_version (takes a tuple of tensors)
  // CUDA (see CudaScope); nullptr where this torch has no CUDA support (then no CUDA tensor exists).
  PyObject* cuda_raw_stream = nullptr;       // torch._C._cuda_getCurrentRawStream(device_index) -> int
  PyObject* cuda_exchange_device = nullptr;  // torch.cuda._exchange_device(index) -> previous index
  PyObject* cuda_maybe_exchange_device = nullptr;  // torch.cuda._maybe_exchange_device(index)
  std::vector<PyObject*> mode_probes;  // each returns something falsy when no mode / transform / trace is active
  std::vector<std::pair<PyObject*, DType>> dtypes;  // torch dtype -> xquant dtype
  PyObject* dtype_of[7] = {};                       // xquant dtype -> torch dtype
  std::vector<std::pair<PyObject*, int>> qdtypes;   // torch dtype -> QuantDType code (npu_quantize's dtype)
  PyObject* kw_dtype = nullptr;                     // ("dtype",)
  PyObject* kw_dtype_device = nullptr;              // ("dtype", "device")
  PyObject *s_data_ptr, *s_dtype, *s_shape, *s_layout, *s_is_cpu, *s_is_contiguous, *s_is_neg, *s_requires_grad,
      *s_is_inference, *s_is_view, *s_is_cuda, *s_device, *s_get_device;
};
TorchApi g_torch;  // references held for the life of the process (never released: no teardown ordering issues)

PyObject* keep(nb::handle h) {
  PyObject* p = h.ptr();
  Py_INCREF(p);
  return p;
}

void init_torch(const nb::dict& d) {
  TorchApi& t = g_torch;
  if (t.ready) return;  // once per process (xquant._torch_ops is imported once)
  t.tensor_type = keep(d["Tensor"]);
  t.parameter_type = keep(d["Parameter"]);
  t.strided = keep(d["strided"]);
  t.empty = keep(d["empty"]);
  t.empty_like = keep(d["empty_like"]);
  t.is_grad_enabled = keep(d["is_grad_enabled"]);
  t.increment_version = keep(d["increment_version"]);
  if (d.contains("cuda_raw_stream") && !d["cuda_raw_stream"].is_none()) {
    t.cuda_raw_stream = keep(d["cuda_raw_stream"]);
    t.cuda_exchange_device = keep(d["cuda_exchange_device"]);
    t.cuda_maybe_exchange_device = keep(d["cuda_maybe_exchange_device"]);
  }
  if (!d["mode_probes"].is_none()) {
    for (nb::handle f : nb::list(d["mode_probes"])) t.mode_probes.push_back(keep(f));
    t.lenient = true;
  }
  const std::pair<const char*, DType> names[] = {{"float32", DType::float32}, {"float16", DType::float16},
                                                 {"bfloat16", DType::bfloat16}, {"int8", DType::int8},
                                                 {"uint8", DType::uint8},     {"int32", DType::int32},
                                                 {"int64", DType::int64}};
  nb::dict dts = nb::borrow<nb::dict>(d["dtypes"]);
  for (const auto& [name, dt] : names) {
    PyObject* o = keep(dts[name]);
    t.dtypes.emplace_back(o, dt);
    t.dtype_of[static_cast<int>(dt)] = o;
  }
  for (auto [k, v] : nb::borrow<nb::dict>(d["qdtypes"])) t.qdtypes.emplace_back(keep(k), nb::cast<int>(v));
  t.kw_dtype = keep(nb::make_tuple("dtype"));
  t.kw_dtype_device = keep(nb::make_tuple("dtype", "device"));
  t.s_data_ptr = PyUnicode_InternFromString("data_ptr");
  t.s_dtype = PyUnicode_InternFromString("dtype");
  t.s_shape = PyUnicode_InternFromString("shape");
  t.s_layout = PyUnicode_InternFromString("layout");
  t.s_is_cpu = PyUnicode_InternFromString("is_cpu");
  t.s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
  t.s_is_neg = PyUnicode_InternFromString("is_neg");
  t.s_requires_grad = PyUnicode_InternFromString("requires_grad");
  t.s_is_inference = PyUnicode_InternFromString("is_inference");
  t.s_is_view = PyUnicode_InternFromString("_is_view");
  t.s_is_cuda = PyUnicode_InternFromString("is_cuda");
  t.s_device = PyUnicode_InternFromString("device");
  t.s_get_device = PyUnicode_InternFromString("get_device");
  t.ready = true;
}

long call_device_fn(PyObject* f, long index) {
  nb::object arg = nb::steal(PyLong_FromLong(index));
  if (!arg.is_valid()) throw nb::python_error();
  PyObject* args[1] = {arg.ptr()};
  nb::object r = nb::steal(PyObject_Vectorcall(f, args, 1, nullptr));
  if (!r.is_valid()) throw nb::python_error();
  const long v = PyLong_AsLong(r.ptr());
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

CudaScope::CudaScope(Device d) {
  if (!d.is_cuda()) return;
  const TorchApi& t = g_torch;
  if (t.cuda_raw_stream == nullptr)
    throw nb::type_error(("xquant: a CUDA array (on " + xquant::device_str(d) +
                          ") reached xquant._core before torch's CUDA functions were handed over (xquant._torch_ops "
                          "calls init_torch; this torch has no CUDA support?)")
                             .c_str());
  previous_device_ = call_device_fn(t.cuda_exchange_device, d.index);
  active_ = true;
  try {
    nb::object idx = nb::steal(PyLong_FromLong(d.index));
    if (!idx.is_valid()) throw nb::python_error();
    PyObject* args[1] = {idx.ptr()};
    nb::object r = nb::steal(PyObject_Vectorcall(t.cuda_raw_stream, args, 1, nullptr));
    if (!r.is_valid()) throw nb::python_error();
    void* stream = PyLong_AsVoidPtr(r.ptr());
    if (stream == nullptr && PyErr_Occurred()) throw nb::python_error();
    stream_.emplace(stream);
  } catch (...) {
    active_ = false;
    try {
      (void)call_device_fn(t.cuda_maybe_exchange_device, previous_device_);
    } catch (const nb::python_error&) {
      // the first error is the one reported
    }
    throw;
  }
}

CudaScope::~CudaScope() {
  stream_.reset();
  if (!active_) return;
  // Restoring the previous device cannot fail for a device torch itself reported; if it does, the error
  // is reported as unraisable (a destructor cannot raise). (No Python error is pending here: errors in
  // flight are C++ exceptions, nb::python_error holding its Python error itself.)
  try {
    (void)call_device_fn(g_torch.cuda_maybe_exchange_device, previous_device_);
  } catch (nb::python_error& e) {
    e.discard_as_unraisable("xquant: restoring the current CUDA device");
  } catch (...) {  // (an allocation failure of the int argument: nothing to report it to)
  }
}

// New reference or a raised Python error.
nb::object attr(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o, name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

nb::object call_method0(PyObject* o, PyObject* name) {
  PyObject* args[1] = {o};
  PyObject* r = PyObject_VectorcallMethod(name, args, 1, nullptr);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

nb::object call0(PyObject* f) {
  PyObject* r = PyObject_CallNoArgs(f);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

bool truthy(const nb::object& o) {
  const int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw nb::python_error();
  return r == 1;
}

// No torch dispatch / function mode, functorch transform, JIT trace or profiler is active, and no argument
// needs autograd: the custom operators would add nothing but their dispatch cost.
bool modes_plain() {
  for (PyObject* probe : g_torch.mode_probes)
    if (truthy(call0(probe))) return false;
  return true;
}

bool plain_eager(bool any_requires_grad) {
  if (any_requires_grad && truthy(call0(g_torch.is_grad_enabled))) return false;
  return modes_plain();
}

// For the operators with autograd: None (take the full path), NotImplemented (everything is plain but an
// argument requires grad and grad mode is on: the caller records autograd itself, see
// xquant._torch_ops._FakeQuantFn), or true (compute here).
nb::object autograd_verdict(bool any_requires_grad) {
  if (!modes_plain()) return nb::none();
  if (any_requires_grad && truthy(call0(g_torch.is_grad_enabled))) return nb::borrow(Py_NotImplemented);
  return nb::borrow(Py_True);
}

// A dense torch tensor as xquant sees it (CPU; CUDA in strict mode).
struct TArg {
  PyObject* obj = nullptr;  // borrowed
  void* data = nullptr;
  DType dtype = DType::float32;
  Shape shape;
  bool requires_grad = false;
  Device device{};        // the CPU, or a CUDA device (strict mode only)
  nb::object device_obj;  // CUDA: the tensor's torch.device (outputs are allocated there)
  std::int64_t numel() const { return xquant::shape_numel(shape); }
  ConstTensorView cview() const { return {data, dtype, shape, device}; }
  TensorView wview() const { return {data, dtype, shape, device}; }
};

std::string torch_dtype_name(PyObject* dt) {
  nb::str s = nb::str(nb::handle(dt));
  std::string r = s.c_str();
  return r.rfind("torch.", 0) == 0 ? r.substr(6) : r;
}

Shape read_shape(PyObject* size) {
  const Py_ssize_t n = PyTuple_Size(size);  // torch.Size is a tuple
  if (n < 0) throw nb::python_error();
  Shape s(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(size, i));
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    s[static_cast<std::size_t>(i)] = v;
  }
  return s;
}

// Reads t into a. Lenient: false when t is not a plain dense CPU tensor of a supported dtype (the caller
// falls back). Strict: raises instead (TypeError for the dtype, ValueError otherwise); t has been checked
// and made dense by the Python layer, so only the dtype can normally fail.
bool targ_impl(PyObject* t, TArg& a, bool strict, const char* op, const char* arg) {
  const TorchApi& T = g_torch;
  a.obj = t;
  if (!T.ready) throw nb::type_error("xquant._core: init_torch() has not run");
  if (!strict && !T.lenient) return false;
  if (!strict) {
    PyObject* tp = reinterpret_cast<PyObject*>(Py_TYPE(t));
    if (tp != T.tensor_type && tp != T.parameter_type) return false;
  }
  auto bad = [&](const char* what) -> bool {
    if (!strict) return false;
    throw nb::value_error((prefix(op) + arg + " " + what).c_str());
  };
  if (attr(t, T.s_layout).ptr() != T.strided) return bad("is not a dense strided tensor");
  if (attr(t, T.s_is_cpu).ptr() != Py_True) {
    // A CUDA tensor: strict mode only (the custom operators' implementations); the lenient fast path is
    // CPU-only and hands CUDA tensors over to the full path.
    if (!strict || attr(t, T.s_is_cuda).ptr() != Py_True) return bad("is not on the CPU or a CUDA device");
    nb::object index = call_method0(t, T.s_get_device);
    const long i = PyLong_AsLong(index.ptr());
    if (i == -1 && PyErr_Occurred()) throw nb::python_error();
    a.device = Device::cuda(static_cast<int>(i));
    a.device_obj = attr(t, T.s_device);
  }
  nb::object dt = attr(t, T.s_dtype);
  bool found = false;
  for (const auto& [o, d] : T.dtypes)
    if (o == dt.ptr()) {
      a.dtype = d;
      found = true;
      break;
    }
  if (!found) {
    if (!strict) return false;
    throw nb::type_error((prefix(op) + arg + " has dtype " + torch_dtype_name(dt.ptr()) +
                          " which xquant does not support (float32, float16, bfloat16, int8, uint8, int32, int64)")
                             .c_str());
  }
  if (call_method0(t, T.s_is_contiguous).ptr() != Py_True)
    return bad("is not contiguous but expected a dense row-major tensor");
  if (call_method0(t, T.s_is_neg).ptr() != Py_False) return bad("is a negative view (call .resolve_neg())");
  a.requires_grad = attr(t, T.s_requires_grad).ptr() == Py_True;
  a.shape = read_shape(attr(t, T.s_shape).ptr());
  nb::object p = call_method0(t, T.s_data_ptr);
  a.data = PyLong_AsVoidPtr(p.ptr());
  if (!a.data && PyErr_Occurred()) throw nb::python_error();
  return true;
}

bool targ(PyObject* t, TArg& a, bool strict, const char* op, const char* arg) {
  if (strict) return targ_impl(t, a, strict, op, arg);
  try {
    return targ_impl(t, a, strict, op, arg);
  } catch (const nb::python_error&) {
    return false;  // a tensor that cannot answer (a nested tensor's sizes, ...): the full path reports
  }
}

// None / a tensor; false (lenient) as targ.
bool opt_targ(PyObject* t, std::optional<TArg>& a, bool strict, const char* op, const char* arg) {
  if (t == Py_None) {
    a.reset();
    return true;
  }
  a.emplace();
  return targ(t, *a, strict, op, arg);
}

// A Python int (not bool) that fits 32 bits; false (lenient) otherwise. In strict mode the schema has made
// it an int: out-of-range values raise the binding's usual message.
bool py_int(PyObject* o, int& v, bool strict, const char* op, const char* arg) {
  if (!PyLong_CheckExact(o)) {
    if (!strict) return false;
    throw nb::type_error((prefix(op) + arg + " is not an int").c_str());
  }
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow || x < INT_MIN || x > INT_MAX) {
    if (!strict) return false;
    throw nb::value_error((prefix(op) + arg + " is " + nb::str(nb::handle(o)).c_str() +
                           " which does not fit in 32 bits").c_str());
  }
  v = static_cast<int>(x);
  return true;
}

bool py_int64(PyObject* o, std::int64_t& v, bool strict, const char* op, const char* arg) {
  if (!PyLong_CheckExact(o)) {
    if (!strict) return false;
    throw nb::type_error((prefix(op) + arg + " is not an int").c_str());
  }
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow) {
    if (!strict) return false;
    throw nb::value_error((prefix(op) + arg + " does not fit in 64 bits").c_str());
  }
  v = x;
  return true;
}

bool py_bool(PyObject* o, bool& v, bool strict, const char* op, const char* arg) {
  if (o == Py_True || o == Py_False) {
    v = o == Py_True;
    return true;
  }
  if (!strict) return false;
  throw nb::type_error((prefix(op) + arg + " is not a bool").c_str());
}

// Outputs of at least this many bytes come from xquant's allocator (2 MiB-aligned, huge pages, reused
// through its cache) rather than torch's: fresh 4 KiB pages cost a fault and a zero-fill each.
constexpr std::size_t kXqAllocMinBytes = std::size_t{2} << 20;
// Calls on fewer elements keep the GIL: releasing and re-acquiring it costs more than such a kernel.
constexpr std::int64_t kReleaseGilMinElements = std::int64_t{1} << 15;

nb::ndarray<nb::pytorch, nb::device::cpu> xq_torch_tensor(const Shape& shape, DType dt, void** data);

struct Out {
  nb::object tensor;
  TensorView view;
};

// An output of `shape` and `dt` on the device of `like` (nullptr: the CPU). CUDA outputs come from
// torch.empty(..., device=like's device): torch's caching allocator, on its current stream.
Out alloc(const Shape& shape, DType dt, const TArg* like = nullptr) {
  Out o;
  const bool cuda = like != nullptr && like->device.is_cuda();
  const std::int64_t n = xquant::shape_numel(shape);
  if (!cuda && static_cast<std::size_t>(n) * xquant::dtype_size(dt) >= kXqAllocMinBytes) {
    void* data = nullptr;
    o.tensor = nb::cast(xq_torch_tensor(shape, dt, &data));
    o.view = {data, dt, shape};
    return o;
  }
  // torch.empty(d0, d1, ..., dtype=dt): the dimensions as separate arguments parse faster than a tuple.
  if (shape.size() > 16) throw nb::value_error("xquant: more than 16 dimensions");
  nb::object dims[16];
  PyObject* args[18];
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dims[i] = nb::steal(PyLong_FromLongLong(shape[i]));
    if (!dims[i].is_valid()) throw nb::python_error();
    args[i] = dims[i].ptr();
  }
  PyObject* r;
  nb::object empty_tuple;
  std::size_t npos = shape.size();
  if (shape.empty()) {  // a 0-d tensor: torch.empty((), dtype=dt)
    empty_tuple = nb::steal(PyTuple_New(0));
    args[0] = empty_tuple.ptr();
    npos = 1;
  }
  args[npos] = g_torch.dtype_of[static_cast<int>(dt)];
  if (cuda) {
    args[npos + 1] = like->device_obj.ptr();
    r = PyObject_Vectorcall(g_torch.empty, args, npos, g_torch.kw_dtype_device);
  } else {
    r = PyObject_Vectorcall(g_torch.empty, args, npos, g_torch.kw_dtype);
  }
  if (!r) throw nb::python_error();
  o.tensor = nb::steal(r);
  nb::object p = call_method0(r, g_torch.s_data_ptr);
  o.view = {PyLong_AsVoidPtr(p.ptr()), dt, shape, cuda ? like->device : Device{}};
  return o;
}

// An output of x's dtype and shape.
Out alloc_like(const TArg& x) {
  if (x.device.is_cuda() || static_cast<std::size_t>(x.numel()) * xquant::dtype_size(x.dtype) >= kXqAllocMinBytes)
    return alloc(x.shape, x.dtype, &x);
  Out o;
  PyObject* args[1] = {x.obj};
  PyObject* r = PyObject_Vectorcall(g_torch.empty_like, args, 1, nullptr);
  if (!r) throw nb::python_error();
  o.tensor = nb::steal(r);
  nb::object p = call_method0(r, g_torch.s_data_ptr);
  o.view = {PyLong_AsVoidPtr(p.ptr()), x.dtype, x.shape, x.device};
  return o;
}

// A tensor the lenient path may write in place: not an inference tensor (only inference mode may modify
// those), and not a view while grad mode is on (torch refuses in-place writes to some views, e.g. one
// created under no_grad of a base that requires grad; the full path lets torch decide).
bool plain_inplace_target(PyObject* t) {
  if (call_method0(t, g_torch.s_is_inference).ptr() != Py_False) return false;
  if (call_method0(t, g_torch.s_is_view).ptr() != Py_False && truthy(call0(g_torch.is_grad_enabled))) return false;
  return true;
}

// Marks a tensor written in place as modified for autograd's saved-tensor checks (what an in-place torch
// operator does).
void bump_version(PyObject* t) {
  nb::object tup = nb::make_tuple(nb::handle(t));
  PyObject* args[1] = {tup.ptr()};
  PyObject* r = PyObject_Vectorcall(g_torch.increment_version, args, 1, nullptr);
  if (!r) throw nb::python_error();
  Py_DECREF(r);
}

template <class F>
void run_maybe_nogil(std::int64_t elements, F&& f) {
  if (elements >= kReleaseGilMinElements) {
    nb::gil_scoped_release nogil;
    f();
  } else {
    f();
  }
}

// A Python real number as a 0-d float32 parameter (what the Python layer's torch.tensor(float(v)) makes).
bool py_number(PyObject* o, float& v) {
  if (!(PyFloat_CheckExact(o) || PyLong_CheckExact(o))) return false;
  const double d = PyFloat_AsDouble(o);
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  v = static_cast<float>(d);
  return true;
}

// The fake-quant options (num_bits, is_unsigned, narrow_range) shared by the per-tensor, per-axis and
// in-place forms; false: hand over to the full path (or, strict, an error was set).
bool fq_parse_options(nb::handle num_bits, nb::handle is_unsigned, nb::handle narrow_range, bool strict, const char* op,
                xquant::FakeQuantOptions& o) {
  return py_int(num_bits.ptr(), o.num_bits, strict, op, "num_bits") &&
         py_bool(is_unsigned.ptr(), o.is_unsigned, strict, op, "is_unsigned") &&
         py_bool(narrow_range.ptr(), o.narrow_range, strict, op, "narrow_range");
}

// amax: a tensor, or (fast path only) a Python number read into `value` as a 0-d float32 parameter.
bool fq_amax(nb::handle amax, bool strict, const char* op, TArg& a, float& value) {
  if (!strict && py_number(amax.ptr(), value)) {
    a.data = &value;
    a.dtype = DType::float32;
    return true;
  }
  return targ(amax.ptr(), a, strict, op, "amax");
}

#define XQ_TRY(cond) \
  do {               \
    if (!(cond)) return nb::none(); \
  } while (0)

nb::object t_fake_tensor_quant(nb::handle inputs, nb::handle amax, nb::handle axis, nb::handle num_bits,
                               nb::handle is_unsigned, nb::handle narrow_range, bool strict) {
  const char* op = axis.is_none() ? "fake_tensor_quant" : "fake_tensor_quant_with_axis";
  xquant::FakeQuantOptions o;
  std::int64_t ax = 0;
  XQ_TRY(fq_parse_options(num_bits, is_unsigned, narrow_range, strict, op, o));
  if (!axis.is_none()) XQ_TRY(py_int64(axis.ptr(), ax, strict, op, "axis"));
  TArg x;
  XQ_TRY(targ(inputs.ptr(), x, strict, op, "inputs"));
  TArg a;
  float a_value = 0.0f;
  XQ_TRY(fq_amax(amax, strict, op, a, a_value));
  if (!strict) {
    nb::object v = autograd_verdict(x.requires_grad || a.requires_grad);
    if (v.ptr() != Py_True) return v;
  }
  Out out = alloc_like(x);
  const ConstTensorView xv = x.cview(), av = a.cview();
  const CudaScope cuda(x.device);
  run_maybe_nogil(x.numel(), [&] {
    if (axis.is_none()) xquant::fake_tensor_quant_out(out.view, xv, av, o);
    else xquant::fake_tensor_quant_with_axis_out(out.view, xv, av, ax, o);
  });
  return out.tensor;
}

nb::object t_fake_tensor_quant_inplace(nb::handle inputs, nb::handle amax, nb::handle num_bits,
                                       nb::handle is_unsigned, nb::handle narrow_range, bool strict) {
  const char* op = "fake_tensor_quant_inplace";
  xquant::FakeQuantOptions o;
  XQ_TRY(fq_parse_options(num_bits, is_unsigned, narrow_range, strict, op, o));
  TArg x;
  XQ_TRY(targ(inputs.ptr(), x, strict, op, "inputs"));
  TArg a;
  float a_value = 0.0f;
  XQ_TRY(fq_amax(amax, strict, op, a, a_value));
  if (!strict) {
    // A tensor that requires grad is refused by the full path (no autograd for the in-place form), and an
    // inference tensor may only be modified inside inference mode: both take the full path.
    XQ_TRY(!x.requires_grad);
    XQ_TRY(plain_inplace_target(x.obj));
    XQ_TRY(plain_eager(a.requires_grad));
  }
  const TensorView xv = x.wview();
  const ConstTensorView av = a.cview();
  const CudaScope cuda(x.device);
  run_maybe_nogil(x.numel(), [&] { xquant::fake_tensor_quant_inplace(xv, av, o); });
  if (!strict) bump_version(x.obj);  // (the custom operator's own dispatch bumps it on the full path)
  return nb::borrow(inputs);
}

// npu_quantize. dtype: a torch dtype (lenient and strict: the Python layer has resolved other spellings).
nb::object t_quantize(nb::handle input, nb::handle scales, nb::handle zero_points, nb::handle dtype,
                      nb::handle axis, nb::handle div_mode, bool strict) {
  const char* op = "quantize";
  int code = -1;
  for (const auto& [o, c] : g_torch.qdtypes)
    if (o == dtype.ptr()) code = c;
  if (code < 0) {
    if (!strict) return nb::none();
    throw nb::value_error((prefix(op) + "dtype is not a quantized output dtype").c_str());
  }
  std::int64_t ax = 0;
  bool div = true;
  XQ_TRY(py_int64(axis.ptr(), ax, strict, op, "axis"));
  XQ_TRY(py_bool(div_mode.ptr(), div, strict, op, "div_mode"));
  TArg x, s;
  std::optional<TArg> zp;
  XQ_TRY(targ(input.ptr(), x, strict, op, "input"));
  XQ_TRY(targ(scales.ptr(), s, strict, op, "scales"));
  XQ_TRY(opt_targ(zero_points.ptr(), zp, strict, op, "zero_points"));
  if (!strict) XQ_TRY(plain_eager(x.requires_grad || s.requires_grad || (zp && zp->requires_grad)));
  const auto q = static_cast<xquant::QuantDType>(code);
  // The output shape, leniently: for invalid arguments the operator reports (in its own order) before it
  // looks at the output.
  Shape out_shape = x.shape;
  if (q == xquant::QuantDType::quint4x2 && !out_shape.empty()) out_shape.back() /= 8;
  Out out = alloc(out_shape, xquant::storage_dtype(q), &x);
  const ConstTensorView xv = x.cview(), sv = s.cview();
  std::optional<ConstTensorView> zv;
  if (zp) zv = zp->cview();
  const CudaScope cuda(x.device);
  run_maybe_nogil(x.numel(), [&] { xquant::quantize_out(out.view, xv, sv, zv, q, ax, div); });
  return out.tensor;
}

// pypto tile quant on dense tiles (padded rows take the full path). mode: 'SYM' / 'ASYM' (or the
// xquant.QuantMode members, a str enum).
nb::object t_tile_quant(nb::handle out, nb::handle src, nb::handle scale, nb::handle mode, nb::handle offset,
                        bool strict) {
  const char* op = "tile_quant";
  bool asym;
  if (PyUnicode_Check(mode.ptr()) && PyUnicode_CompareWithASCIIString(mode.ptr(), "SYM") == 0) asym = false;
  else if (PyUnicode_Check(mode.ptr()) && PyUnicode_CompareWithASCIIString(mode.ptr(), "ASYM") == 0) asym = true;
  else if (!strict) return nb::none();
  else throw nb::value_error((prefix(op) + "mode is not 'SYM' or 'ASYM'").c_str());
  TArg o, s, sc;
  std::optional<TArg> off;
  XQ_TRY(targ(out.ptr(), o, strict, op, "out"));
  XQ_TRY(targ(src.ptr(), s, strict, op, "src"));
  XQ_TRY(targ(scale.ptr(), sc, strict, op, "scale"));
  XQ_TRY(opt_targ(offset.ptr(), off, strict, op, "offset"));
  if (!strict) {
    XQ_TRY(!o.requires_grad);
    XQ_TRY(plain_inplace_target(o.obj));
    XQ_TRY(plain_eager(s.requires_grad || sc.requires_grad || (off && off->requires_grad)));
  }
  auto tile = [&](const TArg& t, const char* arg) {
    if (t.shape.size() != 2)
      throw nb::value_error((prefix(op) + arg + " has shape " + xquant::shape_str(t.shape) +
                             " but expected a 2-D tile")
                                .c_str());
    return xquant::ConstTileView{t.data, t.dtype, t.shape[0], t.shape[1], t.shape[1], t.device};
  };
  const xquant::ConstTileView ov = tile(o, "out"), sv = tile(s, "src"), scv = tile(sc, "scale");
  std::optional<xquant::ConstTileView> offv;
  if (off) offv = tile(*off, "offset");
  const xquant::TileView out_tile{o.data, ov.dtype, ov.rows, ov.cols, ov.row_pitch, ov.device};
  const CudaScope cuda(s.device);
  run_maybe_nogil(o.numel(), [&] {
    xquant::tile_quant(out_tile, sv, scv, asym ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM, offv);
  });
  if (!strict) bump_version(o.obj);
  return nb::borrow(out);
}

nb::object t_dynamic_quant_asymmetric(nb::handle x, nb::handle smooth_scales, nb::handle group_index,
                                      nb::handle dst_type, nb::handle quant_mode, bool strict) {
  const char* op = "dynamic_quant_asymmetric";
  int code = static_cast<int>(xquant::QuantDType::qint8);
  if (!dst_type.is_none()) {
    code = -1;
    for (const auto& [o, c] : g_torch.qdtypes)
      if (o == dst_type.ptr()) code = c;
    if (code < 0) {
      if (!strict) return nb::none();
      throw nb::value_error((prefix(op) + "dst_type is not a quantized output dtype").c_str());
    }
  }
  bool per_tensor;
  if (PyUnicode_Check(quant_mode.ptr()) && PyUnicode_CompareWithASCIIString(quant_mode.ptr(), "pertoken") == 0)
    per_tensor = false;
  else if (PyUnicode_Check(quant_mode.ptr()) &&
           PyUnicode_CompareWithASCIIString(quant_mode.ptr(), "pertensor") == 0)
    per_tensor = true;
  else if (!strict) return nb::none();
  else throw nb::value_error((prefix(op) + "quant_mode is not 'pertoken' or 'pertensor'").c_str());
  TArg xa;
  std::optional<TArg> sm, gi;
  XQ_TRY(targ(x.ptr(), xa, strict, op, "x"));
  XQ_TRY(opt_targ(smooth_scales.ptr(), sm, strict, op, "smooth_scales"));
  XQ_TRY(opt_targ(group_index.ptr(), gi, strict, op, "group_index"));
  if (!strict) XQ_TRY(plain_eager(xa.requires_grad || (sm && sm->requires_grad)));
  // Output shapes, leniently: for invalid arguments the C++ operator reports before it looks at them.
  const auto q = static_cast<xquant::QuantDType>(code);
  Shape y_shape = xa.shape;
  if (q == xquant::QuantDType::quint4x2 && !y_shape.empty()) y_shape.back() /= 8;
  Shape p_shape = per_tensor ? Shape{1} : Shape(xa.shape.begin(), xa.shape.end() - (xa.shape.empty() ? 0 : 1));
  Out y = alloc(y_shape, xquant::storage_dtype(q), &xa);
  Out sc = alloc(p_shape, DType::float32, &xa);
  Out of = alloc(p_shape, DType::float32, &xa);
  const ConstTensorView xv = xa.cview();
  std::optional<ConstTensorView> smv, giv;
  if (sm) smv = sm->cview();
  if (gi) giv = gi->cview();
  const CudaScope cuda(xa.device);
  run_maybe_nogil(xa.numel(), [&] {
    xquant::dynamic_quant_asymmetric_out(y.view, sc.view, of.view, xv, smv, giv, q,
                                         per_tensor ? xquant::DynamicQuantMode::pertensor
                                                    : xquant::DynamicQuantMode::pertoken);
  });
  return nb::make_tuple(y.tensor, sc.tensor, of.tensor);
}

// The dst_type of the dynamic quantizers: None -> qint8, else a torch dtype of g_torch.qdtypes; -1 when it is
// none of them (lenient: take the full path; strict: raises).
int dst_code(nb::handle dst_type, bool strict, const char* op, const char* arg) {
  if (dst_type.is_none()) return static_cast<int>(xquant::QuantDType::qint8);
  for (const auto& [o, c] : g_torch.qdtypes)
    if (o == dst_type.ptr()) return c;
  if (!strict) return -1;
  throw nb::value_error((prefix(op) + arg + " is not a quantized dtype").c_str());
}

// npu_dynamic_quant (symmetric, per token).
nb::object t_dynamic_quant(nb::handle x, nb::handle smooth_scales, nb::handle group_index, nb::handle dst_type,
                           bool strict) {
  const char* op = "dynamic_quant";
  const int code = dst_code(dst_type, strict, op, "dst_type");
  XQ_TRY(code >= 0);
  TArg xa;
  std::optional<TArg> sm, gi;
  XQ_TRY(targ(x.ptr(), xa, strict, op, "x"));
  XQ_TRY(opt_targ(smooth_scales.ptr(), sm, strict, op, "smooth_scales"));
  XQ_TRY(opt_targ(group_index.ptr(), gi, strict, op, "group_index"));
  if (!strict) XQ_TRY(plain_eager(xa.requires_grad || (sm && sm->requires_grad)));
  // Output shapes, leniently: for invalid arguments the C++ operator reports before it looks at them.
  const auto q = static_cast<xquant::QuantDType>(code);
  Shape y_shape = xa.shape;
  if (q == xquant::QuantDType::quint4x2 && !y_shape.empty()) y_shape.back() /= 8;
  const Shape p_shape(xa.shape.begin(), xa.shape.end() - (xa.shape.empty() ? 0 : 1));
  Out y = alloc(y_shape, xquant::storage_dtype(q), &xa);
  Out sc = alloc(p_shape, DType::float32, &xa);
  const ConstTensorView xv = xa.cview();
  std::optional<ConstTensorView> smv, giv;
  if (sm) smv = sm->cview();
  if (gi) giv = gi->cview();
  const CudaScope cuda(xa.device);
  run_maybe_nogil(xa.numel(), [&] { xquant::dynamic_quant_out(y.view, sc.view, xv, smv, giv, q); });
  return nb::make_tuple(y.tensor, sc.tensor);
}

// npu_anti_quant. dst_dtype: None (float16) or torch.float16 / bfloat16 / float32; src_dtype: None (qint8) or
// a torch dtype of g_torch.qdtypes.
nb::object t_anti_quant(nb::handle x, nb::handle scale, nb::handle offset, nb::handle dst_dtype, nb::handle src_dtype,
                        bool strict) {
  const char* op = "anti_quant";
  DType dst = DType::float16;
  if (!dst_dtype.is_none()) {
    bool found = false;
    for (const auto& [o, d] : g_torch.dtypes)
      if (o == dst_dtype.ptr() && xquant::is_floating(d)) {
        dst = d;
        found = true;
      }
    if (!found) {
      if (!strict) return nb::none();
      throw nb::value_error((prefix(op) + "dst_dtype is not float16, bfloat16 or float32").c_str());
    }
  }
  const int code = dst_code(src_dtype, strict, op, "src_dtype");
  XQ_TRY(code >= 0);
  TArg xa, sa;
  std::optional<TArg> oa;
  XQ_TRY(targ(x.ptr(), xa, strict, op, "x"));
  XQ_TRY(targ(scale.ptr(), sa, strict, op, "scale"));
  XQ_TRY(opt_targ(offset.ptr(), oa, strict, op, "offset"));
  if (!strict) XQ_TRY(plain_eager(sa.requires_grad || (oa && oa->requires_grad)));
  // The output shape (x's logical shape), leniently: for invalid arguments the operator reports first.
  const auto q = static_cast<xquant::QuantDType>(code);
  Shape out_shape = xa.shape;
  if (q == xquant::QuantDType::quint4x2 && !out_shape.empty() && out_shape.back() <= INT64_MAX / 8)
    out_shape.back() *= 8;
  Out out = alloc(out_shape, dst, &xa);
  const ConstTensorView xv = xa.cview(), sv = sa.cview();
  std::optional<ConstTensorView> ov;
  if (oa) ov = oa->cview();
  const CudaScope cuda(xa.device);
  run_maybe_nogil(xquant::shape_numel(out_shape), [&] { xquant::anti_quant_out(out.view, xv, sv, ov, q); });
  return out.tensor;
}

nb::object t_acts_ulq(nb::handle x, nb::handle clamp_min, nb::handle clamp_max, nb::handle fixed_min,
                      nb::handle num_bits, bool strict) {
  const char* op = "acts_ulq";
  bool fixed = false;
  int nbits = 8;
  XQ_TRY(py_bool(fixed_min.ptr(), fixed, strict, op, "fixed_min"));
  XQ_TRY(py_int(num_bits.ptr(), nbits, strict, op, "num_bits"));
  TArg xa, lo, hi;
  XQ_TRY(targ(x.ptr(), xa, strict, op, "x"));
  // Python numbers for the clamps: 0-d tensors of x's dtype; float32 only here (a float16 / bfloat16
  // rounding of a double takes the full path, which rounds exactly as torch.tensor does).
  float lo_value = 0.0f, hi_value = 0.0f;
  if (!strict && xa.dtype == DType::float32 && py_number(clamp_min.ptr(), lo_value)) {
    lo.data = &lo_value;
  } else {
    XQ_TRY(targ(clamp_min.ptr(), lo, strict, op, "clamp_min"));
  }
  if (!strict && xa.dtype == DType::float32 && py_number(clamp_max.ptr(), hi_value)) {
    hi.data = &hi_value;
  } else {
    XQ_TRY(targ(clamp_max.ptr(), hi, strict, op, "clamp_max"));
  }
  if (!strict) {
    nb::object v = autograd_verdict(xa.requires_grad || lo.requires_grad || hi.requires_grad);
    if (v.ptr() != Py_True) return v;
  }
  Shape shape;
  try {
    shape = xquant::acts_ulq_output_shape(xa.shape, lo.shape, hi.shape);
  } catch (const xquant::Error&) {
    shape = xa.shape;  // the operator reports the mismatch below, naming the argument
  }
  Out y = alloc(shape, xa.dtype, &xa), m0 = alloc(shape, xa.dtype, &xa), m1 = alloc(shape, xa.dtype, &xa),
      loss = alloc(shape, xa.dtype, &xa);
  const ConstTensorView xv = xa.cview(), lov = lo.cview(), hiv = hi.cview();
  const CudaScope cuda(xa.device);
  run_maybe_nogil(xquant::shape_numel(shape), [&] {
    xquant::acts_ulq_out(y.view, m0.view, m1.view, loss.view, xv, lov, hiv, fixed, nbits);
  });
  return nb::make_tuple(y.tensor, m0.tensor, m1.tensor, loss.tensor);
}

#undef XQ_TRY

}  // namespace

namespace {
nb::dlpack::dtype dlpack_of(DType dt) {
  switch (dt) {
    case DType::float32: return nb::dtype<float>();
    case DType::float16: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::bfloat16: return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::int8: return nb::dtype<std::int8_t>();
    case DType::uint8: return nb::dtype<std::uint8_t>();
    case DType::int32: return nb::dtype<std::int32_t>();
    case DType::int64: return nb::dtype<std::int64_t>();
  }
  return nb::dtype<float>();
}

// A torch tensor over a new xquant::Tensor (owned through a capsule); *data receives its memory.
nb::ndarray<nb::pytorch, nb::device::cpu> xq_torch_tensor(const Shape& shape, DType dt, void** data) {
  auto* t = new xquant::Tensor(dt, shape);
  nb::capsule owner(t, [](void* p) noexcept { delete static_cast<xquant::Tensor*>(p); });
  std::vector<std::size_t> dims(shape.begin(), shape.end());
  *data = t->data();
  return nb::ndarray<nb::pytorch, nb::device::cpu>(t->data(), dims.size(), dims.data(), owner, nullptr,
                                                   dlpack_of(dt));
}
}  // namespace

// A torch tensor over an xquant::Tensor allocation (owned through a capsule): large outputs get
// huge-page-backed, 2 MiB-aligned memory that xquant's allocation cache reuses across calls, instead of
// fresh 4 KiB pages that fault and are zero-filled on first touch (xquant/runtime.hpp).
nb::ndarray<nb::pytorch, nb::device::cpu> empty_torch(const std::vector<std::int64_t>& shape, const std::string& dtype) {
  DType dt;
  if (dtype == "float32") dt = DType::float32;
  else if (dtype == "float16") dt = DType::float16;
  else if (dtype == "bfloat16") dt = DType::bfloat16;
  else if (dtype == "int8") dt = DType::int8;
  else if (dtype == "uint8") dt = DType::uint8;
  else if (dtype == "int32") dt = DType::int32;
  else throw nb::type_error(("xquant::empty: dtype " + dtype + " is not supported").c_str());
  void* data = nullptr;
  return xq_torch_tensor(Shape(shape.begin(), shape.end()), dt, &data);
}


// ---- the library for xquant._torch_fast (core_api.hpp) ------------------------------------------------------

namespace api {
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

void fake_tensor_quant(Status& st, const TensorView& out, const ConstTensorView& x, const ConstTensorView& amax,
                       const std::int64_t* axis, const xquant::FakeQuantOptions& o) {
  guarded(st, [&] {
    if (axis) xquant::fake_tensor_quant_with_axis_out(out, x, amax, *axis, o);
    else xquant::fake_tensor_quant_out(out, x, amax, o);
  });
}
void fake_tensor_quant_inplace(Status& st, const TensorView& x, const ConstTensorView& amax,
                               const xquant::FakeQuantOptions& o) {
  guarded(st, [&] { xquant::fake_tensor_quant_inplace(x, amax, o); });
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
void dynamic_quant_asymmetric(Status& st, const TensorView& y, const TensorView& scale, const TensorView& offset,
                              const ConstTensorView& x, const OptView& sm, const OptView& gi, xquant::QuantDType q,
                              bool per_tensor) {
  guarded(st, [&] {
    xquant::dynamic_quant_asymmetric_out(
        y, scale, offset, x, sm, gi, q,
        per_tensor ? xquant::DynamicQuantMode::pertensor : xquant::DynamicQuantMode::pertoken);
  });
}
void dynamic_quant(Status& st, const TensorView& y, const TensorView& scale, const ConstTensorView& x,
                   const OptView& sm, const OptView& gi, xquant::QuantDType q) {
  guarded(st, [&] { xquant::dynamic_quant_out(y, scale, x, sm, gi, q); });
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
bool acts_ulq_output_shape(const Shape& x, const Shape& lo, const Shape& hi, Shape& out) noexcept {
  try {
    out = xquant::acts_ulq_output_shape(x, lo, hi);
    return true;
  } catch (...) {
    return false;
  }
}
void* new_tensor(Status& st, DType dt, const Shape& shape, void** data) {
  xquant::Tensor* t = nullptr;
  guarded(st, [&] { t = new xquant::Tensor(dt, shape); });
  if (t) *data = t->data();
  return t;
}
void free_tensor(void* owner) noexcept { delete static_cast<xquant::Tensor*>(owner); }

const xquant_py::CoreApi kApi = {xquant_py::kCoreApiVersion,
                                 sizeof(xquant_py::CoreApi),
                                 &fake_tensor_quant,
                                 &fake_tensor_quant_inplace,
                                 &quantize,
                                 &tile_quant,
                                 &dynamic_quant_asymmetric,
                                 &dynamic_quant,
                                 &anti_quant,
                                 &acts_ulq,
                                 &acts_ulq_output_shape,
                                 &new_tensor,
                                 &free_tensor};
}  // namespace api

NB_MODULE(_core, m) {
  m.doc() = "xquant's compiled core: thin out-variant bindings used by xquant.npu (not a public API).";
  m.attr("__version__") = xquant::kVersion;
  m.attr("QINT8") = static_cast<int>(xquant::QuantDType::qint8);
  m.attr("QUINT8") = static_cast<int>(xquant::QuantDType::quint8);
  m.attr("QINT32") = static_cast<int>(xquant::QuantDType::qint32);
  m.attr("QUINT4X2") = static_cast<int>(xquant::QuantDType::quint4x2);
  // The library for xquant._torch_fast (core_api.hpp; PyCapsule_Import("xquant._core._api")).
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
  m.def("fake_tensor_quant_inplace", &fake_tensor_quant_inplace, "inputs"_a, "amax"_a, "num_bits"_a,
        "is_unsigned"_a, "narrow_range"_a);
  m.def("fake_tensor_quant_backward", &fake_tensor_quant_backward, "grad_inputs"_a, "grad_amax"_a.none(),
        "grad_out"_a, "inputs"_a, "amax"_a, "axis"_a.none(), "num_bits"_a, "is_unsigned"_a, "narrow_range"_a);
  m.def("quantize", &quantize, "out"_a, "input"_a, "scales"_a, "zero_points"_a.none(), "dtype"_a, "axis"_a,
        "div_mode"_a);
  m.def("tile_quant", &tile_quant, "out"_a, "src"_a, "scale"_a, "asym"_a, "offset"_a.none());
  m.def("dynamic_quant_asymmetric", &dynamic_quant_asymmetric, "y"_a, "scale"_a, "offset"_a, "x"_a,
        "smooth_scales"_a.none(), "group_index"_a.none(), "dst_type"_a, "per_tensor"_a);
  m.def("dynamic_quant", &dynamic_quant, "y"_a, "scale"_a, "x"_a, "smooth_scales"_a.none(), "group_index"_a.none(),
        "dst_type"_a);
  m.def("anti_quant", &anti_quant, "out"_a, "x"_a, "scale"_a, "offset"_a.none(), "src_dtype"_a);
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
  m.def("cuda_built", &xquant::cuda_built);
  m.def("cuda_available", &xquant::cuda_available);
  m.def("cuda_unavailable_reason", &xquant::cuda_unavailable_reason);
  // torch tensors without DLPack (see t_fake_tensor_quant): None means "take the full path" (lenient).
  // strict defaults to False where xquant._torch_fast has a namesake of the same signature (lenient only).
  m.def("init_torch", &init_torch, "api"_a);
  m.def("plain_modes", [] { return g_torch.lenient && plain_eager(false); });
  m.def("t_fake_tensor_quant", &t_fake_tensor_quant, "inputs"_a, "amax"_a, "axis"_a.none(), "num_bits"_a,
        "is_unsigned"_a, "narrow_range"_a, "strict"_a = false);
  m.def("t_fake_tensor_quant_inplace", &t_fake_tensor_quant_inplace, "inputs"_a, "amax"_a, "num_bits"_a,
        "is_unsigned"_a, "narrow_range"_a, "strict"_a = false);
  m.def("t_quantize", &t_quantize, "input"_a, "scales"_a, "zero_points"_a.none(), "dtype"_a, "axis"_a,
        "div_mode"_a, "strict"_a = false);
  m.def("t_tile_quant", &t_tile_quant, "out"_a, "src"_a, "scale"_a, "mode"_a, "offset"_a.none(), "strict"_a = false);
  m.def("t_dynamic_quant_asymmetric", &t_dynamic_quant_asymmetric, "x"_a, "smooth_scales"_a.none(),
        "group_index"_a.none(), "dst_type"_a.none(), "quant_mode"_a, "strict"_a = false);
  m.def("t_dynamic_quant", &t_dynamic_quant, "x"_a, "smooth_scales"_a.none(), "group_index"_a.none(),
        "dst_type"_a.none(), "strict"_a = false);
  m.def("t_anti_quant", &t_anti_quant, "x"_a, "scale"_a, "offset"_a.none(), "dst_dtype"_a.none(),
        "src_dtype"_a.none(), "strict"_a = false);
  m.def("t_acts_ulq", &t_acts_ulq, "x"_a, "clamp_min"_a, "clamp_max"_a, "fixed_min"_a, "num_bits"_a, "strict"_a = false);
  m.def("acts_ulq_backward", &acts_ulq_backward, "x_grad"_a, "clamp_min_grad"_a, "clamp_max_grad"_a, "y_grad"_a,
        "clamp_min"_a, "clamp_max"_a, "clamp_min_mask"_a, "clamp_max_mask"_a, "x_clamped_loss"_a, "fixed_min"_a,
        "num_bits"_a);
}
