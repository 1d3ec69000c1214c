// Tests of npu_dynamic_quant (SPEC section 6, symmetric per-token): hand-computed rows, an independent
// scalar oracle written here, ties, NaN, +-Inf, saturation, zero rows, int4 nibble order, smooth scales
// (bfloat16 too) with MoE groups, the round trip through anti_quant, and every validation path (nothing
// written on error).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "xquant/runtime.hpp"

namespace {

using namespace xqtest;
using xquant::ErrorCode;
using xquant::QuantDType;
using Opt = std::optional<ConstTensorView>;

constexpr auto kI8 = QuantDType::qint8;
constexpr auto kI4 = QuantDType::quint4x2;
const QuantDType kDsts[] = {kI8, kI4};

struct Expected {
  std::vector<int> y;
  std::vector<float> scale;
};

// SPEC 6 written out directly: x' = x (* smooth[e(r)]), scale = max|x'| / DST_MAX (NaN anywhere: NaN),
// y = sat(rint(x' / scale)).
Expected oracle(const std::vector<float>& xs, std::int64_t S, std::int64_t H, const std::vector<float>* smooth,
                const std::vector<std::int64_t>& ends, bool int4) {
  const float hi = int4 ? 7.0f : 127.0f, lo = int4 ? -8.0f : -128.0f;
  Expected out;
  out.y.resize(static_cast<std::size_t>(S * H));
  for (std::int64_t r = 0; r < S; ++r) {
    std::int64_t e = 0;
    while (!ends.empty() && ends[static_cast<std::size_t>(e)] <= r) ++e;
    std::vector<float> row(static_cast<std::size_t>(H));
    bool nan = false;
    float amax = 0.0f;
    for (std::int64_t j = 0; j < H; ++j) {
      float v = xs[static_cast<std::size_t>(r * H + j)];
      if (smooth) v = v * (*smooth)[static_cast<std::size_t>((ends.empty() ? 0 : e) * H + j)];
      row[static_cast<std::size_t>(j)] = v;
      if (std::isnan(v))
        nan = true;
      else
        amax = std::fmax(amax, std::fabs(v));
    }
    const float scale = nan ? kNaN : amax / hi;
    out.scale.push_back(scale);
    for (std::int64_t j = 0; j < H; ++j) {
      const float q = std::nearbyint(row[static_cast<std::size_t>(j)] / scale);
      int y = 0;
      if (std::isnan(q))
        y = 0;
      else if (q <= lo)
        y = static_cast<int>(lo);
      else if (q >= hi)
        y = static_cast<int>(hi);
      else
        y = static_cast<int>(q);
      out.y[static_cast<std::size_t>(r * H + j)] = y;
    }
  }
  return out;
}

std::vector<int> decode_y(const ConstTensorView& y, bool int4) {
  std::vector<int> out;
  if (!int4) {
    for (std::int8_t v : to_vector<std::int8_t>(y)) out.push_back(v);
    return out;
  }
  for (std::int32_t w : to_vector<std::int32_t>(y)) {
    auto u = static_cast<std::uint32_t>(w);
    for (int k = 0; k < 8; ++k, u >>= 4) {
      const int nib = static_cast<int>(u & 0xFu);
      out.push_back(nib >= 8 ? nib - 16 : nib);
    }
  }
  return out;
}

Tensor group_index(DType dt, const std::vector<std::int64_t>& v) {
  const Shape s{static_cast<std::int64_t>(v.size())};
  if (dt == DType::int64) return make_typed<std::int64_t>(dt, s, v);
  return make_typed<std::int32_t>(dt, s, std::vector<std::int32_t>(v.begin(), v.end()));
}

struct Got {
  std::vector<int> y;
  std::vector<float> scale;
};

// Runs both API forms, checks shapes, compares with the oracle bit for bit; returns the result.
Got run(DType dt, const Shape& shape, const std::vector<float>& xv, QuantDType dst = kI8,
        const std::optional<Tensor>& smooth = std::nullopt, const std::vector<std::int64_t>& ends = {},
        DType gi_dt = DType::int64) {
  const bool int4 = dst == kI4;
  Tensor x = make_float(dt, shape, xv);
  const std::int64_t H = shape.back();
  std::int64_t S = 1;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d) S *= shape[d];
  std::optional<Tensor> gi;
  Opt sv, gv;
  std::vector<float> sm;
  if (smooth) {
    sv = smooth->view();
    sm = to_floats(*smooth);
  }
  if (!ends.empty()) {
    gi = group_index(gi_dt, ends);
    gv = gi->view();
  }
  const Expected want = oracle(to_floats(x), S, H, smooth ? &sm : nullptr, ends, int4);
  Shape y_shape = shape;
  if (int4) y_shape.back() = H / 8;
  const Shape p_shape(shape.begin(), shape.end() - 1);
  const auto r = xquant::dynamic_quant(x, sv, gv, dst);
  EXPECT_EQ(r.y.dtype(), int4 ? DType::int32 : DType::int8);
  EXPECT_EQ(r.y.shape(), y_shape);
  EXPECT_EQ(r.scale.dtype(), DType::float32);
  EXPECT_EQ(r.scale.shape(), p_shape);
  Got g{decode_y(r.y, int4), to_floats(r.scale)};
  EXPECT_EQ(g.y, want.y);
  expect_floats_bitexact(g.scale, want.scale, "scale");
  // The _out form writes the same bytes into pre-filled outputs.
  Tensor y(int4 ? DType::int32 : DType::int8, y_shape), s(DType::float32, p_shape);
  fill_bytes(y);
  fill_bytes(s);
  xquant::dynamic_quant_out(y, s, x, sv, gv, dst);
  EXPECT_TRUE(same_bytes(y, r.y));
  EXPECT_TRUE(same_bytes(s, r.scale));
  return g;
}

