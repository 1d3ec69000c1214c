// The CUDA backend against the scalar reference, bit for bit: every operator family with a CUDA kernel,
// every dtype, per-tensor / per-axis layouts, edge values (ties, NaN, +-Inf, saturation, subnormals, -0),
// empty tensors, lengths around block boundaries, misaligned (odd-offset) device pointers; plus the
// device errors (mixed devices, no CUDA kernel, OOM). Built only with XQUANT_CUDA. Without a usable GPU,
// each test that needs one is skipped with the CUDA runtime's reason.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "cuda/cuda.hpp"
#include "kernel_tables.hpp"
#include "test_util.hpp"
#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace {

using namespace xqtest;
using xquant::Device;
using xquant::QuantDType;

#define REQUIRE_CUDA()                                                                                      \
  do {                                                                                                      \
    if (!xquant::cuda_available()) GTEST_SKIP() << "no CUDA device: " << xquant::cuda_unavailable_reason(); \
  } while (0)

// A device copy of a host tensor, `pad` elements past a 256-byte aligned start (pad > 0: misaligned
// for vector loads); the Tensor owns the allocation.
struct DevTensor {
  Tensor storage;
  std::int64_t pad = 0;
  DType dtype;
  Shape shape;
  TensorView view() {
    auto* base = static_cast<unsigned char*>(storage.data());
    return TensorView(base + pad * static_cast<std::int64_t>(xquant::dtype_size(dtype)), dtype, shape, Device::cuda());
  }
};

