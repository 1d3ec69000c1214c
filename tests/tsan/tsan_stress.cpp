// ThreadSanitizer stress test (scripts/tsan; docs/testing.md, "Fuzzing and thread-safety checks").
//
// Every public operator is called from 8 std::threads at once, on small inputs (which stay on the calling
// thread) and on inputs large enough for the cpu backend to split them over an OpenMP team, while one
// more thread keeps changing the process-wide settings: set_num_threads, set_backend and
// set_memory_cache_limit. Every result is compared byte for byte with the one computed before, on a single
// thread with the default settings: results are specified to be identical for every backend and thread
// count, so any difference is a failure, as is any ThreadSanitizer report (scripts/tsan builds this with
// -fsanitize=thread and fails on a report).
//
//   tsan_stress [ROUNDS]   each worker runs every case ROUNDS times (default 2); exit status 0 when clean
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace {

using xquant::ConstTensorView;
using xquant::DType;
using xquant::QuantDType;
using xquant::Shape;
using xquant::Tensor;
using xquant::TensorView;

// Deterministic test data: uniform values in [-range, range] with ties, signed zeros, subnormals, huge
// values, Inf and NaN mixed in.
std::vector<float> values(std::size_t n, std::uint32_t seed, float range = 4.f) {
  static const float kEdges[] = {0.5f,
                                 1.5f,
                                 -2.5f,
                                 127.5f,
                                 -128.5f,
                                 0.f,
                                 -0.f,
                                 1e-40f,
                                 3.4e38f,
                                 -3.4e38f,
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(),
                                 7.5f,
                                 -8.5f};
  std::vector<float> v(n);
  std::uint32_t s = seed * 2654435761u + 1u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    if ((s >> 8) % 11 == 0)
      x = kEdges[(s >> 12) % (sizeof kEdges / sizeof kEdges[0])];
    else
      x = (static_cast<float>(s >> 8) / 16777216.f * 2.f - 1.f) * range;
  }
  return v;
}

Tensor floats(DType dt, const Shape& shape, std::uint32_t seed, float range = 4.f) {
  Tensor t(dt, shape);
  const auto v = values(static_cast<std::size_t>(t.numel()), seed, range);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::float32)
      t.data<float>()[i] = v[i];
    else if (dt == DType::float16)
      t.data<std::uint16_t>()[i] = xquant::float_to_half(v[i]);
    else
      t.data<std::uint16_t>()[i] = xquant::float_to_bfloat16(v[i]);
  }
  return t;
}

Tensor positive(DType dt, const Shape& shape, std::uint32_t seed) {
  Tensor t = floats(DType::float32, shape, seed);
  Tensor out(dt, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    float a = std::fabs(t.data<float>()[i]);
    if (!std::isfinite(a) || a > 100.f) a = 3.f;
    if (dt == DType::float32)
      out.data<float>()[i] = a + 0.25f;
    else if (dt == DType::float16)
      out.data<std::uint16_t>()[i] = xquant::float_to_half(a + 0.25f);
    else
      out.data<std::uint16_t>()[i] = xquant::float_to_bfloat16(a + 0.25f);
  }
  return out;
}

Tensor zero_one(DType dt, const Shape& shape, std::uint32_t seed) {
  Tensor t(dt, shape);
  std::uint32_t s = seed;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    const float v = (s >> 16) & 1 ? 1.f : 0.f;
    if (dt == DType::float32)
      t.data<float>()[i] = v;
    else if (dt == DType::float16)
      t.data<std::uint16_t>()[i] = xquant::float_to_half(v);
    else
      t.data<std::uint16_t>()[i] = xquant::float_to_bfloat16(v);
  }
  return t;
}

// One operator call on fixed inputs, producing a list of output tensors.
struct Case {
  std::string name;
  std::function<std::vector<Tensor>()> run;
  std::vector<Tensor> expected;
};

std::vector<Tensor> one(Tensor t) {
  std::vector<Tensor> v;
  v.push_back(std::move(t));
  return v;
}

// The cases: every operator (out-variant and allocating form), a small and a large ("parallel") size.
// Inputs are shared by all threads (read-only); outputs are allocated per call.
struct Inputs {
  std::vector<std::unique_ptr<Tensor>> keep;
  const Tensor& add(Tensor t) {
    keep.push_back(std::make_unique<Tensor>(std::move(t)));
    return *keep.back();
  }
};

