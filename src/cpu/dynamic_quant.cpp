// cpu backend: npu_dynamic_quant_asymmetric (SPEC section 4) and npu_dynamic_quant (SPEC section 6,
// symmetric), bit-identical to src/ref/dynamic_quant.cpp. The symmetric operator runs the same row code:
// rowMax(|x'|) = max(0, -rowMin, rowMax) from the same reduction, and its rows are quantized with offset 0
// (x' / scale + 0 gives the same integer as x' / scale).
//
// Pertoken is single-pass over DRAM: each row is read once, widened (and multiplied by its smooth
// scales) into a per-thread float32 row buffer while min / max are tracked, then quantized from that
// buffer while it is in cache. Rows are independent, so any thread partition gives the same bits.
// Pertensor needs the global min / max first: a parallel reduction (exact, order-free), then an
// elementwise pass.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/dynamic_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/fastdiv-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

namespace xquant::detail {
#ifndef XQUANT_CPU_DYNAMIC_QUANT_ONCE
#define XQUANT_CPU_DYNAMIC_QUANT_ONCE
struct RowMinMax {
  float max, min;
  bool nan, empty;
};
// Pertensor quantization parameters with the min / max they came from.
struct RangeParams {
  float min, max, scale, offset;
};
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// x' = x (* smooth) for n elements into buf (padded to whole vectors), with min / max / NaN tracking.
template <DType DT>
RowMinMax SmoothAndReduce(const void* x, std::int64_t pos, std::int64_t n, const float* smooth, float* buf) {
  // buf == nullptr: only reduce (float32 input without smooth scales is quantized straight from x).
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  if (n == 0) return {0.f, 0.f, false, true};
  VF vmin = hn::Set(df, std::numeric_limits<float>::infinity());
  VF vmax = hn::Neg(vmin);
  auto nan = hn::Lt(vmin, vmin);  // all false
  auto step = [&](VF v) {
    nan = hn::Or(nan, hn::IsNaN(v));
    vmin = hn::Min(vmin, v);  // NaN lanes may be dropped or kept here: `nan` decides
    vmax = hn::Max(vmax, v);
  };
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    VF v = LoadF<DT>(x, pos + i);
    if (smooth) v = hn::Mul(v, hn::LoadU(df, smooth + i));
    if (buf) hn::StoreU(v, df, buf + i);
    step(v);
  }
  if (i < n) {
    // Stage the tail; pad lanes repeat a valid element so min / max are unchanged.
    const std::size_t es = dtype_size(DT);
    alignas(64) unsigned char sx[kMaxLanes * 4];
    HWY_ALIGN float ss[kMaxLanes];
    const std::int64_t rem = n - i;
    std::memcpy(sx, static_cast<const unsigned char*>(x) + (pos + i) * static_cast<std::int64_t>(es),
                static_cast<std::size_t>(rem) * es);
    for (std::int64_t k = rem; k < N; ++k)
      std::memcpy(sx + k * static_cast<std::int64_t>(es), sx, es);
    for (std::int64_t k = 0; k < N; ++k) ss[k] = smooth ? smooth[i + (k < rem ? k : 0)] : 1.0f;
    VF v = LoadF<DT>(sx, 0);
    if (smooth) v = hn::Mul(v, hn::Load(df, ss));
    if (buf) hn::StoreU(v, df, buf + i);
    step(v);
  }
  RowMinMax r{};
  r.nan = !hn::AllFalse(df, nan);
  r.empty = false;
  r.min = hn::GetLane(hn::MinOfLanes(df, vmin));
  r.max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  return r;
}

