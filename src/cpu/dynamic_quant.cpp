// cpu backend: npu_dynamic_quant_asymmetric (SPEC section 4) and npu_dynamic_quant (SPEC section 6,
// symmetric), bit-identical to src/ref/dynamic_quant.cpp. The symmetric operator runs the same row code:
// rowMax(|x'|) = max(0, -rowMin, rowMax) from the same reduction, and its rows are quantized with offset 0
// (x' / scale + 0 gives the same integer as x' / scale).
//
// Pertoken is single-pass over DRAM: each row is read once for its min / max (of x' = x * smooth scales),
// then quantized from the row itself while it is in cache (x' computed again: no float32 row buffer,
// whose writes and reads cost more than the multiplication on the cores measured: RowsT). Rows are
// independent, so any thread partition gives the same bits.
// Pertensor needs the global min / max first: a parallel reduction (exact, order-free), then an
// elementwise pass.
//
// float8 outputs and perchannel run plain C++ loops (float8_rows / per_channel below, outside the Highway
// targets): each element is one IEEE division (and addition) and the one float32 -> float8 conversion of
// core/float8.hpp, so they are bit-identical to the reference whatever the compiler vectorizes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/dynamic_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/aligned_allocator.h"
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
struct RowMinMax {  // value-initialized: the empty reduction
  float max = 0.0f, min = 0.0f;
  bool nan = false, empty = true;
};
// Pertensor quantization parameters with the min / max they came from.
struct RangeParams {
  float min, max, scale, offset;
};
// The per-target kernels, instantiated for one dtype (picked by VisitFloatDType on the calling thread).
using RowsFn = void (*)(const DynamicQuantArgs& a, const float* smooth_f32, std::int64_t r0, std::int64_t r1,
                        bool stream);
using RangeMinMaxFn = RowMinMax (*)(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1);
using RangeQuantFn = void (*)(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1, const RangeParams& rp,
                              bool stream);
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// Whether the two-vector loops load bfloat16 as one 64-byte vector split into its even and odd elements
// (AVX-512: x1 = the even elements 0, 2, .., 30 of each 32, widened by a 32-bit shift, x2 = the odd ones
// 1, 3, .., 31, widened by masking off the low half of each 32-bit lane): smooth scales for those loops come
// in that order too (PairOrder), and QuantizePair interleaves the results again as it packs them.
template <DType DT>
inline constexpr bool kEvenOddPairs =
    DT == DType::bfloat16 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL);

// Smooth scales s[0, n) into the order of the two-vector loops (kEvenOddPairs): each whole 32-element block
// as its even elements then its odd ones, the rest in order.
HWY_INLINE void PairOrder(const float* s, std::int64_t n, float* out) {
  std::int64_t i = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(s + i), b = _mm512_loadu_ps(s + i + 16);
    _mm512_storeu_ps(out + i, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(out + i + 16, _mm512_permutex2var_ps(a, odd, b));
  }
#endif
  for (; i + 32 <= n; i += 32)
    for (int p = 0; p < 32; ++p) out[i + p] = s[i + 2 * (p % 16) + p / 16];
  for (; i < n; ++i) out[i] = s[i];
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Two vectors of x at i (2 N elements): bfloat16 split into even and odd elements (kEvenOdd: one 64-byte
// load, see kEvenOddPairs), otherwise widened in order.
template <DType DT, bool kEvenOdd>
HWY_INLINE void LoadPair(const void* x, std::int64_t i, VF& x1, VF& x2) {
  if constexpr (kEvenOdd) {
    const __m512i raw = _mm512_loadu_si512(static_cast<const std::uint16_t*>(x) + i);
    x1 = VF{_mm512_castsi512_ps(_mm512_slli_epi32(raw, 16))};
    x2 = VF{_mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<std::int32_t>(0xFFFF0000u))))};
  } else {
    x1 = LoadF<DT>(x, i);
    x2 = LoadF<DT>(x, i + static_cast<std::int64_t>(hn::Lanes(DF())));
  }
}
#endif

// A non-empty row's RowMinMax from its min / max accumulators and NaN mask.
template <class M>
HWY_INLINE RowMinMax FloatRowMinMax(VF vmin, VF vmax, M nan) {
  const DF df;
  RowMinMax r{};
  r.nan = !hn::AllFalse(df, nan);
  r.empty = false;
  r.min = hn::GetLane(hn::MinOfLanes(df, vmin));
  r.max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  return r;
}

// The order key of float16 / bfloat16 bits b (see ReduceHalfKeys), m7 = 0x7FFF in every lane; one value.
inline std::int16_t HalfKeyScalar(std::int16_t b) {
  return static_cast<std::int16_t>(b ^ ((b < 0 ? 0xFFFF : 0) & 0x7FFF));
}
template <class V>
HWY_INLINE V HalfKey(V b, V m7) {
  return hn::Xor(b, hn::And(hn::ShiftRight<15>(b), m7));
}

// min / max / NaN of x' = x (* smooth) for n elements. bfloat16 on AVX-512 (kEvenOddPairs): smooth in
// PairOrder, unless kInOrder.
template <DType DT, bool kInOrder = false>
RowMinMax SmoothAndReduce(const void* x, std::int64_t pos, std::int64_t n, const float* smooth,
                          float* xbuf = nullptr) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  if (n == 0) return RowMinMax{};
  VF vmin = hn::Set(df, std::numeric_limits<float>::infinity());
  VF vmax = hn::Neg(vmin);
  auto nan = hn::Lt(vmin, vmin);  // all false
  auto step = [&](VF v) {
    nan = hn::Or(nan, hn::IsNaN(v));
    vmin = hn::Min(vmin, v);  // NaN lanes may be dropped or kept here: `nan` decides
    vmax = hn::Max(vmax, v);
  };
  std::int64_t i = 0;
  // Two vectors per iteration: one unordered compare finds NaN in either, and min / max fold the pair
  // first (min / max are exact and order-free, NaN is decided by `nan`).
  // (The loop is instantiated with and without smooth scales: a test inside it is not hoisted by the
  // compiler.)
  auto pairs = [&]<bool kSm>() XQUANT_LAMBDA_INLINE {
    VF lmin = vmin, lmax = vmax;
    auto lnan = nan;
    for (; i + 2 * N <= n; i += 2 * N) {
      VF v, w;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      LoadPair<DT, kEvenOddPairs<DT> && !kInOrder>(x, pos + i, v, w);
#else
      v = LoadF<DT>(x, pos + i);
      w = LoadF<DT>(x, pos + i + N);
#endif
      if constexpr (kSm) {
        v = hn::Mul(v, hn::LoadU(df, smooth + i));
        w = hn::Mul(w, hn::LoadU(df, smooth + i + N));
        if (xbuf != nullptr) {
          hn::Store(v, df, xbuf + i);
          hn::Store(w, df, xbuf + i + N);
        }
      }
      lnan = hn::Or(lnan, EitherNaN(v, w));
      lmin = hn::Min(lmin, hn::Min(v, w));
      lmax = hn::Max(lmax, hn::Max(v, w));
    }
    vmin = lmin;
    vmax = lmax;
    nan = lnan;
  };
  if (smooth != nullptr)
    pairs.template operator()<true>();
  else
    pairs.template operator()<false>();
  for (; i + N <= n; i += N) {
    VF v = LoadF<DT>(x, pos + i);
    if (smooth) v = hn::Mul(v, hn::LoadU(df, smooth + i));
    step(v);
  }
  if (i < n) {
    // The tail; its pad lanes repeat its first element (x and smooth scale), so min / max are unchanged.
    // (Only `last` is captured by reference: the loops' accumulators stay in registers.)
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    VF last;
    StagedTail(i, n - i,
               {{.base = x, .offset = pos, .es = es, .repeat_first = true},
                {.base = smooth, .fill = 1.0f, .repeat_first = true}},
               {{.base = nullptr}},
               [=, &last](const void* const* in, void* const*, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 VF v = LoadF<DT>(in[0], k);
                 if (smooth) v = hn::Mul(v, hn::LoadU(df, StagedF(in[1]) + k));
                 last = v;
               });
    step(last);
  }
  return FloatRowMinMax(vmin, vmax, nan);
}

