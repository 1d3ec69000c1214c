// The AVX3_DL fused loop of bfloat16 -> int8 dynamic quantization with smooth scales (src/cpu/dynamic_quant.cpp,
// FusedRows: pass 2 of a row from its x' buffer with pass 1 of the next row), written out in intrinsics and
// timed alone on one core, with parts removed or replaced, on rows of H columns that stay in L1 (1024) or
// not (4096: 16 KiB of scales + 16 KiB of x' + 8 KiB of row against a 32 KiB L1d). This VM has no hardware
// counters, so the variants say where the cycles go. Not a test: timings only, medians of 9 runs.
//   [OX=bytes OS=.. OB=.. OY=..] build/release/bench/fused_loop_probe [GHz, for the cycles column; default 3.5]
// Each array is its own 4 KiB-aligned allocation plus an offset (environment, bytes): the rows (OX, default 0),
// the scales (OS, 0), the x' buffer (OB, 2048: the kernel keeps it 2 KiB past the scales) and the output
// (OY, 0). On Zen 4 the times move with these offsets (4K aliasing between the streams' loads and stores):
// docs/performance.md. The data are not the kernel's (the check never fails here); the loop body is.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

enum Variant {
  kFused,          // the kernel's loop
  kPass1Only,      // x * scales, min / max / NaN, x' stored (and the previous x' loaded)
  kNoCheckPack,    // kFused without the fixed-point check and the VBMI packing (an xor stored instead)
  kRecompute,      // no x' buffer: pass 2 widens and multiplies its row again (the loop before 2026-12-05)
  kRecompute16,    // kRecompute with the scales kept as bfloat16 (widened in the loop)
  kBuffer16,       // kFused with the scales kept as bfloat16
  kNoNaN,          // kFused without the NaN compare (not exact: NaN rows would be missed)
};

template <int H>
struct Data {
  std::uint16_t* x[4];
  float* sc;
  std::uint16_t* sc16;
  float* xbuf;
  std::int8_t* y[4];
};
static char* Arena(std::size_t bytes, long off) {
  char* p = static_cast<char*>(std::aligned_alloc(4096, bytes + 8192));
  return p + off;
}
template <int H, Variant V>
__attribute__((noinline, target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,fma"))) float Run(Data<H>& d,
                                                                                                  int reps) {
  __m512 vmin = _mm512_set1_ps(1e30f), vmax = _mm512_set1_ps(-1e30f);
  __mmask16 nan = 0;
  const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  // w = x' * rs + zc in [2^9, 2^10) (k = 14: 14 fraction bits), zc = 1.5 * 2^9 + 1/2 + 2^-12 as rint_fixed makes it
  const __m512 rs = _mm512_set1_ps(0.37f), zc = _mm512_set1_ps(768.5f + 0x1p-12f);
  const __m512i fmask = _mm512_set1_epi32(0x3FF8);
  const __m512i ctrl = _mm512_set1_epi64(0x2E0E2E0E2E0E2E0ELL);
  const __m512i idx = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                      0, 0, 0, 0, 0, 121, 57, 120, 56, 113, 49, 112, 48, 105, 41, 104, 40, 97, 33,
                                      96, 32, 89, 25, 88, 24, 81, 17, 80, 16, 73, 9, 72, 8, 65, 1, 64, 0);
  float* const xb = d.xbuf;
  long failed = 0;
  for (int r = 0; r < reps; ++r) {
    const std::uint16_t* x1 = d.x[r & 3];
    const std::uint16_t* x0 = d.x[(r + 3) & 3];
    std::int8_t* y = d.y[r & 3];
    for (int i = 0; i < H; i += 32) {
      __m512 s1, s2;
      if constexpr (V == kRecompute16 || V == kBuffer16) {
        const __m512i sb = _mm512_load_si512(d.sc16 + i);
        s1 = _mm512_castsi512_ps(_mm512_slli_epi32(sb, 16));
        s2 = _mm512_castsi512_ps(_mm512_and_si512(sb, hi16));
      } else {
        s1 = _mm512_load_ps(d.sc + i);
        s2 = _mm512_load_ps(d.sc + i + 16);
      }
      const __m512i b = _mm512_load_si512(x1 + i);  // 32 bfloat16: even elements in v, odd in w
      const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), s1);
      const __m512 w = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(b, hi16)), s2);
      if constexpr (V != kNoNaN) nan |= _mm512_cmp_ps_mask(v, w, _CMP_UNORD_Q);
      vmin = _mm512_min_ps(vmin, _mm512_min_ps(v, w));
      vmax = _mm512_max_ps(vmax, _mm512_max_ps(v, w));
      __m512 a, c;
      if constexpr (V == kRecompute || V == kRecompute16) {
        const __m512i b0 = _mm512_load_si512(x0 + i);
        a = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)), s1);
        c = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(b0, hi16)), s2);
      } else {
        a = _mm512_load_ps(xb + i);
        c = _mm512_load_ps(xb + i + 16);
        _mm512_store_ps(xb + i, v);
        _mm512_store_ps(xb + i + 16, w);
      }
      if constexpr (V == kPass1Only) continue;
      const __m512i w1 = _mm512_castps_si512(_mm512_fmadd_ps(a, rs, zc));
      const __m512i w2 = _mm512_castps_si512(_mm512_fmadd_ps(c, rs, zc));
      if constexpr (V == kNoCheckPack) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(y + i), _mm512_castsi512_si256(_mm512_xor_si512(w1, w2)));
        continue;
      }
      if (_mm512_mask_test_epi32_mask(_mm512_test_epi32_mask(w1, fmask), w2, fmask) != 0xFFFF) ++failed;
      const __m512i pa = _mm512_multishift_epi64_epi8(ctrl, w1), pb = _mm512_multishift_epi64_epi8(ctrl, w2);
      _mm256_store_si256(reinterpret_cast<__m256i*>(y + i),
                         _mm512_castsi512_si256(_mm512_permutex2var_epi8(pa, idx, pb)));
    }
    __asm__ volatile("" ::: "memory");
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_add_ps(vmin, vmax));
  return out[0] + static_cast<float>(nan) + static_cast<float>(failed);
}

