// xquant._torch_fast: the eager fast path of xquant.npu, compiled against the installed PyTorch's C++ API.
//
// Optional (python/CMakeLists.txt builds it only when torch is importable at build time) and used only when
// the runtime torch is the build-time one (xquant._torch_ops compares TORCH_VERSION with torch.__version__);
// otherwise xquant.npu calls the torch-header-free xquant._core.t_* functions, which do the same work through
// the CPython API. Each function here mirrors the lenient mode of its _core.t_* namesake, argument for
// argument, result for result: it computes only in plain eager mode on plain dense CPU tensors and returns
// None otherwise (the caller then takes the full path, which validates and reports), or NotImplemented for
// the operators with autograd when autograd recording is the only obstacle. What makes it cheaper than
// _core.t_*: tensors are read as at::Tensor (THPVariable_Unpack: no Python attribute calls), outputs are
// allocated in C++ by at::detail::empty_cpu (torch.empty from C costs 0.7-0.9 us, this about 0.15 us), and
// the mode / grad probes read torch's thread-local state directly instead of calling five Python
// functions. The xquant library itself is the one inside xquant._core, reached through the function table
// of core_api.hpp (one copy of its state per process).
//
// Raw CPython entry points (METH_FASTCALL), no pybind11: one translation unit with only the ATen / c10
// headers it needs keeps the build short.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/TracerMode.h>
#include <ATen/core/Tensor.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <climits>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "core_api.hpp"
#include "xquant/version.hpp"

#ifndef XQUANT_TORCH_VERSION
#error "XQUANT_TORCH_VERSION (the build-time torch.__version__) must be defined"
#endif

namespace {

using xquant::ConstTensorView;
using xquant::DType;
using xquant::Shape;
using xquant::TensorView;
using xquant_py::Status;

// The xquant library, as xquant._core holds it (core_api.hpp): set when the module is imported.
const xquant_py::CoreApi* g_api = nullptr;

// torch dtype objects -> QuantDType code (npu_quantize's dtype, the dynamic quantizers' dst_type, anti
// quant's src_dtype): the same table as _core's, handed over by init().
std::vector<std::pair<PyObject*, int>> g_qdtypes;
bool g_ready = false;

// Outputs of at least this many bytes come from xquant's allocator (as in _core: huge pages, cached).
constexpr std::size_t kXqAllocMinBytes = std::size_t{2} << 20;
// Calls on fewer elements keep the GIL (as in _core).
constexpr std::int64_t kReleaseGilMinElements = std::int64_t{1} << 15;

std::optional<DType> to_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::float32;
    case at::kHalf: return DType::float16;
    case at::kBFloat16: return DType::bfloat16;
    case at::kChar: return DType::int8;
    case at::kByte: return DType::uint8;
    case at::kInt: return DType::int32;
    case at::kLong: return DType::int64;
    default: return std::nullopt;
  }
}

at::ScalarType to_scalar(DType d) {
  switch (d) {
    case DType::float32: return at::kFloat;
    case DType::float16: return at::kHalf;
    case DType::bfloat16: return at::kBFloat16;
    case DType::int8: return at::kChar;
    case DType::uint8: return at::kByte;
    case DType::int32: return at::kInt;
    case DType::int64: return at::kLong;
  }
  return at::kFloat;
}

std::size_t bytes_per(DType d) {
  switch (d) {
    case DType::float32: case DType::int32: return 4;
    case DType::float16: case DType::bfloat16: return 2;
    case DType::int8: case DType::uint8: return 1;
    case DType::int64: return 8;
  }
  return 4;
}

DType storage_of(xquant::QuantDType q) {
  switch (q) {
    case xquant::QuantDType::qint8: return DType::int8;
    case xquant::QuantDType::quint8: return DType::uint8;
    case xquant::QuantDType::qint32: case xquant::QuantDType::quint4x2: return DType::int32;
  }
  return DType::int8;
}

