// The fast exact division (src/cpu/fastdiv-inl.h) on every compiled and supported SIMD target: bit for bit
// the IEEE quotient at the edges of its domain (zeros, subnormal, tiny, huge, non-finite dividends,
// quotients near the subnormal and overflow thresholds, exact quotients and rounding ties of the
// quotient's last bit), the domain bounds themselves, the divisors it refuses, and vectors mixing lanes
// inside and outside the domain (the whole vector is then divided). The exhaustive sweep over every
// float32 dividend is bench/exhaustive_div.cpp (minutes, not a unit test).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test_fastdiv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/convert.hpp"
#include "cpu/fastdiv-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// out[i] = DivExact(x[i], s[i]) with per-lane r = RN(1 / s[i]) and the domain of [s_min, s_max] (the
// caller checked fast_div_domain(...).ok); in[i] = InDivDomain of x[i]; n a multiple of the lane count.
void DivArrays(const float* x, const float* s, float s_min, float s_max, std::size_t n, float* out, std::uint8_t* in) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const DivDomainV<DF> dom(fast_div_domain(s_min, s_max));
  for (std::size_t i = 0; i < n; i += N) {
    const auto xv = hn::LoadU(df, x + i), sv = hn::LoadU(df, s + i);
    const auto rv = hn::Div(hn::Set(df, 1.0f), sv);
    hn::StoreU(DivExact(df, xv, sv, rv, dom), df, out + i);
    const auto m = InDivDomain(df, xv, dom);
    for (std::size_t k = 0; k < N; ++k) in[i + k] = 0;
    HWY_ALIGN float mf[64];
    hn::Store(hn::IfThenElseZero(m, hn::Set(df, 1.0f)), df, mf);
    for (std::size_t k = 0; k < N; ++k) in[i + k] = mf[k] != 0.0f;
  }
}

// Raw two-step sequence for lanes known to be in the domain (no fallback), to check it alone.
void CoreArrays(const float* x, const float* s, std::size_t n, float* out) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t i = 0; i < n; i += N) {
    const auto xv = hn::LoadU(df, x + i), sv = hn::LoadU(df, s + i);
    hn::StoreU(DivCore(xv, sv, hn::Div(hn::Set(df, 1.0f), sv)), df, out + i);
  }
}

// out[i] = DivIntegral<steps>(q[i], s) (q integral or NaN), per fast_div_integral_steps.
void IntegralArrays(const float* q, float s, int steps, std::size_t n, float* out) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const auto sv = hn::Set(df, s), rv = hn::Set(df, 1.0f / s);
  for (std::size_t i = 0; i < n; i += N) {
    const auto qv = hn::LoadU(df, q + i);
    hn::StoreU(steps == 1 ? DivIntegral<1>(qv, sv, rv) : DivIntegral<2>(qv, sv, rv), df, out + i);
  }
}

// out[i] = rint(DivForInteger(x[i], s) + z) clamped to [-2^31, 2^31] (the integer the kernels derive);
// NaN -> 0. Only where the target has the FMA sequence.
void IntegerArrays(const float* x, float s, float z, float x_max, std::size_t n, double* out) {
#if XQUANT_HAVE_FAST_DIV
  using DF = hn::ScalableTag<float>;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const auto sv = hn::Set(df, s), rv = hn::Set(df, 1.0f / s), xm = hn::Set(df, x_max), zv = hn::Set(df, z);
  HWY_ALIGN float v[64];
  for (std::size_t i = 0; i < n; i += N) {
    hn::Store(hn::Add(DivForInteger<true>(hn::LoadU(df, x + i), sv, rv, xm), zv), df, v);
    for (std::size_t k = 0; k < N; ++k) {
      const double r = std::isnan(v[k]) ? 0.0 : std::nearbyint(static_cast<double>(v[k]));
      out[i + k] = std::max(-0x1p31, std::min(0x1p31, r));
    }
  }
#else
  (void)x;
  (void)s;
  (void)z;
  (void)x_max;
  (void)n;
  (void)out;
#endif
}

