// xquant._torch_ext: the PyTorch operators torch.ops.xquant.*, defined once, in C++, against the installed
// PyTorch's C++ API (built only where torch is importable at build time: python/CMakeLists.txt).
//
//   TORCH_LIBRARY(xquant)                 the schemas of every operator (kSchemas below)
//   TORCH_LIBRARY_IMPL(xquant, CPU/CUDA)  one kernel per operator (k_<op>): plan, allocate, run
//   TORCH_LIBRARY_IMPL(xquant, Meta)      one shape kernel per operator (m_<op>): plan, allocate on meta
//
// Both kinds of kernel start with the library's planning entry (xquant/plan.hpp: the operator's own
// validation of dtypes, shapes and options, without data), so eager calls, meta tensors, FakeTensor,
// torch.compile and torch.export report the same errors from the same code; the CPU / CUDA kernel then runs
// the library's out-variant, which adds the checks that need data (amax values, group_index row ends,
// devices, overlaps). Library errors arrive as c10::TypeError (xquant's dtype_mismatch) or c10::ValueError
// (the rest), which torch raises in Python as TypeError / ValueError with the library's message.
//
// The eager fast path (f_<op>, Python functions of this module): in plain eager mode xquant.npu calls the
// same implementation directly, skipping the dispatcher's Python-to-C++ boxing (10-20 us per call), when
// every tensor is a plain dense CPU tensor and no autograd recording, mode, transform, trace or profiler
// is active; otherwise it returns None and xquant.npu calls torch.ops.xquant.<op>. Same kernel, same
// results. Autograd and batching rules (vmap) are registered in Python (xquant/_torch_ops.py).
//
// The library itself is the one inside xquant._core, reached through the function table of core_api.hpp
// (one copy of its state per process: threads, backend, allocation cache, CUDA stream).
#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/TracerMode.h>
#include <ATen/core/Tensor.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/ops/empty.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/library.h>

#include <cctype>
#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core_api.hpp"
#include "xquant/version.hpp"

#ifndef XQUANT_TORCH_VERSION
#error "XQUANT_TORCH_VERSION (the build-time torch.__version__) must be defined"
#endif

namespace {

using xquant::ConstTensorView;
using xquant::Device;
using xquant::DType;
using xquant::QuantDType;
using xquant::Shape;
using xquant::TensorSpec;
using xquant::TensorView;
using xquant_py::OptSpec;
using xquant_py::Status;

// The xquant library, as xquant._core holds it (core_api.hpp): set when the module is imported.
const xquant_py::CoreApi* g_api = nullptr;

// Outputs of at least this many bytes come from xquant's allocator (huge pages, reused by its cache).
constexpr std::size_t kXqAllocMinBytes = std::size_t{2} << 20;
// Fast-path calls on fewer elements keep the GIL (releasing and re-taking it costs more than the kernel).
constexpr std::int64_t kReleaseGilMinElements = std::int64_t{1} << 15;

std::string prefix(const char* op) { return std::string("xquant::") + op + ": "; }

[[noreturn]] void type_error(const char* op, const std::string& msg) { C10_THROW_ERROR(TypeError, prefix(op) + msg); }
[[noreturn]] void value_error(const char* op, const std::string& msg) { C10_THROW_ERROR(ValueError, prefix(op) + msg); }

// A failed Status (the library's xquant::Error) as the c10 error torch raises in Python as the same type.
void check(const Status& st) {
  switch (st.code) {
    case Status::ok:
      return;
    case Status::type_error:
      C10_THROW_ERROR(TypeError, st.message);
    case Status::value_error:
      C10_THROW_ERROR(ValueError, st.message);
    case Status::no_memory:
      throw std::bad_alloc();
    default:
      C10_THROW_ERROR(Error, st.message);
  }
}

// ---- dtypes ---------------------------------------------------------------------------------------------

std::optional<DType> to_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return DType::float32;
    case at::kHalf:
      return DType::float16;
    case at::kBFloat16:
      return DType::bfloat16;
    case at::kChar:
      return DType::int8;
    case at::kByte:
      return DType::uint8;
    case at::kInt:
      return DType::int32;
    case at::kLong:
      return DType::int64;
    default:
      return std::nullopt;
  }
}

at::ScalarType to_scalar(DType d) {
  switch (d) {
    case DType::float32:
      return at::kFloat;
    case DType::float16:
      return at::kHalf;
    case DType::bfloat16:
      return at::kBFloat16;
    case DType::int8:
      return at::kChar;
    case DType::uint8:
      return at::kByte;
    case DType::int32:
      return at::kInt;
    case DType::int64:
      return at::kLong;
    case DType::float8_e4m3fn:
      return at::kFloat8_e4m3fn;
    case DType::float8_e5m2:
      return at::kFloat8_e5m2;
  }
  return at::kFloat;
}

std::size_t bytes_per(DType d) {
  switch (d) {
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float16:
    case DType::bfloat16:
      return 2;
    case DType::int8:
    case DType::uint8:
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:
      return 1;
    case DType::int64:
      return 8;
  }
  return 4;
}

// A torch dtype as Python prints it without "torch.": float64, bool, qint8, ...
std::string torch_name(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kComplexHalf:
      return "complex32";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    case at::kBool:
      return "bool";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kQInt8:
      return "qint8";
    case at::kQUInt8:
      return "quint8";
    case at::kQInt32:
      return "qint32";
    case at::kQUInt4x2:
      return "quint4x2";
    default: {
      std::string n = c10::toString(s);
      for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return n;
    }
  }
}

// The quantized kinds (npu_quantize's dtype, the dynamic quantizers' dst_type, anti_quant's src_dtype).
std::optional<QuantDType> to_quant(at::ScalarType s) {
  switch (s) {
    case at::kQInt8:
    case at::kChar:
      return QuantDType::qint8;
    case at::kQUInt8:
    case at::kByte:
      return QuantDType::quint8;
    case at::kQInt32:
    case at::kInt:
      return QuantDType::qint32;
    case at::kQUInt4x2:
      return QuantDType::quint4x2;
    case at::kFloat8_e4m3fn:
      return QuantDType::float8_e4m3fn;
    case at::kFloat8_e5m2:
      return QuantDType::float8_e5m2;
    default:
      return std::nullopt;
  }
}

QuantDType quant_of(const char* op, const char* name, at::ScalarType s) {
  if (auto q = to_quant(s)) return *q;
  value_error(op, std::string(name) + " is torch." + torch_name(s) +
                      " but expected one of torch.qint8, torch.quint8, torch.qint32 / torch.int32, torch.quint4x2, "
                      "torch.float8_e4m3fn, torch.float8_e5m2 (NumPy: int8, uint8, int32, ml_dtypes float8; strings: "
                      "'qint8', 'quint8', 'qint32', 'quint4x2', 'float8_e4m3fn', 'float8_e5m2')");
}

DType storage_of(QuantDType q) {
  switch (q) {
    case QuantDType::qint8:
      return DType::int8;
    case QuantDType::quint8:
      return DType::uint8;
    case QuantDType::qint32:
    case QuantDType::quint4x2:
      return DType::int32;
    case QuantDType::float8_e4m3fn:
      return DType::float8_e4m3fn;
    case QuantDType::float8_e5m2:
      return DType::float8_e5m2;
  }
  return DType::int8;
}

int to_int(const char* op, const char* name, std::int64_t v) {
  if (v < INT_MIN || v > INT_MAX)
    value_error(op, std::string(name) + " is " + std::to_string(v) + " which does not fit in 32 bits");
  return static_cast<int>(v);
}

xquant::FakeQuantOptions fq_options(const char* op, std::int64_t num_bits, bool is_unsigned, bool narrow_range) {
  xquant::FakeQuantOptions o;
  o.num_bits = to_int(op, "num_bits", num_bits);
  o.is_unsigned = is_unsigned;
  o.narrow_range = narrow_range;
  return o;
}

// ---- tensors --------------------------------------------------------------------------------------------

std::string device_str(const at::Device& d) {
  return d.is_cuda() ? "cuda:" + std::to_string(d.has_index() ? d.index() : 0) : d.str();
}

// What the library reads of a tensor: a dense copy where the caller's tensor is not dense (or is a negative
// / conjugate view, materialized), its dtype, shape and device. The spec is all a meta kernel reads.
struct Arg {
  at::Tensor keep;  // the tensor the view points into (the caller's, or the dense copy)
  ConstTensorView v;
  TensorSpec spec() const { return {v.dtype, v.shape}; }
};

DType dtype_of(const char* op, const char* name, const at::Tensor& t) {
  const std::optional<DType> dt = to_dtype(t.scalar_type());
  if (!dt)
    type_error(op, std::string(name) + " has dtype " +
                       (t.scalar_type() == at::kUInt16 ? std::string("torch.uint16") : torch_name(t.scalar_type())) +
                       " which xquant does not support (float32, float16, bfloat16, int8, uint8, int32, int64)");
  return *dt;
}

Device xdevice(const at::Tensor& t) { return t.is_cuda() ? Device::cuda(t.get_device()) : Device::cpu(); }

// A meta tensor's sizes (FakeTensors under torch.compile / torch.export may have symbolic ones: planning
// needs their values, so each is guarded on, i.e. specialized, as torch does for data-independent checks).
std::int64_t guarded(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }
Shape sizes_of(const at::Tensor& t) {
  Shape s;
  for (const c10::SymInt& d : t.sym_sizes()) s.push_back(guarded(d));
  return s;
}

Arg arg_of(const char* op, const char* name, const at::Tensor& t) {
  Arg a;
  a.v.dtype = dtype_of(op, name, t);
  if (t.is_meta()) {  // a Meta kernel: the spec is all it reads
    a.keep = t;
    a.v.shape = sizes_of(t);
    a.v.device = xdevice(t);
    return a;
  }
  a.keep = t.is_contiguous() ? t : t.contiguous();
  if (a.keep.is_neg()) a.keep = a.keep.resolve_neg();
  if (a.keep.is_conj()) a.keep = a.keep.resolve_conj();
  const auto sizes = a.keep.sizes();
  a.v.shape.assign(sizes.begin(), sizes.end());
  a.v.device = xdevice(a.keep);
  a.v.data = a.keep.is_meta() || a.keep.numel() == 0 ? nullptr : a.keep.const_data_ptr();
  return a;
}

std::optional<Arg> opt_arg(const char* op, const char* name, const std::optional<at::Tensor>& t) {
  if (!t || !t->defined()) return std::nullopt;
  return arg_of(op, name, *t);
}

OptSpec opt_spec(const std::optional<Arg>& a) {
  if (!a) return std::nullopt;
  return a->spec();
}

std::optional<ConstTensorView> opt_view(const std::optional<Arg>& a) {
  if (!a) return std::nullopt;
  return a->v;
}

