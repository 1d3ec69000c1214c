// The cpu backend's answer to xquant::simd_target(). (Its kernel table is assembled by the backend
// registry, src/backends/registry.cpp.)
#include <string>

#include "hwy/targets.h"

#include "xquant/runtime.hpp"

namespace xquant {

// Public (xquant/runtime.hpp), answered by the cpu backend.
std::string simd_target() {
  // The best target that is both supported by this CPU and compiled in: what HWY_DYNAMIC_DISPATCH picks.
  const auto targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

}  // namespace xquant
