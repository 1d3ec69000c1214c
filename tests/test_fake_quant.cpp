// Fake tensor quantization (SPEC section 1): hand-computed vectors, an independent formula, every
// num_bits / unsigned / narrow combination, edge values, gradients and every validation path.
#include <cmath>
#include <cstdint>
#include <random>

#include "test_util.hpp"

namespace {
using namespace xqtest;
using xquant::ErrorCode;
using xquant::FakeQuantOptions;

// Independent statement of SPEC 1, written from the text (not from the library's reference).
struct Expect {
  double min_b, max_b;  // exact bounds as doubles
  float scale;
  explicit Expect(float amax, int nb, bool uns, bool narrow) {
    const std::uint64_t bound = (std::uint64_t{1} << (nb - 1 + (uns ? 1 : 0))) - 1;
    max_b = static_cast<double>(bound);
    min_b = -(static_cast<double>(bound) + (narrow ? 0.0 : 1.0));  // also unsigned (SPEC 1, revised)
    scale = static_cast<float>(max_b) / amax;
  }
  float forward(float x) const {
    if (std::isnan(x)) return x;
    if (!(std::isfinite(scale) && scale != 0.0f)) return 0.0f;
    float q = std::nearbyint(x * scale);
    const float lo = static_cast<float>(min_b), hi = static_cast<float>(max_b);
    q = q < lo ? lo : (q > hi ? hi : q);
    return q / scale;
  }
};

std::vector<float> run_per_tensor(DType dt, const std::vector<float>& x, float amax, FakeQuantOptions o = {}) {
  Tensor in = make_float(dt, {static_cast<std::int64_t>(x.size())}, x);
  Tensor a = make_float(DType::float32, {1}, {amax});
  Tensor out = xquant::fake_tensor_quant(in, a, o);
  EXPECT_EQ(out.dtype(), dt);
  EXPECT_EQ(out.shape(), in.shape());
  return to_floats(out);
}

TEST(FakeQuant, HandComputedTiesAndSaturationNarrow) {
  // amax = 127 gives scale exactly 1: out = clamp(rint(x), -127, 127).
  const std::vector<float> x = {0.5f,   1.5f,  2.5f,   -0.5f,  -1.5f,   -2.5f,   126.5f,
                                127.5f, 200.f, -200.f, -128.f, 3.4e38f, -3.4e38f};
  const std::vector<float> want = {0.f, 2.f, 2.f, -0.f, -2.f, -2.f, 126.f, 127.f, 127.f, -127.f, -127.f, 127.f, -127.f};
  expect_floats_bitexact(run_per_tensor(DType::float32, x, 127.f), want, "narrow");
}

TEST(FakeQuant, HandComputedWideRangeAndUnsigned) {
  const std::vector<float> x = {-200.f, -128.f, -127.5f, -0.25f, 254.5f, 300.f};
  expect_floats_bitexact(run_per_tensor(DType::float32, x, 127.f, {8, false, false}),
                         {-128.f, -128.f, -128.f, -0.f, 127.f, 127.f}, "wide");
  // unsigned 8 bit: bound 255, amax 255 -> scale 1, range [-255, 255] (SPEC 1: is_unsigned only doubles
  // the bound; the lower bound stays negative as in the seed's formula and the Ascend kernel).
  expect_floats_bitexact(run_per_tensor(DType::float32, x, 255.f, {8, true, true}),
                         {-200.f, -128.f, -128.f, -0.f, 254.f, 255.f}, "unsigned");
  expect_floats_bitexact(run_per_tensor(DType::float32, {-300.f, -255.5f}, 255.f, {8, true, false}), {-256.f, -256.f},
                         "unsigned wide");
}

TEST(FakeQuant, ScaleNotOneDividesBack) {
  // amax = 2, 8 bit: scale = 63.5; x = 1 -> rint(63.5) = 64 -> 64 / 63.5.
  const float scale = 127.f / 2.f;
  const std::vector<float> x = {1.f, -1.f, 2.f, 2.5f, 0.1f};
  const std::vector<float> want = {64.f / scale, -64.f / scale, 127.f / scale, 127.f / scale,
                                   std::nearbyint(0.1f * scale) / scale};
  expect_floats_bitexact(run_per_tensor(DType::float32, x, 2.f), want);
}

TEST(FakeQuant, InfNanPolicy) {
  const std::vector<float> x = {kInf, -kInf, kNaN, -kNaN, 0.f};
  const auto got = run_per_tensor(DType::float32, x, 127.f);
  EXPECT_EQ(got[0], 127.f);
  EXPECT_EQ(got[1], -127.f);
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_TRUE(std::isnan(got[3]));
  EXPECT_TRUE(same_bits(got[4], 0.f));
}

TEST(FakeQuant, AmaxZeroAndTinyGiveZeroButKeepNaN) {
  for (float amax : {0.f, 1e-45f}) {  // 127 / 1e-45 overflows to Inf
    const auto got = run_per_tensor(DType::float32, {1.f, -3.f, kInf, kNaN, 0.f}, amax);
    EXPECT_TRUE(same_bits(got[0], 0.f)) << amax;
    EXPECT_TRUE(same_bits(got[1], 0.f)) << amax;
    EXPECT_TRUE(same_bits(got[2], 0.f)) << amax;
    EXPECT_TRUE(std::isnan(got[3])) << amax;
    EXPECT_TRUE(same_bits(got[4], 0.f)) << amax;
  }
}

TEST(FakeQuant, EveryNumBitsUnsignedNarrowCombination) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> x(257);
  for (auto& v : x) v = u(rng);
  x.insert(x.end(), {0.5f, -0.5f, 2.5f, -2.5f, 1e30f, -1e30f, kInf, -kInf, kNaN, 0.f, -0.f, 1e-40f});
  for (int nb : {1, 2, 3, 4, 8, 16, 24, 31, 32})
    for (bool uns : {false, true})
      for (bool narrow : {false, true})
        for (float amax : {2.5f, 1.f, 0.f}) {
          const Expect e(amax, nb, uns, narrow);  // float32 inputs
          std::vector<float> want;
          for (float v : x) want.push_back(e.forward(v));
          expect_floats_bitexact(run_per_tensor(DType::float32, x, amax, {nb, uns, narrow}), want,
                                 "nb=" + std::to_string(nb) + " uns=" + std::to_string(uns) +
                                     " narrow=" + std::to_string(narrow) + " amax=" + std::to_string(amax));
        }
}

