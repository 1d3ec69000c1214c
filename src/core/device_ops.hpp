// Device memory and copies as the core sees them (Tensor, operators' small host-side reads). Implemented
// by the backend registry (src/backends/device.cpp), which forwards CUDA devices to src/cuda/ when the
// CUDA backend is built and throws xquant::Error otherwise. CPU devices never reach these functions.
#pragma once
#include <cstddef>
#include <string_view>

#include "core/check.hpp"
#include "core/kernels.hpp"
#include "xquant/device.hpp"

namespace xquant::detail {

// Stream-ordered allocation of `bytes` (> 0) on device d on `stream`; throws Error (out_of_memory) on
// failure, naming `what`.
void* device_alloc(Device d, std::size_t bytes, void* stream, std::string_view what);
// Stream-ordered free (never throws; errors are dropped: a destructor cannot report them).
void device_free(Device d, void* p, void* stream) noexcept;
// Synchronous copy of `bytes` device -> host (ordered after the work queued on `stream`).
void device_to_host(Device d, void* dst, const void* src, std::size_t bytes, void* stream);
// Copy host -> device, stream-ordered (the host buffer may be reused when the call returns).
void host_to_device(Device d, void* dst, const void* src, std::size_t bytes, void* stream);

// The kernel table operators on device d run: active_kernels() for the CPU; the CUDA table for CUDA
// devices, or an Error (device_error, naming op and arg) when CUDA is not built / not usable. Every
// table has a kernel for every family (tests/test_runtime.cpp Runtime.EveryKernelTableIsComplete).
const KernelTable& kernels_for(std::string_view op, std::string_view arg, Device d);

}  // namespace xquant::detail

#include <initializer_list>
#include <vector>

#include "xquant/tensor.hpp"

namespace xquant::detail {

// One tensor argument of an operator, for the device check.
struct DeviceArg {
  std::string_view name;
  Device device;
};
// The device all `args` are on; throws Error (device_mismatch) naming the first argument that is on
// another device than the first one, and both devices.
Device common_device(std::string_view op, std::initializer_list<DeviceArg> args);

// A host copy of a (small) view that operators read on the host (amax, scales, group_index): the view
// itself when it is on the CPU, else its bytes copied from the device (synchronously, on the current
// stream).
class HostCopy {
 public:
  explicit HostCopy(const ConstTensorView& v) : view_(v) {
    if (!v.device.is_cuda()) return;
    const std::size_t n = v.data != nullptr ? v.nbytes() : 0;
    bytes_.resize(n);
    if (n > 0) device_to_host(v.device, bytes_.data(), v.data, n, current_cuda_stream());
    view_.data = n > 0 ? static_cast<const void*>(bytes_.data()) : v.data;
    view_.device = Device{};
  }
  const ConstTensorView& view() const noexcept { return view_; }

 private:
  std::vector<unsigned char> bytes_;
  ConstTensorView view_;
};

}  // namespace xquant::detail
