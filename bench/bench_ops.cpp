// Google Benchmark of the xquant operators on the seed documents' shapes and on small shapes, with a
// memcpy bandwidth probe using the same threads. bytes_per_second counts bytes read + bytes written per
// call. Run: build/release/bench/bench_ops --benchmark_min_time=0.2 (see docs/performance.md).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace xq = xquant;

namespace {

xq::Tensor random_tensor(xq::DType dt, const xq::Shape& shape, float range = 4.f) {
  xq::Tensor f(xq::DType::float32, shape);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-range, range);
  float* p = f.data<float>();
  for (std::int64_t i = 0; i < f.numel(); ++i) p[i] = u(rng);
  if (dt == xq::DType::float32) return f;
  xq::Tensor t(dt, shape);
  auto* q = t.data<std::uint16_t>();
  for (std::int64_t i = 0; i < f.numel(); ++i)
    q[i] = dt == xq::DType::float16 ? xq::float_to_half(p[i]) : xq::float_to_bfloat16(p[i]);
  return t;
}

xq::Tensor filled(const xq::Shape& shape, float v) {
  xq::Tensor t(xq::DType::float32, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  return t;
}

void set_bytes(benchmark::State& st, double bytes_per_call) {
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_call * static_cast<double>(st.iterations())));
}

// memcpy of n float32 by every thread on its own slice: the bandwidth line (bytes = read + write).
void BM_memcpy_probe(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  xq::Tensor a = random_tensor(xq::DType::float32, {n}), b(xq::DType::float32, {n});
  std::memset(b.data(), 0, b.nbytes());
  // Small copies stay on one thread, as xquant's kernels do below 256 KiB of traffic.
  const int t = 8 * n < (std::int64_t{1} << 18) ? 1 : xq::get_num_threads();
  for (auto _ : st) {
#pragma omp parallel num_threads(t)
    {
      const std::int64_t k = omp_get_thread_num(), T = omp_get_num_threads();
      const std::int64_t lo = n * k / T, hi = n * (k + 1) / T;
      std::memcpy(b.data<float>() + lo, a.data<float>() + lo, static_cast<std::size_t>(hi - lo) * 4);
    }
    benchmark::ClobberMemory();
  }
  set_bytes(st, 8.0 * static_cast<double>(n));
}

void BM_fake_quant_per_tensor(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  xq::Tensor x = random_tensor(xq::DType::float32, {n}), y(xq::DType::float32, {n}), amax = filled({1}, 3.f);
  xq::fake_tensor_quant_out(y, x, amax);  // warm-up: first-touch page faults and thread start are not the steady state
  for (auto _ : st) xq::fake_tensor_quant_out(y, x, amax);
  set_bytes(st, 8.0 * static_cast<double>(n));
}

// 16-bit in and out, Args {dtype, n} (float16: SPEC 1's float16 arithmetic).
void BM_fake_quant_per_tensor_16(benchmark::State& st) {
  const auto dt = static_cast<xq::DType>(st.range(0));
  const std::int64_t n = st.range(1);
  xq::Tensor x = random_tensor(dt, {n}), y(dt, {n}), amax = filled({1}, 3.f);
  xq::fake_tensor_quant_out(y, x, amax);  // warm-up
  for (auto _ : st) xq::fake_tensor_quant_out(y, x, amax);
  set_bytes(st, 4.0 * static_cast<double>(n));
}

void BM_fake_quant_per_tensor_alloc(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  xq::Tensor x = random_tensor(xq::DType::float32, {n}), amax = filled({1}, 3.f);
  benchmark::DoNotOptimize(xq::fake_tensor_quant(x, amax).data());  // warm-up
  for (auto _ : st) benchmark::DoNotOptimize(xq::fake_tensor_quant(x, amax).data());
  set_bytes(st, 8.0 * static_cast<double>(n));
}

void BM_fake_quant_axis(benchmark::State& st) {
  const std::int64_t axis = st.range(0);
  const xq::Shape shape = {32, 8, 512, 768};
  xq::Tensor x = random_tensor(xq::DType::float32, shape), y(xq::DType::float32, shape);
  xq::Tensor amax = filled({shape[static_cast<std::size_t>(axis)]}, 3.f);
  xq::fake_tensor_quant_with_axis_out(
      y, x, amax, axis);  // warm-up: first-touch page faults and thread start are not the steady state
  for (auto _ : st) xq::fake_tensor_quant_with_axis_out(y, x, amax, axis);
  set_bytes(st, 8.0 * static_cast<double>(x.numel()));
}

void BM_fake_quant_backward(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  xq::Tensor x = random_tensor(xq::DType::float32, {n}), g = random_tensor(xq::DType::float32, {n});
  xq::Tensor gi(xq::DType::float32, {n}), ga(xq::DType::float32, {1}), amax = filled({1}, 3.f);
  xq::fake_tensor_quant_backward_out(
      gi, ga.view(), g, x, amax,
      std::nullopt);  // warm-up: first-touch page faults and thread start are not the steady state
  for (auto _ : st) xq::fake_tensor_quant_backward_out(gi, ga.view(), g, x, amax, std::nullopt);
  set_bytes(st, 12.0 * static_cast<double>(n));
}

