// cpu backend: pypto tile quant FP32 -> INT8 / UINT8 (SPEC section 3), bit-identical to
// src/ref/tile_quant.cpp. Row by row (each row has its own pitch and parameters):
//   SYM:  out = sat_int8(rint(src * scale))
//   ASYM: out = sat_uint8(rint(src * scale + offset))
// Rows are independent, so any thread partition gives the same bits. Outputs are never streamed: a tile
// is normally read again soon (and its rows are short).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tile_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// One row of cols elements: src (float32) -> out (int8 for SYM, uint8 for ASYM).
template <bool kAsym>
void TileRow(const float* src, std::int64_t cols, float scale, float offset, void* out) {
  const DF df;
  const VF s = hn::Set(df, scale), o = hn::Set(df, offset);
  // Captured by value: the byte stores may alias anything, so values behind references would be
  // reloaded for every vector.
  auto quantize = [XQUANT_BY_VALUE](const void* xb, void* yb, std::int64_t k) XQUANT_LAMBDA_INLINE {
    const VF v = hn::Mul(LoadF<DType::float32>(xb, k), s);
    if constexpr (kAsym) {
      StoreU8(RoundSaturateToI32Range(hn::Add(v, o), 0.0f, 255.0f), static_cast<std::uint8_t*>(yb) + k);
    } else {
      StoreI8(RoundSaturateToI32Range(v, -128.0f, 127.0f), static_cast<std::int8_t*>(yb) + k);
    }
  };
  auto step = [=]<bool kStream>(std::int64_t k) XQUANT_LAMBDA_INLINE { quantize(src, out, k); };
  auto stage = [&](std::int64_t k, std::int64_t count) {
    StagedTail(k, count, {{.base = src}}, {{.base = out, .es = 1}},
               [=](const void* const* in, void* const* outs, std::int64_t m)
                   XQUANT_LAMBDA_INLINE { quantize(in[0], outs[0], m); });
  };
  DriveSpan(cols, false, out, 0, 1, step, stage);
}

// Rows [r0, r1).
void TileRows(const TileQuantArgs& a, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t i = r0; i < r1; ++i) {
    const float* src = a.src + i * a.src_pitch;
    void* out = static_cast<std::uint8_t*>(a.out) + i * a.out_pitch;
    const float scale = a.scale[i * a.scale_pitch];
    if (a.mode == QuantMode::SYM)
      TileRow<false>(src, a.cols, scale, 0.0f, out);
    else
      TileRow<true>(src, a.cols, scale, a.offset[i * a.offset_pitch], out);
  }
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(TileRows);

void cpu_tile_quant(const TileQuantArgs& a) {
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(a.cols, 1));
  parallel_ranges(a.rows, grain, a.rows * a.cols * 5, [&](std::int64_t r0, std::int64_t r1) {
    HWY_DYNAMIC_DISPATCH(TileRows)(a, r0, r1);
  });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
