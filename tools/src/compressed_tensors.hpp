// Model directories in the compressed-tensors format (the `quantization_config` that transformers'
// CompressedTensorsHfQuantizer and vLLM load): quantize a Hugging Face model directory with a preset
// (W4A16, W8A16, W8A8), dequantize such a directory, inspect one. See docs/cli.md, "Model directories
// and the compressed-tensors format".
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "jobs.hpp"
#include "safetensors.hpp"

namespace xqcli {

struct ExportOptions {
  std::string preset = "W4A16";          // W4A16 | W8A16 | W8A8
  std::int64_t group_size = 128;         // W4A16 / W8A16; 0: one scale per output channel
  bool group_size_given = false;
  std::vector<std::string> ignore;       // POSIX ERE on module names: keep dense
  std::vector<std::string> targets;      // POSIX ERE on module names: quantize only these
  std::optional<std::uint64_t> max_shard_size;  // bytes; nullopt: keep the input's shards, else 5 GB
};

// A preset as llm-compressor names it.
struct Preset {
  std::string name;
  int bits = 4;             // weight bits
  bool packed = true;       // pack-quantized (int32 words) vs int-quantized (int8 weight)
  bool act8 = false;        // dynamic per-token int8 input activations (W8A8)
  std::int64_t group = 128; // 0: per output channel
};
Preset make_preset(const ExportOptions& e);

// What happens to one tensor of the input.
struct CtDecision {
  bool quantize = false;
  bool warn = false;      // kept because it cannot be quantized (an error under --strict)
  bool ignore = false;    // its module goes into the config's ignore list
  std::string module;     // the name without ".weight" (rank-2 ".weight" tensors only)
  std::string reason;     // why kept
};

// Module-name classification used by the decision (exposed for the tests).
bool is_embedding_module(const std::string& module);
bool is_default_ignored_module(const std::string& module);

// The quantization of one row block of a [rows, K] weight with group size G (K: per channel): scales
// amax / qmax in float32 over the finite values, rounded to `scale_dt` (the stored scale), the weight
// quantized with the widened stored scale by xquant::quantize_out (int8: qint8, div_mode=true,
// q = rint(x / s); int4: quint4x2, div_mode=false, q = rint(x * (1 / s))) on the [rows * K / G, G] view,
// then stored as compressed-tensors does: int4 words with each nibble offset by 8 (word ^ 0x88888888),
// 8-bit packed words with each byte offset by 128, int-quantized int8 as is. `x` need not be aligned.
// `q` receives rows * K bytes (8 bits) or rows * K / 2 (4 bits); `scale` rows * K / G entries of
// `scale_dt`. Returns the round-trip error sums (x against q * s in float32).
ErrorStats ct_quantize_rows(const std::byte* x, StDType dt, std::int64_t rows, std::int64_t K, std::int64_t G,
                            const Preset& p, StDType scale_dt, std::byte* q, std::byte* scale);

// xquant quantize DIR -o OUT (and --format compressed-tensors).
QuantizeResult run_export(const QuantizeOptions& q, const ExportOptions& e);
void print_export_report(std::FILE* out, const QuantizeOptions& q, const ExportOptions& e, const QuantizeResult& r);

// xquant dequantize DIR -o OUT: a compressed-tensors directory back to a dense one.
void run_dequantize_dir(const DequantizeOptions& o);

// xquant dequantize FILE -o OUT for one compressed-tensors file (a shard), its quantization read from its
// tensors; is_ct_file() says whether a file is one (and not an xquant-format file).
bool is_ct_file(const std::string& path);
void run_dequantize_ct_file(const DequantizeOptions& o);

// xquant inspect DIR: the config's quantization and every weight file.
void run_inspect_dir(const InspectOptions& o, std::FILE* out);

}  // namespace xqcli