// range(1): rows of 4096 (4096: DRAM; 64: in cache, the kernel's compute speed)
void BM_quantize_per_channel(benchmark::State& st) {
  const auto q = static_cast<xq::QuantDType>(st.range(0));
  const xq::Shape shape = {st.range(1), 4096};
  xq::Tensor x = random_tensor(xq::DType::float32, shape);
  const bool div = q != xq::QuantDType::quint4x2;
  // int8 (div mode): per-channel on axis 0; int4 (mul mode): per-channel on the last axis
  xq::Tensor scales = filled({div ? shape[0] : shape[1]}, div ? 0.03f : 2.f);
  xq::Tensor y(xq::storage_dtype(q), xq::quantize_output_shape(shape, q));
  xq::quantize_out(y, x, scales, std::nullopt, q, div ? 0 : -1,
                   div);  // warm-up: first-touch page faults and thread start are not the steady state
  for (auto _ : st) xq::quantize_out(y, x, scales, std::nullopt, q, div ? 0 : -1, div);
  set_bytes(st, static_cast<double>(x.nbytes() + y.nbytes()));
}

void BM_dynamic_quant(benchmark::State& st) {
  const auto dt = static_cast<xq::DType>(st.range(0));
  const auto q = static_cast<xq::QuantDType>(st.range(1));
  const bool smooth = st.range(2) != 0;
  const std::int64_t rows = st.range(3), cols = st.range(4);
  xq::Tensor x = random_tensor(dt, {rows, cols});
  xq::Tensor sm = random_tensor(dt, {cols}, 1.f);
  xq::Tensor y(xq::storage_dtype(q), xq::quantize_output_shape({rows, cols}, q));
  xq::Tensor scale(xq::DType::float32, {rows}), offset(xq::DType::float32, {rows});
  xq::dynamic_quant_asymmetric_out(y, scale, offset, x,
                                   smooth ? std::optional<xq::ConstTensorView>(sm.view()) : std::nullopt, std::nullopt,
                                   q);  // warm-up
  for (auto _ : st)
    xq::dynamic_quant_asymmetric_out(
        y, scale, offset, x, smooth ? std::optional<xq::ConstTensorView>(sm.view()) : std::nullopt, std::nullopt, q);
  set_bytes(st, static_cast<double>(x.nbytes() + y.nbytes() + 8 * rows));
}

void BM_acts_ulq(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  xq::Tensor x = random_tensor(xq::DType::float32, {n});
  xq::Tensor cmin = filled({1}, -1.5f), cmax = filled({1}, 2.f);
  xq::Tensor y(xq::DType::float32, {n}), mn(xq::DType::float32, {n}), mx(xq::DType::float32, {n}),
      loss(xq::DType::float32, {n});
  xq::acts_ulq_out(y, mn, mx, loss, x, cmin,
                   cmax);  // warm-up: first-touch page faults and thread start are not the steady state
  for (auto _ : st) xq::acts_ulq_out(y, mn, mx, loss, x, cmin, cmax);
  set_bytes(st, 20.0 * static_cast<double>(n));
}

void BM_acts_ulq_backward(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  xq::Tensor x = random_tensor(xq::DType::float32, {n}), dy = random_tensor(xq::DType::float32, {n});
  xq::Tensor cmin = filled({1}, -1.5f), cmax = filled({1}, 2.f);
  auto f = xq::acts_ulq(x, cmin, cmax);
  xq::Tensor gx(xq::DType::float32, {n}), gmin(xq::DType::float32, {1}), gmax(xq::DType::float32, {1});
  xq::acts_ulq_backward_out(gx, gmin, gmax, dy, cmin, cmax, f.clamp_min_mask, f.clamp_max_mask,
                            f.x_clamped_loss);  // warm-up
  for (auto _ : st)
    xq::acts_ulq_backward_out(gx, gmin, gmax, dy, cmin, cmax, f.clamp_min_mask, f.clamp_max_mask, f.x_clamped_loss);
  set_bytes(st, 20.0 * static_cast<double>(n));
}

void BM_tile_quant(benchmark::State& st) {
  xq::Tensor src = random_tensor(xq::DType::float32, {64, 128}, 40.f), scale = filled({64, 1}, 4.f);
  xq::Tensor out(xq::DType::int8, {64, 128});
  xq::tile_quant(xq::TileView{out.data(), xq::DType::int8, 64, 128, 128},
                 xq::ConstTileView(src.data(), xq::DType::float32, 64, 128, 128),
                 xq::ConstTileView(scale.data(), xq::DType::float32, 64, 1, 1));  // warm-up
  for (auto _ : st)
    xq::tile_quant(xq::TileView{out.data(), xq::DType::int8, 64, 128, 128},
                   xq::ConstTileView(src.data(), xq::DType::float32, 64, 128, 128),
                   xq::ConstTileView(scale.data(), xq::DType::float32, 64, 1, 1));
  set_bytes(st, 5.0 * 64 * 128);
}

