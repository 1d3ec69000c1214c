// The float32 -> float8 conversion of src/core/float8.hpp (e4m3fn and e5m2, with and without saturation)
// against an independent formula: every rounding case in the default run (every sign, exponent and high
// mantissa, the low bits on and around every tie), every one of the 2^32 float32 bit patterns with
// XQUANT_FLOAT8_EXHAUSTIVE=1; and the exact float8 -> float32 decoding of all 256 codes of each format.
//
// The independent formula works on values, not bits: the 256 codes of a format decoded by hand from the
// OCP definition (sign, exponent, mantissa as powers of two in double), and for each float32 the nearest
// finite code found by binary search in the sorted non-negative values, ties to the code with an even
// mantissa; a value that rounds past the largest finite one is out of range. Comparing bits also checks
// the sign of zero and of NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/float8.hpp"

namespace {

using xquant::DType;

struct Format {
  DType dt;
  int mant_bits, bias;
  bool ieee_inf;  // e5m2: exponent all ones is Inf / NaN; e4m3fn: only S.1111.111 is NaN
};
constexpr Format kE4M3{DType::float8_e4m3fn, 3, 7, false};
constexpr Format kE5M2{DType::float8_e5m2, 2, 15, true};

// The value of a code from the definition, or NaN; +-Inf for e5m2's infinities.
double decode(const Format& f, unsigned code) {
  const unsigned mag = code & 0x7Fu;
  const int e = static_cast<int>(mag >> f.mant_bits);
  const unsigned m = mag & ((1u << f.mant_bits) - 1u);
  const int emax_field = (1 << (7 - f.mant_bits)) - 1;
  double v;
  if (f.ieee_inf && e == emax_field) {
    v = m == 0 ? INFINITY : NAN;
  } else if (!f.ieee_inf && mag == 0x7Fu) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), e - f.bias);
  }
  return (code & 0x80u) ? -v : v;
}

struct Table {
  // Finite non-negative values, ascending (index == code), then one virtual value: the largest finite plus
  // its quantum, the value the next code would have with an unbounded exponent. A value that rounds to it
  // (or lies beyond it) is out of range.
  std::vector<double> vals;
  unsigned max_code, over_code;
};
Table table_of(const Format& f) {
  Table t;
  for (unsigned c = 0; c < 0x80u; ++c) {
    const double v = decode(f, c);
    if (!std::isfinite(v)) break;
    t.vals.push_back(v);
  }
  t.max_code = static_cast<unsigned>(t.vals.size() - 1);
  const double quantum = t.vals[t.max_code] - t.vals[t.max_code - 1];
  t.vals.push_back(t.vals[t.max_code] + quantum);
  t.over_code = f.ieee_inf ? 0x7Cu : 0x7Fu;
  return t;
}

unsigned oracle(const Table& t, float x, bool saturate) {
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  if (std::isnan(x)) return sign | 0x7Fu;
  const double a = std::fabs(static_cast<double>(x));
  const unsigned over = sign | (saturate ? t.max_code : t.over_code);
  if (a >= t.vals.back()) return over;  // +-Inf included
  // The nearest of vals, ties to the even code (the even mantissa).
  const auto it = std::lower_bound(t.vals.begin(), t.vals.end(), a);
  unsigned code = static_cast<unsigned>(it - t.vals.begin());
  if (*it != a && code > 0) {
    const unsigned lo = code - 1;
    const double dlo = a - t.vals[lo], dhi = t.vals[code] - a;
    if (dlo < dhi || (dlo == dhi && (lo & 1u) == 0)) code = lo;
  }
  return code > t.max_code ? over : sign | code;
}

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Checks float32 patterns u = (hi << 12) | lo for every hi in [0, 2^20) and lo in `lows`; returns the
// number of mismatches (the first one in *first).
std::uint64_t sweep(const Format& f, const Table& t, const std::vector<std::uint32_t>& lows, std::uint32_t* first) {
  std::atomic<std::uint64_t> bad{0};
  std::atomic<std::uint32_t> first_bad{0};
#pragma omp parallel for schedule(static)
  for (std::int64_t hi = 0; hi < (std::int64_t{1} << 20); ++hi) {
    std::uint64_t local_bad = 0;
    for (std::uint32_t lo : lows) {
      const std::uint32_t u = (static_cast<std::uint32_t>(hi) << 12) | lo;
      const float x = bits_float(u);
      for (bool sat : {false, true}) {
        if (xquant::detail::hd_float_to_float8(x, f.dt, sat) != oracle(t, x, sat)) {
          if (local_bad == 0) first_bad.store(u);
          ++local_bad;
        }
      }
    }
    bad += local_bad;
  }
  *first = first_bad.load();
  return bad.load();
}

