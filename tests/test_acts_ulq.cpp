// ActsULQ (SPEC section 5): forward and backward against hand-worked values and against an independent
// scalar formula written here (broadcasting by div/mod, the blocked sum of numeric.hpp re-implemented).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

using namespace xqtest;
using xquant::ErrorCode;

constexpr float kEps = 1.192092896e-7f;

// ------------------------------------------------------------------------------------------------------
// Independent model
// ------------------------------------------------------------------------------------------------------

float levels_of(int num_bits) { return static_cast<float>((1 << num_bits) - 1); }

// One float32 value rounded to dt and widened back (the single narrowing of an output).
float narrow(DType dt, float v) {
  switch (dt) {
    case DType::float16:
      return xquant::half_to_float(xquant::float_to_half(v));
    case DType::bfloat16:
      return xquant::bfloat16_to_float(xquant::float_to_bfloat16(v));
    default:
      return v;
  }
}

struct Elem {
  float y, min_mask, max_mask, loss;
};

// SPEC 5 for one element, written out with explicit NaN tests instead of nan_min / nan_max.
Elem ulq_formula(float x, float cmin, float cmax, bool fixed_min, int num_bits) {
  const float levels = levels_of(num_bits);
  const float floor_max = levels * kEps;
  float ori_min = 0.0f;
  if (!fixed_min) ori_min = std::isnan(cmin) ? cmin : (cmin > 0.0f ? 0.0f : cmin);
  const float ori_max = std::isnan(cmax) ? cmax : (floor_max > cmax ? floor_max : cmax);
  const float s = (ori_max - ori_min) / levels;
  const float off = std::nearbyint(ori_min / s);
  const float lo = s * off;
  const float hi = s * (off + levels);
  float xc = x;
  if (std::isnan(x) || std::isnan(lo) || std::isnan(hi)) {
    xc = kNaN;
  } else {
    if (lo > xc) xc = lo;
    if (hi < xc) xc = hi;
  }
  const bool mn = x >= lo;
  const bool mx = x <= hi;
  const float raw = xc / s;
  const float rx = std::nearbyint(raw);
  const float loss = (rx - raw) / levels;
  const float raw_m = ori_min / s;
  const float loss_m = (std::nearbyint(raw_m) - raw_m) / levels;
  return {rx * s, mn ? 1.0f : 0.0f, mx ? 1.0f : 0.0f, (mn && mx) ? loss : loss_m};
}

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  std::size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const auto& s : shapes)
    for (std::size_t i = 0; i < s.size(); ++i) {
      const std::int64_t d = s[s.size() - 1 - i];
      if (d != 1) out[rank - 1 - i] = d;
    }
  return out;
}

// Flat index into an operand of shape `op` read at flat output position `o` (NumPy broadcasting).
std::int64_t operand_index(const Shape& out, std::int64_t o, const Shape& op) {
  std::int64_t index = 0, stride = 1, rem = o;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t d = out.size() - 1 - i;
    const std::int64_t idx = rem % out[d];
    rem /= out[d];
    if (i < op.size()) {
      const std::int64_t od = op[op.size() - 1 - i];
      if (od != 1) index += idx * stride;
      stride *= od;
    }
  }
  return index;
}

struct Forward {
  Shape shape;
  std::vector<float> y, min_mask, max_mask, loss;
};

Forward expected_forward(const Tensor& x, const Tensor& cmin, const Tensor& cmax, bool fixed_min, int num_bits) {
  Forward f;
  f.shape = broadcast_shapes({x.shape(), cmin.shape(), cmax.shape()});
  const auto xv = to_floats(x), minv = to_floats(cmin), maxv = to_floats(cmax);
  const DType dt = x.dtype();
  for (std::int64_t o = 0; o < numel_of(f.shape); ++o) {
    const Elem e = ulq_formula(xv[operand_index(f.shape, o, x.shape())], minv[operand_index(f.shape, o, cmin.shape())],
                               maxv[operand_index(f.shape, o, cmax.shape())], fixed_min, num_bits);
    f.y.push_back(narrow(dt, e.y));
    f.min_mask.push_back(narrow(dt, e.min_mask));
    f.max_mask.push_back(narrow(dt, e.max_mask));
    f.loss.push_back(narrow(dt, e.loss));
  }
  return f;
}

// The canonical blocked sum (numeric.hpp), re-implemented: chunks of 1024 terms, 16 double lanes per chunk
// (term n in lane n % 16) starting at -0, folded by halving (8, 4, 2, 1), chunk values added in order to a
// double total starting at -0, rounded once. An empty sum is +0.
float blocked_sum(const std::vector<float>& terms) {
  if (terms.empty()) return 0.0f;
  double total = -0.0;
  for (std::size_t c = 0; c < terms.size(); c += 1024) {
    double lane[16];
    for (double& l : lane) l = -0.0;
    for (std::size_t n = c; n < terms.size() && n < c + 1024; ++n) lane[n % 16] += static_cast<double>(terms[n]);
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
    total += lane[0];
  }
  return static_cast<float>(total);
}

// For every element of a target of shape `target` (which broadcasts to `out`): the blocked sum of term(o)
// over the output positions o that read it, in increasing o.
template <typename Term>
std::vector<float> expected_reduction(const Shape& out, const Shape& target, Term term) {
  std::vector<std::vector<float>> terms(static_cast<std::size_t>(numel_of(target)));
  for (std::int64_t o = 0; o < numel_of(out); ++o)
    terms[static_cast<std::size_t>(operand_index(out, o, target))].push_back(term(o));
  std::vector<float> r;
  for (const auto& t : terms) r.push_back(blocked_sum(t));
  return r;
}

struct Backward {
  std::vector<float> x_grad, min_grad, max_grad;
};

Backward expected_backward(const Tensor& y_grad, const Shape& x_shape, const Tensor& cmin, const Tensor& cmax,
                           const Tensor& min_mask, const Tensor& max_mask, const Tensor& loss, bool fixed_min,
                           int num_bits) {
  const DType dt = cmin.dtype();
  const Shape out = y_grad.shape();
  const auto g = to_floats(y_grad), mn = to_floats(min_mask), mx = to_floats(max_mask), l = to_floats(loss);
  const auto minv = to_floats(cmin), maxv = to_floats(cmax);
  const float floor_max = levels_of(num_bits) * kEps;
  const auto at = [](std::int64_t o) { return static_cast<std::size_t>(o); };
  Backward b;
  b.x_grad = expected_reduction(out, x_shape, [&](std::int64_t o) { return (g[at(o)] * mn[at(o)]) * mx[at(o)]; });
  b.min_grad =
      expected_reduction(out, cmin.shape(), [&](std::int64_t o) { return g[at(o)] * ((1.0f - mn[at(o)]) - l[at(o)]); });
  b.max_grad =
      expected_reduction(out, cmax.shape(), [&](std::int64_t o) { return g[at(o)] * (l[at(o)] + (1.0f - mx[at(o)])); });
  for (std::size_t t = 0; t < b.min_grad.size(); ++t)
    if (fixed_min || minv[t] > 0.0f) b.min_grad[t] = 0.0f;
  for (std::size_t t = 0; t < b.max_grad.size(); ++t)
    if (maxv[t] < floor_max) b.max_grad[t] = 0.0f;
  for (auto* v : {&b.x_grad, &b.min_grad, &b.max_grad})
    for (float& e : *v) e = narrow(dt, e);
  return b;
}

// ------------------------------------------------------------------------------------------------------
// Harness
// ------------------------------------------------------------------------------------------------------

std::vector<float> random_values(std::mt19937& rng, std::int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& e : v) e = dist(rng);
  return v;
}

Tensor random_tensor(std::mt19937& rng, DType dt, const Shape& shape, float lo, float hi) {
  return make_float(dt, shape, random_values(rng, numel_of(shape), lo, hi));
}

// Values u * 2^e with u in [-1, 1) and e spread widely, so that double sums of them are inexact and the
// summation order shows in the result.
Tensor wide_tensor(std::mt19937& rng, DType dt, const Shape& shape) {
  const int emax = dt == DType::float16 ? 14 : 60;
  std::uniform_int_distribution<int> exponent(-emax, emax);
  std::vector<float> v = random_values(rng, numel_of(shape), -1.0f, 1.0f);
  for (float& e : v) e = std::ldexp(e, exponent(rng));
  return make_float(dt, shape, v);
}