// A tensor written in place holds its own values: a negative (or conjugate) view's memory holds the
// negated ones. (xquant.npu checks this before the dispatcher, whose Negative / Conjugate fallbacks would
// otherwise materialize the view first: check_writable, exported below.)
void check_own_values(const char* op, const char* name, const at::Tensor& t) {
  if (t.is_neg() || t.is_conj())
    value_error(op, std::string(name) + " is a " + (t.is_neg() ? "negative" : "conjugate") +
                        " view (its memory holds transformed values); an in-place call cannot write through it "
                        "(call .resolve_neg() / .resolve_conj() first and use the result)");
}

// A tensor written in place: dense already (never copied) and holding its own values.
void check_inplace_target(const char* op, const char* name, const at::Tensor& t) {
  if (!t.is_contiguous())
    value_error(op, std::string(name) +
                        " is not contiguous; an in-place call cannot make it contiguous for you "
                        "(call .contiguous() first and use the result)");
  check_own_values(op, name, t);
}

void* writable_data(const at::Tensor& t) { return t.is_meta() || t.numel() == 0 ? nullptr : t.mutable_data_ptr(); }

// What an in-place torch operator does to its target's version counter (the dispatcher's ADInplaceOrView
// key falls through for these operators).
void bump_version(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

// ---- outputs --------------------------------------------------------------------------------------------

struct Out {
  at::Tensor t;
  TensorView v;
};

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// An output on `dev`: CPU outputs of 2 MiB or more from xquant's allocator (at::from_blob over an
// xquant::Tensor), smaller ones from at::detail::empty_cpu (at::empty's CPU kernel without the dispatcher);
// CUDA (torch's caching allocator) and meta outputs from at::empty.
Out alloc(Shape shape, DType dt, const at::Device& dev) {
  Out o;
  const std::int64_t n = numel_of(shape);
  if (dev.is_cpu()) {
    if (n > 0 && static_cast<std::size_t>(n) * bytes_per(dt) >= kXqAllocMinBytes) {
      Status st;
      void* data = nullptr;
      void* owner = g_api->new_tensor(st, dt, shape, &data);
      check(st);
      const xquant_py::CoreApi* api = g_api;
      o.t = at::from_blob(
          data, shape, [api, owner](void*) { api->free_tensor(owner); },
          at::TensorOptions().dtype(to_scalar(dt)).device(at::kCPU));
    } else {
      o.t = at::Tensor(at::detail::empty_cpu(shape, to_scalar(dt)));
    }
  } else {
    o.t = at::empty(shape, at::TensorOptions().dtype(to_scalar(dt)).device(dev));
  }
  o.v = {writable_data(o.t), dt, std::move(shape), xdevice(o.t)};
  return o;
}

// ---- CUDA calls -----------------------------------------------------------------------------------------
//
// A kernel on CUDA tensors runs the way torch's own CUDA kernels do: with the main tensor's device current
// (c10::DeviceGuard) and on torch's current stream of that device (handed to the library's
// CudaStreamGuard), asynchronously. Mixed devices are reported by the library, naming the argument.
class CudaScope {
 public:
  // cuda: the CUDA kernel (its first step, whatever the tensors: the dispatcher chose the CUDA key).
  CudaScope(bool cuda, const char* op, const char* name, const at::Tensor& t) {
    if (!cuda) return;
    if (!g_api->cuda_available()) {
      std::string reason;
      g_api->cuda_unavailable_reason(reason);
      type_error(op, std::string(name) + " is on " + device_str(t.device()) +
                         " but xquant cannot run on CUDA tensors: " + reason +
                         " (move the tensors with .cpu(), or install an xquant built with CUDA)");
    }
    if (!t.is_cuda()) return;  // another argument is on CUDA: the library reports the mix, naming it
    guard_.emplace(t.device());
    const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    stream_ = g_api->push_cuda_stream(impl.getStream(t.device()).native_handle());
  }
  ~CudaScope() {
    if (stream_) g_api->pop_cuda_stream(stream_);
  }
  CudaScope(const CudaScope&) = delete;
  CudaScope& operator=(const CudaScope&) = delete;

 private:
  std::optional<c10::DeviceGuard> guard_;
  void* stream_ = nullptr;
};

// ---- planning (the library's validation without data) ---------------------------------------------------

enum FqForm { kPerTensor = 0, kInplace = 1, kWithAxis = 2 };
const char* fq_name(FqForm f) {
  return f == kWithAxis  ? "fake_tensor_quant_with_axis"
         : f == kInplace ? "fake_tensor_quant_inplace"
                         : "fake_tensor_quant";
}

// One planning call through _core's function table: the library's validation on dtypes and shapes, its
// error raised as the eager call raises it, the output shape(s) returned.
template <class Out, class... Params, class... Args>
Out plan_call(void (*xquant_py::CoreApi::*entry)(Status&, Out&, Params...), Args&&... args) {
  Status st;
  Out out{};
  (g_api->*entry)(st, out, std::forward<Args>(args)...);
  check(st);
  return out;
}

Shape plan_fq(FqForm form, const TensorSpec& x, const TensorSpec& a, std::int64_t axis,
              const xquant::FakeQuantOptions& o) {
  return plan_call(&xquant_py::CoreApi::plan_fake_tensor_quant, static_cast<int>(form), x, a, axis, o);
}
Shape p_quantize(const TensorSpec& x, const TensorSpec& s, const OptSpec& zp, QuantDType q, std::int64_t axis,
                 bool div_mode) {
  return plan_call(&xquant_py::CoreApi::plan_quantize, x, s, zp, q, axis, div_mode);
}
xquant::DynamicQuantShapes plan_dynamic(bool symmetric, const TensorSpec& x, const OptSpec& sm, const OptSpec& gi,
                                        QuantDType q, int mode) {
  return plan_call(&xquant_py::CoreApi::plan_dynamic_quant, symmetric, x, sm, gi, q, mode);
}
Shape p_anti_quant(const TensorSpec& x, const TensorSpec& s, const OptSpec& off, QuantDType q) {
  return plan_call(&xquant_py::CoreApi::plan_anti_quant, x, s, off, q);
}
Shape p_acts_ulq(const TensorSpec& x, const TensorSpec& lo, const TensorSpec& hi, int num_bits) {
  return plan_call(&xquant_py::CoreApi::plan_acts_ulq, x, lo, hi, num_bits);
}

// ---- argument conversions shared by the kernels ---------------------------------------------------------

bool tile_asym(const char* op, c10::string_view mode) {
  if (mode == "SYM") return false;
  if (mode == "ASYM") return true;
  value_error(op, "mode is '" + std::string(mode) + "' but expected 'SYM' or 'ASYM'");
}

// The dynamic quantizations' quant_mode: 0 pertoken, 1 pertensor, 2 perchannel (xquant::DynamicQuantMode).
int dq_mode(const char* op, c10::string_view mode) {
  if (mode == "pertoken") return 0;
  if (mode == "pertensor") return 1;
  if (mode == "perchannel") return 2;
  value_error(op, "quant_mode is '" + std::string(mode) + "' but expected 'pertoken', 'pertensor' or 'perchannel'");
}
// dst_type_max: on the NPU the range of hifloat8 outputs only (0.0: the type's own); xquant makes no hifloat8.
void check_dst_type_max(const char* op, double v) {
  if (v != 0.0)
    value_error(op, "dst_type_max is " + std::to_string(v) +
                        " but expected 0.0: the NPU applies it to hifloat8 outputs only, which torch (and xquant) "
                        "lack; int8 / int4 / float8 use their own maximum");
}

QuantDType opt_quant(const char* op, const char* name, std::optional<at::ScalarType> s) {
  return s ? quant_of(op, name, *s) : QuantDType::qint8;
}

DType dst_float(const char* op, std::optional<at::ScalarType> s) {
  if (!s) return DType::float16;
  if (*s == at::kHalf) return DType::float16;
  if (*s == at::kBFloat16) return DType::bfloat16;
  if (*s == at::kFloat) return DType::float32;
  value_error(op, "dst_dtype is torch." + torch_name(*s) + " but expected float16, bfloat16 or float32");
}

Shape x_shape_of(const char* op, c10::SymIntArrayRef x_shape) {
  Shape shape;
  for (const c10::SymInt& d : x_shape) shape.push_back(guarded(d));
  for (const std::int64_t d : shape) {
    if (d >= 0) continue;
    std::string s = "[";  // (as xquant::shape_str prints it; this module does not link the library)
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    value_error(op, "x_shape is " + s + "] with a negative dimension");
  }
  return shape;
}

// A 2-D tile of a tensor: rows may be padded (the row pitch is the row stride), columns unit-stride.
xquant::ConstTileView tile_of(const Arg& a, const at::Tensor& t) {
  const auto rows = t.size(0), cols = t.size(1);
  const std::int64_t pitch = rows > 1 && cols > 0 ? t.stride(0) : cols;
  return {a.v.data, a.v.dtype, rows, cols, pitch, a.v.device};
}

// A tile input as the kernel reads it: the caller's memory when its rows are unit-stride (possibly
// padded), else a dense copy.
struct TileArg {
  at::Tensor t;
  Arg a;
};
bool tile_ok(const at::Tensor& t) {
  if (t.dim() != 2) return true;
  const std::int64_t rows = guarded(t.sym_size(0)), cols = guarded(t.sym_size(1));
  if (rows == 0 || cols == 0) return true;
  return (cols <= 1 || guarded(t.sym_stride(1)) == 1) && (rows <= 1 || guarded(t.sym_stride(0)) >= cols);
}
TileArg tile_arg(const char* op, const char* name, const at::Tensor& t) {
  TileArg r;
  r.t = tile_ok(t) ? t : t.contiguous();
  if (r.t.is_neg()) r.t = r.t.resolve_neg();
  r.a.v.dtype = dtype_of(op, name, r.t);
  r.a.v.shape = sizes_of(r.t);
  r.a.v.device = xdevice(r.t);
  r.a.v.data = r.t.is_meta() || r.t.numel() == 0 ? nullptr : r.t.const_data_ptr();
  return r;
}

// ==== the operators ========================================================================================
//
// Each operator: impl_<op> (allocate, run the out-variant; shared by the dispatcher kernel k_<op> and the fast
// path f_<op>), and m_<op> (plan, allocate on meta). The out-variant's validation starts with the same
// checking functions plan_<op> runs, so both report the same first error; impl_<op> computes its output
// shapes leniently where they follow from the input's shape (an invalid call is reported before anything
// is written), and plans where they do not (broadcasting, the tiles' 2-D check).

// quantize / the dynamic quantizers: int4 packs eight per int32 along the last dimension. Lenient (an
// invalid last dimension is reported by the operator before the output is looked at).
Shape quantized_shape(const Shape& x, QuantDType q) {
  Shape s = x;
  if (q == QuantDType::quint4x2 && !s.empty()) s.back() /= 8;
  return s;
}

// ---- fake tensor quant ----------------------------------------------------------------------------------

at::Tensor impl_fake_tensor_quant(FqForm form, const Arg& x, const Arg& a, std::int64_t axis,
                                  const xquant::FakeQuantOptions& o, const at::Device& dev) {
  Out y = alloc(x.v.shape, x.v.dtype, dev);  // (the out-variant validates first: its planning, then the values)
  Status st;
  g_api->fake_tensor_quant(st, y.v, x.v, a.v, form == kWithAxis ? &axis : nullptr, o);
  check(st);
  return y.t;
}

template <bool kCuda>
at::Tensor k_fake_tensor_quant(const at::Tensor& inputs, const at::Tensor& amax, std::int64_t num_bits,
                               bool is_unsigned, bool narrow_range) {
  const char* op = "fake_tensor_quant";
  const Arg x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const CudaScope cuda(kCuda, op, "inputs", inputs);
  return impl_fake_tensor_quant(kPerTensor, x, a, 0, o, inputs.device());
}

template <bool kCuda>
at::Tensor k_fake_tensor_quant_with_axis(const at::Tensor& inputs, const at::Tensor& amax, std::int64_t axis,
                                         std::int64_t num_bits, bool is_unsigned, bool narrow_range) {
  const char* op = "fake_tensor_quant_with_axis";
  const Arg x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const CudaScope cuda(kCuda, op, "inputs", inputs);
  return impl_fake_tensor_quant(kWithAxis, x, a, axis, o, inputs.device());
}

at::Tensor m_fake_quant(FqForm form, const at::Tensor& inputs, const at::Tensor& amax, std::int64_t axis,
                        std::int64_t num_bits) {
  const char* op = fq_name(form);
  const Arg x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  xquant::FakeQuantOptions o;
  o.num_bits = to_int(op, "num_bits", num_bits);
  return alloc(plan_fq(form, x.spec(), a.spec(), axis, o), x.v.dtype, inputs.device()).t;
}

at::Tensor m_fake_tensor_quant(const at::Tensor& inputs, const at::Tensor& amax, std::int64_t num_bits, bool, bool) {
  return m_fake_quant(kPerTensor, inputs, amax, 0, num_bits);
}

at::Tensor m_fake_tensor_quant_with_axis(const at::Tensor& inputs, const at::Tensor& amax, std::int64_t axis,
                                         std::int64_t num_bits, bool, bool) {
  return m_fake_quant(kWithAxis, inputs, amax, axis, num_bits);
}

void impl_fake_tensor_quant_inplace(const at::Tensor& inputs, const Arg& x, const Arg& a,
                                    const xquant::FakeQuantOptions& o) {
  const TensorView xv{writable_data(inputs), x.v.dtype, x.v.shape, x.v.device};
  Status st;
  g_api->fake_tensor_quant_inplace(st, xv, a.v, o);
  check(st);
  bump_version(inputs);
}

template <bool kCuda>
void k_fake_tensor_quant_inplace(at::Tensor& inputs, const at::Tensor& amax, std::int64_t num_bits, bool is_unsigned,
                                 bool narrow_range) {
  const char* op = "fake_tensor_quant_inplace";
  check_inplace_target(op, "inputs", inputs);
  const Arg x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const CudaScope cuda(kCuda, op, "inputs", inputs);
  impl_fake_tensor_quant_inplace(inputs, x, a, o);
}

void m_fake_tensor_quant_inplace(at::Tensor& inputs, const at::Tensor& amax, std::int64_t num_bits, bool, bool) {
  const char* op = "fake_tensor_quant_inplace";
  check_inplace_target(op, "inputs", inputs);
  const Arg x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  xquant::FakeQuantOptions o;
  o.num_bits = to_int(op, "num_bits", num_bits);
  plan_fq(kInplace, x.spec(), a.spec(), 0, o);
}

void plan_fq_backward(const Arg& g, const Arg& x, const Arg& a, const std::optional<std::int64_t>& axis,
                      const xquant::FakeQuantOptions& o) {
  Status st;
  g_api->plan_fake_tensor_quant_backward(st, g.spec(), x.spec(), a.spec(), axis ? &*axis : nullptr, o);
  check(st);
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor> k_fake_tensor_quant_backward(const at::Tensor& grad_out, const at::Tensor& inputs,
                                                                const at::Tensor& amax,
                                                                std::optional<std::int64_t> axis, std::int64_t num_bits,
                                                                bool is_unsigned, bool narrow_range,
                                                                bool want_grad_amax) {
  const char* op = "fake_tensor_quant_backward";
  const Arg g = arg_of(op, "grad_out", grad_out), x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  const auto o = fq_options(op, num_bits, is_unsigned, narrow_range);
  const CudaScope cuda(kCuda, op, "inputs", inputs);
  plan_fq_backward(g, x, a, axis, o);
  Out gi = alloc(x.v.shape, x.v.dtype, inputs.device());
  Out ga = alloc(want_grad_amax ? a.v.shape : Shape{0}, a.v.dtype, amax.device());
  std::optional<TensorView> gav;
  if (want_grad_amax) gav = ga.v;
  Status st;
  g_api->fake_tensor_quant_backward(st, gi.v, gav, g.v, x.v, a.v, axis ? &*axis : nullptr, o);
  check(st);
  return {gi.t, ga.t};
}

std::tuple<at::Tensor, at::Tensor> m_fake_tensor_quant_backward(const at::Tensor& grad_out, const at::Tensor& inputs,
                                                                const at::Tensor& amax,
                                                                std::optional<std::int64_t> axis, std::int64_t num_bits,
                                                                bool, bool, bool want_grad_amax) {
  const char* op = "fake_tensor_quant_backward";
  const Arg g = arg_of(op, "grad_out", grad_out), x = arg_of(op, "inputs", inputs), a = arg_of(op, "amax", amax);
  xquant::FakeQuantOptions o;
  o.num_bits = to_int(op, "num_bits", num_bits);
  plan_fq_backward(g, x, a, axis, o);
  return {alloc(x.v.shape, x.v.dtype, inputs.device()).t,
          alloc(want_grad_amax ? a.v.shape : Shape{0}, a.v.dtype, amax.device()).t};
}

// ---- npu_quantize ---------------------------------------------------------------------------------------

at::Tensor impl_quantize(const Arg& x, const Arg& s, const std::optional<Arg>& zp, QuantDType q, std::int64_t axis,
                         bool div_mode, const at::Device& dev) {
  Out y = alloc(quantized_shape(x.v.shape, q), storage_of(q), dev);
  Status st;
  g_api->quantize(st, y.v, x.v, s.v, opt_view(zp), q, axis, div_mode);
  check(st);
  return y.t;
}

template <bool kCuda>
at::Tensor k_quantize(const at::Tensor& input, const at::Tensor& scales, const std::optional<at::Tensor>& zero_points,
                      at::ScalarType dtype, std::int64_t axis, bool div_mode) {
  const char* op = "quantize";
  const QuantDType q = quant_of(op, "dtype", dtype);
  const Arg x = arg_of(op, "input", input), s = arg_of(op, "scales", scales);
  const std::optional<Arg> zp = opt_arg(op, "zero_points", zero_points);
  const CudaScope cuda(kCuda, op, "input", input);
  return impl_quantize(x, s, zp, q, axis, div_mode, input.device());
}

at::Tensor m_quantize(const at::Tensor& input, const at::Tensor& scales, const std::optional<at::Tensor>& zero_points,
                      at::ScalarType dtype, std::int64_t axis, bool div_mode) {
  const char* op = "quantize";
  const QuantDType q = quant_of(op, "dtype", dtype);
  const Arg x = arg_of(op, "input", input), s = arg_of(op, "scales", scales);
  const std::optional<Arg> zp = opt_arg(op, "zero_points", zero_points);
  return alloc(p_quantize(x.spec(), s.spec(), opt_spec(zp), q, axis, div_mode), storage_of(q), input.device()).t;
}

// ---- pypto tile quant -----------------------------------------------------------------------------------

struct TileCall {
  bool asym = false;
  TileArg out, src, scale;
  std::optional<TileArg> offset;
};

// The arguments, checked and planned (the library's 2-D and tile checks). `out` must already be a tile
// (rows may be padded); scale and offset of different row pitches are made dense.
TileCall tile_call(const at::Tensor& out, const at::Tensor& src, const at::Tensor& scale, c10::string_view tile_mode,
                   const std::optional<at::Tensor>& offset) {
  const char* op = "tile_quant";
  TileCall c;
  c.asym = tile_asym(op, tile_mode);
  check_own_values(op, "out", out);
  if (!tile_ok(out))
    value_error(op,
                "out must be a 2-D row-major tensor with unit column stride (rows may be padded); it is "
                "written in place");
  c.out = tile_arg(op, "out", out);
  c.scale = tile_arg(op, "scale", scale);
  if (offset && offset->defined()) {
    c.offset = tile_arg(op, "offset", *offset);
    if (c.scale.t.dim() == 2 && c.offset->t.dim() == 2 &&
        guarded(c.scale.t.sym_stride(0)) != guarded(c.offset->t.sym_stride(0))) {
      // The NPU needs scale and offset in tiles of one physical shape; off the NPU, give both a dense layout.
      c.scale = tile_arg(op, "scale", c.scale.t.contiguous());
      c.offset = tile_arg(op, "offset", c.offset->t.contiguous());
    }
  }
  c.src = tile_arg(op, "src", src);
  OptSpec off;
  if (c.offset) off = c.offset->a.spec();
  Status st;
  g_api->plan_tile_quant(st, c.out.a.spec(), c.src.a.spec(), c.scale.a.spec(),
                         c.asym ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM, off);
  check(st);
  return c;
}

void impl_tile_quant(const at::Tensor& out, const TileCall& c) {
  const xquant::ConstTileView o = tile_of(c.out.a, c.out.t);
  const xquant::TileView ov{writable_data(out), o.dtype, o.rows, o.cols, o.row_pitch, o.device};
  std::optional<xquant::ConstTileView> off;
  if (c.offset) off = tile_of(c.offset->a, c.offset->t);
  Status st;
  g_api->tile_quant(st, ov, tile_of(c.src.a, c.src.t), tile_of(c.scale.a, c.scale.t),
                    c.asym ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM, off);
  check(st);
  bump_version(out);
}

template <bool kCuda>
void k_tile_quant(at::Tensor& out, const at::Tensor& src, const at::Tensor& scale, c10::string_view tile_mode,
                  const std::optional<at::Tensor>& offset) {
  const TileCall c = tile_call(out, src, scale, tile_mode, offset);
  const CudaScope cuda(kCuda, "tile_quant", "out", out);
  impl_tile_quant(out, c);
}

void m_tile_quant(at::Tensor& out, const at::Tensor& src, const at::Tensor& scale, c10::string_view tile_mode,
                  const std::optional<at::Tensor>& offset) {
  tile_call(out, src, scale, tile_mode, offset);
}

// ---- npu_dynamic_quant_asymmetric / npu_dynamic_quant ---------------------------------------------------

// offset: nullptr for the symmetric operator.
std::vector<at::Tensor> impl_dynamic_quant(bool symmetric, const Arg& x, const std::optional<Arg>& sm,
                                           const std::optional<Arg>& gi, QuantDType q, int mode,
                                           const at::Device& dev) {
  const Shape& xs = x.v.shape;
  // Lenient (the library validates x before it looks at the outputs): pertensor [1], perchannel
  // x.shape[:-2] + [H], pertoken x.shape[:-1].
  Shape p_shape = mode == 1 ? Shape{1} : Shape(xs.begin(), xs.end() - (xs.empty() ? 0 : 1));
  if (mode == 2 && xs.size() >= 2) {
    p_shape.assign(xs.begin(), xs.end() - 2);
    p_shape.push_back(xs.back());
  }
  Out y = alloc(quantized_shape(xs, q), storage_of(q), dev), scale = alloc(p_shape, DType::float32, dev);
  Status st;
  if (symmetric) {
    g_api->dynamic_quant(st, y.v, scale.v, x.v, opt_view(sm), opt_view(gi), q, mode);
    check(st);
    return {y.t, scale.t};
  }
  Out offset = alloc(p_shape, DType::float32, dev);
  g_api->dynamic_quant_asymmetric(st, y.v, scale.v, offset.v, x.v, opt_view(sm), opt_view(gi), q, mode);
  check(st);
  return {y.t, scale.t, offset.t};
}

// The arguments of both dynamic quantizations, converted and checked in the schema's order.
struct DqCall {
  QuantDType q;
  int mode;
  Arg x;
  std::optional<Arg> sm, gi;
};

DqCall dq_call(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& smooth_scales,
               const std::optional<at::Tensor>& group_index, std::optional<at::ScalarType> dst_type,
               c10::string_view quant_mode, double dst_type_max) {
  const QuantDType q = opt_quant(op, "dst_type", dst_type);
  const int mode = dq_mode(op, quant_mode);
  check_dst_type_max(op, dst_type_max);
  Arg xa = arg_of(op, "x", x);
  return {q, mode, std::move(xa), opt_arg(op, "smooth_scales", smooth_scales), opt_arg(op, "group_index", group_index)};
}

// The Meta kernels' outputs: y, scale (and offset for the asymmetric operator).
std::vector<at::Tensor> meta_dynamic_quant(bool symmetric, const DqCall& c, const at::Device& dev) {
  const auto p = plan_dynamic(symmetric, c.x.spec(), opt_spec(c.sm), opt_spec(c.gi), c.q, c.mode);
  std::vector<at::Tensor> r{alloc(p.y_shape, p.y_dtype, dev).t, alloc(p.param_shape, DType::float32, dev).t};
  if (!symmetric) r.push_back(alloc(p.param_shape, DType::float32, dev).t);
  return r;
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor, at::Tensor> k_dynamic_quant_asymmetric(
    const at::Tensor& x, const std::optional<at::Tensor>& smooth_scales, const std::optional<at::Tensor>& group_index,
    std::optional<at::ScalarType> dst_type, c10::string_view quant_mode, double dst_type_max) {
  const char* op = "dynamic_quant_asymmetric";
  const DqCall c = dq_call(op, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max);
  const CudaScope cuda(kCuda, op, "x", x);
  auto r = impl_dynamic_quant(false, c.x, c.sm, c.gi, c.q, c.mode, x.device());
  return {r[0], r[1], r[2]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> m_dynamic_quant_asymmetric(
    const at::Tensor& x, const std::optional<at::Tensor>& smooth_scales, const std::optional<at::Tensor>& group_index,
    std::optional<at::ScalarType> dst_type, c10::string_view quant_mode, double dst_type_max) {
  const DqCall c =
      dq_call("dynamic_quant_asymmetric", x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max);
  auto r = meta_dynamic_quant(false, c, x.device());
  return {r[0], r[1], r[2]};
}

template <bool kCuda>
std::tuple<at::Tensor, at::Tensor> k_dynamic_quant(const at::Tensor& x, const std::optional<at::Tensor>& smooth_scales,
                                                   const std::optional<at::Tensor>& group_index,
                                                   std::optional<at::ScalarType> dst_type, c10::string_view quant_mode,
                                                   double dst_type_max) {
  const char* op = "dynamic_quant";
  const DqCall c = dq_call(op, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max);
  const CudaScope cuda(kCuda, op, "x", x);
  auto r = impl_dynamic_quant(true, c.x, c.sm, c.gi, c.q, c.mode, x.device());
  return {r[0], r[1]};
}

std::tuple<at::Tensor, at::Tensor> m_dynamic_quant(const at::Tensor& x, const std::optional<at::Tensor>& smooth_scales,
                                                   const std::optional<at::Tensor>& group_index,
                                                   std::optional<at::ScalarType> dst_type, c10::string_view quant_mode,
                                                   double dst_type_max) {
  const DqCall c = dq_call("dynamic_quant", x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max);
  auto r = meta_dynamic_quant(true, c, x.device());
  return {r[0], r[1]};
}

// ---- npu_anti_quant -------------------------------------------------------------------------------------

at::Tensor impl_anti_quant(const Arg& x, const Arg& s, const std::optional<Arg>& off, DType dst, QuantDType q,
                           const at::Device& dev) {
  Shape shape = x.v.shape;  // x's logical shape (int4: eight per word)
  if (q == QuantDType::quint4x2 && !shape.empty() && shape.back() <= INT64_MAX / 8) shape.back() *= 8;
  Out y = alloc(std::move(shape), dst, dev);
  Status st;
  g_api->anti_quant(st, y.v, x.v, s.v, opt_view(off), q);
  check(st);
  return y.t;
}

template <bool kCuda>
at::Tensor k_anti_quant(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& offset,
                        std::optional<at::ScalarType> dst_dtype, std::optional<at::ScalarType> src_dtype) {
  const char* op = "anti_quant";
  const DType dst = dst_float(op, dst_dtype);
  const QuantDType q = opt_quant(op, "src_dtype", src_dtype);
  const Arg xa = arg_of(op, "x", x), sa = arg_of(op, "scale", scale);
  const std::optional<Arg> oa = opt_arg(op, "offset", offset);
  const CudaScope cuda(kCuda, op, "x", x);
  return impl_anti_quant(xa, sa, oa, dst, q, x.device());
}

at::Tensor m_anti_quant(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& offset,
                        std::optional<at::ScalarType> dst_dtype, std::optional<at::ScalarType> src_dtype) {
  const char* op = "anti_quant";
  const DType dst = dst_float(op, dst_dtype);
  const QuantDType q = opt_quant(op, "src_dtype", src_dtype);
  const Arg xa = arg_of(op, "x", x), sa = arg_of(op, "scale", scale);
  const std::optional<Arg> oa = opt_arg(op, "offset", offset);
  return alloc(p_anti_quant(xa.spec(), sa.spec(), opt_spec(oa), q), dst, x.device()).t;
}

// ---- ActsULQ --------------------------------------------------------------------------------------------

std::vector<at::Tensor> impl_acts_ulq(const Arg& x, const Arg& lo, const Arg& hi, bool fixed_min, int num_bits,
                                      const at::Device& dev) {
  const Shape shape = p_acts_ulq(x.spec(), lo.spec(), hi.spec(), num_bits);
  Out y = alloc(shape, x.v.dtype, dev), m0 = alloc(shape, x.v.dtype, dev), m1 = alloc(shape, x.v.dtype, dev),
      loss = alloc(shape, x.v.dtype, dev);
  Status st;
  g_api->acts_ulq(st, y.v, m0.v, m1.v, loss.v, x.v, lo.v, hi.v, fixed_min, num_bits);
  check(st);
  return {y.t, m0.t, m1.t, loss.t};
}

using Four = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <bool kCuda>
Four k_acts_ulq(const at::Tensor& x, const at::Tensor& clamp_min, const at::Tensor& clamp_max, bool fixed_min,
                std::int64_t num_bits) {
  const char* op = "acts_ulq";
  const int nbits = to_int(op, "num_bits", num_bits);
  const Arg xa = arg_of(op, "x", x), lo = arg_of(op, "clamp_min", clamp_min), hi = arg_of(op, "clamp_max", clamp_max);
  const CudaScope cuda(kCuda, op, "x", x);
  auto r = impl_acts_ulq(xa, lo, hi, fixed_min, nbits, x.device());
  return {r[0], r[1], r[2], r[3]};
}

Four m_acts_ulq(const at::Tensor& x, const at::Tensor& clamp_min, const at::Tensor& clamp_max, bool,
                std::int64_t num_bits) {
  const char* op = "acts_ulq";
  const int nbits = to_int(op, "num_bits", num_bits);
  const Arg xa = arg_of(op, "x", x), lo = arg_of(op, "clamp_min", clamp_min), hi = arg_of(op, "clamp_max", clamp_max);
  const Shape shape = p_acts_ulq(xa.spec(), lo.spec(), hi.spec(), nbits);
  const DType dt = xa.v.dtype;
  return {alloc(shape, dt, x.device()).t, alloc(shape, dt, x.device()).t, alloc(shape, dt, x.device()).t,
          alloc(shape, dt, x.device()).t};
}

struct UlqBackward {
  Shape x_shape;
  int num_bits;
  Arg dy, lo, hi, m0, m1, loss;
};

UlqBackward ulq_backward_call(const at::Tensor& y_grad, c10::SymIntArrayRef x_shape, const at::Tensor& clamp_min,
                              const at::Tensor& clamp_max, const at::Tensor& clamp_min_mask,
                              const at::Tensor& clamp_max_mask, const at::Tensor& x_clamped_loss,
                              std::int64_t num_bits) {
  const char* op = "acts_ulq_backward";
  UlqBackward c{x_shape_of(op, x_shape),
                to_int(op, "num_bits", num_bits),
                arg_of(op, "y_grad", y_grad),
                arg_of(op, "clamp_min", clamp_min),
                arg_of(op, "clamp_max", clamp_max),
                arg_of(op, "clamp_min_mask", clamp_min_mask),
                arg_of(op, "clamp_max_mask", clamp_max_mask),
                arg_of(op, "x_clamped_loss", x_clamped_loss)};
  Status st;
  Shape out;
  g_api->plan_acts_ulq_backward(st, out, c.dy.spec(), c.x_shape, c.lo.spec(), c.hi.spec(), c.m0.spec(), c.m1.spec(),
                                c.loss.spec(), c.num_bits);
  check(st);
  return c;
}

using Three = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

template <bool kCuda>
Three k_acts_ulq_backward(const at::Tensor& y_grad, c10::SymIntArrayRef x_shape, const at::Tensor& clamp_min,
                          const at::Tensor& clamp_max, const at::Tensor& clamp_min_mask,
                          const at::Tensor& clamp_max_mask, const at::Tensor& x_clamped_loss, bool fixed_min,
                          std::int64_t num_bits) {
  const UlqBackward c = ulq_backward_call(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask,
                                          x_clamped_loss, num_bits);
  const CudaScope cuda(kCuda, "acts_ulq_backward", "clamp_min", clamp_min);
  const DType dt = c.lo.v.dtype;
  Out xg = alloc(c.x_shape, dt, clamp_min.device()), g0 = alloc(c.lo.v.shape, dt, clamp_min.device()),
      g1 = alloc(c.hi.v.shape, dt, clamp_max.device());
  Status st;
  g_api->acts_ulq_backward(st, xg.v, g0.v, g1.v, c.dy.v, c.lo.v, c.hi.v, c.m0.v, c.m1.v, c.loss.v, fixed_min,
                           c.num_bits);
  check(st);
  return {xg.t, g0.t, g1.t};
}

Three m_acts_ulq_backward(const at::Tensor& y_grad, c10::SymIntArrayRef x_shape, const at::Tensor& clamp_min,
                          const at::Tensor& clamp_max, const at::Tensor& clamp_min_mask,
                          const at::Tensor& clamp_max_mask, const at::Tensor& x_clamped_loss, bool,
                          std::int64_t num_bits) {
  const UlqBackward c = ulq_backward_call(y_grad, x_shape, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask,
                                          x_clamped_loss, num_bits);
  const DType dt = c.lo.v.dtype;
  return {alloc(c.x_shape, dt, clamp_min.device()).t, alloc(c.lo.v.shape, dt, clamp_min.device()).t,
          alloc(c.hi.v.shape, dt, clamp_max.device()).t};
}

// ---- the quantized matmuls (npu_quant_matmul, npu_weight_quant_batchmatmul, npu_trans_quant_param,
// npu_convert_weight_to_int4pack) ------------------------------------------------------------------------
//
// A matrix operand that is the transposed view of a dense [..., N, K] tensor (torch_npu's way of passing
// a transposed weight: x2.t(), weight.transpose(-1, -2)) is read as that storage with the library's
// transpose flag, without a copy; any other layout is made dense as it is. Not differentiable (as on the NPU).

struct MatArg {
  Arg a;
  bool transposed = false;
};

MatArg mat_arg_of(const char* op, const char* name, const at::Tensor& t) {
  if (t.dim() >= 2 && !t.is_contiguous() && t.transpose(-2, -1).is_contiguous())
    return {arg_of(op, name, t.transpose(-2, -1)), true};
  return {arg_of(op, name, t), false};
}

DType matmul_out_dtype(const char* op, std::optional<at::ScalarType> s) {
  if (!s) return DType::int8;
  switch (*s) {
    case at::kChar:
      return DType::int8;
    case at::kHalf:
      return DType::float16;
    case at::kBFloat16:
      return DType::bfloat16;
    case at::kInt:
      return DType::int32;
    default:
      value_error(op, "output_dtype is torch." + torch_name(*s) +
                          " but expected None (int8), torch.int8, torch.float16, torch.bfloat16 or torch.int32");
  }
}

struct QmmCall {
  Arg x1;
  MatArg x2;
  Arg scale;
  std::optional<Arg> offset, pertoken_scale, bias;
  DType out_dtype;
  std::array<std::int64_t, 3> group_sizes;
  Shape out_shape;
};

// group_sizes: None, or three integers [group_m, group_n, group_k] (the library checks their values).
std::array<std::int64_t, 3> group_sizes_of(const char* op, at::OptionalIntArrayRef g) {
  std::array<std::int64_t, 3> r{};
  if (!g) return r;
  if (g->size() != 3)
    value_error(op, "group_sizes has " + std::to_string(g->size()) +
                        " elements but expected 3 ([group_m, group_n, group_k])");
  for (std::size_t i = 0; i < 3; ++i) r[i] = (*g)[i];
  return r;
}

QmmCall qmm_call(const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& scale,
                 const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& pertoken_scale,
                 const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> output_dtype,
                 at::OptionalIntArrayRef group_sizes) {
  const char* op = "quant_matmul";
  QmmCall c{arg_of(op, "x1", x1),
            mat_arg_of(op, "x2", x2),
            arg_of(op, "scale", scale),
            opt_arg(op, "offset", offset),
            opt_arg(op, "pertoken_scale", pertoken_scale),
            opt_arg(op, "bias", bias),
            matmul_out_dtype(op, output_dtype),
            group_sizes_of(op, group_sizes),
            {}};
  c.out_shape =
      plan_call(&xquant_py::CoreApi::plan_quant_matmul, c.x1.spec(), c.x2.a.spec(), c.scale.spec(), opt_spec(c.offset),
                opt_spec(c.pertoken_scale), opt_spec(c.bias), c.x2.transposed, c.out_dtype, c.group_sizes);
  return c;
}

at::Tensor impl_quant_matmul(const QmmCall& c, const at::Device& dev) {
  Out y = alloc(c.out_shape, c.out_dtype, dev);
  Status st;
  g_api->quant_matmul(st, y.v, c.x1.v, c.x2.a.v, c.scale.v,
                      {.offset = opt_view(c.offset),
                       .pertoken_scale = opt_view(c.pertoken_scale),
                       .bias = opt_view(c.bias),
                       .transpose_x2 = c.x2.transposed,
                       .group_sizes = c.group_sizes});
  check(st);
  return y.t;
}

template <bool kCuda>
at::Tensor k_quant_matmul(const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& scale,
                          const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& pertoken_scale,
                          const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> output_dtype,
                          at::OptionalIntArrayRef group_sizes) {
  const QmmCall c = qmm_call(x1, x2, scale, offset, pertoken_scale, bias, output_dtype, group_sizes);
  const CudaScope cuda(kCuda, "quant_matmul", "x1", x1);
  return impl_quant_matmul(c, x1.device());
}

at::Tensor m_quant_matmul(const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& scale,
                          const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& pertoken_scale,
                          const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> output_dtype,
                          at::OptionalIntArrayRef group_sizes) {
  const QmmCall c = qmm_call(x1, x2, scale, offset, pertoken_scale, bias, output_dtype, group_sizes);
  return alloc(c.out_shape, c.out_dtype, x1.device()).t;
}

struct WqmCall {
  Arg x;
  MatArg weight;
  Arg scale;
  std::optional<Arg> offset, bias;
  std::int64_t group_size;
  Shape out_shape;
};

WqmCall wqm_call(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& antiquant_scale,
                 const std::optional<at::Tensor>& antiquant_offset, const std::optional<at::Tensor>& bias,
                 std::int64_t antiquant_group_size) {
  const char* op = "weight_quant_batchmatmul";
  WqmCall c{arg_of(op, "x", x),
            mat_arg_of(op, "weight", weight),
            arg_of(op, "antiquant_scale", antiquant_scale),
            opt_arg(op, "antiquant_offset", antiquant_offset),
            opt_arg(op, "bias", bias),
            antiquant_group_size,
            {}};
  c.out_shape = plan_call(&xquant_py::CoreApi::plan_weight_quant_batchmatmul, c.x.spec(), c.weight.a.spec(),
                          c.scale.spec(), opt_spec(c.offset), opt_spec(c.bias), c.group_size, c.weight.transposed);
  return c;
}

template <bool kCuda>
at::Tensor k_weight_quant_batchmatmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& antiquant_scale,
                                      const std::optional<at::Tensor>& antiquant_offset,
                                      const std::optional<at::Tensor>& bias, std::int64_t antiquant_group_size) {
  const WqmCall c = wqm_call(x, weight, antiquant_scale, antiquant_offset, bias, antiquant_group_size);
  const CudaScope cuda(kCuda, "weight_quant_batchmatmul", "x", x);
  Out y = alloc(c.out_shape, c.x.v.dtype, x.device());
  Status st;
  g_api->weight_quant_batchmatmul(st, y.v, c.x.v, c.weight.a.v, c.scale.v,
                                  {.antiquant_offset = opt_view(c.offset),
                                   .bias = opt_view(c.bias),
                                   .antiquant_group_size = c.group_size,
                                   .transpose_weight = c.weight.transposed});
  check(st);
  return y.t;
}

at::Tensor m_weight_quant_batchmatmul(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& antiquant_scale,
                                      const std::optional<at::Tensor>& antiquant_offset,
                                      const std::optional<at::Tensor>& bias, std::int64_t antiquant_group_size) {
  const WqmCall c = wqm_call(x, weight, antiquant_scale, antiquant_offset, bias, antiquant_group_size);
  return alloc(c.out_shape, c.x.v.dtype, x.device()).t;
}

struct TqpCall {
  Arg scale;
  std::optional<Arg> offset;
  int round_mode;
  Shape out_shape;
};

TqpCall tqp_call(const at::Tensor& scale, const std::optional<at::Tensor>& offset, std::int64_t round_mode) {
  const char* op = "trans_quant_param";
  TqpCall c{arg_of(op, "scale", scale), opt_arg(op, "offset", offset), to_int(op, "round_mode", round_mode), {}};
  c.out_shape =
      plan_call(&xquant_py::CoreApi::plan_trans_quant_param, c.scale.spec(), opt_spec(c.offset), c.round_mode);
  return c;
}

template <bool kCuda>
at::Tensor k_trans_quant_param(const at::Tensor& scale, const std::optional<at::Tensor>& offset,
                               std::int64_t round_mode) {
  const TqpCall c = tqp_call(scale, offset, round_mode);
  const CudaScope cuda(kCuda, "trans_quant_param", "scale", scale);
  Out y = alloc(c.out_shape, DType::int64, scale.device());
  Status st;
  g_api->trans_quant_param(st, y.v, c.scale.v, opt_view(c.offset), c.round_mode);
  check(st);
  return y.t;
}

at::Tensor m_trans_quant_param(const at::Tensor& scale, const std::optional<at::Tensor>& offset,
                               std::int64_t round_mode) {
  const TqpCall c = tqp_call(scale, offset, round_mode);  // (before scale.device(): scale may be undefined)
  return alloc(c.out_shape, DType::int64, scale.device()).t;
}

template <bool kCuda>
at::Tensor k_convert_weight_to_int4pack(const at::Tensor& weight) {
  const char* op = "convert_weight_to_int4pack";
  const Arg w = arg_of(op, "weight", weight);
  const Shape shape = plan_call(&xquant_py::CoreApi::plan_convert_weight_to_int4pack, w.spec());
  const CudaScope cuda(kCuda, op, "weight", weight);
  Out y = alloc(shape, DType::int32, weight.device());
  Status st;
  g_api->convert_weight_to_int4pack(st, y.v, w.v);
  check(st);
  return y.t;
}

at::Tensor m_convert_weight_to_int4pack(const at::Tensor& weight) {
  const Arg w = arg_of("convert_weight_to_int4pack", "weight", weight);
  return alloc(plan_call(&xquant_py::CoreApi::plan_convert_weight_to_int4pack, w.spec()), DType::int32, weight.device())
      .t;
}

// ---- autograd: one C++ autograd kernel per differentiable operator --------------------------------------
//
// Registered for the Autograd key (below), and called directly by the eager fast path when autograd records
// (no dispatcher round trip from Python: a training step's forward costs about what torch's own fake-quant
// operators cost). The forward calls the operator below autograd through the dispatcher (CPU, CUDA, Meta,
// FakeTensor alike); the backward calls the backward operator, so AOTAutograd (torch.compile) traces a graph
// of xquant operators.

template <class Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FakeQuantFn : public torch::autograd::Function<FakeQuantFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& inputs, const at::Tensor& amax,
                            std::optional<std::int64_t> axis, std::int64_t num_bits, bool is_unsigned,
                            bool narrow_range) {
    at::Tensor out;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      if (axis) {
        static const auto op =
            op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, std::int64_t, std::int64_t, bool, bool)>(
                "xquant::fake_tensor_quant_with_axis");
        out = op.call(inputs, amax, *axis, num_bits, is_unsigned, narrow_range);
      } else {
        static const auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, std::int64_t, bool, bool)>(
            "xquant::fake_tensor_quant");
        out = op.call(inputs, amax, num_bits, is_unsigned, narrow_range);
      }
    }
    ctx->save_for_backward({inputs, amax});
    ctx->saved_data["axis"] = axis ? c10::IValue(*axis) : c10::IValue();
    ctx->saved_data["num_bits"] = num_bits;
    ctx->saved_data["is_unsigned"] = is_unsigned;
    ctx->saved_data["narrow_range"] = narrow_range;
    return out;
  }

  // Straight-through with clipping for inputs; the PACT-style learnable-amax gradient when amax needs it.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const c10::IValue& ax = ctx->saved_data["axis"];
    const std::optional<std::int64_t> axis = ax.isNone() ? std::nullopt : std::optional<std::int64_t>(ax.toInt());
    const bool want = ctx->needs_input_grad(1);
    static const auto op =
        op_handle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                     std::optional<std::int64_t>, std::int64_t, bool, bool, bool)>(
            "xquant::fake_tensor_quant_backward");
    auto [gi, ga] = op.call(grads[0], saved[0], saved[1], axis, ctx->saved_data["num_bits"].toInt(),
                            ctx->saved_data["is_unsigned"].toBool(), ctx->saved_data["narrow_range"].toBool(), want);
    return {gi, want ? ga : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct ActsUlqFn : public torch::autograd::Function<ActsUlqFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& clamp_min,
                               const at::Tensor& clamp_max, bool fixed_min, std::int64_t num_bits) {
    at::Tensor y, m0, m1, loss;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      static const auto op =
          op_handle<Four(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, std::int64_t)>(
              "xquant::acts_ulq");
      std::tie(y, m0, m1, loss) = op.call(x, clamp_min, clamp_max, fixed_min, num_bits);
    }
    ctx->save_for_backward({clamp_min, clamp_max, m0, m1, loss});
    ctx->saved_data["x_shape"] = sizes_of(x);
    ctx->saved_data["fixed_min"] = fixed_min;
    ctx->saved_data["num_bits"] = num_bits;
    // Only y carries a gradient (the CANN gradient operators take y_grad alone).
    ctx->mark_non_differentiable({m0, m1, loss});
    return {y, m0, m1, loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor y_grad = grads[0].defined() ? grads[0] : at::zeros_like(saved[2]);
    const std::vector<std::int64_t> x_shape = ctx->saved_data["x_shape"].toIntVector();
    static const auto op =
        op_handle<Three(const at::Tensor&, c10::SymIntArrayRef, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const at::Tensor&, const at::Tensor&, bool, std::int64_t)>("xquant::acts_ulq_backward");
    auto [xg, g0, g1] = op.call(y_grad, c10::fromIntArrayRefSlow(x_shape), saved[0], saved[1], saved[2], saved[3],
                                saved[4], ctx->saved_data["fixed_min"].toBool(), ctx->saved_data["num_bits"].toInt());
    return {xg, g0, g1, at::Tensor(), at::Tensor()};
  }
};

