// Reading the compressed-tensors format: dequantize a directory or a single file back to dense weights
// (with the library's xquant::anti_quant_out), inspect a directory.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

#include "compressed_tensors.hpp"
#include "ct_internal.hpp"
#include "errors.hpp"
#include "model_dir.hpp"
#include "progress.hpp"
#include "core/float8.hpp"
#include "xquant/anti_quant.hpp"
#include "xquant/half.hpp"

namespace xqcli {

using ct::OJ;

namespace {

// The weight quantization a compressed-tensors config describes (the subset xquant reads: int weights
// with group or channel strategy, pack-quantized (symmetric or not) or int-quantized; FP8 E4M3 weights
// with channel or group strategy, float-quantized; FP4 E2M1 weights in groups with FP8 scales and a
// global scale, nvfp4-pack-quantized).
struct CtConfig {
  std::string format;
  CtKind kind = CtKind::Int;
  int bits = 4;
  std::int64_t group = 0;  // 0: channel
  bool act8 = false;
  bool symmetric = true;  // false: weight_zero_point (pack-quantized only)
  // The default dtype of dequantized NVFP4 weights (their scales are F8_E4M3): config.json's torch_dtype,
  // else BF16 (what compressed-tensors' NVFP4 decompressor returns).
  StDType nvfp4_dtype = StDType::BF16;
};

// The dtype a module dequantizes to: --dtype, else its scales' dtype (NVFP4: config.json's torch_dtype, else
// BF16, since its scales are F8_E4M3).
StDType dequantized_dtype(const CtConfig& c, const TensorEntry& scale, const std::optional<StDType>& dtype) {
  return dtype.value_or(c.kind == CtKind::Nvfp4 ? c.nvfp4_dtype : scale.dtype);
}

CtKind kind_of_format(const std::string& format) {
  if (format == "float-quantized") return CtKind::Fp8;
  if (format == "nvfp4-pack-quantized") return CtKind::Nvfp4;
  return CtKind::Int;
}

CtConfig read_ct_config(const ModelDir& m) {
  const std::string who = m.path + "/config.json: quantization_config";
  if (!m.config.contains("quantization_config"))
    bad_input(m.path + "/config.json: no quantization_config (not a quantized model)");
  const json::Value& c = m.config["quantization_config"];
  if (!c.is_object()) bad_input(who + ": expected an object, got " + c.type_name());
  // A string member, "" when absent; another type is an error naming the key.
  const auto str = [](const json::Value& obj, const char* key, const std::string& where) -> std::string {
    return obj.contains(key) ? json::get_string(obj[key], where + "." + key) : std::string();
  };
  if (str(c, "quant_method", who) != "compressed-tensors")
    bad_input(who + ": quant_method is not \"compressed-tensors\"");
  CtConfig r;
  r.format = str(c, "format", who);
  if (r.format != "pack-quantized" && r.format != "int-quantized" && r.format != "float-quantized" &&
      r.format != "nvfp4-pack-quantized")
    bad_input(who + ": format '" + r.format +
              "' is not read by xquant (pack-quantized, int-quantized, float-quantized or nvfp4-pack-quantized)");
  r.kind = kind_of_format(r.format);
  if (str(c, "quantization_status", who) != "compressed")
    bad_input(who + ": quantization_status is not \"compressed\"");
  if (!c["config_groups"].is_object() || c["config_groups"].empty()) bad_input(who + ": no config_groups");
  bool first = true;
  for (const auto& [name, g] : c["config_groups"].members()) {
    const std::string gw = who + ".config_groups." + name;
    if (!g.is_object() || !g["weights"].is_object()) bad_input(gw + ": no weights");
    const json::Value& w = g["weights"];
    const std::string ww = gw + ".weights";
    const bool symmetric = !w.contains("symmetric") || json::get_bool(w["symmetric"], ww + ".symmetric");
    const std::string type = str(w, "type", ww);
    if (r.kind == CtKind::Int && type != "int")
      bad_input(ww + ": type '" + type + "', but the format " + r.format + " holds int weights");
    if (r.kind != CtKind::Int && type != "float")
      bad_input(ww + ": type '" + type + "', but the format " + r.format + " holds float weights");
    if (!symmetric && r.format != "pack-quantized")
      bad_input(ww + ": asymmetric weights are read by xquant in the pack-quantized format only");
    const std::string strategy = str(w, "strategy", ww);
    CtConfig one = r;
    one.symmetric = symmetric;
    one.bits = w.contains("num_bits") ? static_cast<int>(json::get_int(w["num_bits"], ww + ".num_bits", 4, 8)) : 0;
    if (one.bits != 4 && one.bits != 8) bad_input(ww + ": num_bits must be 4 or 8");
    if (r.kind == CtKind::Fp8 && one.bits != 8)
      bad_input(ww + ": float-quantized with num_bits " + std::to_string(one.bits) +
                " (xquant reads FP8 E4M3, num_bits 8)");
    if (r.kind == CtKind::Nvfp4 && one.bits != 4)
      bad_input(ww + ": nvfp4-pack-quantized with num_bits " + std::to_string(one.bits) + ", expected 4");
    if (r.kind == CtKind::Nvfp4) {
      if (strategy != "tensor_group" || w["group_size"].is_null())
        bad_input(ww + ": nvfp4-pack-quantized weights need strategy tensor_group with a group_size, got strategy '" +
                  strategy + "'");
      one.group = json::get_int(w["group_size"], ww + ".group_size", 2, INT64_MAX);
      if (one.group % 2 != 0)
        bad_input(ww + ": group_size " + std::to_string(one.group) + " is odd (two FP4 values per byte)");
    } else if (strategy == "group") {
      if (w["group_size"].is_null()) bad_input(ww + ": group strategy without a positive group_size");
      one.group = json::get_int(w["group_size"], ww + ".group_size", 1, INT64_MAX);
    } else if (strategy != "channel") {
      bad_input(ww + ": strategy '" + strategy + "' is not read by xquant (group or channel)");
    }
    one.act8 = g["input_activations"].is_object();
    if (!first && (one.bits != r.bits || one.group != r.group || one.symmetric != r.symmetric))
      bad_input(who + ": config groups with different weight quantizations are not read by xquant");
    r = one;
    first = false;
  }
  if (r.format == "int-quantized" && r.bits != 8)
    bad_input(who + ": int-quantized with num_bits " + std::to_string(r.bits));
  r.nvfp4_dtype = ct::dtype_from_config(m.config).value_or(StDType::BF16);
  return r;
}

// One quantized module of a file.
struct CtModule {
  const TensorEntry* q = nullptr;  // weight_packed or weight
  const TensorEntry* scale = nullptr;
  const TensorEntry* shape = nullptr;         // pack-quantized only
  const TensorEntry* g_idx = nullptr;         // GPTQ activation ordering (weight_g_idx), if present
  const TensorEntry* zero_point = nullptr;    // asymmetric: weight_zero_point, packed along the rows
  std::vector<float> zp;                      // asymmetric: the zero point of each group, [N, K / G]
  const TensorEntry* global_scale = nullptr;  // nvfp4-pack-quantized: weight_global_scale, F32 [1]
  float gs = 0.0f;                            // its value
  std::int64_t N = 0, K = 0, G = 0;
  // The group of each input column when g_idx orders them (empty: column order, group = column / G).
  std::vector<std::int32_t> group_of;
};

// weight_g_idx (compressed-tensors with GPTQ's actorder "group"): I32 or I64 [K], element j the group
// of input column j, in [0, K / G); all -1 (compressed-tensors' initial value) means column order.
std::vector<std::int32_t> read_g_idx(const WeightFile& f, const TensorEntry& t, std::int64_t K, std::int64_t G) {
  if ((t.dtype != StDType::I32 && t.dtype != StDType::I64) || t.shape != Dims{K})
    bad_input(f.path + ": '" + t.name + "' is " + std::string(st_dtype_name(t.dtype)) + " " + dims_str(t.shape) +
              " but expected I32 or I64 [" + std::to_string(K) + "] (one group index per input column)");
  const std::byte* p = f.map->data() + f.header.data_start + t.begin;
  const std::int64_t groups = K / G;
  std::vector<std::int32_t> g(static_cast<std::size_t>(K));
  std::int64_t unset = 0;
  for (std::int64_t j = 0; j < K; ++j) {
    std::int64_t v;
    if (t.dtype == StDType::I32) {
      std::int32_t w;
      std::memcpy(&w, p + j * 4, 4);
      v = w;
    } else {
      std::memcpy(&v, p + j * 8, 8);
    }
    if (v == -1) {
      ++unset;
      continue;
    }
    if (v < 0 || v >= groups)
      bad_input(f.path + ": '" + t.name + "' names group " + std::to_string(v) + " for input column " +
                std::to_string(j) + ", but the module has " + std::to_string(groups) + " group" +
                (groups == 1 ? "" : "s") + " per row (0 to " + std::to_string(groups - 1) + ")");
    g[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(v);
  }
  if (unset == K) return {};  // no activation ordering
  if (unset != 0)
    bad_input(f.path + ": '" + t.name + "' mixes -1 (no ordering) with group indices (" + std::to_string(unset) +
              " of " + std::to_string(K) + " columns are -1)");
  return g;
}

std::map<std::string, CtModule> find_modules(const WeightFile& f, const CtConfig& c) {
  std::map<std::string, CtModule> mods;
  const Header& h = f.header;
  const auto need = [&](const std::string& name) -> const TensorEntry* {
    const TensorEntry* t = h.find(name);
    if (!t) bad_input(f.path + ": '" + name + "' is missing");
    return t;
  };
  for (const auto& t : h.tensors) {
    if (!ct::ends_with(t.name, ".weight_scale")) continue;
    const std::string mod = t.name.substr(0, t.name.size() - 13);
    CtModule cm;
    cm.scale = &t;
    if (c.kind == CtKind::Nvfp4) {
      // weight_packed U8 [N, K / 2] (two E2M1 codes a byte), weight_scale F8_E4M3 [N, K / G],
      // weight_global_scale F32 [1].
      cm.q = need(mod + ".weight_packed");
      if (cm.q->dtype != StDType::U8 || cm.q->shape.size() != 2 || cm.q->shape[1] == 0 ||
          cm.q->shape[1] > INT64_MAX / 2)
        bad_input(f.path + ": '" + cm.q->name + "' is " + std::string(st_dtype_name(cm.q->dtype)) + " " +
                  dims_str(cm.q->shape) + ", expected a U8 [N, K / 2] tensor with K >= 2 (two FP4 E2M1 values a byte)");
      cm.N = cm.q->shape[0];
      cm.K = cm.q->shape[1] * 2;
      cm.global_scale = need(mod + ".weight_global_scale");
      if (cm.global_scale->dtype != StDType::F32 || cm.global_scale->numel != 1)
        bad_input(f.path + ": '" + cm.global_scale->name + "' is " +
                  std::string(st_dtype_name(cm.global_scale->dtype)) + " " + dims_str(cm.global_scale->shape) +
                  ", expected F32 [1]");
      std::memcpy(&cm.gs, f.map->data() + h.data_start + cm.global_scale->begin, 4);
      if (!(cm.gs > 0.0f) || !std::isfinite(cm.gs))
        bad_input(f.path + ": '" + cm.global_scale->name + "' is " + std::to_string(cm.gs) +
                  ", expected a finite positive global scale");
    } else if (c.format == "pack-quantized") {
      cm.q = need(mod + ".weight_packed");
      cm.shape = need(mod + ".weight_shape");
      if (cm.shape->dtype != StDType::I64 || cm.shape->shape != Dims{2})
        bad_input(f.path + ": '" + cm.shape->name + "' must be I64 [2]");
      std::int64_t nk[2];
      std::memcpy(nk, f.map->data() + h.data_start + cm.shape->begin, 16);
      cm.N = nk[0];
      cm.K = nk[1];
      if (cm.K == 0)
        bad_input(f.path + ": '" + cm.shape->name + "' is [" + std::to_string(cm.N) +
                  ", 0]: input width 0 (K = 0), but a quantized Linear module has K >= 1");
      const std::int64_t per = 32 / c.bits;
      if (cm.N <= 0 || cm.K <= 0 || cm.K % per != 0 || cm.q->dtype != StDType::I32 ||
          cm.q->shape != Dims{cm.N, cm.K / per})
        bad_input(f.path + ": '" + cm.q->name + "' is " + std::string(st_dtype_name(cm.q->dtype)) + " " +
                  dims_str(cm.q->shape) + ", which does not hold " + std::to_string(c.bits) + "-bit values of shape [" +
                  std::to_string(cm.N) + ", " + std::to_string(cm.K) + "] (weight_shape)");
    } else {  // one value a byte: int-quantized (I8) or float-quantized (FP8 E4M3)
      cm.q = need(mod + ".weight");
      const StDType want = c.kind == CtKind::Fp8 ? StDType::F8_E4M3 : StDType::I8;
      const std::string wn(st_dtype_name(want));
      if (cm.q->dtype != want || cm.q->shape.size() != 2)
        bad_input(f.path + ": '" + cm.q->name + "' must be a 2-D " + wn + " tensor (" + c.format + "), got " +
                  std::string(st_dtype_name(cm.q->dtype)) + " " + dims_str(cm.q->shape));
      cm.N = cm.q->shape[0];
      cm.K = cm.q->shape[1];
      if (cm.K == 0)
        bad_input(f.path + ": '" + cm.q->name + "' is " + wn + " " + dims_str(cm.q->shape) +
                  ": input width 0 (K = 0), but a quantized Linear module has K >= 1");
    }
    cm.G = c.group == 0 ? cm.K : c.group;
    const bool scale_dt_ok =
        c.kind == CtKind::Nvfp4 ? cm.scale->dtype == StDType::F8_E4M3 : st_is_quantizable(cm.scale->dtype);
    if (cm.K % cm.G != 0 || !scale_dt_ok || cm.scale->shape != Dims{cm.N, cm.K / cm.G})
      bad_input(f.path + ": '" + cm.scale->name + "' is " + std::string(st_dtype_name(cm.scale->dtype)) + " " +
                dims_str(cm.scale->shape) + ", expected " +
                (c.kind == CtKind::Nvfp4 ? "F8_E4M3" : "a float (F32, F16 or BF16)") + " [" + std::to_string(cm.N) +
                ", " + std::to_string(cm.K % cm.G == 0 ? cm.K / cm.G : 0) + "]");
    if (!c.symmetric) {
      // pack_to_int32(zp, bits, packed_dim=0): [ceil(N * b / 32), K / G] int32, value + 2^(b-1) unsigned,
      // element n of a column at bits [b * n mod 32, ...) of word b * n / 32 (4 bits: never split).
      cm.zero_point = need(mod + ".weight_zero_point");
      const std::int64_t C = cm.K / cm.G, W = (cm.N * c.bits + 31) / 32;
      if (cm.zero_point->dtype != StDType::I32 || cm.zero_point->shape != Dims{W, C} || c.bits != 4)
        bad_input(f.path + ": '" + cm.zero_point->name + "' is " + std::string(st_dtype_name(cm.zero_point->dtype)) +
                  " " + dims_str(cm.zero_point->shape) + ", expected I32 [" + std::to_string(W) + ", " +
                  std::to_string(C) + "] (4-bit zero points packed along the output channels)");
      const std::byte* zp = f.map->data() + h.data_start + cm.zero_point->begin;
      cm.zp.resize(static_cast<std::size_t>(cm.N * C));
      for (std::int64_t n = 0; n < cm.N; ++n)
        for (std::int64_t j = 0; j < C; ++j) {
          std::uint32_t w;
          std::memcpy(&w, zp + ((n * 4 / 32) * C + j) * 4, 4);
          cm.zp[static_cast<std::size_t>(n * C + j)] =
              static_cast<float>(static_cast<int>((w >> (n * 4 % 32)) & 0xFu) - 8);
        }
    }
    cm.g_idx = h.find(mod + ".weight_g_idx");
    if (cm.g_idx) cm.group_of = read_g_idx(f, *cm.g_idx, cm.K, cm.G);
    mods[mod] = std::move(cm);
  }
  return mods;
}

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
    if (cm.global_scale) fp.consumed.insert(cm.global_scale->name);
    if (cm.g_idx) fp.consumed.insert(cm.g_idx->name);
    if (cm.zero_point) fp.consumed.insert(cm.zero_point->name);
  }
  for (const auto& [mod, cm] : fp.mods) {
    const std::string dense = mod + ".weight";
    if (f.header.find(dense) && !fp.consumed.count(dense))
      bad_input(f.path + ": '" + dense +
                "' is both a dense tensor of the file and the dequantized weight of the compressed module '" + mod +
                "' ('" + cm.q->name + "'); refusing to write the name twice");
    const StDType dt = dequantized_dtype(c, *cm.scale, dtype);
    fp.tensors.push_back({dense, dt, {cm.N, cm.K}, static_cast<std::uint64_t>(cm.N * cm.K) * st_dtype_size(dt), 0});
  }
  for (const auto& t : f.header.tensors)
    if (!fp.consumed.count(t.name)) fp.tensors.push_back({t.name, t.dtype, t.shape, t.nbytes(), 0});
  layout_tensors(fp.tensors);
  fp.header = build_header(fp.tensors, ct::out_metadata(f.header.metadata));
  return fp;
}

using WriteFn = std::function<void(const void*, std::size_t, std::uint64_t)>;

// Per-thread buffers of one piece: the scale of each element, the stored values in the library's form.
struct Scratch {
  std::vector<float> scale;
  std::vector<float> offset;  // -zero point of each element (asymmetric)
  std::vector<std::byte> q;
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// Dequantizes elements [b, b + len) of a module (row-major [N, K]; len within one row when K exceeds a
// piece) into `out` (dtype dt) with the library's anti_quant: the stored values turned into its input
// (int4: two's complement nibbles, word ^ 0x88888888; 8-bit packed: byte ^ 0x80; int-quantized: as
// they are), and the scale of each element (its group's, from g_idx when present) as anti_quant's
// per-element scale: out = narrow(q * s'), the float32 product rounded once to dt.
void dequantize_piece(const WeightFile& wf, const CtModule& cm, const CtConfig& c, std::int64_t b, std::int64_t len,
                      StDType dt, std::byte* out) {
  const bool packed = c.format == "pack-quantized";
  const std::byte* qp = wf.map->data() + wf.header.data_start + cm.q->begin;
  const std::byte* sp = wf.map->data() + wf.header.data_start + cm.scale->begin;
  const auto ssize = static_cast<std::int64_t>(st_dtype_size(cm.scale->dtype));
  const std::int64_t gpr = cm.K / cm.G;
  Scratch& s = scratch();
  s.scale.resize(static_cast<std::size_t>(len));
  const bool asym = !cm.zp.empty();
  if (asym) s.offset.resize(static_cast<std::size_t>(len));
  for (std::int64_t i = 0; i < len;) {
    const std::int64_t r = (b + i) / cm.K, col = (b + i) % cm.K;
    const std::int64_t run = std::min(len - i, cm.K - col);  // the rest of this row within the piece
    const auto scale_at = [&](std::int64_t g) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, sp + (r * gpr + g) * ssize, static_cast<std::size_t>(ssize));
      if (c.kind == CtKind::Nvfp4)  // the effective scale: the E4M3 scale widened, divided by the global scale
        return xquant::detail::hd_float8_to_float(static_cast<std::uint8_t>(bits), xquant::DType::float8_e4m3fn) /
               cm.gs;
      return ct::decode_scale(bits, cm.scale->dtype);
    };
    float* dst = s.scale.data() + i;
    float* off = asym ? s.offset.data() + i : nullptr;
    const auto offset_at = [&](std::int64_t g) { return -cm.zp[static_cast<std::size_t>(r * gpr + g)]; };
    if (!cm.group_of.empty()) {
      for (std::int64_t k = 0; k < run; ++k) {
        const std::int64_t g = cm.group_of[static_cast<std::size_t>(col + k)];
        dst[k] = scale_at(g);
        if (asym) off[k] = offset_at(g);
      }
    } else {
      for (std::int64_t k = 0; k < run;) {  // runs of one group: decoded once
        const std::int64_t g = (col + k) / cm.G, end = std::min(run, (g + 1) * cm.G - col);
        std::fill(dst + k, dst + end, scale_at(g));
        if (asym) std::fill(off + k, off + end, offset_at(g));
        k = end;
      }
    }
    i += run;
  }
  const std::int64_t qbytes = len * c.bits / 8;
  const std::byte* qsrc = qp + b * c.bits / 8;
  if (c.kind != CtKind::Int) {
    // FP8: narrow(e4m3 * s'); NVFP4: narrow(bf16(e2m1 * s_eff)) (b and len are even: K is).
    for (std::int64_t k = 0; k < len; ++k) {
      const auto byte = static_cast<std::uint8_t>(qsrc[c.kind == CtKind::Fp8 ? k : k / 2]);
      float v;
      if (c.kind == CtKind::Fp8) {
        v = xquant::detail::hd_float8_to_float(byte, xquant::DType::float8_e4m3fn) *
            s.scale[static_cast<std::size_t>(k)];
      } else {
        v = ct::fp4_value(static_cast<std::uint8_t>((byte >> (4 * ((b + k) & 1))) & 0xFu)) *
            s.scale[static_cast<std::size_t>(k)];
        v = xquant::bfloat16_to_float(xquant::float_to_bfloat16(v));
      }
      std::byte* o = out + k * static_cast<std::int64_t>(st_dtype_size(dt));
      if (dt == StDType::BF16) {
        const std::uint16_t h = xquant::float_to_bfloat16(v);
        std::memcpy(o, &h, 2);
      } else if (dt == StDType::F16) {
        const std::uint16_t h = xquant::float_to_half(v);
        std::memcpy(o, &h, 2);
      } else {
        std::memcpy(o, &v, 4);
      }
    }
    return;
  }
  const void* x = qsrc;
  if (packed) {
    s.q.resize(static_cast<std::size_t>(qbytes));
    const auto flip = static_cast<std::byte>(c.bits == 4 ? 0x88 : 0x80);
    for (std::int64_t k = 0; k < qbytes; ++k) s.q[static_cast<std::size_t>(k)] = qsrc[k] ^ flip;
    x = s.q.data();
  }
  const xquant::ConstTensorView xv = c.bits == 4 ? xquant::ConstTensorView(x, xquant::DType::int32, {len / 8})
                                                 : xquant::ConstTensorView(x, xquant::DType::int8, {len});
  const xquant::ConstTensorView sv(s.scale.data(), xquant::DType::float32, {len});
  const xquant::TensorView ov(out, ct::lib_dtype(dt), {len});
  std::optional<xquant::ConstTensorView> offv;
  if (asym) offv = xquant::ConstTensorView(s.offset.data(), xquant::DType::float32, {len});
  xquant::anti_quant_out(ov, xv, sv, offv, c.bits == 4 ? xquant::QuantDType::quint4x2 : xquant::QuantDType::qint8);
}

