// ActsULQ (SPEC 5): LEVELS, the per-(clamp_min, clamp_max) parameters and the per-element math, shared
// by every backend.
#pragma once
#include <cstdint>

#include "core/hd.hpp"

namespace xquant::detail {

inline constexpr float kActsUlqEps = 1.192092896e-7f;  // SPEC: EPS = 1.192092896e-7

struct ActsUlqParams {
  float s;        // (ori_max - ori_min) / LEVELS
  float clip_lo;  // s * off
  float clip_hi;  // s * (off + LEVELS)
  float loss_m;   // (rint(ori_min / s) - ori_min / s) / LEVELS
};

// LEVELS = 2^num_bits - 1 (exact in float32 for num_bits <= 16).
XQ_HD inline float acts_ulq_levels(int num_bits) noexcept {
  return static_cast<float>((std::int64_t{1} << num_bits) - 1);
}
// LEVELS * EPS: one float32 multiply (the floor of ori_max, and the clamp_max gradient's threshold).
XQ_HD inline float acts_ulq_floor_max(float levels) noexcept { return levels * kActsUlqEps; }

XQ_HD inline ActsUlqParams init_acts_ulq_params(float clamp_min, float clamp_max, bool fixed_min,
                                                float levels) noexcept {
  // ori_min = fixed_min ? 0 : min(clamp_min, 0);   ori_max = max(clamp_max, LEVELS * EPS)
  const float ori_min = fixed_min ? 0.0f : hd_nan_min(clamp_min, 0.0f);
  const float ori_max = hd_nan_max(clamp_max, acts_ulq_floor_max(levels));
  ActsUlqParams p{};
  // s = (ori_max - ori_min) / LEVELS;   off = rint(ori_min / s)
  p.s = (ori_max - ori_min) / levels;
  const float off = hd_rint(ori_min / p.s);
  // clip_lo = s * off;   clip_hi = s * (off + LEVELS)
  p.clip_lo = p.s * off;
  p.clip_hi = p.s * (off + levels);
  // loss_m = (rint(ori_min / s) - ori_min / s) / LEVELS
  const float raw_m = ori_min / p.s;
  p.loss_m = (hd_rint(raw_m) - raw_m) / levels;
  return p;
}

struct ActsUlqElement {
  float y;
  float clamp_min_mask;
  float clamp_max_mask;
  float x_clamped_loss;
};

// One output element, SPEC 5 line by line.
XQ_HD inline ActsUlqElement acts_ulq_element(float x, const ActsUlqParams& p, float levels) noexcept {
  // xc = min(max(x, clip_lo), clip_hi)   (NaN x stays NaN)
  const float xc = hd_nan_min(hd_nan_max(x, p.clip_lo), p.clip_hi);
  // min_mask = x >= clip_lo;   max_mask = x <= clip_hi   (comparisons with NaN are false: mask 0)
  const bool min_mask = x >= p.clip_lo;
  const bool max_mask = x <= p.clip_hi;
  // raw = xc / s;   rx = rint(raw);   loss = (rx - raw) / LEVELS
  const float raw = xc / p.s;
  const float rx = hd_rint(raw);
  const float loss = (rx - raw) / levels;
  ActsUlqElement e{};
  e.y = rx * p.s;  // y = rx * s
  e.clamp_min_mask = min_mask ? 1.0f : 0.0f;
  e.clamp_max_mask = max_mask ? 1.0f : 0.0f;
  e.x_clamped_loss = (min_mask && max_mask) ? loss : p.loss_m;  // x_clamped_loss
  return e;
}

}  // namespace xquant::detail
