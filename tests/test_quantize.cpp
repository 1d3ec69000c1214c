// npu_quantize (SPEC section 2): hand-computed vectors, an independent formula over every input dtype,
// scale dtype, zero-point dtype, output dtype and axis form, ties, saturation, quint4x2 packing, empty
// tensors and every validation path.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {
using namespace xqtest;
using xquant::ErrorCode;
using xquant::QuantDType;

// ---------------------------------------------------------------------------------------------------------
// The independent statement of SPEC 2, written from the text.

// Round half to even in double, without rint: floor, then compare the fraction with one half.
double rne(double v) {
  const double f = std::floor(v);
  const double d = v - f;
  if (d > 0.5) return f + 1.0;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

struct Range {
  double lo, hi;
};
Range range_of(QuantDType q) {
  switch (q) {
    case QuantDType::qint8:
      return {-128.0, 127.0};
    case QuantDType::quint8:
      return {0.0, 255.0};
    case QuantDType::qint32:
      return {-2147483648.0, 2147483647.0};
    case QuantDType::quint4x2:
      return {-8.0, 7.0};
    case QuantDType::float8_e4m3fn:
    case QuantDType::float8_e5m2:
      break;  // float outputs: not the integer grid these helpers model
  }
  throw std::invalid_argument("range_of: " + std::string(xquant::quant_dtype_name(q)) + " is not an integer type");
}

// v = x / s + zp (div) or x * s + zp (mul), each a float32 operation; y = clamp(rne(v)), NaN -> 0.
std::int64_t expect_q(float x, float s, float zp, bool div_mode, QuantDType q) {
  const float t = div_mode ? x / s : x * s;
  const float v = t + zp;
  const Range r = range_of(q);
  if (std::isnan(v)) return 0;
  if (v >= r.hi) return static_cast<std::int64_t>(r.hi);  // also +Inf
  if (v <= r.lo) return static_cast<std::int64_t>(r.lo);  // also -Inf
  const double y = rne(static_cast<double>(v));
  return static_cast<std::int64_t>(y < r.lo ? r.lo : (y > r.hi ? r.hi : y));
}

// Decodes quint4x2 words by hand: nibble j of word k is element 8k + j, two's complement.
std::vector<std::int64_t> decode_int4(const std::vector<std::int32_t>& words) {
  std::vector<std::int64_t> out;
  for (std::int32_t w : words) {
    std::uint32_t u = static_cast<std::uint32_t>(w);
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t nib = u & 0xFu;
      out.push_back(nib < 8 ? static_cast<std::int64_t>(nib) : static_cast<std::int64_t>(nib) - 16);
      u >>= 4;
    }
  }
  return out;
}

// The output of quantize as int64 values, one per input element.
std::vector<std::int64_t> values_of(const ConstTensorView& out, QuantDType q) {
  std::vector<std::int64_t> v;
  switch (q) {
    case QuantDType::qint8:
      for (auto e : to_vector<std::int8_t>(out)) v.push_back(e);
      break;
    case QuantDType::quint8:
      for (auto e : to_vector<std::uint8_t>(out)) v.push_back(e);
      break;
    case QuantDType::qint32:
      for (auto e : to_vector<std::int32_t>(out)) v.push_back(e);
      break;
    case QuantDType::quint4x2:
      v = decode_int4(to_vector<std::int32_t>(out));
      break;
    case QuantDType::float8_e4m3fn:
    case QuantDType::float8_e5m2:
      throw std::invalid_argument("values_of: " + std::string(xquant::quant_dtype_name(q)) + " is not an integer type");
  }
  return v;
}

DType storage_of(QuantDType q) {
  switch (q) {
    case QuantDType::qint8:
      return DType::int8;
    case QuantDType::quint8:
      return DType::uint8;
    default:
      return DType::int32;
  }
}

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// A deterministic value stream (64-bit LCG).
struct Lcg {
  std::uint64_t s;
  std::uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(s >> 33);
  }
  std::int64_t in(std::int64_t lo, std::int64_t hi) { return lo + static_cast<std::int64_t>(next() % (hi - lo + 1)); }
};

// Input values: quarter steps in [-300, 300] and in [-12, 12] (ties after most scales; in and out of the
// int4 range), with special values sprinkled in.
std::vector<float> input_values(std::int64_t n, std::uint64_t seed, bool wide) {
  Lcg g{seed};
  const float specials[] = {kNaN, kInf, -kInf, 3.4e38f, -3.4e38f, 0.0f, -0.0f, 2.5f, -2.5f, 0.5f, -0.5f};
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = g.next() % 16;
    if (k == 0)
      v[i] = specials[g.next() % (sizeof(specials) / sizeof(specials[0]))];
    else if (wide && k == 1)
      v[i] = static_cast<float>(g.in(-3000, 3000)) * 1.0e6f;  // beyond int32 too
    else if (k < 9)
      v[i] = static_cast<float>(g.in(-1200, 1200)) * 0.25f;
    else
      v[i] = static_cast<float>(g.in(-48, 48)) * 0.25f;
  }
  return v;
}

// One test problem.
struct Case {
  DType in_dt = DType::float32;
  Shape shape;
  std::int64_t axis = 1;
  bool div_mode = true;
  QuantDType q = QuantDType::qint8;
  DType scale_dt = DType::float32;
  Shape scales_shape;          // as passed
  std::optional<DType> zp_dt;  // absent: no zero points
  std::uint64_t seed = 1;
};

