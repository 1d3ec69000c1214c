// Quantizing a Hugging Face model directory to the compressed-tensors format.
//
// Streaming as `xquant quantize` does for one file: every input shard is mapped, not read; the output
// headers are computed first from the input headers; then each weight is processed as a sequence of
// groups (G consecutive elements of a row, G = K per channel) in pieces of at most kPieceElems elements
// (quantized in parallel) and chunks of at most kChunkElems elements (written at their offsets, their
// input pages then dropped from the mapping). A group longer than a piece (a row of more than 2^18
// elements per channel) gets its scale from a first pass over its pieces. Memory is bounded by the
// chunk, whatever the shape. Everything goes into a temporary directory renamed into place at the end
// (model_dir.hpp).
//
// The numbers: the library's xquant::quantize_out does the quantization; the tool's own loops around it
// (widening, group amax, round-trip error sums) are plain scalar code.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <set>

#include "compressed_tensors.hpp"
#include "ct_internal.hpp"
#include "errors.hpp"
#include "model_dir.hpp"
#include "passes.hpp"
#include "plan.hpp"
#include "progress.hpp"
#include "writer.hpp"
#include "core/float8.hpp"
#include "xquant/quantize.hpp"
#include "xquant/version.hpp"

namespace xqcli {

using ct::OJ;

// ---- the numbers ----

namespace {

// x[0, n) widened exactly to float32.
void widen(const std::byte* x, StDType dt, std::int64_t n, float* out) {
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

// The smallest and largest finite values of v[0, n), each taken together with 0 (compressed-tensors
// clamps them to include 0 anyway; min / max are exact: the eight lanes, there for the compiler's
// vectorizer, do not change the result); non-finite values are counted. max(-lo, hi) is the largest
// finite |v|.
void run_minmax(const float* v, std::int64_t n, float& lo, float& hi, std::int64_t& nonfinite) {
  float mn[8] = {}, mx[8] = {};
  std::int32_t bad[8] = {};
  std::int64_t k = 0;
  const auto lane = [&](int j, float x) {
    const bool ok = std::fabs(x) <= FLT_MAX;  // false for NaN and +-Inf
    mn[j] = ok && x < mn[j] ? x : mn[j];
    mx[j] = ok && x > mx[j] ? x : mx[j];
    bad[j] += ok ? 0 : 1;
  };
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) lane(j, v[k + j]);
  for (; k < n; ++k) lane(0, v[k]);
  lo = 0.0f;
  hi = 0.0f;
  for (int j = 0; j < 8; ++j) {
    lo = std::min(lo, mn[j]);
    hi = std::max(hi, mx[j]);
    nonfinite += bad[j];
  }
}

// How the values of a quantized group are held: int8, int4 nibbles, FP8 E4M3 bytes, FP4 E2M1 nibbles.
enum class Stored { Int8, Int4, Fp8, Fp4 };

// The stored values of the quantize call's output (before the storage offsets) q[b, b + n) as float32:
// int8, or the two's complement nibbles of quint4x2 words (element 8k + j in bits [4j, 4j + 3] of word
// k, little endian; b even); FP8 E4M3 bytes; FP4 E2M1 codes, element 2i in the low nibble of byte i.
template <Stored S>
void stored_values(const std::byte* q, std::int64_t b, std::int64_t n, float* out) {
  if constexpr (S == Stored::Int8) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<std::int8_t>(q[b + i]));
  } else if constexpr (S == Stored::Fp8) {
    for (std::int64_t i = 0; i < n; ++i)
      out[i] = xquant::detail::hd_float8_to_float(static_cast<std::uint8_t>(q[b + i]), xquant::DType::float8_e4m3fn);
  } else if constexpr (S == Stored::Fp4) {  // b and n even
    const std::byte* p = q + b / 2;
    for (std::int64_t i = 0; i < n / 2; ++i) {
      const auto byte = static_cast<std::uint8_t>(p[i]);
      out[2 * i] = ct::fp4_value(byte & 0xFu);
      out[2 * i + 1] = ct::fp4_value(static_cast<std::uint8_t>(byte >> 4));
    }
  } else {
    const std::byte* p = q + b / 2;
    std::int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      const auto v = static_cast<unsigned>(p[i / 2]);
      out[i] = static_cast<float>(static_cast<int>((v & 0xFu) ^ 8u) - 8);
      out[i + 1] = static_cast<float>(static_cast<int>((v >> 4) ^ 8u) - 8);
    }
    if (i < n) out[i] = static_cast<float>(static_cast<int>((static_cast<unsigned>(p[i / 2]) & 0xFu) ^ 8u) - 8);
  }
}

std::vector<float>& error_scratch() {
  static thread_local std::vector<float> v;
  return v;
}