// float16 fake quantization's f16(q / s) against f16(q * RN(1 / s)): for every float16 scale bit pattern
// in [s_first, s_last] (every s_stride-th) and every q in qs (nq a multiple of the lane count), counts the
// pairs whose float16 results differ; the first such pair goes to first_s / first_q. Lanes whose float32
// values agree need no conversion.
std::int64_t F16ProductMisses(std::uint16_t s_first, std::uint16_t s_last, std::uint32_t s_stride, const float* qs,
                              std::size_t nq, float* first_s, float* first_q) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  HWY_ALIGN float a[64], b[64];
  std::int64_t misses = 0;
  for (std::uint32_t sb = s_first; sb <= s_last; sb += s_stride) {
    const float s = hd_half_to_float(static_cast<std::uint16_t>(sb));
    const auto sv = hn::Set(df, s), rv = hn::Set(df, 1.0f / s);
    for (std::size_t i = 0; i < nq; i += N) {
      const auto qv = hn::LoadU(df, qs + i);
      const auto pv = hn::Mul(qv, rv), dv = hn::Div(qv, sv);
      if (hn::AllTrue(df, hn::Eq(pv, dv))) continue;
      hn::Store(pv, df, a);
      hn::Store(dv, df, b);
      for (std::size_t k = 0; k < N; ++k) {
        if (hd_float_to_half(a[k]) == hd_float_to_half(b[k])) continue;
        if (misses++ == 0) {
          *first_s = s;
          *first_q = qs[i + k];
        }
      }
    }
  }
  return misses;
}

std::size_t LaneCount() { return hn::Lanes(hn::ScalableTag<float>()); }
bool FastDivOn() { return kHaveFastDiv; }

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include "hwy/targets.h"
#include "test_targets.hpp"

namespace xquant::detail {
HWY_EXPORT(DivArrays);
HWY_EXPORT(CoreArrays);
HWY_EXPORT(IntegralArrays);
HWY_EXPORT(IntegerArrays);
HWY_EXPORT(F16ProductMisses);
HWY_EXPORT(LaneCount);
HWY_EXPORT(FastDivOn);
}  // namespace xquant::detail

