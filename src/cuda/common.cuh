// Shared by the CUDA translation units: error checks, scratch buffers, and the device-side loads,
// stores and saturating conversions (bit for bit those of core/numeric.hpp and core/half.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/hd.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail::cuda {

// Throws xquant::Error (out_of_memory for cudaErrorMemoryAllocation, else device_error) naming `what`.
void check(cudaError_t e, const std::string& what);

inline cudaStream_t current_stream_of(void* s) { return static_cast<cudaStream_t>(s); }

// ---- float16 / bfloat16 <-> float32 on the bit patterns (core/half.cpp, the same algorithm) ----
__device__ inline float d_half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return __uint_as_float(sign);
  std::uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return __uint_as_float(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

__device__ inline std::uint16_t d_float_to_half(float f) {
  const std::uint32_t x = __float_as_uint(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const std::uint32_t e = a >> 23;
  if (e >= 113) {
    const std::uint32_t rebased = a - (112u << 23);
    const std::uint32_t keep = rebased >> 13;
    const std::uint32_t rest = rebased & 0x1FFFu;
    const std::uint32_t up = (rest > 0x1000u || (rest == 0x1000u && (keep & 1u))) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | (keep + up));
  }
  if (e < 101) return sign;
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - e;
  const std::uint32_t keep = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half_ulp = 1u << (shift - 1u);
  const std::uint32_t up = (rest > half_ulp || (rest == half_ulp && (keep & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (keep + up));
}

__device__ inline float d_bfloat16_to_float(std::uint16_t b) { return __uint_as_float(static_cast<std::uint32_t>(b) << 16); }

__device__ inline std::uint16_t d_float_to_bfloat16(float f) {
  const std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// core/numeric.hpp load_float / store_float.
__device__ inline float d_load(DType dt, const void* base, std::int64_t i) {
  switch (dt) {
    case DType::float16: return d_half_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bfloat16: return d_bfloat16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::int8: return static_cast<float>(static_cast<const std::int8_t*>(base)[i]);
    case DType::uint8: return static_cast<float>(static_cast<const std::uint8_t*>(base)[i]);
    case DType::int32: return static_cast<float>(static_cast<const std::int32_t*>(base)[i]);
    case DType::int64: return static_cast<float>(static_cast<const std::int64_t*>(base)[i]);
    case DType::float32: break;
  }
  return static_cast<const float*>(base)[i];
}

__device__ inline void d_store(DType dt, void* base, std::int64_t i, float v) {
  switch (dt) {
    case DType::float16: static_cast<std::uint16_t*>(base)[i] = d_float_to_half(v); return;
    case DType::bfloat16: static_cast<std::uint16_t*>(base)[i] = d_float_to_bfloat16(v); return;
    default: static_cast<float*>(base)[i] = v; return;
  }
}

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
      static_cast<std::int32_t*>(y)[i] = static_cast<std::int32_t>(
          d_saturate(r, -2147483648.0f, 2147483648.0f, -2147483648LL, 2147483647LL));
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
