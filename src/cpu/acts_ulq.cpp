// cpu backend: ActsULQ forward and backward (SPEC section 5), bit-identical to src/ref/acts_ulq.cpp.
//
// Forward: when x is not broadcast, the clamp tensors' broadcast dimensions span a range [d0, d1) of
// the output, which gives the [outer, C, inner] normal form with one parameter set (s, clip_lo, clip_hi,
// loss_m, computed once per clamp pair by the shared init_acts_ulq_params of params/acts_ulq.hpp) per channel. All four
// outputs are written in one pass. Backward: each clamp tensor's sums follow its own [outer, C, inner] layout; one
// fused pass per 1024-term chunk of a channel writes x_grad and produces the chunk values of both sums (two passes when
// the clamp tensors broadcast differently). x broadcast, clamps varying only along short innermost runs, and clamps
// broadcast inside their own dims are declined (the entry points return false, having written nothing): the backend
// registry (src/backends/registry.cpp) runs the reference kernel for them.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/acts_ulq.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/fastdiv-inl.h"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/walk.hpp"

namespace xquant::detail {
#ifndef XQUANT_CPU_ACTS_ULQ_ONCE
#define XQUANT_CPU_ACTS_ULQ_ONCE
struct UlqJob {
  DType dt;
  const void* x;
  void* out[4];  // y, clamp_min_mask, clamp_max_mask, x_clamped_loss
  float levels;
  const ChannelWalk* walk;
  const ActsUlqParams* params;  // per channel (runs walk)
  const float* arr[4];          // periodic walk: s, clip_lo, clip_hi, loss_m expanded
  bool stream;                  // non-temporal stores (the four outputs are equally aligned)
  bool fast_div;                // xc / s and (rx - raw) / LEVELS by the FMA sequence where in `dom`
  FastDivDomain dom;            // of every s, keeping |raw| >= 2^-100 (then rx - raw is in LEVELS' domain)
  const float* rs;              // fast_div, periodic walk: 1 / s expanded
};
struct UlqBwdJob {
  DType dt;
  const void* y_grad;
  const void* min_mask;
  const void* max_mask;
  const void* loss;
  void* x_grad;
  bool stream;  // non-temporal stores for x_grad
};
// The per-target kernels, instantiated for one dtype (picked by VisitFloatDType on the calling thread).
using UlqRangeFn = void (*)(const UlqJob& j, std::int64_t a, std::int64_t b);
using BwdChunkFn = void (*)(const UlqBwdJob& j, std::int64_t pos, std::int64_t n, float* tmin, float* tmax);
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// The fast path's per-call values (kFast): 1 / LEVELS and the domain.
struct UlqFast {
#if XQUANT_SIZELESS_VECTORS
  float rlevels_s;  // SVE: no vector members (and no fast division on Arm: never read)
  HWY_INLINE VF rlevels() const { return hn::Set(DF(), rlevels_s); }
#else
  VF rlevels_v;
  HWY_INLINE VF rlevels() const { return rlevels_v; }
#endif
  DivDomainV<DF> dom;
};

template <DType DT, bool kStream = false, bool kFast = false>
HWY_INLINE void UlqStep(const void* x, std::int64_t xi, void* const out[4], std::int64_t oi, VF s, VF lo, VF hi, VF lm,
                        VF levels, VF rs, const UlqFast& f) {
  const DF df;
  const VF v = LoadF<DT>(x, xi);
  const VF xc = NanMin(NanMax(v, lo), hi);  // xc = min(max(x, clip_lo), clip_hi)
  const auto min_mask = hn::Ge(v, lo);      // x >= clip_lo
  const auto max_mask = hn::Le(v, hi);      // x <= clip_hi
  VF raw, rx, loss;
#if XQUANT_HAVE_FAST_DIV
  if (kFast && HWY_LIKELY(hn::AllTrue(df, InDivDomain(df, xc, f.dom)))) {
    raw = DivCore(xc, s, rs);
    rx = RoundEven(raw);
    loss = DivCore(hn::Sub(rx, raw), levels, f.rlevels());
  } else
#endif
  {
    (void)rs;
    (void)f;
    raw = hn::Div(xc, s);                      // raw = xc / s
    rx = RoundEven(raw);                       // rx = rint(raw)
    loss = hn::Div(hn::Sub(rx, raw), levels);  // (rx - raw) / LEVELS
  }
  const VF one = hn::Set(df, 1.0f);
  StoreF<DT, kStream>(hn::Mul(rx, s), out[0], oi);  // y = rx * s
  StoreF<DT, kStream>(hn::IfThenElseZero(min_mask, one), out[1], oi);
  StoreF<DT, kStream>(hn::IfThenElseZero(max_mask, one), out[2], oi);
  StoreF<DT, kStream>(hn::IfThenElse(hn::And(min_mask, max_mask), loss, lm), out[3], oi);
}

// n elements at pos; parameters broadcast (pa == nullptr) or arrays aligned with the elements (pa[4]:
// 1 / s when fast).
template <DType DT, bool kFast>
void UlqSpanT(const UlqJob& j, std::int64_t pos, std::int64_t n, const float* const* pa, const ActsUlqParams& p) {
  const DF df;
  const VF levels = hn::Set(df, j.levels);
#if XQUANT_SIZELESS_VECTORS
  const UlqFast f{1.0f / j.levels, DivDomainV<DF>(j.dom)};
#else
  const UlqFast f{hn::Set(df, 1.0f / j.levels), DivDomainV<DF>(j.dom)};
#endif
  const float rs = 1.0f / p.s;
  auto param = [&](const float* const* a, int k, std::int64_t i, float sc) {
    return a ? hn::LoadU(df, a[k] + i) : hn::Set(df, sc);
  };
  auto step = [&]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
    UlqStep<DT, kStream, kFast>(j.x, pos + i, j.out, pos + i, param(pa, 0, i, p.s), param(pa, 1, i, p.clip_lo),
                                param(pa, 2, i, p.clip_hi), param(pa, 3, i, p.loss_m), levels,
                                kFast ? param(pa, 4, i, rs) : levels, f);
  };
  auto stage = [&](std::int64_t i, std::int64_t rem) {
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    auto param_in = [&](int k, float value) { return StageIn::Param(pa != nullptr ? pa[k] : nullptr, value); };
    StagedTail(i, rem,
               {{.base = j.x, .offset = pos, .es = es},
                param_in(0, p.s),
                param_in(1, p.clip_lo),
                param_in(2, p.clip_hi),
                param_in(3, p.loss_m),
                param_in(4, rs)},
               {{.base = j.out[0], .offset = pos, .es = es},
                {.base = j.out[1], .offset = pos, .es = es},
                {.base = j.out[2], .offset = pos, .es = es},
                {.base = j.out[3], .offset = pos, .es = es}},
               [XQUANT_BY_VALUE](const void* const* in, void* const* out, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 auto at = [&](int m) { return hn::LoadU(df, StagedF(in[m]) + k); };
                 UlqStep<DT, false, kFast>(in[0], k, out, k, at(1), at(2), at(3), at(4), levels, kFast ? at(5) : levels,
                                           f);
               });
  };
  // The four outputs share one alignment when streaming (checked by the caller), so out[0] decides.
  DriveSpan(n, j.stream, j.out[0], pos, dtype_size(DT), step, stage);
}

