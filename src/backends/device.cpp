// Device memory, copies and per-device kernel tables for the core (core/device_ops.hpp), and the public
// device queries (xquant/device.hpp). CUDA devices go to src/cuda/ when XQUANT_HAVE_CUDA is defined.
#include <string>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "xquant/device.hpp"
#include "xquant/error.hpp"

#if defined(XQUANT_HAVE_CUDA)
#include "cuda/cuda.hpp"
#endif

namespace xquant {

namespace {
thread_local void* t_stream = nullptr;
}  // namespace

std::string device_str(Device d) { return d.is_cuda() ? "cuda:" + std::to_string(d.index) : std::string("cpu"); }

bool cuda_built() noexcept {
#if defined(XQUANT_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

std::string cuda_unavailable_reason() {
#if defined(XQUANT_HAVE_CUDA)
  return detail::cuda::unavailable_reason();
#else
  return "xquant was built without CUDA (CMake option XQUANT_CUDA)";
#endif
}

bool cuda_available() noexcept {
  try {
    return cuda_unavailable_reason().empty();
  } catch (...) {
    return false;
  }
}

CudaStreamGuard::CudaStreamGuard(void* stream) noexcept : previous_(t_stream) { t_stream = stream; }
CudaStreamGuard::~CudaStreamGuard() { t_stream = previous_; }
void* current_cuda_stream() noexcept { return t_stream; }

}  // namespace xquant

namespace xquant::detail {

namespace {
// CUDA usable on device d, else an Error naming `what`.
void require_cuda(std::string_view op, std::string_view arg, Device d) {
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty())
    fail(ErrorCode::device_error, op, arg,
         std::string(arg) + " is on " + device_str(d) + " but the CUDA backend cannot run: " + reason);
}
}  // namespace

#if defined(XQUANT_HAVE_CUDA)
void* device_alloc(Device d, std::size_t bytes, void* stream, std::string_view what) {
  require_cuda("Tensor", "device", d);
  return cuda::alloc(d.index, bytes, stream, std::string(what));
}
void device_free(Device d, void* p, void* stream) noexcept { cuda::free(d.index, p, stream); }
void device_to_host(Device d, void* dst, const void* src, std::size_t bytes, void* stream) {
  require_cuda("copy", "src", d);
  cuda::to_host(d.index, dst, src, bytes, stream);
}
void host_to_device(Device d, void* dst, const void* src, std::size_t bytes, void* stream) {
  require_cuda("copy", "dst", d);
  cuda::to_device(d.index, dst, src, bytes, stream);
}
const KernelTable& kernels_for(std::string_view op, std::string_view arg, Device d) {
  if (!d.is_cuda()) return active_kernels();
  require_cuda(op, arg, d);
  cuda::set_device(d.index);
  return cuda::kernels();
}
#else
void* device_alloc(Device d, std::size_t, void*, std::string_view) {
  require_cuda("Tensor", "device", d);
  return nullptr;
}
void device_free(Device, void*, void*) noexcept {}
void device_to_host(Device d, void*, const void*, std::size_t, void*) { require_cuda("copy", "src", d); }
void host_to_device(Device d, void*, const void*, std::size_t, void*) { require_cuda("copy", "dst", d); }
const KernelTable& kernels_for(std::string_view op, std::string_view arg, Device d) {
  if (d.is_cuda()) require_cuda(op, arg, d);
  return active_kernels();
}
#endif

}  // namespace xquant::detail

namespace xquant::detail {

Device common_device(std::string_view op, std::initializer_list<DeviceArg> args) {
  if (args.size() == 0) return Device{};
  const DeviceArg& first = *args.begin();
  for (const DeviceArg& a : args)
    if (!(a.device == first.device))
      fail(ErrorCode::device_mismatch, op, a.name,
           std::string(a.name) + " is on " + device_str(a.device) + " but " + std::string(first.name) + " is on " +
               device_str(first.device) + " (expected every tensor of the call on one device)");
  return first.device;
}

}  // namespace xquant::detail