at::Tensor a_fake_tensor_quant(const at::Tensor& inputs, const at::Tensor& amax, std::int64_t num_bits,
                               bool is_unsigned, bool narrow_range) {
  return FakeQuantFn::apply(inputs, amax, std::optional<std::int64_t>(), num_bits, is_unsigned, narrow_range);
}

at::Tensor a_fake_tensor_quant_with_axis(const at::Tensor& inputs, const at::Tensor& amax, std::int64_t axis,
                                         std::int64_t num_bits, bool is_unsigned, bool narrow_range) {
  return FakeQuantFn::apply(inputs, amax, std::optional<std::int64_t>(axis), num_bits, is_unsigned, narrow_range);
}

Four a_acts_ulq(const at::Tensor& x, const at::Tensor& clamp_min, const at::Tensor& clamp_max, bool fixed_min,
                std::int64_t num_bits) {
  const variable_list r = ActsUlqFn::apply(x, clamp_min, clamp_max, fixed_min, num_bits);
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace

// ==== registration =========================================================================================

TORCH_LIBRARY(xquant, m) {
  m.def(
      "fake_tensor_quant(Tensor inputs, Tensor amax, int num_bits=8, bool is_unsigned=False, "
      "bool narrow_range=True) -> Tensor");
  m.def(
      "fake_tensor_quant_with_axis(Tensor inputs, Tensor amax, int axis, int num_bits=8, bool is_unsigned=False, "
      "bool narrow_range=True) -> Tensor");
  m.def(
      "fake_tensor_quant_inplace(Tensor(a!) inputs, Tensor amax, int num_bits=8, bool is_unsigned=False, "
      "bool narrow_range=True) -> ()");
  m.def(
      "fake_tensor_quant_backward(Tensor grad_out, Tensor inputs, Tensor amax, int? axis, int num_bits, "
      "bool is_unsigned, bool narrow_range, bool want_grad_amax) -> (Tensor, Tensor)");
  m.def(
      "quantize(Tensor input, Tensor scales, Tensor? zero_points, ScalarType dtype, int axis=1, "
      "bool div_mode=True) -> Tensor");
  m.def("tile_quant(Tensor(a!) out, Tensor src, Tensor scale, str tile_mode=\"SYM\", Tensor? offset=None) -> ()");
  m.def(
      "dynamic_quant_asymmetric(Tensor x, Tensor? smooth_scales=None, Tensor? group_index=None, "
      "ScalarType? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor, Tensor)");
  m.def(
      "dynamic_quant(Tensor x, Tensor? smooth_scales=None, Tensor? group_index=None, ScalarType? dst_type=None, "
      "str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)");
  m.def(
      "anti_quant(Tensor x, Tensor scale, Tensor? offset=None, ScalarType? dst_dtype=None, "
      "ScalarType? src_dtype=None) -> Tensor");
  m.def(
      "acts_ulq(Tensor x, Tensor clamp_min, Tensor clamp_max, bool fixed_min=False, int num_bits=8) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "acts_ulq_backward(Tensor y_grad, SymInt[] x_shape, Tensor clamp_min, Tensor clamp_max, Tensor clamp_min_mask, "
      "Tensor clamp_max_mask, Tensor x_clamped_loss, bool fixed_min, int num_bits) -> (Tensor, Tensor, Tensor)");
  m.def(
      "quant_matmul(Tensor x1, Tensor x2, Tensor scale, Tensor? offset=None, Tensor? pertoken_scale=None, "
      "Tensor? bias=None, ScalarType? output_dtype=None, int[]? group_sizes=None) -> Tensor");
  m.def(
      "weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None, "
      "Tensor? bias=None, int antiquant_group_size=0) -> Tensor");
  m.def("trans_quant_param(Tensor scale, Tensor? offset=None, int round_mode=0) -> Tensor");
  m.def("convert_weight_to_int4pack(Tensor weight) -> Tensor");
}

// The same kernels serve CPU and CUDA tensors (kCuda: CudaScope checks that xquant can run there, and
// makes the tensors' device and stream current).
#define XQ_KERNELS(m, kCuda)                                                    \
  m.impl("fake_tensor_quant", &k_fake_tensor_quant<kCuda>);                     \
  m.impl("fake_tensor_quant_with_axis", &k_fake_tensor_quant_with_axis<kCuda>); \
  m.impl("fake_tensor_quant_inplace", &k_fake_tensor_quant_inplace<kCuda>);     \
  m.impl("fake_tensor_quant_backward", &k_fake_tensor_quant_backward<kCuda>);   \
  m.impl("quantize", &k_quantize<kCuda>);                                       \
  m.impl("tile_quant", &k_tile_quant<kCuda>);                                   \
  m.impl("dynamic_quant_asymmetric", &k_dynamic_quant_asymmetric<kCuda>);       \
  m.impl("dynamic_quant", &k_dynamic_quant<kCuda>);                             \
  m.impl("anti_quant", &k_anti_quant<kCuda>);                                   \
  m.impl("acts_ulq", &k_acts_ulq<kCuda>);                                       \
  m.impl("acts_ulq_backward", &k_acts_ulq_backward<kCuda>);                     \
  m.impl("quant_matmul", &k_quant_matmul<kCuda>);                               \
  m.impl("weight_quant_batchmatmul", &k_weight_quant_batchmatmul<kCuda>);       \
  m.impl("trans_quant_param", &k_trans_quant_param<kCuda>);                     \
  m.impl("convert_weight_to_int4pack", &k_convert_weight_to_int4pack<kCuda>)

TORCH_LIBRARY_IMPL(xquant, CPU, m) { XQ_KERNELS(m, false); }
TORCH_LIBRARY_IMPL(xquant, CUDA, m) { XQ_KERNELS(m, true); }

TORCH_LIBRARY_IMPL(xquant, Autograd, m) {
  m.impl("fake_tensor_quant", &a_fake_tensor_quant);
  m.impl("fake_tensor_quant_with_axis", &a_fake_tensor_quant_with_axis);
  m.impl("acts_ulq", &a_acts_ulq);
}

TORCH_LIBRARY_IMPL(xquant, Meta, m) {
  m.impl("fake_tensor_quant", &m_fake_tensor_quant);
  m.impl("fake_tensor_quant_with_axis", &m_fake_tensor_quant_with_axis);
  m.impl("fake_tensor_quant_inplace", &m_fake_tensor_quant_inplace);
  m.impl("fake_tensor_quant_backward", &m_fake_tensor_quant_backward);
  m.impl("quantize", &m_quantize);
  m.impl("tile_quant", &m_tile_quant);
  m.impl("dynamic_quant_asymmetric", &m_dynamic_quant_asymmetric);
  m.impl("dynamic_quant", &m_dynamic_quant);
  m.impl("anti_quant", &m_anti_quant);
  m.impl("acts_ulq", &m_acts_ulq);
  m.impl("acts_ulq_backward", &m_acts_ulq_backward);
  m.impl("quant_matmul", &m_quant_matmul);
  m.impl("weight_quant_batchmatmul", &m_weight_quant_batchmatmul);
  m.impl("trans_quant_param", &m_trans_quant_param);
  m.impl("convert_weight_to_int4pack", &m_convert_weight_to_int4pack);
}

// Sparse tensors reach no kernel above (the dispatcher picks a sparse key): a kernel for those keys refuses
// them with the error xquant.npu gives, naming the argument (the schema's name for it) and its layout.
namespace {

std::string layout_name(at::Layout l) {
  switch (l) {
    case at::kSparse:
      return "torch.sparse_coo";
    case at::kSparseCsr:
      return "torch.sparse_csr";
    case at::kSparseCsc:
      return "torch.sparse_csc";
    case at::kSparseBsr:
      return "torch.sparse_bsr";
    case at::kSparseBsc:
      return "torch.sparse_bsc";
    default:
      return c10::str(l);
  }
}

void refuse_sparse(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = handle.schema();
  std::string op = schema.name();
  if (op.rfind("xquant::", 0) == 0) op = op.substr(8);
  const std::size_t n = schema.arguments().size();
  const auto args = torch::jit::last(*stack, n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!args[i].isTensor()) continue;
    const at::Tensor& t = args[i].toTensor();
    if (t.layout() != at::kStrided)
      type_error(op.c_str(), schema.arguments()[i].name() + " is a sparse tensor (layout " + layout_name(t.layout()) +
                                 ") but expected a dense strided tensor (call .to_dense() first)");
  }
  type_error(op.c_str(), "a sparse tensor was given but expected dense strided tensors (call .to_dense() first)");
}

}  // namespace

#define XQ_REFUSE(m)                                                                                           \
  for (const char* name : {"fake_tensor_quant", "fake_tensor_quant_with_axis", "fake_tensor_quant_inplace",    \
                           "fake_tensor_quant_backward", "quantize", "tile_quant", "dynamic_quant_asymmetric", \
                           "dynamic_quant", "anti_quant", "acts_ulq", "acts_ulq_backward", "quant_matmul",     \
                           "weight_quant_batchmatmul", "trans_quant_param", "convert_weight_to_int4pack"})     \
  m.impl(name, torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>())

TORCH_LIBRARY_IMPL(xquant, SparseCPU, m) { XQ_REFUSE(m); }
TORCH_LIBRARY_IMPL(xquant, SparseCUDA, m) { XQ_REFUSE(m); }
TORCH_LIBRARY_IMPL(xquant, SparseCsrCPU, m) { XQ_REFUSE(m); }
TORCH_LIBRARY_IMPL(xquant, SparseCsrCUDA, m) { XQ_REFUSE(m); }

// ==== the eager fast path (Python entry points) ===============================================================
//
// f_<op>(...) takes the Python arguments of the xquant.npu function. It computes (the operator's impl_<op>
// above) only in plain eager mode on plain dense CPU tensors with Python values of the expected types, and
// returns None otherwise: the caller then calls torch.ops.xquant.<op>, which validates and reports, records
// autograd, or traces. Library errors are raised here as there (the same code).

namespace {

// No torch dispatch / function mode, functorch transform, JIT trace or profiler is active.
bool modes_plain() {
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0 && !at::impl::torch_function_mode_enabled() &&
         at::functorch::getDynamicLayerStack().empty() && !at::tracer::impl::is_dispatch_enabled() &&
         !torch::profiler::impl::profilerEnabled();
}

// A plain dense CPU tensor (torch.Tensor or nn.Parameter exactly) of a dtype xquant reads; *t its tensor.
bool targ(PyObject* o, Arg& a, bool& requires_grad, const at::Tensor** t = nullptr) {
  if (!THPVariable_CheckExact(o)) return false;
  const at::Tensor& x = THPVariable_Unpack(o);
  if (!x.defined() || x.layout() != at::kStrided || !x.is_cpu() || x.is_nested()) return false;
  const std::optional<DType> dt = to_dtype(x.scalar_type());
  if (!dt || !x.is_contiguous() || x.is_neg() || x.is_conj() || !x.has_storage()) return false;
  a.v.dtype = *dt;
  const auto sizes = x.sizes();
  a.v.shape.assign(sizes.begin(), sizes.end());
  a.v.data = x.numel() == 0 ? nullptr : x.const_data_ptr();
  requires_grad = requires_grad || x.requires_grad();
  if (t) *t = &x;
  return true;
}

bool opt_targ(PyObject* o, std::optional<Arg>& a, bool& requires_grad) {
  if (o == Py_None) return true;
  a.emplace();
  return targ(o, *a, requires_grad);
}

bool py_int64(PyObject* o, std::int64_t& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow) return false;
  v = x;
  return true;
}

bool py_int(PyObject* o, int& v) {
  std::int64_t x = 0;
  if (!py_int64(o, x) || x < INT_MIN || x > INT_MAX) return false;
  v = static_cast<int>(x);
  return true;
}

bool py_bool(PyObject* o, bool& v) {
  if (o != Py_True && o != Py_False) return false;
  v = o == Py_True;
  return true;
}

// A Python real number as a 0-d float32 parameter (the view points at *v).
bool py_number(PyObject* o, float& v, Arg& a) {
  if (!(PyFloat_CheckExact(o) || PyLong_CheckExact(o))) return false;
  const double d = PyFloat_AsDouble(o);
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  v = static_cast<float>(d);
  a.v = ConstTensorView(&v, DType::float32, Shape{});
  return true;
}

bool py_quant(PyObject* o, QuantDType& q, bool none_is_qint8) {
  if (o == Py_None && none_is_qint8) {
    q = QuantDType::qint8;
    return true;
  }
  if (!THPDtype_Check(o)) return false;
  const auto r = to_quant(reinterpret_cast<THPDtype*>(o)->scalar_type);
  if (!r) return false;
  q = *r;
  return true;
}

// Plain eager mode, and no autograd recording (an argument that requires grad with grad mode on).
bool plain(bool requires_grad) { return modes_plain() && !(requires_grad && c10::GradMode::is_enabled()); }

PyObject* none() { Py_RETURN_NONE; }

PyObject* wrap_all(const std::vector<at::Tensor>& ts) {
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(ts.size()));
  if (!tup) return nullptr;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    PyObject* w = THPVariable_Wrap(ts[i]);
    if (!w) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, static_cast<Py_ssize_t>(i), w);
  }
  return tup;
}

