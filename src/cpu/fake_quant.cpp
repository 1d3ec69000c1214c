// cpu backend: fake tensor quantization forward and backward (SPEC section 1), bit-identical to
// src/ref/fake_quant.cpp.
//
// Layout [outer, C, inner] walked as runs (broadcast parameters) or periodic (parameter vectors, the
// last axis), see cpu/walk.hpp. min_bound / max_bound depend only on the options, so they are broadcast
// in both walks; only scale (and, if any channel is degenerate, its flag) varies per channel.
// Backward with grad_amax is fused: one pass writes grad_in and produces each channel's canonical chunk
// values (chunks of a channel's term sequence n = o * inner + i are independent, so they run in
// parallel); the last axis streams rows and keeps 16 double lanes per channel (row o feeds lane o % 16
// of every channel).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/fake_quant.cpp"
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
#include "cpu/walk.hpp"

namespace xquant::detail {
#ifndef XQUANT_CPU_FAKE_QUANT_ONCE
#define XQUANT_CPU_FAKE_QUANT_ONCE
struct FqJob {
  DType dt;
  const void* x;
  void* y;                     // forward output / backward grad_in
  const void* g;               // backward: grad_out
  float min_bound, max_bound;  // the same for every channel
  bool any_zero;               // some channel is degenerate (scale not finite or 0)
  bool stream;                 // non-temporal stores for y
  int div_steps;               // q / scale without the divider: fast_div_integral_steps (0: divide), kMulF16
  bool hw_bf16;                // bfloat16 forward outputs through AVX512_BF16 (hw_bf16_wanted())
  const ChannelWalk* walk;
  const FakeQuantParams* params;  // per channel (runs walk)
  // periodic walk: expanded per-phase arrays, null where the pass does not read them
  const float* scale;
  const float* zero;  // 1.0f for degenerate channels
  const float* glo;
  const float* ghi;
  const float* ratio;
  const float* rscale;  // 1 / scale, rounded (periodic walk, when div_steps != 0)
};
// The per-target kernels, instantiated for one dtype (picked by VisitFloatDType on the calling thread).
using RangeFn = void (*)(const FqJob& j, std::int64_t a, std::int64_t b, bool backward);
using ChunkFn = double (*)(const FqJob& j, std::int64_t c, std::int64_t n0, std::int64_t n1, float* t);
using LastAxisRowsFn = void (*)(const FqJob& j, std::int64_t o0, std::int64_t o1, double* lanes, float* t);
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// Parameters of one span: broadcast scalars, or arrays aligned with the span's elements.
struct SpanParams {
  float scale = 0, zero = 0, glo = 0, ghi = 0, ratio = 0, rscale = 0;
  const float* a_scale = nullptr;  // non-null: arrays
  const float* a_zero = nullptr;
  const float* a_glo = nullptr;
  const float* a_ghi = nullptr;
  const float* a_ratio = nullptr;
  const float* a_rscale = nullptr;
  HWY_INLINE VF get(const float* a, float s, std::int64_t i) const {
    return a ? hn::LoadU(DF(), a + i) : hn::Set(DF(), s);
  }
};

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// float16 forward with finite float16 bounds (num_bits <= 16, 15 if unsigned) and no degenerate channel,
// on AVX-512. The float16 conversions are the costly instructions on Zen 4 (about 1.5 cycles each per
// 512-bit vector, against 1 or less for a multiply, an add or a logic op), so t = f16(x * scale) is
// rounded without the round trip vcvtps2ph + vcvtph2ps:
//   c = clamp(x * scale, m, M)     (m, M are float16 integers: clamping commutes with both roundings)
//   C = 1.5 * 2^(13 + E)           (2^E = c's exponent bits: c & 0x7F800000 times 1.5 * 2^13)
//   f = (c + C) - C                (c + C lies in [2^(E+13), 2^(E+14)): its ulp is 2^(E-10), c's float16
//                                   ulp, so the add rounds c to float16 precision, ties to even; the
//                                   subtraction is exact)
// then q = rint(f), out = f16(q * (1 / scale)) (kMulF16). Infinite bounds would make C infinite: those
// calls keep FwdSpanT. Below float16's normal range (|c| < 2^-14) f is c rounded to 11 bits instead of
// float16's subnormal grid, but both round to a zero of c's sign; NaN passes (C is then Inf). The sum
// loses the sign of c = -0 (x = -0); every other output already has x's sign, so the float16 result
// takes x's sign bit (one logic op on the 16-bit vector). In cache on Zen 4, 11.3 -> 10.6 us for 65536
// elements (docs/performance.md, 2026-12-05 afternoon).
template <bool kArr>
HWY_NOINLINE void FwdSpanF16(const FqJob& j, std::int64_t pos, std::int64_t n, const SpanParams& sp) {
  const DF df;
  const DU16 d16;
  const VF lo = hn::Set(df, j.min_bound), hi = hn::Set(df, j.max_bound);
  const VF s_b = hn::Set(df, sp.scale), r_b = hn::Set(df, sp.rscale);
  const VF k = hn::Set(df, 12288.0f);  // 1.5 * 2^13
  const VU exp_mask = hn::Set(DU(), 0x7F800000u);
  const auto sign16 = hn::Set(d16, std::uint16_t{0x8000});
  const SpanParams spv = sp;
  const void* const x = j.x;
  void* const y = j.y;
  auto compute = [XQUANT_BY_VALUE](const void* xb, std::int64_t xi, const SpanParams& p, std::int64_t pi)
                     XQUANT_LAMBDA_INLINE {
                       const auto xr = hn::LoadU(d16, static_cast<const std::uint16_t*>(xb) + xi);
                       const VF v = hn::PromoteTo(df, hn::BitCast(DH(), xr));
                       const VF c = ClampKeepNaN(hn::Mul(v, kArr ? hn::LoadU(df, p.a_scale + pi) : s_b), lo, hi);
                       const VF big = hn::Mul(hn::BitCast(df, hn::And(hn::BitCast(DU(), c), exp_mask)), k);
                       const VF q = hn::Round(hn::Sub(hn::Add(c, big), big));
                       const VF r = hn::Mul(q, kArr ? hn::LoadU(df, p.a_rscale + pi) : r_b);
                       return hn::OrAnd(hn::BitCast(d16, hn::DemoteTo(DH(), r)), xr, sign16);
                     };
  const bool prefetch = j.stream && prefetch_ahead_wanted();
  auto step = [=]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
    if (prefetch) PrefetchAhead<DType::float16>(x, pos + i);
    const auto h = compute(x, pos + i, spv, i);
    std::uint16_t* out = static_cast<std::uint16_t*>(y) + pos + i;
    if constexpr (kStream)
      hn::Stream(h, d16, out);
    else
      hn::StoreU(h, d16, out);
  };
  auto stage = [&](std::int64_t i, std::int64_t count) {
    StagedTail(i, count,
               {{.base = x, .offset = pos, .es = 2},
                StageIn::Param(sp.a_scale, sp.scale),
                StageIn::Param(sp.a_rscale, sp.rscale)},
               {{.base = y, .offset = pos, .es = 2}},
               [=](const void* const* in, void* const* out, std::int64_t kk) XQUANT_LAMBDA_INLINE {
                 const SpanParams p{.a_scale = StagedF(in[1]), .a_rscale = StagedF(in[2])};
                 hn::StoreU(compute(in[0], kk, p, kk), d16, static_cast<std::uint16_t*>(out[0]) + kk);
               });
  };
  DriveSpan(n, j.stream, y, pos, 2, step, stage);
}
#endif