// Every sign, exponent and top 11 mantissa bits, with the low 12 bits at the values that decide a rounding:
// both formats drop at least 20 mantissa bits, so the half-way bit (bit 19 or above) and the sticky bits
// between it and bit 12 are enumerated, and these low parts put a value exactly on, just below and just
// above every tie. 16.8M values per format and mode.
void sweep_structured(const Format& f) {
  const std::vector<std::uint32_t> lows{0x000u, 0x001u, 0x002u, 0x3FFu, 0x400u, 0x7FFu, 0x800u, 0x801u, 0xFFEu, 0xFFFu};
  std::uint32_t first = 0;
  EXPECT_EQ(sweep(f, table_of(f), lows, &first), 0u) << "first mismatch at float32 bits 0x" << std::hex << first;
}

// All 2^32 float32 bit patterns (about a minute on 16 cores, far longer on a loaded 2-core machine): run with
// XQUANT_FLOAT8_EXHAUSTIVE=1.
void sweep_exhaustive(const Format& f) {
  if (std::getenv("XQUANT_FLOAT8_EXHAUSTIVE") == nullptr)
    GTEST_SKIP() << "the 2^32 sweep runs with XQUANT_FLOAT8_EXHAUSTIVE=1 (the structured sweep covers every "
                    "rounding case in the default run)";
  std::vector<std::uint32_t> lows(4096);
  for (std::uint32_t i = 0; i < 4096; ++i) lows[i] = i;
  std::uint32_t first = 0;
  EXPECT_EQ(sweep(f, table_of(f), lows, &first), 0u) << "first mismatch at float32 bits 0x" << std::hex << first;
}

TEST(Float8, E4M3FNRoundingCases) { sweep_structured(kE4M3); }
TEST(Float8, E5M2RoundingCases) { sweep_structured(kE5M2); }
TEST(Float8, E4M3FNEveryFloat32) { sweep_exhaustive(kE4M3); }
TEST(Float8, E5M2EveryFloat32) { sweep_exhaustive(kE5M2); }

TEST(Float8, DecodeEveryCode) {
  for (const Format& f : {kE4M3, kE5M2}) {
    for (unsigned c = 0; c < 256; ++c) {
      const double want = decode(f, c);
      const float got = xquant::detail::hd_float8_to_float(static_cast<std::uint8_t>(c), f.dt);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << c;
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80u) != 0) << c;
      }
      // Every finite code converts back to itself (the round trip is exact).
      if (std::isfinite(want)) {
        EXPECT_EQ(xquant::detail::hd_float_to_float8(got, f.dt, false), c) << c;
      }
    }
  }
}

// A few values written out (the formats' landmarks), so that a wrong table above cannot hide.
TEST(Float8, Landmarks) {
  using xquant::detail::hd_float_to_float8;
  EXPECT_EQ(hd_float_to_float8(448.0f, DType::float8_e4m3fn, false), 0x7Eu);
  EXPECT_EQ(hd_float_to_float8(464.0f, DType::float8_e4m3fn, false), 0x7Eu);      // tie above max: even, 448
  EXPECT_EQ(hd_float_to_float8(464.00003f, DType::float8_e4m3fn, false), 0x7Fu);  // past it: NaN
  EXPECT_EQ(hd_float_to_float8(464.00003f, DType::float8_e4m3fn, true), 0x7Eu);
  EXPECT_EQ(hd_float_to_float8(1e9f, DType::float8_e4m3fn, true), 0x7Eu);
  EXPECT_EQ(hd_float_to_float8(-INFINITY, DType::float8_e4m3fn, false), 0xFFu);
  EXPECT_EQ(hd_float_to_float8(-INFINITY, DType::float8_e4m3fn, true), 0xFEu);
  EXPECT_EQ(hd_float_to_float8(0.001953125f, DType::float8_e4m3fn, false), 0x01u);   // 2^-9
  EXPECT_EQ(hd_float_to_float8(0.0009765625f, DType::float8_e4m3fn, false), 0x00u);  // 2^-10: tie to 0
  EXPECT_EQ(hd_float_to_float8(-0.0f, DType::float8_e4m3fn, false), 0x80u);
  EXPECT_EQ(hd_float_to_float8(57344.0f, DType::float8_e5m2, false), 0x7Bu);
  EXPECT_EQ(hd_float_to_float8(61440.0f, DType::float8_e5m2, false), 0x7Cu);  // tie above max: even, Inf
  EXPECT_EQ(hd_float_to_float8(61439.996f, DType::float8_e5m2, false), 0x7Bu);
  EXPECT_EQ(hd_float_to_float8(61440.0f, DType::float8_e5m2, true), 0x7Bu);
  EXPECT_EQ(hd_float_to_float8(1.125f, DType::float8_e5m2, false), 0x3Cu);  // tie between 1 and 1.25: even
  EXPECT_EQ(hd_float_to_float8(1.375f, DType::float8_e5m2, false), 0x3Eu);  // tie between 1.25 and 1.5: 1.5
}

}  // namespace