// Runs the allocating forward and the out-variant (sentinel-filled outputs) and compares both bit-exactly
// with the model. Returns the allocating result.
xquant::ActsUlqResult check_forward(const Tensor& x, const Tensor& cmin, const Tensor& cmax, bool fixed_min,
                                    int num_bits, const std::string& what) {
  const Forward e = expected_forward(x, cmin, cmax, fixed_min, num_bits);
  EXPECT_EQ(xquant::acts_ulq_output_shape(x.shape(), cmin.shape(), cmax.shape()), e.shape) << what;
  auto r = xquant::acts_ulq(x, cmin, cmax, fixed_min, num_bits);
  for (const Tensor* t : {&r.y, &r.clamp_min_mask, &r.clamp_max_mask, &r.x_clamped_loss}) {
    EXPECT_EQ(t->shape(), e.shape) << what;
    EXPECT_EQ(t->dtype(), x.dtype()) << what;
  }
  expect_floats_bitexact(to_floats(r.y), e.y, what + " y");
  expect_floats_bitexact(to_floats(r.clamp_min_mask), e.min_mask, what + " clamp_min_mask");
  expect_floats_bitexact(to_floats(r.clamp_max_mask), e.max_mask, what + " clamp_max_mask");
  expect_floats_bitexact(to_floats(r.x_clamped_loss), e.loss, what + " x_clamped_loss");

  Tensor y(x.dtype(), e.shape), mn(x.dtype(), e.shape), mx(x.dtype(), e.shape), loss(x.dtype(), e.shape);
  for (Tensor* t : {&y, &mn, &mx, &loss}) fill_bytes(*t);
  xquant::acts_ulq_out(y, mn, mx, loss, x, cmin, cmax, fixed_min, num_bits);
  EXPECT_TRUE(same_bytes(y, r.y)) << what;
  EXPECT_TRUE(same_bytes(mn, r.clamp_min_mask)) << what;
  EXPECT_TRUE(same_bytes(mx, r.clamp_max_mask)) << what;
  EXPECT_TRUE(same_bytes(loss, r.x_clamped_loss)) << what;
  return r;
}

// Runs both backward forms (out-variant with sentinel-filled outputs) and compares with the model.
void check_backward(const Tensor& y_grad, const Shape& x_shape, const Tensor& cmin, const Tensor& cmax,
                    const Tensor& min_mask, const Tensor& max_mask, const Tensor& loss, bool fixed_min, int num_bits,
                    const std::string& what) {
  const Backward e = expected_backward(y_grad, x_shape, cmin, cmax, min_mask, max_mask, loss, fixed_min, num_bits);
  auto g = xquant::acts_ulq_backward(y_grad, x_shape, cmin, cmax, min_mask, max_mask, loss, fixed_min, num_bits);
  EXPECT_EQ(g.x_grad.shape(), x_shape) << what;
  EXPECT_EQ(g.clamp_min_grad.shape(), cmin.shape()) << what;
  EXPECT_EQ(g.clamp_max_grad.shape(), cmax.shape()) << what;
  for (const Tensor* t : {&g.x_grad, &g.clamp_min_grad, &g.clamp_max_grad}) EXPECT_EQ(t->dtype(), cmin.dtype()) << what;
  expect_floats_bitexact(to_floats(g.x_grad), e.x_grad, what + " x_grad");
  expect_floats_bitexact(to_floats(g.clamp_min_grad), e.min_grad, what + " clamp_min_grad");
  expect_floats_bitexact(to_floats(g.clamp_max_grad), e.max_grad, what + " clamp_max_grad");

  Tensor xg(cmin.dtype(), x_shape), ming(cmin.dtype(), cmin.shape()), maxg(cmin.dtype(), cmax.shape());
  for (Tensor* t : {&xg, &ming, &maxg}) fill_bytes(*t);
  xquant::acts_ulq_backward_out(xg, ming, maxg, y_grad, cmin, cmax, min_mask, max_mask, loss, fixed_min, num_bits);
  EXPECT_TRUE(same_bytes(xg, g.x_grad)) << what;
  EXPECT_TRUE(same_bytes(ming, g.clamp_min_grad)) << what;
  EXPECT_TRUE(same_bytes(maxg, g.clamp_max_grad)) << what;
}

// Forward on random data, then backward of random y_grad through the forward's outputs.
void check_round_trip(std::mt19937& rng, DType dt, const Shape& xs, const Shape& mins, const Shape& maxs,
                      bool fixed_min, int num_bits, const std::string& what) {
  const Tensor x = random_tensor(rng, dt, xs, -3.0f, 3.0f);
  const Tensor cmin = random_tensor(rng, dt, mins, -2.0f, 0.5f);  // some > 0: ori_min 0, gradient zeroed
  const Tensor cmax = random_tensor(rng, dt, maxs, -0.2f, 2.0f);  // some < LEVELS * EPS: floor, zeroed
  auto r = check_forward(x, cmin, cmax, fixed_min, num_bits, what);
  const Tensor y_grad = random_tensor(rng, dt, r.y.shape(), -1.0f, 1.0f);
  check_backward(y_grad, xs, cmin, cmax, r.clamp_min_mask, r.clamp_max_mask, r.x_clamped_loss, fixed_min, num_bits,
                 what + " backward");
}

std::string name_of(DType dt) { return std::string(xquant::dtype_name(dt)); }

// ------------------------------------------------------------------------------------------------------
// Forward: hand-worked values
// ------------------------------------------------------------------------------------------------------

TEST(ActsUlq, HandWorkedNumBits8ClampMinus1To1) {
  // num_bits 8: LEVELS = 255; clamp_min = -1, clamp_max = 1 -> ori_min = -1, ori_max = 1.
  const float s = (1.0f - (-1.0f)) / 255.0f;
  EXPECT_TRUE(same_bits(s, 0x1.010102p-7f));
  const float ratio = -1.0f / s;                   // ori_min / s
  EXPECT_TRUE(same_bits(ratio, -0x1.fdfffep+6f));  // -127.49999..., just above the tie
  const float off = std::nearbyint(ratio);
  EXPECT_EQ(off, -127.0f);
  const float clip_lo = s * off;
  const float clip_hi = s * (off + 255.0f);
  EXPECT_TRUE(same_bits(clip_lo, -0x1.fdfep-1f));   // -0.99607849
  EXPECT_TRUE(same_bits(clip_hi, 0x1.010102p+0f));  // 1.00392163
  EXPECT_EQ(clip_lo / s, -127.0f);
  EXPECT_EQ(clip_hi / s, 128.0f);
  const float loss_m = (off - ratio) / 255.0f;
  EXPECT_GT(loss_m, 0.0f);

  const float below_lo = std::nextafter(clip_lo, -kInf);
  const float above_hi = std::nextafter(clip_hi, kInf);
  const std::vector<float> xs = {0.3f, clip_lo, below_lo, clip_hi, above_hi, -5.0f, 5.0f, 0.0f, kNaN, kInf, -kInf};
  const float y_lo = -127.0f * s, y_hi = 128.0f * s;
  EXPECT_TRUE(same_bits(0.3f / s, 38.25f));
  // {y, clamp_min_mask, clamp_max_mask, x_clamped_loss}
  const std::vector<Elem> want = {
      {38.0f * s, 1, 1, (38.0f - 38.25f) / 255.0f},  // inside: rx = 38, loss = -0.25 / 255
      {y_lo, 1, 1, 0.0f},                            // exactly clip_lo: both masks 1, raw = -127 exactly
      {y_lo, 0, 1, loss_m},                          // just below clip_lo: clamped, loss_m
      {y_hi, 1, 1, 0.0f},                            // exactly clip_hi
      {y_hi, 1, 0, loss_m},                          // just above clip_hi
      {y_lo, 0, 1, loss_m},
      {y_hi, 1, 0, loss_m},
      {0.0f, 1, 1, 0.0f},
      {kNaN, 0, 0, loss_m},  // NaN x: y NaN, both masks 0
      {y_hi, 1, 0, loss_m},  // +Inf clamps to clip_hi
      {y_lo, 0, 1, loss_m},  // -Inf clamps to clip_lo
  };
  EXPECT_TRUE(same_bits(y_lo, clip_lo));
  EXPECT_TRUE(same_bits(y_hi, clip_hi));
  const Tensor x = make_float(DType::float32, {static_cast<std::int64_t>(xs.size())}, xs);
  const Tensor cmin = make_float(DType::float32, {}, {-1.0f});
  const Tensor cmax = make_float(DType::float32, {}, {1.0f});
  auto r = xquant::acts_ulq(x, cmin, cmax);  // defaults: fixed_min false, num_bits 8
  const auto y = to_floats(r.y), mn = to_floats(r.clamp_min_mask), mx = to_floats(r.clamp_max_mask),
             loss = to_floats(r.x_clamped_loss);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_TRUE(same_bits(y[i], want[i].y)) << i << ": " << y[i] << " vs " << want[i].y;
    EXPECT_TRUE(same_bits(mn[i], want[i].min_mask)) << i;
    EXPECT_TRUE(same_bits(mx[i], want[i].max_mask)) << i;
    EXPECT_TRUE(same_bits(loss[i], want[i].loss)) << i << ": " << loss[i] << " vs " << want[i].loss;
  }
  check_forward(x, cmin, cmax, false, 8, "hand-worked");
}