// Forward of n elements at pos. kSteps: q / scale by the divider (0), the FMA sequence (1, 2 steps), or
// for float16 inputs q * (1 / scale) (kMulF16, see fastdiv-inl.h);
// kAnyZero: some channel is degenerate; kArr: parameters are arrays; kHw: StoreF's kHwBf16.
template <DType DT, int kSteps, bool kAnyZero, bool kArr, bool kHw>
void FwdSpanT(const FqJob& j, std::int64_t pos, std::int64_t n, const SpanParams& sp) {
  const DF df;
  const VF lo = hn::Set(df, j.min_bound), hi = hn::Set(df, j.max_bound);
  // Scalar parameters broadcast once, and everything the hot loop reads captured by value: the output
  // stores may alias anything as far as the compiler knows, so values behind references (the job, the
  // span's parameters) would be reloaded for every vector.
  const VF s_b = hn::Set(df, sp.scale), r_b = hn::Set(df, sp.rscale), z_b = hn::Set(df, sp.zero);
  const SpanParams spv = sp;
  const void* const x = j.x;
  void* const y = j.y;
  // out = clamp(rint(x * scale), min_bound, max_bound) / scale; degenerate channels give 0 (NaN stays).
  auto compute = [XQUANT_BY_VALUE]<bool kA>(const void* xb, std::int64_t xi, const SpanParams& p, std::int64_t pi)
                     XQUANT_LAMBDA_INLINE {
                       // Every output is a float16 / bfloat16 store or arithmetic on v: NaNs leave quiet.
                       const VF v = LoadF<DT, true>(xb, xi);
                       const VF s = kA ? hn::LoadU(df, p.a_scale + pi) : s_b;
                       VF t = hn::Mul(v, s);
                       if constexpr (DT == DType::float16)
                         t = RoundToHalf(t);  // SPEC 1: float16 arithmetic, t = f16(x * scale)
                       const VF q = ClampKeepNaN(RoundEven(t), lo, hi);
                       VF r;
                       if constexpr (kSteps == 0)
                         r = hn::Div(q, s);
                       else if constexpr (kSteps == kMulF16)
                         r = hn::Mul(q, kA ? hn::LoadU(df, p.a_rscale + pi) : r_b);
                       else
                         r = DivIntegral<kSteps>(q, s, kA ? hn::LoadU(df, p.a_rscale + pi) : r_b);
                       if constexpr (kAnyZero) {
                         const auto z = hn::Gt(kA ? hn::LoadU(df, p.a_zero + pi) : z_b, hn::Zero(df));
                         r = hn::IfThenElse(z, hn::IfThenElse(hn::IsNaN(v), v, hn::Zero(df)), r);
                       }
                       return r;
                     };
  const bool prefetch = j.stream && prefetch_ahead_wanted();
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (DT == DType::float16 && kSteps == kMulF16 && !kAnyZero) {
    if (j.min_bound >= -65504.0f && j.max_bound <= 65504.0f) return FwdSpanF16<kArr>(j, pos, n, sp);
  }
#endif
  auto step = [=]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
    if (prefetch) PrefetchAhead<DT>(x, pos + i);
    StoreF<DT, kStream, kHw>(compute.template operator()<kArr>(x, pos + i, spv, i), y, pos + i);
  };
  auto stage = [&](std::int64_t i, std::int64_t count) {
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    StagedTail(i, count,
               {{.base = x, .offset = pos, .es = es},
                StageIn::Param(sp.a_scale, sp.scale),
                StageIn::Param(sp.a_zero, sp.zero),
                StageIn::Param(sp.a_rscale, sp.rscale)},
               {{.base = y, .offset = pos, .es = es}},
               [=](const void* const* in, void* const* out, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 const SpanParams p{.a_scale = StagedF(in[1]), .a_zero = StagedF(in[2]), .a_rscale = StagedF(in[3])};
                 StoreF<DT>(compute.template operator()<true>(in[0], k, p, k), out[0], k);
               });
  };
  DriveSpan(n, j.stream, y, pos, dtype_size(DT), step, stage);
}