// The element count, or -1 where it overflows (the operator, reached through the full path, reports).
std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// A failed Status as the Python exception _core raises for it; nullptr for the caller to return.
PyObject* raise(const Status& st) {
  switch (st.code) {
    case Status::type_error: PyErr_SetString(PyExc_TypeError, st.message.c_str()); break;
    case Status::value_error: PyErr_SetString(PyExc_ValueError, st.message.c_str()); break;
    case Status::no_memory: PyErr_NoMemory(); break;
    default: PyErr_SetString(PyExc_RuntimeError, st.message.c_str()); break;
  }
  return nullptr;
}

// No torch dispatch / function mode, functorch transform, JIT trace or profiler is active: what _core's five
// Python probes check (torch._C._len_torch_dispatch_stack, _is_torch_function_mode_enabled,
// _are_functorch_transforms_active, _get_tracing_state, _autograd._profiler_enabled), read directly.
bool modes_plain() {
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0 && !at::impl::torch_function_mode_enabled() &&
         at::functorch::getDynamicLayerStack().empty() && !at::tracer::impl::is_dispatch_enabled() &&
         !torch::profiler::impl::profilerEnabled();
}

// A plain dense CPU tensor (torch.Tensor or nn.Parameter exactly) of a dtype xquant reads.
// (The view holds the one copy of the shape that the operator call needs: no further copies per call.)
struct TArg {
  const at::Tensor* t = nullptr;
  ConstTensorView v;  // data, dtype, shape
  bool requires_grad = false;
  std::int64_t numel() const { return numel_of(v.shape); }
};

bool targ(PyObject* o, TArg& a) {
  if (!THPVariable_CheckExact(o)) return false;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined() || t.layout() != at::kStrided || !t.is_cpu() || t.is_nested()) return false;
  const std::optional<DType> dt = to_dtype(t.scalar_type());
  if (!dt || !t.is_contiguous() || t.is_neg() || !t.has_storage()) return false;
  a.t = &t;
  a.v.dtype = *dt;
  a.requires_grad = t.requires_grad();
  const auto sizes = t.sizes();
  a.v.shape.assign(sizes.begin(), sizes.end());
  a.v.data = t.numel() == 0 ? nullptr : t.const_data_ptr();
  return true;
}

bool opt_targ(PyObject* o, std::optional<TArg>& a) {
  if (o == Py_None) return true;
  a.emplace();
  return targ(o, *a);
}

bool py_int(PyObject* o, int& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow || x < INT_MIN || x > INT_MAX) return false;
  v = static_cast<int>(x);
  return true;
}

bool py_int64(PyObject* o, std::int64_t& v) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow) return false;
  v = x;
  return true;
}

bool py_bool(PyObject* o, bool& v) {
  if (o != Py_True && o != Py_False) return false;
  v = o == Py_True;
  return true;
}

// A Python real number as a 0-d float32 parameter.
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

int qcode(PyObject* o) {
  for (const auto& [k, c] : g_qdtypes)
    if (k == o) return c;
  return -1;
}

struct Out {
  at::Tensor tensor;
  TensorView view;
};

// false (with a Python error set) where the allocation fails; the shape has been checked by numel_of.
bool alloc(Out& o, Shape shape, DType dt) {
  const std::int64_t n = numel_of(shape);
  if (static_cast<std::size_t>(n) * bytes_per(dt) >= kXqAllocMinBytes) {
    Status st;
    void* data = nullptr;
    void* owner = g_api->new_tensor(st, dt, shape, &data);
    if (!owner) {
      raise(st);
      return false;
    }
    const xquant_py::CoreApi* api = g_api;
    o.tensor = at::from_blob(data, shape, [api, owner](void*) { api->free_tensor(owner); },
                             at::TensorOptions().dtype(to_scalar(dt)).device(at::kCPU));
    o.view = {data, dt, std::move(shape)};
    return true;
  }
  // at::detail::empty_cpu: what at::empty's CPU kernel calls, without the dispatcher round trip (no mode is
  // active here; every element is written by the operator, so deterministic-fill mode changes nothing).
  o.tensor = at::Tensor(at::detail::empty_cpu(shape, to_scalar(dt)));
  o.view = {n == 0 ? nullptr : o.tensor.mutable_data_ptr(), dt, std::move(shape)};
  return true;
}

