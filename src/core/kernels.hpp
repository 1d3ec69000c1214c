// The kernel layer: what every backend (scalar reference, Highway SIMD, CUDA) implements.
//
// Kernels see only normalized, already validated problems: raw pointers, element counts and
// per-channel / per-row parameter arrays (built by the init functions of src/params/, one header per
// family). They never allocate tensors and never validate user input; they write only their outputs, and
// throw only for what the operator cannot have checked (a CUDA runtime error) or for a broken invariant
// (ErrorCode::internal_error, before anything is written). Every family takes one argument struct. Operators
// (src/ops/) pick the table through kernels_for (core/device_ops.hpp): the CUDA table for CUDA tensors,
// else active_kernels(), which the backend registry (src/backends/registry.cpp) answers.
#pragma once
#include <cstdint>

#include "params/acts_ulq.hpp"
#include "params/anti_quant.hpp"
#include "params/dynamic_quant.hpp"
#include "params/fake_quant.hpp"
#include "params/matmul.hpp"
#include "params/quantize.hpp"
#include "params/tile_quant.hpp"
#include "xquant/dtype.hpp"
#include "xquant/layout.hpp"

namespace xquant::detail {

// ---- fake tensor quant (SPEC 1). Problem: x[outer][channels][inner]; params[c] for channel c. ----
struct FakeQuantArgs {
  DType dt;
  const void* x;
  void* y;
  ChannelLayout layout;
  const FakeQuantParams* params;  // [layout.channels]
};
using FakeQuantFn = void (*)(const FakeQuantArgs& args);
// grad_amax: float32[channels] or nullptr (not requested). Sums use the canonical blocked order.
// grad_in may be the buffer of x or of grad_out (each element is read before it is written).
struct FakeQuantBackwardArgs {
  DType dt;
  const void* grad_out;
  const void* x;
  void* grad_in;
  ChannelLayout layout;
  const FakeQuantParams* params;  // [layout.channels]
  float* grad_amax;               // [layout.channels] or nullptr
};
using FakeQuantBackwardFn = void (*)(const FakeQuantBackwardArgs& args);

// ---- npu_quantize (SPEC 2). Problem: x[outer][channels][inner]; params[c]. ----
// quint4x2 output is packed over the flat element index (the last dimension is a multiple of 8).
struct QuantizeArgs {
  DType dt;
  const void* x;
  QuantDType q;
  void* y;
  ChannelLayout layout;
  const QuantizeParams* params;  // [layout.channels]
  bool div_mode;
};
using QuantizeFn = void (*)(const QuantizeArgs& args);

// ---- tile quant (SPEC 3). Pitches in elements; offset is nullptr for SYM. ----
struct TileQuantArgs {
  QuantMode mode;
  std::int64_t rows, cols;
  const float* src;
  std::int64_t src_pitch;
  const float* scale;
  std::int64_t scale_pitch;
  const float* offset;
  std::int64_t offset_pitch;
  void* out;  // int8 (SYM) or uint8 (ASYM)
  std::int64_t out_pitch;
};
using TileQuantFn = void (*)(const TileQuantArgs& args);

// ---- npu_dynamic_quant_asymmetric (SPEC 4) and npu_dynamic_quant (SPEC 6, symmetric). ----
struct DynamicQuantArgs {
  DType dt;
  const void* x;  // [rows][cols]
  std::int64_t rows, cols;
  DType smooth_dt;
  const void* smooth;              // nullptr, [cols] or [num_groups][cols]
  const std::int64_t* group_ends;  // nullptr or [num_groups] cumulative row ends (validated)
  std::int64_t num_groups;
  QuantDType dst;  // qint8, quint4x2, float8_e4m3fn or float8_e5m2
  bool symmetric;  // SPEC 6: scale = rowMax(|x'|) / DST_MAX, no offset
  bool per_tensor;
  // perchannel (x = [channel_batches][channel_rows][cols], rows = channel_batches * channel_rows): one (scale, offset)
  // per (batch, column), reduced over the channel_rows rows of the batch; smooth is then [channel_rows] (row s of every
  // batch is multiplied by smooth[s]); no group_ends. cols-major reduction, int8 / float8 only.
  bool per_channel;
  std::int64_t channel_batches, channel_rows;  // B and S (B * S == rows; S may be 0)
  void* y;                                     // int8 / float8 [rows][cols] or int32 [rows][cols / 8]
  float* scale;                                // [rows] (pertoken), [1] (pertensor) or [batches][cols] (perchannel)
  float* offset;                               // nullptr when symmetric
};
using DynamicQuantFn = void (*)(const DynamicQuantArgs& args);

// ---- ActsULQ (SPEC 5). ----
constexpr int kMaxRank = 8;
// Iteration over a row-major output of `shape`; each operand has an element stride per dimension
// (0 where it is broadcast).
struct BroadcastPlan {
  int rank;
  std::int64_t shape[kMaxRank];
  std::int64_t stride_x[kMaxRank];
  std::int64_t stride_min[kMaxRank];
  std::int64_t stride_max[kMaxRank];
};
struct ActsUlqArgs {
  DType dt;  // of every operand
  BroadcastPlan plan;
  const void* x;
  const void* clamp_min;
  const void* clamp_max;
  bool fixed_min;
  int num_bits;
  void* y;  // dense, plan.shape
  void* clamp_min_mask;
  void* clamp_max_mask;
  void* x_clamped_loss;
};
using ActsUlqFn = void (*)(const ActsUlqArgs& args);

// Backward: y_grad, masks and loss are dense over plan.shape; plan.stride_x / stride_min / stride_max
// describe how x_grad / clamp_min(_grad) / clamp_max(_grad) broadcast, i.e. which output positions each
// gradient element sums (in the canonical blocked order).
struct ActsUlqBackwardArgs {
  DType dt;
  BroadcastPlan plan;
  const void* y_grad;
  const void* clamp_min;
  const void* clamp_max;
  const void* clamp_min_mask;
  const void* clamp_max_mask;
  const void* x_clamped_loss;
  bool fixed_min;
  int num_bits;
  void* x_grad;          // dense, x's shape
  void* clamp_min_grad;  // dense, clamp_min's shape
  void* clamp_max_grad;  // dense, clamp_max's shape
};
using ActsUlqBackwardFn = void (*)(const ActsUlqBackwardArgs& args);

// ---- npu_anti_quant (SPEC 7). Problem: the logical elements of x as [outer][channels][inner]; params[c]. ----
struct AntiQuantArgs {
  QuantDType src;  // qint8 (x int8) or quint4x2 (x int32 words, element 8k + j in bits [4j, 4j + 3])
  const void* x;
  DType dt;   // of out: float16, bfloat16 or float32
  void* out;  // dense, the logical shape
  ChannelLayout layout;
  const AntiQuantParams* params;  // [layout.channels]
};
using AntiQuantFn = void (*)(const AntiQuantArgs& args);

// ---- npu_quant_matmul (docs/semantics.md 9.3). out[b][m][n] from x1[b] (M x K) and x2[b] (K x N). ----
// int4: x1 / x2 are int32 words, logical element e of a matrix in bits [4 (e % 8), +3] of word e / 8.
struct QuantMatmulArgs {
  bool int4;
  const void* x1;  // [.. M][K] logical elements
  const void* x2;  // [.. K][N], or [.. N][K] when transpose_x2
  bool transpose_x2;
  std::int64_t batch, M, K, N;
  const std::int64_t* x1_offsets;  // [batch] host: first logical element of batch b's x1 matrix
  const std::int64_t* x2_offsets;  // [batch] host: the same for x2 (broadcast batches repeat)
  void* out;                       // dense [batch][M][N]
  QuantMatmulEpilogue epilogue;    // host arrays
  // A8W4 per-group mode (9.3.1) when group_k > 0: x1 int8, x2 packed int4 (int4 is false), one batch;
  // group_scale [K / group_k][N] float32 (host); the epilogue's offset / pertoken / out_dt apply, no bias.
  std::int64_t group_k = 0;
  const float* group_scale = nullptr;
};
using QuantMatmulFn = void (*)(const QuantMatmulArgs& args);

// ---- npu_weight_quant_batchmatmul (docs/semantics.md 9.4). out[m][n] = sum_k x[m][k] * w[k][n], k ascending. ----
struct WeightQuantMatmulArgs {
  DType dt;       // of x and out: float16 or bfloat16
  const void* x;  // [M][K]
  std::int64_t M, K, N;
  bool int4;              // weight: int8, or int32 words of eight int4 (logical element order as stored)
  bool transpose_weight;  // weight stored [N][K] instead of [K][N]
  const void* weight;
  const float* scale;       // [G][N] host, widened (a per-tensor scale is expanded to [1][N])
  const float* offset;      // [G][N] host or nullptr
  std::int64_t group_size;  // k uses parameter row k / group_size (K when there is one row)
  const float* bias;        // [N] host, widened, or nullptr
  void* out;                // [M][N]
};
using WeightQuantMatmulFn = void (*)(const WeightQuantMatmulArgs& args);

struct KernelTable {
  const char* name;
  FakeQuantFn fake_quant;
  FakeQuantBackwardFn fake_quant_backward;
  QuantizeFn quantize;
  TileQuantFn tile_quant;
  DynamicQuantFn dynamic_quant;
  ActsUlqFn acts_ulq;
  ActsUlqBackwardFn acts_ulq_backward;
  AntiQuantFn anti_quant;
  QuantMatmulFn quant_matmul = nullptr;
  WeightQuantMatmulFn weight_quant_matmul = nullptr;
};

// The backend registry (src/backends/registry.cpp) implements these: operators never name a backend.
// The scalar reference kernels (src/ref/): the oracle every other backend is tested against.
const KernelTable& reference_kernels();
// The kernels operators run: those of the backend xquant::set_backend selected (default: cpu).
const KernelTable& active_kernels();

}  // namespace xquant::detail
