// The cpu backend's kernel table.
#include "cpu/cpu.hpp"

#include <string>

#include "hwy/targets.h"

#include "xquant/runtime.hpp"

namespace xquant::detail {

const KernelTable& cpu_kernels() {
  static const KernelTable table{
      "cpu",
      cpu_fake_quant,
      cpu_fake_quant_backward,
      cpu_quantize,
      cpu_tile_quant,
      cpu_dynamic_quant,
      cpu_acts_ulq,
      cpu_acts_ulq_backward,
      cpu_anti_quant,
      cpu_quant_matmul,
      cpu_weight_quant_matmul,
  };
  return table;
}

}  // namespace xquant::detail

namespace xquant {

// Public (xquant/runtime.hpp), answered by the cpu backend.
std::string simd_target() {
  // The best target that is both supported by this CPU and compiled in: what HWY_DYNAMIC_DISPATCH picks.
  const auto targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

}  // namespace xquant