TEST(FakeQuant, BoundsAtTheExtremeWidths) {
  // num_bits 32 signed wide: [-2^31, 2^31 - 1] -> float bounds -2147483648, 2147483648.
  const auto got = run_per_tensor(DType::float32, {1e20f, -1e20f}, 2147483648.f, {32, false, false});
  EXPECT_EQ(got[0], 2147483648.f / (2147483648.f / 2147483648.f));
  EXPECT_EQ(got[1], -2147483648.f);
  // num_bits 1 signed: bound 0, scale 0 -> output 0.
  expect_floats_bitexact(run_per_tensor(DType::float32, {5.f, -5.f}, 1.f, {1, false, true}), {0.f, 0.f});
  // num_bits 1 unsigned: bound 1, [-1, 1].
  expect_floats_bitexact(run_per_tensor(DType::float32, {0.4f, 0.6f, -1.f, 9.f, -9.f}, 1.f, {1, true, true}),
                         {0.f, 1.f, -1.f, 1.f, -1.f});
}

TEST(FakeQuant, Bfloat16NarrowsOnceFromFloat32) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (DType dt : {DType::bfloat16}) {
    std::vector<float> x(1000);
    for (auto& v : x) v = u(rng);
    Tensor in = make_float(dt, {1000}, x);
    const std::vector<float> xw = to_floats(in);  // the widened inputs
    const float amax = 3.f;
    const Expect e(amax, 8, false, true);
    Tensor out = xquant::fake_tensor_quant(in, make_float(DType::float32, {1}, {amax}));
    std::vector<float> want;
    for (float v : xw) {
      const float r = e.forward(v);
      want.push_back(dt == DType::float16 ? xquant::half_to_float(xquant::float_to_half(r))
                                          : xquant::bfloat16_to_float(xquant::float_to_bfloat16(r)));
    }
    expect_floats_bitexact(to_floats(out), want, std::string(xquant::dtype_name(dt)));
  }
}

