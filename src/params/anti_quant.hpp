// npu_anti_quant (SPEC 7): the per-channel parameters and the per-element math, shared by every backend.
#pragma once
#include "core/hd.hpp"

namespace xquant::detail {

struct AntiQuantParams {
  float scale;
  float offset;  // 0 when absent
};

// Parameters of one channel (or of the whole tensor) from its scale and offset, widened to float32.
XQ_HD inline AntiQuantParams init_anti_quant_params(float scale, float offset) noexcept {
  return AntiQuantParams{scale, offset};
}

// out = (float(q) + offset) * scale: a rounded float32 add, then a rounded float32 multiply (no FMA).
// q is an integer in [-128, 127], exact in float32. A NaN result is the canonical quiet NaN 0x7FC00000
// (which NaN operand a multiply propagates depends on the operand order the compiler picks).
XQ_HD inline float anti_quant_value(float q, const AntiQuantParams& p) noexcept {
  return hd_canonical_nan((q + p.offset) * p.scale);
}

}  // namespace xquant::detail