template <DType DT, int kSteps, bool kHw>
HWY_INLINE void FwdSpanZ(const FqJob& j, std::int64_t pos, std::int64_t n, const SpanParams& sp) {
  const bool arr = sp.a_scale != nullptr;
  if (j.any_zero) {
    if (arr)
      FwdSpanT<DT, kSteps, true, true, kHw>(j, pos, n, sp);
    else
      FwdSpanT<DT, kSteps, true, false, kHw>(j, pos, n, sp);
  } else {
    if (arr)
      FwdSpanT<DT, kSteps, false, true, kHw>(j, pos, n, sp);
    else
      FwdSpanT<DT, kSteps, false, false, kHw>(j, pos, n, sp);
  }
}

template <DType DT, bool kHw>
HWY_INLINE void FwdSpanH(const FqJob& j, std::int64_t pos, std::int64_t n, const SpanParams& sp) {
  if constexpr (DT == DType::float16) {
    if (j.div_steps == kMulF16) return FwdSpanZ<DT, kMulF16, kHw>(j, pos, n, sp);
  }
#if XQUANT_HAVE_FAST_DIV
  if (j.div_steps == 1) return FwdSpanZ<DT, 1, kHw>(j, pos, n, sp);
  if (j.div_steps == 2) return FwdSpanZ<DT, 2, kHw>(j, pos, n, sp);
#endif
  FwdSpanZ<DT, 0, kHw>(j, pos, n, sp);
}

