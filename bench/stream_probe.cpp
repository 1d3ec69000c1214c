// What one core's memory system gives a trivial streaming loop, whatever the kernel's arithmetic: the
// ceiling that bench_ops --ratios rows are read against (docs/performance.md, "Intel Xeon, 2026-12-07").
// x86-64 with AVX-512 only (the loop is written with intrinsics so that the compiler cannot change it).
//
//   stream_probe MODE WALK [PREFETCH_BYTES] [PIECE_BYTES]
//     MODE   read   every 64-byte line of a 256 MiB buffer loaded, nothing stored
//            2to1   two lines read, one line stored non-temporally (a bfloat16 -> int8 row's traffic)
//            copy   one line read, one stored non-temporally (memcpy's traffic)
//     WALK   seq    each thread walks its share from start to end
//            two    each thread alternates PIECE_BYTES pieces (default 4096) of the two halves of its share
//     PREFETCH_BYTES  prefetcht0 this far ahead of each load (0: none, the default)
// Threads: OMP_NUM_THREADS. Prints the median of 9 timed passes (after one warm-up) in GB/s, counting
// bytes read + written, with the buffers on transparent huge pages where the kernel allows it.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum class Mode { kRead, kTwoToOne, kCopy };

struct Probe {
  Mode mode = Mode::kRead;
  bool two = false;
  std::size_t prefetch = 0, piece = 4096;
  const unsigned char* in = nullptr;
  unsigned char* out = nullptr;
};

// Bytes [lo, hi) of the input (multiples of 128): reads them, stores what the mode stores.
__attribute__((target("avx512f"))) float walk(const Probe& p, std::size_t lo, std::size_t hi) {
  __m512 acc = _mm512_setzero_ps();
  for (std::size_t i = lo; i < hi; i += 128) {
    if (p.prefetch != 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p.in + i + p.prefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p.in + i + p.prefetch + 64), _MM_HINT_T0);
    }
    const __m512 a = _mm512_load_ps(reinterpret_cast<const float*>(p.in + i));
    const __m512 b = _mm512_load_ps(reinterpret_cast<const float*>(p.in + i + 64));
    switch (p.mode) {
      case Mode::kRead:
        acc = _mm512_add_ps(acc, _mm512_add_ps(a, b));
        break;
      case Mode::kTwoToOne:
        _mm512_stream_ps(reinterpret_cast<float*>(p.out + i / 2), _mm512_add_ps(a, b));
        break;
      case Mode::kCopy:
        _mm512_stream_ps(reinterpret_cast<float*>(p.out + i), a);
        _mm512_stream_ps(reinterpret_cast<float*>(p.out + i + 64), b);
        break;
    }
  }
  return _mm512_reduce_add_ps(acc);
}

unsigned char* huge_alloc(std::size_t bytes) {
  void* q = std::aligned_alloc(std::size_t{2} << 20, bytes);
  if (q == nullptr) {
    std::fprintf(stderr, "stream_probe: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  madvise(q, bytes, MADV_HUGEPAGE);  // advisory
  std::memset(q, 1, bytes);
  return static_cast<unsigned char*>(q);
}

int usage(const char* why) {
  std::fprintf(stderr, "stream_probe: %s\nusage: stream_probe read|2to1|copy seq|two [PREFETCH_BYTES] [PIECE_BYTES]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "stream_probe: this CPU has no AVX-512F\n");
    return 1;
  }
  if (argc < 3) return usage("MODE and WALK are required");
  Probe p;
  const std::string mode = argv[1], how = argv[2];
  if (mode == "read") {
    p.mode = Mode::kRead;
  } else if (mode == "2to1") {
    p.mode = Mode::kTwoToOne;
  } else if (mode == "copy") {
    p.mode = Mode::kCopy;
  } else {
    return usage(("MODE must be read, 2to1 or copy, got '" + mode + "'").c_str());
  }
  if (how != "seq" && how != "two") return usage(("WALK must be seq or two, got '" + how + "'").c_str());
  p.two = how == "two";
  p.prefetch = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
  p.piece = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 4096;
  if (p.piece < 128 || p.piece % 128 != 0) return usage("PIECE_BYTES must be a positive multiple of 128");
  const std::size_t n = std::size_t{256} << 20;
  p.in = huge_alloc(n + p.prefetch + 128);
  p.out = huge_alloc(n);
  float sink = 0;
  std::vector<double> times;
  for (int round = 0; round < 10; ++round) {
    const double t0 = omp_get_wtime();
#pragma omp parallel
    {
      const std::size_t t = static_cast<std::size_t>(omp_get_num_threads());
      const std::size_t k = static_cast<std::size_t>(omp_get_thread_num());
      const std::size_t lo = n / t * k / 256 * 256, hi = k + 1 == t ? n : n / t * (k + 1) / 256 * 256;
      float s = 0;
      if (!p.two) {
        s = walk(p, lo, hi);
      } else {
        const std::size_t half = (hi - lo) / 2 / 128 * 128;
        for (std::size_t off = 0; off < half; off += p.piece) {
          const std::size_t len = std::min(p.piece, half - off);
          s += walk(p, lo + off, lo + off + len);
          s += walk(p, lo + half + off, lo + half + std::min(off + len, hi - lo - half));
        }
        if (hi - lo - half > half) s += walk(p, lo + 2 * half, hi);  // the odd tail of the second half
      }
#pragma omp atomic
      sink += s;
    }
    _mm_sfence();
    if (round > 0) times.push_back(omp_get_wtime() - t0);
  }
  if (sink == 1.5f) std::printf(" \n");  // keeps the read mode's loads
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];
  const double bytes = static_cast<double>(n) * (p.mode == Mode::kRead ? 1.0 : p.mode == Mode::kCopy ? 2.0 : 1.5);
  std::printf("%s %s prefetch %zu piece %zu threads %d: %.2f ms, %.1f GB/s (read %.1f GB/s)\n", mode.c_str(),
              how.c_str(), p.prefetch, p.piece, omp_get_max_threads(), t * 1e3, bytes / t / 1e9,
              static_cast<double>(n) / t / 1e9);
  return 0;
}
