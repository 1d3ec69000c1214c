// Per-target SIMD building blocks shared by the CPU kernels (re-included once per Highway target).
//
// Besides the arithmetic, the two pieces every kernel shares: VisitFloatDType (the one dtype dispatch)
// and StagedTail (the one partial-vector tail).
//
// Highway 1.0.3 traps avoided here: its float16 conversions are wrong on the SSE4 / SSSE3 / scalar
// targets and its bfloat16 demotion truncates, so the 16-bit conversions below are our own integer code
// (bit-identical to src/core/half.cpp), except where hardware gives the same bits: F16C on x86 AVX2 /
// AVX-512 (kHwHalf) and AVX512_BF16's conversion for bfloat16 stores (StoreBf16Hw); min / max are never
// applied to values that may be NaN; no
// MaskedLoad (it may read past the end off AVX-512): tails go through small stack buffers instead
// (StagedTail).
#if defined(XQUANT_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef XQUANT_CPU_SIMD_INL_H_
#undef XQUANT_CPU_SIMD_INL_H_
#else
#define XQUANT_CPU_SIMD_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "core/check.hpp"
#include "cpu/cpu.hpp"
#include "cpu/sizeless-inl.h"
#include "xquant/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU16 = hn::Rebind<std::uint16_t, DF>;
using DI8 = hn::Rebind<std::int8_t, DF>;
using DU8 = hn::Rebind<std::uint8_t, DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;

// For hot-loop lambdas: GCC may otherwise call a large step lambda once per vector.
#ifndef XQUANT_LAMBDA_INLINE
#define XQUANT_LAMBDA_INLINE __attribute__((always_inline))
#endif

// Widest vector of this target, in float lanes (AVX-512: 16; SVE: up to 2048 bits, 64); stack buffers
// for tails are sized by it.
inline constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / 4 > 16 ? HWY_MAX_BYTES / 4 : 16;

// x86 AVX2 / AVX-512 (F16C): vcvtps2ph, imm 0 (round to nearest even, not MXCSR's mode) gives the bits of
// FloatToHalfBits for every float32 input, NaN quieting and payload included, and vcvtph2ps those of
// HalfBitsToFloat for every float16 input but the signaling NaNs, which it quiets (both checked for all
// inputs against core/convert.hpp, 2026-12-05). So stores and RoundToHalf use them as they are, and loads
// take the integer path for a vector with a NaN lane. (No kernel output could show a quieted input NaN:
// each goes through arithmetic or a float16 store, which quiet it anyway. LoadF stays exact regardless.)
inline constexpr bool kHwHalf = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;
using DH = hn::Rebind<hwy::float16_t, DF>;

// float16 bits (in u32 lanes) -> float, exact (mirrors half_to_float).
HWY_INLINE VF HalfBitsToFloat(VU h) {
  const DF df;
  const DU du;
  const DI di;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const VU e = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1Fu));
  const VU m = hn::And(h, hn::Set(du, 0x3FFu));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(du, 112u))), hn::ShiftLeft<13>(m));
  const VU infnan = hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(m));
  // subnormal (and zero): m * 2^-24, exact and a normal float (no FTZ / DAZ involvement)
  const VU sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, m)), hn::Set(df, 5.9604644775390625e-8f)));
  const auto e_zero = hn::RebindMask(du, hn::Eq(hn::BitCast(di, e), hn::Zero(di)));
  const auto e_max = hn::RebindMask(du, hn::Eq(hn::BitCast(di, e), hn::Set(di, 31)));
  const VU mag = hn::IfThenElse(e_zero, sub, hn::IfThenElse(e_max, infnan, normal));
  return hn::BitCast(df, hn::Or(mag, sign));
}

// float -> float16 bits in u32 lanes, round to nearest even (mirrors float_to_half).
HWY_INLINE VU FloatToHalfBits(VF v) {
  const DF df;
  const DU du;
  const DI di;
  const VU x = hn::BitCast(du, v);
  const VU a = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
  const VI ai = hn::BitCast(di, a);  // a <= 0x7FFFFFFF: signed compares are exact
  const VU sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
  // Below 2^-14: adding 0.5f rounds the value to a multiple of 2^-24 (the half subnormal unit) in the
  // FPU's round-to-nearest-even; the result is a normal float, so FTZ / DAZ cannot interfere.
  const VU o_sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))), hn::Set(du, 0x3F000000u));
  // Normal: rebias the exponent and drop 13 bits with ties to even (carry may ripple into Inf).
  const VU odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const VU o_norm = hn::ShiftRight<13>(hn::Add(hn::Add(hn::Sub(a, hn::Set(du, 112u << 23)), hn::Set(du, 0xFFFu)), odd));
  VU o = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 113 << 23))), o_sub, o_norm);
  o = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477FFFFF))), hn::Set(du, 0x7C00u), o);
  const VU nan = hn::Or(hn::Set(du, 0x7E00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3FFu)));
  o = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))), nan, o);
  return hn::Or(o, sign);
}

