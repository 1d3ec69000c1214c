// The core of xquant: dtypes, shapes, owning tensors and views, the error type, the validation helpers
// (src/core/check.hpp) and the scalar numeric building blocks (src/core/numeric.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/numeric.hpp"
#include "test_util.hpp"
#include "xquant/xquant.hpp"

namespace {

using xqtest::same_bits;
using xquant::DType;
using xquant::ErrorCode;
using xquant::QuantDType;
using xquant::Shape;
using xquant::Tensor;

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::size_t kHugePage = std::size_t{2} << 20;

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Runs f, expects xquant::Error with this code and argument; returns its message ("" if none thrown).
template <typename F>
std::string error_message(F&& f, ErrorCode code, const std::string& arg) {
  try {
    f();
  } catch (const xquant::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.argument(), arg) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected xquant::Error(" << xquant::error_code_name(code) << ", " << arg << ")";
  return "";
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// =====================================================================================================
// DType helpers

TEST(DTypeHelpers, SizeAndName) {
  const std::pair<DType, std::pair<std::size_t, const char*>> table[] = {
      {DType::float32, {4, "float32"}}, {DType::float16, {2, "float16"}}, {DType::bfloat16, {2, "bfloat16"}},
      {DType::int8, {1, "int8"}},       {DType::uint8, {1, "uint8"}},     {DType::int32, {4, "int32"}},
      {DType::int64, {8, "int64"}},
  };
  for (const auto& [dt, expected] : table) {
    EXPECT_EQ(xquant::dtype_size(dt), expected.first) << expected.second;
    EXPECT_EQ(xquant::dtype_name(dt), expected.second);
  }
}

TEST(DTypeHelpers, IsFloating) {
  static_assert(xquant::is_floating(DType::float32));
  static_assert(xquant::is_floating(DType::float16));
  static_assert(xquant::is_floating(DType::bfloat16));
  static_assert(!xquant::is_floating(DType::int8));
  static_assert(!xquant::is_floating(DType::uint8));
  static_assert(!xquant::is_floating(DType::int32));
  static_assert(!xquant::is_floating(DType::int64));
  SUCCEED();
}

TEST(DTypeHelpers, QuantDTypes) {
  EXPECT_EQ(xquant::quant_dtype_name(QuantDType::qint8), "qint8");
  EXPECT_EQ(xquant::quant_dtype_name(QuantDType::quint8), "quint8");
  EXPECT_EQ(xquant::quant_dtype_name(QuantDType::qint32), "qint32");
  EXPECT_EQ(xquant::quant_dtype_name(QuantDType::quint4x2), "quint4x2");
  EXPECT_EQ(xquant::storage_dtype(QuantDType::qint8), DType::int8);
  EXPECT_EQ(xquant::storage_dtype(QuantDType::quint8), DType::uint8);
  EXPECT_EQ(xquant::storage_dtype(QuantDType::qint32), DType::int32);
  EXPECT_EQ(xquant::storage_dtype(QuantDType::quint4x2), DType::int32);
}

// =====================================================================================================
// Shapes

TEST(Shapes, Numel) {
  EXPECT_EQ(xquant::shape_numel({}), 1);  // rank 0: one element
  EXPECT_EQ(xquant::shape_numel({0}), 0);
  EXPECT_EQ(xquant::shape_numel({7}), 7);
  EXPECT_EQ(xquant::shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(xquant::shape_numel({3, 0, 5}), 0);
  EXPECT_EQ(xquant::shape_numel({1, 1, 1, 1, 1}), 1);
  EXPECT_EQ(xquant::shape_numel({kI64Max}), kI64Max);
  EXPECT_EQ(xquant::shape_numel({1, kI64Max, 1}), kI64Max);
  EXPECT_EQ(xquant::shape_numel({std::int64_t{1} << 32, std::int64_t{1} << 30}), std::int64_t{1} << 62);
  EXPECT_EQ(xquant::shape_numel({3, 0x2AAAAAAAAAAAAAAA}), kI64Max - 1);  // 3 * (2^63 - 2) / 3
  EXPECT_EQ(xquant::shape_numel({kI64Max, 0}), 0);
}

TEST(Shapes, NumelRejectsNegativeDimensions) {
  for (const Shape& s :
       {Shape{-1}, Shape{2, -3}, Shape{0, -1}, Shape{-1, 0}, Shape{std::numeric_limits<std::int64_t>::min()}}) {
    const std::string msg = error_message([&] { (void)xquant::shape_numel(s); }, ErrorCode::shape_mismatch, "shape");
    EXPECT_TRUE(contains(msg, xquant::shape_str(s))) << msg;
  }
}

TEST(Shapes, NumelRejectsInt64Overflow) {
  const Shape overflowing[] = {
      {kI64Max, 2},
      {std::int64_t{1} << 32, std::int64_t{1} << 31},  // exactly 2^63
      {std::int64_t{1} << 31, std::int64_t{1} << 31, 2},
      {3, 0x2AAAAAAAAAAAAAAB},  // 2^63 + 1
      {kI64Max, kI64Max},
      {65536, 65536, 65536, 65536},  // 2^64: wraps to 0 in unchecked arithmetic
  };
  for (const Shape& s : overflowing) {
    const std::string msg = error_message([&] { (void)xquant::shape_numel(s); }, ErrorCode::shape_mismatch, "shape");
    EXPECT_TRUE(contains(msg, xquant::shape_str(s))) << msg;
  }
}

// The element count is the product of the dimensions: a zero dimension makes it 0 wherever it stands,
// even when the other dimensions alone would overflow int64.
// check_view (src/core/check.hpp) applies the same rule.
TEST(Shapes, ZeroDimensionAnywhereGivesZeroElements) {
  for (const Shape& s : {Shape{0, kI64Max, kI64Max}, Shape{kI64Max, 0, kI64Max}, Shape{kI64Max, kI64Max, 0},
                         Shape{std::int64_t{1} << 40, std::int64_t{1} << 40, 0, 5}}) {
    std::int64_t n = -1;
    EXPECT_NO_THROW(n = xquant::shape_numel(s)) << xquant::shape_str(s);
    EXPECT_EQ(n, 0) << xquant::shape_str(s);
    EXPECT_NO_THROW(xquant::detail::check_view("op", "inputs", xquant::ConstTensorView(nullptr, DType::float32, s)))
        << xquant::shape_str(s);
  }
}

TEST(Shapes, Str) {
  EXPECT_EQ(xquant::shape_str({}), "[]");
  EXPECT_EQ(xquant::shape_str({0}), "[0]");
  EXPECT_EQ(xquant::shape_str({5}), "[5]");
  EXPECT_EQ(xquant::shape_str({2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(xquant::shape_str({-1, 7}), "[-1, 7]");
  EXPECT_EQ(xquant::shape_str({kI64Max}), "[9223372036854775807]");
}

// =====================================================================================================
// Tensor

TEST(TensorTest, DefaultConstructedIsEmpty) {
  Tensor t;
  EXPECT_EQ(t.shape(), Shape{0});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.dim(), 1);
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(t.dtype(), DType::float32);
  const xquant::ConstTensorView v = t;
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ(v.shape, Shape{0});
}

TEST(TensorTest, TypeProperties) {
  static_assert(!std::is_copy_constructible_v<Tensor>);
  static_assert(!std::is_copy_assignable_v<Tensor>);
  static_assert(std::is_nothrow_move_constructible_v<Tensor>);
  static_assert(std::is_nothrow_move_assignable_v<Tensor>);
  static_assert(std::is_convertible_v<Tensor&, xquant::TensorView>);
  static_assert(std::is_convertible_v<Tensor&, xquant::ConstTensorView>);
  static_assert(std::is_convertible_v<const Tensor&, xquant::ConstTensorView>);
  static_assert(!std::is_convertible_v<const Tensor&, xquant::TensorView>);
  static_assert(std::is_convertible_v<xquant::TensorView, xquant::ConstTensorView>);
  static_assert(!std::is_convertible_v<xquant::ConstTensorView, xquant::TensorView>);
  static_assert(std::is_convertible_v<xquant::TileView, xquant::ConstTileView>);
  static_assert(!std::is_convertible_v<xquant::ConstTileView, xquant::TileView>);
  SUCCEED();
}

TEST(TensorTest, UninitializedMetadataAndWritableStorage) {
  Tensor t(DType::float16, {2, 3, 5});
  EXPECT_EQ(t.dtype(), DType::float16);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.nbytes(), 60u);
  ASSERT_NE(t.data(), nullptr);
  EXPECT_EQ(t.data<std::uint16_t>(), static_cast<std::uint16_t*>(t.data()));
  std::memset(t.data(), 0x5A, t.nbytes());  // the whole storage is writable (ASan checks the bounds)
  const Tensor& ct = t;
  EXPECT_EQ(ct.data<std::uint8_t>()[59], 0x5A);
}

TEST(TensorTest, RankZeroHasOneElement) {
  Tensor t(DType::int64, {});
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.nbytes(), 8u);
  ASSERT_NE(t.data(), nullptr);
  t.data<std::int64_t>()[0] = -5;
  EXPECT_EQ(t.data<std::int64_t>()[0], -5);
}

TEST(TensorTest, EmptyShapes) {
  for (const Shape& s : {Shape{0}, Shape{3, 0}, Shape{0, 4, 5}}) {
    Tensor t(DType::float32, s);
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(t.nbytes(), 0u);
    EXPECT_EQ(t.shape(), s);
    Tensor z = Tensor::zeros(DType::int8, s);
    EXPECT_EQ(z.numel(), 0);
  }
}

TEST(TensorTest, SmallAllocationsAre64ByteAligned) {
  std::vector<Tensor> keep;  // alive together, so that they are distinct allocations
  for (const std::int64_t n : {1, 3, 63, 64, 65, 100, 4096, 65537, 2097151}) {
    keep.emplace_back(DType::uint8, Shape{n});
    const Tensor& t = keep.back();
    EXPECT_EQ(t.nbytes(), static_cast<std::size_t>(n));
    ASSERT_NE(t.data(), nullptr);
    EXPECT_EQ(address(t.data()) % 64, 0u) << n << " bytes";
    std::memset(keep.back().data(), 1, t.nbytes());
  }
}

TEST(TensorTest, LargeAllocationsAre2MiBAligned) {
  const std::pair<DType, std::int64_t> cases[] = {
      {DType::uint8, 2097152},    // exactly 2 MiB
      {DType::uint8, 2097153},    // 2 MiB + 1
      {DType::float32, 524288},   // 2 MiB of float32
      {DType::float16, 5000001},  // ~9.5 MiB
      {DType::int64, 1310721},    // 10 MiB + 8
  };
  std::vector<Tensor> keep;
  for (const auto& [dt, n] : cases) {
    keep.emplace_back(dt, Shape{n});
    Tensor& t = keep.back();
    ASSERT_NE(t.data(), nullptr);
    EXPECT_EQ(t.nbytes(), static_cast<std::size_t>(n) * xquant::dtype_size(dt));
    EXPECT_EQ(address(t.data()) % kHugePage, 0u) << t.nbytes() << " bytes";
    auto* p = t.data<std::uint8_t>();
    p[0] = 1;
    p[t.nbytes() / 2] = 2;
    p[t.nbytes() - 1] = 3;  // the last byte is mapped
    EXPECT_EQ(p[0] + p[t.nbytes() / 2] + p[t.nbytes() - 1], 6);
  }
}

TEST(TensorTest, ZerosSmallAndLarge) {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{3} << 20}) {
    // Dirty the heap first so that a missing memset would show.
    {
      Tensor dirty(DType::uint8, {n});
      std::memset(dirty.data(), 0xFF, dirty.nbytes());
    }
    const Tensor z = Tensor::zeros(DType::int32, {n});
    EXPECT_EQ(z.numel(), n);
    const auto* p = z.data<std::uint8_t>();
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < z.nbytes(); ++i) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0u) << n;
  }
}