template <DType DT>
void FwdSpan(const FqJob& j, std::int64_t pos, std::int64_t n, const SpanParams& sp) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (DT == DType::bfloat16) {
    if (j.hw_bf16) return FwdSpanH<DT, true>(j, pos, n, sp);
  }
#endif
  FwdSpanH<DT, false>(j, pos, n, sp);
}

// Backward of n elements at pos: grad_in = grad_out inside [glo, ghi] else 0; with t != null also the
// grad_amax terms grad_out * (x > ghi ? 1 : x < glo ? ratio : 0) into t[0, n).
template <DType DT>
void BwdSpan(const FqJob& j, std::int64_t pos, std::int64_t n, const SpanParams& sp, float* t) {
  const DF df;
  const VF one = hn::Set(df, 1.0f);
  auto compute = [&](const void* gb, const void* xb, std::int64_t xi, void* yb, std::int64_t yi, const SpanParams& p,
                     std::int64_t pi, float* tp, auto stream_tag) {
    constexpr bool kStream = decltype(stream_tag)::value;
    const VF v = LoadF<DT>(xb, xi);
    const VF gv = LoadF<DT>(gb, xi);
    const VF glo = p.get(p.a_glo, p.glo, pi), ghi = p.get(p.a_ghi, p.ghi, pi);
    StoreF<DT, kStream>(hn::IfThenElseZero(hn::And(hn::Ge(v, glo), hn::Le(v, ghi)), gv), yb, yi);
    if (tp != nullptr) {
      const VF f =
          hn::IfThenElse(hn::Gt(v, ghi), one, hn::IfThenElseZero(hn::Lt(v, glo), p.get(p.a_ratio, p.ratio, pi)));
      hn::StoreU(hn::Mul(gv, f), df, tp);
    }
  };
  const bool prefetch = j.stream && prefetch_ahead_wanted();
  auto step = [&]<bool kStream>(std::int64_t i) {
    if (prefetch) {
      PrefetchAhead<DT>(j.g, pos + i);
      PrefetchAhead<DT>(j.x, pos + i);
    }
    compute(j.g, j.x, pos + i, j.y, pos + i, sp, i, t ? t + i : nullptr, std::bool_constant<kStream>());
  };
  auto stage = [&](std::int64_t i, std::int64_t count) {
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    StagedTail(i, count,
               {{.base = j.g, .offset = pos, .es = es},
                {.base = j.x, .offset = pos, .es = es},
                StageIn::Param(sp.a_glo, sp.glo),
                StageIn::Param(sp.a_ghi, sp.ghi),
                StageIn::Param(sp.a_ratio, sp.ratio)},
               {{.base = j.y, .offset = pos, .es = es}, {.base = t}},
               [=](const void* const* in, void* const* out, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 const SpanParams p{.a_glo = StagedF(in[2]), .a_ghi = StagedF(in[3]), .a_ratio = StagedF(in[4])};
                 compute(in[0], in[1], k, out[0], k, p, k, t ? static_cast<float*>(out[1]) + k : nullptr,
                         std::false_type());
               });
  };
  DriveSpan(n, j.stream, j.y, pos, dtype_size(DT), step, stage);
}