// ---- small calls: [8, 128] float32, per-tensor against per-channel (the per-call setup cost) ----
// Each operator's per-tensor case is its reference: docs/performance.md, "Small calls".
constexpr std::int64_t kSmallRows = 8, kSmallCols = 128;

// axis < 0: per-tensor; otherwise per-channel on that axis.
void BM_small_fake_quant(benchmark::State& st, std::int64_t axis) {
  const xq::Shape shape = {kSmallRows, kSmallCols};
  xq::Tensor x = random_tensor(xq::DType::float32, shape), y(xq::DType::float32, shape);
  xq::Tensor amax = filled({axis < 0 ? 1 : shape[static_cast<std::size_t>(axis)]}, 3.f);
  auto call = [&] {
    if (axis < 0)
      xq::fake_tensor_quant_out(y, x, amax);
    else
      xq::fake_tensor_quant_with_axis_out(y, x, amax, axis);
  };
  call();  // warm-up
  for (auto _ : st) call();
  set_bytes(st, 8.0 * static_cast<double>(x.numel()));
}

// axis < 0: per-tensor (one scale); otherwise per-channel on that axis. int8: div mode; quint4x2: mul mode.
void BM_small_quantize(benchmark::State& st, xq::QuantDType q, std::int64_t axis) {
  const xq::Shape shape = {kSmallRows, kSmallCols};
  const bool div = q != xq::QuantDType::quint4x2;
  xq::Tensor x = random_tensor(xq::DType::float32, shape);
  xq::Tensor scales = filled({axis < 0 ? 1 : shape[static_cast<std::size_t>(axis)]}, div ? 0.03f : 2.f);
  xq::Tensor y(xq::storage_dtype(q), xq::quantize_output_shape(shape, q));
  const std::int64_t ax = axis < 0 ? -1 : axis;
  xq::quantize_out(y, x, scales, std::nullopt, q, ax, div);  // warm-up
  for (auto _ : st) xq::quantize_out(y, x, scales, std::nullopt, q, ax, div);
  set_bytes(st, static_cast<double>(x.nbytes() + y.nbytes()));
}

// per_channel: scale / offset of length 128 (the last axis), else one scale and offset.
void BM_small_anti_quant(benchmark::State& st, xq::QuantDType src, bool per_channel, xq::DType dst = xq::DType::float32,
                         bool with_offset = true) {
  const bool int4 = src == xq::QuantDType::quint4x2;
  xq::Tensor x(int4 ? xq::DType::int32 : xq::DType::int8, {kSmallRows, int4 ? kSmallCols / 8 : kSmallCols});
  std::mt19937 rng(1);
  auto* bytes = static_cast<unsigned char*>(x.data());
  for (std::size_t i = 0; i < x.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  const std::int64_t h = per_channel ? kSmallCols : 1;
  xq::Tensor scale = filled({h}, 0.5f), offset = filled({h}, 1.f);
  xq::Tensor out(dst, {kSmallRows, kSmallCols});
  const std::optional<xq::ConstTensorView> off =
      with_offset ? std::optional<xq::ConstTensorView>(offset.view()) : std::nullopt;
  xq::anti_quant_out(out, x, scale, off, src);  // warm-up
  for (auto _ : st) xq::anti_quant_out(out, x, scale, off, src);
  set_bytes(st, static_cast<double>(x.nbytes() + out.nbytes()));
}

// Args {dst dtype, src QuantDType, rows, cols}: per-channel scale and offset (the last axis), random codes.
void BM_anti_quant(benchmark::State& st) {
  const auto dst = static_cast<xq::DType>(st.range(0));
  const auto src = static_cast<xq::QuantDType>(st.range(1));
  const std::int64_t rows = st.range(2), cols = st.range(3);
  const bool int4 = src == xq::QuantDType::quint4x2;
  xq::Tensor x(int4 ? xq::DType::int32 : xq::DType::int8, {rows, int4 ? cols / 8 : cols});
  std::mt19937 rng(1);
  auto* bytes = static_cast<unsigned char*>(x.data());
  for (std::size_t i = 0; i < x.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  xq::Tensor scale = random_tensor(xq::DType::float32, {cols}, 0.05f), offset = random_tensor(xq::DType::float32, {cols});
  xq::Tensor out(dst, {rows, cols});
  xq::anti_quant_out(out, x, scale, offset, src);  // warm-up
  for (auto _ : st) xq::anti_quant_out(out, x, scale, offset, src);
  set_bytes(st, static_cast<double>(x.nbytes() + out.nbytes()));
}

constexpr std::int64_t kBig = 100663296;  // the seed's global fake-quant shape
const auto f32 = static_cast<std::int64_t>(xq::DType::float32);
const auto bf16 = static_cast<std::int64_t>(xq::DType::bfloat16);
const auto i8 = static_cast<std::int64_t>(xq::QuantDType::qint8);
const auto i4 = static_cast<std::int64_t>(xq::QuantDType::quint4x2);

BENCHMARK(BM_memcpy_probe)->Arg(kBig)->Arg(1024)->Arg(4096)->Arg(65536)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fake_quant_per_tensor)
    ->Arg(kBig)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(65536)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fake_quant_per_tensor_16)
    ->ArgsProduct({{static_cast<std::int64_t>(xq::DType::float16), bf16}, {kBig, 65536}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fake_quant_per_tensor_alloc)->Arg(kBig)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fake_quant_axis)->Arg(1)->Arg(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fake_quant_backward)->Arg(kBig)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fake_quant_backward)->Arg(32768)->UseRealTime()->Unit(benchmark::kMicrosecond);  // in cache