TEST(TensorTest, CopyOf) {
  const std::vector<float> values = {1.5f, -2.0f, 0.0f, -0.0f, kInf, 3.25f};
  const xquant::ConstTensorView v(values.data(), DType::float32, {2, 3});
  const Tensor c = Tensor::copy_of(v);
  EXPECT_EQ(c.dtype(), DType::float32);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  ASSERT_NE(c.data(), static_cast<const void*>(values.data()));
  EXPECT_EQ(std::memcmp(c.data(), values.data(), sizeof(float) * values.size()), 0);

  // A large one (mmap path), an empty one and a rank-0 one.
  std::vector<std::int32_t> big(std::size_t{1} << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::int32_t>(i * 2654435761u);
  const Tensor cb = Tensor::copy_of({big.data(), DType::int32, {1024, 1024}});
  EXPECT_EQ(std::memcmp(cb.data(), big.data(), big.size() * 4), 0);
  const Tensor ce = Tensor::copy_of({nullptr, DType::int8, {0, 3}});
  EXPECT_EQ(ce.numel(), 0);
  EXPECT_EQ(ce.shape(), (Shape{0, 3}));
  const std::int8_t scalar = -7;
  const Tensor cs = Tensor::copy_of({&scalar, DType::int8, {}});
  EXPECT_EQ(cs.data<std::int8_t>()[0], -7);
}

TEST(TensorTest, MoveConstructionAndAssignment) {
  for (const std::int64_t n : {std::int64_t{10}, std::int64_t{1} << 20}) {  // heap and mmap storage
    Tensor a(DType::float32, {n});
    a.data<float>()[n - 1] = 42.0f;
    void* const storage = a.data();

    Tensor b(std::move(a));
    EXPECT_EQ(b.data(), storage);
    EXPECT_EQ(b.numel(), n);
    EXPECT_EQ(b.shape(), Shape{n});
    EXPECT_EQ(b.data<float>()[n - 1], 42.0f);
    // NOLINTBEGIN(bugprone-use-after-move): a moved-from tensor is documented to be empty.
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(a.numel(), 0);
    EXPECT_EQ(a.nbytes(), 0u);
    EXPECT_EQ(a.shape(), Shape{0});

    Tensor c(DType::int8, {3, 3});  // its storage must be released by the assignment (LeakSanitizer)
    c = std::move(b);
    EXPECT_EQ(c.data(), storage);
    EXPECT_EQ(c.dtype(), DType::float32);
    EXPECT_EQ(c.shape(), Shape{n});
    EXPECT_EQ(c.nbytes(), static_cast<std::size_t>(n) * 4);
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(b.shape(), Shape{0});
    EXPECT_EQ(b.numel(), 0);
    // NOLINTEND(bugprone-use-after-move)

    Tensor& alias = c;
    c = std::move(alias);  // self-move keeps the tensor
    EXPECT_EQ(c.data(), storage);
    EXPECT_EQ(c.numel(), n);

    a = std::move(c);  // into a moved-from tensor
    EXPECT_EQ(a.data(), storage);
    EXPECT_EQ(a.data<float>()[n - 1], 42.0f);
  }
}

TEST(TensorTest, BadShapesThrowBeforeAllocating) {
  const std::string neg = error_message([] { Tensor t(DType::float32, {4, -2}); }, ErrorCode::shape_mismatch, "shape");
  EXPECT_TRUE(contains(neg, "[4, -2]")) << neg;
  error_message([] { Tensor t(DType::float32, {kI64Max, 2}); }, ErrorCode::shape_mismatch, "shape");
  error_message([] { (void)Tensor::zeros(DType::int8, {-1}); }, ErrorCode::shape_mismatch, "shape");
  // Byte counts beyond size_t: refused without calling the allocator.
  error_message([] { Tensor t(DType::float32, {kI64Max}); }, ErrorCode::out_of_memory, "shape");
  error_message([] { Tensor t(DType::int64, {std::int64_t{1} << 62}); }, ErrorCode::out_of_memory, "shape");
}

TEST(TensorTest, ViewsShareStorage) {
  Tensor t(DType::int32, {4, 2});
  xquant::TensorView v = t;
  EXPECT_EQ(v.data, t.data());
  EXPECT_EQ(v.dtype, DType::int32);
  EXPECT_EQ(v.shape, (Shape{4, 2}));
  EXPECT_EQ(v.numel(), 8);
  EXPECT_EQ(v.dim(), 2);
  EXPECT_EQ(v.nbytes(), 32u);
  v.ptr<std::int32_t>()[5] = 123;
  EXPECT_EQ(t.data<std::int32_t>()[5], 123);

  const xquant::ConstTensorView cv = v;  // TensorView -> ConstTensorView
  EXPECT_EQ(cv.data, t.data());
  EXPECT_EQ(cv.dtype, DType::int32);
  EXPECT_EQ(cv.shape, (Shape{4, 2}));
  EXPECT_EQ(cv.ptr<std::int32_t>()[5], 123);
  EXPECT_EQ(cv.nbytes(), 32u);

  const Tensor& ct = t;
  const xquant::ConstTensorView cv2 = ct;  // const Tensor -> ConstTensorView
  EXPECT_EQ(cv2.data, t.data());
  EXPECT_EQ(cv2.shape, t.shape());
  const xquant::ConstTensorView cv3 = ct.view();
  EXPECT_EQ(cv3.data, t.data());

  const xquant::TileView tile{t.data(), DType::int32, 4, 2, 2};
  const xquant::ConstTileView ctile = tile;
  EXPECT_EQ(ctile.data, t.data());
  EXPECT_EQ(ctile.rows, 4);
  EXPECT_EQ(ctile.cols, 2);
  EXPECT_EQ(ctile.row_pitch, 2);
}

// =====================================================================================================
// Error

TEST(ErrorTest, Accessors) {
  const xquant::Error e(ErrorCode::shape_mismatch, "amax", "xquant::op: amax has shape [3] but expected [8]");
  EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
  EXPECT_EQ(e.argument(), "amax");
  EXPECT_STREQ(e.what(), "xquant::op: amax has shape [3] but expected [8]");
  static_assert(std::is_base_of_v<std::exception, xquant::Error>);
  try {
    throw xquant::Error(ErrorCode::aliasing, "out", "boom");
  } catch (const std::exception& ex) {
    EXPECT_STREQ(ex.what(), "boom");
  }
}

TEST(ErrorTest, CodeNames) {
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::invalid_argument), "invalid_argument");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::dtype_mismatch), "dtype_mismatch");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::shape_mismatch), "shape_mismatch");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::not_contiguous), "not_contiguous");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::aliasing), "aliasing");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::out_of_memory), "out_of_memory");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::device_mismatch), "device_mismatch");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::device_error), "device_error");
  EXPECT_STREQ(xquant::error_code_name(ErrorCode::internal_error), "internal_error");
}

