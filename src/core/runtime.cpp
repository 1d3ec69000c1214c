#include "xquant/runtime.hpp"

#include <omp.h>

#include <atomic>

#include "core/check.hpp"
#include "core/kernels.hpp"
#include "cpu/cpu.hpp"
#include "cpu/parallel.hpp"
#include "hwy/targets.h"

namespace xquant {
namespace {
std::atomic<int> g_threads{0};
std::atomic<Backend> g_backend{Backend::cpu};
}  // namespace

void set_num_threads(int n) {
  if (n < 0)
    detail::fail(ErrorCode::invalid_argument, "set_num_threads", "n",
                 "n is " + std::to_string(n) + " but expected a thread count >= 1, or 0 for the default");
  g_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : std::max(1, omp_get_max_threads());
}

void set_backend(Backend b) { g_backend.store(b, std::memory_order_relaxed); }
Backend get_backend() { return g_backend.load(std::memory_order_relaxed); }

std::string simd_target() { return detail::cpu_target_name(); }

namespace detail {

int worker_threads() { return get_num_threads(); }

namespace {
std::atomic<std::int64_t> g_stream_min_bytes{kStreamMinBytes};
std::atomic<std::int64_t> g_parallel_min_bytes{kParallelMinBytes};
}
std::int64_t parallel_min_bytes() { return g_parallel_min_bytes.load(std::memory_order_relaxed); }
void set_parallel_min_bytes(std::int64_t b) { g_parallel_min_bytes.store(b, std::memory_order_relaxed); }
std::int64_t stream_min_bytes() { return g_stream_min_bytes.load(std::memory_order_relaxed); }
void set_stream_min_bytes(std::int64_t b) { g_stream_min_bytes.store(b, std::memory_order_relaxed); }

const KernelTable& active_kernels() {
  return get_backend() == Backend::reference ? reference_kernels() : cpu_kernels();
}

}  // namespace detail
}  // namespace xquant