// Round-trip error sums of `groups` groups of G: v (x widened) against q * s' in float32
// (dequantize_value(q, s', 0)). Per group, eight float32 lanes (lane = offset in the group mod 8) of x^2
// and (x - q s')^2, added into eight double lanes after each group; the lanes summed in a fixed order at
// the end. The same sums on every machine and for every thread count. Non-finite inputs add +0, which
// leaves a lane as it is. A group whose float32 lanes overflow (|x| above ~1.8e19) is summed again in
// double, so a large weight never turns the report into Inf / Inf = NaN.
template <Stored S>
ErrorStats error_groups(const float* v, const std::byte* q, std::int64_t groups, std::int64_t G, const float* sw,
                        const float* zw) {
  double sig[8] = {}, noi[8] = {};
  float mx[8] = {};
  double mxd = 0.0;
  std::vector<float>& qf = error_scratch();
  if (qf.size() < static_cast<std::size_t>(G)) qf.resize(static_cast<std::size_t>(G));
  for (std::int64_t g = 0; g < groups; ++g) {
    const float s = sw[g];
    const float z = zw ? zw[g] : 0.0f;  // (q - z) is exact: small integers
    float gs[8] = {}, gn[8] = {}, gm[8] = {};
    const std::int64_t b = g * G;
    const float* x = v + b;
    stored_values<S>(q, b, G, qf.data());
    const float* qv = qf.data();
    const auto lane = [&](int j, std::int64_t k) {
      const bool ok = std::fabs(x[k]) <= FLT_MAX;
      const float r = (qv[k] - z) * s;
      const float xs = ok ? x[k] : 0.0f;
      const float e = ok ? x[k] - r : 0.0f;
      gs[j] += xs * xs;
      gn[j] += e * e;
      const float ae = std::fabs(e);
      gm[j] = ae > gm[j] ? ae : gm[j];
    };
    std::int64_t k = 0;
    for (; k + 8 <= G; k += 8)
      for (int j = 0; j < 8; ++j) lane(j, k + j);
    for (; k < G; ++k) lane(static_cast<int>(k & 7), k);
    bool finite = true;
    for (int j = 0; j < 8; ++j) finite = finite && std::isfinite(gs[j]) && std::isfinite(gn[j]) && std::isfinite(gm[j]);
    if (finite) {
      for (int j = 0; j < 8; ++j) {
        sig[j] += static_cast<double>(gs[j]);
        noi[j] += static_cast<double>(gn[j]);
        mx[j] = gm[j] > mx[j] ? gm[j] : mx[j];
      }
      continue;
    }
    for (k = 0; k < G; ++k) {
      const int j = static_cast<int>(k & 7);
      const double xd = x[k];
      if (!(std::fabs(xd) <= FLT_MAX)) continue;
      const double e = xd - static_cast<double>((qv[k] - z) * s);
      sig[j] += xd * xd;
      noi[j] += e * e;
      mxd = std::max(mxd, std::fabs(e));
    }
  }
  ErrorStats err;
  for (int j = 0; j < 8; ++j) {
    err.signal += sig[j];
    err.noise += noi[j];
    err.max_abs = std::max(err.max_abs, static_cast<double>(mx[j]));
  }
  err.max_abs = std::max(err.max_abs, mxd);
  return err;
}

// The library's quantize on the [groups, G] view of x (aligned) with the widened stored scales sw (and
// zero points zw, asymmetric), the round-trip error against v, then the storage offsets of
// compressed-tensors. The compressed-tensors rule: qint8 with div_mode=True, v = x / s' + zp in float32,
// rint, saturated (compressed-tensors' round(clamp(x / s + zp, qmin, qmax)): the same, rint and clamping
// commute on integer bounds), then for 4 bits clamped to [-8, 7] and packed as quint4x2 nibbles. The
// amax-qmax rule (the tool before issue 19): int8 the same; int4 quint4x2 with div_mode=False,
// q = rint(x * (1 / s')).
std::vector<std::int8_t>& int8_scratch() {
  static thread_local std::vector<std::int8_t> v;
  return v;
}

