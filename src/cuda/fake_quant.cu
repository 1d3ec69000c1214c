// CUDA backend: fake tensor quantization forward and backward (SPEC 1).
// Per-element math from src/params/ (the XQ_HD code the reference runs), loads / stores / saturation and
// the launch helpers from cuda/common.cuh. Compiled with -fmad=false --prec-div=true --prec-sqrt=true
// --ftz=false (CMakeLists.txt): every float operation is the single IEEE operation of the reference.
#include "cuda/common.cuh"
#include "cuda/cuda.hpp"

namespace xquant::detail::cuda {

namespace {

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

}  // namespace

void fake_quant(const FakeQuantArgs& a) {
  const std::int64_t n = a.layout.numel();
  if (n == 0) return;
  Upload<FakeQuantParams> params(a.params, a.layout.channels, "fake_quant parameters");
  fake_quant_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a.dt, a.x, a.y, a.layout, params.get());
  check_launch("fake_quant_kernel");
}

namespace {

// Fake tensor quant backward (SPEC 1) with grad_amax in the canonical blocked order (core/numeric.hpp
// CanonicalSum; docs/semantics.md "CUDA backend"):
//   - channel c's terms g * factor, in (o, i) order, k = o * inner + i, are cut into chunks of 1024;
//   - chunk j: 16 threads (half a warp), thread l adds terms 1024 j + 16 m + l (m = 0 .. 63) in order
//     into a double lane starting at -0.0; the 16 lanes fold by halving (+8, +4, +2, +1) with shuffles;
//   - one thread per channel adds the chunk values in order into a double total starting at -0.0, which
//     is rounded once to float32 (NaN: the canonical quiet NaN; no term: +0).
// The in-order fold over chunks is sequential (N / 1024 dependent double additions per channel): the
// price of the thread-count-independent order the CPU backends follow (kChunk, kLanes: cuda/common.cuh).
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
        const float t =
            __fmul_rn(hd_load_float(dt, grad_out, flat), fake_quant_amax_factor(hd_load_float(dt, x, flat), p));
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
    for (std::int64_t j = 0; j < chunks_per_channel; ++j)
      total = __dadd_rn(total, chunk_values[c * chunks_per_channel + j]);
    float r = chunks_per_channel == 0 ? 0.0f : __double2float_rn(total);
    if (hd_isnan(r)) r = hd_qnan();
    grad_amax[c] = r;
  }
}

__global__ void fake_quant_grad_in_kernel(DType dt, const void* grad_out, const void* x, void* grad_in, ChannelLayout l,
                                          const FakeQuantParams* params) {
  const std::int64_t n = l.outer * l.channels * l.inner;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = hd_load_float(dt, grad_out, i);
    const float v = hd_load_float(dt, x, i);
    hd_store_float(dt, grad_in, i, fake_quant_passes_grad(v, params[chan(l, i)]) ? g : 0.0f);
  }
}

}  // namespace

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

}  // namespace xquant::detail::cuda
