// Tests of npu_dynamic_quant_asymmetric (SPEC section 4): hand-computed rows, an independent scalar
// oracle written here (not the library's reference), edge values, packing and every validation path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "xquant/runtime.hpp"

namespace {

using namespace xqtest;
using xquant::DynamicQuantMode;
using xquant::ErrorCode;
using xquant::QuantDType;

constexpr const char* kOp = "xquant::dynamic_quant_asymmetric: ";
constexpr float kFloor = 1e-12f;

// ---------------------------------------------------------------------------------------------------
// The independent oracle: SPEC 4 written out directly on widened float values.

struct Expected {
  std::vector<int> y;  // unpacked, one value per element of x
  std::vector<float> scale;
  std::vector<float> offset;
};

// smooth: widened, [H] (ends empty) or [E * H]; ends: group_index values (row ends).
Expected oracle(const std::vector<float>& xs, std::int64_t S, std::int64_t H, const std::vector<float>* smooth,
                const std::vector<std::int64_t>& ends, bool int4, bool per_tensor) {
  const float hi = int4 ? 7.0f : 127.0f;
  const float lo = int4 ? -8.0f : -128.0f;
  auto expert = [&](std::int64_t r) {
    std::int64_t e = 0;
    if (ends.empty()) return e;
    while (ends[static_cast<std::size_t>(e)] <= r) ++e;
    return e;
  };
  auto xp = [&](std::int64_t r, std::int64_t j) {
    float v = xs[static_cast<std::size_t>(r * H + j)];
    if (smooth != nullptr) v = v * (*smooth)[static_cast<std::size_t>(expert(r) * H + j)];
    return v;
  };
  Expected out;
  out.y.resize(static_cast<std::size_t>(S * H));
  // [r0, r1) rows share one (scale, offset).
  auto block = [&](std::int64_t r0, std::int64_t r1) {
    bool any_nan = false, seen = false;
    float mx = 0.0f, mn = 0.0f;
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t j = 0; j < H; ++j) {
        const float v = xp(r, j);
        if (std::isnan(v)) {
          any_nan = true;
        } else if (!seen) {
          mx = mn = v;
          seen = true;
        } else {
          mx = std::max(mx, v);
          mn = std::min(mn, v);
        }
      }
    if (any_nan) mx = mn = kNaN;
    float scale = (mx - mn) / (hi - lo);
    if (!std::isnan(scale) && scale < kFloor) scale = kFloor;
    const float offset = hi - mx / scale;
    out.scale.push_back(scale);
    out.offset.push_back(offset);
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t j = 0; j < H; ++j) {
        const float q = xp(r, j) / scale;
        const float v = q + offset;
        const float rounded = std::nearbyint(v);
        int y = 0;
        if (std::isnan(rounded))
          y = 0;
        else if (rounded <= lo)
          y = static_cast<int>(lo);
        else if (rounded >= hi)
          y = static_cast<int>(hi);
        else
          y = static_cast<int>(rounded);
        out.y[static_cast<std::size_t>(r * H + j)] = y;
      }
  };
  if (per_tensor) {
    block(0, S);
  } else {
    for (std::int64_t r = 0; r < S; ++r) block(r, r + 1);
  }
  return out;
}

// Independent int4 decoder: each int32 word holds eight two's complement nibbles, lowest first.
std::vector<int> decode_int4_words(const std::vector<std::int32_t>& words) {
  std::vector<int> out;
  for (std::int32_t w : words) {
    std::uint32_t u = static_cast<std::uint32_t>(w);
    for (int k = 0; k < 8; ++k) {
      const int nib = static_cast<int>(u & 0xFu);
      u >>= 4;
      out.push_back((nib & 8) != 0 ? nib - 16 : nib);
    }
  }
  return out;
}

std::vector<int> decode_y(const ConstTensorView& y, bool int4) {
  if (int4) return decode_int4_words(to_vector<std::int32_t>(y));
  std::vector<int> out;
  for (std::int8_t v : to_vector<std::int8_t>(y)) out.push_back(v);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Running a case through both API forms and comparing with the oracle.

constexpr std::size_t kGuard = 64;

// An output buffer with sentinel-filled guard bytes after the view's end.
struct Guarded {
  Tensor storage;
  TensorView view;
  std::size_t bytes = 0;
  Guarded(DType dt, const Shape& shape) {
    bytes = static_cast<std::size_t>(xquant::shape_numel(shape)) * xquant::dtype_size(dt);
    storage = Tensor(DType::uint8, {static_cast<std::int64_t>(bytes + kGuard)});
    std::memset(storage.data(), 0xA5, bytes + kGuard);
    view = TensorView(storage.data(), dt, shape);
  }
  bool guard_intact() const {
    const auto* p = storage.data<std::uint8_t>();
    for (std::size_t i = bytes; i < bytes + kGuard; ++i)
      if (p[i] != 0xA5) return false;
    return true;
  }
};

struct Case {
  DType dt = DType::float32;
  Shape shape;
  std::vector<float> x;
  std::optional<DType> smooth_dt;  // smooth_scales present when set
  Shape smooth_shape;
  std::vector<float> smooth;
  std::optional<DType> gi_dt;  // group_index present when set (int32 / int64)
  std::vector<std::int64_t> gi;
  QuantDType dst = QuantDType::qint8;
  DynamicQuantMode mode = DynamicQuantMode::pertoken;
};

struct Got {
  std::vector<int> y;
  std::vector<float> scale;
  std::vector<float> offset;
  Shape y_shape;
  Shape param_shape;
};

Tensor make_group_index(DType dt, const std::vector<std::int64_t>& v) {
  const Shape s{static_cast<std::int64_t>(v.size())};
  if (dt == DType::int64) return make_typed<std::int64_t>(dt, s, v);
  std::vector<std::int32_t> w(v.begin(), v.end());
  return make_typed<std::int32_t>(dt, s, w);
}

std::string describe(const Case& c) {
  std::string s = std::string(xquant::dtype_name(c.dt)) + " x" + xquant::shape_str(c.shape) + " dst " +
                  std::string(xquant::quant_dtype_name(c.dst)) +
                  (c.mode == DynamicQuantMode::pertensor ? " pertensor" : " pertoken");
  if (c.smooth_dt) s += " smooth " + std::string(xquant::dtype_name(*c.smooth_dt)) + xquant::shape_str(c.smooth_shape);
  if (c.gi_dt) s += " group_index " + std::string(xquant::dtype_name(*c.gi_dt));
  return s;
}

Got check_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const bool int4 = c.dst == QuantDType::quint4x2;
  const bool per_tensor = c.mode == DynamicQuantMode::pertensor;
  Tensor x = make_float(c.dt, c.shape, c.x);
  const Tensor x_copy = Tensor::copy_of(x);
  std::optional<Tensor> smooth, gi;
  std::optional<ConstTensorView> smooth_v, gi_v;
  if (c.smooth_dt) {
    smooth = make_float(*c.smooth_dt, c.smooth_shape, c.smooth);
    smooth_v = smooth->view();
  }
  if (c.gi_dt) {
    gi = make_group_index(*c.gi_dt, c.gi);
    gi_v = gi->view();
  }

  const std::int64_t H = c.shape.back();
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < c.shape.size(); ++d) rows *= c.shape[d];
  const std::vector<float> xs = to_floats(x);
  std::vector<float> sm;
  if (smooth) sm = to_floats(*smooth);
  const Expected want = oracle(xs, rows, H, smooth ? &sm : nullptr, c.gi, int4, per_tensor);

  Shape y_shape = c.shape;
  if (int4) y_shape.back() = H / 8;
  const Shape param_shape = per_tensor ? Shape{1} : Shape(c.shape.begin(), c.shape.end() - 1);
  Guarded y(int4 ? DType::int32 : DType::int8, y_shape), scale(DType::float32, param_shape),
      offset(DType::float32, param_shape);
  xquant::dynamic_quant_asymmetric_out(y.view, scale.view, offset.view, x, smooth_v, gi_v, c.dst, c.mode);
  EXPECT_TRUE(y.guard_intact()) << "y written past its end";
  EXPECT_TRUE(scale.guard_intact()) << "scale written past its end";
  EXPECT_TRUE(offset.guard_intact()) << "offset written past its end";
  EXPECT_TRUE(same_bytes(x, x_copy)) << "x modified";

  Got got;
  got.y = decode_y(y.view, int4);
  got.scale = to_floats(scale.view);
  got.offset = to_floats(offset.view);
  got.y_shape = y_shape;
  got.param_shape = param_shape;
  EXPECT_EQ(got.y, want.y);
  expect_floats_bitexact(got.scale, want.scale, "scale");
  expect_floats_bitexact(got.offset, want.offset, "offset");

  // The allocating form gives the same tensors, bit for bit.
  const xquant::DynamicQuantResult r = xquant::dynamic_quant_asymmetric(x, smooth_v, gi_v, c.dst, c.mode);
  EXPECT_EQ(r.y.dtype(), int4 ? DType::int32 : DType::int8);
  EXPECT_EQ(r.y.shape(), y_shape);
  EXPECT_EQ(r.scale.dtype(), DType::float32);
  EXPECT_EQ(r.scale.shape(), param_shape);
  EXPECT_EQ(r.offset.dtype(), DType::float32);
  EXPECT_EQ(r.offset.shape(), param_shape);
  EXPECT_TRUE(same_bytes(r.y, y.view));
  EXPECT_TRUE(same_bytes(r.scale, scale.view));
  EXPECT_TRUE(same_bytes(r.offset, offset.view));
  return got;
}

