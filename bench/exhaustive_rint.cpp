// Exhaustive check of dynamic quantization's rounding check (rint_check in src/cpu/fastdiv-inl.h):
// for each row range [lo, hi] below, every float32 x in it (both signs, zeros, subnormals) is quantized
// by the cpu backend with the check forced on and compared byte for byte with the scalar reference,
// which divides as SPEC 4 / 6 write it. Asymmetric and symmetric (npu_dynamic_quant), int8 and int4,
// on every compiled SIMD target this CPU runs, in division mode 2 (rounding check forced: on AVX-512 its
// fixed-point form, rint_fixed), mode 3 (the check's y - rint(y) form) and this CPU's default mode.
//
//   build/release/bench/exhaustive_rint [--quick | --16] [--mode M]
//   (--quick: every 61st float32 only; --16: only the float16 / bfloat16 part, every value, seconds)
//
// Each row is [lo, hi, x...]: its min and max are lo and hi, so every row of a range has the same scale
// and offset. Exit status 1 on any difference.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/fastdiv-inl.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "xquant/half.hpp"
#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace {

float bits_float(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t float_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The floats in [lo, hi] in bit-pattern order: negative ones (if lo < 0) from -0 down to lo, then the
// non-negative ones up to hi.
struct Sweep {
  std::uint64_t neg = 0, pos = 0;  // counts
  std::uint32_t pos_first = 0;
  Sweep(float lo, float hi) {
    if (std::signbit(lo)) neg = std::uint64_t{float_bits(lo)} - 0x80000000u + 1;
    if (hi >= 0.0f) {
      pos_first = lo > 0.0f ? float_bits(lo) : 0u;
      pos = std::uint64_t{float_bits(hi)} - pos_first + 1;
    }
  }
  std::uint64_t size() const { return neg + pos; }
  float at(std::uint64_t i) const {
    return i < neg ? bits_float(0x80000000u + static_cast<std::uint32_t>(i))
                   : bits_float(pos_first + static_cast<std::uint32_t>(i - neg));
  }
};

}  // namespace

