// CUDA backend: npu_dynamic_quant_asymmetric (SPEC 4) and npu_dynamic_quant (SPEC 6).
// Per-element math from src/params/ (the XQ_HD code the reference runs), loads / stores / saturation and
// the launch helpers from cuda/common.cuh. Compiled with -fmad=false --prec-div=true --prec-sqrt=true
// --ftz=false (CMakeLists.txt): every float operation is the single IEEE operation of the reference.
#include <cub/block/block_reduce.cuh>

#include "cuda/common.cuh"
#include "cuda/cuda.hpp"

namespace xquant::detail::cuda {

namespace {

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
    if (ends[mid] > r)
      hi = mid;
    else
      lo = mid + 1;
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
  if (dynamic_quant_is_float8(a.dst)) {
    for (std::int64_t j = tid; j < a.cols; j += nthreads) {
      const float xs = smoothed(a, r, e, j);
      const float v = a.symmetric ? dynamic_quant_symmetric_value(xs, p.scale) : dynamic_quant_value(xs, p);
      static_cast<std::uint8_t*>(a.y)[r * a.cols + j] = dynamic_quant_float8(v, a.dst);
    }
  } else if (a.dst == QuantDType::quint4x2) {
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
        a.symmetric ? init_dynamic_quant_symmetric_params(total.any ? total.absmax : 0.0f, a.dst)
                    : init_dynamic_quant_params(total.any ? total.max : 0.0f, total.any ? total.min : 0.0f, a.dst);
    a.scale[0] = p.scale;
    if (!a.symmetric) a.offset[0] = p.offset;
  }
}

// Pertensor, pass 3: every row with the tensor's parameters (one block per row).
__global__ void quantize_rows_kernel(DynamicQuantArgs a) {
  const DynamicQuantRowParams p{a.scale[0], a.symmetric ? 0.0f : a.offset[0]};
  for (std::int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) quantize_row(a, r, 0, p, threadIdx.x, blockDim.x);
}

// Perchannel: one thread per (batch, column), down the channel_rows rows of its batch (coalesced across
// the threads of a warp), twice: the reduction, then the quantization.
__global__ void per_channel_kernel(DynamicQuantArgs a, std::int64_t batches) {
  const std::int64_t S = a.channel_rows, H = a.cols;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < batches * H;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = t / H, h = t % H;
    auto xs = [&](std::int64_t s) {
      const float x = hd_load_float(a.dt, a.x, (b * S + s) * H + h);
      return a.smooth == nullptr ? x : x * hd_load_float(a.smooth_dt, a.smooth, s);
    };
    MinMax m{0.0f, 0.0f, 0.0f, false};
    for (std::int64_t s = 0; s < S; ++s) m = MinMaxOp{}(m, mm_of(xs(s)));
    const DynamicQuantRowParams p = a.symmetric
                                        ? init_dynamic_quant_symmetric_params(m.any ? m.absmax : 0.0f, a.dst)
                                        : init_dynamic_quant_params(m.any ? m.max : 0.0f, m.any ? m.min : 0.0f, a.dst);
    a.scale[t] = p.scale;
    if (!a.symmetric) a.offset[t] = p.offset;
    for (std::int64_t s = 0; s < S; ++s) {
      const float v = a.symmetric ? dynamic_quant_symmetric_value(xs(s), p.scale) : dynamic_quant_value(xs(s), p);
      const std::int64_t i = (b * S + s) * H + h;
      if (dynamic_quant_is_float8(a.dst))
        static_cast<std::uint8_t*>(a.y)[i] = dynamic_quant_float8(v, a.dst);
      else
        d_store_q(QuantDType::qint8, a.y, i, hd_rint(v));
    }
  }
}

}  // namespace

void dynamic_quant(const DynamicQuantArgs& host_args) {
  DynamicQuantArgs a = host_args;
  Upload<std::int64_t> ends(a.group_ends, a.num_groups, "group_index");
  a.group_ends = ends.get();
  const unsigned row_grid = static_cast<unsigned>(a.rows < 65536 * 4 ? (a.rows > 0 ? a.rows : 1) : 65536 * 4);
  if (a.per_channel) {
    const std::int64_t batches = a.channel_batches;
    if (batches * a.cols == 0) return;
    per_channel_kernel<<<grid_for(batches * a.cols, kBlock), kBlock, 0, stream()>>>(a, batches);
    check_launch("per_channel_kernel");
    return;
  }
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

}  // namespace xquant::detail::cuda
