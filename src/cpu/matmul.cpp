// cpu backend: the quantized matmuls (docs/semantics.md section 9), bit-identical to src/ref/matmul.cpp.
//
// quant_matmul: the integer product is exact modulo 2^32 and addition modulo 2^32 is associative, so any
// blocking gives the reference's bits. Two kernels, both on int16 multiply-adds (pmaddwd on x86:
// Highway's ReorderWidenMulAccumulate; each pair product is at most 2 * 128 * 128, exact in int32):
//  - GEMM (the general path, prefill): x1 is widened to int16 rows once; x2 is packed once per call into
//    panels of kQmmNR = 2 vectors of columns, each k pair (2p, 2p + 1) of a column one int32 word of two
//    int16 (the pmaddwd operand order), so a register block of kMR rows x 2 vectors takes per k pair
//    one broadcast of x1's word per row and two loads of the panel. Tiles of kQmmMC x kQmmNC outputs are
//    spread over threads; each accumulates over K in chunks of kQmmKC pairs (panel chunks stay in L1)
//    into an int32 tile, then runs the epilogue.
//  - dot (decode: few rows and x2 stored [N, K], as vllm-ascend passes the weight): each output is a dot
//    product along K of two contiguous int8 rows; 2 rows x 4 columns per register block, so x2 (the
//    weight, the bulk of the traffic) streams through once per 2 rows.
// The epilogue is params/matmul.hpp's quant_matmul_finish, the reference's own code (dot kernel), or the
// same operations in the same order in vector form (GEMM kernel). (The x86 vector adds wrap modulo 2^32; Highway's
// scalar fallback target adds in C++ int, which can only overflow beyond K = 131071 with extreme values, far above the
// NPU's K limit of 65535.)
//
// weight_quant_batchmatmul: the float32 sum runs over k in increasing order per output element, as in
// the reference; vectors run across n (lane j holds column n + j), so each lane performs exactly the
// reference's sequence of rounded multiplies and adds (no FMA). Partial sums wait in a float32 tile
// between chunks of k (storing and reloading a float is exact), so blocking over k keeps the order. The
// weight is dequantized with the reference's formula in vector form into panels of kWqmNR = 2 vectors of
// columns ([k][kWqmNR] floats); the 16-bit roundings are F16C's conversions on x86 AVX2 / AVX-512 (IEEE
// round to nearest even, as core/convert.hpp) and simd-inl.h's bit-pattern roundings elsewhere. A
// register block of kMR rows x 2 vectors multiplies a broadcast x[m][k] by the panel row and adds.
//  - decode (M <= kWqmDecodeMaxM): each thread takes one contiguous range of columns and walks k in
//    chunks of kWqmDecodeKC rows (stored rows are read in long runs, page after page), dequantizing a
//    chunk 128 columns at a time into an L1 buffer and running every row of x over it: the weight is
//    read once.
//  - prefill: x is widened into rows packed by register block; per block of kWqmNC columns the whole K
//    is dequantized once (threads split k), then threads take kWqmMC-row tiles, chunking k by kWqmKC so
//    a panel chunk stays in L1 and the x tile in L2.
// The result does not depend on the partition or the target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"