DevTensor to_device(const ConstTensorView& h, std::int64_t pad = 0) {
  DevTensor d;
  d.pad = pad;
  d.dtype = h.dtype;
  d.shape = h.shape;
  d.storage = Tensor(h.dtype, Shape{h.numel() + pad}, Device::cuda());
  if (h.nbytes() > 0) {
    EXPECT_EQ(cudaMemcpy(d.view().data, h.data, h.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}

Tensor to_host(const ConstTensorView& d) {
  Tensor h(d.dtype, d.shape);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (d.nbytes() > 0) {
    EXPECT_EQ(cudaMemcpy(h.data(), d.data, d.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

// Bytes equal; on a mismatch, report the first differing byte.
void expect_same_bytes(const ConstTensorView& want, const ConstTensorView& got, const std::string& what) {
  ASSERT_EQ(want.nbytes(), got.nbytes()) << what;
  const auto* a = static_cast<const unsigned char*>(want.data);
  const auto* b = static_cast<const unsigned char*>(got.data);
  for (std::size_t i = 0; i < want.nbytes(); ++i)
    if (a[i] != b[i]) {
      ADD_FAILURE() << what << ": first difference at byte " << i << " (element " << i / xquant::dtype_size(want.dtype)
                    << "): reference " << int(a[i]) << ", cuda " << int(b[i]);
      return;
    }
}

// Values that exercise every rule: ties at several scales, NaN, +-Inf, huge, subnormal, +-0, and random
// values over a wide range.
std::vector<float> edge_values(std::int64_t n, std::uint32_t seed, float spread = 200.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  const float specials[] = {0.5f, 1.5f,  2.5f, -0.5f, -2.5f,   126.5f,   127.5f, -128.5f, 0.0f, -0.0f,
                            kNaN, -kNaN, kInf, -kInf, 3.0e38f, -3.0e38f, 1e-40f, -1e-45f, 7.5f, -8.5f};
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t r = rng();
    if (r % 7 == 0)
      v[static_cast<std::size_t>(i)] = specials[(r / 7) % (sizeof specials / sizeof specials[0])];
    else if (r % 7 == 1)
      v[static_cast<std::size_t>(i)] = std::rint(u(rng)) + 0.5f;  // a tie
    else
      v[static_cast<std::size_t>(i)] = u(rng);
  }
  return v;
}

std::int64_t shape_numel_or(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

const std::int64_t kLengths[] = {0, 1, 7, 8, 255, 256, 257, 1023, 1024, 1025, 4099};

class CudaEquivalence : public ::testing::Test {
 protected:
  void SetUp() override { xquant::set_backend(xquant::Backend::reference); }
  void TearDown() override { xquant::set_backend(xquant::Backend::cpu); }
};

// ---- fake tensor quant (forward), per tensor and per axis ----
// Every family has a CUDA kernel (operators call the table's entries without a null check). Needs no GPU.
TEST(CudaTable, Complete) {
  const xquant::detail::KernelTable& t = xquant::detail::cuda::kernels();
  EXPECT_STREQ(t.name, "cuda");
  xqtest::expect_complete_table(t);
}

TEST_F(CudaEquivalence, FakeQuantForward) {
  REQUIRE_CUDA();
  const xquant::FakeQuantOptions opts[] = {{8, false, true},  {8, false, false}, {8, true, false},  {4, false, true},
                                           {1, false, false}, {16, true, true},  {32, false, false}};
  for (DType dt : kFloatTypes)
    for (std::int64_t n : kLengths)
      for (const auto& o : opts)
        for (std::int64_t pad : {0, 1}) {
          const Tensor x = make_float(dt, {n}, edge_values(n, static_cast<std::uint32_t>(n * 31 + o.num_bits)));
          // (float16 inputs need an amax exact in float16, SPEC 1: the float16 range's extremes instead)
          for (float a : dt == DType::float16 ? std::vector<float>{1.0f, 100.0f, 0.0f, 5.9604645e-8f, 65504.0f}
                                              : std::vector<float>{1.0f, 100.0f, 0.0f, 1e-40f, 3.0e38f}) {
            const Tensor amax = make_float(DType::float32, {1}, {a});
            const Tensor want = xquant::fake_tensor_quant(x, amax, o);
            DevTensor dx = to_device(x, pad), damax = to_device(amax);
            const Tensor got = xquant::fake_tensor_quant(dx.view(), damax.view(), o);
            EXPECT_EQ(got.device(), Device::cuda());
            expect_same_bytes(want, to_host(got),
                              "fake_tensor_quant " + std::string(xquant::dtype_name(dt)) + " n=" + std::to_string(n) +
                                  " bits=" + std::to_string(o.num_bits) + " amax=" + std::to_string(a) +
                                  " pad=" + std::to_string(pad));
            // In place.
            xquant::fake_tensor_quant_inplace(dx.view(), damax.view(), o);
            expect_same_bytes(want, to_host(dx.view()), "fake_tensor_quant_inplace");
          }
        }
}

TEST_F(CudaEquivalence, FakeQuantWithAxis) {
  REQUIRE_CUDA();
  const Shape shape{3, 5, 67};
  for (DType dt : kFloatTypes)
    for (std::int64_t axis : {0, 1, 2, -1}) {
      const Tensor x = make_float(dt, shape, edge_values(3 * 5 * 67, 7u + static_cast<std::uint32_t>(axis)));
      const std::int64_t c = shape[static_cast<std::size_t>(axis < 0 ? axis + 3 : axis)];
      std::vector<float> a(static_cast<std::size_t>(c));
      for (std::int64_t i = 0; i < c; ++i)
        a[static_cast<std::size_t>(i)] = i == 1 ? 0.0f : 0.75f * static_cast<float>(i + 1);
      const Tensor amax = make_float(dt, {c}, a);
      const Tensor want = xquant::fake_tensor_quant_with_axis(x, amax, axis);
      DevTensor dx = to_device(x, 1), damax = to_device(amax);
      const Tensor got = xquant::fake_tensor_quant_with_axis(dx.view(), damax.view(), axis);
      expect_same_bytes(want, to_host(got), "fake_tensor_quant_with_axis axis=" + std::to_string(axis));
    }
}

// ---- fake tensor quant backward: grad_inputs and grad_amax (the canonical blocked sum) ----
TEST_F(CudaEquivalence, FakeQuantBackward) {
  REQUIRE_CUDA();
  struct Case {
    Shape shape;
    std::optional<std::int64_t> axis;
  };
  const Case cases[] = {{{0}, std::nullopt},    {{1}, std::nullopt},    {{1023}, std::nullopt},
                        {{1024}, std::nullopt}, {{1025}, std::nullopt}, {{16 * 1024 + 7}, std::nullopt},
                        {{3, 1100}, 0},         {{5, 3, 700}, 1},       {{4100, 3}, 1},
                        {{2, 2049, 2}, -2}};
  for (DType dt : kFloatTypes)
    for (const Case& cs : cases) {
      const std::int64_t n = shape_numel_or(cs.shape);
      const Tensor x = make_float(dt, cs.shape, edge_values(n, static_cast<std::uint32_t>(n) + 1u, 4.0f));
      const Tensor g = make_float(dt, cs.shape, edge_values(n, static_cast<std::uint32_t>(n) + 2u, 3.0f));
      const std::int64_t c = cs.axis
                                 ? cs.shape[static_cast<std::size_t>(
                                       *cs.axis < 0 ? *cs.axis + static_cast<std::int64_t>(cs.shape.size()) : *cs.axis)]
                                 : 1;
      std::vector<float> a(static_cast<std::size_t>(c));
      for (std::int64_t i = 0; i < c; ++i) a[static_cast<std::size_t>(i)] = 1.0f + 0.5f * static_cast<float>(i % 4);
      const Tensor amax = make_float(dt, cs.axis ? Shape{c} : Shape{1}, a);
      for (int bits : {8, 4})
        for (bool uns : {false, true}) {
          const xquant::FakeQuantOptions o{bits, uns, !uns};
          const xquant::FakeQuantGrads want = xquant::fake_tensor_quant_backward(g, x, amax, cs.axis, o);
          DevTensor dx = to_device(x, 1), dg = to_device(g), da = to_device(amax);
          const xquant::FakeQuantGrads got =
              xquant::fake_tensor_quant_backward(dg.view(), dx.view(), da.view(), cs.axis, o);
          const std::string what = "fake_tensor_quant_backward " + std::string(xquant::dtype_name(dt)) + " " +
                                   xquant::shape_str(cs.shape) + " bits=" + std::to_string(bits);
          expect_same_bytes(want.grad_inputs, to_host(got.grad_inputs), what + " grad_inputs");
          expect_same_bytes(want.grad_amax, to_host(got.grad_amax), what + " grad_amax");
          // grad_inputs written over grad_out (allowed aliasing), grad_amax requested.
          Tensor ga(dt, amax.shape(), Device::cuda());
          xquant::fake_tensor_quant_backward_out(dg.view(), ga.view(), dg.view(), dx.view(), da.view(), cs.axis, o);
          expect_same_bytes(want.grad_inputs, to_host(dg.view()), what + " grad_inputs in place");
          expect_same_bytes(want.grad_amax, to_host(ga), what + " grad_amax (in place call)");
        }
    }
}

// ---- npu_quantize ----
TEST_F(CudaEquivalence, Quantize) {
  REQUIRE_CUDA();
  struct Case {
    QuantDType q;
    bool div_mode;
  };
  const Case cases[] = {{QuantDType::qint8, true},
                        {QuantDType::quint8, true},
                        {QuantDType::qint32, true},
                        {QuantDType::qint8, false},
                        {QuantDType::quint4x2, false}};
  for (DType dt : kFloatTypes)
    for (const Case& cs : cases)
      for (std::int64_t cols : {0, 8, 16, 264, 1032})
        for (bool per_channel : {false, true}) {
          const Shape shape{3, cols};
          const Tensor x = make_float(dt, shape, edge_values(3 * cols, static_cast<std::uint32_t>(cols), 3000.0f));
          const std::int64_t axis = cs.div_mode ? 1 : -1;
          const std::int64_t nscale = per_channel ? cols : 1;
          if (nscale == 0) continue;
          std::vector<float> s(static_cast<std::size_t>(nscale)), z(static_cast<std::size_t>(nscale));
          for (std::int64_t i = 0; i < nscale; ++i) {
            s[static_cast<std::size_t>(i)] = cs.div_mode ? 0.37f + 0.01f * static_cast<float>(i % 13) : 1.0f / 3.0f;
            z[static_cast<std::size_t>(i)] = static_cast<float>(i % 5) - 2.0f;
          }
          const Tensor scales = make_float(DType::float32, {nscale}, s);
          const Tensor zp = make_float(DType::float32, {nscale}, z);
          for (bool with_zp : {false, true}) {
            std::optional<ConstTensorView> hz;
            if (with_zp) hz = zp.view();
            const Tensor want = xquant::quantize(x, scales, hz, cs.q, axis, cs.div_mode);
            DevTensor dx = to_device(x, 1), ds = to_device(scales), dz = to_device(zp);
            std::optional<ConstTensorView> dzv;
            if (with_zp) dzv = ConstTensorView(dz.view());
            const Tensor got = xquant::quantize(dx.view(), ds.view(), dzv, cs.q, axis, cs.div_mode);
            expect_same_bytes(
                want, to_host(got),
                "quantize " + std::string(xquant::quant_dtype_name(cs.q)) + " cols=" + std::to_string(cols));
          }
        }
}

// ---- tile quant ----
TEST_F(CudaEquivalence, TileQuant) {
  REQUIRE_CUDA();
  for (xquant::QuantMode mode : {xquant::QuantMode::SYM, xquant::QuantMode::ASYM})
    for (std::int64_t cols : {0, 1, 31, 256, 1025}) {
      const std::int64_t rows = 5, pitch = cols + 3;
      const Tensor src = make_float(DType::float32, {rows * pitch}, edge_values(rows * pitch, 11u));
      std::vector<float> s, o;
      for (std::int64_t i = 0; i < rows * 2; ++i) {
        s.push_back(i == 3 ? kInf : 0.5f + static_cast<float>(i));
        o.push_back(static_cast<float>(i) * 10.0f + 0.5f);
      }
      const Tensor scale = make_float(DType::float32, {rows * 2}, s);
      const Tensor offset = make_float(DType::float32, {rows * 2}, o);
      const DType odt = mode == xquant::QuantMode::SYM ? DType::int8 : DType::uint8;
      Tensor want(odt, {rows * pitch});
      fill_bytes(want);
      std::optional<xquant::ConstTileView> hoff;
      if (mode == xquant::QuantMode::ASYM) hoff = xquant::ConstTileView(offset.data(), DType::float32, rows, 1, 2);
      xquant::tile_quant(xquant::TileView{want.data(), odt, rows, cols, pitch},
                         xquant::ConstTileView(src.data(), DType::float32, rows, cols, pitch),
                         xquant::ConstTileView(scale.data(), DType::float32, rows, 1, 2), mode, hoff);
      Tensor init(odt, {rows * pitch});
      fill_bytes(init);
      DevTensor dsrc = to_device(src), dscale = to_device(scale), doff = to_device(offset), dout = to_device(init);
      std::optional<xquant::ConstTileView> doffv;
      if (mode == xquant::QuantMode::ASYM)
        doffv = xquant::ConstTileView(doff.view().data, DType::float32, rows, 1, 2, Device::cuda());
      xquant::tile_quant(xquant::TileView{dout.view().data, odt, rows, cols, pitch, Device::cuda()},
                         xquant::ConstTileView(dsrc.view().data, DType::float32, rows, cols, pitch, Device::cuda()),
                         xquant::ConstTileView(dscale.view().data, DType::float32, rows, 1, 2, Device::cuda()), mode,
                         doffv);
      expect_same_bytes(want, to_host(dout.view()), "tile_quant cols=" + std::to_string(cols));  // padding kept too
    }
}

// ---- npu_anti_quant ----
TEST_F(CudaEquivalence, AntiQuant) {
  REQUIRE_CUDA();
  for (QuantDType src : {QuantDType::qint8, QuantDType::quint4x2})
    for (DType out_dt : kFloatTypes)
      for (DType sdt : {DType::float32, DType::bfloat16})
        for (std::int64_t h : {8, 16, 1032}) {
          const std::int64_t rows = 3, stored = src == QuantDType::quint4x2 ? h / 8 : h;
          std::mt19937 rng(static_cast<std::uint32_t>(h));
          Tensor x(src == QuantDType::quint4x2 ? DType::int32 : DType::int8, {rows, stored});
          for (std::size_t i = 0; i < x.nbytes(); ++i)
            static_cast<unsigned char*>(x.data())[i] = static_cast<unsigned char>(rng());
          for (bool per_channel : {false, true})
            for (bool with_offset : {false, true}) {
              const std::int64_t n = per_channel ? h : 1;
              std::vector<float> s(static_cast<std::size_t>(n)), o(static_cast<std::size_t>(n));
              for (std::int64_t i = 0; i < n; ++i) {
                s[static_cast<std::size_t>(i)] = i == 2 ? kNaN : i == 3 ? kInf : 0.013f * static_cast<float>(i + 1);
                o[static_cast<std::size_t>(i)] = i == 5 ? -kInf : static_cast<float>(i % 7) - 3.5f;
              }
              const Tensor scale = make_float(sdt, {n}, s), offset = make_float(sdt, {n}, o);
              std::optional<ConstTensorView> ho;
              if (with_offset) ho = offset.view();
              const Tensor want = xquant::anti_quant(x, scale, ho, out_dt, src);
              DevTensor dx = to_device(x, 1), ds = to_device(scale), dof = to_device(offset);
              std::optional<ConstTensorView> dov;
              if (with_offset) dov = ConstTensorView(dof.view());
              const Tensor got = xquant::anti_quant(dx.view(), ds.view(), dov, out_dt, src);
              expect_same_bytes(want, to_host(got), "anti_quant h=" + std::to_string(h));
            }
        }
}

// ---- dynamic quant (asymmetric pertoken / pertensor, symmetric), with smooth scales and groups ----
TEST_F(CudaEquivalence, DynamicQuant) {
  REQUIRE_CUDA();
  for (DType dt : kFloatTypes)
    for (QuantDType dst : {QuantDType::qint8, QuantDType::quint4x2})
      for (std::int64_t cols : {0, 8, 256, 264, 1024, 1032, 4104}) {
        const std::int64_t rows = 6;
        std::vector<float> v = edge_values(rows * cols, static_cast<std::uint32_t>(cols) + 5u, 50.0f);
        // Row 0: no NaN / Inf (a normal row), row 1: constant, the others: edge values.
        for (std::int64_t j = 0; j < cols; ++j) {
          v[static_cast<std::size_t>(j)] = static_cast<float>(j % 17) - 8.25f;
          v[static_cast<std::size_t>(cols + j)] = 3.0f;
        }
        const Tensor x = make_float(dt, {2, 3, cols}, v);
        DevTensor dx = to_device(x, 1);
        const std::string what = std::string(xquant::dtype_name(dt)) + " cols=" + std::to_string(cols);
        for (auto mode : {xquant::DynamicQuantMode::pertoken, xquant::DynamicQuantMode::pertensor}) {
          const auto want = xquant::dynamic_quant_asymmetric(x, std::nullopt, std::nullopt, dst, mode);
          const auto got = xquant::dynamic_quant_asymmetric(dx.view(), std::nullopt, std::nullopt, dst, mode);
          expect_same_bytes(want.y, to_host(got.y), "dynamic_quant_asymmetric y " + what);
          expect_same_bytes(want.scale, to_host(got.scale), "dynamic_quant_asymmetric scale " + what);
          expect_same_bytes(want.offset, to_host(got.offset), "dynamic_quant_asymmetric offset " + what);
        }
        {
          const auto want = xquant::dynamic_quant(x, std::nullopt, std::nullopt, dst);
          const auto got = xquant::dynamic_quant(dx.view(), std::nullopt, std::nullopt, dst);
          expect_same_bytes(want.y, to_host(got.y), "dynamic_quant y " + what);
          expect_same_bytes(want.scale, to_host(got.scale), "dynamic_quant scale " + what);
        }
        // Smooth scales per group: group ends {2, 2, 6} (an empty group).
        std::vector<float> sm(static_cast<std::size_t>(3 * cols));
        for (std::size_t i = 0; i < sm.size(); ++i) sm[i] = 0.5f + 0.125f * static_cast<float>(i % 9);
        const Tensor smooth = make_float(dt, {3, cols}, sm);
        const Tensor groups = make_typed<std::int64_t>(DType::int64, {3}, {2, 2, 6});
        DevTensor dsm = to_device(smooth), dg = to_device(groups);
        const auto want = xquant::dynamic_quant_asymmetric(x, smooth.view(), groups.view(), dst);
        const auto got =
            xquant::dynamic_quant_asymmetric(dx.view(), ConstTensorView(dsm.view()), ConstTensorView(dg.view()), dst);
        expect_same_bytes(want.y, to_host(got.y), "dynamic_quant_asymmetric smooth y " + what);
        expect_same_bytes(want.scale, to_host(got.scale), "dynamic_quant_asymmetric smooth scale " + what);
        expect_same_bytes(want.offset, to_host(got.offset), "dynamic_quant_asymmetric smooth offset " + what);
        const auto wsym = xquant::dynamic_quant(x, smooth.view(), groups.view(), dst);
        const auto gsym =
            xquant::dynamic_quant(dx.view(), ConstTensorView(dsm.view()), ConstTensorView(dg.view()), dst);
        expect_same_bytes(wsym.y, to_host(gsym.y), "dynamic_quant smooth y " + what);
        expect_same_bytes(wsym.scale, to_host(gsym.scale), "dynamic_quant smooth scale " + what);
      }
}

// ---- dynamic quant, op-plugin 26.x forms: float8 outputs, symmetric pertensor, perchannel (with smooth [S]) ----
TEST_F(CudaEquivalence, DynamicQuantFloat8AndPerChannel) {
  REQUIRE_CUDA();
  using xquant::DynamicQuantMode;
  for (DType dt : kFloatTypes)
    for (QuantDType dst : {QuantDType::qint8, QuantDType::float8_e4m3fn, QuantDType::float8_e5m2})
      for (std::int64_t cols : {0, 8, 264, 1032}) {
        std::vector<float> v = edge_values(6 * cols, static_cast<std::uint32_t>(cols) + 11u, 50.0f);
        for (std::int64_t j = 0; j < cols; ++j) v[static_cast<std::size_t>(j)] = static_cast<float>(j % 13) - 6.5f;
        const Tensor x = make_float(dt, {2, 3, cols}, v);
        DevTensor dx = to_device(x, 1);
        const Tensor smooth = make_float(dt, {3}, {0.5f, 1.25f, 2.0f});
        DevTensor dsm = to_device(smooth);
        const std::string what = std::string(xquant::dtype_name(dt)) + " " +
                                 std::string(xquant::quant_dtype_name(dst)) + " cols=" + std::to_string(cols);
        for (auto mode : {DynamicQuantMode::pertoken, DynamicQuantMode::pertensor, DynamicQuantMode::perchannel})
          for (bool with_smooth : {false, true}) {
            if (with_smooth && mode != DynamicQuantMode::perchannel) continue;
            const std::optional<ConstTensorView> hs =
                with_smooth ? std::optional<ConstTensorView>(smooth.view()) : std::nullopt;
            const std::optional<ConstTensorView> ds =
                with_smooth ? std::optional<ConstTensorView>(dsm.view()) : std::nullopt;
            const auto want = xquant::dynamic_quant_asymmetric(x, hs, std::nullopt, dst, mode);
            const auto got = xquant::dynamic_quant_asymmetric(dx.view(), ds, std::nullopt, dst, mode);
            expect_same_bytes(want.y, to_host(got.y), "dynamic_quant_asymmetric y " + what);
            expect_same_bytes(want.scale, to_host(got.scale), "dynamic_quant_asymmetric scale " + what);
            expect_same_bytes(want.offset, to_host(got.offset), "dynamic_quant_asymmetric offset " + what);
            const auto wsym = xquant::dynamic_quant(x, hs, std::nullopt, dst, mode);
            const auto gsym = xquant::dynamic_quant(dx.view(), ds, std::nullopt, dst, mode);
            expect_same_bytes(wsym.y, to_host(gsym.y), "dynamic_quant y " + what);
            expect_same_bytes(wsym.scale, to_host(gsym.scale), "dynamic_quant scale " + what);
          }
      }
}

// Float outputs equal bit for bit, except that two NaNs of any bits count as equal (ActsULQ forward: NaN
// bits are not promised across architectures, docs/semantics.md 1.5 / 1.11).
void expect_same_floats_nan_any(const ConstTensorView& want, const ConstTensorView& got, const std::string& what) {
  const std::vector<float> w = to_floats(want), g = to_floats(got);
  ASSERT_EQ(w.size(), g.size()) << what;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (!same_bits(w[i], g[i])) {
      ADD_FAILURE() << what << ": element " << i << ": reference " << w[i] << ", cuda " << g[i];
      return;
    }
  }
}

// ---- ActsULQ forward and backward (broadcast clamps; gradient sums in the canonical order) ----
TEST_F(CudaEquivalence, ActsUlq) {
  REQUIRE_CUDA();
  struct Case {
    Shape x, cmin, cmax;
  };
  const Case cases[] = {{{0}, {1}, {1}},
                        {{1}, {1}, {1}},
                        {{1025}, {1}, {1}},
                        {{4, 777}, {4, 1}, {1}},
                        {{3, 5, 300}, {5, 1}, {3, 1, 1}},
                        {{2100, 3}, {3}, {2100, 1}},
                        {{2}, {0, 1}, {1}}};
  for (DType dt : kFloatTypes)
    for (const Case& cs : cases)
      for (bool fixed_min : {false, true})
        for (int bits : {8, 4}) {
          const std::int64_t nx = shape_numel_or(cs.x), nmin = shape_numel_or(cs.cmin), nmax = shape_numel_or(cs.cmax);
          const Tensor x = make_float(dt, cs.x, edge_values(nx, static_cast<std::uint32_t>(nx) + 3u, 6.0f));
          std::vector<float> vmin(static_cast<std::size_t>(nmin)), vmax(static_cast<std::size_t>(nmax));
          for (std::int64_t i = 0; i < nmin; ++i)
            vmin[static_cast<std::size_t>(i)] = i % 3 == 2 ? 0.25f : -1.0f - 0.5f * static_cast<float>(i % 4);
          for (std::int64_t i = 0; i < nmax; ++i)
            vmax[static_cast<std::size_t>(i)] = i % 5 == 4 ? 1e-9f : 1.0f + 0.75f * static_cast<float>(i % 6);
          const Tensor cmin = make_float(dt, cs.cmin, vmin), cmax = make_float(dt, cs.cmax, vmax);
          const std::string what = "acts_ulq " + std::string(xquant::dtype_name(dt)) + " x=" + xquant::shape_str(cs.x) +
                                   " bits=" + std::to_string(bits) + " fixed_min=" + std::to_string(fixed_min);
          const xquant::ActsUlqResult want = xquant::acts_ulq(x, cmin, cmax, fixed_min, bits);
          DevTensor dx = to_device(x, 1), dmin = to_device(cmin), dmax = to_device(cmax);
          const xquant::ActsUlqResult got = xquant::acts_ulq(dx.view(), dmin.view(), dmax.view(), fixed_min, bits);
          expect_same_floats_nan_any(want.y, to_host(got.y), what + " y");
          expect_same_bytes(want.clamp_min_mask, to_host(got.clamp_min_mask), what + " clamp_min_mask");
          expect_same_bytes(want.clamp_max_mask, to_host(got.clamp_max_mask), what + " clamp_max_mask");
          expect_same_floats_nan_any(want.x_clamped_loss, to_host(got.x_clamped_loss), what + " x_clamped_loss");
          // Backward from the reference's forward outputs (the same inputs on both sides).
          const Shape out = want.y.shape();
          const Tensor dy = make_float(dt, out, edge_values(shape_numel_or(out), 99u, 2.0f));
          const xquant::ActsUlqGrads gw = xquant::acts_ulq_backward(
              dy, cs.x, cmin, cmax, want.clamp_min_mask, want.clamp_max_mask, want.x_clamped_loss, fixed_min, bits);
          DevTensor ddy = to_device(dy), dmm = to_device(want.clamp_min_mask), dxm = to_device(want.clamp_max_mask),
                    dl = to_device(want.x_clamped_loss);
          const xquant::ActsUlqGrads gg = xquant::acts_ulq_backward(ddy.view(), cs.x, dmin.view(), dmax.view(),
                                                                    dmm.view(), dxm.view(), dl.view(), fixed_min, bits);
          expect_same_bytes(gw.x_grad, to_host(gg.x_grad), what + " x_grad");
          expect_same_bytes(gw.clamp_min_grad, to_host(gg.clamp_min_grad), what + " clamp_min_grad");
          expect_same_bytes(gw.clamp_max_grad, to_host(gg.clamp_max_grad), what + " clamp_max_grad");
        }
}

// ---- 64-bit indexing: more than 2^31 elements (4 GiB of bfloat16 in, 2 GiB of int8 out) ----
// The elementwise per-tensor operators are position-independent, so the reference runs on the pattern
// written at the head and at the tail of the big tensor only.
TEST(CudaLarge, MoreThan2To31Elements) {
  REQUIRE_CUDA();
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const std::int64_t n = (std::int64_t{1} << 31) + 4096 + 8;
  if (free_bytes < static_cast<std::size_t>(n) * 6 + (std::size_t{1} << 30))
    GTEST_SKIP() << "not enough GPU memory for the > 2^31-element case: " << free_bytes << " bytes free";
  const std::int64_t m = 1 << 20;
  const Tensor pat = make_float(DType::bfloat16, {m}, edge_values(m, 77u, 300.0f));
  Tensor x(DType::bfloat16, {n}, Device::cuda());
  ASSERT_EQ(cudaMemset(x.data(), 0, x.nbytes()), cudaSuccess);
  auto* base = static_cast<std::uint16_t*>(x.data());
  ASSERT_EQ(cudaMemcpy(base, pat.data(), pat.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(base + (n - m), pat.data(), pat.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  const Tensor amax = make_float(DType::float32, {1}, {100.0f});
  DevTensor damax = to_device(amax);
  xquant::set_backend(xquant::Backend::reference);
  const Tensor want_fq = xquant::fake_tensor_quant(pat, amax);
  const Tensor scales = make_float(DType::float32, {1}, {0.7f});
  DevTensor dscales = to_device(scales);
  const Tensor want_q = xquant::quantize(pat, scales, std::nullopt, QuantDType::qint8, 0, true);
  xquant::set_backend(xquant::Backend::cpu);
  {
    const Tensor q = xquant::quantize(x, dscales.view(), std::nullopt, QuantDType::qint8, 0, true);
    const auto* qb = static_cast<const std::int8_t*>(q.data());
    expect_same_bytes(want_q, to_host(ConstTensorView(qb, DType::int8, {m}, Device::cuda())), "quantize head");
    expect_same_bytes(want_q, to_host(ConstTensorView(qb + (n - m), DType::int8, {m}, Device::cuda())),
                      "quantize tail");
  }
  xquant::fake_tensor_quant_inplace(x, damax.view());
  expect_same_bytes(want_fq, to_host(ConstTensorView(base, DType::bfloat16, {m}, Device::cuda())), "fake quant head");
  expect_same_bytes(want_fq, to_host(ConstTensorView(base + (n - m), DType::bfloat16, {m}, Device::cuda())),
                    "fake quant tail");
}

// ---- streams: a call under CudaStreamGuard runs on that stream ----
TEST_F(CudaEquivalence, StreamGuard) {
  REQUIRE_CUDA();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  {
    xquant::CudaStreamGuard g(s);
    EXPECT_EQ(xquant::current_cuda_stream(), static_cast<void*>(s));
    const Tensor x = make_float(DType::float32, {4099}, edge_values(4099, 3u));
    const Tensor amax = make_float(DType::float32, {1}, {10.0f});
    const Tensor want = xquant::fake_tensor_quant(x, amax);
    DevTensor dx = to_device(x), da = to_device(amax);
    const Tensor got = xquant::fake_tensor_quant(dx.view(), da.view());
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    expect_same_bytes(want, to_host(got), "fake_tensor_quant on a stream");
  }
  EXPECT_EQ(xquant::current_cuda_stream(), nullptr);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// ---- errors ----
// Mixed devices are rejected before anything else (no GPU needed: the views are never read).
TEST(CudaErrors, MixedDevicesNameTheArgumentAndBothDevices) {
  std::vector<float> host(16, 1.0f);
  float amax_v = 1.0f;
  const ConstTensorView x(host.data(), DType::float32, {16});
  const ConstTensorView amax_dev(&amax_v, DType::float32, {1}, Device::cuda(0));
  expect_error([&] { (void)xquant::fake_tensor_quant(x, amax_dev); }, xquant::ErrorCode::device_mismatch, "amax",
               {"cuda:0", "cpu"});
  Tensor out(DType::float32, {16});
  TensorView out_dev = out.view();
  out_dev.device = Device::cuda(1);
  const ConstTensorView amax(&amax_v, DType::float32, {1});
  expect_error([&] { xquant::fake_tensor_quant_out(out_dev, x, amax); }, xquant::ErrorCode::device_mismatch, "out",
               {"cuda:1"});
  EXPECT_EQ(host, std::vector<float>(16, 1.0f));
}

// On a machine without a usable GPU, CUDA tensors give a clear device_error (not a crash).
TEST(CudaErrors, NoDeviceIsAClearError) {
  if (xquant::cuda_available()) GTEST_SKIP() << "a CUDA device is available: this test covers machines without one";
  EXPECT_FALSE(xquant::cuda_unavailable_reason().empty());
  float v[4] = {1, 2, 3, 4};
  float a = 1.0f;
  const ConstTensorView x(v, DType::float32, {4}, Device::cuda());
  const ConstTensorView amax(&a, DType::float32, {1}, Device::cuda());
  expect_error([&] { (void)xquant::fake_tensor_quant(x, amax); }, xquant::ErrorCode::device_error, "inputs",
               {"cuda:0"});
  expect_error([&] { (void)Tensor(DType::float32, {4}, Device::cuda()); }, xquant::ErrorCode::device_error, "device");
}

// Out of device memory: a clear out_of_memory error.
TEST(CudaErrors, OutOfMemory) {
  REQUIRE_CUDA();
  try {
    Tensor t(DType::float32, {std::int64_t{1} << 50}, Device::cuda());
    ADD_FAILURE() << "allocating 4 PiB on the GPU succeeded";
  } catch (const xquant::Error& e) {
    EXPECT_EQ(e.code(), xquant::ErrorCode::out_of_memory) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot allocate"), std::string::npos) << e.what();
  }
}

TEST(CudaErrors, CpuPathUnaffected) {
  // Default views are on the CPU, and the CPU path never touches the CUDA runtime.
  const Tensor x = make_float(DType::float32, {3}, {0.5f, 1.5f, -2.5f});
  EXPECT_EQ(x.device(), Device::cpu());
  EXPECT_EQ(ConstTensorView(x).device, Device::cpu());
  const Tensor amax = make_float(DType::float32, {1}, {127.0f});
  const Tensor y = xquant::fake_tensor_quant(x, amax);
  EXPECT_EQ(to_floats(y), (std::vector<float>{0.0f, 2.0f, -2.0f}));
  EXPECT_TRUE(xquant::cuda_built());
  EXPECT_EQ(xquant::device_str(Device::cuda(2)), "cuda:2");
}

}  // namespace

// ---- quantized matmuls (docs/semantics.md section 9) ----
namespace {

Tensor random_bytes(DType dt, const Shape& shape, std::uint32_t seed) {
  Tensor t(dt, shape);
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < t.nbytes(); ++i)
    static_cast<unsigned char*>(t.data())[i] = static_cast<unsigned char>(rng());
  return t;
}

TEST_F(CudaEquivalence, QuantMatmul) {
  REQUIRE_CUDA();
  struct Sz {
    std::int64_t M, K, N;
  };
  for (bool int4 : {false, true})
    for (bool transpose : {false, true})
      for (Sz z : {Sz{1, 8, 8}, Sz{3, 40, 72}, Sz{70, 264, 136}, Sz{0, 8, 8}, Sz{2, 0, 8}})
        for (DType out_dt : {DType::int8, DType::float16, DType::bfloat16, DType::int32})
          for (int opt = 0; opt < 3; ++opt) {
            const std::int64_t d = int4 ? 8 : 1;
            const DType qdt = int4 ? DType::int32 : DType::int8;
            const auto seed = static_cast<std::uint32_t>(z.M * 31 + z.K * 7 + z.N + opt);
            Tensor x1 = random_bytes(qdt, {z.M, z.K / d}, seed);
            Tensor x2 = random_bytes(qdt, transpose ? Shape{z.N, z.K / d} : Shape{z.K, z.N / d}, seed + 1);
            const std::vector<float> sv = edge_values(z.N, seed + 2, 0.01f), pv = edge_values(z.M, seed + 3, 2.f);
            Tensor s = make_float(DType::float32, {z.N}, sv), p = make_float(DType::float32, {z.M}, pv);
            Tensor bf = make_float(DType::bfloat16, {z.N}, edge_values(z.N, seed + 4, 9.f));
            Tensor bi = random_bytes(DType::int32, {z.N}, seed + 5);
            Tensor s64 = xquant::trans_quant_param(make_float(DType::float32, {1}, {0.03125f}),
                                                   make_float(DType::float32, {1}, {-3.f}).view());
            const bool float_out = out_dt == DType::float16 || out_dt == DType::bfloat16;
            DevTensor d1 = to_device(x1, 1), d2 = to_device(x2, 3), ds = to_device(s), dp = to_device(p),
                      dbf = to_device(bf), dbi = to_device(bi), ds64 = to_device(s64);
            xquant::QuantMatmulOptions h, g;
            h.transpose_x2 = g.transpose_x2 = transpose;
            if (opt >= 1) {
              h.bias = float_out && opt == 2 ? bf.view() : bi.view();
              g.bias = float_out && opt == 2 ? ConstTensorView(dbf.view()) : ConstTensorView(dbi.view());
            }
            if (opt == 2 && out_dt != DType::int32)
              h.pertoken_scale = p.view(), g.pertoken_scale = ConstTensorView(dp.view());
            if (opt == 1 && out_dt == DType::int8) h.offset = s.view(), g.offset = ConstTensorView(ds.view());
            const Tensor want = xquant::quant_matmul(x1, x2, s, h, out_dt);
            const Tensor got = xquant::quant_matmul(d1.view(), d2.view(), ds.view(), g, out_dt);
            const std::string what = "quant_matmul int4 " + std::to_string(int4) + " transpose " +
                                     std::to_string(transpose) + " [" + std::to_string(z.M) + ", " +
                                     std::to_string(z.K) + ", " + std::to_string(z.N) + "] opt " + std::to_string(opt) +
                                     " -> " + std::string(xquant::dtype_name(out_dt));
            expect_same_bytes(want, to_host(got), what);
            if (opt == 0) {  // the int64 scale (with its offset) on the device too
              const Tensor w64 = xquant::quant_matmul(x1, x2, s64, h, out_dt);
              const Tensor g64 = xquant::quant_matmul(d1.view(), d2.view(), ds64.view(), g, out_dt);
              expect_same_bytes(w64, to_host(g64), what + " int64 scale");
            }
          }
}

TEST_F(CudaEquivalence, WeightQuantBatchMatmul) {
  REQUIRE_CUDA();
  struct Sz {
    std::int64_t M, K, N;
  };
  for (DType dt : {DType::float16, DType::bfloat16})
    for (bool int4 : {false, true})
      for (bool transpose : {false, true})
        for (Sz z : {Sz{1, 64, 8}, Sz{5, 96, 72}, Sz{33, 264, 136}, Sz{0, 64, 8}})
          for (int kind : {0, 1, 2}) {
            const std::int64_t d = int4 ? 8 : 1;
            const auto seed = static_cast<std::uint32_t>(z.M * 17 + z.K + z.N * 3 + kind);
            Tensor w = random_bytes(int4 ? DType::int32 : DType::int8,
                                    transpose ? Shape{z.N, z.K / d} : Shape{z.K, z.N / d}, seed);
            Tensor x = make_float(dt, {z.M, z.K}, edge_values(z.M * z.K, seed + 1, 4.f));
            const std::int64_t gs = kind == 2 ? 32 : 0, G = kind == 2 ? (z.K + 31) / 32 : 1;
            const Shape ps = kind == 0 ? Shape{1} : kind == 1 ? Shape{z.N} : Shape{G, z.N};
            const std::int64_t np = shape_numel_or(ps);
            Tensor s = make_float(dt, ps, edge_values(np, seed + 2, 0.02f)),
                   o = make_float(dt, ps, edge_values(np, seed + 3, 9.f));
            Tensor b = make_float(DType::float32, {z.N}, edge_values(z.N, seed + 4, 1.f));
            DevTensor dx = to_device(x, 1), dw = to_device(w, 1), dsc = to_device(s), dof = to_device(o),
                      db = to_device(b);
            for (int opt = 0; opt < 2; ++opt) {
              xquant::WeightQuantMatmulOptions h, g;
              h.transpose_weight = g.transpose_weight = transpose;
              h.antiquant_group_size = g.antiquant_group_size = gs;
              if (opt == 1) {
                h.antiquant_offset = o.view(), h.bias = b.view();
                g.antiquant_offset = ConstTensorView(dof.view()), g.bias = ConstTensorView(db.view());
              }
              const Tensor want = xquant::weight_quant_batchmatmul(x, w, s, h);
              const Tensor got = xquant::weight_quant_batchmatmul(dx.view(), dw.view(), dsc.view(), g);
              expect_same_bytes(want, to_host(got),
                                "weight_quant_batchmatmul " + std::string(xquant::dtype_name(dt)) + " int4 " +
                                    std::to_string(int4) + " transpose " + std::to_string(transpose) + " [" +
                                    std::to_string(z.M) + ", " + std::to_string(z.K) + ", " + std::to_string(z.N) +
                                    "] kind " + std::to_string(kind) + " opt " + std::to_string(opt));
            }
          }
}

TEST_F(CudaEquivalence, TransQuantParamAndInt4PackOnDevice) {
  REQUIRE_CUDA();
  Tensor s = make_float(DType::float32, {3}, {1.0458984375f, -0.5f, kNaN});
  Tensor o = make_float(DType::float32, {3}, {1.f, -2.5f, 300.f});
  DevTensor ds = to_device(s), dof = to_device(o);
  expect_same_bytes(xquant::trans_quant_param(s, o.view(), 1),
                    to_host(xquant::trans_quant_param(ds.view(), ConstTensorView(dof.view()), 1)), "trans_quant_param");
  Tensor w = make_typed<std::int32_t>(DType::int32, {1, 8}, {-2, 1, 2, 3, 7, -8, 0, 7});
  DevTensor dw = to_device(w);
  expect_same_bytes(xquant::convert_weight_to_int4pack(w), to_host(xquant::convert_weight_to_int4pack(dw.view())),
                    "convert_weight_to_int4pack");
}

}  // namespace