std::vector<float> iota_row(std::int64_t n, float start, float step) {
  std::vector<float> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(start + step * static_cast<float>(i));
  return v;
}

std::vector<int> iota_int(int n, int start) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(start + i);
  return v;
}

template <typename T>
std::vector<T> repeat(const std::vector<T>& v, int times) {
  std::vector<T> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), v.begin(), v.end());
  return out;
}

// Random rows of varying range and sign (some all-positive, some all-negative), values that float16 holds.
std::vector<float> random_rows(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const float mags[] = {1e-3f, 0.5f, 1.0f, 37.0f, 1000.0f, 30000.0f};
  std::uniform_int_distribution<int> pick(0, 5), kind(0, 3);
  std::vector<float> v;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float m = mags[pick(rng)];
    const int k = kind(rng);
    const float a = k == 1 ? 0.1f * m : -m;  // all positive when k == 1
    const float b = k == 2 ? -0.1f * m : m;  // all negative when k == 2
    std::uniform_real_distribution<float> u(a, b);
    for (std::int64_t j = 0; j < cols; ++j) v.push_back(k == 3 && j % 3 == 0 ? std::round(u(rng)) : u(rng));
  }
  return v;
}

const DynamicQuantMode kModes[] = {DynamicQuantMode::pertoken, DynamicQuantMode::pertensor};
const QuantDType kDsts[] = {QuantDType::qint8, QuantDType::quint4x2};

// ---------------------------------------------------------------------------------------------------
// Hand-computed rows.

TEST(DynamicQuant, Row0To255HasScale1Offset128) {
  // rowMax 255, rowMin 0: scale = 255 / 255 = 1, offset = 127 - 255 / 1 = -128, y = j - 128.
  for (DType dt : kFloatTypes) {
    Case c;
    c.dt = dt;
    c.shape = {1, 256};
    c.x = iota_row(256, 0.0f, 1.0f);
    const Got g = check_case(c);
    EXPECT_EQ(g.y, iota_int(256, -128));
    expect_floats_bitexact(g.scale, {1.0f});
    expect_floats_bitexact(g.offset, {-128.0f});
  }
}

TEST(DynamicQuant, HandRowsInt8) {
  for (DType dt : kFloatTypes) {
    Case c;
    c.dt = dt;
    c.shape = {2, 256};
    c.x = iota_row(256, -128.0f, 1.0f);                          // scale 1, offset 127 - 127 = 0: y = x
    const std::vector<float> evens = iota_row(256, 0.0f, 2.0f);  // scale 510 / 255 = 2, offset -128
    c.x.insert(c.x.end(), evens.begin(), evens.end());
    const Got g = check_case(c);
    std::vector<int> want = iota_int(256, -128);
    const std::vector<int> second = iota_int(256, -128);  // 2j / 2 - 128
    want.insert(want.end(), second.begin(), second.end());
    EXPECT_EQ(g.y, want);
    expect_floats_bitexact(g.scale, {1.0f, 2.0f});
    expect_floats_bitexact(g.offset, {0.0f, -128.0f});
  }
}

TEST(DynamicQuant, Int4HandRowAndPackingOrder) {
  // Row 0..15: scale = 15 / 15 = 1, offset = 7 - 15 = -8, y = j - 8 (negative nibbles first).
  for (DType dt : kFloatTypes) {
    Case c;
    c.dt = dt;
    c.dst = QuantDType::quint4x2;
    c.shape = {1, 16};
    c.x = iota_row(16, 0.0f, 1.0f);
    const Got g = check_case(c);
    EXPECT_EQ(g.y, iota_int(16, -8));
    expect_floats_bitexact(g.scale, {1.0f});
    expect_floats_bitexact(g.offset, {-8.0f});
    EXPECT_EQ(g.y_shape, (Shape{1, 2}));

    // Raw words: element 8k + j in bits [4j, 4j + 3] of word k, two's complement nibbles.
    const Tensor xt = make_float(dt, c.shape, c.x);
    const auto r = xquant::dynamic_quant_asymmetric(xt, std::nullopt, std::nullopt, QuantDType::quint4x2);
    const auto words = to_vector<std::int32_t>(r.y);
    ASSERT_EQ(words.size(), 2u);
    EXPECT_EQ(static_cast<std::uint32_t>(words[0]), 0xFEDCBA98u);  // -8..-1
    EXPECT_EQ(static_cast<std::uint32_t>(words[1]), 0x76543210u);  // 0..7
  }
  // A reversed row puts 7 in the lowest nibble.
  Case c;
  c.dst = QuantDType::quint4x2;
  c.shape = {1, 8};
  c.x = {15, 14, 13, 12, 3, 2, 1, 0};  // y = 7, 6, 5, 4, -5, -6, -7, -8
  const Got g = check_case(c);
  EXPECT_EQ(g.y, (std::vector<int>{7, 6, 5, 4, -5, -6, -7, -8}));
  const Tensor xt = make_float(DType::float32, c.shape, c.x);
  const auto r = xquant::dynamic_quant_asymmetric(xt, std::nullopt, std::nullopt, QuantDType::quint4x2);
  EXPECT_EQ(static_cast<std::uint32_t>(to_vector<std::int32_t>(r.y)[0]), 0x89AB4567u);
}

