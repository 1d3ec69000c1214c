// float16 / bfloat16 <-> float32 conversions (include/xquant/half.hpp) over every 16-bit pattern, against
// formulas written here independently of the library:
//   - 16 bit -> float: the value rebuilt from sign / exponent / mantissa with std::ldexp;
//   - float -> float16: round-to-nearest-even done in double (as for bfloat16 below) and, where the
//     compiler has _Float16 (GCC 12 on x86; clang 14 has no x86 _Float16), also its own correctly
//     rounded conversion static_cast<_Float16>(f), each checked on hand-computed values;
//   - float -> bfloat16: round-to-nearest-even done in double (scale by the quantum, std::nearbyint,
//     rebuild the bit pattern from frexp).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "xquant/half.hpp"

namespace {

using u16 = std::uint16_t;
using u32 = std::uint32_t;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFltMax = std::numeric_limits<float>::max();

u32 bits(float f) { return std::bit_cast<u32>(f); }
float from_bits(u32 b) { return std::bit_cast<float>(b); }
float next_up(float f) { return std::nextafter(f, kInf); }
float next_down(float f) { return std::nextafter(f, -kInf); }

// ---------------------------------------------------------------------------------------------------
// Independent oracles.

// Value of a binary16 / bfloat16 pattern with `mant_bits` mantissa bits and `exp_bits` exponent bits
// (not for the all-ones exponent).
double small_float_value(u16 h, int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool negative = (h >> 15) != 0;
  const int e = (h >> mant_bits) & ((1 << exp_bits) - 1);
  const int m = h & ((1 << mant_bits) - 1);
  double v;
  if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);  // subnormal: m * 2^(emin - p)
  else
    v = std::ldexp(static_cast<double>((1 << mant_bits) + m), e - bias - mant_bits);
  return negative ? -v : v;
}
double half_value(u16 h) { return small_float_value(h, 5, 10); }
double bf16_value(u16 b) { return small_float_value(b, 8, 7); }

bool half_is_special(u16 h) { return ((h >> 10) & 0x1F) == 0x1F; }
bool bf16_is_special(u16 b) { return ((b >> 7) & 0xFF) == 0xFF; }
bool half_is_nan(u16 h) { return half_is_special(h) && (h & 0x3FF) != 0; }
bool bf16_is_nan(u16 b) { return bf16_is_special(b) && (b & 0x7F) != 0; }

#include "test_half_type.hpp"  // XQ_TEST_HALF_TYPE: the compiler's float16 type
#if defined(XQ_TEST_HALF_TYPE)
#define XQ_TEST_HAVE_FLOAT16 1
u16 compiler_half(float f) { return std::bit_cast<u16>(static_cast<XQ_TEST_HALF_TYPE>(f)); }
#else
#define XQ_TEST_HAVE_FLOAT16 0
#endif

// Round-to-nearest-even of a non-NaN float to float16 (11 significant bits, normal exponents -14..15),
// done in double like reference_bf16 below: divide by the quantum of the input's binade (a power of
// two: exact), std::nearbyint, multiply back, rebuild the bit pattern.
u16 reference_half(float f) {
  const u16 sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return static_cast<u16>(sign | 0x7C00);
  if (a == 0.0) return sign;
  int e = 0;
  (void)std::frexp(a, &e);                        // a = m * 2^e, m in [0.5, 1)
  const int quantum_exp = std::max(e - 11, -24);  // 11 significant bits; subnormal spacing 2^-24
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -quantum_exp)), quantum_exp);
  if (r >= 65536.0) return static_cast<u16>(sign | 0x7C00);  // overflow: Inf
  if (r == 0.0) return sign;
  if (r < std::ldexp(1.0, -14)) return static_cast<u16>(sign | static_cast<u16>(std::ldexp(r, 24)));
  int re = 0;
  const double rm = std::frexp(r, &re);  // r = rm * 2^re, rm in [0.5, 1)
  const int biased = re - 1 + 15;
  const int mant = static_cast<int>(std::ldexp(rm, 11)) - 1024;
  return static_cast<u16>(sign | (biased << 10) | mant);
}

