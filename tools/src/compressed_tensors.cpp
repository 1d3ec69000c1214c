// Quantizing a Hugging Face model directory to the compressed-tensors format, and back.
//
// Streaming as `xquant quantize` does for one file: every input shard is mapped, not read; the output
// headers are computed first from the input headers; then each tensor is processed in blocks of rows
// (at most kChunkElems elements, quantized in parallel pieces), written at its offset, and its input
// pages are dropped from the mapping. Everything goes into a temporary directory that is renamed into
// place at the end (model_dir.hpp).
#include "compressed_tensors.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "errors.hpp"
#include "model_dir.hpp"
#include "passes.hpp"
#include "plan.hpp"
#include "progress.hpp"
#include "writer.hpp"
#include "xquant/half.hpp"
#include "xquant/quantize.hpp"
#include "xquant/version.hpp"

namespace xqcli {

namespace {

constexpr std::int64_t kPieceElems = std::int64_t{1} << 18;
constexpr std::int64_t kChunkElems = std::int64_t{1} << 24;
constexpr std::uint64_t kCopyChunk = std::uint64_t{64} << 20;
constexpr std::uint64_t kDefaultShard = 5'000'000'000ull;  // transformers' "5GB"

using OJ = nlohmann::ordered_json;

xquant::DType lib_dtype(StDType dt) {
  switch (dt) {
    case StDType::F16: return xquant::DType::float16;
    case StDType::BF16: return xquant::DType::bfloat16;
    default: return xquant::DType::float32;
  }
}

std::string last_component(const std::string& module) {
  const auto dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Stored scale: s rounded to the scale dtype; never 0 (a float16 scale that underflows becomes the
// smallest subnormal), so that 1 / s stays finite.
std::uint32_t encode_scale(float s, StDType dt) {
  if (dt == StDType::BF16) return xquant::float_to_bfloat16(s);
  if (dt == StDType::F16) {
    const std::uint16_t h = xquant::float_to_half(s);
    return (h & 0x7fffu) == 0 ? 0x0001u : h;
  }
  std::uint32_t b;
  std::memcpy(&b, &s, 4);
  return b;
}

float decode_scale(std::uint32_t bits, StDType dt) {
  if (dt == StDType::BF16) {
    const std::uint32_t u = bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  if (dt == StDType::F16) return xquant::half_to_float(static_cast<std::uint16_t>(bits));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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
      bad_input("--group-size: W8A8 has one scale per output channel (int-quantized); got " + std::to_string(e.group_size));
    p.group = 0;
    return p;
  } else {
    bad_input("--preset: unknown preset '" + e.preset + "', expected W4A16, W8A16 or W8A8");
  }
  if (e.group_size < 0 || (e.group_size != 0 && e.group_size % 8 != 0))
    bad_input("--group-size: expected 0 (per output channel) or a positive multiple of 8, got " + std::to_string(e.group_size));
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

namespace {

CtDecision decide_ct(const TensorEntry& t, const Preset& p, const Filters& f, bool tied) {
  CtDecision d;
  if (!ends_with(t.name, ".weight") || t.shape.size() != 2) {
    d.reason = t.shape.size() != 2 ? "rank " + std::to_string(t.shape.size()) + " (only 2-D Linear weights are quantized)"
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

}  // namespace

// ---- the numbers ----

// The element loops are compiled for several x86-64 levels and picked at load time (as passes.cpp does).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define XQCT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define XQCT_CLONES
#endif

namespace {

// x[0, n) widened exactly to float32.
XQCT_CLONES void widen(const std::byte* x, StDType dt, std::int64_t n, float* out) {
  if (dt == StDType::F32) {
    std::memcpy(out, x, static_cast<std::size_t>(n) * 4);
  } else if (dt == StDType::BF16) {
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, x + i * 2, 2);
      const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
      std::memcpy(out + i, &u, 4);
    }
  } else {
    const float* t = half_table();
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, x + i * 2, 2);
      out[i] = t[h];
    }
  }
}

// Eight float32 / int32 lanes (GCC / clang vector extensions; each clone of the callers gets its own
// instructions, two SSE halves on the baseline). Lane j holds element offset mod 8, exactly as a scalar
// loop over j would: the same operations per lane in the same order, so the results do not change.
// The helpers below are always inlined, so the ABI of passing a 32-byte vector never applies (gcc and
// clang both warn about it all the same).
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
using v8f = float __attribute__((vector_size(32)));
using v8i = std::int32_t __attribute__((vector_size(32)));
using v8u = std::uint32_t __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline v8f select8(v8i mask, v8f a, v8f b) {  // mask ? a : b, lane by lane
  return reinterpret_cast<v8f>((reinterpret_cast<v8i>(a) & mask) | (reinterpret_cast<v8i>(b) & ~mask));
}
[[gnu::always_inline]] inline v8f abs8(v8f x) {
  return reinterpret_cast<v8f>(reinterpret_cast<v8i>(x) & 0x7FFFFFFF);
}

// Largest finite |v| of each group of G (a multiple of 8) and the count of non-finite values, with eight
// lanes (max is exact, so the lane layout does not change the result).
XQCT_CLONES std::int64_t group_amax(const float* v, std::int64_t groups, std::int64_t G, float* amax) {
  std::int64_t bad = 0;
  const v8f fmax = v8f{} + FLT_MAX;
  for (std::int64_t g = 0; g < groups; ++g) {
    v8f m = {};
    v8i b = {};
    const float* r = v + g * G;
    for (std::int64_t i = 0; i < G; i += 8) {
      const v8f a = abs8(load8(r + i));
      const v8i ok = a <= fmax;  // false for NaN and +-Inf
      m = select8(ok & (a > m), a, m);
      b += ~ok & 1;
    }
    float mm = 0.0f;
    for (int j = 0; j < 8; ++j) {
      mm = std::max(mm, m[j]);
      bad += b[j];
    }
    amax[g] = mm;
  }
  return bad;
}

// Round-trip error sums of groups of G (a multiple of 8): x against q * s in float32. Eight float32
// lanes per group (lane j = element offset mod 8), added into double lanes after each group, and the
// lanes summed in a fixed order: the same sums on every machine and for every thread count.
template <int BITS>
[[gnu::always_inline]] inline ErrorStats error_groups(const float* v, const std::byte* q, std::int64_t groups, std::int64_t G,
                                                      const float* sw) {
  double sig[8] = {}, noi[8] = {};
  v8f mx = {};
  const v8f fmax = v8f{} + FLT_MAX;
  const v8u shifts = {0, 4, 8, 12, 16, 20, 24, 28};
  for (std::int64_t g = 0; g < groups; ++g) {
    const v8f s = v8f{} + sw[g];
    v8f gs = {}, gn = {};
    for (std::int64_t i = g * G; i < (g + 1) * G; i += 8) {
      v8i qv;
      if constexpr (BITS == 8) {
        using v8c = std::int8_t __attribute__((vector_size(8)));
        v8c c;
        std::memcpy(&c, q + i, sizeof c);
        qv = __builtin_convertvector(c, v8i);
      } else {
        std::uint32_t w;
        std::memcpy(&w, q + i / 2, 4);
        qv = (reinterpret_cast<v8i>(((v8u{} + w) >> shifts) & 0xFu) ^ 8) - 8;
      }
      const v8f x = load8(v + i);
      const v8i ok = abs8(x) <= fmax;                      // non-finite inputs add nothing
      const v8f r = __builtin_convertvector(qv, v8f) * s;  // dequantize_value(q, s, 0)
      const v8f xs = select8(ok, x, v8f{});
      const v8f e = select8(ok, x - r, v8f{});
      gs += xs * xs;
      gn += e * e;
      const v8f ae = abs8(e);
      mx = select8(ae > mx, ae, mx);
    }
    for (int j = 0; j < 8; ++j) {
      sig[j] += static_cast<double>(gs[j]);
      noi[j] += static_cast<double>(gn[j]);
    }
  }
  ErrorStats err;
  for (int j = 0; j < 8; ++j) {
    err.signal += sig[j];
    err.noise += noi[j];
    err.max_abs = std::max(err.max_abs, static_cast<double>(mx[j]));
  }
  return err;
}

XQCT_CLONES ErrorStats error_groups8(const float* v, const std::byte* q, std::int64_t groups, std::int64_t G, const float* sw) {
  return error_groups<8>(v, q, groups, G, sw);
}
XQCT_CLONES ErrorStats error_groups4(const float* v, const std::byte* q, std::int64_t groups, std::int64_t G, const float* sw) {
  return error_groups<4>(v, q, groups, G, sw);
}

}  // namespace

ErrorStats ct_quantize_rows(const std::byte* x, StDType dt, std::int64_t rows, std::int64_t K, std::int64_t G,
                            const Preset& p, StDType scale_dt, std::byte* q, std::byte* scale) {
  const std::int64_t groups = rows * K / G;
  const std::int64_t n = rows * K;
  const auto esize = static_cast<std::int64_t>(st_dtype_size(dt));
  const auto ssize = st_dtype_size(scale_dt);
  const float qmax = p.bits == 4 ? 7.0f : 127.0f;

  // The library reads typed elements: an aligned copy of a misaligned run.
  std::vector<std::byte> staging;
  if (reinterpret_cast<std::uintptr_t>(x) % static_cast<std::uintptr_t>(esize) != 0) {
    staging.resize(static_cast<std::size_t>(n * esize));
    std::memcpy(staging.data(), x, staging.size());
    x = staging.data();
  }
  // The tool's own passes read a float32 copy (G is a multiple of 8 for these loops; per channel K may
  // not be, then they run on a padded copy). Thread-local scratch, reused from call to call.
  const std::int64_t Gp = (G + 7) / 8 * 8;
  static thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<std::size_t>(groups * Gp)) scratch.resize(static_cast<std::size_t>(groups * Gp));
  if (Gp == G) {
    widen(x, dt, n, scratch.data());  // every element written: no zero fill first
  } else {
    for (std::int64_t g = 0; g < groups; ++g) {
      widen(x + g * G * esize, dt, G, scratch.data() + g * Gp);
      std::fill(scratch.data() + g * Gp + G, scratch.data() + (g + 1) * Gp, 0.0f);  // padding: x = 0
    }
  }

  // 1. Scales: symmetric absmax over the finite values of each group.
  std::vector<float> amax(static_cast<std::size_t>(groups));
  ErrorStats err;
  err.nonfinite = group_amax(scratch.data(), groups, Gp, amax.data());
  std::vector<float> sw(static_cast<std::size_t>(groups));
  for (std::int64_t g = 0; g < groups; ++g) {
    const float a = amax[static_cast<std::size_t>(g)];
    float s = a / qmax;
    if (a == 0.0f) s = 1.0f;
    else if (!(s >= FLT_MIN)) s = FLT_MIN;
    const std::uint32_t bits = encode_scale(s, scale_dt);
    std::memcpy(scale + static_cast<std::size_t>(g) * ssize, &bits, ssize);  // little endian: low bytes
    sw[static_cast<std::size_t>(g)] = decode_scale(bits, scale_dt);
  }

  // 2. The library's quantize on the [groups, G] view, one scale per row of the view.
  const xquant::ConstTensorView xin(x, lib_dtype(dt), {groups, G});
  if (p.bits == 8) {
    const xquant::TensorView yout(q, xquant::DType::int8, {groups, G});
    const xquant::ConstTensorView sv(sw.data(), xquant::DType::float32, {groups});
    xquant::quantize_out(yout, xin, sv, std::nullopt, xquant::QuantDType::qint8, 0, true);
  } else {
    std::vector<float> mult(sw.size());
    for (std::size_t g = 0; g < sw.size(); ++g) mult[g] = 1.0f / sw[g];
    const xquant::TensorView yout(q, xquant::DType::int32, {groups, G / 8});
    const xquant::ConstTensorView sv(mult.data(), xquant::DType::float32, {groups});
    xquant::quantize_out(yout, xin, sv, std::nullopt, xquant::QuantDType::quint4x2, -2, false);
  }

  // 3. Round-trip error against q * s (float32), then the storage offsets.
  ErrorStats e;
  if (Gp == G) {
    e = p.bits == 8 ? error_groups8(scratch.data(), q, groups, G, sw.data()) : error_groups4(scratch.data(), q, groups, G, sw.data());
  } else {  // per channel with K not a multiple of 8: int8 only (int4 needs K % 8 == 0)
    std::vector<std::byte> qp(static_cast<std::size_t>(groups * Gp), std::byte{0});
    for (std::int64_t g = 0; g < groups; ++g) std::memcpy(qp.data() + g * Gp, q + g * G, static_cast<std::size_t>(G));
    e = error_groups8(scratch.data(), qp.data(), groups, Gp, sw.data());  // padding: x = 0, q = 0
  }
  e.nonfinite = err.nonfinite;
  if (p.packed) {
    const std::uint32_t flip = p.bits == 4 ? 0x88888888u : 0x80808080u;
    const std::int64_t words = n * p.bits / 32;
    for (std::int64_t w = 0; w < words; ++w) {
      std::uint32_t v;
      std::memcpy(&v, q + w * 4, 4);
      v ^= flip;
      std::memcpy(q + w * 4, &v, 4);
    }
  }
  return e;
}

// ---- quantize a directory ----

namespace {

struct OutPlan {
  std::string name;  // file name
  std::vector<OutTensor> tensors;
  std::uint64_t data_size = 0;
  std::string header;
};

// One input tensor and where its outputs go.
struct Item {
  std::size_t file = 0;     // input file index
  const TensorEntry* t = nullptr;
  CtDecision d;
  std::size_t out = 0;      // output file index
  std::uint64_t out_bytes = 0;
};

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

std::map<std::string, std::string> out_metadata(const std::map<std::string, std::string>& in) {
  std::map<std::string, std::string> m = in;
  m["format"] = "pt";
  return m;
}

OJ weights_args(const Preset& p) {
  OJ w = OJ::object();
  w["num_bits"] = p.bits;
  w["type"] = "int";
  w["symmetric"] = true;
  w["group_size"] = p.group == 0 ? OJ(nullptr) : OJ(p.group);
  w["strategy"] = p.group == 0 ? "channel" : "group";
  w["dynamic"] = false;
  return w;
}

OJ quantization_config(const Preset& p, const std::set<std::string>& ignore) {
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
  c["ignore"] = OJ(std::vector<std::string>(ignore.begin(), ignore.end()));
  c["kv_cache_scheme"] = nullptr;
  c["global_compression_ratio"] = nullptr;
  return c;
}

// Writes the index of a sharded output.
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

// Assigns each item (a group of output tensors) to an output file: the input's shards when it was
// sharded and no --max-shard-size was given, else greedily in input order up to `max` bytes.
std::vector<std::string> assign_files(std::vector<Item>& items, const ModelDir& m, const std::optional<std::uint64_t>& max) {
  std::vector<std::string> names;
  if (m.sharded && !max) {
    for (const auto& f : m.files) names.push_back(f.name);
    for (auto& it : items) it.out = it.file;
    return names;
  }
  const std::uint64_t limit = max.value_or(kDefaultShard);
  std::size_t cur = 0;
  std::uint64_t size = 0;
  bool empty = true;
  for (auto& it : items) {
    if (!empty && size + it.out_bytes > limit) {
      ++cur;
      size = 0;
      empty = true;
    }
    it.out = cur;
    size += it.out_bytes;
    empty = false;
  }
  const std::size_t n = cur + 1;
  if (n == 1 && !m.sharded) return {kSingleWeights};
  for (std::size_t i = 0; i < n; ++i) names.push_back(shard_name(i, n));
  return names;
}

}  // namespace

QuantizeResult run_export(const QuantizeOptions& o, const ExportOptions& e) {
  const auto t0 = std::chrono::steady_clock::now();
  const Preset p = make_preset(e);
  const Filters filters{compile_patterns(e.targets, "--targets"), compile_patterns(e.ignore, "--ignore")};
  if (!is_directory(o.input))
    bad_input(o.input + ": --format compressed-tensors needs a model directory (config.json and safetensors weights)");
  check_can_create_dir(o.output, o.input, o.force);
  if (!o.report_path.empty()) check_can_create(o.report_path, o.force);

  const ModelDir m = open_model_dir(o.input, o.quiet);
  check_apart(o.output, "-o", m.inputs);
  if (!o.report_path.empty()) check_apart(o.report_path, "--report", m.inputs);
  if (m.config.contains("quantization_config"))
    bad_input(o.input + "/config.json: already has a quantization_config (the model is quantized)");
  // An output head tied to the input embedding cannot be quantized (the loader ties its .weight).
  const bool tied = m.config["tie_word_embeddings"].is_bool() && m.config["tie_word_embeddings"].as_bool();
  const std::optional<StDType> model_dt = dtype_from_config(m.config);

  // Decide every tensor and lay out every output file before reading any data.
  std::set<std::string> names;
  for (const auto& f : m.files)
    for (const auto& t : f.header.tensors) names.insert(t.name);
  QuantizeResult result;
  std::vector<Item> items;
  std::set<std::string> ignore{"lm_head"};
  for (std::size_t fi = 0; fi < m.files.size(); ++fi)
    for (const auto& t : m.files[fi].header.tensors) {
      Item it;
      it.file = fi;
      it.t = &t;
      it.d = decide_ct(t, p, filters, tied);
      if (it.d.warn && o.strict)
        bad_input("tensor '" + t.name + "' cannot be quantized with these options (--strict): " + it.d.reason);
      TensorResult r;
      r.name = t.name;
      r.dtype = t.dtype;
      r.shape = t.shape;
      r.bytes_in = t.nbytes();
      r.quantized = it.d.quantize;
      r.reason = it.d.reason;
      r.warned = it.d.warn;
      if (it.d.quantize) {
        for (const char* suffix : {".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point"})
          if (names.count(it.d.module + suffix))
            bad_input(o.input + ": tensor '" + it.d.module + suffix + "' already exists, so '" + t.name +
                      "' cannot be quantized (is the model already quantized?)");
        const std::int64_t N = t.shape[0], K = t.shape[1];
        const std::int64_t G = p.group == 0 ? K : p.group;
        const StDType sdt = model_dt.value_or(t.dtype);
        r.stored_dtype = p.packed ? StDType::I32 : StDType::I8;
        r.stored_shape = p.packed ? Dims{N, K * p.bits / 32} : Dims{N, K};
        r.channel_dim = 0;
        r.channels = N * (K / G);
        r.bytes_out = static_cast<std::uint64_t>(N * K * p.bits / 8) +
                      static_cast<std::uint64_t>(N * (K / G)) * st_dtype_size(sdt) + (p.packed ? 16 : 0);
      } else {
        if (it.d.ignore) ignore.insert(it.d.module);
        r.stored_dtype = t.dtype;
        r.stored_shape = t.shape;
        r.bytes_out = t.nbytes();
      }
      it.out_bytes = r.bytes_out;
      result.tensors.push_back(std::move(r));
      items.push_back(std::move(it));
    }
  for (const auto& it : items)
    if (it.d.quantize) ignore.erase(it.d.module);

  const std::vector<std::string> file_names = assign_files(items, m, e.max_shard_size);
  std::vector<OutPlan> outs(file_names.size());
  for (std::size_t i = 0; i < outs.size(); ++i) outs[i].name = file_names[i];
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    const TensorResult& r = result.tensors[i];
    auto& ts = outs[it.out].tensors;
    if (!it.d.quantize) {
      ts.push_back({it.t->name, it.t->dtype, it.t->shape, it.t->nbytes(), 0});
      continue;
    }
    const std::int64_t N = it.t->shape[0], K = it.t->shape[1];
    const std::int64_t G = p.group == 0 ? K : p.group;
    const StDType sdt = model_dt.value_or(it.t->dtype);
    const auto qbytes = static_cast<std::uint64_t>(N * K * p.bits / 8);
    ts.push_back({it.d.module + (p.packed ? ".weight_packed" : ".weight"), r.stored_dtype, r.stored_shape, qbytes, 0});
    ts.push_back({it.d.module + ".weight_scale", sdt, {N, K / G}, static_cast<std::uint64_t>(N * (K / G)) * st_dtype_size(sdt), 0});
    if (p.packed) ts.push_back({it.d.module + ".weight_shape", StDType::I64, {2}, 16, 0});
  }
  // Metadata of each output file: that of its first input file, with format = pt.
  std::vector<std::map<std::string, std::string>> metas(outs.size());
  for (std::size_t i = items.size(); i-- > 0;) metas[items[i].out] = out_metadata(m.files[items[i].file].header.metadata);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (metas[i].empty()) metas[i] = {{"format", "pt"}};
    outs[i].data_size = layout_tensors(outs[i].tensors);
    outs[i].header = build_header(outs[i].tensors, metas[i]);
  }

