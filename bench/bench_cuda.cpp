// CUDA benchmark (scripts/device-check): every operator family with a CUDA kernel on a large case, timed
// with CUDA events (median of the repetitions, including the operator's host-side work: validation, the
// parameter upload and, where the operator reads a parameter tensor on the host, that copy), against the
// same run's device-to-device cudaMemcpy bandwidth. Before timing, each case's CUDA output is compared
// bit for bit with the CPU backend's (a failed comparison makes the exit status 1), so that this program
// checks correctness even where GoogleTest is not installed.
//
//   bench_cuda [--quick]      writes bench_cuda.json and bench_cuda.md into $OUT (if set), and the table
//                             to stdout
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace {

using namespace xquant;

#define CK(call)                                                              \
  do {                                                                        \
    const cudaError_t e_ = (call);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                           \
    }                                                                         \
  } while (0)

Tensor host_random(DType dt, Shape shape, std::uint32_t seed, float spread) {
  Tensor t(dt, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    float v = u(rng);
    if (i % 97 == 0) v = std::nearbyint(v) + 0.5f;  // ties
    switch (dt) {
      case DType::float32:
        t.data<float>()[i] = v;
        break;
      case DType::float16:
        t.data<std::uint16_t>()[i] = float_to_half(v);
        break;
      case DType::bfloat16:
        t.data<std::uint16_t>()[i] = float_to_bfloat16(v);
        break;
      case DType::int8:
        t.data<std::int8_t>()[i] = static_cast<std::int8_t>(rng());
        break;
      default:
        break;
    }
  }
  return t;
}

