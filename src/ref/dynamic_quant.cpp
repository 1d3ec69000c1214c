// Reference kernel of npu_dynamic_quant_asymmetric (SPEC section 4), scalar float32, one formula per line.
//
//   x'     = smooth ? x * smooth[e][j] : x                  (a rounded float32 multiply after widening both)
//   rowMax = max(x'),  rowMin = min(x')                     (a NaN anywhere makes both NaN; empty: both 0)
//   scale  = (rowMax - rowMin) / (DST_MAX - DST_MIN)
//   scale  = isnan(scale) ? NaN : max(scale, 1e-12)         (the Ascend A2 kernel's constant-row guard)
//   offset = DST_MAX - rowMax / scale
//   y      = sat(rint(x' / scale + offset))                 (a rounded division, then a rounded addition)
//
// DST = int8 [-128, 127] (qint8) or int4 [-8, 7] (quint4x2, eight per int32 word: element 8k + j of the
// flat output sits in bits [4j, 4j + 3] of word k; cols % 8 == 0, so a word never straddles two rows).
// Pertoken: one (scale, offset) per row, each row reduced and then quantized while it is still in cache
// (the single-pass shape the fast kernels use). Pertensor: one reduction over every element first.
// Row r uses expert e = the first e with group_ends[e] > r (no group_ends: expert 0 of a [cols] smooth).
//
// npu_dynamic_quant (SPEC 6, symmetric), the same rows:
//   rowAbsMax = max(|x'|)                                   (NaN anywhere: NaN; empty: 0)
//   scale     = rowAbsMax / DST_MAX                         (zero row: 0)
//   y         = sat(rint(x' / scale))                       (0 / 0 = NaN -> 0)
//
// float8 outputs (DST = +-448 for e4m3fn, +-57344 for e5m2): y = float8(v) for the same v, the one
// rounding of the float32 -> float8 conversion (core/float8.hpp; no rint, no saturation).
// Perchannel: x = [B][S][H]; per batch b and column h the reduction runs down the S rows (x'[b][s][h] =
// x * smooth[s]) and scale / offset are [B][H]; computed column by column here.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

