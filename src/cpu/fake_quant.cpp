// cpu backend: fake tensor quantization forward and backward (SPEC section 1), bit-identical to
// src/ref/fake_quant.cpp.
//
// Layout [outer, C, inner]. Two element walks:
//  - runs:     inner >= kMinRun: each (o, c) row is a run with scalar (broadcast) parameters;
//  - periodic: small inner (last axis: inner == 1): parameters are expanded to a period P = C * inner
//              (replicated to at least kMinPeriod elements) and loaded as vectors; element i uses phase
//              i % P.
// Backward sums (grad_amax) follow the canonical chunks: per-tensor and runs layouts compute each chunk
// of a channel's term sequence independently (in parallel) and add chunk values in order; the last-axis
// layout streams rows and keeps 16 double lanes per channel (all channels share lane o % 16).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/fake_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstring>
#include <vector>

#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "ref/ref.hpp"

namespace xquant::detail {
#ifndef XQUANT_CPU_FAKE_QUANT_ONCE
#define XQUANT_CPU_FAKE_QUANT_ONCE
// Parameters as arrays over a period (periodic walk) or per channel (runs walk).
struct FqArrays {
  std::vector<float> scale, lo, hi, zero, glo, ghi, ratio;
  void resize(std::size_t n) {
    for (auto* v : {&scale, &lo, &hi, &zero, &glo, &ghi, &ratio}) v->resize(n);
  }
  void set(std::size_t i, const FakeQuantParams& p) {
    scale[i] = p.scale;
    lo[i] = p.min_bound;
    hi[i] = p.max_bound;
    zero[i] = p.zero ? 1.0f : 0.0f;
    glo[i] = p.grad_lo;
    ghi[i] = p.grad_hi;
    ratio[i] = p.ratio;
  }
};

struct FqJob {
  DType dt;
  const void* x;
  void* y;            // forward output / backward grad_in
  const void* g;      // backward: grad_out
  std::int64_t C, inner;
  const FakeQuantParams* params;  // runs walk
  std::int64_t period;            // periodic walk (0: runs)
  const FqArrays* arr;
};
// grad_amax term parameters: broadcast scalars, or per-element arrays {glo, ghi, ratio} when pa[0] != null.
struct TermParams {
  float glo, ghi, ratio;
  const float* pa[3];
};
inline constexpr std::int64_t kMinRun = 64;
inline constexpr std::int64_t kMinPeriod = 1024;
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// out = clamp(rint(x * scale), min_bound, max_bound) / scale; zero channels give 0 (NaN stays NaN).
HWY_INLINE VF FqForward(VF v, VF s, VF lo, VF hi) {
  const VF q = ClampKeepNaN(RoundEven(hn::Mul(v, s)), lo, hi);
  return hn::Div(q, s);
}
HWY_INLINE VF FqZero(VF v) { return hn::IfThenElse(hn::IsNaN(v), v, hn::Zero(DF())); }

// One step of Lanes(DF) elements. Parameter pointers point at the phase of element 0 (periodic) or are
// null (runs: broadcast vectors passed in).
template <DType DT, bool kBackward>
struct FqStep {
  // forward, broadcast parameters
  static HWY_INLINE void Fwd(const void* x, void* y, std::int64_t i, VF s, VF lo, VF hi, bool zero) {
    const VF v = LoadF<DT>(x, i);
    StoreF<DT>(zero ? FqZero(v) : FqForward(v, s, lo, hi), y, i);
  }
  // forward, vector parameters
  static HWY_INLINE void FwdVec(const void* x, void* y, std::int64_t i, const FqArrays& a, std::int64_t ph) {
    const DF df;
    const VF v = LoadF<DT>(x, i);
    const VF r = FqForward(v, hn::LoadU(df, a.scale.data() + ph), hn::LoadU(df, a.lo.data() + ph),
                           hn::LoadU(df, a.hi.data() + ph));
    const auto z = hn::Gt(hn::LoadU(df, a.zero.data() + ph), hn::Zero(df));
    StoreF<DT>(hn::IfThenElse(z, FqZero(v), r), y, i);
  }
  // backward grad_in = grad_out inside [glo, ghi], else 0
  static HWY_INLINE void Bwd(const void* g, const void* x, void* gx, std::int64_t i, VF glo, VF ghi) {
    const VF v = LoadF<DT>(x, i);
    const auto inside = hn::And(hn::Ge(v, glo), hn::Le(v, ghi));
    StoreF<DT>(hn::IfThenElseZero(inside, LoadF<DT>(g, i)), gx, i);
  }
};

// Tail staging: copies n (< Lanes) elements of each operand into zero-padded stack buffers, runs one
// vector step on them and copies the valid outputs back. Never reads or writes past the caller's data.
struct Stage {
  alignas(64) unsigned char x[kMaxLanes * 4] = {}, g[kMaxLanes * 4] = {}, y[kMaxLanes * 4] = {};
};

template <DType DT>
void FqRun(const FqJob& j, std::int64_t pos, std::int64_t n, const FakeQuantParams& p) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const VF s = hn::Set(df, p.scale), lo = hn::Set(df, p.min_bound), hi = hn::Set(df, p.max_bound);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) FqStep<DT, false>::Fwd(j.x, j.y, pos + i, s, lo, hi, p.zero);
  if (i < n) {
    const std::size_t es = dtype_size(DT), bytes = static_cast<std::size_t>(n - i) * es;
    Stage st;
    std::memcpy(st.x, static_cast<const unsigned char*>(j.x) + (pos + i) * static_cast<std::int64_t>(es), bytes);
    FqStep<DT, false>::Fwd(st.x, st.y, 0, s, lo, hi, p.zero);
    std::memcpy(static_cast<unsigned char*>(j.y) + (pos + i) * static_cast<std::int64_t>(es), st.y, bytes);
  }
}

