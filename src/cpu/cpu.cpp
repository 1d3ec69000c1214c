// The cpu backend's answer to xquant::simd_target(). (Its kernel table is assembled by the backend
// registry, src/backends/registry.cpp.)
#include <cstdlib>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "hwy/targets.h"
#include "cpu/cpu.hpp"

#include "xquant/runtime.hpp"

namespace xquant {

// Public (xquant/runtime.hpp), answered by the cpu backend.
std::string simd_target() {
  // The best target that is both supported by this CPU and compiled in: what HWY_DYNAMIC_DISPATCH picks.
  const auto targets = hwy::SupportedAndGeneratedTargets();
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

}  // namespace xquant

namespace xquant::detail {
namespace {

bool detect_hw_bf16() {
  const char* e = std::getenv("XQUANT_HW_BF16");
  if (e != nullptr && e[0] == '0' && e[1] == '\0') return false;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;  // AVX512_BF16 (the AVX-512 kernels run only where AVX-512 itself is usable)
#else
  return false;
#endif
}

// Decided while the library loads (no lazy initialization for a fork() to interrupt).
const bool g_hw_bf16 = detect_hw_bf16();

}  // namespace

bool hw_bf16_wanted() { return g_hw_bf16; }

}  // namespace xquant::detail