TEST(ActsUlq, TiesRoundHalfToEven) {
  // clamp_min = -8, clamp_max = 7.9375: s = 15.9375 / 255 = 1/16 exactly, off = -128, clip [-8, 7.9375].
  const float s = (7.9375f - -8.0f) / 255.0f;
  ASSERT_EQ(s, 0.0625f);
  const std::vector<float> raws = {0.5f, -0.5f, 1.5f, 2.5f, -2.5f, -3.5f, 3.5f, 126.5f, -127.5f};
  const std::vector<float> rounded = {0.0f, -0.0f, 2.0f, 2.0f, -2.0f, -4.0f, 4.0f, 126.0f, -128.0f};
  std::vector<float> xs;
  for (float r : raws) xs.push_back(r * s);  // exact
  const Tensor x = make_float(DType::float32, {static_cast<std::int64_t>(xs.size())}, xs);
  const Tensor cmin = make_float(DType::float32, {1}, {-8.0f});
  const Tensor cmax = make_float(DType::float32, {1}, {7.9375f});
  auto r = check_forward(x, cmin, cmax, false, 8, "ties");
  const auto y = to_floats(r.y), loss = to_floats(r.x_clamped_loss);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_TRUE(same_bits(y[i], rounded[i] * s)) << raws[i] << " -> " << y[i];  // -0.5 -> -0 (sign kept)
    EXPECT_TRUE(same_bits(loss[i], (rounded[i] - raws[i]) / 255.0f)) << raws[i];
  }
  EXPECT_TRUE(std::signbit(y[1]));
}

TEST(ActsUlq, FixedMinAndPositiveClampMin) {
  const std::vector<float> xs = {-1.0f, -0.001f, 0.0f, 0.1f, 0.5f, 0.99f, 1.5f};
  const Tensor x = make_float(DType::float32, {7}, xs);
  const Tensor cmax = make_float(DType::float32, {}, {1.0f});
  const Tensor neg = make_float(DType::float32, {}, {-1.0f});
  const Tensor zero = make_float(DType::float32, {}, {0.0f});
  const Tensor pos = make_float(DType::float32, {}, {0.5f});
  // fixed_min: ori_min = 0 whatever clamp_min is; clamp_min > 0: ori_min = min(clamp_min, 0) = 0.
  auto fixed = check_forward(x, neg, cmax, true, 8, "fixed_min");
  auto positive = check_forward(x, pos, cmax, false, 8, "clamp_min > 0");
  auto at_zero = check_forward(x, zero, cmax, false, 8, "clamp_min 0");
  auto free = check_forward(x, neg, cmax, false, 8, "clamp_min -1");
  EXPECT_TRUE(same_bytes(fixed.y, at_zero.y));
  EXPECT_TRUE(same_bytes(positive.y, at_zero.y));
  EXPECT_TRUE(same_bytes(positive.x_clamped_loss, at_zero.x_clamped_loss));
  EXPECT_FALSE(same_bytes(free.y, fixed.y));
  // ori_min = 0: s = 1 / 255, off = 0, clip [0, 1]: x = -0.001 is below clip_lo, loss_m = 0.
  const float s = 1.0f / 255.0f;
  const auto y = to_floats(fixed.y), mn = to_floats(fixed.clamp_min_mask), loss = to_floats(fixed.x_clamped_loss);
  EXPECT_EQ(mn[0], 0.0f);
  EXPECT_EQ(mn[1], 0.0f);
  EXPECT_EQ(mn[2], 1.0f);
  EXPECT_TRUE(same_bits(y[1], 0.0f));
  EXPECT_TRUE(same_bits(loss[1], 0.0f));
  EXPECT_TRUE(same_bits(y[3], std::nearbyint(0.1f / s) * s));
}

TEST(ActsUlq, ClampMaxBelowFloor) {
  for (int nb : {2, 8, 16}) {
    const float floor_max = levels_of(nb) * kEps;
    const Tensor x = make_float(DType::float32, {6}, {-1.0f, 0.0f, floor_max / 3.0f, floor_max, 1e-3f, kNaN});
    const Tensor cmin = make_float(DType::float32, {}, {0.0f});
    const Tensor at_floor = make_float(DType::float32, {}, {floor_max});
    for (float below : {floor_max / 2.0f, 0.0f, -1.0f, -kInf}) {
      const Tensor cmax = make_float(DType::float32, {}, {below});
      auto r = check_forward(x, cmin, cmax, false, nb, "clamp_max " + std::to_string(below));
      auto ref = xquant::acts_ulq(x, cmin, at_floor, false, nb);  // ori_max = LEVELS * EPS in both
      EXPECT_TRUE(same_bytes(r.y, ref.y));
      EXPECT_TRUE(same_bytes(r.x_clamped_loss, ref.x_clamped_loss));
    }
  }
}

TEST(ActsUlq, NaNAndInfClampValues) {
  std::mt19937 rng(11);
  const Tensor x = make_float(DType::float32, {4, 3}, random_values(rng, 12, -2.0f, 2.0f));
  const Tensor cmin = make_float(DType::float32, {4, 1}, {kNaN, -kInf, -1.0f, -1.0f});
  const Tensor cmax = make_float(DType::float32, {1, 3}, {1.0f, kNaN, kInf});
  auto r = check_forward(x, cmin, cmax, false, 8, "NaN / Inf clamps");
  const auto y = to_floats(r.y);
  EXPECT_TRUE(std::isnan(y[0]));   // NaN clamp_min propagates
  EXPECT_TRUE(std::isnan(y[7]));   // NaN clamp_max propagates
  EXPECT_TRUE(std::isnan(y[11]));  // Inf clamp_max: s = Inf, clip_lo = Inf * 0 = NaN
  EXPECT_FALSE(std::isnan(y[6]));
  auto fixed = check_forward(x, cmin, cmax, true, 8, "NaN / Inf clamps, fixed_min");
  EXPECT_FALSE(std::isnan(to_floats(fixed.y)[0]));  // fixed_min ignores the NaN clamp_min
}

TEST(ActsUlq, NegativeZeroClampMinAndX) {
  const Tensor x = make_float(DType::float32, {4}, {-0.0f, 0.0f, -1e-30f, 0.25f});
  const Tensor cmax = make_float(DType::float32, {}, {1.0f});
  auto r = check_forward(x, make_float(DType::float32, {}, {-0.0f}), cmax, false, 8, "clamp_min -0");
  const auto y = to_floats(r.y);
  EXPECT_TRUE(same_bits(y[0], -0.0f));
  EXPECT_TRUE(same_bits(y[1], 0.0f));
  EXPECT_EQ(to_floats(r.clamp_min_mask)[2], 0.0f);  // -1e-30 < clip_lo = 0
}

TEST(ActsUlq, NumBitsWidths) {
  std::mt19937 rng(2);
  for (int nb : {2, 3, 4, 8, 12, 15, 16}) {
    for (bool fixed : {false, true}) {
      const Tensor x = random_tensor(rng, DType::float32, {5, 40}, -2.5f, 2.5f);
      const Tensor cmin = random_tensor(rng, DType::float32, {5, 1}, -2.0f, 0.3f);
      const Tensor cmax = random_tensor(rng, DType::float32, {5, 1}, -0.1f, 2.0f);
      check_forward(x, cmin, cmax, fixed, nb, "num_bits " + std::to_string(nb));
    }
  }
  // num_bits 2: LEVELS = 3. clamp [-1, 2]: s = 1, off = -1, clip [-1, 2]; y = rint(clamped x).
  const Tensor x = make_float(DType::float32, {6}, {-3.0f, -0.5f, 0.5f, 1.5f, 2.0f, 9.0f});
  auto r =
      xquant::acts_ulq(x, make_float(DType::float32, {}, {-1.0f}), make_float(DType::float32, {}, {2.0f}), false, 2);
  expect_floats_bitexact(to_floats(r.y), {-1.0f, -0.0f, 0.0f, 2.0f, 2.0f, 2.0f}, "num_bits 2 y");
  expect_floats_bitexact(to_floats(r.x_clamped_loss), {0.0f, 0.5f / 3.0f, -0.5f / 3.0f, 0.5f / 3.0f, 0.0f, 0.0f},
                         "num_bits 2 loss");
  // num_bits 16: LEVELS = 65535, clamp [0, 65535 / 1024]: s = 1 / 1024.
  const float s16 = (65535.0f / 1024.0f) / 65535.0f;
  ASSERT_EQ(s16, 1.0f / 1024.0f);
  auto r16 = xquant::acts_ulq(make_float(DType::float32, {3}, {2.5f / 1024.0f, 3.5f / 1024.0f, 100.0f}),
                              make_float(DType::float32, {}, {0.0f}),
                              make_float(DType::float32, {}, {65535.0f / 1024.0f}), false, 16);
  expect_floats_bitexact(to_floats(r16.y), {2.0f / 1024.0f, 4.0f / 1024.0f, 65535.0f / 1024.0f}, "num_bits 16 y");
  expect_floats_bitexact(to_floats(r16.clamp_max_mask), {1.0f, 1.0f, 0.0f}, "num_bits 16 max mask");
}

