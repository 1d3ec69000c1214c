// cpu backend: npu_anti_quant (SPEC section 7), bit-identical to src/ref/anti_quant.cpp.
//
// Elementwise over the logical elements. int8 values are loaded and widened in registers; packed int4
// words are unpacked in registers too: each lane gets the word holding its element (a broadcast), shifts
// its nibble to the top with a per-lane variable shift and sign-extends it with an arithmetic shift right
// by 28 (a vector that does not start on a word boundary, only possible behind a streaming head, goes
// through unpack_int4_bytes). Parameters follow the [outer, C, inner] channel walk shared with
// npu_quantize (cpu/walk.hpp): the periodic walk's scale / offset arrays are de-interleaved from the
// per-channel pairs once per call (SIMD, on the stack for small problems) and loaded as vectors along the
// rows; the runs walk broadcasts one channel's pair. Offsets that are all +-0 (or absent) are skipped:
// float(q) + (+-0) == float(q) exactly for an integer q (never -0), so the result bits are unchanged.
// Outputs of at least stream_min_bytes() use non-temporal stores. Any thread partition gives the same bits.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/anti_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/walk.hpp"

namespace xquant::detail {
#ifndef XQUANT_CPU_ANTI_QUANT_ONCE
#define XQUANT_CPU_ANTI_QUANT_ONCE
struct AqJob {
  const AntiQuantArgs* args;
  const ChannelWalk* walk;
  const float* scale;  // periodic walk: per-phase arrays
  const float* offset;
  bool offset_used;  // periodic walk: some offset is not +-0
  bool stream;       // non-temporal stores for out (large outputs, cpu/parallel.hpp)
  bool normal;       // no channel's result can be NaN or subnormal (AntiQuantResultsNormal)
};
// The per-target kernel for one (dtype, input type) pair (picked on the calling thread).
using AntiQuantRangeFn = void (*)(const AqJob& j, std::int64_t b0, std::int64_t b1);
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// The most lanes of one vector: the lane count itself on x86 and NEON, an upper bound on SVE and SVE2
// (whose vector length is known at run time only: loops step by hn::Lanes).
constexpr std::int64_t kN = static_cast<std::int64_t>(hn::MaxLanes(DF()));

// Elements e .. e + kN - 1 of packed int4 words, sign-extended, as float32. Needs e % min(kN, 8) == 0
// (kN <= 16); shl0 is ShlTable().
HWY_INLINE VF Int4Vec(const std::int32_t* words, std::int64_t e, VI shl0) {
  const DF df;
  const DI di;
  VI w;
  if constexpr (kN == 16) {  // two words: broadcast the pair, then lanes 0-7 take the first, 8-15 the second
    const hn::Repartition<std::uint64_t, DI> d64;
    std::uint64_t two;
    std::memcpy(&two, words + (e >> 3), 8);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // The value of each nibble from a 16-entry table of floats (vpermps reads only bits 0-3 of each
    // index lane): no shift, no conversion. The nibble of lane t to bits 0-3:
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    (void)shl0;
#if HWY_TARGET == HWY_AVX3_DL
    // VBMI: every qword holds all 16 nibbles; one vpmultishiftqb copies the 8 bits from bit 4t into lane
    // t's low byte (lane 2q: from bit 8q, lane 2q + 1: from bit 8q + 4).
    const __m512i ctrl = _mm512_set_epi64(0x0000003C00000038LL, 0x0000003400000030LL, 0x0000002C00000028LL, 0x0000002400000020LL, 0x0000001C00000018LL, 0x0000001400000010LL, 0x0000000C00000008LL, 0x0000000400000000LL);
    const __m512i idx = _mm512_multishift_epi64_epi8(ctrl, _mm512_set1_epi64(static_cast<long long>(two)));
#else
    // lanes 0-7 the first word, 8-15 the second, each shifted right by 4 (t % 8)
    const __m512i idx = _mm512_srlv_epi32(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_set1_epi64(static_cast<long long>(two))),
        _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28));
#endif
    return VF{_mm512_permutexvar_ps(idx, values)};
#endif
    alignas(64) static constexpr std::int32_t kPick[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    w = hn::TableLookupLanes(hn::BitCast(di, hn::Set(d64, two)), hn::SetTableIndices(di, kPick));
  } else {
    std::int32_t one;
    std::memcpy(&one, words + (e >> 3), 4);
    w = hn::Set(di, one);
  }
  VI shl = shl0;  // lane t: nibble (e + t) % 8 to bits [28, 31]
  if constexpr (kN < 8) shl = hn::Sub(shl0, hn::Set(di, static_cast<std::int32_t>(4 * (e & 7))));
  return hn::ConvertTo(df, hn::ShiftRight<28>(hn::Shl(w, shl)));
}

