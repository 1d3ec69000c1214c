// Reference kernel of tile quantization (SPEC section 3, pypto quant), scalar float32.
//
//   SYM : out[i,j] = sat_int8 (rint(src[i,j] * scale[i]))
//   ASYM: out[i,j] = sat_uint8(rint(src[i,j] * scale[i] + offset[i]))   (multiply, add, ONE rounding)
//
// Element (i, j) of a tile is at data[i * pitch + j]; scale / offset are [rows, 1] columns with their own
// pitch. Only the valid region [rows, cols] of out is written: the padding of each physical row is not.
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

void tile_quant(const TileQuantArgs& a) {
  for (std::int64_t i = 0; i < a.rows; ++i) {
    const float* src = a.src + i * a.src_pitch;
    const float scale = a.scale[i * a.scale_pitch];  // scale[i, 0], a multiplier (1 / s)
    if (a.mode == QuantMode::SYM) {
      auto* out = static_cast<std::int8_t*>(a.out) + i * a.out_pitch;
      for (std::int64_t j = 0; j < a.cols; ++j)
        out[j] = saturate_rounded<std::int8_t>(
            round_half_even(tile_quant_sym_value(src[j], scale)));  // sat_int8(rint(x * s))
    } else {
      const TileQuantRowParams p{scale, a.offset[i * a.offset_pitch]};  // scale[i, 0], offset[i, 0]
      auto* out = static_cast<std::uint8_t*>(a.out) + i * a.out_pitch;
      for (std::int64_t j = 0; j < a.cols; ++j) {
        const float v = tile_quant_asym_value(src[j], p);             // rounded multiply, then rounded add (no FMA)
        out[j] = saturate_rounded<std::uint8_t>(round_half_even(v));  // sat_uint8(rint(v))
      }
    }
  }
}

}  // namespace xquant::detail::ref