template <DType DT>
void FqPeriodic(const FqJob& j, std::int64_t pos, std::int64_t n, std::int64_t ph) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) FqStep<DT, false>::FwdVec(j.x, j.y, pos + i, *j.arr, ph + i);
  if (i < n) {
    const std::size_t es = dtype_size(DT), bytes = static_cast<std::size_t>(n - i) * es;
    Stage st;
    FqArrays a;  // the remaining parameters, padded
    a.resize(kMaxLanes);
    for (std::int64_t k = 0; k < n - i; ++k) {
      const auto src = static_cast<std::size_t>(ph + i + k), dst = static_cast<std::size_t>(k);
      a.scale[dst] = j.arr->scale[src];
      a.lo[dst] = j.arr->lo[src];
      a.hi[dst] = j.arr->hi[src];
      a.zero[dst] = j.arr->zero[src];
    }
    std::memcpy(st.x, static_cast<const unsigned char*>(j.x) + (pos + i) * static_cast<std::int64_t>(es), bytes);
    FqStep<DT, false>::FwdVec(st.x, st.y, 0, a, 0);
    std::memcpy(static_cast<unsigned char*>(j.y) + (pos + i) * static_cast<std::int64_t>(es), st.y, bytes);
  }
}

template <DType DT>
void FqBwdRun(const FqJob& j, std::int64_t pos, std::int64_t n, float glo_s, float ghi_s, const float* glo_a,
              const float* ghi_a) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF glo = glo_a ? hn::LoadU(df, glo_a + i) : hn::Set(df, glo_s);
    const VF ghi = ghi_a ? hn::LoadU(df, ghi_a + i) : hn::Set(df, ghi_s);
    FqStep<DT, true>::Bwd(j.g, j.x, j.y, pos + i, glo, ghi);
  }
  if (i < n) {
    const std::size_t es = dtype_size(DT), bytes = static_cast<std::size_t>(n - i) * es;
    const std::int64_t off = (pos + i) * static_cast<std::int64_t>(es);
    Stage st;
    float plo[kMaxLanes] = {}, phi[kMaxLanes] = {};
    for (std::int64_t k = 0; k < n - i; ++k) {
      plo[k] = glo_a ? glo_a[i + k] : glo_s;
      phi[k] = ghi_a ? ghi_a[i + k] : ghi_s;
    }
    std::memcpy(st.x, static_cast<const unsigned char*>(j.x) + off, bytes);
    std::memcpy(st.g, static_cast<const unsigned char*>(j.g) + off, bytes);
    FqStep<DT, true>::Bwd(st.g, st.x, st.y, 0, hn::LoadU(df, plo), hn::LoadU(df, phi));
    std::memcpy(static_cast<unsigned char*>(j.y) + off, st.y, bytes);
  }
}