// 28 - 4 * (t % 8) in lane t.
HWY_INLINE VI ShlTable() {
  const DI di;
  return hn::Sub(hn::Set(di, 28), hn::ShiftLeft<2>(hn::And(hn::Iota(di, 0), hn::Set(di, 7))));
}

// out = (x + offset) * scale (or x * scale when every offset is +-0), before NaN canonicalization.
template <bool kOff>
HWY_INLINE VF AntiQuantVec(VF x, VF offset, VF scale) {
  return kOff ? hn::Mul(hn::Add(x, offset), scale) : hn::Mul(x, scale);
}

// Stores r to base[i] as DT with a NaN made canonical first (params/anti_quant.hpp): as StoreF of the
// canonical value. For bfloat16 the canonical NaN 0x7FC00000 narrows to 0x7FC0, so NaN lanes take that
// constant and the other lanes round to nearest even as in FloatToBf16Bits (one select instead of two).
// kHw (AVX-512 with hw_bf16_wanted()): vectors without NaN or subnormal lanes convert in hardware.
template <DType DT, bool kStream = false, bool kHw = false>
HWY_INLINE void StoreAq(VF r, void* base, std::int64_t i) {
  const DF df;
  if constexpr (DT == DType::bfloat16) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (kHw) {
      if (HWY_LIKELY(StoreBf16Hw<kStream>(r, static_cast<std::uint16_t*>(base) + i))) return;
    }
#endif
    const DU du;
    const VU x = hn::BitCast(du, r);
    const VU lsb = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
    const VU rounded = hn::ShiftRight<16>(hn::Add(hn::Add(x, hn::Set(du, 0x7FFFu)), lsb));
    const VU bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(r)), hn::Set(du, 0x7FC0u), rounded);
    const auto h = hn::DemoteTo(DU16(), hn::BitCast(DI(), bits));  // <= 0xFFFF: exact
    std::uint16_t* p = static_cast<std::uint16_t*>(base) + i;
    if constexpr (kStream)
      hn::Stream(h, DU16(), p);
    else
      hn::StoreU(h, DU16(), p);
  } else {
    StoreF<DT, kStream>(hn::IfThenElse(hn::IsNaN(r), hn::Set(df, std::numeric_limits<float>::quiet_NaN()), r), base, i);
  }
}

