// The backend registry: which kernel backends are built in, and the kernel table of each. The cpu table
// is assembled here from the SIMD entry points of src/cpu/ and, where those decline a problem (ActsULQ
// layouts without a SIMD walk), the reference kernels of src/ref/: src/cpu/ itself never calls src/ref/.
// CUDA is not in kBackends: operators reach it by the tensors' device (core/device_ops.hpp).
#include "backends/registry.hpp"

#if defined(XQUANT_HAVE_CPU_SIMD)
#include "cpu/cpu.hpp"
#endif
#include "ref/ref.hpp"

namespace xquant::detail {

namespace {

#if defined(XQUANT_HAVE_CPU_SIMD)
void cpu_or_ref_acts_ulq(const ActsUlqArgs& a) {
  if (!cpu_acts_ulq(a)) ref::acts_ulq(a);
}
void cpu_or_ref_acts_ulq_backward(const ActsUlqBackwardArgs& a) {
  if (!cpu_acts_ulq_backward(a)) ref::acts_ulq_backward(a);
}

const KernelTable& cpu_table() {
  static const KernelTable table{
      .name = "cpu",
      .fake_quant = cpu_fake_quant,
      .fake_quant_backward = cpu_fake_quant_backward,
      .quantize = cpu_quantize,
      .tile_quant = cpu_tile_quant,
      .dynamic_quant = cpu_dynamic_quant,
      .acts_ulq = cpu_or_ref_acts_ulq,
      .acts_ulq_backward = cpu_or_ref_acts_ulq_backward,
      .anti_quant = cpu_anti_quant,
      .quant_matmul = cpu_quant_matmul,
      .weight_quant_matmul = cpu_weight_quant_matmul,
  };
  return table;
}
#endif

struct BackendEntry {
  Backend id;
  const KernelTable& (*table)();
};

constexpr BackendEntry kBackends[] = {
#if defined(XQUANT_HAVE_CPU_SIMD)
    {Backend::cpu, cpu_table},
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