SpanParams RunParams(const FqJob& j, std::int64_t c) {
  const FakeQuantParams& p = j.params[c];
  return SpanParams{.scale = p.scale,
                    .zero = p.zero ? 1.0f : 0.0f,
                    .glo = p.grad_lo,
                    .ghi = p.grad_hi,
                    .ratio = p.ratio,
                    .rscale = 1.0f / p.scale};
}
// The periodic walk's arrays from phase ph on (arrays the pass does not read are null).
SpanParams PhaseParams(const FqJob& j, std::int64_t ph) {
  auto at = [ph](const float* a) { return a ? a + ph : nullptr; };
  return SpanParams{.a_scale = at(j.scale),
                    .a_zero = at(j.zero),
                    .a_glo = at(j.glo),
                    .a_ghi = at(j.ghi),
                    .a_ratio = at(j.ratio),
                    .a_rscale = at(j.rscale)};
}

template <DType DT>
void RangeT(const FqJob& j, std::int64_t a, std::int64_t b, bool backward) {
  j.walk->visit(
      a, b,
      [&](std::int64_t pos, std::int64_t n, std::int64_t c) {
        if (backward)
          BwdSpan<DT>(j, pos, n, RunParams(j, c), nullptr);
        else
          FwdSpan<DT>(j, pos, n, RunParams(j, c));
      },
      [&](std::int64_t pos, std::int64_t n, std::int64_t ph) {
        if (backward)
          BwdSpan<DT>(j, pos, n, PhaseParams(j, ph), nullptr);
        else
          FwdSpan<DT>(j, pos, n, PhaseParams(j, ph));
      });
  if (j.stream) hwy::FlushStream();
}

RangeFn SelectRange(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> RangeFn { return &RangeT<DT>; });
}

// Fused backward over one chunk of channel c's term sequence, terms [n0, n1) (n = o * inner + i):
// grad_in written for those elements, terms to t; returns the chunk value.
template <DType DT>
double ChunkT(const FqJob& j, std::int64_t c, std::int64_t n0, std::int64_t n1, float* t) {
  const std::int64_t inner = j.walk->inner, C = j.walk->C;
  const SpanParams sp = RunParams(j, c);
  std::int64_t n = n0, filled = 0;
  while (n < n1) {
    const std::int64_t o = n / inner, i = n % inner;
    const std::int64_t run = std::min(n1 - n, inner - i);
    BwdSpan<DT>(j, (o * C + c) * inner + i, run, sp, t + filled);
    filled += run;
    n += run;
  }
  if (j.stream) hwy::FlushStream();
  return cpu_chunk_value(t, filled);
}

ChunkFn SelectChunk(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> ChunkFn { return &ChunkT<DT>; });
}

// Last axis (inner == 1): rows [o0, o1) of one chunk (o1 - o0 <= 1024): grad_in for each row and its C
// terms added into lane o % 16 of every channel (lanes[m * C + c]).
template <DType DT>
void LastAxisRowsT(const FqJob& j, std::int64_t o0, std::int64_t o1, double* lanes, float* t) {
  const std::int64_t C = j.walk->C;
  const SpanParams sp = PhaseParams(j, 0);  // every row starts at a multiple of C: phase 0 of the arrays' period
  for (std::int64_t o = o0; o < o1; ++o) {
    BwdSpan<DT>(j, o * C, C, sp, t);
    double* lane = lanes + (o % kSumLanes) * C;
    for (std::int64_t c = 0; c < C; ++c) lane[c] += static_cast<double>(t[c]);
  }
  if (j.stream) hwy::FlushStream();
}

LastAxisRowsFn SelectLastAxisRows(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> LastAxisRowsFn { return &LastAxisRowsT<DT>; });
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(SelectRange);
HWY_EXPORT(SelectChunk);
HWY_EXPORT(SelectLastAxisRows);

namespace {

constexpr std::int64_t kGrain = std::int64_t{1} << 16;

// Per-call state: the job plus the expanded parameter arrays it points into. Only the arrays the pass
// reads are built: forward scale (zero when a channel is degenerate, 1 / scale for the FMA division),
// backward glo / ghi (ratio with grad_amax).
struct FqCall {
  ChannelWalk walk;
  ParamStore store;
  FqJob job{};

