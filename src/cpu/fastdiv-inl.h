// Per-target exact float32 division x / s without the divider (re-included once per Highway target).
//
// SPEC rule 2 requires the correctly rounded quotient x / s. The divider is slow on some CPUs (512-bit
// vdivps: one per 5-10 cycles on Intel Xeon; Arm's fdiv: 4 floats per 7-26 cycles), so on targets with a
// real FMA (x86 AVX2 and AVX-512, every aarch64 target: Highway's MulSub / NegMulAdd are fused there) the
// quotient is computed from a reciprocal
// r = RN(1 / s), prepared once per call, with two Markstein corrections:
//
//   q0 = RN(x * r)
//   e1 = RN(q0 * s - x)      q1 = RN(q0 - e1 * r)      (fused: one rounding each)
//   e2 = RN(q1 * s - x)      q2 = RN(q1 - e2 * r)      == RN(x / s), bit for bit
//
// Why q2 is the IEEE quotient (docs/fast-division.md has the whole argument): the steps scale exactly
// with the exponents of x and s while nothing underflows or overflows, so take x, s in [1, 2).
// |r - 1/s| <= 2^-25 puts q0 within 2^-23 of Q = x / s; one correction leaves q1 within
// (1/2 + 2^-22) ulp(Q) of Q, so q1 is faithful; then e2 = q1 * s - x is exact (Markstein) and
// q1 - e2 * r = Q + (q1 - Q)(1 - s r) differs from Q by less than Q's distance to any rounding
// midpoint (at least 2^-48 / s, as x / s is never a midpoint), for every s significand below
// 2 - 2^-21. The four largest significands are checked exhaustively (bench/exhaustive_div.cpp, which
// also checks every float32 x for a set of scales against the divider).
//
// The argument needs: s positive and normal with a normal reciprocal (s in [2^-126, 2^126): checked
// once per call by fast_div_domain), and per lane x == +-0 (the FMA signs then give the quotient's
// signed zero) or xlo <= |x| <= xhi, where xlo = max(2^-100, 2^-124 * s_max) and
// xhi = min(FLT_MAX, 2^125 * s_min) keep q0, q1, q2 in [2^-125, 2^126] and the residuals on a grid
// of at least 2^-149. NaN, +-Inf, subnormal, tiny and huge x are outside. DivExact checks the domain
// per vector (two integer compares) and divides a vector with any lane outside; DivIntegral and
// DivForInteger need no per-vector check (see fast_div_integral_steps and fast_div_int). Either way
// the result is the divider's, bit for bit, on every target. Kernels use the sequence only where
// fast_div_wanted() says so (Intel CPUs and aarch64 by default).
#if defined(XQUANT_CPU_FASTDIV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef XQUANT_CPU_FASTDIV_INL_H_
#undef XQUANT_CPU_FASTDIV_INL_H_
#else
#define XQUANT_CPU_FASTDIV_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
#include "cpu/sizeless-inl.h"
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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

// min_quotient_exp: also keep |x / s| >= 2^min_quotient_exp for every nonzero x in the domain (ActsULQ
// divides the quotient's rounding error again).
inline FastDivDomain fast_div_domain(float s_min, float s_max, int min_quotient_exp = -1000) {
  FastDivDomain d;
  if (!(fast_div_scale_ok(s_min) && fast_div_scale_ok(s_max) && s_min <= s_max)) return d;
  // Both bounds are exact: powers of two times normal floats, capped by normal floats.
  float lo = std::max(0x1p-100f, std::ldexp(s_max, -124));
  if (min_quotient_exp > -1000) lo = std::max(lo, std::ldexp(s_max, min_quotient_exp + 1));
  const double hi_d = std::ldexp(static_cast<double>(s_min), 125);
  const float hi = hi_d >= static_cast<double>(std::numeric_limits<float>::max()) ? std::numeric_limits<float>::max()
                                                                                  : static_cast<float>(hi_d);
  std::memcpy(&d.lo, &lo, 4);
  std::memcpy(&d.hi, &hi, 4);
  d.ok = d.lo <= d.hi;
  return d;
}

