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
    const float v = d_load(dt, x, i);
    float out;
    if (hd_isnan(v))
      out = p.zero ? v : d_quiet(v);  // the reference's NaN: the input, quieted by its arithmetic
    else
      out = fake_quant_value(v, p);
    d_store(dt, y, i, out);
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
        const float t = __fmul_rn(d_load(dt, grad_out, flat), fake_quant_amax_factor(d_load(dt, x, flat), p));
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
    const float g = d_load(dt, grad_out, i);
    const float v = d_load(dt, x, i);
    d_store(dt, grad_in, i, fake_quant_passes_grad(v, params[chan(l, i)]) ? g : 0.0f);
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
        const float v = quantize_value(d_load(dt, x, i), params[chan(l, i)], div_mode);
        w |= d_nibble(hd_rint(v)) << (4 * j);
      }
      static_cast<std::uint32_t*>(y)[t] = w;
    } else {
      const float v = quantize_value(d_load(dt, x, t), params[chan(l, t)], div_mode);
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
    d_store(dt, out, i, anti_quant_value(static_cast<float>(q), params[chan(l, i)]));
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
  const float x = d_load(a.dt, a.x, r * a.cols + j);
  if (a.smooth == nullptr) return x;
  return x * d_load(a.smooth_dt, a.smooth, e * a.cols + j);
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
    m = MinMaxOp{}(m, mm_of(d_load(a.dt, a.x, i)));
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
      nullptr,  // acts_ulq: not yet on CUDA
      nullptr,  // acts_ulq_backward: not yet on CUDA
      anti_quant,
  };
  return table;
}

}  // namespace xquant::detail::cuda