ErrorStats quantize_known(const std::byte* x, StDType dt, const float* v, std::int64_t groups, std::int64_t G,
                          const Preset& p, const float* sw, const float* zw, std::byte* q) {
  const xquant::ConstTensorView xin(x, ct::lib_dtype(dt), {groups, G});
  const xquant::ConstTensorView sv(sw, xquant::DType::float32, {groups});
  std::optional<xquant::ConstTensorView> zv;
  if (zw) zv = xquant::ConstTensorView(zw, xquant::DType::float32, {groups});
  ErrorStats e;
  if (p.kind == CtKind::Fp8) {  // E4M3 bytes of clamp(x / s', -448, 448)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t k = g * G; k < (g + 1) * G; ++k) q[k] = static_cast<std::byte>(ct::fp8_quantize(v[k], sw[g]));
    return error_groups<Stored::Fp8>(v, q, groups, G, sw, nullptr);
  }
  if (p.kind == CtKind::Nvfp4) {  // E2M1 codes of clamp(x / s_eff, -6, 6), two per byte (G is even)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t k = g * G; k < (g + 1) * G; k += 2)
        q[k / 2] = static_cast<std::byte>(ct::fp4_quantize(v[k], sw[g]) | (ct::fp4_quantize(v[k + 1], sw[g]) << 4));
    return error_groups<Stored::Fp4>(v, q, groups, G, sw, nullptr);
  }
  if (p.bits == 8) {
    const xquant::TensorView yout(q, xquant::DType::int8, {groups, G});
    xquant::quantize_out(yout, xin, sv, zv, xquant::QuantDType::qint8, 0, true);
    e = error_groups<Stored::Int8>(v, q, groups, G, sw, zw);
  } else if (!p.amax_qmax) {
    auto& t = int8_scratch();
    t.resize(static_cast<std::size_t>(groups * G));
    const xquant::TensorView yout(t.data(), xquant::DType::int8, {groups, G});
    xquant::quantize_out(yout, xin, sv, zv, xquant::QuantDType::qint8, 0, true);
    for (std::int64_t i = 0; i < groups * G; i += 2) {  // G is a multiple of 8
      const int lo = std::clamp<int>(t[static_cast<std::size_t>(i)], -8, 7);
      const int hi = std::clamp<int>(t[static_cast<std::size_t>(i + 1)], -8, 7);
      q[i / 2] = static_cast<std::byte>((lo & 0xF) | ((hi & 0xF) << 4));
    }
    e = error_groups<Stored::Int4>(v, q, groups, G, sw, zw);
  } else {
    std::vector<float> mult(static_cast<std::size_t>(groups));
    for (std::size_t g = 0; g < mult.size(); ++g) mult[g] = 1.0f / sw[g];  // quint4x2 multiplies
    const xquant::TensorView yout(q, xquant::DType::int32, {groups, G / 8});
    const xquant::ConstTensorView mv(mult.data(), xquant::DType::float32, {groups});
    xquant::quantize_out(yout, xin, mv, std::nullopt, xquant::QuantDType::quint4x2, -2, false);
    e = error_groups<Stored::Int4>(v, q, groups, G, sw, nullptr);
  }
  if (p.packed) {  // unsigned storage: each nibble + 8 (int4), each byte + 128 (8-bit packed words)
    const auto flip = static_cast<std::byte>(p.bits == 4 ? 0x88 : 0x80);
    const std::int64_t bytes = groups * G * p.bits / 8;
    for (std::int64_t i = 0; i < bytes; ++i) q[i] ^= flip;
  }
  return e;
}