std::vector<Case> make_cases(Inputs& in) {
  std::vector<Case> cases;
  // Large: 2 MiB or more of traffic, so the cpu backend splits the call over its OpenMP team.
  const std::int64_t kLargeRows = 512, kSmallRows = 3;
  for (const std::int64_t rows : {kSmallRows, kLargeRows}) {
    const std::string sz = rows == kSmallRows ? "small" : "large";
    const std::int64_t H = 1024;
    for (const DType dt : {DType::float32, DType::bfloat16}) {
      const std::string dn(xquant::dtype_name(dt));
      const Tensor& x = in.add(floats(dt, {rows, H}, 1 + static_cast<std::uint32_t>(dt)));
      const Tensor& amax1 = in.add(positive(DType::float32, {1}, 2));
      const Tensor& amaxc = in.add(positive(dt, {H}, 3));
      const Tensor& amaxr = in.add(positive(DType::float32, {rows}, 4));
      const Tensor& g = in.add(floats(dt, {rows, H}, 5));
      xquant::FakeQuantOptions o;
      o.num_bits = 6;
      cases.push_back({"fake_tensor_quant_out " + dn + " " + sz,
                       [&x, &amax1, o] {
                         Tensor y(x.dtype(), x.shape());
                         xquant::fake_tensor_quant_out(y, x, amax1, o);
                         return one(std::move(y));
                       },
                       {}});
      cases.push_back({"fake_tensor_quant_inplace " + dn + " " + sz,
                       [&x, &amax1] {
                         Tensor y = Tensor::copy_of(x);
                         xquant::fake_tensor_quant_inplace(y, amax1);
                         return one(std::move(y));
                       },
                       {}});
      cases.push_back({"fake_tensor_quant_with_axis(-1) " + dn + " " + sz,
                       [&x, &amaxc] { return one(xquant::fake_tensor_quant_with_axis(x, amaxc, -1)); },
                       {}});
      cases.push_back({"fake_tensor_quant_with_axis(0) " + dn + " " + sz,
                       [&x, &amaxr] { return one(xquant::fake_tensor_quant_with_axis(x, amaxr, 0)); },
                       {}});
      cases.push_back({"fake_tensor_quant_backward per-tensor " + dn + " " + sz,
                       [&x, &amax1, &g] {
                         auto r = xquant::fake_tensor_quant_backward(g, x, amax1, std::nullopt);
                         std::vector<Tensor> v;
                         v.push_back(std::move(r.grad_inputs));
                         v.push_back(std::move(r.grad_amax));
                         return v;
                       },
                       {}});
      cases.push_back({"fake_tensor_quant_backward_out axis 1 " + dn + " " + sz,
                       [&x, &amaxc, &g] {
                         Tensor gi(x.dtype(), x.shape());
                         Tensor ga(amaxc.dtype(), amaxc.shape());
                         xquant::fake_tensor_quant_backward_out(gi, ga.view(), g, x, amaxc, 1);
                         std::vector<Tensor> v;
                         v.push_back(std::move(gi));
                         v.push_back(std::move(ga));
                         return v;
                       },
                       {}});
      cases.push_back({"fake_tensor_quant_backward axis 0 " + dn + " " + sz,
                       [&x, &amaxr, &g] {
                         auto r = xquant::fake_tensor_quant_backward(g, x, amaxr, 0);
                         std::vector<Tensor> v;
                         v.push_back(std::move(r.grad_inputs));
                         v.push_back(std::move(r.grad_amax));
                         return v;
                       },
                       {}});
      // quantize: div mode per channel with zero points; multiply mode to int4.
      const Tensor& sc = in.add(positive(DType::float32, {H}, 6));
      const Tensor& zp = in.add(floats(DType::float32, {H}, 7, 20.f));
      cases.push_back(
          {"quantize div qint8 " + dn + " " + sz,
           [&x, &sc, &zp] { return one(xquant::quantize(x, sc, ConstTensorView(zp), QuantDType::qint8, -1, true)); },
           {}});
      cases.push_back({"quantize_out mul quint4x2 " + dn + " " + sz,
                       [&x, &sc, &zp] {
                         Tensor y(DType::int32, xquant::quantize_output_shape(x.shape(), QuantDType::quint4x2));
                         xquant::quantize_out(y, x, sc, ConstTensorView(zp), QuantDType::quint4x2, -1, false);
                         return one(std::move(y));
                       },
                       {}});
      // dynamic quant: per token, int4, and with expert groups.
      const Tensor& smooth = in.add(positive(dt, {2, H}, 8));
      const Tensor& groups = in.add([rows] {
        Tensor t(DType::int64, {2});
        t.data<std::int64_t>()[0] = rows / 3;
        t.data<std::int64_t>()[1] = rows;
        return t;
      }());
      cases.push_back({"dynamic_quant_asymmetric pertoken " + dn + " " + sz,
                       [&x] {
                         auto r = xquant::dynamic_quant_asymmetric(x);
                         std::vector<Tensor> v;
                         v.push_back(std::move(r.y));
                         v.push_back(std::move(r.scale));
                         v.push_back(std::move(r.offset));
                         return v;
                       },
                       {}});
      cases.push_back({"dynamic_quant_asymmetric_out pertensor int4 " + dn + " " + sz,
                       [&x] {
                         Shape ys = x.shape();
                         ys.back() /= 8;
                         Tensor y(DType::int32, ys), s(DType::float32, {1}), o(DType::float32, {1});
                         xquant::dynamic_quant_asymmetric_out(y, s, o, x, std::nullopt, std::nullopt,
                                                              QuantDType::quint4x2,
                                                              xquant::DynamicQuantMode::pertensor);
                         std::vector<Tensor> v;
                         v.push_back(std::move(y));
                         v.push_back(std::move(s));
                         v.push_back(std::move(o));
                         return v;
                       },
                       {}});
      cases.push_back({"dynamic_quant_asymmetric groups " + dn + " " + sz,
                       [&x, &smooth, &groups] {
                         auto r = xquant::dynamic_quant_asymmetric(x, ConstTensorView(smooth), ConstTensorView(groups));
                         std::vector<Tensor> v;
                         v.push_back(std::move(r.y));
                         v.push_back(std::move(r.scale));
                         v.push_back(std::move(r.offset));
                         return v;
                       },
                       {}});
      // acts_ulq forward and backward with per-column clamps.
      const Tensor& cmin = in.add(floats(dt, {1, H}, 9, 2.f));
      const Tensor& cmax = in.add(positive(dt, {1, H}, 10));
      const Tensor& m1 = in.add(zero_one(dt, {rows, H}, 11));
      const Tensor& m2 = in.add(zero_one(dt, {rows, H}, 12));
      const Tensor& loss = in.add(floats(dt, {rows, H}, 13, 0.5f));
      cases.push_back({"acts_ulq " + dn + " " + sz,
                       [&x, &cmin, &cmax] {
                         auto r = xquant::acts_ulq(x, cmin, cmax, false, 8);
                         std::vector<Tensor> v;
                         v.push_back(std::move(r.y));
                         v.push_back(std::move(r.clamp_min_mask));
                         v.push_back(std::move(r.clamp_max_mask));
                         v.push_back(std::move(r.x_clamped_loss));
                         return v;
                       },
                       {}});
      cases.push_back({"acts_ulq_backward_out " + dn + " " + sz,
                       [&x, &g, &cmin, &cmax, &m1, &m2, &loss] {
                         Tensor gx(x.dtype(), x.shape()), gmin(x.dtype(), cmin.shape()), gmax(x.dtype(), cmax.shape());
                         xquant::acts_ulq_backward_out(gx, gmin, gmax, g, cmin, cmax, m1, m2, loss, false, 8);
                         std::vector<Tensor> v;
                         v.push_back(std::move(gx));
                         v.push_back(std::move(gmin));
                         v.push_back(std::move(gmax));
                         return v;
                       },
                       {}});
      cases.push_back({"acts_ulq_backward scalar clamps " + dn + " " + sz,
                       [&x, &g, &m1, &m2, &loss, dt] {
                         Tensor lo = floats(dt, {1}, 14, 1.f), hi = positive(dt, {1}, 15);
                         auto r = xquant::acts_ulq_backward(g, x.shape(), lo, hi, m1, m2, loss, true, 4);
                         std::vector<Tensor> v;
                         v.push_back(std::move(r.x_grad));
                         v.push_back(std::move(r.clamp_min_grad));
                         v.push_back(std::move(r.clamp_max_grad));
                         return v;
                       },
                       {}});
    }
    // tile_quant: float32 only; padded rows (pitch > cols).
    const std::int64_t cols = 1000, pitch = 1024;
    const Tensor& src = in.add(floats(DType::float32, {rows, pitch}, 16, 50.f));
    const Tensor& tsc = in.add(positive(DType::float32, {rows, 1}, 17));
    const Tensor& tof = in.add(floats(DType::float32, {rows, 1}, 18, 100.f));
    cases.push_back({"tile_quant SYM " + sz,
                     [&src, &tsc, rows] {
                       Tensor out(DType::int8, {rows, pitch});
                       std::memset(out.data(), 0x77, out.nbytes());
                       xquant::tile_quant(xquant::TileView{out.data(), DType::int8, rows, cols, pitch},
                                          xquant::ConstTileView(src.data(), DType::float32, rows, cols, pitch),
                                          xquant::ConstTileView(tsc.data(), DType::float32, rows, 1, 1));
                       return one(std::move(out));
                     },
                     {}});
    cases.push_back({"tile_quant ASYM (alloc) " + sz,
                     [&src, &tsc, &tof, rows] {
                       return one(xquant::tile_quant(
                           xquant::ConstTileView(src.data(), DType::float32, rows, cols, pitch),
                           xquant::ConstTileView(tsc.data(), DType::float32, rows, 1, 1), xquant::QuantMode::ASYM,
                           xquant::ConstTileView(tof.data(), DType::float32, rows, 1, 1)));
                     },
                     {}});
  }
  return cases;
}

