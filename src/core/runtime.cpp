#include "xquant/runtime.hpp"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "core/check.hpp"

namespace xquant {
namespace {
std::atomic<int> g_threads{0};
std::atomic<Backend> g_backend{Backend::cpu};

// Fork safety. libgomp's thread pool does not survive fork(): the child has only the forking thread, and
// its first parallel region waits forever for pool threads that are not there. Any library sharing the
// runtime may have started the pool (PyTorch's wheels bring their own libgomp.so.1, which the dynamic
// linker then hands to xquant too), so a forked child cannot know whether it is safe, and runs every
// operator on its calling thread: get_num_threads() is 1 there, and every kernel takes its serial path
// (which opens no OpenMP region). Results do not change: every kernel is thread-count independent.
// LLVM's libomp would survive the fork, but one rule for both runtimes keeps results and costs alike.
std::atomic<bool> g_forked_child{false};
void mark_forked_child() { g_forked_child.store(true, std::memory_order_relaxed); }
// Registered when the library is loaded (this translation unit is always linked: get_num_threads is).
[[maybe_unused]] const bool g_atfork_registered = pthread_atfork(nullptr, nullptr, &mark_forked_child) == 0;
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
  if (g_forked_child.load(std::memory_order_relaxed)) return 1;  // see mark_forked_child
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : std::max(1, omp_get_max_threads());
}

void set_backend(Backend b) { g_backend.store(b, std::memory_order_relaxed); }
Backend get_backend() { return g_backend.load(std::memory_order_relaxed); }

// simd_target() is answered by the cpu backend (src/cpu/cpu.cpp); active_kernels() by the backend
// registry (src/backends/registry.cpp).

}  // namespace xquant