// Runs f without the GIL from kReleaseGilMinElements elements on; C++ errors -> Python errors, as torch's
// own bindings translate them (c10::TypeError -> TypeError, c10::ValueError -> ValueError).
template <class F>
PyObject* run(std::int64_t elements, F&& f) noexcept {
  PyThreadState* save = elements >= kReleaseGilMinElements ? PyEval_SaveThread() : nullptr;
  PyObject* exc = nullptr;
  std::string msg;
  PyObject* result = nullptr;
  try {
    if (save) {
      auto r = f();
      PyEval_RestoreThread(save);
      save = nullptr;
      return r();
    }
    result = f()();
  } catch (const c10::TypeError& e) {
    exc = PyExc_TypeError;
    msg = e.what_without_backtrace();
  } catch (const c10::ValueError& e) {
    exc = PyExc_ValueError;
    msg = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    exc = PyExc_RuntimeError;
    msg = e.what_without_backtrace();
  } catch (const std::bad_alloc&) {
    exc = PyExc_MemoryError;
  } catch (const std::exception& e) {
    exc = PyExc_RuntimeError;
    msg = e.what();
  }
  if (save) PyEval_RestoreThread(save);
  if (exc == PyExc_MemoryError) return PyErr_NoMemory();
  if (exc) PyErr_SetString(exc, msg.c_str());
  return result;
}