std::string describe(const Case& c) {
  std::string s = std::string(xquant::dtype_name(c.in_dt)) + " " + xquant::shape_str(c.shape) + " axis " +
                  std::to_string(c.axis) + (c.div_mode ? " div " : " mul ") +
                  std::string(xquant::quant_dtype_name(c.q)) + " scales " +
                  std::string(xquant::dtype_name(c.scale_dt)) + xquant::shape_str(c.scales_shape);
  if (c.zp_dt) s += " zp " + std::string(xquant::dtype_name(*c.zp_dt));
  return s;
}

// The quantization dimension as the test understands SPEC 2, or -1 for per-tensor.
std::int64_t quant_dim(const Case& c) {
  if (numel(c.scales_shape) == 1) return -1;
  const auto rank = static_cast<std::int64_t>(c.shape.size());
  if (c.div_mode) return c.axis < 0 ? c.axis + rank : c.axis;
  return c.axis == -2 ? rank - 2 : rank - 1;
}

Tensor make_zero_points(DType dt, const Shape& shape, std::uint64_t seed, std::vector<float>& as_float) {
  const std::int64_t n = numel(shape);
  Lcg g{seed};
  as_float.assign(static_cast<std::size_t>(n), 0.0f);
  switch (dt) {
    case DType::int8: {
      std::vector<std::int8_t> v;
      for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<std::int8_t>(g.in(-128, 127)));
      for (std::int64_t i = 0; i < n; ++i) as_float[i] = v[i];
      return make_typed(dt, shape, v);
    }
    case DType::uint8: {
      std::vector<std::uint8_t> v;
      for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<std::uint8_t>(g.in(0, 255)));
      for (std::int64_t i = 0; i < n; ++i) as_float[i] = v[i];
      return make_typed(dt, shape, v);
    }
    case DType::int32: {
      std::vector<std::int32_t> v;
      for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<std::int32_t>(g.in(-40000, 40000)));
      for (std::int64_t i = 0; i < n; ++i) as_float[i] = static_cast<float>(v[i]);
      return make_typed(dt, shape, v);
    }
    default: {
      // Half steps: ties after the addition.
      std::vector<float> v;
      for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<float>(g.in(-40, 40)) * 0.5f);
      Tensor t = make_float(dt, shape, v);
      as_float = to_floats(t);
      return t;
    }
  }
}

// Runs both forms of quantize on a case and compares every element with expect_q.
void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const std::int64_t n = numel(c.shape);
  Tensor input = make_float(c.in_dt, c.shape, input_values(n, c.seed, c.q == QuantDType::qint32));
  const std::vector<float> x = to_floats(input);  // the values after narrowing to in_dt

  const std::int64_t ns = numel(c.scales_shape);
  const float scale_pool[] = {0.5f, 1.5f, 2.0f, 0.25f, 3.0f, -0.75f, 1.25f, 6.0f, 0.125f, 4.0f, 1.0f};
  std::vector<float> sv;
  for (std::int64_t i = 0; i < ns; ++i) sv.push_back(scale_pool[(i + static_cast<std::int64_t>(c.seed)) % 11]);
  Tensor scales = make_float(c.scale_dt, c.scales_shape, sv);
  const std::vector<float> s = to_floats(scales);

  std::vector<float> zp(static_cast<std::size_t>(ns), 0.0f);
  std::optional<Tensor> zpt;
  if (c.zp_dt) zpt = make_zero_points(*c.zp_dt, c.scales_shape, c.seed + 7, zp);
  std::optional<ConstTensorView> zpv;
  if (zpt) zpv = zpt->view();

  // Expected values from the test's own channel arithmetic.
  const std::int64_t d = quant_dim(c);
  std::int64_t stride = 1, len = 1;
  if (d >= 0) {
    for (std::size_t i = static_cast<std::size_t>(d) + 1; i < c.shape.size(); ++i) stride *= c.shape[i];
    len = c.shape[static_cast<std::size_t>(d)];
  }
  std::vector<std::int64_t> want(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t ch = d < 0 ? 0 : (i / stride) % len;
    want[i] = expect_q(x[i], s[ch], zp[ch], c.div_mode, c.q);
  }

  Tensor got = xquant::quantize(input, scales, zpv, c.q, c.axis, c.div_mode);
  Shape out_shape = c.shape;
  if (c.q == QuantDType::quint4x2) out_shape.back() /= 8;
  ASSERT_EQ(got.shape(), out_shape);
  ASSERT_EQ(got.dtype(), storage_of(c.q));
  const auto gv = values_of(got, c.q);
  ASSERT_EQ(gv.size(), want.size());
  int bad = 0;
  for (std::size_t i = 0; i < want.size() && bad < 10; ++i)
    if (gv[i] != want[i]) {
      ++bad;
      ADD_FAILURE() << "element " << i << " x " << x[i] << ": got " << gv[i] << " want " << want[i];
    }

  // The out-variant into a sentinel-filled buffer gives the same bytes.
  Tensor out(storage_of(c.q), out_shape);
  fill_bytes(out);
  xquant::quantize_out(out, input, scales, zpv, c.q, c.axis, c.div_mode);
  EXPECT_TRUE(same_bytes(out, got));
}

// ---------------------------------------------------------------------------------------------------------
// Hand-computed vectors.

Tensor f32(const Shape& shape, const std::vector<float>& v) { return make_float(DType::float32, shape, v); }