BENCHMARK(BM_quantize_per_channel)
    ->Args({i8, 4096})
    ->Args({i4, 4096})
    ->Args({i8, 64})
    ->Args({i4, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_dynamic_quant)
    ->Args({bf16, i8, 0, 8192, 4096})
    ->Args({f32, i8, 0, 8192, 4096})
    ->Args({bf16, i4, 0, 8192, 4096})
    ->Args({bf16, i8, 1, 8192, 4096})
    ->Args({f32, i4, 1, 8192, 4096})
    ->Args({f32, i8, 0, 1, 1024})
    ->Args({f32, i8, 0, 1, 4096})
    ->Args({bf16, i8, 1, 1, 4096})  // one decode token with smooth scales: the scales' widening is half the work
    // in cache (L2): the kernels' compute speed, without DRAM
    ->Args({bf16, i8, 0, 64, 4096})
    ->Args({bf16, i4, 0, 64, 4096})
    ->Args({bf16, i8, 1, 64, 4096})
    ->Args({bf16, i8, 1, 1024, 4096})  // 8 MiB of input: from L3, between in cache and DRAM
    ->Args({f32, i8, 0, 32, 4096})
    ->Args({f32, i4, 1, 32, 4096})
    // narrow rows in cache: the per-row work (reductions, scale / offset, the fixed-point constants) shows
    ->Args({bf16, i8, 0, 256, 1024})
    ->Args({bf16, i8, 1, 256, 1024})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_acts_ulq)->Arg(kBig)->Arg(4096)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_acts_ulq_backward)->Arg(kBig)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_acts_ulq_backward)->Arg(32768)->UseRealTime()->Unit(benchmark::kMicrosecond);  // in cache
BENCHMARK(BM_tile_quant)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_fake_quant, per_tensor, -1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_fake_quant, axis0, 0)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_fake_quant, axis1, 1)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_quantize, int8_per_tensor, xq::QuantDType::qint8, -1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_quantize, int8_axis0, xq::QuantDType::qint8, 0)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_quantize, int8_axis1, xq::QuantDType::qint8, 1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_quantize, int4_per_tensor, xq::QuantDType::quint4x2, -1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_quantize, int4_last_axis, xq::QuantDType::quint4x2, 1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_anti_quant, int8_per_tensor, xq::QuantDType::qint8, false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_anti_quant, int8_per_channel, xq::QuantDType::qint8, true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_anti_quant, int4_per_tensor, xq::QuantDType::quint4x2, false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_anti_quant, int4_per_channel, xq::QuantDType::quint4x2, true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
// the case of bench/py_overhead.py: int4 per channel -> bfloat16, float32 scale, no offset
BENCHMARK_CAPTURE(BM_small_anti_quant, int4_per_tensor_bf16_no_offset, xq::QuantDType::quint4x2, false,
                  xq::DType::bfloat16, false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_small_anti_quant, int4_per_channel_bf16_no_offset, xq::QuantDType::quint4x2, true,
                  xq::DType::bfloat16, false)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
// anti_quant in cache (one thread: 256 KiB of codes) and from memory, to float16 / bfloat16 / float32.
BENCHMARK(BM_anti_quant)
    ->ArgsProduct({{static_cast<std::int64_t>(xq::DType::float16), bf16, f32}, {i8, i4}, {16, 64}, {4096}})
    ->Args({bf16, i8, 8192, 4096})
    ->Args({bf16, i4, 8192, 4096})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_dynamic_quant)
    ->Name("BM_small_dynamic_quant")
    ->Args({f32, i8, 0, kSmallRows, kSmallCols})
    ->Args({bf16, i8, 0, kSmallRows, kSmallCols})
    ->Args({f32, i4, 0, kSmallRows, kSmallCols})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// ---- ratio mode: each out-variant interleaved with the memcpy probe ----
