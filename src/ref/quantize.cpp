// Reference kernel of npu_quantize (SPEC section 2), scalar float32, one formula per line.
//
//   div_mode = true : v = x / scale + zero_point      (a rounded division, then a rounded addition)
//   div_mode = false: v = x * scale + zero_point      (a rounded multiplication, then a rounded addition)
//   y = sat(rint(v))                                  (round half to even; NaN -> 0, +-Inf -> max / min)
//
// The problem arrives normalized: x[outer][channels][inner] with params[c] for channel c (per-tensor is
// outer = 1, channels = 1). quint4x2 output is packed over the flat element index: element 8k + j sits in
// bits [4j, 4j + 3] of int32 word k (the operator guarantees the last dimension is a multiple of 8, so a
// word never straddles two rows).
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

namespace {

template <typename Int>
void quantize_typed(DType dt, const void* x, Int* y, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                    const QuantizeParams* params, bool div_mode) {
  std::int64_t i = 0;  // flat element index
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t k = 0; k < inner; ++k, ++i) {
        const float v = quantize_value(load_float(dt, x, i), params[c], div_mode);
        y[i] = saturate_rounded<Int>(round_half_even(v));  // y = sat(rint(v))
      }
}

void quantize_int4(DType dt, const void* x, std::int32_t* y, std::int64_t outer, std::int64_t channels,
                   std::int64_t inner, const QuantizeParams* params, bool div_mode) {
  std::int64_t i = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t k = 0; k < inner; ++k, ++i) {
        const float v = quantize_value(load_float(dt, x, i), params[c], div_mode);
        // Elements arrive in flat order, so nibble 0 of each word comes first: clear the word then, and
        // the remaining seven nibbles fill it (never a read of the caller's old contents).
        if ((i & 7) == 0) y[i >> 3] = 0;
        store_int4(y, i, saturate_rounded_range(round_half_even(v), -8, 7));  // int4 in [-8, 7]
      }
}

}  // namespace

void quantize(const QuantizeArgs& a) {
  const DType dt = a.dt;
  const void* x = a.x;
  void* y = a.y;
  const std::int64_t outer = a.layout.outer, channels = a.layout.channels, inner = a.layout.inner;
  const QuantizeParams* params = a.params;
  const bool div_mode = a.div_mode;
  switch (a.q) {
    case QuantDType::qint8:
      quantize_typed(dt, x, static_cast<std::int8_t*>(y), outer, channels, inner, params, div_mode);
      return;
    case QuantDType::quint8:
      quantize_typed(dt, x, static_cast<std::uint8_t*>(y), outer, channels, inner, params, div_mode);
      return;
    case QuantDType::qint32:
      quantize_typed(dt, x, static_cast<std::int32_t*>(y), outer, channels, inner, params, div_mode);
      return;
    case QuantDType::quint4x2:
      quantize_int4(dt, x, static_cast<std::int32_t*>(y), outer, channels, inner, params, div_mode);
      return;
    case QuantDType::float8_e4m3fn:  // rejected by the operator (ops/quantize.cpp)
    case QuantDType::float8_e5m2:
      return;
  }
}

}  // namespace xquant::detail::ref