// Logical elements [pos, pos + n) of x -> out. kArr: parameters are arrays aligned with the span (sa, oa),
// else broadcast (s, o). kOff: add the offset (else every offset is +-0 and oa / o are not read). kR > 1:
// also the kR - 1 spans that follow at strides of P elements, with the same parameters (whole periods of
// the periodic walk): each parameter vector is loaded once for kR rows (P * dtype size a multiple of 64
// bytes, so a streamed output is aligned alike in every row).
// kHw: 0 the integer bfloat16 code, 1 AVX512_BF16 after the per-vector class check, 2 AVX512_BF16 without
// it (AqJob::normal).
template <DType DT, bool kInt4, bool kArr, bool kOff, int kHw, int kR = 1>
void Span(const AqJob& j, std::int64_t pos, std::int64_t n, const float* sa, const float* oa, float s, float o,
          std::int64_t P = 0) {
  const DF df;
  const DI di;
  const AntiQuantArgs& a = *j.args;
  const auto* x8 = static_cast<const std::int8_t*>(a.x);
  const auto* w4 = static_cast<const std::int32_t*>(a.x);
  void* const out = a.out;
  const VF sb = hn::Set(df, s), ob = hn::Set(df, o);
  const VI shl0 = ShlTable();
  constexpr std::int64_t kAlign = kN < 8 ? kN : 8;
  auto values = [&](std::int64_t e) XQUANT_LAMBDA_INLINE -> VF {
    if constexpr (kInt4) {
      if (HWY_LIKELY(kN <= 16 && (e & (kAlign - 1)) == 0)) return Int4Vec(w4, e, shl0);
      HWY_ALIGN std::int8_t tq[kMaxLanes];
      unpack_int4_bytes(w4, e, static_cast<std::int64_t>(hn::Lanes(df)), tq);
      return hn::ConvertTo(df, hn::PromoteTo(di, hn::Load(DI8(), tq)));
    } else {
      return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(DI8(), x8 + e)));
    }
  };
  auto step = [&]<bool kStream>(std::int64_t k) XQUANT_LAMBDA_INLINE {
    const VF sv = kArr ? hn::LoadU(df, sa + k) : sb;
    const VF ov = kOff ? (kArr ? hn::LoadU(df, oa + k) : ob) : sb;
    for (int r = 0; r < kR; ++r) {
      const std::int64_t e = pos + r * P + k;
      StoreAq<DT, kStream, kHw != 0>(AntiQuantVec<kOff>(values(e), ov, sv), out, e);
    }
  };
  // Fewer than a vector (the tail; the head that aligns a streamed output) through stack buffers: x staged
  // as int8 lanes (int4 unpacked), then the body's arithmetic and store.
  auto stage = [&](std::int64_t k, std::int64_t rem) {
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    for (int r = 0; r < kR; ++r)
      StagedTail(k, rem,
                 {{.base = a.x, .offset = pos + r * P, .es = kInt4 ? std::size_t{0} : std::size_t{1}},
                  StageIn::Param(kArr ? sa : nullptr, s),
                  {.base = kOff && kArr ? oa : nullptr, .fill = kOff && !kArr ? o : 0.0f}},
                 {{.base = out, .offset = pos + r * P, .es = es}},
                 [=](const void* const* in, void* const* outs, std::int64_t m) XQUANT_LAMBDA_INLINE {
                   const VF x = hn::ConvertTo(
                       df, hn::PromoteTo(di, hn::LoadU(DI8(), static_cast<const std::int8_t*>(in[0]) + m)));
                   StoreAq<DT>(
                       AntiQuantVec<kOff>(x, hn::LoadU(df, StagedF(in[2]) + m), hn::LoadU(df, StagedF(in[1]) + m)),
                       outs[0], m);
                 });
  };
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kHw != 0 && DT == DType::bfloat16) {
    // Two vectors per step: one conversion instruction and one 64-byte store for both.
    auto pair = [&]<bool kStream>(std::int64_t k) XQUANT_LAMBDA_INLINE {
      const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
      const VF s1 = kArr ? hn::LoadU(df, sa + k) : sb, s2 = kArr ? hn::LoadU(df, sa + k + N) : sb;
      const VF o1 = kOff ? (kArr ? hn::LoadU(df, oa + k) : ob) : sb;
      const VF o2 = kOff ? (kArr ? hn::LoadU(df, oa + k + N) : ob) : sb;
      if constexpr (kInt4 && kR == 4) {
        // One 64-byte line of the next block of four rows (its 4 P / 2 bytes of packed words) per step into
        // L1: a block's P / 32 steps fetch exactly that block. The hardware prefetcher does not keep up
        // with four short input streams (a 4096-column row is 2 KiB); a prefetch per row per step gained
        // the same from DRAM and cost 10 % in cache.
        hwy::Prefetch(reinterpret_cast<const unsigned char*>(w4) + (pos + kR * P) / 2 + 2 * k);
      }
      for (int r = 0; r < kR; ++r) {
        const std::int64_t e = pos + r * P + k;
        const VF r1 = AntiQuantVec<kOff>(values(e), o1, s1);
        const VF r2 = AntiQuantVec<kOff>(values(e + N), o2, s2);
        if (HWY_LIKELY((StoreBf16HwPair<kStream, kHw == 1>(r1, r2, static_cast<std::uint16_t*>(out) + e)))) continue;
        StoreAq<DT, kStream>(r1, out, e);
        StoreAq<DT, kStream>(r2, out, e + N);
      }
    };
    return DriveSpanPairs(n, j.stream, out, pos, dtype_size(DT), pair, step, stage);
  }
