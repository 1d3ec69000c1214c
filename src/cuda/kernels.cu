// The CUDA kernels. Per-element math comes from src/params/ (the same XQ_HD code the reference runs);
// loads, stores and saturation from cuda/common.cuh (bit for bit those of core/numeric.hpp). The build
// compiles this file with -fmad=false --prec-div=true --prec-sqrt=true --ftz=false, so every float
// operation is the single IEEE operation the reference performs. Indices are 64-bit.
#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/kernels.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda.hpp"
#include "cuda/matmul.hpp"
#include "xquant/device.hpp"

namespace xquant::detail::cuda {

namespace {

constexpr int kBlock = 256;

cudaStream_t stream() { return static_cast<cudaStream_t>(current_cuda_stream()); }

// A stream-ordered device copy of a small host array (per-channel parameters, group ends), freed
// stream-ordered after the kernels queued before the destructor.
template <typename T>
class Upload {
 public:
  Upload(const T* host, std::int64_t n, const char* what) {
    if (host == nullptr || n <= 0) return;
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
    check(cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes, stream()), std::string("cudaMallocAsync (") + what + ")");
    const cudaError_t e = cudaMemcpyAsync(p_, host, bytes, cudaMemcpyHostToDevice, stream());
    if (e != cudaSuccess) {
      (void)cudaFreeAsync(p_, stream());
      p_ = nullptr;
      check(e, std::string("cudaMemcpyAsync (") + what + ")");
    }
  }
  ~Upload() {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, stream());
  }
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;
  const T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

// ChannelLayout::channel_of (host constexpr) for device code.
__device__ inline std::int64_t chan(const ChannelLayout& l, std::int64_t i) { return (i / l.inner) % l.channels; }

void check_launch(const char* kernel) { check(cudaGetLastError(), std::string("launching ") + kernel); }

// ---------------------------------------------------------------------------------------------------
// Fake tensor quant forward (SPEC 1).
__global__ void fake_quant_kernel(DType dt, const void* x, void* y, ChannelLayout l, const FakeQuantParams* params) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const FakeQuantParams& p = params[chan(l, i)];
    const float v = hd_load_float(dt, x, i);
    float out;
    if (hd_isnan(v))
      out = p.zero ? v : d_quiet(v);  // the reference's NaN: the input, quieted by its arithmetic
    else
      out = fake_quant_value(v, p);
    hd_store_float(dt, y, i, out);
  }
}

void fake_quant(const FakeQuantArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<FakeQuantParams> params(a.params, a.layout.channels, "fake_quant parameters");
  fake_quant_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a.dt, a.x, a.y, a.layout, params.get());
  check_launch("fake_quant_kernel");
}

// ---------------------------------------------------------------------------------------------------
// Fake tensor quant backward (SPEC 1) with grad_amax in the canonical blocked order (core/numeric.hpp
// CanonicalSum; docs/semantics.md "CUDA backend"):
//   - channel c's terms g * factor, in (o, i) order, k = o * inner + i, are cut into chunks of 1024;
//   - chunk j: 16 threads (half a warp), thread l adds terms 1024 j + 16 m + l (m = 0 .. 63) in order
//     into a double lane starting at -0.0; the 16 lanes fold by halving (+8, +4, +2, +1) with shuffles;
//   - one thread per channel adds the chunk values in order into a double total starting at -0.0, which
//     is rounded once to float32 (NaN: the canonical quiet NaN; no term: +0).
// The in-order fold over chunks is sequential (N / 1024 dependent double additions per channel): the
// price of the thread-count-independent order the CPU backends follow.
constexpr int kChunk = 1024;
constexpr int kLanes = 16;