// float -> the nearest float16 value, as a float (mirrors hd_round_to_half): ties to even, beyond
// 65504 -> +-Inf, zero keeps its sign, NaN kept. Float16 arithmetic of SPEC 1 (fake quant).
// The integer code; RoundToHalf below uses F16C instead where it can.
HWY_INLINE VF RoundToHalfInt(VF v) {
  const DF df;
  const DU du;
  const DI di;
  const VU x = hn::BitCast(du, v);
  const VU sign = hn::And(x, hn::Set(du, 0x80000000u));
  const VU a = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
  const VI ai = hn::BitCast(di, a);  // a <= 0x7FFFFFFF: signed compares are exact
  // float16 normal range: keep 10 mantissa bits, ties to even (a carry ripples into the exponent).
  const VU odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  VU r = hn::And(hn::Add(hn::Add(a, hn::Set(du, 0xFFFu)), odd), hn::Set(du, ~0x1FFFu));
  // Below 2^-14: multiples of 2^-24; adding 0.5f rounds there (ties to even), subtracting it is exact.
  const VF half = hn::Set(df, 0.5f);
  const VU sub = hn::BitCast(du, hn::Sub(hn::Add(hn::BitCast(df, a), half), half));
  r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 113 << 23))), sub, r);
  // 65520 and above (the tie above 65504 goes to even, 65536): Inf.
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477FEFFF))), hn::Set(du, 0x7F800000u), r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))), a, r);  // NaN
  return hn::BitCast(df, hn::Or(r, sign));
}
HWY_INLINE VF RoundToHalf(VF v) {
  // F16C: the round trip is hd_round_to_half for every input (a NaN comes back quiet with its top payload
  // bits, where the integer code keeps it as it was; either gives the same bits once stored).
  if constexpr (kHwHalf) return hn::PromoteTo(DF(), hn::DemoteTo(DH(), v));
  return RoundToHalfInt(v);
}

// float -> bfloat16 bits in u32 lanes, round to nearest even, NaN quieted (mirrors float_to_bfloat16).
HWY_INLINE VU FloatToBf16Bits(VF v) {
  const DU du;
  const DI di;
  const VU x = hn::BitCast(du, v);
  const VI ai = hn::BitCast(di, hn::And(x, hn::Set(du, 0x7FFFFFFFu)));
  const VU lsb = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
  const VU r = hn::ShiftRight<16>(hn::Add(hn::Add(x, hn::Set(du, 0x7FFFu)), lsb));
  const VU nan = hn::Or(hn::ShiftRight<16>(x), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))), nan, r);
}

// The streaming loops' software prefetch (prefetch_ahead_wanted, cpu/fastdiv-inl.h): called for each
// vector of Lanes(DF) elements of dtype DT at base[i], it prefetches 2 KiB ahead once per 64 bytes, and with
// l2_too also 8 KiB ahead into L2 (prefetch_l2_ahead_wanted).
template <DType DT>
HWY_INLINE void PrefetchAhead(const void* base, std::int64_t i, bool l2_too = false) {
  constexpr std::int64_t kEs = DT == DType::float32 ? 4 : 2, kAheadBytes = 2048, kL2AheadBytes = 8192;
  if ((i * kEs) % 64 < static_cast<std::int64_t>(hn::Lanes(DF())) * kEs) {
    const unsigned char* p = static_cast<const unsigned char*>(base) + i * kEs;
    hwy::Prefetch(p + kAheadBytes);
    if (l2_too) __builtin_prefetch(p + kL2AheadBytes, 0, 2);
  }
}

// Prefetch into L2 rather than L1 (x86 prefetcht1, Arm PLDL2KEEP): data needed after the current L1
// working set, which an L1 prefetch would evict.
HWY_INLINE void PrefetchL2(const void* p) { __builtin_prefetch(p, 0, 2); }