// This machine's memory bandwidth drifts by 2x within minutes (it is shared), so a probe measured once
// cannot be compared with an operator measured later. Here every round runs the operator and then the
// probe; the ratio of the medians is the fraction of memcpy bandwidth.
struct RatioCase {
  const char* name;
  double bytes;       // read + written per call
  double read_bytes;  // of which read
  std::function<void()> run;
};

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_ratios(const char* json_path, const char* filter) {
  const std::int64_t n = kBig;
  xq::Tensor src = random_tensor(xq::DType::float32, {n}), dst(xq::DType::float32, {n});
  std::memset(dst.data(), 0, dst.nbytes());
  const int threads = xq::get_num_threads();
  auto probe = [&] {
#pragma omp parallel num_threads(threads)
    {
      const std::int64_t k = omp_get_thread_num(), T = omp_get_num_threads();
      const std::int64_t lo = n * k / T, hi = n * (k + 1) / T;
      std::memcpy(dst.data<float>() + lo, src.data<float>() + lo, static_cast<std::size_t>(hi - lo) * 4);
    }
  };
  const double probe_bytes = 8.0 * static_cast<double>(n);
  // The read probe: the same source read once (eight independent accumulators, one load per 8 bytes).
  // Reads and writes share a memory system unequally (on some machines one core stream reads at well
  // under half of what memcpy moves in both directions), so a kernel that mostly reads is bounded by
  // this probe rather than by memcpy: see the bound column below.
  std::uint64_t read_sink = 0;
  auto read_probe = [&] {
    std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(^ : total)
    {
      const std::int64_t k = omp_get_thread_num(), T = omp_get_num_threads();
      const std::int64_t words = n / 2;  // n floats = n / 2 64-bit words
      const std::int64_t lo = words * k / T / 8 * 8, hi = k + 1 == T ? words : words * (k + 1) / T / 8 * 8;
      const auto* w = reinterpret_cast<const std::uint64_t*>(src.data<float>());
      std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
      for (std::int64_t i = lo; i + 8 <= hi; i += 8) {
        a0 ^= w[i];
        a1 ^= w[i + 1];
        a2 ^= w[i + 2];
        a3 ^= w[i + 3];
        a4 ^= w[i + 4];
        a5 ^= w[i + 5];
        a6 ^= w[i + 6];
        a7 ^= w[i + 7];
      }
      total ^= a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
    }
    read_sink ^= total;
  };
  const double read_probe_bytes = 4.0 * static_cast<double>(n);
  // operands
  xq::Tensor x = random_tensor(xq::DType::float32, {n}), y(xq::DType::float32, {n}),
             g = random_tensor(xq::DType::float32, {n});
  xq::Tensor amax = filled({1}, 3.f), ga(xq::DType::float32, {1});
  xq::Tensor xh = random_tensor(xq::DType::float16, {n}), yh(xq::DType::float16, {n});
  const xq::Shape s4 = {32, 8, 512, 768};
  xq::TensorView x4(x.data(), xq::DType::float32, s4), y4(y.data(), xq::DType::float32, s4);
  xq::Tensor a8 = filled({8}, 3.f), a768 = filled({768}, 3.f);
  xq::Tensor m = random_tensor(xq::DType::float32, {4096, 4096}), m_i8(xq::DType::int8, {4096, 4096}),
             m_i4(xq::DType::int32, {4096, 512});
  xq::Tensor sc = filled({4096}, 0.03f), sc4 = filled({4096}, 2.f);
  xq::Tensor xb = random_tensor(xq::DType::bfloat16, {8192, 4096}),
             xf = random_tensor(xq::DType::float32, {8192, 4096});
  xq::Tensor smb = random_tensor(xq::DType::bfloat16, {4096}, 1.f),
             smf = random_tensor(xq::DType::float32, {4096}, 1.f);
  xq::Tensor dy8(xq::DType::int8, {8192, 4096}), dy4(xq::DType::int32, {8192, 512});
  xq::Tensor dsc(xq::DType::float32, {8192}), dof(xq::DType::float32, {8192});
  xq::Tensor cmin = filled({1}, -1.5f), cmax = filled({1}, 2.f);
  xq::Tensor o1(xq::DType::float32, {n}), o2(xq::DType::float32, {n}), o3(xq::DType::float32, {n});
  xq::Tensor gmin(xq::DType::float32, {1}), gmax(xq::DType::float32, {1});
  xq::acts_ulq_out(y, o1, o2, o3, x, cmin, cmax);
  xq::Tensor mn = xq::Tensor::copy_of(o1), mx = xq::Tensor::copy_of(o2), loss = xq::Tensor::copy_of(o3);
  // anti_quant reads dynamic quantization's outputs (filled below, before its rows); tile_quant quantizes
  // xf as one [8192, 4096] tile with per-row scale and offset.
  xq::Tensor aq_out(xq::DType::bfloat16, {8192, 4096});
  xq::Tensor aq_sc = random_tensor(xq::DType::float32, {4096}, 0.05f), aq_of = random_tensor(xq::DType::float32, {4096});
  xq::Tensor tq_out(xq::DType::uint8, {8192, 4096});
  xq::Tensor tq_sc = filled({8192, 1}, 40.f), tq_of = filled({8192, 1}, 128.f);
  const double N = static_cast<double>(n), M = 4096.0 * 4096.0, T = 8192.0 * 4096.0;
  using Q = xq::QuantDType;
  auto dyn = [&](const xq::Tensor& xin, const xq::Tensor* sm, Q q) {
    xq::Tensor& yo = q == Q::qint8 ? dy8 : dy4;
    xq::dynamic_quant_asymmetric_out(
        yo, dsc, dof, xin, sm ? std::optional<xq::ConstTensorView>(sm->view()) : std::nullopt, std::nullopt, q);
  };
  const std::vector<RatioCase> cases = {
      {"fake_tensor_quant_out [100663296] f32", 8 * N, 4 * N, [&] { xq::fake_tensor_quant_out(y, x, amax); }},
      {"fake_tensor_quant_out [100663296] f16", 4 * N, 2 * N, [&] { xq::fake_tensor_quant_out(yh, xh, amax); }},
      {"fake_tensor_quant_with_axis_out axis=1 [32,8,512,768]", 8 * N, 4 * N,
       [&] { xq::fake_tensor_quant_with_axis_out(y4, x4, a8, 1); }},
      {"fake_tensor_quant_with_axis_out axis=3 [32,8,512,768]", 8 * N, 4 * N,
       [&] { xq::fake_tensor_quant_with_axis_out(y4, x4, a768, 3); }},
      {"fake_tensor_quant_backward_out [100663296] + grad_amax", 12 * N, 8 * N,
       [&] { xq::fake_tensor_quant_backward_out(o1, ga.view(), g, x, amax, std::nullopt); }},
      {"quantize_out per-channel int8 [4096,4096]", 5 * M, 4 * M,
       [&] { xq::quantize_out(m_i8, m, sc, std::nullopt, Q::qint8, 0, true); }},
      {"quantize_out per-channel quint4x2 [4096,4096]", 4.5 * M, 4 * M,
       [&] { xq::quantize_out(m_i4, m, sc4, std::nullopt, Q::quint4x2, -1, false); }},
      {"dynamic pertoken bf16->int8 [8192,4096]", 3 * T, 2 * T, [&] { dyn(xb, nullptr, Q::qint8); }},
      {"dynamic pertoken bf16->int8 smooth", 3 * T, 2 * T, [&] { dyn(xb, &smb, Q::qint8); }},
      {"dynamic pertoken bf16->int4", 2.5 * T, 2 * T, [&] { dyn(xb, nullptr, Q::quint4x2); }},
      {"dynamic pertoken f32->int8", 5 * T, 4 * T, [&] { dyn(xf, nullptr, Q::qint8); }},
      {"dynamic pertoken f32->int4 smooth", 4.5 * T, 4 * T, [&] { dyn(xf, &smf, Q::quint4x2); }},
      {"anti_quant_out per-channel int8 [8192,4096] -> bf16", 3 * T, T,
       [&] { xq::anti_quant_out(aq_out, dy8, aq_sc, aq_of, Q::qint8); }},
      {"anti_quant_out per-channel int4 [8192,4096] -> bf16", 2.5 * T, 0.5 * T,
       [&] { xq::anti_quant_out(aq_out, dy4, aq_sc, aq_of, Q::quint4x2); }},
      {"tile_quant ASYM [8192,4096] f32 -> uint8", 5 * T, 4 * T,
       [&] {
         xq::tile_quant(xq::TileView{tq_out.data(), xq::DType::uint8, 8192, 4096, 4096},
                        xq::ConstTileView(xf.data(), xq::DType::float32, 8192, 4096, 4096),
                        xq::ConstTileView(tq_sc.data(), xq::DType::float32, 8192, 1, 1), xq::QuantMode::ASYM,
                        xq::ConstTileView(tq_of.data(), xq::DType::float32, 8192, 1, 1));
       }},
      {"acts_ulq_out [100663296] f32 (4 outputs)", 20 * N, 4 * N,
       [&] { xq::acts_ulq_out(y, o1, o2, o3, x, cmin, cmax); }},
      {"acts_ulq_backward_out [100663296] f32", 20 * N, 16 * N,
       [&] { xq::acts_ulq_backward_out(o1, gmin, gmax, g, cmin, cmax, mn, mx, loss); }},
  };
  dyn(xb, nullptr, Q::qint8);  // anti_quant's inputs: real quantized values
  dyn(xb, nullptr, Q::quint4x2);
  std::printf(
      "memcpy probe: %d threads, %.0f MB copied per call; read probe: %.0f MB read per call; %d interleaved "
      "rounds per case (medians)\n",
      threads, 4.0 * N / 1e6, 4.0 * N / 1e6, 15);
  std::printf(
      "bound: the time the case's own bytes need at the probes' rates, max(read / read GB/s, (read + write) /"
      " copy GB/s)\n");
  std::printf("%-58s %9s %8s %9s %9s %7s %7s\n", "operator (out-variant)", "ms", "GB/s", "copy GB/s", "read GB/s",
              "memcpy", "bound");
  std::FILE* js = json_path ? std::fopen(json_path, "w") : nullptr;
  if (js)
    std::fprintf(js, "{\"threads\": %d, \"simd_target\": \"%s\", \"rows\": [\n", threads, xq::simd_target().c_str());
  bool first = true;
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const RatioCase& c = cases[k];
    if (filter != nullptr && std::strstr(c.name, filter) == nullptr) continue;
    c.run();  // warm-up
    probe();
    read_probe();
    std::vector<double> top, tprobe, tread;
    for (int r = 0; r < 15; ++r) {
      top.push_back(seconds(c.run));
      tprobe.push_back(seconds(probe));
      tread.push_back(seconds(read_probe));
    }
    const double to = median(top), tp = median(tprobe), tr = median(tread);
    const double gbs = c.bytes / to / 1e9, pgbs = probe_bytes / tp / 1e9, rgbs = read_probe_bytes / tr / 1e9;
    const double bound_s = std::max(c.read_bytes / (rgbs * 1e9), c.bytes / (pgbs * 1e9));
    std::printf("%-58s %9.3f %8.1f %9.1f %9.1f %6.0f%% %6.0f%%\n", c.name, to * 1e3, gbs, pgbs, rgbs, 100 * gbs / pgbs,
                100 * bound_s / to);
    if (js)
      std::fprintf(js,
                   "%s  {\"case\": \"%s\", \"ms\": %.4f, \"gbs\": %.2f, \"memcpy_gbs\": %.2f, \"read_gbs\": %.2f, "
                   "\"ratio\": %.3f, \"bound_ratio\": %.3f}",
                   first ? "" : ",\n", c.name, to * 1e3, gbs, pgbs, rgbs, gbs / pgbs, bound_s / to);
    first = false;
  }
  if (read_sink == 42) std::printf(" \n");  // keeps the read probe's loads
  if (js) {
    std::fprintf(js, "\n]}\n");
    std::fclose(js);
  }
  return 0;
}

}  // namespace