// =====================================================================================================
// Validation helpers (src/core/check.hpp)

namespace d = xquant::detail;

TEST(Check, FailFormatsTheMessage) {
  const std::string msg = error_message([] { d::fail(ErrorCode::not_contiguous, "tile_op", "x", "x is bad"); },
                                        ErrorCode::not_contiguous, "x");
  EXPECT_EQ(msg, "xquant::tile_op: x is bad");
}

TEST(Check, View) {
  float storage[6] = {};
  d::check_view("op", "inputs", xquant::ConstTensorView(storage, DType::float32, {2, 3}));
  d::check_view("op", "inputs", xquant::ConstTensorView(nullptr, DType::float32, {0}));  // empty: null ok
  d::check_view("op", "inputs", xquant::ConstTensorView(nullptr, DType::float32, {4, 0}));
  d::check_view("op", "inputs", xquant::ConstTensorView(storage, DType::float32, {}));

  std::string msg = error_message(
      [&] {
        d::check_view("op", "inputs", xquant::ConstTensorView(storage, DType::float32, {2, -3}));
      },
      ErrorCode::shape_mismatch, "inputs");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "inputs")) << msg;
  EXPECT_TRUE(contains(msg, "[2, -3]")) << msg;
  EXPECT_TRUE(contains(msg, "negative")) << msg;

  msg = error_message(
      [&] {
        d::check_view("op", "scales", xquant::ConstTensorView(storage, DType::float32, {kI64Max, 3}));
      },
      ErrorCode::shape_mismatch, "scales");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "[9223372036854775807, 3]")) << msg;

  msg = error_message([&] { d::check_view("op", "amax", xquant::ConstTensorView(nullptr, DType::float32, {})); },
                      ErrorCode::invalid_argument, "amax");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "null")) << msg;
  error_message([&] { d::check_view("op", "amax", xquant::ConstTensorView(nullptr, DType::float32, {2})); },
                ErrorCode::invalid_argument, "amax");
}

