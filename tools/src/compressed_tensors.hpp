// Model directories in the compressed-tensors format (the `quantization_config` that transformers'
// CompressedTensorsHfQuantizer and vLLM load): quantize a Hugging Face model directory with a preset
// (W4A16, W4A16_ASYM, W8A16, W8A8, FP8_DYNAMIC, NVFP4A16), dequantize such a directory, inspect one. See docs/cli.md,
// "Model directories and the compressed-tensors format".
//
// ct_presets.cpp: the presets, which modules are quantized, the config, the scales.
// ct_export.cpp:  quantize a directory (the numbers: the library's quantize_out, scalar passes around it).
// ct_read.cpp:    read a compressed-tensors directory or file: dequantize (the library's anti_quant_out),
//                 inspect.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "jobs.hpp"
#include "plan.hpp"
#include "safetensors.hpp"

namespace xqcli {

struct ExportOptions {
  std::string preset = "W4A16";   // W4A16 | W4A16_ASYM | W8A16 | W8A8 | FP8_DYNAMIC | NVFP4A16, any case
  std::int64_t group_size = 128;  // W4A16 / W8A16; 0: one scale per output channel
  bool group_size_given = false;
  // compressed-tensors' selection syntax (docs/cli.md, "Which modules are quantized"): a module class
  // name (Linear, Embedding, as inferred from the checkpoint), "re:REGEX" (Python's re.match: anchored at
  // the start of the module name only), or an exact module name.
  std::vector<std::string> ignore;                // keep dense
  std::vector<std::string> targets;               // quantize only these
  std::optional<std::uint64_t> max_shard_size;    // bytes; nullopt: keep the input's shards, else 5 GB
  std::string scale_rule = "compressed-tensors";  // or "amax-qmax" (xquant's rule before issue 19)
  bool keep_partial_dense = false;                // a layer whose K the group size does not divide stays dense
  std::string recipe_yaml;                        // --recipe: written into the output as recipe.yaml (recipe.hpp)
  std::string observer = "minmax";                // or "mse": a search of the clipping range per group (ct_mse_range)
};

// The weight type of a preset: integers (W4A16, W4A16_ASYM, W8A16, W8A8), FP8 E4M3 with one scale per
// output channel (FP8_DYNAMIC, float-quantized), or FP4 E2M1 in groups of 16 with FP8 E4M3 group scales
// and a float32 global scale per tensor (NVFP4A16, nvfp4-pack-quantized).
enum class CtKind { Int, Fp8, Nvfp4 };

// A preset as compressed-tensors names it.
struct Preset {
  std::string name;  // upper case
  CtKind kind = CtKind::Int;
  int bits = 4;              // weight bits
  bool packed = true;        // pack-quantized (int32 words; NVFP4A16: two FP4 per uint8) vs one value per byte
  bool act8 = false;         // dynamic per-token input activations (W8A8: int8, FP8_DYNAMIC: FP8 E4M3)
  bool symmetric = true;     // false: a zero point per group (W4A16_ASYM)
  bool amax_qmax = false;    // the old scale rule amax / qmax (--scale-rule amax-qmax)
  bool mse = false;          // --observer mse
  std::int64_t group = 128;  // 0: per output channel
};
Preset make_preset(const ExportOptions& e);

// One --targets / --ignore entry (compressed-tensors' match_name / class match).
struct CtSelector {
  std::string text;
  std::shared_ptr<const std::regex> re;  // "re:" entries
  bool matched = false;                  // set by the decisions: an entry that matches nothing is an error
};
struct CtSelection {
  std::vector<CtSelector> targets;  // empty: the default (every Linear but output heads and routers)
  std::vector<CtSelector> ignore;
};
// Compiles the entries; a bad regular expression is a usage error naming the option and the entry.
CtSelection compile_selection(const ExportOptions& e);
// Whether `s` selects module `module` of inferred class `cls` ("Linear" or "Embedding").
bool selector_matches(const CtSelector& s, const std::string& module, const std::string& cls);
// The usage error (exit 1) for the entries that matched no module of the model, if any.
void check_all_matched(const CtSelection& sel);

// What happens to one tensor of the input.
struct CtDecision {
  bool quantize = false;
  bool warn = false;     // kept because it cannot be quantized (an error under --strict)
  bool ignore = false;   // its module goes into the config's ignore list
  std::string module;    // the name without ".weight" (rank-2 ".weight" tensors only)
  std::string reason;    // why kept
  bool partial = false;  // kept because the group size (or packing) does not divide K
};

// Module-name classification used by the decision (exposed for the tests).
bool is_embedding_module(const std::string& module);
bool is_default_ignored_module(const std::string& module);

// The decision for one tensor (docs/cli.md, "Which modules are quantized"): `include` is --targets,
// `tied`: config.json's tie_word_embeddings. Marks the selectors that match the module.
CtDecision decide_ct(const TensorEntry& t, const Preset& p, CtSelection& sel, bool tied);

// The module's class as compressed-tensors would see it, inferred from its name: "Embedding" or "Linear".
std::string inferred_class(const std::string& module);

// The one-line error for layers that the group size does not divide: how many, and which group sizes
// (multiples of 8 dividing every quantized layer's K) would.
std::string partial_groups_message(const Preset& p, const std::vector<std::int64_t>& partial_k,
                                   const std::vector<std::int64_t>& all_k);

// The config's "format" of a preset: pack-quantized, int-quantized, float-quantized, nvfp4-pack-quantized.
const char* ct_format_name(const Preset& p);

// config.json's "quantization_config" of a preset, `ignore` the module names left dense (sorted), as
// JSON text (an object, keys in compressed-tensors' order).
std::string quantization_config_json(const Preset& p, const std::vector<std::string>& ignore);

// The stored scale of one group under --scale-rule amax-qmax (xquant's rule before issue 19; the default
// is ct_qparams below): s = amax / qmax in float32 (amax = 0: s = 1; s below FLT_MIN: FLT_MIN),
// rounded to nearest even to `scale_dt` (F32, F16 or BF16; a float16 scale that rounds to 0 becomes
// 2^-24). `bits` are the stored scale's bits (little endian, the low ssize bytes), `widened` the stored
// scale back in float32 (s'). `ok` is false when the scale dtype cannot hold the group: s' is not
// finite, or neither is the largest dequantized value qmax * s' rounded to the scale dtype (what the
// loader computes); then nothing may be written (issue 17: such a model got +Inf scales and NaN weights).
struct CtScale {
  std::uint32_t bits = 0;
  float widened = 0.0f;
  float largest = 0.0f;  // the largest |q - zp| * s' rounded to the scale dtype
  float zero_point = 0;  // an integer in [qmin, qmax] (asymmetric), else 0
  bool ok = false;
};
CtScale ct_scale(float amax, int num_bits, StDType scale_dt);
// compressed-tensors' calculate_qparams for the group's finite minimum `lo` and maximum `hi`, in float32
// (docs/cli.md, "The numbers"): lo = min(lo, 0), hi = max(hi, 0); symmetric s = max(-lo, hi) / ((qmax -
// qmin) / 2) (7.5 int4, 127.5 int8), zero point 0; asymmetric s = (hi - lo) / (qmax - qmin), zp =
// rint(clamp(qmin - lo / s, qmin, qmax)) (0 when it is NaN: an all-zero group); s rounded to nearest even
// to scale_dt, and a stored 0 replaced by the scale dtype's epsilon. With p.amax_qmax: ct_scale(amax).
CtScale ct_qparams(float lo, float hi, const Preset& p, StDType scale_dt);

// --observer mse: among the ranges [lo * f, hi * f], f = 1 - i / 100 for i = 0 .. 19 (llm-compressor's
// MSE observer's grid, maxshrink 0.2, searched to the end for each group), the one whose parameters
// (ct_qparams, the scale rounded to scale_dt) give the smallest sum of squared errors
// (x - (q - zp) * s')^2 over the finite values of the group, in float32 arithmetic summed in double;
// ties keep the larger range, so i = 0 (min-max) is kept unless another is strictly better. Updates lo
// and hi; returns the factor's index i.
int ct_mse_range(const float* v, std::int64_t n, float& lo, float& hi, const Preset& p, StDType scale_dt);
// A message for a group whose scale is not ok: amax, the scale and its dtype, the largest value.
std::string ct_scale_problem(float amax, int num_bits, StDType scale_dt, const CtScale& s);

// ---- the float presets (docs/cli.md, "FP8_DYNAMIC and NVFP4A16") ----
//
// FP8_DYNAMIC, one output channel (row) whose largest finite |x| is `amax` (compressed-tensors'
// calculate_qparams for float 8-bit weights, in float32): s = amax / 448 rounded to nearest even to
// `scale_dt` (F32, F16, BF16); a stored 0 (an all-zero row, or a scale that underflows) becomes the
// epsilon of scale_dt (2^-23, 2^-10, 2^-7), as ct_qparams does. `ok` is false when s' or the largest
// dequantized value 448 * s' rounded to scale_dt is not finite.
CtScale ct_fp8_scale(float amax, StDType scale_dt);
// The FP8 E4M3 bits of x / s' (float32 division) clamped to [-448, 448] and rounded to nearest even
// (src/core/float8.hpp); x finite, s' > 0.
std::uint8_t ct_fp8_quantize(float x, float s);

// NVFP4A16, one tensor whose largest finite |x| is `amax`: the global scale 448 * 6 / amax as
// compressed-tensors' generate_gparam computes it in float32: amax raised to FLT_MIN, then (torch's
// scalar / tensor is the reciprocal times the scalar) fl(fl(1 / amax) * 2688), and 1 when that is not
// finite (an all-zero tensor, or amax below about 7.9e-36).
float ct_nvfp4_global_scale(float amax);
// One group of 16 whose largest finite |x| is `amax`, with the tensor's global scale `gs`: the FP8 E4M3
// scale fl(gs * fl(amax / 6)) clamped to 448 and rounded to nearest even; a scale of 0 (an all-zero
// group, or one below half of E4M3's smallest subnormal 2^-9) becomes `kNvfp4ZeroScale`, as
// compressed-tensors does. `bits` the E4M3 byte, `widened` the effective scale fl(E4M3 value / gs)
// (what quantization divides by and dequantization multiplies by), `largest` 6 * widened; `ok` when both
// are finite.
CtScale ct_nvfp4_scale(float amax, float gs);
inline constexpr std::uint8_t kNvfp4ZeroScale = 0x20;  // E4M3 0.125
// The FP4 E2M1 code (bit 3 the sign, bits 0-2 the index of 0, 0.5, 1, 1.5, 2, 3, 4, 6) of x / s (float32
// division) clamped to [-6, 6], rounded to nearest even (ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
// 2.5 -> 2, 3.5 -> 4, 5 -> 4); the sign bit is set when x / s < 0 (-0.0 gives +0, as compressed-tensors'
// cast_to_fp4 does). x finite, s > 0.
std::uint8_t ct_fp4_quantize(float x, float s);
// The value of an FP4 E2M1 code (exact).
float ct_fp4_value(std::uint8_t code);

// The quantization of `groups` consecutive groups of G elements of a weight (a run of whole groups in
// row-major order; G = K per channel) at `x`, which need not be aligned: scales and zero points as
// ct_qparams() over the finite minimum / maximum of each group (after ct_mse_range() with --observer mse),
// the weight quantized with the widened stored scale by xquant::quantize_out (qint8, div_mode=true,
// q = sat(rint(x / s' + zp)), clamped to [-8, 7] for int4; with amax-qmax int4 is quint4x2,
// div_mode=false, q = rint(x * (1 / s'))) on the [groups, G] view, then stored as compressed-tensors does: int4 nibbles
// and 8-bit packed bytes offset by 8 / 128 (word ^ 0x88888888 / 0x80808080), int-quantized int8 as is.
// `q` receives groups * G bytes (8 bits) or groups * G / 2 (4 bits); `scale` `groups` entries of
// `scale_dt`; `zp` (asymmetric presets) `groups` int8 zero points. `first_group` (the index of the first group in the
// tensor) and `groups_per_row` (K / G) only name the place of a scale that cannot be stored, in the CliError thrown
// (exit 1). Returns the round-trip error sums (x against q * s' in float32).
// FP8_DYNAMIC: ct_fp8_scale / ct_fp8_quantize, `q` groups * G E4M3 bytes, `scale` in scale_dt.
// NVFP4A16: ct_nvfp4_scale with the tensor's `global_scale` / ct_fp4_quantize, `q` groups * G / 2 bytes
// (element 2i in the low nibble of byte i, 2i + 1 in the high one), `scale` E4M3 bytes (scale_dt is
// F8_E4M3). Both refuse a NaN or +-Inf weight (CliError naming its row and column).
ErrorStats ct_quantize_groups(const std::byte* x, StDType dt, std::int64_t groups, std::int64_t G, const Preset& p,
                              StDType scale_dt, std::byte* q, std::byte* scale, std::int64_t first_group = 0,
                              std::int64_t groups_per_row = 1, std::int8_t* zp = nullptr, float global_scale = 0.0f);

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
