// The public float16 / bfloat16 conversions: the host side of core/convert.hpp (one algorithm, on the bit
// patterns, shared with the CUDA kernels).
#include "xquant/half.hpp"

#include "core/convert.hpp"

namespace xquant {

float half_to_float(std::uint16_t h) noexcept { return detail::hd_half_to_float(h); }
std::uint16_t float_to_half(float f) noexcept { return detail::hd_float_to_half(f); }
float bfloat16_to_float(std::uint16_t b) noexcept { return detail::hd_bfloat16_to_float(b); }
std::uint16_t float_to_bfloat16(float f) noexcept { return detail::hd_float_to_bfloat16(f); }

}  // namespace xquant