// min / max / NaN of n float16 or bfloat16 values, in the integer domain: both formats are sign-magnitude,
// so key(b) = b ^ ((b >> 15) & 0x7FFF) (int16) orders the non-NaN values as floats, and twice as many lanes
// as float32 fit a vector. NaNs map beyond both infinities (positive NaN above key(+Inf), negative NaN
// below key(-Inf)), so the row has a NaN iff its max key or min key lies beyond them. The min / max are
// exact (widening is exact); -0 sorts below +0, which no output depends on (rowMax - rowMin and
// rowMax / scale give the same results for either zero).
// A non-empty row's RowMinMax from its smallest and largest key (see ReduceHalfKeys).
template <DType DT>
RowMinMax HalfKeysMinMax(std::int16_t kmn, std::int16_t kmx) {
  constexpr auto key = HalfKeyScalar;
  constexpr std::uint16_t kInf = DT == DType::bfloat16 ? 0x7F80 : 0x7C00;
  const std::int16_t pos_inf = static_cast<std::int16_t>(kInf);
  const std::int16_t neg_inf = key(static_cast<std::int16_t>(kInf | 0x8000));
  RowMinMax r{};
  r.empty = false;
  r.nan = kmx > pos_inf || kmn < neg_inf;
  const auto value = [&](std::int16_t k) {  // key is an involution
    const auto b = static_cast<std::uint16_t>(key(k));
    return DT == DType::bfloat16 ? hd_bfloat16_to_float(b) : hd_half_to_float(b);
  };
  r.min = value(kmn);
  r.max = value(kmx);
  return r;
}

template <DType DT>
RowMinMax ReduceHalfKeys(const void* x, std::int64_t pos, std::int64_t n) {
  static_assert(DT == DType::float16 || DT == DType::bfloat16);
  if (n == 0) return RowMinMax{};
  const hn::ScalableTag<std::int16_t> d16;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d16));
  const std::int16_t* p = static_cast<const std::int16_t*>(x) + pos;
  const auto m7 = hn::Set(d16, std::int16_t{0x7FFF});
  auto kmin = hn::Set(d16, std::numeric_limits<std::int16_t>::max());
  auto kmax = hn::Set(d16, std::numeric_limits<std::int16_t>::min());
  std::int64_t i = 0;
  auto keys = [&](std::int64_t at) XQUANT_LAMBDA_INLINE {
    return HalfKey(hn::LoadU(d16, p + at), m7);
  };
  for (; i + 2 * N <= n; i += 2 * N) {  // two vectors per iteration: the pair is folded first
    const auto k = keys(i), l = keys(i + N);
    kmin = hn::Min(kmin, hn::Min(k, l));
    kmax = hn::Max(kmax, hn::Max(k, l));
  }
  for (; i + N <= n; i += N) {
    const auto k = keys(i);
    kmin = hn::Min(kmin, k);
    kmax = hn::Max(kmax, k);
  }
  constexpr auto key = HalfKeyScalar;
  std::int16_t kmn = std::numeric_limits<std::int16_t>::max(), kmx = std::numeric_limits<std::int16_t>::min();
  if (i > 0) {
    kmn = hn::GetLane(hn::MinOfLanes(d16, kmin));
    kmx = hn::GetLane(hn::MaxOfLanes(d16, kmax));
  }
  for (; i < n; ++i) {
    const std::int16_t k = key(p[i]);
    kmn = std::min(kmn, k);
    kmx = std::max(kmx, k);
  }
  return HalfKeysMinMax<DT>(kmn, kmx);
}

// y = sat(rint(x' / scale + offset)) for n values of src (dtype DT, widened; x' = x * smooth scales when
// kSmooth: 1 with sm_pair in order, 2 in PairOrder). int8 output may be streamed (non-temporal); int4 is
// packed.
// kFinite: the caller proved every x' / scale + offset finite or +-Inf (finite row min / max, scale,
// offset, rowMin / scale and rowMax / scale), so the NaN -> 0 step is skipped: x / s is monotonic in x,
// and finite + finite cannot be NaN. kMode: how x' / scale is computed:
//   kDivide: the divider;
//   kFma:    the FMA sequence (fast_div_int for this row's scale and offset, every |x'| <= x_max);
//   kRint:   the rounding check (rint_check for this row): y = RN(x' * (1 / scale) + offset) and its
//            nearest integer, for vectors whose every lane is farther than the row's delta from a
//            half-integer; the other vectors divide. (kFinite holds.)
//   kFixed:  the same check in fixed point (rint_fixed for this row; AVX-512 only): threshold holds its
//            constant zc (offset + c) and fixed_mask its fraction mask; vectors that fail it divide.
//            (kFinite holds.)
enum class DivMode { kDivide, kFma, kRint, kFixed };

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// A row's constants for the two-vector loop of pass 2 (QuantizePair).
struct PairConsts {
  VF s, o, rs, thr, lo, hi;  // thr: rint_check's threshold, or for kFixed rint_fixed's zc
  __m512i fmask, fbase;      // kFixed: the fraction mask and n's base
};

// The 32 results of an even / odd pair in order: lane j of a holds element 2j in its low byte (int8) or
// nibble (int4), lane j of b element 2j + 1 in its second byte (bits 8-15) or second nibble (bits 4-7);
// other bits of either are ignored. One vpternlogd merges them and a truncating vpmovdw (int8: 32 bytes) or
// vpmovdb (int4: 16 bytes = 4 words) narrows them. The values must be in the output range already.
template <bool kInt4, bool kStream>
HWY_INLINE void StoreEvenOdd(__m512i a, __m512i b, std::int8_t* y8, std::int32_t* y4, std::int64_t i) {
  const __m512i m = _mm512_set1_epi32(kInt4 ? 0x0F : 0xFF);
  const __m512i v = _mm512_ternarylogic_epi32(m, a, b, 0xCA);  // bitwise m ? a : b (truth table A ? B : C)
  if constexpr (kInt4)
    StoreBytes<kStream>(_mm512_cvtepi32_epi8(v), y4 + i / 8);
  else
    StoreBytes<kStream>(_mm512_cvtepi32_epi16(v), y8 + i);
}

// Pass 2 on two vectors of x' (elements i .. i + 2 N): the rounding check (kRint: RintPairWithin; kFixed: two
// vptestmd, the second masked by the first), a pair that fails it divided. kEvenOdd (x1 even elements, x2
// odd ones): StoreEvenOdd, straight from the fixed-point bits for kFixed (bits(w) >> k is n plus a
// multiple of 2^(22 - k), and 256 / 16 divide that base: the low byte / nibble is n's), otherwise from the
// integers clamped to the output range. In order: int8 one vpmovsdb per vector, int4 StoreInt4Pair.
// kStream: non-temporal stores (aligned: 32 bytes int8 kEvenOdd, 16 otherwise).
template <DivMode kMode, bool kInt4, bool kEvenOdd, bool kStream>
HWY_INLINE void QuantizePair(VF x1, VF x2, const PairConsts& c, std::int8_t* y8, std::int32_t* y4, std::int64_t i) {
  constexpr int kK = kInt4 ? 16 : 14;
  constexpr int kShift = kInt4 ? 4 : 8;  // kEvenOdd: where the odd element's bits go
  __m512i q1, q2;
  bool within;
  if constexpr (kMode == DivMode::kFixed) {
    // q = bits(w) >> k: n plus a multiple of 2^(22 - k) (256 for int8, 64 for int4), positive and below
    // 2^15: the int4 packing keeps the low nibble, int8 in order subtracts the base (its packs saturate).
    const __m512i w1 = _mm512_castps_si512(hn::MulAdd(x1, c.rs, c.thr).raw);
    const __m512i w2 = _mm512_castps_si512(hn::MulAdd(x2, c.rs, c.thr).raw);
    within = _mm512_mask_test_epi32_mask(_mm512_test_epi32_mask(w1, c.fmask), w2, c.fmask) == 0xFFFF;
#if HWY_TARGET == HWY_AVX3_DL
    if constexpr (!kInt4) {
      if (HWY_LIKELY(within)) {
        // VBMI: one vpmultishiftqb per vector puts each lane's n (bits 14-21) into a byte (qword bytes 0 / 1
        // for its lanes 0 / 1), one vpermt2b gathers the 32 bytes in element order.
        const __m512i ctrl = _mm512_set1_epi64(0x2E0E2E0E2E0E2E0ELL);
        const __m512i a = _mm512_multishift_epi64_epi8(ctrl, w1), b = _mm512_multishift_epi64_epi8(ctrl, w2);
        __m512i idx;
        if constexpr (kEvenOdd)  // element 4q + r: r even from a, odd from b; lane q*2 + r/2
          idx = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                0, 0, 0, 0, 121, 57, 120, 56, 113, 49, 112, 48, 105, 41, 104, 40, 97, 33, 96, 32, 89,
                                25, 88, 24, 81, 17, 80, 16, 73, 9, 72, 8, 65, 1, 64, 0);
        else  // element j < 16: a's lane j; j >= 16: b's lane j - 16
          idx = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                0, 0, 0, 0, 121, 120, 113, 112, 105, 104, 97, 96, 89, 88, 81, 80, 73, 72, 65, 64, 57,
                                56, 49, 48, 41, 40, 33, 32, 25, 24, 17, 16, 9, 8, 1, 0);
        return StoreBytes<kStream>(_mm512_castsi512_si256(_mm512_permutex2var_epi8(a, idx, b)), y8 + i);
      }
    }