inline float fast_div_bits_to_float(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Quotients q / s of integers |q| <= q_max (or NaN), s in [s_min, s_max] (fake quantization's
// dequantization step): 0 = not covered (divide), 1 = one correction suffices (every integer up to
// 2^kOneStepIntegerBits against every divisor significand: bench/exhaustive_div --integers),
// 2 = the two-step sequence. Every integer is then in the domain, so no per-vector check is needed.
inline constexpr int kOneStepIntegerBits = 12;
inline int fast_div_integral_steps(float s_min, float s_max, float q_max) {
  const FastDivDomain d = fast_div_domain(s_min, s_max);
  if (!d.ok || fast_div_bits_to_float(d.lo) > 1.0f || !(fast_div_bits_to_float(d.hi) >= q_max)) return 0;
  return q_max <= std::ldexp(1.0f, kOneStepIntegerBits) ? 1 : 2;
}

// float16 fake quantization's last step, out = f16(q / s): s is a float16 scale (positive, finite) and q
// a float16 integer (rint of a float16 value, or a float16 bound; +-Inf and NaN pass alike). For every
// such pair f16(RN(q * RN(1 / s))) == f16(RN(q / s)), so the product replaces the division, on every
// target (no FMA needed): checked for all 31743 scales against all 7167 float16 integers by
// FastDiv.Float16QuotientsByProduct (tests/test_fastdiv.cpp). It needs q on the float16 grid: for
// integers between float16 values it can miss (19131 / 0.4375, the smallest). kMulF16 marks the mode in
// the kernels' step counts.
inline constexpr int kMulF16 = -1;

// Integer results sat(rint(x / s + z)) with s in [s_min, s_max], |z| <= z_max (npu_quantize div_mode,
// dynamic quantization): no per-vector check either. x is first clamped to [-x_max, x_max] (NaN kept):
// beyond x_max both quotients saturate alike, as x_max / s_max >= 2^34 > 2^33 >= |z|. Dividends below
// the domain (|x| < lo, zero excepted) give |x / s| < 2^-36 both ways (s_min >= 2^-60, s_max / s_min <=
// 2^60; the FMA steps at most multiply |x r| by 7) and rint(q + z) is the same integer for any two such q: if |z| >=
// 2^-5, q is below half an ulp of z and q + z rounds to z; otherwise |q + z| < 1/2 and rounds to 0.
struct FastDivInt {
  bool ok = false;
  float x_max = 0.0f;
};
inline FastDivInt fast_div_int(float s_min, float s_max, float z_max) {
  FastDivInt f;
  const FastDivDomain d = fast_div_domain(s_min, s_max);
  if (!d.ok || !(s_min >= 0x1p-60f) || !(s_max <= std::ldexp(s_min, 60)) || !(z_max <= 0x1p33f)) return f;
  f.x_max = fast_div_bits_to_float(d.hi);
  f.ok = static_cast<double>(f.x_max) / static_cast<double>(s_max) >= 0x1p34;
  return f;
}

// sat(rint(x / s + z)) without the division, for |x| <= x_absmax (dynamic quantization: a row's own
// min / max). y = RN(x * r + z) with r = RN(1 / s) (one fused rounding, or a rounded product and a rounded
// sum on targets without FMA) differs from v = RN(RN(x / s) + z), the value SPEC rounds, by at most
// 2^-24 (5 M + 2 |z|)(1 + 2^-22) + 2^-149 with M = x_absmax / s: the product's error against the
// quotient (|1 - s r| <= 2^-24), the quotient's and the sum's roundings, and y's own one or two. So
// with delta = 2^-21 (M + |z|) + 2^-126, which bounds that, a lane whose y lies farther than delta from
// every half-integer has v strictly on the same side of every half-integer as y, hence rint(v) ==
// rint(y) (no tie either). y - rint(y) is exact (Sterbenz), so the test is |y - rint(y)| < threshold
// with threshold = 0.5 - delta rounded down. Vectors with any lane at or beyond it (about 2 delta per
// lane: 1 in 2700 for an int8 row, delta ~ 2^-12.5) are divided, as are rows where delta is not below
// 0.25 (M + |z| >= 2^19, which also keeps rint(y) inside the int32 range) and scales outside
// [2^-126, 2^126) (r must be a normal float for |1 - s r| <= 2^-24). Correct on every target; checked
// against the divider for every float32 x of a set of rows by bench/exhaustive_rint.
struct RintCheck {
  bool ok = false;
  float threshold = 0.0f;
};
// Called per row: always inlined (into the per-target kernels, whose FMA then needs no library call).
HWY_INLINE RintCheck rint_check(float s, float z, float x_absmax) {
  RintCheck c;
  if (!(s >= 0x1p-126f && s < 0x1p126f) || !std::isfinite(z) || !std::isfinite(x_absmax)) return c;
  const double m = static_cast<double>(x_absmax) / static_cast<double>(s);
  const double thr = 0.5 - ((m + std::fabs(static_cast<double>(z))) * 0x1p-21 + 0x1p-126);
  if (!(thr > 0.25)) return c;
  float t = static_cast<float>(thr);
  // the next float toward zero (t is positive and normal: thr is in (0.25, 0.5))
  if (static_cast<double>(t) > thr) t = std::bit_cast<float>(std::bit_cast<std::uint32_t>(t) - 1u);
  c.ok = true;
  c.threshold = t;
  return c;
}

// The rounding check in fixed point (AVX-512 dynamic quantization; fewer operations than rint_check's
// y - rint(y), and none of them a conversion). With u = x * r + z (exact), r = RN(1 / s), and the same delta
// (|v - u| <= delta, see rint_check): w = RN(x * r + zc), one FMA, with zc = RN(z + c) computed once per
// row, c = 1.5 * 2^(23 - k) + 1/2 + h, h = 2^-j. While u + 1/2 + h and z + 1/2 + h stay inside
// (-2^(22 - k), 2^(22 - k)), zc and w lie in [2^(23 - k), 2^(24 - k)), whose spacing is 2^-k, so
// w = u + c + e with |e| <= 2^-k (two roundings of at most 2^-(k + 1)), and w's bit pattern holds
// g = w - 1.5 * 2^(23 - k) = u + 1/2 + h + e in fixed point: bits [0, k) its fraction, bits [k, 22] its
// integer part n = floor(g) plus a constant whose low 22 - k bits are zero (base below). If g's fraction
// is at least 2h (one of the fraction bits [k - j + 1, k) set: the mask), then u + 1/2 lies in
// [n + h - 2^-k, n + 1 - h], and v + 1/2 strictly inside (n, n + 1) when h > delta + 2^-k: rint(v) = n,
// never a tie. A lane that fails (fraction below 2h: about 2h of the lanes) sends its vector pair to the
// divider, as rint_check's do. n = (bits(w) >> k) - base.
// The row's y = RN(x r + z) lie in [RN(x_min r + z), RN(x_max r + z)] (an FMA is monotonic in x for r > 0),
// within 2^-24 |y| + delta of v and u; that interval must keep w in its binade (with a margin of 2 for e)
// and rint(v) inside [lo, hi] (so no lane needs saturation), or the row takes rint_check. k = 14 for int8
// (|g| < 256), 16 for int4 (|g| < 64: the integer part lands in the upper 16 bits). Checked against the
// divider by bench/exhaustive_rint (mode 2) and the tests.
struct RintFixed {
  float zc = 0.0f;  // RN(z + c)
  float r = 0.0f;   // RN(1 / s)
  std::uint32_t mask = 0;
  bool ok = false;
};
template <int k>
inline constexpr std::int32_t kRintFixedBase =
    static_cast<std::int32_t>(((static_cast<std::uint32_t>(127 + 23 - k) << 23) | (1u << 22)) >> k);
// Called per row: always inlined (see rint_check). ok implies what rint_check(s, z, max(|x_min|, |x_max|))
// requires: s in [2^-126, 2^126), z and x finite, and M + |z| < 2^19 (here |y| < hi + 1/4 and |z| < 2^(22 - k)),
// and that x / s and the row's values are finite.
template <int k>
HWY_INLINE RintFixed rint_fixed(float s, float z, float x_min, float x_max, float lo, float hi) {
  static_assert(k >= 8 && k <= 20);
  RintFixed f;
  if (!(s >= 0x1p-126f && s < 0x1p126f) || !std::isfinite(z) || !std::isfinite(x_min) || !std::isfinite(x_max) ||
      !(x_min <= x_max))
    return f;
  const double m = std::max(std::fabs(static_cast<double>(x_min)), std::fabs(static_cast<double>(x_max))) /
                   static_cast<double>(s);
  // (Called per row: powers of two as products, not std::ldexp.)
  constexpr double kUlp = 1.0 / static_cast<double>(std::uint64_t{1} << k);  // 2^-k
  const double delta = (m + std::fabs(static_cast<double>(z))) * 0x1p-21 + 0x1p-126;
  const double need = delta + kUlp;
  int j = k;
  double h = kUlp;  // 2^-j
  while (j > 2 && !(h > need)) {
    --j;
    h *= 2.0;
  }
  if (!(h > need)) return f;
  const float r = 1.0f / s;
  const double ylo = static_cast<double>(std::fma(x_min, r, z)), yhi = static_cast<double>(std::fma(x_max, r, z));
  if (!(ylo > static_cast<double>(lo) - 0.25 && yhi < static_cast<double>(hi) + 0.25)) return f;
  constexpr double kBinade = static_cast<double>(std::uint64_t{1} << (22 - k));  // 2^(22 - k)
  const double zd = static_cast<double>(z);
  if (!(ylo + 0.5 + h > -(kBinade - 2.0) && yhi + 0.5 + h < kBinade - 2.0 && std::fabs(zd) + 0.5 + h < kBinade - 2.0))
    return f;
  // c = 1.5 * 2^(23 - k) + 1/2 + h is exact; z + c is exact in double, rounded once to float.
  f.zc = static_cast<float>(zd + (3.0 * kBinade + 0.5 + h));
  f.mask = ((1u << k) - 1u) & ~((1u << (k - j + 1)) - 1u);
  f.r = r;
  f.ok = true;
  return f;
}

// Whether kernels use the fast path (where the target has a real FMA). Default: on Intel CPUs, whose
// 512-bit divider retires one quotient vector per 5-10 cycles, while AMD Zen 4 divides a 512-bit vector
// in about the time of 4 of its double-pumped 512-bit FMAs (docs/performance.md). XQUANT_FAST_DIV=0
// (the divider everywhere, no rounding check either) / 1 (the FMA sequence on every CPU) overrides; tests
// force each path with set_fast_div_mode: 0 divider only, 1 FMA sequence only, 2 rounding check (fixed-point
// form where a kernel has one) and FMA sequence, 3 the same with the check's y - rint(y) form, -1 the default. Results are the same bits either way.
inline std::atomic<int>& fast_div_mode_override() {
  static std::atomic<int> mode{-1};
  return mode;
}
inline void set_fast_div_mode(int mode) { fast_div_mode_override().store(mode, std::memory_order_relaxed); }
// Whether CPUID's vendor string is `vendor` (12 characters: "GenuineIntel", "AuthenticAMD"); false off x86.
inline bool cpu_vendor_is(const char* vendor) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, r[3] = {0, 0, 0};
  if (!__get_cpuid(0, &a, &r[0], &r[2], &r[1])) return false;  // the string is in EBX, EDX, ECX
  return std::memcmp(r, vendor, 12) == 0;
#else
  (void)vendor;
  return false;
#endif
}
// An on / off switch from the environment: 0 or 1 when set to exactly that, else -1.
inline int env_switch(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && (e[0] == '0' || e[0] == '1') && e[1] == '\0' ? e[0] - '0' : -1;
}
// The process's defaults, read once: XQUANT_FAST_DIV (env_switch) and the CPU vendor.
inline int fast_div_env() {
  static const int env = env_switch("XQUANT_FAST_DIV");
  return env;
}
inline bool cpu_is_intel() {
  static const bool intel = cpu_vendor_is("GenuineIntel");
  return intel;
}
// Only when asked for (XQUANT_FAST_DIV=1 or set_fast_div_mode(1)), not by default on any CPU: for
// kernels where the models show no gain (ActsULQ forward: memory-bound, and its two quotients need
// a per-vector domain check and ten FMA-class instructions against two divisions).
inline bool fast_div_forced() {
  const int m = fast_div_mode_override().load(std::memory_order_relaxed);
  return m >= 0 ? m >= 1 : fast_div_env() == 1;
}
// The rounding check (rint_check) is used by default on every CPU and target, and when the mode is
// forced to 2; mode 0 (divider only) and mode 1 (FMA division only) turn it off, so tests reach every path.
inline bool rint_check_wanted() {
  const int m = fast_div_mode_override().load(std::memory_order_relaxed);
  return m >= 0 ? m == 2 || m == 3 : fast_div_env() != 0;
}
// The fixed-point form of the check (rint_fixed; AVX-512 dynamic quantization) where the check is used:
// by default, and in mode 2; mode 3 keeps the check in its y - rint(y) form, so tests reach both.
// XQUANT_RINT_FIXED=0 turns it off (measurement); the same bits either way.
inline bool rint_fixed_wanted() {
  const int m = fast_div_mode_override().load(std::memory_order_relaxed);
  if (m >= 0) return m == 2;
  static const bool env_off = [] {
    const char* e = std::getenv("XQUANT_RINT_FIXED");
    return e != nullptr && e[0] == '0' && e[1] == '\0';
  }();
  return !env_off;
}
// Software prefetch of the inputs 2 KiB ahead in the streaming loops (quantize, fake quant forward and
// backward, ActsULQ backward; only calls large enough to stream their output). Measured on 2 threads, % of
// memcpy (docs/performance.md):
//   Intel (Sapphire Rapids-class VM, 2026-12-03): one core's sequential read stream stalls on DRAM latency
//   without it: quantize quint4x2 42 -> 60, fake quant 91 -> 99, fake quant backward 73 -> 80, ActsULQ
//   backward 65 -> 75. On for every loop.
//   AMD Zen 4 (2026-12-04, interleaved processes): quantize quint4x2 1.86-2.01 -> 1.70-1.76 ms (77 -> 87 %);
//   fake quant forward and backward unchanged; ActsULQ backward 20 % slower (43-44 -> 52-53 ms). On for
//   quantize only (quantize_too).
// Off on other CPUs (Arm: not measured). XQUANT_PREFETCH=0 / 1 overrides (measurement); the same bits either way.
inline int prefetch_env() {
  static const int env = env_switch("XQUANT_PREFETCH");
  return env;
}
inline bool cpu_is_amd() {
  static const bool amd = cpu_vendor_is("AuthenticAMD");
  return amd;
}
inline bool prefetch_ahead_wanted(bool quantize_too = false) {
  const int env = prefetch_env();
  if (env >= 0) return env == 1;
  return cpu_is_intel() || (quantize_too && cpu_is_amd());
}
// npu_quantize's loops also prefetch 8 KiB ahead into L2 (PrefetchAhead's l2_too) on AMD: Zen 4, quint4x2
// [4096, 4096] from float32, 2 threads, alternating: 1.74 ms (84-88 % of memcpy) -> 1.17-1.32 ms (109-127 %)
// in the VM's fast memory state, 98-100 -> 103-106 % in the slow one; 8 and 16 KiB measured alike. Not
// measured on Intel (off there).
inline bool prefetch_l2_ahead_wanted() { return prefetch_ahead_wanted(/*quantize_too=*/true) && cpu_is_amd(); }
// The fused rows' second prefetch of the next row (dynamic_quant.cpp FusedRows): into L1, 2 KiB ahead of its
// loads, instead of into L2 4 KiB ahead (the Zen 4 choice). Intel VM (2026-12-07, 2 threads, [8192, 4096],
// two sessions of two interleaved rounds): bf16 -> int8 smooth 3.62-3.67 -> 3.29-3.40 ms, bf16 -> int4
// 3.10-3.18 -> 2.67-2.91, bf16 -> int8 3.43-3.46 -> 2.90-3.08 in the first session and 2.87-2.95 -> 2.85-2.88
// in the second, float32 rows within 2-4 % either way; an L1 prefetch beside the L2 one gained less.
// Intel only (AMD measured the other way, Arm not measured). XQUANT_ROWS_PREFETCH_L1=0 / 1 overrides.
inline bool rows_prefetch_l1_wanted() {
  static const int env = env_switch("XQUANT_ROWS_PREFETCH_L1");
  return env >= 0 ? env == 1 : cpu_is_intel();
}
// Default: Intel (measured) and aarch64 (modelled: every Arm core's divider bounds the dividing loops,
// e.g. llvm-mca tsv110 (Kunpeng 920) fake quant 26 cycles per 4-float vector with the divider against
// about 6 with the sequence; docs/performance-arm.md). AMD Zen 4: the divider.
inline bool fast_div_wanted() {
  const int m = fast_div_mode_override().load(std::memory_order_relaxed);
  if (m >= 0) return m >= 1;
  const int env = fast_div_env();
#if defined(__aarch64__)
  return env != 0;
#else
  return env >= 0 ? env == 1 : cpu_is_intel();
#endif
}

}  // namespace xquant::detail
#endif  // XQUANT_CPU_FASTDIV_ONCE

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#undef XQUANT_HAVE_FAST_DIV
// x86 AVX2 / AVX-512, and every aarch64 target (NEON's fmla / fmls and SVE's fmla / fmls are fused, IEEE
// round to nearest even: the argument above holds as written).
#if (HWY_ARCH_X86 && HWY_NATIVE_FMA && !defined(HWY_DISABLE_BMI2_FMA)) || (HWY_ARCH_ARM_A64 && HWY_NATIVE_FMA)
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

