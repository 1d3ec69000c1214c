// Pure parts of quantize / dequantize, unit-tested on their own: which tensors are quantized, the
// per-channel parameters, the split of a tensor into pieces that one xquant::quantize call each handles,
// and the description of a quantized file in its __metadata__.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <regex.h>
#include <string>
#include <vector>

#include "safetensors.hpp"

namespace xqcli {

struct QuantScheme {
  int bits = 8;             // 8: qint8 (div_mode=true); 4: quint4x2 (div_mode=false)
  bool per_channel = true;  // false: per-tensor
  std::int64_t axis = 0;    // the channel axis as given (Python-style negative values wrap)
  bool symmetric = true;
};

// A POSIX extended regular expression (regcomp), matched anywhere in a name.
class Pattern {
 public:
  // A bad pattern is a usage error (exit 1) naming `option`.
  Pattern(const std::string& text, const char* option);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  bool search(const std::string& name) const noexcept;

 private:
  regex_t re_;
};

struct Filters {
  std::vector<std::shared_ptr<const Pattern>> include;  // empty: every name; else a name must match one
  std::vector<std::shared_ptr<const Pattern>> exclude;  // a name matching one is kept as is
};

// Compiles --include / --exclude patterns; a bad pattern is a usage error (exit 1).
std::vector<std::shared_ptr<const Pattern>> compile_patterns(const std::vector<std::string>& patterns,
                                                             const char* option);

struct Decision {
  bool quantize = false;
  bool warn = false;              // a candidate that the options cannot quantize (an error under --strict)
  std::string reason;             // why it is kept, when !quantize
  std::int64_t channel_dim = -1;  // the normalized channel dimension; -1 per-tensor
  std::int64_t channels = 1;      // number of (scale, zero point) pairs
};

// Tensors of a higher rank are kept (with a warning): NumPy's limit, and it bounds the size of the
// piece shapes that plan_pieces() returns.
inline constexpr std::int64_t kMaxQuantizeRank = 64;

// Whether tensor `t` is quantized under `scheme` and `filters`, and along which dimension.
Decision decide(const TensorEntry& t, const QuantScheme& scheme, const Filters& filters);

// Integer range of the stored values: [-128, 127] for 8 bits, [-8, 7] for 4 bits.
struct QRange {
  int qmin;
  int qmax;
};
QRange qrange(int bits) noexcept;

// Per-channel scale s (the step: x ~ (q - zero_point) * s) and zero point, from the finite minimum and
// maximum of each channel (lo > hi marks a channel without a finite value). Symmetric: s = amax / qmax,
// zero point 0. Asymmetric: the range is widened to contain 0, s = (hi - lo) / (qmax - qmin),
// zero_point = qmax - hi / s (float32, not rounded). All-zero channels get s = 1, zero point 0;
// s is never below FLT_MIN, so 1 / s is finite (no Inf / NaN scales).
struct QParams {
  std::vector<float> scale;
  std::vector<float> zero_point;  // all 0 when symmetric
};
QParams compute_params(const std::vector<float>& lo, const std::vector<float>& hi, int bits, bool symmetric);

// [outer, channels, inner] of a shape for a channel dimension (-1: per-tensor, [1, 1, numel]).
struct NormalForm {
  std::int64_t outer = 1;
  std::int64_t channels = 1;
  std::int64_t inner = 1;
};
NormalForm normal_form(const Dims& shape, std::int64_t channel_dim);

// A contiguous run of a tensor's elements that one quantize call handles: `shape` is the run's own
// shape (the tensor's trailing dimensions, the first one possibly shortened), its channels are
// [ch_begin, ch_begin + ch_count) of the tensor's parameters along piece dimension `ch_dim` (-1: the
// run lies in one channel, or the scheme is per-tensor; then ch_count == 1).
struct Piece {
  std::int64_t begin = 0;  // flat element offset in the tensor
  std::int64_t count = 0;
  Dims shape;
  std::int64_t ch_begin = 0;
  std::int64_t ch_count = 1;
  std::int64_t ch_dim = -1;
};

// Splits a tensor into pieces of at most max(target, one row) elements, in order, covering every
// element once, in time linear in the rank plus the pieces' size (no recursion). Runs inside one row are cut at
// multiples of `align` (8 for int4: a packed word never straddles two pieces).
std::vector<Piece> plan_pieces(const Dims& shape, std::int64_t channel_dim, std::int64_t target, std::int64_t align);

// ---- the quantized file format (docs/cli.md) ----
inline constexpr const char* kScaleSuffix = ".scale";
inline constexpr const char* kZeroPointSuffix = ".zero_point";
inline constexpr const char* kFormatVersion = "1";

struct QuantizedTensorInfo {
  StDType dtype = StDType::F32;   // original dtype
  Dims shape;                     // original shape
  std::int64_t channel_dim = -1;  // -1: per-tensor
};

struct QuantizedFileInfo {
  int bits = 8;
  bool per_channel = true;
  bool symmetric = true;
  std::string axis;  // as requested
  std::map<std::string, QuantizedTensorInfo> tensors;
};

// The xquant.* metadata entries of a quantized file.
std::map<std::string, std::string> quant_metadata(const QuantizedFileInfo& info);
// Reads them back; nullopt when the file has no xquant.format_version. Malformed entries are bad input.
std::optional<QuantizedFileInfo> parse_quant_metadata(const std::map<std::string, std::string>& metadata);

// A file's parsed header and, if xquant wrote it, its quantization metadata; errors are prefixed with
// the path.
struct FileHeader {
  Header header;
  std::optional<QuantizedFileInfo> info;
};
FileHeader read_file_header(const std::byte* data, std::uint64_t size, const std::string& path);

// Stored dtype / shape / size of a quantized tensor's data and of its scale (and zero point).
StDType quantized_dtype(int bits) noexcept;
Dims quantized_shape(const Dims& shape, int bits);
Dims param_shape(const Dims& shape, std::int64_t channel_dim);

}  // namespace xqcli