// Elements [a, b) of the job, forward or backward (grad_in only).
template <DType DT>
void FqRangeT(const FqJob& j, std::int64_t a, std::int64_t b, bool backward) {
  std::int64_t pos = a;
  while (pos < b) {
    if (j.period > 0) {
      const std::int64_t ph = pos % j.period;
      const std::int64_t n = std::min(b - pos, j.period - ph);
      if (backward)
        FqBwdRun<DT>(j, pos, n, 0.f, 0.f, j.arr->glo.data() + ph, j.arr->ghi.data() + ph);
      else
        FqPeriodic<DT>(j, pos, n, ph);
      pos += n;
    } else {
      const std::int64_t row = pos / j.inner, off = pos % j.inner;
      const std::int64_t n = std::min(b - pos, j.inner - off);
      const FakeQuantParams& p = j.params[row % j.C];
      if (backward)
        FqBwdRun<DT>(j, pos, n, p.grad_lo, p.grad_hi, nullptr, nullptr);
      else
        FqRun<DT>(j, pos, n, p);
      pos += n;
    }
  }
}

void FqRange(const FqJob& j, std::int64_t a, std::int64_t b, bool backward) {
  switch (j.dt) {
    case DType::float16: return FqRangeT<DType::float16>(j, a, b, backward);
    case DType::bfloat16: return FqRangeT<DType::bfloat16>(j, a, b, backward);
    default: return FqRangeT<DType::float32>(j, a, b, backward);
  }
}

// grad_amax terms grad_out * (x > ghi ? 1 : x < glo ? ratio : 0) for n contiguous elements, written to
// t[0, n). Parameters are broadcast scalars, or per-element arrays when `pa` is non-null
// (pa = {glo, ghi, ratio} arrays aligned with the elements).
template <DType DT>
void FqTermsT(const void* g, const void* x, std::int64_t pos, std::int64_t n, const TermParams& tp, float* t) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const VF one = hn::Set(df, 1.0f);
  const bool vec = tp.pa[0] != nullptr;
  auto term = [&](VF gv, VF v, VF glo, VF ghi, VF ratio) {
    const VF f = hn::IfThenElse(hn::Gt(v, ghi), one, hn::IfThenElseZero(hn::Lt(v, glo), ratio));
    return hn::Mul(gv, f);
  };
  auto param = [&](int k, std::int64_t i, float s) { return vec ? hn::LoadU(df, tp.pa[k] + i) : hn::Set(df, s); };
  std::int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(term(LoadF<DT>(g, pos + i), LoadF<DT>(x, pos + i), param(0, i, tp.glo), param(1, i, tp.ghi),
                    param(2, i, tp.ratio)),
               df, t + i);
  if (i < n) {
    const std::size_t es = dtype_size(DT), bytes = static_cast<std::size_t>(n - i) * es;
    const std::int64_t off = (pos + i) * static_cast<std::int64_t>(es);
    Stage st;
    std::memcpy(st.x, static_cast<const unsigned char*>(x) + off, bytes);
    std::memcpy(st.g, static_cast<const unsigned char*>(g) + off, bytes);
    HWY_ALIGN float pv[3][kMaxLanes] = {};
    const float sc[3] = {tp.glo, tp.ghi, tp.ratio};
    for (int k = 0; k < 3; ++k)
      for (std::int64_t m = 0; m < n - i; ++m) pv[k][m] = vec ? tp.pa[k][i + m] : sc[k];
    HWY_ALIGN float tmp[kMaxLanes];
    hn::Store(term(LoadF<DT>(st.g, 0), LoadF<DT>(st.x, 0), hn::Load(df, pv[0]), hn::Load(df, pv[1]), hn::Load(df, pv[2])),
              df, tmp);
    std::memcpy(t + i, tmp, static_cast<std::size_t>(n - i) * sizeof(float));
  }
}