// One correction: correct for the integer dividends fast_div_integral_steps allows (checked exhaustively);
// for other dividends only the second step is proven (bench/exhaustive_div counts both).
template <class V>
HWY_INLINE V DivCoreOneStep(V x, V s, V r) {
  const V q0 = hn::Mul(x, r);
  return hn::NegMulAdd(hn::MulSub(q0, s, x), r, q0);
}

// q / s for q integral or NaN under fast_div_integral_steps(...) == kSteps; NaN passes unchanged (as
// the division returns a quiet NaN operand).
template <int kSteps, class V>
HWY_INLINE V DivIntegral(V q, V s, V r) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kSteps == 1 && sizeof(hn::TFromV<V>) == 4) {
    // The last FMA merge-masked on the non-NaN lanes: NaN lanes keep q0 = q * r, which is q itself (a
    // product with one NaN operand returns that NaN, quieted, sign and payload kept; q is already quiet),
    // as the division returns it. One instruction fewer than the select.
    const __m512 q0 = _mm512_mul_ps(q.raw, r.raw);
    const __mmask16 num = _mm512_cmp_ps_mask(q.raw, q.raw, _CMP_ORD_Q);
    return V{_mm512_mask3_fnmadd_ps(_mm512_fmsub_ps(q0, s.raw, q.raw), r.raw, q0, num)};
  }