bool same(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype() != b[i].dtype() || a[i].shape() != b[i].shape() || a[i].nbytes() != b[i].nbytes()) return false;
    if (a[i].nbytes() > 0 && std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 2;
  constexpr int kWorkers = 8;
  Inputs inputs;
  std::vector<Case> cases = make_cases(inputs);

  // Expected results: one thread, cpu backend, default settings, nothing else running.
  xquant::set_num_threads(1);
  xquant::set_backend(xquant::Backend::cpu);
  for (auto& c : cases) c.expected = c.run();
  xquant::set_num_threads(0);
  std::printf("tsan_stress: %zu cases, %d worker threads x %d rounds, settings changing concurrently\n", cases.size(),
              kWorkers, rounds);
  std::fflush(stdout);

  std::atomic<int> running{kWorkers};
  std::atomic<long> calls{0}, mismatches{0}, errors{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w)
    workers.emplace_back([&, w] {
      for (int round = 0; round < rounds; ++round)
        for (std::size_t k = 0; k < cases.size(); ++k) {
          const Case& c = cases[(k + static_cast<std::size_t>(w) * 5) % cases.size()];  // staggered order
          try {
            if (!same(c.run(), c.expected)) {
              std::fprintf(stderr, "tsan_stress: MISMATCH: %s (worker %d, round %d)\n", c.name.c_str(), w, round);
              ++mismatches;
            }
          } catch (const std::exception& e) {
            std::fprintf(stderr, "tsan_stress: ERROR: %s threw: %s\n", c.name.c_str(), e.what());
            ++errors;
          }
          ++calls;
        }
      --running;
    });

  // The settings thread: thread counts, backend and memory cache limit change under the workers' feet.
  std::thread settings([&] {
    static const int kThreads[] = {0, 1, 2, 3, 4};
    static const std::size_t kLimits[] = {0, std::size_t{4} << 20, std::size_t{64} << 20, std::size_t{2} << 30};
    std::uint32_t s = 12345;
    long changes = 0;
    while (running.load() > 0) {
      s = s * 1664525u + 1013904223u;
      switch ((s >> 16) % 3) {
        case 0:
          xquant::set_num_threads(kThreads[(s >> 20) % 5]);
          break;
        case 1:
          xquant::set_backend((s >> 20) % 4 == 0 ? xquant::Backend::reference : xquant::Backend::cpu);
          break;
        default:
          xquant::set_memory_cache_limit(kLimits[(s >> 20) % 4]);
          break;
      }
      (void)xquant::get_num_threads();
      (void)xquant::get_backend();
      (void)xquant::get_memory_cache_limit();
      ++changes;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::printf("tsan_stress: %ld settings changes\n", changes);
  });
  for (auto& t : workers) t.join();
  settings.join();
  xquant::set_backend(xquant::Backend::cpu);
  xquant::set_num_threads(0);

  std::printf("tsan_stress: %ld calls, %ld mismatches, %ld errors\n", calls.load(), mismatches.load(), errors.load());
  return mismatches.load() == 0 && errors.load() == 0 ? 0 : 1;
}