template <class F>
void run_maybe_nogil(std::int64_t elements, F&& f) {
  if (elements >= kReleaseGilMinElements) {
    PyThreadState* save = PyEval_SaveThread();
    try {
      f();
    } catch (...) {
      PyEval_RestoreThread(save);
      throw;
    }
    PyEval_RestoreThread(save);
  } else {
    f();
  }
}

PyObject* none() { Py_RETURN_NONE; }
PyObject* not_implemented() { Py_RETURN_NOTIMPLEMENTED; }
PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

PyObject* wrap_tuple(std::initializer_list<at::Tensor*> ts) {
  PyObject* tup = PyTuple_New(static_cast<Py_ssize_t>(ts.size()));
  if (!tup) return nullptr;
  Py_ssize_t i = 0;
  for (at::Tensor* t : ts) {
    PyObject* w = THPVariable_Wrap(std::move(*t));
    if (!w) {
      Py_DECREF(tup);
      return nullptr;
    }
    PyTuple_SET_ITEM(tup, i++, w);
  }
  return tup;
}

// C++ exceptions (torch's, allocation) -> Python errors. (The library's own errors arrive as a Status.)
template <class F>
PyObject* guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

bool nargs_ok(const char* name, Py_ssize_t n, Py_ssize_t want) {
  if (n == want) return true;
  PyErr_Format(PyExc_TypeError, "xquant._torch_fast.%s takes %zd arguments (%zd given)", name, want, n);
  return false;
}

#define XQ_TRY(cond)            \
  do {                          \
    if (!(cond)) return none(); \
  } while (0)
#define XQ_ALLOC(name, shape, dtype)            \
  Out name;                                     \
  if (!alloc(name, shape, dtype)) return nullptr

// t_fake_tensor_quant(inputs, amax, axis, num_bits, is_unsigned, narrow_range)
PyObject* t_fake_tensor_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_fake_tensor_quant", n, 6)) return nullptr;
  return guarded([&]() -> PyObject* {
    const bool has_axis = args[2] != Py_None;
    xquant::FakeQuantOptions o;
    std::int64_t ax = 0;
    XQ_TRY(py_int(args[3], o.num_bits) && py_bool(args[4], o.is_unsigned) && py_bool(args[5], o.narrow_range));
    if (has_axis) XQ_TRY(py_int64(args[2], ax));
    TArg x, a;
    XQ_TRY(targ(args[0], x));
    float a_value = 0.0f;
    if (py_number(args[1], a_value)) a.v.data = &a_value;
    else XQ_TRY(targ(args[1], a));
    XQ_TRY(modes_plain());
    if ((x.requires_grad || a.requires_grad) && c10::GradMode::is_enabled()) return not_implemented();
    XQ_TRY(x.numel() >= 0);
    XQ_ALLOC(out, x.v.shape, x.v.dtype);
    Status st;
    run_maybe_nogil(x.numel(), [&] { g_api->fake_tensor_quant(st, out.view, x.v, a.v, has_axis ? &ax : nullptr, o); });
    if (st.code != Status::ok) return raise(st);
    return wrap(std::move(out.tensor));
  });
}

// A tensor the fast path may write in place (as _core's plain_inplace_target): not an inference tensor,
// and not a view while grad mode is on (torch refuses some in-place writes to views; the full path lets
// torch decide).
bool plain_inplace_target(const at::Tensor& t) {
  return !t.is_inference() && !(t.is_view() && c10::GradMode::is_enabled());
}

// The data of a tensor written in place: mutable_data_ptr() materializes a lazily copied (copy-on-write)
// storage first, as torch's in-place operators do (const_data_ptr(), used for inputs, does not).
void* writable_data(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.mutable_data_ptr(); }