bool nargs_ok(const char* name, Py_ssize_t n, Py_ssize_t want) {
  if (n == want) return true;
  PyErr_Format(PyExc_TypeError, "xquant._torch_ext.%s takes %zd arguments (%zd given)", name, want, n);
  return false;
}

#define XQ_TRY(cond)            \
  do {                          \
    if (!(cond)) return none(); \
  } while (0)

const at::Device kCpu(at::kCPU);

// f_fake_tensor_quant(inputs, amax, axis, num_bits, is_unsigned, narrow_range): axis None is per-tensor.
PyObject* f_fake_tensor_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_fake_tensor_quant", n, 6)) return nullptr;
  const bool has_axis = args[2] != Py_None;
  xquant::FakeQuantOptions o;
  std::int64_t ax = 0;
  XQ_TRY(py_int(args[3], o.num_bits) && py_bool(args[4], o.is_unsigned) && py_bool(args[5], o.narrow_range));
  if (has_axis) XQ_TRY(py_int64(args[2], ax));
  Arg x, a;
  bool rg = false;
  float a_value = 0.0f;
  const at::Tensor* xt = nullptr;
  const bool a_number = py_number(args[1], a_value, a);
  XQ_TRY(targ(args[0], x, rg, &xt) && (a_number || targ(args[1], a, rg)) && modes_plain());
  if (rg && c10::GradMode::is_enabled()) {  // autograd records: the operator's autograd kernel, directly
    return run(numel_of(x.v.shape), [&] {
      const at::Tensor amax = a_number ? at::scalar_tensor(a_value, at::kFloat) : THPVariable_Unpack(args[1]);
      at::Tensor y = FakeQuantFn::apply(*xt, amax, has_axis ? std::optional<std::int64_t>(ax) : std::nullopt,
                                        o.num_bits, o.is_unsigned, o.narrow_range);
      return [y = std::move(y)]() mutable { return THPVariable_Wrap(std::move(y)); };
    });
  }
  return run(numel_of(x.v.shape), [&] {
    at::Tensor y = impl_fake_tensor_quant(has_axis ? kWithAxis : kPerTensor, x, a, ax, o, kCpu);
    return [y = std::move(y)]() mutable { return THPVariable_Wrap(std::move(y)); };
  });
}

