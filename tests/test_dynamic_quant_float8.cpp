// The op-plugin 26.x forms of npu_dynamic_quant / npu_dynamic_quant_asymmetric (docs/semantics.md): float8
// outputs in every quant_mode, symmetric pertensor, and perchannel (int8 and float8, with smooth scales [S]),
// against an oracle written here from the documented formulas, with its own float8 rounding (nearest of the
// decoded codes, ties to the even code); the default backend, then the reference.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "core/numeric.hpp"
#include "test_util.hpp"
#include "xquant/plan.hpp"
#include "xquant/runtime.hpp"

namespace {

using namespace xqtest;
using xquant::DynamicQuantMode;
using xquant::QuantDType;

// float8 by value: the nearest of the finite codes of the format, ties to the even code; beyond the
// largest finite (rounding up to the next would-be value): NaN (e4m3fn, 0x7F) or +-Inf (e5m2, 0x7C).
std::uint8_t to_f8(float v, QuantDType q) {
  const bool e5 = q == QuantDType::float8_e5m2;
  if (std::isnan(v)) return 0x7F;  // the operators' NaN (sign not kept)
  const int M = e5 ? 2 : 3, B = e5 ? 15 : 7;
  const unsigned max_code = e5 ? 0x7Bu : 0x7Eu, over = e5 ? 0x7Cu : 0x7Fu;
  std::vector<double> vals;
  for (unsigned c = 0; c <= max_code; ++c) {
    const int e = static_cast<int>(c >> M);
    const double m = static_cast<double>(c & ((1u << M) - 1u));
    vals.push_back(e == 0 ? std::ldexp(m, 1 - B - M) : std::ldexp(1.0 + std::ldexp(m, -M), e - B));
  }
  vals.push_back(vals.back() + (vals.back() - vals[vals.size() - 2]));  // the would-be next value
  const unsigned sign = std::signbit(v) ? 0x80u : 0u;
  const double a = std::fabs(static_cast<double>(v));
  unsigned best = 0;
  for (unsigned c = 1; c < vals.size(); ++c) {
    const double d = std::fabs(vals[c] - a), db = std::fabs(vals[best] - a);
    if (d < db || (d == db && (c & 1u) == 0)) best = c;
  }
  if (a > vals.back() || best > max_code) return static_cast<std::uint8_t>(sign | over);
  return static_cast<std::uint8_t>(sign | best);
}

struct Oracle {
  std::vector<std::uint8_t> y;  // int8 bytes or float8 codes
  std::vector<float> scale, offset;
};

// Groups of element indices that share one (scale, offset): rows (pertoken), everything (pertensor) or the
// columns of each batch (perchannel); xs = x' (smoothed).
Oracle oracle(const std::vector<float>& xs, const std::vector<std::vector<std::int64_t>>& groups, QuantDType q,
              bool symmetric) {
  const bool f8 = q != QuantDType::qint8;
  const float dmax = q == QuantDType::float8_e5m2 ? 57344.f : q == QuantDType::float8_e4m3fn ? 448.f : 127.f;
  const float dmin = f8 ? -dmax : -128.f;
  Oracle o;
  o.y.resize(xs.size());
  for (const auto& g : groups) {
    bool nan = false;
    float mx = 0.f, mn = 0.f, am = 0.f;
    for (std::size_t k = 0; k < g.size(); ++k) {
      const float v = xs[static_cast<std::size_t>(g[k])];
      nan = nan || std::isnan(v);
      mx = k == 0 ? v : std::max(mx, v);
      mn = k == 0 ? v : std::min(mn, v);
      am = std::max(am, std::fabs(v));
    }
    const float qnan = std::nanf("");
    float scale, offset = 0.f;
    if (symmetric) {
      scale = nan ? qnan : am / dmax;
    } else {
      scale = nan ? qnan : std::max((mx - mn) / (dmax - dmin), 1e-12f);
      offset = nan ? qnan : dmax - mx / scale;
    }
    o.scale.push_back(scale);
    o.offset.push_back(offset);
    for (std::int64_t i : g) {
      const float xv = xs[static_cast<std::size_t>(i)];
      const float v = symmetric ? xv / scale : xv / scale + offset;
      std::uint8_t b;
      if (f8) {
        b = to_f8(v, q);
      } else {
        const float r = std::nearbyint(v);
        const float c = std::isnan(r) ? 0.f : std::min(127.f, std::max(-128.f, r));
        b = static_cast<std::uint8_t>(static_cast<std::int8_t>(c));
      }
      o.y[static_cast<std::size_t>(i)] = b;
    }
  }
  return o;
}

bool same_float_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  std::uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

void run_case(DType dt, const Shape& shape, QuantDType q, bool symmetric, DynamicQuantMode mode, bool smooth,
              std::uint32_t seed) {
  const std::int64_t n = xquant::shape_numel(shape), H = shape.back(), S = shape[shape.size() - 2];
  const std::int64_t B = n / std::max<std::int64_t>(S * H, 1);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  std::vector<float> xv(static_cast<std::size_t>(n));
  for (auto& v : xv) v = u(rng);
  if (n > 8) {  // ties after scaling are unlikely with random data: add landmarks
    xv[1] = 0.f;
    xv[2] = -0.f;
    xv[3] = 4.f;
    xv[5] = -4.f;
  }
  const Tensor x = make_float(dt, shape, xv);
  std::vector<float> xw(xv.size());  // x widened as stored
  for (std::size_t i = 0; i < xv.size(); ++i)
    xw[i] = xquant::detail::load_float(dt, x.data(), static_cast<std::int64_t>(i));
  Tensor sm;
  std::optional<xquant::ConstTensorView> smv;
  std::vector<float> sv;
  if (smooth) {
    const std::int64_t len = mode == DynamicQuantMode::perchannel ? S : H;
    for (std::int64_t i = 0; i < len; ++i) sv.push_back(0.25f + 0.125f * static_cast<float>(i % 11));
    sm = make_float(DType::float32, {len}, sv);
    smv = sm.view();
  }
  std::vector<float> xs(xw.size());
  std::vector<std::vector<std::int64_t>> groups;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t h = i % H, s = (i / H) % std::max<std::int64_t>(S, 1);
    xs[static_cast<std::size_t>(i)] =
        smooth ? xw[static_cast<std::size_t>(i)] *
                     sv[static_cast<std::size_t>(mode == DynamicQuantMode::perchannel ? s : h)]
               : xw[static_cast<std::size_t>(i)];
  }
  if (mode == DynamicQuantMode::pertensor) {
    groups.emplace_back();
    for (std::int64_t i = 0; i < n; ++i) groups[0].push_back(i);
  } else if (mode == DynamicQuantMode::perchannel) {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        groups.emplace_back();
        for (std::int64_t s = 0; s < S; ++s) groups.back().push_back((b * S + s) * H + h);
      }
  } else {
    for (std::int64_t r = 0; r < n / H; ++r) {
      groups.emplace_back();
      for (std::int64_t h = 0; h < H; ++h) groups.back().push_back(r * H + h);
    }
  }
  const Oracle want = oracle(xs, groups, q, symmetric);
  for (auto backend : {xquant::Backend::cpu, xquant::Backend::reference}) {
    xquant::set_backend(backend);
    Tensor y, scale, offset;
    if (symmetric) {
      auto r = xquant::dynamic_quant(x.view(), smv, std::nullopt, q, mode);
      y = std::move(r.y);
      scale = std::move(r.scale);
    } else {
      auto r = xquant::dynamic_quant_asymmetric(x.view(), smv, std::nullopt, q, mode);
      y = std::move(r.y);
      scale = std::move(r.scale);
      offset = std::move(r.offset);
    }
    ASSERT_EQ(y.dtype(), xquant::storage_dtype(q));
    ASSERT_EQ(y.shape(), shape);
    ASSERT_EQ(scale.numel(), static_cast<std::int64_t>(want.scale.size()));
    const auto* yb = static_cast<const std::uint8_t*>(y.data());
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
      if (yb[i] != want.y[static_cast<std::size_t>(i)] && bad++ < 3)
        ADD_FAILURE() << "y[" << i << "] = " << int(yb[i]) << " want " << int(want.y[static_cast<std::size_t>(i)])
                      << " (x' " << xs[static_cast<std::size_t>(i)] << ")";
    for (std::size_t g = 0; g < want.scale.size(); ++g) {
      EXPECT_TRUE(same_float_bits(scale.data<float>()[g], want.scale[g])) << "scale[" << g << "]";
      if (!symmetric) {
        EXPECT_TRUE(same_float_bits(offset.data<float>()[g], want.offset[g])) << "offset[" << g << "]";
      }
    }
    EXPECT_EQ(bad, 0) << xquant::shape_str(shape) << " " << xquant::quant_dtype_name(q);
  }
  xquant::set_backend(xquant::Backend::cpu);
}

