// The single dispatch point between operators and kernels.
#include "core/kernels.hpp"
#include "ref/ref.hpp"

namespace xquant::detail {

const KernelTable& reference_kernels() {
  static const KernelTable table{
      "reference",     ref::fake_quant,    ref::fake_quant_backward, ref::quantize,
      ref::tile_quant, ref::dynamic_quant, ref::acts_ulq,            ref::acts_ulq_backward,
  };
  return table;
}

const KernelTable& active_kernels() {
  // Faster backends (Highway SIMD + OpenMP, CUDA) plug in here; each must be bit-identical to the
  // reference (SPEC: results reproducible to the bit on every backend).
  return reference_kernels();
}

}  // namespace xquant::detail
