// SIMD canonical chunk sums (rule 5), and the one float16 / bfloat16 -> float32 widening of whole arrays
// (cpu_widen_to_float: dynamic quantization's smooth scales, the weight-quant matmul's activations).
//
// Chunk sums: A chunk of up to 1024 float32 terms is added into 16 double lanes,
// lane = term index % 16, in index order; lanes are then folded by halving. Two chunks (ActsULQ
// backward's clamp_min and clamp_max sums) can be computed in one loop. With Lanes(double) = L, the
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

// The values of up to two chunks of `count` terms each (terms[s] -> values[s], s < sums) in one loop: the
// accumulators (16 / L vectors per chunk) are independent dependency chains, so their adds overlap. Each
// lane still receives its terms in index order: the result is the same as one chunk at a time.
void ChunkValues(const float* const* terms, int sums, std::int64_t count, double* values) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // L floats
  constexpr std::size_t kLanes = static_cast<std::size_t>(kSumLanes);
  const std::size_t L = hn::Lanes(dd);
  HWY_ALIGN double lanes[2][kLanes];
  // Full groups of 16 terms with vector adds; the last partial group is padded with -0.0f, the exact
  // additive identity, so padding changes no lane.
  const std::int64_t full = count / kSumLanes * kSumLanes;
  float pad[2][kLanes];
  for (int s = 0; s < sums; ++s)
    for (std::size_t j = 0; j < kLanes; ++j)
      pad[s][j] = static_cast<std::int64_t>(j) < count - full ? terms[s][full + static_cast<std::int64_t>(j)] : -0.0f;
#if XQUANT_SIZELESS_VECTORS
  // SVE: vectors cannot be array elements; one accumulator at a time.
  for (int s = 0; s < sums; ++s)
    for (std::size_t k = 0; k < kLanes / L; ++k) {
      auto acc = hn::Set(dd, -0.0);
      for (std::int64_t g = 0; g < full; g += kSumLanes)
        acc = hn::Add(acc, hn::PromoteTo(dd, hn::LoadU(dfh, terms[s] + g + static_cast<std::int64_t>(k * L))));
      if (full < count) acc = hn::Add(acc, hn::PromoteTo(dd, hn::LoadU(dfh, pad[s] + k * L)));
      hn::Store(acc, dd, lanes[s] + k * L);
    }
#else
  constexpr std::size_t K = kLanes / hn::MaxLanes(dd);  // accumulators per chunk (1 .. 16)
  using V = hn::Vec<decltype(dd)>;
  auto run = [&]<int S>() {
    V acc[S][K];
    for (int s = 0; s < S; ++s)
      for (std::size_t k = 0; k < K; ++k) acc[s][k] = hn::Set(dd, -0.0);
    auto add = [&](int s, const float* t) {
      for (std::size_t k = 0; k < K; ++k) acc[s][k] = hn::Add(acc[s][k], hn::PromoteTo(dd, hn::LoadU(dfh, t + k * L)));
    };
    for (std::int64_t g = 0; g < full; g += kSumLanes)
      for (int s = 0; s < S; ++s) add(s, terms[s] + g);
    for (int s = 0; s < S; ++s) {
      if (full < count) add(s, pad[s]);
      for (std::size_t k = 0; k < K; ++k) hn::Store(acc[s][k], dd, lanes[s] + k * L);
    }
  };
  if (sums == 2)
    run.template operator()<2>();
  else
    run.template operator()<1>();
#endif
  for (int s = 0; s < sums; ++s) {
    for (std::size_t w = kLanes / 2; w >= 1; w /= 2)
      for (std::size_t i = 0; i < w; ++i) lanes[s][i] += lanes[s][i + w];
    values[s] = lanes[s][0];
  }
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
HWY_EXPORT(ChunkValues);
HWY_EXPORT(WidenToFloat);

void cpu_widen_to_float(DType dt, const void* src, std::int64_t b0, std::int64_t b1, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenToFloat)(dt, src, b0, b1, dst);
}

double cpu_chunk_value(const float* terms, std::int64_t count) {
  double v;
  HWY_DYNAMIC_DISPATCH(ChunkValues)(&terms, 1, count, &v);
  return v;
}

void cpu_chunk_values(const float* a, const float* b, std::int64_t count, double* va, double* vb) {
  const float* const terms[2] = {a, b};
  double v[2];
  HWY_DYNAMIC_DISPATCH(ChunkValues)(terms, 2, count, v);
  *va = v[0];
  *vb = v[1];
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
