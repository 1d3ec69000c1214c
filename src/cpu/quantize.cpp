// cpu backend: npu_quantize (SPEC section 2), bit-identical to src/ref/quantize.cpp.
//   div_mode: v = x / scale + zero_point;  else v = x * scale + zero_point;  y = sat(rint(v))
// quint4x2 is packed over the flat index; every piece of the walk starts at a multiple of 8 (the last
// dimension is a multiple of 8 and so are the grain and the periods), so words never straddle pieces.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quantize.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <bit>
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
#ifndef XQUANT_CPU_QUANTIZE_ONCE
#define XQUANT_CPU_QUANTIZE_ONCE
struct QJob {
  DType dt;
  QuantDType q;
  bool div_mode;
  const void* x;
  void* y;
  const ChannelWalk* walk;
  const QuantizeParams* params;  // runs walk
  const float* scale;            // periodic walk: expanded arrays
  const float* zero_point;       // null when every zero point is 0
  bool stream;                   // non-temporal stores for y (int4: AVX-512 only, 16-byte aligned words)
  bool has_zero_point;           // some zero point is not 0
  bool fast_div;                 // div_mode without the divider (fast_div_int: every scale and zero point allows it)
  float x_max;                   // fast_div: dividends clamped to [-x_max, x_max]
  const float* rscale;           // fast_div, periodic walk: 1 / scale, rounded
};
// The per-target kernel for one (dtype, output type) pair (picked on the calling thread).
using QuantizeRangeFn = void (*)(const QJob& j, std::int64_t a, std::int64_t b);
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

constexpr std::int64_t kBlock = 64;  // int4: elements per packing block (8 words)

// v (not yet rounded) -> sat(rint(v)) stored as Q.
template <QuantDType Q, bool kStream = false>
HWY_INLINE void StoreQ(VF v, void* y, std::int64_t i) {
  if constexpr (Q == QuantDType::qint8 || Q == QuantDType::quint4x2) {
    StoreI8<kStream>(
        RoundSaturateToI32Range(v, Q == QuantDType::qint8 ? -128.0f : -8.0f, Q == QuantDType::qint8 ? 127.0f : 7.0f),
        static_cast<std::int8_t*>(y) + i);
  } else if constexpr (Q == QuantDType::quint8) {
    StoreU8<kStream>(RoundSaturateToI32Range(v, 0.0f, 255.0f), static_cast<std::uint8_t*>(y) + i);
  } else {
    StoreI32<kStream>(SaturateToI32(RoundEven(v)), static_cast<std::int32_t*>(y) + i);
  }
}