__global__ void fake_quant_grad_chunks_kernel(DType dt, const void* grad_out, const void* x, ChannelLayout l,
                                              const FakeQuantParams* params, std::int64_t chunks_per_channel,
                                              double* chunk_values) {
  const std::int64_t terms = l.outer * l.inner;
  const std::int64_t groups = l.channels * chunks_per_channel;  // (channel, chunk) pairs
  const int lane = threadIdx.x % kLanes;
  // Warp-uniform loop (the shuffles need all 32 threads): each warp takes two consecutive groups.
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  const std::int64_t warp = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  for (std::int64_t g0 = warp * 2; g0 < groups; g0 += warps * 2) {
    const std::int64_t g = g0 + (threadIdx.x % 32) / kLanes;
    double acc = -0.0;
    if (g < groups) {
      const std::int64_t c = g / chunks_per_channel, j = g % chunks_per_channel;
      const FakeQuantParams& p = params[c];
      for (int m = 0; m < kChunk / kLanes; ++m) {
        const std::int64_t k = j * kChunk + m * kLanes + lane;
        if (k >= terms) break;
        const std::int64_t o = k / l.inner, i = k % l.inner;
        const std::int64_t flat = (o * l.channels + c) * l.inner + i;
        const float t = __fmul_rn(hd_load_float(dt, grad_out, flat), fake_quant_amax_factor(hd_load_float(dt, x, flat), p));
        acc = __dadd_rn(acc, static_cast<double>(t));
      }
    }
    // lane[i] += lane[i + w] for w = 8, 4, 2, 1 (within each 16-thread group).
    for (int w = kLanes / 2; w >= 1; w /= 2) acc = __dadd_rn(acc, __shfl_down_sync(0xFFFFFFFFu, acc, w, kLanes));
    if (lane == 0 && g < groups) chunk_values[g] = acc;
  }
}

__global__ void fake_quant_grad_total_kernel(const double* chunk_values, std::int64_t channels,
                                             std::int64_t chunks_per_channel, float* grad_amax) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double total = -0.0;
    for (std::int64_t j = 0; j < chunks_per_channel; ++j) total = __dadd_rn(total, chunk_values[c * chunks_per_channel + j]);
    float r = chunks_per_channel == 0 ? 0.0f : __double2float_rn(total);
    if (hd_isnan(r)) r = hd_qnan();
    grad_amax[c] = r;
  }
}

__global__ void fake_quant_grad_in_kernel(DType dt, const void* grad_out, const void* x, void* grad_in,
                                          ChannelLayout l, const FakeQuantParams* params) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = hd_load_float(dt, grad_out, i);
    const float v = hd_load_float(dt, x, i);
    hd_store_float(dt, grad_in, i, fake_quant_passes_grad(v, params[chan(l, i)]) ? g : 0.0f);
  }
}

void fake_quant_backward(const FakeQuantBackwardArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<FakeQuantParams> params(a.params, a.layout.channels, "fake_quant parameters");
  if (a.grad_amax != nullptr) {
    // Before grad_in is written: grad_in may be the buffer of grad_out or x.
    const std::int64_t terms = a.layout.outer * a.layout.inner;
    const std::int64_t cpc = (terms + kChunk - 1) / kChunk;
    const std::int64_t groups = a.layout.channels * cpc;
    double* chunk_values = nullptr;
    check(cudaMallocAsync(reinterpret_cast<void**>(&chunk_values), static_cast<std::size_t>(groups) * sizeof(double),
                          stream()),
          "cudaMallocAsync (fake_quant_backward chunk sums)");
    fake_quant_grad_chunks_kernel<<<grid_for(groups, kBlock / kLanes), kBlock, 0, stream()>>>(
        a.dt, a.grad_out, a.x, a.layout, params.get(), cpc, chunk_values);
    fake_quant_grad_total_kernel<<<grid_for(a.layout.channels, 128), 128, 0, stream()>>>(
        chunk_values, a.layout.channels, cpc, a.grad_amax);
    const cudaError_t e = cudaGetLastError();
    (void)cudaFreeAsync(chunk_values, stream());
    check(e, "launching the fake_quant_backward grad_amax sums");
  }
  fake_quant_grad_in_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a.dt, a.grad_out, a.x, a.grad_in, a.layout,
                                                                         params.get());
  check_launch("fake_quant_grad_in_kernel");
}

// ---------------------------------------------------------------------------------------------------
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
    const ActsUlqParams p =
        init_acts_ulq_params(hd_load_float(a.dt, a.clamp_min, imin), hd_load_float(a.dt, a.clamp_max, imax), a.fixed_min, levels);
    const ActsUlqElement e = acts_ulq_element(hd_load_float(a.dt, a.x, ix), p, levels);
    // NaN results as the reference's usual NaN (the canonical 0x7FC00000, from NaN operands); x86's default
    // NaN 0xFFC00000 of an invalid operation (Inf clamps) is not reproduced (docs/semantics.md 1.11).
    hd_store_float(a.dt, a.y, i, hd_canonical_nan(e.y));
    hd_store_float(a.dt, a.clamp_min_mask, i, e.clamp_min_mask);
    hd_store_float(a.dt, a.clamp_max_mask, i, e.clamp_max_mask);
    hd_store_float(a.dt, a.x_clamped_loss, i, hd_canonical_nan(e.x_clamped_loss));
  }
}

