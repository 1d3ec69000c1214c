// cpu backend: the quantized matmuls (docs/semantics.md section 9), bit-identical to src/ref/matmul.cpp.
//
// quant_matmul: the integer product is exact modulo 2^32 and addition modulo 2^32 is associative, so any
// blocking gives the reference's bits. Both operands are brought to int8 rows along K once per call
// (x1 as given, or unpacked from int4; x2 used as stored when transposed int8, else transposed / unpacked
// into [N][K]); a tile of 2 rows x 4 columns then takes its dot products with int16 multiply-adds
// (pmaddwd: ReorderWidenMulAccumulate), and each element's epilogue is params/matmul.hpp's scalar
// quant_matmul_finish, the reference's own code. Tiles of 64 x 64 outputs are spread over threads.
// (The x86 vector adds wrap modulo 2^32; Highway's scalar fallback target adds in C++ int, which can only
// overflow beyond K = 131071 with extreme values, far above the NPU's K limit of 65535.)
//
// weight_quant_batchmatmul: the float32 sum runs over k in increasing order per output element, as in
// the reference; vectors run across n (lane j holds column n + j), so each lane performs exactly the
// reference's sequence of rounded multiplies and adds (no FMA). The weight is dequantized panel by panel
// (64 columns x K, per thread) with the reference's formula in vector form (the 16-bit roundings are the
// bit-pattern conversions of simd-inl.h, identical to core/convert.hpp); x is widened to float32 once.
// Panels are spread over threads; the result does not depend on the partition.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstring>
#include <vector>

#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

namespace xquant::detail {
#ifndef XQUANT_CPU_MATMUL_ONCE
#define XQUANT_CPU_MATMUL_ONCE
struct QmmJob {
  const QuantMatmulArgs* args;
  const std::int8_t* x1;   // logical elements, x1_offsets apply
  const std::int8_t* x2t;  // [.. N][K] per matrix, x2_offsets apply
};
struct WqmJob {
  const WeightQuantMatmulArgs* args;
  const float* x;  // [M][K] widened
};
inline constexpr std::int64_t kQmmTile = 64;
inline constexpr std::int64_t kPanel = 64;  // columns per weight panel (a multiple of two vectors up to 1024 bits)
// Floats per panel row allocated: kPanel, or on Arm two of the widest SVE vectors (2048 bits).
inline constexpr std::int64_t kPanelAlloc = HWY_ARCH_ARM_A64 ? 128 : kPanel;
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// A panel row's buffers: kPanel columns rounded up to two vectors (more than kPanel only for SVE vectors
// wider than 1024 bits).
inline constexpr std::int64_t kPanelBuf = kPanel > 2 * static_cast<std::int64_t>(kMaxLanes)
                                              ? kPanel
                                              : 2 * static_cast<std::int64_t>(kMaxLanes);
static_assert(kPanelBuf <= kPanelAlloc, "the panel allocation is too narrow for this target");

using D16 = hn::ScalableTag<std::int16_t>;
using D8h = hn::Rebind<std::int8_t, D16>;
using D32 = hn::Repartition<std::int32_t, D16>;

// Output tile [m0, m1) x [n0, n1) of batch b.
void QmmTile(const QmmJob& j, std::int64_t b, std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
  const QuantMatmulArgs& a = *j.args;
  const D16 d16;
  const D8h d8;
  const D32 d32;
  const std::int64_t K = a.K, N = a.N, M = a.M;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d16));
  const std::int8_t* X1 = j.x1 + a.x1_offsets[b];
  const std::int8_t* X2 = j.x2t + a.x2_offsets[b];
  for (std::int64_t m = m0; m < m1; m += 2) {
    const std::int8_t* r[2] = {X1 + m * K, X1 + std::min(m + 1, m1 - 1) * K};  // a missing row repeats the last
    for (std::int64_t n = n0; n < n1; n += 4) {
      const std::int8_t* c[4];
      for (int t = 0; t < 4; ++t) c[t] = X2 + std::min(n + t, n1 - 1) * K;
      std::int64_t k = 0;
#if XQUANT_SIZELESS_VECTORS
      // SVE: vectors cannot form arrays; the tile's columns one after another (sums modulo 2^32: the
      // same values in any order).
      std::int32_t sum[2][4];
      for (int t = 0; t < 4; ++t) {
        auto acc0 = hn::Zero(d32), acc1 = hn::Zero(d32), ext0 = hn::Zero(d32), ext1 = hn::Zero(d32);
        for (k = 0; k + L <= K; k += L) {
          const auto a0 = hn::PromoteTo(d16, hn::LoadU(d8, r[0] + k));
          const auto a1 = hn::PromoteTo(d16, hn::LoadU(d8, r[1] + k));
          const auto bv = hn::PromoteTo(d16, hn::LoadU(d8, c[t] + k));
          acc0 = hn::ReorderWidenMulAccumulate(d32, a0, bv, acc0, ext0);
          acc1 = hn::ReorderWidenMulAccumulate(d32, a1, bv, acc1, ext1);
        }
        sum[0][t] = hn::GetLane(hn::SumOfLanes(d32, hn::RearrangeToOddPlusEven(acc0, ext0)));
        sum[1][t] = hn::GetLane(hn::SumOfLanes(d32, hn::RearrangeToOddPlusEven(acc1, ext1)));
      }
#else
      hn::Vec<D32> acc[2][4], extra[2][4];
      for (int u = 0; u < 2; ++u)
        for (int t = 0; t < 4; ++t) acc[u][t] = extra[u][t] = hn::Zero(d32);
      for (; k + L <= K; k += L) {
        const auto a0 = hn::PromoteTo(d16, hn::LoadU(d8, r[0] + k));
        const auto a1 = hn::PromoteTo(d16, hn::LoadU(d8, r[1] + k));
        for (int t = 0; t < 4; ++t) {
          const auto bv = hn::PromoteTo(d16, hn::LoadU(d8, c[t] + k));
          acc[0][t] = hn::ReorderWidenMulAccumulate(d32, a0, bv, acc[0][t], extra[0][t]);
          acc[1][t] = hn::ReorderWidenMulAccumulate(d32, a1, bv, acc[1][t], extra[1][t]);
        }
      }
#endif
      for (int u = 0; u < 2; ++u) {
        const std::int64_t mm = m + u;
        if (mm >= m1) break;
        for (int t = 0; t < 4; ++t) {
          const std::int64_t nn = n + t;
          if (nn >= n1) break;
#if XQUANT_SIZELESS_VECTORS
          std::int32_t s = sum[u][t];
#else
          std::int32_t s = hn::GetLane(hn::SumOfLanes(d32, hn::RearrangeToOddPlusEven(acc[u][t], extra[u][t])));
#endif
          for (std::int64_t kk = k; kk < K; ++kk) s = wrap_add(s, wrap_mul(r[u][kk], c[t][kk]));  // the tail
          quant_matmul_finish(a.epilogue, a.out, (b * M + mm) * N + nn, b, mm, nn, s);
        }
      }
    }
  }
}