template <DType DT, bool kFast>
void UlqRangeF(const UlqJob& j, std::int64_t a, std::int64_t b) {
  j.walk->visit(
      a, b,
      [&](std::int64_t pos, std::int64_t n, std::int64_t c) { UlqSpanT<DT, kFast>(j, pos, n, nullptr, j.params[c]); },
      [&](std::int64_t pos, std::int64_t n, std::int64_t ph) {
        const float* pa[5] = {j.arr[0] + ph, j.arr[1] + ph, j.arr[2] + ph, j.arr[3] + ph,
                              j.rs ? j.rs + ph : j.arr[0] + ph};
        ActsUlqParams unused{};
        unused.s = 1.0f;
        UlqSpanT<DT, kFast>(j, pos, n, pa, unused);
      });
}

template <DType DT>
void UlqRangeT(const UlqJob& j, std::int64_t a, std::int64_t b) {
#if XQUANT_HAVE_FAST_DIV
  if (j.fast_div)
    UlqRangeF<DT, true>(j, a, b);
  else
#endif
    UlqRangeF<DT, false>(j, a, b);
  if (j.stream) hwy::FlushStream();
}

UlqRangeFn SelectUlqRange(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> UlqRangeFn { return &UlqRangeT<DT>; });
}

// Backward, one chunk [pos, pos + n) (n <= 1024): x_grad written, clamp terms to tmin / tmax.
template <DType DT, bool kStream = false>
HWY_INLINE void BwdStep(const void* const in[4], std::int64_t ii, void* xg, std::int64_t xi, float* tmin, float* tmax) {
  const DF df;
  const VF one = hn::Set(df, 1.0f);
  const VF dy = LoadF<DT>(in[0], ii), mn = LoadF<DT>(in[1], ii), mx = LoadF<DT>(in[2], ii), loss = LoadF<DT>(in[3], ii);
  // x_grad = (y_grad * min_mask) * max_mask: a one-term canonical sum, so NaN is the canonical quiet NaN
  const VF xg_v = hn::Mul(hn::Mul(dy, mn), mx);
  StoreF<DT, kStream>(hn::IfThenElse(hn::IsNaN(xg_v), hn::Set(df, std::numeric_limits<float>::quiet_NaN()), xg_v), xg,
                      xi);
  hn::StoreU(hn::Mul(dy, hn::Sub(hn::Sub(one, mn), loss)), df, tmin);  // y_grad * ((1 - min_mask) - loss)
  hn::StoreU(hn::Mul(dy, hn::Add(loss, hn::Sub(one, mx))), df, tmax);  // y_grad * (loss + (1 - max_mask))
}