TEST(DynamicQuantSymmetric, HandRowsInt8) {
  for (DType dt : kFloatTypes) {
    // Row 0: max |x| 127 -> scale 1. Row 1: max |x| 254 -> scale 2; 0.5 / 2 = 0.25 -> 0, -1.5 / 2 -> -1.
    // Row 2: negative maximum: max |x| = 254 from -254 -> y = -127.
    const Got g = run(dt, {3, 4}, {0, 1, -2, 127, 0.5f, -1.5f, 2.5f, 254, 1, 2, 3, -254});
    expect_floats_bitexact(g.scale, {1.0f, 2.0f, 2.0f});
    EXPECT_EQ(g.y, (std::vector<int>{0, 1, -2, 127, 0, -1, 1, 127, 0, 1, 2, -127}));
  }
}

TEST(DynamicQuantSymmetric, TiesRoundHalfToEven) {
  // scale 2: 1/2 = 0.5 -> 0, 3/2 = 1.5 -> 2, -5/2 = -2.5 -> -2, -1/2 -> -0 -> 0, 5/2 = 2.5 -> 2.
  const Got g = run(DType::float32, {1, 6}, {1, 3, -5, -1, 5, 254});
  EXPECT_EQ(g.y, (std::vector<int>{0, 2, -2, 0, 2, 127}));
  // Division, not a reciprocal multiplication: scale = 129 / 127 and x = 34.027557373046875 give
  // x / scale = 33.5 exactly -> 34, while x * fl(1 / scale) -> 33.
  const Got d = run(DType::float32, {1, 2}, {34.027557373046875f, 129.0f});
  EXPECT_EQ(d.scale[0], 129.0f / 127.0f);
  EXPECT_EQ(d.y, (std::vector<int>{34, 127}));
}

