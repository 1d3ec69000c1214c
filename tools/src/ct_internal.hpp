// Shared by ct_presets.cpp, ct_export.cpp and ct_read.cpp (the compressed-tensors format); not part of the
// tool's interface.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/float8.hpp"
#include "json.hpp"
#include "safetensors.hpp"
#include "writer.hpp"
#include "xquant/dtype.hpp"

namespace xqcli::ct {

using OJ = nlohmann::ordered_json;

// Work units: pieces of at most kPieceElems elements are what one thread does at a time (its float32
// copy of them stays in cache); chunks of at most kChunkElems elements are written at once. Memory is
// bounded by these, not by a row or a tensor.
inline constexpr std::int64_t kPieceElems = std::int64_t{1} << 18;
inline constexpr std::int64_t kChunkElems = std::int64_t{1} << 24;
inline constexpr std::uint64_t kCopyChunk = std::uint64_t{64} << 20;
inline constexpr std::uint64_t kDefaultShard = 5'000'000'000ull;  // transformers' "5GB"

inline xquant::DType lib_dtype(StDType dt) {
  switch (dt) {
    case StDType::F16:
      return xquant::DType::float16;
    case StDType::BF16:
      return xquant::DType::bfloat16;
    default:
      return xquant::DType::float32;
  }
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The per-element steps of FP8_DYNAMIC and NVFP4A16 (compressed_tensors.hpp: ct_fp8_quantize,
// ct_fp4_quantize, ct_fp4_value call these), inline for the loops over a group.
inline std::uint8_t fp8_quantize(float x, float s) {
  const float q = x / s;
  const float v = q < -448.0f ? -448.0f : q > 448.0f ? 448.0f : q;  // clamped first: the cast does not saturate
  return xquant::detail::hd_float_to_float8(v, xquant::DType::float8_e4m3fn, false);
}
inline std::uint8_t fp4_quantize(float x, float s) {
  const float q = x / s;
  const float v = q < -6.0f ? -6.0f : q > 6.0f ? 6.0f : q;
  const float a = v < 0.0f ? -v : v;
  // The index in 0, 0.5, 1, 1.5, 2, 3, 4, 6 by its midpoints, each tie to the even index: 0.25 -> 0,
  // 0.75 -> 2, 1.25 -> 2, 1.75 -> 4, 2.5 -> 4, 3.5 -> 6, 5 -> 6 (branch-free: a sum of comparisons).
  const int m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<std::uint8_t>(m | (v < 0.0f ? 8 : 0));
}
inline float fp4_value(std::uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 15u];
}

// A scale of dtype `dt` (F32, F16, BF16) from its little-endian bits, widened exactly to float32.
float decode_scale(std::uint32_t bits, StDType dt);

// config.json's torch_dtype (or transformers 5's dtype) as a scale dtype, if it names one.
std::optional<StDType> dtype_from_config(const json::Value& config);

// Output file metadata: the input file's, with format = pt.
std::map<std::string, std::string> out_metadata(const std::map<std::string, std::string>& in);

// One output weight file.
struct OutPlan {
  std::string name;  // file name
  std::vector<OutTensor> tensors;
  std::uint64_t data_size = 0;
  std::string header;
};

// model.safetensors.index.json of a sharded output.
std::string index_json(const std::vector<OutPlan>& outs);

// Refuses (exit 1) an output in which a tensor name occurs twice (in one file or in two), naming it and
// `why` (what the two are); never writes such a header.
void check_unique_names(const std::vector<OutPlan>& outs, const std::string& who);

}  // namespace xqcli::ct
