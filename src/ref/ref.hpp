// The scalar reference kernels, one file per operator family, mirroring SPEC.md formula by formula.
// They are the oracle of every faster backend and, until those land, what the operators run.
#pragma once
#include "core/kernels.hpp"

namespace xquant::detail::ref {

// SPEC 1: per-channel parameters from amax (shared by every backend: computed once per call).
FakeQuantParams fake_quant_params(float amax, int num_bits, bool is_unsigned, bool narrow_range);
void fake_quant(DType dt, const void* x, void* y, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                const FakeQuantParams* params);
void fake_quant_backward(DType dt, const void* grad_out, const void* x, void* grad_in, std::int64_t outer,
                         std::int64_t channels, std::int64_t inner, const FakeQuantParams* params, float* grad_amax);

// SPEC 2.
void quantize(DType dt, const void* x, QuantDType q, void* y, std::int64_t outer, std::int64_t channels,
              std::int64_t inner, const QuantizeParams* params, bool div_mode);

// SPEC 3.
void tile_quant(const TileQuantArgs& args);

// SPEC 4: scale and offset of one row (or the whole tensor) from its max / min (shared by every backend).
struct DynamicQuantRowParams {
  float scale;
  float offset;
};
DynamicQuantRowParams dynamic_quant_params(float row_max, float row_min, QuantDType dst);
void dynamic_quant(const DynamicQuantArgs& args);

// SPEC 5: LEVELS and the per-(clamp_min, clamp_max) quantities, shared by every backend.
struct ActsUlqParams {
  float s;        // (ori_max - ori_min) / LEVELS
  float clip_lo;  // s * off
  float clip_hi;  // s * (off + LEVELS)
  float loss_m;   // (rint(ori_min / s) - ori_min / s) / LEVELS
};
float acts_ulq_levels(int num_bits);
ActsUlqParams acts_ulq_params(float clamp_min, float clamp_max, bool fixed_min, float levels);
void acts_ulq(const ActsUlqArgs& args);
void acts_ulq_backward(const ActsUlqBackwardArgs& args);

}  // namespace xquant::detail::ref