// float16 inputs follow the Ascend kernel's float16 arithmetic (SPEC 1), stated here with the compiler's
// own _Float16 arithmetic (g++ on x86-64: each operation rounded once to float16), independent of the
// library's conversions: scale = M / amax, t = x * scale, out = clamp(rint(t), m, M) / scale, all in half.
#include "test_half_type.hpp"  // XQ_TEST_HALF_TYPE: the compiler's float16 type
#if defined(XQ_TEST_HALF_TYPE)
using TestHalf = XQ_TEST_HALF_TYPE;
namespace {
float half_expect(TestHalf x, TestHalf amax, int nb, bool uns, bool narrow) {
  const std::int64_t bound = (std::int64_t{1} << (nb - 1 + (uns ? 1 : 0))) - 1;
  const auto M = static_cast<TestHalf>(static_cast<float>(bound));
  const auto m = static_cast<TestHalf>(static_cast<float>(-(bound + (narrow ? 0 : 1))));
  const TestHalf scale = M / amax;
  if (x != x) return static_cast<float>(x);
  if (!std::isfinite(static_cast<float>(scale)) || scale == static_cast<TestHalf>(0.f)) return 0.f;
  const TestHalf t = x * scale;
  TestHalf q = static_cast<TestHalf>(std::nearbyint(static_cast<float>(t)));
  if (q > M) q = M;
  if (q < m) q = m;
  return static_cast<float>(static_cast<TestHalf>(q / scale));
}
}  // namespace

TEST(FakeQuant, Float16FollowsTheKernelsHalfArithmetic) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-6.f, 6.f);
  std::vector<float> x(4000);
  for (auto& v : x) v = u(rng);
  x.insert(x.end(), {0.f, -0.f, 65504.f, -65504.f, kInf, -kInf, kNaN, 6e-8f, -3e-5f, 1e-4f});
  Tensor in = make_float(DType::float16, {static_cast<std::int64_t>(x.size())}, x);
  const std::vector<float> xw = to_floats(in);  // the float16 inputs, widened exactly
  std::size_t differs_from_f32 = 0;
  for (int nb : {2, 4, 8, 11, 12, 16})
    for (bool uns : {false, true})
      for (bool narrow : {false, true})
        for (float amax : {5.f, 1.5f, 0.0999755859375f /* exact half */, 0.f, 6e-8f /* half subnormal */}) {
          const auto a16 = static_cast<TestHalf>(amax);
          Tensor a = make_float(DType::float16, {1}, {amax});
          Tensor out = xquant::fake_tensor_quant(in, a, {nb, uns, narrow});
          std::vector<float> want;
          for (float v : xw) want.push_back(half_expect(static_cast<TestHalf>(v), a16, nb, uns, narrow));
          const std::string what = "nb=" + std::to_string(nb) + " uns=" + std::to_string(uns) +
                                   " narrow=" + std::to_string(narrow) + " amax=" + std::to_string(amax);
          expect_floats_bitexact(to_floats(out), want, what);
          // The same amax as a float32 tensor gives the same result (it is exact in float16).
          EXPECT_TRUE(same_bytes(
              out.view(), xquant::fake_tensor_quant(in, make_float(DType::float32, {1}, {static_cast<float>(a16)}),
                                                    {nb, uns, narrow})
                              .view()))
              << what;
          if (nb == 8 && !uns && narrow && amax == 5.f) {
            const Expect e(static_cast<float>(a16), nb, uns, narrow);
            for (std::size_t i = 0; i < xw.size(); ++i)
              differs_from_f32 +=
                  xquant::half_to_float(xquant::float_to_half(e.forward(xw[i]))) != want[i] && !std::isnan(want[i]);
          }
        }
  // The float16 arithmetic is visible: the float32 formula narrowed once differs on some elements.
  EXPECT_GT(differs_from_f32, 0u);
}
#else
TEST(FakeQuant, Float16FollowsTheKernelsHalfArithmetic) {
  GTEST_SKIP() << "this compiler has no _Float16 arithmetic for the independent statement (g++ 12 on x86-64 has)";
}
#endif

TEST(FakeQuant, Float16AmaxMustBeExactInHalf) {
  Tensor in = make_float(DType::float16, {3}, {1.f, 2.f, 3.f});
  expect_error([&] { xquant::fake_tensor_quant(in, make_float(DType::float32, {1}, {0.1f})); },
               ErrorCode::invalid_argument, "amax", {"amax[0]", "float16"});
  expect_error(
      [&] {
        xquant::fake_tensor_quant_with_axis(make_float(DType::float16, {2, 2}, {1.f, 2.f, 3.f, 4.f}),
                                            make_float(DType::float32, {2}, {1.f, 0.3f}), 0);
      },
      ErrorCode::invalid_argument, "amax", {"amax[1]", "float16"});
  // float32 / bfloat16 inputs take any finite amax >= 0.
  EXPECT_NO_THROW(
      xquant::fake_tensor_quant(make_float(DType::float32, {1}, {1.f}), make_float(DType::float32, {1}, {0.1f})));
}