void FqTerms(DType dt, const void* g, const void* x, std::int64_t pos, std::int64_t n, const TermParams& tp, float* t) {
  switch (dt) {
    case DType::float16: return FqTermsT<DType::float16>(g, x, pos, n, tp, t);
    case DType::bfloat16: return FqTermsT<DType::bfloat16>(g, x, pos, n, tp, t);
    default: return FqTermsT<DType::float32>(g, x, pos, n, tp, t);
  }
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(FqRange);
HWY_EXPORT(FqTerms);

namespace {

// Elementwise grain: a multiple of every vector length, large enough to amortize scheduling.
constexpr std::int64_t kGrain = std::int64_t{1} << 16;

FqJob make_job(DType dt, const void* x, void* y, const void* g, std::int64_t channels, std::int64_t inner,
               const FakeQuantParams* params, FqArrays& arr, bool backward) {
  FqJob j{dt, x, y, g, channels, inner, params, 0, &arr};
  const std::int64_t period = channels * inner;
  if (inner < kMinRun && period <= (std::int64_t{1} << 20)) {
    // Periodic walk: expand per-channel parameters to the period, replicated to >= kMinPeriod.
    const std::int64_t reps = std::max<std::int64_t>(1, (kMinPeriod + period - 1) / period);
    j.period = period * reps;
    arr.resize(static_cast<std::size_t>(j.period));
    for (std::int64_t k = 0; k < j.period; ++k) arr.set(static_cast<std::size_t>(k), params[(k / inner) % channels]);
  }
  (void)backward;
  return j;
}

void run_elementwise(const FqJob& j, std::int64_t n, bool backward) {
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(j.dt)) * (backward ? 3 : 2);
  parallel_ranges(n, kGrain, bytes, [&](std::int64_t a, std::int64_t b) { HWY_DYNAMIC_DISPATCH(FqRange)(j, a, b, backward); });
}

// grad_amax[c] for every channel, in the canonical order of channel c's term sequence n = o * inner + i.
void amax_sums(DType dt, const void* g, const void* x, std::int64_t outer, std::int64_t C, std::int64_t inner,
               const FakeQuantParams* params, float* grad_amax) {
  const std::int64_t len = outer * inner;  // terms per channel
  const std::int64_t chunks = (len + kSumChunk - 1) / kSumChunk;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(dt));
  if (inner == 1 && C > 1) {
    // Last axis: row o holds one term of every channel, all in lane o % 16 of chunk o / 1024. Rows of a
    // chunk are streamed in order; each chunk (1024 rows) is independent.
    std::vector<double> chunk_vals(static_cast<std::size_t>(chunks * C));
    std::vector<float> glo(static_cast<std::size_t>(C)), ghi(glo.size()), ratio(glo.size());
    for (std::int64_t c = 0; c < C; ++c) {
      glo[static_cast<std::size_t>(c)] = params[c].grad_lo;
      ghi[static_cast<std::size_t>(c)] = params[c].grad_hi;
      ratio[static_cast<std::size_t>(c)] = params[c].ratio;
    }
    const TermParams tp{0.f, 0.f, 0.f, {glo.data(), ghi.data(), ratio.data()}};
    const int t = threads_for(len * C * es * 2);
#pragma omp parallel num_threads(t)
    {
      std::vector<double> lanes(static_cast<std::size_t>(kSumLanes * C));
      std::vector<float> terms(static_cast<std::size_t>(C));
#pragma omp for schedule(static)
      for (std::int64_t k = 0; k < chunks; ++k) {
        std::fill(lanes.begin(), lanes.end(), -0.0);
        const std::int64_t o_end = std::min(outer, (k + 1) * kSumChunk);
        for (std::int64_t o = k * kSumChunk; o < o_end; ++o) {
          double* lane = lanes.data() + (o % kSumLanes) * C;
          HWY_DYNAMIC_DISPATCH(FqTerms)(dt, g, x, o * C, C, tp, terms.data());
          for (std::int64_t c = 0; c < C; ++c) lane[c] += static_cast<double>(terms[static_cast<std::size_t>(c)]);
        }
        for (std::int64_t c = 0; c < C; ++c) {
          double l[kSumLanes];
          for (std::int64_t m = 0; m < kSumLanes; ++m) l[m] = lanes[static_cast<std::size_t>(m * C + c)];
          for (std::int64_t w = kSumLanes / 2; w >= 1; w /= 2)
            for (std::int64_t i = 0; i < w; ++i) l[i] += l[i + w];
          chunk_vals[static_cast<std::size_t>(k * C + c)] = l[0];
        }
      }
    }
    std::vector<double> col(static_cast<std::size_t>(chunks));
    for (std::int64_t c = 0; c < C; ++c) {
      for (std::int64_t k = 0; k < chunks; ++k) col[static_cast<std::size_t>(k)] = chunk_vals[static_cast<std::size_t>(k * C + c)];
      grad_amax[c] = finish_chunk_sum(col.data(), chunks);
    }
    return;
  }
  // General: chunk k of channel c covers terms [k * 1024, ...) of its sequence; those terms lie in runs of
  // `inner` contiguous elements. Every (c, k) is independent.
  std::vector<double> chunk_vals(static_cast<std::size_t>(chunks * C));
  const int t = threads_for(len * C * es * 2);
#pragma omp parallel num_threads(t)
  {
    std::vector<float> terms(static_cast<std::size_t>(kSumChunk));
#pragma omp for schedule(static)
    for (std::int64_t ck = 0; ck < chunks * C; ++ck) {
      const std::int64_t c = ck / chunks, k = ck % chunks;
      const FakeQuantParams& p = params[c];
      std::int64_t n = k * kSumChunk;
      const std::int64_t n_end = std::min(len, n + kSumChunk);
      std::int64_t filled = 0;
      while (n < n_end) {
        const std::int64_t o = n / inner, i = n % inner;
        const std::int64_t run = std::min(n_end - n, inner - i);
        const TermParams tp{p.grad_lo, p.grad_hi, p.ratio, {nullptr, nullptr, nullptr}};
        HWY_DYNAMIC_DISPATCH(FqTerms)(dt, g, x, (o * C + c) * inner + i, run, tp, terms.data() + filled);
        filled += run;
        n += run;
      }
      chunk_vals[static_cast<std::size_t>(c * chunks + k)] = cpu_chunk_value(terms.data(), filled);
    }
  }
  for (std::int64_t c = 0; c < C; ++c) grad_amax[c] = finish_chunk_sum(chunk_vals.data() + c * chunks, chunks);
}

}  // namespace

void cpu_fake_quant(DType dt, const void* x, void* y, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                    const FakeQuantParams* params) {
  FqArrays arr;
  const FqJob j = make_job(dt, x, y, nullptr, channels, inner, params, arr, false);
  run_elementwise(j, outer * channels * inner, false);
}

void cpu_fake_quant_backward(DType dt, const void* grad_out, const void* x, void* grad_in, std::int64_t outer,
                             std::int64_t channels, std::int64_t inner, const FakeQuantParams* params,
                             float* grad_amax) {
  // The sums read x and grad_out before grad_in is written: grad_in may alias either of them.
  if (grad_amax != nullptr) amax_sums(dt, grad_out, x, outer, channels, inner, params, grad_amax);
  FqArrays arr;
  const FqJob j = make_job(dt, x, grad_in, grad_out, channels, inner, params, arr, true);
  run_elementwise(j, outer * channels * inner, true);
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