void acts_ulq(const ActsUlqArgs& a) {
  std::int64_t n = 1;
  for (int d = 0; d < a.plan.rank; ++d) n *= a.plan.shape[d];
  if (n == 0) return;
  acts_ulq_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a, n);
  check_launch("acts_ulq_kernel");
}

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

__device__ inline std::int64_t unravel(std::int64_t v, int rank, const std::int64_t* extent, const std::int64_t* stride) {
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
      for (std::int64_t j = 0; j < chunks_per_target; ++j) total = __dadd_rn(total, chunk_values[t * chunks_per_target + j]);
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

void acts_ulq_backward(const ActsUlqBackwardArgs& a) {
  ulq_grad<UlqGrad::x>(a, a.plan.stride_x, a.x_grad, nullptr);
  ulq_grad<UlqGrad::clamp_min>(a, a.plan.stride_min, a.clamp_min_grad, a.clamp_min);
  ulq_grad<UlqGrad::clamp_max>(a, a.plan.stride_max, a.clamp_max_grad, a.clamp_max);
}

// ---------------------------------------------------------------------------------------------------
// npu_quantize (SPEC 2). quint4x2: one thread per output word (8 consecutive flat elements).
__global__ void quantize_kernel(DType dt, const void* x, QuantDType q, void* y, ChannelLayout l,
                                const QuantizeParams* params, bool div_mode) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  const std::int64_t items = q == QuantDType::quint4x2 ? n / 8 : n;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < items;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (q == QuantDType::quint4x2) {
      std::uint32_t w = 0;
      for (int j = 0; j < 8; ++j) {
        const std::int64_t i = t * 8 + j;
        const float v = quantize_value(hd_load_float(dt, x, i), params[chan(l, i)], div_mode);
        w |= d_nibble(hd_rint(v)) << (4 * j);
      }
      static_cast<std::uint32_t*>(y)[t] = w;
    } else {
      const float v = quantize_value(hd_load_float(dt, x, t), params[chan(l, t)], div_mode);
      d_store_q(q, y, t, hd_rint(v));
    }
  }
}

void quantize(const QuantizeArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<QuantizeParams> params(a.params, a.layout.channels, "quantize parameters");
  quantize_kernel<<<grid_for(a.q == QuantDType::quint4x2 ? n / 8 : n, kBlock), kBlock, 0, stream()>>>(
      a.dt, a.x, a.q, a.y, a.layout, params.get(), a.div_mode);
  check_launch("quantize_kernel");
}

// ---------------------------------------------------------------------------------------------------
// Tile quant (SPEC 3): the valid [rows, cols] region only, each tile with its own pitch.
__global__ void tile_quant_kernel(TileQuantArgs a) {
  const std::int64_t n = a.rows * a.cols;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t / a.cols, j = t % a.cols;
    const float x = a.src[i * a.src_pitch + j];
    const float scale = a.scale[i * a.scale_pitch];
    if (a.mode == QuantMode::SYM) {
      d_store_q(QuantDType::qint8, a.out, i * a.out_pitch + j, hd_rint(tile_quant_sym_value(x, scale)));
    } else {
      const TileQuantRowParams p{scale, a.offset[i * a.offset_pitch]};
      d_store_q(QuantDType::quint8, a.out, i * a.out_pitch + j, hd_rint(tile_quant_asym_value(x, p)));
    }
  }
}

void tile_quant(const TileQuantArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  if (n == 0) return;
  tile_quant_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a);
  check_launch("tile_quant_kernel");
}

// ---------------------------------------------------------------------------------------------------
// npu_anti_quant (SPEC 7).
__global__ void anti_quant_kernel(QuantDType src, const void* x, DType dt, void* out, ChannelLayout l,
                                  const AntiQuantParams* params) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int q = src == QuantDType::quint4x2 ? d_load_int4(static_cast<const std::int32_t*>(x), i)
                                              : static_cast<const std::int8_t*>(x)[i];
    hd_store_float(dt, out, i, anti_quant_value(static_cast<float>(q), params[chan(l, i)]));
  }
}

