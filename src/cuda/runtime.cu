// CUDA backend runtime glue: lazy availability probe, stream-ordered memory, copies, errors, and the
// kernel table (the kernels live in one .cu file per operator family).
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "cuda/cuda.hpp"
#include "cuda/common.cuh"
#include "cuda/matmul.hpp"
#include "xquant/error.hpp"

namespace xquant::detail::cuda {

const std::string& unavailable_reason() {
  // Probed once, on first use (never at load time): a library built with CUDA loads and runs CPU-only
  // on machines without a GPU or a driver.
  static const std::string reason = [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state of this thread
      // Without any driver the runtime says "CUDA driver version is insufficient for CUDA runtime
      // version"; cudaDriverGetVersion reports 0 then, which tells the two cases apart.
      int driver = 0;
      if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
        return std::string("no NVIDIA driver found (the CUDA driver library libcuda.so.1 could not be loaded)");
      return std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
    }
    if (count == 0) return std::string("no CUDA device found (cudaGetDeviceCount returned 0)");
    return std::string();
  }();
  return reason;
}

void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  const ErrorCode code = e == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::device_error;
  throw Error(code, "cuda",
              "xquant::cuda: CUDA error in " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void set_device(int index) { check(cudaSetDevice(index), "cudaSetDevice(" + std::to_string(index) + ")"); }

void* alloc(int index, std::size_t bytes, void* stream, const std::string& what) {
  set_device(index);
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::device_error, "cuda",
                "xquant::cuda: cannot allocate " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(index) +
                    " for " + what + ": " + cudaGetErrorString(e));
  }
  return p;
}

void free(int index, void* p, void* stream) noexcept {
  if (p == nullptr) return;
  if (cudaSetDevice(index) != cudaSuccess || cudaFreeAsync(p, static_cast<cudaStream_t>(stream)) != cudaSuccess)
    (void)cudaGetLastError();
}

void to_host(int index, void* dst, const void* src, std::size_t bytes, void* stream) {
  set_device(index);
  const auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (device to host)");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void to_device(int index, void* dst, const void* src, std::size_t bytes, void* stream) {
  set_device(index);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync (host to device)");
}

const KernelTable& kernels() {
  static const KernelTable table{
      .name = "cuda",
      .fake_quant = fake_quant,
      .fake_quant_backward = fake_quant_backward,
      .quantize = quantize,
      .tile_quant = tile_quant,
      .dynamic_quant = dynamic_quant,
      .acts_ulq = acts_ulq,
      .acts_ulq_backward = acts_ulq_backward,
      .anti_quant = anti_quant,
      .quant_matmul = quant_matmul,
      .weight_quant_matmul = weight_quant_matmul,
  };
  return table;
}

}  // namespace xquant::detail::cuda