#endif
    if constexpr (kEvenOdd) {
      if (HWY_LIKELY(within))
        return StoreEvenOdd<kInt4, kStream>(_mm512_srli_epi32(w1, kK), _mm512_srli_epi32(w2, kK - kShift), y8, y4,
                                            i);
    } else if constexpr (kInt4) {
      // k = 16: bits(w) >> 16 is the high 16-bit half of each lane; one vpermt2w gathers the 32 halves in
      // order (elements 2j and 2j + 1 in the low and high half of 32-bit lane j), and StoreEvenOdd joins
      // each lane's two nibbles (the high half shifted down to bits 4-7).
      if (HWY_LIKELY(within)) {
        const __m512i idx = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                             27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
        const __m512i h = _mm512_permutex2var_epi16(w1, idx, w2);
        return StoreEvenOdd<true, kStream>(h, _mm512_srli_epi32(h, 12), y8, y4, i);
      }
    } else {
      q1 = _mm512_srli_epi32(w1, kK);
      q2 = _mm512_srli_epi32(w2, kK);
      if constexpr (!kInt4) {
        q1 = _mm512_sub_epi32(q1, c.fbase);
        q2 = _mm512_sub_epi32(q2, c.fbase);
      }
    }
  } else {
    static_assert(kMode == DivMode::kRint);
    within = RintPairWithin(hn::MulAdd(x1, c.rs, c.o), hn::MulAdd(x2, c.rs, c.o), c.thr, q1, q2);
  }
  if (HWY_UNLIKELY(!within)) {
    q1 = RoundSaturateToI32Range<true>(hn::Add(hn::Div(x1, c.s), c.o), c.lo, c.hi).raw;
    q2 = RoundSaturateToI32Range<true>(hn::Add(hn::Div(x2, c.s), c.o), c.lo, c.hi).raw;
  } else if constexpr (kEvenOdd) {  // kRint: |q| < 2^19, saturated here
    const __m512i lo = _mm512_set1_epi32(kInt4 ? -8 : -128), hi = _mm512_set1_epi32(kInt4 ? 7 : 127);
    q1 = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
    q2 = _mm512_min_epi32(_mm512_max_epi32(q2, lo), hi);
  }
  if constexpr (kEvenOdd) {
    StoreEvenOdd<kInt4, kStream>(q1, _mm512_slli_epi32(q2, kShift), y8, y4, i);
  } else if constexpr (kInt4) {
    // Already in [-8, 7], no clamp: the divided pairs are clamped above; kFixed rows are in range by
    // rint_fixed's test, and kRint rows because rint_check accepted them, i.e. m + |offset| < 2^19 (m =
    // max|x'| / scale). Then x' * (1 / scale) and max / scale are within m 2^-24 <= 2^-5 of x' / scale,
    // offset = RN(7 - RN(max / scale)) within 2^-5 + 2^-5 of 7 - max / scale, so y(rowMax) is within 0.1 of
    // 7 and, as (rowMax - rowMin) / scale <= 15 (1 + 2^-23), y(rowMin) >= -8 - 0.1: every y of the row rounds
    // into [-8, 7] (symmetric rows: |y| <= 7 (1 + 2^-23) + 0.1). Measured on Zen 4 in cache: bf16 -> int4
    // [64, 4096] 33.9 -> 31.0 us.
    StoreInt4Pair</*kInRange=*/true, kStream>(q1, q2, y4 + i / 8);
  } else {
    StoreI8<kStream>(VI{q1}, y8 + i);
    StoreI8<kStream>(VI{q2}, y8 + i + static_cast<std::int64_t>(hn::Lanes(DF())));
  }
}
#endif

// Where a row's results go, and what to prefetch meanwhile: the next row's input (pf, pf_es bytes per
// element of this row; the row itself when there is none), so that its DRAM reads overlap this row's
// arithmetic instead of following it.
// sm: the row's smooth scales (float32, nullptr: none), multiplied in as each vector is loaded; sm_pair:
// the same scales in the order the two-vector loop loads x (bfloat16 on AVX-512: each 32-element block in
// even / odd order, see kEvenOddPairs; the elements past the last whole block in order, as in sm).
struct RowOut {
  std::int8_t* y8;
  std::int32_t* y4;
  std::int8_t* qtmp;
  bool stream;
  const unsigned char* pf;
  std::int64_t pf_es;
  const float* sm = nullptr;
  const float* sm_pair = nullptr;
};