  json::Value config = m.config;
  config.set("quantization_config", json::Value::from_nlohmann(quantization_config(p, ignore)));

  if (!o.quiet)
    for (const auto& r : result.tensors)
      if (r.warned)
        std::fprintf(stderr, "xquant: warning: keeping '%s' dense (added to ignore): %s\n", r.name.c_str(), r.reason.c_str());

  configure_threads(o.threads);
  ensure_open_files(outs.size(), "writing " + std::to_string(outs.size()) + " weight files");
  std::vector<std::string> written = file_names;
  written.insert(written.end(), {kConfigFile, kWeightsIndex});
  OutputDir out(o.output, o.force);
  for (const auto& f : files_to_copy(m, written, o.quiet)) out.copy_file(m.path + "/" + f, f);
  out.write_file(kConfigFile, config.dump(2) + "\n");
  if (outs.size() > 1 || m.sharded || file_names[0] != kSingleWeights) out.write_file(kWeightsIndex, index_json(outs));

  std::uint64_t total_bytes = 0;
  for (const auto& f : m.files) total_bytes += f.header.data_size;
  Progress progress(progress_wanted(o.quiet), "quantize", total_bytes, items.size());
  std::uint64_t done = 0;
  std::size_t tensors_done = 0;
  std::vector<int> fds(outs.size(), -1);
  std::vector<std::map<std::string, std::uint64_t>> offset_of(outs.size());
  try {
    for (std::size_t i = 0; i < outs.size(); ++i) {
      fds[i] = out.create_file(outs[i].name);
      out.write_at(fds[i], outs[i].header.data(), outs[i].header.size(), 0, outs[i].name);
      for (const auto& t : outs[i].tensors) offset_of[i][t.name] = outs[i].header.size() + t.offset;
    }
    // In the try block: joined before the catch closes the files.
    AsyncWriter writer([&](std::size_t file, const void* data, std::size_t len, std::uint64_t offset) {
      out.write_at(fds[file], data, len, offset, outs[file].name);
    });
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      const WeightFile& wf = m.files[it.file];
      const MappedFile& in = *wf.map;
      const std::uint64_t src_off = wf.header.data_start + it.t->begin;
      const std::byte* src = in.data() + src_off;
      if (!it.d.quantize) {
        const std::uint64_t dst = offset_of[it.out].at(it.t->name);
        for (std::uint64_t off = 0; off < it.t->nbytes(); off += kCopyChunk) {
          const std::uint64_t len = std::min(kCopyChunk, it.t->nbytes() - off);
          writer.submit_view(src + off, static_cast<std::size_t>(len), dst + off, &in, src_off + off, it.out);
          done += len;
          progress.update(done, tensors_done);
        }
      } else {
        const std::int64_t N = it.t->shape[0], K = it.t->shape[1];
        const std::int64_t G = p.group == 0 ? K : p.group;
        const StDType sdt = model_dt.value_or(it.t->dtype);
        const auto ssize = static_cast<std::int64_t>(st_dtype_size(sdt));
        const auto esize = static_cast<std::int64_t>(st_dtype_size(it.t->dtype));
        const std::uint64_t qdst = offset_of[it.out].at(it.d.module + (p.packed ? ".weight_packed" : ".weight"));
        const std::uint64_t sdst = offset_of[it.out].at(it.d.module + ".weight_scale");
        std::vector<std::byte> sbuf;
        sbuf.assign(static_cast<std::size_t>(N * (K / G) * ssize), std::byte{0});
        const std::int64_t piece_rows = std::max<std::int64_t>(1, kPieceElems / K);
        const std::int64_t chunk_rows = std::max<std::int64_t>(piece_rows, kChunkElems / K / piece_rows * piece_rows);
        TensorResult& res = result.tensors[i];
        for (std::int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
          const std::int64_t r1 = std::min(N, r0 + chunk_rows);
          std::vector<std::byte> qbuf = writer.buffer();
          qbuf.resize(static_cast<std::size_t>((r1 - r0) * K * p.bits / 8));
          const std::int64_t npieces = (r1 - r0 + piece_rows - 1) / piece_rows;
          std::vector<ErrorStats> errs(static_cast<std::size_t>(npieces));
          std::string failure;
#pragma omp parallel for schedule(dynamic, 1)
          for (std::int64_t k = 0; k < npieces; ++k) {
            const std::int64_t a = r0 + k * piece_rows, b = std::min(r1, a + piece_rows);
            try {
              errs[static_cast<std::size_t>(k)] =
                  ct_quantize_rows(src + a * K * esize, it.t->dtype, b - a, K, G, p, sdt,
                                   qbuf.data() + (a - r0) * K * p.bits / 8, sbuf.data() + a * (K / G) * ssize);
            } catch (const std::exception& ex) {
#pragma omp critical
              if (failure.empty()) failure = ex.what();
            }
          }
          if (!failure.empty()) bad_input("tensor '" + it.t->name + "': " + failure);
          for (const auto& er : errs) res.error.merge(er);
          writer.submit(std::move(qbuf), qdst + static_cast<std::uint64_t>(r0 * K * p.bits / 8), it.out);
          in.release(src_off + static_cast<std::uint64_t>(r0 * K * esize), static_cast<std::uint64_t>((r1 - r0) * K * esize));
          done += static_cast<std::uint64_t>((r1 - r0) * K * esize);
          progress.update(done, tensors_done);
        }
        writer.submit(std::move(sbuf), sdst, it.out);
        if (p.packed) {
          const std::int64_t shape[2] = {N, K};
          std::vector<std::byte> sb(sizeof shape);
          std::memcpy(sb.data(), shape, sizeof shape);
          writer.submit(std::move(sb), offset_of[it.out].at(it.d.module + ".weight_shape"), it.out);
        }
        result.total.merge(res.error);
      }
      progress.update(done, ++tensors_done);
    }
    writer.finish();
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const int fd = fds[i];
      fds[i] = -1;
      out.close_file(fd, outs[i].name);
    }
  } catch (...) {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    throw;
  }
  progress.clear();
  out.commit();

  result.file_bytes_in = m.weight_bytes;
  for (const auto& f : outs) result.file_bytes_out += f.header.size() + f.data_size;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!o.report_path.empty()) {
    OJ j = nlohmann::ordered_json::parse(report_json(o, result));
    j["options"] = {{"format", "compressed-tensors"},
                    {"preset", p.name},
                    {"group_size", p.group},
                    {"targets", e.targets},
                    {"ignore", e.ignore},
                    {"strict", o.strict},
                    {"threads", o.threads}};
    OJ files = OJ::array();
    for (const auto& f : outs) files.push_back(f.name);
    j["output_files"] = std::move(files);
    j["ignore"] = OJ(std::vector<std::string>(ignore.begin(), ignore.end()));
    OJ skipped = OJ::array();  // entries of the input left out (links leaving it, loops): docs/cli.md
    for (const auto& n : m.not_followed) skipped.push_back(utf8_safe(n));
    j["not_followed"] = std::move(skipped);
    const std::string json = j.dump(2) + "\n";
    AtomicOutput rep(o.report_path, o.force);
    rep.write_at(json.data(), json.size(), 0);
    rep.commit();
  }
  return result;
}

