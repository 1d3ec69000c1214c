// Uses the installed xquant: one operator, the half conversions and the error type. Exit status 0 when
// every result is as computed by hand, 1 otherwise.
#include <xquant/xquant.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  // fake_tensor_quant, 8 bits, signed, narrow range: bound = 127, scale = 127 / amax = 127,
  // out = clamp(rint(x * 127), -127, 127) / 127. Every product below is exact; ties round to even.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {-2.0f, -1.0f, -0.5f, 0.0f, 0.25f, 0.5f, 1.0f, 3.0f, nan};
  const std::vector<float> want = {-1.0f, -1.0f, -64.0f / 127.0f, 0.0f, 32.0f / 127.0f, 64.0f / 127.0f, 1.0f,
                                   1.0f,  nan};
  const float amax_value = 1.0f;
  const xquant::ConstTensorView inputs(x.data(), xquant::DType::float32, {3, 3});
  const xquant::ConstTensorView amax(&amax_value, xquant::DType::float32, {1});

  const xquant::Tensor out = xquant::fake_tensor_quant(inputs, amax);
  check(out.dtype() == xquant::DType::float32, "output dtype is float32");
  check(out.shape() == xquant::Shape({3, 3}), "output shape is [3, 3]");
  if (out.numel() == 9) {
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float got = out.data<float>()[i];
      const bool same = std::isnan(want[i])
                            ? std::isnan(got)
                            : std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want[i]);
      if (!same) std::fprintf(stderr, "element %zu: got %.9g, want %.9g\n", i, got, want[i]);
      check(same, "fake_tensor_quant value");
    }
  }

  // Bad arguments throw xquant::Error across the library boundary.
  bool thrown = false;
  try {
    xquant::FakeQuantOptions bad;
    bad.num_bits = 0;
    (void)xquant::fake_tensor_quant(inputs, amax, bad);
  } catch (const xquant::Error& e) {
    thrown = e.code() == xquant::ErrorCode::invalid_argument && e.argument() == "num_bits";
    if (!thrown) std::fprintf(stderr, "unexpected error: %s\n", e.what());
  }
  check(thrown, "num_bits = 0 throws xquant::Error(invalid_argument, num_bits)");

  check(xquant::float_to_half(1.0f) == 0x3C00, "float_to_half(1)");
  check(xquant::bfloat16_to_float(0xC040) == -3.0f, "bfloat16_to_float(0xC040)");

  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("xquant %s consumer: OK\n", xquant::kVersion);
  return 0;
}