template <int H, Variant V>
void Time(Data<H>& d, const char* name, double ghz) {
  const int reps = 20000 * 1024 / H;
  std::vector<double> t;
  volatile float sink = 0;
  for (int k = 0; k < 9; ++k) {
    const auto a = std::chrono::steady_clock::now();
    sink = sink + Run<H, V>(d, reps);
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  const double ns = t[4] / (static_cast<double>(reps) * H / 32) * 1e9;
  std::printf("H=%-5d %-58s %6.3f ns %6.2f cycles\n", H, name, ns, ns * ghz);
}

template <int H>
void All(double ghz) {
  auto* d = new Data<H>;
  const long ox = std::atol(std::getenv("OX") ? std::getenv("OX") : "0"), os = std::atol(std::getenv("OS") ? std::getenv("OS") : "0"),
             ob = std::atol(std::getenv("OB") ? std::getenv("OB") : "2048"), oy = std::atol(std::getenv("OY") ? std::getenv("OY") : "0");
  {
    char* px = Arena(4 * 2 * H, ox);
    for (int k = 0; k < 4; ++k) d->x[k] = reinterpret_cast<std::uint16_t*>(px + k * 2 * H);
    d->sc = reinterpret_cast<float*>(Arena(4 * H, os));
    d->sc16 = reinterpret_cast<std::uint16_t*>(Arena(2 * H, os));
    d->xbuf = reinterpret_cast<float*>(Arena(4 * H, ob));
    char* py = Arena(4 * H, oy);
    for (int k = 0; k < 4; ++k) d->y[k] = reinterpret_cast<std::int8_t*>(py + k * H);
  }
  std::mt19937 rng(1);
  for (auto& row : d->x)
    for (int i = 0; i < H; ++i) row[i] = static_cast<std::uint16_t>(0x3F80 + rng() % 128);
  for (int i = 0; i < H; ++i) {
    d->sc16[i] = static_cast<std::uint16_t>(0x3F80 + rng() % 128);
    d->sc[i] = 1.0f + static_cast<float>(rng() % 256) / 256.0f;
    d->xbuf[i] = 1.0f;
  }
  Time<H, kFused>(*d, "fused loop (the kernel's)", ghz);
  Time<H, kPass1Only>(*d, "pass 1 with the x' loads and stores only", ghz);
  Time<H, kNoCheckPack>(*d, "fused, without the check and the packing", ghz);
  Time<H, kNoNaN>(*d, "fused, without the NaN compare (inexact)", ghz);
  Time<H, kBuffer16>(*d, "fused, bfloat16 scales widened in the loop", ghz);
  Time<H, kRecompute>(*d, "no x' buffer: pass 2 multiplies again", ghz);
  Time<H, kRecompute16>(*d, "no x' buffer, bfloat16 scales", ghz);
  Time<H, kFused>(*d, "fused loop again", ghz);
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512vbmi")) {
    std::printf("skipped: this CPU has no AVX-512 VBMI (the loop is the AVX3_DL target's)\n");
    return 0;
  }
  const double ghz = argc > 1 ? std::atof(argv[1]) : 3.5;
  std::printf("ns and cycles (at %.2f GHz) per 32 elements, one thread\n", ghz);
  All<1024>(ghz);
  All<4096>(ghz);
}