TEST(DynamicQuantSymmetric, Int4HandRowAndNibbleOrder) {
  // Row 0: 0..7 -> scale 1 -> word 0x76543210. Row 1: -7..0 -> nibbles 9, A, ..., F, 0 -> 0x0FEDCBA9.
  Tensor x = make_float(DType::float32, {2, 8}, {0, 1, 2, 3, 4, 5, 6, 7, -7, -6, -5, -4, -3, -2, -1, 0});
  const auto r = xquant::dynamic_quant(x, std::nullopt, std::nullopt, kI4);
  EXPECT_EQ(r.y.shape(), (Shape{2, 1}));
  EXPECT_EQ(static_cast<std::uint32_t>(r.y.data<std::int32_t>()[0]), 0x76543210u);
  EXPECT_EQ(static_cast<std::uint32_t>(r.y.data<std::int32_t>()[1]), 0x0FEDCBA9u);
  expect_floats_bitexact(to_floats(r.scale), {1.0f, 1.0f});
  // And through the oracle, with scale 14 / 7 = 2 and ties.
  const Got g = run(DType::float32, {1, 8}, {1, 3, -5, 14, -14, 7, -7, 0}, kI4);
  EXPECT_EQ(g.y, (std::vector<int>{0, 2, -2, 7, -7, 4, -4, 0}));
}

TEST(DynamicQuantSymmetric, ZeroRowsGiveScaleZeroAndZeros) {
  for (QuantDType dst : kDsts) {
    // 0 / 0 is NaN, which converts to 0; -0.0 rows too.
    const Got g = run(DType::float32, {3, 8},
                      {0, 0, 0, 0, 0, 0, 0, 0, -0.0f, 0, -0.0f, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 7}, dst);
    EXPECT_EQ(g.scale[0], 0.0f);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(g.scale[1]), 0u) << "|x| of -0 is +0";
    for (int i = 0; i < 16; ++i) EXPECT_EQ(g.y[static_cast<std::size_t>(i)], 0) << i;
  }
}

TEST(DynamicQuantSymmetric, NaNRowsGiveCanonicalNaNScaleAndZeros) {
  const xquant::Backend saved = xquant::get_backend();
  for (xquant::Backend b : {xquant::Backend::cpu, xquant::Backend::reference}) {
    xquant::set_backend(b);
    for (QuantDType dst : kDsts)
      for (DType dt : kFloatTypes) {
        std::vector<float> v = {0, 1, 2, 3, 4, 5, 6, 7, 1, 2, kNaN, 4, 5, 6, 7, 8};
        const Got g = run(dt, {2, 8}, v, dst);
        EXPECT_EQ(g.scale[0], 7.0f / (dst == kI4 ? 7.0f : 127.0f));
        for (int i = 8; i < 16; ++i) EXPECT_EQ(g.y[static_cast<std::size_t>(i)], 0) << i;
      }
    // A NaN with a payload in a one-element row: the scale is 0x7FC00000 exactly.
    for (std::uint32_t bits : {0x7FC00001u, 0xFFC12345u, 0x7FA00000u}) {
      Tensor x(DType::float32, {1, 1});
      x.data<std::uint32_t>()[0] = bits;
      const auto r = xquant::dynamic_quant(x);
      EXPECT_EQ(r.scale.data<std::uint32_t>()[0], 0x7FC00000u) << std::hex << bits;
      EXPECT_EQ(r.y.data<std::int8_t>()[0], 0);
    }
  }
  xquant::set_backend(saved);
}

