// SPEC rule 7: element counts are 64-bit. A float16 tensor of 2^31 + 37 elements (~4 GiB) goes through
// the in-place per-tensor fake quant, and every element is checked, so an index truncated to 32 bits
// anywhere (kernel, normalization, partitioning) shows up as a wrong or unwritten element.
#include <cstdint>

#include "test_util.hpp"

namespace {
using namespace xqtest;

constexpr std::int64_t kN = (std::int64_t{1} << 31) + 37;
constexpr std::int64_t kPeriod = 1021;  // prime: a 32-bit wrap-around would land on a different phase

TEST(Large, FakeQuantInplaceFloat16BeyondTwoToThe31) {
  Tensor x(DType::float16, {kN});
  std::uint16_t table_in[kPeriod];
  std::uint16_t table_out[kPeriod];
  const float amax = 3.0f;
  // float16 arithmetic (SPEC 1): scale = f16(127 / 3), t = f16(x * scale), out = f16(q / scale).
  const float scale = xquant::half_to_float(xquant::float_to_half(127.0f / amax));
  for (std::int64_t k = 0; k < kPeriod; ++k) {
    const std::int64_t centered = k - kPeriod / 2;
    const float v = static_cast<float>(centered) / 100.0f;  // [-5.1, 5.1]: some saturate
    table_in[k] = xquant::float_to_half(v);
    const float t = xquant::half_to_float(xquant::float_to_half(xquant::half_to_float(table_in[k]) * scale));
    float q = std::nearbyint(t);
    q = q < -127.f ? -127.f : (q > 127.f ? 127.f : q);
    table_out[k] = xquant::float_to_half(q / scale);
  }
  auto* p = x.data<std::uint16_t>();
  for (std::int64_t i = 0; i < kN; ++i) p[i] = table_in[i % kPeriod];
  xquant::fake_tensor_quant_inplace(x, make_float(DType::float32, {1}, {amax}));
  std::int64_t bad = 0, first_bad = -1;
  for (std::int64_t i = 0; i < kN; ++i)
    if (p[i] != table_out[i % kPeriod]) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0) << "first wrong element at index " << first_bad;
  // The tail, past 2^31, specifically.
  EXPECT_EQ(p[kN - 1], table_out[(kN - 1) % kPeriod]);
}

}  // namespace