namespace xquant::detail {
#ifndef XQUANT_CPU_MATMUL_ONCE
#define XQUANT_CPU_MATMUL_ONCE
// quant_matmul, dot kernel
struct QmmDotJob {
  const QuantMatmulArgs* args;
  const std::int8_t* x1;   // logical elements, x1_offsets apply
  const std::int8_t* x2t;  // [.. N][K] per matrix, x2_offsets apply
};
inline constexpr std::int64_t kQmmTile = 64;
inline constexpr std::int64_t kQmmDotMaxM = 32;  // the dot kernel for M up to this (x2 stored [N, K])
// quant_matmul, GEMM kernel
inline constexpr std::int64_t kRowPad = 8;   // x1 rows are padded to a multiple of every target's kMR
inline constexpr std::int64_t kQmmMC = 96;   // rows per tile (a multiple of kRowPad)
inline constexpr std::int64_t kQmmNC = 256;  // columns per tile (a multiple of every kQmmNR)
inline constexpr std::int64_t kQmmKC = 256;  // k pairs per chunk: a panel chunk of 16 columns is 16 KiB
struct QmmGemmJob {
  const QuantMatmulArgs* args;
  std::int64_t b;           // batch
  const std::int32_t* a;    // [Mp / kMR][Kh][kMR] words: int16 pairs of x1 rows (rows beyond M zero)
  const std::int32_t* bp;   // [N / NR][Kh][NR] words: int16 pairs of x2 columns (columns beyond N zero)
  std::int64_t Kh, Mp, NR;  // k pairs, padded rows, panel width of the packing target
};
// weight_quant_batchmatmul
struct WqmJob {
  const WeightQuantMatmulArgs* args;
  const float* x;  // [M][K] widened
};
inline constexpr std::int64_t kWqmDecodeMaxM = 24;  // the decode path up to this many rows
inline constexpr std::int64_t kWqmBlock = 128;      // decode: columns per block (a multiple of every NR, SVE too)
inline constexpr std::int64_t kWqmKC = 256;         // k per chunk (prefill); decode chunks are kWqmDecodeKC
inline constexpr std::int64_t kWqmDecodeKC = 16;
inline constexpr std::int64_t kWqmNC = 128;  // prefill: columns per block
// int4 words: lane i of a vector starting at element e (e % 8 == i0) multiplies its word by
// kNibbleMul.v[i0 + i] = 2^(28 - 4 ((i0 + i) % 8)), moving its nibble to the top (a shift in every target).
struct NibbleMul {
  std::uint32_t v[64 + 8];  // up to 64 lanes (2048-bit SVE) from any start
  constexpr NibbleMul() : v{} {
    for (int i = 0; i < 64 + 8; ++i) v[i] = 1u << (28 - 4 * (i % 8));
  }
};
inline constexpr NibbleMul kNibbleMul{};
inline constexpr std::int64_t kWqmMC = 96;  // prefill: rows per tile
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

using D16 = hn::ScalableTag<std::int16_t>;
using D8h = hn::Rebind<std::int8_t, D16>;
using D32 = hn::Repartition<std::int32_t, D16>;

// Arm SVE vectors are sizeless (no arrays of them): the register-block kernels take their plain-code form.
#undef XQUANT_MM_SIZELESS
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
#define XQUANT_MM_SIZELESS 1
#else
#define XQUANT_MM_SIZELESS 0
#endif

// Rows per register block: with 2 vectors of columns, kMR rows take 2 kMR accumulators, 2 panel vectors
// and kMR broadcasts (compilers load every broadcast of a k step first): 14 of AVX2's 16 registers at 4,
// 26 of AVX-512's / NEON's 32 at 8.
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_ARCH_ARM_A64
constexpr int kMR = 8;
#else
constexpr int kMR = 4;
#endif
static_assert(kRowPad % kMR == 0 && kQmmMC % kRowPad == 0 && kWqmMC % kMR == 0);

// ---------------------------------------------------------------------------------------------------
// quant_matmul, dot kernel: output tile [m0, m1) x [n0, n1) of batch b.
void QmmTile(const QmmDotJob& j, std::int64_t b, std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
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

// ---------------------------------------------------------------------------------------------------
// quant_matmul, GEMM kernel.

// The panel width (columns) of this target's packing.
std::int64_t QmmPanelWidth() { return 2 * static_cast<std::int64_t>(hn::Lanes(D32())); }

// Packs panels [p0, p1) of one x2 matrix (logical int8; `tr`: stored [N][K], else [K][N]) into
// bp[p][kp][j] = (x2(2kp, n) & 0xFFFF) | x2(2kp + 1, n) << 16 with n = p * NR + j (zero beyond K and N).
void QmmPackB(const std::int8_t* x2, bool tr, std::int64_t K, std::int64_t N, std::int64_t p0, std::int64_t p1,
              std::int32_t* bp) {
  const std::int64_t NR = QmmPanelWidth(), Kh = (K + 1) / 2;
  auto pair = [](std::int8_t lo, std::int8_t hi) {
    return static_cast<std::int32_t>(static_cast<std::uint16_t>(static_cast<std::int16_t>(lo)) |
                                     (static_cast<std::uint32_t>(static_cast<std::uint16_t>(hi)) << 16));
  };
  for (std::int64_t p = p0; p < p1; ++p) {
    std::int32_t* dst = bp + p * Kh * NR;
    const std::int64_t n0 = p * NR, nw = std::min(NR, N - n0);
    if (tr) {
      for (std::int64_t j = 0; j < NR; ++j) {
        if (j >= nw) {
          for (std::int64_t kp = 0; kp < Kh; ++kp) dst[kp * NR + j] = 0;
          continue;
        }
        const std::int8_t* col = x2 + (n0 + j) * K;
        std::int64_t kp = 0;
        for (; 2 * kp + 1 < K; ++kp) dst[kp * NR + j] = pair(col[2 * kp], col[2 * kp + 1]);
        if (kp < Kh) dst[kp * NR + j] = pair(col[2 * kp], 0);
      }
    } else {
      for (std::int64_t kp = 0; kp < Kh; ++kp) {
        const std::int8_t* r0 = x2 + 2 * kp * N + n0;
        const std::int8_t* r1 = 2 * kp + 1 < K ? r0 + N : nullptr;
        std::int32_t* d = dst + kp * NR;
        for (std::int64_t j = 0; j < nw; ++j) d[j] = pair(r0[j], r1 != nullptr ? r1[j] : 0);
        for (std::int64_t j = nw; j < NR; ++j) d[j] = 0;
      }
    }
  }
}

// Packs rows [m0, m1) (multiples of kMR, or m1 = Mp) of one x1 matrix (logical int8 [M][K]) into
// a[m / kMR][kp][m % kMR] = (x1(m, 2kp) & 0xFFFF) | x1(m, 2kp + 1) << 16, zero beyond M and K: the
// register block's rows of one k pair side by side (rows kept apart by K would alias in the caches).
void QmmPackA(const std::int8_t* x1, std::int64_t M, std::int64_t K, std::int64_t m0, std::int64_t m1,
              std::int32_t* a) {
  const std::int64_t Kh = (K + 1) / 2;
  for (std::int64_t m = m0; m < m1; ++m) {
    std::int32_t* dst = a + (m / kMR) * Kh * kMR + m % kMR;
    if (m >= M) {
      for (std::int64_t kp = 0; kp < Kh; ++kp) dst[kp * kMR] = 0;
      continue;
    }
    const std::int8_t* row = x1 + m * K;
    for (std::int64_t kp = 0; kp < Kh; ++kp) {
      const std::int8_t hi = 2 * kp + 1 < K ? row[2 * kp + 1] : 0;
      dst[kp * kMR] = static_cast<std::int32_t>(static_cast<std::uint16_t>(static_cast<std::int16_t>(row[2 * kp])) |
                                                (static_cast<std::uint32_t>(static_cast<std::uint16_t>(hi)) << 16));
    }
  }
}

// c[r][0, NR) (+)= sum over k pairs [0, kh) of a[kp][r] . bp[kp], rows r < R (a: R words per k pair);
// c rows ldc apart.
template <int R>
HWY_INLINE void QmmMicro(const std::int32_t* a, const std::int32_t* bp, std::int64_t kh, std::int32_t* c,
                         std::int64_t ldc, bool init) {
  const D32 d32;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(d32));
#if HWY_TARGET == HWY_SCALAR || XQUANT_MM_SIZELESS
  // scalar: one lane of int16 and one of int32, no pair reinterpretation; SVE: vectors cannot form arrays.
  // The same sums in plain code.
  for (int r = 0; r < R; ++r)
    for (std::int64_t t = 0; t < 2 * L; ++t) {
      std::int32_t s = init ? 0 : c[r * ldc + t];
      for (std::int64_t kp = 0; kp < kh; ++kp) {
        const std::int32_t w = a[kp * R + r], v = bp[kp * 2 * L + t];
        const auto lo = [](std::int32_t x) { return static_cast<std::int32_t>(static_cast<std::int16_t>(x & 0xFFFF)); };
        s = wrap_add(s, wrap_add(wrap_mul(lo(w), lo(v)), wrap_mul(w >> 16, v >> 16)));
      }
      c[r * ldc + t] = s;
    }
#else
  const D16 d16;
  // The accumulators start at zero and c is added after RearrangeToOddPlusEven: that step is a lane-wise
  // sum on x86 but a pairwise one on NEON (ReorderWidenMulAccumulate keeps products of the low and high
  // halves apart there), so partial sums loaded into an accumulator would be mixed across columns.
  hn::Vec<D32> acc[R][2], extra[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = extra[r][0] = extra[r][1] = hn::Zero(d32);
  const auto zero = hn::Zero(d32);
  for (std::int64_t kp = 0; kp < kh; ++kp) {
    const auto b0 = hn::BitCast(d16, hn::Load(d32, bp + kp * 2 * L));
    const auto b1 = hn::BitCast(d16, hn::Load(d32, bp + kp * 2 * L + L));
    for (int r = 0; r < R; ++r) {
      const auto av = hn::BitCast(d16, hn::Set(d32, a[kp * R + r]));
      // the sum written as acc + product: GCC then adds in place instead of copying every accumulator
      acc[r][0] = hn::Add(acc[r][0], hn::ReorderWidenMulAccumulate(d32, av, b0, zero, extra[r][0]));
      acc[r][1] = hn::Add(acc[r][1], hn::ReorderWidenMulAccumulate(d32, av, b1, zero, extra[r][1]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      std::int32_t* dst = c + r * ldc + h * L;
      const auto sum = hn::RearrangeToOddPlusEven(acc[r][h], extra[r][h]);
      hn::StoreU(init ? sum : hn::Add(hn::LoadU(d32, dst), sum), d32, dst);  // int32 sums wrap, as the reference's
    }
#endif
}

// The epilogue of outputs (b, m, n0 + t), t < count, stored from out index i0, from the accumulators
// acc[t]: params/matmul.hpp's quant_matmul_finish in vector form (the same operations in the same order;
// float(int32) rounds to nearest even, no FMA), the scalar function itself for the tail.
void QmmFinishRow(const QuantMatmulEpilogue& e, void* out, std::int64_t i0, std::int64_t b, std::int64_t m,
                  std::int64_t n0, std::int64_t count, const std::int32_t* acc) {
  const DF df;
  const DI di;
  const DU du;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t brow = b * e.bias_stride + n0;
  const VF qnan = hn::BitCast(df, hn::Set(du, 0x7FC00000u));
  const VF lo = hn::Set(df, -128.0f), hi = hn::Set(df, 127.0f);
  std::int64_t t = 0;
  for (; t + L <= count; t += L) {
    VI a = hn::LoadU(di, acc + t);
    if (e.bias_int != nullptr)  // modulo 2^32
      a = hn::BitCast(di, hn::Add(hn::BitCast(du, a), hn::BitCast(du, hn::LoadU(di, e.bias_int + brow + t))));
    if (e.out_dt == DType::int32) {
      hn::StoreU(a, di, static_cast<std::int32_t*>(out) + i0 + t);
      continue;
    }
    VF v = hn::Mul(hn::ConvertTo(df, a), hn::LoadU(df, e.scale + n0 + t));
    if (e.pertoken != nullptr) v = hn::Mul(v, hn::Set(df, e.pertoken[m]));
    if (e.bias_float != nullptr) v = hn::Add(v, hn::LoadU(df, e.bias_float + brow + t));
    if (e.offset != nullptr) v = hn::Add(v, hn::LoadU(df, e.offset + n0 + t));
    if (e.out_dt == DType::int8) {
      StoreI8(RoundSaturateToI32Range(v, lo, hi), static_cast<std::int8_t*>(out) + i0 + t);
    } else {
      v = hn::IfThenElse(hn::IsNaN(v), qnan, v);
      if (e.out_dt == DType::float16)
        StoreF<DType::float16>(v, out, i0 + t);
      else
        StoreF<DType::bfloat16>(v, out, i0 + t);
    }
  }
  for (; t < count; ++t) quant_matmul_finish(e, out, i0 + t, b, m, n0 + t, acc[t]);
}

// Output tile [m0, m0 + kQmmMC) x [n0, n0 + kQmmNC) (clipped to M, N) of batch j.b.
void QmmGemmTile(const QmmGemmJob& j, std::int64_t m0, std::int64_t n0, std::int32_t* c /* kQmmMC x kQmmNC */) {
  const QuantMatmulArgs& a = *j.args;
  const std::int64_t NR = QmmPanelWidth(), Kh = j.Kh, M = a.M, N = a.N;
  const std::int64_t mw = std::min(kQmmMC, M - m0), nw = std::min(kQmmNC, N - n0);
  const std::int64_t mr_blocks = (mw + kMR - 1) / kMR, panels = (nw + NR - 1) / NR;
  for (std::int64_t k0 = 0; k0 < Kh; k0 += kQmmKC) {
    const std::int64_t kh = std::min(kQmmKC, Kh - k0);
    for (std::int64_t p = 0; p < panels; ++p) {
      const std::int32_t* bp = j.bp + ((n0 / NR + p) * Kh + k0) * NR;
      for (std::int64_t i = 0; i < mr_blocks; ++i) {  // rows up to Mp exist (zero): full blocks only
        const std::int32_t* ar = j.a + ((m0 / kMR + i) * Kh + k0) * kMR;
        QmmMicro<kMR>(ar, bp, kh, c + i * kMR * kQmmNC + p * NR, kQmmNC, k0 == 0);
      }
    }
  }
  if (Kh == 0) std::fill(c, c + kQmmMC * kQmmNC, 0);
  for (std::int64_t r = 0; r < mw; ++r)
    QmmFinishRow(a.epilogue, a.out, (j.b * M + m0 + r) * N + n0, j.b, m0 + r, n0, nw, c + r * kQmmNC);
}

// ---------------------------------------------------------------------------------------------------
// weight_quant_batchmatmul.

template <DType DT>
HWY_INLINE VF Round16(VF v) {
  if constexpr (DT == DType::float16) {
    return RoundToHalf(v);  // F16C's round trip on x86 AVX2 / AVX-512 (simd-inl.h)
  } else {
    return hn::BitCast(DF(), hn::ShiftLeft<16>(FloatToBf16Bits(v)));
  }
}

// Dequantized rows [k0, k1) of columns [n0, n0 + nw) (nw <= kWqmBlock): panel j (columns n0 + j NR ..)
// at dst + j * ldp, row k at + (k - k0) * NR; columns beyond nw up to a multiple of NR are zero.
template <DType DT>
void WqmDequant(const WeightQuantMatmulArgs& a, std::int64_t n0, std::int64_t nw, std::int64_t k0, std::int64_t k1,
                float* dst, std::int64_t ldp) {
  const DF df;
  const DI di;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df)), NR = 2 * L;
  const std::int64_t K = a.K, N = a.N;
  const std::int64_t width = (nw + NR - 1) / NR * NR;
  HWY_ALIGN std::int8_t q[kWqmBlock];
  HWY_ALIGN float s[kWqmBlock], o[kWqmBlock];
  HWY_ALIGN std::int32_t words[kWqmBlock / 8 + HWY_MAX_BYTES / 4];  // int4: the row's words (+ slack for LoadU)
  const auto* w8 = static_cast<const std::int8_t*>(a.weight);
  const auto* w4 = static_cast<const std::int32_t*>(a.weight);
  const bool has_off = a.offset != nullptr;
  // whole rows straight from storage: int8 [K][N] loads, int4 [K][N / 8] words split in registers
  const bool direct8 = !a.transpose_weight && !a.int4 && nw == width;
  const bool direct4 = !a.transpose_weight && a.int4 && nw == width && n0 % 8 == 0;
  std::fill(words, words + kWqmBlock / 8 + HWY_MAX_BYTES / 4, 0);
  std::int64_t g_next = k0;  // first k of the next parameter group
  for (std::int64_t k = k0; k < k1; ++k) {
    if (k == g_next) {  // parameters of group k / group_size, zero-padded to the panel width
      const std::int64_t g = k / a.group_size;
      g_next = (g + 1) * a.group_size;
      std::memcpy(s, a.scale + g * N + n0, static_cast<std::size_t>(nw) * sizeof(float));
      if (has_off) std::memcpy(o, a.offset + g * N + n0, static_cast<std::size_t>(nw) * sizeof(float));
      for (std::int64_t t = nw; t < width; ++t) s[t] = o[t] = 0.0f;
    }
    // q[t] = weight element (k, n0 + t)
    const std::int8_t* qrow = q;
    if (direct8) {
      qrow = w8 + k * N + n0;
    } else if (direct4) {
      std::memcpy(words, w4 + (k * N + n0) / 8, static_cast<std::size_t>(nw / 8) * sizeof(std::int32_t));
    } else {
      if (!a.transpose_weight) {
        if (a.int4)
          unpack_int4_bytes(w4, k * N + n0, nw, q);
        else
          std::memcpy(q, w8 + k * N + n0, static_cast<std::size_t>(nw));
      } else if (a.int4) {
        for (std::int64_t t = 0; t < nw; ++t) q[t] = static_cast<std::int8_t>(load_int4(w4, (n0 + t) * K + k));
      } else {
        for (std::int64_t t = 0; t < nw; ++t) q[t] = w8[(n0 + t) * K + k];
      }
      for (std::int64_t t = nw; t < width; ++t) q[t] = 0;
    }
    float* row = dst + (k - k0) * NR;
    float* out = row;  // panel t / NR, half (t % NR) / L
    for (std::int64_t t = 0; t < width; t += L, out += (t % NR == 0) ? ldp - L : L) {
      VI qi;
      if (direct4) {
        // lane l is element t + l: nibble (t + l) % 8 of word (t + l) / 8, moved to the top (multiply) and shifted down
        const VI lane = hn::Iota(di, static_cast<std::int32_t>(t % 8));
        const VI wv =
            hn::TableLookupLanes(hn::LoadU(di, words + t / 8), hn::IndicesFromVec(di, hn::ShiftRight<3>(lane)));
        const auto top = hn::Mul(hn::BitCast(DU(), wv), hn::LoadU(DU(), kNibbleMul.v + t % 8));  // modulo 2^32
        qi = hn::ShiftRight<28>(hn::BitCast(di, top));
      } else {
        qi = hn::PromoteTo(di, hn::LoadU(DI8(), qrow + t));
      }
      VF v = hn::ConvertTo(df, qi);
      if (has_off) v = Round16<DT>(hn::Add(v, hn::Load(df, o + t)));  // narrow_x(q + offset)
      v = Round16<DT>(hn::Mul(v, hn::Load(df, s + t)));               // narrow_x(. * scale)
      hn::Store(v, df, out);
    }
  }
}

void WqmDequantRows(const WeightQuantMatmulArgs& a, std::int64_t n0, std::int64_t nw, std::int64_t k0, std::int64_t k1,
                    float* dst, std::int64_t ldp) {
  if (a.dt == DType::float16)
    WqmDequant<DType::float16>(a, n0, nw, k0, k1, dst, ldp);
  else
    WqmDequant<DType::bfloat16>(a, n0, nw, k0, k1, dst, ldp);
}

// c[r][0, NR) = (init ? +0 : c[r]) + x[r][k] * bp[k] over k in [0, kc) in order, rows r < R; x[r][k] at
// x[r * ldx + k * sk].
template <int R>
HWY_INLINE void WqmMicro(const float* x, std::int64_t ldx, std::int64_t sk, const float* bp, std::int64_t kc, float* c,
                         std::int64_t ldc, bool init) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
#if XQUANT_MM_SIZELESS
  for (int r = 0; r < R; ++r)  // plain code, each lane's sequence as below
    for (std::int64_t t = 0; t < 2 * L; ++t) {
      float acc = init ? 0.0f : c[r * ldc + t];
      for (std::int64_t k = 0; k < kc; ++k) acc = weight_matmul_step(acc, x[r * ldx + k * sk], bp[k * 2 * L + t]);
      c[r * ldc + t] = acc;
    }
  (void)df;
#else
  VF acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = init ? hn::Zero(df) : hn::LoadU(df, c + r * ldc);  // +0
    acc[r][1] = init ? hn::Zero(df) : hn::LoadU(df, c + r * ldc + L);
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const VF w0 = hn::Load(df, bp + k * 2 * L), w1 = hn::Load(df, bp + k * 2 * L + L);
    for (int r = 0; r < R; ++r) {
      const VF xv = hn::Set(df, x[r * ldx + k * sk]);
      acc[r][0] = hn::Add(acc[r][0], hn::Mul(xv, w0));  // the product rounded, then the sum
      acc[r][1] = hn::Add(acc[r][1], hn::Mul(xv, w1));
    }
  }
  for (int r = 0; r < R; ++r) {
    hn::StoreU(acc[r][0], df, c + r * ldc);
    hn::StoreU(acc[r][1], df, c + r * ldc + L);
  }
#endif
}

// Rows [0, rows) in register blocks of kMR (the last one shorter).
HWY_INLINE void WqmRows(const float* x, std::int64_t ldx, std::int64_t rows, const float* bp, std::int64_t kc, float* c,
                        std::int64_t ldc, bool init) {
  std::int64_t r = 0;
  for (; r + kMR <= rows; r += kMR) WqmMicro<kMR>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
  switch (rows - r) {
    case 1:
      WqmMicro<1>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    case 2:
      WqmMicro<2>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    case 3:
      WqmMicro<3>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    case 4:
      WqmMicro<4>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    case 5:
      WqmMicro<5>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    case 6:
      WqmMicro<6>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    case 7:
      WqmMicro<7>(x + r * ldx, ldx, 1, bp, kc, c + r * ldc, ldc, init);
      break;
    default:
      break;
  }
}

// out[m][n] for rows [m0, m0 + rows) and columns [n0, n0 + nw) from the finished sums c (ldc apart).
void WqmFinish(const WeightQuantMatmulArgs& a, std::int64_t m0, std::int64_t rows, std::int64_t n0, std::int64_t nw,
               const float* c, std::int64_t ldc) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const VF qnan = hn::BitCast(df, hn::Set(DU(), 0x7FC00000u));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t base = (m0 + r) * a.N + n0;
    std::int64_t t = 0;
    for (; t + L <= nw; t += L) {
      VF v = hn::LoadU(df, c + r * ldc + t);
      if (a.bias != nullptr) v = hn::Add(v, hn::LoadU(df, a.bias + n0 + t));
      v = hn::IfThenElse(hn::IsNaN(v), qnan, v);  // canonical NaN
      if (a.dt == DType::float16)
        StoreF<DType::float16>(v, a.out, base + t);
      else
        StoreF<DType::bfloat16>(v, a.out, base + t);
    }
    for (; t < nw; ++t) weight_matmul_finish(a.dt, a.out, base + t, c[r * ldc + t], a.bias, n0 + t);
  }
}

