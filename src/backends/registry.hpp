// The backend registry: the one place that knows which kernel backends are built in. It sits above
// src/ref, src/cpu and src/cuda; src/core and src/ops never include a backend header, they ask for
// kernels_for() (core/device_ops.hpp, implemented in device.cpp: the CUDA table for CUDA tensors) and
// active_kernels() (core/kernels.hpp, implemented in registry.cpp: the selected host backend).
#pragma once
#include "core/kernels.hpp"
#include "xquant/runtime.hpp"

namespace xquant::detail {

// The kernel table of backend `b`, or nullptr when that backend is not built into this library.
const KernelTable* find_kernels(Backend b) noexcept;

}  // namespace xquant::detail
