// Process-wide runtime settings: worker threads and the kernel backend.
#pragma once
#include <cstddef>
#include <string>

namespace xquant {

// The largest thread count set_num_threads accepts.
inline constexpr int kMaxThreads = 1024;

// Number of OpenMP threads the CPU kernels use (1 <= n <= kMaxThreads), or 0 to follow OpenMP's default
// (OMP_NUM_THREADS / the number of cores). A negative n or n > kMaxThreads throws xquant::Error
// (invalid_argument). Results are bit-identical for every thread count. A fork()ed child runs on 1.
void set_num_threads(int n);
// The thread count in effect (>= 1; 1 in a child made by fork(): OpenMP's pool does not survive fork).
int get_num_threads();

enum class Backend {
  cpu,        // Highway SIMD kernels (runtime-dispatched to the best target of this CPU) + OpenMP: default
  reference,  // the scalar reference kernels: slow, the oracle the others are tested against
};
void set_backend(Backend b);
Backend get_backend();

// Large xquant::Tensor allocations (>= 2 MiB, huge-page backed) are returned to a per-process cache when
// freed, and reused by later allocations of the same rounded size: first-touch page faults and the
// kernel's zero-fill of fresh pages cost about as much as a memory-bound operator. Default limit 2 GiB;
// 0 disables the cache and releases what it holds.
void set_memory_cache_limit(std::size_t bytes);
std::size_t get_memory_cache_limit();

// The SIMD target the cpu backend runs on this machine, e.g. "AVX3", "AVX2", "SSE4", "SCALAR".
std::string simd_target();

}  // namespace xquant