#endif
  DriveSpan(n, j.stream, out, pos, dtype_size(DT), step, stage);
}


template <DType DT, bool kInt4, int kHw>
void RangeT(const AqJob& j, std::int64_t b0, std::int64_t b1) {
  if constexpr (kHw == 1) {
    if (j.normal) return RangeT<DT, kInt4, 2>(j, b0, b1);
  }
  const AntiQuantParams* p = j.args->params;
  const ChannelWalk& walk = *j.walk;
  // Whole periods (rows of the last axis) taken together, so that each parameter vector is loaded once
  // for all of them. int4: four rows on AVX-512 for bfloat16 and float32 outputs (a 4096-column call's
  // 32 KiB of parameter pairs came from L2 every second row with two; one thread, in cache, Zen 4, with
  // the prefetch in Span: -> bf16 22.5-22.9 -> 18.9-20.4 us, -> f32 30.4-34.3 -> 27.7-28.1 us), two
  // elsewhere and for float16 (its conversion, not the parameters, bounds that loop; four measured slower
  // there on 2026-12-05).
  constexpr bool kAvx512 = HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL;
  constexpr int kRows = kInt4 && !(kAvx512 && DT != DType::float16) ? 2 : 4;
  auto periodic = [&]<int kR>(std::int64_t pos, std::int64_t n, std::int64_t ph) {
    if (j.offset_used)
      Span<DT, kInt4, true, true, kHw, kR>(j, pos, n, j.scale + ph, j.offset + ph, 0.f, 0.f, walk.period);
    else
      Span<DT, kInt4, true, false, kHw, kR>(j, pos, n, j.scale + ph, nullptr, 0.f, 0.f, walk.period);
  };
  if (walk.period > 0) {
    // As walk.visit, but kRows whole periods at once where the range holds them.
    const std::int64_t P = walk.period;
    const bool rows = P * static_cast<std::int64_t>(dtype_size(DT)) % 64 == 0;
    for (std::int64_t pos = b0; pos < b1;) {
      const std::int64_t ph = pos % P;
      if (rows && ph == 0 && b1 - pos >= kRows * P) {
        periodic.template operator()<kRows>(pos, P, 0);
        pos += kRows * P;
        continue;
      }
      const std::int64_t n = std::min(b1 - pos, P - ph);
      periodic.template operator()<1>(pos, n, ph);
      pos += n;
    }
  } else {
    walk.visit(
        b0, b1,
        [&](std::int64_t pos, std::int64_t n, std::int64_t c) {
          if (p[c].offset == 0.0f)
            Span<DT, kInt4, false, false, kHw>(j, pos, n, nullptr, nullptr, p[c].scale, 0.f);
          else
            Span<DT, kInt4, false, true, kHw>(j, pos, n, nullptr, nullptr, p[c].scale, p[c].offset);
        },
        [](std::int64_t, std::int64_t, std::int64_t) {});
  }
  if (j.stream) hwy::FlushStream();
}

