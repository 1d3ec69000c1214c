// Shared helpers for the GoogleTest suite.
#pragma once
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "xquant/xquant.hpp"

namespace xqtest {

using xquant::ConstTensorView;
using xquant::DType;
using xquant::Shape;
using xquant::Tensor;
using xquant::TensorView;

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// An owning tensor with the given float values converted to `dt` (float32 / float16 / bfloat16).
inline Tensor make_float(DType dt, const Shape& shape, const std::vector<float>& values) {
  Tensor t(dt, shape);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size()) << "make_float: value count";
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dt) {
      case DType::float32:
        t.data<float>()[i] = values[i];
        break;
      case DType::float16:
        t.data<std::uint16_t>()[i] = xquant::float_to_half(values[i]);
        break;
      case DType::bfloat16:
        t.data<std::uint16_t>()[i] = xquant::float_to_bfloat16(values[i]);
        break;
      default:
        ADD_FAILURE() << "make_float: not a float dtype";
    }
  }
  return t;
}

template <typename T>
inline Tensor make_typed(DType dt, const Shape& shape, const std::vector<T>& values) {
  Tensor t(dt, shape);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size()) << "make_typed: value count";
  EXPECT_EQ(sizeof(T), xquant::dtype_size(dt));
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  return t;
}

// Values of a floating tensor widened to float.
inline std::vector<float> to_floats(const ConstTensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (v.dtype) {
      case DType::float32:
        out[i] = v.ptr<float>()[i];
        break;
      case DType::float16:
        out[i] = xquant::half_to_float(v.ptr<std::uint16_t>()[i]);
        break;
      case DType::bfloat16:
        out[i] = xquant::bfloat16_to_float(v.ptr<std::uint16_t>()[i]);
        break;
      default:
        ADD_FAILURE() << "to_floats: not a float dtype";
    }
  }
  return out;
}

template <typename T>
inline std::vector<T> to_vector(const ConstTensorView& v) {
  std::vector<T> out(static_cast<std::size_t>(v.numel()));
  if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * sizeof(T));
  return out;
}

// Bit-exact float comparison: equal bit patterns, or both NaN. +0 and -0 differ.
inline bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

inline void expect_floats_bitexact(const std::vector<float>& got, const std::vector<float>& want,
                                   const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(same_bits(got[i], want[i])) << what << " element " << i << ": got " << got[i] << " want " << want[i];
}

// Runs f, expects an xquant::Error with the given code whose argument() is `arg` and whose message
// contains every string in `needles`.
inline void expect_error(const std::function<void()>& f, xquant::ErrorCode code, const std::string& arg,
                         const std::vector<std::string>& needles = {}) {
  try {
    f();
    ADD_FAILURE() << "expected xquant::Error(" << xquant::error_code_name(code) << ", " << arg << "), nothing thrown";
  } catch (const xquant::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.argument(), arg) << e.what();
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("xquant::", 0), 0u) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message lacks '" << n << "': " << msg;
  }
}

// Fill every byte of a tensor with a sentinel, and check that it is still there.
inline void fill_bytes(TensorView v, std::uint8_t b = 0xA5) {
  if (v.nbytes() > 0) std::memset(v.data, b, v.nbytes());
}
inline bool all_bytes(const ConstTensorView& v, std::uint8_t b = 0xA5) {
  const auto* p = static_cast<const std::uint8_t*>(v.data);
  for (std::size_t i = 0; i < v.nbytes(); ++i)
    if (p[i] != b) return false;
  return true;
}

// Byte-for-byte equality of two tensors' storage (same size required).
inline bool same_bytes(const ConstTensorView& a, const ConstTensorView& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.data, b.data, a.nbytes()) == 0);
}

inline const DType kFloatTypes[] = {DType::float32, DType::float16, DType::bfloat16};

}  // namespace xqtest
