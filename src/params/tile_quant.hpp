// Tile quantization (SPEC 3): the per-element math. Each row's parameters are the scale (a multiplier,
// 1 / s) and, for ASYM, the offset, read straight from their [M, 1] tiles: there is nothing to precompute.
#pragma once
#include "core/hd.hpp"

namespace xquant::detail {

struct TileQuantRowParams {
  float scale;
  float offset;  // 0 for SYM (unused)
};

// SYM: v = x * scale;   the result is sat_int8(rint(v)).
XQ_HD inline float tile_quant_sym_value(float x, float scale) noexcept { return x * scale; }
// ASYM: v = x * scale + offset (a rounded multiply, then a rounded add: no FMA);  sat_uint8(rint(v)).
XQ_HD inline float tile_quant_asym_value(float x, const TileQuantRowParams& p) noexcept {
  return x * p.scale + p.offset;
}

}  // namespace xquant::detail