// t_fake_tensor_quant_inplace(inputs, amax, num_bits, is_unsigned, narrow_range)
PyObject* t_fake_tensor_quant_inplace(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_fake_tensor_quant_inplace", n, 5)) return nullptr;
  return guarded([&]() -> PyObject* {
    xquant::FakeQuantOptions o;
    XQ_TRY(py_int(args[2], o.num_bits) && py_bool(args[3], o.is_unsigned) && py_bool(args[4], o.narrow_range));
    TArg x, a;
    XQ_TRY(targ(args[0], x));
    float a_value = 0.0f;
    if (py_number(args[1], a_value)) a.v.data = &a_value;
    else XQ_TRY(targ(args[1], a));
    // A tensor that requires grad is refused by the full path (no autograd for the in-place form).
    XQ_TRY(!x.requires_grad && plain_inplace_target(*x.t) && modes_plain());
    if (a.requires_grad) XQ_TRY(!c10::GradMode::is_enabled());
    const TensorView xv{writable_data(*x.t), x.v.dtype, x.v.shape};
    const ConstTensorView& av = a.v;
    XQ_TRY(x.numel() >= 0);
    Status st;
    run_maybe_nogil(x.numel(), [&] { g_api->fake_tensor_quant_inplace(st, xv, av, o); });
    if (st.code != Status::ok) return raise(st);
    x.t->unsafeGetTensorImpl()->bump_version();  // what an in-place torch operator does
    Py_INCREF(args[0]);
    return args[0];
  });
}

// t_tile_quant(out, src, scale, mode, offset): dense tiles only (padded rows take the full path).
PyObject* t_tile_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_tile_quant", n, 5)) return nullptr;
  return guarded([&]() -> PyObject* {
    PyObject* mode = args[3];
    bool asym;
    if (PyUnicode_Check(mode) && PyUnicode_CompareWithASCIIString(mode, "SYM") == 0) asym = false;
    else if (PyUnicode_Check(mode) && PyUnicode_CompareWithASCIIString(mode, "ASYM") == 0) asym = true;
    else return none();
    TArg o, s, sc;
    std::optional<TArg> off;
    XQ_TRY(targ(args[0], o) && targ(args[1], s) && targ(args[2], sc) && opt_targ(args[4], off));
    XQ_TRY(!o.requires_grad && plain_inplace_target(*o.t) && modes_plain());
    if (s.requires_grad || sc.requires_grad || (off && off->requires_grad)) XQ_TRY(!c10::GradMode::is_enabled());
    // Not 2-D: the full path reports (with _core's message).
    XQ_TRY(o.v.shape.size() == 2 && s.v.shape.size() == 2 && sc.v.shape.size() == 2 && (!off || off->v.shape.size() == 2));
    auto tile = [](const TArg& t) {
      return xquant::ConstTileView{t.v.data, t.v.dtype, t.v.shape[0], t.v.shape[1], t.v.shape[1]};
    };
    const xquant::ConstTileView ov = tile(o), sv = tile(s), scv = tile(sc);
    std::optional<xquant::ConstTileView> offv;
    if (off) offv = tile(*off);
    const xquant::TileView out_tile{writable_data(*o.t), ov.dtype, ov.rows, ov.cols, ov.row_pitch};
    XQ_TRY(o.numel() >= 0);
    Status st;
    run_maybe_nogil(o.numel(), [&] {
      g_api->tile_quant(st, out_tile, sv, scv, asym ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM, offv);
    });
    if (st.code != Status::ok) return raise(st);
    o.t->unsafeGetTensorImpl()->bump_version();
    Py_INCREF(args[0]);
    return args[0];
  });
}

// t_quantize(input, scales, zero_points, dtype, axis, div_mode)
PyObject* t_quantize(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_quantize", n, 6)) return nullptr;
  return guarded([&]() -> PyObject* {
    const int code = qcode(args[3]);
    XQ_TRY(code >= 0);
    std::int64_t ax = 0;
    bool div = true;
    XQ_TRY(py_int64(args[4], ax) && py_bool(args[5], div));
    TArg x, s;
    std::optional<TArg> zp;
    XQ_TRY(targ(args[0], x) && targ(args[1], s) && opt_targ(args[2], zp));
    XQ_TRY(modes_plain());
    if (x.requires_grad || s.requires_grad || (zp && zp->requires_grad)) XQ_TRY(!c10::GradMode::is_enabled());
    const auto q = static_cast<xquant::QuantDType>(code);
    Shape out_shape = x.v.shape;
    if (q == xquant::QuantDType::quint4x2 && !out_shape.empty()) out_shape.back() /= 8;
    XQ_TRY(x.numel() >= 0 && numel_of(out_shape) >= 0);
    XQ_ALLOC(out, out_shape, storage_of(q));
    const ConstTensorView &xv = x.v, &sv = s.v;
    std::optional<ConstTensorView> zv;
    if (zp) zv = zp->v;
    Status st;
    run_maybe_nogil(x.numel(), [&] { g_api->quantize(st, out.view, xv, sv, zv, q, ax, div); });
    if (st.code != Status::ok) return raise(st);
    return wrap(std::move(out.tensor));
  });
}