// Writes the dequantized file: header, kept tensors copied, each module's q * s' narrowed, in chunks of
// at most kChunkElems elements made of pieces of at most kPieceElems (whole rows when a row fits in a
// piece, else parts of one row) dequantized in parallel.
void write_dequantized(const WeightFile& wf, const FilePlan& fp, const CtConfig& c, const std::optional<StDType>& dtype,
                       const WriteFn& write) {
  write(fp.header.data(), fp.header.size(), 0);
  std::map<std::string, std::uint64_t> at;
  for (const auto& t : fp.tensors) at[t.name] = fp.header.size() + t.offset;
  for (const auto& t : wf.header.tensors) {
    if (fp.consumed.count(t.name)) continue;
    const std::byte* src = wf.map->data() + wf.header.data_start + t.begin;
    for (std::uint64_t off = 0; off < t.nbytes(); off += ct::kCopyChunk) {
      const std::uint64_t len = std::min(ct::kCopyChunk, t.nbytes() - off);
      write(src + off, static_cast<std::size_t>(len), at.at(t.name) + off);
      wf.map->release(wf.header.data_start + t.begin + off, len);
    }
  }
  std::vector<std::byte> buf;
  for (const auto& entry : fp.mods) {
    const std::string& mod = entry.first;
    const CtModule& cm = entry.second;  // not a structured binding: the OpenMP region below uses it
    const StDType dt = dequantized_dtype(c, *cm.scale, dtype);
    const auto osize = static_cast<std::int64_t>(st_dtype_size(dt));
    const std::int64_t n = cm.N * cm.K;
    // A piece: whole rows when a row fits, else a part of one row (a multiple of 8 elements).
    const std::int64_t piece = cm.K <= ct::kPieceElems ? ct::kPieceElems / cm.K * cm.K : ct::kPieceElems;
    const std::int64_t per_row = (cm.K + piece - 1) / piece;  // pieces per row (1 when rows fit)
    const std::int64_t chunk = std::max<std::int64_t>(1, ct::kChunkElems / piece) * piece;
    const auto piece_begin = [&](std::int64_t k) {  // the first element of piece k
      return cm.K <= ct::kPieceElems ? k * piece : k / per_row * cm.K + k % per_row * piece;
    };
    const auto piece_end = [&](std::int64_t k) {
      return cm.K <= ct::kPieceElems ? std::min(n, (k + 1) * piece)
                                     : k / per_row * cm.K + std::min(cm.K, (k % per_row + 1) * piece);
    };
    const std::int64_t total_pieces = cm.K <= ct::kPieceElems ? (n + piece - 1) / piece : cm.N * per_row;
    const std::int64_t ppc = chunk / piece;
    for (std::int64_t k0 = 0; k0 < total_pieces; k0 += ppc) {
      const std::int64_t k1 = std::min(total_pieces, k0 + ppc);
      const std::int64_t e0 = piece_begin(k0), e1 = piece_end(k1 - 1);
      buf.resize(static_cast<std::size_t>((e1 - e0) * osize));
      std::string failure;
#pragma omp parallel for schedule(dynamic, 1) if (k1 - k0 > 1)
      for (std::int64_t k = k0; k < k1; ++k) {
        try {
          const std::int64_t b = piece_begin(k);
          dequantize_piece(wf, cm, c, b, piece_end(k) - b, dt, buf.data() + (b - e0) * osize);
        } catch (const std::exception& ex) {
#pragma omp critical
          if (failure.empty()) failure = ex.what();
        }
      }
      if (!failure.empty()) bad_input(wf.path + ": '" + mod + ".weight': " + failure);
      write(buf.data(), buf.size(), at.at(mod + ".weight") + static_cast<std::uint64_t>(e0 * osize));
      const auto qb = static_cast<std::uint64_t>(e0 * c.bits / 8), qe = static_cast<std::uint64_t>(e1 * c.bits / 8);
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
    if (!ct::ends_with(t.name, ".weight_scale") || t.shape.size() != 2) continue;
    const std::string mod = t.name.substr(0, t.name.size() - 13);
    CtConfig c;
    const TensorEntry* packed = h.find(mod + ".weight_packed");
    const TensorEntry* shape = h.find(mod + ".weight_shape");
    const TensorEntry* w = h.find(mod + ".weight");
    std::int64_t K = 0;
    if (packed && packed->dtype == StDType::U8 && packed->shape.size() == 2 && packed->shape[1] <= INT64_MAX / 2 &&
        t.dtype == StDType::F8_E4M3 && h.find(mod + ".weight_global_scale")) {
      c.format = "nvfp4-pack-quantized";
      c.kind = CtKind::Nvfp4;
      c.bits = 4;
      K = packed->shape[1] * 2;
      if (K <= 0 || t.shape[1] <= 0 || K % t.shape[1] != 0 || (K / t.shape[1]) % 2 != 0)
        bad_input(f.path + ": '" + t.name + "' " + dims_str(t.shape) + " does not divide K = " + std::to_string(K) +
                  " into groups of an even size");
      c.group = K / t.shape[1];
      return c;
    }
    if (w && w->dtype == StDType::F8_E4M3 && w->shape.size() == 2) {
      c.format = "float-quantized";
      c.kind = CtKind::Fp8;
      c.bits = 8;
      K = w->shape[1];
    } else if (packed && shape && shape->dtype == StDType::I64 && shape->shape == Dims{2} &&
               packed->shape.size() == 2) {
      std::int64_t nk[2];
      std::memcpy(nk, f.map->data() + h.data_start + shape->begin, 16);
      K = nk[1];
      c.format = "pack-quantized";
      if (K <= 0 || packed->shape[1] <= 0) bad_input(f.path + ": '" + shape->name + "' holds no valid shape");
      c.bits = static_cast<int>(packed->shape[1] * 32 / K);
      if ((c.bits != 4 && c.bits != 8) || packed->shape[1] * 32 != K * c.bits)
        bad_input(f.path + ": '" + packed->name + "' " + dims_str(packed->shape) +
                  " is neither 4-bit nor 8-bit packing of K = " + std::to_string(K));
    } else if (w && w->dtype == StDType::I8 && w->shape.size() == 2) {
      K = w->shape[1];
      c.format = "int-quantized";
      c.bits = 8;
    } else {
      continue;
    }
    if (t.shape[1] <= 0 || K % t.shape[1] != 0)
      bad_input(f.path + ": '" + t.name + "' " + dims_str(t.shape) + " does not divide K = " + std::to_string(K) +
                " into groups");
    c.group = t.shape[1] == 1 ? 0 : K / t.shape[1];
    c.symmetric = h.find(mod + ".weight_zero_point") == nullptr;
    if (!c.symmetric && c.format != "pack-quantized")
      bad_input(f.path + ": '" + mod +
                ".weight_zero_point': asymmetric weights are read in the pack-quantized format only");
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
  if (!c)
    bad_input(o.input + ": no compressed-tensors weights (P.weight_scale with P.weight_packed or an I8 P.weight)");
  const FilePlan fp = plan_dequantize(f, *c, o.dtype);
  configure_threads(o.threads);
  AtomicOutput out(o.output, o.force);
  write_dequantized(f, fp, *c, o.dtype,
                    [&](const void* d, std::size_t n, std::uint64_t off) { out.write_at(d, n, off); });
  out.commit();
}

void run_dequantize_dir(const DequantizeOptions& o) {
  check_can_create_dir(o.output, o.input, o.force);
  const ModelDir m = open_model_dir(o.input, o.quiet);
  const CtConfig c = read_ct_config(m);
  std::vector<FilePlan> plans;
  for (const auto& f : m.files) plans.push_back(plan_dequantize(f, c, o.dtype));
  std::vector<ct::OutPlan> idx(m.files.size());
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    idx[i].name = m.files[i].name;
    idx[i].tensors = plans[i].tensors;
  }
  ct::check_unique_names(idx, o.input);  // a dense P.weight in one shard, P compressed in another
  json::Value config = m.config;
  config.erase("quantization_config");

  configure_threads(o.threads);
  OutputDir out(o.output, o.force);
  for (const auto& f : m.other_files) out.copy_file(m.path + "/" + f, f);
  out.write_file(kConfigFile, config.dump(2) + "\n");
  if (m.sharded) out.write_file(kWeightsIndex, ct::index_json(idx));
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
          if (e.second.g_idx) role_of[e.second.g_idx->name] = {"g_idx", &e};
          if (e.second.zero_point) role_of[e.second.zero_point->name] = {"zero_point", &e};
          if (e.second.global_scale) role_of[e.second.global_scale->name] = {"global_scale", &e};
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
    const std::string weights = c->kind == CtKind::Fp8 ? "FP8 E4M3 weights"
                                : c->kind == CtKind::Nvfp4
                                    ? "FP4 E2M1 weights (FP8 E4M3 scales, a float32 global scale)"
                                    : "int" + std::to_string(c->bits) + " weights";
    std::fprintf(out, "compressed-tensors %s: %s, %s, %s%s; ignore: %zu module%s\n", c->format.c_str(), weights.c_str(),
                 c->symmetric ? "symmetric" : "asymmetric",
                 c->group == 0 ? "per output channel" : ("groups of " + std::to_string(c->group)).c_str(),
                 !c->act8                 ? ""
                 : c->kind == CtKind::Fp8 ? ", FP8 dynamic per-token activations"
                                          : ", int8 dynamic per-token activations",
                 qc.contains("ignore") && qc["ignore"].is_array() ? qc["ignore"].size() : 0,
                 qc.contains("ignore") && qc["ignore"].is_array() && qc["ignore"].size() == 1 ? "" : "s");
    std::size_t n = 0, ordered = 0;
    for (const auto& f : m.files)
      for (const auto& [mod, cm] : find_modules(f, *c)) {
        ++n;
        ordered += cm.group_of.empty() ? 0 : 1;
      }
    std::fprintf(out, "quantized modules: %zu", n);
    if (ordered) std::fprintf(out, " (%zu with activation order, weight_g_idx)", ordered);
    std::fprintf(out, "\n");
  } else {
    std::fprintf(out, "not quantized (config.json has no quantization_config)\n");
  }
  for (const auto& f : m.files) {
    std::fprintf(out, "\n");
    run_inspect(InspectOptions{f.path, false}, out);
  }
}

}  // namespace xqcli
