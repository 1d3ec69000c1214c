// The cpu backend: Highway SIMD kernels (runtime dispatch over the targets compiled into the build) with
// OpenMP threads. Bit-identical to the reference kernels (src/ref/) on every target and thread count.
#pragma once
#include <string>

#include "core/kernels.hpp"

namespace xquant::detail {

const KernelTable& cpu_kernels();
std::string cpu_target_name();

// Entry points (each partitions the work over threads and dispatches to the best SIMD target).
void cpu_fake_quant(DType dt, const void* x, void* y, std::int64_t outer, std::int64_t channels,
                    std::int64_t inner, const FakeQuantParams* params);
void cpu_fake_quant_backward(DType dt, const void* grad_out, const void* x, void* grad_in, std::int64_t outer,
                             std::int64_t channels, std::int64_t inner, const FakeQuantParams* params,
                             float* grad_amax);
void cpu_quantize(DType dt, const void* x, QuantDType q, void* y, std::int64_t outer, std::int64_t channels,
                  std::int64_t inner, const QuantizeParams* params, bool div_mode);
void cpu_tile_quant(const TileQuantArgs& args);
void cpu_dynamic_quant(const DynamicQuantArgs& args);
void cpu_acts_ulq(const ActsUlqArgs& args);
void cpu_acts_ulq_backward(const ActsUlqBackwardArgs& args);

// Packs n (a multiple of 8) int8 values in [-8, 7] into int4 words: element 8k + j -> bits [4j, 4j + 3]
// of word k, two's complement nibbles (quint4x2).
void pack_int4_bytes(const std::int8_t* q, std::int64_t n, std::int32_t* words);

// Canonical blocked sums (core/numeric.hpp, rule 5), SIMD: the value of one chunk of at most kSumChunk
// float32 terms (its 16 double lanes folded by halving). Summing chunk values in order into a -0.0
// double total and rounding once gives exactly CanonicalSum's result.
double cpu_chunk_value(const float* terms, std::int64_t count);
float finish_chunk_sum(const double* chunk_values, std::int64_t chunks);

}  // namespace xquant::detail
