#include "xquant/error.hpp"

#include <utility>

namespace xquant {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::dtype_mismatch:
      return "dtype_mismatch";
    case ErrorCode::shape_mismatch:
      return "shape_mismatch";
    case ErrorCode::not_contiguous:
      return "not_contiguous";
    case ErrorCode::aliasing:
      return "aliasing";
    case ErrorCode::out_of_memory:
      return "out_of_memory";
    case ErrorCode::device_mismatch:
      return "device_mismatch";
    case ErrorCode::device_error:
      return "device_error";
    case ErrorCode::internal_error:
      return "internal_error";
  }
  return "unknown";
}

Error::Error(ErrorCode code, std::string argument, std::string message)
    : code_(code), argument_(std::move(argument)), message_(std::move(message)) {}

}  // namespace xquant