// Rows [0, K) of the dequantized panel of columns [n0, n0 + np): panel[k][0, width), zero beyond np.
template <DType DT>
void WqmPanelT(const WeightQuantMatmulArgs& a, std::int64_t n0, std::int64_t np, std::int64_t width, float* panel) {
  const DF df;
  const DI di;
  const std::int64_t K = a.K, N = a.N;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  HWY_ALIGN std::int8_t q[kPanelBuf];
  HWY_ALIGN float s[kPanelBuf], o[kPanelBuf];
  std::int64_t g_loaded = -1;
  auto round16 = [](VF v) -> VF {
    if constexpr (DT == DType::float16) {
      return HalfBitsToFloat(FloatToHalfBits(v));
    } else {
      return hn::BitCast(DF(), hn::ShiftLeft<16>(FloatToBf16Bits(v)));
    }
  };
  const auto* w8 = static_cast<const std::int8_t*>(a.weight);
  const auto* w4 = static_cast<const std::int32_t*>(a.weight);
  for (std::int64_t k = 0; k < K; ++k) {
    const std::int64_t g = k / a.group_size;
    if (g != g_loaded) {  // parameters of group g, zero-padded to the panel width
      for (std::int64_t t = 0; t < width; ++t) {
        s[t] = t < np ? a.scale[g * N + n0 + t] : 0.0f;
        o[t] = t < np && a.offset != nullptr ? a.offset[g * N + n0 + t] : 0.0f;
      }
      g_loaded = g;
    }
    // q[t] = weight element (k, n0 + t)
    if (!a.transpose_weight) {
      if (a.int4)
        unpack_int4_bytes(w4, k * N + n0, np, q);
      else
        std::memcpy(q, w8 + k * N + n0, static_cast<std::size_t>(np));
    } else if (a.int4) {
      for (std::int64_t t = 0; t < np; ++t) q[t] = static_cast<std::int8_t>(load_int4(w4, (n0 + t) * K + k));
    } else {
      for (std::int64_t t = 0; t < np; ++t) q[t] = w8[(n0 + t) * K + k];
    }
    for (std::int64_t t = np; t < width; ++t) q[t] = 0;
    for (std::int64_t t = 0; t < width; t += L) {
      VF v = hn::ConvertTo(df, hn::PromoteTo(di, hn::Load(DI8(), q + t)));
      if (a.offset != nullptr) v = round16(hn::Add(v, hn::Load(df, o + t)));            // narrow_x(q + offset)
      hn::StoreU(round16(hn::Mul(v, hn::Load(df, s + t))), df, panel + k * width + t);  // narrow_x(. * scale)
    }
  }
}

