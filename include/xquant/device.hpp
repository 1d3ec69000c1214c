// Where a tensor's memory lives, and the CUDA execution context of operator calls.
//
// Every TensorView / ConstTensorView / TileView carries a Device (default: the CPU, so code that never
// names a device is unchanged). An operator checks that all its tensors are on one device and runs there:
// CPU tensors on the CPU backend selected by set_backend(), CUDA tensors on the CUDA backend (when the
// library was built with it). CUDA calls are asynchronous on the stream of the innermost CudaStreamGuard
// of the calling thread (default: the legacy default stream, nullptr), like PyTorch's operators.
#pragma once
#include <cstdint>
#include <string>

namespace xquant {

enum class DeviceKind : std::uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // CUDA device ordinal; 0 for the CPU

  static constexpr Device cpu() noexcept { return {}; }
  static constexpr Device cuda(int i = 0) noexcept { return {DeviceKind::cuda, i}; }
  constexpr bool is_cuda() const noexcept { return kind == DeviceKind::cuda; }
  constexpr bool operator==(const Device&) const noexcept = default;
};

// "cpu", "cuda:0".
std::string device_str(Device d);

// True when this library was compiled with the CUDA backend (CMake option XQUANT_CUDA).
bool cuda_built() noexcept;
// True when the CUDA backend is built and at least one CUDA device can be used. Probed on the first call
// (cudaGetDeviceCount), never at load time: a CUDA build loads and runs on machines without a GPU or
// driver, with CPU tensors only.
bool cuda_available() noexcept;
// Why cuda_available() is false ("" when it is true), e.g. "xquant was built without CUDA" or the CUDA
// runtime's error string ("no CUDA-capable device is detected").
std::string cuda_unavailable_reason();

// Scoped choice of the CUDA stream (a cudaStream_t passed as void*) on which this thread's operator calls
// on CUDA tensors run; guards nest, the destructor restores the previous stream.
class CudaStreamGuard {
 public:
  explicit CudaStreamGuard(void* stream) noexcept;
  ~CudaStreamGuard();
  CudaStreamGuard(const CudaStreamGuard&) = delete;
  CudaStreamGuard& operator=(const CudaStreamGuard&) = delete;

 private:
  void* previous_;
};
// The stream of the innermost CudaStreamGuard of this thread (nullptr: the default stream).
void* current_cuda_stream() noexcept;

}  // namespace xquant
