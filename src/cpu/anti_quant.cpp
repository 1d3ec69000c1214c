// cpu backend: npu_anti_quant (SPEC section 7), bit-identical to src/ref/anti_quant.cpp.
//
// Elementwise over the logical elements: int8 values are loaded and widened in registers; packed int4
// words are first unpacked into a small int8 staging buffer (unpack_int4_bytes, the inverse of the
// packing the quantizers use). Parameters follow the [outer, C, inner] channel walk shared with
// npu_quantize (cpu/walk.hpp): scale / offset of length H are loaded along each row of H elements (or
// expanded to a replicated period when H is short), a single scale is broadcast. Outputs of at least
// stream_min_bytes() use non-temporal stores. Any thread partition gives the same bits.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/anti_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstring>
#include <limits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "core/numeric.hpp"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/walk.hpp"

namespace xquant::detail {
#ifndef XQUANT_CPU_ANTI_QUANT_ONCE
#define XQUANT_CPU_ANTI_QUANT_ONCE
struct AqJob {
  const AntiQuantArgs* args;
  const ChannelWalk* walk;
  const float* scale;   // periodic walk: expanded per-phase arrays
  const float* offset;
  bool stream;  // non-temporal stores for out (large outputs, cpu/parallel.hpp)
};
#endif
}  // namespace xquant::detail

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

constexpr std::int64_t kPiece = 512;  // int4: logical elements unpacked per staging round

// out = (float(q) + offset) * scale, NaN made canonical (params/anti_quant.hpp).
HWY_INLINE VF AntiQuantVec(const std::int8_t* q, VF offset, VF scale) {
  const DF df;
  const VF x = hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(DI8(), q)));
  const VF r = hn::Mul(hn::Add(x, offset), scale);
  return hn::IfThenElse(hn::IsNaN(r), hn::Set(df, std::numeric_limits<float>::quiet_NaN()), r);
}

// m values q[0, m) -> out elements [pos, pos + m); parameters broadcast (sa == nullptr) or arrays
// aligned with q. stream: non-temporal stores where the output can be aligned (DriveSpan).
template <DType DT>
void Values(const std::int8_t* q, std::int64_t m, void* out, std::int64_t pos, const float* sa, const float* oa,
            float s, float o, bool stream) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  auto step = [&]<bool kStream>(std::int64_t k) {
    const VF sv = sa ? hn::LoadU(df, sa + k) : hn::Set(df, s);
    const VF ov = oa ? hn::LoadU(df, oa + k) : hn::Set(df, o);
    StoreF<DT, kStream>(AntiQuantVec(q + k, ov, sv), out, pos + k);
  };
  auto stage = [&](std::int64_t k, std::int64_t rem) {  // fewer than a vector: through padded stack buffers
    HWY_ALIGN std::int8_t tq[kMaxLanes] = {};
    HWY_ALIGN float ts[kMaxLanes], to[kMaxLanes];
    alignas(64) unsigned char tout[kMaxLanes * 4];
    std::memcpy(tq, q + k, static_cast<std::size_t>(rem));
    for (std::int64_t t = 0; t < N; ++t) {
      ts[t] = t < rem ? (sa ? sa[k + t] : s) : 1.0f;
      to[t] = t < rem ? (oa ? oa[k + t] : o) : 0.0f;
    }
    StoreF<DT>(AntiQuantVec(tq, hn::Load(df, to), hn::Load(df, ts)), tout, 0);
    const std::size_t es = dtype_size(DT);
    std::memcpy(static_cast<unsigned char*>(out) + (pos + k) * static_cast<std::int64_t>(es), tout,
                static_cast<std::size_t>(rem) * es);
  };
  DriveSpan(m, stream, out, pos, dtype_size(DT), step, stage);
}

// n logical elements at pos.
template <DType DT>
void SpanT(const AqJob& j, std::int64_t pos, std::int64_t n, const float* sa, const float* oa, float s, float o) {
  const AntiQuantArgs& a = *j.args;
  if (a.src != QuantDType::quint4x2) {
    Values<DT>(static_cast<const std::int8_t*>(a.x) + pos, n, a.out, pos, sa, oa, s, o, j.stream);
    return;
  }
  HWY_ALIGN std::int8_t q[kPiece];
  for (std::int64_t b = 0; b < n; b += kPiece) {
    const std::int64_t m = std::min(kPiece, n - b);
    unpack_int4_bytes(static_cast<const std::int32_t*>(a.x), pos + b, m, q);
    Values<DT>(q, m, a.out, pos + b, sa ? sa + b : nullptr, oa ? oa + b : nullptr, s, o, j.stream);
  }
}

template <DType DT>
void RangeT(const AqJob& j, std::int64_t b0, std::int64_t b1) {
  const AntiQuantParams* p = j.args->params;
  j.walk->visit(
      b0, b1,
      [&](std::int64_t pos, std::int64_t n, std::int64_t c) {
        SpanT<DT>(j, pos, n, nullptr, nullptr, p[c].scale, p[c].offset);
      },
      [&](std::int64_t pos, std::int64_t n, std::int64_t ph) {
        SpanT<DT>(j, pos, n, j.scale + ph, j.offset + ph, 0.f, 0.f);
      });
}

void AntiQuantRange(const AqJob& j, std::int64_t b0, std::int64_t b1) {
  switch (j.args->dt) {
    case DType::float16: RangeT<DType::float16>(j, b0, b1); break;
    case DType::bfloat16: RangeT<DType::bfloat16>(j, b0, b1); break;
    default: RangeT<DType::float32>(j, b0, b1); break;
  }
  if (j.stream) hwy::FlushStream();
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(AntiQuantRange);

void cpu_anti_quant(const AntiQuantArgs& a) {
  const ChannelWalk walk(a.layout);
  ParamStore store;  // the periodic walk's arrays (on the stack for small problems)
  const float *scale = nullptr, *offset = nullptr;
  if (walk.period > 0) {
    const auto P = static_cast<std::size_t>(walk.period);
    float* s = store.allocate(2 * P);
    walk.expand_into(s, [&](std::int64_t c) { return a.params[c].scale; });
    walk.expand_into(s + P, [&](std::int64_t c) { return a.params[c].offset; });
    scale = s;
    offset = s + P;
  }
  const std::int64_t n = a.layout.numel();
  const AqJob j{&a, &walk, scale, offset, use_stream(n * static_cast<std::int64_t>(dtype_size(a.dt)))};
  const std::int64_t bytes = n * static_cast<std::int64_t>(dtype_size(a.dt) + 1);
  parallel_ranges(n, std::int64_t{1} << 16, bytes,
                  [&](std::int64_t b0, std::int64_t b1) { HWY_DYNAMIC_DISPATCH(AntiQuantRange)(j, b0, b1); });
}

}  // namespace xquant::detail
#endif  // HWY_ONCE
