// The pure parts of xquant quantize / dequantize: which tensors are quantized, the parameters (with
// the all-zero / tiny / huge / non-finite guards), the split into pieces, the element passes and the
// metadata of a quantized file. Expected values are computed here by hand or by an independent formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "entry.hpp"
#include "errors.hpp"
#include "passes.hpp"
#include "plan.hpp"
#include "xquant/half.hpp"

namespace {

using namespace xqcli;
using xqcli::test_support::entry;

bool same_bits(float a, float b) {
  std::uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// ---- decide ----

TEST(Decide, DefaultsQuantizeFloatingRank2AndKeepTheRest) {
  const QuantScheme s;  // int8, per-channel, axis 0, symmetric
  const Filters f;
  for (StDType dt : {StDType::F32, StDType::F16, StDType::BF16}) {
    const Decision d = decide(entry("w", dt, {6, 4}), s, f);
    EXPECT_TRUE(d.quantize);
    EXPECT_FALSE(d.warn);
    EXPECT_EQ(d.channel_dim, 0);
    EXPECT_EQ(d.channels, 6);
  }
  for (StDType dt : {StDType::F64, StDType::I64, StDType::I8, StDType::U8, StDType::BOOL, StDType::F8_E4M3}) {
    const Decision d = decide(entry("w", dt, {6, 4}), s, f);
    EXPECT_FALSE(d.quantize);
    EXPECT_FALSE(d.warn);
    EXPECT_NE(d.reason.find("is not F32, F16 or BF16"), std::string::npos);
  }
  EXPECT_NE(decide(entry("bias", StDType::F32, {6}), s, f).reason.find("rank 1"), std::string::npos);
  EXPECT_NE(decide(entry("scalar", StDType::F32, {}), s, f).reason.find("rank 0"), std::string::npos);
  const Decision e = decide(entry("empty", StDType::F32, {0, 4}), s, f);
  EXPECT_FALSE(e.quantize);
  EXPECT_EQ(e.reason, "empty tensor");
  EXPECT_TRUE(decide(entry("conv", StDType::F32, {4, 3, 3, 3}), s, f).quantize);
}

TEST(Decide, AxisWrapsAndOutOfRangeWarns) {
  QuantScheme s;
  s.axis = -1;
  Decision d = decide(entry("w", StDType::F32, {6, 4}), s, {});
  EXPECT_TRUE(d.quantize);
  EXPECT_EQ(d.channel_dim, 1);
  EXPECT_EQ(d.channels, 4);
  s.axis = 2;
  d = decide(entry("w", StDType::F32, {6, 4}), s, {});
  EXPECT_FALSE(d.quantize);
  EXPECT_TRUE(d.warn);
  EXPECT_NE(d.reason.find("axis 2 is out of range for a rank-2 tensor"), std::string::npos);
  s.axis = -3;
  EXPECT_TRUE(decide(entry("w", StDType::F32, {6, 4}), s, {}).warn);
  s.per_channel = false;  // per-tensor ignores the axis
  d = decide(entry("w", StDType::F32, {6, 4}), s, {});
  EXPECT_TRUE(d.quantize);
  EXPECT_EQ(d.channel_dim, -1);
  EXPECT_EQ(d.channels, 1);
}

TEST(Decide, Int4NeedsLastDimDivisibleBy8AndOneOfTheLastTwoAxes) {
  QuantScheme s;
  s.bits = 4;
  Decision d = decide(entry("w", StDType::F32, {6, 12}), s, {});
  EXPECT_FALSE(d.quantize);
  EXPECT_TRUE(d.warn);
  EXPECT_NE(d.reason.find("divisible by 8 (it is 12)"), std::string::npos);
  EXPECT_TRUE(decide(entry("w", StDType::F32, {6, 16}), s, {}).quantize);  // axis 0 == rank - 2
  d = decide(entry("experts", StDType::F32, {2, 6, 16}), s, {});           // axis 0 of rank 3
  EXPECT_FALSE(d.quantize);
  EXPECT_TRUE(d.warn);
  EXPECT_NE(d.reason.find("only along the last two dimensions"), std::string::npos);
  s.axis = 1;
  EXPECT_TRUE(decide(entry("experts", StDType::F32, {2, 6, 16}), s, {}).quantize);
  s.axis = -1;
  EXPECT_EQ(decide(entry("experts", StDType::F32, {2, 6, 16}), s, {}).channel_dim, 2);
  s.per_channel = false;
  EXPECT_TRUE(decide(entry("experts", StDType::F32, {2, 6, 16}), s, {}).quantize);
  EXPECT_TRUE(decide(entry("w", StDType::F32, {6, 12}), s, {}).warn);  // the packing rule stays
}

TEST(Decide, IncludeAndExcludeFilters) {
  Filters f;
  f.include = compile_patterns({"proj", "^lm_head"}, "--include");
  f.exclude = compile_patterns({"k_proj"}, "--exclude");
  const QuantScheme s;
  EXPECT_TRUE(decide(entry("layers.0.q_proj.weight", StDType::F32, {4, 4}), s, f).quantize);
  EXPECT_TRUE(decide(entry("lm_head.weight", StDType::F32, {4, 4}), s, f).quantize);
  EXPECT_EQ(decide(entry("embed.weight", StDType::F32, {4, 4}), s, f).reason, "not matched by --include");
  EXPECT_EQ(decide(entry("layers.0.k_proj.weight", StDType::F32, {4, 4}), s, f).reason, "matched by --exclude");
  EXPECT_FALSE(decide(entry("layers.0.k_proj.weight", StDType::F32, {4, 4}), s, f).warn);
  try {
    compile_patterns({"(unclosed"}, "--include");
    ADD_FAILURE();
  } catch (const CliError& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_NE(std::string(e.what()).find("--include: invalid regular expression '(unclosed'"), std::string::npos);
  }
}

// ---- compute_params ----

TEST(Params, SymmetricIsAmaxOverQmax) {
  const QParams p8 = compute_params({-2.54f, -1.0f, 0.5f}, {1.0f, 3.81f, 0.75f}, 8, true);
  EXPECT_TRUE(same_bits(p8.scale[0], 2.54f / 127.0f));
  EXPECT_TRUE(same_bits(p8.scale[1], 3.81f / 127.0f));
  EXPECT_TRUE(same_bits(p8.scale[2], 0.75f / 127.0f));
  for (float z : p8.zero_point) EXPECT_TRUE(same_bits(z, 0.0f));
  const QParams p4 = compute_params({-7.0f}, {3.5f}, 4, true);
  EXPECT_TRUE(same_bits(p4.scale[0], 1.0f));
}

TEST(Params, AsymmetricWidensToZeroAndUsesTheFullRange) {
  // [-1, 3]: s = 4 / 255, zero_point = 127 - 3 / s.
  const QParams p = compute_params({-1.0f}, {3.0f}, 8, false);
  EXPECT_TRUE(same_bits(p.scale[0], static_cast<float>(4.0 / 255.0)));
  EXPECT_TRUE(same_bits(p.zero_point[0], static_cast<float>(127.0 - 3.0 / static_cast<double>(p.scale[0]))));
  // All positive [2, 3]: the range becomes [0, 3], so 0 maps to qmin.
  const QParams q = compute_params({2.0f}, {3.0f}, 4, false);
  EXPECT_TRUE(same_bits(q.scale[0], static_cast<float>(3.0 / 15.0)));
  EXPECT_NEAR(q.zero_point[0], -8.0f, 1e-5f);
  // A constant negative channel: [-2, 0].
  const QParams r = compute_params({-2.0f}, {-2.0f}, 8, false);
  EXPECT_TRUE(same_bits(r.scale[0], static_cast<float>(2.0 / 255.0)));
  EXPECT_NEAR(r.zero_point[0], 127.0f, 1e-5f);
}

TEST(Params, GuardsKeepScalesFiniteAndPositive) {
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  // channels: all zero, no finite value (lo > hi), tiny, huge both signs
  const std::vector<float> lo = {0.0f, inf, -tiny, -FLT_MAX};
  const std::vector<float> hi = {0.0f, -inf, tiny, FLT_MAX};
  for (int bits : {8, 4})
    for (bool sym : {true, false}) {
      const QParams p = compute_params(lo, hi, bits, sym);
      for (std::size_t c = 0; c < lo.size(); ++c) {
        EXPECT_TRUE(std::isfinite(p.scale[c]) && p.scale[c] >= FLT_MIN) << bits << sym << c << " " << p.scale[c];
        EXPECT_TRUE(std::isfinite(1.0f / p.scale[c])) << c;
        EXPECT_TRUE(std::isfinite(p.zero_point[c])) << c;
      }
      EXPECT_EQ(p.scale[0], 1.0f);
      EXPECT_EQ(p.zero_point[0], 0.0f);
      EXPECT_EQ(p.scale[1], 1.0f);
      EXPECT_EQ(p.scale[2], FLT_MIN);
    }
}

// ---- normal form and pieces ----

TEST(Pieces, NormalForm) {
  const NormalForm a = normal_form({2, 3, 4}, 1);
  EXPECT_EQ(a.outer, 2);
  EXPECT_EQ(a.channels, 3);
  EXPECT_EQ(a.inner, 4);
  const NormalForm b = normal_form({2, 3, 4}, -1);
  EXPECT_EQ(b.outer, 1);
  EXPECT_EQ(b.channels, 1);
  EXPECT_EQ(b.inner, 24);
}

// Every element is covered once, in order, and the channel a piece assigns to it is the tensor's.
void check_pieces(const Dims& shape, std::int64_t ch, std::int64_t target, std::int64_t align) {
  SCOPED_TRACE(dims_str(shape) + " ch " + std::to_string(ch) + " target " + std::to_string(target));
  const auto pieces = plan_pieces(shape, ch, target, align);
  const NormalForm full = normal_form(shape, ch);
  std::int64_t next = 0;
  for (const Piece& p : pieces) {
    ASSERT_EQ(p.begin, next);
    ASSERT_EQ(p.count, checked_numel(p.shape).value());
    ASSERT_GT(p.count, 0);
    EXPECT_EQ(p.begin % align, 0);
    if (p.shape.size() > 1 || p.count > target) {
      EXPECT_EQ(p.shape.back() % align, 0);  // whole rows
    }
    if (p.ch_dim >= 0) {
      EXPECT_EQ(p.ch_count, p.shape[static_cast<std::size_t>(p.ch_dim)]);
    } else {
      EXPECT_EQ(p.ch_count, 1);
    }
    // A piece longer than the target is a single row that could not be split further.
    if (p.count > target) {
      EXPECT_EQ(p.shape.size(), 1u);
    }
    const NormalForm nf = normal_form(p.shape, p.ch_dim);
    for (std::int64_t i = 0; i < p.count; ++i) {
      const std::int64_t local = p.ch_begin + (p.ch_dim < 0 ? 0 : (i / nf.inner) % nf.channels);
      const std::int64_t global = ch < 0 ? 0 : ((p.begin + i) / full.inner) % full.channels;
      ASSERT_EQ(local, global) << "element " << p.begin + i;
    }
    next += p.count;
  }
  EXPECT_EQ(next, checked_numel(shape).value());
}

TEST(Pieces, CoverEveryElementWithTheRightChannel) {
  const std::vector<Dims> shapes = {{7, 5},  {3, 4, 8}, {2, 3, 4, 5},    {1, 64},
                                    {64, 1}, {5, 16},   {2, 2, 2, 2, 8}, {0, 8}};
  for (const Dims& s : shapes) {
    for (std::int64_t ch = -1; ch < static_cast<std::int64_t>(s.size()); ++ch)
      for (std::int64_t target : {1, 3, 7, 8, 16, 40, 1000}) check_pieces(s, ch, target, 1);
  }
  // int4: the last dimension is a multiple of 8 and cuts inside a row fall on multiples of 8.
  for (const Dims& s : std::vector<Dims>{{3, 64}, {2, 3, 16}, {1, 128}, {4, 8}})
    for (std::int64_t ch :
         {std::int64_t{-1}, static_cast<std::int64_t>(s.size()) - 2, static_cast<std::int64_t>(s.size()) - 1})
      for (std::int64_t target : {1, 8, 20, 24, 100}) check_pieces(s, ch, target, 8);
}

TEST(Pieces, LargeTensorsSplitIntoBoundedPieces) {
  const auto p = plan_pieces({1000, 3000}, 0, 1 << 18, 1);
  EXPECT_EQ(p.size(), 12u);  // 87 rows of 3000 per piece
  EXPECT_EQ(p[0].shape, (Dims{87, 3000}));
  EXPECT_EQ(p[0].ch_count, 87);
  const auto q = plan_pieces({2, 1 << 20}, 1, 1 << 18, 8);  // rows longer than the target
  EXPECT_EQ(q.size(), 8u);
  EXPECT_EQ(q[1].shape, (Dims{1 << 18}));
  EXPECT_EQ(q[1].ch_begin, 1 << 18);
  EXPECT_EQ(q[1].ch_dim, 0);
  const auto r = plan_pieces({2, 1 << 20}, 0, 1 << 18, 8);
  EXPECT_EQ(r[5].ch_begin, 1);  // the second row's channel, per-tensor within the row
  EXPECT_EQ(r[5].ch_dim, -1);
}

// A long rank used to make the planner recurse once per dimension, copying the remaining shape each
// time (a rank-30,000 tensor: 3.5 GB and a stack overflow). The shape of issue 11's 1.1 MB file.
TEST(Pieces, HugeRankIsPlannedInLinearTime) {
  Dims shape(29'998, 1);
  shape.push_back(2);
  shape.push_back(262'152);
  for (std::int64_t ch : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{29'998}, std::int64_t{29'999}}) {
    const auto p = plan_pieces(shape, ch, 1 << 18, 8);
    ASSERT_EQ(p.size(), 4u) << ch;  // two rows of 262152, each cut into 262144 + 8
    EXPECT_EQ(p[0].count, 262'144);
    EXPECT_EQ(p[1].count, 8);
    EXPECT_EQ(p[2].begin, 262'152);
    EXPECT_EQ(p[3].begin + p[3].count, 2 * 262'152);
    EXPECT_EQ(p[3].shape, (Dims{8}));
    if (ch == 29'998) {
      EXPECT_EQ(p[2].ch_begin, 1);  // the second row's channel, per-tensor within the row
      EXPECT_EQ(p[2].ch_dim, -1);
    }
    if (ch == 29'999) {
      EXPECT_EQ(p[1].ch_begin, 262'144);
      EXPECT_EQ(p[1].ch_dim, 0);
    }
  }
  // Leading dimensions of 1 before a small tensor: one piece, the whole shape.
  Dims small(20'000, 1);
  small.push_back(3);
  const auto q = plan_pieces(small, 20'000, 1 << 18, 1);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].shape, small);
  EXPECT_EQ(q[0].ch_dim, 20'000);
  EXPECT_EQ(q[0].ch_count, 3);
}

// The recursive planner that plan_pieces() replaced, kept as the reference for its output.
void plan_reference(const Dims& shape, std::int64_t begin, std::int64_t ch_dim, std::int64_t ch_begin,
                    std::int64_t ch_count, std::int64_t target, std::int64_t align, std::vector<Piece>& out) {
  const std::int64_t n = checked_numel(shape).value_or(0);
  if (n == 0) return;
  if (n <= target) {
    out.push_back({begin, n, shape, ch_begin, ch_count, ch_dim});
    return;
  }
  if (shape.size() == 1) {
    const std::int64_t step = std::max(align, target / align * align);
    for (std::int64_t s = 0; s < n; s += step) {
      const std::int64_t len = std::min(step, n - s);
      if (ch_dim == 0)
        out.push_back({begin + s, len, {len}, ch_begin + s, len, 0});
      else
        out.push_back({begin + s, len, {len}, ch_begin, ch_count, ch_dim});
    }
    return;
  }
  const Dims rest(shape.begin() + 1, shape.end());
  const std::int64_t slice = n / shape[0];
  if (slice <= target) {
    const std::int64_t k = std::max<std::int64_t>(1, target / slice);
    for (std::int64_t i = 0; i < shape[0]; i += k) {
      const std::int64_t kk = std::min(k, shape[0] - i);
      Dims s = shape;
      s[0] = kk;
      if (ch_dim == 0)
        out.push_back({begin + i * slice, kk * slice, s, ch_begin + i, kk, 0});
      else
        out.push_back({begin + i * slice, kk * slice, s, ch_begin, ch_count, ch_dim});
    }
    return;
  }
  for (std::int64_t i = 0; i < shape[0]; ++i) {
    if (ch_dim == 0)
      plan_reference(rest, begin + i * slice, -1, ch_begin + i, 1, target, align, out);
    else
      plan_reference(rest, begin + i * slice, ch_dim < 0 ? -1 : ch_dim - 1, ch_begin, ch_count, target, align, out);
  }
}

TEST(Pieces, SameAsTheRecursivePlanner) {
  const std::vector<Dims> shapes = {{7, 5},  {3, 4, 8},     {2, 3, 4, 5},    {1, 64},
                                    {64, 1}, {5, 16},       {2, 2, 2, 2, 8}, {0, 8},
                                    {},      {1, 1, 1, 40}, {3, 1, 5, 1, 7}, {6, 2, 1, 16}};
  for (const Dims& s : shapes)
    for (std::int64_t ch = -1; ch < static_cast<std::int64_t>(s.size()); ++ch)
      for (std::int64_t target : {1, 2, 3, 7, 8, 16, 40, 1000})
        for (std::int64_t align : {1, 8}) {
          std::vector<Piece> want;
          const std::int64_t channels = ch < 0 ? 1 : s[static_cast<std::size_t>(ch)];
          plan_reference(s, 0, ch, 0, channels, target, align, want);
          const auto got = plan_pieces(s, ch, target, align);
          ASSERT_EQ(got.size(), want.size()) << dims_str(s) << " ch " << ch << " target " << target;
          for (std::size_t i = 0; i < got.size(); ++i) {
            SCOPED_TRACE(dims_str(s) + " ch " + std::to_string(ch) + " target " + std::to_string(target) + " piece " +
                         std::to_string(i));
            EXPECT_EQ(got[i].begin, want[i].begin);
            EXPECT_EQ(got[i].count, want[i].count);
            EXPECT_EQ(got[i].shape, want[i].shape);
            EXPECT_EQ(got[i].ch_begin, want[i].ch_begin);
            EXPECT_EQ(got[i].ch_count, want[i].ch_count);
            EXPECT_EQ(got[i].ch_dim, want[i].ch_dim);
          }
        }
}

TEST(Decide, RanksAboveTheLimitAreKeptWithAWarning) {
  const QuantScheme s;
  const Filters f;
  Dims at(kMaxQuantizeRank, 1);
  at[0] = 4;
  at.back() = 8;
  EXPECT_TRUE(decide(entry("w", StDType::F32, at), s, f).quantize);
  Dims above = at;
  above.push_back(1);
  const Decision d = decide(entry("w", StDType::F32, above), s, f);
  EXPECT_FALSE(d.quantize);
  EXPECT_TRUE(d.warn);
  EXPECT_NE(d.reason.find("rank 65 is above 64"), std::string::npos) << d.reason;
}

// ---- element passes ----

TEST(Passes, LoadElementWidensEveryDtypeExactly) {
  const float f[3] = {1.5f, -0.0f, 3.0e-39f};
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(same_bits(load_element(reinterpret_cast<const std::byte*>(f), StDType::F32, i), f[i]));
  for (std::uint32_t h = 0; h < 65536; h += 97) {
    const auto u = static_cast<std::uint16_t>(h);
    const float want = xquant::half_to_float(u);
    const float got = load_element(reinterpret_cast<const std::byte*>(&u), StDType::F16, 0);
    EXPECT_TRUE(same_bits(got, want) || (std::isnan(got) && std::isnan(want))) << h;
    const float bwant = xquant::bfloat16_to_float(u);
    const float bgot = load_element(reinterpret_cast<const std::byte*>(&u), StDType::BF16, 0);
    EXPECT_TRUE(same_bits(bgot, bwant) || (std::isnan(bgot) && std::isnan(bwant))) << h;
  }
  // Misaligned reads are fine (memcpy).
  std::byte buf[9] = {};
  const float v = 2.25f;
  std::memcpy(buf + 1, &v, 4);
  EXPECT_EQ(load_element(buf + 1, StDType::F32, 0), 2.25f);
}

TEST(Passes, MinMaxSkipsNonFiniteValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // [3, 4], channels on axis 1 (columns)
  const float x[12] = {1, nan, -2, 5, -inf, 0, 3, 9, 4, inf, 6, -7};
  std::vector<float> lo(4, inf), hi(4, -inf);
  std::int64_t bad = 0;
  for (const Piece& p : plan_pieces({3, 4}, 1, 5, 1))
    piece_minmax(reinterpret_cast<const std::byte*>(x), StDType::F32, p, lo.data(), hi.data(), bad);
  EXPECT_EQ(bad, 3);
  EXPECT_EQ(lo, (std::vector<float>{1, 0, -2, -7}));  // columns of the rows {1,NaN,-2,5} {-Inf,0,3,9} {4,Inf,6,-7}
  EXPECT_EQ(hi, (std::vector<float>{4, 0, 6, 9}));
}

TEST(Passes, StoredValuesAndInt4Nibbles) {
  const std::int8_t q8[3] = {-128, 0, 127};
  EXPECT_EQ(stored_value(q8, 8, 0), -128);
  EXPECT_EQ(stored_value(q8, 8, 2), 127);
  // Word 0x87654321: nibble j = bits [4j, 4j+3]: 1, 2, 3, 4, 5, 6, 7, 8 -> -8.
  const std::uint32_t w[2] = {0x87654321u, 0xF0000009u};
  const int want[16] = {1, 2, 3, 4, 5, 6, 7, -8, -7, 0, 0, 0, 0, 0, 0, -1};
  for (int j = 0; j < 16; ++j) EXPECT_EQ(stored_value(w, 4, j), want[j]) << j;
}

TEST(Passes, RoundTripErrorAgainstHandComputedValues) {
  // Two channels (rows) of 2: scale 0.5 and 2, zero points 0 and 1.
  const float x[4] = {1.0f, -0.3f, 4.0f, std::numeric_limits<float>::quiet_NaN()};
  const std::int8_t q[4] = {2, -1, 3, 0};  // x' = 1.0, -0.5, (3 - 1) * 2 = 4.0, -2 (NaN input: left out)
  const float scale[2] = {0.5f, 2.0f}, zp[2] = {0.0f, 1.0f};
  const auto pieces = plan_pieces({2, 2}, 0, 100, 1);
  ASSERT_EQ(pieces.size(), 1u);
  const ErrorStats e = piece_error(reinterpret_cast<const std::byte*>(x), StDType::F32, pieces[0], q, 8, scale, zp);
  const double err = static_cast<double>(-0.3f) - (-0.5);
  EXPECT_EQ(e.nonfinite, 1);
  EXPECT_DOUBLE_EQ(e.noise, err * err);
  EXPECT_DOUBLE_EQ(e.signal, 1.0 + static_cast<double>(-0.3f) * static_cast<double>(-0.3f) + 16.0);
  EXPECT_DOUBLE_EQ(e.max_abs, std::fabs(err));
  EXPECT_DOUBLE_EQ(e.sqnr_db(), 10.0 * std::log10(e.signal / e.noise));
  ErrorStats exact;
  exact.signal = 4.0;
  EXPECT_TRUE(std::isinf(exact.sqnr_db()));
}

TEST(Passes, DequantizeRangeNarrowsToEachDtype) {
  // [2, 8] int4 per-channel along axis 0: row 0 scale 0.1, row 1 scale 1/3 with zero point 0.5.
  std::uint32_t w[2];
  const int vals[16] = {-8, -1, 0, 1, 7, 3, 2, -3, 5, -5, 0, 7, -8, 1, 1, 1};
  for (int k = 0; k < 2; ++k) {
    w[k] = 0;
    for (int j = 0; j < 8; ++j) w[k] |= (static_cast<std::uint32_t>(vals[8 * k + j]) & 0xFu) << (4 * j);
  }
  const float scale[2] = {0.1f, 1.0f / 3.0f}, zp[2] = {0.0f, 0.5f};
  const NormalForm nf = normal_form({2, 8}, 0);
  for (StDType dt : {StDType::F32, StDType::F16, StDType::BF16}) {
    std::vector<std::byte> out(16 * st_dtype_size(dt));
    dequantize_range(w, 4, nf, scale, zp, 0, 16, dt, out.data());
    for (int i = 0; i < 16; ++i) {
      const float want = (static_cast<float>(vals[i]) - zp[i / 8]) * scale[i / 8];
      const float got = load_element(out.data(), dt, i);
      const float want_n = dt == StDType::F32   ? want
                           : dt == StDType::F16 ? xquant::half_to_float(xquant::float_to_half(want))
                                                : xquant::bfloat16_to_float(xquant::float_to_bfloat16(want));
      EXPECT_TRUE(same_bits(got, want_n)) << i;
    }
    // A sub-range starting at element 8 writes element 8 first.
    std::vector<std::byte> part(8 * st_dtype_size(dt));
    dequantize_range(w, 4, nf, scale, zp, 8, 16, dt, part.data());
    EXPECT_EQ(std::memcmp(part.data(), out.data() + 8 * st_dtype_size(dt), part.size()), 0);
  }
}

// ---- metadata of a quantized file ----

TEST(Metadata, RoundTrip) {
  QuantizedFileInfo info;
  info.bits = 4;
  info.per_channel = true;
  info.symmetric = false;
  info.axis = "-2";
  info.tensors["a"] = {StDType::BF16, {4, 16}, 0};
  info.tensors["b.c"] = {StDType::F32, {2, 3, 8}, -1};
  const auto meta = quant_metadata(info);
  EXPECT_EQ(meta.at("xquant.format_version"), "1");
  EXPECT_EQ(meta.at("xquant.bits"), "4");
  EXPECT_EQ(meta.at("xquant.scheme"), "per-channel");
  EXPECT_EQ(meta.at("xquant.mode"), "asymmetric");
  EXPECT_EQ(meta.at("xquant.axis"), "-2");
  EXPECT_FALSE(meta.at("xquant.version").empty());
  EXPECT_EQ(meta.at("xquant.tensors"),
            R"({"a":{"dtype":"BF16","shape":[4,16],"axis":0},"b.c":{"dtype":"F32","shape":[2,3,8],"axis":null}})");
  const auto back = parse_quant_metadata(meta);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->bits, 4);
  EXPECT_FALSE(back->symmetric);
  EXPECT_EQ(back->tensors.at("a").dtype, StDType::BF16);
  EXPECT_EQ(back->tensors.at("a").shape, (Dims{4, 16}));
  EXPECT_EQ(back->tensors.at("b.c").channel_dim, -1);
  EXPECT_FALSE(parse_quant_metadata({{"format", "pt"}}).has_value());
}

TEST(Metadata, MalformedEntriesAreBadInput) {
  QuantizedFileInfo info;
  info.tensors["a"] = {StDType::F32, {4, 16}, 1};
  const auto good = quant_metadata(info);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"xquant.format_version", "2"},
      {"xquant.bits", "3"},
      {"xquant.scheme", "per-row"},
      {"xquant.mode", "sym"},
      {"xquant.tensors", "{"},
      {"xquant.tensors", "[]"},
      {"xquant.tensors", R"({"a":{"dtype":"I8","shape":[4,16],"axis":0}})"},
      {"xquant.tensors", R"({"a":{"dtype":"F32","shape":[4,-16],"axis":0}})"},
      {"xquant.tensors", R"({"a":{"dtype":"F32","shape":[4,16],"axis":2}})"},
      {"xquant.tensors", R"({"a":{"dtype":"F32","shape":[4,16]}})"},
  };
  for (const auto& [k, v] : cases) {
    auto meta = good;
    meta[k] = v;
    EXPECT_THROW(parse_quant_metadata(meta), CliError) << k << " = " << v;
  }
  auto missing = good;
  missing.erase("xquant.mode");
  EXPECT_THROW(parse_quant_metadata(missing), CliError);
  auto int4 = good;
  int4["xquant.bits"] = "4";
  int4["xquant.tensors"] = R"({"a":{"dtype":"F32","shape":[4,12],"axis":0}})";
  EXPECT_THROW(parse_quant_metadata(int4), CliError);
}

TEST(Metadata, StoredShapes) {
  EXPECT_EQ(quantized_dtype(8), StDType::I8);
  EXPECT_EQ(quantized_dtype(4), StDType::I32);
  EXPECT_EQ(quantized_shape({3, 16}, 8), (Dims{3, 16}));
  EXPECT_EQ(quantized_shape({3, 16}, 4), (Dims{3, 2}));
  EXPECT_EQ(param_shape({3, 5, 16}, 1), (Dims{1, 5, 1}));
  EXPECT_EQ(param_shape({3, 16}, -1), (Dims{1, 1}));
}

}  // namespace