// Decode: columns [c0, c1) (c0 a multiple of kWqmBlock) of every row, k in chunks of kWqmDecodeKC rows,
// each chunk dequantized block by block (128 columns: stored rows are read in long runs, one page after
// another) into buf (kWqmBlock * kWqmDecodeKC floats) and added into c (M rows of c1 - c0 floats, ldc
// apart) by every row of x.
void WqmDecodeRange(const WqmJob& j, std::int64_t c0, std::int64_t c1, float* buf, float* c, std::int64_t ldc) {
  const WeightQuantMatmulArgs& a = *j.args;
  const std::int64_t NR = 2 * static_cast<std::int64_t>(hn::Lanes(DF()));
  const std::int64_t M = a.M, K = a.K;
  for (std::int64_t k0 = 0; k0 < K; k0 += kWqmDecodeKC) {
    const std::int64_t kc = std::min(kWqmDecodeKC, K - k0);
    for (std::int64_t n0 = c0; n0 < c1; n0 += kWqmBlock) {
      const std::int64_t nw = std::min(kWqmBlock, c1 - n0), panels = (nw + NR - 1) / NR;
      WqmDequantRows(a, n0, nw, k0, k0 + kc, buf, kc * NR);
      for (std::int64_t p = 0; p < panels; ++p)
        WqmRows(j.x + k0, K, M, buf + p * kc * NR, kc, c + (n0 - c0) + p * NR, ldc, k0 == 0);
    }
  }
  if (K == 0)
    for (std::int64_t r = 0; r < M; ++r) std::fill(c + r * ldc, c + r * ldc + (c1 - c0), 0.0f);
  WqmFinish(a, 0, M, c0, c1 - c0, c, ldc);
}

