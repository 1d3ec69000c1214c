#include "xquant/dtype.hpp"

namespace xquant {

std::size_t dtype_size(DType dt) noexcept {
  switch (dt) {
    case DType::float32:
      return 4;
    case DType::float16:
    case DType::bfloat16:
      return 2;
    case DType::int8:
    case DType::uint8:
      return 1;
    case DType::int32:
      return 4;
    case DType::int64:
      return 8;
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dt) noexcept {
  switch (dt) {
    case DType::float32:
      return "float32";
    case DType::float16:
      return "float16";
    case DType::bfloat16:
      return "bfloat16";
    case DType::int8:
      return "int8";
    case DType::uint8:
      return "uint8";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::float8_e4m3fn:
      return "float8_e4m3fn";
    case DType::float8_e5m2:
      return "float8_e5m2";
  }
  return "unknown";
}

std::string_view quant_dtype_name(QuantDType q) noexcept {
  switch (q) {
    case QuantDType::qint8:
      return "qint8";
    case QuantDType::quint8:
      return "quint8";
    case QuantDType::qint32:
      return "qint32";
    case QuantDType::quint4x2:
      return "quint4x2";
    case QuantDType::float8_e4m3fn:
      return "float8_e4m3fn";
    case QuantDType::float8_e5m2:
      return "float8_e5m2";
  }
  return "unknown";
}

DType storage_dtype(QuantDType q) noexcept {
  switch (q) {
    case QuantDType::qint8:
      return DType::int8;
    case QuantDType::quint8:
      return DType::uint8;
    case QuantDType::qint32:
    case QuantDType::quint4x2:  // eight int4 per int32
      return DType::int32;
    case QuantDType::float8_e4m3fn:
      return DType::float8_e4m3fn;
    case QuantDType::float8_e5m2:
      return DType::float8_e5m2;
  }
  return DType::int8;
}

}  // namespace xquant
