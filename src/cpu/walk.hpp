// How the cpu kernels walk an [outer, C, inner] problem (a ChannelLayout, xquant/layout.hpp) with per-channel parameters.
//  - runs:     inner >= kMinRun: each (o, c) row is a run with broadcast (scalar) parameters;
//  - periodic: small inner (the last axis has inner == 1): parameters are expanded to the period
//              P = C * inner, replicated to at least kMinPeriod elements, and loaded as vectors; element
//              i uses phase i % P. Expansion is capped (kMaxPeriod); beyond it the runs walk is used.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "xquant/layout.hpp"

namespace xquant::detail {

inline constexpr std::int64_t kMinRun = 64;
inline constexpr std::int64_t kMinPeriod = 1024;
inline constexpr std::int64_t kMaxPeriod = std::int64_t{1} << 20;

struct ChannelWalk {
  std::int64_t C = 1, inner = 1;
  std::int64_t period = 0;  // > 0: periodic walk with this period; 0: runs

  explicit ChannelWalk(const ChannelLayout& layout) : C(layout.channels), inner(layout.inner) {
    const std::int64_t p = C * inner;
    if (inner < kMinRun && p > 0 && p <= kMaxPeriod)
      period = p * std::max<std::int64_t>(1, (kMinPeriod + p - 1) / p);
  }
  // Channel of phase k of the periodic walk.
  std::int64_t channel_of_phase(std::int64_t k) const { return (k / inner) % C; }
  // Per-channel values expanded to the period.
  template <class T>
  std::vector<T> expand(const T* per_channel) const {
    std::vector<T> v(static_cast<std::size_t>(period));
    for (std::int64_t k = 0; k < period; ++k) v[static_cast<std::size_t>(k)] = per_channel[channel_of_phase(k)];
    return v;
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

}  // namespace xquant::detail