// ---- quantized matmuls (docs/semantics.md section 9): xquant against a naive loop ----
// Args: {M, K, N}. Decode M = 1..16, prefill M = 2048; K = N = 4096 (a Llama-7B projection).
namespace mm {

xq::Tensor random_int8(const xq::Shape& shape, int lo = -128, int span = 256) {
  xq::Tensor t(xq::DType::int8, shape);
  std::mt19937 rng(7);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<std::int8_t>()[i] = static_cast<std::int8_t>(lo + static_cast<int>(rng() % span));
  return t;
}

// W8A8: x1 int8 [M, K], weight int8 stored [N, K] (transpose_x2, as vllm-ascend passes it), per-channel
// float32 scale, per-token scale, bfloat16 output.
void BM_quant_matmul(benchmark::State& st) {
  const std::int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  xq::Tensor x1 = random_int8({M, K}), w = random_int8({N, K});
  xq::Tensor s = random_tensor(xq::DType::float32, {N}, 0.01f), p = random_tensor(xq::DType::float32, {M}, 0.1f);
  xq::Tensor out(xq::DType::bfloat16, {M, N});
  xq::QuantMatmulOptions o;
  o.transpose_x2 = true;
  o.pertoken_scale = p.view();
  for (auto _ : st) {
    xq::quant_matmul_out(out, x1, w, s, o);
    benchmark::ClobberMemory();
  }
  st.counters["GOPS"] = benchmark::Counter(2.0 * static_cast<double>(M * K * N) * static_cast<double>(st.iterations()),
                                           benchmark::Counter::kIsRate);
}

// The same problem as a plain scalar loop: int32 dot products, then the epilogue (the baseline a
// user would write without a GEMM library).
void BM_quant_matmul_naive(benchmark::State& st) {
  const std::int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  xq::Tensor x1 = random_int8({M, K}), w = random_int8({N, K});
  xq::Tensor s = random_tensor(xq::DType::float32, {N}, 0.01f), p = random_tensor(xq::DType::float32, {M}, 0.1f);
  xq::Tensor out(xq::DType::bfloat16, {M, N});
  const auto* a = x1.data<std::int8_t>();
  const auto* b = w.data<std::int8_t>();
  for (auto _ : st) {
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        std::int32_t acc = 0;
        for (std::int64_t k = 0; k < K; ++k) acc += a[m * K + k] * b[n * K + k];
        out.data<std::uint16_t>()[m * N + n] =
            xq::float_to_bfloat16(static_cast<float>(acc) * s.data<float>()[n] * p.data<float>()[m]);
      }
    benchmark::ClobberMemory();
  }
  st.counters["GOPS"] = benchmark::Counter(2.0 * static_cast<double>(M * K * N) * static_cast<double>(st.iterations()),
                                           benchmark::Counter::kIsRate);
}

