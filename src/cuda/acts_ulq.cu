// CUDA backend: ActsULQ forward and backward (SPEC 5).
// Per-element math from src/params/ (the XQ_HD code the reference runs), loads / stores / saturation and
// the launch helpers from cuda/common.cuh. Compiled with -fmad=false --prec-div=true --prec-sqrt=true
// --ftz=false (CMakeLists.txt): every float operation is the single IEEE operation of the reference.
#include "cuda/common.cuh"
#include "cuda/cuda.hpp"

namespace xquant::detail::cuda {

namespace {

// ActsULQ (SPEC 5). Forward: per output element, the operands' broadcast offsets from the BroadcastPlan.
__global__ void acts_ulq_kernel(ActsUlqArgs a, std::int64_t n) {
  const float levels = acts_ulq_levels(a.num_bits);
  const BroadcastPlan& plan = a.plan;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, ix = 0, imin = 0, imax = 0;
    for (int d = plan.rank - 1; d >= 0; --d) {
      const std::int64_t k = rest % plan.shape[d];
      rest /= plan.shape[d];
      ix += k * plan.stride_x[d];
      imin += k * plan.stride_min[d];
      imax += k * plan.stride_max[d];
    }
    const ActsUlqParams p = init_acts_ulq_params(hd_load_float(a.dt, a.clamp_min, imin),
                                                 hd_load_float(a.dt, a.clamp_max, imax), a.fixed_min, levels);
    const ActsUlqElement e = acts_ulq_element(hd_load_float(a.dt, a.x, ix), p, levels);
    // NaN results as the reference's usual NaN (the canonical 0x7FC00000, from NaN operands); x86's default
    // NaN 0xFFC00000 of an invalid operation (Inf clamps) is not reproduced (docs/semantics.md 1.11).
    hd_store_float(a.dt, a.y, i, hd_canonical_nan(e.y));
    hd_store_float(a.dt, a.clamp_min_mask, i, e.clamp_min_mask);
    hd_store_float(a.dt, a.clamp_max_mask, i, e.clamp_max_mask);
    hd_store_float(a.dt, a.x_clamped_loss, i, hd_canonical_nan(e.x_clamped_loss));
  }
}

}  // namespace

void acts_ulq(const ActsUlqArgs& a) {
  std::int64_t n = 1;
  for (int d = 0; d < a.plan.rank; ++d) n *= a.plan.shape[d];
  if (n == 0) return;
  acts_ulq_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a, n);
  check_launch("acts_ulq_kernel");
}

namespace {

// Backward: each gradient element t of a target operand (x, clamp_min or clamp_max) is the canonical sum
// of its terms over the output positions that broadcast onto it, in increasing flat output index (as the
// reference's Preimage walk). The target's own dims ("kept") fix the first position; its broadcast dims
// ("free") enumerate the rest, row-major.
struct Reduction {
  int kept_rank, free_rank;
  std::int64_t kept_extent[kMaxRank], kept_stride[kMaxRank];  // output strides
  std::int64_t free_extent[kMaxRank], free_stride[kMaxRank];
  std::int64_t targets;  // product of kept extents
  std::int64_t terms;    // product of free extents (per target)
};

Reduction reduction_of(const BroadcastPlan& plan, const std::int64_t* stride) {
  Reduction r{};
  std::int64_t out_stride[kMaxRank];
  std::int64_t acc = 1;
  for (int d = plan.rank - 1; d >= 0; --d) {
    out_stride[d] = acc;
    acc *= plan.shape[d];
  }
  r.targets = 1;
  r.terms = 1;
  for (int d = 0; d < plan.rank; ++d) {
    if (stride[d] == 0) {
      r.free_extent[r.free_rank] = plan.shape[d];
      r.free_stride[r.free_rank++] = out_stride[d];
      r.terms *= plan.shape[d];
    } else {
      r.kept_extent[r.kept_rank] = plan.shape[d];
      r.kept_stride[r.kept_rank++] = out_stride[d];
      r.targets *= plan.shape[d];
    }
  }
  return r;
}

__device__ inline std::int64_t unravel(std::int64_t v, int rank, const std::int64_t* extent,
                                       const std::int64_t* stride) {
  std::int64_t o = 0;
  for (int k = rank - 1; k >= 0; --k) {
    o += (v % extent[k]) * stride[k];
    v /= extent[k];
  }
  return o;
}

enum class UlqGrad { x, clamp_min, clamp_max };

struct UlqGradArgs {
  DType dt;
  const void* y_grad;
  const void* min_mask;
  const void* max_mask;
  const void* loss;
};

template <UlqGrad G>
__device__ inline float ulq_term(const UlqGradArgs& a, std::int64_t o) {
  const float g = hd_load_float(a.dt, a.y_grad, o);
  if (G == UlqGrad::x)  // (y_grad * min_mask) * max_mask
    return __fmul_rn(__fmul_rn(g, hd_load_float(a.dt, a.min_mask, o)), hd_load_float(a.dt, a.max_mask, o));
  if (G == UlqGrad::clamp_min)  // y_grad * ((1 - min_mask) - x_clamped_loss)
    return __fmul_rn(g, __fsub_rn(__fsub_rn(1.0f, hd_load_float(a.dt, a.min_mask, o)), hd_load_float(a.dt, a.loss, o)));
  // y_grad * (x_clamped_loss + (1 - max_mask))
  return __fmul_rn(g, __fadd_rn(hd_load_float(a.dt, a.loss, o), __fsub_rn(1.0f, hd_load_float(a.dt, a.max_mask, o))));
}

template <UlqGrad G>
__global__ void ulq_grad_chunks_kernel(UlqGradArgs a, Reduction r, std::int64_t chunks_per_target,
                                       double* chunk_values) {
  const std::int64_t groups = r.targets * chunks_per_target;
  const int lane = threadIdx.x % kLanes;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  const std::int64_t warp = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  for (std::int64_t g0 = warp * 2; g0 < groups; g0 += warps * 2) {
    const std::int64_t g = g0 + (threadIdx.x % 32) / kLanes;
    double acc = -0.0;
    if (g < groups) {
      const std::int64_t t = g / chunks_per_target, j = g % chunks_per_target;
      const std::int64_t base = unravel(t, r.kept_rank, r.kept_extent, r.kept_stride);
      for (int m = 0; m < kChunk / kLanes; ++m) {
        const std::int64_t q = j * kChunk + m * kLanes + lane;
        if (q >= r.terms) break;
        const float term = ulq_term<G>(a, base + unravel(q, r.free_rank, r.free_extent, r.free_stride));
        acc = __dadd_rn(acc, static_cast<double>(term));
      }
    }
    for (int w = kLanes / 2; w >= 1; w /= 2) acc = __dadd_rn(acc, __shfl_down_sync(0xFFFFFFFFu, acc, w, kLanes));
    if (lane == 0 && g < groups) chunk_values[g] = acc;
  }
}

// Totals in chunk order; `zero` decides the elements whose gradient is 0 (fixed_min / clamp_min > 0, or
// clamp_max < LEVELS * EPS), read from `clamp` (nullptr: none).
__global__ void ulq_grad_total_kernel(const double* chunk_values, std::int64_t targets, std::int64_t chunks_per_target,
                                      DType dt, void* grad, UlqGrad which, bool fixed_min, const void* clamp,
                                      float floor_max) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < targets;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    bool zero = false;
    if (which == UlqGrad::clamp_min) zero = fixed_min || hd_load_float(dt, clamp, t) > 0.0f;
    if (which == UlqGrad::clamp_max) zero = hd_load_float(dt, clamp, t) < floor_max;
    float r = 0.0f;
    if (!zero && chunks_per_target > 0) {
      double total = -0.0;
      for (std::int64_t j = 0; j < chunks_per_target; ++j)
        total = __dadd_rn(total, chunk_values[t * chunks_per_target + j]);
      r = __double2float_rn(total);
      if (hd_isnan(r)) r = hd_qnan();
    }
    hd_store_float(dt, grad, t, r);
  }
}