TEST(FakeQuant, AmaxInAnyFloatDtype) {
  Tensor in = make_float(DType::float32, {3}, {1.f, 2.f, 3.f});
  Tensor a16 = make_float(DType::float16, {1}, {3.f});
  Tensor a32 = make_float(DType::float32, {1}, {3.f});
  EXPECT_TRUE(same_bytes(xquant::fake_tensor_quant(in, a16).view(), xquant::fake_tensor_quant(in, a32).view()));
}

TEST(FakeQuant, InplaceWritesIntoInputs) {
  Tensor in = make_float(DType::float32, {2, 3}, {0.5f, 1.5f, 2.5f, 200.f, -200.f, kNaN});
  void* storage = in.data();
  xquant::fake_tensor_quant_inplace(in, make_float(DType::float32, {1}, {127.f}));
  EXPECT_EQ(in.data(), storage);
  expect_floats_bitexact(to_floats(in), {0.f, 2.f, 2.f, 127.f, -127.f, kNaN});
}

TEST(FakeQuant, OutVariantMayAliasInputsExactly) {
  Tensor in = make_float(DType::float32, {4}, {0.5f, 1.5f, 2.5f, 3.5f});
  xquant::fake_tensor_quant_out(in, in, make_float(DType::float32, {1}, {127.f}));
  expect_floats_bitexact(to_floats(in), {0.f, 2.f, 2.f, 4.f});
}

TEST(FakeQuant, PerAxisEveryAxisAndNegativeAxis) {
  const Shape shape = {2, 3, 4};
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i) * 0.37f - 4.f;
  Tensor in = make_float(DType::float32, shape, x);
  for (std::int64_t axis = -3; axis < 3; ++axis) {
    const std::int64_t ax = axis < 0 ? axis + 3 : axis;
    const std::int64_t C = shape[static_cast<std::size_t>(ax)];
    std::vector<float> amax;
    for (std::int64_t c = 0; c < C; ++c) amax.push_back(1.f + static_cast<float>(c));
    Tensor a = make_float(DType::float32, {C}, amax);
    Tensor out = xquant::fake_tensor_quant_with_axis(in, a, axis, {4, false, true});
    std::vector<float> want(24);
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 3; ++j)
        for (std::int64_t k = 0; k < 4; ++k) {
          const std::int64_t idx[3] = {i, j, k};
          const std::size_t flat = static_cast<std::size_t>((i * 3 + j) * 4 + k);
          want[flat] = Expect(amax[static_cast<std::size_t>(idx[ax])], 4, false, true).forward(x[flat]);
        }
    expect_floats_bitexact(to_floats(out), want, "axis=" + std::to_string(axis));
  }
}

TEST(FakeQuant, PerAxisLastAxisWithZeroAmaxChannel) {
  Tensor in = make_float(DType::float32, {2, 3}, {1.f, 1.f, 1.f, -2.f, -2.f, kNaN});
  Tensor a = make_float(DType::float32, {3}, {0.f, 127.f, 1.f});
  Tensor out = xquant::fake_tensor_quant_with_axis(in, a, -1);
  expect_floats_bitexact(to_floats(out), {0.f, 1.f, 1.f, 0.f, -2.f, kNaN});
}

TEST(FakeQuant, EmptyTensorsAreValid) {
  Tensor in(DType::float32, {0, 5});
  Tensor out = xquant::fake_tensor_quant(in, make_float(DType::float32, {1}, {1.f}));
  EXPECT_EQ(out.shape(), (Shape{0, 5}));
  Tensor out2 = xquant::fake_tensor_quant_with_axis(in, make_float(DType::float32, {5}, {1.f, 1.f, 1.f, 1.f, 1.f}), 1);
  EXPECT_EQ(out2.numel(), 0);
  Tensor a0(DType::float32, {0});
  Tensor out3 = xquant::fake_tensor_quant_with_axis(in, a0, 0);
  EXPECT_EQ(out3.numel(), 0);
}

// ---- gradients ----