TEST(Check, Floating) {
  for (const DType dt : xqtest::kFloatTypes) d::check_floating("op", "inputs", dt);
  for (const DType dt : {DType::int8, DType::uint8, DType::int32, DType::int64}) {
    const std::string msg =
        error_message([&] { d::check_floating("quantize", "input", dt); }, ErrorCode::dtype_mismatch, "input");
    EXPECT_EQ(msg.rfind("xquant::quantize: ", 0), 0u) << msg;
    EXPECT_TRUE(contains(msg, "input")) << msg;
    EXPECT_TRUE(contains(msg, std::string(xquant::dtype_name(dt)))) << msg;
    EXPECT_TRUE(contains(msg, "float32, float16 or bfloat16")) << msg;
  }
}

TEST(Check, DType) {
  d::check_dtype("op", "out", DType::int8, DType::int8);
  const std::string msg =
      error_message([] { d::check_dtype("op", "out", DType::uint8, DType::int32); }, ErrorCode::dtype_mismatch, "out");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "out")) << msg;
  EXPECT_TRUE(contains(msg, "uint8")) << msg;
  EXPECT_TRUE(contains(msg, "int32")) << msg;
}

TEST(Check, ShapeAndOutput) {
  d::check_shape("op", "out", {2, 3}, {2, 3}, "the shape of inputs");
  std::string msg = error_message([] { d::check_shape("op", "out", {2}, {3}, "the shape of inputs"); },
                                  ErrorCode::shape_mismatch, "out");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "out has shape [2]")) << msg;
  EXPECT_TRUE(contains(msg, "[3]")) << msg;
  EXPECT_TRUE(contains(msg, "the shape of inputs")) << msg;
  // Same element count, different shape: still a mismatch.
  error_message([] { d::check_shape("op", "out", {6}, {2, 3}, "x"); }, ErrorCode::shape_mismatch, "out");
  error_message([] { d::check_shape("op", "out", {}, {1}, "x"); }, ErrorCode::shape_mismatch, "out");

  float storage[4] = {};
  const xquant::TensorView good(storage, DType::float32, {2, 2});
  d::check_output("op", "out", good, DType::float32, {2, 2}, "inputs");
  error_message(
      [&] {
        d::check_output("op", "out", good, DType::float16, {2, 2}, "inputs");
      },
      ErrorCode::dtype_mismatch, "out");
  error_message([&] { d::check_output("op", "out", good, DType::float32, {4}, "inputs"); }, ErrorCode::shape_mismatch,
                "out");
  error_message(
      [&] {
        d::check_output("op", "out", xquant::TensorView(nullptr, DType::float32, {2, 2}), DType::float32, {2, 2},
                        "inputs");
      },
      ErrorCode::invalid_argument, "out");
}

TEST(Check, NormalizeAxis) {
  EXPECT_EQ(d::normalize_axis("op", "axis", 0, 3), 0);
  EXPECT_EQ(d::normalize_axis("op", "axis", 2, 3), 2);
  EXPECT_EQ(d::normalize_axis("op", "axis", -1, 3), 2);
  EXPECT_EQ(d::normalize_axis("op", "axis", -2, 3), 1);
  EXPECT_EQ(d::normalize_axis("op", "axis", -3, 3), 0);
  EXPECT_EQ(d::normalize_axis("op", "axis", -1, 1), 0);
  EXPECT_EQ(d::normalize_axis("op", "axis", 0, 1), 0);
  std::string msg =
      error_message([] { (void)d::normalize_axis("op", "axis", 3, 3); }, ErrorCode::invalid_argument, "axis");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "axis is 3")) << msg;
  EXPECT_TRUE(contains(msg, "[-3, 2]")) << msg;
  msg = error_message([] { (void)d::normalize_axis("op", "dim", -4, 3); }, ErrorCode::invalid_argument, "dim");
  EXPECT_TRUE(contains(msg, "dim is -4")) << msg;
  error_message([] { (void)d::normalize_axis("op", "axis", std::numeric_limits<std::int64_t>::min(), 3); },
                ErrorCode::invalid_argument, "axis");
  error_message([] { (void)d::normalize_axis("op", "axis", kI64Max, 3); }, ErrorCode::invalid_argument, "axis");
}

TEST(Check, NumBits) {
  d::check_num_bits("op", 1, 1, 32);
  d::check_num_bits("op", 32, 1, 32);
  d::check_num_bits("op", 8, 8, 8);
  for (const int bad : {0, 33, -1}) {
    const std::string msg =
        error_message([&] { d::check_num_bits("op", bad, 1, 32); }, ErrorCode::invalid_argument, "num_bits");
    EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
    EXPECT_TRUE(contains(msg, "num_bits is " + std::to_string(bad))) << msg;
    EXPECT_TRUE(contains(msg, "[1, 32]")) << msg;
  }
}

