// SIMD canonical chunk sums (rule 5), and the one float16 / bfloat16 -> float32 widening of whole arrays
// (cpu_widen_to_float: dynamic quantization's smooth scales, the weight-quant matmul's activations).
//
// Chunk sums: A chunk of up to 1024 float32 terms is added into 16 double lanes,
// lane = term index % 16, in index order; lanes are then folded by halving. With Lanes(double) = L, the
// 16 lanes are 16 / L vectors: vector k holds lanes [k L, (k + 1) L), so each lane still receives its
// terms in index order and the result does not depend on the SIMD width.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/reduce.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

double ChunkValue(const float* terms, std::int64_t count) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // L floats
  constexpr std::size_t kLanes = static_cast<std::size_t>(kSumLanes);
  const std::size_t L = hn::Lanes(dd);
  const std::size_t K = kLanes / L;  // accumulators (1 .. 16)
  HWY_ALIGN double lanes[kLanes];
  // Full groups of 16 terms with vector adds; the last partial group is padded with -0.0f, the exact
  // additive identity, so padding changes no lane.
  const std::int64_t full = count / kSumLanes * kSumLanes;
  float pad[kLanes];
  for (std::size_t j = 0; j < kLanes; ++j)
    pad[j] = static_cast<std::int64_t>(j) < count - full ? terms[full + static_cast<std::int64_t>(j)] : -0.0f;
  for (std::size_t k = 0; k < K; ++k) {
    auto acc = hn::Set(dd, -0.0);
    for (std::int64_t g = 0; g < full; g += kSumLanes)
      acc = hn::Add(acc, hn::PromoteTo(dd, hn::LoadU(dfh, terms + g + static_cast<std::int64_t>(k * L))));
    if (full < count) acc = hn::Add(acc, hn::PromoteTo(dd, hn::LoadU(dfh, pad + k * L)));
    hn::Store(acc, dd, lanes + k * L);
  }
  for (std::size_t w = kLanes / 2; w >= 1; w /= 2)
    for (std::size_t i = 0; i < w; ++i) lanes[i] += lanes[i + w];
  return lanes[0];
}

void WidenToFloat(DType dt, const void* src, std::int64_t b0, std::int64_t b1, float* dst) {
  VisitFloatDType(dt, [&]<DType DT>() {
    const DF df;
    const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
    std::int64_t i = b0;
    for (; i + L <= b1; i += L) hn::StoreU(LoadF<DT>(src, i), df, dst + i);
    for (; i < b1; ++i) dst[i] = load_float(DT, src, i);
  });
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(ChunkValue);
HWY_EXPORT(WidenToFloat);

void cpu_widen_to_float(DType dt, const void* src, std::int64_t b0, std::int64_t b1, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenToFloat)(dt, src, b0, b1, dst);
}

double cpu_chunk_value(const float* terms, std::int64_t count) {
  return HWY_DYNAMIC_DISPATCH(ChunkValue)(terms, count);
}

float finish_chunk_sum(const double* chunk_values, std::int64_t chunks) {
  if (chunks == 0) return 0.0f;  // empty sum
  double total = -0.0;
  for (std::int64_t k = 0; k < chunks; ++k) total += chunk_values[k];
  if (std::isnan(total)) return std::numeric_limits<float>::quiet_NaN();  // canonical NaN, as CanonicalSum
  return static_cast<float>(total);
}
}  // namespace xquant::detail
#endif