AntiQuantRangeFn SelectAntiQuantRange(DType dt, QuantDType src) {
  return VisitFloatDType(dt, [src]<DType DT>() -> AntiQuantRangeFn {
    if (src != QuantDType::qint8 && src != QuantDType::quint4x2)
      fail_internal("cpu kernel", "anti_quant has no kernel for " + std::string(quant_dtype_name(src)) +
                                      " input (expected qint8 or quint4x2)");
    const bool int4 = src == QuantDType::quint4x2;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if (DT == DType::bfloat16 && hw_bf16_wanted()) return int4 ? &RangeT<DT, true, 1> : &RangeT<DT, false, 1>;
#endif
    return int4 ? &RangeT<DT, true, 0> : &RangeT<DT, false, 0>;
  });
}

// Whether no (x + offset[k]) * scale[k], k < n, can be NaN or subnormal for any integer x of the input
// type (|x| <= 128): then AVX512_BF16's conversion, which flushes subnormals to zero, needs no per-vector
// class check (AqJob::normal). A sufficient condition, cheap enough to test for every channel: scale and
// offset finite (|offset| <= 2^100: no NaN, no overflow of the sum), and |scale| * u >= FLT_MIN, where u =
// min(ulp(offset), 1) (1 for a zero offset) bounds every nonzero |RN(x + offset)| from below (x is a
// multiple of any power of two up to 1, so x + offset is a multiple of u, and exact below 2^24 u; with
// ulp(offset) > 1, |x + offset| is near |offset| >= 2^24), and |RN(a * scale)| grows with |a|. It refuses
// some harmless pairs (tiny scales with fractional offsets): those calls keep the per-vector check.
bool AntiQuantResultsNormal(const float* scale, const float* offset, std::int64_t n) {
  const DF df;
  const DI di;
  const VF fmax = hn::Set(df, std::numeric_limits<float>::max()), omax = hn::Set(df, 0x1p100f);
  const VF fmin = hn::Set(df, std::numeric_limits<float>::min()), one = hn::Set(df, 1.0f), zero = hn::Zero(df);
  const VI exp_mask = hn::Set(di, 0x7F800000), ulp_shift = hn::Set(di, 23 << 23), tiniest = hn::Set(di, 1);
  auto bad_lanes = [&](VF s, VF o) XQUANT_LAMBDA_INLINE {
    const auto finite = hn::And(hn::Le(hn::Abs(s), fmax), hn::Le(hn::Abs(o), omax));  // false for NaN
    const VI ulp = hn::Max(hn::Sub(hn::And(hn::BitCast(di, o), exp_mask), ulp_shift), tiniest);
    const VF u = hn::IfThenElse(hn::Eq(o, zero), one, hn::Min(hn::BitCast(df, ulp), one));
    const auto tiny = hn::And(hn::Ne(s, zero), hn::Not(hn::Ge(hn::Mul(hn::Abs(s), u), fmin)));
    return hn::Or(hn::Not(finite), tiny);
  };
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  auto bad = hn::FirstN(df, 0);
  std::int64_t k = 0;
  for (; k + N <= n; k += N) bad = hn::Or(bad, bad_lanes(hn::LoadU(df, scale + k), hn::LoadU(df, offset + k)));
  if (k < n) {  // the rest through zero-filled buffers (scale 0 passes)
    HWY_ALIGN float ts[kMaxLanes] = {}, to[kMaxLanes] = {};
    std::memcpy(ts, scale + k, static_cast<std::size_t>(n - k) * sizeof(float));
    std::memcpy(to, offset + k, static_cast<std::size_t>(n - k) * sizeof(float));
    bad = hn::Or(bad, bad_lanes(hn::Load(df, ts), hn::Load(df, to)));
  }
  return hn::AllFalse(df, bad);
}