TEST(DynamicQuantSymmetric, InfinityAndSaturation) {
  for (DType dt : kFloatTypes) {
    // +-Inf: scale Inf; finite / Inf = 0, +-Inf / Inf = NaN -> 0.
    const Got g = run(dt, {2, 4}, {kInf, 1, -2, 0, -kInf, 5, 6, 7});
    expect_floats_bitexact(g.scale, {kInf, kInf});
    EXPECT_EQ(g.y, std::vector<int>(8, 0));
  }
  // Saturation: max |x| = 1e-44 (subnormal) / 127 underflows to scale +0, so x / 0 = +-Inf saturates and
  // 0 / 0 = NaN gives 0.
  const Got s = run(DType::float32, {1, 4}, {1e-44f, -1e-44f, 0.0f, 5e-45f});
  EXPECT_EQ(std::bit_cast<std::uint32_t>(s.scale[0]), 0u);
  EXPECT_EQ(s.y, (std::vector<int>{127, -128, 0, 127}));
  // int4: 1e-44 / 7 is one subnormal unit (not 0), so take the smallest subnormal: 1.4e-45 / 7 -> +0.
  const Got s4 = run(DType::float32, {1, 8}, {1e-45f, -1e-45f, 0, 0, 0, 0, 0, 1e-45f}, kI4);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(s4.scale[0]), 0u);
  EXPECT_EQ(s4.y, (std::vector<int>{7, -8, 0, 0, 0, 0, 0, 7}));
  // Largest finite values: scale = 3.4e38 / 127, y = +-127.
  const float big = std::numeric_limits<float>::max();
  const Got l = run(DType::float32, {1, 3}, {big, -big, 0});
  EXPECT_EQ(l.y, (std::vector<int>{127, -127, 0}));
}

TEST(DynamicQuantSymmetric, RandomAgainstOracleEveryDtype) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-100.0f, 100.0f);
  const xquant::Backend saved = xquant::get_backend();
  for (xquant::Backend b : {xquant::Backend::cpu, xquant::Backend::reference}) {
    xquant::set_backend(b);
    for (QuantDType dst : kDsts)
      for (DType dt : kFloatTypes)
        for (std::int64_t H : {8, 40, 1000}) {
          std::vector<float> v(static_cast<std::size_t>(6 * H));
          for (float& f : v) f = u(rng);
          run(dt, {2, 3, H}, v, dst);
        }
  }
  xquant::set_backend(saved);
}

TEST(DynamicQuantSymmetric, SmoothScalesAndGroups) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f), su(0.25f, 2.0f);
  for (DType sdt : kFloatTypes)
    for (QuantDType dst : kDsts) {
      const std::int64_t S = 6, H = 16;
      std::vector<float> v(static_cast<std::size_t>(S * H));
      for (float& f : v) f = u(rng);
      std::vector<float> s1(static_cast<std::size_t>(H)), s3(static_cast<std::size_t>(3 * H));
      for (float& f : s1) f = su(rng);
      for (float& f : s3) f = su(rng);
      run(DType::float32, {S, H}, v, dst, make_float(sdt, {H}, s1));
      for (DType gdt : {DType::int32, DType::int64}) {
        // Groups [0, 2), [2, 2) (empty), [2, 6).
        run(DType::bfloat16, {S, H}, v, dst, make_float(sdt, {3, H}, s3), {2, 2, 6}, gdt);
      }
    }
  // Hand: smooth [2, 0.5] on [[1, 4]] -> x' = [2, 2], scale 2/127, y = [127, 127].
  const Got g = run(DType::float32, {1, 2}, {1, 4}, kI8, make_float(DType::float32, {2}, {2.0f, 0.5f}));
  EXPECT_EQ(g.y, (std::vector<int>{127, 127}));
}

TEST(DynamicQuantSymmetric, EmptyInputs) {
  // No rows: nothing to write. H == 0: one scale per row, 0 / 127 = 0.
  const auto r0 = xquant::dynamic_quant(Tensor(DType::float32, {0, 8}));
  EXPECT_EQ(r0.scale.shape(), (Shape{0}));
  const auto r1 = xquant::dynamic_quant(Tensor(DType::float32, {3, 0}));
  EXPECT_EQ(r1.scale.shape(), (Shape{3}));
  expect_floats_bitexact(to_floats(r1.scale), {0.0f, 0.0f, 0.0f});
}

