// Per-target exact float32 division x / s without the divider (re-included once per Highway target).
//
// SPEC rule 2 requires the correctly rounded quotient x / s. The divider is slow on some CPUs (512-bit
// vdivps: one per 5-10 cycles on Intel Xeon), so on targets with a real FMA (x86 AVX2 and AVX-512,
// where Highway's MulSub / NegMulAdd are fused) the quotient is computed from a reciprocal
// r = RN(1 / s), prepared once per call, with two Markstein corrections:
//
//   q0 = RN(x * r)
//   e1 = RN(q0 * s - x)      q1 = RN(q0 - e1 * r)      (fused: one rounding each)
//   e2 = RN(q1 * s - x)      q2 = RN(q1 - e2 * r)      == RN(x / s), bit for bit
//
// Why q2 is the IEEE quotient (docs/performance.md has the whole argument): the steps scale exactly
// with the exponents of x and s while nothing underflows or overflows, so take x, s in [1, 2).
// |r - 1/s| <= 2^-25 puts q0 within 2^-23 of Q = x / s; one correction leaves q1 within
// (1/2 + 2^-22) ulp(Q) of Q, so q1 is faithful; then e2 = q1 * s - x is exact (Markstein) and
// q1 - e2 * r = Q + (q1 - Q)(1 - s r) differs from Q by less than Q's distance to any rounding
// midpoint (at least 2^-48 / s, as x / s is never a midpoint), for every s significand below
// 2 - 2^-21. The four largest significands are checked exhaustively (bench/exhaustive_div.cpp, which
// also checks every float32 x for a set of scales against the divider).
//
// The argument needs: s positive and normal with a normal reciprocal (s in [2^-126, 2^126): checked
// once per call by fast_div_divisor), and per lane x == +-0 (the FMA signs then give the quotient's
// signed zero) or xlo <= |x| <= xhi, where xlo = max(2^-100, 2^-124 * s_max) and
// xhi = min(FLT_MAX, 2^125 * s_min) keep q0, q1, q2 in [2^-125, 2^126] and the residuals on a grid
// of at least 2^-149. NaN, +-Inf, subnormal, tiny and huge x are outside: a vector with any such
// lane is divided instead (one integer compare per vector decides), so the result is always the
// divider's, bit for bit, on every target.
#if defined(XQUANT_CPU_FASTDIV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef XQUANT_CPU_FASTDIV_INL_H_
#undef XQUANT_CPU_FASTDIV_INL_H_
#else
#define XQUANT_CPU_FASTDIV_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"

#ifndef XQUANT_CPU_FASTDIV_ONCE
#define XQUANT_CPU_FASTDIV_ONCE
namespace xquant::detail {

// The per-call part of the fast division by divisors in [s_min, s_max] (one scale: s_min == s_max).
// ok: every divisor is in [2^-126, 2^126) (positive, normal, normal reciprocal); otherwise callers
// divide. Lanes x with x == +-0 or lo <= |x| <= hi take the fast path (as float bit patterns, |x| in
// [lo, hi] is one range of integers).
struct FastDivDomain {
  bool ok = false;
  std::uint32_t lo = 1, hi = 0;
};

inline bool fast_div_scale_ok(float s) { return s >= 0x1p-126f && s < 0x1p126f; }

inline FastDivDomain fast_div_domain(float s_min, float s_max) {
  FastDivDomain d;
  if (!(fast_div_scale_ok(s_min) && fast_div_scale_ok(s_max) && s_min <= s_max)) return d;
  // Both bounds are exact: powers of two times normal floats, capped by normal floats.
  const float lo = std::max(0x1p-100f, std::ldexp(s_max, -124));
  const double hi_d = std::ldexp(static_cast<double>(s_min), 125);
  const float hi = hi_d >= static_cast<double>(std::numeric_limits<float>::max()) ? std::numeric_limits<float>::max()
                                                                                   : static_cast<float>(hi_d);
  std::memcpy(&d.lo, &lo, 4);
  std::memcpy(&d.hi, &hi, 4);
  d.ok = d.lo <= d.hi;
  return d;
}

}  // namespace xquant::detail
#endif  // XQUANT_CPU_FASTDIV_ONCE

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef XQUANT_HAVE_FAST_DIV
#if HWY_ARCH_X86 && HWY_NATIVE_FMA && !defined(HWY_DISABLE_BMI2_FMA)
#define XQUANT_HAVE_FAST_DIV 1
#else
#define XQUANT_HAVE_FAST_DIV 0
#endif

// Whether this target computes quotients with the FMA sequence (otherwise every quotient is divided).
inline constexpr bool kHaveFastDiv = XQUANT_HAVE_FAST_DIV != 0;

// The quotient sequence, without the domain check: x / s for lanes in the domain (see the top).
template <class V>
HWY_INLINE V DivCore(V x, V s, V r) {
  const V q0 = hn::Mul(x, r);
  const V q1 = hn::NegMulAdd(hn::MulSub(q0, s, x), r, q0);
  return hn::NegMulAdd(hn::MulSub(q1, s, x), r, q1);
}

// Only one correction (kept for bench/exhaustive_div.cpp, which shows why the second one is needed).
template <class V>
HWY_INLINE V DivCoreOneStep(V x, V s, V r) {
  const V q0 = hn::Mul(x, r);
  return hn::NegMulAdd(hn::MulSub(q0, s, x), r, q0);
}

// A domain in vector form: |x| bits in [lo, hi] <=> (int32)(|x| bits + (2^31 - lo)) <= INT32_MIN + (hi - lo).
template <class DF>
struct DivDomainV {
  hn::Vec<hn::RebindToSigned<DF>> bias, top;
  explicit DivDomainV(const FastDivDomain& d) {
    const hn::RebindToSigned<DF> di;
    const std::uint32_t bias_u = 0x80000000u - d.lo;
    const std::uint32_t top_u = 0x80000000u + (d.hi - d.lo);
    std::int32_t b, t;
    std::memcpy(&b, &bias_u, 4);
    std::memcpy(&t, &top_u, 4);
    bias = hn::Set(di, b);
    top = hn::Set(di, t);
  }
};

// Per-lane domain mask (as a mask of DF).
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE auto InDivDomain(DF df, V x, const DivDomainV<DF>& dom) {
  const hn::RebindToSigned<DF> di;
  const auto ax = hn::And(hn::BitCast(di, x), hn::Set(di, 0x7FFFFFFF));
  const auto t = hn::Add(ax, dom.bias);  // wraps: in range <=> t <= top (signed)
  const auto in = hn::Or(hn::Eq(ax, hn::Zero(di)), hn::Not(hn::Gt(t, dom.top)));
  return hn::RebindMask(df, in);
}

// x / s, bit for bit the divider's: the FMA sequence when the target has it and every lane is in the
// domain, the division otherwise. r = RN(1 / s) lane by lane; dom from fast_div_domain over the
// divisors, which must have said ok (callers divide otherwise).
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE V DivExact(DF df, V x, V s, V r, const DivDomainV<DF>& dom) {
#if XQUANT_HAVE_FAST_DIV
  if (HWY_LIKELY(hn::AllTrue(df, InDivDomain(df, x, dom)))) return DivCore(x, s, r);
#else
  (void)df;
  (void)r;
  (void)dom;
#endif
  return hn::Div(x, s);
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // XQUANT_CPU_FASTDIV_INL_H_