// Prefill: rows [m0, m0 + rows) x columns [n0, n0 + nw) (nw <= kWqmNC) against the dequantized block
// panel (panel p at panel + p * K * NR); x packed by WidenXPacked; c: kWqmMC * kWqmNC floats.
void WqmPrefillTile(const WqmJob& j, std::int64_t m0, std::int64_t rows, std::int64_t n0, std::int64_t nw,
                    const float* panel, float* c) {
  const WeightQuantMatmulArgs& a = *j.args;
  const std::int64_t NR = 2 * static_cast<std::int64_t>(hn::Lanes(DF()));
  const std::int64_t K = a.K, panels = (nw + NR - 1) / NR;
  const std::int64_t blocks = (rows + kMR - 1) / kMR;  // padded rows are zero in x and ignored in c
  for (std::int64_t k0 = 0; k0 < K; k0 += kWqmKC) {
    const std::int64_t kc = std::min(kWqmKC, K - k0);
    for (std::int64_t p = 0; p < panels; ++p)
      for (std::int64_t i = 0; i < blocks; ++i)
        WqmMicro<kMR>(j.x + ((m0 / kMR + i) * K + k0) * kMR, 1, kMR, panel + (p * K + k0) * NR, kc,
                      c + i * kMR * kWqmNC + p * NR, kWqmNC, k0 == 0);
  }
  if (K == 0) std::fill(c, c + kWqmMC * kWqmNC, 0.0f);
  WqmFinish(a, m0, rows, n0, nw, c, kWqmNC);
}