void print_export_report(std::FILE* out, const QuantizeOptions& o, const ExportOptions& e, const QuantizeResult& r) {
  const Preset p = make_preset(e);
  std::fprintf(out, "xquant %s quantize: %s -> %s\n", xquant::kVersion, o.input.c_str(), o.output.c_str());
  std::fprintf(out, "format: compressed-tensors %s (%s): int%d weights, symmetric, %s%s\n", p.name.c_str(),
               p.packed ? "pack-quantized" : "int-quantized", p.bits,
               p.group == 0 ? "one scale per output channel" : ("groups of " + std::to_string(p.group)).c_str(),
               p.act8 ? ", dynamic per-token int8 activations" : "");
  print_summary(out, r, p.packed ? (p.bits == 4 ? "int4" : "int8p") : "int8", "kept dense", " of weights");
  if (!o.report_path.empty()) std::fprintf(out, "report: %s\n", o.report_path.c_str());
}

}  // namespace xqcli

// ---- dequantize / inspect a compressed-tensors directory ----

namespace xqcli {

namespace {

// The weight quantization a compressed-tensors config describes (the subset xquant reads: symmetric
// int weights, group or channel strategy, pack-quantized or int-quantized).
struct CtConfig {
  std::string format;
  int bits = 4;
  std::int64_t group = 0;  // 0: channel
  bool act8 = false;
};

CtConfig read_ct_config(const ModelDir& m) {
  const std::string who = m.path + "/config.json: quantization_config";
  if (!m.config.contains("quantization_config")) bad_input(m.path + "/config.json: no quantization_config (not a quantized model)");
  const json::Value& c = m.config["quantization_config"];
  if (!c.is_object()) bad_input(who + ": expected an object, got " + c.type_name());
  // A string member, "" when absent; another type is an error naming the key.
  const auto str = [](const json::Value& obj, const char* key, const std::string& where) -> std::string {
    return obj.contains(key) ? json::get_string(obj[key], where + "." + key) : std::string();
  };
  if (str(c, "quant_method", who) != "compressed-tensors") bad_input(who + ": quant_method is not \"compressed-tensors\"");
  CtConfig r;
  r.format = str(c, "format", who);
  if (r.format != "pack-quantized" && r.format != "int-quantized")
    bad_input(who + ": format '" + r.format + "' is not read by xquant (pack-quantized or int-quantized)");
  if (str(c, "quantization_status", who) != "compressed") bad_input(who + ": quantization_status is not \"compressed\"");
  if (!c["config_groups"].is_object() || c["config_groups"].empty()) bad_input(who + ": no config_groups");
  bool first = true;
  for (const auto& [name, g] : c["config_groups"].members()) {
    const std::string gw = who + ".config_groups." + name;
    if (!g.is_object() || !g["weights"].is_object()) bad_input(gw + ": no weights");
    const json::Value& w = g["weights"];
    const std::string ww = gw + ".weights";
    const bool symmetric = w.contains("symmetric") && json::get_bool(w["symmetric"], ww + ".symmetric");
    if (str(w, "type", ww) != "int" || !symmetric) bad_input(ww + ": only symmetric int weights are read by xquant");
    const std::string strategy = str(w, "strategy", ww);
    CtConfig one = r;
    one.bits = w.contains("num_bits") ? static_cast<int>(json::get_int(w["num_bits"], ww + ".num_bits", 4, 8)) : 0;
    if (one.bits != 4 && one.bits != 8) bad_input(ww + ": num_bits must be 4 or 8");
    if (strategy == "group") {
      if (w["group_size"].is_null()) bad_input(ww + ": group strategy without a positive group_size");
      one.group = json::get_int(w["group_size"], ww + ".group_size", 1, INT64_MAX);
    } else if (strategy != "channel") {
      bad_input(ww + ": strategy '" + strategy + "' is not read by xquant (group or channel)");
    }
    one.act8 = g["input_activations"].is_object();
    if (!first && (one.bits != r.bits || one.group != r.group))
      bad_input(who + ": config groups with different weight quantizations are not read by xquant");
    r = one;
    first = false;
  }
  if (r.format == "int-quantized" && r.bits != 8) bad_input(who + ": int-quantized with num_bits " + std::to_string(r.bits));
  return r;
}

// One quantized module of a file.
struct CtModule {
  const TensorEntry* q = nullptr;      // weight_packed or weight
  const TensorEntry* scale = nullptr;
  const TensorEntry* shape = nullptr;  // pack-quantized only
  std::int64_t N = 0, K = 0, G = 0;
};

std::map<std::string, CtModule> find_modules(const WeightFile& f, const CtConfig& c) {
  std::map<std::string, CtModule> mods;
  const Header& h = f.header;
  const auto need = [&](const std::string& name) -> const TensorEntry* {
    const TensorEntry* t = h.find(name);
    if (!t) bad_input(f.path + ": '" + name + "' is missing");
    return t;
  };
  for (const auto& t : h.tensors) {
    if (!ends_with(t.name, ".weight_scale")) continue;
    const std::string mod = t.name.substr(0, t.name.size() - 13);
    CtModule cm;
    cm.scale = &t;
    if (c.format == "pack-quantized") {
      cm.q = need(mod + ".weight_packed");
      cm.shape = need(mod + ".weight_shape");
      if (cm.shape->dtype != StDType::I64 || cm.shape->shape != Dims{2})
        bad_input(f.path + ": '" + cm.shape->name + "' must be I64 [2]");
      std::int64_t nk[2];
      std::memcpy(nk, f.map->data() + h.data_start + cm.shape->begin, 16);
      cm.N = nk[0];
      cm.K = nk[1];
      const std::int64_t per = 32 / c.bits;
      if (cm.N <= 0 || cm.K <= 0 || cm.K % per != 0 || cm.q->dtype != StDType::I32 || cm.q->shape != Dims{cm.N, cm.K / per})
        bad_input(f.path + ": '" + cm.q->name + "' is " + std::string(st_dtype_name(cm.q->dtype)) + " " + dims_str(cm.q->shape) +
                  ", which does not hold " + std::to_string(c.bits) + "-bit values of shape [" + std::to_string(cm.N) + ", " +
                  std::to_string(cm.K) + "] (weight_shape)");
    } else {
      cm.q = need(mod + ".weight");
      if (cm.q->dtype != StDType::I8 || cm.q->shape.size() != 2)
        bad_input(f.path + ": '" + cm.q->name + "' must be a 2-D I8 tensor, got " + std::string(st_dtype_name(cm.q->dtype)) + " " +
                  dims_str(cm.q->shape));
      cm.N = cm.q->shape[0];
      cm.K = cm.q->shape[1];
    }
    cm.G = c.group == 0 ? cm.K : c.group;
    if (cm.K % cm.G != 0 || !st_is_quantizable(cm.scale->dtype) || cm.scale->shape != Dims{cm.N, cm.K / cm.G})
      bad_input(f.path + ": '" + cm.scale->name + "' is " + std::string(st_dtype_name(cm.scale->dtype)) + " " +
                dims_str(cm.scale->shape) + ", expected a float [" + std::to_string(cm.N) + ", " +
                std::to_string(cm.G ? cm.K / cm.G : 0) + "]");
    mods[mod] = cm;
  }
  return mods;
}

// Stored value i of a compressed-tensors weight (offsets removed).
inline int ct_value(const std::byte* q, int bits, bool packed, std::int64_t i) {
  if (!packed) return static_cast<int>(static_cast<std::int8_t>(q[i]));
  if (bits == 8) return static_cast<int>(static_cast<std::uint8_t>(q[i])) - 128;  // byte i of the little-endian words
  const auto byte = static_cast<std::uint8_t>(q[i >> 1]);
  return static_cast<int>((i & 1) ? (byte >> 4) : (byte & 0xF)) - 8;
}

}  // namespace

namespace {

struct FilePlan {
  std::map<std::string, CtModule> mods;
  std::set<std::string> consumed;
  std::vector<OutTensor> tensors;
  std::string header;
};

FilePlan plan_dequantize(const WeightFile& f, const CtConfig& c, const std::optional<StDType>& dtype) {
  FilePlan fp;
  fp.mods = find_modules(f, c);
  for (const auto& [mod, cm] : fp.mods) {
    fp.consumed.insert(cm.q->name);
    fp.consumed.insert(cm.scale->name);
    if (cm.shape) fp.consumed.insert(cm.shape->name);
    const StDType dt = dtype.value_or(cm.scale->dtype);
    fp.tensors.push_back({mod + ".weight", dt, {cm.N, cm.K}, static_cast<std::uint64_t>(cm.N * cm.K) * st_dtype_size(dt), 0});
  }
  for (const auto& t : f.header.tensors)
    if (!fp.consumed.count(t.name)) fp.tensors.push_back({t.name, t.dtype, t.shape, t.nbytes(), 0});
  layout_tensors(fp.tensors);
  fp.header = build_header(fp.tensors, out_metadata(f.header.metadata));
  return fp;
}

using WriteFn = std::function<void(const void*, std::size_t, std::uint64_t)>;

// Writes the dequantized file: header, kept tensors copied, each module's q * s narrowed.
void write_dequantized(const WeightFile& wf, const FilePlan& fp, const CtConfig& c, const std::optional<StDType>& dtype,
                       const WriteFn& write) {
  const bool packed = c.format == "pack-quantized";
  write(fp.header.data(), fp.header.size(), 0);
  std::map<std::string, std::uint64_t> at;
  for (const auto& t : fp.tensors) at[t.name] = fp.header.size() + t.offset;
  for (const auto& t : wf.header.tensors) {
    if (fp.consumed.count(t.name)) continue;
    const std::byte* src = wf.map->data() + wf.header.data_start + t.begin;
    for (std::uint64_t off = 0; off < t.nbytes(); off += kCopyChunk) {
      const std::uint64_t len = std::min(kCopyChunk, t.nbytes() - off);
      write(src + off, static_cast<std::size_t>(len), at.at(t.name) + off);
      wf.map->release(wf.header.data_start + t.begin + off, len);
    }
  }
  std::vector<std::byte> buf;
  for (const auto& entry : fp.mods) {
    const std::string& mod = entry.first;
    const CtModule& cm = entry.second;  // not a structured binding: the OpenMP region below uses it
    const StDType dt = dtype.value_or(cm.scale->dtype);
    const auto osize = static_cast<std::int64_t>(st_dtype_size(dt));
    const std::byte* qp = wf.map->data() + wf.header.data_start + cm.q->begin;
    const std::byte* sp = wf.map->data() + wf.header.data_start + cm.scale->begin;
    const auto ssize = static_cast<std::int64_t>(st_dtype_size(cm.scale->dtype));
    const std::int64_t rows_per = std::max<std::int64_t>(1, kChunkElems / cm.K);
    const std::int64_t gpr = cm.K / cm.G;
    for (std::int64_t r0 = 0; r0 < cm.N; r0 += rows_per) {
      const std::int64_t r1 = std::min(cm.N, r0 + rows_per);
      buf.resize(static_cast<std::size_t>((r1 - r0) * cm.K * osize));
#pragma omp parallel for schedule(static)
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t g = 0; g < gpr; ++g) {
          std::uint32_t sb = 0;
          std::memcpy(&sb, sp + (r * gpr + g) * ssize, static_cast<std::size_t>(ssize));
          const float s = decode_scale(sb, cm.scale->dtype);
          for (std::int64_t k = g * cm.G; k < (g + 1) * cm.G; ++k) {
            const float v = dequantize_value(ct_value(qp, c.bits, packed, r * cm.K + k), s, 0.0f);
            std::byte* dst = buf.data() + ((r - r0) * cm.K + k) * osize;
            if (dt == StDType::F32) {
              std::memcpy(dst, &v, 4);
            } else {
              const std::uint16_t hv = dt == StDType::F16 ? xquant::float_to_half(v) : xquant::float_to_bfloat16(v);
              std::memcpy(dst, &hv, 2);
            }
          }
        }
      write(buf.data(), buf.size(), at.at(mod + ".weight") + static_cast<std::uint64_t>(r0 * cm.K * osize));
      const std::uint64_t qb = static_cast<std::uint64_t>(r0 * cm.K * c.bits / 8), qe = static_cast<std::uint64_t>(r1 * cm.K * c.bits / 8);
      wf.map->release(wf.header.data_start + cm.q->begin + qb, qe - qb);
    }
  }
}

// The quantization of a single compressed-tensors file, read from its tensors (no config.json): the
// format from the names, the bits from weight_packed's width against weight_shape, the group size from
// the scale's width.
std::optional<CtConfig> infer_ct_config(const WeightFile& f) {
  const Header& h = f.header;
  for (const auto& t : h.tensors) {
    if (!ends_with(t.name, ".weight_scale") || t.shape.size() != 2) continue;
    const std::string mod = t.name.substr(0, t.name.size() - 13);
    CtConfig c;
    const TensorEntry* packed = h.find(mod + ".weight_packed");
    const TensorEntry* shape = h.find(mod + ".weight_shape");
    const TensorEntry* w = h.find(mod + ".weight");
    std::int64_t K = 0;
    if (packed && shape && shape->dtype == StDType::I64 && shape->shape == Dims{2} && packed->shape.size() == 2) {
      std::int64_t nk[2];
      std::memcpy(nk, f.map->data() + h.data_start + shape->begin, 16);
      K = nk[1];
      c.format = "pack-quantized";
      if (K <= 0 || packed->shape[1] <= 0) bad_input(f.path + ": '" + shape->name + "' holds no valid shape");
      c.bits = static_cast<int>(packed->shape[1] * 32 / K);
      if ((c.bits != 4 && c.bits != 8) || packed->shape[1] * 32 != K * c.bits)
        bad_input(f.path + ": '" + packed->name + "' " + dims_str(packed->shape) + " is neither 4-bit nor 8-bit packing of K = " +
                  std::to_string(K));
    } else if (w && w->dtype == StDType::I8 && w->shape.size() == 2) {
      K = w->shape[1];
      c.format = "int-quantized";
      c.bits = 8;
    } else {
      continue;
    }
    if (t.shape[1] <= 0 || K % t.shape[1] != 0)
      bad_input(f.path + ": '" + t.name + "' " + dims_str(t.shape) + " does not divide K = " + std::to_string(K) + " into groups");
    c.group = t.shape[1] == 1 ? 0 : K / t.shape[1];
    return c;
  }
  return std::nullopt;
}

}  // namespace