  FqCall(DType dt, const void* x, void* y, const void* g, const ChannelLayout& layout, const FakeQuantParams* params,
         bool backward, bool with_ratio)
      : walk(layout) {
    const std::int64_t channels = layout.channels;
    bool any_zero = false;
    for (std::int64_t c = 0; c < channels; ++c) any_zero |= params[c].zero;
    int div_steps = 0;                     // the backward pass divides nothing
    const float q_max = channels > 0 ? std::max(std::abs(params[0].qmin), std::abs(params[0].qmax)) : 0.0f;
    if (!backward && dt == DType::float16) {
      div_steps = kMulF16;  // q and scale are float16 values: the product is exact (fastdiv-inl.h)
    } else if (!backward && fast_div_wanted()) {  // the scan only where the FMA division may be used
      float s_min = std::numeric_limits<float>::infinity(), s_max = 0.0f;
      for (std::int64_t c = 0; c < channels; ++c) {
        if (!params[c].zero) {  // degenerate channels' quotients are replaced: their scales do not matter
          s_min = std::min(s_min, params[c].scale);
          s_max = std::max(s_max, params[c].scale);
        }
      }
      if (s_max > 0.0f) div_steps = fast_div_integral_steps(s_min, s_max, q_max);
    }
    const float *scale = nullptr, *zero = nullptr, *glo = nullptr, *ghi = nullptr, *ratio = nullptr, *rscale = nullptr;
    if (walk.period > 0) {
      const auto P = static_cast<std::size_t>(walk.period);
      const std::size_t count = backward ? 2 + (with_ratio ? 1 : 0) : 1 + (any_zero ? 1 : 0) + (div_steps != 0 ? 1 : 0);
      float* next = store.allocate(count * P);
      auto expand = [&](auto field) {
        float* dst = next;
        walk.expand_into(dst, [&](std::int64_t c) { return field(params[c]); });
        next += P;
        return dst;
      };
      if (!backward) {
        scale = expand([](const FakeQuantParams& p) { return p.scale; });
        if (any_zero) zero = expand([](const FakeQuantParams& p) { return p.zero ? 1.0f : 0.0f; });
        if (div_steps != 0) rscale = expand([](const FakeQuantParams& p) { return 1.0f / p.scale; });
      } else {
        glo = expand([](const FakeQuantParams& p) { return p.grad_lo; });
        ghi = expand([](const FakeQuantParams& p) { return p.grad_hi; });
        if (with_ratio) ratio = expand([](const FakeQuantParams& p) { return p.ratio; });
      }
    }
    const std::int64_t n = layout.numel();
    job = FqJob{.dt = dt,
                .x = x,
                .y = y,
                .g = g,
                .min_bound = channels > 0 ? params[0].qmin : 0.f,  // the forward clamp (float16: rounded bounds)
                .max_bound = channels > 0 ? params[0].qmax : 0.f,
                .any_zero = any_zero,
                .stream = use_stream(n * static_cast<std::int64_t>(dtype_size(dt))),
                .div_steps = div_steps,
                .hw_bf16 = dt == DType::bfloat16 && hw_bf16_wanted(),
                .walk = &walk,
                .params = params,
                .scale = scale,
                .zero = zero,
                .glo = glo,
                .ghi = ghi,
                .ratio = ratio,
                .rscale = rscale};
  }
};

void run_elementwise(const FqJob& j, std::int64_t n, bool backward) {
  const RangeFn range = HWY_DYNAMIC_DISPATCH(SelectRange)(j.dt);
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(j.dt)) * (backward ? 3 : 2);
  parallel_ranges(n, kGrain, bytes, [&](std::int64_t a, std::int64_t b) { range(j, a, b, backward); });
}

}  // namespace

void cpu_fake_quant(const FakeQuantArgs& a) {
  const FqCall call(a.dt, a.x, a.y, nullptr, a.layout, a.params, false, false);
  run_elementwise(call.job, a.layout.numel(), false);
}