TEST(ActsUlq, EveryDtypeNarrowsOnce) {
  std::mt19937 rng(3);
  for (DType dt : kFloatTypes) {
    for (bool fixed : {false, true}) {
      const Tensor x = random_tensor(rng, dt, {3, 70}, -3.0f, 3.0f);
      const Tensor cmin = random_tensor(rng, dt, {3, 1}, -2.0f, 0.2f);
      const Tensor cmax = random_tensor(rng, dt, {3, 1}, -0.1f, 2.0f);
      check_forward(x, cmin, cmax, fixed, 8, name_of(dt));
    }
  }
  // A value whose float32 result is not representable in 16 bits: y = 38 * (2 / 255) is rounded once.
  for (DType dt : {DType::float16, DType::bfloat16}) {
    const Tensor x = make_float(dt, {1}, {0.3f});
    const Tensor cmin = make_float(dt, {}, {-1.0f});
    const Tensor cmax = make_float(dt, {}, {1.0f});
    const float xw = to_floats(x)[0];
    const float s = 2.0f / 255.0f;
    const float raw = xw / s;
    auto r = xquant::acts_ulq(x, cmin, cmax);
    EXPECT_TRUE(same_bits(to_floats(r.y)[0], narrow(dt, std::nearbyint(raw) * s))) << name_of(dt);
    EXPECT_TRUE(same_bits(to_floats(r.x_clamped_loss)[0], narrow(dt, (std::nearbyint(raw) - raw) / 255.0f)))
        << name_of(dt);
  }
}

// ------------------------------------------------------------------------------------------------------
// Forward: broadcasting
// ------------------------------------------------------------------------------------------------------

TEST(ActsUlq, BroadcastShapes) {
  std::mt19937 rng(4);
  struct ShapeCase {
    Shape x, cmin, cmax, out;
  };
  const std::vector<ShapeCase> cases = {
      {{2, 3, 4, 5}, {}, {}, {2, 3, 4, 5}},
      {{2, 3, 4, 5}, {1}, {1}, {2, 3, 4, 5}},
      {{2, 3, 4, 5}, {5}, {}, {2, 3, 4, 5}},
      {{2, 3, 4, 5}, {3, 1, 1}, {3, 1, 1}, {2, 3, 4, 5}},
      {{2, 3, 4, 5}, {3, 1, 1}, {5}, {2, 3, 4, 5}},
      {{4, 1}, {3}, {1, 3}, {4, 3}},  // x broadcast too
      {{1}, {2, 3}, {}, {2, 3}},      // x broadcast to the clamps' shape
      {{}, {}, {}, {}},               // rank 0: one element
      {{3, 1, 5}, {1, 4, 1}, {3, 4, 1}, {3, 4, 5}},
      {{2, 1, 2, 1, 2, 1, 2, 1}, {1, 2, 1, 2, 1, 2, 1, 2}, {2, 2, 1, 1, 2, 2, 1, 1}, {2, 2, 2, 2, 2, 2, 2, 2}},
      {{1, 1, 1, 1, 1, 1, 1, 3}, {2, 1, 1, 1, 1, 1, 1, 1}, {1}, {2, 1, 1, 1, 1, 1, 1, 3}},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(xquant::acts_ulq_output_shape(c.x, c.cmin, c.cmax), c.out);
    for (DType dt : kFloatTypes) {
      for (bool fixed : {false, true}) {
        check_round_trip(rng, dt, c.x, c.cmin, c.cmax, fixed, 8,
                         name_of(dt) + " x " + xquant::shape_str(c.x) + " min " + xquant::shape_str(c.cmin) + " max " +
                             xquant::shape_str(c.cmax));
      }
    }
  }
}

TEST(ActsUlq, EmptyTensors) {
  std::mt19937 rng(5);
  // x [0, 3] with clamps [3]: every output is empty.
  {
    const Tensor x(DType::float32, {0, 3});
    auto r = xquant::acts_ulq(x, random_tensor(rng, DType::float32, {3}, -1, 0),
                              random_tensor(rng, DType::float32, {3}, 0, 1));
    EXPECT_EQ(r.y.shape(), (Shape{0, 3}));
    EXPECT_EQ(r.x_clamped_loss.numel(), 0);
  }
  // x [2], clamp_min [0, 1]: the output [0, 2] is empty, but x_grad (shape [2]) and clamp_max_grad
  // (shape []) are empty sums: +0.
  {
    const Tensor cmin(DType::float32, {0, 1});
    const Tensor cmax = make_float(DType::float32, {}, {1.0f});
    EXPECT_EQ(xquant::acts_ulq_output_shape({2}, {0, 1}, {}), (Shape{0, 2}));
    const Tensor empty(DType::float32, {0, 2});
    Tensor xg(DType::float32, {2}), ming(DType::float32, {0, 1}), maxg(DType::float32, {});
    fill_bytes(xg);
    fill_bytes(maxg);
    xquant::acts_ulq_backward_out(xg, ming, maxg, empty, cmin, cmax, empty, empty, empty);
    expect_floats_bitexact(to_floats(xg), {0.0f, 0.0f}, "x_grad");
    expect_floats_bitexact(to_floats(maxg), {0.0f}, "clamp_max_grad");
    auto g = xquant::acts_ulq_backward(empty, {2}, cmin, cmax, empty, empty, empty);
    expect_floats_bitexact(to_floats(g.x_grad), {0.0f, 0.0f}, "x_grad (allocating)");
  }
}

// ------------------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------------------

TEST(ActsUlq, BackwardHandWorked) {
  // Elementwise (no broadcast): each gradient element is its single term, exactly.
  const Tensor g = make_float(DType::float32, {4}, {0.5f, -2.0f, 3.0f, 1.0f});
  const Tensor mn = make_float(DType::float32, {4}, {1.0f, 0.0f, 1.0f, 1.0f});
  const Tensor mx = make_float(DType::float32, {4}, {1.0f, 1.0f, 0.0f, 0.0f});
  const Tensor loss = make_float(DType::float32, {4}, {0.25f, -0.125f, 0.5f, -0.0f});
  const Tensor cmin = make_float(DType::float32, {4}, {-1.0f, -1.0f, 0.5f, -1.0f});
  const Tensor cmax = make_float(DType::float32, {4}, {1.0f, 1.0f, 1.0f, 1e-6f});
  auto r = xquant::acts_ulq_backward(g, {4}, cmin, cmax, mn, mx, loss);
  // x_grad = (g * mn) * mx: 0.5, (-2 * 0) * 1 = -0, 0, 0.
  expect_floats_bitexact(to_floats(r.x_grad), {0.5f, -0.0f, 0.0f, 0.0f}, "x_grad");
  // clamp_min_grad = g * ((1 - mn) - loss): 0.5 * -0.25, -2 * 1.125, zeroed (clamp_min 0.5 > 0), 1 * (0 - -0).
  expect_floats_bitexact(to_floats(r.clamp_min_grad), {-0.125f, -2.25f, 0.0f, 0.0f}, "clamp_min_grad");
  // clamp_max_grad = g * (loss + (1 - mx)): 0.125, 0.25, 4.5, zeroed (clamp_max 1e-6 < 255 * EPS).
  expect_floats_bitexact(to_floats(r.clamp_max_grad), {0.125f, 0.25f, 4.5f, 0.0f}, "clamp_max_grad");
  auto fixed = xquant::acts_ulq_backward(g, {4}, cmin, cmax, mn, mx, loss, true);
  expect_floats_bitexact(to_floats(fixed.clamp_min_grad), {0.0f, 0.0f, 0.0f, 0.0f}, "fixed_min clamp_min_grad");
  EXPECT_TRUE(same_bytes(fixed.x_grad, r.x_grad));
  EXPECT_TRUE(same_bytes(fixed.clamp_max_grad, r.clamp_max_grad));
  check_backward(g, {4}, cmin, cmax, mn, mx, loss, false, 8, "hand-worked");
  // num_bits moves the floor: 1e-6 >= 3 * EPS, so num_bits 2 keeps the last term: 1 * (-0 + (1 - 0)) = 1.
  auto nb2 = xquant::acts_ulq_backward(g, {4}, cmin, cmax, mn, mx, loss, false, 2);
  expect_floats_bitexact(to_floats(nb2.clamp_max_grad), {0.125f, 0.25f, 4.5f, 1.0f}, "num_bits 2 clamp_max_grad");
}