// Per-thread scratch, reused from call to call (at most a piece: 1 MiB of float32).
struct Scratch {
  std::vector<float> v;
  std::vector<std::byte> staging;
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// x aligned for the library's typed reads: x itself, or a copy in the scratch's staging.
const std::byte* aligned_input(const std::byte* x, StDType dt, std::int64_t n) {
  const auto esize = st_dtype_size(dt);
  if (reinterpret_cast<std::uintptr_t>(x) % esize == 0) return x;
  auto& st = scratch().staging;
  st.resize(static_cast<std::size_t>(n) * esize);
  std::memcpy(st.data(), x, st.size());
  return st.data();
}

float* widened(const std::byte* x, StDType dt, std::int64_t n) {
  auto& v = scratch().v;
  if (v.size() < static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
  widen(x, dt, n, v.data());
  return v.data();
}

std::string place(std::int64_t group, std::int64_t G, std::int64_t groups_per_row) {
  const std::int64_t row = group / groups_per_row, c0 = group % groups_per_row * G;
  return "row " + std::to_string(row) + ", columns [" + std::to_string(c0) + ", " + std::to_string(c0 + G) + ")";
}

CtScale group_scale(float lo, float hi, const Preset& p, StDType scale_dt, float global_scale) {
  if (p.kind == CtKind::Fp8) return ct_fp8_scale(std::max(-lo, hi), scale_dt);
  if (p.kind == CtKind::Nvfp4) return ct_nvfp4_scale(std::max(-lo, hi), global_scale);
  return ct_qparams(lo, hi, p, scale_dt);
}

// Why the float presets refuse a NaN / +-Inf weight, after the place and the value (or count) found.
std::string nonfinite_reason(const Preset& p) {
  return p.name + " refuses NaN and +-Inf weights (compressed-tensors would give the whole " +
         (p.kind == CtKind::Fp8 ? "channel" : "group") + " a NaN or infinite scale); replace them, or --ignore the module";
}
std::string nonfinite_refusal(const Preset& p, float value) {
  return std::string(std::isnan(value) ? "NaN" : value > 0 ? "+Inf" : "-Inf") + ": " + nonfinite_reason(p);
}

}  // namespace

ErrorStats ct_quantize_groups(const std::byte* x, StDType dt, std::int64_t groups, std::int64_t G, const Preset& p,
                              StDType scale_dt, std::byte* q, std::byte* scale, std::int64_t first_group,
                              std::int64_t groups_per_row, std::int8_t* zp, float global_scale) {
  const std::int64_t n = groups * G;
  const auto ssize = st_dtype_size(scale_dt);
  const std::byte* xa = aligned_input(x, dt, n);
  const float* v = widened(x, dt, n);
  // 1. Scales (and zero points) from the finite minimum and maximum of each group, rounded to the scale
  //    dtype.
  std::int64_t nonfinite = 0;
  std::vector<float> sw(static_cast<std::size_t>(groups));
  std::vector<float> zw(p.symmetric ? 0 : static_cast<std::size_t>(groups));
  for (std::int64_t g = 0; g < groups; ++g) {
    float lo, hi;
    run_minmax(v + g * G, G, lo, hi, nonfinite);
    if (nonfinite && p.kind != CtKind::Int)
      for (std::int64_t k = 0; k < G; ++k)
        if (!std::isfinite(v[g * G + k])) {
          const std::int64_t at = (first_group + g) % groups_per_row * G + k;
          bad_input("row " + std::to_string((first_group + g) / groups_per_row) + ", column " + std::to_string(at) +
                    ": " + nonfinite_refusal(p, v[g * G + k]));
        }
    if (p.mse) ct_mse_range(v + g * G, G, lo, hi, p, scale_dt);
    const CtScale s = group_scale(lo, hi, p, scale_dt, global_scale);
    if (!s.ok)
      bad_input(place(first_group + g, G, groups_per_row) + ": " +
                ct_scale_problem(std::max(-lo, hi), p.bits, scale_dt, s));
    std::memcpy(scale + static_cast<std::size_t>(g) * ssize, &s.bits, ssize);  // little endian: the low bytes
    sw[static_cast<std::size_t>(g)] = s.widened;
    if (!p.symmetric) {
      zw[static_cast<std::size_t>(g)] = s.zero_point;
      if (zp) zp[g] = static_cast<std::int8_t>(s.zero_point);
    }
  }
  // 2. The library's quantize with the stored scales; the error; the storage offsets.
  ErrorStats e = quantize_known(xa, dt, v, groups, G, p, sw.data(), p.symmetric ? nullptr : zw.data(), q);
  e.nonfinite = nonfinite;
  return e;
}

// ---- quantize a directory ----

namespace {

// compressed-tensors' pack_to_int32(zp, bits, packed_dim=0) of the [N, C] zero points: along the output
// channels, each value + 2^(b-1) unsigned, element n of column c at bits [b*n mod 32, ...) of word
// b*n / 32 of that column (4 bits: never split across words); the last word of a column padded with 0
// bits. Shape [ceil(N * b / 32), C], little-endian int32 words.
std::uint64_t zero_point_bytes(std::int64_t N, std::int64_t C, int bits) {
  return static_cast<std::uint64_t>((N * bits + 31) / 32 * C) * 4;
}

std::vector<std::byte> pack_zero_points(const std::vector<std::int8_t>& zp, std::int64_t N, std::int64_t C, int bits) {
  const std::int64_t W = (N * bits + 31) / 32;
  std::vector<std::uint32_t> words(static_cast<std::size_t>(W * C), 0u);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const auto u = static_cast<std::uint32_t>(zp[static_cast<std::size_t>(n * C + c)] + (1 << (bits - 1)));
      const std::int64_t bit = n * bits;
      words[static_cast<std::size_t>(bit / 32 * C + c)] |= u << (bit % 32);
      if (bit % 32 + bits > 32) words[static_cast<std::size_t>((bit / 32 + 1) * C + c)] |= u >> (32 - bit % 32);
    }
  std::vector<std::byte> out(words.size() * 4);
  for (std::size_t i = 0; i < words.size(); ++i)
    for (int b = 0; b < 4; ++b) out[i * 4 + static_cast<std::size_t>(b)] = static_cast<std::byte>(words[i] >> (8 * b));
  return out;
}

// The dtype of the stored values and of the scales of a preset (the scales of the int presets and
// FP8_DYNAMIC: the model's dtype from config.json, else the weight's).
StDType stored_dtype(const Preset& p) {
  if (p.kind == CtKind::Fp8) return StDType::F8_E4M3;
  if (p.kind == CtKind::Nvfp4) return StDType::U8;
  return p.packed ? StDType::I32 : StDType::I8;
}
StDType scale_dtype(const Preset& p, const std::optional<StDType>& model_dt, StDType weight_dt) {
  return p.kind == CtKind::Nvfp4 ? StDType::F8_E4M3 : model_dt.value_or(weight_dt);
}

// One input tensor and where its outputs go.
struct Item {
  std::size_t file = 0;  // input file index
  const TensorEntry* t = nullptr;
  CtDecision d;
  std::size_t out = 0;  // output file index
  std::uint64_t out_bytes = 0;
};

std::string shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Assigns each item (a group of output tensors) to an output file: the input's shards when it was
// sharded and no --max-shard-size was given, else greedily in input order up to `max` bytes.
std::vector<std::string> assign_files(std::vector<Item>& items, const ModelDir& m,
                                      const std::optional<std::uint64_t>& max) {
  std::vector<std::string> names;
  if (m.sharded && !max) {
    for (const auto& f : m.files) names.push_back(f.name);
    for (auto& it : items) it.out = it.file;
    return names;
  }
  const std::uint64_t limit = max.value_or(ct::kDefaultShard);
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

// Runs `body(k)` for k in [0, n) on the OpenMP team (one piece each, dynamically), collecting the first
// exception's message instead of letting it escape the parallel region; then throws it, prefixed with
// the tensor's name.
template <class Body>
void parallel_pieces(std::int64_t n, const std::string& tensor, Body&& body) {
  std::string failure;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (std::int64_t k = 0; k < n; ++k) {
    try {
      body(k);
    } catch (const std::exception& ex) {
#pragma omp critical
      if (failure.empty()) failure = ex.what();
    }
  }
  if (!failure.empty()) bad_input("tensor '" + tensor + "': " + failure);
}

// The streaming of one quantized weight [N, K] with group size G.
struct WeightJob {
  const Preset& p;
  const TensorEntry& t;
  const MappedFile& in;
  std::uint64_t src_off;  // the tensor's first byte in the mapped file
  StDType sdt;
  AsyncWriter& writer;
  std::size_t out_file;
  std::uint64_t qdst, sdst;  // output offsets of the stored values and of the scales
  Progress& progress;
  std::uint64_t& done;
  std::size_t tensors_done;
  std::vector<std::int8_t>* zp = nullptr;  // asymmetric: the zero point of every group, [N, K / G]
  float global_scale = 0.0f;               // NVFP4A16: the tensor's (global_amax() first)

  // NVFP4A16's first pass: the largest finite |x| of the whole tensor, in pieces (in parallel, merged
  // exactly), its input pages dropped after each chunk. A NaN or +-Inf weight is refused here.
  float global_amax() {
    const std::byte* src = in.data() + src_off;
    const auto esize = static_cast<std::int64_t>(st_dtype_size(t.dtype));
    const std::int64_t n = t.numel, piece = ct::kPieceElems;
    const std::int64_t npieces = (n + piece - 1) / piece, ppc = ct::kChunkElems / piece;
    float amax = 0.0f;
    for (std::int64_t c0 = 0; c0 < npieces; c0 += ppc) {
      const std::int64_t c1 = std::min(npieces, c0 + ppc);
      std::vector<float> lo(static_cast<std::size_t>(c1 - c0)), hi(lo.size());
      std::vector<std::int64_t> bad(lo.size());
      parallel_pieces(c1 - c0, t.name, [&](std::int64_t k) {
        const std::int64_t a = (c0 + k) * piece, len = std::min(n, a + piece) - a;
        const float* v = widened(src + a * esize, t.dtype, len);
        const auto i = static_cast<std::size_t>(k);
        run_minmax(v, len, lo[i], hi[i], bad[i]);
        if (bad[i])
          for (std::int64_t j = 0; j < len; ++j)
            if (!std::isfinite(v[j]))
              bad_input("row " + std::to_string((a + j) / t.shape[1]) + ", column " +
                        std::to_string((a + j) % t.shape[1]) + ": " + nonfinite_refusal(p, v[j]));
      });
      for (std::size_t i = 0; i < lo.size(); ++i) amax = std::max(amax, std::max(-lo[i], hi[i]));
      in.release(src_off + static_cast<std::uint64_t>(c0 * piece * esize),
                 static_cast<std::uint64_t>((std::min(n, c1 * piece) - c0 * piece) * esize));
    }
    return amax;
  }

  ErrorStats run() {
    const std::int64_t N = t.shape[0], K = t.shape[1];
    const std::int64_t G = p.group == 0 ? K : p.group;
    return G <= ct::kPieceElems ? whole_groups(N, K, G) : long_groups(N, K, G);
  }

  // Groups of at most a piece: pieces of whole groups. A piece is as many whole rows as fit in
  // kPieceElems when a row does (the error sums are added piece by piece, so this keeps them as they
  // were), else as many groups as fit.
  ErrorStats whole_groups(std::int64_t N, std::int64_t K, std::int64_t G) {
    const std::byte* src = in.data() + src_off;
    const auto esize = static_cast<std::int64_t>(st_dtype_size(t.dtype));
    const auto ssize = static_cast<std::int64_t>(st_dtype_size(sdt));
    const std::int64_t gpr = K / G, total = N * gpr;
    const std::int64_t gpp = K <= ct::kPieceElems ? ct::kPieceElems / K * gpr : ct::kPieceElems / G;
    const std::int64_t gpc = std::max<std::int64_t>(1, ct::kChunkElems / (gpp * G)) * gpp;
    ErrorStats err;
    for (std::int64_t g0 = 0; g0 < total; g0 += gpc) {
      const std::int64_t g1 = std::min(total, g0 + gpc);
      std::vector<std::byte> qbuf = writer.buffer();
      qbuf.resize(static_cast<std::size_t>((g1 - g0) * G * p.bits / 8));
      std::vector<std::byte> sbuf(static_cast<std::size_t>((g1 - g0) * ssize));
      const std::int64_t npieces = (g1 - g0 + gpp - 1) / gpp;
      std::vector<ErrorStats> errs(static_cast<std::size_t>(npieces));
      std::byte* qb = qbuf.data();
      std::byte* sb = sbuf.data();
      parallel_pieces(npieces, t.name, [&](std::int64_t k) {
        const std::int64_t a = g0 + k * gpp, b = std::min(g1, a + gpp);
        errs[static_cast<std::size_t>(k)] =
            ct_quantize_groups(src + a * G * esize, t.dtype, b - a, G, p, sdt, qb + (a - g0) * G * p.bits / 8,
                               sb + (a - g0) * ssize, a, gpr, zp ? zp->data() + a : nullptr, global_scale);
      });
      for (const auto& e : errs) err.merge(e);  // piece order: the same for every thread count
      writer.submit(std::move(qbuf), qdst + static_cast<std::uint64_t>(g0 * G * p.bits / 8), out_file);
      writer.submit(std::move(sbuf), sdst + static_cast<std::uint64_t>(g0 * ssize), out_file);
      const auto bytes = static_cast<std::uint64_t>((g1 - g0) * G * esize);
      in.release(src_off + static_cast<std::uint64_t>(g0 * G * esize), bytes);
      done += bytes;
      progress.update(done, tensors_done);
    }
    return err;
  }

  // Groups longer than a piece (per channel with K > 2^18): per group, its amax from a first pass over
  // its pieces (in parallel, merged exactly), then its pieces quantized with that scale, chunk by chunk.
  // Each piece is one run of the error sums.
  ErrorStats long_groups(std::int64_t N, std::int64_t K, std::int64_t G) {
    const std::byte* src = in.data() + src_off;
    const auto esize = static_cast<std::int64_t>(st_dtype_size(t.dtype));
    const auto ssize = static_cast<std::int64_t>(st_dtype_size(sdt));
    const std::int64_t gpr = K / G, total = N * gpr;
    const std::int64_t piece = ct::kPieceElems;  // a multiple of 8: packed words are not split
    const std::int64_t npieces = (G + piece - 1) / piece;
    const std::int64_t ppc = ct::kChunkElems / piece;  // pieces per chunk
    ErrorStats err;
    for (std::int64_t g = 0; g < total; ++g) {
      const std::byte* gx = src + g * G * esize;
      const std::uint64_t goff = src_off + static_cast<std::uint64_t>(g * G * esize);
      std::vector<float> lo(static_cast<std::size_t>(npieces)), hi(static_cast<std::size_t>(npieces));
      std::vector<std::int64_t> bad(static_cast<std::size_t>(npieces));
      for (std::int64_t c0 = 0; c0 < npieces; c0 += ppc) {
        const std::int64_t c1 = std::min(npieces, c0 + ppc);
        parallel_pieces(c1 - c0, t.name, [&](std::int64_t k) {
          const std::int64_t a = (c0 + k) * piece, len = std::min(G, a + piece) - a;
          const auto i = static_cast<std::size_t>(c0 + k);
          run_minmax(widened(gx + a * esize, t.dtype, len), len, lo[i], hi[i], bad[i]);
        });
        in.release(goff + static_cast<std::uint64_t>(c0 * piece * esize),
                   static_cast<std::uint64_t>((std::min(G, c1 * piece) - c0 * piece) * esize));
      }
      float mn = 0.0f, mx = 0.0f;
      for (std::size_t k = 0; k < lo.size(); ++k) {
        mn = std::min(mn, lo[k]);
        mx = std::max(mx, hi[k]);
        err.nonfinite += bad[k];
      }
      if (p.mse)
        bad_input("tensor '" + t.name + "': --observer mse keeps a group in memory; groups longer than " +
                  std::to_string(ct::kPieceElems) + " elements (here one scale per row of " + std::to_string(G) +
                  ") are not supported: use a --group-size");
      if (err.nonfinite && p.kind != CtKind::Int)
        bad_input("tensor '" + t.name + "': " + place(g, G, gpr) + " holds " + std::to_string(err.nonfinite) +
                  " NaN or +-Inf values: " + nonfinite_reason(p));
      const CtScale s = group_scale(mn, mx, p, sdt, global_scale);
      if (!s.ok)
        bad_input("tensor '" + t.name + "': " + place(g, G, gpr) + ": " +
                  ct_scale_problem(std::max(-mn, mx), p.bits, sdt, s));
      std::vector<std::byte> sb(static_cast<std::size_t>(ssize));
      std::memcpy(sb.data(), &s.bits, sb.size());
      writer.submit(std::move(sb), sdst + static_cast<std::uint64_t>(g * ssize), out_file);
      if (zp) (*zp)[static_cast<std::size_t>(g)] = static_cast<std::int8_t>(s.zero_point);
      const float zw = s.zero_point;
      const float sw = s.widened;
      for (std::int64_t c0 = 0; c0 < npieces; c0 += ppc) {
        const std::int64_t c1 = std::min(npieces, c0 + ppc);
        const std::int64_t e0 = c0 * piece, e1 = std::min(G, c1 * piece);
        std::vector<std::byte> qbuf = writer.buffer();
        qbuf.resize(static_cast<std::size_t>((e1 - e0) * p.bits / 8));
        std::vector<ErrorStats> errs(static_cast<std::size_t>(c1 - c0));
        std::byte* qb = qbuf.data();
        parallel_pieces(c1 - c0, t.name, [&](std::int64_t k) {
          const std::int64_t b = (c0 + k) * piece, len = std::min(G, b + piece) - b;
          const std::byte* x = gx + b * esize;
          const float* v = widened(x, t.dtype, len);
          errs[static_cast<std::size_t>(k)] = quantize_known(aligned_input(x, t.dtype, len), t.dtype, v, 1, len, p, &sw,
                                                             p.symmetric ? nullptr : &zw, qb + (b - e0) * p.bits / 8);
        });
        for (const auto& e : errs) err.merge(e);
        writer.submit(std::move(qbuf), qdst + static_cast<std::uint64_t>((g * G + e0) * p.bits / 8), out_file);
        const auto bytes = static_cast<std::uint64_t>((e1 - e0) * esize);
        in.release(goff + static_cast<std::uint64_t>(e0 * esize), bytes);
        done += bytes;
        progress.update(done, tensors_done);
      }
    }
    return err;
  }
};

}  // namespace

QuantizeResult run_export(const QuantizeOptions& o, const ExportOptions& e) {
  const auto t0 = std::chrono::steady_clock::now();
  const Preset p = make_preset(e);
  CtSelection sel = compile_selection(e);
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
  const std::optional<StDType> model_dt = ct::dtype_from_config(m.config);

  // Decide every tensor and lay out every output file before reading any data.
  std::set<std::string> names;
  for (const auto& f : m.files)
    for (const auto& t : f.header.tensors) names.insert(t.name);
  // A tied output head has no tensor but is a Linear module of a causal language model (transformers
  // ties its weight to the embedding): it exists for --targets / --ignore and for the ignore list.
  bool tied_head = false;
  if (tied && !names.count("lm_head.weight") && m.config["architectures"].is_array())
    for (const auto& a : m.config["architectures"].items())
      if (a.is_string() && (ct::ends_with(a.text(), "ForCausalLM") || ct::ends_with(a.text(), "LMHeadModel") ||
                            ct::ends_with(a.text(), "ForConditionalGeneration")))
        tied_head = true;
  QuantizeResult result;
  std::vector<Item> items;
  std::set<std::string> ignore;
  if (tied_head) {
    ignore.insert("lm_head");
    for (auto* v : {&sel.targets, &sel.ignore})
      for (auto& s : *v)
        if (selector_matches(s, "lm_head", "Linear")) s.matched = true;
  }
  std::vector<std::int64_t> partial_k, all_k;
  for (std::size_t fi = 0; fi < m.files.size(); ++fi)
    for (const auto& t : m.files[fi].header.tensors) {
      Item it;
      it.file = fi;
      it.t = &t;
      it.d = decide_ct(t, p, sel, tied);
      if (it.d.quantize || it.d.partial) all_k.push_back(t.shape[1]);
      if (it.d.partial) partial_k.push_back(t.shape[1]);
      if (it.d.warn && o.strict && !(it.d.partial && !e.keep_partial_dense))
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
        for (const char* suffix : {".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point",
                                   ".weight_g_idx", ".weight_global_scale"})
          if (names.count(it.d.module + suffix))
            bad_input(o.input + ": tensor '" + it.d.module + suffix + "' already exists, so '" + t.name +
                      "' cannot be quantized (is the model already quantized?)");
        const std::int64_t N = t.shape[0], K = t.shape[1];
        const std::int64_t G = p.group == 0 ? K : p.group;
        const StDType sdt = scale_dtype(p, model_dt, t.dtype);
        r.stored_dtype = stored_dtype(p);
        r.stored_shape = p.kind == CtKind::Nvfp4 ? Dims{N, K / 2} : p.packed ? Dims{N, K * p.bits / 32} : Dims{N, K};
        r.channel_dim = 0;
        r.channels = N * (K / G);
        // + weight_shape (int packed) or weight_global_scale (NVFP4A16), + the zero points (asymmetric)
        r.bytes_out = static_cast<std::uint64_t>(N * K * p.bits / 8) +
                      static_cast<std::uint64_t>(N * (K / G)) * st_dtype_size(sdt) +
                      (p.kind == CtKind::Nvfp4 ? 4
                       : p.packed              ? 16
                                               : 0) +
                      (p.symmetric ? 0 : zero_point_bytes(N, K / G, p.bits));
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
  check_all_matched(sel);
  if (!partial_k.empty() && !e.keep_partial_dense) bad_input(partial_groups_message(p, partial_k, all_k));

  const std::vector<std::string> file_names = assign_files(items, m, e.max_shard_size);
  std::vector<ct::OutPlan> outs(file_names.size());
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
    const StDType sdt = scale_dtype(p, model_dt, it.t->dtype);
    const auto qbytes = static_cast<std::uint64_t>(N * K * p.bits / 8);
    ts.push_back({it.d.module + (p.packed ? ".weight_packed" : ".weight"), r.stored_dtype, r.stored_shape, qbytes, 0});
    ts.push_back({it.d.module + ".weight_scale",
                  sdt,
                  {N, K / G},
                  static_cast<std::uint64_t>(N * (K / G)) * st_dtype_size(sdt),
                  0});
    if (p.kind == CtKind::Nvfp4)
      ts.push_back({it.d.module + ".weight_global_scale", StDType::F32, {1}, 4, 0});
    else if (p.packed)
      ts.push_back({it.d.module + ".weight_shape", StDType::I64, {2}, 16, 0});
    if (!p.symmetric)
      ts.push_back({it.d.module + ".weight_zero_point",
                    StDType::I32,
                    {(N * p.bits + 31) / 32, K / G},
                    zero_point_bytes(N, K / G, p.bits),
                    0});
  }
  ct::check_unique_names(outs, o.input);
  // Metadata of each output file: that of its first input file, with format = pt.
  std::vector<std::map<std::string, std::string>> metas(outs.size());
  for (std::size_t i = items.size(); i-- > 0;)
    metas[items[i].out] = ct::out_metadata(m.files[items[i].file].header.metadata);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (metas[i].empty()) metas[i] = {{"format", "pt"}};
    outs[i].data_size = layout_tensors(outs[i].tensors);
    outs[i].header = build_header(outs[i].tensors, metas[i]);
  }

