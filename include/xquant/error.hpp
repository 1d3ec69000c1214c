// The one error type of xquant.
#pragma once
#include <exception>
#include <string>

namespace xquant {

enum class ErrorCode {
  invalid_argument,  // a value outside what the operator accepts (num_bits, axis, amax < 0, mode, ...)
  dtype_mismatch,    // a tensor has a dtype the operator does not accept
  shape_mismatch,    // a tensor's shape does not fit the others
  not_contiguous,    // a view that must be dense is not (tile views with a bad pitch)
  aliasing,          // outputs overlap inputs where the operator forbids it
  out_of_memory,     // an owning tensor could not be allocated
  device_mismatch,   // an operator's tensors are not all on one device
  device_error,      // the device cannot run the call: backend not built / no device / a CUDA runtime error
  internal_error,    // a bug in xquant: an internal invariant failed (e.g. a kernel got a dtype it has no code for)
};

const char* error_code_name(ErrorCode code) noexcept;

// Thrown by every xquant operator on bad input, before anything is written.
// what() reads e.g. "xquant::fake_tensor_quant_with_axis: amax has shape [3] but inputs has 8 channels
// on axis 1"; argument() is the offending argument's name ("amax").
class Error : public std::exception {
 public:
  Error(ErrorCode code, std::string argument, std::string message);
  ErrorCode code() const noexcept { return code_; }
  const std::string& argument() const noexcept { return argument_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  ErrorCode code_;
  std::string argument_;
  std::string message_;
};

}  // namespace xquant