std::int64_t WqmPanelWidth() { return 2 * static_cast<std::int64_t>(hn::Lanes(DF())); }

// Rows [m0, m1) of x widened to float32 and packed by register block: x(m, k) at
// xp[((m / kMR) * K + k) * kMR + m % kMR] (the block's rows of one k side by side: rows kept apart by K
// would alias in the caches).
void WidenXPacked(const WeightQuantMatmulArgs& a, float* xp, std::int64_t m0, std::int64_t m1) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df)), K = a.K;
  HWY_ALIGN float tmp[HWY_MAX_BYTES / 4];
  for (std::int64_t m = m0; m < m1; ++m) {
    float* dst = xp + (m / kMR) * K * kMR + m % kMR;
    std::int64_t k = 0;
    for (; k + L <= K; k += L) {
      hn::Store(a.dt == DType::float16 ? LoadF<DType::float16>(a.x, m * K + k) : LoadF<DType::bfloat16>(a.x, m * K + k),
                df, tmp);
      for (std::int64_t t = 0; t < L; ++t) dst[(k + t) * kMR] = tmp[t];
    }
    for (; k < K; ++k) dst[k * kMR] = load_float(a.dt, a.x, m * K + k);
  }
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(QmmTile);
HWY_EXPORT(QmmPanelWidth);
HWY_EXPORT(QmmPackB);
HWY_EXPORT(QmmPackA);
HWY_EXPORT(QmmGemmTile);
HWY_EXPORT(WqmPanelWidth);
HWY_EXPORT(WqmDequantRows);
HWY_EXPORT(WqmDecodeRange);
HWY_EXPORT(WqmPrefillTile);
HWY_EXPORT(WidenXPacked);