// Columns [n0, n0 + np) of every row: acc = acc + x * w over k ascending, 4 rows x 2 vectors at a time.
void WqmPanel(const WqmJob& j, std::int64_t n0, std::int64_t np, float* panel) {
  const WeightQuantMatmulArgs& a = *j.args;
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t width = (np + 2 * L - 1) / (2 * L) * (2 * L);
  if (a.dt == DType::float16)
    WqmPanelT<DType::float16>(a, n0, np, width, panel);
  else
    WqmPanelT<DType::bfloat16>(a, n0, np, width, panel);
  const std::int64_t M = a.M, K = a.K, N = a.N;
  HWY_ALIGN float res[4 * kPanelBuf];
  for (std::int64_t m = 0; m < M; m += 4) {
    const float* xr[4];
    for (int u = 0; u < 4; ++u) xr[u] = j.x + std::min(m + u, M - 1) * K;  // a missing row repeats the last
    for (std::int64_t c = 0; c < width; c += 2 * L) {
#if XQUANT_SIZELESS_VECTORS
      // SVE: vectors cannot form arrays; the same 4 x 2 accumulators by name.
      VF a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);  // +0
      VF a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
      const float* wp = panel + c;
      for (std::int64_t k = 0; k < K; ++k, wp += width) {
        const VF w0 = hn::LoadU(df, wp), w1 = hn::LoadU(df, wp + L);
        const VF x0 = hn::Set(df, xr[0][k]), x1 = hn::Set(df, xr[1][k]);
        const VF x2 = hn::Set(df, xr[2][k]), x3 = hn::Set(df, xr[3][k]);
        a00 = hn::Add(a00, hn::Mul(x0, w0));  // the product rounded, then the sum
        a01 = hn::Add(a01, hn::Mul(x0, w1));
        a10 = hn::Add(a10, hn::Mul(x1, w0));
        a11 = hn::Add(a11, hn::Mul(x1, w1));
        a20 = hn::Add(a20, hn::Mul(x2, w0));
        a21 = hn::Add(a21, hn::Mul(x2, w1));
        a30 = hn::Add(a30, hn::Mul(x3, w0));
        a31 = hn::Add(a31, hn::Mul(x3, w1));
      }
      hn::Store(a00, df, res + 0 * kPanelBuf + c);
      hn::Store(a01, df, res + 0 * kPanelBuf + c + L);
      hn::Store(a10, df, res + 1 * kPanelBuf + c);
      hn::Store(a11, df, res + 1 * kPanelBuf + c + L);
      hn::Store(a20, df, res + 2 * kPanelBuf + c);
      hn::Store(a21, df, res + 2 * kPanelBuf + c + L);
      hn::Store(a30, df, res + 3 * kPanelBuf + c);
      hn::Store(a31, df, res + 3 * kPanelBuf + c + L);
#else
      VF acc[4][2];
      for (int u = 0; u < 4; ++u) acc[u][0] = acc[u][1] = hn::Zero(df);  // +0
      const float* wp = panel + c;
      for (std::int64_t k = 0; k < K; ++k, wp += width) {
        const VF w0 = hn::LoadU(df, wp), w1 = hn::LoadU(df, wp + L);
        for (int u = 0; u < 4; ++u) {
          const VF xv = hn::Set(df, xr[u][k]);
          acc[u][0] = hn::Add(acc[u][0], hn::Mul(xv, w0));  // the product rounded, then the sum
          acc[u][1] = hn::Add(acc[u][1], hn::Mul(xv, w1));
        }
      }
      for (int u = 0; u < 4; ++u) {
        hn::Store(acc[u][0], df, res + u * kPanelBuf + c);
        hn::Store(acc[u][1], df, res + u * kPanelBuf + c + L);
      }
#endif
    }
    for (int u = 0; u < 4 && m + u < M; ++u)
      for (std::int64_t t = 0; t < np; ++t)
        weight_matmul_finish(a.dt, a.out, (m + u) * N + n0 + t, res[u * kPanelBuf + t], a.bias, n0 + t);
  }
}

