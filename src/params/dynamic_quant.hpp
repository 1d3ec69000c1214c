// npu_dynamic_quant_asymmetric (SPEC 4): the per-row (or per-tensor) parameters from rowMax / rowMin
// and the per-element math, shared by every backend.
#pragma once
#include "core/float8.hpp"
#include "core/hd.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail {

inline constexpr float kDynamicQuantScaleFloor = 1e-12f;  // the Ascend A2 kernel's constant-row guard

struct DynamicQuantDstRange {
  float max;  // DST_MAX
  float min;  // DST_MIN
};
// float8 outputs: DST = [-max finite, max finite] (448 for e4m3fn, 57344 for e5m2), so that the asymmetric
// DST_MAX - DST_MIN is 896 / 114688 as in the Ascend kernels.
XQ_HD inline DynamicQuantDstRange dynamic_quant_dst_range(QuantDType q) noexcept {
  if (q == QuantDType::quint4x2) return {7.0f, -8.0f};
  if (q == QuantDType::float8_e4m3fn) return {448.0f, -448.0f};
  if (q == QuantDType::float8_e5m2) return {57344.0f, -57344.0f};
  return {127.0f, -128.0f};
}
XQ_HD inline bool dynamic_quant_is_float8(QuantDType q) noexcept {
  return q == QuantDType::float8_e4m3fn || q == QuantDType::float8_e5m2;
}
// A float8 output element: v (= x' / scale [+ offset]) converted once, round to nearest even, without
// saturation (torch's .to() and the Ascend golden's astype: e4m3fn out of range -> NaN, e5m2 -> +-Inf;
// NaN -> NaN). No rint: the conversion is the only rounding. A NaN v is always 0x7F (positive: which NaN
// an IEEE division returns differs between CPUs and GPUs, so its sign is not kept).
XQ_HD inline std::uint8_t dynamic_quant_float8(float v, QuantDType q) noexcept {
  if (hd_isnan(v)) return 0x7Fu;
  return hd_float_to_float8(v, q == QuantDType::float8_e5m2 ? DType::float8_e5m2 : DType::float8_e4m3fn, false);
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

// npu_dynamic_quant (SPEC 6, symmetric): scale = rowMax(|x'|) / DST_MAX (a float32 division), no offset
// (0 here, so that the asymmetric kernels can run it: x' / scale + 0 rounds and saturates to the same
// integer as x' / scale, -0 and NaN included). A NaN scale is the canonical quiet NaN.
XQ_HD inline DynamicQuantRowParams init_dynamic_quant_symmetric_params(float row_absmax, QuantDType dst) noexcept {
  return {hd_canonical_nan(row_absmax / dynamic_quant_dst_range(dst).max), 0.0f};
}
// rowMax(|x'|) = max(0, -rowMin, rowMax) from rowMax and rowMin (exact; NaN in either gives NaN; +0, not
// -0, for rows of zeros and for empty rows, whose rowMax / rowMin are 0).
XQ_HD inline float dynamic_quant_row_absmax(float row_max, float row_min) noexcept {
  return hd_nan_max(hd_nan_max(0.0f, -row_min), row_max);
}
// Symmetric: v = x' / scale; the result is y = sat(rint(v)).
XQ_HD inline float dynamic_quant_symmetric_value(float xs, float scale) noexcept { return xs / scale; }

// v = x' / scale + offset (a rounded division, then a rounded addition); the result is y = sat(rint(v)).
XQ_HD inline float dynamic_quant_value(float xs, const DynamicQuantRowParams& p) noexcept {
  return xs / p.scale + p.offset;
}

}  // namespace xquant::detail
