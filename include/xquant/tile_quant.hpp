// Tile quantization FP32 -> INT8 / UINT8 (seed 03, pypto_pro.language.quant).
//
//   SYM : out[i,j] = sat_int8 (rint(src[i,j] * scale[i]))
//   ASYM: out[i,j] = sat_uint8(rint(src[i,j] * scale[i] + offset[i]))   (multiply, add, one rounding)
//
// src: float32 [M, N] tile with a row pitch; scale (and offset for ASYM): float32 [M, 1] tiles with their
// own row pitch; scale is a multiplier (1/s). out: int8 (SYM) or uint8 (ASYM) [M, N]; only its valid
// region is written, the padding of each physical row is left untouched. offset is required for ASYM and
// rejected for SYM. Overlapping out and inputs is an error.
#pragma once
#include <optional>

#include "xquant/tensor.hpp"

namespace xquant {

// QuantMode (SYM / ASYM) is declared in xquant/dtype.hpp.

void tile_quant(TileView out, ConstTileView src, ConstTileView scale, QuantMode mode = QuantMode::SYM,
                std::optional<ConstTileView> offset = std::nullopt);
// Allocating form: returns a dense [M, N] int8 (SYM) or uint8 (ASYM) tensor.
Tensor tile_quant(ConstTileView src, ConstTileView scale, QuantMode mode = QuantMode::SYM,
                  std::optional<ConstTileView> offset = std::nullopt);

}  // namespace xquant
