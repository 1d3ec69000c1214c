// The tool's own element loops around the library's quantize: per-channel min / max before it, the
// round-trip error after it, and dequantization. Elements are read with memcpy (the data section of a
// safetensors file need not be aligned) and widened exactly (float16 through a table, bfloat16 by a shift).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "plan.hpp"
#include "safetensors.hpp"

namespace xqcli {

// float16 -> float32 for all 65,536 bit patterns (exact; built once from the library's conversion).
const float* half_table();

// Element i of a F32 / F16 / BF16 array, widened to float32 exactly.
float load_element(const std::byte* base, StDType dt, std::int64_t i) noexcept;

// Finite min / max of each channel that piece `p` of a tensor (starting at `tensor`) touches, merged
// into lo / hi (indexed by the tensor's channel; per-tensor uses index 0); NaN and +-Inf are counted in
// `nonfinite` and left out.
void piece_minmax(const std::byte* tensor, StDType dt, const Piece& p, float* lo, float* hi,
                  std::int64_t& nonfinite) noexcept;

// Sums of one quantize -> dequantize round trip over finite inputs.
struct ErrorStats {
  double signal = 0.0;   // sum x^2
  double noise = 0.0;    // sum (x - x')^2
  double max_abs = 0.0;  // max |x - x'|
  std::int64_t nonfinite = 0;
  void merge(const ErrorStats& o) noexcept;
  // 10 log10(signal / noise); +Inf when noise is 0 (an exact round trip); NaN or -Inf when a sum is not
  // finite (never reported as a number: see round_trip()).
  double sqnr_db() const noexcept;
  // What the report says instead of a non-finite SQNR: "exact" (noise 0: every finite value came back
  // exactly), "non-finite" (a sum is NaN or Inf: some dequantized value overflowed or is NaN; never
  // counted as exact), else "lossy" (the SQNR is a finite number).
  const char* round_trip() const noexcept;
  // The SQNR as printed: "%.2f dB", "exact", or "not finite".
  std::string sqnr_text() const;
};

// Stored value j of a quantized run: int8, or the sign-extended nibble j of packed int32 words.
inline int stored_value(const void* q, int bits, std::int64_t j) noexcept {
  if (bits == 8) return static_cast<const std::int8_t*>(q)[j];
  std::uint32_t word;
  __builtin_memcpy(&word, static_cast<const std::byte*>(q) + (j >> 3) * 4, 4);
  const int nibble = static_cast<int>((word >> (4 * (j & 7))) & 0xFu);
  return (nibble ^ 8) - 8;
}

// x' = (q - zero_point[c]) * scale[c], in float32 (the dequantization formula of docs/cli.md).
inline float dequantize_value(int q, float scale, float zero_point) noexcept {
  return (static_cast<float>(q) - zero_point) * scale;
}

// Round-trip error of piece `p`: its inputs against the dequantized stored values `q` (the piece's own
// output, element 0 first), with the tensor's parameters.
ErrorStats piece_error(const std::byte* tensor, StDType dt, const Piece& p, const void* q, int bits, const float* scale,
                       const float* zero_point) noexcept;

// Dequantizes elements [begin, end) of a quantized tensor (stored values at `q`, element 0 first; for
// int4 `begin` and `end` are multiples of 8) whose parameters follow normal form `nf`, into `out` (dtype
// F32 / F16 / BF16, element `begin` first), narrowing with round-to-nearest-even: the library's
// xquant::anti_quant_out with offset = -zero_point (a NaN result is its canonical quiet NaN).
void dequantize_range(const void* q, int bits, const NormalForm& nf, const float* scale, const float* zero_point,
                      std::int64_t begin, std::int64_t end, StDType out_dt, std::byte* out);

}  // namespace xqcli
