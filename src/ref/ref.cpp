// The reference backend's kernel table.
#include "ref/ref.hpp"

namespace xquant::detail::ref {

const KernelTable& kernels() {
  static const KernelTable table{
      .name = "reference",
      .fake_quant = fake_quant,
      .fake_quant_backward = fake_quant_backward,
      .quantize = quantize,
      .tile_quant = tile_quant,
      .dynamic_quant = dynamic_quant,
      .acts_ulq = acts_ulq,
      .acts_ulq_backward = acts_ulq_backward,
      .anti_quant = anti_quant,
      .quant_matmul = quant_matmul,
      .weight_quant_matmul = weight_quant_matmul,
  };
  return table;
}

}  // namespace xquant::detail::ref
