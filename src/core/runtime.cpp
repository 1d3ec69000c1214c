#include "xquant/runtime.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "core/check.hpp"

namespace xquant {
namespace {
std::atomic<int> g_threads{0};
std::atomic<Backend> g_backend{Backend::cpu};
}  // namespace

void set_num_threads(int n) {
  if (n < 0)
    detail::fail(ErrorCode::invalid_argument, "set_num_threads", "n",
                 "n is " + std::to_string(n) + " but expected a thread count >= 1, or 0 for the default");
  if (n > kMaxThreads)
    detail::fail(ErrorCode::invalid_argument, "set_num_threads", "n",
                 "n is " + std::to_string(n) + " but expected at most kMaxThreads = " + std::to_string(kMaxThreads) +
                     " (or 0 for the default)");
  g_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : std::max(1, omp_get_max_threads());
}

void set_backend(Backend b) { g_backend.store(b, std::memory_order_relaxed); }
Backend get_backend() { return g_backend.load(std::memory_order_relaxed); }

// simd_target() is answered by the cpu backend (src/cpu/cpu.cpp); active_kernels() by the backend
// registry (src/backends/registry.cpp).

}  // namespace xquant