TEST(DynamicQuantSymmetric, RoundTripThroughAntiQuantWithinOneStep) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-5.0f, 5.0f);
  for (QuantDType dst : kDsts) {
    const std::int64_t H = 64;
    std::vector<float> v(static_cast<std::size_t>(H));
    for (float& f : v) f = u(rng);
    Tensor x = make_float(DType::float32, {1, H}, v);
    const auto q = xquant::dynamic_quant(x, std::nullopt, std::nullopt, dst);
    Tensor scale1(DType::float32, {1});
    scale1.data<float>()[0] = q.scale.data<float>()[0];
    const auto back = to_floats(xquant::anti_quant(q.y, scale1, std::nullopt, DType::float32, dst));
    const float step = q.scale.data<float>()[0];
    for (std::size_t i = 0; i < v.size(); ++i) EXPECT_LE(std::fabs(back[i] - v[i]), step) << i;
  }
}

// ---------------------------------------------------------------------------------------------------
// Validation: the rules (and the code) of the asymmetric operator, under this operator's name.

void expect_sym_error(ConstTensorView x, Opt smooth, Opt gi, QuantDType dst, ErrorCode code, const std::string& arg,
                      std::vector<std::string> needles, DType y_dt = DType::int8, std::optional<Shape> y_shape = {},
                      DType s_dt = DType::float32, std::optional<Shape> s_shape = {}) {
  Shape ys = x.shape, ss;
  if (!ys.empty() && dst == kI4 && ys.back() % 8 == 0) ys.back() /= 8;
  if (!x.shape.empty()) ss = Shape(x.shape.begin(), x.shape.end() - 1);
  Tensor y(y_dt, y_shape.value_or(ys)), s(s_dt, s_shape.value_or(ss));
  fill_bytes(y);
  fill_bytes(s);
  needles.push_back("xquant::dynamic_quant: ");
  expect_error([&] { xquant::dynamic_quant_out(y, s, x, smooth, gi, dst); }, code, arg, needles);
  EXPECT_TRUE(all_bytes(y)) << "y written on error (" << arg << ")";
  EXPECT_TRUE(all_bytes(s)) << "scale written on error (" << arg << ")";
  if (!y_shape && !s_shape && y_dt == DType::int8 && s_dt == DType::float32)  // the allocating form too
    expect_error([&] { xquant::dynamic_quant(x, smooth, gi, dst); }, code, arg);
}