// n elements at pos; parameters broadcast (kArr false: sa, za, rsa null) or arrays aligned with the
// elements (kArr: sa non-null, za non-null when j.has_zero_point, rsa non-null when kMode == 2).
// kMode: 0 x * scale, 1 x / scale by the divider, 2 x / scale by the FMA sequence (rsa / rs: 1 / scale).
// kArr is a template argument so that the hot loops test no pointer per vector (GCC hoisted those tests
// out of the AVX-512 loops but not out of NEON's: 48 instructions per vector there).
template <DType DT, QuantDType Q, int kMode, bool kArr>
void SpanT(const QJob& j, std::int64_t pos, std::int64_t n, const float* sa, const float* za, float s, float z,
           const float* rsa, float rs) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const VF x_max = hn::Set(df, j.x_max);
  // What the hot loops read, as locals captured by value: the output stores may alias anything as far as
  // the compiler knows, so values behind references (the job) would be reloaded for every vector.
  const void* const x = j.x;
  void* const y = j.y;
  const bool has_zero_point = j.has_zero_point;
  const bool prefetch = j.stream && prefetch_ahead_wanted(/*quantize_too=*/true);
  const bool prefetch_l2 = prefetch && prefetch_l2_ahead_wanted();
  // 2 KiB ahead: 512-2048 bytes measured alike on the Intel VM (quint4x2, 1 and 2 threads), 4096 worse; on
  // Zen 4 too (prefetch_ahead_wanted), with 8 KiB ahead into L2 as well (prefetch_l2_ahead_wanted).
  auto ahead = [=](std::int64_t k) XQUANT_LAMBDA_INLINE {
    if (prefetch) PrefetchAhead<DT>(x, pos + k, prefetch_l2);
  };
  // Returns x / scale (+ zero_point) or x * scale (+ offset), not yet rounded. kA: the parameters are
  // arrays (the stage below always passes arrays: its buffers hold the broadcast values).
  auto value = [XQUANT_BY_VALUE]<bool kA>(const void* xb, std::int64_t xi, std::int64_t pi, const float* sp,
                                          const float* zp, const float* rp) XQUANT_LAMBDA_INLINE {
    const VF xv = LoadF<DT>(xb, xi);
    const VF sv = kA ? hn::LoadU(df, sp + pi) : hn::Set(df, s);
    VF scaled;
    if constexpr (kMode == 0) {
      scaled = hn::Mul(xv, sv);
    } else if constexpr (kMode == 1) {
      scaled = hn::Div(xv, sv);
    } else {
      scaled = DivForInteger<true>(xv, sv, kA ? hn::LoadU(df, rp + pi) : hn::Set(df, rs), x_max);
    }
    // No zero points: adding +0.0 could only turn -0.0 into +0.0, which rounds to the same integer.
    if (!has_zero_point) return scaled;
    const VF zv = kA ? hn::LoadU(df, zp + pi) : hn::Set(df, z);
    return hn::Add(scaled, zv);  // rint(... + zero_point) later
  };
  constexpr std::size_t kOutSize = Q == QuantDType::qint32 ? 4 : 1;
  // Fewer than kBlock elements at i (the tail; the head that aligns a streamed output) through stack
  // buffers: the body's value + StoreQ per vector (int4: packed from the int8 lanes).
  auto stage = [&](std::int64_t i, std::int64_t rem) {
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    StagedTail<kBlock>(
        i, rem,
        {{.base = x, .offset = pos, .es = es},
         StageIn::Param(sa, s),
         {.base = za, .fill = za != nullptr ? 0.0f : z},
         StageIn::Param(rsa, rs)},
        {{.base = y, .offset = pos, .es = Q == QuantDType::quint4x2 ? 0 : kOutSize}},
        [=](const void* const* in, void* const* out, std::int64_t k) XQUANT_LAMBDA_INLINE {
          StoreQ<Q>(value.template operator()<true>(in[0], k, k, StagedF(in[1]), StagedF(in[2]), StagedF(in[3])),
                    out[0], k);
        });
  };
  if constexpr (Q == QuantDType::quint4x2) {
    std::int64_t i = 0;
    auto* words = static_cast<std::int32_t*>(y);
#if XQUANT_HAVE_VECTOR_INT4
    auto one = [=](std::int64_t k) XQUANT_LAMBDA_INLINE {  // 16 elements -> 2 words (8 on AVX2: 1 word)
      ahead(k);
      StoreInt4Words<true>(
          RoundSaturateToI32Range(value.template operator()<kArr>(x, pos + k, k, sa, za, rsa), -8.0f, 7.0f),
          words + ((pos + k) >> 3));
    };
#endif
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    auto pair = [=]<bool kStream>(std::int64_t k) XQUANT_LAMBDA_INLINE {  // 32 elements -> 4 words
      ahead(k);
      ahead(k + N);
      StoreInt4Pair<true, kStream>(
          RoundSaturateToI32Range(value.template operator()<kArr>(x, pos + k, k, sa, za, rsa), -8.0f, 7.0f).raw,
          RoundSaturateToI32Range(value.template operator()<kArr>(x, pos + k + N, k + N, sa, za, rsa), -8.0f, 7.0f).raw,
          words + ((pos + k) >> 3));
    };
    // Large outputs: non-temporal 16-byte stores once the words are 16-byte aligned (a vector's 8 bytes
    // first when they sit at 8 mod 16; never for 4-byte offsets).
    const auto mis = reinterpret_cast<std::uintptr_t>(words + (pos >> 3)) % 16;
    if (j.stream && (mis == 0 || mis == 8) && n >= 4 * N) {
      if (mis == 8) {
        one(0);
        i = N;
      }
      for (; i + 2 * N <= n; i += 2 * N) pair.template operator()<true>(i);
    }
    for (; i + 2 * N <= n; i += 2 * N) pair.template operator()<false>(i);
#endif
#if XQUANT_HAVE_VECTOR_INT4
    for (; i + N <= n; i += N) one(i);
#else
    HWY_ALIGN std::int8_t tmp[kBlock] = {};
    for (; i + kBlock <= n; i += kBlock) {
      for (std::int64_t k = 0; k < kBlock; k += N)
        StoreQ<Q>(value.template operator()<kArr>(x, pos + i + k, i + k, sa, za, rsa), tmp, k);
      pack_int4_bytes(tmp, kBlock, words + (pos + i) / 8);
    }
#endif
    if (i < n) stage(i, n - i);
  } else {
    auto step = [=]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
      ahead(i);
      StoreQ<Q, kStream>(value.template operator()<kArr>(x, pos + i, i, sa, za, rsa), y, pos + i);
    };
    DriveSpan(n, j.stream, y, pos, kOutSize, step, stage);
  }
}

template <DType DT, QuantDType Q, int kMode>
void RangeT(const QJob& j, std::int64_t a, std::int64_t b) {
  j.walk->visit(
      a, b,
      [&](std::int64_t pos, std::int64_t n, std::int64_t c) {
        const float s = j.params[c].scale;
        SpanT<DT, Q, kMode, false>(j, pos, n, nullptr, nullptr, s, j.params[c].zero_point, nullptr, 1.0f / s);
      },
      [&](std::int64_t pos, std::int64_t n, std::int64_t ph) {
        SpanT<DT, Q, kMode, true>(j, pos, n, j.scale + ph, j.zero_point ? j.zero_point + ph : nullptr, 0.f, 0.f,
                                  j.rscale ? j.rscale + ph : nullptr, 1.0f);
      });
}