#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// AVX512_BF16 (only where hw_bf16_wanted()): vcvtneps2bf16 rounds float32 -> bfloat16 to nearest even as
// FloatToBf16Bits does, except that it flushes subnormal inputs to signed zero (and quiets NaN alike).
// So a vector with a subnormal or NaN lane (one vfpclassps) returns false for the caller's integer path;
// otherwise the 16 results are stored and it returns true (checked for all 2^32 inputs: the class test
// and the converted bits). Inline asm: Highway 1.0.3 has no target with AVX512_BF16.
template <bool kStream>
HWY_INLINE bool StoreBf16Hw(VF v, std::uint16_t* p) {
  if (_mm512_fpclass_ps_mask(v.raw, 0xA1) != 0) return false;  // 0x01 QNaN, 0x20 subnormal, 0x80 SNaN
  __m256i h;
  asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(v.raw));
  const hn::Vec<DU16> hv{h};
  if constexpr (kStream)
    hn::Stream(hv, DU16(), p);
  else
    hn::StoreU(hv, DU16(), p);
  return true;
}
// StoreBf16Hw for two vectors (2 N elements, a first) at once: one vcvtne2ps2bf16 and one 64-byte store.
// kCheck false: the caller knows that no lane is NaN or subnormal (no class check; always stores).
template <bool kStream, bool kCheck = true>
HWY_INLINE bool StoreBf16HwPair(VF a, VF b, std::uint16_t* p) {
  if constexpr (kCheck) {
    // kortestw: both masks tested in one instruction, no moves to general registers
    if (!_kortestz_mask16_u8(_mm512_fpclass_ps_mask(a.raw, 0xA1), _mm512_fpclass_ps_mask(b.raw, 0xA1))) return false;
  }
  __m512i h;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(h) : "v"(b.raw), "v"(a.raw));  // low half from a
  const hn::Repartition<std::uint16_t, DF> d16;
  const hn::Vec<decltype(d16)> hv{h};
  if constexpr (kStream)
    hn::Stream(hv, d16, p);
  else
    hn::StoreU(hv, d16, p);
  return true;
}
#endif

// Load Lanes(DF) values of dtype DT at base[i], widened to float32.
// kQuietOk: the caller quiets every NaN it passes on (arithmetic, or a float16 / bfloat16 store), so a
// signaling float16 NaN may arrive quieted: vcvtph2ps without the per-vector NaN check.
template <DType DT, bool kQuietOk = false>
HWY_INLINE VF LoadF(const void* base, std::int64_t i) {
  const DF df;
  if constexpr (DT == DType::float32) {
    return hn::LoadU(df, static_cast<const float*>(base) + i);
  } else {
    const DU du;
    if constexpr (DT == DType::float16 && kHwHalf) {
      const VF h = hn::PromoteTo(df, hn::LoadU(DH(), static_cast<const hwy::float16_t*>(base) + i));
      if (kQuietOk || HWY_LIKELY(hn::AllFalse(df, hn::IsNaN(h)))) return h;
    }
    const VU u = hn::PromoteTo(du, hn::LoadU(DU16(), static_cast<const std::uint16_t*>(base) + i));
    if constexpr (DT == DType::bfloat16) return hn::BitCast(df, hn::ShiftLeft<16>(u));
    return HalfBitsToFloat(u);
  }
}

// Store Lanes(DF) float32 values to base[i] as dtype DT (narrowed once, round to nearest even).
// kStream: non-temporal store; base + i must then be aligned to the stored vector's size (StreamHead).
// kHwBf16 (callers that checked hw_bf16_wanted()): bfloat16 through StoreBf16Hw on AVX-512.
template <DType DT, bool kStream = false, bool kHwBf16 = false>
HWY_INLINE void StoreF(VF v, void* base, std::int64_t i) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kHwBf16 && DT == DType::bfloat16) {
    if (HWY_LIKELY(StoreBf16Hw<kStream>(v, static_cast<std::uint16_t*>(base) + i))) return;
  }
#endif
  if constexpr (DT == DType::float32) {
    float* p = static_cast<float*>(base) + i;
    if constexpr (kStream)
      hn::Stream(v, DF(), p);
    else
      hn::StoreU(v, DF(), p);
  } else {
    hn::Vec<DU16> h;
    if constexpr (DT == DType::float16 && kHwHalf) {
      h = hn::BitCast(DU16(), hn::DemoteTo(DH(), v));
    } else {
      const VU bits = DT == DType::float16 ? FloatToHalfBits(v) : FloatToBf16Bits(v);
      // values are <= 0xFFFF, so the saturating int32 -> uint16 demotion is exact
      h = hn::DemoteTo(DU16(), hn::BitCast(DI(), bits));
    }
    std::uint16_t* p = static_cast<std::uint16_t*>(base) + i;
    if constexpr (kStream)
      hn::Stream(h, DU16(), p);
    else
      hn::StoreU(h, DU16(), p);
  }
}

