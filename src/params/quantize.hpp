// npu_quantize (SPEC 2): the per-channel parameters and the per-element math.
#pragma once
#include "core/hd.hpp"

namespace xquant::detail {

struct QuantizeParams {
  float scale;
  float zero_point;  // 0 when absent
};

// Parameters of one channel from its scale and (optional, else 0) zero point, both widened to float32.
XQ_HD inline QuantizeParams init_quantize_params(float scale, float zero_point) noexcept {
  return QuantizeParams{scale, zero_point};
}

// v = x / scale + zp  or  v = x * scale + zp, in float32, in exactly this order (no FMA: the build uses
// -ffp-contract=off). Division stays division: x / s and x * (1 / s) differ on ties. The result is
// then y = sat(rint(v)).
XQ_HD inline float quantize_value(float x, const QuantizeParams& p, bool div_mode) noexcept {
  const float scaled = div_mode ? x / p.scale : x * p.scale;
  return scaled + p.zero_point;
}

}  // namespace xquant::detail
