// Regressions found by the fuzz_ops harness (fuzz/fuzz_ops.cpp, docs/testing.md). Each finding has
//   - a readable case here that states the failing call with the public API, and
//   - its input, embedded below and kept in fuzz/corpus/ops/regressions/, replayed through the harness's
//     own checks (the harness source is compiled into this test; under the asan preset its sanitizer
//     findings reproduce too).
#define XQUANT_FUZZ_OPS_NO_ENTRY
#include "../fuzz/fuzz_ops.cpp"  // NOLINT(bugprone-suspicious-include): the harness is compiled in, on purpose

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
    x.data<std::uint16_t>()[0] = 0xFD88;                     // NaN, sign set, payload
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

// fuzz/corpus/ops/regressions/dq-empty-rows-overflow{,-pertensor}.
// x is empty (last dimension 0) but its leading dimensions multiply past int64: [2^32, 2^32, 0]. check_view
// accepts it (empty tensors are valid, and an empty shape's element count is 0 whatever the other
// dimensions), then validate_inputs (src/ops/dynamic_quant.cpp, `p.rows *= x.shape[d]`, commented "fits:
// check_view") multiplies the leading dimensions into int64 and overflows: undefined behaviour, reported
// by UndefinedBehaviorSanitizer (this test fails under the asan preset). pertensor has valid outputs
// (y empty, scale and offset [1], the empty reduction's rowMax = rowMin = 0); pertoken would need a
// scale of 2^64 elements and must be rejected with an xquant::Error.
TEST(FuzzRegression, DynamicQuantEmptyXWithHugeLeadingDims) {
  BackendGuard guard;
  const std::int64_t big = std::int64_t{1} << 32;
  float dummy = 0.f;
  const xquant::ConstTensorView x(&dummy, DType::float32, {big, big, 0});
  std::int8_t ydummy = 0;
  for (const Backend b : {Backend::reference, Backend::cpu}) {
    xquant::set_backend(b);
    float scale = -1.f, offset = -1.f;
    xquant::dynamic_quant_asymmetric_out(xquant::TensorView(&ydummy, DType::int8, {big, big, 0}),
                                         xquant::TensorView(&scale, DType::float32, {1}),
                                         xquant::TensorView(&offset, DType::float32, {1}), x, std::nullopt,
                                         std::nullopt, xquant::QuantDType::qint8, xquant::DynamicQuantMode::pertensor);
    EXPECT_EQ(scale, 1e-12f);  // max((0 - 0) / 255, 1e-12)
    EXPECT_EQ(offset, 127.f);  // 127 - 0 / scale
    EXPECT_THROW(xquant::dynamic_quant_asymmetric(x), xquant::Error);
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
    {"dq-empty-rows-overflow", {5, 0, 0, 0, 3, 246, 246, 192, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {"dq-empty-rows-overflow-pertensor",
     {5, 0, 0, 2, 3, 246, 246, 192, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
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
