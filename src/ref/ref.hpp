// The scalar reference kernels, one file per operator family, mirroring SPEC.md formula by formula.
// They are the oracle of every faster backend. Parameters and per-element math come from src/params/,
// shared with the other backends.
#pragma once
#include "core/kernels.hpp"

namespace xquant::detail::ref {

// The reference backend's kernel table (registered in src/backends/registry.cpp).
const KernelTable& kernels();

// SPEC 1.
void fake_quant(const FakeQuantArgs& args);
void fake_quant_backward(const FakeQuantBackwardArgs& args);
// SPEC 2.
void quantize(const QuantizeArgs& args);
// SPEC 3.
void tile_quant(const TileQuantArgs& args);
// SPEC 4.
void dynamic_quant(const DynamicQuantArgs& args);
// SPEC 7.
void anti_quant(const AntiQuantArgs& args);
// SPEC 5.
void acts_ulq(const ActsUlqArgs& args);
void acts_ulq_backward(const ActsUlqBackwardArgs& args);
// docs/semantics.md section 9.
void quant_matmul(const QuantMatmulArgs& args);
void weight_quant_matmul(const WeightQuantMatmulArgs& args);

}  // namespace xquant::detail::ref
