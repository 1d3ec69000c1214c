// Shared by the CUDA translation units (one per operator family, plus runtime.cu): error checks, the
// launch helpers (stream, grid, parameter uploads), the canonical-sum geometry, and the device-side loads,
// stores and saturating conversions (bit for bit those of core/numeric.hpp and core/half.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/convert.hpp"
#include "core/hd.hpp"
#include "core/kernels.hpp"
#include "xquant/device.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail::cuda {

// Throws xquant::Error (out_of_memory for cudaErrorMemoryAllocation, else device_error) naming `what`.
void check(cudaError_t e, const std::string& what);

// Threads per block of the elementwise kernels.
constexpr int kBlock = 256;
// Canonical blocked sums (core/numeric.hpp, rule 5): chunks of kChunk terms, kLanes double lanes each.
constexpr int kChunk = 1024;
constexpr int kLanes = 16;

// The stream kernels are queued on: the calling thread's xquant::CudaStreamGuard (default stream: null).
inline cudaStream_t stream() { return static_cast<cudaStream_t>(current_cuda_stream()); }

// Throws (as check) when the last kernel launch failed.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), std::string("launching ") + kernel); }

// A stream-ordered device copy of a small host array (per-channel parameters, group ends), freed
// stream-ordered after the kernels queued before the destructor.
template <typename T>
class Upload {
 public:
  Upload(const T* host, std::int64_t n, const char* what) {
    if (host == nullptr || n <= 0) return;
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
    check(cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes, stream()),
          std::string("cudaMallocAsync (") + what + ")");
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

// float16 / bfloat16 conversions and the dtype-dispatched loads / stores are core/convert.hpp's
// hd_* functions: the very code the host runs.

// x86 (the reference's host) returns a NaN operand of an arithmetic operation quieted, payload and sign
// kept; NVIDIA GPUs return the canonical NaN 0x7FFFFFFF. Kernels whose reference propagates an input NaN
// (fake quant) rebuild the host's result with this.
__device__ inline float d_quiet(float v) { return __uint_as_float(__float_as_uint(v) | 0x00400000u); }

// core/numeric.hpp saturate_rounded<Int>: r already rounded (or +-Inf / NaN); compare in float, never
// convert an out-of-range value. [lo, above) with `above` the first value past the range, exact in float.
__device__ inline long long d_saturate(float r, float lo, float above, long long min, long long max) {
  if (hd_isnan(r)) return 0;
  if (r < lo) return min;
  if (r >= above) return max;
  return static_cast<long long>(r);
}

// Saturating store of an already rounded value into the quantized storage type of q (int4 excluded).
__device__ inline void d_store_q(QuantDType q, void* y, std::int64_t i, float r) {
  switch (q) {
    case QuantDType::qint8:
      static_cast<std::int8_t*>(y)[i] = static_cast<std::int8_t>(d_saturate(r, -128.0f, 128.0f, -128, 127));
      return;
    case QuantDType::quint8:
      static_cast<std::uint8_t*>(y)[i] = static_cast<std::uint8_t>(d_saturate(r, 0.0f, 256.0f, 0, 255));
      return;
    case QuantDType::qint32:
    case QuantDType::quint4x2:
      static_cast<std::int32_t*>(y)[i] =
          static_cast<std::int32_t>(d_saturate(r, -2147483648.0f, 2147483648.0f, -2147483648LL, 2147483647LL));
      return;
    case QuantDType::float8_e4m3fn:  // not integer outputs: the operators that round never take them
    case QuantDType::float8_e5m2:
      return;
  }
}

// int4 nibble of an already rounded value (hd_saturate_range to [-8, 7]), two's complement.
__device__ inline std::uint32_t d_nibble(float r) {
  return static_cast<std::uint32_t>(hd_saturate_range(r, -8, 7)) & 0xFu;
}
__device__ inline int d_load_int4(const std::int32_t* words, std::int64_t i) {
  const std::uint32_t w = reinterpret_cast<const std::uint32_t*>(words)[i >> 3];
  const int nib = static_cast<int>((w >> ((i & 7) * 4)) & 0xFu);
  return nib >= 8 ? nib - 16 : nib;
}

// Grid for a grid-stride loop over n items (64-bit indices inside the kernels).
inline unsigned grid_for(std::int64_t n, int block) {
  const std::int64_t b = (n + block - 1) / block;
  return static_cast<unsigned>(b < 65536 * 4 ? (b > 0 ? b : 1) : 65536 * 4);
}

}  // namespace xquant::detail::cuda