std::vector<std::int64_t> q1(const std::vector<float>& x, float scale, QuantDType q, bool div_mode = true,
                             std::optional<float> zp = std::nullopt) {
  Tensor in = f32({static_cast<std::int64_t>(x.size())}, x);
  Tensor s = f32({1}, {scale});
  std::optional<Tensor> z;
  if (zp) z = f32({1}, {*zp});
  std::optional<ConstTensorView> zv;
  if (z) zv = z->view();
  return values_of(xquant::quantize(in, s, zv, q, 0, div_mode), q);
}

using V = std::vector<std::int64_t>;

TEST(Quantize, TiesRoundHalfToEvenBothSigns) {
  const std::vector<float> x = {0.5f, 1.5f, 2.5f, 3.5f, -0.5f, -1.5f, -2.5f, -3.5f, 126.5f, -127.5f, 0.49999997f};
  const V want = {0, 2, 2, 4, 0, -2, -2, -4, 126, -128, 0};
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint8), want);
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint8, false), want);
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint32), want);
  // Ties produced by the scale: x / 2 = k + 0.5.
  EXPECT_EQ(q1({1.f, 3.f, 5.f, -1.f, -3.f, -5.f}, 2.0f, QuantDType::qint8), (V{0, 2, 2, 0, -2, -2}));
  // Ties produced by the zero point: 1 / 2 + 1 = 1.5 -> 2; 1 / 2 + 2 = 2.5 -> 2 (one rounding, after the add).
  EXPECT_EQ(q1({1.f}, 2.0f, QuantDType::qint8, true, 1.0f), (V{2}));
  EXPECT_EQ(q1({1.f}, 2.0f, QuantDType::qint8, true, 2.0f), (V{2}));
  EXPECT_EQ(q1({1.f, -1.f}, 0.5f, QuantDType::qint8, false, 0.5f), (V{1, 0}));  // 1.0 -> 1; -0.0 -> 0
  EXPECT_EQ(q1({3.f, -3.f}, 0.5f, QuantDType::qint8, false, 1.0f), (V{2, 0}));  // 2.5 -> 2; -0.5 -> 0
}

TEST(Quantize, SaturationInfNanEveryOutputDtype) {
  const std::vector<float> x = {200.f, -200.f, kInf, -kInf, kNaN, -kNaN, 3.4e38f, -3.4e38f, 127.4f, -128.4f, 0.f};
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint8), (V{127, -128, 127, -128, 0, 0, 127, -128, 127, -128, 0}));
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint8, false), (V{127, -128, 127, -128, 0, 0, 127, -128, 127, -128, 0}));
  EXPECT_EQ(q1(x, 1.0f, QuantDType::quint8), (V{200, 0, 255, 0, 0, 0, 255, 0, 127, 0, 0}));
  EXPECT_EQ(q1({255.4f, 255.5f, 254.5f, -0.5f, -0.6f}, 1.0f, QuantDType::quint8), (V{255, 255, 254, 0, 0}));
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint32),
            (V{200, -200, 2147483647, -2147483648LL, 0, 0, 2147483647, -2147483648LL, 127, -128, 0}));
}

TEST(Quantize, Int32SaturationNearTwoToThe31) {
  // 2147483520 is the largest float below 2^31; 2^31 itself does not fit int32; -2^31 does.
  const std::vector<float> x = {2147483520.f,  2147483648.f, 4294967296.f, -2147483648.f,
                                -2147483904.f, -1e10f,       16777217.f,   8388608.5f};
  EXPECT_EQ(q1(x, 1.0f, QuantDType::qint32), (V{2147483520LL, 2147483647LL, 2147483647LL, -2147483648LL, -2147483648LL,
                                                -2147483648LL, 16777216LL, 8388608LL}));
  // Reached through the zero point: 1 / 1 + 2147483520 (an int32 zero point, widened to float32).
  Tensor in = f32({2}, {1.f, -1.f});
  Tensor s = f32({1}, {1.f});
  Tensor z = make_typed<std::int32_t>(DType::int32, {1}, {2147483520});
  EXPECT_EQ(values_of(xquant::quantize(in, s, z.view(), QuantDType::qint32, 1, true), QuantDType::qint32),
            (V{2147483520LL, 2147483520LL}));
}

TEST(Quantize, ZeroAndNaNScalesFollowTheFormula) {
  // x / 0 = +-Inf saturates; 0 / 0 = NaN -> 0; x * NaN = NaN -> 0.
  EXPECT_EQ(q1({1.f, -1.f, 0.f}, 0.0f, QuantDType::qint8), (V{127, -128, 0}));
  EXPECT_EQ(q1({1.f, -1.f, 0.f}, 0.0f, QuantDType::quint8), (V{255, 0, 0}));
  EXPECT_EQ(q1({1.f, -1.f}, kNaN, QuantDType::qint8), (V{0, 0}));
  EXPECT_EQ(q1({1.f, -1.f}, kNaN, QuantDType::qint8, false), (V{0, 0}));
  EXPECT_EQ(q1({1.f, -1.f, 0.f}, 0.0f, QuantDType::qint8, false), (V{0, 0, 0}));
}

