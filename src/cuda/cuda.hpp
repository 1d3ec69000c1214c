// The CUDA backend (built with XQUANT_CUDA): runtime glue (availability, memory, copies), the kernel table
// and the per-family kernels. Host-only declarations, so that host C++ translation units (the registry's
// src/backends/device.cpp) can include it.
#pragma once
#include <cstddef>
#include <string>

#include "core/kernels.hpp"

namespace xquant::detail::cuda {

// "" when a CUDA device is usable, else the reason. Probed once, lazily (cudaGetDeviceCount).
const std::string& unavailable_reason();

// Memory and copies on device `index` (errors throw xquant::Error naming `what`).
void* alloc(int index, std::size_t bytes, void* stream, const std::string& what);
void free(int index, void* p, void* stream) noexcept;
void to_host(int index, void* dst, const void* src, std::size_t bytes, void* stream);
void to_device(int index, void* dst, const void* src, std::size_t bytes, void* stream);
// Makes `index` the current device of the calling thread (before a kernel table call).
void set_device(int index);

// The CUDA backend's kernel table (runtime.cu): every family has a kernel.
const KernelTable& kernels();

// The kernels, one translation unit per operator family (fake_quant.cu, quantize.cu, ...). Asynchronous on
// the current stream (xquant::CudaStreamGuard); errors throw xquant::Error (cuda/common.cuh check).
void fake_quant(const FakeQuantArgs& args);
void fake_quant_backward(const FakeQuantBackwardArgs& args);
void quantize(const QuantizeArgs& args);
void tile_quant(const TileQuantArgs& args);
void dynamic_quant(const DynamicQuantArgs& args);
void acts_ulq(const ActsUlqArgs& args);
void acts_ulq_backward(const ActsUlqBackwardArgs& args);
void anti_quant(const AntiQuantArgs& args);

}  // namespace xquant::detail::cuda
