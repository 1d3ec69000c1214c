// The backend registry. Each backend exposes its KernelTable through one function; registering a new
// backend (e.g. CUDA) is one line in kBackends, under that backend's build option.
#include "backends/registry.hpp"

#include "cpu/cpu.hpp"
#include "ref/ref.hpp"

namespace xquant::detail {

namespace {

struct BackendEntry {
  Backend id;
  const KernelTable& (*table)();
};

constexpr BackendEntry kBackends[] = {
    {Backend::cpu, cpu_kernels},
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
  // Every Backend value is registered today; a backend left out of a build would run the reference.
  const KernelTable* t = find_kernels(get_backend());
  return t != nullptr ? *t : ref::kernels();
}

}  // namespace xquant::detail