TEST(Quantize, DivAndMulDifferOnTies) {
  // Search for x whose x / s is a tie k + 0.5 while x * (1 / s) (the reciprocal rounded to float32) is
  // not, so that division and reciprocal multiplication give different integers.
  struct Found {
    float s, r, x;
  };
  std::vector<Found> found;
  for (float s : {3.0f, 5.0f, 7.0f, 0.3f, 0.7f, 1.1f, 10.0f, 11.0f, 13.0f}) {
    const float r = 1.0f / s;
    for (int k = -100; k <= 100 && found.size() < 40; ++k) {
      const float x = (static_cast<float>(k) + 0.5f) * s;
      if (rne(static_cast<double>(x / s)) != rne(static_cast<double>(x * r))) found.push_back({s, r, x});
    }
  }
  ASSERT_FALSE(found.empty()) << "no div/mul tie found";
  std::cout << "[ info ] " << found.size() << " div/mul tie cases, first: s = " << found[0].s << " x = " << found[0].x
            << "\n";
  for (const Found& f : found) {
    SCOPED_TRACE("s " + std::to_string(f.s) + " x " + std::to_string(f.x));
    // |x / s| <= 100.5: inside the int8 range, so the integers differ only by rounding.
    const std::int64_t div = q1({f.x}, f.s, QuantDType::qint8, true)[0];
    const std::int64_t mul = q1({f.x}, f.r, QuantDType::qint8, false)[0];
    EXPECT_EQ(div, expect_q(f.x, f.s, 0.0f, true, QuantDType::qint8));
    EXPECT_EQ(mul, expect_q(f.x, f.r, 0.0f, false, QuantDType::qint8));
    EXPECT_NE(div, mul);
  }
}

TEST(Quantize, Int4NibbleOrder) {
  // Mul mode, scale 1: element 8k + j is nibble j of word k, lowest nibble first, two's complement.
  const std::vector<float> x = {0,  1,  2,  3,  4,    5,   6,     7,    -1,   -2,    -3,   -4,
                                -5, -6, -7, -8, 7.5f, 8.f, -8.5f, -9.f, 0.5f, -0.5f, 1.5f, kNaN};
  Tensor in = f32({3, 8}, x);
  Tensor s = f32({1}, {1.f});
  Tensor out = xquant::quantize(in, s, std::nullopt, QuantDType::quint4x2, -1, false);
  ASSERT_EQ(out.shape(), (Shape{3, 1}));
  ASSERT_EQ(out.dtype(), DType::int32);
  const auto w = to_vector<std::int32_t>(out);
  EXPECT_EQ(static_cast<std::uint32_t>(w[0]), 0x76543210u);
  EXPECT_EQ(static_cast<std::uint32_t>(w[1]), 0x89ABCDEFu);
  // 7.5 -> 8 -> 7; 8 -> 7; -8.5 -> -8; -9 -> -8; 0.5 -> 0; -0.5 -> 0; 1.5 -> 2; NaN -> 0.
  EXPECT_EQ(static_cast<std::uint32_t>(w[2]), 0x02008877u);
  EXPECT_EQ(decode_int4(w), (V{0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, -8, 7, 7, -8, -8, 0, 0, 2, 0}));
}

TEST(Quantize, Int4PerChannelOnLastAndSecondToLastAxis) {
  // [2, 16] input; per-channel on the last dim (16 scales) and on dim 0 via axis = -2 (2 scales).
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.5f;
  Tensor in = f32({2, 16}, x);
  std::vector<float> s16(16);
  for (int i = 0; i < 16; ++i) s16[i] = (i % 2) ? 0.5f : 1.0f;
  Tensor s_last = f32({16}, s16);
  Tensor z_last = f32({16}, std::vector<float>(16, 0.5f));
  auto got =
      values_of(xquant::quantize(in, s_last, z_last.view(), QuantDType::quint4x2, 1, false), QuantDType::quint4x2);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[i], expect_q(x[i], s16[i % 16], 0.5f, false, QuantDType::quint4x2)) << i;
  Tensor s_rows = f32({2}, {0.25f, 2.0f});
  got = values_of(xquant::quantize(in, s_rows, std::nullopt, QuantDType::quint4x2, -2, false), QuantDType::quint4x2);
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(got[i], expect_q(x[i], i < 16 ? 0.25f : 2.0f, 0.0f, false, QuantDType::quint4x2)) << i;
}

TEST(Quantize, HandComputedPerChannel) {
  // [2, 3] input, div mode, axis 1 (3 channels), int8 zero points.
  Tensor in = f32({2, 3}, {1.f, 2.f, 3.f, -4.f, 5.f, -6.f});
  Tensor s = f32({3}, {2.f, 0.5f, 4.f});
  Tensor z = make_typed<std::int8_t>(DType::int8, {3}, {1, -1, 10});
  // 1/2+1=1.5->2, 2/0.5-1=3, 3/4+10=10.75->11, -4/2+1=-1, 5/0.5-1=9, -6/4+10=8.5->8
  EXPECT_EQ(values_of(xquant::quantize(in, s, z.view(), QuantDType::qint8, 1, true), QuantDType::qint8),
            (V{2, 3, 11, -1, 9, 8}));
  // axis -2 wraps to 0 (2 channels) in div mode.
  Tensor s0 = f32({2}, {2.f, -1.f});
  EXPECT_EQ(values_of(xquant::quantize(in, s0, std::nullopt, QuantDType::qint8, -2, true), QuantDType::qint8),
            (V{0, 1, 2, 4, -5, 6}));  // 0.5->0, 1, 1.5->2 ; 4, -5, 6
  // Mul mode on a [2, 3] input with axis 0: the document's rule makes any axis > -2 the last dim.
  Tensor s3 = f32({3}, {2.f, 0.5f, 4.f});
  Tensor z3 = f32({3}, {0.f, 0.5f, -1.f});
  EXPECT_EQ(values_of(xquant::quantize(in, s3, z3.view(), QuantDType::qint8, 0, false), QuantDType::qint8),
            (V{2, 2, 11, -8, 3, -25}));  // 2, 1.5->2, 11, -8, 3 (2.5+0.5), -24-1=-25
}

