// The cpu backend's thresholds, and the test hooks that move them (cpu/parallel.hpp).
#include "cpu/parallel.hpp"

#include <atomic>

namespace xquant::detail {

namespace {
std::atomic<std::int64_t> g_stream_min_bytes{kStreamMinBytes};
std::atomic<std::int64_t> g_parallel_min_bytes{kParallelMinBytes};
}  // namespace

std::int64_t parallel_min_bytes() { return g_parallel_min_bytes.load(std::memory_order_relaxed); }
void set_parallel_min_bytes(std::int64_t b) { g_parallel_min_bytes.store(b, std::memory_order_relaxed); }
std::int64_t stream_min_bytes() { return g_stream_min_bytes.load(std::memory_order_relaxed); }
void set_stream_min_bytes(std::int64_t b) { g_stream_min_bytes.store(b, std::memory_order_relaxed); }

}  // namespace xquant::detail