void cpu_fake_quant_backward(const FakeQuantBackwardArgs& a) {
  // Every element is read (x, grad_out) before its grad_in is written, so grad_in may alias either.
  const FqCall call(a.dt, a.x, a.grad_in, a.grad_out, a.layout, a.params, true, a.grad_amax != nullptr);
  const FqJob& j = call.job;
  const DType dt = a.dt;
  const std::int64_t outer = a.layout.outer, inner = a.layout.inner;
  float* grad_amax = a.grad_amax;
  const std::int64_t C = a.layout.channels, len = outer * inner;  // terms per channel
  if (grad_amax == nullptr) return run_elementwise(j, a.layout.numel(), true);
  const ChunkFn chunk = HWY_DYNAMIC_DISPATCH(SelectChunk)(dt);
  const LastAxisRowsFn last_axis_rows = HWY_DYNAMIC_DISPATCH(SelectLastAxisRows)(dt);
  const std::int64_t chunks = (len + kSumChunk - 1) / kSumChunk;
  std::vector<double> vals(static_cast<std::size_t>(chunks * C));  // vals[c * chunks + k]
  const int t = threads_for(len * C * static_cast<std::int64_t>(dtype_size(dt)) * 3);
  if (inner == 1 && C > 1 && call.walk.period > 0) {
    // Last axis: chunk k = rows [1024 k, 1024 (k + 1)), independent of the other chunks.
    auto chunks_of = [&](std::int64_t k0, std::int64_t k1, bool parallel) {
      std::vector<double> lanes(static_cast<std::size_t>(kSumLanes * C));
      std::vector<float> terms(static_cast<std::size_t>(C));
      auto one = [&](std::int64_t k) {
        std::fill(lanes.begin(), lanes.end(), -0.0);
        last_axis_rows(j, k * kSumChunk, std::min(outer, (k + 1) * kSumChunk), lanes.data(), terms.data());
        for (std::int64_t c = 0; c < C; ++c) {  // fold channel c's 16 lanes by halving
          double l[kSumLanes];
          for (std::int64_t m = 0; m < kSumLanes; ++m) l[m] = lanes[static_cast<std::size_t>(m * C + c)];
          for (std::int64_t w = kSumLanes / 2; w >= 1; w /= 2)
            for (std::int64_t i = 0; i < w; ++i) l[i] += l[i + w];
          vals[static_cast<std::size_t>(c * chunks + k)] = l[0];
        }
      };
      if (!parallel) {
        for (std::int64_t k = k0; k < k1; ++k) one(k);
        return;
      }
#pragma omp for schedule(static)
      for (std::int64_t k = k0; k < k1; ++k) one(k);
    };
    if (t <= 1 || chunks <= 1) {
      chunks_of(0, chunks, false);  // on the calling thread: no OpenMP region
    } else {
#pragma omp parallel num_threads(t)
      chunks_of(0, chunks, true);
    }
  } else {
    // Chunk k of channel c: terms [1024 k, 1024 (k + 1)) of its sequence, in runs of `inner` elements.
    auto chunks_of = [&](bool parallel) {
      std::vector<float> terms(static_cast<std::size_t>(std::min(kSumChunk, len)));
      auto one = [&](std::int64_t ck) {
        const std::int64_t c = ck / chunks, k = ck % chunks;
        vals[static_cast<std::size_t>(ck)] =
            chunk(j, c, k * kSumChunk, std::min(len, (k + 1) * kSumChunk), terms.data());
      };
      if (!parallel) {
        for (std::int64_t ck = 0; ck < chunks * C; ++ck) one(ck);
        return;
      }
#pragma omp for schedule(static)
      for (std::int64_t ck = 0; ck < chunks * C; ++ck) one(ck);
    };
    if (t <= 1 || chunks * C <= 1) {
      chunks_of(false);  // on the calling thread: no OpenMP region
    } else {
#pragma omp parallel num_threads(t)
      chunks_of(true);
    }
  }
  for (std::int64_t c = 0; c < C; ++c) grad_amax[c] = finish_chunk_sum(vals.data() + c * chunks, chunks);
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