TEST(Quantize, ZeroPointsOfEveryAcceptedDtype) {
  for (DType zdt : {DType::int8, DType::uint8, DType::int32, DType::float32, DType::float16, DType::bfloat16})
    for (QuantDType q : {QuantDType::qint8, QuantDType::quint8, QuantDType::qint32}) {
      Case c;
      c.shape = {4, 5, 3};
      c.axis = 1;
      c.q = q;
      c.scales_shape = {5};
      c.zp_dt = zdt;
      c.seed = 11;
      run_case(c);
      c.scales_shape = {1};  // per-tensor with a zero point
      run_case(c);
    }
  // Floating zero points with a fraction give ties after the addition: 0.5 + 1.5 = 2; 0.5 + 2.5 = 3;
  // 1 / 4 + 0.25 = 0.5 -> 0 (float16 and bfloat16 hold these exactly).
  for (DType zdt : {DType::float32, DType::float16, DType::bfloat16}) {
    Tensor in = f32({3}, {1.f, 1.f, 1.f});
    Tensor s = f32({3}, {2.f, 2.f, 4.f});
    Tensor z = make_float(zdt, {3}, {1.5f, 2.5f, 0.25f});
    EXPECT_EQ(values_of(xquant::quantize(in, s, z.view(), QuantDType::qint8, 0, true), QuantDType::qint8),
              (V{2, 3, 0}));
  }
  // An int32 zero point is added as float32: 16777217 rounds to 16777216 (documented).
  Tensor in = f32({1}, {0.f});
  Tensor s = f32({1}, {1.f});
  Tensor z = make_typed<std::int32_t>(DType::int32, {1}, {16777217});
  EXPECT_EQ(values_of(xquant::quantize(in, s, z.view(), QuantDType::qint32, 0, true), QuantDType::qint32),
            (V{16777216}));
}

// ---------------------------------------------------------------------------------------------------------
// The independent formula over every input dtype, scale dtype, axis form and output dtype.

TEST(Quantize, DivModeEveryDtypeAndAxis) {
  const Shape shape = {3, 4, 8};
  struct AxisCase {
    std::int64_t axis;
    Shape scales;
  };
  const AxisCase axes[] = {{0, {3}}, {1, {4}}, {2, {8}}, {-1, {8}}, {-2, {4}}, {-3, {3}}, {1, {1}}, {7, {1}}};
  std::uint64_t seed = 100;
  for (DType in_dt : kFloatTypes)
    for (DType s_dt : kFloatTypes)
      for (const auto& a : axes)
        for (QuantDType q : {QuantDType::qint8, QuantDType::quint8, QuantDType::qint32}) {
          Case c;
          c.in_dt = in_dt;
          c.shape = shape;
          c.axis = a.axis;
          c.div_mode = true;
          c.q = q;
          c.scale_dt = s_dt;
          c.scales_shape = a.scales;
          c.seed = seed++;
          run_case(c);
          c.zp_dt = DType::bfloat16;
          run_case(c);
        }
}

TEST(Quantize, MulModeEveryDtypeAndAxis) {
  const Shape shape = {3, 4, 16};
  struct AxisCase {
    std::int64_t axis;
    Shape scales;
  };
  // axis -2 selects dim 1; any axis in (-2, rank) the last dim; 1-D or rank-3 scales; 1 or len elements.
  const AxisCase axes[] = {{-2, {4}},        {-1, {16}},      {0, {16}},       {1, {16}}, {2, {16}}, {-2, {1, 4, 1}},
                           {-1, {1, 1, 16}}, {0, {1, 1, 16}}, {-2, {1, 1, 1}}, {2, {1}},  {-2, {1}}};
  std::uint64_t seed = 5000;
  for (DType in_dt : kFloatTypes)
    for (DType s_dt : kFloatTypes)
      for (const auto& a : axes)
        for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2}) {
          Case c;
          c.in_dt = in_dt;
          c.shape = shape;
          c.axis = a.axis;
          c.div_mode = false;
          c.q = q;
          c.scale_dt = s_dt;
          c.scales_shape = a.scales;
          c.seed = seed++;
          run_case(c);
          c.zp_dt = s_dt;  // offset matches scales in dtype
          run_case(c);
        }
}

TEST(Quantize, OtherRanks) {
  // Rank 0 (div mode, per-tensor), rank 1, rank 4; large-ish inner and outer.
  for (DType in_dt : kFloatTypes) {
    Case c;
    c.in_dt = in_dt;
    c.shape = {};
    c.scales_shape = {1};
    c.axis = 5;  // ignored for per-tensor
    run_case(c);
    c.shape = {40};
    c.axis = 0;
    c.scales_shape = {40};
    c.q = QuantDType::quint8;
    run_case(c);
    c.shape = {2, 3, 5, 8};
    c.axis = 2;
    c.scales_shape = {5};
    c.zp_dt = DType::uint8;
    run_case(c);
    c.div_mode = false;
    c.q = QuantDType::quint4x2;
    c.axis = -2;
    c.scales_shape = {1, 1, 5, 1};
    c.zp_dt = DType::float32;
    c.scale_dt = DType::float32;
    run_case(c);
    c.shape = {24};  // rank 1, mul mode, per-channel on the only dim
    c.axis = 0;
    c.scales_shape = {24};
    run_case(c);
  }
}