bool is_ct_file(const std::string& path) {
  try {
    WeightFile f = open_weight_file(path);
    return !parse_quant_metadata(f.header.metadata) && infer_ct_config(f).has_value();
  } catch (const CliError&) {
    return false;  // the regular reader reports the problem
  }
}

void run_dequantize_ct_file(const DequantizeOptions& o) {
  check_can_create(o.output, o.force);
  const WeightFile f = open_weight_file(o.input);
  const std::optional<CtConfig> c = infer_ct_config(f);
  if (!c) bad_input(o.input + ": no compressed-tensors weights (P.weight_scale with P.weight_packed or an I8 P.weight)");
  const FilePlan fp = plan_dequantize(f, *c, o.dtype);
  configure_threads(o.threads);
  AtomicOutput out(o.output, o.force);
  write_dequantized(f, fp, *c, o.dtype, [&](const void* d, std::size_t n, std::uint64_t off) { out.write_at(d, n, off); });
  out.commit();
}

void run_dequantize_dir(const DequantizeOptions& o) {
  check_can_create_dir(o.output, o.input, o.force);
  const ModelDir m = open_model_dir(o.input, o.quiet);
  const CtConfig c = read_ct_config(m);
  std::vector<FilePlan> plans;
  for (const auto& f : m.files) plans.push_back(plan_dequantize(f, c, o.dtype));
  json::Value config = m.config;
  config.erase("quantization_config");

  configure_threads(o.threads);
  OutputDir out(o.output, o.force);
  for (const auto& f : m.other_files) out.copy_file(m.path + "/" + f, f);
  out.write_file(kConfigFile, config.dump(2) + "\n");
  if (m.sharded) {
    std::vector<OutPlan> idx(m.files.size());
    for (std::size_t i = 0; i < m.files.size(); ++i) {
      idx[i].name = m.files[i].name;
      idx[i].tensors = plans[i].tensors;
    }
    out.write_file(kWeightsIndex, index_json(idx));
  }
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const WeightFile& wf = m.files[i];
    const int fd = out.create_file(wf.name);
    try {
      write_dequantized(wf, plans[i], c, o.dtype,
                        [&](const void* d, std::size_t n, std::uint64_t off) { out.write_at(fd, d, n, off, wf.name); });
    } catch (...) {
      ::close(fd);
      throw;
    }
    out.close_file(fd, wf.name);
  }
  out.commit();
}