// Shared by the two dynamic quantizers: dst_type None -> qint8, else a quantized dtype; -1 otherwise.
int dst_code(PyObject* o) { return o == Py_None ? static_cast<int>(xquant::QuantDType::qint8) : qcode(o); }

// t_dynamic_quant_asymmetric(x, smooth_scales, group_index, dst_type, quant_mode)
PyObject* t_dynamic_quant_asymmetric(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_dynamic_quant_asymmetric", n, 5)) return nullptr;
  return guarded([&]() -> PyObject* {
    const int code = dst_code(args[3]);
    XQ_TRY(code >= 0);
    PyObject* mode = args[4];
    bool per_tensor;
    if (PyUnicode_Check(mode) && PyUnicode_CompareWithASCIIString(mode, "pertoken") == 0) per_tensor = false;
    else if (PyUnicode_Check(mode) && PyUnicode_CompareWithASCIIString(mode, "pertensor") == 0) per_tensor = true;
    else return none();
    TArg xa;
    std::optional<TArg> sm, gi;
    XQ_TRY(targ(args[0], xa) && opt_targ(args[1], sm) && opt_targ(args[2], gi));
    XQ_TRY(modes_plain());
    if (xa.requires_grad || (sm && sm->requires_grad)) XQ_TRY(!c10::GradMode::is_enabled());
    const auto q = static_cast<xquant::QuantDType>(code);
    Shape y_shape = xa.v.shape;
    if (q == xquant::QuantDType::quint4x2 && !y_shape.empty()) y_shape.back() /= 8;
    const Shape p_shape =
        per_tensor ? Shape{1} : Shape(xa.v.shape.begin(), xa.v.shape.end() - (xa.v.shape.empty() ? 0 : 1));
    XQ_TRY(xa.numel() >= 0 && numel_of(y_shape) >= 0 && numel_of(p_shape) >= 0);
    XQ_ALLOC(y, y_shape, storage_of(q));
    XQ_ALLOC(sc, p_shape, DType::float32);
    XQ_ALLOC(of, p_shape, DType::float32);
    const ConstTensorView& xv = xa.v;
    std::optional<ConstTensorView> smv, giv;
    if (sm) smv = sm->v;
    if (gi) giv = gi->v;
    Status st;
    run_maybe_nogil(xa.numel(), [&] {
      g_api->dynamic_quant_asymmetric(st, y.view, sc.view, of.view, xv, smv, giv, q, per_tensor);
    });
    if (st.code != Status::ok) return raise(st);
    return wrap_tuple({&y.tensor, &sc.tensor, &of.tensor});
  });
}

// t_dynamic_quant(x, smooth_scales, group_index, dst_type)
PyObject* t_dynamic_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_dynamic_quant", n, 4)) return nullptr;
  return guarded([&]() -> PyObject* {
    const int code = dst_code(args[3]);
    XQ_TRY(code >= 0);
    TArg xa;
    std::optional<TArg> sm, gi;
    XQ_TRY(targ(args[0], xa) && opt_targ(args[1], sm) && opt_targ(args[2], gi));
    XQ_TRY(modes_plain());
    if (xa.requires_grad || (sm && sm->requires_grad)) XQ_TRY(!c10::GradMode::is_enabled());
    const auto q = static_cast<xquant::QuantDType>(code);
    Shape y_shape = xa.v.shape;
    if (q == xquant::QuantDType::quint4x2 && !y_shape.empty()) y_shape.back() /= 8;
    const Shape p_shape(xa.v.shape.begin(), xa.v.shape.end() - (xa.v.shape.empty() ? 0 : 1));
    XQ_TRY(xa.numel() >= 0 && numel_of(y_shape) >= 0 && numel_of(p_shape) >= 0);
    XQ_ALLOC(y, y_shape, storage_of(q));
    XQ_ALLOC(sc, p_shape, DType::float32);
    const ConstTensorView& xv = xa.v;
    std::optional<ConstTensorView> smv, giv;
    if (sm) smv = sm->v;
    if (gi) giv = gi->v;
    Status st;
    run_maybe_nogil(xa.numel(), [&] { g_api->dynamic_quant(st, y.view, sc.view, xv, smv, giv, q); });
    if (st.code != Status::ok) return raise(st);
    return wrap_tuple({&y.tensor, &sc.tensor});
  });
}

