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

// active_kernels() lives in runtime.cpp: it follows xquant::set_backend (default: the cpu backend,
// which is bit-identical to the reference on every SIMD target and thread count).

}  // namespace xquant::detail