// Elements to process one by one (fewer than a vector) before base + i * es is aligned for streaming
// stores of a whole vector of es-byte elements; -1 when it can never be (base not es-aligned).
// vectors > 1: aligned for stores of that many vectors at once.
HWY_INLINE std::int64_t StreamHead(const void* base, std::int64_t i, std::size_t es, std::size_t vectors = 1) {
  const std::uintptr_t align = vectors * hn::Lanes(DF()) * es;
  const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(i) * es;
  if (addr % es != 0) return -1;
  return static_cast<std::int64_t>(((align - addr % align) % align) / es);
}

// Drives a span of n elements: stage(i, count) handles fewer than a vector through stack buffers (the
// tail, and the head that aligns the output when streaming); step.template operator()<kStream>(i)
// handles one whole vector at i. Streaming is used when requested and the output can be aligned.
template <class Step, class Stage>
HWY_INLINE void DriveSpan(std::int64_t n, bool stream, const void* out, std::int64_t out_pos, std::size_t out_es,
                          Step&& step, Stage&& stage) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(DF()));
  std::int64_t i = 0;
  // Highway's Stream writes a whole 128-bit register even for a narrower vector (e.g. 4 x uint16 on
  // SSE4), so only vectors of at least 16 bytes are streamed.
  if (stream && n >= 4 * N && static_cast<std::size_t>(N) * out_es >= 16) {
    const std::int64_t h = StreamHead(out, out_pos, out_es);
    if (h >= 0) {
      if (h > 0) stage(std::int64_t{0}, h);
      for (i = h; i + N <= n; i += N) step.template operator()<true>(i);
      if (i < n) stage(i, n - i);
      return;
    }
  }
  for (; i + N <= n; i += N) step.template operator()<false>(i);
  if (i < n) stage(i, n - i);
}

// DriveSpan with two vectors per step: pair.template operator()<kStream>(i) handles 2 N elements at i
// (when streaming, base + i is then aligned to two vectors' bytes); a last whole vector goes to step.
template <class Pair, class Step, class Stage>
HWY_INLINE void DriveSpanPairs(std::int64_t n, bool stream, const void* out, std::int64_t out_pos, std::size_t out_es,
                               Pair&& pair, Step&& step, Stage&& stage) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(DF()));
  std::int64_t i = 0;
  if (stream && n >= 4 * N && static_cast<std::size_t>(N) * out_es >= 16) {
    const std::int64_t h = StreamHead(out, out_pos, out_es, 2);  // < 2 N <= n
    if (h >= 0) {
      if (h >= N) step.template operator()<false>(std::int64_t{0});
      if (h % N > 0) stage(h - h % N, h % N);
      for (i = h; i + 2 * N <= n; i += 2 * N) pair.template operator()<true>(i);
      if (i + N <= n) {
        step.template operator()<true>(i);
        i += N;
      }
      if (i < n) stage(i, n - i);
      return;
    }
  }
  for (; i + 2 * N <= n; i += 2 * N) pair.template operator()<false>(i);
  if (i + N <= n) {
    step.template operator()<false>(i);
    i += N;
  }
  if (i < n) stage(i, n - i);
}

