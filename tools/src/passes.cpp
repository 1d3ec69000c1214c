#include "passes.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "xquant/anti_quant.hpp"
#include "xquant/half.hpp"

namespace xqcli {

const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t h = 0; h < 65536; ++h) t[h] = xquant::half_to_float(static_cast<std::uint16_t>(h));
    return t;
  }();
  return table.data();
}

namespace {

inline float ld_f32(const std::byte* b, std::int64_t i) noexcept {
  float v;
  std::memcpy(&v, b + i * 4, 4);
  return v;
}
inline std::uint16_t ld_u16(const std::byte* b, std::int64_t i) noexcept {
  std::uint16_t v;
  std::memcpy(&v, b + i * 2, 2);
  return v;
}
inline float bf16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

}  // namespace

float load_element(const std::byte* base, StDType dt, std::int64_t i) noexcept {
  switch (dt) {
    case StDType::F16:
      return half_table()[ld_u16(base, i)];
    case StDType::BF16:
      return bf16_to_f32(ld_u16(base, i));
    default:
      return ld_f32(base, i);
  }
}

// The loops below are plain scalar code (the library's kernels do the quantization itself). They keep
// kLanes independent accumulators in a fixed layout (lane = offset in the run mod kLanes), so the sums
// do not depend on the compiler, the machine or the thread count.
namespace {

constexpr int kLanes = 16;

// `ht` is half_table(), fetched once per piece (a function-local static costs a guard check per call).
template <StDType DT>
inline float ld(const std::byte* b, std::int64_t i, const float* ht) noexcept {
  if constexpr (DT == StDType::F32)
    return ld_f32(b, i);
  else if constexpr (DT == StDType::BF16)
    return bf16_to_f32(ld_u16(b, i));
  else
    return ht[ld_u16(b, i)];
}

// min / max / non-finite count of x[first, first + n) (one channel), or, with PER_ELEM, x[first + k]
// updates lo[k] / hi[k] (channels along the last axis). min and max are exact: the lanes only help the
// compiler.
template <StDType DT, bool PER_ELEM>
inline void minmax_run(const std::byte* x, std::int64_t first, std::int64_t n, float* lo, float* hi,
                       std::int64_t& nonfinite, const float* ht) noexcept {
  const float inf = std::numeric_limits<float>::infinity();
  if constexpr (PER_ELEM) {
    std::int64_t bad = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const float v = ld<DT>(x, first + k, ht);
      const bool ok = std::fabs(v) <= FLT_MAX;
      lo[k] = ok && v < lo[k] ? v : lo[k];
      hi[k] = ok && v > hi[k] ? v : hi[k];
      bad += ok ? 0 : 1;
    }
    nonfinite += bad;
  } else {
    float l[kLanes], h[kLanes];
    std::int64_t b[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      l[j] = inf;
      h[j] = -inf;
      b[j] = 0;
    }
    std::int64_t k = 0;
    for (; k + kLanes <= n; k += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        const float v = ld<DT>(x, first + k + j, ht);
        const bool ok = std::fabs(v) <= FLT_MAX;  // false for NaN and +-Inf
        l[j] = ok && v < l[j] ? v : l[j];
        h[j] = ok && v > h[j] ? v : h[j];
        b[j] += ok ? 0 : 1;
      }
    for (; k < n; ++k) {
      const int j = static_cast<int>(k % kLanes);
      const float v = ld<DT>(x, first + k, ht);
      const bool ok = std::fabs(v) <= FLT_MAX;
      l[j] = ok && v < l[j] ? v : l[j];
      h[j] = ok && v > h[j] ? v : h[j];
      b[j] += ok ? 0 : 1;
    }
    for (int j = 0; j < kLanes; ++j) {
      lo[0] = std::min(lo[0], l[j]);
      hi[0] = std::max(hi[0], h[j]);
      nonfinite += b[j];
    }
  }
}

template <StDType DT>
void minmax_piece(const std::byte* base, const Piece& p, float* lo, float* hi, std::int64_t& nonfinite) noexcept {
  const NormalForm nf = normal_form(p.shape, p.ch_dim);
  const float* ht = DT == StDType::F16 ? half_table() : nullptr;
  std::int64_t i = 0;
  for (std::int64_t o = 0; o < nf.outer; ++o) {
    if (nf.inner == 1) {  // a row of channels
      minmax_run<DT, true>(base, i, nf.channels, lo + p.ch_begin, hi + p.ch_begin, nonfinite, ht);
      i += nf.channels;
      continue;
    }
    for (std::int64_t c = 0; c < nf.channels; ++c, i += nf.inner)
      minmax_run<DT, false>(base, i, nf.inner, lo + p.ch_begin + c, hi + p.ch_begin + c, nonfinite, ht);
  }
}