int main(int argc, char** argv) {
  // [--quick | --16] [--mode M]: --mode runs one division mode (2, 3 or -1) instead of all three
  std::string opt;
  std::vector<int> modes = {2, 3, -1};
  for (int k = 1; k < argc; ++k) {
    const std::string a = argv[k];
    if (a == "--mode" && k + 1 < argc)
      modes = {std::atoi(argv[++k])};
    else
      opt = a;
  }
  const bool quick = opt == "--quick", only16 = opt == "--16";
  const std::uint64_t step = quick ? 61 : 1;
  struct Range {
    float lo, hi;
  };
  // Ordinary rows, rows far from zero (large |x / s|, near the check's limit), tiny and huge magnitudes,
  // one-signed rows, and a constant-ish row (the 1e-12 scale floor).
  const std::vector<Range> ranges = {{-1.0f, 2.0f},
                                     {0.0f, 1.0f},
                                     {-3e-5f, 1e-5f},
                                     {-448.0f, 57344.0f},
                                     {1000.0f, 1001.0f},
                                     {-1e30f, 1e30f},
                                     {0.75f, 0.7500001f},
                                     {-1e-38f, 3e-38f},
                                     // scale 1 (int8 asymmetric, int8 / int4 symmetric, int4 asymmetric):
                                     // every half-integer x is an exact tie of rint
                                     {-128.0f, 127.0f},
                                     {-127.0f, 127.0f},
                                     {-7.0f, 7.0f},
                                     {-8.0f, 7.0f}};
  using xquant::QuantDType;
  constexpr std::int64_t H = 1 << 16;
  constexpr std::int64_t kRows = 64;  // per chunk: 4 Mi elements
  std::vector<float> xs(static_cast<std::size_t>(kRows * H));
  xquant::Tensor y_ref(xquant::DType::int8, {kRows, H}), y_cpu(xquant::DType::int8, {kRows, H});
  xquant::Tensor s_ref(xquant::DType::float32, {kRows}), o_ref(xquant::DType::float32, {kRows});
  xquant::Tensor s_cpu(xquant::DType::float32, {kRows}), o_cpu(xquant::DType::float32, {kRows});
  std::uint64_t checked = 0, bad = 0;
  // x [rows, cols] quantized by the reference and by the cpu backend on every target (skip_scalar: not the
  // scalar / emulated ones, minutes each on 2^32 floats; the tests cover them), int8 and int4, asymmetric
  // and symmetric; prints and counts the combinations whose outputs differ in any byte.
  auto compare = [&](const xquant::ConstTensorView& x, std::int64_t rows, std::int64_t cols, bool skip_scalar,
                     const char* label) {
    std::uint64_t diffs = 0;
    for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2})
      for (bool symmetric : {false, true}) {
        const xquant::Shape yshape = q == QuantDType::qint8 ? xquant::Shape{rows, cols} : xquant::Shape{rows, cols / 8};
        const xquant::DType ydt = q == QuantDType::qint8 ? xquant::DType::int8 : xquant::DType::int32;
        const xquant::TensorView yr(y_ref.data(), ydt, yshape), yc(y_cpu.data(), ydt, yshape);
        const xquant::TensorView sr(s_ref.data(), xquant::DType::float32, {rows}),
            sc(s_cpu.data(), xquant::DType::float32, {rows});
        const xquant::TensorView orr(o_ref.data(), xquant::DType::float32, {rows}),
            oc(o_cpu.data(), xquant::DType::float32, {rows});
        auto run = [&](const xquant::TensorView& y, const xquant::TensorView& s, const xquant::TensorView& o) {
          if (symmetric)
            xquant::dynamic_quant_out(y, s, x, std::nullopt, std::nullopt, q);
          else
            xquant::dynamic_quant_asymmetric_out(y, s, o, x, std::nullopt, std::nullopt, q);
        };
        xquant::set_backend(xquant::Backend::reference);
        run(yr, sr, orr);
        xquant::set_backend(xquant::Backend::cpu);
        for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
          if (skip_scalar && (target == HWY_SCALAR || target == HWY_EMU128)) continue;
          hwy::SetSupportedTargetsForTest(target);
          run(yc, sc, oc);
          const std::size_t bytes = static_cast<std::size_t>(rows * (q == QuantDType::qint8 ? cols : cols / 2));
          if (std::memcmp(yr.data, yc.data, bytes) != 0) {
            ++diffs;
            std::printf("  DIFFERENCE: %s %s %s target %s\n", label, symmetric ? "symmetric" : "asymmetric",
                        q == QuantDType::qint8 ? "int8" : "int4", hwy::TargetName(target));
          }
          checked += static_cast<std::uint64_t>(rows * cols);
        }
        hwy::SetSupportedTargetsForTest(0);
      }
    return diffs;
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int mode : modes)
    for (const Range& r : ranges) {
      if (only16) break;
      xquant::detail::set_fast_div_mode(mode);
      const Sweep sw(r.lo, r.hi);
      const std::uint64_t per_row = H - 2;
      const std::uint64_t count = (sw.size() + step - 1) / step;
      std::uint64_t range_bad = 0;
      for (std::uint64_t done = 0; done < count; done += per_row * kRows) {
        const std::int64_t rows =
            static_cast<std::int64_t>(std::min<std::uint64_t>(kRows, (count - done + per_row - 1) / per_row));
        for (std::int64_t row = 0; row < rows; ++row) {
          float* p = xs.data() + row * H;
          p[0] = r.lo;
          p[1] = r.hi;
          for (std::int64_t k = 2; k < H; ++k) {
            const std::uint64_t idx =
                done + static_cast<std::uint64_t>(row) * per_row + static_cast<std::uint64_t>(k - 2);
            p[k] = idx < count ? sw.at(idx * step) : r.lo;
          }
        }
        const xquant::ConstTensorView x(xs.data(), xquant::DType::float32, {rows, H});
        char label[96];
        std::snprintf(label, sizeof label, "range [%g, %g]", double(r.lo), double(r.hi));
        range_bad += compare(x, rows, H, true, label);
      }
      bad += range_bad;
      std::printf("mode %2d, range [%.9g, %.9g]: %llu floats x {asymmetric, symmetric} x {int8, int4} x targets: %s\n",
                  mode, double(r.lo), double(r.hi), static_cast<unsigned long long>(count),
                  range_bad ? "DIFFERENCES" : "identical to the reference");
      std::fflush(stdout);
    }
  // float16 and bfloat16 rows: every value of the dtype in each range (at most 2^16, so one row each),
  // through the kernels' 16-bit loads (bfloat16's pairs are split into even and odd elements, float16's converted).
  for (int mode : modes)
    for (xquant::DType dt : {xquant::DType::bfloat16, xquant::DType::float16}) {
      xquant::detail::set_fast_div_mode(mode);
      const bool bf = dt == xquant::DType::bfloat16;
      auto to_float = [bf](std::uint16_t b) { return bf ? xquant::bfloat16_to_float(b) : xquant::half_to_float(b); };
      std::uint64_t dt_bad = 0, dt_values = 0;
      for (const Range& r : ranges) {
        // the range's ends rounded into the dtype; ranges beyond its finite values are skipped
        float lo = r.lo, hi = r.hi;
        lo = to_float(bf ? xquant::float_to_bfloat16(lo) : xquant::float_to_half(lo));
        hi = to_float(bf ? xquant::float_to_bfloat16(hi) : xquant::float_to_half(hi));
        if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi)) continue;
        std::vector<std::uint16_t> row = {bf ? xquant::float_to_bfloat16(lo) : xquant::float_to_half(lo),
                                          bf ? xquant::float_to_bfloat16(hi) : xquant::float_to_half(hi)};
        for (std::uint32_t b = 0; b < 0x10000u; ++b) {
          const float v = to_float(static_cast<std::uint16_t>(b));
          if (v >= lo && v <= hi) row.push_back(static_cast<std::uint16_t>(b));
        }
        dt_values += row.size() - 2;
        while (row.size() % 64 != 40) row.push_back(row[0]);  // pairs, one more vector and a part vector
        const std::int64_t n = static_cast<std::int64_t>(row.size());
        const xquant::ConstTensorView x(row.data(), dt, {1, n});
        char label[96];
        std::snprintf(label, sizeof label, "%s range [%g, %g]", bf ? "bfloat16" : "float16", double(lo), double(hi));
        dt_bad += compare(x, 1, n, false, label);
      }
      bad += dt_bad;
      std::printf(
          "mode %2d, %s: every value of each range (%llu values) x {asymmetric, symmetric} x {int8, int4} x "
          "targets: %s\n",
          mode, bf ? "bfloat16" : "float16", static_cast<unsigned long long>(dt_values),
          dt_bad ? "DIFFERENCES" : "identical to the reference");
      std::fflush(stdout);
    }
  xquant::detail::set_fast_div_mode(-1);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%llu lanes checked in %.0f s; %llu chunks differ\n", static_cast<unsigned long long>(checked), sec,
              static_cast<unsigned long long>(bad));
  return bad == 0 ? 0 : 1;
}