TEST(ActsUlq, BackwardReductionsSmall) {
  // Per-channel clamps [C, 1, 1] and scalars: sums of up to 1024 terms in the blocked order.
  std::mt19937 rng(6);
  for (DType dt : kFloatTypes) {
    for (bool fixed : {false, true}) {
      check_round_trip(rng, dt, {2, 4, 8, 16}, {4, 1, 1}, {4, 1, 1}, fixed, 8, name_of(dt) + " [C,1,1]");
      check_round_trip(rng, dt, {4, 256}, {}, {1}, fixed, 8, name_of(dt) + " scalar clamps, 1024 terms");
      check_round_trip(rng, dt, {1, 6}, {5, 1}, {5, 6}, fixed, 4, name_of(dt) + " x broadcast");
    }
  }
  // Arbitrary (non-0/1) masks: the terms keep SPEC's operation order.
  for (DType dt : kFloatTypes) {
    const Shape out = {3, 5, 7};
    const Tensor g = wide_tensor(rng, dt, out);
    const Tensor mn = random_tensor(rng, dt, out, -1.0f, 2.0f);
    const Tensor mx = random_tensor(rng, dt, out, -1.0f, 2.0f);
    const Tensor loss = random_tensor(rng, dt, out, -0.01f, 0.01f);
    const Tensor cmin = make_float(dt, {5, 1}, {-1.0f, 0.25f, -0.0f, 0.0f, kNaN});  // zeroed: 0.25
    std::vector<float> maxv;  // zeroed: 0 and 1e-7 (below LEVELS * EPS for num_bits 3 and 8)
    for (int i = 0; i < 3; ++i) maxv.insert(maxv.end(), {1.0f, 0.0f, 1e-7f, kNaN, 2.0f});
    const Tensor cmax = make_float(dt, {3, 5, 1}, maxv);
    check_backward(g, {3, 1, 7}, cmin, cmax, mn, mx, loss, false, 8, name_of(dt) + " arbitrary masks");
    check_backward(g, {7}, cmin, cmax, mn, mx, loss, true, 8, name_of(dt) + " arbitrary masks, fixed_min");
    check_backward(g, {1, 5, 7}, cmin, cmax, mn, mx, loss, false, 3, name_of(dt) + " arbitrary masks, num_bits 3");
  }
}

TEST(ActsUlq, BackwardCanonicalOrder) {
  // y_grad [2, 2] = {2^60, 1, -2^60, 1} all summed into a scalar x / clamp_min / clamp_max. The terms go to
  // double lanes 0..3 in flat output order and fold as (t0 + t2) + (t1 + t3) = 0 + 2 = 2. A transposed walk
  // would give (2^60 + 1) + (-2^60 + 1) = 0, a sequential float or double sum 1.
  const float big = 0x1p60f;
  const Tensor g = make_float(DType::float32, {2, 2}, {big, 1.0f, -big, 1.0f});
  const Tensor ones = make_float(DType::float32, {2, 2}, {1.0f, 1.0f, 1.0f, 1.0f});
  const Tensor zeros = make_float(DType::float32, {2, 2}, {0.0f, 0.0f, 0.0f, 0.0f});
  const Tensor cmin = make_float(DType::float32, {}, {-1.0f});
  const Tensor cmax = make_float(DType::float32, {1, 1}, {1.0f});
  const Tensor cmin22 = make_float(DType::float32, {2, 2}, {-1.0f, -1.0f, -1.0f, -1.0f});
  // Masks 1, loss 0: the x_grad term is y_grad. Masks 0, loss 0: both clamp terms are y_grad.
  auto in = xquant::acts_ulq_backward(g, {}, cmin22, cmax, ones, ones, zeros);
  expect_floats_bitexact(to_floats(in.x_grad), {2.0f}, "x_grad");
  auto out = xquant::acts_ulq_backward(g, {2, 2}, cmin, cmax, zeros, zeros, zeros);
  expect_floats_bitexact(to_floats(out.clamp_min_grad), {2.0f}, "clamp_min_grad");
  expect_floats_bitexact(to_floats(out.clamp_max_grad), {2.0f}, "clamp_max_grad");
  EXPECT_TRUE(same_bits(blocked_sum({big, 1.0f, -big, 1.0f}), 2.0f));  // the model agrees
  // Two broadcast dims around a kept one: x [1, 3, 1] over [4, 3, 5]; 20 terms per element, wide range.
  std::mt19937 rng(14);
  for (DType dt : kFloatTypes) {
    const Shape o = {4, 3, 5};
    const Tensor gw = wide_tensor(rng, dt, o);
    const Tensor m0 = make_float(dt, o, std::vector<float>(60, 0.0f));
    const Tensor m1 = make_float(dt, o, std::vector<float>(60, 1.0f));
    const Tensor cm = make_float(dt, {4, 1, 1}, {-1.0f, -2.0f, -0.5f, -1.0f});
    const Tensor cx = make_float(dt, {1, 1, 5}, {1.0f, 2.0f, 0.5f, 1.0f, 3.0f});
    check_backward(gw, {1, 3, 1}, cm, cx, m1, m1, m0, false, 8, name_of(dt) + " wide, masks 1");
    check_backward(gw, {1, 3, 1}, cm, cx, m0, m0, m0, false, 8, name_of(dt) + " wide, masks 0");
  }
}

TEST(ActsUlq, BackwardZeroing) {
  std::mt19937 rng(7);
  const Shape out = {6, 10};
  const Tensor g = random_tensor(rng, DType::float32, out, -1.0f, 1.0f);
  const Tensor mn = make_float(DType::float32, out, std::vector<float>(60, 0.0f));
  const Tensor mx = make_float(DType::float32, out, std::vector<float>(60, 0.0f));
  const Tensor loss = random_tensor(rng, DType::float32, out, -0.001f, 0.001f);
  const float floor8 = 255.0f * kEps;
  const Tensor cmin = make_float(DType::float32, {6, 1}, {-1.0f, 1e-30f, 0.0f, -0.0f, 3.0f, -1e-30f});
  const Tensor cmax =
      make_float(DType::float32, {6, 1}, {floor8, std::nextafter(floor8, 0.0f), 1.0f, -1.0f, kInf, -kInf});
  auto r = xquant::acts_ulq_backward(g, out, cmin, cmax, mn, mx, loss);
  const auto ming = to_floats(r.clamp_min_grad), maxg = to_floats(r.clamp_max_grad);
  for (int c : {1, 4}) EXPECT_TRUE(same_bits(ming[c], 0.0f)) << c;     // clamp_min > 0
  for (int c : {0, 2, 3, 5}) EXPECT_NE(ming[c], 0.0f) << c;            // <= 0: kept
  for (int c : {1, 3, 5}) EXPECT_TRUE(same_bits(maxg[c], 0.0f)) << c;  // clamp_max < LEVELS * EPS
  for (int c : {0, 2, 4}) EXPECT_NE(maxg[c], 0.0f) << c;               // at the floor or above: kept
  check_backward(g, out, cmin, cmax, mn, mx, loss, false, 8, "zeroing");
  auto fixed = xquant::acts_ulq_backward(g, out, cmin, cmax, mn, mx, loss, true);
  for (float v : to_floats(fixed.clamp_min_grad)) EXPECT_TRUE(same_bits(v, 0.0f));
  EXPECT_TRUE(same_bytes(fixed.clamp_max_grad, r.clamp_max_grad));
}