// A tensor the fast path may write in place: not an inference tensor, and not a view while grad mode is on
// (torch refuses some in-place writes to views; the operator lets torch decide).
bool plain_inplace_target(const at::Tensor& t) {
  return !t.is_inference() && !(t.is_view() && c10::GradMode::is_enabled());
}

// f_fake_tensor_quant_inplace(inputs, amax, num_bits, is_unsigned, narrow_range) -> inputs
PyObject* f_fake_tensor_quant_inplace(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_fake_tensor_quant_inplace", n, 5)) return nullptr;
  xquant::FakeQuantOptions o;
  XQ_TRY(py_int(args[2], o.num_bits) && py_bool(args[3], o.is_unsigned) && py_bool(args[4], o.narrow_range));
  Arg x, a;
  bool x_rg = false, rg = false;
  const at::Tensor* t = nullptr;
  float a_value = 0.0f;
  XQ_TRY(targ(args[0], x, x_rg, &t) && (py_number(args[1], a_value, a) || targ(args[1], a, rg)));
  // A tensor that requires grad is refused by the full path (no autograd for the in-place form).
  XQ_TRY(!x_rg && plain_inplace_target(*t) && plain(rg));
  PyObject* self = args[0];
  return run(numel_of(x.v.shape), [&] {
    impl_fake_tensor_quant_inplace(*t, x, a, o);
    return [self] {
      Py_INCREF(self);
      return self;
    };
  });
}