// t_anti_quant(x, scale, offset, dst_dtype, src_dtype)
PyObject* t_anti_quant(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_anti_quant", n, 5)) return nullptr;
  return guarded([&]() -> PyObject* {
    DType dst = DType::float16;
    if (args[3] != Py_None) {
      XQ_TRY(THPDtype_Check(args[3]));
      const std::optional<DType> d = to_dtype(reinterpret_cast<THPDtype*>(args[3])->scalar_type);
      XQ_TRY(d && xquant::is_floating(*d));
      dst = *d;
    }
    const int code = dst_code(args[4]);
    XQ_TRY(code >= 0);
    TArg xa, sa;
    std::optional<TArg> oa;
    XQ_TRY(targ(args[0], xa) && targ(args[1], sa) && opt_targ(args[2], oa));
    XQ_TRY(modes_plain());
    if (sa.requires_grad || (oa && oa->requires_grad)) XQ_TRY(!c10::GradMode::is_enabled());
    const auto q = static_cast<xquant::QuantDType>(code);
    Shape out_shape = xa.v.shape;
    if (q == xquant::QuantDType::quint4x2 && !out_shape.empty() && out_shape.back() <= INT64_MAX / 8)
      out_shape.back() *= 8;
    XQ_TRY(numel_of(out_shape) >= 0);
    XQ_ALLOC(out, out_shape, dst);
    const ConstTensorView &xv = xa.v, &sv = sa.v;
    std::optional<ConstTensorView> ov;
    if (oa) ov = oa->v;
    Status st;
    run_maybe_nogil(numel_of(out_shape), [&] { g_api->anti_quant(st, out.view, xv, sv, ov, q); });
    if (st.code != Status::ok) return raise(st);
    return wrap(std::move(out.tensor));
  });
}

// t_acts_ulq(x, clamp_min, clamp_max, fixed_min, num_bits)
PyObject* t_acts_ulq(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!nargs_ok("t_acts_ulq", n, 5)) return nullptr;
  return guarded([&]() -> PyObject* {
    bool fixed = false;
    int nbits = 8;
    XQ_TRY(py_bool(args[3], fixed) && py_int(args[4], nbits));
    TArg xa, lo, hi;
    XQ_TRY(targ(args[0], xa));
    // Python numbers for the clamps: float32 x only (as in _core).
    float lo_value = 0.0f, hi_value = 0.0f;
    if (xa.v.dtype == DType::float32 && py_number(args[1], lo_value)) lo.v.data = &lo_value;
    else XQ_TRY(targ(args[1], lo));
    if (xa.v.dtype == DType::float32 && py_number(args[2], hi_value)) hi.v.data = &hi_value;
    else XQ_TRY(targ(args[2], hi));
    XQ_TRY(modes_plain());
    if ((xa.requires_grad || lo.requires_grad || hi.requires_grad) && c10::GradMode::is_enabled())
      return not_implemented();
    Shape shape;
    if (!g_api->acts_ulq_output_shape(xa.v.shape, lo.v.shape, hi.v.shape, shape))
      shape = xa.v.shape;  // the operator reports the mismatch below, naming the argument
    XQ_TRY(numel_of(shape) >= 0);
    XQ_ALLOC(y, shape, xa.v.dtype);
    XQ_ALLOC(m0, shape, xa.v.dtype);
    XQ_ALLOC(m1, shape, xa.v.dtype);
    XQ_ALLOC(loss, shape, xa.v.dtype);
    const ConstTensorView &xv = xa.v, &lov = lo.v, &hiv = hi.v;
    Status st;
    run_maybe_nogil(numel_of(shape), [&] {
      g_api->acts_ulq(st, y.view, m0.view, m1.view, loss.view, xv, lov, hiv, fixed, nbits);
    });
    if (st.code != Status::ok) return raise(st);
    return wrap_tuple({&y.tensor, &m0.tensor, &m1.tensor, &loss.tensor});
  });
}