// kPfL2: the next row is prefetched into L2 instead of L1 (smooth rows, whose smooth scales and row already
// fill most of L1: see RowsT).
template <DType DT, bool kFinite, DivMode kMode, bool kInt4, bool kPfL2, int kSmooth>
HWY_INLINE void QuantizeRow(const void* src, std::int64_t n, float scale, float offset, float threshold,
                            const RowOut& out, std::uint32_t fixed_mask = 0) {
  std::int8_t* y8 = out.y8;
  std::int32_t* y4 = out.y4;
  std::int8_t* qtmp = out.qtmp;
  const unsigned char* pf = out.pf;
  const std::int64_t pf_es = out.pf_es;
  const float* sm = out.sm;
  [[maybe_unused]] const float* sm_pair = out.sm_pair;
  auto prefetch = [](const unsigned char* p) XQUANT_LAMBDA_INLINE {
    if constexpr (kPfL2)
      PrefetchL2(p);
    else
      hwy::Prefetch(p);
  };
  const DF df;
  const VF s = hn::Set(df, scale), o = hn::Set(df, offset), rs = hn::Set(df, 1.0f / scale);
  const VF thr = hn::Set(df, threshold);
  const VF lo = hn::Set(df, kInt4 ? -8.0f : -128.0f), hi = hn::Set(df, kInt4 ? 7.0f : 127.0f);
  // Captured by value: the int8 stores may alias anything, so values behind references would be
  // reloaded from memory for every vector.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // kFixed: n = (bits(w) >> k) - base (rint_fixed); int8 k = 14, int4 k = 16.
  constexpr int kK = kInt4 ? 16 : 14;
  const __m512i fmask = _mm512_set1_epi32(static_cast<std::int32_t>(fixed_mask));
  const __m512i fbase = _mm512_set1_epi32(kRintFixedBase<kK>);
#else
  (void)fixed_mask;
#endif
  // x' at i: x (base) times the smooth scales (smb) when the row has them.
  auto value = [XQUANT_BY_VALUE](const void* base, const float* smb, std::int64_t i) XQUANT_LAMBDA_INLINE {
    VF x = LoadF<DT>(base, i);
    if constexpr (kSmooth != 0) x = hn::Mul(x, hn::LoadU(df, smb + i));
    if constexpr (kMode == DivMode::kFixed) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      const __m512i w = _mm512_castps_si512(hn::MulAdd(x, rs, thr).raw);
      if (HWY_LIKELY(_mm512_test_epi32_mask(w, fmask) == 0xFFFF))
        return VI{_mm512_sub_epi32(_mm512_srli_epi32(w, kK), fbase)};
#endif
      return RoundSaturateToI32Range<true>(hn::Add(hn::Div(x, s), o), lo, hi);
    } else if constexpr (kMode == DivMode::kRint) {
      const VF yv = hn::MulAdd(x, rs, o);
      // |y| < 2^19, so rint(y) converts exactly; the int8 and int4 stores saturate / clamp (StoreI8,
      // StoreInt4Words), except int4 through qtmp on targets without vector packing.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      // vreduceps: y - rint(y) in one instruction; the conversion rounds to nearest even itself
      const VF d{_mm512_reduce_ps(yv.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
      if (HWY_LIKELY(hn::AllTrue(df, hn::Lt(hn::Abs(d), thr))))
        return VI{_mm512_cvt_roundps_epi32(yv.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#else
      const VF t = RoundEven(yv);
      if (HWY_LIKELY(hn::AllTrue(df, hn::Lt(hn::Abs(hn::Sub(yv, t)), thr))))
        return ConvertInRange(kInt4 && !XQUANT_HAVE_VECTOR_INT4 ? hn::Min(hn::Max(t, lo), hi) : t);
#endif
      return RoundSaturateToI32Range<true>(hn::Add(hn::Div(x, s), o), lo, hi);
    } else {
      const VF q = kMode == DivMode::kFma ? DivForInteger<false>(x, s, rs, s) : hn::Div(x, s);
      return RoundSaturateToI32Range<kFinite>(hn::Add(q, o), lo, hi);  // sat(rint(x' / scale + offset))
    }
  };
  constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
  // int8 (and int4 through qtmp where vectors cannot pack it): one vector at i, or fewer staged.
  std::int8_t* dst = kInt4 ? qtmp : y8;
  auto step = [=]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
    prefetch(pf + i * pf_es);
    StoreI8<kStream>(value(src, sm, i), dst + i);
  };
  auto stage = [&](std::int64_t i, std::int64_t count) {
    StagedTail(i, count, {{.base = src, .es = es}, {.base = sm, .fill = 1.0f}}, {{.base = dst, .es = 1}},
               [=](const void* const* in, void* const* outs, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 StoreI8(value(in[0], StagedF(in[1]), k), static_cast<std::int8_t*>(outs[0]) + k);
               });
  };
  // int4 packed in registers: fewer than a vector of values at i, clamped to [-8, 7] and packed into words.
  [[maybe_unused]] auto stage4 = [&](std::int64_t i, std::int64_t count) {
    StagedTail(i, count, {{.base = src, .es = es}, {.base = sm, .fill = 1.0f}}, {{.base = y4, .es = 0}},
               [=](const void* const* in, void* const* outs, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 const DI di;
                 StoreI8(hn::Min(hn::Max(value(in[0], StagedF(in[1]), k), hn::Set(di, -8)), hn::Set(di, 7)),
                         static_cast<std::int8_t*>(outs[0]) + k);
               });
  };
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kMode == DivMode::kRint || kMode == DivMode::kFixed) {
    // Two vectors per step with one check for both (QuantizePair); int4 streamed when the output is large.
    const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
    constexpr bool kEvenOdd = kEvenOddPairs<DT> && kSmooth != 1;
    const PairConsts pc{.s = s, .o = o, .rs = rs, .thr = thr, .lo = lo, .hi = hi, .fmask = fmask, .fbase = fbase};
    auto pair = [=]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
      prefetch(pf + i * pf_es);
      if (pf_es > 2) prefetch(pf + (i + N) * pf_es);  // a 16-bit pair is one 64-byte line
      VF x1, x2;
      LoadPair<DT, kEvenOdd>(src, i, x1, x2);
      if constexpr (kSmooth != 0) {
        x1 = hn::Mul(x1, hn::LoadU(df, sm_pair + i));
        x2 = hn::Mul(x2, hn::LoadU(df, sm_pair + i + N));
      }
      QuantizePair<kMode, kInt4, kEvenOdd, kStream>(x1, x2, pc, y8, y4, i);
    };
    if constexpr (kInt4) {  // n % 8 == 0; a last part vector goes through qtmp
      auto step4 = [=]<bool>(std::int64_t i) XQUANT_LAMBDA_INLINE {
        prefetch(pf + i * pf_es);
        StoreInt4Words(value(src, sm, i), y4 + i / 8);
      };
      if (out.stream && reinterpret_cast<std::uintptr_t>(y4) % 16 == 0) {
        // Large outputs: each pair's 16 bytes streamed (non-temporal, 16-byte aligned from the row start).
        std::int64_t i = 0;
        for (; i + 2 * N <= n; i += 2 * N) pair.template operator()<true>(i);
        if (i + N <= n) {
          step4.template operator()<false>(i);
          i += N;
        }
        if (i < n) stage4(i, n - i);
      } else {
        DriveSpanPairs(n, false, y4, 0, 1, pair, step4, stage4);
      }
    } else {
      // Smooth scales in even / odd order (bfloat16) hold for pairs from element 0: such rows stream only
      // when that is where the stream's pairs start (y8 32-byte aligned).
      const bool pairs_at_0 = !(kSmooth != 0 && kEvenOdd) || reinterpret_cast<std::uintptr_t>(y8) % 32 == 0;
      DriveSpanPairs(n, out.stream && pairs_at_0, y8, 0, 1, pair, step, stage);
    }
    return;
  }
#endif
#if XQUANT_HAVE_VECTOR_INT4
  if constexpr (kInt4) {  // n % 8 == 0: whole vectors pack in registers, a last part vector through qtmp
    const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
    std::int64_t i = 0;
    for (; i + N <= n; i += N) {
      prefetch(pf + i * pf_es);
      StoreInt4Words(value(src, sm, i), y4 + i / 8);
    }
    if (i < n) stage4(i, n - i);
    return;
  }
#endif
  DriveSpan(n, out.stream && !kInt4, dst, 0, 1, step, stage);
  if (kInt4) pack_int4_bytes(qtmp, n, y4);
}

// Whether every x' / scale + offset of a row with these min / max is finite or +-Inf (see QuantizeRow).
inline bool finite_row(float rmin, float rmax, float scale, float offset) {
  return std::isfinite(rmin) && std::isfinite(rmax) && std::isfinite(scale) && std::isfinite(offset) &&
         std::isfinite(rmin / scale) && std::isfinite(rmax / scale);
}

// The fixed-point check's parameters for a row, ok when QuantizeAnyT takes DivMode::kFixed (AVX-512).
// rint_fixed's ok implies finite_row and rint_check's ok (see rint_fixed), which are not computed again.
inline RintFixed FixedFor(float rmin, float rmax, float scale, float offset, bool int4) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (rint_check_wanted() && rint_fixed_wanted()) {
    return int4 ? rint_fixed<16>(scale, offset, rmin, rmax, -8.0f, 7.0f)
                : rint_fixed<14>(scale, offset, rmin, rmax, -128.0f, 127.0f);
  }
#else
  (void)rmin, (void)rmax, (void)scale, (void)offset, (void)int4;
#endif
  return RintFixed{};
}

