// Element types understood by xquant.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace xquant {

// Storage types of tensors. Packed int4 (quint4x2) has no dtype of its own: eight int4 values live in
// one int32 word (see QuantDType::quint4x2).
enum class DType : std::uint8_t {
  float32,
  float16,   // IEEE binary16, stored as uint16_t bits
  bfloat16,  // bfloat16, stored as uint16_t bits
  int8,
  uint8,
  int32,
  int64,          // only for index tensors (group_index)
  float8_e4m3fn,  // OCP FP8 E4M3 (no Inf; 0x7F NaN; max 448), stored as uint8_t bits: quantized outputs only
  float8_e5m2,    // OCP FP8 E5M2 (IEEE-like; max 57344), stored as uint8_t bits: quantized outputs only
};

// Bytes per element.
std::size_t dtype_size(DType dt) noexcept;
// "float32", "float16", ...
std::string_view dtype_name(DType dt) noexcept;
// float32, float16 or bfloat16 (the float8 types are not: no operator takes them as floating input).
constexpr bool is_floating(DType dt) noexcept {
  return dt == DType::float32 || dt == DType::float16 || dt == DType::bfloat16;
}

// Output kinds of the quantizing operators, named as in torch_npu.
enum class QuantDType : std::uint8_t {
  qint8,          // int8 in [-128, 127]
  quint8,         // uint8 in [0, 255]
  qint32,         // int32 (npu_quantize's torch.int32 / torch.qint32)
  quint4x2,       // int4 in [-8, 7], eight per int32 word, element 8k+j in bits [4j, 4j+3] of word k
  float8_e4m3fn,  // torch.float8_e4m3fn (dynamic quantization only)
  float8_e5m2,    // torch.float8_e5m2 (dynamic quantization only)
};

std::string_view quant_dtype_name(QuantDType q) noexcept;

// Symmetric (no offset) or asymmetric (with an offset / zero point) quantization (tile_quant).
enum class QuantMode { SYM, ASYM };
// Storage dtype of a quantized output: int8, uint8, int32, int32 (packed), float8_e4m3fn, float8_e5m2.
DType storage_dtype(QuantDType q) noexcept;

}  // namespace xquant
