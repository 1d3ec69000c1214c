// npu_dynamic_quant_asymmetric (SPEC 4): the per-row (or per-tensor) parameters from rowMax / rowMin
// and the per-element math, shared by every backend.
#pragma once
#include "core/hd.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail {

inline constexpr float kDynamicQuantScaleFloor = 1e-12f;  // the Ascend A2 kernel's constant-row guard

struct DynamicQuantDstRange {
  float max;  // DST_MAX
  float min;  // DST_MIN
};
XQ_HD inline DynamicQuantDstRange dynamic_quant_dst_range(QuantDType q) noexcept {
  if (q == QuantDType::quint4x2) return {7.0f, -8.0f};
  return {127.0f, -128.0f};
}

struct DynamicQuantRowParams {
  float scale;
  float offset;
};

// scale  = (rowMax - rowMin) / (DST_MAX - DST_MIN)
// scale  = isnan(scale) ? NaN : max(scale, 1e-12)
// offset = DST_MAX - rowMax / scale
// A NaN scale or offset is the canonical quiet NaN 0x7FC00000, whatever NaN the row held (docs/semantics.md).
XQ_HD inline DynamicQuantRowParams init_dynamic_quant_params(float row_max, float row_min, QuantDType dst) noexcept {
  const DynamicQuantDstRange d = dynamic_quant_dst_range(dst);
  float scale = (row_max - row_min) / (d.max - d.min);
  scale = hd_nan_max(scale, kDynamicQuantScaleFloor);  // NaN stays NaN (canonical), else max(scale, 1e-12)
  const float offset = d.max - row_max / scale;
  return {scale, hd_canonical_nan(offset)};
}

// v = x' / scale + offset (a rounded division, then a rounded addition); the result is y = sat(rint(v)).
XQ_HD inline float dynamic_quant_value(float xs, const DynamicQuantRowParams& p) noexcept {
  return xs / p.scale + p.offset;
}

}  // namespace xquant::detail