// Round-to-nearest-even of a float to bfloat16 (8 significant bits, float's exponent range), done in
// double: divide by the quantum of the input's binade (exact: a power of two), std::nearbyint (the default
// rounding mode is to nearest, ties to even), multiply back, then rebuild the bit pattern. Finite input.
u16 reference_bf16(float f) {
  const u16 sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0.0) return sign;
  int e = 0;
  (void)std::frexp(a, &e);                        // a = m * 2^e, m in [0.5, 1)
  const int quantum_exp = std::max(e - 8, -133);  // 8 significant bits; subnormal spacing 2^-133
  const double r = std::ldexp(std::nearbyint(std::ldexp(a, -quantum_exp)), quantum_exp);
  if (r >= std::ldexp(1.0, 128)) return static_cast<u16>(sign | 0x7F80);  // overflow: Inf
  if (r == 0.0) return sign;
  if (r < std::ldexp(1.0, -126)) return static_cast<u16>(sign | static_cast<u16>(std::ldexp(r, 133)));
  int re = 0;
  const double rm = std::frexp(r, &re);  // r = rm * 2^re, rm in [0.5, 1)
  const int biased = re - 1 + 127;
  const int mant = static_cast<int>(std::ldexp(rm, 8)) - 128;
  return static_cast<u16>(sign | (biased << 7) | mant);
}

// ---------------------------------------------------------------------------------------------------
// Checks of one input.