// f_quantize(input, scales, zero_points, dtype, axis, div_mode)
PyObject* f_quantize(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_quantize", n, 6)) return nullptr;
  QuantDType q;
  std::int64_t ax = 0;
  bool div = true;
  XQ_TRY(py_quant(args[3], q, false) && py_int64(args[4], ax) && py_bool(args[5], div));
  Arg x, s;
  std::optional<Arg> zp;
  bool rg = false;
  XQ_TRY(targ(args[0], x, rg) && targ(args[1], s, rg) && opt_targ(args[2], zp, rg) && plain(rg));
  return run(numel_of(x.v.shape), [&] {
    at::Tensor y = impl_quantize(x, s, zp, q, ax, div, kCpu);
    return [y = std::move(y)]() mutable { return THPVariable_Wrap(std::move(y)); };
  });
}

// f_tile_quant(out, src, scale, mode, offset) -> True: dense tiles only (padded rows take the operator).
PyObject* f_tile_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_tile_quant", n, 5)) return nullptr;
  PyObject* mode = args[3];
  const char* m = nullptr;
  if (PyUnicode_Check(mode) && PyUnicode_CompareWithASCIIString(mode, "SYM") == 0)
    m = "SYM";
  else if (PyUnicode_Check(mode) && PyUnicode_CompareWithASCIIString(mode, "ASYM") == 0)
    m = "ASYM";
  XQ_TRY(m != nullptr);
  Arg o, s, sc;
  std::optional<Arg> off;
  bool o_rg = false, rg = false;
  const at::Tensor *ot = nullptr, *st = nullptr, *sct = nullptr;
  XQ_TRY(targ(args[0], o, o_rg, &ot) && targ(args[1], s, rg, &st) && targ(args[2], sc, rg, &sct) &&
         opt_targ(args[4], off, rg));
  XQ_TRY(!o_rg && plain_inplace_target(*ot) && plain(rg));
  std::optional<at::Tensor> offset;
  if (off) offset = THPVariable_Unpack(args[4]);
  return run(numel_of(s.v.shape), [&] {
    const TileCall c = tile_call(*ot, *st, *sct, m, offset);
    impl_tile_quant(*ot, c);
    return [] { Py_RETURN_TRUE; };
  });
}