TEST(DynamicQuantFloat8, EveryModeAgainstOracle) {
  std::uint32_t seed = 1;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (QuantDType q : {QuantDType::float8_e4m3fn, QuantDType::float8_e5m2})
      for (bool sym : {true, false})
        for (auto mode : {DynamicQuantMode::pertoken, DynamicQuantMode::pertensor, DynamicQuantMode::perchannel})
          for (bool smooth : {false, true}) {
            if (smooth && mode == DynamicQuantMode::pertensor) continue;
            for (const Shape& shape : {Shape{4, 16}, Shape{2, 5, 33}, Shape{1, 1}})
              run_case(dt, shape, q, sym, mode, smooth, seed++);
          }
}

TEST(DynamicQuantPerChannel, Int8AgainstOracle) {
  std::uint32_t seed = 100;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (bool sym : {true, false})
      for (bool smooth : {false, true})
        for (const Shape& shape : {Shape{32, 256}, Shape{2, 3, 40}, Shape{3, 1, 7}})
          run_case(dt, shape, QuantDType::qint8, sym, DynamicQuantMode::perchannel, smooth, seed++);
}

TEST(DynamicQuantSymmetric, PerTensorAgainstOracle) {
  std::uint32_t seed = 200;
  for (DType dt : {DType::float32, DType::float16, DType::bfloat16})
    for (const Shape& shape : {Shape{4, 16}, Shape{2, 5, 33}})
      run_case(dt, shape, QuantDType::qint8, true, DynamicQuantMode::pertensor, false, seed++);
}

