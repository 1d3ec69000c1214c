// The cpu backend: Highway SIMD kernels (runtime dispatch over the targets compiled into the build) with
// OpenMP threads. Bit-identical to the reference kernels (src/ref/) on every target and thread count.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/kernels.hpp"

namespace xquant::detail {

// Entry points (each partitions the work over threads and dispatches to the best SIMD target); the
// backend registry (src/backends/registry.cpp) makes them the cpu backend's kernel table. A dtype the
// kernels have no code for throws xquant::Error (ErrorCode::internal_error) before anything is written.
void cpu_fake_quant(const FakeQuantArgs& args);
void cpu_fake_quant_backward(const FakeQuantBackwardArgs& args);
void cpu_quantize(const QuantizeArgs& args);
void cpu_tile_quant(const TileQuantArgs& args);
void cpu_dynamic_quant(const DynamicQuantArgs& args);
// ActsULQ: false (nothing written) for broadcast layouts without a SIMD walk (x broadcast, clamp tensors
// varying along short inner runs or broadcast inside their own dims, empty outputs); the registry runs
// the reference kernel for those.
bool cpu_acts_ulq(const ActsUlqArgs& args);
bool cpu_acts_ulq_backward(const ActsUlqBackwardArgs& args);
void cpu_anti_quant(const AntiQuantArgs& args);
// Whether the AVX-512 kernels may use AVX512_BF16's float32 -> bfloat16 conversion (x86: CPUID leaf 7
// sub-leaf 1, EAX bit 5, e.g. AMD Zen 4, Intel Sapphire Rapids), unless XQUANT_HW_BF16=0 (measurement).
// Read once, when the library loads.
bool hw_bf16_wanted();
void cpu_quant_matmul(const QuantMatmulArgs& args);
void cpu_weight_quant_matmul(const WeightQuantMatmulArgs& args);

// Packs n (a multiple of 8) int8 values in [-8, 7] into int4 words: element 8k + j -> bits [4j, 4j + 3]
// of word k, two's complement nibbles (quint4x2).
// (Inline: it runs once per 8 output elements inside the kernels' loops.)
inline void pack_int4_bytes(const std::int8_t* q, std::int64_t n, std::int32_t* words) {
  for (std::int64_t k = 0; k < n / 8; ++k) {
    std::uint64_t b;
    std::memcpy(&b, q + 8 * k, 8);  // byte j = element 8k + j (little-endian)
    b &= 0x0F0F0F0F0F0F0F0Full;     // two's complement nibbles
    b = (b | (b >> 4)) & 0x00FF00FF00FF00FFull;
    b = (b | (b >> 8)) & 0x0000FFFF0000FFFFull;
    b = (b | (b >> 16)) & 0x00000000FFFFFFFFull;
    const auto w = static_cast<std::uint32_t>(b);
    std::memcpy(words + k, &w, 4);
  }
}

// The inverse of pack_int4_bytes: the n int4 values of elements [begin, begin + n) of packed words,
// sign-extended to int8 (q[i] = element begin + i).
inline void unpack_int4_bytes(const std::int32_t* words, std::int64_t begin, std::int64_t n, std::int8_t* q) {
  std::int64_t i = 0;
  auto one = [&](std::int64_t e) {
    std::uint32_t w;
    std::memcpy(&w, words + (e >> 3), 4);
    const int nib = static_cast<int>((w >> ((e & 7) * 4)) & 0xFu);
    return static_cast<std::int8_t>(nib >= 8 ? nib - 16 : nib);
  };
  for (; i < n && ((begin + i) & 7) != 0; ++i) q[i] = one(begin + i);  // up to a word boundary
  for (; i + 8 <= n; i += 8) {
    std::uint32_t w;
    std::memcpy(&w, words + ((begin + i) >> 3), 4);
    std::uint64_t b = w;  // spread nibble j to byte j
    b = (b | (b << 16)) & 0x0000FFFF0000FFFFull;
    b = (b | (b << 8)) & 0x00FF00FF00FF00FFull;
    b = (b | (b << 4)) & 0x0F0F0F0F0F0F0F0Full;
    b |= ((b & 0x0808080808080808ull) >> 3) * 0xF0u;  // sign-extend: nibbles >= 8 get 0xF0
    std::memcpy(q + i, &b, 8);                        // byte j = element 8k + j (little-endian)
  }
  for (; i < n; ++i) q[i] = one(begin + i);
}

// Canonical blocked sums (core/numeric.hpp, rule 5), SIMD: the value of one chunk of at most kSumChunk
// float32 terms (its 16 double lanes folded by halving). Summing chunk values in order into a -0.0
// double total and rounding once gives exactly CanonicalSum's result.
double cpu_chunk_value(const float* terms, std::int64_t count);
// Two chunks of count terms each in one loop (independent accumulator chains): the same values as two
// cpu_chunk_value calls.
void cpu_chunk_values(const float* a, const float* b, std::int64_t count, double* va, double* vb);
float finish_chunk_sum(const double* chunk_values, std::int64_t chunks);

// dst[i] = float(src[i]) for i in [b0, b1), src of float dtype dt (float32, float16, bfloat16), SIMD; exact
// (widening). Callers index dst like src.
void cpu_widen_to_float(DType dt, const void* src, std::int64_t b0, std::int64_t b1, float* dst);

}  // namespace xquant::detail