TEST(DynamicQuant, PertokenVersusPertensorOnTheSameData) {
  const std::vector<float> x = {0, 255, 100, 50, -255, 0, 255, 10};
  for (DType dt : kFloatTypes) {
    Case c;
    c.dt = dt;
    c.shape = {2, 4};
    c.x = x;
    // Row 0: scale 1, offset -128. Row 1: scale 510 / 255 = 2, offset 127 - 255 / 2 = -0.5:
    // -255 / 2 - 0.5 = -128, 0 - 0.5 -> -0 -> 0, 127.5 - 0.5 = 127, 5 - 0.5 = 4.5 -> 4 (tie to even).
    Got g = check_case(c);
    EXPECT_EQ(g.y, (std::vector<int>{-128, 127, -28, -78, -128, 0, 127, 4}));
    expect_floats_bitexact(g.scale, {1.0f, 2.0f});
    expect_floats_bitexact(g.offset, {-128.0f, -0.5f});
    EXPECT_EQ(g.param_shape, (Shape{2}));

    // Whole tensor: max 255, min -255, scale 2, offset -0.5 for every element:
    // 100 / 2 - 0.5 = 49.5 -> 50, 50 / 2 - 0.5 = 24.5 -> 24 (ties to even).
    c.mode = DynamicQuantMode::pertensor;
    g = check_case(c);
    EXPECT_EQ(g.y, (std::vector<int>{0, 127, 50, 24, -128, 0, 127, 4}));
    expect_floats_bitexact(g.scale, {2.0f});
    expect_floats_bitexact(g.offset, {-0.5f});
    EXPECT_EQ(g.param_shape, (Shape{1}));
  }
}

TEST(DynamicQuant, TiesRoundHalfToEvenBothSigns) {
  // scale 1, offset -128: x - 128 lands exactly on k + 0.5.
  for (DType dt : {DType::float32, DType::float16}) {
    Case c;
    c.dt = dt;
    c.shape = {1, 11};
    c.x = {0, 255, 0.5f, 1.5f, 2.5f, 126.5f, 127.5f, 128.5f, 129.5f, 253.5f, 254.5f};
    const Got g = check_case(c);
    //           -127.5 -126.5 -125.5 -1.5 -0.5 0.5 1.5 125.5 126.5
    EXPECT_EQ(g.y, (std::vector<int>{-128, 127, -128, -126, -126, -2, 0, 0, 2, 126, 126}));
  }
  // int4: scale 1, offset -8.
  for (DType dt : kFloatTypes) {
    Case c;
    c.dt = dt;
    c.dst = QuantDType::quint4x2;
    c.shape = {1, 8};
    c.x = {0, 15, 0.5f, 1.5f, 7.5f, 8.5f, 9.5f, 14.5f};
    const Got g = check_case(c);
    //                          -7.5 -6.5 -0.5 0.5 1.5 6.5
    EXPECT_EQ(g.y, (std::vector<int>{-8, 7, -8, -6, 0, 0, 2, 6}));
  }
}

TEST(DynamicQuant, DivisionNotReciprocalMultiplication) {
  // Row [0, 257, ...]: scale = 257 / 255. x / scale - 128 is exactly -32.5 and 63.5 for these two
  // values (-> -32 and 64), while x * (1 / scale) - 128 gives -32.5000076 and 63.4999847 (-> -33, 63).
  Case c;
  c.shape = {1, 4};
  c.x = {0.0f, 257.0f, 0x1.80fefep+6f, 0x1.8201p+7f};
  const Got g = check_case(c);
  const float scale = 257.0f / 255.0f;
  const float offset = 127.0f - 257.0f / scale;
  EXPECT_FLOAT_EQ(offset, -128.0f);
  EXPECT_EQ(c.x[2] / scale + offset, -32.5f);
  EXPECT_EQ(c.x[3] / scale + offset, 63.5f);
  EXPECT_EQ(g.y, (std::vector<int>{-128, 127, -32, 64}));
  expect_floats_bitexact(g.scale, {scale});
  expect_floats_bitexact(g.offset, {offset});
}

// ---------------------------------------------------------------------------------------------------
// The oracle over random data: every x dtype, both destinations, both modes, many shapes.

TEST(DynamicQuant, RandomAgainstOracle) {
  const Shape shapes[] = {{1, 1}, {1, 8}, {3, 7}, {4, 16}, {2, 3, 33}, {5, 64}, {2, 200}, {2, 2, 2, 24}, {1, 1032}};
  std::uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (QuantDType dst : kDsts)
      for (DynamicQuantMode mode : kModes)
        for (const Shape& shape : shapes) {
          if (dst == QuantDType::quint4x2 && shape.back() % 8 != 0) continue;
          Case c;
          c.dt = dt;
          c.dst = dst;
          c.mode = mode;
          c.shape = shape;
          const std::int64_t n = xquant::shape_numel(shape);
          c.x = random_rows(n / shape.back(), shape.back(), seed++);
          check_case(c);
        }
}

TEST(DynamicQuant, RankThreeAndFourParameterShapes) {
  for (QuantDType dst : kDsts) {
    Case c;
    c.dst = dst;
    c.shape = {2, 3, 16};
    c.x = random_rows(6, 16, 77);
    Got g = check_case(c);
    EXPECT_EQ(g.param_shape, (Shape{2, 3}));
    EXPECT_EQ(g.y_shape, dst == QuantDType::qint8 ? (Shape{2, 3, 16}) : (Shape{2, 3, 2}));
    c.shape = {2, 1, 3, 8};
    c.x = random_rows(6, 8, 78);
    g = check_case(c);
    EXPECT_EQ(g.param_shape, (Shape{2, 1, 3}));
  }
}

// ---------------------------------------------------------------------------------------------------
// smooth_scales and MoE groups.

