// Built instead of src/cpu/ when XQUANT_CPU_SIMD=OFF: the cpu backend is then the scalar reference
// (registry.cpp registers no cpu table), and there is no SIMD target to report.
#include <string>

#include "xquant/runtime.hpp"

namespace xquant {

std::string simd_target() { return "none (built with XQUANT_CPU_SIMD=OFF)"; }

}  // namespace xquant