TEST(Quantize, EmptyTensors) {
  const std::vector<std::pair<Shape, Shape>> cases = {{{0}, {1}}, {{0, 8}, {8}}, {{3, 0, 8}, {1}}, {{2, 0}, {1}}};
  for (const auto& [shape, scales_shape] : cases)
    for (bool div_mode : {true, false})
      for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2}) {
        if (div_mode && q == QuantDType::quint4x2) continue;
        Tensor in(DType::float32, shape);
        Tensor s = f32(scales_shape, std::vector<float>(static_cast<std::size_t>(numel(scales_shape)), 1.f));
        Tensor got = xquant::quantize(in, s, std::nullopt, q, -1, div_mode);
        Shape want = shape;
        if (q == QuantDType::quint4x2) want.back() /= 8;
        EXPECT_EQ(got.shape(), want);
        EXPECT_EQ(got.numel(), 0);
        Tensor out(storage_of(q), want);
        xquant::quantize_out(out, in, s, std::nullopt, q, -1, div_mode);
      }
  // Per-channel with zero channels: scales [0] matches input.shape[1] == 0.
  Tensor in(DType::float16, {4, 0, 2});
  Tensor s(DType::float32, {0});
  Tensor z(DType::int8, {0});
  EXPECT_EQ(xquant::quantize(in, s, z.view(), QuantDType::qint8, 1, true).shape(), (Shape{4, 0, 2}));
  // Null data is fine for an empty view.
  TensorView out{nullptr, DType::int8, {0, 3}};
  xquant::quantize_out(out, ConstTensorView{nullptr, DType::float32, {0, 3}}, s.view(), std::nullopt, QuantDType::qint8,
                       0, true);
}

TEST(Quantize, OutputShape) {
  EXPECT_EQ(xquant::quantize_output_shape({2, 3, 16}, QuantDType::quint4x2), (Shape{2, 3, 2}));
  EXPECT_EQ(xquant::quantize_output_shape({8}, QuantDType::quint4x2), (Shape{1}));
  EXPECT_EQ(xquant::quantize_output_shape({4, 0}, QuantDType::quint4x2), (Shape{4, 0}));
  EXPECT_EQ(xquant::quantize_output_shape({2, 3, 5}, QuantDType::qint8), (Shape{2, 3, 5}));
  EXPECT_EQ(xquant::quantize_output_shape({}, QuantDType::qint32), (Shape{}));
  expect_error(
      [] {
        xquant::quantize_output_shape({2, 12}, QuantDType::quint4x2);
      },
      ErrorCode::shape_mismatch, "input", {"[2, 12]", "divisible by 8"});
  expect_error([] { xquant::quantize_output_shape({}, QuantDType::quint4x2); }, ErrorCode::shape_mismatch, "input");
  expect_error(
      [] {
        xquant::quantize_output_shape({2, -8}, QuantDType::qint8);
      },
      ErrorCode::shape_mismatch, "input", {"negative"});
  expect_error([] { xquant::quantize_output_shape({8}, static_cast<QuantDType>(9)); }, ErrorCode::invalid_argument,
               "dtype");
}

// ---------------------------------------------------------------------------------------------------------
// Validation: every error names its argument and leaves the output untouched.

struct Args {
  Tensor input = f32({2, 3, 8}, std::vector<float>(48, 1.0f));
  Tensor scales = f32({3}, {1.f, 2.f, 3.f});
  std::optional<Tensor> zp;
  QuantDType q = QuantDType::qint8;
  std::int64_t axis = 1;
  bool div_mode = true;
  std::optional<Tensor> out;  // defaults to a sentinel-filled tensor of the right dtype and shape

  void expect(ErrorCode code, const std::string& arg, const std::vector<std::string>& needles = {}) {
    if (!out) {
      Shape shape = input.shape();
      if (q == QuantDType::quint4x2 && !shape.empty() && shape.back() % 8 == 0) shape.back() /= 8;
      out = Tensor(storage_of(q), shape);
    }
    fill_bytes(*out);
    std::optional<ConstTensorView> zv;
    if (zp) zv = zp->view();
    expect_error([&] { xquant::quantize_out(*out, input, scales, zv, q, axis, div_mode); }, code, arg, needles);
    EXPECT_TRUE(all_bytes(*out)) << "out was written before validation failed";
    // The allocating form rejects the same arguments (except those about out).
    if (arg != "out") expect_error([&] { xquant::quantize(input, scales, zv, q, axis, div_mode); }, code, arg, needles);
  }
};

TEST(QuantizeErrors, InputDtypeAndData) {
  Args a;
  a.input = make_typed<std::int32_t>(DType::int32, {2, 3, 8}, std::vector<std::int32_t>(48, 1));
  a.expect(ErrorCode::dtype_mismatch, "input", {"int32"});
  Args b;
  b.out = Tensor(DType::int8, {2, 3, 8});
  fill_bytes(*b.out);
  expect_error(
      [&] {
        xquant::quantize_out(*b.out, ConstTensorView{nullptr, DType::float32, {2, 3, 8}}, b.scales, std::nullopt,
                             QuantDType::qint8, 1, true);
      },
      ErrorCode::invalid_argument, "input", {"null"});
  EXPECT_TRUE(all_bytes(*b.out));
}