template <DType DT, QuantDType Q>
void RangeM(const QJob& j, std::int64_t a, std::int64_t b) {
  if (!j.div_mode) {
    RangeT<DT, Q, 0>(j, a, b);
#if XQUANT_HAVE_FAST_DIV
  } else if (j.fast_div) {
    RangeT<DT, Q, 2>(j, a, b);
#endif
  } else {
    RangeT<DT, Q, 1>(j, a, b);
  }
  if (j.stream) hwy::FlushStream();
}

QuantizeRangeFn SelectQuantizeRange(DType dt, QuantDType q) {
  return VisitFloatDType(dt, [q]<DType DT>() {
    return VisitQuantDType(q, []<QuantDType Q>() -> QuantizeRangeFn { return &RangeM<DT, Q>; });
  });
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(SelectQuantizeRange);

void cpu_quantize(const QuantizeArgs& a) {
  const DType dt = a.dt;
  const QuantDType q = a.q;
  const std::int64_t channels = a.layout.channels;
  const QuantizeParams* params = a.params;
  const ChannelWalk walk(a.layout);
  const std::int64_t n = a.layout.numel();
  // Streamed when the call's traffic (input + output bytes) reaches the threshold: the output then leaves
  // the cache behind the input stream before anyone reads it. (quint4x2 [4096, 4096] from float32 writes
  // 8 MiB behind a 64 MiB read: streamed it measured 87-112 % of memcpy against 80-88 % through the cache,
  // docs/performance.md.)
  const std::int64_t out_bytes =
      q == QuantDType::quint4x2 ? n / 2 : n * static_cast<std::int64_t>(dtype_size(storage_dtype(q)));
  const bool stream = use_stream(out_bytes + n * static_cast<std::int64_t>(dtype_size(dt)));
  // Some zero point is not +-0 (NaN included): an OR of the magnitude bits, a loop without a compare chain.
  std::uint32_t zp_bits = 0;
  for (std::int64_t c = 0; c < channels; ++c)
    zp_bits |= std::bit_cast<std::uint32_t>(params[c].zero_point) & 0x7FFFFFFFu;
  const bool has_zero_point = zp_bits != 0;
  FastDivInt fd{};
  if (a.div_mode && channels > 0 && fast_div_wanted()) {  // the scan only where the FMA division may be used
    float s_min = std::numeric_limits<float>::infinity(), s_max = -s_min, z_max = 0.0f;
    bool any_nan = false;
    for (std::int64_t c = 0; c < channels; ++c) {
      s_min = std::min(s_min, params[c].scale);
      s_max = std::max(s_max, params[c].scale);
      z_max = std::max(z_max, std::abs(params[c].zero_point));
      any_nan |= std::isnan(params[c].scale) || std::isnan(params[c].zero_point);
    }
    // NaN scales or zero points: fast_div_int refuses (comparisons with NaN are false)
    fd = fast_div_int(any_nan ? std::numeric_limits<float>::quiet_NaN() : s_min, s_max, z_max);
  }
  // Periodic walk: only the arrays the kernel reads (zero points when some is not 0, 1 / scale for the
  // FMA division), in a ParamStore (no allocation for small problems).
  ParamStore store;
  const float *scale = nullptr, *zero_point = nullptr, *rscale = nullptr;
  if (walk.period > 0) {
    const auto P = static_cast<std::size_t>(walk.period);
    float* next = store.allocate(P * (1 + (has_zero_point ? 1 : 0) + (fd.ok ? 1 : 0)));
    auto expand = [&](auto field) {
      float* dst = next;
      walk.expand_into(dst, [&](std::int64_t c) { return field(params[c]); });
      next += P;
      return dst;
    };
    scale = expand([](const QuantizeParams& p) { return p.scale; });
    if (has_zero_point) zero_point = expand([](const QuantizeParams& p) { return p.zero_point; });
    if (fd.ok) rscale = expand([](const QuantizeParams& p) { return 1.0f / p.scale; });
  }
  const QJob j{.dt = dt,
               .q = q,
               .div_mode = a.div_mode,
               .x = a.x,
               .y = a.y,
               .walk = &walk,
               .params = params,
               .scale = scale,
               .zero_point = zero_point,
               .stream = stream,
               .has_zero_point = has_zero_point,
               .fast_div = fd.ok,
               .x_max = fd.x_max,
               .rscale = rscale};
  const QuantizeRangeFn range = HWY_DYNAMIC_DISPATCH(SelectQuantizeRange)(dt, q);
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(dt) + 1);
  parallel_ranges(n, std::int64_t{1} << 16, bytes, [&](std::int64_t b0, std::int64_t b1) { range(j, b0, b1); });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
