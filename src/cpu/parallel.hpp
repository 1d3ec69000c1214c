// OpenMP partitioning for the CPU kernels. Every kernel here is either elementwise (any partition gives
// the same bits) or reduces with the canonical blocked order of core/numeric.hpp, whose chunks are fixed
// by the data, not by the thread count.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "xquant/runtime.hpp"

namespace xquant::detail {

inline int worker_threads() { return get_num_threads(); }  // the configured count (set_num_threads)

// Below this many bytes of traffic a call stays on the calling thread: one core moves 2 MiB in ~100 us,
// while waking a sleeping OpenMP team costs 10-100 us on a loaded machine (and more when another OpenMP
// runtime, e.g. PyTorch's, shares the cores). The per-call overhead target is < 1 us for 4 Ki elements.
inline constexpr std::int64_t kParallelMinBytes = std::int64_t{2} << 20;

// Outputs of at least this many bytes are written with non-temporal (streaming) stores: they exceed
// the 32 MiB last-level cache of the development machine by the time the call ends, so caching them
// only costs a read-for-ownership per line.
inline constexpr std::int64_t kStreamMinBytes = std::int64_t{16} << 20;
std::int64_t stream_min_bytes();          // kStreamMinBytes unless a test changed it (parallel.cpp)
void set_stream_min_bytes(std::int64_t);  // tests: 0 streams every output that can be aligned
inline bool use_stream(std::int64_t output_bytes) { return output_bytes >= stream_min_bytes(); }

std::int64_t parallel_min_bytes();          // kParallelMinBytes unless a test changed it (parallel.cpp)
void set_parallel_min_bytes(std::int64_t);  // tests: 0 splits every call that has more than one piece

inline int threads_for(std::int64_t bytes) {
  if (bytes < parallel_min_bytes()) return 1;
  return worker_threads();
}

// Calls f(begin, end) over [0, n) cut into contiguous pieces of `grain` elements (the last one shorter),
// pieces handed to threads in contiguous groups (schedule(static)).
template <class F>
void parallel_ranges(std::int64_t n, std::int64_t grain, std::int64_t bytes, F&& f) {
  if (n <= 0) return;
  const int t = threads_for(bytes);
  const std::int64_t pieces = (n + grain - 1) / grain;
  if (t <= 1 || pieces <= 1) {
    f(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(t)
  for (std::int64_t p = 0; p < pieces; ++p) f(p * grain, std::min(n, (p + 1) * grain));
}

}  // namespace xquant::detail