  json::Value config = m.config;
  config.set("quantization_config", json::Value::from_nlohmann(OJ::parse(quantization_config_json(
                                        p, std::vector<std::string>(ignore.begin(), ignore.end())))));

  if (!o.quiet)
    for (const auto& r : result.tensors)
      if (r.warned)
        std::fprintf(stderr, "xquant: warning: keeping '%s' dense (added to ignore): %s\n", r.name.c_str(),
                     r.reason.c_str());

  configure_threads(o.threads);
  ensure_open_files(outs.size(), "writing " + std::to_string(outs.size()) + " weight files");
  std::vector<std::string> written = file_names;
  written.insert(written.end(), {kConfigFile, kWeightsIndex});
  if (!e.recipe_yaml.empty()) written.emplace_back("recipe.yaml");
  OutputDir out(o.output, o.force);
  for (const auto& f : files_to_copy(m, written, o.quiet)) out.copy_file(m.path + "/" + f, f);
  out.write_file(kConfigFile, config.dump(2) + "\n");
  if (!e.recipe_yaml.empty()) out.write_file("recipe.yaml", e.recipe_yaml);
  if (outs.size() > 1 || m.sharded || file_names[0] != kSingleWeights)
    out.write_file(kWeightsIndex, ct::index_json(outs));

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
      if (!it.d.quantize) {
        const std::byte* src = in.data() + src_off;
        const std::uint64_t dst = offset_of[it.out].at(it.t->name);
        for (std::uint64_t off = 0; off < it.t->nbytes(); off += ct::kCopyChunk) {
          const std::uint64_t len = std::min(ct::kCopyChunk, it.t->nbytes() - off);
          writer.submit_view(src + off, static_cast<std::size_t>(len), dst + off, &in, src_off + off, it.out);
          done += len;
          progress.update(done, tensors_done);
        }
      } else {
        const std::uint64_t qdst = offset_of[it.out].at(it.d.module + (p.packed ? ".weight_packed" : ".weight"));
        const std::uint64_t sdst = offset_of[it.out].at(it.d.module + ".weight_scale");
        WeightJob job{p,    *it.t,    in,   src_off,     scale_dtype(p, model_dt, it.t->dtype), writer, it.out, qdst,
                      sdst, progress, done, tensors_done};
        if (p.kind == CtKind::Nvfp4) {
          job.global_scale = ct_nvfp4_global_scale(job.global_amax());
          std::vector<std::byte> gb(4);
          std::memcpy(gb.data(), &job.global_scale, 4);
          writer.submit(std::move(gb), offset_of[it.out].at(it.d.module + ".weight_global_scale"), it.out);
        }
        std::vector<std::int8_t> zps;
        const std::int64_t N = it.t->shape[0], K = it.t->shape[1];
        const std::int64_t G = p.group == 0 ? K : p.group;
        if (!p.symmetric) {
          zps.resize(static_cast<std::size_t>(N * (K / G)));
          job.zp = &zps;
        }
        TensorResult& res = result.tensors[i];
        res.error = job.run();
        if (!p.symmetric)
          writer.submit(pack_zero_points(zps, N, K / G, p.bits),
                        offset_of[it.out].at(it.d.module + ".weight_zero_point"), it.out);
        if (p.packed && p.kind == CtKind::Int) {
          const std::int64_t shape[2] = {it.t->shape[0], it.t->shape[1]};
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
                    {"scale_rule", p.amax_qmax ? "amax-qmax" : "compressed-tensors"},
                    {"observer", p.mse ? "mse" : "minmax"},
                    {"keep_partial_dense", e.keep_partial_dense},
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
  if (p.kind == CtKind::Fp8)
    std::fprintf(out,
                 "format: compressed-tensors %s (%s): FP8 E4M3 weights, symmetric, one scale per output channel, "
                 "dynamic per-token FP8 activations\n",
                 p.name.c_str(), ct_format_name(p));
  else if (p.kind == CtKind::Nvfp4)
    std::fprintf(out,
                 "format: compressed-tensors %s (%s): FP4 E2M1 weights, groups of 16 with FP8 E4M3 scales and a "
                 "float32 global scale per tensor\n",
                 p.name.c_str(), ct_format_name(p));
  else
    std::fprintf(out, "format: compressed-tensors %s (%s): int%d weights, %s (scale rule %s), %s%s\n", p.name.c_str(),
                 ct_format_name(p), p.bits, p.symmetric ? "symmetric" : "asymmetric",
                 p.amax_qmax ? "amax / qmax" : "compressed-tensors",
                 p.group == 0 ? "one scale per output channel" : ("groups of " + std::to_string(p.group)).c_str(),
                 p.act8 ? ", dynamic per-token int8 activations" : "");
  const char* stored = p.kind == CtKind::Fp8     ? "fp8"
                       : p.kind == CtKind::Nvfp4 ? "fp4"
                       : p.packed                ? (p.bits == 4 ? "int4" : "int8p")
                                                 : "int8";
  print_summary(out, r, stored, "kept dense", " of weights");
  if (!o.report_path.empty()) std::fprintf(out, "report: %s\n", o.report_path.c_str());
}

}  // namespace xqcli