// y = sat(rint(src / scale + offset)) for n float32 values of src. int8 output may be streamed
// (non-temporal); int4 is packed. kFinite: the caller proved every src / scale + offset finite or +-Inf
// (finite row min / max, scale, offset, rowMin / scale and rowMax / scale), so the NaN -> 0 step is
// skipped: x / s is monotonic in x, and finite + finite cannot be NaN.
// kFast: x' / scale by the FMA sequence (fast_div_int for this row's scale and offset, every |x'| <=
// x_max: no clamp needed).
template <bool kFinite, bool kFast>
HWY_INLINE void QuantizeRow(const float* src, std::int64_t n, float scale, float offset, bool int4, bool stream,
                            std::int8_t* y8, std::int32_t* y4, std::int8_t* qtmp) {
  const DF df;
  const VF s = hn::Set(df, scale), o = hn::Set(df, offset), rs = hn::Set(df, 1.0f / scale);
  const VF lo = hn::Set(df, int4 ? -8.0f : -128.0f), hi = hn::Set(df, int4 ? 7.0f : 127.0f);
  auto value = [&](const float* p) XQUANT_LAMBDA_INLINE {
    const VF x = hn::LoadU(df, p);
    const VF q = kFast ? DivForInteger<false>(x, s, rs, s) : hn::Div(x, s);
    return RoundSaturateToI32Range<kFinite>(hn::Add(q, o), lo, hi);  // sat(rint(x' / scale + offset))
  };
  // Fewer than a vector of values at i: staged through a padded copy (src need not be padded).
  auto staged = [&](std::int64_t i, std::int64_t count) {
    HWY_ALIGN float f[kMaxLanes] = {};
    std::memcpy(f, src + i, static_cast<std::size_t>(count) * sizeof(float));
    return value(f);
  };
#if XQUANT_HAVE_VECTOR_INT4
  if (int4) {  // n % 8 == 0: whole vectors pack in registers, a last part vector through qtmp
    const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
    std::int64_t i = 0;
    for (; i + N <= n; i += N) StoreInt4Words(value(src + i), y4 + i / 8);
    if (i < n) {
      StoreI8(staged(i, n - i), qtmp);
      pack_int4_bytes(qtmp, n - i, y4 + i / 8);
    }
    return;
  }
#endif
  std::int8_t* dst = int4 ? qtmp : y8;
  auto step = [&]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE { StoreI8<kStream>(value(src + i), dst + i); };
  auto stage = [&](std::int64_t i, std::int64_t count) {
    std::int8_t tmp[kMaxLanes] = {};
    StoreI8(staged(i, count), tmp);
    std::memcpy(dst + i, tmp, static_cast<std::size_t>(count));
  };
  DriveSpan(n, stream && !int4, dst, 0, 1, step, stage);
  if (int4) pack_int4_bytes(qtmp, n, y4);
}

// Whether every x' / scale + offset of a row with these min / max is finite or +-Inf (see QuantizeRow).
inline bool finite_row(float rmin, float rmax, float scale, float offset) {
  return std::isfinite(rmin) && std::isfinite(rmax) && std::isfinite(scale) && std::isfinite(offset) &&
         std::isfinite(rmin / scale) && std::isfinite(rmax / scale);
}

HWY_INLINE void QuantizeAny(const float* src, std::int64_t n, float rmin, float rmax, float scale, float offset,
                            bool int4, bool stream, std::int8_t* y8, std::int32_t* y4, std::int8_t* qtmp) {
  if (finite_row(rmin, rmax, scale, offset)) {
#if XQUANT_HAVE_FAST_DIV
    if (fast_div_wanted()) {
      const FastDivInt fd = fast_div_int(scale, scale, std::abs(offset));
      if (fd.ok && std::max(std::abs(rmin), std::abs(rmax)) <= fd.x_max)
        return QuantizeRow<true, true>(src, n, scale, offset, int4, stream, y8, y4, qtmp);
    }
#endif
    QuantizeRow<true, false>(src, n, scale, offset, int4, stream, y8, y4, qtmp);
  } else {
    QuantizeRow<false, false>(src, n, scale, offset, int4, stream, y8, y4, qtmp);
  }
}