// Written-out values: a symmetric float8_e4m3fn row [1, -2, 3.5, 0] has scale 3.5 / 448 and y = x / scale
// rounded to e4m3fn; a zero row gives scale 0 and NaN (0 / 0) for every element.
TEST(DynamicQuantFloat8, HandComputed) {
  const Tensor x = make_float(DType::float32, {2, 4}, {1.f, -2.f, 3.5f, 0.f, 0.f, 0.f, -0.f, 0.f});
  auto r = xquant::dynamic_quant(x.view(), std::nullopt, std::nullopt, QuantDType::float8_e4m3fn);
  const float s0 = 3.5f / 448.f;
  EXPECT_EQ(r.scale.data<float>()[0], s0);
  EXPECT_EQ(r.scale.data<float>()[1], 0.f);
  const auto* y = static_cast<const std::uint8_t*>(r.y.data());
  // s0 = 2^-7: 1 / s0 = 128 = 2^7 (exponent field 14, mantissa 0: 0x70), -256 -> 0xF8, 448 -> 0x7E
  EXPECT_EQ(y[0], to_f8(1.f / s0, QuantDType::float8_e4m3fn));
  EXPECT_EQ(y[0], 0x70);
  EXPECT_EQ(y[1], 0xF8);
  EXPECT_EQ(y[2], 0x7E);
  EXPECT_EQ(y[3], 0x00);
  for (int j = 4; j < 8; ++j) EXPECT_EQ(y[j], 0x7F) << j;
}

}  // namespace

namespace {

// Planning (shapes and dtypes without data) of the new forms.
TEST(DynamicQuantPlan, Float8AndPerChannelShapes) {
  using xquant::TensorSpec;
  auto p = xquant::plan_dynamic_quant(TensorSpec{DType::bfloat16, {2, 32, 256}}, TensorSpec{DType::bfloat16, {32}},
                                      std::nullopt, QuantDType::qint8, DynamicQuantMode::perchannel);
  EXPECT_EQ(p.y_dtype, DType::int8);
  EXPECT_EQ(p.y_shape, (Shape{2, 32, 256}));
  EXPECT_EQ(p.param_shape, (Shape{2, 256}));
  p = xquant::plan_dynamic_quant_asymmetric(TensorSpec{DType::float32, {4, 16}}, std::nullopt, std::nullopt,
                                            QuantDType::float8_e5m2, DynamicQuantMode::pertensor);
  EXPECT_EQ(p.y_dtype, DType::float8_e5m2);
  EXPECT_EQ(p.y_shape, (Shape{4, 16}));
  EXPECT_EQ(p.param_shape, (Shape{1}));
  EXPECT_THROW(xquant::plan_dynamic_quant(TensorSpec{DType::float32, {4, 16}}, TensorSpec{DType::float32, {16}},
                                          std::nullopt, QuantDType::qint8, DynamicQuantMode::perchannel),
               xquant::Error);  // smooth_scales must be [S] = [4]
}

}  // namespace