Tensor to_dev(const ConstTensorView& h) {
  Tensor d(h.dtype, h.shape, Device::cuda());
  if (h.nbytes() > 0) CK(cudaMemcpy(d.data(), h.data, h.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

bool same(const ConstTensorView& host, const ConstTensorView& dev) {
  std::vector<unsigned char> b(dev.nbytes());
  CK(cudaDeviceSynchronize());
  if (!b.empty()) CK(cudaMemcpy(b.data(), dev.data, b.size(), cudaMemcpyDeviceToHost));
  return host.nbytes() == dev.nbytes() && std::memcmp(host.data, b.data(), b.size()) == 0;
}

double median_ms(const std::function<void()>& f, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();  // warm-up
  CK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string name;
  double bytes;  // read + written
  double ms;
  double memcpy_ms;  // cudaMemcpy D2D moving the same read + written bytes
  bool exact;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (!cuda_available()) {
    std::printf("bench_cuda: no CUDA device: %s\n", cuda_unavailable_reason().c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const std::int64_t R = quick ? 1024 : 8192, C = quick ? 1024 : 8192;  // 64 Mi elements
  const int reps = quick ? 5 : 21;
  set_backend(Backend::cpu);
  std::vector<Row> rows;

  // Device-to-device copy bandwidth of `bytes` moved (half read, half written).
  auto memcpy_ms = [&](double moved) {
    const std::size_t n = static_cast<std::size_t>(moved / 2);
    void *s = nullptr, *d = nullptr;
    CK(cudaMalloc(&s, n));
    CK(cudaMalloc(&d, n));
    const double ms = median_ms([&] { CK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice)); }, reps);
    CK(cudaFree(s));
    CK(cudaFree(d));
    return ms;
  };
  auto add = [&](const std::string& name, double moved, bool exact, const std::function<void()>& f) {
    const double ms = median_ms(f, reps);
    rows.push_back({name, moved, ms, memcpy_ms(moved), exact});
    std::fprintf(stderr, "%-52s %8.3f ms %s\n", name.c_str(), ms, exact ? "exact" : "MISMATCH");
  };

  const Shape shape{R, C};
  const double n = static_cast<double>(R * C);
  {  // fake_tensor_quant, float32, per tensor
    const Tensor x = host_random(DType::float32, shape, 1, 300.0f);
    Tensor amax_pos(DType::float32, {1});
    amax_pos.data<float>()[0] = 200.0f;
    const Tensor dx = to_dev(x), da = to_dev(amax_pos);
    Tensor dy(DType::float32, shape, Device::cuda());
    fake_tensor_quant_out(dy, dx, da);
    const bool ok = same(fake_tensor_quant(x, amax_pos), dy);
    add("fake_tensor_quant f32 per-tensor", n * 8, ok, [&] { fake_tensor_quant_out(dy, dx, da); });
  }
  {  // fake_tensor_quant_with_axis, float16, axis 1
    const Tensor x = host_random(DType::float16, shape, 3, 300.0f);
    Tensor amax(DType::float16, {C});
    for (std::int64_t c = 0; c < C; ++c)
      amax.data<std::uint16_t>()[c] = float_to_half(50.0f + static_cast<float>(c % 100));
    const Tensor dx = to_dev(x), da = to_dev(amax);
    Tensor dy(DType::float16, shape, Device::cuda());
    fake_tensor_quant_with_axis_out(dy, dx, da, 1);
    const bool ok = same(fake_tensor_quant_with_axis(x, amax, 1), dy);
    add("fake_tensor_quant_with_axis f16 axis=1", n * 4, ok, [&] { fake_tensor_quant_with_axis_out(dy, dx, da, 1); });
  }
  {  // fake_tensor_quant_backward, float32, per tensor, with grad_amax (the canonical blocked sum)
    const Tensor x = host_random(DType::float32, shape, 11, 300.0f);
    const Tensor g = host_random(DType::float32, shape, 12, 1.0f);
    Tensor amax(DType::float32, {1});
    amax.data<float>()[0] = 200.0f;
    const Tensor dx = to_dev(x), dg = to_dev(g), da = to_dev(amax);
    Tensor dgi(DType::float32, shape, Device::cuda()), dga(DType::float32, {1}, Device::cuda());
    auto run = [&] { fake_tensor_quant_backward_out(dgi, dga.view(), dg, dx, da, std::nullopt); };
    run();
    const FakeQuantGrads want = fake_tensor_quant_backward(g, x, amax, std::nullopt);
    add("fake_tensor_quant_backward f32 per-tensor + grad_amax", n * 12,
        same(want.grad_inputs, dgi) && same(want.grad_amax, dga), run);
  }
  {  // ActsULQ forward and backward, float16, per-tensor clamps
    const Tensor x = host_random(DType::float16, shape, 13, 4.0f);
    Tensor cmin(DType::float16, {1}), cmax(DType::float16, {1});
    cmin.data<std::uint16_t>()[0] = float_to_half(-2.0f);
    cmax.data<std::uint16_t>()[0] = float_to_half(3.0f);
    const Tensor dx = to_dev(x), dmin = to_dev(cmin), dmax = to_dev(cmax);
    Tensor y(DType::float16, shape, Device::cuda()), m1(DType::float16, shape, Device::cuda()),
        m2(DType::float16, shape, Device::cuda()), l(DType::float16, shape, Device::cuda());
    auto fwd = [&] { acts_ulq_out(y, m1, m2, l, dx, dmin, dmax); };
    fwd();
    const ActsUlqResult want = acts_ulq(x, cmin, cmax);
    add("acts_ulq f16 per-tensor clamps", n * 10,
        same(want.y, y) && same(want.clamp_min_mask, m1) && same(want.clamp_max_mask, m2) &&
            same(want.x_clamped_loss, l),
        fwd);
    const Tensor dy = host_random(DType::float16, shape, 14, 1.0f);
    const Tensor ddy = to_dev(dy);
    Tensor xg(DType::float16, shape, Device::cuda()), gmin(DType::float16, {1}, Device::cuda()),
        gmax(DType::float16, {1}, Device::cuda());
    auto bwd = [&] { acts_ulq_backward_out(xg, gmin, gmax, ddy, dmin, dmax, m1, m2, l); };
    bwd();
    const ActsUlqGrads gw =
        acts_ulq_backward(dy, shape, cmin, cmax, want.clamp_min_mask, want.clamp_max_mask, want.x_clamped_loss);
    add("acts_ulq_backward f16 per-tensor clamps (2 full sums)", n * 10,
        same(gw.x_grad, xg) && same(gw.clamp_min_grad, gmin) && same(gw.clamp_max_grad, gmax), bwd);
  }
  {  // npu_quantize div_mode qint8, float16, per channel
    const Tensor x = host_random(DType::float16, shape, 4, 300.0f);
    Tensor s(DType::float32, {C});
    for (std::int64_t c = 0; c < C; ++c) s.data<float>()[c] = 0.5f + 0.01f * static_cast<float>(c % 50);
    const Tensor dx = to_dev(x), ds = to_dev(s);
    Tensor dy(DType::int8, shape, Device::cuda());
    quantize_out(dy, dx, ds, std::nullopt, QuantDType::qint8, 1, true);
    const bool ok = same(quantize(x, s, std::nullopt, QuantDType::qint8, 1, true), dy);
    add("quantize f16 -> qint8 div_mode axis=1", n * 3, ok,
        [&] { quantize_out(dy, dx, ds, std::nullopt, QuantDType::qint8, 1, true); });
  }
  {  // npu_quantize mul mode quint4x2, bfloat16
    const Tensor x = host_random(DType::bfloat16, shape, 5, 20.0f);
    Tensor s(DType::float32, {1});
    s.data<float>()[0] = 0.3f;
    const Tensor dx = to_dev(x), ds = to_dev(s);
    Tensor dy(DType::int32, {R, C / 8}, Device::cuda());
    quantize_out(dy, dx, ds, std::nullopt, QuantDType::quint4x2, -1, false);
    const bool ok = same(quantize(x, s, std::nullopt, QuantDType::quint4x2, -1, false), dy);
    add("quantize bf16 -> quint4x2 (int4 packed)", n * 2.5, ok,
        [&] { quantize_out(dy, dx, ds, std::nullopt, QuantDType::quint4x2, -1, false); });
  }
  {  // tile_quant SYM
    const Tensor src = host_random(DType::float32, shape, 6, 2.0f);
    Tensor sc(DType::float32, {R});
    for (std::int64_t r = 0; r < R; ++r) sc.data<float>()[r] = 60.0f + static_cast<float>(r % 7);
    const Tensor dsrc = to_dev(src), dsc = to_dev(sc);
    Tensor dout(DType::int8, shape, Device::cuda());
    auto run = [&] {
      tile_quant(TileView{dout.data(), DType::int8, R, C, C, Device::cuda()},
                 ConstTileView(dsrc.data(), DType::float32, R, C, C, Device::cuda()),
                 ConstTileView(dsc.data(), DType::float32, R, 1, 1, Device::cuda()));
    };
    run();
    const Tensor want = tile_quant(ConstTileView(src.data(), DType::float32, R, C, C),
                                   ConstTileView(sc.data(), DType::float32, R, 1, 1));
    add("tile_quant SYM f32 -> int8", n * 5, same(want, dout), run);
  }
  {  // anti_quant int8 -> float16, per channel scale + offset
    const Tensor x = host_random(DType::int8, shape, 7, 1.0f);
    Tensor s(DType::float32, {C}), o(DType::float32, {C});
    for (std::int64_t c = 0; c < C; ++c) {
      s.data<float>()[c] = 0.01f * static_cast<float>(1 + c % 9);
      o.data<float>()[c] = static_cast<float>(c % 5) - 2.0f;
    }
    const Tensor dx = to_dev(x), ds = to_dev(s), dof = to_dev(o);
    Tensor dy(DType::float16, shape, Device::cuda());
    anti_quant_out(dy, dx, ds, ConstTensorView(dof));
    const bool ok = same(anti_quant(x, s, ConstTensorView(o), DType::float16), dy);
    add("anti_quant int8 -> f16 per-channel", n * 3, ok, [&] { anti_quant_out(dy, dx, ds, ConstTensorView(dof)); });
  }
  for (DynamicQuantMode mode : {DynamicQuantMode::pertoken, DynamicQuantMode::pertensor}) {
    const Tensor x = host_random(DType::float16, shape, 8, 30.0f);
    const Tensor dx = to_dev(x);
    const Shape ps = mode == DynamicQuantMode::pertoken ? Shape{R} : Shape{1};
    Tensor dy(DType::int8, shape, Device::cuda()), dsc(DType::float32, ps, Device::cuda()),
        dof(DType::float32, ps, Device::cuda());
    auto run = [&] {
      dynamic_quant_asymmetric_out(dy, dsc, dof, dx, std::nullopt, std::nullopt, QuantDType::qint8, mode);
    };
    run();
    const DynamicQuantResult want = dynamic_quant_asymmetric(x, std::nullopt, std::nullopt, QuantDType::qint8, mode);
    const bool ok = same(want.y, dy) && same(want.scale, dsc) && same(want.offset, dof);
    add(std::string("dynamic_quant_asymmetric f16 -> int8 ") +
            (mode == DynamicQuantMode::pertoken ? "pertoken" : "pertensor"),
        n * 3, ok, run);
  }
  {  // dynamic_quant (symmetric) f16 -> int4
    const Tensor x = host_random(DType::float16, shape, 9, 30.0f);
    const Tensor dx = to_dev(x);
    Tensor dy(DType::int32, {R, C / 8}, Device::cuda()), dsc(DType::float32, {R}, Device::cuda());
    auto run = [&] { dynamic_quant_out(dy, dsc, dx, std::nullopt, std::nullopt, QuantDType::quint4x2); };
    run();
    const DynamicQuantSymmetricResult want = dynamic_quant(x, std::nullopt, std::nullopt, QuantDType::quint4x2);
    add("dynamic_quant (symmetric) f16 -> int4 pertoken", n * 2.5, same(want.y, dy) && same(want.scale, dsc), run);
  }

  // Report.
  std::string md =
      "| operator (" + std::to_string(R) + " x " + std::to_string(C) + ", " + prop.name +
      ") | median ms | GB/s | memcpy GB/s | fraction of memcpy | bit-exact vs cpu |\n|---|---:|---:|---:|---:|:-:|\n";
  std::string js = "{\n  \"device\": \"" + std::string(prop.name) + "\",\n  \"rows\": " + std::to_string(R) +
                   ", \"cols\": " + std::to_string(C) + ", \"reps\": " + std::to_string(reps) + ",\n  \"results\": [\n";
  bool all_ok = true;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double gbs = r.bytes / (r.ms * 1e6), mgbs = r.bytes / (r.memcpy_ms * 1e6);
    char line[512];
    std::snprintf(line, sizeof line, "| %s | %.3f | %.0f | %.0f | %.2f | %s |\n", r.name.c_str(), r.ms, gbs, mgbs,
                  gbs / mgbs, r.exact ? "yes" : "**NO**");
    md += line;
    std::snprintf(line, sizeof line,
                  "    {\"name\": \"%s\", \"bytes\": %.0f, \"median_ms\": %.4f, \"gb_per_s\": %.1f, "
                  "\"memcpy_gb_per_s\": %.1f, \"bit_exact\": %s}%s\n",
                  r.name.c_str(), r.bytes, r.ms, gbs, mgbs, r.exact ? "true" : "false", i + 1 < rows.size() ? "," : "");
    js += line;
    all_ok = all_ok && r.exact;
  }
  js += "  ]\n}\n";
  std::printf("%s", md.c_str());
  if (const char* out = std::getenv("OUT")) {
    std::ofstream(std::string(out) + "/bench_cuda.json") << js;
    std::ofstream(std::string(out) + "/bench_cuda.md") << md;
  }
  return all_ok ? 0 : 1;
}