template <DType DT>
void BwdChunkT(const UlqBwdJob& j, std::int64_t pos, std::int64_t n, float* tmin, float* tmax) {
  // Copies captured by value: the stores may alias anything as far as the compiler knows.
  const void* const in[4] = {j.y_grad, j.min_mask, j.max_mask, j.loss};
  void* const xg = j.x_grad;
  // The four inputs prefetched 2 KiB ahead when streaming on Intel (prefetch_ahead_wanted).
  const bool prefetch = j.stream && prefetch_ahead_wanted();
  auto step = [=]<bool kStream>(std::int64_t i) XQUANT_LAMBDA_INLINE {
    if (prefetch)
      for (const void* p : in) PrefetchAhead<DT>(p, pos + i);
    BwdStep<DT, kStream>(in, pos + i, xg, pos + i, tmin + i, tmax + i);
  };
  auto stage = [&](std::int64_t i, std::int64_t rem) {
    constexpr std::size_t es = DT == DType::float32 ? 4 : 2;
    StagedTail(i, rem,
               {{.base = in[0], .offset = pos, .es = es},
                {.base = in[1], .offset = pos, .es = es},
                {.base = in[2], .offset = pos, .es = es},
                {.base = in[3], .offset = pos, .es = es}},
               {{.base = xg, .offset = pos, .es = es}, {.base = tmin}, {.base = tmax}},
               [=](const void* const* sin, void* const* out, std::int64_t k) XQUANT_LAMBDA_INLINE {
                 BwdStep<DT>(sin, k, out[0], k, static_cast<float*>(out[1]) + k, static_cast<float*>(out[2]) + k);
               });
  };
  DriveSpan(n, j.stream, xg, pos, dtype_size(DT), step, stage);
}