#endif
  const V d = kSteps == 1 ? DivCoreOneStep(q, s, r) : DivCore(q, s, r);
  return hn::IfThenElse(hn::IsNaN(q), q, d);
}

// x / s where only sat(rint(x / s + z)) is needed, under fast_div_int: x clamped to [-x_max, x_max]
// first, NaN kept (it becomes 0 later). x86 min / max return their second operand for NaN, so two
// instructions keep it; Arm's Min / Max (fminnm / fmaxnm in Highway) would return the number instead, so
// there the clamp is two selects on ordered compares, false for NaN. kClamp false: the caller knows
// |x| <= x_max (a dynamic quantization row's min / max). Targets without FMA divide.
template <bool kClamp, class V>
HWY_INLINE V DivForInteger(V x, V s, V r, V x_max) {
#if XQUANT_HAVE_FAST_DIV
  if constexpr (kClamp) {
#if HWY_ARCH_X86
    x = hn::Max(hn::Neg(x_max), hn::Min(x_max, x));
#else
    const V lo = hn::Neg(x_max);
    x = hn::IfThenElse(hn::Lt(x, lo), lo, x);
    x = hn::IfThenElse(hn::Gt(x, x_max), x_max, x);
#endif
  }
  return DivCore(x, s, r);
#else
  (void)r;
  (void)x_max;
  return hn::Div(x, s);
#endif
}

