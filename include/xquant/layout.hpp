// The [outer, channels, inner] view of a tensor around one axis: the normal form of every per-channel
// problem (fake_tensor_quant_with_axis, npu_quantize, the cpu kernels' channel walks, the CLI's
// per-channel passes). A row-major tensor of shape [d0, ..., d(r-1)] split at axis a has
//   outer = d0 * ... * d(a-1),  channels = d(a),  inner = d(a+1) * ... * d(r-1),
// and element (o, c, i) at flat index (o * channels + c) * inner + i. Per-tensor is [1, 1, numel].
#pragma once
#include <cstdint>

#include "xquant/tensor.hpp"

namespace xquant {

struct ChannelLayout {
  std::int64_t outer = 1;
  std::int64_t channels = 1;
  std::int64_t inner = 1;

  constexpr std::int64_t numel() const noexcept { return outer * channels * inner; }
  // Channel of flat element index i.
  constexpr std::int64_t channel_of(std::int64_t i) const noexcept { return (i / inner) % channels; }
  constexpr bool operator==(const ChannelLayout&) const noexcept = default;
};

// The layout of `shape` split at `axis` (Python-style: -rank <= axis < rank). Throws xquant::Error
// (invalid_argument, naming "axis") when axis is out of range.
ChannelLayout channel_layout(const Shape& shape, std::int64_t axis);
// [1, 1, numel]: the per-tensor form.
ChannelLayout per_tensor_layout(const Shape& shape);

}  // namespace xquant