// float -> float16 of a non-NaN input equals round-to-nearest-even done in double and (where available)
// the compiler's conversion, bit for bit.
::testing::AssertionResult half_matches(float f) {
  const u16 got = xquant::float_to_half(f);
  const u16 want = reference_half(f);
  if (got != want)
    return ::testing::AssertionFailure() << "float_to_half(" << f << " = 0x" << std::hex << bits(f) << ") = 0x" << got
                                         << " but round-to-nearest-even gives 0x" << want;
#if XQ_TEST_HAVE_FLOAT16
  const u16 compiler = compiler_half(f);
  if (got != compiler)
    return ::testing::AssertionFailure() << "float_to_half(" << f << " = 0x" << std::hex << bits(f) << ") = 0x" << got
                                         << " but the compiler gives 0x" << compiler;
#endif
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult bf16_matches(float f) {
  const u16 got = xquant::float_to_bfloat16(f);
  const u16 want = reference_bf16(f);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "float_to_bfloat16(" << f << " = 0x" << std::hex << bits(f) << ") = 0x" << got
                                       << " but round-to-nearest-even gives 0x" << want;
}

// NaN -> 16 bit: a NaN of the same sign, quiet, whose mantissa keeps the float's top payload bits.
::testing::AssertionResult half_nan_ok(float f) {
  const u16 h = xquant::float_to_half(f);
  const u32 x = bits(f);
  const u16 sign = static_cast<u16>((x >> 16) & 0x8000);
  const u16 top_payload = static_cast<u16>((x >> 13) & 0x1FF);  // float mantissa bits 13..21
  if (half_is_nan(h) && (h & 0x8000) == sign && (h & 0x200) != 0 && (h & 0x1FF) == top_payload)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "float_to_half(NaN 0x" << std::hex << x << ") = 0x" << h;
}

::testing::AssertionResult bf16_nan_ok(float f) {
  const u16 b = xquant::float_to_bfloat16(f);
  const u32 x = bits(f);
  const u16 sign = static_cast<u16>((x >> 16) & 0x8000);
  const u16 top_payload = static_cast<u16>((x >> 16) & 0x3F);  // float mantissa bits 16..21
  if (bf16_is_nan(b) && (b & 0x8000) == sign && (b & 0x40) != 0 && (b & 0x3F) == top_payload)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "float_to_bfloat16(NaN 0x" << std::hex << x << ") = 0x" << b;
}

::testing::AssertionResult half_conversion_ok(float f) { return std::isnan(f) ? half_nan_ok(f) : half_matches(f); }
::testing::AssertionResult bf16_conversion_ok(float f) { return std::isnan(f) ? bf16_nan_ok(f) : bf16_matches(f); }

// Counts failures and reports only the first few, so that a broken conversion does not print millions
// of lines.
class FailureBudget {
 public:
  void check(const ::testing::AssertionResult& r) {
    if (r) return;
    if (++failures_ <= 20) ADD_FAILURE() << r.message();
  }
  ~FailureBudget() { EXPECT_EQ(failures_, 0) << "conversion mismatches in total"; }

 private:
  long failures_ = 0;
};

// ---------------------------------------------------------------------------------------------------
// The oracles themselves, on hand-computed values (so that a broken oracle cannot hide a broken library).

// Hand-computed float -> float16 results, for either oracle.
void expect_half_oracle(u16 (*half)(float), const char* name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(half(1.0f), 0x3C00);
  EXPECT_EQ(half(1.0f + 0x1p-11f), 0x3C00);      // tie, 0x3C00 is even
  EXPECT_EQ(half(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, 0x3C02 is even
  EXPECT_EQ(half(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  EXPECT_EQ(half(65504.0f), 0x7BFF);
  EXPECT_EQ(half(65519.996f), 0x7BFF);  // just below the overflow tie
  EXPECT_EQ(half(65520.0f), 0x7C00);
  EXPECT_EQ(half(kInf), 0x7C00);
  EXPECT_EQ(half(-kFltMax), 0xFC00);
  EXPECT_EQ(half(0x1p-24f), 0x0001);
  EXPECT_EQ(half(0x1p-25f), 0x0000);
  EXPECT_EQ(half(-0x1p-25f), 0x8000);
  EXPECT_EQ(half(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(half(0x1p-14f - 0x1p-25f), 0x0400);  // subnormal tie rounds up to the smallest normal
  EXPECT_EQ(half(0x1p-14f), 0x0400);
  EXPECT_EQ(half(-0.0f), 0x8000);
  EXPECT_EQ(half(-2.0f), 0xC000);
}

TEST(HalfOracle, ReferenceHalfRoundsToNearestEven) {
  ASSERT_EQ(FE_TONEAREST, std::fegetround());
  expect_half_oracle(reference_half, "reference_half");
}

TEST(HalfOracle, CompilerConversionRoundsToNearestEven) {
#if XQ_TEST_HAVE_FLOAT16
  ASSERT_EQ(FE_TONEAREST, std::fegetround());
  expect_half_oracle(compiler_half, "compiler_half");
#else
  GTEST_SKIP() << "this compiler has no _Float16 on this target (clang 14 on x86): float16 results are "
                  "checked against reference_half only";
#endif
}

TEST(HalfOracle, ReferenceBfloat16RoundsToNearestEven) {
  EXPECT_EQ(reference_bf16(1.0f), 0x3F80);
  EXPECT_EQ(reference_bf16(1.0f + 0x1p-8f), 0x3F80);      // tie to even
  EXPECT_EQ(reference_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie to even (up)
  EXPECT_EQ(reference_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(reference_bf16(-3.0f), 0xC040);
  EXPECT_EQ(reference_bf16(kFltMax), 0x7F80);
  EXPECT_EQ(reference_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(reference_bf16(from_bits(0x7F7F8000)), 0x7F80);
  EXPECT_EQ(reference_bf16(from_bits(0x00008000)), 0x0000);  // subnormal tie to even (0)
  EXPECT_EQ(reference_bf16(from_bits(0x00018000)), 0x0002);  // subnormal tie to even (up)
  EXPECT_EQ(reference_bf16(from_bits(0x007FFFFF)), 0x0080);  // rounds up to the smallest normal
  EXPECT_EQ(reference_bf16(-0.0f), 0x8000);
  EXPECT_EQ(half_value(0x3C00), 1.0);
  EXPECT_EQ(half_value(0x0001), 0x1p-24);
  EXPECT_EQ(half_value(0x7BFF), 65504.0);
  EXPECT_EQ(half_value(0x8400), -0x1p-14);
  EXPECT_EQ(bf16_value(0x3F80), 1.0);
  EXPECT_EQ(bf16_value(0x0001), 0x1p-133);
  EXPECT_EQ(bf16_value(0xC040), -3.0);
}

// ---------------------------------------------------------------------------------------------------
// 16 bit -> float, all 65,536 patterns.

TEST(HalfToFloat, AllPatterns) {
  for (u32 i = 0; i <= 0xFFFF; ++i) {
    const u16 h = static_cast<u16>(i);
    const float f = xquant::half_to_float(h);
    const bool negative = (h & 0x8000) != 0;
    if (half_is_special(h)) {
      const u32 mant = h & 0x3FFu;
      if (mant == 0) {
        ASSERT_EQ(bits(f), negative ? 0xFF800000u : 0x7F800000u) << std::hex << h;
      } else {
        ASSERT_TRUE(std::isnan(f)) << std::hex << h;
        ASSERT_EQ(std::signbit(f), negative) << std::hex << h;
        ASSERT_EQ(bits(f) & 0x7FFFFFu, mant << 13) << "payload of 0x" << std::hex << h;
      }
      continue;
    }
    const double want = half_value(h);
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), negative) << std::hex << h;  // -0 included
  }
}

TEST(Bfloat16ToFloat, AllPatterns) {
  for (u32 i = 0; i <= 0xFFFF; ++i) {
    const u16 b = static_cast<u16>(i);
    const float f = xquant::bfloat16_to_float(b);
    const bool negative = (b & 0x8000) != 0;
    if (bf16_is_special(b)) {
      const u32 mant = b & 0x7Fu;
      if (mant == 0) {
        ASSERT_EQ(bits(f), negative ? 0xFF800000u : 0x7F800000u) << std::hex << b;
      } else {
        ASSERT_TRUE(std::isnan(f)) << std::hex << b;
        ASSERT_EQ(std::signbit(f), negative) << std::hex << b;
        ASSERT_EQ(bits(f) & 0x7FFFFFu, mant << 16) << "payload of 0x" << std::hex << b;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), bf16_value(b)) << std::hex << b;
    ASSERT_EQ(std::signbit(f), negative) << std::hex << b;
  }
}

// ---------------------------------------------------------------------------------------------------
// float -> float16.

TEST(FloatToHalf, RoundTripOfEveryHalf) {
  for (u32 i = 0; i <= 0xFFFF; ++i) {
    const u16 h = static_cast<u16>(i);
    const float f = xquant::half_to_float(h);
    if (half_is_nan(h)) {
      const u16 back = xquant::float_to_half(f);
      ASSERT_TRUE(half_is_nan(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
      ASSERT_EQ(back & 0x1FF, h & 0x1FF) << "payload of 0x" << std::hex << h;
      continue;
    }
    ASSERT_EQ(xquant::float_to_half(f), h) << std::hex << h;
    ASSERT_TRUE(half_matches(f));
  }
}

// Midpoints between adjacent float16 values (exact in float: 12 significant bits) round to the even
// neighbour; the floats just above / below round away from / towards the lower neighbour.
// One 16-bit format for the midpoint sweep below.
struct Format16 {
  u16 inf;                                       // bits of +Inf (the first non-finite pattern)
  double beyond_max;                             // the step above the largest finite value
  double (*value)(u16);                          // independent bits -> value
  u16 (*convert)(float);                         // the library's float -> bits
  ::testing::AssertionResult (*matches)(float);  // the library against the independent oracle
};

// Every midpoint between adjacent finite values (exact in float) must round to the even neighbour, the
// float just beyond it to the upper neighbour and the float just inside to the lower one, both signs.
void check_midpoints(const Format16& f) {
  FailureBudget budget;
  long ties = 0;
  for (u32 lo = 0; lo < f.inf; ++lo) {
    const double a = f.value(static_cast<u16>(lo));
    // Above the largest finite value the next step would be beyond_max: that midpoint rounds to "even" = Inf.
    const double b = lo == f.inf - 1u ? f.beyond_max : f.value(static_cast<u16>(lo + 1));
    const double mid_d = (a + b) / 2;
    const float mid = static_cast<float>(mid_d);
    ASSERT_EQ(static_cast<double>(mid), mid_d) << "midpoint not exact in float for 0x" << std::hex << lo;
    const u16 even = (lo & 1u) == 0 ? static_cast<u16>(lo) : static_cast<u16>(lo + 1);
    for (const float sign : {1.0f, -1.0f}) {
      const u16 s = sign < 0 ? 0x8000 : 0;
      const float m = sign * mid;
      budget.check(f.matches(m));
      budget.check(f.matches(next_up(m)));
      budget.check(f.matches(next_down(m)));
      if (f.convert(m) != static_cast<u16>(s | even)) budget.check(::testing::AssertionFailure() << "tie " << m);
      // Away from zero of the midpoint: the upper neighbour; towards zero: the lower one.
      const float above = sign > 0 ? next_up(m) : next_down(m);
      const float below = sign > 0 ? next_down(m) : next_up(m);
      if (f.convert(above) != static_cast<u16>(s | (lo + 1)))
        budget.check(::testing::AssertionFailure() << "just beyond the midpoint " << above);
      if (f.convert(below) != static_cast<u16>(s | lo))
        budget.check(::testing::AssertionFailure() << "just inside the midpoint " << below);
      ++ties;
    }
  }
  EXPECT_EQ(ties, 2L * f.inf);
}

TEST(FloatToHalf, MidpointsAndTheirNeighbours) {
  check_midpoints({0x7C00, 65536.0, half_value, xquant::float_to_half, half_matches});
}

TEST(FloatToHalf, OverflowBoundary) {
  EXPECT_EQ(xquant::float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(xquant::float_to_half(-65504.0f), 0xFBFF);
  EXPECT_EQ(xquant::float_to_half(65519.99f), 0x7BFF);
  EXPECT_EQ(xquant::float_to_half(next_down(65520.0f)), 0x7BFF);
  EXPECT_EQ(xquant::float_to_half(65520.0f), 0x7C00);
  EXPECT_EQ(xquant::float_to_half(-65520.0f), 0xFC00);
  EXPECT_EQ(xquant::float_to_half(65536.0f), 0x7C00);
  EXPECT_EQ(xquant::float_to_half(1e10f), 0x7C00);
  EXPECT_EQ(xquant::float_to_half(kFltMax), 0x7C00);
  EXPECT_EQ(xquant::float_to_half(-kFltMax), 0xFC00);
  EXPECT_EQ(xquant::float_to_half(kInf), 0x7C00);
  EXPECT_EQ(xquant::float_to_half(-kInf), 0xFC00);
  // Every float from 65504 up to 2^16, then every 17th one up to 2^17, against the compiler.
  FailureBudget budget;
  for (u32 x = bits(65504.0f); x <= bits(65536.0f); ++x) {
    budget.check(half_matches(from_bits(x)));
    budget.check(half_matches(-from_bits(x)));
  }
  for (u32 x = bits(65536.0f); x <= bits(131072.0f); x += 17) budget.check(half_matches(from_bits(x)));
}

TEST(FloatToHalf, ZerosInfinitiesAndTiny) {
  EXPECT_EQ(xquant::float_to_half(0.0f), 0x0000);
  EXPECT_EQ(xquant::float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(xquant::float_to_half(0x1p-25f), 0x0000);  // tie between 0 and 2^-24: even = 0
  EXPECT_EQ(xquant::float_to_half(-0x1p-25f), 0x8000);
  EXPECT_EQ(xquant::float_to_half(next_up(0x1p-25f)), 0x0001);
  EXPECT_EQ(xquant::float_to_half(next_down(0x1p-25f)), 0x0000);
  EXPECT_EQ(xquant::float_to_half(0x1p-26f), 0x0000);
  EXPECT_EQ(xquant::float_to_half(-0x1p-40f), 0x8000);
  EXPECT_EQ(xquant::float_to_half(from_bits(0x00000001)), 0x0000);  // float subnormals
  EXPECT_EQ(xquant::float_to_half(from_bits(0x80000001)), 0x8000);
  EXPECT_EQ(xquant::float_to_half(std::numeric_limits<float>::min()), 0x0000);
  EXPECT_EQ(xquant::float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(xquant::float_to_half(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(xquant::float_to_half(next_down(0x1p-14f)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(xquant::float_to_half(0x1p-14f - 0x1p-25f), 0x0400);  // tie between 0x3FF and 0x400: even
  EXPECT_EQ(xquant::float_to_half(0x1p-14f - 0x1p-24f), 0x03FF);
}

// Floats whose magnitude lies in [2^-30, 2^-13] (the whole subnormal range of float16, the region below
// 2^-25 that rounds to zero, and the first normal binade), every 37th pattern; the patterns of the binade
// [2^-25, 2^-24) (rounding to 0 or to the smallest subnormal), every 5th, and every 3rd pattern of [2^-15, 2^-14)
// (rounding up into the smallest normal); and the low float subnormals.
TEST(FloatToHalf, SubnormalRange) {
  FailureBudget budget;
  for (u32 x = bits(0x1p-30f); x <= bits(0x1p-13f); x += 37) {
    budget.check(half_matches(from_bits(x)));
    budget.check(half_matches(from_bits(x | 0x80000000u)));
  }
  for (u32 x = bits(0x1p-25f); x < bits(0x1p-24f); x += 5) budget.check(half_matches(from_bits(x)));
  for (u32 x = bits(0x1p-15f); x < bits(0x1p-14f); x += 3) budget.check(half_matches(-from_bits(x)));
  for (u32 x = 0; x < 0x10000; ++x) budget.check(half_matches(from_bits(x)));  // float subnormals
}

TEST(FloatToHalf, NaNsStayNaNWithTheirSign) {
  const u32 patterns[] = {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7FC02000u,
                          0x7F802000u, 0x7FA00000u, 0x7F801FFFu, 0x7FD55555u, 0x7FAAAAAAu};
  for (const u32 p : patterns) {
    EXPECT_TRUE(half_nan_ok(from_bits(p)));
    EXPECT_TRUE(half_nan_ok(from_bits(p | 0x80000000u)));
  }
  EXPECT_EQ(xquant::float_to_half(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(xquant::float_to_half(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  // A signaling NaN whose payload lies only in the dropped bits still gives a NaN (not Inf).
  EXPECT_EQ(xquant::float_to_half(from_bits(0x7F800001u)), 0x7E00);
  EXPECT_EQ(xquant::float_to_half(from_bits(0xFF800001u)), 0xFE00);
}

TEST(FloatToHalf, RandomPatterns) {
  FailureBudget budget;
  std::mt19937 rng(20240611u);
  // Uniform over all bit patterns (mostly far outside float16's range) ...
  for (int i = 0; i < 2000000; ++i) budget.check(half_conversion_ok(from_bits(static_cast<u32>(rng()))));
  // ... and with the exponent restricted to [2^-27, 2^17), where float16 rounding actually happens.
  std::uniform_int_distribution<u32> exponent(127 - 27, 127 + 16);
  for (int i = 0; i < 2000000; ++i) {
    const u32 x = (static_cast<u32>(rng()) & 0x807FFFFFu) | (exponent(rng) << 23);
    budget.check(half_matches(from_bits(x)));
  }
}

// ---------------------------------------------------------------------------------------------------
// float -> bfloat16.

TEST(FloatToBfloat16, RoundTripOfEveryBfloat16) {
  for (u32 i = 0; i <= 0xFFFF; ++i) {
    const u16 b = static_cast<u16>(i);
    const float f = xquant::bfloat16_to_float(b);
    if (bf16_is_nan(b)) {
      const u16 back = xquant::float_to_bfloat16(f);
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << b;
      ASSERT_EQ(back & 0x8000, b & 0x8000) << std::hex << b;
      ASSERT_EQ(back & 0x3F, b & 0x3F) << "payload of 0x" << std::hex << b;
      continue;
    }
    ASSERT_EQ(xquant::float_to_bfloat16(f), b) << std::hex << b;
    ASSERT_TRUE(bf16_matches(f));
  }
}

TEST(FloatToBfloat16, MidpointsAndTheirNeighbours) {
  check_midpoints({0x7F80, std::ldexp(1.0, 128), bf16_value, xquant::float_to_bfloat16, bf16_matches});
}

TEST(FloatToBfloat16, OverflowToInfinity) {
  EXPECT_EQ(xquant::float_to_bfloat16(kFltMax), 0x7F80);
  EXPECT_EQ(xquant::float_to_bfloat16(-kFltMax), 0xFF80);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x7F7F8000u)), 0x7F80);  // tie above the largest finite
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x7F7F0000u)), 0x7F7F);
  EXPECT_EQ(xquant::float_to_bfloat16(kInf), 0x7F80);
  EXPECT_EQ(xquant::float_to_bfloat16(-kInf), 0xFF80);
  FailureBudget budget;
  for (u32 x = 0x7F000000u; x < 0x7F800000u; ++x) {  // the whole top binade of float
    budget.check(bf16_matches(from_bits(x)));
    budget.check(bf16_matches(from_bits(x | 0x80000000u)));
  }
}

TEST(FloatToBfloat16, ZerosAndSubnormals) {
  EXPECT_EQ(xquant::float_to_bfloat16(0.0f), 0x0000);
  EXPECT_EQ(xquant::float_to_bfloat16(-0.0f), 0x8000);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x00000001u)), 0x0000);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x80000001u)), 0x8000);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x00008001u)), 0x0001);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x007FFFFFu)), 0x0080);
  FailureBudget budget;
  // All float subnormals and the first normal binade, every 3rd pattern; all patterns up to 2^-140.
  for (u32 x = 0; x < 0x01000000u; x += 3) {
    budget.check(bf16_matches(from_bits(x)));
    budget.check(bf16_matches(from_bits(x | 0x80000000u)));
  }
  for (u32 x = 0; x < 0x00080000u; ++x) budget.check(bf16_matches(from_bits(x)));
}

TEST(FloatToBfloat16, NaNsStayNaNWithTheirSign) {
  const u32 patterns[] = {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7F810000u,
                          0x7F80FFFFu, 0x7FA00000u, 0x7FD55555u, 0x7FAAAAAAu, 0x7FFF0000u};
  for (const u32 p : patterns) {
    EXPECT_TRUE(bf16_nan_ok(from_bits(p)));
    EXPECT_TRUE(bf16_nan_ok(from_bits(p | 0x80000000u)));
  }
  EXPECT_EQ(xquant::float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(xquant::float_to_bfloat16(-std::numeric_limits<float>::quiet_NaN()), 0xFFC0);
  // A NaN whose payload is only in the dropped bits must not turn into Inf, nor carry into the sign.
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0x7FFFFFFFu)), 0x7FFF);
  EXPECT_EQ(xquant::float_to_bfloat16(from_bits(0xFFFFFFFFu)), 0xFFFF);
}

TEST(FloatToBfloat16, RandomPatterns) {
  FailureBudget budget;
  std::mt19937 rng(7031u);
  for (int i = 0; i < 3000000; ++i) budget.check(bf16_conversion_ok(from_bits(static_cast<u32>(rng()))));
  // Low 16 bits concentrated near the rounding boundary (0x8000 +- a little).
  std::uniform_int_distribution<int> near(-3, 3);
  for (int i = 0; i < 500000; ++i) {
    const u32 x = (static_cast<u32>(rng()) & 0xFFFF0000u) | static_cast<u32>(0x8000 + near(rng));
    budget.check(bf16_conversion_ok(from_bits(x)));
  }
}

}  // namespace