void anti_quant(const AntiQuantArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<AntiQuantParams> params(a.params, a.layout.channels, "anti_quant parameters");
  anti_quant_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a.src, a.x, a.dt, a.out, a.layout, params.get());
  check_launch("anti_quant_kernel");
}

// ---------------------------------------------------------------------------------------------------
// Dynamic quant (SPEC 4 and 6): rowMax / rowMin / rowMax(|x'|) with cub::BlockReduce (min / max are
// exact, so the reduction order does not change the value; NaN anywhere gives the canonical NaN), then
// the row parameters from src/params/dynamic_quant.hpp and the quantization pass.
struct MinMax {
  float max, min, absmax;
  bool any;  // false: no element (an empty reduction gives 0, as the reference)
};
struct MinMaxOp {
  __device__ MinMax operator()(const MinMax& a, const MinMax& b) const {
    if (!a.any) return b;
    if (!b.any) return a;
    return {hd_nan_max(a.max, b.max), hd_nan_min(a.min, b.min), hd_nan_max(a.absmax, b.absmax), true};
  }
};
__device__ inline MinMax mm_of(float v) { return {v, v, hd_nan_max(0.0f, fabsf(v)), true}; }

__device__ inline std::int64_t expert_of_row(const std::int64_t* ends, std::int64_t groups, std::int64_t r) {
  if (ends == nullptr) return 0;
  std::int64_t lo = 0, hi = groups;  // first e with ends[e] > r (upper_bound)
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (ends[mid] > r) hi = mid; else lo = mid + 1;
  }
  return lo;
}

__device__ inline float smoothed(const DynamicQuantArgs& a, std::int64_t r, std::int64_t e, std::int64_t j) {
  const float x = hd_load_float(a.dt, a.x, r * a.cols + j);
  if (a.smooth == nullptr) return x;
  return x * hd_load_float(a.smooth_dt, a.smooth, e * a.cols + j);
}

// Quantizes row r with p (j over this thread's share of the row).
__device__ inline void quantize_row(const DynamicQuantArgs& a, std::int64_t r, std::int64_t e,
                                    const DynamicQuantRowParams& p, std::int64_t tid, std::int64_t nthreads) {
  if (a.dst == QuantDType::quint4x2) {
    for (std::int64_t k = tid; k < a.cols / 8; k += nthreads) {
      std::uint32_t w = 0;
      for (int j = 0; j < 8; ++j) {
        const float xs = smoothed(a, r, e, k * 8 + j);
        const float v = a.symmetric ? dynamic_quant_symmetric_value(xs, p.scale) : dynamic_quant_value(xs, p);
        w |= d_nibble(hd_rint(v)) << (4 * j);
      }
      static_cast<std::uint32_t*>(a.y)[(r * a.cols) / 8 + k] = w;
    }
  } else {
    for (std::int64_t j = tid; j < a.cols; j += nthreads) {
      const float xs = smoothed(a, r, e, j);
      const float v = a.symmetric ? dynamic_quant_symmetric_value(xs, p.scale) : dynamic_quant_value(xs, p);
      d_store_q(QuantDType::qint8, a.y, r * a.cols + j, hd_rint(v));
    }
  }
}

using BlockMinMax = cub::BlockReduce<MinMax, kBlock>;

// Pertoken: one block per row (grid-stride over rows).
__global__ void dynamic_quant_rows_kernel(DynamicQuantArgs a) {
  __shared__ typename BlockMinMax::TempStorage temp;
  __shared__ DynamicQuantRowParams shared_p;
  for (std::int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const std::int64_t e = expert_of_row(a.group_ends, a.num_groups, r);
    MinMax m{0.0f, 0.0f, 0.0f, false};
    for (std::int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) m = MinMaxOp{}(m, mm_of(smoothed(a, r, e, j)));
    const MinMax total = BlockMinMax(temp).Reduce(m, MinMaxOp{});
    if (threadIdx.x == 0) {
      const float mx = total.any ? total.max : 0.0f, mn = total.any ? total.min : 0.0f;
      const float am = total.any ? total.absmax : 0.0f;
      DynamicQuantRowParams p;
      if (a.symmetric) {
        p = init_dynamic_quant_symmetric_params(am, a.dst);
      } else {
        p = init_dynamic_quant_params(mx, mn, a.dst);
        a.offset[r] = p.offset;
      }
      a.scale[r] = p.scale;
      shared_p = p;
    }
    __syncthreads();
    const DynamicQuantRowParams p = shared_p;
    quantize_row(a, r, e, p, threadIdx.x, blockDim.x);
    __syncthreads();  // temp and shared_p are reused by the next row
  }
}