// A domain in vector form: |x| bits in [lo, hi] <=> (int32)(|x| bits + (2^31 - lo)) <= INT32_MIN + (hi - lo).
template <class DF>
struct DivDomainV {
  using DI = hn::RebindToSigned<DF>;
#if XQUANT_SIZELESS_VECTORS
  // SVE: no vector members; the two constants are broadcast where they are used.
  std::int32_t bias_s, top_s;
  HWY_INLINE hn::Vec<DI> bias() const { return hn::Set(DI(), bias_s); }
  HWY_INLINE hn::Vec<DI> top() const { return hn::Set(DI(), top_s); }
#else
  hn::Vec<DI> bias_v, top_v;
  HWY_INLINE hn::Vec<DI> bias() const { return bias_v; }
  HWY_INLINE hn::Vec<DI> top() const { return top_v; }
#endif
  explicit DivDomainV(const FastDivDomain& d) {
    const std::uint32_t bias_u = 0x80000000u - d.lo;
    const std::uint32_t top_u = 0x80000000u + (d.hi - d.lo);
    std::int32_t b, t;
    std::memcpy(&b, &bias_u, 4);
    std::memcpy(&t, &top_u, 4);
#if XQUANT_SIZELESS_VECTORS
    bias_s = b;
    top_s = t;
#else
    bias_v = hn::Set(DI(), b);
    top_v = hn::Set(DI(), t);
#endif
  }
};

