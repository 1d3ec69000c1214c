// The CUDA backend (built with XQUANT_CUDA): runtime glue (availability, memory, copies) and the kernel
// table. Host-only declarations, so that host C++ translation units (the registry) can include it.
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

// The CUDA backend's kernel table. Families without a CUDA kernel yet are nullptr.
const KernelTable& kernels();

}  // namespace xquant::detail::cuda