template <DType DT, bool kInt4, bool kPfL2, int kSmooth>
HWY_INLINE void QuantizeAnyT(const void* src, std::int64_t n, float rmin, float rmax, float scale, float offset,
                             const RowOut& out) {
  if (finite_row(rmin, rmax, scale, offset)) {
    const float x_absmax = std::max(std::abs(rmin), std::abs(rmax));
    if (rint_check_wanted()) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      const RintFixed rf = FixedFor(rmin, rmax, scale, offset, kInt4);
      if (rf.ok)
        return QuantizeRow<DT, true, DivMode::kFixed, kInt4, kPfL2, kSmooth>(src, n, scale, offset, rf.zc, out,
                                                                             rf.mask);
#endif
      const RintCheck rc = rint_check(scale, offset, x_absmax);
      if (rc.ok) {
        return QuantizeRow<DT, true, DivMode::kRint, kInt4, kPfL2, kSmooth>(src, n, scale, offset, rc.threshold, out);
      }
    }
#if XQUANT_HAVE_FAST_DIV
    if (fast_div_wanted()) {
      const FastDivInt fd = fast_div_int(scale, scale, std::abs(offset));
      if (fd.ok && x_absmax <= fd.x_max)
        return QuantizeRow<DT, true, DivMode::kFma, kInt4, kPfL2, kSmooth>(src, n, scale, offset, 0.f, out);
    }
#endif
    QuantizeRow<DT, true, DivMode::kDivide, kInt4, kPfL2, kSmooth>(src, n, scale, offset, 0.f, out);
  } else {
    QuantizeRow<DT, false, DivMode::kDivide, kInt4, kPfL2, kSmooth>(src, n, scale, offset, 0.f, out);
  }
}

template <DType DT, bool kPfL2 = false, int kSmooth = 0>
HWY_INLINE void QuantizeAny(const void* src, std::int64_t n, float rmin, float rmax, float scale, float offset,
                            bool int4, const RowOut& out) {
  if (int4) return QuantizeAnyT<DT, true, kPfL2, kSmooth>(src, n, rmin, rmax, scale, offset, out);
  QuantizeAnyT<DT, false, kPfL2, kSmooth>(src, n, rmin, rmax, scale, offset, out);
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Pass 2 of a row with smooth scales (x0, in the fixed-point mode) fused with pass 1 of the next row of the
// same group (x1): one loop loads the scales once for both, and the next row's min / max (FP2/FP3 pipes on
// Zen 4) interleave with this row's multiplies and checks (FP0/FP1). n a whole number of vector pairs. pf:
// the row after x1, prefetched into L2. Returns x1's RowMinMax.
// kSmooth false: rows without smooth scales (smp unused; 16-bit rows reduced on int16 keys as in
// ReduceHalfKeys).
template <DType DT, bool kSmooth, bool kInt4, bool kEvenOdd, bool kStream>
HWY_NOINLINE RowMinMax FusedRows(const void* x0, const void* x1, const float* smp, std::int64_t n,
                                 const PairConsts& consts, std::int8_t* y8, std::int32_t* y4,
                                 const unsigned char* pf, std::int64_t pf_es, float* xbuf) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const PairConsts c = consts;  // a local copy: kept in registers across the stores
  constexpr bool kKeys = !kSmooth && DT != DType::float32;
  VF vmin = hn::Set(df, std::numeric_limits<float>::infinity());
  VF vmax = hn::Neg(vmin);
  auto nan = hn::Lt(vmin, vmin);  // all false
  const hn::ScalableTag<std::int16_t> d16;
  auto kmin = hn::Set(d16, std::numeric_limits<std::int16_t>::max());
  auto kmax = hn::Set(d16, std::numeric_limits<std::int16_t>::min());
  const auto m7 = hn::Set(d16, std::int16_t{0x7FFF});
  // x1 is prefetched again into L2, 4 KiB ahead of its loads: the next row's prefetch (pf, one row ahead)
  // alone left the smooth rows' loop waiting on memory (slower Zen 4, [8192, 4096], 2 threads, memcpy
  // 35 GB/s, alternating: bf16 -> int8 smooth 3.04-3.18 -> 2.68-2.85 ms; one thread 5.0-5.2 -> 4.4 ms; in
  // the fast memory state f32 -> int4 smooth 75 -> 97-98 % of memcpy). An L1 prefetch 2 KiB ahead gave
  // the same, 1 or 4 KiB ahead less; a third prefetch (L2, 2 KiB ahead) or the pf row two rows ahead
  // nothing more. On Intel the second prefetch goes into L1, 2 KiB ahead (rows_prefetch_l1_wanted); the
  // condition is loop-invariant (the compiler unswitches the loop).
  const bool l1 = rows_prefetch_l1_wanted();
  const unsigned char* const x1b = static_cast<const unsigned char*>(x1) + (l1 ? 2048 : 4096);
  for (std::int64_t i = 0; i + 2 * N <= n; i += 2 * N) {
    PrefetchL2(pf + i * pf_es);
    if (l1)
      hwy::Prefetch(x1b + i * pf_es);
    else
      PrefetchL2(x1b + i * pf_es);
    if (pf_es > 2) {
      PrefetchL2(pf + (i + N) * pf_es);
      if (l1)
        hwy::Prefetch(x1b + (i + N) * pf_es);
      else
        PrefetchL2(x1b + (i + N) * pf_es);
    }
    VF s1, s2;
    if constexpr (kSmooth) {
      s1 = hn::LoadU(df, smp + i);
      s2 = hn::LoadU(df, smp + i + N);
    }
    if constexpr (kKeys) {
      const auto b = hn::LoadU(d16, static_cast<const std::int16_t*>(x1) + i);  // 2 N elements
      const auto k = HalfKey(b, m7);
      kmin = hn::Min(kmin, k);
      kmax = hn::Max(kmax, k);
    } else {
      VF v, w;
      LoadPair<DT, kEvenOdd>(x1, i, v, w);
      if constexpr (kSmooth) {
        v = hn::Mul(v, s1);
        w = hn::Mul(w, s2);
      }
      nan = hn::Or(nan, EitherNaN(v, w));
      vmin = hn::Min(vmin, hn::Min(v, w));
      vmax = hn::Max(vmax, hn::Max(v, w));
      if constexpr (kSmooth && DT != DType::float32) {
        const VF a = hn::Load(df, xbuf + i), b = hn::Load(df, xbuf + i + N);
        hn::Store(v, df, xbuf + i);
        hn::Store(w, df, xbuf + i + N);
        QuantizePair<DivMode::kFixed, kInt4, kEvenOdd, kStream>(a, b, c, y8, y4, i);
        continue;
      }
    }
    VF a, b;
    LoadPair<DT, kEvenOdd>(x0, i, a, b);
    if constexpr (kSmooth) {
      a = hn::Mul(a, s1);
      b = hn::Mul(b, s2);
    }
    QuantizePair<DivMode::kFixed, kInt4, kEvenOdd, kStream>(a, b, c, y8, y4, i);
  }
  if constexpr (kKeys) {
    return HalfKeysMinMax<DT>(hn::GetLane(hn::MinOfLanes(d16, kmin)), hn::GetLane(hn::MaxOfLanes(d16, kmax)));
  } else {
    return FloatRowMinMax(vmin, vmax, nan);
  }
}
#endif

