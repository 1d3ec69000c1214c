// Quantized matmuls (docs/semantics.md section 9): the per-element math shared by every backend (reference,
// cpu, CUDA). XQ_HD: the same source runs on the host and in CUDA device code.
#pragma once
#include <cstdint>

#include "core/convert.hpp"
#include "core/hd.hpp"
#include "xquant/dtype.hpp"

namespace xquant::detail {

// ---- npu_trans_quant_param (9.1) ----
// The int64 word of one (scale, offset) pair. offset_rounded: rint(offset), or 0 when absent.
XQ_HD inline std::uint64_t trans_quant_param_word(float scale, bool has_offset, float offset, int round_mode) noexcept {
  std::uint32_t b = hd_float_bits(scale);
  if (round_mode == 1) b += 0x1000u;  // round the bit pattern to its top 19 bits (ties up in magnitude)
  std::uint64_t w = static_cast<std::uint64_t>(b & 0xFFFFE000u) | (std::uint64_t{1} << 46);
  if (has_offset) {
    // o = clamp(rint(offset), -256, 255): NaN -> 0, +-Inf -> the bounds (rule 1.4)
    const int o = hd_saturate_range(hd_rint(offset), -256, 255);
    w = (w & 0x4000FFFFFFFFull) | ((static_cast<std::uint64_t>(static_cast<std::uint32_t>(o)) & 0x1FFu) << 37);
  }
  return w;
}
// The float32 scale an int64 word carries (bits [0, 31]).
XQ_HD inline float int64_scale_value(std::uint64_t w) noexcept {
  return hd_bits_float(static_cast<std::uint32_t>(w & 0xFFFFFFFFu));
}
// The offset an int64 word carries: the 9-bit two's-complement field of bits [37, 45].
XQ_HD inline float int64_scale_offset(std::uint64_t w) noexcept {
  const int f = static_cast<int>((w >> 37) & 0x1FFu);
  return static_cast<float>(f >= 256 ? f - 512 : f);
}

// ---- npu_quant_matmul (9.3) ----
// Per-call epilogue parameters. Pointers are in the memory the kernel runs in (host, or device after
// the CUDA backend's upload); arrays are float32 / int32 already widened by the operator.
struct QuantMatmulEpilogue {
  DType out_dt;                  // int8, float16, bfloat16 or int32
  const float* scale;            // [N]
  const float* offset;           // [N] or nullptr
  const float* pertoken;         // [M] or nullptr
  const std::int32_t* bias_int;  // [bias rows][N] or nullptr
  const float* bias_float;       // [bias rows][N] (widened) or nullptr
  std::int64_t bias_stride;      // elements between the bias rows of consecutive batches: 0 (shared) or N
};

// int32 addition modulo 2^32 (no signed-overflow UB).
XQ_HD inline std::int32_t wrap_add(std::int32_t a, std::int32_t b) noexcept {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
}
XQ_HD inline std::int32_t wrap_mul(std::int32_t a, std::int32_t b) noexcept {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) * static_cast<std::uint32_t>(b));
}

// The epilogue of output element (b, m, n) from its exact int32 accumulator, stored at out[i].
XQ_HD inline void quant_matmul_finish(const QuantMatmulEpilogue& e, void* out, std::int64_t i, std::int64_t b,
                                      std::int64_t m, std::int64_t n, std::int32_t acc) noexcept {
  // a = acc + bias (int32 bias, modulo 2^32)
  const std::int32_t a = e.bias_int != nullptr ? wrap_add(acc, e.bias_int[b * e.bias_stride + n]) : acc;
  if (e.out_dt == DType::int32) {  // the exact accumulator (+ bias); no scale
    static_cast<std::int32_t*>(out)[i] = a;
    return;
  }
  float v = static_cast<float>(a);                                           // round to nearest even above 2^24
  v = v * e.scale[n];                                                        // * scale[n]
  if (e.pertoken != nullptr) v = v * e.pertoken[m];                          // * pertoken_scale[m]
  if (e.bias_float != nullptr) v = v + e.bias_float[b * e.bias_stride + n];  // + float bias[n]
  if (e.offset != nullptr) v = v + e.offset[n];                              // + offset[n]
  if (e.out_dt == DType::int8) {
    // sat_int8(rint(v)): compare in float first (rule 1.4), NaN -> 0
    static_cast<std::int8_t*>(out)[i] = static_cast<std::int8_t>(hd_saturate_range(hd_rint(v), -128, 127));
    return;
  }
  hd_store_float(e.out_dt, out, i, hd_canonical_nan(v));  // float16 / bfloat16: one rounding
}

