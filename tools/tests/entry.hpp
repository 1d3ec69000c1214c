// Shared by the CLI's C++ tests: a safetensors entry as the file reader lists it (name, dtype, shape, and the
// byte end of a tensor stored alone), built from a shape.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "safetensors.hpp"

namespace xqcli::test_support {

inline TensorEntry entry(const std::string& name, StDType dt, Dims shape) {
  TensorEntry t;
  t.name = name;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.numel = checked_numel(t.shape).value();
  t.end = static_cast<std::uint64_t>(t.numel) * st_dtype_size(dt);
  return t;
}

}  // namespace xqcli::test_support