template <DType DT>
void RowsT(const DynamicQuantArgs& a, const float* smooth_f32, std::int64_t r0, std::int64_t r1, bool stream) {
  const std::int64_t H = a.cols;
  const std::int64_t padded = H + static_cast<std::int64_t>(kMaxLanes);
  // Per-thread scratch kept across calls (no allocation or zero-fill on the per-call path) for rows up to
  // kKeepCols; longer rows use scratch that is freed when the call ends, so one huge row does not pin
  // memory in every worker thread for the life of the process.
  constexpr std::int64_t kKeepCols = std::int64_t{1} << 20;
  thread_local std::vector<std::int8_t> kept_qtmp;
  std::vector<std::int8_t> big_qtmp;
  std::vector<std::int8_t>& qtmp = padded <= kKeepCols ? kept_qtmp : big_qtmp;
  if (a.dst == QuantDType::quint4x2 && qtmp.size() < static_cast<std::size_t>(padded))
    qtmp.resize(static_cast<std::size_t>(padded));
  const bool int4 = a.dst == QuantDType::quint4x2;
  // float32 rows quantized straight from x: on the Intel VM measured, prefetching the next row during pass
  // 2 made [8192, 4096] -> int8 slower (61-67 % of memcpy without it, 46-54 % with it: docs/performance.md);
  // the other cases gain from it there, and every case on AMD. Smooth rows prefetch it into L2 only: their
  // smooth scales (16 KiB for 4096 columns) and the row fill a 32 KiB L1, which an L1 prefetch of the next
  // row would evict (Zen 4, [8192, 4096], interleaved processes, with the row buffer of before: bf16 ->
  // int8 smooth 3.92 -> 3.41-3.65 ms, f32 -> int4 smooth 5.47-5.54 -> 4.75-4.89 ms; rows without smooth
  // scales unchanged or slower with L2 prefetch).
  const bool skip_next_row_prefetch = DT == DType::float32 && smooth_f32 == nullptr && prefetch_ahead_wanted();
  // 16-bit rows with smooth scales keep x' = x * scales of the row the fused loop reduces (FusedRows) in a
  // float32 buffer, which pass 2 reads back in the next fused loop instead of widening and multiplying
  // again. float32 rows multiply again (fewer loads and stores than the buffer for them). Both buffers share
  // one allocation, the x' buffer 2 KiB past a 4 KiB multiple after the scales, so that its stores do not
  // alias the scale loads of the same loop (4K aliasing: measured bimodal 30 / 33-39 us with separate
  // allocations). The scales in PairOrder for the two-vector loops (bfloat16 on AVX-512), rebuilt per
  // group.
  constexpr bool kKeepX = DT != DType::float32 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL);
  const std::int64_t xbuf_at = (H + 1023) / 1024 * 1024 + 512;  // floats
  const std::int64_t scratch_size = smooth_f32 != nullptr && kKeepX ? xbuf_at + H : 0;  // (kEvenOddPairs too)
  thread_local hwy::AlignedFreeUniquePtr<float[]> kept_scratch;
  thread_local std::int64_t kept_scratch_size = 0;
  hwy::AlignedFreeUniquePtr<float[]> big_scratch;
  float* scratch = nullptr;
  if (scratch_size > 0 && padded <= kKeepCols) {
    if (kept_scratch_size < scratch_size) {
      kept_scratch = hwy::AllocateAligned<float>(static_cast<std::size_t>(scratch_size));
      kept_scratch_size = scratch_size;
    }
    scratch = kept_scratch.get();
  } else if (scratch_size > 0) {
    big_scratch = hwy::AllocateAligned<float>(static_cast<std::size_t>(scratch_size));
    scratch = big_scratch.get();
  }
  float* const pair_sm = scratch;
  float* const xbuf = scratch != nullptr ? scratch + xbuf_at : nullptr;
  std::int64_t pair_sm_group = -1;
  constexpr std::int64_t kPairOrderMinRows = 4;
  std::int64_t e = 0;
  RowMinMax next_mm{};     // row r's min / max when the fused loop of row r - 1 reduced it
  bool have_next = false;
  // Which rows run FusedRows (pass 2 of a row with pass 1 of the next): rows with smooth scales, float32
  // rows without them (except on Intel, which does not prefetch the next such row: see above), and 16-bit
  // rows without them to int4, and bfloat16 rows without them to int8 on AVX-512 (even / odd pairs). Slower
  // Zen 4, [8192, 4096], 2 threads, alternating: f32 -> int8 4.72-4.92 -> 4.24-4.42 ms (slow memory state),
  // 4.18 -> 3.38 ms (fast); bf16 -> int4 2.35-2.41 -> 2.17-2.22, 2.23 -> 2.06 ms. bf16 -> int8 with the
  // unpacked pairs of before: 2.46-2.49 -> 2.53-2.61 ms (slower, not fused then); with even / odd pairs
  // 2.44-2.47 -> 2.34-2.42 ms, one thread 3.88-3.89 -> 3.35-3.56 ms (in cache 24.5 -> 25.3 us).
  // XQUANT_FUSE_ROWS=0 turns fusing off (measurement); the same bits either way.
  static const bool fuse_off = [] {
    const char* v = std::getenv("XQUANT_FUSE_ROWS");
    return v != nullptr && v[0] == '0' && v[1] == '\0';
  }();
  const bool fuse_direct = DT == DType::float32 ? !skip_next_row_prefetch : (int4 || kEvenOddPairs<DT>);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* smooth = nullptr;
    const float* smooth_pair = nullptr;
    if (smooth_f32 != nullptr) {
      if (a.group_ends != nullptr)
        while (e < a.num_groups - 1 && a.group_ends[e] <= r) ++e;  // first e with group_ends[e] > r
      const std::int64_t g = a.group_ends ? e : 0;
      smooth = smooth_f32 + g * H;
      smooth_pair = smooth;
      if constexpr (kEvenOddPairs<DT>) {
        // Reordering costs about as much as two rows' extra shuffles: a group with fewer rows left on
        // this thread keeps the scales in order (one decode token: 1.31 us with, 1.5-1.7 us without this).
        const std::int64_t group_end = a.group_ends ? std::min(r1, a.group_ends[e]) : r1;
        if (pair_sm_group != g && group_end - r >= kPairOrderMinRows) {
          PairOrder(smooth, H, pair_sm);
          pair_sm_group = g;
        }
        if (pair_sm_group == g) smooth_pair = pair_sm;
      }
    }
    // Without smooth scales x' is x itself: quantized straight from the row (in cache); 16-bit rows are
    // reduced on their bits (ReduceHalfKeys).
    const bool direct = smooth == nullptr;
    [[maybe_unused]] const bool fuse_rows = !fuse_off && (!direct || fuse_direct);
    // Whether this row may run FusedRows with the next one (pass 2 of this row with pass 1 of the next): the
    // next row is on this thread and in the same group, the rows are whole vector pairs; the row's
    // fixed-point parameters decide the rest (below). Pass 1 of such a row keeps x' for it (kKeepX).
    const std::int64_t kPair = 2 * static_cast<std::int64_t>(hn::Lanes(DF()));
    [[maybe_unused]] const bool fusable = fuse_rows && r + 1 < r1 && H > 0 && H % kPair == 0 &&
                                          (a.group_ends == nullptr || a.group_ends[e] > r + 1);
    const bool fill_buf = kKeepX && !direct && fusable;
    RowMinMax mm;
    if (have_next) {
      mm = next_mm;
      have_next = false;
    } else if constexpr (DT == DType::float32) {
      mm = SmoothAndReduce<DT>(a.x, r * H, H, smooth);
    } else {
      if (direct)
        mm = ReduceHalfKeys<DT>(a.x, r * H, H);
      else if (smooth_pair != smooth)
        mm = SmoothAndReduce<DT>(a.x, r * H, H, smooth_pair, fill_buf ? xbuf : nullptr);
      else
        mm = SmoothAndReduce<DT, /*kInOrder=*/true>(a.x, r * H, H, smooth, fill_buf ? xbuf : nullptr);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float rmax = mm.empty ? 0.f : (mm.nan ? nan : mm.max);
    const float rmin = mm.empty ? 0.f : (mm.nan ? nan : mm.min);
    const auto p = a.symmetric ? init_dynamic_quant_symmetric_params(dynamic_quant_row_absmax(rmax, rmin), a.dst)
                               : init_dynamic_quant_params(rmax, rmin, a.dst);
    a.scale[r] = p.scale;
    if (!a.symmetric) a.offset[r] = p.offset;
    constexpr std::int64_t es = DT == DType::float32 ? 4 : 2;
    const unsigned char* row = static_cast<const unsigned char*>(a.x) + r * H * es;
    const RowOut out{.y8 = static_cast<std::int8_t*>(a.y) + r * H,
                     .y4 = static_cast<std::int32_t*>(a.y) + r * (H / 8),
                     .qtmp = qtmp.data(),
                     .stream = stream,
                     .pf = r + 1 < a.rows && !skip_next_row_prefetch ? row + H * es : row,
                     .pf_es = es,
                     .sm = smooth,
                     .sm_pair = smooth_pair};
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // Pass 2 fused with the next row's pass 1 (fusable, above) when this row takes the fixed-point check.
    if (fusable) {
      const RintFixed rf = FixedFor(rmin, rmax, p.scale, p.offset, int4);
      if (rf.ok) {
        const DF df;
        const PairConsts pc{.s = hn::Set(df, p.scale),
                            .o = hn::Set(df, p.offset),
                            .rs = hn::Set(df, rf.r),  // 1 / scale
                            .thr = hn::Set(df, rf.zc),
                            .lo = hn::Set(df, int4 ? -8.0f : -128.0f),
                            .hi = hn::Set(df, int4 ? 7.0f : 127.0f),
                            .fmask = _mm512_set1_epi32(static_cast<std::int32_t>(rf.mask)),
                            .fbase = _mm512_set1_epi32(int4 ? kRintFixedBase<16> : kRintFixedBase<14>)};
        const unsigned char* next = row + H * es;
        const unsigned char* pf2 = r + 2 < a.rows ? next + H * es : next;
        // Direct bfloat16 rows load even / odd too (no scales to reorder).
        const bool even_odd = kEvenOddPairs<DT> && (direct || smooth_pair != smooth);
        // Streaming needs the stores aligned: 32 bytes (int8 even / odd), 16 (other int8, int4).
        const auto at = reinterpret_cast<std::uintptr_t>(int4 ? static_cast<void*>(out.y4) : out.y8);
        const bool st = stream && at % (!int4 && even_odd ? 32 : 16) == 0;
        auto run = [&]<bool kI4, bool kUn, bool kSt>() {
          if (direct)
            next_mm = FusedRows<DT, false, kI4, kUn, kSt>(row, next, nullptr, H, pc, out.y8, out.y4, pf2, es, nullptr);
          else
            next_mm = FusedRows<DT, true, kI4, kUn, kSt>(row, next, smooth_pair, H, pc, out.y8, out.y4, pf2, es,
                                                          xbuf);
        };
        auto run_st = [&]<bool kI4, bool kUn>() {
          if (st)
            run.template operator()<kI4, kUn, true>();
          else
            run.template operator()<kI4, kUn, false>();
        };
        auto run_un = [&]<bool kI4>() {
          if constexpr (kEvenOddPairs<DT>) {
            if (even_odd) return run_st.template operator()<kI4, true>();
          }
          run_st.template operator()<kI4, false>();
        };
        if (int4)
          run_un.template operator()<true>();
        else
          run_un.template operator()<false>();
        have_next = true;
        continue;
      }
    }
#endif
    if (direct)
      QuantizeAny<DT>(row, H, rmin, rmax, p.scale, p.offset, int4, out);
    else if (smooth_pair != smooth)
      QuantizeAny<DT, /*kPfL2=*/true, /*kSmooth=*/2>(row, H, rmin, rmax, p.scale, p.offset, int4, out);
    else
      QuantizeAny<DT, /*kPfL2=*/true, /*kSmooth=*/1>(row, H, rmin, rmax, p.scale, p.offset, int4, out);
  }
  if (stream) hwy::FlushStream();
}

