// Planning (xquant/plan.hpp) runs an operator's own validation on views made from TensorSpecs: the data
// pointer is a placeholder that is never read (validation looks at data only to check it is non-null; the
// value checks are skipped by the operators' `read_values = false`).
#pragma once
#include <optional>

#include "xquant/plan.hpp"

namespace xquant::detail {

inline const void* spec_data() noexcept {
  static const unsigned char placeholder = 0;
  return &placeholder;
}
inline ConstTensorView spec_view(const TensorSpec& s) { return {spec_data(), s.dtype, s.shape}; }
inline std::optional<ConstTensorView> spec_view(const std::optional<TensorSpec>& s) {
  if (!s) return std::nullopt;
  return spec_view(*s);
}

}  // namespace xquant::detail