// Independent implementation of the blocked order of numeric.hpp (CanonicalSum), written with arrays.
float blocked_sum(const std::vector<float>& t) {
  if (t.empty()) return 0.f;
  double total = -0.0;
  for (std::size_t start = 0; start < t.size(); start += 1024) {
    double lane[16];
    for (double& l : lane) l = -0.0;
    for (std::size_t n = start; n < std::min(t.size(), start + 1024); ++n) lane[(n - start) % 16] += t[n];
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
    total += lane[0];
  }
  return static_cast<float>(total);
}

TEST(FakeQuantBackward, HandWorkedPerTensor) {
  // amax 127 -> scale 1, window [-127, 127], ratio min/max = -1.
  Tensor x = make_float(DType::float32, {6}, {-200.f, -127.f, 0.f, 127.f, 127.5f, kNaN});
  Tensor g = make_float(DType::float32, {6}, {1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  Tensor a = make_float(DType::float32, {1}, {127.f});
  auto r = xquant::fake_tensor_quant_backward(g, x, a, std::nullopt);
  expect_floats_bitexact(to_floats(r.grad_inputs), {0.f, 2.f, 3.f, 4.f, 0.f, 0.f});
  // grad_amax = 1 * (-1) + 5 * 1 = 4
  expect_floats_bitexact(to_floats(r.grad_amax), {4.f});
  EXPECT_EQ(r.grad_amax.shape(), (Shape{1}));
}

TEST(FakeQuantBackward, UnsignedAndWideRatios) {
  Tensor x = make_float(DType::float32, {3}, {-5.f, 300.f, 10.f});
  Tensor g = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  Tensor a = make_float(DType::float32, {1}, {127.f});
  // wide signed 8 bit: window [-128, 127], ratio -128/127; x = -5 inside.
  auto r = xquant::fake_tensor_quant_backward(g, x, a, std::nullopt, {8, false, false});
  expect_floats_bitexact(to_floats(r.grad_inputs), {1.f, 0.f, 1.f});
  expect_floats_bitexact(to_floats(r.grad_amax), {1.f});
  // unsigned: bound 255, scale 255/127, window [-127, 127] (the lower bound stays negative): x = -5 is
  // inside, x = 300 above (factor 1).
  r = xquant::fake_tensor_quant_backward(g, x, a, std::nullopt, {8, true, true});
  expect_floats_bitexact(to_floats(r.grad_inputs), {1.f, 0.f, 1.f});
  expect_floats_bitexact(to_floats(r.grad_amax), {1.f});
  // ... and x = -500 below: factor min_bound / max_bound = -255 / 255 = -1.
  Tensor x2 = make_float(DType::float32, {2}, {-500.f, 300.f});
  Tensor g2 = make_float(DType::float32, {2}, {2.f, 0.5f});
  r = xquant::fake_tensor_quant_backward(g2, x2, a, std::nullopt, {8, true, true});
  expect_floats_bitexact(to_floats(r.grad_inputs), {0.f, 0.f});
  expect_floats_bitexact(to_floats(r.grad_amax), {-1.5f});
}

TEST(FakeQuantBackward, PerAxisBlockedSumsAgainstIndependentOrder) {
  // [outer=3, C=2, inner=700]: each channel sums 2100 terms (> 2 chunks of 1024).
  const std::int64_t O = 3, C = 2, I = 700;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> xs(static_cast<std::size_t>(O * C * I)), gs(xs.size());
  for (auto& v : xs) v = u(rng);
  for (auto& v : gs) v = u(rng) * 1000.f;
  Tensor x = make_float(DType::float32, {O, C, I}, xs);
  Tensor g = make_float(DType::float32, {O, C, I}, gs);
  const std::vector<float> amax = {1.f, 0.5f};
  Tensor a = make_float(DType::float32, {C}, amax);
  auto r = xquant::fake_tensor_quant_backward(g, x, a, 1, {8, false, true});
  std::vector<float> want_gx(xs.size());
  std::vector<float> want_ga;
  for (std::int64_t c = 0; c < C; ++c) {
    const float scale = 127.f / amax[static_cast<std::size_t>(c)];
    const float lo = -127.f / scale, hi = 127.f / scale;
    std::vector<float> terms;
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t i = 0; i < I; ++i) {
        const std::size_t k = static_cast<std::size_t>((o * C + c) * I + i);
        want_gx[k] = (xs[k] >= lo && xs[k] <= hi) ? gs[k] : 0.f;
        terms.push_back(gs[k] * (xs[k] > hi ? 1.f : xs[k] < lo ? -1.f : 0.f));
      }
    want_ga.push_back(blocked_sum(terms));
  }
  expect_floats_bitexact(to_floats(r.grad_inputs), want_gx, "grad_inputs");
  expect_floats_bitexact(to_floats(r.grad_amax), want_ga, "grad_amax");
}

TEST(FakeQuantBackward, AmaxZeroWindowIsZeroWidth) {
  // amax = 0: scale = Inf, window [-0, 0]: only x == 0 passes; x > 0 pulls amax up (PACT), x < 0 by ratio.
  Tensor x = make_float(DType::float32, {3}, {0.f, 2.f, -2.f});
  Tensor g = make_float(DType::float32, {3}, {1.f, 3.f, 5.f});
  auto r = xquant::fake_tensor_quant_backward(g, x, make_float(DType::float32, {1}, {0.f}), std::nullopt);
  expect_floats_bitexact(to_floats(r.grad_inputs), {1.f, 0.f, 0.f});
  expect_floats_bitexact(to_floats(r.grad_amax), {3.f - 5.f});
}

TEST(FakeQuantBackward, InPlaceGradIntoInputsKeepsAmaxSums) {
  Tensor x = make_float(DType::float32, {3}, {-200.f, 0.f, 300.f});
  Tensor g = make_float(DType::float32, {3}, {1.f, 2.f, 3.f});
  Tensor a = make_float(DType::float32, {1}, {127.f});
  Tensor ga(DType::float32, {1});
  xquant::fake_tensor_quant_backward_out(x, ga.view(), g, x, a, std::nullopt);
  expect_floats_bitexact(to_floats(x), {0.f, 2.f, 0.f});
  expect_floats_bitexact(to_floats(ga), {-1.f + 3.f});
}

TEST(FakeQuantBackward, WithoutGradAmax) {
  Tensor x = make_float(DType::bfloat16, {2}, {1.f, 500.f});
  Tensor g = make_float(DType::bfloat16, {2}, {0.5f, 0.5f});
  auto r = xquant::fake_tensor_quant_backward(g, x, make_float(DType::bfloat16, {1}, {127.f}), std::nullopt, {}, false);
  EXPECT_EQ(r.grad_amax.numel(), 0);
  EXPECT_EQ(r.grad_inputs.dtype(), DType::bfloat16);
  expect_floats_bitexact(to_floats(r.grad_inputs), {0.5f, 0.f});
}

// ---- validation ----

TEST(FakeQuantErrors, EveryPathNamesTheArgumentAndWritesNothing) {
  Tensor x = make_float(DType::float32, {2, 3}, {1.f, 2.f, 3.f, 4.f, 5.f, 6.f});
  Tensor a1 = make_float(DType::float32, {1}, {1.f});
  Tensor out(DType::float32, {2, 3});
  fill_bytes(out);
  auto untouched = [&] { EXPECT_TRUE(all_bytes(out)); };

  Tensor xi = make_typed<std::int8_t>(DType::int8, {2}, {1, 2});
  expect_error([&] { xquant::fake_tensor_quant(xi, a1); }, ErrorCode::dtype_mismatch, "inputs", {"int8", "float32"});
  Tensor ai = make_typed<std::int32_t>(DType::int32, {1}, {1});
  expect_error([&] { xquant::fake_tensor_quant_out(out, x, ai); }, ErrorCode::dtype_mismatch, "amax", {"int32"});
  untouched();
  Tensor a2 = make_float(DType::float32, {2}, {1.f, 1.f});
  expect_error([&] { xquant::fake_tensor_quant_out(out, x, a2); }, ErrorCode::shape_mismatch, "amax",
               {"[2]", "one element"});
  untouched();
  expect_error([&] { xquant::fake_tensor_quant_with_axis_out(out, x, a2, 1); }, ErrorCode::shape_mismatch, "amax",
               {"[2]", "3 channels on axis 1"});
  untouched();
  expect_error([&] { xquant::fake_tensor_quant_with_axis_out(out, x, a2, 2); }, ErrorCode::invalid_argument, "axis",
               {"2", "[-2, 1]"});
  expect_error([&] { xquant::fake_tensor_quant_with_axis_out(out, x, a2, -3); }, ErrorCode::invalid_argument, "axis",
               {"-3"});
  for (int nb : {0, 33, -1})
    expect_error(
        [&] {
          xquant::fake_tensor_quant_out(out, x, a1, {nb, false, true});
        },
        ErrorCode::invalid_argument, "num_bits", {std::to_string(nb), "[1, 32]"});
  untouched();
  Tensor a3 = make_float(DType::float32, {3}, {1.f, -1.f, 2.f});
  expect_error([&] { xquant::fake_tensor_quant_with_axis_out(out, x, a3, 1); }, ErrorCode::invalid_argument, "amax",
               {"amax[1]", "-1", "finite value >= 0"});
  Tensor a4 = make_float(DType::float32, {3}, {1.f, 1.f, kNaN});
  expect_error([&] { xquant::fake_tensor_quant_with_axis_out(out, x, a4, 1); }, ErrorCode::invalid_argument, "amax",
               {"amax[2]", "nan"});
  Tensor a5 = make_float(DType::float32, {1}, {kInf});
  expect_error([&] { xquant::fake_tensor_quant_out(out, x, a5); }, ErrorCode::invalid_argument, "amax", {"inf"});
  untouched();
  Tensor out_bad(DType::float16, {2, 3});
  expect_error([&] { xquant::fake_tensor_quant_out(out_bad, x, a1); }, ErrorCode::dtype_mismatch, "out", {"float16"});
  Tensor out_shape(DType::float32, {3, 2});
  fill_bytes(out_shape);
  expect_error([&] { xquant::fake_tensor_quant_out(out_shape, x, a1); }, ErrorCode::shape_mismatch, "out",
               {"[3, 2]", "[2, 3]"});
  EXPECT_TRUE(all_bytes(out_shape));
  // partial overlap of out and inputs
  Tensor buf = make_float(DType::float32, {8}, {1, 2, 3, 4, 5, 6, 7, 8});
  TensorView in_v(buf.data<float>(), DType::float32, {6});
  TensorView out_v(buf.data<float>() + 2, DType::float32, {6});
  expect_error([&] { xquant::fake_tensor_quant_out(out_v, in_v, a1); }, ErrorCode::aliasing, "out",
               {"partially overlaps"});
  expect_floats_bitexact(to_floats(buf), {1, 2, 3, 4, 5, 6, 7, 8});
  // null data
  TensorView null_in(nullptr, DType::float32, {4});
  expect_error([&] { xquant::fake_tensor_quant(null_in, a1); }, ErrorCode::invalid_argument, "inputs", {"null"});
}

TEST(FakeQuantErrors, FailedInplaceLeavesInputUntouched) {
  Tensor x = make_float(DType::float32, {4}, {0.3f, 1.7f, -2.2f, 9.f});
  Tensor before = Tensor::copy_of(x);
  expect_error([&] { xquant::fake_tensor_quant_inplace(x, make_float(DType::float32, {1}, {-1.f})); },
               ErrorCode::invalid_argument, "amax");
  expect_error(
      [&] {
        xquant::fake_tensor_quant_inplace(x, make_float(DType::float32, {1}, {1.f}), {40, false, true});
      },
      ErrorCode::invalid_argument, "num_bits");
  EXPECT_TRUE(same_bytes(x, before));
}

TEST(FakeQuantErrors, Backward) {
  Tensor x = make_float(DType::float32, {2}, {1.f, 2.f});
  Tensor a = make_float(DType::float32, {1}, {1.f});
  Tensor g16 = make_float(DType::float16, {2}, {1.f, 2.f});
  expect_error([&] { xquant::fake_tensor_quant_backward(g16, x, a, std::nullopt); }, ErrorCode::dtype_mismatch,
               "grad_out");
  Tensor g3 = make_float(DType::float32, {3}, {1.f, 2.f, 3.f});
  expect_error([&] { xquant::fake_tensor_quant_backward(g3, x, a, std::nullopt); }, ErrorCode::shape_mismatch,
               "grad_out");
  Tensor g = make_float(DType::float32, {2}, {1.f, 2.f});
  Tensor gi(DType::float32, {2});
  Tensor ga_bad(DType::float32, {2});
  fill_bytes(gi);
  expect_error([&] { xquant::fake_tensor_quant_backward_out(gi, ga_bad.view(), g, x, a, std::nullopt); },
               ErrorCode::shape_mismatch, "grad_amax");
  EXPECT_TRUE(all_bytes(gi));
}

}  // namespace