RowsFn SelectRows(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> RowsFn { return &RowsT<DT>; });
}

// Pertensor: min / max / NaN over elements [b0, b1).
template <DType DT>
RowMinMax RangeMinMaxT(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1) {
  constexpr std::int64_t kPiece = 4096;
  RowMinMax acc{};
  for (std::int64_t p = b0; p < b1; p += kPiece) {
    const std::int64_t n = std::min(kPiece, b1 - p);
    RowMinMax m;
    if constexpr (DT == DType::float32)
      m = SmoothAndReduce<DT>(a.x, p, n, nullptr);
    else
      m = ReduceHalfKeys<DT>(a.x, p, n);
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

RangeMinMaxFn SelectRangeMinMax(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> RangeMinMaxFn { return &RangeMinMaxT<DT>; });
}

// Pertensor: quantize elements [b0, b1) (b0, b1 multiples of 8 for int4).
template <DType DT>
void RangeQuantT(const DynamicQuantArgs& a, std::int64_t b0, std::int64_t b1, const RangeParams& rp, bool stream) {
  constexpr std::int64_t kPiece = 4096;
  thread_local std::vector<std::int8_t> qtmp(static_cast<std::size_t>(kPiece) + kMaxLanes);
  const bool int4 = a.dst == QuantDType::quint4x2;
  for (std::int64_t p = b0; p < b1; p += kPiece) {
    const std::int64_t n = std::min(kPiece, b1 - p);
    const void* src = static_cast<const unsigned char*>(a.x) + p * static_cast<std::int64_t>(dtype_size(DT));
    const RowOut out{.y8 = static_cast<std::int8_t*>(a.y) + p,
                     .y4 = static_cast<std::int32_t*>(a.y) + p / 8,
                     .qtmp = qtmp.data(),
                     .stream = stream,
                     .pf = static_cast<const unsigned char*>(src),
                     .pf_es = 0};
    QuantizeAny<DT>(src, n, rp.min, rp.max, rp.scale, rp.offset, int4, out);
  }
  if (stream) hwy::FlushStream();
}

RangeQuantFn SelectRangeQuant(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> RangeQuantFn { return &RangeQuantT<DT>; });
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(SelectRows);
HWY_EXPORT(SelectRangeMinMax);
HWY_EXPORT(SelectRangeQuant);

namespace {

// min / max / max|.| with NaN tracking (NaN anywhere: all three NaN; nothing added: all 0).
struct Range {
  float max = 0.f, min = 0.f, absmax = 0.f;
  bool nan = false, empty = true;
  void add(float v) noexcept {
    if (v != v) {
      nan = true;
      return;
    }
    if (empty) {
      max = min = v;
      empty = false;
    } else {
      max = v > max ? v : max;
      min = v < min ? v : min;
    }
    const float m = std::fabs(v);
    absmax = m > absmax ? m : absmax;
  }
  void merge(const Range& o) noexcept {
    nan = nan || o.nan;
    if (o.empty) return;
    if (empty) {
      max = o.max, min = o.min;
      empty = false;
    } else {
      max = std::max(max, o.max), min = std::min(min, o.min);
    }
    absmax = std::max(absmax, o.absmax);
  }
  DynamicQuantRowParams params(const DynamicQuantArgs& a) const noexcept {
    const float q = std::numeric_limits<float>::quiet_NaN();
    if (a.symmetric) return init_dynamic_quant_symmetric_params(nan ? q : absmax, a.dst);
    return init_dynamic_quant_params(nan ? q : max, nan ? q : min, a.dst);
  }
};

// y[i] for i in [0, n) of one run sharing p: float8(x' / scale [+ offset]).
void float8_span(const DynamicQuantArgs& a, const float* xs, std::int64_t n, const DynamicQuantRowParams& p,
                 std::uint8_t* y) {
  if (a.symmetric) {
    for (std::int64_t j = 0; j < n; ++j)
      y[j] = dynamic_quant_float8(dynamic_quant_symmetric_value(xs[j], p.scale), a.dst);
  } else {
    for (std::int64_t j = 0; j < n; ++j) y[j] = dynamic_quant_float8(dynamic_quant_value(xs[j], p), a.dst);
  }
}

// float8 outputs, pertoken or pertensor: rows widened (and smoothed) into a float32 buffer.
void float8_rows(const DynamicQuantArgs& a, std::int64_t bytes) {
  const std::int64_t H = a.cols;
  auto widen = [&](std::int64_t r, std::int64_t e, std::vector<float>& buf) {
    buf.resize(static_cast<std::size_t>(H));
    for (std::int64_t j = 0; j < H; ++j) buf[static_cast<std::size_t>(j)] = load_float(a.dt, a.x, r * H + j);
    if (a.smooth != nullptr)
      for (std::int64_t j = 0; j < H; ++j)
        buf[static_cast<std::size_t>(j)] *= load_float(a.smooth_dt, a.smooth, e * H + j);
  };
  auto* y = static_cast<std::uint8_t*>(a.y);
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 14) / std::max<std::int64_t>(H, 1));
  if (a.per_tensor) {  // no smooth scales in this mode
    const std::int64_t pieces = (a.rows + grain - 1) / grain;
    std::vector<Range> part(static_cast<std::size_t>(std::max<std::int64_t>(pieces, 1)));
    parallel_ranges(a.rows, grain, bytes, [&](std::int64_t r0, std::int64_t r1) {
      Range& rg = part[static_cast<std::size_t>(r0 / grain)];
      for (std::int64_t i = r0 * H; i < r1 * H; ++i) rg.add(load_float(a.dt, a.x, i));
    });
    Range all;
    for (const Range& rg : part) all.merge(rg);
    const DynamicQuantRowParams p = all.params(a);
    a.scale[0] = p.scale;
    if (!a.symmetric) a.offset[0] = p.offset;
    parallel_ranges(a.rows, grain, bytes, [&](std::int64_t r0, std::int64_t r1) {
      std::vector<float> buf;
      for (std::int64_t r = r0; r < r1; ++r) {
        widen(r, 0, buf);
        float8_span(a, buf.data(), H, p, y + r * H);
      }
    });
    return;
  }
  parallel_ranges(a.rows, grain, bytes, [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> buf;
    std::int64_t e = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      if (a.group_ends != nullptr) {
        e = std::upper_bound(a.group_ends, a.group_ends + a.num_groups, r) - a.group_ends;
      }
      widen(r, e, buf);
      Range rg;
      for (float v : buf) rg.add(v);
      const DynamicQuantRowParams p = rg.params(a);
      a.scale[r] = p.scale;
      if (!a.symmetric) a.offset[r] = p.offset;
      float8_span(a, buf.data(), H, p, y + r * H);
    }
  });
}

