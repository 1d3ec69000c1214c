// The xquant C++ library as xquant._core holds it, offered to xquant._torch_fast through the PyCapsule
// xquant._core._api: one copy of the library's process state (thread count, backend, allocation cache)
// for both modules. (_torch_fast does not link the library: a second static copy would have its own
// state, and xquant.set_num_threads / set_backend / set_memory_cache_limit would not reach it.)
//
// Both modules are compiled in one build, with one compiler, from this header: the C++ types below cross
// the module boundary as they are. Errors cross as a Status (never as C++ exceptions), because the calls
// may run without the GIL; the caller turns it into the Python exception _core would raise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "xquant/xquant.hpp"

namespace xquant_py {

inline constexpr const char* kCoreApiCapsule = "xquant._core._api";
inline constexpr std::uint32_t kCoreApiVersion = 1;

struct Status {
  enum Code : int { ok = 0, type_error, value_error, no_memory, runtime_error };
  int code = ok;
  std::string message;
};

using xquant::ConstTensorView;
using xquant::ConstTileView;
using xquant::DType;
using xquant::QuantDType;
using xquant::Shape;
using xquant::TensorView;
using xquant::TileView;
using OptView = std::optional<ConstTensorView>;

struct CoreApi {
  std::uint32_t version;  // kCoreApiVersion
  std::uint32_t size;     // sizeof(CoreApi)
  // axis: nullptr for the per-tensor form.
  void (*fake_tensor_quant)(Status&, const TensorView& out, const ConstTensorView& x, const ConstTensorView& amax,
                            const std::int64_t* axis, const xquant::FakeQuantOptions& o);
  void (*fake_tensor_quant_inplace)(Status&, const TensorView& x, const ConstTensorView& amax,
                                    const xquant::FakeQuantOptions& o);
  void (*quantize)(Status&, const TensorView& out, const ConstTensorView& x, const ConstTensorView& scales,
                   const OptView& zero_points, QuantDType q, std::int64_t axis, bool div_mode);
  void (*tile_quant)(Status&, const TileView& out, const ConstTileView& src, const ConstTileView& scale,
                     xquant::QuantMode mode, const std::optional<ConstTileView>& offset);
  void (*dynamic_quant_asymmetric)(Status&, const TensorView& y, const TensorView& scale, const TensorView& offset,
                                   const ConstTensorView& x, const OptView& smooth_scales,
                                   const OptView& group_index, QuantDType q, bool per_tensor);
  void (*dynamic_quant)(Status&, const TensorView& y, const TensorView& scale, const ConstTensorView& x,
                        const OptView& smooth_scales, const OptView& group_index, QuantDType q);
  void (*anti_quant)(Status&, const TensorView& out, const ConstTensorView& x, const ConstTensorView& scale,
                     const OptView& offset, QuantDType src_dtype);
  void (*acts_ulq)(Status&, const TensorView& y, const TensorView& m0, const TensorView& m1, const TensorView& loss,
                   const ConstTensorView& x, const ConstTensorView& lo, const ConstTensorView& hi, bool fixed_min,
                   int num_bits);
  // The broadcast output shape; false where the shapes do not broadcast (the operator then reports).
  bool (*acts_ulq_output_shape)(const Shape& x, const Shape& lo, const Shape& hi, Shape& out) noexcept;
  // An xquant::Tensor from the library's allocator (huge pages, cached): the owner to free with
  // free_tensor, its memory in *data; nullptr with *status set on failure.
  void* (*new_tensor)(Status&, DType dt, const Shape& shape, void** data);
  void (*free_tensor)(void* owner) noexcept;
};

}  // namespace xquant_py
