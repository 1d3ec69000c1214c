// Reference kernel of npu_anti_quant (SPEC section 7), scalar float32, one formula per line.
//
//   out = narrow((float(x) + offset) * scale)     (a rounded add, then a rounded multiply; no FMA)
//
// The problem arrives normalized over the logical elements: x[outer][channels][inner] with params[c] for
// channel c (scale of length H: [rows, H, 1]; length 1: [1, 1, numel]). quint4x2 input holds element
// 8k + j in bits [4j, 4j + 3] of int32 word k.
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

void anti_quant(const AntiQuantArgs& a) {
  const bool int4 = a.src == QuantDType::quint4x2;
  std::int64_t i = 0;  // flat logical element index
  for (std::int64_t o = 0; o < a.layout.outer; ++o)
    for (std::int64_t c = 0; c < a.layout.channels; ++c)
      for (std::int64_t k = 0; k < a.layout.inner; ++k, ++i) {
        const int q =
            int4 ? load_int4(static_cast<const std::int32_t*>(a.x), i) : static_cast<const std::int8_t*>(a.x)[i];
        // out = narrow((float(q) + offset) * scale)
        store_float(a.dt, a.out, i, anti_quant_value(static_cast<float>(q), a.params[c]));
      }
}

}  // namespace xquant::detail::ref
