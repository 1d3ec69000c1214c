// How the cpu kernels walk an [outer, C, inner] problem (a ChannelLayout, xquant/layout.hpp) with per-channel
// parameters.
//  - runs:     inner >= kMinRun: each (o, c) row is a run with broadcast (scalar) parameters;
//  - periodic: small inner (the last axis has inner == 1): parameters are expanded to the period
//              P = C * inner and loaded as vectors; element i uses phase i % P. A short P is replicated
//              (towards kMinPeriod elements, never beyond the problem's outer rows) when the problem has
//              enough rows for the longer pieces to pay for the longer expansion; with P >= kMinRun and
//              few rows each row is one piece and its parameters are the per-channel values themselves
//              (the last axis: loaded straight along the row). Expansion is capped (kMaxPeriod); beyond
//              it the runs walk is used.
// The expanded arrays live in a ParamStore: on the stack for small problems, so a small call allocates nothing.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "xquant/layout.hpp"

namespace xquant::detail {

inline constexpr std::int64_t kMinRun = 64;
inline constexpr std::int64_t kMinPeriod = 1024;
inline constexpr std::int64_t kMaxPeriod = std::int64_t{1} << 20;
// A piece of the periodic walk costs about as much call and tail overhead as expanding this many
// parameter elements: replication (fewer, longer pieces) is chosen when it saves more than it expands.
inline constexpr std::int64_t kPieceCostElems = 32;

struct ChannelWalk {
  std::int64_t C = 1, inner = 1;
  std::int64_t period = 0;  // > 0: periodic walk with this period; 0: runs

  explicit ChannelWalk(const ChannelLayout& layout) : C(layout.channels), inner(layout.inner) {
    const std::int64_t p = C * inner;
    if (inner < kMinRun && p > 0 && p <= kMaxPeriod) {
      const std::int64_t outer = std::max<std::int64_t>(layout.outer, 1);
      const std::int64_t reps = std::min((kMinPeriod + p - 1) / p, outer);
      // replicated: outer / reps pieces and p * reps elements to expand; not: outer pieces, p elements
      const bool replicate = reps > 1 && (outer - outer / reps) * kPieceCostElems >= p * (reps - 1);
      period = replicate ? p * reps : p;
    }
  }
  // Channel of phase k of the periodic walk.
  std::int64_t channel_of_phase(std::int64_t k) const { return (k / inner) % C; }
  // Writes the period's values to dst[0, period): value(c) is channel c's value.
  template <class T, class Value>
  void expand_into(T* dst, Value&& value) const {
    std::int64_t k = 0;
    if (inner == 1) {  // the last axis: one value per channel
      for (; k < C; ++k) dst[k] = value(k);
    } else {
      for (std::int64_t c = 0; c < C; ++c) {
        const T v = value(c);
        for (std::int64_t i = 0; i < inner; ++i) dst[k++] = v;
      }
    }
    for (; k < period; k += C * inner) std::copy(dst, dst + C * inner, dst + k);  // replicas of the first
  }
  // Visits [a, b): run(pos, n, channel) for the runs walk, periodic(pos, n, phase) for the periodic one;
  // each piece stays inside one run / one period.
  template <class Run, class Periodic>
  void visit(std::int64_t a, std::int64_t b, Run&& run, Periodic&& periodic) const {
    std::int64_t pos = a;
    while (pos < b) {
      if (period > 0) {
        const std::int64_t ph = pos % period;
        const std::int64_t n = std::min(b - pos, period - ph);
        periodic(pos, n, ph);
        pos += n;
      } else {
        const std::int64_t row = pos / inner, off = pos % inner;
        const std::int64_t n = std::min(b - pos, inner - off);
        run(pos, n, row % C);
        pos += n;
      }
    }
  }
};

// Storage for one call's expanded parameter arrays: inline up to kInline floats (no allocation), on the
// heap beyond. Not copyable: the arrays point into it.
class ParamStore {
 public:
  static constexpr std::size_t kInline = 2048;
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;
  // Room for n floats (contents unspecified); called at most once.
  float* allocate(std::size_t n) {
    if (n <= kInline) return inline_;
    heap_ = std::make_unique_for_overwrite<float[]>(n);
    return heap_.get();
  }

 private:
  alignas(64) float inline_[kInline];
  std::unique_ptr<float[]> heap_;
};

}  // namespace xquant::detail