TEST(Check, RangesOverlap) {
  alignas(64) unsigned char buf[64] = {};
  const unsigned char* p = buf;
  EXPECT_TRUE(d::ranges_overlap(p, 8, p, 8));       // identical
  EXPECT_TRUE(d::ranges_overlap(p, 8, p + 7, 8));   // one byte in common
  EXPECT_TRUE(d::ranges_overlap(p + 7, 8, p, 8));   // symmetric
  EXPECT_FALSE(d::ranges_overlap(p, 8, p + 8, 8));  // adjacent
  EXPECT_FALSE(d::ranges_overlap(p + 8, 8, p, 8));
  EXPECT_TRUE(d::ranges_overlap(p, 64, p + 10, 1));  // contained
  EXPECT_TRUE(d::ranges_overlap(p + 10, 1, p, 64));
  EXPECT_FALSE(d::ranges_overlap(p, 0, p, 8));  // empty ranges never overlap
  EXPECT_FALSE(d::ranges_overlap(p, 8, p, 0));
  EXPECT_FALSE(d::ranges_overlap(p + 4, 0, p, 8));  // even inside another range
  EXPECT_FALSE(d::ranges_overlap(p, 0, p, 0));
  EXPECT_FALSE(d::ranges_overlap(nullptr, 0, nullptr, 0));
  EXPECT_FALSE(d::ranges_overlap(nullptr, 0, p, 8));
}

TEST(Check, NoOverlap) {
  float a[8] = {};
  d::check_no_overlap("op", "out", a, 16, "inputs", a + 4, 16);
  d::check_no_overlap("op", "out", a, 0, "inputs", a, 32);
  std::string msg =
      error_message([&] { d::check_no_overlap("op", "out", a, 32, "inputs", a, 32); }, ErrorCode::aliasing, "out");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "out")) << msg;
  EXPECT_TRUE(contains(msg, "inputs")) << msg;
  error_message([&] { d::check_no_overlap("op", "scale", a + 3, 8, "inputs", a, 16); }, ErrorCode::aliasing, "scale");
}

