// Regressions found by the fuzz_ops harness (fuzz/fuzz_ops.cpp, docs/testing.md). Each finding has
//   - a readable case here that states the failing call with the public API, and
//   - its input, embedded below and kept in fuzz/corpus/ops/regressions/, replayed through the harness's
//     own checks (the harness source is compiled into this test; under the asan preset its sanitizer
//     findings reproduce too).
#define XQUANT_FUZZ_OPS_NO_ENTRY
#include "../fuzz/fuzz_ops.cpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace {

using xquant::Backend;
using xquant::DType;
using xquant::Tensor;

struct BackendGuard {
  ~BackendGuard() {
    xquant::set_backend(Backend::cpu);
    xquant::set_num_threads(0);
  }
};

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// fuzz/corpus/ops/regressions/dq-nan-payload-single-column.
// A row of dynamic_quant_asymmetric whose only element is a NaN with a payload (float16 0xFD88): the
// reference backend's row max / min is that NaN itself (its first element is taken as is, only later
// elements go through the NaN-canonicalizing max), so offset = 127 - rowMax / scale carries the payload
// (0xFFF10000), while the cpu backend gives the canonical quiet NaN 0x7FC00000. docs/semantics.md 1.5: the
// min / max reductions give the canonical NaN and the backends agree on NaN bits.
TEST(FuzzRegression, DynamicQuantNanPayloadInSingleElementRow) {
  BackendGuard guard;
  for (const auto mode : {xquant::DynamicQuantMode::pertoken, xquant::DynamicQuantMode::pertensor}) {
    const xquant::Shape shape = mode == xquant::DynamicQuantMode::pertoken ? xquant::Shape{2, 1} : xquant::Shape{1, 1};
    Tensor x(DType::float16, shape);
    x.data<std::uint16_t>()[0] = 0xFD88;  // NaN, sign set, payload
    if (x.numel() > 1) x.data<std::uint16_t>()[1] = 0x3C00;  // 1.0
    xquant::set_backend(Backend::reference);
    const auto ref = xquant::dynamic_quant_asymmetric(x, std::nullopt, std::nullopt, xquant::QuantDType::qint8, mode);
    xquant::set_backend(Backend::cpu);
    xquant::set_num_threads(1);
    const auto cpu = xquant::dynamic_quant_asymmetric(x, std::nullopt, std::nullopt, xquant::QuantDType::qint8, mode);
    const char* m = mode == xquant::DynamicQuantMode::pertoken ? "pertoken" : "pertensor";
    ASSERT_TRUE(std::isnan(ref.offset.data<float>()[0])) << m;
    ASSERT_TRUE(std::isnan(ref.scale.data<float>()[0])) << m;
    EXPECT_EQ(bits(ref.scale.data<float>()[0]), bits(cpu.scale.data<float>()[0])) << m << ": scale NaN bits differ";
    EXPECT_EQ(bits(ref.offset.data<float>()[0]), bits(cpu.offset.data<float>()[0]))
        << m << ": offset NaN bits differ between the reference and cpu backends";
    EXPECT_EQ(std::memcmp(ref.y.data(), cpu.y.data(), ref.y.nbytes()), 0) << m;
  }
}

// The harness inputs of every finding above (byte for byte the files in fuzz/corpus/ops/regressions/).
struct Input {
  const char* name;
  std::vector<std::uint8_t> bytes;
};

const Input kInputs[] = {
    {"dq-nan-payload-single-column",
     {5, 0, 1, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x88, 0xfd, 0x00, 0x3c}},
};

TEST(FuzzRegression, HarnessInputs) {
  xquant_fuzz::g_on_failure = [](const std::string& what) { throw std::runtime_error(what); };
  for (const auto& in : kInputs) {
    try {
      xquant_fuzz::run_one(in.bytes.data(), in.bytes.size());
    } catch (const std::runtime_error& e) {
      ADD_FAILURE() << in.name << ": " << e.what();
    }
  }
  xquant_fuzz::g_on_failure = nullptr;
}

}  // namespace