// ---- npu_quant_matmul, A8W4 per-group mode (9.3.1) ----
// x1 int8 times packed int4 x2, in k groups of G. The NPU's int4 x int4 unit takes x as two int4 halves:
// x = 16 * hi + (lo + 8) with hi = floor(x / 16) and lo = (x & 15) - 8, both in [-8, 7]. Per k group g the
// two exact int32 products acc_hi / acc_lo are scaled by scale[g][n] and accumulated across groups in
// float16 (each term and each sum rounded to float16, round to nearest even, overflow to +-Inf); then
//   v = float(sum_hi) * 16 + float(sum_lo)    (float32)
//   v = v + offset[n]                         (when given)
//   v = v * pertoken_scale[m]                 (when given)
//   out = narrow(v)                           (float16 / bfloat16)
XQ_HD inline int a8w4_hi(int x) noexcept { return (x & ~15) / 16; }  // floor(x / 16), exact
XQ_HD inline int a8w4_lo(int x) noexcept { return (x & 15) - 8; }
XQ_HD inline float a8w4_half(float v) noexcept { return hd_half_to_float(hd_float_to_half(v)); }
// One group's term added to a float16 running sum: half(sum + half(float(acc) * scale)).
XQ_HD inline float a8w4_group_step(float sum, std::int32_t acc, float scale) noexcept {
  const float term = a8w4_half(static_cast<float>(acc) * scale);
  return a8w4_half(sum + term);
}
XQ_HD inline void a8w4_finish(const QuantMatmulEpilogue& e, void* out, std::int64_t i, std::int64_t m, std::int64_t n,
                              float sum_hi, float sum_lo) noexcept {
  float v = sum_hi * 16.0f;  // exact (a power of two; float16 range times 16 stays finite in float32)
  v = v + sum_lo;
  if (e.offset != nullptr) v = v + e.offset[n];
  if (e.pertoken != nullptr) v = v * e.pertoken[m];
  hd_store_float(e.out_dt, out, i, hd_canonical_nan(v));
}

// ---- npu_weight_quant_batchmatmul (9.4) ----
// v rounded to the 16-bit dtype dt and widened back (exact).
XQ_HD inline float round_to_dtype(DType dt, float v) noexcept {
  return dt == DType::float16 ? hd_half_to_float(hd_float_to_half(v)) : hd_bfloat16_to_float(hd_float_to_bfloat16(v));
}
// The dequantized weight: narrow_x(narrow_x(float(q) + offset) * scale), as a float32 value.
XQ_HD inline float weight_antiquant_value(DType dt, int q, float scale, bool has_offset, float offset) noexcept {
  float v = static_cast<float>(q);
  if (has_offset) v = round_to_dtype(dt, v + offset);
  return round_to_dtype(dt, v * scale);
}
// One step of the fixed-order sum: acc + x * w (the product rounded, then the sum; no FMA).
XQ_HD inline float weight_matmul_step(float acc, float x, float w) noexcept {
  const float p = x * w;
  return acc + p;
}
// The output element from the finished sum: + bias, then one narrowing (NaN: canonical).
XQ_HD inline void weight_matmul_finish(DType dt, void* out, std::int64_t i, float acc, const float* bias,
                                       std::int64_t n) noexcept {
  if (bias != nullptr) acc = acc + bias[n];
  hd_store_float(dt, out, i, hd_canonical_nan(acc));
}

}  // namespace xquant::detail