// Per-lane double sums of x^2 and (x - x')^2 and the largest |x - x'| of a run. A non-finite input adds
// +0 (which leaves a lane as it is) and is counted. Written branch-free over kLanes-wide blocks so that
// the compiler can vectorize it; the lane layout, not the instructions, fixes the result.
struct Lanes {
  double sig[kLanes] = {}, noi[kLanes] = {}, mx[kLanes] = {};
  std::int64_t bad = 0;

  void add(int j, float x, float xr) noexcept {
    const bool ok = std::fabs(x) <= FLT_MAX;
    const double xd = ok ? static_cast<double>(x) : 0.0;
    const double e = xd - (ok ? static_cast<double>(xr) : 0.0);
    const double ae = std::fabs(e);
    sig[j] += xd * xd;
    noi[j] += e * e;
    mx[j] = mx[j] < ae ? ae : mx[j];
    bad += ok ? 0 : 1;
  }

  void into(ErrorStats& e) const noexcept {
    double s = 0.0, n = 0.0, m = 0.0;
    for (int j = 0; j < kLanes; ++j) {
      s += sig[j];
      n += noi[j];
      m = std::max(m, mx[j]);
    }
    e.signal += s;
    e.noise += n;
    e.max_abs = std::max(e.max_abs, m);
    e.nonfinite += bad;
  }
};

// Round-trip error of x[first, first + n) against the stored values, with one (scale, zero point) or,
// with PER_ELEM, scale[k] / zero_point[k] for element k.
template <StDType DT, int BITS, bool PER_ELEM>
inline void error_run(const std::byte* x, const void* q, std::int64_t first, std::int64_t n, const float* scale,
                      const float* zero_point, ErrorStats& out, const float* ht) noexcept {
  Lanes a;
  std::int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    float xv[kLanes], xr[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      const float s = PER_ELEM ? scale[k + j] : scale[0];
      const float z = PER_ELEM ? zero_point[k + j] : zero_point[0];
      xv[j] = ld<DT>(x, first + k + j, ht);
      xr[j] = dequantize_value(stored_value(q, BITS, first + k + j), s, z);
    }
    for (int j = 0; j < kLanes; ++j) a.add(j, xv[j], xr[j]);
  }
  for (; k < n; ++k) {
    const float s = PER_ELEM ? scale[k] : scale[0];
    const float z = PER_ELEM ? zero_point[k] : zero_point[0];
    a.add(static_cast<int>(k % kLanes), ld<DT>(x, first + k, ht),
          dequantize_value(stored_value(q, BITS, first + k), s, z));
  }
  a.into(out);
}

template <StDType DT, int BITS>
ErrorStats error_piece(const std::byte* base, const Piece& p, const void* q, const float* scale,
                       const float* zero_point) noexcept {
  const NormalForm nf = normal_form(p.shape, p.ch_dim);
  const float* ht = DT == StDType::F16 ? half_table() : nullptr;
  ErrorStats e;
  std::int64_t i = 0;
  for (std::int64_t o = 0; o < nf.outer; ++o) {
    if (nf.inner == 1) {
      error_run<DT, BITS, true>(base, q, i, nf.channels, scale + p.ch_begin, zero_point + p.ch_begin, e, ht);
      i += nf.channels;
      continue;
    }
    for (std::int64_t c = 0; c < nf.channels; ++c, i += nf.inner)
      error_run<DT, BITS, false>(base, q, i, nf.inner, scale + p.ch_begin + c, zero_point + p.ch_begin + c, e, ht);
  }
  return e;
}

void minmax_f32(const std::byte* b, const Piece& p, float* lo, float* hi, std::int64_t& n) noexcept {
  minmax_piece<StDType::F32>(b, p, lo, hi, n);
}
void minmax_bf16(const std::byte* b, const Piece& p, float* lo, float* hi, std::int64_t& n) noexcept {
  minmax_piece<StDType::BF16>(b, p, lo, hi, n);
}
void minmax_f16(const std::byte* b, const Piece& p, float* lo, float* hi, std::int64_t& n) noexcept {
  minmax_piece<StDType::F16>(b, p, lo, hi, n);
}

#define XQCLI_ERROR_FN(NAME, DT, BITS)                                                                          \
  ErrorStats NAME(const std::byte* b, const Piece& p, const void* q, const float* s, const float* z) noexcept { \
    return error_piece<DT, BITS>(b, p, q, s, z);                                                                \
  }
XQCLI_ERROR_FN(error_f32_8, StDType::F32, 8)
XQCLI_ERROR_FN(error_f32_4, StDType::F32, 4)
XQCLI_ERROR_FN(error_bf16_8, StDType::BF16, 8)
XQCLI_ERROR_FN(error_bf16_4, StDType::BF16, 4)
XQCLI_ERROR_FN(error_f16_8, StDType::F16, 8)
XQCLI_ERROR_FN(error_f16_4, StDType::F16, 4)
#undef XQCLI_ERROR_FN

}  // namespace