// ---- The one dtype dispatch ----
// f.template operator()<DT>() for the float dtype dt (float32, float16, bfloat16: the dtypes the kernels
// are instantiated for). Any other dtype is a bug in the caller (src/ops/ validates dtypes before any
// kernel runs) and throws xquant::Error (ErrorCode::internal_error) instead of running the data as some
// other dtype. It throws on the calling thread: the kernels use it to pick an instantiation before their
// parallel region (an exception must not leave an OpenMP region), e.g.
//   const RangeFn range = VisitFloatDType(dt, []<DType DT>() -> RangeFn { return &RangeT<DT>; });
template <class F>
HWY_INLINE decltype(auto) VisitFloatDType(DType dt, F&& f) {
  switch (dt) {
    case DType::float32:
      return f.template operator()<DType::float32>();
    case DType::float16:
      return f.template operator()<DType::float16>();
    case DType::bfloat16:
      return f.template operator()<DType::bfloat16>();
    default:
      break;
  }
  fail_internal("cpu kernel",
                "no kernel for dtype " + std::string(dtype_name(dt)) + " (expected float32, float16 or bfloat16)");
}
// The same for the quantized output types (qint8, quint8, qint32, quint4x2).
template <class F>
HWY_INLINE decltype(auto) VisitQuantDType(QuantDType q, F&& f) {
  switch (q) {
    case QuantDType::qint8:
      return f.template operator()<QuantDType::qint8>();
    case QuantDType::quint8:
      return f.template operator()<QuantDType::quint8>();
    case QuantDType::qint32:
      return f.template operator()<QuantDType::qint32>();
    case QuantDType::quint4x2:
      return f.template operator()<QuantDType::quint4x2>();
    case QuantDType::float8_e4m3fn:  // not integer: no rounding kernel takes them
    case QuantDType::float8_e5m2:
      break;
  }
  fail_internal("cpu kernel", "no kernel for quantized type " + std::to_string(static_cast<int>(q)));
}

// ---- The one partial-vector tail ----
// A span's last partial vector (and the head that aligns a streamed output) runs the very per-vector code
// of the span's body, on copies in stack buffers: StagedTail copies the operands' elements in, calls the
// body on the buffers and copies the results out. No masked loads or stores (see above), nothing read or
// written outside the span.
//
// An operand's element k of the span (k counted from the span's start) is element offset + k of base.
// es: bytes per element, 1, 2 or 4; 0 for quint4x2 words (element e in bits [4 (e % 8), 4 (e % 8) + 3]
// of word e / 8), which the body sees as one sign-extended int8 lane per element.
struct StageIn {
  const void* base = nullptr;  // nullptr: a broadcast float parameter, `fill` in every lane
  std::int64_t offset = 0;
  std::size_t es = 4;
  float fill = 0.0f;          // float operands: every lane when broadcast, else the lanes past the data
  bool repeat_first = false;  // the lanes past the data repeat the first element (a min / max stays exact)

  // A float parameter aligned with the span: the array, or (array == nullptr) `value` broadcast. Pad
  // lanes of an array are 1.0f: a divisor that raises nothing.
  static StageIn Param(const float* array, float value) {
    return {.base = array, .fill = array != nullptr ? 1.0f : value};
  }
};
struct StageOut {
  void* base = nullptr;  // nullptr: computed, not copied out
  std::int64_t offset = 0;
  std::size_t es = 4;  // 0: quint4x2 words, packed from the body's int8 lanes (offset + i a multiple of 8)
};

// Runs body(in, out, k) (in: const void* const*, out: void* const*, one pointer per operand, in order)
// for k = 0, N, 2 N, ... < count on buffers holding elements [i, i + count) of the operands (count <=
// kLen; N = Lanes(DF)), then copies the outputs' count elements back. Input lanes past the data are 0
// (or as StageIn says), so the body may read whole vectors. Not inlined: the tail stays out of the hot
// loop's function, and bodies capture by value ([=]) so that no local of the hot loop has its address
// taken (GCC would then keep it in memory, e.g. a min / max accumulator stored on every iteration).
template <std::size_t kLen = kMaxLanes, std::size_t kIn, std::size_t kOut, class Body>
HWY_NOINLINE void StagedTail(std::int64_t i, std::int64_t count, const StageIn (&in)[kIn], const StageOut (&out)[kOut],
                             Body&& body) {
  alignas(64) unsigned char ibuf[kIn][kLen * 4];
  alignas(64) unsigned char obuf[kOut][kLen * 4] = {};  // zeroed: GCC 12 cannot see every byte read is written
  const void* ip[kIn];
  void* op[kOut];
  const auto n = static_cast<std::size_t>(count);
  for (std::size_t k = 0; k < kIn; ++k) {
    const StageIn& s = in[k];
    unsigned char* b = ibuf[k];
    ip[k] = b;
    if (s.base == nullptr) {
      for (std::size_t m = 0; m < kLen; ++m) std::memcpy(b + 4 * m, &s.fill, 4);
      continue;
    }
    const std::int64_t e = s.offset + i;  // the operand's first staged element
    std::size_t es = s.es;
    if (es == 0) {
      unpack_int4_bytes(static_cast<const std::int32_t*>(s.base), e, count, reinterpret_cast<std::int8_t*>(b));
      es = 1;
    } else {
      std::memcpy(b, static_cast<const unsigned char*>(s.base) + e * static_cast<std::int64_t>(es), n * es);
    }
    if (s.repeat_first) {
      for (std::size_t m = n; m < kLen; ++m) std::memcpy(b + m * es, b, es);
    } else if (es == 4) {
      for (std::size_t m = n; m < kLen; ++m) std::memcpy(b + 4 * m, &s.fill, 4);
    } else {
      std::memset(b + n * es, 0, (kLen - n) * es);
    }
  }
  for (std::size_t k = 0; k < kOut; ++k) op[k] = obuf[k];
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(DF()));
  for (std::int64_t k = 0; k < count; k += N)
    body(static_cast<const void* const*>(ip), static_cast<void* const*>(op), k);
  for (std::size_t k = 0; k < kOut; ++k) {
    const StageOut& s = out[k];
    if (s.base == nullptr) continue;
    const std::int64_t e = s.offset + i;
    if (s.es == 0)
      pack_int4_bytes(reinterpret_cast<const std::int8_t*>(obuf[k]), count, static_cast<std::int32_t*>(s.base) + e / 8);
    else
      std::memcpy(static_cast<unsigned char*>(s.base) + e * static_cast<std::int64_t>(s.es), obuf[k], n * s.es);
  }
}
// The float lanes of a staged operand at k.
HWY_INLINE const float* StagedF(const void* p) { return static_cast<const float*>(p); }