// Per-lane domain mask (as a mask of DF).
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE auto InDivDomain(DF df, V x, const DivDomainV<DF>& dom) {
  const hn::RebindToSigned<DF> di;
  const auto ax = hn::And(hn::BitCast(di, x), hn::Set(di, 0x7FFFFFFF));
  const auto t = hn::Add(ax, dom.bias());  // wraps: in range <=> t <= top (signed)
  const auto in = hn::Or(hn::Eq(ax, hn::Zero(di)), hn::Not(hn::Gt(t, dom.top())));
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

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The rounding check on two vectors of y (rint_check): q = rint(y) as int32 (round to nearest even,
// |y| < 2^19) and whether every lane of both has |y - rint(y)| < thr. y - rint(y) is exact (see
// rint_check) and so is float(rint(y)); vrangeps (imm 0x0B) keeps the larger of |d1| and |d2| lane by
// lane, so one compare and one mask test cover both vectors. The residual comes from the conversion
// (vcvtps2dq, vcvtdq2ps, vsubps: three single-uop instructions, which the Intel models spread over two
// ports) rather than vreduceps (two uops on one port for the icelake-server model, three cycles on Zen 4).
HWY_INLINE bool RintPairWithin(hn::Vec<hn::ScalableTag<float>> y1, hn::Vec<hn::ScalableTag<float>> y2,
                               hn::Vec<hn::ScalableTag<float>> thr, __m512i& q1, __m512i& q2) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  q1 = _mm512_cvt_roundps_epi32(y1.raw, kNearest);
  q2 = _mm512_cvt_roundps_epi32(y2.raw, kNearest);
  const __m512 d1 = _mm512_sub_ps(y1.raw, _mm512_cvtepi32_ps(q1));
  const __m512 d2 = _mm512_sub_ps(y2.raw, _mm512_cvtepi32_ps(q2));
  const __mmask16 far = _mm512_cmp_ps_mask(_mm512_range_ps(d1, d2, 0x0B), thr.raw, _CMP_NLT_UQ);
  return far == 0;
}
#endif

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // XQUANT_CPU_FASTDIV_INL_H_