TEST(Check, SameOrDisjoint) {
  float a[8] = {};
  d::check_same_or_disjoint("op", "out", a, 32, "inputs", a, 32);      // exactly the same: in place
  d::check_same_or_disjoint("op", "out", a, 16, "inputs", a + 4, 16);  // disjoint
  d::check_same_or_disjoint("op", "out", a, 0, "inputs", a + 1, 16);   // empty
  std::string msg = error_message([&] { d::check_same_or_disjoint("op", "out", a + 1, 16, "inputs", a, 16); },
                                  ErrorCode::aliasing, "out");
  EXPECT_EQ(msg.rfind("xquant::op: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "out")) << msg;
  EXPECT_TRUE(contains(msg, "inputs")) << msg;
  // Same start but different extent is a partial overlap.
  error_message([&] { d::check_same_or_disjoint("op", "out", a, 16, "inputs", a, 32); }, ErrorCode::aliasing, "out");
  error_message([&] { d::check_same_or_disjoint("op", "out", a, 32, "inputs", a, 16); }, ErrorCode::aliasing, "out");
}

TEST(Check, SplitAtAxis) {
  auto expect = [](const Shape& s, std::int64_t axis, std::int64_t o, std::int64_t c, std::int64_t i) {
    const xquant::ChannelLayout r = d::split_at_axis(s, axis);
    EXPECT_EQ(r.outer, o) << xquant::shape_str(s) << " axis " << axis;
    EXPECT_EQ(r.channels, c) << xquant::shape_str(s) << " axis " << axis;
    EXPECT_EQ(r.inner, i) << xquant::shape_str(s) << " axis " << axis;
  };
  expect({2, 3, 4}, 0, 1, 2, 12);
  expect({2, 3, 4}, 1, 2, 3, 4);
  expect({2, 3, 4}, 2, 6, 4, 1);
  expect({5}, 0, 1, 5, 1);
  expect({2, 0, 4}, 1, 2, 0, 4);
  expect({2, 3, 0}, 1, 2, 3, 0);
}

// The public form of the same split (xquant/layout.hpp): Python-style axes, per-tensor, flat index.
TEST(Check, PublicChannelLayout) {
  const xquant::ChannelLayout a = xquant::channel_layout({2, 3, 4}, -2);
  EXPECT_EQ(a, (xquant::ChannelLayout{2, 3, 4}));
  EXPECT_EQ(a.numel(), 24);
  EXPECT_EQ(a.channel_of((1 * 3 + 2) * 4 + 3), 2);  // element (o=1, c=2, i=3)
  EXPECT_EQ(xquant::channel_layout({2, 3, 4}, 2), (xquant::ChannelLayout{6, 4, 1}));
  EXPECT_EQ(xquant::per_tensor_layout({2, 3, 4}), (xquant::ChannelLayout{1, 1, 24}));
  xqtest::expect_error([] { xquant::channel_layout({2, 3}, 2); }, ErrorCode::invalid_argument, "axis", {"2"});
  xqtest::expect_error([] { xquant::channel_layout({2, 3}, -3); }, ErrorCode::invalid_argument, "axis", {"-3"});
}

// =====================================================================================================
// Numeric building blocks (src/core/numeric.hpp)

TEST(Numeric, RoundHalfEven) {
  const std::pair<float, float> cases[] = {
      {0.5f, 0.0f},   {1.5f, 2.0f},        {2.5f, 2.0f}, {-0.5f, -0.0f},           {-1.5f, -2.0f},
      {-2.5f, -2.0f}, {0.49999997f, 0.0f}, {3.7f, 4.0f}, {8388607.5f, 8388608.0f}, {-0.0f, -0.0f}};
  for (const auto& [in, want] : cases) EXPECT_TRUE(same_bits(d::round_half_even(in), want)) << in;
  EXPECT_TRUE(std::isnan(d::round_half_even(kNaN)));
  EXPECT_EQ(d::round_half_even(-kInf), -kInf);
}

TEST(Numeric, LoadAndStoreFloat) {
  const std::int8_t i8[] = {-128, 127};
  const std::uint8_t u8[] = {0, 255};
  const std::int32_t i32[] = {-2147483647 - 1, 16777217};
  const std::int64_t i64[] = {-3};
  const std::uint16_t h[] = {0x3C00, 0xC500};   // 1, -5 (float16)
  const std::uint16_t bf[] = {0x3F80, 0xC0A0};  // 1, -5 (bfloat16)
  const float f[] = {0.1f, -0.0f};
  EXPECT_EQ(d::load_float(DType::int8, i8, 0), -128.0f);
  EXPECT_EQ(d::load_float(DType::int8, i8, 1), 127.0f);
  EXPECT_EQ(d::load_float(DType::uint8, u8, 1), 255.0f);
  EXPECT_EQ(d::load_float(DType::int32, i32, 0), -2147483648.0f);
  EXPECT_EQ(d::load_float(DType::int32, i32, 1), 16777216.0f);  // rounded to float (ties to even)
  EXPECT_EQ(d::load_float(DType::int64, i64, 0), -3.0f);
  EXPECT_EQ(d::load_float(DType::float16, h, 1), -5.0f);
  EXPECT_EQ(d::load_float(DType::bfloat16, bf, 1), -5.0f);
  EXPECT_TRUE(same_bits(d::load_float(DType::float32, f, 1), -0.0f));
  EXPECT_EQ(d::load_float(DType::float32, f, 0), 0.1f);

  std::uint16_t out16[2] = {0xFFFF, 0xFFFF};
  d::store_float(DType::float16, out16, 1, 1.0f + 0x1p-11f);  // tie -> 1.0
  EXPECT_EQ(out16[1], 0x3C00);
  EXPECT_EQ(out16[0], 0xFFFF);
  d::store_float(DType::bfloat16, out16, 0, 1.0f + 3 * 0x1p-8f);  // tie -> 0x3F82
  EXPECT_EQ(out16[0], 0x3F82);
  float out32[2] = {1.0f, 1.0f};
  d::store_float(DType::float32, out32, 1, 0.1f);
  EXPECT_EQ(out32[1], 0.1f);
  EXPECT_EQ(out32[0], 1.0f);
}

TEST(Numeric, SaturateInt8) {
  const std::pair<float, int> cases[] = {
      {0.0f, 0},      {-0.0f, 0},    {1.0f, 1},     {-1.0f, -1},     {126.0f, 126},   {127.0f, 127},
      {128.0f, 127},  {129.0f, 127}, {1e30f, 127},  {-127.0f, -127}, {-128.0f, -128}, {-129.0f, -128},
      {-1e30f, -128}, {kInf, 127},   {-kInf, -128}, {kNaN, 0},       {-kNaN, 0},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(d::saturate_rounded<std::int8_t>(in), want) << in;
}

TEST(Numeric, SaturateUint8) {
  const std::pair<float, int> cases[] = {
      {0.0f, 0},  {-0.0f, 0},  {1.0f, 1},   {254.0f, 254}, {255.0f, 255}, {256.0f, 255}, {1e30f, 255},
      {-1.0f, 0}, {-1e30f, 0}, {kInf, 255}, {-kInf, 0},    {kNaN, 0},     {-kNaN, 0},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(d::saturate_rounded<std::uint8_t>(in), want) << in;
}

TEST(Numeric, SaturateInt32) {
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  const float largest_below = std::nextafter(2147483648.0f, 0.0f);
  ASSERT_EQ(largest_below, 2147483520.0f);
  const std::pair<float, std::int32_t> cases[] = {
      {0.0f, 0},
      {2147483520.0f, 2147483520},  // largest float below 2^31: exact
      {2147483648.0f, kMax},        // 2^31: saturates
      {2147483904.0f, kMax},
      {-2147483648.0f, kMin},  // -2^31: exact
      {-2147483520.0f, -2147483520},
      {-2147483904.0f, kMin},   // next float below -2^31
      {16777217.0f, 16777216},  // the literal rounds to 2^24 in float
      {-1e10f, kMin},
      {1e10f, kMax},
      {kInf, kMax},
      {-kInf, kMin},
      {kNaN, 0},
      {-kNaN, 0},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(d::saturate_rounded<std::int32_t>(in), want) << in;
}

TEST(Numeric, SaturateRange) {
  const std::pair<float, int> int4[] = {{0.0f, 0},   {-0.0f, 0},  {7.0f, 7},    {8.0f, 7}, {100.0f, 7},
                                        {-8.0f, -8}, {-9.0f, -8}, {-1e30f, -8}, {3.0f, 3}, {-3.0f, -3},
                                        {kInf, 7},   {-kInf, -8}, {kNaN, 0},    {-kNaN, 0}};
  for (const auto& [in, want] : int4) EXPECT_EQ(d::saturate_rounded_range(in, -8, 7), want) << in;
  EXPECT_EQ(d::saturate_rounded_range(-1.0f, 0, 15), 0);
  EXPECT_EQ(d::saturate_rounded_range(16.0f, 0, 15), 15);
  EXPECT_EQ(d::saturate_rounded_range(15.0f, 0, 15), 15);
}

TEST(Numeric, Int4PackingHandValues) {
  std::int32_t words[2] = {0, 0};
  for (int j = 0; j < 8; ++j) d::store_int4(words, j, j);          // 0..7 in nibbles 0..7
  for (int j = 0; j < 8; ++j) d::store_int4(words, 8 + j, j - 8);  // -8..-1
  EXPECT_EQ(static_cast<std::uint32_t>(words[0]), 0x76543210u);
  EXPECT_EQ(static_cast<std::uint32_t>(words[1]), 0xFEDCBA98u);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(d::load_int4(words, j), j);
    EXPECT_EQ(d::load_int4(words, 8 + j), j - 8);
  }
  const std::int32_t w[1] = {static_cast<std::int32_t>(0x8F00000Fu)};
  EXPECT_EQ(d::load_int4(w, 0), -1);
  EXPECT_EQ(d::load_int4(w, 1), 0);
  EXPECT_EQ(d::load_int4(w, 6), -1);
  EXPECT_EQ(d::load_int4(w, 7), -8);
}

TEST(Numeric, Int4StoreTouchesOnlyItsNibble) {
  std::mt19937 rng(99u);
  for (std::int64_t i = 0; i < 24; ++i) {
    for (int v = -8; v <= 7; ++v) {
      std::array<std::int32_t, 3> words{};
      for (auto& w : words) w = static_cast<std::int32_t>(rng());
      const auto before = words;
      d::store_int4(words.data(), i, v);
      for (std::int64_t k = 0; k < 24; ++k) {
        const auto word_bits = [&](const std::array<std::int32_t, 3>& ws) {
          return static_cast<std::uint32_t>(ws[static_cast<std::size_t>(k / 8)]);
        };
        const std::uint32_t nib_now = (word_bits(words) >> (4 * (k % 8))) & 0xFu;
        const std::uint32_t nib_before = (word_bits(before) >> (4 * (k % 8))) & 0xFu;
        if (k == i) {
          EXPECT_EQ(nib_now, static_cast<std::uint32_t>(v + 16) % 16) << "element " << i << " value " << v;
          EXPECT_EQ(d::load_int4(words.data(), k), v);
        } else {
          EXPECT_EQ(nib_now, nib_before) << "element " << k << " changed by storing element " << i;
          const int signed_before = nib_before >= 8 ? static_cast<int>(nib_before) - 16 : static_cast<int>(nib_before);
          EXPECT_EQ(d::load_int4(words.data(), k), signed_before);
        }
      }
    }
  }
}

TEST(Numeric, NanMinMax) {
  EXPECT_EQ(d::nan_min(1.0f, 2.0f), 1.0f);
  EXPECT_EQ(d::nan_min(2.0f, 1.0f), 1.0f);
  EXPECT_EQ(d::nan_max(1.0f, 2.0f), 2.0f);
  EXPECT_EQ(d::nan_max(2.0f, 1.0f), 2.0f);
  EXPECT_EQ(d::nan_min(-kInf, 3.0f), -kInf);
  EXPECT_EQ(d::nan_max(-kInf, kInf), kInf);
  EXPECT_EQ(d::nan_max(-5.0f, -7.0f), -5.0f);
  for (const float x : {0.0f, 1.0f, -1.0f, kInf, -kInf}) {
    EXPECT_TRUE(std::isnan(d::nan_min(kNaN, x))) << x;
    EXPECT_TRUE(std::isnan(d::nan_min(x, kNaN))) << x;
    EXPECT_TRUE(std::isnan(d::nan_max(kNaN, x))) << x;
    EXPECT_TRUE(std::isnan(d::nan_max(x, kNaN))) << x;
  }
  EXPECT_TRUE(std::isnan(d::nan_min(kNaN, kNaN)));
  EXPECT_TRUE(std::isnan(d::nan_max(-kNaN, kNaN)));
  // A running reduction keeps the NaN once seen, whatever follows.
  float m = 0.0f;
  for (const float x : {1.0f, kNaN, 5.0f, -3.0f}) m = d::nan_max(m, x);
  EXPECT_TRUE(std::isnan(m));
  m = 0.0f;
  for (const float x : {1.0f, kNaN, 5.0f, -3.0f}) m = d::nan_min(x, m);
  EXPECT_TRUE(std::isnan(m));
}

// ---- CanonicalSum ----

// The order of numeric.hpp, written independently: the terms are cut into arrays of 1024; in each, the
// terms at positions p, p + 16, p + 32, ... are summed (in order, in double) into a partial s[p]; the 16
// partials are combined as a balanced tree over the pairs (p, p + 8), then (p, p + 4), (p, p + 2),
// (p, p + 1); the chunk results are added in order to a running double, which is rounded once. Both
// start from -0.0, the exact additive identity; an empty sum is +0.
float reference_sum(const std::vector<float>& terms) {
  if (terms.empty()) return 0.0f;
  double total = -0.0;
  for (std::size_t begin = 0; begin < terms.size(); begin += 1024) {
    const std::size_t end = std::min(terms.size(), begin + 1024);
    std::array<double, 16> s;
    s.fill(-0.0);
    for (std::size_t p = 0; p < 16; ++p)
      for (std::size_t k = begin + p; k < end; k += 16) s[p] += static_cast<double>(terms[k]);
    std::array<double, 8> s8;
    for (std::size_t p = 0; p < 8; ++p) s8[p] = s[p] + s[p + 8];
    std::array<double, 4> s4;
    for (std::size_t p = 0; p < 4; ++p) s4[p] = s8[p] + s8[p + 4];
    const double s2a = s4[0] + s4[2];
    const double s2b = s4[1] + s4[3];
    total += s2a + s2b;
  }
  return static_cast<float>(total);
}

float canonical_sum(const std::vector<float>& terms) {
  d::CanonicalSum acc;
  for (const float t : terms) acc.add(t);
  return acc.result();
}

// Alternative orders that a wrong implementation might use; the test data must tell them apart.
float naive_float_sum(const std::vector<float>& terms) {
  float s = 0.0f;
  for (const float t : terms) s += t;
  return s;
}
float sequential_double_sum(const std::vector<float>& terms) {
  double s = 0.0;
  for (const float t : terms) s += static_cast<double>(t);
  return static_cast<float>(s);
}
float lanes_folded_left_to_right(const std::vector<float>& terms) {  // chunked, but no halving fold
  double total = 0.0;
  for (std::size_t begin = 0; begin < terms.size(); begin += 1024) {
    std::array<double, 16> s{};
    for (std::size_t k = begin; k < std::min(terms.size(), begin + 1024); ++k) s[k % 16] += terms[k];
    double c = 0.0;
    for (const double v : s) c += v;
    total += c;
  }
  return static_cast<float>(total);
}
float lanes_without_chunks(const std::vector<float>& terms) {  // one chunk for everything
  std::array<double, 16> s{};
  for (std::size_t k = 0; k < terms.size(); ++k) s[k % 16] += terms[k];
  for (std::size_t w = 8; w >= 1; w /= 2)
    for (std::size_t p = 0; p < w; ++p) s[p] += s[p + w];
  return static_cast<float>(s[0]);
}

// Mixed magnitudes whose exact sum is small: small terms of random sign in [2^-8, 2^8) and big terms
// (up to 2^60) placed as +B / -B pairs at random positions, so that how much of the small terms survives
// next to the big ones depends on the order of the additions.
std::vector<float> mixed_terms(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small_exp(-8, 7);
  std::uniform_int_distribution<int> big_exp(30, 60);
  std::uniform_int_distribution<std::uint32_t> mant(0, (1u << 23) - 1);
  std::vector<float> t(n);
  for (auto& v : t) {
    v = std::ldexp(1.0f + static_cast<float>(mant(rng)) * 0x1p-23f, small_exp(rng));
    if (rng() & 1u) v = -v;
  }
  // Distinct positions for the pairs, so that every +B meets its -B.
  std::vector<std::size_t> pos(n);
  for (std::size_t i = 0; i < n; ++i) pos[i] = i;
  std::shuffle(pos.begin(), pos.end(), rng);
  for (std::size_t k = 0; 2 * k + 1 < n && k < n / 6 + 1; ++k) {
    const float big = std::ldexp(1.0f + static_cast<float>(mant(rng)) * 0x1p-23f, big_exp(rng));
    t[pos[2 * k]] = big;
    t[pos[2 * k + 1]] = -big;
  }
  return t;
}

const std::size_t kSumLengths[] = {0, 1, 15, 16, 17, 1023, 1024, 1025, 5000};

TEST(CanonicalSumTest, MatchesTheDocumentedOrder) {
  int naive_differs = 0, sequential_differs = 0, left_fold_differs = 0, unchunked_differs = 0;
  for (const std::size_t n : kSumLengths) {
    for (std::uint32_t seed = 1; seed <= 4; ++seed) {
      const std::vector<float> t = mixed_terms(n, seed * 1000u + static_cast<std::uint32_t>(n));
      const float got = canonical_sum(t);
      const float want = reference_sum(t);
      EXPECT_TRUE(same_bits(got, want)) << "n = " << n << " seed " << seed << ": got " << got << " want " << want;
      naive_differs += !same_bits(naive_float_sum(t), want);
      sequential_differs += !same_bits(sequential_double_sum(t), want);
      left_fold_differs += !same_bits(lanes_folded_left_to_right(t), want);
      unchunked_differs += !same_bits(lanes_without_chunks(t), want);
    }
  }
  // The data can tell the canonical order from the plausible wrong ones (so the test above can fail).
  EXPECT_GT(naive_differs, 0);
  EXPECT_GT(sequential_differs, 0);
  EXPECT_GT(left_fold_differs, 0);
  EXPECT_GT(unchunked_differs, 0);
}

TEST(CanonicalSumTest, HandComputedOrder) {
  // Lane 0 gets 2^60, lane 1 gets 1, lane 2 gets -2^60. The halving fold adds lanes 0 and 2 (w = 2)
  // before lane 1 (w = 1): the result is exactly 1. Left to right, 2^60 + 1 loses the 1: the result is 0.
  const std::vector<float> t = {0x1p60f, 1.0f, -0x1p60f};
  EXPECT_EQ(canonical_sum(t), 1.0f);
  EXPECT_EQ(sequential_double_sum(t), 0.0f);
  // Across chunks: chunk 0 = 2^60 (lane 0) + 1 (lane 1) rounds to 2^60 in double; chunk 1 = -2^60.
  std::vector<float> u(1025, 0.0f);
  u[0] = 0x1p60f;
  u[1] = 1.0f;
  u[1024] = -0x1p60f;
  EXPECT_TRUE(same_bits(canonical_sum(u), 0.0f));
  // Within one chunk the same three terms (lanes 0, 1, 0) cancel before the 1 is added.
  std::vector<float> v(1024, 0.0f);
  v[0] = 0x1p60f;
  v[1] = 1.0f;
  v[16] = -0x1p60f;
  EXPECT_EQ(canonical_sum(v), 1.0f);
  // Rounding to float happens once at the end: 2^24 + 1 + 1 is 2^24 + 2 (float steps would give 2^24).
  EXPECT_EQ(canonical_sum({0x1p24f, 1.0f, 1.0f}), 16777218.0f);
  EXPECT_EQ(naive_float_sum({0x1p24f, 1.0f, 1.0f}), 16777216.0f);
}

TEST(CanonicalSumTest, EmptyAndSingleTerm) {
  EXPECT_EQ(bits(canonical_sum({})), 0u);  // +0.0
  const float singles[] = {
      -0.0f, 0.0f,  1.5f, -3.0e-39f /* subnormal */, 0x1p-149f, -0x1p127f, std::numeric_limits<float>::max(),
      kInf,  -kInf, 0.1f};
  for (const float x : singles) EXPECT_EQ(bits(canonical_sum({x})), bits(x)) << x;
  // A NaN result is the canonical quiet NaN 0x7FC00000, whatever the NaN terms' signs and payloads.
  EXPECT_EQ(bits(canonical_sum({kNaN})), 0x7FC00000u);
  EXPECT_EQ(bits(canonical_sum({-kNaN})), 0x7FC00000u);
  EXPECT_EQ(bits(canonical_sum({std::bit_cast<float>(0xFFA12345u)})), 0x7FC00000u);
  // Sums of negative zeros stay -0, in one chunk or several.
  for (const std::size_t n : {std::size_t{2}, std::size_t{17}, std::size_t{1024}, std::size_t{1025}, std::size_t{3000}})
    EXPECT_EQ(bits(canonical_sum(std::vector<float>(n, -0.0f))), 0x80000000u) << n;
  // Mixed signed zeros give +0.
  EXPECT_EQ(bits(canonical_sum({-0.0f, 0.0f})), 0u);
}

TEST(CanonicalSumTest, ResultResetsTheAccumulator) {
  d::CanonicalSum acc;
  const std::vector<float> a = mixed_terms(1500, 5u);
  const std::vector<float> b = mixed_terms(37, 6u);
  for (const float t : a) acc.add(t);
  EXPECT_TRUE(same_bits(acc.result(), reference_sum(a)));
  for (const float t : b) acc.add(t);
  EXPECT_TRUE(same_bits(acc.result(), reference_sum(b)));
  EXPECT_EQ(bits(acc.result()), 0u);  // nothing added since: empty sum
  acc.add(-0.0f);
  EXPECT_EQ(bits(acc.result()), 0x80000000u);
}

TEST(CanonicalSumTest, NonFiniteTerms) {
  std::vector<float> t(3000, 1.0f);
  t[2000] = kInf;
  EXPECT_EQ(canonical_sum(t), kInf);
  t[10] = -kInf;
  EXPECT_EQ(bits(canonical_sum(t)), 0x7FC00000u);  // Inf - Inf: the canonical quiet NaN
  std::vector<float> u(3000, 1.0f);
  u[1500] = -kNaN;
  u[2500] = std::bit_cast<float>(0x7F800001u);
  EXPECT_EQ(bits(canonical_sum(u)), 0x7FC00000u);
  // Partial sums live in double: lane 0 holds 2 * FLT_MAX (beyond float) before lane 1's -FLT_MAX
  // brings the total back to FLT_MAX; only the final value is rounded to float.
  const float m = std::numeric_limits<float>::max();
  std::vector<float> w(18, 0.0f);
  w[0] = m;
  w[16] = m;
  w[17] = -m;
  EXPECT_EQ(canonical_sum(w), m);
  EXPECT_EQ(naive_float_sum(w), kInf);
}

}  // namespace