TEST(QuantizeErrors, DtypeModeCombinations) {
  Args a;
  a.q = QuantDType::quint4x2;
  a.expect(ErrorCode::invalid_argument, "dtype", {"quint4x2", "div_mode=true"});
  for (QuantDType q : {QuantDType::quint8, QuantDType::qint32}) {
    Args b;
    b.div_mode = false;
    b.axis = -2;
    b.q = q;
    b.expect(ErrorCode::invalid_argument, "dtype", {std::string(xquant::quant_dtype_name(q)), "div_mode=false"});
  }
  Args c;
  c.q = static_cast<QuantDType>(42);
  c.out = Tensor(DType::int8, {2, 3, 8});
  c.expect(ErrorCode::invalid_argument, "dtype");
}

TEST(QuantizeErrors, ScalesDtypeAndShapeDivMode) {
  Args a;
  a.scales = make_typed<std::int32_t>(DType::int32, {3}, {1, 2, 3});
  a.expect(ErrorCode::dtype_mismatch, "scales", {"int32"});
  Args b;
  b.scales = f32({3}, {1.f, 2.f, 3.f});
  b.axis = 2;  // 8 channels
  b.expect(ErrorCode::shape_mismatch, "scales", {"scales has shape [3] but input has 8 channels on axis 2"});
  Args c;
  c.scales = f32({1, 3}, {1.f, 2.f, 3.f});  // div mode wants 1-D
  c.expect(ErrorCode::shape_mismatch, "scales", {"[1, 3]", "1-D"});
  Args d;
  d.scales = f32({}, {1.f});  // rank 0 is not 1-D either
  d.expect(ErrorCode::shape_mismatch, "scales");
  Args e;
  e.scales = Tensor(DType::float32, {0});
  e.expect(ErrorCode::shape_mismatch, "scales", {"[0]"});
  Args f;
  f.scales = f32({3}, {1.f, 2.f, 3.f});
  f.axis = -1;  // wraps to 2: 8 channels
  f.expect(ErrorCode::shape_mismatch, "scales", {"axis 2"});
}

TEST(QuantizeErrors, AxisDivMode) {
  for (std::int64_t axis : {3, -4, 100, -100}) {
    Args a;
    a.axis = axis;
    a.expect(ErrorCode::invalid_argument, "axis", {std::to_string(axis)});
  }
  Args b;  // rank 0 with per-channel scales
  b.input = f32({}, {1.f});
  b.axis = 0;
  b.out = Tensor(DType::int8, Shape{});
  b.expect(ErrorCode::invalid_argument, "axis");
}

TEST(QuantizeErrors, AxisMulMode) {
  for (std::int64_t axis : {-3, -4, 3, 4, -100}) {
    Args a;
    a.div_mode = false;
    a.scales = f32({8}, std::vector<float>(8, 1.f));
    a.axis = axis;
    a.expect(ErrorCode::invalid_argument, "axis", {std::to_string(axis)});
  }
  Args b;  // axis -2 needs rank >= 2
  b.div_mode = false;
  b.input = f32({8}, std::vector<float>(8, 1.f));
  b.scales = f32({1}, {1.f});
  b.axis = -2;
  b.expect(ErrorCode::invalid_argument, "axis", {"-2", "rank 1"});
  Args c;  // rank 0 input
  c.div_mode = false;
  c.input = f32({}, {1.f});
  c.scales = f32({1}, {1.f});
  c.axis = -1;
  c.expect(ErrorCode::shape_mismatch, "input", {"rank >= 1"});
}

TEST(QuantizeErrors, ScalesShapeMulMode) {
  // input [2, 3, 8]: axis -2 -> dim 1 (3), axis -1 -> dim 2 (8).
  const std::vector<std::pair<std::int64_t, Shape>> bad = {
      {-1, {3}},       {-2, {8}},       {-1, {1, 8}},       {-1, {2, 1, 8}}, {-1, {1, 1, 4}},
      {-2, {1, 3, 8}}, {-2, {3, 1, 1}}, {-1, {1, 1, 1, 8}}, {-1, {0}},       {-1, {}}};
  for (const auto& [axis, shape] : bad) {
    Args a;
    a.div_mode = false;
    a.axis = axis;
    a.scales = Tensor(DType::float32, shape);
    a.expect(ErrorCode::shape_mismatch, "scales", {xquant::shape_str(shape)});
  }
}

TEST(QuantizeErrors, ZeroPoints) {
  Args a;  // div mode: int64 is not accepted
  a.zp = make_typed<std::int64_t>(DType::int64, {3}, {1, 2, 3});
  a.expect(ErrorCode::dtype_mismatch, "zero_points", {"int64"});
  Args b;  // div mode: shape must equal scales'
  b.zp = make_typed<std::int8_t>(DType::int8, {1}, {1});
  b.expect(ErrorCode::shape_mismatch, "zero_points", {"[1]", "[3]"});
  Args c;  // mul mode: dtype must equal scales'
  c.div_mode = false;
  c.axis = -2;
  c.zp = make_float(DType::float16, {3}, {1.f, 2.f, 3.f});
  c.expect(ErrorCode::dtype_mismatch, "zero_points", {"float16", "float32"});
  Args d;  // mul mode: integer offsets are not accepted either
  d.div_mode = false;
  d.axis = -2;
  d.zp = make_typed<std::int8_t>(DType::int8, {3}, {1, 2, 3});
  d.expect(ErrorCode::dtype_mismatch, "zero_points");
  Args e;  // mul mode: same element count, different shape
  e.div_mode = false;
  e.axis = -2;
  e.scales = f32({1, 3, 1}, {1.f, 2.f, 3.f});
  e.zp = f32({3}, {1.f, 2.f, 3.f});
  e.expect(ErrorCode::shape_mismatch, "zero_points", {"[3]", "[1, 3, 1]"});
  Args f;  // null data
  f.zp = Tensor(DType::int8, {3});
  std::optional<ConstTensorView> zv = ConstTensorView{nullptr, DType::int8, {3}};
  f.out = Tensor(DType::int8, {2, 3, 8});
  fill_bytes(*f.out);
  expect_error([&] { xquant::quantize_out(*f.out, f.input, f.scales, zv, QuantDType::qint8, 1, true); },
               ErrorCode::invalid_argument, "zero_points", {"null"});
  EXPECT_TRUE(all_bytes(*f.out));
}