TEST(DynamicQuantSymmetricErrors, EveryArgument) {
  const Tensor x = make_float(DType::float32, {4, 8}, std::vector<float>(32, 1.0f));
  const Tensor xi = make_typed<std::int8_t>(DType::int8, {4, 8}, std::vector<std::int8_t>(32, 1));
  expect_sym_error(xi, {}, {}, kI8, ErrorCode::dtype_mismatch, "x", {"x has dtype int8"});
  const Tensor x1 = make_float(DType::float32, {8}, std::vector<float>(8, 1.0f));
  expect_sym_error(x1, {}, {}, kI8, ErrorCode::shape_mismatch, "x", {"rank"});
  expect_sym_error(ConstTensorView(nullptr, DType::float32, {4, 8}), {}, {}, kI8, ErrorCode::invalid_argument, "x",
                   {"null"});
  expect_sym_error(x, {}, {}, QuantDType::quint8, ErrorCode::invalid_argument, "dst_type", {"quint8"});
  expect_sym_error(x, {}, {}, QuantDType::qint32, ErrorCode::invalid_argument, "dst_type", {"qint32"});
  const Tensor x12 = make_float(DType::float32, {2, 12}, std::vector<float>(24, 1.0f));
  expect_sym_error(x12, {}, {}, kI4, ErrorCode::shape_mismatch, "x", {"multiple of 8"}, DType::int32, Shape{2, 1});
  // smooth_scales
  const Tensor si = make_typed<std::int32_t>(DType::int32, {8}, std::vector<std::int32_t>(8, 1));
  expect_sym_error(x, si.view(), {}, kI8, ErrorCode::dtype_mismatch, "smooth_scales", {"int32"});
  const Tensor s9 = make_float(DType::float32, {9}, std::vector<float>(9, 1.0f));
  expect_sym_error(x, s9.view(), {}, kI8, ErrorCode::shape_mismatch, "smooth_scales", {"[9]", "[8]"});
  const Tensor s2 = make_float(DType::float32, {1, 8}, std::vector<float>(8, 1.0f));
  expect_sym_error(x, s2.view(), {}, kI8, ErrorCode::shape_mismatch, "smooth_scales", {"group_index"});
  // group_index
  const Tensor s3 = make_float(DType::float32, {3, 8}, std::vector<float>(24, 1.0f));
  const Tensor g_ok = group_index(DType::int32, {1, 2, 4});
  expect_sym_error(x, {}, g_ok.view(), kI8, ErrorCode::invalid_argument, "group_index", {"smooth_scales"});
  const Tensor gf = make_float(DType::float32, {3}, {1, 2, 4});
  expect_sym_error(x, s3.view(), gf.view(), kI8, ErrorCode::dtype_mismatch, "group_index", {"float32"});
  const Tensor g2 = group_index(DType::int64, {2, 4});
  expect_sym_error(x, s3.view(), g2.view(), kI8, ErrorCode::shape_mismatch, "group_index", {"[2]", "[3]"});
  const Tensor gd = group_index(DType::int64, {2, 1, 4});
  expect_sym_error(x, s3.view(), gd.view(), kI8, ErrorCode::invalid_argument, "group_index", {"group_index[1] is 1"});
  const Tensor gl = group_index(DType::int32, {1, 2, 3});
  expect_sym_error(x, s3.view(), gl.view(), kI8, ErrorCode::invalid_argument, "group_index", {"group_index[2] is 3"});
  const Tensor gn = group_index(DType::int32, {-1, 2, 4});
  expect_sym_error(x, s3.view(), gn.view(), kI8, ErrorCode::invalid_argument, "group_index", {"is -1"});
  // outputs
  expect_sym_error(x, {}, {}, kI8, ErrorCode::dtype_mismatch, "y", {"y has dtype int32"}, DType::int32);
  expect_sym_error(x, {}, {}, kI8, ErrorCode::shape_mismatch, "y", {"[4, 9]"}, DType::int8, Shape{4, 9});
  expect_sym_error(x, {}, {}, kI4, ErrorCode::shape_mismatch, "y", {"[4, 8]", "[4, 1]"}, DType::int32, Shape{4, 8});
  expect_sym_error(x, {}, {}, kI8, ErrorCode::dtype_mismatch, "scale", {"float16"}, DType::int8, {}, DType::float16);
  expect_sym_error(x, {}, {}, kI8, ErrorCode::shape_mismatch, "scale", {"[1]", "[4]"}, DType::int8, {}, DType::float32,
                   Shape{1});
}

TEST(DynamicQuantSymmetricErrors, Overlap) {
  // scale overlapping y, y overlapping x: rejected, nothing written.
  Tensor buf(DType::float32, {64});
  fill_bytes(buf);
  Tensor x = make_float(DType::float32, {2, 8}, std::vector<float>(16, 1.0f));
  TensorView y(buf.data(), DType::int8, {2, 8});
  TensorView s(buf.data<float>() + 2, DType::float32, {2});
  expect_error([&] { xquant::dynamic_quant_out(y, s, x); }, ErrorCode::aliasing, "scale", {"y"});
  EXPECT_TRUE(all_bytes(buf));
  TensorView y2(x.data(), DType::int8, {2, 8});
  TensorView s2(buf.data(), DType::float32, {2});
  expect_error([&] { xquant::dynamic_quant_out(y2, s2, x); }, ErrorCode::aliasing, "y", {"x"});
  EXPECT_TRUE(all_bytes(buf));
}

}  // namespace