// Perchannel: per batch, blocks of columns; the S rows of a block are streamed twice (reduce, quantize).
void per_channel(const DynamicQuantArgs& a, std::int64_t bytes) {
  const std::int64_t S = a.channel_rows, H = a.cols;
  const std::int64_t batches = a.channel_batches;
  constexpr std::int64_t kBlockCols = 256;
  const std::int64_t blocks_per_batch = (H + kBlockCols - 1) / kBlockCols;
  const bool f8 = dynamic_quant_is_float8(a.dst);
  parallel_ranges(batches * blocks_per_batch, 1, bytes, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<Range> rg(static_cast<std::size_t>(kBlockCols));
    std::vector<DynamicQuantRowParams> ps(static_cast<std::size_t>(kBlockCols));
    std::vector<float> row(static_cast<std::size_t>(kBlockCols));
    std::vector<std::uint8_t> q8(static_cast<std::size_t>(kBlockCols));
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / blocks_per_batch;
      const std::int64_t h0 = (t % blocks_per_batch) * kBlockCols;
      const std::int64_t w = std::min(kBlockCols, H - h0);
      auto load_row = [&](std::int64_t s) {
        const std::int64_t base = (b * S + s) * H + h0;
        for (std::int64_t k = 0; k < w; ++k) row[static_cast<std::size_t>(k)] = load_float(a.dt, a.x, base + k);
        if (a.smooth != nullptr) {
          const float sm = load_float(a.smooth_dt, a.smooth, s);
          for (std::int64_t k = 0; k < w; ++k) row[static_cast<std::size_t>(k)] *= sm;
        }
      };
      std::fill(rg.begin(), rg.end(), Range{});
      for (std::int64_t s = 0; s < S; ++s) {
        load_row(s);
        for (std::int64_t k = 0; k < w; ++k) rg[static_cast<std::size_t>(k)].add(row[static_cast<std::size_t>(k)]);
      }
      for (std::int64_t k = 0; k < w; ++k) {
        const DynamicQuantRowParams p = rg[static_cast<std::size_t>(k)].params(a);
        ps[static_cast<std::size_t>(k)] = p;
        a.scale[b * H + h0 + k] = p.scale;
        if (!a.symmetric) a.offset[b * H + h0 + k] = p.offset;
      }
      for (std::int64_t s = 0; s < S; ++s) {
        load_row(s);
        auto* out = static_cast<std::uint8_t*>(a.y) + (b * S + s) * H + h0;
        for (std::int64_t k = 0; k < w; ++k) {
          const DynamicQuantRowParams& p = ps[static_cast<std::size_t>(k)];
          const float xs = row[static_cast<std::size_t>(k)];
          const float v = a.symmetric ? dynamic_quant_symmetric_value(xs, p.scale) : dynamic_quant_value(xs, p);
          out[k] = f8 ? dynamic_quant_float8(v, a.dst)
                      : static_cast<std::uint8_t>(saturate_rounded<std::int8_t>(round_half_even(v)));
        }
      }
    }
  });
}

}  // namespace

void cpu_dynamic_quant(const DynamicQuantArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  if (a.per_channel) return per_channel(a, n * static_cast<std::int64_t>(dtype_size(a.dt) + 1));
  if (dynamic_quant_is_float8(a.dst)) return float8_rows(a, n * static_cast<std::int64_t>(dtype_size(a.dt) + 1));
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(a.dt) + 1);
  // Output bytes; int4 rows stream only on AVX-512 (QuantizeRow's pair loop), other targets ignore it.
  const bool stream = use_stream(a.dst == QuantDType::quint4x2 ? n / 2 : n);
  if (a.per_tensor) {
    const RangeMinMaxFn range_min_max = HWY_DYNAMIC_DISPATCH(SelectRangeMinMax)(a.dt);
    const RangeQuantFn range_quant = HWY_DYNAMIC_DISPATCH(SelectRangeQuant)(a.dt);
    constexpr std::int64_t kGrain = std::int64_t{1} << 16;  // multiple of 8: int4 words never straddle
    const std::int64_t pieces = (n + kGrain - 1) / kGrain;
    std::vector<RowMinMax> part(static_cast<std::size_t>(std::max<std::int64_t>(pieces, 1)), RowMinMax{});
    parallel_ranges(n, kGrain, bytes, [&](std::int64_t b0, std::int64_t b1) {
      part[static_cast<std::size_t>(b0 / kGrain)] = range_min_max(a, b0, b1);
    });
    // min / max are exact and order-free; NaN anywhere makes both NaN; no elements: both 0.
    RowMinMax all{};
    for (const RowMinMax& m : part) {
      if (m.empty) continue;
      if (all.empty) all = m;
      all.nan = all.nan || m.nan;
      all.min = std::min(all.min, m.min);
      all.max = std::max(all.max, m.max);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float rmax = all.empty ? 0.f : (all.nan ? nan : all.max), rmin = all.empty ? 0.f : (all.nan ? nan : all.min);
    const auto p = a.symmetric ? init_dynamic_quant_symmetric_params(dynamic_quant_row_absmax(rmax, rmin), a.dst)
                               : init_dynamic_quant_params(rmax, rmin, a.dst);
    a.scale[0] = p.scale;
    if (!a.symmetric) a.offset[0] = p.offset;
    const RangeParams rp{.min = rmin, .max = rmax, .scale = p.scale, .offset = p.offset};
    parallel_ranges(n, kGrain, bytes, [&](std::int64_t b0, std::int64_t b1) { range_quant(a, b0, b1, rp, stream); });
    return;
  }
  // Smooth scales widened to float32 once per call ([E][H] or [H]).
  std::vector<float> smooth;
  if (a.smooth != nullptr) {
    const std::int64_t count = (a.group_ends ? a.num_groups : 1) * a.cols;
    smooth.resize(static_cast<std::size_t>(count));
    cpu_widen_to_float(a.smooth_dt, a.smooth, 0, count, smooth.data());
  }
  const float* sm = a.smooth ? smooth.data() : nullptr;
  const RowsFn rows = HWY_DYNAMIC_DISPATCH(SelectRows)(a.dt);
  const std::int64_t grain_rows =
      std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(a.cols, 1));
  parallel_ranges(a.rows, grain_rows, bytes, [&](std::int64_t r0, std::int64_t r1) { rows(a, sm, r0, r1, stream); });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