namespace {

// Expert of row r: the first e with group_ends[e] > r. The operator guarantees group_ends is
// non-decreasing with last value == rows, so e < num_groups for every r < rows.
std::int64_t expert_of_row(const DynamicQuantArgs& a, std::int64_t r) noexcept {
  if (a.group_ends == nullptr) return 0;
  return std::upper_bound(a.group_ends, a.group_ends + a.num_groups, r) - a.group_ends;
}

// x'[r][j] = smooth ? x[r][j] * smooth[e][j] : x[r][j]
float smoothed(const DynamicQuantArgs& a, std::int64_t r, std::int64_t e, std::int64_t j) noexcept {
  const float x = load_float(a.dt, a.x, r * a.cols + j);
  if (a.smooth == nullptr) return x;
  return x * load_float(a.smooth_dt, a.smooth, e * a.cols + j);
}

// rowMax / rowMin with NaN propagation; an empty reduction gives 0 for both.
struct MinMax {
  bool empty = true;
  float max = 0.0f;
  float min = 0.0f;
  float absmax = 0.0f;  // max(|x'|): starts at 0, the value of an empty row
  void add(float v) noexcept {
    if (empty) {
      max = v;
      min = v;
      empty = false;
    } else {
      max = nan_max(max, v);
      min = nan_min(min, v);
    }
    absmax = nan_max(absmax, std::fabs(v));
  }
};

void reduce_row(const DynamicQuantArgs& a, std::int64_t r, std::int64_t e, MinMax& mm) noexcept {
  for (std::int64_t j = 0; j < a.cols; ++j) mm.add(smoothed(a, r, e, j));
}

using Params = DynamicQuantRowParams;

// y[r][:] = sat(rint(x'[r][:] / scale + offset)), or sat(rint(x'[r][:] / scale)) when symmetric
void quantize_row(const DynamicQuantArgs& a, std::int64_t r, std::int64_t e, Params p) noexcept {
  auto value = [&](std::int64_t j) {
    const float xs = smoothed(a, r, e, j);
    return a.symmetric ? dynamic_quant_symmetric_value(xs, p.scale) : dynamic_quant_value(xs, p);
  };
  if (dynamic_quant_is_float8(a.dst)) {
    auto* y = static_cast<std::uint8_t*>(a.y);
    for (std::int64_t j = 0; j < a.cols; ++j) y[r * a.cols + j] = dynamic_quant_float8(value(j), a.dst);
  } else if (a.dst == QuantDType::quint4x2) {
    auto* y = static_cast<std::int32_t*>(a.y);
    for (std::int64_t j = 0; j < a.cols; ++j) {
      const std::int64_t i = r * a.cols + j;  // flat element index
      const float v = value(j);
      // Nibble 0 of each word comes first: clear the word then; the other seven nibbles fill it, so the
      // caller's old contents are never read into the result.
      if ((i & 7) == 0) y[i >> 3] = 0;
      store_int4(y, i, saturate_rounded_range(round_half_even(v), -8, 7));
    }
  } else {
    auto* y = static_cast<std::int8_t*>(a.y);
    for (std::int64_t j = 0; j < a.cols; ++j) {
      const float v = value(j);
      y[r * a.cols + j] = saturate_rounded<std::int8_t>(round_half_even(v));
    }
  }
}

Params params_of(const DynamicQuantArgs& a, const MinMax& mm) noexcept {
  return a.symmetric ? init_dynamic_quant_symmetric_params(mm.absmax, a.dst)
                     : init_dynamic_quant_params(mm.max, mm.min, a.dst);
}

// Perchannel: column h of batch b, x'[b][s][h] = x[b][s][h] * smooth[s] (s < S = channel_rows).
void per_channel(const DynamicQuantArgs& a) {
  const std::int64_t S = a.channel_rows, H = a.cols;
  const std::int64_t batches = a.channel_batches;
  auto xs = [&](std::int64_t b, std::int64_t s, std::int64_t h) {
    const float x = load_float(a.dt, a.x, (b * S + s) * H + h);
    return a.smooth == nullptr ? x : x * load_float(a.smooth_dt, a.smooth, s);
  };
  for (std::int64_t b = 0; b < batches; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      MinMax mm;
      for (std::int64_t s = 0; s < S; ++s) mm.add(xs(b, s, h));
      const Params p = params_of(a, mm);
      a.scale[b * H + h] = p.scale;
      if (!a.symmetric) a.offset[b * H + h] = p.offset;
      for (std::int64_t s = 0; s < S; ++s) {
        const float v =
            a.symmetric ? dynamic_quant_symmetric_value(xs(b, s, h), p.scale) : dynamic_quant_value(xs(b, s, h), p);
        const std::int64_t i = (b * S + s) * H + h;
        if (dynamic_quant_is_float8(a.dst))
          static_cast<std::uint8_t*>(a.y)[i] = dynamic_quant_float8(v, a.dst);
        else
          static_cast<std::int8_t*>(a.y)[i] = saturate_rounded<std::int8_t>(round_half_even(v));
      }
    }
  }
}

}  // namespace

void dynamic_quant(const DynamicQuantArgs& a) {
  if (a.per_channel) return per_channel(a);
  if (a.per_tensor) {
    // rowMax / rowMin of the whole tensor (no smooth_scales in this mode), then every row with them.
    MinMax mm;
    for (std::int64_t r = 0; r < a.rows; ++r) reduce_row(a, r, 0, mm);
    const Params p = params_of(a, mm);
    a.scale[0] = p.scale;
    if (!a.symmetric) a.offset[0] = p.offset;
    for (std::int64_t r = 0; r < a.rows; ++r) quantize_row(a, r, 0, p);
    return;
  }
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const std::int64_t e = expert_of_row(a, r);
    MinMax mm;
    reduce_row(a, r, e, mm);
    const Params p = params_of(a, mm);
    a.scale[r] = p.scale;
    if (!a.symmetric) a.offset[r] = p.offset;
    quantize_row(a, r, e, p);
  }
}

}  // namespace xquant::detail::ref