// The tensor arguments (x, smooth_scales, group_index) of both dynamic quantizations' fast paths, and the call.
PyObject* dynamic_quant_fast(PyObject* const* args, bool symmetric, QuantDType q, int mode) {
  Arg x;
  std::optional<Arg> sm, gi;
  bool rg = false;
  XQ_TRY(targ(args[0], x, rg) && opt_targ(args[1], sm, rg) && opt_targ(args[2], gi, rg) && plain(rg));
  return run(numel_of(x.v.shape), [&] {
    auto r = impl_dynamic_quant(symmetric, x, sm, gi, q, mode, kCpu);
    return [r = std::move(r)] { return wrap_all(r); };
  });
}

// quant_mode 'pertoken' / 'pertensor' / 'perchannel' -> 0 / 1 / 2; -1 otherwise (the slow path says why).
int py_dq_mode(PyObject* mode) {
  if (!PyUnicode_Check(mode)) return -1;
  if (PyUnicode_CompareWithASCIIString(mode, "pertoken") == 0) return 0;
  if (PyUnicode_CompareWithASCIIString(mode, "pertensor") == 0) return 1;
  if (PyUnicode_CompareWithASCIIString(mode, "perchannel") == 0) return 2;
  return -1;
}

// f_dynamic_quant_asymmetric(x, smooth_scales, group_index, dst_type, quant_mode) and
// f_dynamic_quant(x, smooth_scales, group_index, dst_type, quant_mode) (dst_type_max is 0.0 here: the
// Python wrappers take the slow path, which checks it, for any other value)
PyObject* f_dynamic_quant_asymmetric(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_dynamic_quant_asymmetric", n, 5)) return nullptr;
  QuantDType q;
  XQ_TRY(py_quant(args[3], q, true));
  const int mode = py_dq_mode(args[4]);
  XQ_TRY(mode >= 0);
  return dynamic_quant_fast(args, false, q, mode);
}

PyObject* f_dynamic_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_dynamic_quant", n, 5)) return nullptr;
  QuantDType q;
  XQ_TRY(py_quant(args[3], q, true));
  const int mode = py_dq_mode(args[4]);
  XQ_TRY(mode >= 0);
  return dynamic_quant_fast(args, true, q, mode);
}

// f_anti_quant(x, scale, offset, dst_dtype, src_dtype)
PyObject* f_anti_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_anti_quant", n, 5)) return nullptr;
  DType dst = DType::float16;
  if (args[3] != Py_None) {
    XQ_TRY(THPDtype_Check(args[3]));
    const std::optional<DType> d = to_dtype(reinterpret_cast<THPDtype*>(args[3])->scalar_type);
    XQ_TRY(d && xquant::is_floating(*d));
    dst = *d;
  }
  QuantDType q;
  XQ_TRY(py_quant(args[4], q, true));
  Arg x, s;
  std::optional<Arg> off;
  bool rg = false;
  XQ_TRY(targ(args[0], x, rg) && targ(args[1], s, rg) && opt_targ(args[2], off, rg) && plain(rg));
  return run(numel_of(x.v.shape), [&] {
    at::Tensor y = impl_anti_quant(x, s, off, dst, q, kCpu);
    return [y = std::move(y)]() mutable { return THPVariable_Wrap(std::move(y)); };
  });
}

// f_acts_ulq(x, clamp_min, clamp_max, fixed_min, num_bits)
PyObject* f_acts_ulq(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("f_acts_ulq", n, 5)) return nullptr;
  bool fixed = false;
  int nbits = 8;
  XQ_TRY(py_bool(args[3], fixed) && py_int(args[4], nbits));
  Arg x, lo, hi;
  bool rg = false;
  XQ_TRY(targ(args[0], x, rg));
  // Python numbers for the clamps: float32 x only (a float16 / bfloat16 rounding of a double takes the
  // operator, which rounds exactly as torch.tensor does).
  float lo_value = 0.0f, hi_value = 0.0f;
  const bool f32 = x.v.dtype == DType::float32;
  const bool lo_number = f32 && py_number(args[1], lo_value, lo), hi_number = f32 && py_number(args[2], hi_value, hi);
  XQ_TRY(lo_number || targ(args[1], lo, rg));
  XQ_TRY(hi_number || targ(args[2], hi, rg));
  XQ_TRY(modes_plain());
  if (rg && c10::GradMode::is_enabled()) {  // autograd records: the operator's autograd kernel, directly
    return run(numel_of(x.v.shape), [&] {
      const at::Tensor lot = lo_number ? at::scalar_tensor(lo_value, at::kFloat) : THPVariable_Unpack(args[1]);
      const at::Tensor hit = hi_number ? at::scalar_tensor(hi_value, at::kFloat) : THPVariable_Unpack(args[2]);
      variable_list r = ActsUlqFn::apply(THPVariable_Unpack(args[0]), lot, hit, fixed, nbits);
      return [r = std::move(r)] { return wrap_all(r); };
    });
  }
  return run(numel_of(x.v.shape), [&] {
    auto r = impl_acts_ulq(x, lo, hi, fixed, nbits, kCpu);
    return [r = std::move(r)] { return wrap_all(r); };
  });
}

#undef XQ_TRY

// check_writable(op, name, tensor): the in-place target holds its own values (check_own_values), checked by
// xquant.npu before the dispatcher (whose Negative / Conjugate fallbacks would materialize the view).
PyObject* check_writable(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("check_writable", n, 3)) return nullptr;
  if (!PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1]) || !THPVariable_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "xquant._torch_ext.check_writable(op: str, name: str, tensor)");
    return nullptr;
  }
  const char* op = PyUnicode_AsUTF8(args[0]);
  const char* name = PyUnicode_AsUTF8(args[1]);
  if (!op || !name) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(args[2]);
  return run(0, [&] {
    check_own_values(op, name, t);
    return [] { Py_RETURN_NONE; };
  });
}

// Plain eager mode (no mode, transform, trace or profiler): for tests.
PyObject* plain_modes(PyObject*, PyObject*) { return PyBool_FromLong(modes_plain()); }

#define XQ_FASTCALL(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f))

PyMethodDef g_methods[] = {
    {"plain_modes", plain_modes, METH_NOARGS, "True when no torch mode, transform, trace or profiler is active."},
    {"check_writable", XQ_FASTCALL(check_writable), METH_FASTCALL,
     "check_writable(op, name, tensor): ValueError if tensor is a negative / conjugate view."},
    {"f_fake_tensor_quant", XQ_FASTCALL(f_fake_tensor_quant), METH_FASTCALL,
     "f_fake_tensor_quant(inputs, amax, axis, num_bits, is_unsigned, narrow_range)"},
    {"f_fake_tensor_quant_inplace", XQ_FASTCALL(f_fake_tensor_quant_inplace), METH_FASTCALL,
     "f_fake_tensor_quant_inplace(inputs, amax, num_bits, is_unsigned, narrow_range)"},
    {"f_tile_quant", XQ_FASTCALL(f_tile_quant), METH_FASTCALL, "f_tile_quant(out, src, scale, mode, offset)"},
    {"f_quantize", XQ_FASTCALL(f_quantize), METH_FASTCALL,
     "f_quantize(input, scales, zero_points, dtype, axis, div_mode)"},
    {"f_dynamic_quant_asymmetric", XQ_FASTCALL(f_dynamic_quant_asymmetric), METH_FASTCALL,
     "f_dynamic_quant_asymmetric(x, smooth_scales, group_index, dst_type, quant_mode)"},
    {"f_dynamic_quant", XQ_FASTCALL(f_dynamic_quant), METH_FASTCALL,
     "f_dynamic_quant(x, smooth_scales, group_index, dst_type, quant_mode)"},
    {"f_anti_quant", XQ_FASTCALL(f_anti_quant), METH_FASTCALL, "f_anti_quant(x, scale, offset, dst_dtype, src_dtype)"},
    {"f_acts_ulq", XQ_FASTCALL(f_acts_ulq), METH_FASTCALL, "f_acts_ulq(x, clamp_min, clamp_max, fixed_min, num_bits)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT,
                        "_torch_ext",
                        "xquant's PyTorch operators (torch.ops.xquant.*) and their eager fast path (not a public API).",
                        -1,
                        g_methods,
                        nullptr,
                        nullptr,
                        nullptr,
                        nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_ext() {
  // The library through xquant._core (imported here if need be): one copy of its state per process.
  const auto* api = static_cast<const xquant_py::CoreApi*>(PyCapsule_Import(xquant_py::kCoreApiCapsule, 0));
  if (!api) return nullptr;
  if (api->version != xquant_py::kCoreApiVersion || api->size != sizeof(xquant_py::CoreApi)) {
    PyErr_SetString(PyExc_ImportError, "xquant._torch_ext was built with another xquant._core: reinstall xquant");
    return nullptr;
  }
  g_api = api;
  PyObject* m = PyModule_Create(&g_module);
  if (!m) return nullptr;
  if (PyModule_AddStringConstant(m, "TORCH_VERSION", XQUANT_TORCH_VERSION) < 0 ||
      PyModule_AddStringConstant(m, "__version__", xquant::kVersion) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