// The periodic walk's arrays: scale[k] / offset[k] of phase k < walk.period. Returns whether some offset
// is not +-0 (NaN counts as not zero).
bool AntiQuantExpand(const AntiQuantParams* p, const ChannelWalk& walk, float* scale, float* offset) {
  const DF df;
  const DU du;
  const std::int64_t C = walk.C, P = walk.period;
  if (walk.inner != 1) {
    bool used = false;
    walk.expand_into(scale, [&](std::int64_t c) { return p[c].scale; });
    walk.expand_into(offset, [&](std::int64_t c) {
      used |= p[c].offset != 0.0f;
      return p[c].offset;
    });
    return used;
  }
  // the last axis: one (scale, offset) pair per channel, de-interleaved
  static_assert(sizeof(AntiQuantParams) == 2 * sizeof(float));
  const float* pairs = &p[0].scale;
  VU nonzero = hn::Zero(du);
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t c = 0;
  for (; c + N <= C; c += N) {
    VF s, o;
    hn::LoadInterleaved2(df, pairs + 2 * c, s, o);
    hn::StoreU(s, df, scale + c);
    hn::StoreU(o, df, offset + c);
    nonzero = hn::Or(nonzero, hn::And(hn::BitCast(du, o), hn::Set(du, 0x7FFFFFFFu)));
  }
  bool used = !hn::AllTrue(du, hn::Eq(nonzero, hn::Zero(du)));
  for (; c < C; ++c) {
    scale[c] = p[c].scale;
    offset[c] = p[c].offset;
    used |= p[c].offset != 0.0f;
  }
  for (std::int64_t k = C; k < P; k += C) {  // replicas of the first period (cpu/walk.hpp)
    std::memcpy(scale + k, scale, static_cast<std::size_t>(C) * sizeof(float));
    std::memcpy(offset + k, offset, static_cast<std::size_t>(C) * sizeof(float));
  }
  return used;
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(SelectAntiQuantRange);
HWY_EXPORT(AntiQuantExpand);
HWY_EXPORT(AntiQuantResultsNormal);

void cpu_anti_quant(const AntiQuantArgs& a) {
  const ChannelWalk walk(a.layout);
  ParamStore store;  // the periodic walk's arrays (on the stack for small problems)
  const std::int64_t n = a.layout.numel();
  const AntiQuantRangeFn range = HWY_DYNAMIC_DISPATCH(SelectAntiQuantRange)(a.dt, a.src);
  AqJob j{.args = &a,
          .walk = &walk,
          .scale = nullptr,
          .offset = nullptr,
          .offset_used = false,
          .stream = use_stream(n * static_cast<std::int64_t>(dtype_size(a.dt))),
          .normal = false};
  // The class check is skipped only where that pays: at least 64 elements per parameter pair.
  const bool check_normal = a.dt == DType::bfloat16 && hw_bf16_wanted() && n >= 64 * a.layout.channels;
  if (walk.period > 0) {
    float* s = store.allocate(2 * static_cast<std::size_t>(walk.period));
    j.scale = s;
    j.offset = s + walk.period;
    j.offset_used = HWY_DYNAMIC_DISPATCH(AntiQuantExpand)(a.params, walk, s, s + walk.period);
    if (check_normal) j.normal = HWY_DYNAMIC_DISPATCH(AntiQuantResultsNormal)(s, s + walk.period, walk.period);
  } else if (check_normal) {
    j.normal = true;
    for (std::int64_t c = 0; c < a.layout.channels && j.normal; ++c)
      j.normal = HWY_DYNAMIC_DISPATCH(AntiQuantResultsNormal)(&a.params[c].scale, &a.params[c].offset, 1);
  }
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(a.dt) + 1);
  parallel_ranges(n, std::int64_t{1} << 16, bytes, [&](std::int64_t b0, std::int64_t b1) { range(j, b0, b1); });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
