// The compressed-tensors presets (W4A16, W4A16_ASYM, W8A16, W8A8, FP8_DYNAMIC, NVFP4A16), which modules
// they quantize, the config they write, and the stored scale of a group. docs/cli.md, "Model directories and the
// compressed-tensors format".
#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <set>

#include "compressed_tensors.hpp"
#include "ct_internal.hpp"
#include "errors.hpp"
#include "core/float8.hpp"
#include "xquant/half.hpp"

namespace xqcli {

namespace {

std::string last_component(const std::string& module) {
  const auto dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

}  // namespace

// ---- presets and decisions ----

Preset make_preset(const ExportOptions& e) {
  Preset p;
  std::string name = e.preset;
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  p.name = name;
  if (e.scale_rule == "amax-qmax")
    p.amax_qmax = true;
  else if (e.scale_rule != "compressed-tensors")
    bad_input("--scale-rule: expected compressed-tensors or amax-qmax, got '" + e.scale_rule + "'");
  if (e.observer == "mse")
    p.mse = true;
  else if (e.observer != "minmax")
    bad_input("--observer: expected minmax or mse, got '" + e.observer + "'");
  if (p.mse && p.amax_qmax) bad_input("--observer mse needs the compressed-tensors scale rule, not amax-qmax");
  if (name == "W4A16") {
    p.bits = 4;
  } else if (name == "W4A16_ASYM") {
    p.bits = 4;
    p.symmetric = false;
    if (p.amax_qmax) bad_input("--scale-rule amax-qmax is symmetric; W4A16_ASYM needs the compressed-tensors rule");
  } else if (name == "W8A16") {
    p.bits = 8;
  } else if (name == "W8A8") {
    p.bits = 8;
    p.packed = false;
    p.act8 = true;
    if (e.group_size_given && e.group_size != 0)
      bad_input("--group-size: W8A8 has one scale per output channel (int-quantized); got " +
                std::to_string(e.group_size));
    p.group = 0;
    return p;
  } else if (name == "FP8_DYNAMIC" || name == "NVFP4A16") {
    const bool fp8 = name == "FP8_DYNAMIC";
    p.kind = fp8 ? CtKind::Fp8 : CtKind::Nvfp4;
    p.bits = fp8 ? 8 : 4;
    p.packed = !fp8;
    p.act8 = fp8;
    if (p.amax_qmax)
      bad_input("--scale-rule amax-qmax is a rule of the int presets; " + name +
                " has compressed-tensors' float rule only (--scale-rule compressed-tensors)");
    if (p.mse) bad_input("--observer mse searches int ranges; " + name + " takes --observer minmax only");
    const std::int64_t fixed = fp8 ? 0 : 16;
    if (e.group_size_given && e.group_size != fixed)
      bad_input("--group-size: " + name +
                (fp8 ? " has one scale per output channel (float-quantized), expected 0"
                     : " has groups of 16 (nvfp4-pack-quantized), expected 16") +
                "; got " + std::to_string(e.group_size));
    p.group = fixed;
    return p;
  } else {
    bad_input("--preset: unknown preset '" + e.preset +
              "', expected W4A16, W4A16_ASYM, W8A16, W8A8, FP8_DYNAMIC or NVFP4A16 (any case)");
  }
  if (e.group_size < 0 || (e.group_size != 0 && e.group_size % 8 != 0))
    bad_input("--group-size: expected 0 (per output channel) or a positive multiple of 8, got " +
              std::to_string(e.group_size));
  p.group = e.group_size;
  return p;
}

// ---- selection (compressed-tensors' match_name and class match) ----

CtSelection compile_selection(const ExportOptions& e) {
  CtSelection sel;
  const auto compile = [](const std::vector<std::string>& in, const char* option) {
    std::vector<CtSelector> out;
    for (const auto& text : in) {
      CtSelector s;
      s.text = text;
      if (text.rfind("re:", 0) == 0) {
        try {
          s.re = std::make_shared<const std::regex>(text.substr(3), std::regex::ECMAScript);
        } catch (const std::regex_error& ex) {
          bad_input(std::string(option) + ": bad regular expression '" + text + "': " + ex.what());
        }
      } else if (text.empty()) {
        bad_input(std::string(option) + ": an empty entry (expected a module name, a class name or re:REGEX)");
      }
      out.push_back(std::move(s));
    }
    return out;
  };
  sel.targets = compile(e.targets, "--targets");
  sel.ignore = compile(e.ignore, "--ignore");
  return sel;
}

bool selector_matches(const CtSelector& s, const std::string& module, const std::string& cls) {
  if (s.re) return std::regex_search(module, *s.re, std::regex_constants::match_continuous);
  return s.text == module || s.text == cls;
}

void check_all_matched(const CtSelection& sel) {
  std::string bad;
  const auto collect = [&](const std::vector<CtSelector>& v, const char* option) {
    for (const auto& s : v) {
      if (s.matched) continue;
      if (!bad.empty()) bad += "; ";
      bad += std::string(option) + " '" + s.text + "'";
      const bool looks_regex = !s.re && s.text.find_first_of("^$*+?()[]|\\") != std::string::npos;
      if (looks_regex)
        bad += " (a plain entry is an exact module name; write re:" + s.text + " for a regular expression)";
    }
  };
  collect(sel.targets, "--targets");
  collect(sel.ignore, "--ignore");
  if (!bad.empty())
    bad_input("matches no module of the model: " + bad +
              " (entries are module class names (Linear), exact module names, or re:REGEX matched from the start "
              "of the module name)");
}

std::string inferred_class(const std::string& module) { return is_embedding_module(module) ? "Embedding" : "Linear"; }

bool is_embedding_module(const std::string& module) {
  const std::string c = last_component(module);
  if (c == "embed_out") return false;  // GPT-NeoX's output head is a Linear
  return c.find("embed") != std::string::npos || c == "wte" || c == "wpe" || c == "shared";
}

bool is_default_ignored_module(const std::string& module) {
  const std::string c = last_component(module);
  return c == "lm_head" || c == "embed_out" || module == "cls.predictions.decoder" || c == "gate" || c == "router" ||
         c == "shared_expert_gate";
}

CtDecision decide_ct(const TensorEntry& t, const Preset& p, CtSelection& sel, bool tied) {
  CtDecision d;
  if (!ct::ends_with(t.name, ".weight") || t.shape.size() != 2) {
    d.reason = t.shape.size() != 2
                   ? "rank " + std::to_string(t.shape.size()) + " (only 2-D Linear weights are quantized)"
                   : "not a module's .weight";
    return d;
  }
  d.module = t.name.substr(0, t.name.size() - 7);
  d.ignore = true;  // every 2-D .weight left dense is listed
  const std::string cls = inferred_class(d.module);
  // Every entry is tried (not only up to the first match) so that each one's `matched` is known.
  const auto matches = [&](std::vector<CtSelector>& v) {
    bool any = false;
    for (auto& s : v)
      if (selector_matches(s, d.module, cls)) any = s.matched = true;
    return any;
  };
  const bool targeted = matches(sel.targets);
  const bool ignored = matches(sel.ignore);
  if (!st_is_quantizable(t.dtype)) {
    d.reason = "dtype " + std::string(st_dtype_name(t.dtype)) + " is not F32, F16 or BF16";
    return d;
  }
  if (cls == "Embedding") {
    d.reason = "embedding (not a Linear layer)";
    return d;
  }
  if (!sel.targets.empty()) {
    if (!targeted) {
      d.reason = "not matched by --targets";
      return d;
    }
  } else if (is_default_ignored_module(d.module)) {
    d.reason = "output head or MoE router (dense by default)";
    return d;
  }
  if (ignored) {
    d.reason = "matched by --ignore";
    return d;
  }
  if (tied && last_component(d.module) == "lm_head") {
    d.warn = !sel.targets.empty();
    d.reason = "tied to the input embedding (tie_word_embeddings)";
    return d;
  }
  if (t.numel == 0) {
    d.reason = "empty tensor";
    return d;
  }
  const std::int64_t K = t.shape[1];
  const std::int64_t G = p.group == 0 ? K : p.group;
  const std::int64_t pack = p.packed ? 32 / p.bits : 1;
  if (K % G != 0) {
    d.warn = d.partial = true;
    d.reason = "input dimension " + std::to_string(K) + " is not divisible by the group size " + std::to_string(G);
    return d;
  }
  if (K % pack != 0) {
    d.warn = d.partial = true;
    d.reason = "input dimension " + std::to_string(K) + " is not divisible by " + std::to_string(pack) +
               " (values per packed int32)";
    return d;
  }
  d.quantize = true;
  d.ignore = false;
  return d;
}

std::string partial_groups_message(const Preset& p, const std::vector<std::int64_t>& partial_k,
                                   const std::vector<std::int64_t>& all_k) {
  std::int64_t g = 0;
  for (const std::int64_t k : all_k) g = std::gcd(g, k);
  std::string fits;
  if (g > 0)
    for (std::int64_t c = g; c >= 8; --c)
      if (g % c == 0 && c % 8 == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(c);
  if (p.kind == CtKind::Nvfp4) {
    std::set<std::int64_t> ks(partial_k.begin(), partial_k.end());
    std::string kl;
    for (const std::int64_t k : ks) kl += (kl.empty() ? "" : ", ") + std::to_string(k);
    return std::to_string(partial_k.size()) + " of " + std::to_string(all_k.size()) +
           " targeted Linear layers have an input width (" + kl +
           ") that NVFP4A16's groups of 16 do not divide (the group size of NVFP4A16 is fixed); --ignore them or use "
           "--keep-partial-dense to keep those layers dense";
  }
  const std::int64_t pack = p.packed ? 32 / p.bits : 1;
  bool per_channel = true;
  for (const std::int64_t k : all_k) per_channel = per_channel && k % pack == 0;
  if (per_channel) fits += std::string(fits.empty() ? "" : ", ") + "0 (one scale per output channel)";
  std::set<std::int64_t> ks(partial_k.begin(), partial_k.end());
  std::string kl;
  for (const std::int64_t k : ks) kl += (kl.empty() ? "" : ", ") + std::to_string(k);
  return std::to_string(partial_k.size()) + " of " + std::to_string(all_k.size()) +
         " targeted Linear layers have an input width (" + kl + ") that " +
         (p.group == 0 ? "the packing of " + std::to_string(pack) + " values per int32"
                       : "the group size " + std::to_string(p.group)) +
         " does not divide; --group-size values that divide every layer: " + (fits.empty() ? "none" : fits) +
         " (or --keep-partial-dense to keep those layers dense)";
}

// ---- the config ----

namespace {

ct::OJ weights_args(const Preset& p) {
  ct::OJ w = ct::OJ::object();
  w["num_bits"] = p.bits;
  w["type"] = p.kind == CtKind::Int ? "int" : "float";
  w["symmetric"] = p.symmetric;
  w["group_size"] = p.group == 0 ? ct::OJ(nullptr) : ct::OJ(p.group);
  w["strategy"] = p.group == 0 ? "channel" : p.kind == CtKind::Nvfp4 ? "tensor_group" : "group";
  w["dynamic"] = false;
  if (p.kind == CtKind::Nvfp4) w["scale_dtype"] = "torch.float8_e4m3fn";  // as compressed-tensors writes NVFP4A16
  return w;
}

}  // namespace

const char* ct_format_name(const Preset& p) {
  if (p.kind == CtKind::Fp8) return "float-quantized";
  if (p.kind == CtKind::Nvfp4) return "nvfp4-pack-quantized";
  return p.packed ? "pack-quantized" : "int-quantized";
}

std::string quantization_config_json(const Preset& p, const std::vector<std::string>& ignore) {
  using ct::OJ;
  OJ g = OJ::object();
  g["targets"] = OJ::array({"Linear"});
  g["weights"] = weights_args(p);
  if (p.act8) {
    OJ a = OJ::object();
    a["num_bits"] = 8;
    a["type"] = p.kind == CtKind::Fp8 ? "float" : "int";
    a["symmetric"] = true;
    a["group_size"] = nullptr;
    a["strategy"] = "token";
    a["dynamic"] = true;
    g["input_activations"] = std::move(a);
  } else {
    g["input_activations"] = nullptr;
  }
  g["output_activations"] = nullptr;
  OJ c = OJ::object();
  c["quant_method"] = "compressed-tensors";
  c["format"] = ct_format_name(p);
  c["quantization_status"] = "compressed";
  c["config_groups"] = {{"group_0", std::move(g)}};
  c["ignore"] = OJ(ignore);
  c["kv_cache_scheme"] = nullptr;
  c["global_compression_ratio"] = nullptr;
  return c.dump();
}

// ---- the scale of a group ----

namespace ct {

float decode_scale(std::uint32_t bits, StDType dt) {
  if (dt == StDType::BF16) {
    const std::uint32_t u = bits << 16;  // exact (a NaN keeps its payload)
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  if (dt == StDType::F16) return xquant::half_to_float(static_cast<std::uint16_t>(bits));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace ct

namespace {

// float32 rounded to nearest even to `dt`, as bits.
std::uint32_t encode(float v, StDType dt) {
  if (dt == StDType::BF16) return xquant::float_to_bfloat16(v);
  if (dt == StDType::F16) return xquant::float_to_half(v);
  std::uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

}  // namespace

CtScale ct_scale(float amax, int num_bits, StDType scale_dt) {
  const float qmax = num_bits == 4 ? 7.0f : 127.0f;
  float s = amax / qmax;
  if (amax == 0.0f)
    s = 1.0f;
  else if (!(s >= FLT_MIN))
    s = FLT_MIN;
  CtScale r;
  r.bits = encode(s, scale_dt);
  // Never 0 (so that 1 / s' stays finite): a float16 scale that underflows is the smallest subnormal.
  if (scale_dt == StDType::F16 && (r.bits & 0x7fffu) == 0) r.bits = 0x0001u;
  r.widened = ct::decode_scale(r.bits, scale_dt);
  // The loader's dequantization q * s' in the scale dtype; |q| <= qmax for finite weights.
  r.largest = ct::decode_scale(encode(qmax * r.widened, scale_dt), scale_dt);
  r.ok = std::isfinite(r.widened) && std::isfinite(r.largest);
  return r;
}

namespace {

// torch.finfo(dtype).eps of the scale dtype: what compressed-tensors stores for a scale of 0.
float dtype_eps(StDType dt) {
  if (dt == StDType::BF16) return 0.0078125f;    // 2^-7
  if (dt == StDType::F16) return 0.0009765625f;  // 2^-10
  return FLT_EPSILON;                            // 2^-23
}

}  // namespace

CtScale ct_qparams(float lo, float hi, const Preset& p, StDType scale_dt) {
  if (p.amax_qmax) return ct_scale(std::max(-lo, hi), p.bits, scale_dt);
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  const float qmin = -static_cast<float>(1 << (p.bits - 1));
  const float qmax = static_cast<float>((1 << (p.bits - 1)) - 1);
  const float range = qmax - qmin;  // 15 or 255
  float s, zp = 0.0f;
  if (p.symmetric) {
    s = std::max(-lo, hi) / (range / 2.0f);
  } else {
    s = (hi - lo) / range;
    const float z = qmin - lo / s;  // NaN for an all-zero group (0 / 0)
    zp = std::isnan(z) ? 0.0f : std::nearbyint(std::clamp(z, qmin, qmax));
  }
  CtScale r;
  r.bits = encode(s, scale_dt);
  r.widened = ct::decode_scale(r.bits, scale_dt);
  if (r.widened == 0.0f) {  // an all-zero group, or a scale that underflowed in the scale dtype
    r.bits = encode(dtype_eps(scale_dt), scale_dt);
    r.widened = ct::decode_scale(r.bits, scale_dt);
  }
  r.zero_point = zp;
  // The loader's (q - zp) * s' in the scale dtype: |q - zp| is at most 2^(b-1) symmetric, 2^b - 1 asymmetric.
  const float span = p.symmetric ? -qmin : range;
  r.largest = ct::decode_scale(encode(span * r.widened, scale_dt), scale_dt);
  r.ok = std::isfinite(r.widened) && std::isfinite(r.largest);
  return r;
}

namespace {

double squared_error(const float* v, std::int64_t n, const CtScale& s, int bits) {
  const float qmin = -static_cast<float>(1 << (bits - 1)), qmax = static_cast<float>((1 << (bits - 1)) - 1);
  double sum = 0.0;
  for (std::int64_t k = 0; k < n; ++k) {
    const float x = v[k];
    if (!(std::fabs(x) <= FLT_MAX)) continue;
    const float t = x / s.widened + s.zero_point;
    const float q = std::nearbyint(std::clamp(t, qmin, qmax));
    const float e = x - (q - s.zero_point) * s.widened;
    sum += static_cast<double>(e) * static_cast<double>(e);
  }
  return sum;
}

}  // namespace

int ct_mse_range(const float* v, std::int64_t n, float& lo, float& hi, const Preset& p, StDType scale_dt) {
  double best = 0.0;
  int best_i = -1;
  const float lo0 = lo, hi0 = hi;
  for (int i = 0; i < 20; ++i) {
    const float f = 1.0f - static_cast<float>(i) / 100.0f;
    const CtScale s = ct_qparams(lo0 * f, hi0 * f, p, scale_dt);
    if (!s.ok) continue;
    const double e = squared_error(v, n, s, p.bits);
    if (best_i < 0 || e < best) {
      best = e;
      best_i = i;
    }
  }
  if (best_i <= 0) return 0;  // min-max (also when no candidate can be stored: its refusal follows)
  const float f = 1.0f - static_cast<float>(best_i) / 100.0f;
  lo = lo0 * f;
  hi = hi0 * f;
  return best_i;
}

std::string ct_scale_problem(float amax, int num_bits, StDType scale_dt, const CtScale& s) {
  (void)num_bits;
  const double top = scale_dt == StDType::F16 ? 65504.0 : scale_dt == StDType::BF16 ? 3.3895313892515355e38 : FLT_MAX;
  const std::string sdt(st_dtype_name(scale_dt));
  const auto num = [](double v) {
    if (std::isnan(v)) return std::string("NaN");
    if (std::isinf(v)) return std::string(v > 0 ? "+Inf" : "-Inf");
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  return "amax " + num(amax) + " gives the scale " + num(s.widened) + " in " + sdt +
         " and the largest dequantized value " + num(s.largest) + ", which " + sdt +
         " cannot hold (its largest finite value is " + num(top) +
         "); refusing to write infinite or NaN weights (the scale dtype is config.json's torch_dtype, else the "
         "weight's "
         "dtype)";
}

// ---- the float presets ----

namespace {

constexpr auto kE4m3 = xquant::DType::float8_e4m3fn;

float e4m3_value(std::uint8_t b) { return xquant::detail::hd_float8_to_float(b, kE4m3); }

}  // namespace

CtScale ct_fp8_scale(float amax, StDType scale_dt) {
  // calculate_qparams: max(|min|, |max|) / ((448 - (-448)) / 2); a scale of 0 becomes the epsilon of its
  // dtype (here, as for the int presets, of the stored scale's dtype: the scale is rounded first).
  CtScale r;
  r.bits = encode(amax / 448.0f, scale_dt);
  r.widened = ct::decode_scale(r.bits, scale_dt);
  if (r.widened == 0.0f) {
    r.bits = encode(dtype_eps(scale_dt), scale_dt);
    r.widened = ct::decode_scale(r.bits, scale_dt);
  }
  r.largest = ct::decode_scale(encode(448.0f * r.widened, scale_dt), scale_dt);
  r.ok = std::isfinite(r.widened) && std::isfinite(r.largest);
  return r;
}

std::uint8_t ct_fp8_quantize(float x, float s) { return ct::fp8_quantize(x, s); }

float ct_nvfp4_global_scale(float amax) {
  // generate_gparam: amax raised to float32's smallest normal, 448 * 6 / amax (torch's scalar / tensor is
  // t.reciprocal() * scalar: two roundings), a NaN or infinite result replaced by 1.
  const float r = 1.0f / std::max(amax, FLT_MIN);
  const float gs = r * 2688.0f;
  return std::isfinite(gs) ? gs : 1.0f;
}

CtScale ct_nvfp4_scale(float amax, float gs) {
  // calculate_qparams with a global scale: gs * (amax / 6), clamped to [-448, 448], cast to E4M3 (round
  // to nearest even); an E4M3 scale of 0 replaced by 0.125.
  const float t = std::min(gs * (amax / 6.0f), 448.0f);
  std::uint8_t b = xquant::detail::hd_float_to_float8(t, kE4m3, false);
  if ((b & 0x7Fu) == 0) b = kNvfp4ZeroScale;
  CtScale r;
  r.bits = b;
  r.widened = e4m3_value(b) / gs;  // _quantize / _dequantize: scale.to(float32) / global_scale
  r.largest = 6.0f * r.widened;
  r.ok = std::isfinite(r.widened) && std::isfinite(r.largest) && r.widened > 0.0f;
  return r;
}

std::uint8_t ct_fp4_quantize(float x, float s) { return ct::fp4_quantize(x, s); }

float ct_fp4_value(std::uint8_t code) { return ct::fp4_value(code); }

// ---- shared helpers ----

namespace ct {

std::optional<StDType> dtype_from_config(const json::Value& config) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!config[key].is_string()) continue;
    const std::string& v = config[key].text();
    if (v == "bfloat16") return StDType::BF16;
    if (v == "float16") return StDType::F16;
    if (v == "float32") return StDType::F32;
  }
  return std::nullopt;
}

std::map<std::string, std::string> out_metadata(const std::map<std::string, std::string>& in) {
  std::map<std::string, std::string> m = in;
  m["format"] = "pt";
  return m;
}

std::string index_json(const std::vector<OutPlan>& outs) {
  std::map<std::string, std::string> wmap;
  std::uint64_t total = 0;
  for (const auto& o : outs)
    for (const auto& t : o.tensors) {
      wmap[t.name] = o.name;
      total += t.nbytes;
    }
  // json::Value: hashed member insertion (ordered_json's operator[] scans: quadratic for 100k entries).
  json::Value j = json::Value::object();
  json::Value meta = json::Value::object();
  meta.set("total_size", json::Value::number_text(std::to_string(total)));
  j.set("metadata", std::move(meta));
  json::Value m = json::Value::object();
  for (const auto& [k, v] : wmap) m.set(k, json::Value::string(v));
  j.set("weight_map", std::move(m));
  return j.dump(2) + "\n";
}

void check_unique_names(const std::vector<OutPlan>& outs, const std::string& who) {
  std::map<std::string, const std::string*> seen;
  for (const auto& o : outs)
    for (const auto& t : o.tensors) {
      const auto [it, inserted] = seen.emplace(t.name, &o.name);
      if (!inserted)
        bad_input(who + ": the output would hold tensor '" + t.name + "' twice (" +
                  (*it->second == o.name ? "in " + o.name : "in " + *it->second + " and in " + o.name) +
                  "); refusing to write a duplicate name");
    }
}

}  // namespace ct

}  // namespace xqcli
