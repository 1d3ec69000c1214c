// The backend registry. Each backend exposes its KernelTable through one function; registering a new
// backend (e.g. CUDA) is one line in kBackends, under that backend's build option.
#include "backends/registry.hpp"

#if defined(XQUANT_HAVE_CPU_SIMD)
#include "cpu/cpu.hpp"
#endif
#include "ref/ref.hpp"

namespace xquant::detail {

namespace {

struct BackendEntry {
  Backend id;
  const KernelTable& (*table)();
};

constexpr BackendEntry kBackends[] = {
#if defined(XQUANT_HAVE_CPU_SIMD)
    {Backend::cpu, cpu_kernels},
#endif
    {Backend::reference, ref::kernels},
};

}  // namespace

const KernelTable* find_kernels(Backend b) noexcept {
  for (const BackendEntry& e : kBackends)
    if (e.id == b) return &e.table();
  return nullptr;
}

const KernelTable& reference_kernels() { return ref::kernels(); }

const KernelTable& active_kernels() {
  // A backend left out of the build (cpu with XQUANT_CPU_SIMD=OFF) runs the reference kernels. CUDA
  // tensors do not come here: operators pick the CUDA table by device (core/device_ops.hpp).
  const KernelTable* t = find_kernels(get_backend());
  return t != nullptr ? *t : ref::kernels();
}

}  // namespace xquant::detail