template <DType DT>
void RowsT(const DynamicQuantArgs& a, const float* smooth_f32, std::int64_t r0, std::int64_t r1, bool stream) {
  const std::int64_t H = a.cols;
  const std::int64_t padded = H + static_cast<std::int64_t>(kMaxLanes);
  // Per-thread scratch kept across calls (no allocation or zero-fill on the per-call path) for rows up to
  // kKeepCols; longer rows use scratch that is freed when the call ends, so one huge row does not pin
  // memory in every worker thread for the life of the process.
  constexpr std::int64_t kKeepCols = std::int64_t{1} << 20;
  thread_local std::vector<float> kept_buf;
  thread_local std::vector<std::int8_t> kept_qtmp;
  std::vector<float> big_buf;
  std::vector<std::int8_t> big_qtmp;
  std::vector<float>& buf = padded <= kKeepCols ? kept_buf : big_buf;
  std::vector<std::int8_t>& qtmp = padded <= kKeepCols ? kept_qtmp : big_qtmp;
  if (buf.size() < static_cast<std::size_t>(padded)) buf.resize(static_cast<std::size_t>(padded));
  if (a.dst == QuantDType::quint4x2 && qtmp.size() < static_cast<std::size_t>(padded)) qtmp.resize(static_cast<std::size_t>(padded));
  const bool int4 = a.dst == QuantDType::quint4x2;
  std::int64_t e = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* smooth = nullptr;
    if (smooth_f32 != nullptr) {
      if (a.group_ends != nullptr)
        while (e < a.num_groups - 1 && a.group_ends[e] <= r) ++e;  // first e with group_ends[e] > r
      smooth = smooth_f32 + (a.group_ends ? e : 0) * H;
    }
    // float32 without smooth scales: x' is x itself, quantized straight from the row (in cache).
    const bool direct = DT == DType::float32 && smooth == nullptr;
    const RowMinMax mm = SmoothAndReduce<DT>(a.x, r * H, H, smooth, direct ? nullptr : buf.data());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float rmax = mm.empty ? 0.f : (mm.nan ? nan : mm.max);
    const float rmin = mm.empty ? 0.f : (mm.nan ? nan : mm.min);
    const auto p = a.symmetric ? init_dynamic_quant_symmetric_params(dynamic_quant_row_absmax(rmax, rmin), a.dst)
                               : init_dynamic_quant_params(rmax, rmin, a.dst);
    a.scale[r] = p.scale;
    if (!a.symmetric) a.offset[r] = p.offset;
    const float* src = direct ? static_cast<const float*>(a.x) + r * H : buf.data();
    QuantizeAny(src, H, rmin, rmax, p.scale, p.offset, int4, stream, static_cast<std::int8_t*>(a.y) + r * H,
                static_cast<std::int32_t*>(a.y) + r * (H / 8), qtmp.data());
  }
}

void Rows(const DynamicQuantArgs& a, const float* smooth_f32, std::int64_t r0, std::int64_t r1, bool stream) {
  switch (a.dt) {
    case DType::float16: RowsT<DType::float16>(a, smooth_f32, r0, r1, stream); break;
    case DType::bfloat16: RowsT<DType::bfloat16>(a, smooth_f32, r0, r1, stream); break;
    default: RowsT<DType::float32>(a, smooth_f32, r0, r1, stream); break;
  }
  if (stream) hwy::FlushStream();
}

// Pertensor: min / max / NaN over elements [b0, b1).
template <DType DT>
RowMinMax RangeMinMaxT(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1) {
  constexpr std::int64_t kPiece = 4096;
  RowMinMax acc{0.f, 0.f, false, true};
  for (std::int64_t p = b0; p < b1; p += kPiece) {
    const RowMinMax m = SmoothAndReduce<DT>(a.x, p, std::min(kPiece, b1 - p), nullptr, nullptr);
    if (m.empty) continue;
    if (acc.empty) {
      acc = m;
    } else {
      acc.nan = acc.nan || m.nan;
      acc.min = std::min(acc.min, m.min);
      acc.max = std::max(acc.max, m.max);
    }
  }
  return acc;
}

RowMinMax RangeMinMax(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1) {
  switch (a.dt) {
    case DType::float16: return RangeMinMaxT<DType::float16>(a, b0, b1);
    case DType::bfloat16: return RangeMinMaxT<DType::bfloat16>(a, b0, b1);
    default: return RangeMinMaxT<DType::float32>(a, b0, b1);
  }
}