void run_inspect_dir(const InspectOptions& o, std::FILE* out) {
  const ModelDir m = open_model_dir(o.path);  // warnings on stderr, the listing on `out`
  std::optional<CtConfig> c;
  if (m.config.contains("quantization_config")) c = read_ct_config(m);
  if (o.json) {
    OJ j = OJ::object();
    j["directory"] = utf8_safe(o.path);
    j["sharded"] = m.sharded;
    j["quantization_config"] = m.config["quantization_config"].to_nlohmann();
    OJ others = OJ::array();
    for (const auto& f : m.other_files) others.push_back(utf8_safe(f));
    j["other_files"] = std::move(others);
    OJ files = OJ::array();
    for (const auto& f : m.files) {
      char* text = nullptr;
      std::size_t len = 0;
      std::FILE* mem = ::open_memstream(&text, &len);
      if (!mem) io_error("open_memstream", errno);
      try {
        run_inspect(InspectOptions{f.path, true}, mem);
      } catch (...) {
        std::fclose(mem);
        std::free(text);
        throw;
      }
      std::fclose(mem);
      OJ fj = OJ::parse(std::string(text, len));
      std::free(text);
      if (c) {
        const auto mods = find_modules(f, *c);
        // tensor name -> (role, module): one lookup per tensor (a scan of the modules per tensor is
        // quadratic for 100k tensors).
        std::unordered_map<std::string, std::pair<const char*, const std::pair<const std::string, CtModule>*>> role_of;
        for (const auto& e : mods) {
          role_of[e.second.q->name] = {"quantized", &e};
          role_of[e.second.scale->name] = {"scale", &e};
          if (e.second.shape) role_of[e.second.shape->name] = {"shape", &e};
        }
        for (auto& t : fj["tensors"]) {
          const auto it = role_of.find(t["name"].get<std::string>());
          if (it == role_of.end()) continue;
          const auto& [mod, cm] = *it->second.second;
          t["role"] = it->second.first;
          t["of"] = mod + ".weight";
          if (std::string_view(it->second.first) == "quantized") {
            t["original_shape"] = Dims{cm.N, cm.K};
            t["group_size"] = cm.G;
          }
        }
      }
      files.push_back(std::move(fj));
    }
    j["files"] = std::move(files);
    std::fprintf(out, "%s\n", j.dump(2, ' ', false, OJ::error_handler_t::replace).c_str());
    return;
  }
  std::fprintf(out, "%s: model directory, %zu weight file%s%s, %zu other file%s\n", o.path.c_str(), m.files.size(),
               m.files.size() == 1 ? "" : "s", m.sharded ? " (model.safetensors.index.json)" : "", m.other_files.size(),
               m.other_files.size() == 1 ? "" : "s");
  if (c) {
    const auto& qc = m.config["quantization_config"];
    std::fprintf(out, "compressed-tensors %s: int%d weights, symmetric, %s%s; ignore: %zu module%s\n", c->format.c_str(), c->bits,
                 c->group == 0 ? "per output channel" : ("groups of " + std::to_string(c->group)).c_str(),
                 c->act8 ? ", int8 dynamic per-token activations" : "",
                 qc.contains("ignore") && qc["ignore"].is_array() ? qc["ignore"].size() : 0,
                 qc.contains("ignore") && qc["ignore"].is_array() && qc["ignore"].size() == 1 ? "" : "s");
    std::size_t n = 0;
    for (const auto& f : m.files) n += find_modules(f, *c).size();
    std::fprintf(out, "quantized modules: %zu\n", n);
  } else {
    std::fprintf(out, "not quantized (config.json has no quantization_config)\n");
  }
  for (const auto& f : m.files) {
    std::fprintf(out, "\n");
    run_inspect(InspectOptions{f.path, false}, out);
  }
}

}  // namespace xqcli