// W8A16 / W4A16: x float16 [M, K], weight int8 [K, N] or int4 [K, N / 8], per-channel scale and offset.
void BM_weight_quant_matmul(benchmark::State& st) {
  const std::int64_t M = st.range(0), K = st.range(1), N = st.range(2), int4 = st.range(3);
  xq::Tensor x = random_tensor(xq::DType::float16, {M, K}, 1.f);
  xq::Tensor w8 = random_int8({K, N}, int4 ? -8 : -128, int4 ? 16 : 256);
  xq::Tensor w4;
  if (int4) {
    xq::Tensor wi(xq::DType::int32, {K, N});
    const std::int8_t* w = w8.data<std::int8_t>();
    for (std::int64_t i = 0; i < wi.numel(); ++i) wi.data<std::int32_t>()[i] = w[i];
    w4 = xq::convert_weight_to_int4pack(wi);
  }
  const xq::ConstTensorView w = int4 ? xq::ConstTensorView(w4) : xq::ConstTensorView(w8);
  xq::Tensor s = random_tensor(xq::DType::float16, {N}, 0.01f), o = random_tensor(xq::DType::float16, {N}, 4.f);
  xq::Tensor out(xq::DType::float16, {M, N});
  xq::WeightQuantMatmulOptions opt;
  opt.antiquant_offset = o.view();
  for (auto _ : st) {
    xq::weight_quant_batchmatmul_out(out, x, w, s, opt);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(M * K * N) * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

// The same as a naive loop: dequantize the weight to float, then a float32 triple loop.
void BM_weight_quant_matmul_naive(benchmark::State& st) {
  const std::int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  xq::Tensor x = random_tensor(xq::DType::float16, {M, K}, 1.f);
  xq::Tensor w = random_int8({K, N});
  xq::Tensor s = random_tensor(xq::DType::float32, {N}, 0.01f), o = random_tensor(xq::DType::float32, {N}, 4.f);
  xq::Tensor out(xq::DType::float16, {M, N});
  std::vector<float> wf(static_cast<std::size_t>(K * N)), xf(static_cast<std::size_t>(M * K)),
      acc(static_cast<std::size_t>(N));
  for (auto _ : st) {
    for (std::int64_t i = 0; i < K * N; ++i)
      wf[i] = (static_cast<float>(w.data<std::int8_t>()[i]) + o.data<float>()[i % N]) * s.data<float>()[i % N];
    for (std::int64_t i = 0; i < M * K; ++i) xf[i] = xq::half_to_float(x.data<std::uint16_t>()[i]);
    for (std::int64_t m = 0; m < M; ++m) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (std::int64_t k = 0; k < K; ++k)
        for (std::int64_t n = 0; n < N; ++n) acc[n] += xf[m * K + k] * wf[k * N + n];
      for (std::int64_t n = 0; n < N; ++n) out.data<std::uint16_t>()[m * N + n] = xq::float_to_half(acc[n]);
    }
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(M * K * N) * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace mm

BENCHMARK(mm::BM_quant_matmul)
    ->Args({1, 4096, 4096})
    ->Args({4, 4096, 4096})
    ->Args({16, 4096, 4096})
    ->Args({2048, 4096, 4096})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(mm::BM_quant_matmul_naive)
    ->Args({1, 4096, 4096})
    ->Args({16, 4096, 4096})
    ->Args({256, 4096, 4096})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(mm::BM_weight_quant_matmul)
    ->Args({1, 4096, 4096, 0})
    ->Args({4, 4096, 4096, 0})
    ->Args({16, 4096, 4096, 0})
    ->Args({1, 4096, 4096, 1})
    ->Args({4, 4096, 4096, 1})
    ->Args({16, 4096, 4096, 1})
    ->Args({2048, 4096, 4096, 0})
    ->Args({2048, 4096, 4096, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(mm::BM_weight_quant_matmul_naive)
    ->Args({1, 4096, 4096})
    ->Args({16, 4096, 4096})
    ->Args({256, 4096, 4096})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  // bench_ops --ratios [FILE.json] [--filter SUBSTRING]: the interleaved operator / memcpy table
  // (docs/performance.md), optionally only the cases whose name contains SUBSTRING.
  if (argc >= 2 && std::strcmp(argv[1], "--ratios") == 0) {
    const char* json = nullptr;
    const char* filter = nullptr;
    for (int i = 2; i < argc; ++i) {
      if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
        filter = argv[++i];
      else
        json = argv[i];
    }
    return run_ratios(json, filter);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