TEST(DynamicQuant, SmoothScalesHand) {
  // x' = x * 2: row 0..255 becomes 0..510: scale 2, offset -128, y = j - 128.
  for (DType dt : kFloatTypes)
    for (DType sdt : kFloatTypes) {
      Case c;
      c.dt = dt;
      c.shape = {1, 256};
      c.x = iota_row(256, 0.0f, 1.0f);
      c.smooth_dt = sdt;
      c.smooth_shape = {256};
      c.smooth = std::vector<float>(256, 2.0f);
      const Got g = check_case(c);
      EXPECT_EQ(g.y, iota_int(256, -128));
      expect_floats_bitexact(g.scale, {2.0f});
      expect_floats_bitexact(g.offset, {-128.0f});
    }
  // Per-column smooth: x' = [1, 2, 3, 4] * [2, 0.5, -1, 4] = [2, 1, -3, 16]; independent of smooth's order.
  Case c;
  c.shape = {1, 4};
  c.x = {1, 2, 3, 4};
  c.smooth_dt = DType::float32;
  c.smooth_shape = {4};
  c.smooth = {2, 0.5f, -1, 4};
  const Got g = check_case(c);
  const float scale = (16.0f - -3.0f) / 255.0f;
  expect_floats_bitexact(g.scale, {scale});
  expect_floats_bitexact(g.offset, {127.0f - 16.0f / scale});
  EXPECT_EQ(g.y.back(), 127);
  EXPECT_EQ(g.y[2], -128);
}

TEST(DynamicQuant, SmoothScalesRandomMixedDtypes) {
  std::uint32_t seed = 100;
  for (DType dt : kFloatTypes)
    for (DType sdt : kFloatTypes)
      for (QuantDType dst : kDsts) {
        Case c;
        c.dt = dt;
        c.dst = dst;
        c.shape = {3, 2, 24};
        c.x = random_rows(6, 24, seed++);
        c.smooth_dt = sdt;
        c.smooth_shape = {24};
        c.smooth = random_rows(1, 24, seed++);
        check_case(c);
      }
}

TEST(DynamicQuant, MoeGroupsWithEmptyGroupsHand) {
  // Six rows [0, 255, 10, ...]; expert e scales by (e + 1), so x' spans [0, 255 (e + 1)] and
  // scale = e + 1 exactly, offset = -128, y = x - 128 whatever the expert.
  // group_index [0, 2, 2, 5, 6, 6]: expert 0 empty (first), 2 empty (middle), 5 empty (last);
  // rows 0-1 -> expert 1, rows 2-4 -> expert 3, row 5 -> expert 4.
  const std::vector<float> row = {0, 255, 10, 20, 30, 40, 50, 60};
  for (DType gdt : {DType::int32, DType::int64})
    for (DType dt : kFloatTypes) {
      Case c;
      c.dt = dt;
      c.shape = {2, 3, 8};
      c.x = repeat(row, 6);
      c.smooth_dt = DType::float32;
      c.smooth_shape = {6, 8};
      for (int e = 0; e < 6; ++e)
        for (int j = 0; j < 8; ++j) c.smooth.push_back(static_cast<float>(e + 1));
      c.gi_dt = gdt;
      c.gi = {0, 2, 2, 5, 6, 6};
      const Got g = check_case(c);
      expect_floats_bitexact(g.scale, {2, 2, 4, 4, 4, 5});
      expect_floats_bitexact(g.offset, std::vector<float>(6, -128.0f));
      EXPECT_EQ(g.y, repeat(std::vector<int>{-128, 127, -118, -108, -98, -88, -78, -68}, 6));
      EXPECT_EQ(g.param_shape, (Shape{2, 3}));
    }
}

TEST(DynamicQuant, MoeGroupsRandom) {
  const std::vector<std::vector<std::int64_t>> layouts = {
      {6}, {0, 6}, {6, 6}, {1, 2, 3, 4, 5, 6}, {0, 0, 3, 3, 3, 6, 6}, {2, 2, 6}, {0, 1, 1, 1, 6}};
  std::uint32_t seed = 500;
  for (DType gdt : {DType::int32, DType::int64})
    for (QuantDType dst : kDsts)
      for (const auto& gi : layouts) {
        const auto E = static_cast<std::int64_t>(gi.size());
        Case c;
        c.dt = seed % 3 == 0 ? DType::float16 : seed % 3 == 1 ? DType::bfloat16 : DType::float32;
        c.dst = dst;
        c.shape = {6, 16};
        c.x = random_rows(6, 16, seed++);
        c.smooth_dt = seed % 2 == 0 ? DType::float32 : DType::bfloat16;
        c.smooth_shape = {E, 16};
        c.smooth = random_rows(E, 16, seed++);
        c.gi_dt = gdt;
        c.gi = gi;
        check_case(c);
      }
}

// ---------------------------------------------------------------------------------------------------
// Edge values.

TEST(DynamicQuant, ConstantRows) {
  // max == min: scale = max(0, 1e-12) = 1e-12, offset = DST_MAX - c / 1e-12 stays finite.
  for (QuantDType dst : kDsts)
    for (DType dt : kFloatTypes) {
      Case c;
      c.dt = dt;
      c.dst = dst;
      c.shape = {5, 8};
      for (float v : {0.0f, 1.0f, 3.0f, -2.0f, -0.0f}) {
        const std::vector<float> row(8, v);
        c.x.insert(c.x.end(), row.begin(), row.end());
      }
      const Got g = check_case(c);
      const float dmax = dst == QuantDType::qint8 ? 127.0f : 7.0f;
      for (std::size_t r = 0; r < 5; ++r) {
        EXPECT_TRUE(same_bits(g.scale[r], kFloor)) << r;
        EXPECT_TRUE(std::isfinite(g.offset[r])) << r;
      }
      // A zero row: offset = DST_MAX, y = 0 / 1e-12 + DST_MAX = DST_MAX.
      EXPECT_TRUE(same_bits(g.offset[0], dmax));
      EXPECT_TRUE(same_bits(g.offset[4], dmax));
      for (int j = 0; j < 8; ++j) {
        EXPECT_EQ(g.y[static_cast<std::size_t>(j)], static_cast<int>(dmax));
        EXPECT_EQ(g.y[static_cast<std::size_t>(32 + j)], static_cast<int>(dmax));
      }
      // A row of ones: offset = DST_MAX - 1 / 1e-12 (float32).
      EXPECT_TRUE(same_bits(g.offset[1], dmax - 1.0f / kFloor));
    }
}