namespace {
// Logical int8 values of `count` elements of int8 or packed int4 storage.
void to_int8(bool int4, const void* src, std::int64_t count, std::int8_t* dst) {
  if (int4)
    unpack_int4_bytes(static_cast<const std::int32_t*>(src), 0, count, dst);
  else
    std::memcpy(dst, src, static_cast<std::size_t>(count));
}

// A vector-aligned buffer of n (at least 1) elements, zero-filled.
template <class T>
hwy::AlignedFreeUniquePtr<T[]> aligned_zeros(std::int64_t n) {
  const auto count = static_cast<std::size_t>(std::max<std::int64_t>(n, 1));
  auto p = hwy::AllocateAligned<T>(count);
  if (!p) throw std::bad_alloc();
  std::memset(p.get(), 0, count * sizeof(T));
  return p;
}

// The dot kernel over every batch (x1 / x2 as logical int8, x2 stored [N][K]).
void quant_matmul_dot(const QuantMatmulArgs& a, const std::int8_t* x1, const std::int8_t* x2t) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  const QmmDotJob j{&a, x1, x2t};
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

// The GEMM kernel, batch by batch (a broadcast x2 is packed once while its offset repeats).
void quant_matmul_gemm(const QuantMatmulArgs& a, const std::int8_t* x1, const std::int8_t* x2) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  const std::int64_t Kh = (K + 1) / 2, Mp = (M + kRowPad - 1) / kRowPad * kRowPad;
  const std::int64_t NR = HWY_DYNAMIC_DISPATCH(QmmPanelWidth)();
  const std::int64_t panels = (N + NR - 1) / NR;
  auto apack = aligned_zeros<std::int32_t>(Mp * Kh);
  auto bpack = aligned_zeros<std::int32_t>(panels * Kh * NR);
  const std::int64_t mt = (M + kQmmMC - 1) / kQmmMC, nt = (N + kQmmNC - 1) / kQmmNC;
  std::int64_t packed_off = -1;
  for (std::int64_t b = 0; b < a.batch; ++b) {
    // x1 rows as int16 pairs, interleaved by register block (pieces of whole kRowPad rows: any kMR divides)
    const std::int8_t* X1 = x1 + a.x1_offsets[b];
    parallel_ranges(Mp, kRowPad * 8, M * K * 3, [&](std::int64_t r0, std::int64_t r1) {
      HWY_DYNAMIC_DISPATCH(QmmPackA)(X1, M, K, r0, r1, apack.get());
    });
    if (a.x2_offsets[b] != packed_off) {
      const std::int8_t* X2 = x2 + a.x2_offsets[b];
      const bool tr = a.transpose_x2;
      parallel_ranges(panels, 4, K * N * 5, [&](std::int64_t p0, std::int64_t p1) {
        HWY_DYNAMIC_DISPATCH(QmmPackB)(X2, tr, K, N, p0, p1, bpack.get());
      });
      packed_off = a.x2_offsets[b];
    }
    const QmmGemmJob j{&a, b, apack.get(), bpack.get(), Kh, Mp, NR};
    parallel_ranges(mt * nt, 1, M * N * std::max<std::int64_t>(K, 1), [&](std::int64_t t0, std::int64_t t1) {
      auto c = aligned_zeros<std::int32_t>(kQmmMC * kQmmNC);
      for (std::int64_t t = t0; t < t1; ++t)
        HWY_DYNAMIC_DISPATCH(QmmGemmTile)(j, (t / nt) * kQmmMC, (t % nt) * kQmmNC, c.get());
    });
  }
}
// A8W4 per-group mode (9.3.1) on the GEMM kernel: x1's rows split into their two int4 halves (row 2m: hi,
// row 2m + 1: lo) and cut into k groups become G batches of [2 rows][group_k] int8; x2, unpacked to int8
// [K][N], is the same G batches of [group_k][N]. The kernel's exact int32 products per (group, half, n) then
// fold in float16, group by group, with params/matmul.hpp's a8w4_group_step (the reference's order). Rows
// are taken in chunks so the int32 products stay below ~64 MiB.
void quant_matmul_a8w4(const QuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N, GK = a.group_k, G = K / GK;
  std::vector<std::int8_t> w(static_cast<std::size_t>(K * N));
  if (a.transpose_x2) {  // stored [N][K / 8]: unpack row by row, then transpose to [K][N]
    std::vector<std::int8_t> t(static_cast<std::size_t>(K * N));
    to_int8(true, a.x2, K * N, t.data());
    parallel_ranges(K, 64, K * N * 2, [&](std::int64_t k0, std::int64_t k1) {
      for (std::int64_t k = k0; k < k1; ++k)
        for (std::int64_t n = 0; n < N; ++n)
          w[static_cast<std::size_t>(k * N + n)] = t[static_cast<std::size_t>(n * K + k)];
    });
  } else {
    to_int8(true, a.x2, K * N, w.data());
  }
  const auto* x1 = static_cast<const std::int8_t*>(a.x1);
  const std::int64_t chunk = std::max<std::int64_t>(
      1, std::min<std::int64_t>(M, (std::int64_t{16} << 20) / (2 * std::max<std::int64_t>(G, 1) * N)));
  std::vector<std::int8_t> xs(static_cast<std::size_t>(G * 2 * chunk * GK));
  std::vector<std::int32_t> acc(static_cast<std::size_t>(G * 2 * chunk * N));
  std::vector<std::int64_t> off1(static_cast<std::size_t>(G)), off2(static_cast<std::size_t>(G));
  for (std::int64_t g = 0; g < G; ++g) off2[static_cast<std::size_t>(g)] = g * GK * N;
  for (std::int64_t m0 = 0; m0 < M; m0 += chunk) {
    const std::int64_t rows = std::min(chunk, M - m0), R = 2 * rows;
    // xs[g][2r + h][j] = half h of x1[m0 + r][g * GK + j]
    parallel_ranges(rows, 4, rows * K * 3, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t g = 0; g < G; ++g) {
          const std::int8_t* src = x1 + (m0 + r) * K + g * GK;
          std::int8_t* hi = xs.data() + (g * R + 2 * r) * GK;
          std::int8_t* lo = hi + GK;
          for (std::int64_t j = 0; j < GK; ++j) {
            hi[j] = static_cast<std::int8_t>(a8w4_hi(src[j]));
            lo[j] = static_cast<std::int8_t>(a8w4_lo(src[j]));
          }
        }
    });
    for (std::int64_t g = 0; g < G; ++g) off1[static_cast<std::size_t>(g)] = g * R * GK;
    QuantMatmulArgs sub{};
    sub.x1 = xs.data();
    sub.x2 = w.data();
    sub.batch = G;
    sub.M = R;
    sub.K = GK;
    sub.N = N;
    sub.x1_offsets = off1.data();
    sub.x2_offsets = off2.data();
    sub.out = acc.data();
    sub.epilogue.out_dt = DType::int32;
    quant_matmul_gemm(sub, xs.data(), w.data());
    // fold the groups in float16, per output element (the reference's order)
    parallel_ranges(rows, 1, rows * N * G * 8, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t n = 0; n < N; ++n) {
          float sum_hi = 0.0f, sum_lo = 0.0f;
          for (std::int64_t g = 0; g < G; ++g) {
            const float s = a.group_scale[g * N + n];
            sum_hi = a8w4_group_step(sum_hi, acc[static_cast<std::size_t>((g * R + 2 * r) * N + n)], s);
            sum_lo = a8w4_group_step(sum_lo, acc[static_cast<std::size_t>((g * R + 2 * r + 1) * N + n)], s);
          }
          a8w4_finish(a.epilogue, a.out, (m0 + r) * N + n, m0 + r, n, sum_hi, sum_lo);
        }
    });
  }
}
}  // namespace