TEST(ActsUlq, BackwardLargeReduction) {
  // clamp_min_grad of a scalar clamp_min over 2047 terms (two chunks). min_mask = 0 and loss = 0 make the
  // term y_grad itself: 2^24 followed by 2046 ones. A float32 running sum would stay at 2^24 (2^24 + 1
  // rounds to even); the canonical sum accumulates in double: exactly 2^24 + 2046.
  const std::int64_t n = 2047;
  std::vector<float> gv(static_cast<std::size_t>(n), 1.0f);
  gv[0] = 16777216.0f;
  const Tensor g = make_float(DType::float32, {n}, gv);
  const Tensor zeros = make_float(DType::float32, {n}, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  const Tensor cmin = make_float(DType::float32, {}, {-1.0f});
  const Tensor cmax = make_float(DType::float32, {1}, {1.0f});
  auto r = xquant::acts_ulq_backward(g, {n}, cmin, cmax, zeros, zeros, zeros);
  EXPECT_TRUE(same_bits(to_floats(r.clamp_min_grad)[0], 16779262.0f)) << to_floats(r.clamp_min_grad)[0];
  // clamp_max term = y_grad * (0 + (1 - 0)) = y_grad: the same sum.
  EXPECT_TRUE(same_bits(to_floats(r.clamp_max_grad)[0], 16779262.0f));
  check_backward(g, {n}, cmin, cmax, zeros, zeros, zeros, false, 8, "2047 terms");

  // Chunk boundaries: terms 2^60 and 1 at positions 0, 1 and -2^60 and 1 at 1024, 1025 (2048 terms, two
  // chunks). Chunk 0 = 2^60 + 1 = 2^60 in double, chunk 1 = -2^60: total 0. Without chunks the lanes would
  // give (2^60 - 2^60) + (1 + 1) = 2, a sequential sum 1.
  {
    std::vector<float> tv(2048, 0.0f);
    tv[0] = 0x1p60f;
    tv[1] = 1.0f;
    tv[1024] = -0x1p60f;
    tv[1025] = 1.0f;
    const Tensor gt = make_float(DType::float32, {2048}, tv);
    const Tensor z = make_float(DType::float32, {2048}, std::vector<float>(2048, 0.0f));
    auto rt = xquant::acts_ulq_backward(gt, {2048}, cmin, cmax, z, z, z);
    EXPECT_TRUE(same_bits(to_floats(rt.clamp_min_grad)[0], 0.0f)) << to_floats(rt.clamp_min_grad)[0];
    EXPECT_TRUE(same_bits(to_floats(rt.clamp_max_grad)[0], 0.0f)) << to_floats(rt.clamp_max_grad)[0];
    EXPECT_TRUE(same_bits(blocked_sum(tv), 0.0f));
    check_backward(gt, {2048}, cmin, cmax, z, z, z, false, 8, "chunk boundary");
  }

  // Random data, 3 x 1500 terms per channel and x broadcast over a leading dim: blocked order in the model.
  std::mt19937 rng(8);
  for (DType dt : kFloatTypes) {
    check_round_trip(rng, dt, {2, 3, 1500}, {3, 1}, {1, 1, 1}, false, 8, name_of(dt) + " > 1024 terms");
    check_round_trip(rng, dt, {1, 3000}, {2, 1}, {}, false, 8, name_of(dt) + " 6000 terms");
  }
  // Wide-range terms over several chunks: the chunk boundaries and lanes show in the result.
  for (DType dt : kFloatTypes) {
    const Shape o = {3, 2500};
    const Tensor gw = wide_tensor(rng, dt, o);
    const Tensor m0 = make_float(dt, o, std::vector<float>(7500, 0.0f));
    const Tensor m1 = make_float(dt, o, std::vector<float>(7500, 1.0f));
    const Tensor cm = make_float(dt, {3, 1}, {-1.0f, -2.0f, -0.5f});
    const Tensor cx = make_float(dt, {}, {1.0f});
    check_backward(gw, {1, 2500}, cm, cx, m0, m0, m0, false, 8, name_of(dt) + " wide, 2500 / 7500 terms");
    const Tensor cx_row = make_float(dt, {1, 2500}, std::vector<float>(2500, 1.0f));
    check_backward(gw, {3, 1}, cm, cx_row, m1, m1, m0, false, 8, name_of(dt) + " wide x_grad, 2500 terms");
  }
  // x broadcast over 1100 rows: each x_grad element sums 1100 terms (stride of the output dim is 1 column).
  check_round_trip(rng, DType::float32, {1, 4}, {1100, 1}, {1100, 4}, false, 8, "x_grad reduced over 1100");
}

TEST(ActsUlq, BackwardBroadcastXGrad) {
  std::mt19937 rng(9);
  for (DType dt : kFloatTypes) {
    check_round_trip(rng, dt, {1, 3, 1}, {2, 1, 4}, {2, 3, 4}, false, 8, name_of(dt) + " x [1,3,1]");
    check_round_trip(rng, dt, {}, {3, 2}, {2}, false, 8, name_of(dt) + " x []");
    check_round_trip(rng, dt, {2, 1, 2, 1, 2, 1, 2, 1}, {1, 2, 1, 2, 1, 2, 1, 2}, {2, 2, 1, 1, 2, 2, 1, 1}, false, 8,
                     name_of(dt) + " rank 8");
  }
}

// ------------------------------------------------------------------------------------------------------
// Validation
// ------------------------------------------------------------------------------------------------------

struct FwdOutputs {
  Tensor y, mn, mx, loss;
  explicit FwdOutputs(const Shape& s, DType dt = DType::float32) : y(dt, s), mn(dt, s), mx(dt, s), loss(dt, s) {
    for (Tensor* t : {&y, &mn, &mx, &loss}) fill_bytes(*t);
  }
  bool untouched() const { return all_bytes(y) && all_bytes(mn) && all_bytes(mx) && all_bytes(loss); }
};

TEST(ActsUlq, ForwardValidation) {
  std::mt19937 rng(10);
  const Tensor x = random_tensor(rng, DType::float32, {2, 4}, -1, 1);
  const Tensor cmin = random_tensor(rng, DType::float32, {4}, -1, 0);
  const Tensor cmax = random_tensor(rng, DType::float32, {2, 1}, 0, 1);
  const Tensor half_min = random_tensor(rng, DType::float16, {4}, -1, 0);
  const Tensor half_max = random_tensor(rng, DType::bfloat16, {2, 1}, 0, 1);
  const Tensor int_x = make_typed<std::int8_t>(DType::int8, {2, 4}, std::vector<std::int8_t>(8, 1));

  // Each case runs the out-variant (outputs must stay untouched) and the allocating form.
  auto both = [&](const ConstTensorView& xv, const ConstTensorView& mnv, const ConstTensorView& mxv, int nb,
                  ErrorCode code, const std::string& arg, const std::vector<std::string>& needles) {
    FwdOutputs o({2, 4});
    expect_error([&] { xquant::acts_ulq_out(o.y, o.mn, o.mx, o.loss, xv, mnv, mxv, false, nb); }, code, arg, needles);
    EXPECT_TRUE(o.untouched()) << arg;
    expect_error([&] { (void)xquant::acts_ulq(xv, mnv, mxv, false, nb); }, code, arg, needles);
  };
  both(x, half_min, cmax, 8, ErrorCode::dtype_mismatch, "clamp_min", {"float16", "float32"});
  both(x, cmin, half_max, 8, ErrorCode::dtype_mismatch, "clamp_max", {"bfloat16", "float32"});
  both(int_x, cmin, cmax, 8, ErrorCode::dtype_mismatch, "x", {"int8"});
  both(x, make_float(DType::float32, {3}, {0, 0, 0}), cmax, 8, ErrorCode::shape_mismatch, "clamp_min",
       {"clamp_min has shape [3] which does not broadcast with x's shape [2, 4]"});
  both(x, cmin, make_float(DType::float32, {3, 1}, {0, 0, 0}), 8, ErrorCode::shape_mismatch, "clamp_max",
       {"clamp_max has shape [3, 1]", "x's shape [2, 4]"});
  {  // clamp_max fits x [2, 1] but not clamp_min [3]
    const Tensor x21 = random_tensor(rng, DType::float32, {2, 1}, -1, 1);
    expect_error(
        [&] {
          (void)xquant::acts_ulq(x21, make_float(DType::float32, {3}, {0, 0, 0}), cmin);
        },
        ErrorCode::shape_mismatch, "clamp_max", {"clamp_max has shape [4]", "clamp_min's shape [3]"});
  }
  const Shape rank9 = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  const Tensor x9 = make_float(DType::float32, rank9, {0.5f});
  both(x9, cmin, cmax, 8, ErrorCode::shape_mismatch, "x", {"rank 9", "at most 8"});
  both(x, x9, cmax, 8, ErrorCode::shape_mismatch, "clamp_min", {"rank 9"});
  both(x, cmin, x9, 8, ErrorCode::shape_mismatch, "clamp_max", {"rank 9"});
  both(x, cmin, cmax, 1, ErrorCode::invalid_argument, "num_bits", {"num_bits is 1", "[2, 16]"});
  both(x, cmin, cmax, 17, ErrorCode::invalid_argument, "num_bits", {"num_bits is 17"});
  both(x, cmin, cmax, 0, ErrorCode::invalid_argument, "num_bits", {});
  both(ConstTensorView(x.data(), DType::float32, {2, -4}), cmin, cmax, 8, ErrorCode::shape_mismatch, "x", {"negative"});
  both(ConstTensorView(nullptr, DType::float32, {2, 4}), cmin, cmax, 8, ErrorCode::invalid_argument, "x", {"null"});

  // acts_ulq_output_shape throws the same way.
  expect_error(
      [] {
        (void)xquant::acts_ulq_output_shape({2, 4}, {3}, {});
      },
      ErrorCode::shape_mismatch, "clamp_min",
      {"clamp_min has shape [3] which does not broadcast with x's shape [2, 4]"});
  expect_error(
      [] {
        (void)xquant::acts_ulq_output_shape({2, 4}, {}, {1, 2, 1, 1, 1, 1, 1, 1, 1});
      },
      ErrorCode::shape_mismatch, "clamp_max", {"rank 9"});
  expect_error([] { (void)xquant::acts_ulq_output_shape({-1}, {}, {}); }, ErrorCode::shape_mismatch, "x", {});
  // 0 broadcasts with 1 only.
  expect_error([] { (void)xquant::acts_ulq_output_shape({0}, {2}, {}); }, ErrorCode::shape_mismatch, "clamp_min", {});
  EXPECT_EQ(xquant::acts_ulq_output_shape({0}, {1}, {}), (Shape{0}));

  // Output views: shape, dtype, null data.
  struct OutCase {
    int which;
    Shape shape;
    DType dt;
    ErrorCode code;
  };
  const char* names[] = {"y", "clamp_min_mask", "clamp_max_mask", "x_clamped_loss"};
  for (int which = 0; which < 4; ++which) {
    for (const OutCase& c : {OutCase{which, {2, 3}, DType::float32, ErrorCode::shape_mismatch},
                             OutCase{which, {8}, DType::float32, ErrorCode::shape_mismatch},
                             OutCase{which, {2, 4}, DType::float16, ErrorCode::dtype_mismatch}}) {
      FwdOutputs o({2, 4});
      Tensor bad(c.dt, c.shape);
      fill_bytes(bad);
      TensorView v[4] = {o.y, o.mn, o.mx, o.loss};
      v[c.which] = bad;
      expect_error([&] { xquant::acts_ulq_out(v[0], v[1], v[2], v[3], x, cmin, cmax); }, c.code, names[which],
                   {names[which]});
      EXPECT_TRUE(o.untouched());
      EXPECT_TRUE(all_bytes(bad));
    }
    FwdOutputs o({2, 4});
    TensorView v[4] = {o.y, o.mn, o.mx, o.loss};
    v[which].data = nullptr;
    expect_error([&] { xquant::acts_ulq_out(v[0], v[1], v[2], v[3], x, cmin, cmax); }, ErrorCode::invalid_argument,
                 names[which], {"null"});
    EXPECT_TRUE(o.untouched());
  }
}

TEST(ActsUlq, ForwardOverlap) {
  // One buffer holds x and an output, or two outputs.
  Tensor buf(DType::float32, {32});
  for (int i = 0; i < 32; ++i) buf.data<float>()[i] = static_cast<float>(i) / 32.0f;
  const Tensor before = Tensor::copy_of(buf);
  float* p = buf.data<float>();
  const ConstTensorView x(p, DType::float32, {8});
  const Tensor cmin = make_float(DType::float32, {}, {-1.0f});
  const Tensor cmax = make_float(DType::float32, {}, {1.0f});
  FwdOutputs o({8});
  // y overlaps x (even exactly: in-place is not offered).
  for (int shift : {0, 4, 7}) {
    expect_error(
        [&] { xquant::acts_ulq_out(TensorView(p + shift, DType::float32, {8}), o.mn, o.mx, o.loss, x, cmin, cmax); },
        ErrorCode::aliasing, "y", {"y overlaps x"});
  }
  // x_clamped_loss overlaps clamp_min.
  Tensor cbuf = make_float(DType::float32, {9}, {-1.0f, 0, 0, 0, 0, 0, 0, 0, 0});
  const Tensor cbuf_before = Tensor::copy_of(cbuf);
  const ConstTensorView cmin_in_buf(cbuf.data<float>(), DType::float32, {});
  expect_error(
      [&] {
        xquant::acts_ulq_out(o.y, o.mn, o.mx, TensorView(cbuf.data<float>(), DType::float32, {8}), x, cmin_in_buf,
                             cmax);
      },
      ErrorCode::aliasing, "x_clamped_loss", {"clamp_min"});
  // Outputs overlapping each other: clamp_max_mask shares y's buffer (p + 8 .. p + 16 vs p + 12 ..).
  expect_error(
      [&] {
        xquant::acts_ulq_out(TensorView(p + 8, DType::float32, {8}), o.mn, TensorView(p + 12, DType::float32, {8}),
                             o.loss, x, cmin, cmax);
      },
      ErrorCode::aliasing, "clamp_max_mask", {"clamp_max_mask overlaps y"});
  EXPECT_TRUE(same_bytes(buf, before));
  EXPECT_TRUE(same_bytes(cbuf, cbuf_before));
  EXPECT_TRUE(o.untouched());
  // Adjacent, disjoint buffers are fine.
  xquant::acts_ulq_out(TensorView(p + 8, DType::float32, {8}), TensorView(p + 16, DType::float32, {8}),
                       TensorView(p + 24, DType::float32, {8}), o.loss, x, cmin, cmax);
  EXPECT_TRUE(same_bits(p[7], 7.0f / 32.0f));
}

struct BwdInputs {
  Tensor g, cmin, cmax, mn, mx, loss;
};

BwdInputs make_bwd_inputs(std::mt19937& rng, DType dt = DType::float32) {
  return {random_tensor(rng, dt, {2, 4}, -1, 1), random_tensor(rng, dt, {4}, -1, 0),
          random_tensor(rng, dt, {2, 1}, 0, 1),  random_tensor(rng, dt, {2, 4}, 0, 1),
          random_tensor(rng, dt, {2, 4}, 0, 1),  random_tensor(rng, dt, {2, 4}, -0.01f, 0.01f)};
}

struct BwdOutputs {
  Tensor xg, ming, maxg;
  BwdOutputs(const Shape& xs, const Shape& mins, const Shape& maxs, DType dt = DType::float32)
      : xg(dt, xs), ming(dt, mins), maxg(dt, maxs) {
    for (Tensor* t : {&xg, &ming, &maxg}) fill_bytes(*t);
  }
  bool untouched() const { return all_bytes(xg) && all_bytes(ming) && all_bytes(maxg); }
};

TEST(ActsUlq, BackwardValidation) {
  std::mt19937 rng(12);
  const BwdInputs in = make_bwd_inputs(rng);
  const Tensor h8 = random_tensor(rng, DType::float16, {2, 4}, 0, 1);
  const Tensor b4 = random_tensor(rng, DType::bfloat16, {4}, 0, 1);
  const Tensor b21 = random_tensor(rng, DType::bfloat16, {2, 1}, 0, 1);
  const Tensor i4 = make_typed<std::int32_t>(DType::int32, {4}, {0, 0, 0, 0});
  const Tensor f3 = random_tensor(rng, DType::float32, {3}, 0, 1);
  const Tensor f248 = random_tensor(rng, DType::float32, {3, 2, 4}, 0, 1);
  const Tensor f42 = random_tensor(rng, DType::float32, {4, 2}, 0, 1);

  using Views = std::vector<ConstTensorView>;  // y_grad, clamp_min, clamp_max, min mask, max mask, loss
  const Views good = {in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss};
  // Runs the out-variant (outputs untouched) and the allocating form with an input replaced.
  auto both = [&](std::size_t slot, const ConstTensorView& replacement, int nb, ErrorCode code, const std::string& arg,
                  const std::vector<std::string>& needles) {
    Views v = good;
    if (slot < v.size()) v[slot] = replacement;
    BwdOutputs o({2, 4}, v[1].shape, v[2].shape);
    expect_error(
        [&] { xquant::acts_ulq_backward_out(o.xg, o.ming, o.maxg, v[0], v[1], v[2], v[3], v[4], v[5], false, nb); },
        code, arg, needles);
    EXPECT_TRUE(o.untouched()) << arg;
    expect_error(
        [&] {
          (void)xquant::acts_ulq_backward(v[0], {2, 4}, v[1], v[2], v[3], v[4], v[5], false, nb);
        },
        code, arg, needles);
  };
  constexpr std::size_t kNone = 99;
  // dtypes
  both(0, h8, 8, ErrorCode::dtype_mismatch, "y_grad", {"float16"});
  both(1, b4, 8, ErrorCode::dtype_mismatch, "clamp_max", {"float32", "bfloat16"});  // clamp_min sets the dtype
  both(1, i4, 8, ErrorCode::dtype_mismatch, "clamp_min", {"int32"});
  both(2, b21, 8, ErrorCode::dtype_mismatch, "clamp_max", {"bfloat16"});
  both(3, h8, 8, ErrorCode::dtype_mismatch, "clamp_min_mask", {});
  both(4, h8, 8, ErrorCode::dtype_mismatch, "clamp_max_mask", {});
  both(5, h8, 8, ErrorCode::dtype_mismatch, "x_clamped_loss", {});
  // shapes
  both(2, f3, 8, ErrorCode::shape_mismatch, "clamp_max", {"clamp_max has shape [3]", "clamp_min's shape [4]"});
  both(0, f248, 8, ErrorCode::shape_mismatch, "y_grad", {"y_grad has shape [3, 2, 4]", "[2, 4]"});
  both(0, f42, 8, ErrorCode::shape_mismatch, "y_grad", {});
  both(3, f248, 8, ErrorCode::shape_mismatch, "clamp_min_mask", {});
  both(4, f3, 8, ErrorCode::shape_mismatch, "clamp_max_mask", {});
  both(5, f42, 8, ErrorCode::shape_mismatch, "x_clamped_loss", {});
  const Tensor r9 = make_float(DType::float32, {1, 1, 1, 1, 1, 1, 1, 1, 4}, {0, 0, 0, 0});
  both(1, r9, 8, ErrorCode::shape_mismatch, "clamp_min", {"rank 9"});
  both(2, r9, 8, ErrorCode::shape_mismatch, "clamp_max", {"rank 9"});
  both(1, ConstTensorView(nullptr, DType::float32, {4}), 8, ErrorCode::invalid_argument, "clamp_min", {"null"});
  // num_bits
  both(kNone, {}, 1, ErrorCode::invalid_argument, "num_bits", {"num_bits is 1"});
  both(kNone, {}, 17, ErrorCode::invalid_argument, "num_bits", {"num_bits is 17"});
  // A clamp tensor that broadcasts with x but widens the output beyond y_grad's shape: y_grad is blamed.
  both(2, make_float(DType::float32, {3, 1, 1}, {1, 1, 1}), 8, ErrorCode::shape_mismatch, "y_grad",
       {"y_grad has shape [2, 4] but expected [3, 2, 4]"});

  // x's shape: from x_grad (out-variant) or x_shape (allocating).
  auto x_case = [&](const Shape& xs, ErrorCode code, const std::vector<std::string>& needles) {
    BwdOutputs o(xs.size() <= 9 && std::all_of(xs.begin(), xs.end(), [](auto d) { return d >= 0; }) ? xs : Shape{1},
                 {4}, {2, 1});
    TensorView xg = o.xg;
    xg.shape = xs;
    expect_error(
        [&] { xquant::acts_ulq_backward_out(xg, o.ming, o.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); }, code,
        "x_grad", needles);
    EXPECT_TRUE(o.untouched());
    expect_error([&] { (void)xquant::acts_ulq_backward(in.g, xs, in.cmin, in.cmax, in.mn, in.mx, in.loss); }, code,
                 "x_shape", needles);
  };
  x_case({3, 4}, ErrorCode::shape_mismatch, {"does not broadcast", "[3, 4]"});
  x_case({5}, ErrorCode::shape_mismatch, {"does not broadcast"});
  {  // clamp_min [3] fits clamp_max [2, 1] but not x [2, 4]: x's shape is blamed.
    BwdOutputs o({2, 4}, {3}, {2, 1});
    expect_error([&] { xquant::acts_ulq_backward_out(o.xg, o.ming, o.maxg, in.g, f3, in.cmax, in.mn, in.mx, in.loss); },
                 ErrorCode::shape_mismatch, "x_grad", {"x_grad has shape [2, 4]", "clamp_min's shape [3]"});
    EXPECT_TRUE(o.untouched());
    expect_error(
        [&] {
          (void)xquant::acts_ulq_backward(in.g, {2, 4}, f3, in.cmax, in.mn, in.mx, in.loss);
        },
        ErrorCode::shape_mismatch, "x_shape", {"x_shape has shape [2, 4]", "clamp_min's shape [3]"});
  }
  x_case({1, 1, 1, 1, 1, 1, 1, 2, 4}, ErrorCode::shape_mismatch, {"rank 9"});
  x_case({2, -4}, ErrorCode::shape_mismatch, {"negative"});
  // x of shape [3, 2, 4] broadcasts with the clamps, but then the output is [3, 2, 4], not y_grad's [2, 4].
  {
    BwdOutputs o({3, 2, 4}, {4}, {2, 1});
    expect_error(
        [&] { xquant::acts_ulq_backward_out(o.xg, o.ming, o.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); },
        ErrorCode::shape_mismatch, "y_grad", {"[3, 2, 4]"});
    EXPECT_TRUE(o.untouched());
  }

  // Output views: dtype and shape of each gradient, null data.
  {
    BwdOutputs o({2, 4}, {4}, {2, 1}, DType::float16);
    BwdOutputs ok({2, 4}, {4}, {2, 1});
    expect_error(
        [&] { xquant::acts_ulq_backward_out(o.xg, ok.ming, ok.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); },
        ErrorCode::dtype_mismatch, "x_grad", {"float16"});
    expect_error(
        [&] { xquant::acts_ulq_backward_out(ok.xg, o.ming, ok.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); },
        ErrorCode::dtype_mismatch, "clamp_min_grad", {"float16"});
    expect_error(
        [&] { xquant::acts_ulq_backward_out(ok.xg, ok.ming, o.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); },
        ErrorCode::dtype_mismatch, "clamp_max_grad", {"float16"});
    EXPECT_TRUE(o.untouched());
    EXPECT_TRUE(ok.untouched());
    BwdOutputs wrong({2, 4}, {1, 4}, {2});
    expect_error(
        [&] {
          xquant::acts_ulq_backward_out(ok.xg, wrong.ming, ok.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss);
        },
        ErrorCode::shape_mismatch, "clamp_min_grad", {"the shape of clamp_min"});
    expect_error(
        [&] {
          xquant::acts_ulq_backward_out(ok.xg, ok.ming, wrong.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss);
        },
        ErrorCode::shape_mismatch, "clamp_max_grad", {"the shape of clamp_max"});
    TensorView null_min = ok.ming;
    null_min.data = nullptr;
    expect_error(
        [&] { xquant::acts_ulq_backward_out(ok.xg, null_min, ok.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); },
        ErrorCode::invalid_argument, "clamp_min_grad", {"null"});
    TensorView null_x = ok.xg;
    null_x.data = nullptr;
    expect_error(
        [&] { xquant::acts_ulq_backward_out(null_x, ok.ming, ok.maxg, in.g, in.cmin, in.cmax, in.mn, in.mx, in.loss); },
        ErrorCode::invalid_argument, "x_grad", {"null"});
    EXPECT_TRUE(ok.untouched());
    EXPECT_TRUE(wrong.untouched());
  }
}

TEST(ActsUlq, BackwardOverlap) {
  std::mt19937 rng(13);
  const BwdInputs in = make_bwd_inputs(rng);
  // A buffer holding y_grad at [0, 8) and free room after it.
  Tensor buf(DType::float32, {40});
  for (int i = 0; i < 40; ++i) buf.data<float>()[i] = static_cast<float>(i) / 64.0f;
  const Tensor before = Tensor::copy_of(buf);
  float* p = buf.data<float>();
  const ConstTensorView g(p, DType::float32, {2, 4});
  BwdOutputs o({2, 4}, {4}, {2, 1});
  // x_grad overlaps y_grad (exactly, or partly).
  for (int shift : {0, 3}) {
    expect_error(
        [&] {
          xquant::acts_ulq_backward_out(TensorView(p + shift, DType::float32, {2, 4}), o.ming, o.maxg, g, in.cmin,
                                        in.cmax, in.mn, in.mx, in.loss);
        },
        ErrorCode::aliasing, "x_grad", {"x_grad overlaps y_grad"});
  }
  // clamp_max_grad overlaps x_grad (both outputs).
  expect_error(
      [&] {
        xquant::acts_ulq_backward_out(TensorView(p + 8, DType::float32, {2, 4}), o.ming,
                                      TensorView(p + 15, DType::float32, {2, 1}), g, in.cmin, in.cmax, in.mn, in.mx,
                                      in.loss);
      },
      ErrorCode::aliasing, "clamp_max_grad", {"clamp_max_grad overlaps x_grad"});
  // clamp_min_grad overlaps clamp_min / the masks / the loss.
  const ConstTensorView cmin_in_buf(p + 20, DType::float32, {4});
  expect_error(
      [&] {
        xquant::acts_ulq_backward_out(o.xg, TensorView(p + 22, DType::float32, {4}), o.maxg, in.g, cmin_in_buf, in.cmax,
                                      in.mn, in.mx, in.loss);
      },
      ErrorCode::aliasing, "clamp_min_grad", {"clamp_min"});
  const ConstTensorView loss_in_buf(p + 24, DType::float32, {2, 4});
  expect_error(
      [&] {
        xquant::acts_ulq_backward_out(o.xg, TensorView(p + 30, DType::float32, {4}), o.maxg, in.g, in.cmin, in.cmax,
                                      in.mn, in.mx, loss_in_buf);
      },
      ErrorCode::aliasing, "clamp_min_grad", {"x_clamped_loss"});
  const ConstTensorView mask_in_buf(p + 24, DType::float32, {2, 4});
  expect_error(
      [&] {
        xquant::acts_ulq_backward_out(o.xg, o.ming, TensorView(p + 31, DType::float32, {2, 1}), in.g, in.cmin, in.cmax,
                                      in.mn, mask_in_buf, in.loss);
      },
      ErrorCode::aliasing, "clamp_max_grad", {"clamp_max_mask"});
  EXPECT_TRUE(same_bytes(buf, before));
  EXPECT_TRUE(o.untouched());
}

}  // namespace