namespace {
using xquant::detail::fast_div_domain;
using xquant::detail::FastDivDomain;

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
float up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

// The divisors under test: ordinary, near powers of two, the largest significands, the range ends.
std::vector<float> test_scales() {
  return {1.0f,
          3.0f,
          0.1f,
          127.0f / 3.0f,
          255.0f,
          1e-12f,
          0.03f,
          from_bits(0x3FFFFFFFu),
          from_bits(0x3FFFFFFCu),
          from_bits(0x3F800001u),
          0x1p-126f,
          from_bits(0x00FFFFFFu),
          from_bits(0x7E7FFFFFu),
          1e30f,
          1e-30f,
          0x1p100f};
}

// Dividends at the domain's edges for divisor s, plus the special values.
std::vector<float> edge_dividends(float s) {
  const FastDivDomain d = fast_div_domain(s, s);
  const float lo = from_bits(d.lo), hi = from_bits(d.hi);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {0.0f,
                          lo,
                          up(lo),
                          down(lo),
                          hi,
                          down(hi),
                          up(hi),
                          0x1p-100f,
                          down(0x1p-100f),
                          1e-45f,
                          1e-40f,
                          down(0x1p-126f),
                          0x1p-126f,
                          up(0x1p-126f),
                          std::numeric_limits<float>::max(),
                          inf,
                          nan,
                          from_bits(0x7FA00000u) /* signalling NaN */,
                          1.0f,
                          s,
                          3.0f * s,
                          0.5f * s};
  // quotients near the subnormal threshold and near overflow (only where representable)
  for (float q : {0x1p-126f, up(0x1p-126f), down(0x1p-126f), 0x1p-125f, down(0x1p-125f), 0x1p126f, up(0x1p126f),
                  0x1p127f, std::numeric_limits<float>::max()}) {
    const double xd = static_cast<double>(q) * static_cast<double>(s);
    if (std::isfinite(xd) && std::abs(xd) <= static_cast<double>(std::numeric_limits<float>::max())) {
      const float x = static_cast<float>(xd);
      v.insert(v.end(), {x, up(x), down(x)});
    }
  }
  // rounding ties of rint(x / s): x / s == k + 0.5 exactly where k + 0.5 times s is exact
  for (float h : {0.5f, 1.5f, 2.5f, 126.5f, 127.5f, 7.5f, 8.5f}) {
    const double xd = static_cast<double>(h) * static_cast<double>(s);
    const float x = static_cast<float>(xd);
    if (static_cast<double>(x) == xd) v.insert(v.end(), {x, up(x), down(x)});
  }
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

template <class F>
void for_each_target(F&& f) {
  for (std::int64_t target : xqtest::tested_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    f(hwy::TargetName(target));
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(FastDiv, DomainRefusesDivisorsOutsideTheProof) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {-3.0f, -0.0f, 0.0f, 1e-40f, down(0x1p-126f), 0x1p126f, 3e38f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN()})
    EXPECT_FALSE(fast_div_domain(s, s).ok) << "divisor " << s;
  for (float s : {0x1p-126f, down(0x1p126f), 1.0f, 1e-12f}) EXPECT_TRUE(fast_div_domain(s, s).ok) << "divisor " << s;
  EXPECT_FALSE(fast_div_domain(2.0f, 1.0f).ok);  // s_min > s_max
}

TEST(FastDiv, DomainBounds) {
  // x in [max(2^-100, 2^-124 s_max), min(FLT_MAX, 2^125 s_min)]
  FastDivDomain d = fast_div_domain(1.0f, 1.0f);
  EXPECT_EQ(d.lo, bits(0x1p-100f));
  EXPECT_EQ(d.hi, bits(0x1p125f));
  d = fast_div_domain(0x1p-126f, 0x1p100f);
  EXPECT_EQ(d.lo, bits(0x1p-24f));
  EXPECT_EQ(d.hi, bits(0x1p-1f));
  d = fast_div_domain(0x1p120f, 0x1p120f);
  EXPECT_EQ(d.hi, bits(std::numeric_limits<float>::max()));
}

TEST(FastDiv, EdgeDividendsAreBitExactOnEveryTarget) {
  for_each_target([&](const char* target) {
    const std::size_t N = HWY_DYNAMIC_DISPATCH(xquant::detail::LaneCount)();
    for (float s : test_scales()) {
      const FastDivDomain d = fast_div_domain(s, s);
      ASSERT_TRUE(d.ok) << s;
      const float lo = from_bits(d.lo), hi = from_bits(d.hi);
      // every edge value alone in a vector of in-domain lanes (so a fast-path vector and a fallback vector
      // are both exercised), and all of them packed together
      std::vector<float> xs;
      for (float e : edge_dividends(s)) {
        for (std::size_t k = 0; k < N; ++k) xs.push_back(k == N / 2 ? e : (k % 2 ? lo : s));
      }
      for (float e : edge_dividends(s)) xs.push_back(e);
      while (xs.size() % N) xs.push_back(1.0f);
      std::vector<float> ss(xs.size(), s), out(xs.size());
      std::vector<std::uint8_t> in(xs.size());
      HWY_DYNAMIC_DISPATCH(xquant::detail::DivArrays)(xs.data(), ss.data(), s, s, xs.size(), out.data(), in.data());
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const float ref = xs[i] / s;
        EXPECT_EQ(bits(out[i]), bits(ref))
            << target << ": " << xs[i] << " / " << s << " gave " << out[i] << ", IEEE " << ref;
        const float a = std::abs(xs[i]);
        const bool expect_in = a == 0.0f || (a >= lo && a <= hi);
        EXPECT_EQ(in[i] != 0, expect_in) << target << ": domain of " << xs[i] << " for divisor " << s;
      }
    }
  });
}

TEST(FastDiv, TwoStepSequenceAloneInsideTheDomain) {
  if (!HWY_DYNAMIC_DISPATCH(xquant::detail::FastDivOn)())
    GTEST_SKIP() << "the dispatched target has no FMA: it always divides";
  // Random divisors over the whole allowed range, random dividends inside their domain (with exact zeros).
  std::mt19937 rng(2024);
  for_each_target([&](const char* target) {
    if (!HWY_DYNAMIC_DISPATCH(xquant::detail::FastDivOn)()) return;  // SSE4 / SSSE3 / scalar: no FMA sequence
    constexpr std::size_t n = 1 << 16;
    std::vector<float> xs(n), ss(n), out(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float s = from_bits(static_cast<std::uint32_t>((1u + rng() % 252u) << 23 | (rng() & 0x7FFFFFu)));
      const FastDivDomain d = fast_div_domain(s, s);
      const float lo = std::log2(from_bits(d.lo)), hi = std::log2(from_bits(d.hi));
      const float e = lo + static_cast<float>(rng() % 1000u) / 1000.0f * (hi - lo);
      float x = std::ldexp(1.0f + static_cast<float>(rng() & 0x7FFFFFu) * 0x1p-23f, static_cast<int>(std::floor(e)));
      if (std::abs(x) < from_bits(d.lo) || std::abs(x) > from_bits(d.hi)) x = from_bits(d.lo);
      if (rng() % 16 == 0) x = 0.0f;
      xs[i] = (rng() & 1) ? -x : x;
      ss[i] = s;
    }
    HWY_DYNAMIC_DISPATCH(xquant::detail::CoreArrays)(xs.data(), ss.data(), n, out.data());
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(bits(out[i]), bits(xs[i] / ss[i])) << target << ": " << xs[i] << " / " << ss[i];
  });
}

TEST(FastDiv, PerLaneDivisorsShareOneDomain) {
  // Divisors varying per lane (per-channel scales) use the domain of [s_min, s_max].
  for_each_target([&](const char* target) {
    const std::size_t N = HWY_DYNAMIC_DISPATCH(xquant::detail::LaneCount)();
    const float s_min = 1e-3f, s_max = 1e6f;
    std::vector<float> xs, ss;
    std::mt19937 rng(5);
    for (std::size_t i = 0; i < 64 * N; ++i) {
      ss.push_back(i % 3 == 0 ? s_min : i % 3 == 1 ? s_max : 1.5f);
      const float edges[] = {0.0f, -0.0f, 1e-40f, 0x1p-100f, 1e-30f, 3e38f, 1.0f, -2.5f, 0.1f};
      xs.push_back(rng() % 4 == 0 ? edges[rng() % 9]
                                  : static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 0.25f);
    }
    std::vector<float> out(xs.size());
    std::vector<std::uint8_t> in(xs.size());
    HWY_DYNAMIC_DISPATCH(xquant::detail::DivArrays)
    (xs.data(), ss.data(), s_min, s_max, xs.size(), out.data(), in.data());
    for (std::size_t i = 0; i < xs.size(); ++i)
      EXPECT_EQ(bits(out[i]), bits(xs[i] / ss[i])) << target << ": " << xs[i] << " / " << ss[i];
  });
}

TEST(FastDiv, IntegralDividendsOneAndTwoSteps) {
  // fake quantization's q / scale: every integer of a 13-bit range and NaN, for divisors that allow it
  std::vector<float> q;
  for (int k = -4096; k <= 4096; ++k) q.push_back(static_cast<float>(k));
  q.push_back(-0.0f);
  q.push_back(std::numeric_limits<float>::quiet_NaN());
  q.push_back(-std::numeric_limits<float>::quiet_NaN());
  q.push_back(from_bits(0x7FC12345u));
  while (q.size() % 64) q.push_back(1.0f);
  for_each_target([&](const char* target) {
    if (!HWY_DYNAMIC_DISPATCH(xquant::detail::FastDivOn)()) return;
    for (float s : {127.0f / 3.0f, 0.1f, 1e-20f, 1e20f, from_bits(0x3FFFFFFFu), 7.0f / 2.75f, 0x1p-93f}) {
      const int steps = xquant::detail::fast_div_integral_steps(s, s, 4096.0f);
      ASSERT_EQ(steps, 1) << s;
      for (int st : {1, 2}) {
        std::vector<float> out(q.size());
        HWY_DYNAMIC_DISPATCH(xquant::detail::IntegralArrays)(q.data(), s, st, q.size(), out.data());
        for (std::size_t i = 0; i < q.size(); ++i)
          ASSERT_EQ(bits(out[i]), bits(q[i] / s)) << target << " steps " << st << ": " << q[i] << " / " << s;
      }
    }
  });
  EXPECT_EQ(xquant::detail::fast_div_integral_steps(1.0f, 1.0f, 0x1p20f), 2);
  EXPECT_EQ(xquant::detail::fast_div_integral_steps(0x1p-120f, 0x1p-120f, 4096.0f), 0);  // 4096 / s beyond the domain
  EXPECT_EQ(xquant::detail::fast_div_integral_steps(0x1p125f, 0x1p125f, 127.0f), 0);     // 1 / s below the domain
}

TEST(FastDiv, Float16QuotientsByProduct) {
  // The claim behind kMulF16 (fastdiv-inl.h): every positive finite float16 scale (subnormals included)
  // against every float16 integer (1 .. 65504; negative q mirrors positive q exactly), on the best target
  // (IEEE products and quotients are the same on every target).
  // About 0.6 s on a Zen 4 core; sanitizer builds and aarch64 (run under qemu) take every 61st scale.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !(defined(__x86_64__) || defined(_M_X64))
  const std::uint32_t stride = 61;
  std::printf("note: every %u-th float16 scale (sanitizer or emulated build; the x86-64 release suite runs all)\n",
              stride);
#else
  const std::uint32_t stride = 1;
#endif
  std::vector<float> qs;
  for (std::uint32_t b = 0x3C00; b < 0x7C00; ++b) {  // float16 1 .. 65504
    const float q = xquant::detail::hd_half_to_float(static_cast<std::uint16_t>(b));
    if (q == std::floor(q)) qs.push_back(q);
  }
  ASSERT_EQ(qs.size(), 7167u);
  const std::size_t nq = qs.size();
  while (qs.size() % 64) qs.push_back(1.0f);
  float s = 0, q = 0;
  EXPECT_EQ(HWY_DYNAMIC_DISPATCH(xquant::detail::F16ProductMisses)(0x0001, 0x7BFF, stride, qs.data(), qs.size(), &s, &q), 0)
      << "first miss: " << q << " / " << s << " (" << nq << " integers)";
  // q must be a float16 value: 19131 lies between two (float16 steps are 16 there) and misses for
  // s = 0.4375 (float16 0x3700).
  std::vector<float> off(64, 19131.0f);
  EXPECT_GT(HWY_DYNAMIC_DISPATCH(xquant::detail::F16ProductMisses)(0x3700, 0x3700, 1, off.data(), off.size(), &s, &q), 0);
}

TEST(FastDiv, IntegerResultsThroughTheClamp) {
  // sat(rint(x / s + z)) from the clamped FMA quotient equals the one from the division, for dividends
  // below the domain, beyond x_max, infinite and NaN.
  const float inf = std::numeric_limits<float>::infinity();
  for_each_target([&](const char* target) {
    if (!HWY_DYNAMIC_DISPATCH(xquant::detail::FastDivOn)()) return;
    for (float s : {1e-12f, 0x1p-60f, 0.03f, 1.0f, 3e6f, 0x1p60f}) {
      for (float z : {0.0f, 0.5f, -0.5f, 1e-30f, 3.0f, -128.0f, 0x1p33f, -0x1p33f}) {
        const auto f = xquant::detail::fast_div_int(s, s, std::abs(z));
        ASSERT_TRUE(f.ok) << s << " " << z;
        std::vector<float> xs = {0.0f,
                                 -0.0f,
                                 1e-45f,
                                 -1e-40f,
                                 1e-38f,
                                 0x1p-100f,
                                 down(0x1p-100f),
                                 0.5f * s,
                                 1.5f * s,
                                 -2.5f * s,
                                 127.5f * s,
                                 f.x_max,
                                 up(f.x_max),
                                 -up(f.x_max),
                                 3.4e38f,
                                 -3.4e38f,
                                 inf,
                                 -inf,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 s * 1e-30f,
                                 -s * 1e-30f};
        while (xs.size() % 64) xs.push_back(1.0f);
        std::vector<double> out(xs.size());
        HWY_DYNAMIC_DISPATCH(xquant::detail::IntegerArrays)(xs.data(), s, z, f.x_max, xs.size(), out.data());
        for (std::size_t i = 0; i < xs.size(); ++i) {
          const float v = xs[i] / s + z;
          const double ref =
              std::isnan(v) ? 0.0 : std::max(-0x1p31, std::min(0x1p31, std::nearbyint(static_cast<double>(v))));
          ASSERT_EQ(out[i], ref) << target << ": " << xs[i] << " / " << s << " + " << z;
        }
      }
    }
  });
  EXPECT_FALSE(xquant::detail::fast_div_int(0x1p-61f, 0x1p-61f, 0.0f).ok);  // tiny dividends no longer vanish
  EXPECT_FALSE(xquant::detail::fast_div_int(1.0f, 0x1p61f, 0.0f).ok);       // scales too far apart
  EXPECT_FALSE(xquant::detail::fast_div_int(1.0f, 1.0f, 0x1p34f).ok);       // zero point beyond 2^33
  EXPECT_FALSE(xquant::detail::fast_div_int(1e30f, 1e30f, 0.0f).ok);        // x_max / s below 2^34
}

}  // namespace
#endif  // HWY_ONCE