void cpu_quant_matmul(const QuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  if (a.batch * M * N == 0) return;
  if (a.group_k > 0) return quant_matmul_a8w4(a);
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
  // x2 as int8 in its stored layout
  std::vector<std::int8_t> x2buf;
  const std::int8_t* x2 = static_cast<const std::int8_t*>(a.x2);
  if (a.int4) {
    x2buf.resize(static_cast<std::size_t>(n2));
    to_int8(true, a.x2, n2, x2buf.data());
    x2 = x2buf.data();
  }
  if (a.transpose_x2 && M <= kQmmDotMaxM)
    quant_matmul_dot(a, x1, x2);
  else
    quant_matmul_gemm(a, x1, x2);
}

void cpu_weight_quant_matmul(const WeightQuantMatmulArgs& a) {
  const std::int64_t M = a.M, K = a.K, N = a.N;
  if (M * N == 0) return;
  const std::int64_t NR = HWY_DYNAMIC_DISPATCH(WqmPanelWidth)();
  const std::int64_t bytes = M * N * std::max<std::int64_t>(K, 1);
  if (M <= kWqmDecodeMaxM) {
    auto x = aligned_zeros<float>(M * K);
    parallel_ranges(M * K, std::int64_t{1} << 16, M * K * 6,
                    [&](std::int64_t b0, std::int64_t b1) { cpu_widen_to_float(a.dt, a.x, b0, b1, x.get()); });
    const WqmJob j{&a, x.get()};
    // each thread one contiguous range of whole blocks (a partial last block at N)
    const std::int64_t blocks = (N + kWqmBlock - 1) / kWqmBlock;
    const std::int64_t per = (blocks + worker_threads() - 1) / worker_threads();
    parallel_ranges(blocks, std::max<std::int64_t>(per, 1), bytes + K * N, [&](std::int64_t p0, std::int64_t p1) {
      const std::int64_t c0 = p0 * kWqmBlock, c1 = std::min(N, p1 * kWqmBlock);
      const std::int64_t ldc = (c1 - c0 + kWqmBlock - 1) / kWqmBlock * kWqmBlock;
      auto buf = aligned_zeros<float>(kWqmBlock * kWqmDecodeKC);
      auto c = aligned_zeros<float>(M * ldc);
      HWY_DYNAMIC_DISPATCH(WqmDecodeRange)(j, c0, c1, buf.get(), c.get(), ldc);
    });
    return;
  }
  // prefill: x widened and packed by register block (rows padded to kRowPad, a multiple of every kMR,
  // stay zero); per block of kWqmNC columns, dequantize all K (threads split k), then row tiles over threads
  const std::int64_t Mp = (M + kRowPad - 1) / kRowPad * kRowPad;
  auto x = aligned_zeros<float>(Mp * K);
  parallel_ranges(M, kRowPad * 8, M * K * 6, [&](std::int64_t r0, std::int64_t r1) {
    HWY_DYNAMIC_DISPATCH(WidenXPacked)(a, x.get(), r0, r1);
  });
  const WqmJob j{&a, x.get()};
  const std::int64_t kmax = std::max<std::int64_t>(K, 1);
  auto panel = aligned_zeros<float>(kWqmNC * kmax);
  const std::int64_t mt = (M + kWqmMC - 1) / kWqmMC;
  for (std::int64_t n0 = 0; n0 < N; n0 += kWqmNC) {
    const std::int64_t nw = std::min(kWqmNC, N - n0);
    parallel_ranges(K, 256, K * nw * 8, [&](std::int64_t k0, std::int64_t k1) {
      for (std::int64_t c0 = 0; c0 < nw; c0 += kWqmBlock)  // 128 columns (whole panels) at a time
        HWY_DYNAMIC_DISPATCH(WqmDequantRows)
      (a, n0 + c0, std::min(kWqmBlock, nw - c0), k0, k1, panel.get() + (c0 / NR * K + k0) * NR, K * NR);
    });
    parallel_ranges(mt, 1, M * nw * kmax, [&](std::int64_t t0, std::int64_t t1) {
      auto c = aligned_zeros<float>(kWqmMC * kWqmNC);
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t m0 = t * kWqmMC;
        HWY_DYNAMIC_DISPATCH(WqmPrefillTile)(j, m0, std::min(kWqmMC, M - m0), n0, nw, panel.get(), c.get());
      }
    });
  }
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