TEST(DynamicQuant, NaNRowsGiveNaNParametersAndZeros) {
  for (QuantDType dst : kDsts)
    for (DType dt : kFloatTypes) {
      Case c;
      c.dt = dt;
      c.dst = dst;
      c.shape = {3, 8};
      c.x = {0,    1,    2,    3,    4,    5,    6,    15,  //
             1,    2,    kNaN, 4,    5,    6,    7,    8,   //
             kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
      Got g = check_case(c);
      EXPECT_FALSE(std::isnan(g.scale[0]));
      for (std::size_t r = 1; r < 3; ++r) {
        EXPECT_TRUE(std::isnan(g.scale[r])) << r;
        EXPECT_TRUE(std::isnan(g.offset[r])) << r;
      }
      for (std::size_t i = 8; i < 24; ++i) EXPECT_EQ(g.y[i], 0) << i;

      // Pertensor: one NaN anywhere makes everything 0.
      c.mode = DynamicQuantMode::pertensor;
      c.x = iota_row(24, 0.0f, 1.0f);
      c.x[13] = kNaN;
      g = check_case(c);
      EXPECT_TRUE(std::isnan(g.scale[0]));
      EXPECT_TRUE(std::isnan(g.offset[0]));
      EXPECT_EQ(g.y, std::vector<int>(24, 0));
    }
}

// Regression: on a one-element row holding a NaN with a payload, the reference backend kept the payload
// in offset (rowMax / scale propagates it) while the cpu backend gave 0x7FC00000. Every NaN scale /
// offset is now the canonical quiet NaN on both backends (docs/semantics.md), including the NaN that
// Inf / Inf produces (x86's default NaN is 0xFFC00000).
TEST(DynamicQuant, NaNParametersAreTheCanonicalQuietNaNOnEveryBackend) {
  constexpr std::uint32_t kCanonical = 0x7FC00000u;
  const std::uint32_t payloads[] = {0x7FC00001u, 0xFFC12345u, 0x7FA00000u /* signalling */, 0xFFFFFFFFu};
  const xquant::Backend saved = xquant::get_backend();
  for (xquant::Backend b : {xquant::Backend::cpu, xquant::Backend::reference}) {
    xquant::set_backend(b);
    const char* bname = b == xquant::Backend::cpu ? "cpu" : "reference";
    for (std::uint32_t bits : payloads) {
      for (auto mode : {DynamicQuantMode::pertoken, DynamicQuantMode::pertensor}) {
        Tensor x(DType::float32, {1, 1});
        x.data<std::uint32_t>()[0] = bits;
        const auto r = xquant::dynamic_quant_asymmetric(x, std::nullopt, std::nullopt, QuantDType::qint8, mode);
        EXPECT_EQ(r.scale.data<std::uint32_t>()[0], kCanonical) << bname << " payload " << std::hex << bits;
        EXPECT_EQ(r.offset.data<std::uint32_t>()[0], kCanonical) << bname << " payload " << std::hex << bits;
        EXPECT_EQ(r.y.data<std::int8_t>()[0], 0) << bname;
      }
      // float16 input with a payload (0x7E01 widens to a float32 NaN with a payload), int4 output.
      Tensor h(DType::float16, {1, 8});
      for (int j = 0; j < 8; ++j) h.data<std::uint16_t>()[j] = xquant::float_to_half(static_cast<float>(j));
      h.data<std::uint16_t>()[3] = 0x7E01;
      const auto r = xquant::dynamic_quant_asymmetric(h, std::nullopt, std::nullopt, QuantDType::quint4x2);
      EXPECT_EQ(r.scale.data<std::uint32_t>()[0], kCanonical) << bname;
      EXPECT_EQ(r.offset.data<std::uint32_t>()[0], kCanonical) << bname;
      EXPECT_EQ(r.y.data<std::int32_t>()[0], 0) << bname;
    }
    // Inf / Inf in offset = 127 - rowMax / scale, and Inf - Inf in scale.
    Tensor x = make_float(DType::float32, {2, 2}, {kInf, 1.0f, kInf, kInf});
    const auto r = xquant::dynamic_quant_asymmetric(x);
    EXPECT_EQ(r.offset.data<std::uint32_t>()[0], kCanonical) << bname;
    EXPECT_EQ(r.scale.data<std::uint32_t>()[1], kCanonical) << bname;
    EXPECT_EQ(r.offset.data<std::uint32_t>()[1], kCanonical) << bname;
  }
  xquant::set_backend(saved);
}

TEST(DynamicQuant, InfinityRowsFollowTheFormula) {
  for (DType dt : kFloatTypes) {
    Case c;
    c.dt = dt;
    c.shape = {4, 4};
    c.x = {kInf,  1,     2,    3,      // scale Inf, offset 127 - Inf / Inf = NaN, y = 0
           -kInf, 1,     2,    3,      // scale Inf, offset 127 - 3 / Inf = 127: y = 127, -Inf / Inf = NaN -> 0
           kInf,  -kInf, 0,    1,      // scale Inf, offset NaN
           kInf,  kInf,  kInf, kInf};  // Inf - Inf = NaN scale
    const Got g = check_case(c);
    const std::vector<float> want_scale = {kInf, kInf, kInf, kNaN};
    const std::vector<float> want_offset = {kNaN, 127.0f, kNaN, kNaN};
    expect_floats_bitexact(g.scale, want_scale);
    expect_floats_bitexact(g.offset, want_offset);
    EXPECT_EQ(g.y, (std::vector<int>{0, 0, 0, 0, 0, 127, 127, 127, 0, 0, 0, 0, 0, 0, 0, 0}));
  }
  // Pertensor with -Inf only at one end: scale Inf, offset 127 - 2 / Inf = 127.
  Case c;
  c.mode = DynamicQuantMode::pertensor;
  c.shape = {2, 2};
  c.x = {-kInf, 1, 2, 0};
  const Got g = check_case(c);
  expect_floats_bitexact(g.scale, {kInf});
  expect_floats_bitexact(g.offset, {127.0f});
  EXPECT_EQ(g.y, (std::vector<int>{0, 127, 127, 127}));
}

TEST(DynamicQuant, LargestFiniteValues) {
  Case c;
  c.shape = {3, 4};
  c.x = {3.4e38f,  -3.4e38f, 0,      1,   // max - min overflows: scale Inf, offset 127 - 3.4e38 / Inf = 127
         3.4e38f,  0,        1e38f,  -1,  // finite scale ~1.3e36
         -3.4e38f, -3.0e38f, -1e38f, -3.3e38f};
  for (QuantDType dst : kDsts) {
    c.dst = dst;
    c.shape = {3, dst == QuantDType::qint8 ? 4 : 8};
    if (dst == QuantDType::quint4x2) {
      c.x = {3.4e38f,  -3.4e38f, 0,      1,        5,  6,  7,  8,  //
             3.4e38f,  0,        1e38f,  -1,       2,  3,  4,  5,  //
             -3.4e38f, -3.0e38f, -1e38f, -3.3e38f, -1, -2, -3, -4};
    }
    const Got g = check_case(c);
    const float dmax = dst == QuantDType::qint8 ? 127.0f : 7.0f;
    EXPECT_TRUE(same_bits(g.scale[0], kInf));
    EXPECT_TRUE(same_bits(g.offset[0], dmax));
    for (std::size_t j = 0; j < static_cast<std::size_t>(c.shape[1]); ++j) EXPECT_EQ(g.y[j], static_cast<int>(dmax));
    EXPECT_TRUE(std::isfinite(g.scale[1]));
    EXPECT_TRUE(std::isfinite(g.scale[2]));
  }
}

// ---------------------------------------------------------------------------------------------------
// Empty tensors.

TEST(DynamicQuant, EmptyRows) {
  for (QuantDType dst : kDsts) {
    for (const Shape& shape : {Shape{0, 8}, Shape{2, 0, 8}}) {
      Case c;
      c.dst = dst;
      c.shape = shape;
      const Got g = check_case(c);
      EXPECT_TRUE(g.y.empty());
      EXPECT_TRUE(g.scale.empty());
      EXPECT_EQ(g.param_shape, Shape(shape.begin(), shape.end() - 1));
      // Pertensor over zero elements: rowMax = rowMin = 0, scale 1e-12, offset DST_MAX.
      c.mode = DynamicQuantMode::pertensor;
      const Got t = check_case(c);
      expect_floats_bitexact(t.scale, {kFloor});
      expect_floats_bitexact(t.offset, {dst == QuantDType::qint8 ? 127.0f : 7.0f});
    }
    // H == 0 with S > 0: every row's parameters are (1e-12, DST_MAX).
    Case c;
    c.dst = dst;
    c.shape = {3, 0};
    const Got g = check_case(c);
    EXPECT_EQ(g.y_shape, (Shape{3, 0}));
    expect_floats_bitexact(g.scale, std::vector<float>(3, kFloor));
    expect_floats_bitexact(g.offset, std::vector<float>(3, dst == QuantDType::qint8 ? 127.0f : 7.0f));
  }
  // MoE with S == 0: group_index [0] (last == S) is valid.
  Case c;
  c.shape = {0, 8};
  c.smooth_dt = DType::float32;
  c.smooth_shape = {1, 8};
  c.smooth = std::vector<float>(8, 1.0f);
  c.gi_dt = DType::int64;
  c.gi = {0};
  check_case(c);
}

// ---------------------------------------------------------------------------------------------------
// Validation: every error names the argument, and nothing is written.

struct Outs {
  Tensor y, scale, offset;
  Outs(DType ydt, const Shape& ys, const Shape& ps, DType pdt = DType::float32)
      : y(ydt, ys), scale(pdt, ps), offset(pdt, ps) {
    fill_bytes(y);
    fill_bytes(scale);
    fill_bytes(offset);
  }
  bool untouched() const { return all_bytes(y) && all_bytes(scale) && all_bytes(offset); }
};

using OptView = std::optional<ConstTensorView>;

// The out-variant with the given outputs and arguments must fail with (code, arg) and write nothing.
void expect_out_error(Outs& o, const ConstTensorView& x, OptView smooth, OptView gi, QuantDType dst,
                      DynamicQuantMode mode, ErrorCode code, const std::string& arg,
                      const std::vector<std::string>& needles = {}) {
  const bool has_data = x.data != nullptr;
  const Tensor x_copy = has_data ? Tensor::copy_of(x) : Tensor();
  expect_error([&] { xquant::dynamic_quant_asymmetric_out(o.y, o.scale, o.offset, x, smooth, gi, dst, mode); }, code,
               arg, needles);
  EXPECT_TRUE(o.untouched()) << "outputs written despite the error";
  if (has_data) {
    EXPECT_TRUE(same_bytes(x, x_copy)) << "x modified";
  }
}

// Both API forms fail the same way for input errors; the out-variant's outputs are valid int8 [S, H].
void expect_input_error(const ConstTensorView& x, OptView smooth, OptView gi, QuantDType dst, DynamicQuantMode mode,
                        ErrorCode code, const std::string& arg, const std::vector<std::string>& needles = {}) {
  expect_error([&] { (void)xquant::dynamic_quant_asymmetric(x, smooth, gi, dst, mode); }, code, arg, needles);
  Shape ys = x.shape.empty() ? Shape{1} : x.shape;
  Shape ps = x.shape.size() >= 2 ? Shape(x.shape.begin(), x.shape.end() - 1) : Shape{1};
  Outs o(DType::int8, ys, ps);
  expect_out_error(o, x, smooth, gi, dst, mode, code, arg, needles);
}

constexpr auto kTok = DynamicQuantMode::pertoken;
constexpr auto kTen = DynamicQuantMode::pertensor;
constexpr auto kI8 = QuantDType::qint8;
constexpr auto kI4 = QuantDType::quint4x2;

TEST(DynamicQuantErrors, XDtypeAndRank) {
  const Tensor xi = make_typed<std::int8_t>(DType::int8, {2, 8}, std::vector<std::int8_t>(16, 1));
  expect_input_error(xi, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::dtype_mismatch, "x",
                     {kOp, "x has dtype int8"});
  const Tensor x32 = make_typed<std::int32_t>(DType::int32, {2, 8}, std::vector<std::int32_t>(16, 1));
  expect_input_error(x32, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::dtype_mismatch, "x", {"int32"});
  for (DType dt : kFloatTypes) {
    const Tensor x1 = make_float(dt, {8}, std::vector<float>(8, 1.0f));
    expect_input_error(x1, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::shape_mismatch, "x", {"[8]", "rank"});
    expect_input_error(x1, std::nullopt, std::nullopt, kI8, kTen, ErrorCode::shape_mismatch, "x", {"rank"});
  }
  const Tensor x0 = make_float(DType::float32, {}, {1.0f});
  expect_input_error(x0, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::shape_mismatch, "x", {"rank"});
  // A null pointer with elements.
  const ConstTensorView xnull(nullptr, DType::float32, {2, 8});
  expect_input_error(xnull, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::invalid_argument, "x", {"null"});
}

TEST(DynamicQuantErrors, DstTypeAndQuantMode) {
  const Tensor x = make_float(DType::float32, {2, 8}, iota_row(16, 0.0f, 1.0f));
  expect_input_error(x, std::nullopt, std::nullopt, QuantDType::quint8, kTok, ErrorCode::invalid_argument, "dst_type",
                     {"quint8", "qint8, quint4x2, float8_e4m3fn or float8_e5m2"});
  expect_input_error(x, std::nullopt, std::nullopt, QuantDType::qint32, kTok, ErrorCode::invalid_argument, "dst_type",
                     {"qint32"});
  expect_input_error(x, std::nullopt, std::nullopt, kI8, static_cast<DynamicQuantMode>(7), ErrorCode::invalid_argument,
                     "quant_mode", {"7"});
  // int4 needs H % 8 == 0.
  const Tensor x12 = make_float(DType::float32, {2, 12}, iota_row(24, 0.0f, 1.0f));
  expect_input_error(x12, std::nullopt, std::nullopt, kI4, kTok, ErrorCode::shape_mismatch, "x",
                     {"[2, 12]", "12", "multiple of 8"});
  // pertensor with smooth_scales.
  const Tensor s = make_float(DType::float32, {8}, std::vector<float>(8, 1.0f));
  expect_input_error(x, s.view(), std::nullopt, kI8, kTen, ErrorCode::invalid_argument, "quant_mode",
                     {"pertensor", "smooth_scales"});
  // group_index without smooth_scales.
  const Tensor gi = make_group_index(DType::int32, {2});
  expect_input_error(x, std::nullopt, gi.view(), kI8, kTok, ErrorCode::invalid_argument, "group_index",
                     {"smooth_scales"});
  expect_input_error(x, std::nullopt, gi.view(), kI8, kTen, ErrorCode::invalid_argument, "group_index");
  // perchannel: no int4, no group_index, smooth_scales [S] (x.shape[-2]).
  constexpr auto kChan = DynamicQuantMode::perchannel;
  expect_input_error(x, std::nullopt, std::nullopt, kI4, kChan, ErrorCode::invalid_argument, "dst_type",
                     {"quint4x2", "perchannel"});
  const Tensor s2 = make_float(DType::float32, {2, 8}, std::vector<float>(16, 1.0f));
  expect_input_error(x, s2.view(), gi.view(), kI8, kChan, ErrorCode::invalid_argument, "group_index", {"perchannel"});
  expect_input_error(x, s.view(), std::nullopt, kI8, kChan, ErrorCode::shape_mismatch, "smooth_scales",
                     {"[8]", "[2]", "perchannel"});
}

TEST(DynamicQuantErrors, SmoothScales) {
  const Tensor x = make_float(DType::float32, {2, 8}, iota_row(16, 0.0f, 1.0f));
  const Tensor si = make_typed<std::int32_t>(DType::int32, {8}, std::vector<std::int32_t>(8, 1));
  expect_input_error(x, si.view(), std::nullopt, kI8, kTok, ErrorCode::dtype_mismatch, "smooth_scales",
                     {"smooth_scales has dtype int32"});
  // 2-D without group_index.
  const Tensor s2 = make_float(DType::float32, {1, 8}, std::vector<float>(8, 1.0f));
  expect_input_error(x, s2.view(), std::nullopt, kI8, kTok, ErrorCode::shape_mismatch, "smooth_scales",
                     {"[1, 8]", "group_index"});
  // Wrong length.
  const Tensor s9 = make_float(DType::float32, {9}, std::vector<float>(9, 1.0f));
  expect_input_error(x, s9.view(), std::nullopt, kI8, kTok, ErrorCode::shape_mismatch, "smooth_scales", {"[9]", "[8]"});
  // 1-D with group_index.
  const Tensor s1 = make_float(DType::float32, {8}, std::vector<float>(8, 1.0f));
  const Tensor gi1 = make_group_index(DType::int64, {2});
  expect_input_error(x, s1.view(), gi1.view(), kI8, kTok, ErrorCode::shape_mismatch, "smooth_scales", {"[8]"});
  // [E, H'] with H' != H.
  const Tensor s27 = make_float(DType::float32, {1, 7}, std::vector<float>(7, 1.0f));
  expect_input_error(x, s27.view(), gi1.view(), kI8, kTok, ErrorCode::shape_mismatch, "smooth_scales", {"[1, 7]"});
  // Rank 3 with group_index.
  const Tensor s3 = make_float(DType::float32, {1, 1, 8}, std::vector<float>(8, 1.0f));
  expect_input_error(x, s3.view(), gi1.view(), kI8, kTok, ErrorCode::shape_mismatch, "smooth_scales");
}

TEST(DynamicQuantErrors, GroupIndex) {
  const Tensor x = make_float(DType::float32, {4, 8}, iota_row(32, 0.0f, 1.0f));
  const Tensor s3 = make_float(DType::float32, {3, 8}, std::vector<float>(24, 1.0f));
  // dtype.
  const Tensor gf = make_float(DType::float32, {3}, {1, 2, 4});
  expect_input_error(x, s3.view(), gf.view(), kI8, kTok, ErrorCode::dtype_mismatch, "group_index",
                     {"group_index has dtype float32", "int32 or int64"});
  const Tensor g8 = make_typed<std::int8_t>(DType::int8, {3}, {1, 2, 4});
  expect_input_error(x, s3.view(), g8.view(), kI8, kTok, ErrorCode::dtype_mismatch, "group_index", {"int8"});
  // Shape: 2-D, E mismatch.
  const Tensor g2d = make_typed<std::int32_t>(DType::int32, {1, 3}, {1, 2, 4});
  expect_input_error(x, s3.view(), g2d.view(), kI8, kTok, ErrorCode::shape_mismatch, "group_index", {"[1, 3]"});
  const Tensor g2 = make_group_index(DType::int32, {2, 4});
  expect_input_error(x, s3.view(), g2.view(), kI8, kTok, ErrorCode::shape_mismatch, "group_index", {"[2]", "[3]"});
  // E == 0.
  const Tensor s0 = make_float(DType::float32, {0, 8}, {});
  const Tensor g0 = make_group_index(DType::int64, {});
  expect_input_error(x, s0.view(), g0.view(), kI8, kTok, ErrorCode::shape_mismatch, "group_index", {"at least 1"});
  for (DType gdt : {DType::int32, DType::int64}) {
    // Not non-decreasing.
    const Tensor gd = make_group_index(gdt, {2, 1, 4});
    expect_input_error(x, s3.view(), gd.view(), kI8, kTok, ErrorCode::invalid_argument, "group_index",
                       {"group_index[1] is 1", "group_index[0] = 2"});
    // A value above S.
    const Tensor gs = make_group_index(gdt, {2, 5, 4});
    expect_input_error(x, s3.view(), gs.view(), kI8, kTok, ErrorCode::invalid_argument, "group_index",
                       {"group_index[1] is 5", "[0, 4]"});
    // A negative value.
    const Tensor gn = make_group_index(gdt, {-1, 2, 4});
    expect_input_error(x, s3.view(), gn.view(), kI8, kTok, ErrorCode::invalid_argument, "group_index",
                       {"group_index[0] is -1"});
    // Last != S.
    const Tensor gl = make_group_index(gdt, {1, 2, 3});
    expect_input_error(x, s3.view(), gl.view(), kI8, kTok, ErrorCode::invalid_argument, "group_index",
                       {"group_index[2] is 3", "4"});
  }
  // An int32 value that is negative as int32 (not only as int64).
  const Tensor gm = make_typed<std::int32_t>(DType::int32, {3}, {1, INT32_MIN, 4});
  expect_input_error(x, s3.view(), gm.view(), kI8, kTok, ErrorCode::invalid_argument, "group_index",
                     {"group_index[1] is -2147483648"});
}

TEST(DynamicQuantErrors, OutputViews) {
  const Tensor x = make_float(DType::float16, {2, 3, 8}, iota_row(48, 0.0f, 1.0f));
  {  // y dtype
    Outs o(DType::int32, {2, 3, 8}, {2, 3});
    expect_out_error(o, x, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::dtype_mismatch, "y",
                     {"y has dtype int32", "int8"});
  }
  {  // y dtype for int4
    Outs o(DType::int8, {2, 3, 1}, {2, 3});
    expect_out_error(o, x, std::nullopt, std::nullopt, kI4, kTok, ErrorCode::dtype_mismatch, "y", {"int32"});
  }
  {  // y shape for int4: last dim must be H / 8
    Outs o(DType::int32, {2, 3, 8}, {2, 3});
    expect_out_error(o, x, std::nullopt, std::nullopt, kI4, kTok, ErrorCode::shape_mismatch, "y",
                     {"[2, 3, 8]", "[2, 3, 1]"});
  }
  {  // y shape
    Outs o(DType::int8, {6, 8}, {2, 3});
    expect_out_error(o, x, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::shape_mismatch, "y", {"[6, 8]"});
  }
  {  // scale dtype
    Outs o(DType::int8, {2, 3, 8}, {2, 3}, DType::float16);
    expect_out_error(o, x, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::dtype_mismatch, "scale",
                     {"scale has dtype float16", "float32"});
  }
  {  // scale shape: pertoken is x.shape[:-1], not [S]
    Outs o(DType::int8, {2, 3, 8}, {6});
    expect_out_error(o, x, std::nullopt, std::nullopt, kI8, kTok, ErrorCode::shape_mismatch, "scale",
                     {"[6]", "[2, 3]"});
  }
  {  // scale shape: pertensor is [1]
    Outs o(DType::int8, {2, 3, 8}, {2, 3});
    expect_out_error(o, x, std::nullopt, std::nullopt, kI8, kTen, ErrorCode::shape_mismatch, "scale",
                     {"[2, 3]", "[1]"});
  }
  {  // offset dtype / shape (scale correct)
    Outs o(DType::int8, {2, 3, 8}, {2, 3});
    Tensor bad(DType::float32, {3, 2});
    fill_bytes(bad);
    expect_error([&] { xquant::dynamic_quant_asymmetric_out(o.y, o.scale, bad, x); }, ErrorCode::shape_mismatch,
                 "offset", {"[3, 2]"});
    EXPECT_TRUE(o.untouched());
    EXPECT_TRUE(all_bytes(bad));
    Tensor bad_dt(DType::int32, {2, 3});
    fill_bytes(bad_dt);
    expect_error([&] { xquant::dynamic_quant_asymmetric_out(o.y, o.scale, bad_dt, x); }, ErrorCode::dtype_mismatch,
                 "offset", {"int32"});
    EXPECT_TRUE(o.untouched());
    EXPECT_TRUE(all_bytes(bad_dt));
  }
  {  // null output data
    Outs o(DType::int8, {2, 3, 8}, {2, 3});
    const TensorView null_scale(nullptr, DType::float32, {2, 3});
    expect_error([&] { xquant::dynamic_quant_asymmetric_out(o.y, null_scale, o.offset, x); },
                 ErrorCode::invalid_argument, "scale", {"null"});
    EXPECT_TRUE(o.untouched());
  }
}

TEST(DynamicQuantErrors, OverlappingOutputs) {
  Tensor x = make_float(DType::float32, {2, 8}, iota_row(16, 0.0f, 1.0f));
  const Tensor x_copy = Tensor::copy_of(x);
  Tensor smooth = make_float(DType::float32, {1, 8}, std::vector<float>(8, 1.0f));
  Tensor gi = make_group_index(DType::int64, {2});
  const Tensor smooth_copy = Tensor::copy_of(smooth);
  const Tensor gi_copy = Tensor::copy_of(gi);
  Outs o(DType::int8, {2, 8}, {2});
  auto run = [&](TensorView y, TensorView scale, TensorView offset, bool with_smooth) {
    if (with_smooth)
      xquant::dynamic_quant_asymmetric_out(y, scale, offset, x, smooth.view(), gi.view());
    else
      xquant::dynamic_quant_asymmetric_out(y, scale, offset, x);
  };
  auto inputs_intact = [&] {
    EXPECT_TRUE(same_bytes(x, x_copy));
    EXPECT_TRUE(same_bytes(smooth, smooth_copy));
    EXPECT_TRUE(same_bytes(gi, gi_copy));
    EXPECT_TRUE(o.untouched());
  };
  // y inside x.
  const TensorView y_in_x(x.data(), DType::int8, {2, 8});
  expect_error([&] { run(y_in_x, o.scale, o.offset, false); }, ErrorCode::aliasing, "y", {"y overlaps x"});
  inputs_intact();
  // scale over x's tail.
  const TensorView scale_in_x(x.data<float>() + 14, DType::float32, {2});
  expect_error([&] { run(o.y, scale_in_x, o.offset, false); }, ErrorCode::aliasing, "scale", {"scale overlaps x"});
  inputs_intact();
  // scale over smooth_scales.
  const TensorView scale_in_smooth(smooth.data(), DType::float32, {2});
  expect_error([&] { run(o.y, scale_in_smooth, o.offset, true); }, ErrorCode::aliasing, "scale", {"smooth_scales"});
  inputs_intact();
  // offset over group_index.
  const TensorView offset_in_gi(gi.data(), DType::float32, {2});
  expect_error([&] { run(o.y, o.scale, offset_in_gi, true); }, ErrorCode::aliasing, "offset", {"group_index"});
  inputs_intact();
  // y over smooth_scales.
  const TensorView y_in_smooth(smooth.data(), DType::int8, {2, 8});
  expect_error([&] { run(y_in_smooth, o.scale, o.offset, true); }, ErrorCode::aliasing, "y", {"smooth_scales"});
  inputs_intact();
  // scale and offset the same buffer.
  const TensorView offset_is_scale(o.scale.data(), DType::float32, {2});
  expect_error([&] { run(o.y, o.scale, offset_is_scale, false); }, ErrorCode::aliasing, "offset",
               {"offset overlaps scale"});
  inputs_intact();
  // scale partly inside y.
  const TensorView scale_in_y(o.y.data<std::int8_t>() + 8, DType::float32, {2});
  expect_error([&] { run(o.y, scale_in_y, o.offset, false); }, ErrorCode::aliasing, "scale", {"scale overlaps y"});
  inputs_intact();
  // offset inside y.
  const TensorView offset_in_y(o.y.data<std::int8_t>(), DType::float32, {2});
  expect_error([&] { run(o.y, o.scale, offset_in_y, false); }, ErrorCode::aliasing, "offset", {"offset overlaps y"});
  inputs_intact();
}

TEST(DynamicQuantErrors, AdjacentBuffersAreNotOverlap) {
  // y, scale and offset carved back to back out of one buffer: touching ends is not an overlap.
  const Tensor x = make_float(DType::float32, {2, 8}, iota_row(16, 0.0f, 1.0f));
  Tensor buf(DType::uint8, {16 + 8 + 8});
  const TensorView y(buf.data(), DType::int8, {2, 8});
  const TensorView scale(buf.data<std::uint8_t>() + 16, DType::float32, {2});
  const TensorView offset(buf.data<std::uint8_t>() + 24, DType::float32, {2});
  xquant::dynamic_quant_asymmetric_out(y, scale, offset, x);
  const float want_scale = 7.0f / 255.0f, want_scale2 = (15.0f - 8.0f) / 255.0f;
  expect_floats_bitexact(to_floats(scale), {want_scale, want_scale2});
}

}  // namespace
