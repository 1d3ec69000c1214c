#include "plan.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include <nlohmann/json.hpp>

#include "errors.hpp"
#include "xquant/version.hpp"

namespace xqcli {

Pattern::Pattern(const std::string& text, const char* option) {
  const int rc = ::regcomp(&re_, text.c_str(), REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    char buf[256];
    ::regerror(rc, &re_, buf, sizeof buf);
    bad_input(std::string(option) + ": invalid regular expression '" + text + "': " + buf);
  }
}

Pattern::~Pattern() { ::regfree(&re_); }

bool Pattern::search(const std::string& name) const noexcept {
  return ::regexec(&re_, name.c_str(), 0, nullptr, 0) == 0;
}

std::vector<std::shared_ptr<const Pattern>> compile_patterns(const std::vector<std::string>& patterns,
                                                             const char* option) {
  std::vector<std::shared_ptr<const Pattern>> out;
  out.reserve(patterns.size());
  for (const auto& p : patterns) out.push_back(std::make_shared<const Pattern>(p, option));
  return out;
}

Decision decide(const TensorEntry& t, const QuantScheme& scheme, const Filters& filters) {
  Decision d;
  const auto rank = static_cast<std::int64_t>(t.shape.size());
  if (!st_is_quantizable(t.dtype)) {
    d.reason = "dtype " + std::string(st_dtype_name(t.dtype)) + " is not F32, F16 or BF16";
    return d;
  }
  if (rank < 2) {
    d.reason = "rank " + std::to_string(rank) + " (scalars and 1-D tensors such as biases and norms stay as they are)";
    return d;
  }
  const auto matches = [&](const std::shared_ptr<const Pattern>& p) { return p->search(t.name); };
  if (!filters.include.empty() && std::none_of(filters.include.begin(), filters.include.end(), matches)) {
    d.reason = "not matched by --include";
    return d;
  }
  if (std::any_of(filters.exclude.begin(), filters.exclude.end(), matches)) {
    d.reason = "matched by --exclude";
    return d;
  }
  if (t.numel == 0) {
    d.reason = "empty tensor";
    return d;
  }
  if (rank > kMaxQuantizeRank) {
    d.warn = true;
    d.reason = "rank " + std::to_string(rank) + " is above " + std::to_string(kMaxQuantizeRank) +
               " (NumPy's limit; larger ranks are kept as they are)";
    return d;
  }
  if (scheme.per_channel) {
    if (scheme.axis < -rank || scheme.axis >= rank) {
      d.warn = true;
      d.reason =
          "axis " + std::to_string(scheme.axis) + " is out of range for a rank-" + std::to_string(rank) + " tensor";
      return d;
    }
    d.channel_dim = scheme.axis < 0 ? scheme.axis + rank : scheme.axis;
    d.channels = t.shape[static_cast<std::size_t>(d.channel_dim)];
  }
  if (scheme.bits == 4) {
    if (t.shape.back() % 8 != 0) {
      d.warn = true;
      d.reason = "int4 packs eight values per int32 along the last dimension, which must be divisible by 8 (it is " +
                 std::to_string(t.shape.back()) + ")";
      return d;
    }
    if (scheme.per_channel && d.channel_dim != rank - 2 && d.channel_dim != rank - 1) {
      d.warn = true;
      d.reason =
          "int4 (npu_quantize div_mode=false) takes per-channel scales only along the last two dimensions, "
          "not dimension " +
          std::to_string(d.channel_dim) + " of a rank-" + std::to_string(rank) + " tensor";
      return d;
    }
  }
  d.quantize = true;
  return d;
}

QRange qrange(int bits) noexcept { return bits == 4 ? QRange{-8, 7} : QRange{-128, 127}; }

QParams compute_params(const std::vector<float>& lo, const std::vector<float>& hi, int bits, bool symmetric) {
  const QRange r = qrange(bits);
  QParams p;
  p.scale.resize(lo.size());
  p.zero_point.assign(lo.size(), 0.0f);
  for (std::size_t c = 0; c < lo.size(); ++c) {
    float l = lo[c], h = hi[c];
    if (!(l <= h)) l = h = 0.0f;  // no finite value in this channel
    if (symmetric) {
      const float amax = std::max(std::fabs(l), std::fabs(h));
      float s = amax / static_cast<float>(r.qmax);  // s = amax / qmax
      if (amax == 0.0f)
        s = 1.0f;  // all-zero channel: q = 0, dequantizes to 0 exactly
      else if (!(s >= FLT_MIN))
        s = FLT_MIN;  // keep 1 / s finite for tiny channels
      p.scale[c] = s;
    } else {
      // The range always contains 0 (as PyTorch's observers do): a constant channel stays representable.
      const double wlo = std::min(static_cast<double>(l), 0.0);
      const double whi = std::max(static_cast<double>(h), 0.0);
      if (whi == wlo) {
        p.scale[c] = 1.0f;
        continue;
      }
      // In double: hi - lo can exceed FLT_MAX. Rounded once to float32.
      float s = static_cast<float>((whi - wlo) / static_cast<double>(r.qmax - r.qmin));
      if (!(s >= FLT_MIN)) s = FLT_MIN;
      p.scale[c] = s;
      p.zero_point[c] = static_cast<float>(static_cast<double>(r.qmax) - whi / static_cast<double>(s));
    }
  }
  return p;
}

NormalForm normal_form(const Dims& shape, std::int64_t channel_dim) {
  NormalForm f;
  if (channel_dim < 0) {
    f.inner = checked_numel(shape).value_or(0);
    return f;
  }
  const auto d = static_cast<std::size_t>(channel_dim);
  for (std::size_t i = 0; i < d; ++i) f.outer *= shape[i];
  f.channels = shape[d];
  for (std::size_t i = d + 1; i < shape.size(); ++i) f.inner *= shape[i];
  return f;
}

std::vector<Piece> plan_pieces(const Dims& shape, std::int64_t channel_dim, std::int64_t target, std::int64_t align) {
  std::vector<Piece> out;
  target = std::max<std::int64_t>(target, 1);
  align = std::max<std::int64_t>(align, 1);
  const std::int64_t n = checked_numel(shape).value_or(0);
  if (n == 0) return out;
  const std::size_t rank = shape.size();
  const std::int64_t channels = channel_dim < 0 ? 1 : shape[static_cast<std::size_t>(channel_dim)];
  // suffix[i]: elements of a slice over dimensions [i, rank) (no overflow: the product of all fits).
  std::vector<std::int64_t> suffix(rank + 1, 1);
  for (std::size_t i = rank; i-- > 0;) suffix[i] = suffix[i + 1] * shape[i];

  // The level L where pieces are cut, found without recursion (time and memory linear in the rank):
  // every dimension before L is iterated whole, because one slice over [L, rank) exceeds the target.
  enum class Cut { whole, row, group } cut = Cut::whole;
  std::size_t level = 0;
  for (;; ++level) {
    if (suffix[level] <= target) {
      cut = Cut::whole;  // the slice over [L, rank) is one piece
      break;
    }
    if (rank - level == 1) {
      cut = Cut::row;  // one long row: cut at multiples of `align`
      break;
    }
    if (suffix[level + 1] <= target) {
      cut = Cut::group;  // whole slices along dimension L, several per piece
      break;
    }
  }
  const Dims rest(shape.begin() + static_cast<std::ptrdiff_t>(level), shape.end());
  const auto L = static_cast<std::int64_t>(level);
  const std::int64_t blocks = n / suffix[level];
  for (std::int64_t o = 0; o < blocks; ++o) {
    const std::int64_t begin = o * suffix[level];
    // Channels along a dimension before L: one channel per block (a per-tensor call with that
    // channel's parameters); along L or after: the channel dimension of the block.
    std::int64_t ch_dim = -1, ch_begin = 0, ch_count = channels;
    if (channel_dim >= 0 && channel_dim < L) {
      const auto c = static_cast<std::size_t>(channel_dim);
      ch_begin = (begin / suffix[c + 1]) % shape[c];
      ch_count = 1;
    } else if (channel_dim >= L) {
      ch_dim = channel_dim - L;
    }
    if (cut == Cut::whole) {
      out.push_back({begin, suffix[level], rest, ch_begin, ch_count, ch_dim});
    } else if (cut == Cut::row) {
      const std::int64_t len_all = suffix[level];
      const std::int64_t step = std::max(align, target / align * align);
      for (std::int64_t s = 0; s < len_all; s += step) {
        const std::int64_t len = std::min(step, len_all - s);
        if (ch_dim == 0)
          out.push_back({begin + s, len, {len}, ch_begin + s, len, 0});
        else
          out.push_back({begin + s, len, {len}, ch_begin, ch_count, ch_dim});
      }
    } else {
      const std::int64_t slice = suffix[level + 1];
      const std::int64_t k = std::max<std::int64_t>(1, target / slice);
      for (std::int64_t i = 0; i < shape[level]; i += k) {
        const std::int64_t kk = std::min(k, shape[level] - i);
        Dims s = rest;
        s[0] = kk;
        if (ch_dim == 0)
          out.push_back({begin + i * slice, kk * slice, std::move(s), ch_begin + i, kk, 0});
        else
          out.push_back({begin + i * slice, kk * slice, std::move(s), ch_begin, ch_count, ch_dim});
      }
    }
  }
  return out;
}

// ---- format ----

StDType quantized_dtype(int bits) noexcept { return bits == 4 ? StDType::I32 : StDType::I8; }

Dims quantized_shape(const Dims& shape, int bits) {
  Dims s = shape;
  if (bits == 4 && !s.empty()) s.back() /= 8;
  return s;
}

Dims param_shape(const Dims& shape, std::int64_t channel_dim) {
  Dims s(shape.size(), 1);
  if (channel_dim >= 0) s[static_cast<std::size_t>(channel_dim)] = shape[static_cast<std::size_t>(channel_dim)];
  return s;
}

std::map<std::string, std::string> quant_metadata(const QuantizedFileInfo& info) {
  // Member by member (ordered_json's operator[] is a linear scan: quadratic for 100k tensors); the same
  // text as ordered_json's dump().
  std::string tensors = "{";
  for (const auto& [name, t] : info.tensors) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(st_dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["axis"] = t.channel_dim < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(t.channel_dim);
    if (tensors.size() > 1) tensors.push_back(',');
    tensors += nlohmann::json(name).dump();
    tensors.push_back(':');
    tensors += e.dump();
  }
  tensors.push_back('}');
  return {
      {"xquant.format_version", kFormatVersion},
      {"xquant.version", xquant::kVersion},
      {"xquant.bits", std::to_string(info.bits)},
      {"xquant.scheme", info.per_channel ? "per-channel" : "per-tensor"},
      {"xquant.axis", info.axis},
      {"xquant.mode", info.symmetric ? "symmetric" : "asymmetric"},
      {"xquant.tensors", tensors},
  };
}

std::optional<QuantizedFileInfo> parse_quant_metadata(const std::map<std::string, std::string>& metadata) {
  const auto version = metadata.find("xquant.format_version");
  if (version == metadata.end()) return std::nullopt;
  if (version->second != kFormatVersion)
    bad_input("unsupported xquant.format_version '" + version->second + "' (this xquant reads " + kFormatVersion + ")");
  const auto get = [&](const char* key) -> const std::string& {
    const auto it = metadata.find(key);
    if (it == metadata.end()) bad_input(std::string("quantized file without __metadata__ entry ") + key);
    return it->second;
  };
  QuantizedFileInfo info;
  const std::string& bits = get("xquant.bits");
  if (bits != "8" && bits != "4") bad_input("xquant.bits is '" + bits + "', expected 8 or 4");
  info.bits = bits == "4" ? 4 : 8;
  const std::string& scheme = get("xquant.scheme");
  if (scheme != "per-channel" && scheme != "per-tensor")
    bad_input("xquant.scheme is '" + scheme + "', expected per-channel or per-tensor");
  info.per_channel = scheme == "per-channel";
  const std::string& mode = get("xquant.mode");
  if (mode != "symmetric" && mode != "asymmetric")
    bad_input("xquant.mode is '" + mode + "', expected symmetric or asymmetric");
  info.symmetric = mode == "symmetric";
  info.axis = get("xquant.axis");

  const nlohmann::json j =
      parse_json_strict(get("xquant.tensors"), "xquant.tensors", "xquant.tensors is not valid JSON: ");
  if (!j.is_object()) bad_input("xquant.tensors must be a JSON object");
  for (const auto& [name, e] : j.items()) {
    const std::string who = "xquant.tensors['" + clip(name) + "']";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("axis"))
      bad_input(who + " must be an object with dtype, shape and axis");
    QuantizedTensorInfo t;
    const auto dt = e["dtype"].is_string() ? parse_st_dtype(e["dtype"].get<std::string>()) : std::nullopt;
    if (!dt || !st_is_quantizable(*dt))
      bad_input(who + ": dtype must be F32, F16 or BF16, got " + json_excerpt(e["dtype"]));
    t.dtype = *dt;
    if (!e["shape"].is_array()) bad_input(who + ": shape must be an array");
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        bad_input(who + ": shape must hold non-negative integers, got " + json_excerpt(e["shape"]));
      t.shape.push_back(d.get<std::int64_t>());
    }
    if (!checked_numel(t.shape)) bad_input(who + ": shape " + json_excerpt(e["shape"]) + " is too large");
    const auto rank = static_cast<std::int64_t>(t.shape.size());
    if (e["axis"].is_null()) {
      t.channel_dim = -1;
    } else if (e["axis"].is_number_integer() && e["axis"].get<std::int64_t>() >= 0 &&
               e["axis"].get<std::int64_t>() < rank) {
      t.channel_dim = e["axis"].get<std::int64_t>();
    } else {
      bad_input(who + ": axis must be null or a dimension of the shape, got " + json_excerpt(e["axis"]));
    }
    if (info.bits == 4 && (t.shape.empty() || t.shape.back() % 8 != 0))
      bad_input(who + ": an int4 tensor needs a last dimension divisible by 8, shape is " + clip(dims_str(t.shape)));
    info.tensors.emplace(name, std::move(t));
  }
  return info;
}

FileHeader read_file_header(const std::byte* data, std::uint64_t size, const std::string& path) {
  FileHeader f;
  try {
    f.header = parse_header(data, size);
    f.info = parse_quant_metadata(f.header.metadata);
  } catch (const CliError& e) {
    throw CliError(e.exit_code(), path + ": " + e.what());
  }
  return f;
}

}  // namespace xqcli