TEST(QuantizeErrors, Int4LastDim) {
  Args a;
  a.div_mode = false;
  a.axis = -1;
  a.q = QuantDType::quint4x2;
  a.input = f32({2, 12}, std::vector<float>(24, 1.f));
  a.scales = f32({1}, {1.f});
  a.out = Tensor(DType::int32, {2, 1});
  a.expect(ErrorCode::shape_mismatch, "input", {"[2, 12]", "divisible by 8"});
}

TEST(QuantizeErrors, OutDtypeShapeAndData) {
  Args a;
  a.out = Tensor(DType::uint8, {2, 3, 8});
  a.expect(ErrorCode::dtype_mismatch, "out", {"uint8", "int8"});
  Args b;
  b.out = Tensor(DType::int8, {2, 3, 7});
  b.expect(ErrorCode::shape_mismatch, "out", {"[2, 3, 7]", "[2, 3, 8]"});
  Args c;  // quint4x2 wants int32 [.., last / 8]
  c.div_mode = false;
  c.axis = -1;
  c.q = QuantDType::quint4x2;
  c.scales = f32({1}, {1.f});
  c.out = Tensor(DType::int32, {2, 3, 8});
  c.expect(ErrorCode::shape_mismatch, "out", {"[2, 3, 1]"});
  Args d;
  d.div_mode = false;
  d.axis = -1;
  d.q = QuantDType::quint4x2;
  d.scales = f32({1}, {1.f});
  d.out = Tensor(DType::int8, {2, 3, 1});
  d.expect(ErrorCode::dtype_mismatch, "out", {"int32"});
  Args e;
  e.q = QuantDType::qint32;
  e.out = Tensor(DType::int8, {2, 3, 8});
  e.expect(ErrorCode::dtype_mismatch, "out");
  Args f;
  expect_error(
      [&] {
        xquant::quantize_out(TensorView{nullptr, DType::int8, {2, 3, 8}}, f.input, f.scales, std::nullopt,
                             QuantDType::qint8, 1, true);
      },
      ErrorCode::invalid_argument, "out", {"null"});
}

TEST(QuantizeErrors, Overlap) {
  // out placed inside the input buffer.
  {
    Tensor in = f32({4, 8}, std::vector<float>(32, 2.5f));
    Tensor s = f32({1}, {1.f});
    const Tensor before = Tensor::copy_of(in);
    TensorView out{static_cast<char*>(in.data()) + 16, DType::int8, {4, 8}};
    expect_error([&] { xquant::quantize_out(out, in, s, std::nullopt, QuantDType::qint8, 1, true); },
                 ErrorCode::aliasing, "out", {"input"});
    EXPECT_TRUE(same_bytes(in, before));
    // The very same buffer is an overlap too (different element sizes).
    TensorView same{in.data(), DType::int32, {4, 8}};
    expect_error([&] { xquant::quantize_out(same, in, s, std::nullopt, QuantDType::qint32, 1, true); },
                 ErrorCode::aliasing, "out", {"input"});
    EXPECT_TRUE(same_bytes(in, before));
  }
  // out overlapping scales and zero points (one buffer holds everything).
  {
    std::vector<float> buf(64, 1.f);
    ConstTensorView in{buf.data(), DType::float32, {2, 8}};   // floats 0..15
    ConstTensorView s{buf.data() + 16, DType::float32, {8}};  // floats 16..23
    ConstTensorView z{buf.data() + 24, DType::float32, {8}};  // floats 24..31
    TensorView out_s{buf.data() + 20, DType::int8, {2, 8}};   // bytes of floats 20..23
    TensorView out_z{buf.data() + 30, DType::int8, {2, 8}};   // bytes of floats 30..33
    const std::vector<float> before = buf;
    expect_error([&] { xquant::quantize_out(out_s, in, s, std::nullopt, QuantDType::qint8, 1, true); },
                 ErrorCode::aliasing, "out", {"scales"});
    expect_error([&] { xquant::quantize_out(out_z, in, s, z, QuantDType::qint8, 1, true); }, ErrorCode::aliasing, "out",
                 {"zero_points"});
    EXPECT_EQ(std::memcmp(buf.data(), before.data(), buf.size() * sizeof(float)), 0);
    // Adjacent but disjoint is fine.
    TensorView out_ok{buf.data() + 32, DType::int8, {2, 8}};
    xquant::quantize_out(out_ok, in, s, z, QuantDType::qint8, 1, true);
    const auto* o = static_cast<const std::int8_t*>(out_ok.data);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(o[i], 2);  // 1 / 1 + 1
  }
}

}  // namespace
