// The xquant C++ library as xquant._core holds it, offered to the torch extension xquant._torch_ext through
// the PyCapsule xquant._core._api: one copy of the library's process state (thread count, backend,
// allocation cache, CUDA stream) for both modules. (_torch_ext does not link the library: a second static
// copy would have its own state, and xquant.set_num_threads / set_backend / set_memory_cache_limit would
// not reach it.)
//
// Both modules are compiled in one build, with one compiler, from this header: the C++ types below cross
// the module boundary as they are. Errors cross as a Status (never as C++ exceptions), because the calls
// may run without the GIL; the caller turns it into the exception _core would raise (TypeError for
// dtype_mismatch, ValueError otherwise).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "xquant/plan.hpp"
#include "xquant/xquant.hpp"

namespace xquant_py {

inline constexpr const char* kCoreApiCapsule = "xquant._core._api";
inline constexpr std::uint32_t kCoreApiVersion = 4;

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
using xquant::TensorSpec;
using xquant::TensorView;
using xquant::TileView;
using OptView = std::optional<ConstTensorView>;
using OptSpec = std::optional<TensorSpec>;

struct CoreApi {
  std::uint32_t version;  // kCoreApiVersion
  std::uint32_t size;     // sizeof(CoreApi)
  // ---- the out-variants (xquant/<op>.hpp). axis: nullptr for the per-tensor form.
  void (*fake_tensor_quant)(Status&, const TensorView& out, const ConstTensorView& x, const ConstTensorView& amax,
                            const std::int64_t* axis, const xquant::FakeQuantOptions& o);
  void (*fake_tensor_quant_inplace)(Status&, const TensorView& x, const ConstTensorView& amax,
                                    const xquant::FakeQuantOptions& o);
  void (*fake_tensor_quant_backward)(Status&, const TensorView& grad_inputs, const std::optional<TensorView>& grad_amax,
                                     const ConstTensorView& grad_out, const ConstTensorView& x,
                                     const ConstTensorView& amax, const std::int64_t* axis,
                                     const xquant::FakeQuantOptions& o);
  void (*quantize)(Status&, const TensorView& out, const ConstTensorView& x, const ConstTensorView& scales,
                   const OptView& zero_points, QuantDType q, std::int64_t axis, bool div_mode);
  void (*tile_quant)(Status&, const TileView& out, const ConstTileView& src, const ConstTileView& scale,
                     xquant::QuantMode mode, const std::optional<ConstTileView>& offset);
  void (*dynamic_quant_asymmetric)(Status&, const TensorView& y, const TensorView& scale, const TensorView& offset,
                                   const ConstTensorView& x, const OptView& smooth_scales, const OptView& group_index,
                                   QuantDType q, int quant_mode);  // 0 pertoken, 1 pertensor, 2 perchannel
  void (*dynamic_quant)(Status&, const TensorView& y, const TensorView& scale, const ConstTensorView& x,
                        const OptView& smooth_scales, const OptView& group_index, QuantDType q, int quant_mode);
  void (*anti_quant)(Status&, const TensorView& out, const ConstTensorView& x, const ConstTensorView& scale,
                     const OptView& offset, QuantDType src_dtype);
  void (*acts_ulq)(Status&, const TensorView& y, const TensorView& m0, const TensorView& m1, const TensorView& loss,
                   const ConstTensorView& x, const ConstTensorView& lo, const ConstTensorView& hi, bool fixed_min,
                   int num_bits);
  void (*acts_ulq_backward)(Status&, const TensorView& x_grad, const TensorView& g0, const TensorView& g1,
                            const ConstTensorView& y_grad, const ConstTensorView& lo, const ConstTensorView& hi,
                            const ConstTensorView& m0, const ConstTensorView& m1, const ConstTensorView& loss,
                            bool fixed_min, int num_bits);
  // ---- planning (xquant/plan.hpp): validation without data, output shapes. `form` of the fake quant:
  // 0 per-tensor, 1 in place, 2 with axis (axis read only then).
  void (*plan_fake_tensor_quant)(Status&, Shape& out, int form, const TensorSpec& x, const TensorSpec& amax,
                                 std::int64_t axis, const xquant::FakeQuantOptions& o);
  void (*plan_fake_tensor_quant_backward)(Status&, const TensorSpec& grad_out, const TensorSpec& x,
                                          const TensorSpec& amax, const std::int64_t* axis,
                                          const xquant::FakeQuantOptions& o);
  void (*plan_quantize)(Status&, Shape& out, const TensorSpec& x, const TensorSpec& scales, const OptSpec& zero_points,
                        QuantDType q, std::int64_t axis, bool div_mode);
  void (*plan_tile_quant)(Status&, const TensorSpec& out, const TensorSpec& src, const TensorSpec& scale,
                          xquant::QuantMode mode, const OptSpec& offset);
  // symmetric: the symmetric operator; quant_mode as above.
  void (*plan_dynamic_quant)(Status&, xquant::DynamicQuantShapes& out, bool symmetric, const TensorSpec& x,
                             const OptSpec& smooth_scales, const OptSpec& group_index, QuantDType q, int quant_mode);
  void (*plan_anti_quant)(Status&, Shape& out, const TensorSpec& x, const TensorSpec& scale, const OptSpec& offset,
                          QuantDType src_dtype);
  void (*plan_acts_ulq)(Status&, Shape& out, const TensorSpec& x, const TensorSpec& lo, const TensorSpec& hi,
                        int num_bits);
  void (*plan_acts_ulq_backward)(Status&, Shape& out, const TensorSpec& y_grad, const Shape& x_shape,
                                 const TensorSpec& lo, const TensorSpec& hi, const TensorSpec& m0, const TensorSpec& m1,
                                 const TensorSpec& loss, int num_bits);
  // ---- memory: an xquant::Tensor from the library's allocator (huge pages, cached): the owner to free
  // with free_tensor, its memory in *data; nullptr with the status set on failure.
  void* (*new_tensor)(Status&, DType dt, const Shape& shape, void** data);
  void (*free_tensor)(void* owner) noexcept;
  // ---- CUDA: whether the library can run on CUDA tensors (and why not), and a scoped stream choice
  // (xquant::CudaStreamGuard: push returns the guard to pass to pop).
  bool (*cuda_available)() noexcept;
  void (*cuda_unavailable_reason)(std::string& out);
  void* (*push_cuda_stream)(void* stream);
  void (*pop_cuda_stream)(void* guard) noexcept;
  // ---- the quantized matmuls (xquant/matmul.hpp): out-variants, then planning (the output shape).
  void (*quant_matmul)(Status&, const TensorView& out, const ConstTensorView& x1, const ConstTensorView& x2,
                       const ConstTensorView& scale, const xquant::QuantMatmulOptions& o);
  void (*weight_quant_batchmatmul)(Status&, const TensorView& out, const ConstTensorView& x,
                                   const ConstTensorView& weight, const ConstTensorView& antiquant_scale,
                                   const xquant::WeightQuantMatmulOptions& o);
  void (*trans_quant_param)(Status&, const TensorView& out, const ConstTensorView& scale, const OptView& offset,
                            int round_mode);
  void (*convert_weight_to_int4pack)(Status&, const TensorView& out, const ConstTensorView& weight);
  void (*plan_quant_matmul)(Status&, Shape& out, const TensorSpec& x1, const TensorSpec& x2, const TensorSpec& scale,
                            const OptSpec& offset, const OptSpec& pertoken_scale, const OptSpec& bias,
                            bool transpose_x2, DType output_dtype, const std::array<std::int64_t, 3>& group_sizes);
  void (*plan_weight_quant_batchmatmul)(Status&, Shape& out, const TensorSpec& x, const TensorSpec& weight,
                                        const TensorSpec& antiquant_scale, const OptSpec& antiquant_offset,
                                        const OptSpec& bias, std::int64_t antiquant_group_size, bool transpose_weight);
  void (*plan_trans_quant_param)(Status&, Shape& out, const TensorSpec& scale, const OptSpec& offset, int round_mode);
  void (*plan_convert_weight_to_int4pack)(Status&, Shape& out, const TensorSpec& weight);
};

}  // namespace xquant_py