// Rule 1: round half to even, keeping the sign of zero (rint(-0.25) == -0.0).
HWY_INLINE VF RoundEven(VF v) {
#if HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  // Highway 1.0.3 emulates Round here with copysign(2^23, v) + v - copysign(2^23, v), which turns
  // rint(-0.25) into +0.0. Round |v| instead (adding 2^23 leaves no fraction bits: the FPU's
  // round-to-nearest-even does the rounding) and put the sign back; |v| >= 2^23, Inf, NaN pass unchanged.
  const DF df;
  const VF big = hn::Set(df, 8388608.0f);
  const VF a = hn::Abs(v);
  const VF r = hn::Sub(hn::Add(a, big), big);
  return hn::IfThenElse(hn::Lt(a, big), hn::CopySignToAbs(r, v), v);
#else
  return hn::Round(v);  // roundps / vrndscaleps with round-to-nearest-even
#endif
}

// Clamp that lets NaN through (rule 4): comparisons with NaN are false, so NaN keeps its value.
HWY_INLINE VF ClampKeepNaN(VF v, VF lo, VF hi) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  // x86 minps(a, b) / maxps(a, b) are `a < b ? a : b` / `a > b ? a : b`: the second operand when either is
  // NaN, and on equal operands (+0 / -0), so this is the select below in two instructions.
  return hn::Max(lo, hn::Min(hi, v));
#else
  v = hn::IfThenElse(hn::Lt(v, lo), lo, v);
  return hn::IfThenElse(hn::Gt(v, hi), hi, v);
#endif
}

// Lanes where a or b is NaN (one unordered compare on x86).
HWY_INLINE auto EitherNaN(VF a, VF b) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return hn::Mask512<float>{_mm512_cmp_ps_mask(a.raw, b.raw, _CMP_UNORD_Q)};
#elif HWY_TARGET == HWY_AVX2
  return hn::Mask256<float>{_mm256_cmp_ps(a.raw, b.raw, _CMP_UNORD_Q)};
#else
  return hn::Or(hn::IsNaN(a), hn::IsNaN(b));
#endif
}

// min / max that return the canonical quiet NaN when either operand is NaN (mirror nan_min / nan_max of
// core/numeric.hpp bit for bit; on ties of +0 / -0 the first operand is kept, as there).
HWY_INLINE VF NanMin(VF a, VF b) {
  const DF df;
  const auto nan = hn::Or(hn::IsNaN(a), hn::IsNaN(b));
  return hn::IfThenElse(nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), hn::IfThenElse(hn::Lt(b, a), b, a));
}
HWY_INLINE VF NanMax(VF a, VF b) {
  const DF df;
  const auto nan = hn::Or(hn::IsNaN(a), hn::IsNaN(b));
  return hn::IfThenElse(nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), hn::IfThenElse(hn::Gt(b, a), b, a));
}