// One term per gradient element (nothing broadcast onto it): the canonical sum of one term is that term
// (NaN: the canonical quiet NaN), so the chunk machinery reduces to an elementwise pass.
template <UlqGrad G>
__global__ void ulq_grad_single_kernel(UlqGradArgs a, Reduction r, void* grad, bool fixed_min, const void* clamp,
                                       float floor_max) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < r.targets;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    bool zero = false;
    if (G == UlqGrad::clamp_min) zero = fixed_min || hd_load_float(a.dt, clamp, t) > 0.0f;
    if (G == UlqGrad::clamp_max) zero = hd_load_float(a.dt, clamp, t) < floor_max;
    float v = 0.0f;
    if (!zero) {
      v = ulq_term<G>(a, unravel(t, r.kept_rank, r.kept_extent, r.kept_stride) +
                             unravel(0, r.free_rank, r.free_extent, r.free_stride));
      if (hd_isnan(v)) v = hd_qnan();
    }
    hd_store_float(a.dt, grad, t, v);
  }
}

template <UlqGrad G>
void ulq_grad(const ActsUlqBackwardArgs& a, const std::int64_t* stride, void* grad, const void* clamp) {
  const Reduction r = reduction_of(a.plan, stride);
  if (r.targets == 0) return;
  if (r.terms == 1) {
    const UlqGradArgs ga{a.dt, a.y_grad, a.clamp_min_mask, a.clamp_max_mask, a.x_clamped_loss};
    ulq_grad_single_kernel<G><<<grid_for(r.targets, kBlock), kBlock, 0, stream()>>>(
        ga, r, grad, a.fixed_min, clamp, acts_ulq_floor_max(acts_ulq_levels(a.num_bits)));
    check_launch("ulq_grad_single_kernel");
    return;
  }
  const std::int64_t cpt = (r.terms + kChunk - 1) / kChunk;
  const UlqGradArgs ga{a.dt, a.y_grad, a.clamp_min_mask, a.clamp_max_mask, a.x_clamped_loss};
  double* chunk_values = nullptr;
  const std::int64_t groups = r.targets * cpt;
  if (groups > 0) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&chunk_values), static_cast<std::size_t>(groups) * sizeof(double),
                          stream()),
          "cudaMallocAsync (acts_ulq_backward chunk sums)");
    ulq_grad_chunks_kernel<G><<<grid_for(groups, kBlock / kLanes), kBlock, 0, stream()>>>(ga, r, cpt, chunk_values);
  }
  ulq_grad_total_kernel<<<grid_for(r.targets, 128), 128, 0, stream()>>>(
      chunk_values, r.targets, cpt, a.dt, grad, G, a.fixed_min, clamp, acts_ulq_floor_max(acts_ulq_levels(a.num_bits)));
  const cudaError_t e = cudaGetLastError();
  if (chunk_values != nullptr) (void)cudaFreeAsync(chunk_values, stream());
  check(e, "launching the acts_ulq_backward sums");
}

}  // namespace

void acts_ulq_backward(const ActsUlqBackwardArgs& a) {
  ulq_grad<UlqGrad::x>(a, a.plan.stride_x, a.x_grad, nullptr);
  ulq_grad<UlqGrad::clamp_min>(a, a.plan.stride_min, a.clamp_min_grad, a.clamp_min);
  ulq_grad<UlqGrad::clamp_max>(a, a.plan.stride_max, a.clamp_max_grad, a.clamp_max);
}

}  // namespace xquant::detail::cuda
