// CUDA backend: pypto tile quant (SPEC 3).
// Per-element math from src/params/ (the XQ_HD code the reference runs), loads / stores / saturation and
// the launch helpers from cuda/common.cuh. Compiled with -fmad=false --prec-div=true --prec-sqrt=true
// --ftz=false (CMakeLists.txt): every float operation is the single IEEE operation of the reference.
#include "cuda/common.cuh"
#include "cuda/cuda.hpp"

namespace xquant::detail::cuda {

namespace {

// Tile quant (SPEC 3): the valid [rows, cols] region only, each tile with its own pitch.
__global__ void tile_quant_kernel(TileQuantArgs a) {
  const std::int64_t n = a.rows * a.cols;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < n;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t / a.cols, j = t % a.cols;
    const float x = a.src[i * a.src_pitch + j];
    const float scale = a.scale[i * a.scale_pitch];
    if (a.mode == QuantMode::SYM) {
      d_store_q(QuantDType::qint8, a.out, i * a.out_pitch + j, hd_rint(tile_quant_sym_value(x, scale)));
    } else {
      const TileQuantRowParams p{scale, a.offset[i * a.offset_pitch]};
      d_store_q(QuantDType::quint8, a.out, i * a.out_pitch + j, hd_rint(tile_quant_asym_value(x, p)));
    }
  }
}

}  // namespace

void tile_quant(const TileQuantArgs& a) {
  const std::int64_t n = a.rows * a.cols;
  if (n == 0) return;
  tile_quant_kernel<<<grid_for(n, kBlock), kBlock, 0, stream()>>>(a);
  check_launch("tile_quant_kernel");
}

}  // namespace xquant::detail::cuda
