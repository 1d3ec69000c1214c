// The compressed-tensors presets (W4A16, W8A16, W8A8), which modules they quantize, the config they
// write, and the stored scale of a group. docs/cli.md, "Model directories and the compressed-tensors
// format".
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <memory>

#include "compressed_tensors.hpp"
#include "ct_internal.hpp"
#include "errors.hpp"
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
  p.name = e.preset;
  if (e.preset == "W4A16") {
    p.bits = 4;
  } else if (e.preset == "W8A16") {
    p.bits = 8;
  } else if (e.preset == "W8A8") {
    p.bits = 8;
    p.packed = false;
    p.act8 = true;
    if (e.group_size_given && e.group_size != 0)
      bad_input("--group-size: W8A8 has one scale per output channel (int-quantized); got " +
                std::to_string(e.group_size));
    p.group = 0;
    return p;
  } else {
    bad_input("--preset: unknown preset '" + e.preset + "', expected W4A16, W8A16 or W8A8");
  }
  if (e.group_size < 0 || (e.group_size != 0 && e.group_size % 8 != 0))
    bad_input("--group-size: expected 0 (per output channel) or a positive multiple of 8, got " +
              std::to_string(e.group_size));
  p.group = e.group_size;
  return p;
}

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

CtDecision decide_ct(const TensorEntry& t, const Preset& p, const Filters& f, bool tied) {
  CtDecision d;
  if (!ct::ends_with(t.name, ".weight") || t.shape.size() != 2) {
    d.reason = t.shape.size() != 2
                   ? "rank " + std::to_string(t.shape.size()) + " (only 2-D Linear weights are quantized)"
                   : "not a module's .weight";
    return d;
  }
  d.module = t.name.substr(0, t.name.size() - 7);
  d.ignore = true;  // every 2-D .weight left dense is listed
  const auto matches = [&](const std::vector<std::shared_ptr<const Pattern>>& ps) {
    return std::any_of(ps.begin(), ps.end(), [&](const auto& pat) { return pat->search(d.module); });
  };
  if (!st_is_quantizable(t.dtype)) {
    d.reason = "dtype " + std::string(st_dtype_name(t.dtype)) + " is not F32, F16 or BF16";
    return d;
  }
  if (is_embedding_module(d.module)) {
    d.reason = "embedding (not a Linear layer)";
    return d;
  }
  if (!f.include.empty()) {
    if (!matches(f.include)) {
      d.reason = "not matched by --targets";
      return d;
    }
  } else if (is_default_ignored_module(d.module)) {
    d.reason = "output head or MoE router (dense by default)";
    return d;
  }
  if (matches(f.exclude)) {
    d.reason = "matched by --ignore";
    return d;
  }
  if (tied && last_component(d.module) == "lm_head") {
    d.warn = !f.include.empty();
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
    d.warn = true;
    d.reason = "input dimension " + std::to_string(K) + " is not divisible by the group size " + std::to_string(G);
    return d;
  }
  if (K % pack != 0) {
    d.warn = true;
    d.reason = "input dimension " + std::to_string(K) + " is not divisible by " + std::to_string(pack) +
               " (values per packed int32)";
    return d;
  }
  d.quantize = true;
  d.ignore = false;
  return d;
}

// ---- the config ----

namespace {

ct::OJ weights_args(const Preset& p) {
  ct::OJ w = ct::OJ::object();
  w["num_bits"] = p.bits;
  w["type"] = "int";
  w["symmetric"] = true;
  w["group_size"] = p.group == 0 ? ct::OJ(nullptr) : ct::OJ(p.group);
  w["strategy"] = p.group == 0 ? "channel" : "group";
  w["dynamic"] = false;
  return w;
}

}  // namespace

std::string quantization_config_json(const Preset& p, const std::vector<std::string>& ignore) {
  using ct::OJ;
  OJ g = OJ::object();
  g["targets"] = OJ::array({"Linear"});
  g["weights"] = weights_args(p);
  if (p.act8) {
    OJ a = OJ::object();
    a["num_bits"] = 8;
    a["type"] = "int";
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
  c["format"] = p.packed ? "pack-quantized" : "int-quantized";
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

std::string ct_scale_problem(float amax, int num_bits, StDType scale_dt, const CtScale& s) {
  const int qmax = num_bits == 4 ? 7 : 127;
  const double top = scale_dt == StDType::F16 ? 65504.0 : scale_dt == StDType::BF16 ? 3.3895313892515355e38 : FLT_MAX;
  const std::string sdt(st_dtype_name(scale_dt));
  const auto num = [](double v) {
    if (std::isnan(v)) return std::string("NaN");
    if (std::isinf(v)) return std::string(v > 0 ? "+Inf" : "-Inf");
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  return "amax " + num(amax) + " / " + std::to_string(qmax) + " gives the scale " + num(s.widened) + " in " + sdt +
         " and the largest dequantized value " + std::to_string(qmax) + " * scale = " + num(s.largest) + ", which " +
         sdt + " cannot hold (its largest finite value is " + num(top) +
         "); refusing to write infinite or NaN weights (the scale dtype is config.json's torch_dtype, else the "
         "weight's "
         "dtype)";
}

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