void piece_minmax(const std::byte* tensor, StDType dt, const Piece& p, float* lo, float* hi,
                  std::int64_t& nonfinite) noexcept {
  const std::byte* base = tensor + p.begin * static_cast<std::int64_t>(st_dtype_size(dt));
  switch (dt) {
    case StDType::BF16:
      minmax_bf16(base, p, lo, hi, nonfinite);
      return;
    case StDType::F16:
      minmax_f16(base, p, lo, hi, nonfinite);
      return;
    default:
      minmax_f32(base, p, lo, hi, nonfinite);
      return;
  }
}

void ErrorStats::merge(const ErrorStats& o) noexcept {
  signal += o.signal;
  noise += o.noise;
  max_abs = std::max(max_abs, o.max_abs);
  nonfinite += o.nonfinite;
}

double ErrorStats::sqnr_db() const noexcept {
  if (noise == 0.0 && std::isfinite(signal)) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal / noise);
}

const char* ErrorStats::round_trip() const noexcept {
  if (!std::isfinite(signal) || !std::isfinite(noise) || !std::isfinite(max_abs)) return "non-finite";
  return noise == 0.0 ? "exact" : "lossy";
}

std::string ErrorStats::sqnr_text() const {
  const std::string rt = round_trip();
  if (rt == "exact") return "exact";
  const double sq = sqnr_db();
  if (rt == "non-finite" || !std::isfinite(sq)) return "not finite";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f dB", sq);
  return buf;
}

ErrorStats piece_error(const std::byte* tensor, StDType dt, const Piece& p, const void* q, int bits, const float* scale,
                       const float* zero_point) noexcept {
  const std::byte* base = tensor + p.begin * static_cast<std::int64_t>(st_dtype_size(dt));
  const bool four = bits == 4;
  switch (dt) {
    case StDType::BF16:
      return four ? error_bf16_4(base, p, q, scale, zero_point) : error_bf16_8(base, p, q, scale, zero_point);
    case StDType::F16:
      return four ? error_f16_4(base, p, q, scale, zero_point) : error_f16_8(base, p, q, scale, zero_point);
    default:
      return four ? error_f32_4(base, p, q, scale, zero_point) : error_f32_8(base, p, q, scale, zero_point);
  }
}

void dequantize_range(const void* q, int bits, const NormalForm& nf, const float* scale, const float* zero_point,
                      std::int64_t begin, std::int64_t end, StDType out_dt, std::byte* out) {
  // The library's anti_quant: out = narrow((q + offset) * scale) with offset = -zero_point, which is
  // (q - zero_point) * scale exactly (a - b and a + (-b) are the same IEEE operation), one (scale,
  // offset) per element of the run, from its channel.
  const std::int64_t n = end - begin;
  if (n <= 0) return;
  static thread_local std::vector<float> sv, ov;
  static thread_local std::vector<std::byte> staging;
  sv.resize(static_cast<std::size_t>(n));
  ov.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = begin; i < end;) {
    const std::int64_t c = (i / nf.inner) % nf.channels;
    const std::int64_t run_end = std::min(end, (i / nf.inner + 1) * nf.inner);  // a run of one channel
    std::fill(sv.begin() + (i - begin), sv.begin() + (run_end - begin), scale[c]);
    std::fill(ov.begin() + (i - begin), ov.begin() + (run_end - begin), -zero_point[c]);
    i = run_end;
  }
  const std::byte* src = static_cast<const std::byte*>(q) + (bits == 4 ? begin / 2 : begin);
  if (bits == 4 && reinterpret_cast<std::uintptr_t>(src) % 4 != 0) {  // typed int32 reads: an aligned copy
    staging.resize(static_cast<std::size_t>(n / 2));
    std::memcpy(staging.data(), src, staging.size());
    src = staging.data();
  }
  const xquant::DType odt = out_dt == StDType::F16    ? xquant::DType::float16
                            : out_dt == StDType::BF16 ? xquant::DType::bfloat16
                                                      : xquant::DType::float32;
  const xquant::ConstTensorView xv = bits == 4 ? xquant::ConstTensorView(src, xquant::DType::int32, {n / 8})
                                               : xquant::ConstTensorView(src, xquant::DType::int8, {n});
  xquant::anti_quant_out(xquant::TensorView(out, odt, {n}), xv,
                         xquant::ConstTensorView(sv.data(), xquant::DType::float32, {n}),
                         xquant::ConstTensorView(ov.data(), xquant::DType::float32, {n}),
                         bits == 4 ? xquant::QuantDType::quint4x2 : xquant::QuantDType::qint8);
}

}  // namespace xqcli