BwdChunkFn SelectBwdChunk(DType dt) {
  return VisitFloatDType(dt, []<DType DT>() -> BwdChunkFn { return &BwdChunkT<DT>; });
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(SelectUlqRange);
HWY_EXPORT(SelectBwdChunk);

namespace {

std::int64_t plan_numel(const BroadcastPlan& p) {
  std::int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= p.shape[d];
  return n;
}

// x dense over the output (not broadcast): its strides are the row-major ones wherever the dim is > 1.
bool dense_over_output(const BroadcastPlan& p, const std::int64_t* stride) {
  std::int64_t expect = 1;
  for (int d = p.rank - 1; d >= 0; --d) {
    if (p.shape[d] > 1 && stride[d] != expect) return false;
    expect *= p.shape[d];
  }
  return true;
}

}  // namespace

bool cpu_acts_ulq(const ActsUlqArgs& a) {
  const BroadcastPlan& p = a.plan;
  const std::int64_t n = plan_numel(p);
  if (n == 0 || !dense_over_output(p, p.stride_x)) return false;
  // The clamp tensors vary over dims [d0, d1): channels = those dims, outer / inner around them.
  int d0 = p.rank, d1 = 0;
  for (int d = 0; d < p.rank; ++d)
    if (p.shape[d] > 1 && (p.stride_min[d] != 0 || p.stride_max[d] != 0)) {
      d0 = std::min(d0, d);
      d1 = d + 1;
    }
  std::int64_t C = 1, inner = 1;
  if (d0 < d1) {
    for (int d = d0; d < d1; ++d) C *= p.shape[d];
    for (int d = d1; d < p.rank; ++d) inner *= p.shape[d];
  } else {
    inner = n;
  }
  if (C > kMaxPeriod) return false;  // clamp tensors about as large as x: no reuse to exploit
  const UlqRangeFn range = HWY_DYNAMIC_DISPATCH(SelectUlqRange)(a.dt);  // throws for a dtype without kernel
  const float levels = acts_ulq_levels(a.num_bits);
  std::vector<ActsUlqParams> params(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    std::int64_t rem = c, omin = 0, omax = 0;
    for (int d = d1 - 1; d >= d0; --d) {
      const std::int64_t idx = rem % p.shape[d];
      rem /= p.shape[d];
      omin += idx * p.stride_min[d];
      omax += idx * p.stride_max[d];
    }
    params[static_cast<std::size_t>(c)] = init_acts_ulq_params(
        load_float(a.dt, a.clamp_min, omin), load_float(a.dt, a.clamp_max, omax), a.fixed_min, levels);
  }
  const ChannelWalk walk(ChannelLayout{n / (C * inner), C, inner});
  ParamStore store;  // the periodic walk's arrays (on the stack for small problems)
  float* arr[4] = {nullptr, nullptr, nullptr, nullptr};
  if (walk.period > 0) {
    const auto P = static_cast<std::size_t>(walk.period);
    float* s = store.allocate(4 * P);
    for (int k = 0; k < 4; ++k) {
      arr[k] = s + static_cast<std::size_t>(k) * P;
      walk.expand_into(arr[k], [&](std::int64_t c) {
        const auto& q = params[static_cast<std::size_t>(c)];
        return k == 0 ? q.s : k == 1 ? q.clip_lo : k == 2 ? q.clip_hi : q.loss_m;
      });
    }
  }
  const auto mod64 = [](const void* q) { return reinterpret_cast<std::uintptr_t>(q) % 64; };
  const bool same_alignment = mod64(a.y) == mod64(a.clamp_min_mask) && mod64(a.y) == mod64(a.clamp_max_mask) &&
                              mod64(a.y) == mod64(a.x_clamped_loss);
  const bool stream = same_alignment && use_stream(4 * n * static_cast<std::int64_t>(dtype_size(a.dt)));
  float s_min = std::numeric_limits<float>::infinity(), s_max = -s_min;
  for (const auto& q : params) {
    s_min = std::isnan(q.s) ? q.s : std::min(s_min, q.s);
    s_max = std::max(s_max, q.s);
  }
  FastDivDomain dom;
  // Only when forced: on the Intel models this loop gains nothing from the FMA quotients (docs/performance.md).
  if (fast_div_forced() && fast_div_domain(levels, levels).ok) dom = fast_div_domain(s_min, s_max, -100);
  std::vector<float> rs;
  if (dom.ok && walk.period > 0) {
    rs.assign(arr[0], arr[0] + walk.period);
    for (float& v : rs) v = 1.0f / v;
  }
  const UlqJob j{.dt = a.dt,
                 .x = a.x,
                 .out = {a.y, a.clamp_min_mask, a.clamp_max_mask, a.x_clamped_loss},
                 .levels = levels,
                 .walk = &walk,
                 .params = params.data(),
                 .arr = {arr[0], arr[1], arr[2], arr[3]},
                 .stream = stream,
                 .fast_div = dom.ok,
                 .dom = dom,
                 .rs = rs.empty() ? nullptr : rs.data()};
  parallel_ranges(n, std::int64_t{1} << 16, n * static_cast<std::int64_t>(dtype_size(a.dt)) * 5,
                  [&](std::int64_t b0, std::int64_t b1) { range(j, b0, b1); });
  return true;
}

namespace {

// How a clamp tensor broadcasts over the output: it varies exactly over the dims [d0, d1) (the others
// are broadcast), so the output is [outer, C, inner] with clamp element c <-> channel c and the positions
// summed into element c are (o, c, i) in increasing flat order: the term sequence n = o * inner + i.
struct ClampLayout : ChannelLayout {
  bool ok = false;  // the clamp tensor varies over one contiguous range of dims
};

ClampLayout clamp_layout(const BroadcastPlan& p, const std::int64_t* stride) {
  int d0 = p.rank, d1 = 0;
  for (int d = 0; d < p.rank; ++d)
    if (p.shape[d] > 1 && stride[d] != 0) {
      d0 = std::min(d0, d);
      d1 = d + 1;
    }
  ClampLayout l;
  l.ok = true;
  if (d0 >= d1) {  // a scalar clamp: one channel spanning everything
    l.inner = plan_numel(p);
    return l;
  }
  for (int d = d0; d < d1; ++d)
    if (p.shape[d] > 1 && stride[d] == 0) return ClampLayout{};  // broadcast inside its own range
  for (int d = 0; d < d0; ++d) l.outer *= p.shape[d];
  for (int d = d0; d < d1; ++d) l.channels *= p.shape[d];
  for (int d = d1; d < p.rank; ++d) l.inner *= p.shape[d];
  return l;
}

// One fused pass over the layout: x_grad for every element (rewritten with the same values if a
// second pass runs) and the chunk values of the requested sums, chunk k of channel c = terms
// [1024 k, 1024 (k + 1)) of its sequence; every (c, k) is independent, so they run in parallel.
void fused_pass(BwdChunkFn bwd_chunk, const UlqBwdJob& j, const ClampLayout& l, bool sum_min, bool sum_max,
                std::vector<double>& vmin, std::vector<double>& vmax, std::int64_t bytes) {
  const std::int64_t len = l.outer * l.inner, chunks = (len + kSumChunk - 1) / kSumChunk;
  vmin.assign(static_cast<std::size_t>(l.channels * chunks), 0.0);
  vmax.assign(vmin.size(), 0.0);
  const int t = threads_for(bytes);
#pragma omp parallel num_threads(t)
  {
    std::vector<float> tmin(static_cast<std::size_t>(kSumChunk)), tmax(tmin.size());
#pragma omp for schedule(static)
    for (std::int64_t ck = 0; ck < l.channels * chunks; ++ck) {
      const std::int64_t c = ck / chunks, k = ck % chunks;
      std::int64_t n = k * kSumChunk, filled = 0;
      const std::int64_t end = std::min(len, n + kSumChunk);
      while (n < end) {
        const std::int64_t o = n / l.inner, i = n % l.inner, run = std::min(end - n, l.inner - i);
        bwd_chunk(j, (o * l.channels + c) * l.inner + i, run, tmin.data() + filled, tmax.data() + filled);
        filled += run;
        n += run;
      }
      const auto at = static_cast<std::size_t>(ck);
      if (sum_min && sum_max)
        cpu_chunk_values(tmin.data(), tmax.data(), filled, &vmin[at], &vmax[at]);
      else if (sum_min)
        vmin[at] = cpu_chunk_value(tmin.data(), filled);
      else if (sum_max)
        vmax[at] = cpu_chunk_value(tmax.data(), filled);
    }
    if (j.stream) hwy::FlushStream();  // x_grad's non-temporal stores
  }
}

}  // namespace

bool cpu_acts_ulq_backward(const ActsUlqBackwardArgs& a) {
  const BroadcastPlan& p = a.plan;
  const std::int64_t n = plan_numel(p);
  const ClampLayout lmin = clamp_layout(p, p.stride_min), lmax = clamp_layout(p, p.stride_max);
  // Short runs (a clamp varying along the innermost dims) gain nothing from the chunk walk; x broadcast
  // (x_grad is itself a reduction) is rare. Both, and empty outputs (the clamp tensors may then be empty
  // too), are declined.
  auto fast = [](const ClampLayout& l) { return l.ok && (l.channels == 1 || l.inner >= kMinRun); };
  if (n == 0 || !dense_over_output(p, p.stride_x) || !fast(lmin) || !fast(lmax)) return false;
  const BwdChunkFn bwd_chunk = HWY_DYNAMIC_DISPATCH(SelectBwdChunk)(a.dt);  // throws for a dtype without kernel
  const float floor_max = acts_ulq_floor_max(acts_ulq_levels(a.num_bits));  // LEVELS * EPS
  const UlqBwdJob j{.dt = a.dt,
                    .y_grad = a.y_grad,
                    .min_mask = a.clamp_min_mask,
                    .max_mask = a.clamp_max_mask,
                    .loss = a.x_clamped_loss,
                    .x_grad = a.x_grad,
                    .stream = use_stream(n * static_cast<std::int64_t>(dtype_size(a.dt)))};
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(a.dt)) * 5;
  std::vector<double> vmin, vmax, unused;
  if (static_cast<const ChannelLayout&>(lmin) == static_cast<const ChannelLayout&>(lmax)) {
    fused_pass(bwd_chunk, j, lmin, true, true, vmin, vmax, bytes);
  } else {  // different layouts: one pass per clamp tensor (the second rewrites x_grad identically)
    fused_pass(bwd_chunk, j, lmin, true, false, vmin, unused, bytes);
    fused_pass(bwd_chunk, j, lmax, false, true, unused, vmax, bytes);
  }
  // clamp_min_grad[c] = sum, 0 where fixed_min or clamp_min[c] > 0; clamp_max_grad[c] = sum, 0 where
  // clamp_max[c] < LEVELS * EPS.
  const std::int64_t cmin = (lmin.outer * lmin.inner + kSumChunk - 1) / kSumChunk;
  for (std::int64_t c = 0; c < lmin.channels; ++c) {
    const bool zero = a.fixed_min || load_float(a.dt, a.clamp_min, c) > 0.0f;
    store_float(a.dt, a.clamp_min_grad, c, zero ? 0.0f : finish_chunk_sum(vmin.data() + c * cmin, cmin));
  }
  const std::int64_t cmax = (lmax.outer * lmax.inner + kSumChunk - 1) / kSumChunk;
  for (std::int64_t c = 0; c < lmax.channels; ++c) {
    const bool zero = load_float(a.dt, a.clamp_max, c) < floor_max;
    store_float(a.dt, a.clamp_max_grad, c, zero ? 0.0f : finish_chunk_sum(vmax.data() + c * cmax, cmax));
  }
  return true;
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
