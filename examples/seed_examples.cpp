// Runs the usage example of each seed operator document through the xquant C++ API and prints a short,
// readable result. Random inputs come from a fixed seed, so the output is the same on every machine.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "xquant/xquant.hpp"

namespace xq = xquant;

namespace {

std::mt19937 rng(2024);

xq::Tensor randn(xq::Shape shape) {
  xq::Tensor t(xq::DType::float32, std::move(shape));
  std::normal_distribution<float> n(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

xq::Tensor scalar(float v) {
  xq::Tensor t(xq::DType::float32, {1});
  t.data<float>()[0] = v;
  return t;
}

float abs_max(const xq::Tensor& t) {
  float m = 0.f;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

template <typename T>
void print_row(const char* label, const T* p, int n) {
  std::printf("  %-28s", label);
  for (int i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>)
      std::printf(" %9.5f", static_cast<double>(p[i]));
    else
      std::printf(" %5d", static_cast<int>(p[i]));
  }
  std::printf(" ...\n");
}

int distinct_levels(const xq::Tensor& t) {
  std::vector<float> v(t.data<float>(), t.data<float>() + t.numel());
  std::sort(v.begin(), v.end());
  return static_cast<int>(std::unique(v.begin(), v.end()) - v.begin());
}

void fake_quant_examples() {
  std::printf("== 01 npu_fake_tensor_quant ==\n");
  // Example 1: per-tensor (activations), 8-bit signed narrow range.
  xq::Tensor inputs = randn({4, 64, 32, 32});
  xq::Tensor amax = scalar(abs_max(inputs));
  xq::Tensor q = xq::fake_tensor_quant(inputs, amax, {8, false, true});
  std::printf("example 1: inputs [4, 64, 32, 32], amax = %.5f, %d distinct output levels (<= 255)\n",
              static_cast<double>(amax.data<float>()[0]), distinct_levels(q));
  print_row("inputs", inputs.data<float>(), 6);
  print_row("quantized", q.data<float>(), 6);
  // Example 2: in place.
  xq::Tensor x2 = randn({1000, 256});
  const float first = x2.data<float>()[0];
  xq::fake_tensor_quant_inplace(x2, scalar(abs_max(x2)));
  std::printf("example 2: in place on [1000, 256]: element 0 %.5f -> %.5f\n", static_cast<double>(first),
              static_cast<double>(x2.data<float>()[0]));
  // Example 3: per-axis (weights), axis 0, amax per output channel.
  xq::Tensor weight = randn({64, 128, 3, 3});
  xq::Tensor ch_amax(xq::DType::float32, {64});
  for (int c = 0; c < 64; ++c) {
    float m = 0.f;
    for (int i = 0; i < 128 * 9; ++i) m = std::max(m, std::fabs(weight.data<float>()[c * 128 * 9 + i]));
    ch_amax.data<float>()[c] = m;
  }
  xq::Tensor qw = xq::fake_tensor_quant_with_axis(weight, ch_amax, 0, {8, false, true});
  std::printf("example 3: per-axis weight [64, 128, 3, 3], axis 0, amax[0] = %.5f\n",
              static_cast<double>(ch_amax.data<float>()[0]));
  print_row("weight[0]", weight.data<float>(), 6);
  print_row("quantized_weight[0]", qw.data<float>(), 6);
}

void quantize_examples() {
  std::printf("== 02 npu_quantize ==\n");
  // div_mode = true, per-channel scales on axis 1, int8 zero points, qint8 output.
  xq::Tensor x = randn({4, 8});
  xq::Tensor scales(xq::DType::float32, {8});
  xq::Tensor zp(xq::DType::int8, {8});
  for (int c = 0; c < 8; ++c) {
    scales.data<float>()[c] = 0.01f * static_cast<float>(c + 1);
    zp.data<std::int8_t>()[c] = static_cast<std::int8_t>(c - 4);
  }
  xq::Tensor y = xq::quantize(x, scales, zp.view(), xq::QuantDType::qint8, 1, true);
  std::printf("div_mode=True, qint8, per-channel axis 1, x [4, 8]:\n");
  print_row("x[0]", x.data<float>(), 8);
  print_row("y[0] = rint(x/s + zp)", y.data<std::int8_t>(), 8);
  // div_mode = false, quint4x2: eight int4 per int32, per-tensor scale.
  xq::Tensor x4 = randn({2, 16});
  xq::Tensor s4 = scalar(4.f);
  xq::Tensor y4 = xq::quantize(x4, s4, std::nullopt, xq::QuantDType::quint4x2, -1, false);
  std::printf("div_mode=False, quint4x2, x [2, 16] -> int32 [2, 2]: word 0 = 0x%08x\n",
              static_cast<unsigned>(y4.data<std::int32_t>()[0]));
  print_row("x[0][0:8] (y = rint(x * 4))", x4.data<float>(), 8);
}

void tile_quant_example() {
  std::printf("== 03 pypto quant (SYM) ==\n");
  // The document's example: a [64, 128] FP32 tile whose row r starts at -16 + 32 r in steps of 0.25, scale 4.
  xq::Tensor src(xq::DType::float32, {64, 128});
  xq::Tensor scale(xq::DType::float32, {64, 1});
  for (int r = 0; r < 64; ++r) {
    scale.data<float>()[r] = 4.f;
    for (int c = 0; c < 128; ++c)
      src.data<float>()[r * 128 + c] = -16.f + 32.f * static_cast<float>(r) + 0.25f * static_cast<float>(c);
  }
  xq::Tensor out = xq::tile_quant(xq::ConstTileView(src.data(), xq::DType::float32, 64, 128, 128),
                                  xq::ConstTileView(scale.data(), xq::DType::float32, 64, 1, 1), xq::QuantMode::SYM);
  for (int r = 0; r < 4; ++r) {
    char label[64];  // room for any int and %g (no -Wformat-truncation)
    std::snprintf(label, sizeof label, "row %d (src from %g)", r, -16.0 + 32.0 * r);
    print_row(label, out.data<std::int8_t>() + r * 128, 8);
  }
}

void dynamic_quant_examples() {
  std::printf("== 04 npu_dynamic_quant_asymmetric ==\n");
  xq::Tensor x = randn({4, 2, 16});
  auto r = xq::dynamic_quant_asymmetric(x);
  std::printf("pertoken int8, x [4, 2, 16] -> scale shape %s\n", xq::shape_str(r.scale.shape()).c_str());
  std::printf("  row 0: scale %.6f offset %.4f\n", static_cast<double>(r.scale.data<float>()[0]),
              static_cast<double>(r.offset.data<float>()[0]));
  print_row("y[0]", r.y.data<std::int8_t>(), 8);
  auto rt = xq::dynamic_quant_asymmetric(x, std::nullopt, std::nullopt, xq::QuantDType::qint8,
                                         xq::DynamicQuantMode::pertensor);
  std::printf("pertensor int8: scale %.6f offset %.4f\n", static_cast<double>(rt.scale.data<float>()[0]),
              static_cast<double>(rt.offset.data<float>()[0]));
  xq::Tensor smooth(xq::DType::float32, {16});
  for (int j = 0; j < 16; ++j) smooth.data<float>()[j] = 0.5f + 0.1f * static_cast<float>(j);
  auto rs = xq::dynamic_quant_asymmetric(x, smooth.view(), std::nullopt, xq::QuantDType::quint4x2);
  std::printf("smooth_scales [16], int4: y shape %s (int32 words), row 0 word 0 = 0x%08x\n",
              xq::shape_str(rs.y.shape()).c_str(), static_cast<unsigned>(rs.y.data<std::int32_t>()[0]));
  // MoE: 8 rows, 3 experts, group_index = [3, 3, 8] (expert 1 receives no tokens).
  xq::Tensor smooth3(xq::DType::float32, {3, 16});
  for (int i = 0; i < 48; ++i) smooth3.data<float>()[i] = 1.f + 0.01f * static_cast<float>(i);
  xq::Tensor groups(xq::DType::int32, {3});
  groups.data<std::int32_t>()[0] = 3;
  groups.data<std::int32_t>()[1] = 3;
  groups.data<std::int32_t>()[2] = 8;
  auto rm = xq::dynamic_quant_asymmetric(x, smooth3.view(), groups.view());
  std::printf("MoE smooth_scales [3, 16], group_index [3, 3, 8]: row 7 scale %.6f offset %.4f\n",
              static_cast<double>(rm.scale.data<float>()[7]), static_cast<double>(rm.offset.data<float>()[7]));
}

void acts_ulq_example() {
  std::printf("== 05 ActsULQ ==\n");
  xq::Tensor x(xq::DType::float32, {2, 6});
  const float xs[12] = {-1.5f, -0.6f, -0.01f, 0.f, 0.3f, 0.7f, 0.99f, 1.2f, 2.f, -3.f, 0.5f, 0.25f};
  std::copy(xs, xs + 12, x.data<float>());
  xq::Tensor cmin = scalar(-1.f), cmax = scalar(1.f);
  auto r = xq::acts_ulq(x, cmin, cmax, false, 8);
  std::printf("x [2, 6], clamp_min -1, clamp_max 1, num_bits 8:\n");
  print_row("x", x.data<float>(), 6);
  print_row("y", r.y.data<float>(), 6);
  print_row("clamp_min_mask", r.clamp_min_mask.data<float>(), 6);
  print_row("clamp_max_mask", r.clamp_max_mask.data<float>(), 6);
  print_row("x_clamped_loss", r.x_clamped_loss.data<float>(), 6);
}

// The two companions of seeds 02 / 04: symmetric per-token quantization and dequantization.
void companion_examples() {
  std::printf("== companions: npu_dynamic_quant (symmetric) and npu_anti_quant ==\n");
  xq::Tensor x = randn({1, 16});
  auto r = xq::dynamic_quant(x);
  const float scale = r.scale.data<float>()[0];
  std::printf("symmetric pertoken int8, x [1, 16]: scale = max|x| / 127 = %.6f\n", static_cast<double>(scale));
  print_row("y", r.y.data<std::int8_t>(), 8);
  xq::Tensor back = xq::anti_quant(r.y, scalar(scale), std::nullopt, xq::DType::float32);
  print_row("x", x.data<float>(), 8);
  print_row("anti_quant(y, scale)", back.data<float>(), 8);
  float err = 0.f;
  for (int i = 0; i < 16; ++i) err = std::max(err, std::fabs(back.data<float>()[i] - x.data<float>()[i]));
  std::printf("  max |x - anti_quant(y, scale)| = %.6f (half a step: %.6f)\n", static_cast<double>(err),
              static_cast<double>(scale / 2));
}

}  // namespace

int main() {
  try {
    std::printf("xquant %s: the seed documents' examples through the C++ API\n\n", xq::kVersion);
    fake_quant_examples();
    quantize_examples();
    tile_quant_example();
    dynamic_quant_examples();
    acts_ulq_example();
    companion_examples();
  } catch (const xq::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