// Pertensor: quantize elements [b0, b1) (b0, b1 multiples of 8 for int4).
template <DType DT>
void RangeQuantT(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1, const RangeParams& rp, bool stream) {
  constexpr std::int64_t kPiece = 4096;
  thread_local std::vector<float> buf(static_cast<std::size_t>(kPiece) + kMaxLanes);
  thread_local std::vector<std::int8_t> qtmp(static_cast<std::size_t>(kPiece) + kMaxLanes);
  const bool int4 = a.dst == QuantDType::quint4x2;
  for (std::int64_t p = b0; p < b1; p += kPiece) {
    const std::int64_t n = std::min(kPiece, b1 - p);
    const float* src = static_cast<const float*>(a.x) + p;
    if constexpr (DT != DType::float32) {
      SmoothAndReduce<DT>(a.x, p, n, nullptr, buf.data());  // widen into buf (min / max unused)
      src = buf.data();
    }
    QuantizeAny(src, n, rp.min, rp.max, rp.scale, rp.offset, int4, stream, static_cast<std::int8_t*>(a.y) + p,
                static_cast<std::int32_t*>(a.y) + p / 8, qtmp.data());
  }
}

void RangeQuant(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1, const RangeParams& rp, bool stream) {
  switch (a.dt) {
    case DType::float16: RangeQuantT<DType::float16>(a, b0, b1, rp, stream); break;
    case DType::bfloat16: RangeQuantT<DType::bfloat16>(a, b0, b1, rp, stream); break;
    default: RangeQuantT<DType::float32>(a, b0, b1, rp, stream); break;
  }
  if (stream) hwy::FlushStream();
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(Rows);
HWY_EXPORT(RangeMinMax);
HWY_EXPORT(RangeQuant);

void cpu_dynamic_quant(const DynamicQuantArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(a.dt) + 1);
  const bool stream = use_stream(n);  // int8 output bytes (int4 output is never streamed)
  if (a.per_tensor) {
    constexpr std::int64_t kGrain = std::int64_t{1} << 16;  // multiple of 8: int4 words never straddle
    const std::int64_t pieces = (n + kGrain - 1) / kGrain;
    std::vector<RowMinMax> part(static_cast<std::size_t>(std::max<std::int64_t>(pieces, 1)), RowMinMax{0.f, 0.f, false, true});
    parallel_ranges(n, kGrain, bytes, [&](std::int64_t b0, std::int64_t b1) {
      part[static_cast<std::size_t>(b0 / kGrain)] = HWY_DYNAMIC_DISPATCH(RangeMinMax)(a, b0, b1);
    });
    // min / max are exact and order-free; NaN anywhere makes both NaN; no elements: both 0.
    RowMinMax all{0.f, 0.f, false, true};
    for (const RowMinMax& m : part) {
      if (m.empty) continue;
      if (all.empty) all = m;
      all.nan = all.nan || m.nan;
      all.min = std::min(all.min, m.min);
      all.max = std::max(all.max, m.max);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float rmax = all.empty ? 0.f : (all.nan ? nan : all.max), rmin = all.empty ? 0.f : (all.nan ? nan : all.min);
    const auto p = init_dynamic_quant_params(rmax, rmin, a.dst);
    a.scale[0] = p.scale;
    a.offset[0] = p.offset;
    const RangeParams rp{rmin, rmax, p.scale, p.offset};
    parallel_ranges(n, kGrain, bytes, [&](std::int64_t b0, std::int64_t b1) {
      HWY_DYNAMIC_DISPATCH(RangeQuant)(a, b0, b1, rp, stream);
    });
    return;
  }
  // Smooth scales widened to float32 once per call ([E][H] or [H]).
  std::vector<float> smooth;
  if (a.smooth != nullptr) {
    const std::int64_t count = (a.group_ends ? a.num_groups : 1) * a.cols;
    smooth.resize(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) smooth[static_cast<std::size_t>(i)] = load_float(a.smooth_dt, a.smooth, i);
  }
  const float* sm = a.smooth ? smooth.data() : nullptr;
  const std::int64_t grain_rows = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(a.cols, 1));
  parallel_ranges(a.rows, grain_rows, bytes, [&](std::int64_t r0, std::int64_t r1) {
    HWY_DYNAMIC_DISPATCH(Rows)(a, sm, r0, r1, stream);
  });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