// Pertensor, pass 1: per-block partial min / max over the flat elements.
__global__ void minmax_partial_kernel(DynamicQuantArgs a, MinMax* partial) {
  __shared__ typename BlockMinMax::TempStorage temp;
  const std::int64_t n = a.rows * a.cols;
  MinMax m{0.0f, 0.0f, 0.0f, false};
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m = MinMaxOp{}(m, mm_of(hd_load_float(a.dt, a.x, i)));
  const MinMax total = BlockMinMax(temp).Reduce(m, MinMaxOp{});
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Pertensor, pass 2: one block folds the partials and writes scale[0], offset[0].
__global__ void minmax_final_kernel(DynamicQuantArgs a, const MinMax* partial, int parts) {
  __shared__ typename BlockMinMax::TempStorage temp;
  MinMax m{0.0f, 0.0f, 0.0f, false};
  for (int i = threadIdx.x; i < parts; i += blockDim.x) m = MinMaxOp{}(m, partial[i]);
  const MinMax total = BlockMinMax(temp).Reduce(m, MinMaxOp{});
  if (threadIdx.x == 0) {
    const DynamicQuantRowParams p =
        init_dynamic_quant_params(total.any ? total.max : 0.0f, total.any ? total.min : 0.0f, a.dst);
    a.scale[0] = p.scale;
    a.offset[0] = p.offset;
  }
}

// Pertensor, pass 3: every row with the tensor's parameters (one block per row).
__global__ void quantize_rows_kernel(DynamicQuantArgs a) {
  const DynamicQuantRowParams p{a.scale[0], a.offset[0]};
  for (std::int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) quantize_row(a, r, 0, p, threadIdx.x, blockDim.x);
}

void dynamic_quant(const DynamicQuantArgs& host_args) {
  DynamicQuantArgs a = host_args;
  Upload<std::int64_t> ends(a.group_ends, a.num_groups, "group_index");
  a.group_ends = ends.get();
  const unsigned row_grid = static_cast<unsigned>(a.rows < 65536 * 4 ? (a.rows > 0 ? a.rows : 1) : 65536 * 4);
  if (!a.per_tensor) {
    if (a.rows == 0) return;
    dynamic_quant_rows_kernel<<<row_grid, kBlock, 0, stream()>>>(a);
    check_launch("dynamic_quant_rows_kernel");
    return;
  }
  const std::int64_t n = a.rows * a.cols;
  const unsigned parts = n > 0 ? grid_for(n, kBlock) : 1u;
  MinMax* partial = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&partial), parts * sizeof(MinMax), stream()),
        "cudaMallocAsync (dynamic_quant partial min / max)");
  if (n > 0) {
    minmax_partial_kernel<<<parts, kBlock, 0, stream()>>>(a, partial);
  } else {
    (void)cudaMemsetAsync(partial, 0, sizeof(MinMax), stream());  // any = false: the empty reduction
  }
  minmax_final_kernel<<<1, kBlock, 0, stream()>>>(a, partial, static_cast<int>(parts));
  const cudaError_t e = cudaGetLastError();
  (void)cudaFreeAsync(partial, stream());
  check(e, "launching the dynamic_quant per-tensor reduction");
  if (a.rows > 0 && a.cols > 0) {
    quantize_rows_kernel<<<row_grid, kBlock, 0, stream()>>>(a);
    check_launch("quantize_rows_kernel");
  }
}

}  // namespace

const KernelTable& kernels() {
  static const KernelTable table{
      "cuda",
      fake_quant,
      fake_quant_backward,
      quantize,
      tile_quant,
      dynamic_quant,
      acts_ulq,
      acts_ulq_backward,
      anti_quant,
      quant_matmul,
      weight_quant_matmul,
  };
  return table;
}

}  // namespace xquant::detail::cuda