#undef XQ_TRY
#undef XQ_ALLOC

// init(qdtypes): the {torch dtype: QuantDType code} table of xquant._torch_ops.
PyObject* init(PyObject*, PyObject* arg) {
  if (!PyDict_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "xquant._torch_fast.init expects a dict");
    return nullptr;
  }
  if (!g_ready) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(arg, &pos, &k, &v)) {
      const long c = PyLong_AsLong(v);
      if (c == -1 && PyErr_Occurred()) return nullptr;
      Py_INCREF(k);  // held for the life of the process
      g_qdtypes.emplace_back(k, static_cast<int>(c));
    }
    g_ready = true;
  }
  Py_RETURN_NONE;
}

// Plain eager mode (no mode, transform, trace or profiler): for tests.
PyObject* plain_modes(PyObject*, PyObject*) { return PyBool_FromLong(modes_plain()); }

#define XQ_FASTCALL(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f))

PyMethodDef g_methods[] = {
    {"init", init, METH_O, "init(qdtypes): the quantized dtype table (xquant._torch_ops calls it once)."},
    {"plain_modes", plain_modes, METH_NOARGS, "True when no torch mode, transform, trace or profiler is active."},
    {"t_fake_tensor_quant", XQ_FASTCALL(t_fake_tensor_quant), METH_FASTCALL,
     "t_fake_tensor_quant(inputs, amax, axis, num_bits, is_unsigned, narrow_range)"},
    {"t_fake_tensor_quant_inplace", XQ_FASTCALL(t_fake_tensor_quant_inplace), METH_FASTCALL,
     "t_fake_tensor_quant_inplace(inputs, amax, num_bits, is_unsigned, narrow_range)"},
    {"t_tile_quant", XQ_FASTCALL(t_tile_quant), METH_FASTCALL, "t_tile_quant(out, src, scale, mode, offset)"},
    {"t_quantize", XQ_FASTCALL(t_quantize), METH_FASTCALL,
     "t_quantize(input, scales, zero_points, dtype, axis, div_mode)"},
    {"t_dynamic_quant_asymmetric", XQ_FASTCALL(t_dynamic_quant_asymmetric), METH_FASTCALL,
     "t_dynamic_quant_asymmetric(x, smooth_scales, group_index, dst_type, quant_mode)"},
    {"t_dynamic_quant", XQ_FASTCALL(t_dynamic_quant), METH_FASTCALL,
     "t_dynamic_quant(x, smooth_scales, group_index, dst_type)"},
    {"t_anti_quant", XQ_FASTCALL(t_anti_quant), METH_FASTCALL,
     "t_anti_quant(x, scale, offset, dst_dtype, src_dtype)"},
    {"t_acts_ulq", XQ_FASTCALL(t_acts_ulq), METH_FASTCALL, "t_acts_ulq(x, clamp_min, clamp_max, fixed_min, num_bits)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "_torch_fast",
                        "xquant's eager fast path compiled against PyTorch's C++ API (not a public API).", -1,
                        g_methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_fast() {
  // The library through xquant._core (imported here if need be): one copy of its state per process.
  const auto* api = static_cast<const xquant_py::CoreApi*>(PyCapsule_Import(xquant_py::kCoreApiCapsule, 0));
  if (!api) return nullptr;
  if (api->version != xquant_py::kCoreApiVersion || api->size != sizeof(xquant_py::CoreApi)) {
    PyErr_SetString(PyExc_ImportError, "xquant._torch_fast was built with another xquant._core");
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