// x (float16 / bfloat16) widened to float32, elements [b0, b1).
void WidenX(const WeightQuantMatmulArgs& a, float* x, std::int64_t b0, std::int64_t b1) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = b0;
  if (a.dt == DType::float16) {
    for (; i + L <= b1; i += L) hn::StoreU(LoadF<DType::float16>(a.x, i), df, x + i);
  } else {
    for (; i + L <= b1; i += L) hn::StoreU(LoadF<DType::bfloat16>(a.x, i), df, x + i);
  }
  for (; i < b1; ++i) x[i] = load_float(a.dt, a.x, i);
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(QmmTile);
HWY_EXPORT(WqmPanel);
HWY_EXPORT(WidenX);

namespace {
// Logical int8 values of `count` elements of int8 or packed int4 storage.
void to_int8(bool int4, const void* src, std::int64_t count, std::int8_t* dst) {
  if (int4)
    unpack_int4_bytes(static_cast<const std::int32_t*>(src), 0, count, dst);
  else
    std::memcpy(dst, src, static_cast<std::size_t>(count));
}
}  // namespace

void cpu_quant_matmul(const QuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  if (a.batch * M * N == 0) return;
  const std::int64_t n1 = *std::max_element(a.x1_offsets, a.x1_offsets + a.batch) + M * K;
  const std::int64_t n2 = *std::max_element(a.x2_offsets, a.x2_offsets + a.batch) + K * N;
  // x1 as int8 rows
  std::vector<std::int8_t> x1buf;
  const std::int8_t* x1 = static_cast<const std::int8_t*>(a.x1);
  if (a.int4) {
    x1buf.resize(static_cast<std::size_t>(n1));
    to_int8(true, a.x1, n1, x1buf.data());
    x1 = x1buf.data();
  }
  // x2 as [N][K] int8 rows per matrix
  std::vector<std::int8_t> x2buf;
  const std::int8_t* x2t = static_cast<const std::int8_t*>(a.x2);
  if (a.int4 || !a.transpose_x2) {
    x2buf.resize(static_cast<std::size_t>(n2));
    if (a.transpose_x2) {
      to_int8(true, a.x2, n2, x2buf.data());
    } else {
      std::vector<std::int8_t> row(static_cast<std::size_t>(a.int4 ? N : 0));
      for (std::int64_t base = 0; base < n2; base += K * N)  // each stored matrix [K][N] -> [N][K]
        for (std::int64_t k = 0; k < K; ++k) {
          const std::int8_t* src;
          if (a.int4) {
            unpack_int4_bytes(static_cast<const std::int32_t*>(a.x2), base + k * N, N, row.data());
            src = row.data();
          } else {
            src = static_cast<const std::int8_t*>(a.x2) + base + k * N;
          }
          for (std::int64_t n = 0; n < N; ++n) x2buf[static_cast<std::size_t>(base + n * K + k)] = src[n];
        }
    }
    x2t = x2buf.data();
  }
  const QmmJob j{&a, x1, x2t};
  const std::int64_t mt = (M + kQmmTile - 1) / kQmmTile, nt = (N + kQmmTile - 1) / kQmmTile;
  const std::int64_t tiles = a.batch * mt * nt;
  parallel_ranges(tiles, 1, a.batch * M * N * std::max<std::int64_t>(K, 1), [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / (mt * nt), r = t % (mt * nt);
      const std::int64_t m0 = (r / nt) * kQmmTile, n0 = (r % nt) * kQmmTile;
      HWY_DYNAMIC_DISPATCH(QmmTile)(j, b, m0, std::min(M, m0 + kQmmTile), n0, std::min(N, n0 + kQmmTile));
    }
  });
}

void cpu_weight_quant_matmul(const WeightQuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  if (M * N == 0) return;
  std::vector<float> x(static_cast<std::size_t>(M * K));
  parallel_ranges(M * K, std::int64_t{1} << 16, M * K * 6, [&](std::int64_t b0, std::int64_t b1) {
    HWY_DYNAMIC_DISPATCH(WidenX)(a, x.data(), b0, b1);
  });
  const WqmJob j{&a, x.data()};
  const std::int64_t panels = (N + kPanel - 1) / kPanel;
  parallel_ranges(panels, 1, M * N * std::max<std::int64_t>(K, 1), [&](std::int64_t p0, std::int64_t p1) {
    std::vector<float> panel(static_cast<std::size_t>(std::max<std::int64_t>(K, 1) * kPanelAlloc));
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t n0 = p * kPanel;
      HWY_DYNAMIC_DISPATCH(WqmPanel)(j, n0, std::min(kPanel, N - n0), panel.data());
    }
  });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
