// The reference backend's kernel table.
#include "ref/ref.hpp"

namespace xquant::detail::ref {

const KernelTable& kernels() {
  static const KernelTable table{
      "reference", fake_quant, fake_quant_backward, quantize, tile_quant, dynamic_quant, acts_ulq, acts_ulq_backward, anti_quant,
      quant_matmul, weight_quant_matmul,
  };
  return table;
}

}  // namespace xquant::detail::ref