// float -> int32 for integral values already inside the int32 range (no overflow handling: Highway's
// ConvertTo adds four instructions per vector on x86 to saturate, which such values never need).
HWY_INLINE VI ConvertInRange(VF v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return VI{_mm512_cvttps_epi32(v.raw)};
#elif HWY_TARGET == HWY_AVX2
  return VI{_mm256_cvttps_epi32(v.raw)};
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  return VI{_mm_cvttps_epi32(v.raw)};
#else
  return hn::ConvertTo(DI(), v);
#endif
}

// Rule 3 for small integer ranges ([lo, hi] inside int32, exact in float): r is rounded; NaN -> 0,
// +-Inf and out-of-range values saturate. Clamped in float first: the float->int conversion of an
// out-of-range value is not defined.
HWY_INLINE VI SaturateToI32Range(VF r, float lo, float hi) {
  const DF df;
  r = hn::IfThenZeroElse(hn::IsNaN(r), r);
  r = hn::Min(hn::Max(r, hn::Set(df, lo)), hn::Set(df, hi));  // NaN already removed
  return ConvertInRange(r);
}

// rint(v) saturated to [lo, hi] (integers inside int32), NaN -> 0 unless kNoNaN (the caller knows v is
// not NaN). The same as SaturateToI32Range(RoundEven(v), lo, hi): clamping to integer bounds commutes with
// rounding. AVX-512 rounds and converts in one instruction (embedded round-to-nearest-even).
// The bounds as vectors: hot loops pass them ready-made (a broadcast from memory per vector costs an FP
// pipe on Zen 4, where the loops with a division are bound by the FP pipe of the divider).
template <bool kNoNaN = false>
HWY_INLINE VI RoundSaturateToI32Range(VF v, VF lo, VF hi) {
  if constexpr (!kNoNaN) v = hn::IfThenZeroElse(hn::IsNaN(v), v);
  v = hn::Min(hn::Max(v, lo), hi);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return VI{_mm512_cvt_roundps_epi32(v.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#else
  return ConvertInRange(RoundEven(v));
#endif
}
template <bool kNoNaN = false>
HWY_INLINE VI RoundSaturateToI32Range(VF v, float lo, float hi) {
  const DF df;
  return RoundSaturateToI32Range<kNoNaN>(v, hn::Set(df, lo), hn::Set(df, hi));
}

// Rule 3 for the full int32 range: 2^31 is not representable as int32, so values >= 2^31 are selected
// explicitly (mirrors saturate_rounded<int32_t>).
HWY_INLINE VI SaturateToI32(VF r) {
  const DF df;
  const DI di;
  r = hn::IfThenZeroElse(hn::IsNaN(r), r);
  const auto big = hn::RebindMask(di, hn::Ge(r, hn::Set(df, 2147483648.0f)));
  r = hn::Min(hn::Max(r, hn::Set(df, -2147483648.0f)), hn::Set(df, 2147483520.0f));
  return hn::IfThenElse(big, hn::Set(di, 2147483647), hn::ConvertTo(di, r));
}

// quint4x2 packing in registers for vectors of at least 8 lanes (AVX2, AVX-512): int32 lanes in [-8, 7]
// -> Lanes / 8 words at w, element 8k + j in bits [4j, 4j + 3] of word k (the same SWAR steps as
// pack_int4_bytes in cpu.hpp, on 64-bit lanes).
// v is clamped to [-8, 7] here (lanes already inside are unchanged).
#undef XQUANT_HAVE_VECTOR_INT4
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define XQUANT_HAVE_VECTOR_INT4 1
// Clamped in int32; each 64-bit lane holds elements 2k and 2k + 1, whose nibbles a 64-bit shift-or puts
// side by side, and vpmovqb narrows. (A narrow-first variant, vpmovsdb then 128-bit nibble shifts and
// pshufb, was the Intel models' choice for dynamic quantization's int4 rows; measured there against
// StoreInt4Pair it was 10 % slower on Zen 4 and 12-29 % slower on a Sapphire Rapids-class Xeon, and was
// removed: docs/performance.md.)
// kInRange: the caller guarantees every lane in [-8, 7] (no clamp needed).
template <bool kInRange = false>
HWY_INLINE void StoreInt4Words(VI v, std::int32_t* w) {
  __m512i c = v.raw;
  if constexpr (!kInRange) c = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_set1_epi32(-8)), _mm512_set1_epi32(7));
  c = _mm512_and_si512(c, _mm512_set1_epi64(0x0000000F0000000Fll));
  c = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(w), _mm512_cvtepi64_epi8(c));
}
// A 16- or 32-byte store at p: non-temporal for kStream (p then aligned to the vector's size).
template <bool kStream>
HWY_INLINE void StoreBytes(__m128i v, void* p) {
  if constexpr (kStream)
    _mm_stream_si128(static_cast<__m128i*>(p), v);
  else
    _mm_storeu_si128(static_cast<__m128i*>(p), v);
}
template <bool kStream>
HWY_INLINE void StoreBytes(__m256i v, void* p) {
  if constexpr (kStream)
    _mm256_stream_si256(static_cast<__m256i*>(p), v);
  else
    _mm256_storeu_si256(static_cast<__m256i*>(p), v);
}
// Two vectors of int32 lanes, q1 elements 0-15 and q2 16-31 -> 32 nibbles = 4 words at w (the same
// layout). vpackssdw gives int16 lanes, per 128-bit block four of q1, then four of q2, clamped to [-8, 7]
// (kInRange: already) and cut to nibbles; vpmaddwd by (1, 16) joins each pair into its byte value in an
// int32 lane, vpmovdb narrows, and pshufb puts the bytes in order: 6-8 instructions for 32 elements against
// 7-8 per 16 in StoreInt4Words.
// kStream: a non-temporal store (w 16-byte aligned).
template <bool kInRange = false, bool kStream = false>
HWY_INLINE void StoreInt4Pair(__m512i q1, __m512i q2, std::int32_t* w) {
  __m512i h = _mm512_packs_epi32(q1, q2);
  if constexpr (!kInRange) h = _mm512_min_epi16(_mm512_max_epi16(h, _mm512_set1_epi16(-8)), _mm512_set1_epi16(7));
  h = _mm512_and_si512(h, _mm512_set1_epi16(0x0F));
  __m128i b = _mm512_cvtepi32_epi8(_mm512_madd_epi16(h, _mm512_set1_epi32(0x00100001)));
  b = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  StoreBytes<kStream>(b, w);
}
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define XQUANT_HAVE_VECTOR_INT4 1
template <bool kInRange = false>
HWY_INLINE void StoreInt4Words(VI v, std::int32_t* w) {
  if constexpr (!kInRange) v = hn::Min(hn::Max(v, hn::Set(DI(), -8)), hn::Set(DI(), 7));
  const DI8 d8;
  const hn::Repartition<std::uint64_t, DI8> d64;
  auto u = hn::BitCast(d64, hn::DemoteTo(d8, v));  // byte j of lane k = element 8k + j
  u = hn::And(u, hn::Set(d64, 0x0F0F0F0F0F0F0F0Full));
  u = hn::And(hn::Or(u, hn::ShiftRight<4>(u)), hn::Set(d64, 0x00FF00FF00FF00FFull));
  u = hn::And(hn::Or(u, hn::ShiftRight<8>(u)), hn::Set(d64, 0x0000FFFF0000FFFFull));
  u = hn::Or(u, hn::ShiftRight<16>(u));  // the word is in the low 32 bits of each 64-bit lane
  HWY_ALIGN std::uint64_t lanes[kMaxLanes / 8];
  hn::Store(u, d64, lanes);
  for (std::size_t k = 0; k < hn::Lanes(d64); ++k) {
    const auto word = static_cast<std::uint32_t>(lanes[k]);
    std::memcpy(w + k, &word, 4);
  }
}
#else
#define XQUANT_HAVE_VECTOR_INT4 0
#endif

// int32 lanes -> int8, saturating (AVX-512: one vpmovsdb instead of Highway's two packs and a permute).
template <bool kStream = false>
HWY_INLINE void StoreI8(VI v, std::int8_t* p) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const hn::Vec<DI8> b{_mm512_cvtsepi32_epi8(v.raw)};
#else
  const hn::Vec<DI8> b = hn::DemoteTo(DI8(), v);
#endif
  if constexpr (kStream)
    hn::Stream(b, DI8(), p);
  else
    hn::StoreU(b, DI8(), p);
}
template <bool kStream = false>
HWY_INLINE void StoreU8(VI v, std::uint8_t* p) {
  if constexpr (kStream)
    hn::Stream(hn::DemoteTo(DU8(), v), DU8(), p);
  else
    hn::StoreU(hn::DemoteTo(DU8(), v), DU8(), p);
}
template <bool kStream = false>
HWY_INLINE void StoreI32(VI v, std::int32_t* p) {
  if constexpr (kStream)
    hn::Stream(v, DI(), p);
  else
    hn::StoreU(v, DI(), p);
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // XQUANT_CPU_SIMD_INL_H_
