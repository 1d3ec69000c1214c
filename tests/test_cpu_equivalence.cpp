// The cpu backend (Highway SIMD + OpenMP) against the scalar reference, bit for bit: on every SIMD target
// compiled into the build and supported by this CPU, at thread counts 1, 2, 3 and 7, for lengths around
// every vector / unroll / grain boundary, misaligned pointers, guard bytes after outputs and the SPEC edge
// values.
#include <cstring>
#include <functional>
#include <random>

#include "cpu/cpu.hpp"
#include "cpu/fastdiv-inl.h"
#include "cpu/parallel.hpp"
#include "params/dynamic_quant.hpp"
#include "hwy/targets.h"
#include "test_targets.hpp"
#include "test_util.hpp"
#include "xquant/runtime.hpp"

namespace {
using namespace xqtest;
using xquant::Backend;
using xquant::QuantDType;

// Values that exercise every rule: ties at k + 0.5 (after scaling by small powers of two as well), signed
// zeros, subnormals, huge, +-Inf, NaN.
std::vector<float> edge_values() {
  std::vector<float> v = {0.5f,    1.5f,  2.5f,  -0.5f,   -1.5f,   -2.5f,   126.5f,   -126.5f,  127.5f,
                          -128.5f, 0.f,   -0.f,  1e-40f,  -1e-40f, 1e-45f,  3.4e38f,  -3.4e38f, kInf,
                          -kInf,   kNaN,  -kNaN, 65504.f, 65520.f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 1.0f / 3.0f,
                          0.25f,   0.75f, 1.25f, 7.5f,    -7.5f,   8.5f,    -8.5f};
  return v;
}

// Random data with edge values sprinkled in.
std::vector<float> test_data(std::size_t n, std::uint32_t seed, float range = 4.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> v(n);
  const auto edges = edge_values();
  for (std::size_t i = 0; i < n; ++i) v[i] = (rng() % 7 == 0) ? edges[rng() % edges.size()] : u(rng);
  return v;
}

// A tensor placed at an odd element offset inside a larger buffer, with sentinel guard bytes after it.
struct Placed {
  Tensor buf;
  TensorView view;
  std::size_t guard_off = 0, guard_len = 0;
  Placed(DType dt, const Shape& shape, std::int64_t offset_elems) {
    const std::int64_t n = xquant::shape_numel(shape);
    const std::int64_t guard = 64;
    buf = Tensor(
        DType::uint8,
        {static_cast<std::int64_t>((n + offset_elems) * static_cast<std::int64_t>(xquant::dtype_size(dt))) + guard});
    std::memset(buf.data(), 0xA5, buf.nbytes());
    view = TensorView(buf.data<std::uint8_t>() + offset_elems * static_cast<std::int64_t>(xquant::dtype_size(dt)), dt,
                      shape);
    guard_off = static_cast<std::size_t>((n + offset_elems) * static_cast<std::int64_t>(xquant::dtype_size(dt)));
    guard_len = static_cast<std::size_t>(guard);
  }
  bool guard_ok() const {
    for (std::size_t i = 0; i < guard_len; ++i)
      if (buf.data<std::uint8_t>()[guard_off + i] != 0xA5) return false;
    return true;
  }
};

Placed placed_floats(DType dt, const Shape& shape, const std::vector<float>& vals, std::int64_t off) {
  Placed p(dt, shape, off);
  Tensor t = make_float(dt, shape, vals);
  if (t.nbytes() > 0) std::memcpy(p.view.data, t.data(), t.nbytes());
  return p;
}

// Runs `op` (which writes into the given outputs) under the reference and under the cpu backend on every
// target and thread count, with each division path of src/cpu/fastdiv-inl.h forced (the rounding check,
// the FMA sequence, the divider) and the default; compares every output's bytes and guard bytes.
void check_equivalent(const std::function<void(std::vector<TensorView>&)>& op,
                      const std::vector<std::pair<DType, Shape>>& outputs, const std::string& what) {
  std::vector<Placed> ref_out;
  std::vector<TensorView> ref_views;
  for (auto& [dt, shape] : outputs) {
    ref_out.emplace_back(dt, shape, 0);
  }
  for (auto& p : ref_out) ref_views.push_back(p.view);
  xquant::set_backend(Backend::reference);
  op(ref_views);
  xquant::set_backend(Backend::cpu);
  for (std::int64_t target : tested_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (int threads : {1, 2, 3, 5, 7}) {
      xquant::set_num_threads(threads);
      // thread counts 1 and 3 also run with non-temporal stores forced on (normally only >= 16 MiB)
      xquant::detail::set_stream_min_bytes(threads % 2 == 1 ? 0 : xquant::detail::kStreamMinBytes);
      // every call with more than one piece of work is split over the threads (normally only >= 2 MiB)
      xquant::detail::set_parallel_min_bytes(0);
      // the division paths, whatever this CPU's default (both streaming settings meet each): 1 thread
      // the rounding check of dynamic quantization where a row allows it (else the FMA sequence), 2 the
      // FMA sequence only (where the target has FMA), 3 the divider only, 5 the rounding check in its
      // y - rint(y) form only (no fixed point), 7 this CPU's default
      xquant::detail::set_fast_div_mode(threads == 1 ? 2 : threads == 2 ? 1 : threads == 3 ? 0 : threads == 5 ? 3 : -1);
      std::vector<Placed> out;
      std::vector<TensorView> views;
      for (auto& [dt, shape] : outputs) out.emplace_back(dt, shape, 3);  // misaligned by 3 elements
      for (auto& p : out) views.push_back(p.view);
      op(views);
      for (std::size_t k = 0; k < out.size(); ++k) {
        const bool same = same_bytes(views[k], ref_views[k]);
        EXPECT_TRUE(same) << what << ": output " << k << " differs on target " << hwy::TargetName(target) << " with "
                          << threads << " threads";
        EXPECT_TRUE(out[k].guard_ok()) << what << ": guard bytes after output " << k << " overwritten on "
                                       << hwy::TargetName(target);
        if (!same) {  // first differing element, for diagnosis
          const auto es = xquant::dtype_size(views[k].dtype);
          for (std::size_t b = 0; b < views[k].nbytes(); ++b)
            if (static_cast<const std::uint8_t*>(views[k].data)[b] !=
                static_cast<const std::uint8_t*>(ref_views[k].data)[b]) {
              ADD_FAILURE() << "  first difference at element " << b / es;
              break;
            }
          hwy::SetSupportedTargetsForTest(0);
          xquant::detail::set_fast_div_mode(-1);
          xquant::set_num_threads(0);
          xquant::detail::set_stream_min_bytes(xquant::detail::kStreamMinBytes);
          xquant::detail::set_parallel_min_bytes(xquant::detail::kParallelMinBytes);
          return;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  xquant::detail::set_fast_div_mode(-1);
  xquant::set_num_threads(0);
  xquant::detail::set_stream_min_bytes(xquant::detail::kStreamMinBytes);
  xquant::detail::set_parallel_min_bytes(xquant::detail::kParallelMinBytes);
}

const std::int64_t kLengths[] = {1, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1023, 1024, 1025, 4096, 70001};

TEST(CpuEquivalence, ReportsTargets) {
  std::string names, skipped;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets())
    (skipped_by_env(t) ? skipped : names) += std::string(hwy::TargetName(t)) + " ";
  std::printf("SIMD targets tested: %s(dispatch picks %s)\n", names.c_str(), xquant::simd_target().c_str());
  if (!skipped.empty())
    std::printf("SIMD targets skipped: %s(named in XQUANT_TEST_SKIP_TARGETS)\n", skipped.c_str());
  EXPECT_FALSE(tested_targets().empty());
}

// float16 fake quant needs an amax exact in float16 (SPEC 1): made as a float16 tensor (values rounded).
DType fq_amax_dtype(DType inputs) { return inputs == DType::float16 ? DType::float16 : DType::float32; }

TEST(CpuEquivalence, FakeQuantPerTensor) {
  for (DType dt : kFloatTypes)
    for (std::int64_t n : kLengths)
      for (auto [nb, uns, narrow] :
           {std::tuple{8, false, true}, std::tuple{4, true, false}, std::tuple{16, false, false}}) {
        Placed x = placed_floats(dt, {n}, test_data(static_cast<std::size_t>(n), static_cast<std::uint32_t>(n)), 1);
        Tensor amax = make_float(fq_amax_dtype(dt), {1}, {2.5f});
        // (init-captures: clang 14 cannot capture structured bindings)
        check_equivalent(
            [&, nb = nb, uns = uns, narrow = narrow](std::vector<TensorView>& o) {
              xquant::fake_tensor_quant_out(o[0], x.view, amax, {nb, uns, narrow});
            },
            {{dt, {n}}}, "fake_tensor_quant n=" + std::to_string(n) + " " + std::string(xquant::dtype_name(dt)));
      }
}

TEST(CpuEquivalence, FakeQuantPerAxisLayouts) {
  const std::vector<std::pair<Shape, std::int64_t>> cases = {
      {{5, 7, 70}, 1},
      {{5, 7, 70}, 0},
      {{5, 7, 70}, -1},
      {{300, 37}, 1},
      {{3000, 13}, -1},
      {{64, 20, 9}, 0},
      {{4, 3, 5000}, 1},
      {{2, 9, 65}, 1},
      {{1, 1}, 0},
      {{1200, 1}, 1},
      // periodic walk (cpu/walk.hpp): one row per piece (the last axis, few rows; inner 8), replicated
      // short periods capped by the rows
      {{8, 128}, 1},
      {{9, 200}, -1},
      {{6, 10, 8}, 1},
      {{2, 5}, 1},
      {{40, 64}, 1},
      {{3, 3, 3}, 1}};
  for (DType dt : kFloatTypes)
    for (const auto& [shape, axis] : cases) {
      const std::int64_t n = xquant::shape_numel(shape);
      const std::int64_t ax = axis < 0 ? axis + static_cast<std::int64_t>(shape.size()) : axis;
      const std::int64_t C = shape[static_cast<std::size_t>(ax)];
      std::vector<float> amax_v(static_cast<std::size_t>(C));
      for (std::int64_t c = 0; c < C; ++c)
        amax_v[static_cast<std::size_t>(c)] = c % 5 == 3 ? 0.f : 0.5f + 0.37f * static_cast<float>(c);
      Tensor amax = make_float(fq_amax_dtype(dt), {C}, amax_v);  // rounded to half for float16 inputs
      Placed x = placed_floats(dt, shape, test_data(static_cast<std::size_t>(n), 99), 1);
      check_equivalent(
          [&, axis = axis](std::vector<TensorView>& o) {
            xquant::fake_tensor_quant_with_axis_out(o[0], x.view, amax, axis);
          },
          {{dt, shape}}, "fake_tensor_quant_with_axis " + xquant::shape_str(shape) + " axis " + std::to_string(axis));
    }
}

TEST(CpuEquivalence, FakeQuantBackward) {
  const std::vector<std::pair<Shape, std::optional<std::int64_t>>> cases = {
      {{70001}, std::nullopt}, {{1025}, std::nullopt}, {{17}, std::nullopt}, {{5, 7, 700}, 1},
      {{3000, 13}, 1},         {{2100, 5}, -1},        {{64, 20, 9}, 0},     {{3, 2500}, 0},
      {{1030, 3}, 1},          {{8, 128}, 1},          {{9, 200}, 1},        {{2, 5}, 1},
      {{6, 10, 8}, 1}};
  for (DType dt : kFloatTypes)
    for (const auto& [shape, axis] : cases) {
      const std::int64_t n = xquant::shape_numel(shape);
      std::int64_t C = 1;
      if (axis)
        C = shape[static_cast<std::size_t>(*axis < 0 ? *axis + static_cast<std::int64_t>(shape.size()) : *axis)];
      std::vector<float> amax_v(static_cast<std::size_t>(C));
      for (std::int64_t c = 0; c < C; ++c)
        amax_v[static_cast<std::size_t>(c)] = c % 4 == 2 ? 0.f : 1.f + 0.21f * static_cast<float>(c);
      Tensor amax = make_float(dt, {C}, amax_v);
      Placed x = placed_floats(dt, shape, test_data(static_cast<std::size_t>(n), 7, 6.f), 1);
      Placed g = placed_floats(dt, shape, test_data(static_cast<std::size_t>(n), 8, 1000.f), 2);
      check_equivalent(
          [&, axis = axis](std::vector<TensorView>& o) {
            xquant::fake_tensor_quant_backward_out(o[0], o[1], g.view, x.view, amax, axis, {8, false, false});
          },
          {{dt, shape}, {dt, {C}}}, "fake_tensor_quant_backward " + xquant::shape_str(shape));
    }
}

TEST(CpuEquivalence, Quantize) {
  using xquant::QuantDType;
  struct Case {
    Shape shape;
    std::int64_t axis;
    bool div_mode;
    QuantDType q;
    bool per_tensor;
  };
  std::vector<Case> cases;
  for (bool per_tensor : {false, true}) {
    for (QuantDType q : {QuantDType::qint8, QuantDType::quint8, QuantDType::qint32}) {
      cases.push_back({{70001}, 0, true, q, true});
      cases.push_back({{33}, 0, true, q, true});
      cases.push_back({{5, 7, 70}, 1, true, q, per_tensor});
      cases.push_back({{300, 37}, -1, true, q, per_tensor});
      cases.push_back({{64, 20, 9}, 0, true, q, per_tensor});
      cases.push_back({{3000, 13}, 1, true, q, per_tensor});
      cases.push_back({{8, 128}, 1, true, q, per_tensor});  // last axis, one row per piece
      cases.push_back({{2, 5}, -1, true, q, per_tensor});
    }
    for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2}) {
      cases.push_back({{70000, 8}, -1, false, q, per_tensor});
      cases.push_back({{9, 136}, -2, false, q, per_tensor});
      cases.push_back({{4, 9, 1032}, 1, false, q, per_tensor});
      cases.push_back({{3, 40, 24}, -2, false, q, per_tensor});
      cases.push_back({{2, 8}, -1, false, q, per_tensor});
      cases.push_back({{8, 128}, -1, false, q, per_tensor});
      cases.push_back({{3, 8, 8}, -2, false, q, per_tensor});
    }
  }
  for (DType dt : kFloatTypes)
    for (const Case& cs : cases) {
      const std::int64_t n = xquant::shape_numel(cs.shape);
      const auto rank = static_cast<std::int64_t>(cs.shape.size());
      std::int64_t ax = cs.axis < 0 ? cs.axis + rank : cs.axis;
      if (!cs.div_mode) ax = cs.axis == -2 ? rank - 2 : rank - 1;
      const std::int64_t C = cs.per_tensor ? 1 : cs.shape[static_cast<std::size_t>(ax)];
      std::vector<float> sv(static_cast<std::size_t>(C)), zv(sv.size());
      for (std::int64_t c = 0; c < C; ++c) {
        sv[static_cast<std::size_t>(c)] =
            cs.div_mode ? 0.02f + 0.003f * static_cast<float>(c % 50) : 30.f - 0.2f * static_cast<float>(c % 40);
        zv[static_cast<std::size_t>(c)] = static_cast<float>(c % 7) - 3.f;
      }
      Tensor scales = make_float(DType::float32, {C}, sv);
      Tensor zps = make_float(DType::float32, {C}, zv);
      Placed x = placed_floats(dt, cs.shape,
                               test_data(static_cast<std::size_t>(n), static_cast<std::uint32_t>(n),
                                         cs.q == QuantDType::qint32 ? 3e7f : 3.f),
                               1);
      const Shape yshape = xquant::quantize_output_shape(cs.shape, cs.q);
      for (bool with_zp : {true, false})  // without zero points the kernels skip the addition
        check_equivalent(
            [&](std::vector<TensorView>& o) {
              xquant::quantize_out(o[0], x.view, scales,
                                   with_zp ? std::optional<ConstTensorView>(zps.view()) : std::nullopt, cs.q, cs.axis,
                                   cs.div_mode);
            },
            {{xquant::storage_dtype(cs.q), yshape}},
            "quantize " + xquant::shape_str(cs.shape) + " axis " + std::to_string(cs.axis) + " " +
                std::string(xquant::quant_dtype_name(cs.q)) + (cs.div_mode ? " div" : " mul") + (with_zp ? " zp" : ""));
    }
}

TEST(CpuEquivalence, TileQuant) {
  using xquant::QuantMode;
  for (auto [rows, cols, pitch] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{64, 128, 128},
                                   {5, 17, 40},
                                   {300, 300, 333},
                                   {3, 1, 1},
                                   {2000, 64, 70}})
    for (QuantMode mode : {QuantMode::SYM, QuantMode::ASYM}) {
      std::vector<float> sv = test_data(static_cast<std::size_t>(rows * pitch), 3, 40.f);
      Tensor src = make_float(DType::float32, {rows * pitch}, sv);
      std::vector<float> scv(static_cast<std::size_t>(rows * 2)), ofv(scv.size());
      for (std::size_t i = 0; i < scv.size(); ++i) {
        scv[i] = 0.5f + 0.25f * static_cast<float>(i % 9);
        ofv[i] = static_cast<float>(i % 13) * 10.f + 0.5f;
      }
      Tensor sc = make_float(DType::float32, {rows * 2}, scv), of = make_float(DType::float32, {rows * 2}, ofv);
      const xquant::ConstTileView s(src.data(), DType::float32, rows, cols, pitch);
      const xquant::ConstTileView scale(sc.data(), DType::float32, rows, 1, 2);
      std::optional<xquant::ConstTileView> offset;
      if (mode == QuantMode::ASYM) offset = xquant::ConstTileView(of.data(), DType::float32, rows, 1, 2);
      const DType odt = mode == QuantMode::SYM ? DType::int8 : DType::uint8;
      check_equivalent(
          [&, rows = rows, cols = cols, pitch = pitch](std::vector<TensorView>& o) {
            // the whole padded tile is compared: padding must stay as the sentinel left it
            xquant::tile_quant(xquant::TileView{o[0].data, odt, rows, cols, pitch}, s, scale, mode, offset);
          },
          {{odt, {rows * pitch}}}, "tile_quant " + std::to_string(rows) + "x" + std::to_string(cols));
    }
}

TEST(CpuEquivalence, ActsUlq) {
  struct Case {
    Shape x, cmin, cmax;
  };
  const std::vector<Case> cases = {
      {{70001}, {1}, {1}},
      {{33}, {}, {}},
      {{4, 5, 300}, {5, 1}, {5, 1}},
      {{300, 37}, {37}, {1}},
      {{2, 3, 4, 5}, {3, 1, 1}, {1, 4, 1}},  // clamp dims 1..2 -> C = 12
      {{7, 9}, {7, 9}, {1}},
      {{3, 1}, {1, 4}, {1}},  // x broadcast: reference path
      {{1025, 3}, {1}, {1}},
      {{4, 5, 300}, {5, 1}, {1}},           // clamp layouts differ: one backward pass per clamp tensor
      {{4, 5, 300}, {4, 1, 1}, {4, 5, 1}},  // channels over [0, 1) and over [0, 2)
      {{3, 70, 70}, {3, 70, 1}, {3, 70, 1}}};
  for (DType dt : kFloatTypes)
    for (const Case& cs : cases)
      for (bool fixed_min : {false, true})
        for (int nb : {8, 4}) {
          const Shape out = xquant::acts_ulq_output_shape(cs.x, cs.cmin, cs.cmax);
          const std::int64_t nx = xquant::shape_numel(cs.x), nmin = xquant::shape_numel(cs.cmin),
                             nmax = xquant::shape_numel(cs.cmax);
          Placed x = placed_floats(dt, cs.x, test_data(static_cast<std::size_t>(nx), 5, 2.f), 1);
          std::vector<float> mv(static_cast<std::size_t>(nmin)), xv(static_cast<std::size_t>(nmax));
          for (std::size_t i = 0; i < mv.size(); ++i)
            mv[i] = i % 4 == 3 ? 0.3f : -0.5f - 0.1f * static_cast<float>(i % 9);
          for (std::size_t i = 0; i < xv.size(); ++i)
            xv[i] = i % 5 == 4 ? 1e-8f : 0.7f + 0.13f * static_cast<float>(i % 11);
          Tensor cmin = make_float(dt, cs.cmin, mv), cmax = make_float(dt, cs.cmax, xv);
          const std::string what = "acts_ulq " + xquant::shape_str(cs.x) + " " + xquant::shape_str(cs.cmin) + " " +
                                   xquant::shape_str(cs.cmax) + (fixed_min ? " fixed" : "");
          check_equivalent(
              [&](std::vector<TensorView>& o) {
                xquant::acts_ulq_out(o[0], o[1], o[2], o[3], x.view, cmin, cmax, fixed_min, nb);
              },
              {{dt, out}, {dt, out}, {dt, out}, {dt, out}}, what);
          // backward on the forward's outputs
          xquant::set_backend(Backend::reference);
          auto fwd = xquant::acts_ulq(x.view, cmin, cmax, fixed_min, nb);
          Placed dy = placed_floats(dt, out, test_data(static_cast<std::size_t>(xquant::shape_numel(out)), 6, 50.f), 2);
          check_equivalent(
              [&](std::vector<TensorView>& o) {
                xquant::acts_ulq_backward_out(o[0], o[1], o[2], dy.view, cmin, cmax, fwd.clamp_min_mask,
                                              fwd.clamp_max_mask, fwd.x_clamped_loss, fixed_min, nb);
              },
              {{dt, cs.x}, {dt, cs.cmin}, {dt, cs.cmax}}, what + " backward");
        }
}

// Smooth scales for dynamic quantization of x in dtype dt: `experts` rows of H (shape {H} when experts is 0),
// 0.5 + step * (i % period), in another dtype than x's (bfloat16 for float32 x, else float32; the kernels
// convert either); with `ends`, the MoE group ends (int64 or int32). The views point into the tensors.
struct SmoothInputs {
  Tensor smooth, groups;
  std::optional<ConstTensorView> sm, gi;
};
SmoothInputs smooth_inputs(DType dt, std::int64_t experts, std::int64_t H, float step, int period,
                           const std::vector<std::int64_t>& ends = {}, DType ends_dtype = DType::int64) {
  SmoothInputs in;
  std::vector<float> sv(static_cast<std::size_t>(std::max<std::int64_t>(experts, 1) * H));
  for (std::size_t i = 0; i < sv.size(); ++i)
    sv[i] = 0.5f + step * static_cast<float>(i % static_cast<std::size_t>(period));
  in.smooth = make_float(dt == DType::float32 ? DType::bfloat16 : DType::float32,
                         experts > 0 ? Shape{experts, H} : Shape{H}, sv);
  in.sm = in.smooth.view();
  if (!ends.empty()) {
    const Shape es = {static_cast<std::int64_t>(ends.size())};
    if (ends_dtype == DType::int32)
      in.groups = make_typed<std::int32_t>(DType::int32, es, std::vector<std::int32_t>(ends.begin(), ends.end()));
    else
      in.groups = make_typed<std::int64_t>(DType::int64, es, ends);
    in.gi = in.groups.view();
  }
  return in;
}

TEST(CpuEquivalence, DynamicQuant) {
  using xquant::DynamicQuantMode;
  using xquant::QuantDType;
  const std::vector<Shape> shapes = {{3, 8}, {5, 16}, {7, 24}, {2, 3, 40}, {9, 1000}, {40, 4104}, {300, 264}, {33, 256}, {1, 0}};  // 256: whole vector pairs (the fused smooth loop)
  for (DType dt : kFloatTypes)
    for (const Shape& shape : shapes)
      for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2})
        for (int variant = 0; variant < 4; ++variant) {  // 0 plain, 1 smooth, 2 MoE, 3 pertensor
          const std::int64_t n = xquant::shape_numel(shape);
          const std::int64_t H = shape.back(), S = xquant::shape_numel(Shape(shape.begin(), shape.end() - 1));
          if (q == QuantDType::quint4x2 && H % 8 != 0) continue;
          std::vector<float> xv = test_data(static_cast<std::size_t>(n), static_cast<std::uint32_t>(n + variant), 3.f);
          // a constant row and an all-zero row, rows with NaN / +-Inf come from the edge values
          if (S > 3) {
            for (std::int64_t j = 0; j < H; ++j) {
              xv[static_cast<std::size_t>(H + j)] = 1.25f;
              xv[static_cast<std::size_t>(2 * H + j)] = 0.f;
            }
          }
          // keep NaN / Inf out of some rows so that most rows are finite
          for (std::int64_t r = 0; r < S; r += 2)
            for (std::int64_t j = 0; j < H; ++j) {
              float& v = xv[static_cast<std::size_t>(r * H + j)];
              if (!std::isfinite(v) || std::fabs(v) > 1e6f) v = 0.5f;
            }
          Placed x = placed_floats(dt, shape, xv, 1);
          SmoothInputs si;
          if (variant == 1 || variant == 2)  // MoE: empty groups 0 and 2
            si = smooth_inputs(dt, variant == 2 ? 4 : 0, H, 0.013f, 97,
                               variant == 2 ? std::vector<std::int64_t>{0, S / 3, S / 3, S} : std::vector<std::int64_t>{});
          const auto& sm = si.sm;
          const auto& gi = si.gi;
          const auto mode = variant == 3 ? DynamicQuantMode::pertensor : DynamicQuantMode::pertoken;
          Shape yshape = shape;
          if (q == QuantDType::quint4x2) yshape.back() /= 8;
          const Shape sshape = variant == 3 ? Shape{1} : Shape(shape.begin(), shape.end() - 1);
          const DType ydt = q == QuantDType::quint4x2 ? DType::int32 : DType::int8;
          check_equivalent(
              [&](std::vector<TensorView>& o) {
                xquant::dynamic_quant_asymmetric_out(o[0], o[1], o[2], x.view, sm, gi, q, mode);
              },
              {{ydt, yshape}, {DType::float32, sshape}, {DType::float32, sshape}},
              "dynamic_quant " + std::string(xquant::dtype_name(dt)) + " -> " +
                  std::string(xquant::quant_dtype_name(q)) + " " + xquant::shape_str(shape) + " variant " +
                  std::to_string(variant));
        }
}

// Long runs of finite rows, where the fused loops of AVX-512 (pass 2 of a row with pass 1 of the next,
// src/cpu/dynamic_quant.cpp RowsT) follow each other: runs that start, end at a group or thread boundary,
// and break where a row takes another path (a NaN row, an Inf row, a constant row, a row of another range).
// (DynamicQuant's odd rows hold NaN / Inf, so there no two fused loops follow each other.)
TEST(CpuEquivalence, DynamicQuantRowRuns) {
  using xquant::QuantDType;
  for (DType dt : kFloatTypes)
    for (const Shape& shape : {Shape{70, 256}, Shape{37, 512}})
      for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2})
        for (int variant = 0; variant < 3; ++variant) {  // 0 plain, 1 smooth, 2 MoE
          const std::int64_t S = shape[0], H = shape[1];
          std::mt19937 rng(static_cast<std::uint32_t>(S * 4 + variant));
          std::uniform_real_distribution<float> u(-3.f, 3.f);
          std::vector<float> xv(static_cast<std::size_t>(S * H));
          for (float& v : xv) v = u(rng);
          auto row = [&](std::int64_t r) { return xv.begin() + static_cast<std::ptrdiff_t>(r * H); };
          row(20)[7] = std::numeric_limits<float>::quiet_NaN();
          row(21)[H - 1] = std::numeric_limits<float>::infinity();
          std::fill(row(30), row(31), 1.5f);
          for (std::int64_t j = 0; j < H; ++j) row(12)[j] *= 1e5f;  // a wider range than its neighbours
          Placed x = placed_floats(dt, shape, xv, 1);
          SmoothInputs si;
          if (variant > 0)  // MoE: groups of 5, 9, 0, 17 and the rest of the rows
            si = smooth_inputs(dt, variant == 2 ? 5 : 0, H, 0.017f, 89,
                               variant == 2 ? std::vector<std::int64_t>{5, 14, 14, 31, S} : std::vector<std::int64_t>{});
          const auto& sm = si.sm;
          const auto& gi = si.gi;
          const DType ydt = q == QuantDType::quint4x2 ? DType::int32 : DType::int8;
          const Shape yshape = {S, q == QuantDType::quint4x2 ? H / 8 : H};
          check_equivalent(
              [&](std::vector<TensorView>& o) { xquant::dynamic_quant_asymmetric_out(o[0], o[1], o[2], x.view, sm, gi, q); },
              {{ydt, yshape}, {DType::float32, {S}}, {DType::float32, {S}}},
              "dynamic_quant row runs " + std::string(xquant::dtype_name(dt)) + " -> " +
                  std::string(xquant::quant_dtype_name(q)) + " " + xquant::shape_str(shape) + " variant " +
                  std::to_string(variant));
        }
}

// The limits of the division without the divider (src/cpu/fastdiv-inl.h): scales, zero points, amax,
// clamp ranges and data on both sides of every per-call condition, so that the FMA sequence and the
// fallback to the divider both run, on dividends that are zero, subnormal, tiny, huge, infinite, NaN.
std::vector<float> boundary_data(std::size_t n, std::uint32_t seed, float scale) {
  std::vector<float> v = test_data(n, seed, 4.f);
  const float extra[] = {0x1p-100f, -0x1p-101f, 1e-30f, -1e-38f, 1e-45f, 0x1p125f, -0x1p126f, 3.4e38f, 1e30f, -1e20f};
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 11 == 5)
      v[i] = extra[(i / 11) % 10];
    else if (i % 11 == 7)
      v[i] *= scale;  // values of the scale's magnitude: quotients near 1, ties
  }
  return v;
}

TEST(CpuEquivalence, FastDivisionBoundariesQuantize) {
  const float sub = 1e-40f;
  const std::vector<std::vector<float>> scale_sets = {{0x1p-60f, 1.0f},   // smallest scale the integer path takes
                                                      {0x1p-61f, 1.0f},   // below it: divider
                                                      {1e-12f, 1e6f},     // ordinary spread
                                                      {1.0f, 0x1p61f},    // scales too far apart: divider
                                                      {1e30f},            // x_max / scale below 2^34: divider
                                                      {0x1p-126f, 2.0f},  // smallest normal scale
                                                      {-2.0f, 3.0f},      // a negative scale: divider
                                                      {sub, 1.0f},        // a subnormal scale: divider
                                                      {0.03f, 0.02f}};
  for (DType dt : kFloatTypes)
    for (const auto& ss : scale_sets)
      for (float zp : {0.0f, -0.5f, 0x1p33f, 0x1p34f})
        for (QuantDType q : {QuantDType::qint8, QuantDType::quint8, QuantDType::qint32})
          for (std::int64_t axis : {0, 1}) {
            const Shape shape = {6, 70};
            const std::int64_t C = shape[static_cast<std::size_t>(axis)];
            std::vector<float> sv(static_cast<std::size_t>(C)), zv(sv.size());
            for (std::int64_t c = 0; c < C; ++c) {
              sv[static_cast<std::size_t>(c)] = ss[static_cast<std::size_t>(c) % ss.size()];
              zv[static_cast<std::size_t>(c)] = c % 3 == 0 ? zp : 1.0f;
            }
            Tensor scales = make_float(DType::float32, {C}, sv), zps = make_float(DType::float32, {C}, zv);
            Placed x = placed_floats(dt, shape, boundary_data(420, 17, ss[0]), 1);
            check_equivalent(
                [&](std::vector<TensorView>& o) {
                  xquant::quantize_out(o[0], x.view, scales, zps.view(), q, axis, true);
                },
                {{xquant::storage_dtype(q), shape}},
                "quantize boundaries scale " + std::to_string(ss[0]) + " zp " + std::to_string(zp) + " axis " +
                    std::to_string(axis) + " " + std::string(xquant::quant_dtype_name(q)));
          }
}

TEST(CpuEquivalence, FastDivisionBoundariesFakeQuant) {
  // num_bits 12 / 13 straddle the one-step limit (2^12), 16 and 32 take two steps; amax from tiny (scale
  // too large for the domain) to huge (scale tiny), with degenerate channels (amax 0)
  for (DType dt : kFloatTypes)
    for (int nb : {4, 8, 12, 13, 16, 32})
      for (float amax_v : dt == DType::float16 ? std::vector<float>{5.9604645e-8f, 6.1035156e-5f, 2.5f, 1000.f, 65504.f}
                                               : std::vector<float>{1e-30f, 1e-20f, 2.5f, 1e20f, 3e38f}) {
        Placed x = placed_floats(dt, {5, 70}, boundary_data(350, 23, amax_v), 1);
        Tensor amax = make_float(fq_amax_dtype(dt), {1}, {amax_v});
        check_equivalent(
            [&](std::vector<TensorView>& o) {
              xquant::fake_tensor_quant_out(o[0], x.view, amax, {nb, false, false});
            },
            {{dt, {5, 70}}},
            "fake_tensor_quant boundaries nb " + std::to_string(nb) + " amax " + std::to_string(amax_v));
        Tensor amax5 = make_float(fq_amax_dtype(dt), {5}, {amax_v, 0.0f, 1.0f, amax_v * 0.5f, 7.0f});
        check_equivalent(
            [&](std::vector<TensorView>& o) {
              xquant::fake_tensor_quant_with_axis_out(o[0], x.view, amax5, 0, {nb, true, false});
            },
            {{dt, {5, 70}}},
            "fake_tensor_quant_with_axis boundaries nb " + std::to_string(nb) + " amax " + std::to_string(amax_v));
        Tensor amax70 = make_float(fq_amax_dtype(dt), {70}, std::vector<float>(70, amax_v));
        check_equivalent(
            [&](std::vector<TensorView>& o) {
              xquant::fake_tensor_quant_with_axis_out(o[0], x.view, amax70, 1, {nb, false, true});
            },
            {{dt, {5, 70}}}, "fake_tensor_quant_with_axis last boundaries nb " + std::to_string(nb));
      }
}

TEST(CpuEquivalence, FakeQuantFloat16EveryInput) {
  // Every float16 bit pattern (NaNs with payloads, both zeros, subnormals, Inf) through the float16
  // arithmetic, for scales from subnormal to huge and bit widths from 2 to 17 (16 unsigned and 17 have
  // infinite float16 bounds, which the AVX-512 path leaves to the generic one), per tensor and per axis.
  Placed x(DType::float16, {256, 256}, 1);
  for (std::uint32_t b = 0; b < 65536; ++b) static_cast<std::uint16_t*>(x.view.data)[b] = static_cast<std::uint16_t>(b);
  for (float amax_v : {5.9604645e-8f, 6.1035156e-5f, 0.0999755859375f, 1.0f, 2.5f, 100.0f, 65504.0f})
    for (auto [nb, uns, narrow] : {std::tuple{2, false, false}, std::tuple{8, false, false}, std::tuple{8, true, false},
                                   std::tuple{8, false, true}, std::tuple{14, false, false}, std::tuple{15, false, false},
                                   std::tuple{16, false, false}, std::tuple{16, true, false},
                                   std::tuple{17, false, false}}) {
      const std::string what = "float16 every input, amax " + std::to_string(amax_v) + " nb " + std::to_string(nb) +
                               (uns ? " unsigned" : "") + (narrow ? " narrow" : "");
      Tensor amax = make_float(DType::float16, {1}, {amax_v});
      check_equivalent(
          [&, nb = nb, uns = uns, narrow = narrow](std::vector<TensorView>& o) {
            xquant::fake_tensor_quant_out(o[0], x.view, amax, {nb, uns, narrow});
          },
          {{DType::float16, {256, 256}}}, what);
      Tensor amax2 = make_float(DType::float16, {256}, std::vector<float>(256, amax_v));
      check_equivalent(
          [&, nb = nb, uns = uns, narrow = narrow](std::vector<TensorView>& o) {
            xquant::fake_tensor_quant_with_axis_out(o[0], x.view, amax2, 1, {nb, uns, narrow});
          },
          {{DType::float16, {256, 256}}}, what + " per axis");
    }
}

TEST(CpuEquivalence, FastDivisionBoundariesDynamicQuant) {
  using xquant::DynamicQuantMode;
  // rows of tiny, ordinary, huge magnitude (the scale floor 1e-12, scales near 2^126 and infinite ranges)
  for (DType dt : {DType::float32, DType::bfloat16})
    for (float mag : {1e-30f, 1e-12f, 1.0f, 1e30f, 1e37f, 3e38f})
      for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2})
        for (auto mode : {DynamicQuantMode::pertoken, DynamicQuantMode::pertensor}) {
          const Shape shape = {6, 64};
          std::vector<float> xv = test_data(384, 31, 1.f);
          for (std::size_t i = 0; i < xv.size(); ++i) {
            if (!std::isfinite(xv[i]) || std::fabs(xv[i]) > 1e6f) xv[i] = 0.25f;
            xv[i] *= i < 128 ? mag : i < 256 ? 1.0f / mag : 1.0f;
            if (i % 17 == 3) xv[i] = i % 2 ? 1e-40f : -0.0f;
          }
          Placed x = placed_floats(dt, shape, xv, 1);
          const Shape yshape = q == QuantDType::quint4x2 ? Shape{6, 8} : shape;
          const Shape sshape = mode == DynamicQuantMode::pertensor ? Shape{1} : Shape{6};
          const DType ydt = q == QuantDType::quint4x2 ? DType::int32 : DType::int8;
          check_equivalent(
              [&](std::vector<TensorView>& o) {
                xquant::dynamic_quant_asymmetric_out(o[0], o[1], o[2], x.view, std::nullopt, std::nullopt, q, mode);
              },
              {{ydt, yshape}, {DType::float32, sshape}, {DType::float32, sshape}},
              "dynamic_quant boundaries magnitude " + std::to_string(mag));
        }
}

// Dynamic quantization's rounding check (rint_check): rows whose x' / scale + offset land exactly on
// half-integers (ties of rint), one and two ulps either side of them, and just inside / outside the
// check's threshold, so that vectors take both the check's fast result and its fallback division; rows
// whose |x / scale| + |offset| straddle the check's 2^19 limit (the row then goes to the FMA sequence or
// the divider); scale 1 rows, where every half-integer is a tie; float32, bfloat16, float16 inputs.
TEST(CpuEquivalence, DynamicQuantRoundingCheck) {
  using xquant::QuantDType;
  auto round_trip = [](DType dt, float v) { return to_floats(make_float(dt, {1}, {v}))[0]; };
  struct RowSpec {
    float lo, hi;
  };
  const std::vector<RowSpec> specs = {{-1.0f, 2.0f},    {-128.0f, 127.0f}, {-8.0f, 7.0f},      {0.0f, 3.0f},
                                      {-7.0f, 0.0f},    {-0.3f, 0.01f},    {1000.0f, 1001.0f}, {2000.0f, 2000.5f},
                                      {1e-30f, 3e-30f}, {-5e6f, 4e6f}};
  for (DType dt : kFloatTypes)
    for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2})
      for (bool symmetric : {false, true}) {
        const std::int64_t H = 264;  // vectors of every width plus a tail (int4: a multiple of 8)
        const std::int64_t S = static_cast<std::int64_t>(specs.size());
        std::vector<float> xv(static_cast<std::size_t>(S * H));
        for (std::int64_t r = 0; r < S; ++r) {
          // the row's own min and max, rounded to the input dtype first so that the parameters below are the
          // kernel's
          const float lo = round_trip(dt, specs[static_cast<std::size_t>(r)].lo);
          const float hi = round_trip(dt, specs[static_cast<std::size_t>(r)].hi);
          const auto qmax = q == QuantDType::qint8 ? 127.0f : 7.0f;
          float scale, offset;
          if (symmetric) {
            scale = std::max(std::fabs(lo), std::fabs(hi)) / qmax;
            offset = 0.0f;
          } else {
            const auto p = xquant::detail::init_dynamic_quant_params(hi, lo, q);
            scale = p.scale;
            offset = p.offset;
          }
          float* row = xv.data() + r * H;
          row[0] = lo;
          row[1] = hi;
          for (std::int64_t j = 2; j < H; ++j) {
            // x with x / scale + offset near the half-integer k + 1/2, nudged by -3 .. +3 ulps
            const float k = std::floor(static_cast<float>(j % 40) - 20.0f - offset) + 0.5f;
            float x = (k - offset) * scale;
            const int nudge = static_cast<int>(j % 7) - 3;
            for (int u = 0; u < std::abs(nudge); ++u) x = std::nextafter(x, nudge > 0 ? kInf : -kInf);
            x = round_trip(dt, x);
            row[j] = std::min(std::max(x, lo), hi);  // keep the row's min and max
          }
        }
        Placed x = placed_floats(dt, {S, H}, xv, 1);
        const Shape yshape = q == QuantDType::quint4x2 ? Shape{S, H / 8} : Shape{S, H};
        const DType ydt = q == QuantDType::quint4x2 ? DType::int32 : DType::int8;
        const std::string what = std::string("dynamic_quant rounding check ") + std::string(xquant::dtype_name(dt)) +
                                 (symmetric ? " symmetric" : " asymmetric") +
                                 (q == QuantDType::qint8 ? " int8" : " int4");
        if (symmetric)
          check_equivalent(
              [&](std::vector<TensorView>& o) {
                xquant::dynamic_quant_out(o[0], o[1], x.view, std::nullopt, std::nullopt, q);
              },
              {{ydt, yshape}, {DType::float32, {S}}}, what);
        else
          check_equivalent(
              [&](std::vector<TensorView>& o) {
                xquant::dynamic_quant_asymmetric_out(o[0], o[1], o[2], x.view, std::nullopt, std::nullopt, q);
              },
              {{ydt, yshape}, {DType::float32, {S}}, {DType::float32, {S}}}, what);
      }
}

// The rounding check's per-row parameters: the threshold is 0.5 - 2^-21 (|x| max / scale + |offset|) -
// 2^-126 rounded down, and rows at or beyond 2^19 (or with scales outside [2^-126, 2^126), or non-finite
// values) are refused.
TEST(CpuEquivalence, RoundingCheckParameters) {
  using xquant::detail::rint_check;
  const auto c = rint_check(1.0f, 0.0f, 127.0f);
  ASSERT_TRUE(c.ok);
  const double expect = 0.5 - (127.0 * 0x1p-21 + 0x1p-126);
  EXPECT_LE(static_cast<double>(c.threshold), expect);
  EXPECT_GT(static_cast<double>(c.threshold), expect - 0x1p-25);
  EXPECT_TRUE(rint_check(1.0f, 0.0f, 0x1p18f).ok);          // 2^18: threshold 0.375
  EXPECT_FALSE(rint_check(1.0f, 0.0f, 0x1p19f).ok);         // 2^19: threshold 0.25, refused
  EXPECT_FALSE(rint_check(1.0f, 0x1p19f, 0.0f).ok);         // |offset| counts too
  EXPECT_FALSE(rint_check(0x1p-127f, 0.0f, 0x1p-140f).ok);  // subnormal scale
  EXPECT_FALSE(rint_check(0x1p126f, 0.0f, 1.0f).ok);        // reciprocal not normal
  EXPECT_TRUE(rint_check(0x1p-126f, 0.0f, 0x1p-120f).ok);
  EXPECT_FALSE(rint_check(1.0f, kNaN, 1.0f).ok);
  EXPECT_FALSE(rint_check(1.0f, 0.0f, kInf).ok);
}

// The fixed-point form's per-row parameters (rint_fixed): h = 2^-j is the smallest power of two above
// delta + 2^-k, zc = RN(offset + 1.5 * 2^(23 - k) + 1/2 + h), the mask covers fraction bits [k - j + 1, k);
// rows whose y would leave [lo - 1/4, hi + 1/4] or the magic constant's binade are refused (they take
// rint_check, which saturates).
TEST(CpuEquivalence, RoundingCheckFixedParameters) {
  using xquant::detail::rint_fixed;
  // int8, scale 1, offset 0, |x| <= 127: delta = 127 * 2^-21 + 2^-126 just below 2^-14, need just below
  // 2^-14 + 2^-14 = 2^-13: j = 13
  const auto f = rint_fixed<14>(1.0f, 0.0f, -127.0f, 127.0f, -128.0f, 127.0f);
  ASSERT_TRUE(f.ok);
  EXPECT_EQ(f.zc, 768.0f + 0.5f + 0x1p-13f);
  EXPECT_EQ(f.mask, 0x3FFCu);  // bits 2..13: fraction >= 2^-12 = 2h
  // |x| <= 128 (and offset 0): delta just above 2^-14, so need is above 2^-13: h = 2^-12 (j = 12)
  const auto f2 = rint_fixed<14>(1.0f, 0.0f, -128.0f, 127.0f, -128.0f, 127.0f);
  ASSERT_TRUE(f2.ok);
  EXPECT_EQ(f2.zc, 768.0f + 0.5f + 0x1p-12f);
  EXPECT_EQ(f2.mask, 0x3FF8u);
  // the offset is folded in: zc = RN(offset + c); 0.1f + 768.5 + 2^-13 rounds to the 2^-14 grid
  const auto f3 = rint_fixed<14>(1.0f, 0.1f, -100.0f, 100.0f, -128.0f, 127.0f);
  ASSERT_TRUE(f3.ok);
  EXPECT_EQ(f3.zc, static_cast<float>(static_cast<double>(0.1f) + 768.5 + 0x1p-13));
  // int4 (k = 16): |x| <= 7, delta ~ 2^-18.2: need ~ 2^-16 + 2^-18.2 -> h = 2^-15 (j = 15), mask bits 2..15
  const auto g = rint_fixed<16>(1.0f, 0.0f, -7.0f, 7.0f, -8.0f, 7.0f);
  ASSERT_TRUE(g.ok);
  EXPECT_EQ(g.zc, 192.0f + 0.5f + 0x1p-15f);
  EXPECT_EQ(g.mask, 0xFFFCu);
  // the asymmetric int8 row of [-1, 2]: scale 3 / 255, offset 127 - 2 / scale
  const auto p = xquant::detail::init_dynamic_quant_params(2.0f, -1.0f, xquant::QuantDType::qint8);
  EXPECT_TRUE((rint_fixed<14>(p.scale, p.offset, -1.0f, 2.0f, -128.0f, 127.0f).ok));
  EXPECT_FALSE((rint_fixed<14>(1.0f, 0.0f, -129.0f, 127.0f, -128.0f, 127.0f).ok));  // y below lo - 1/4
  EXPECT_FALSE((rint_fixed<14>(1.0f, 0.0f, -127.0f, 127.3f, -128.0f, 127.0f).ok));  // y above hi + 1/4
  EXPECT_FALSE((rint_fixed<16>(1.0f, 0.0f, -9.0f, 7.0f, -8.0f, 7.0f).ok));
  EXPECT_FALSE((rint_fixed<14>(1.0f, 0.0f, -300.0f, 300.0f, -1000.0f, 1000.0f).ok));  // beyond the binade
  EXPECT_FALSE((rint_fixed<14>(1.0f, 0.0f, 0.0f, kInf, -128.0f, 127.0f).ok));
  EXPECT_FALSE((rint_fixed<14>(1.0f, kNaN, 0.0f, 1.0f, -128.0f, 127.0f).ok));
  EXPECT_FALSE((rint_fixed<14>(0x1p126f, 0.0f, 0.0f, 1.0f, -128.0f, 127.0f).ok));
}

TEST(CpuEquivalence, FastDivisionBoundariesActsUlq) {
  // clamp ranges from the LEVELS * EPS floor to huge, x with tiny, subnormal and huge values
  for (DType dt : kFloatTypes)
    for (float cmax_v : {1e-30f, 1e-3f, 2.0f, 1e30f, 3e38f})
      for (int nb : {8, 16}) {
        Placed x = placed_floats(dt, {4, 90}, boundary_data(360, 41, cmax_v), 1);
        Tensor cmin = make_float(dt, {1}, {-0.5f * cmax_v}), cmax = make_float(dt, {1}, {cmax_v});
        Tensor cmin4 = make_float(dt, {4, 1}, {-0.5f * cmax_v, -1e-30f, -2.0f, 0.0f}),
               cmax4 = make_float(dt, {4, 1}, {cmax_v, 1e-6f, 3.0f, 1e20f});
        check_equivalent(
            [&](std::vector<TensorView>& o) {
              xquant::acts_ulq_out(o[0], o[1], o[2], o[3], x.view, cmin, cmax, false, nb);
            },
            {{dt, {4, 90}}, {dt, {4, 90}}, {dt, {4, 90}}, {dt, {4, 90}}},
            "acts_ulq boundaries " + std::to_string(cmax_v));
        check_equivalent(
            [&](std::vector<TensorView>& o) {
              xquant::acts_ulq_out(o[0], o[1], o[2], o[3], x.view, cmin4, cmax4, false, nb);
            },
            {{dt, {4, 90}}, {dt, {4, 90}}, {dt, {4, 90}}, {dt, {4, 90}}},
            "acts_ulq boundaries per row " + std::to_string(cmax_v));
      }
}

TEST(CpuEquivalence, DynamicQuantSymmetric) {
  using xquant::QuantDType;
  const std::vector<Shape> shapes = {{3, 8}, {5, 16}, {7, 24}, {2, 3, 40}, {9, 1000}, {40, 4104}, {300, 264}, {33, 256}, {1, 0}};
  for (DType dt : kFloatTypes)
    for (const Shape& shape : shapes)
      for (QuantDType q : {QuantDType::qint8, QuantDType::quint4x2})
        for (int variant = 0; variant < 3; ++variant) {  // 0 plain, 1 smooth, 2 MoE
          const std::int64_t n = xquant::shape_numel(shape);
          const std::int64_t H = shape.back(), S = xquant::shape_numel(Shape(shape.begin(), shape.end() - 1));
          if (q == QuantDType::quint4x2 && H % 8 != 0) continue;
          std::vector<float> xv =
              test_data(static_cast<std::size_t>(n), static_cast<std::uint32_t>(7 * n + variant), 3.f);
          if (S > 3) {  // a constant row and an all-zero row (scale 0: every y is 0 / 0 -> 0)
            for (std::int64_t j = 0; j < H; ++j) {
              xv[static_cast<std::size_t>(H + j)] = -1.25f;
              xv[static_cast<std::size_t>(2 * H + j)] = j % 2 ? 0.f : -0.f;
            }
          }
          for (std::int64_t r = 0; r < S; r += 2)  // most rows finite
            for (std::int64_t j = 0; j < H; ++j) {
              float& v = xv[static_cast<std::size_t>(r * H + j)];
              if (!std::isfinite(v) || std::fabs(v) > 1e6f) v = -0.5f;
            }
          Placed x = placed_floats(dt, shape, xv, 1);
          SmoothInputs si;
          if (variant >= 1)
            si = smooth_inputs(dt, variant == 2 ? 4 : 0, H, 0.017f, 89,
                               variant == 2 ? std::vector<std::int64_t>{0, S / 3, S / 3, S} : std::vector<std::int64_t>{},
                               DType::int32);
          const auto& sm = si.sm;
          const auto& gi = si.gi;
          Shape yshape = shape;
          if (q == QuantDType::quint4x2) yshape.back() /= 8;
          const Shape sshape(shape.begin(), shape.end() - 1);
          const DType ydt = q == QuantDType::quint4x2 ? DType::int32 : DType::int8;
          check_equivalent(
              [&](std::vector<TensorView>& o) { xquant::dynamic_quant_out(o[0], o[1], x.view, sm, gi, q); },
              {{ydt, yshape}, {DType::float32, sshape}},
              "dynamic_quant (symmetric) " + xquant::shape_str(shape) + " variant " + std::to_string(variant));
        }
}

// The op-plugin 26.x forms of both dynamic quantizations: float8 outputs (every mode), symmetric pertensor,
// and perchannel (int8 / float8, with and without smooth scales [S]), shapes with empty dimensions included.
TEST(CpuEquivalence, DynamicQuantFloat8AndPerChannel) {
  using xquant::DynamicQuantMode;
  using xquant::QuantDType;
  const std::vector<Shape> shapes = {{7, 24}, {2, 3, 40}, {9, 1000}, {5, 300, 7}, {2, 0, 8}};
  for (DType dt : kFloatTypes)
    for (const Shape& shape : shapes)
      for (QuantDType q : {QuantDType::qint8, QuantDType::float8_e4m3fn, QuantDType::float8_e5m2})
        for (bool symmetric : {true, false})
          for (int variant = 0; variant < 5; ++variant) {         // pertoken, + smooth, pertensor, perchannel, + smooth
            if (q == QuantDType::qint8 && variant < 2) continue;  // pertoken int8: the two tests above
            const std::int64_t n = xquant::shape_numel(shape);
            const std::int64_t H = shape.back();
            const std::int64_t Srow = shape[shape.size() - 2];
            std::vector<float> xv =
                test_data(static_cast<std::size_t>(n), static_cast<std::uint32_t>(3 * n + variant), 3.f);
            for (std::size_t i = 0; i < xv.size(); i += 2)  // most values finite
              if (!std::isfinite(xv[i]) || std::fabs(xv[i]) > 1e6f) xv[i] = 0.75f;
            Placed x = placed_floats(dt, shape, xv, 1);
            Tensor smooth;
            std::optional<ConstTensorView> sm;
            if (variant == 1 || variant == 4) {
              const std::int64_t len = variant == 1 ? H : Srow;
              std::vector<float> sv(static_cast<std::size_t>(len));
              for (std::size_t i = 0; i < sv.size(); ++i) sv[i] = 0.5f + 0.019f * static_cast<float>(i % 83);
              smooth = make_float(dt == DType::float32 ? DType::bfloat16 : DType::float32, Shape{len}, sv);
              sm = smooth.view();
            }
            const DynamicQuantMode mode = variant == 2   ? DynamicQuantMode::pertensor
                                          : variant >= 3 ? DynamicQuantMode::perchannel
                                                         : DynamicQuantMode::pertoken;
            Shape sshape;
            if (mode == DynamicQuantMode::pertensor) {
              sshape = {1};
            } else if (mode == DynamicQuantMode::perchannel) {
              sshape.assign(shape.begin(), shape.end() - 2);
              sshape.push_back(H);
            } else {
              sshape.assign(shape.begin(), shape.end() - 1);
            }
            const DType ydt = xquant::storage_dtype(q);
            const std::string what = std::string(symmetric ? "dynamic_quant " : "dynamic_quant_asymmetric ") +
                                     std::string(xquant::quant_dtype_name(q)) + " " + xquant::shape_str(shape) +
                                     " variant " + std::to_string(variant);
            if (symmetric) {
              check_equivalent(
                  [&](std::vector<TensorView>& o) {
                    xquant::dynamic_quant_out(o[0], o[1], x.view, sm, std::nullopt, q, mode);
                  },
                  {{ydt, shape}, {DType::float32, sshape}}, what);
            } else {
              check_equivalent(
                  [&](std::vector<TensorView>& o) {
                    xquant::dynamic_quant_asymmetric_out(o[0], o[1], o[2], x.view, sm, std::nullopt, q, mode);
                  },
                  {{ydt, shape}, {DType::float32, sshape}, {DType::float32, sshape}}, what);
            }
          }
}

TEST(CpuEquivalence, AntiQuant) {
  using xquant::QuantDType;
  const auto edges = edge_values();
  for (QuantDType src : {QuantDType::qint8, QuantDType::quint4x2})
    for (std::int64_t H : {8, 16, 24, 64, 72, 1024, 1032, 4104})
      for (std::int64_t rows : {1, 3, 70})
        for (bool per_column : {false, true})
          for (int opt = 0; opt < 3; ++opt) {  // 0 no offset, 1 float32 scale / offset, 2 bfloat16
            if (rows * H > 100000 && (per_column || opt != 1)) continue;  // keep the big case small in number
            const bool int4 = src == QuantDType::quint4x2;
            const std::int64_t n = rows * H;
            std::mt19937 rng(static_cast<std::uint32_t>(n * 3 + opt));
            Placed x(int4 ? DType::int32 : DType::int8, {rows, int4 ? H / 8 : H}, 1);
            for (std::size_t b = 0; b < x.view.nbytes(); ++b)
              static_cast<std::uint8_t*>(x.view.data)[b] = static_cast<std::uint8_t>(rng());
            const std::int64_t ns = per_column ? H : 1;
            std::vector<float> sv(static_cast<std::size_t>(ns)), ov(sv.size());
            std::uniform_real_distribution<float> u(-2.f, 2.f);
            for (std::size_t i = 0; i < sv.size(); ++i) {
              // mostly ordinary scales, some edge values (NaN, +-Inf, 0, subnormal, huge)
              sv[i] = rng() % 9 == 0 ? edges[rng() % edges.size()] : u(rng);
              ov[i] = rng() % 11 == 0 ? edges[rng() % edges.size()] : 30.f * u(rng);
            }
            const DType sdt = opt == 2 ? DType::bfloat16 : DType::float32;
            Tensor s = make_float(sdt, {ns}, sv), o = make_float(sdt, {ns}, ov);
            const std::optional<ConstTensorView> off =
                opt == 0 ? std::nullopt : std::optional<ConstTensorView>(o.view());
            for (DType dst : kFloatTypes)
              check_equivalent(
                  [&](std::vector<TensorView>& out) { xquant::anti_quant_out(out[0], x.view, s, off, src); },
                  {{dst, {rows, H}}},
                  "anti_quant " + std::string(xquant::quant_dtype_name(src)) + " [" + std::to_string(rows) + ", " +
                      std::to_string(H) + "] per_column " + std::to_string(per_column) + " opt " + std::to_string(opt) +
                      " -> " + std::string(xquant::dtype_name(dst)));
          }
}

// AVX512_BF16's conversion flushes subnormal results, so the cpu kernel checks each vector unless the call's
// parameters rule NaN and subnormal results out (AntiQuantResultsNormal: |scale| * min(ulp(offset), 1) >=
// FLT_MIN). One channel per call, every input value present: scales and offsets whose results are all
// normal, and ones where a single x (inside the range, at its ends, or next to an integral -offset) gives a
// subnormal or a zero from underflow.
TEST(CpuEquivalence, AntiQuantResultsNearSubnormal) {
  using xquant::QuantDType;
  const std::vector<std::pair<float, float>> cases = {
      {0x1p-120f, 0.0f},           {0x1p-127f, 0.0f},          {0x1p-110f, -3.0f + 0x1p-21f}, {0x1p-110f, 3.0f},
      {0x1p-110f, -7.0f - 0x1p-22f}, {0x1p-110f, 8.0f + 0x1p-22f}, {0x1p-110f, 100.5f},         {0x1p-125f, 0.5f},
      {0x1p-125f, -0.25f},         {0x1p-140f, 0.0f},          {0x1p-100f, 2.0f + 0x1p-24f},  {-0x1p-110f, 120.0f + 0x1p-17f},
      {0x1p-110f, -127.0f - 0x1p-17f}, {1.5f, -0.5f}, {0x1p-127f, -7.0f}, {0x1p-127f, -127.0f}, {0x1p-127f, 8.0f},
      {0x1p-127f, 128.0f}};
  for (QuantDType src : {QuantDType::qint8, QuantDType::quint4x2}) {
    const bool int4 = src == QuantDType::quint4x2;
    const std::int64_t rows = 4, H = 512;
    Placed x(int4 ? DType::int32 : DType::int8, {rows, int4 ? H / 8 : H}, 1);
    for (std::size_t b = 0; b < x.view.nbytes(); ++b)  // every int8 value, every pair of nibbles
      static_cast<std::uint8_t*>(x.view.data)[b] = static_cast<std::uint8_t>(b * 7);
    for (const auto& [sc, of] : cases) {
      Tensor s = make_float(DType::float32, {1}, {sc}), o = make_float(DType::float32, {1}, {of});
      check_equivalent([&](std::vector<TensorView>& out) { xquant::anti_quant_out(out[0], x.view, s, o.view(), src); },
                       {{DType::bfloat16, {rows, H}}},
                       "anti_quant near subnormal " + std::string(xquant::quant_dtype_name(src)) + " scale " +
                           std::to_string(sc) + " offset " + std::to_string(of));
    }
  }
}

// Offsets that are all +-0 are skipped by the cpu kernel (float(q) + (+-0) == float(q)); one offset that is
// not (a value, a subnormal, NaN) anywhere in the channel array (the SIMD part or the scalar tail of the
// de-interleaving, the first or the last channel) must switch the add back on. Per channel and per tensor
// (the broadcast runs walk), int8 and int4, every destination dtype.
TEST(CpuEquivalence, AntiQuantZeroAndSparseOffsets) {
  using xquant::QuantDType;
  for (QuantDType src : {QuantDType::qint8, QuantDType::quint4x2})
    for (std::int64_t H : {8, 24, 40, 128})
      for (std::int64_t rows : {1, 5})
        for (std::int64_t ns : {std::int64_t{1}, H})
          for (int odd : {-1, 0, 1, 2})    // -1: all +-0; else one odd offset (kOdd[odd]) ...
            for (int where : {0, 1, 2}) {  // ... at channel 0, ns / 2 or ns - 1
              if (odd < 0 && where > 0) continue;
              static const float kOdd[] = {0.5f, 1e-45f, kNaN};
              const bool int4 = src == QuantDType::quint4x2;
              std::mt19937 rng(static_cast<std::uint32_t>(H * 131 + rows * 7 + ns + odd * 3 + where));
              Placed x(int4 ? DType::int32 : DType::int8, {rows, int4 ? H / 8 : H}, 1);
              for (std::size_t b = 0; b < x.view.nbytes(); ++b)
                static_cast<std::uint8_t*>(x.view.data)[b] = static_cast<std::uint8_t>(rng());
              std::vector<float> sv(static_cast<std::size_t>(ns)), ov(sv.size());
              std::uniform_real_distribution<float> u(-2.f, 2.f);
              for (std::size_t i = 0; i < sv.size(); ++i) {
                sv[i] = u(rng);
                ov[i] = rng() % 2 ? -0.0f : 0.0f;
              }
              const std::int64_t at = where == 0 ? 0 : where == 1 ? ns / 2 : ns - 1;
              if (odd >= 0) ov[static_cast<std::size_t>(at)] = kOdd[odd];
              for (DType pdt : {DType::float32, DType::bfloat16}) {
                Tensor s = make_float(pdt, {ns}, sv), o = make_float(pdt, {ns}, ov);
                for (DType dst : kFloatTypes)
                  check_equivalent(
                      [&](std::vector<TensorView>& out) { xquant::anti_quant_out(out[0], x.view, s, o.view(), src); },
                      {{dst, {rows, H}}},
                      "anti_quant offsets " + std::string(xquant::quant_dtype_name(src)) + " [" + std::to_string(rows) +
                          ", " + std::to_string(H) + "] scales " + std::to_string(ns) + " odd " + std::to_string(odd) +
                          " at " + std::to_string(at) + " " + std::string(xquant::dtype_name(pdt)) + " -> " +
                          std::string(xquant::dtype_name(dst)));
              }
            }
}

// ---- The cpu kernels' own contract (src/cpu/cpu.hpp), below the operators' validation ----

// A dtype the kernels have no code for is a bug in their caller: on every target, the one dtype dispatch
// (VisitFloatDType, src/cpu/simd-inl.h) throws ErrorCode::internal_error before anything is written.
// (Each kernel used to switch on its own with a `default:` that ran the data as float32.)
TEST(CpuKernels, DtypeWithoutKernelIsAnInternalError) {
  namespace xd = xquant::detail;
  constexpr std::int64_t n = 100;
  std::vector<float> x(n, 1.5f), cmin(1, -1.0f), cmax(1, 2.0f);
  std::vector<std::uint8_t> y(4 * n, 0xA5), y2(4 * n, 0xA5), y3(4 * n, 0xA5), y4(4 * n, 0xA5);
  std::vector<float> grad(1, 7.0f), scale(n, 7.0f), offset(n, 7.0f);
  const xd::FakeQuantParams fq = xd::init_fake_quant_params(4.0f, 8, false, true);
  const xd::QuantizeParams qp{.scale = 2.0f, .zero_point = 0.0f};
  const xd::AntiQuantParams ap{.scale = 2.0f, .offset = 0.0f};
  const xquant::ChannelLayout layout{.outer = 1, .channels = 1, .inner = n};
  xd::BroadcastPlan plan{};
  plan.rank = 1;
  plan.shape[0] = n;
  plan.stride_x[0] = 1;  // x dense, clamps broadcast: a layout the SIMD walk takes
  const auto bad = [](const std::function<void()>& f, const std::string& what, const std::string& dtype) {
    SCOPED_TRACE(what);
    expect_error(f, xquant::ErrorCode::internal_error, "", {"internal error", dtype});
  };
  for (std::int64_t target : tested_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    bad([&] { xd::cpu_fake_quant({.dt = DType::int8, .x = x.data(), .y = y.data(), .layout = layout, .params = &fq}); },
        "fake_quant", "int8");
    bad(
        [&] {
          xd::cpu_fake_quant_backward({.dt = DType::int32,
                                       .grad_out = x.data(),
                                       .x = x.data(),
                                       .grad_in = y.data(),
                                       .layout = layout,
                                       .params = &fq,
                                       .grad_amax = grad.data()});
        },
        "fake_quant_backward with grad_amax", "int32");
    bad(
        [&] {
          xd::cpu_fake_quant_backward({.dt = DType::uint8,
                                       .grad_out = x.data(),
                                       .x = x.data(),
                                       .grad_in = y.data(),
                                       .layout = layout,
                                       .params = &fq,
                                       .grad_amax = nullptr});
        },
        "fake_quant_backward", "uint8");
    bad(
        [&] {
          xd::cpu_quantize({.dt = DType::int8,
                            .x = x.data(),
                            .q = QuantDType::qint8,
                            .y = y.data(),
                            .layout = layout,
                            .params = &qp,
                            .div_mode = true});
        },
        "quantize", "int8");
    bad(
        [&] {
          xd::cpu_quantize({.dt = DType::float32,
                            .x = x.data(),
                            .q = static_cast<QuantDType>(9),
                            .y = y.data(),
                            .layout = layout,
                            .params = &qp,
                            .div_mode = false});
        },
        "quantize output type", "quantized type 9");
    for (bool per_tensor : {false, true})
      bad(
          [&] {
            xd::cpu_dynamic_quant({.dt = DType::int8,
                                   .x = x.data(),
                                   .rows = 4,
                                   .cols = 25,
                                   .smooth_dt = DType::float32,
                                   .smooth = nullptr,
                                   .group_ends = nullptr,
                                   .num_groups = 0,
                                   .dst = QuantDType::qint8,
                                   .symmetric = false,
                                   .per_tensor = per_tensor,
                                   .per_channel = false,
                                   .channel_batches = 0,
                                   .channel_rows = 0,
                                   .y = y.data(),
                                   .scale = scale.data(),
                                   .offset = offset.data()});
          },
          per_tensor ? "dynamic_quant per tensor" : "dynamic_quant per token", "int8");
    bad(
        [&] {
          (void)xd::cpu_acts_ulq({.dt = DType::int8,
                                  .plan = plan,
                                  .x = x.data(),
                                  .clamp_min = cmin.data(),
                                  .clamp_max = cmax.data(),
                                  .fixed_min = false,
                                  .num_bits = 8,
                                  .y = y.data(),
                                  .clamp_min_mask = y2.data(),
                                  .clamp_max_mask = y3.data(),
                                  .x_clamped_loss = y4.data()});
        },
        "acts_ulq", "int8");
    bad(
        [&] {
          (void)xd::cpu_acts_ulq_backward({.dt = DType::int64,
                                           .plan = plan,
                                           .y_grad = x.data(),
                                           .clamp_min = cmin.data(),
                                           .clamp_max = cmax.data(),
                                           .clamp_min_mask = x.data(),
                                           .clamp_max_mask = x.data(),
                                           .x_clamped_loss = x.data(),
                                           .fixed_min = false,
                                           .num_bits = 8,
                                           .x_grad = y.data(),
                                           .clamp_min_grad = y2.data(),
                                           .clamp_max_grad = y3.data()});
        },
        "acts_ulq_backward", "int64");
    bad(
        [&] {
          xd::cpu_anti_quant({.src = QuantDType::qint8,
                              .x = y2.data(),
                              .dt = DType::int8,
                              .out = y.data(),
                              .layout = layout,
                              .params = &ap});
        },
        "anti_quant", "int8");
    bad(
        [&] {
          xd::cpu_anti_quant({.src = QuantDType::qint32,
                              .x = y2.data(),
                              .dt = DType::float32,
                              .out = y.data(),
                              .layout = layout,
                              .params = &ap});
        },
        "anti_quant input type", "qint32");
  }
  hwy::SetSupportedTargetsForTest(0);
  for (const auto* v : {&y, &y2, &y3, &y4})
    for (std::uint8_t b : *v) ASSERT_EQ(b, 0xA5) << "an output was written";
  EXPECT_EQ(grad[0], 7.0f);
  EXPECT_EQ(scale[0], 7.0f);
  EXPECT_EQ(offset[0], 7.0f);
}

// ActsULQ layouts without a SIMD walk (here x broadcast against a larger clamp tensor) are declined by
// the cpu kernels, which then write nothing; the backend registry runs the reference kernel for them
// (src/backends/registry.cpp; the results are compared in CpuEquivalence.ActsUlq).
TEST(CpuKernels, ActsUlqDeclinesLayoutsWithoutSimdWalk) {
  namespace xd = xquant::detail;
  std::vector<float> x(1, 0.5f), cmin(8, -1.0f), cmax(8, 2.0f), g(8, 1.0f);
  std::vector<std::uint8_t> y(32, 0xA5), y2(32, 0xA5), y3(32, 0xA5), y4(32, 0xA5);
  xd::BroadcastPlan plan{};
  plan.rank = 1;
  plan.shape[0] = 8;
  plan.stride_x[0] = 0;
  plan.stride_min[0] = 1;
  plan.stride_max[0] = 1;
  EXPECT_FALSE(xd::cpu_acts_ulq({.dt = DType::float32,
                                 .plan = plan,
                                 .x = x.data(),
                                 .clamp_min = cmin.data(),
                                 .clamp_max = cmax.data(),
                                 .fixed_min = false,
                                 .num_bits = 8,
                                 .y = y.data(),
                                 .clamp_min_mask = y2.data(),
                                 .clamp_max_mask = y3.data(),
                                 .x_clamped_loss = y4.data()}));
  EXPECT_FALSE(xd::cpu_acts_ulq_backward({.dt = DType::float32,
                                          .plan = plan,
                                          .y_grad = g.data(),
                                          .clamp_min = cmin.data(),
                                          .clamp_max = cmax.data(),
                                          .clamp_min_mask = g.data(),
                                          .clamp_max_mask = g.data(),
                                          .x_clamped_loss = g.data(),
                                          .fixed_min = false,
                                          .num_bits = 8,
                                          .x_grad = y.data(),
                                          .clamp_min_grad = y2.data(),
                                          .clamp_max_grad = y3.data()}));
  for (const auto* v : {&y, &y2, &y3, &y4})
    for (std::uint8_t b : *v) ASSERT_EQ(b, 0xA5) << "a declined call wrote an output";
}

}  // namespace

// ---- quantized matmuls (docs/semantics.md section 9) ----
namespace {

// Random int8 bytes (or int4 words) of `shape` placed at an odd offset.
Placed random_q(DType dt, const Shape& shape, std::mt19937& rng) {
  Placed p(dt, shape, 1);
  for (std::size_t b = 0; b < p.view.nbytes(); ++b)
    static_cast<std::uint8_t*>(p.view.data)[b] = static_cast<std::uint8_t>(rng());
  return p;
}

// Sizes around the cpu kernels (src/cpu/matmul.cpp): the dot kernel's 2 x 4 register blocks and 64 x 64
// tiles (x2 transposed, M <= 32), the GEMM kernel's 4 / 8-row register blocks, 96 x 256 tiles and
// 256-pair chunks of k (K = 520), odd K, every vector width (int16 lanes: 8 / 16 / 32), with extreme values (-128 *
// -128 products, int32 wrap-around of the bias) and edge scales (NaN, +-Inf, subnormal, huge).
TEST(CpuEquivalence, QuantMatmul) {
  const auto edges = edge_values();
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Sz {
    std::int64_t M, K, N;
  };
  for (bool int4 : {false, true})
    for (bool transpose : {false, true})
      for (Sz z : {Sz{1, 8, 8}, Sz{2, 16, 8}, Sz{3, 24, 40}, Sz{5, 32, 64}, Sz{1, 40, 72}, Sz{66, 72, 136},
                   Sz{7, 264, 16}, Sz{130, 8, 65 * 8}, Sz{37, 520, 24}})
        for (DType out_dt : {DType::int8, DType::float16, DType::bfloat16, DType::int32}) {
          if (!int4 && z.K == 8 && z.N == 8) z.K = 17, z.N = 5;  // odd int8 sizes
          const DType qdt = int4 ? DType::int32 : DType::int8;
          const std::int64_t d = int4 ? 8 : 1;
          Placed x1 = random_q(qdt, {z.M, z.K / d}, rng);
          Placed x2 = random_q(qdt, transpose ? Shape{z.N, z.K / d} : Shape{z.K, z.N / d}, rng);
          std::vector<float> sv(static_cast<std::size_t>(z.N)), pv(static_cast<std::size_t>(z.M)), bv(sv.size());
          for (auto& s : sv) s = rng() % 9 == 0 ? edges[rng() % edges.size()] : 0.01f * u(rng);
          for (auto& p : pv) p = 1.f + u(rng);
          for (auto& b : bv) b = 7.f * u(rng);
          Tensor s = make_float(DType::float32, {z.N}, sv), p = make_float(DType::float32, {z.M}, pv);
          Tensor bf = make_float(DType::bfloat16, {z.N}, bv);
          std::vector<std::int32_t> bi(static_cast<std::size_t>(z.N));
          for (auto& b : bi) b = static_cast<std::int32_t>(rng());
          Tensor bint = make_typed<std::int32_t>(DType::int32, {z.N}, bi);
          for (int opt = 0; opt < 3; ++opt) {
            xquant::QuantMatmulOptions o;
            o.transpose_x2 = transpose;
            const bool float_out = out_dt == DType::float16 || out_dt == DType::bfloat16;
            if (opt >= 1) o.bias = float_out && opt == 2 ? bf.view() : bint.view();
            if (opt == 2 && out_dt != DType::int32) o.pertoken_scale = p.view();
            if (opt == 1 && out_dt == DType::int8) o.offset = s.view();  // any float32 [N] will do
            check_equivalent(
                [&](std::vector<TensorView>& out) { xquant::quant_matmul_out(out[0], x1.view, x2.view, s, o); },
                {{out_dt, {z.M, z.N}}},
                "quant_matmul int4 " + std::to_string(int4) + " transpose " + std::to_string(transpose) + " [" +
                    std::to_string(z.M) + ", " + std::to_string(z.K) + ", " + std::to_string(z.N) + "] opt " +
                    std::to_string(opt) + " -> " + std::string(xquant::dtype_name(out_dt)));
          }
        }
}

// The A8W4 per-group mode (9.3.1): int8 x1, int4 x2 (plain and transposed), k groups of 8 to 256 (one group,
// many groups), the GEMM kernel's row tiles (2 * M rows per group), scales with edge values (NaN, Inf, huge:
// the float16 fold overflows), float32 and int64 scales, offset and pertoken_scale on and off.
TEST(CpuEquivalence, QuantMatmulA8W4) {
  const auto edges = edge_values();
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  struct Sz {
    std::int64_t M, K, N, G;
  };
  for (bool transpose : {false, true})
    for (Sz z : {Sz{1, 8, 8, 8}, Sz{3, 64, 16, 32}, Sz{1, 512, 72, 256}, Sz{50, 96, 264, 32}, Sz{7, 256, 8, 256}})
      for (DType out_dt : {DType::float16, DType::bfloat16})
        for (int opt = 0; opt < 3; ++opt) {
          Placed x1 = random_q(DType::int8, {z.M, z.K}, rng);
          Placed x2 = random_q(DType::int32, transpose ? Shape{z.N, z.K / 8} : Shape{z.K, z.N / 8}, rng);
          const std::int64_t ns = (z.K / z.G) * z.N;
          std::vector<float> sv(static_cast<std::size_t>(ns)), pv(static_cast<std::size_t>(z.M)),
              ov(static_cast<std::size_t>(z.N));
          for (auto& s : sv) s = rng() % 11 == 0 ? edges[rng() % edges.size()] : (opt == 2 ? 40.f : 1.f) * u(rng);
          for (auto& p : pv) p = 0.02f * u(rng);
          for (auto& o : ov) o = 8.f * (u(rng) - 0.5f);
          Tensor s = make_float(DType::float32, {z.K / z.G, z.N}, sv);
          Tensor p = make_float(DType::float32, {z.M, 1}, pv), off = make_float(DType::float32, {z.N}, ov);
          Tensor s64 = xquant::trans_quant_param(ConstTensorView(s.data(), DType::float32, {ns}));
          const ConstTensorView s64v(s64.data(), DType::int64, {z.K / z.G, z.N});
          xquant::QuantMatmulOptions o;
          o.transpose_x2 = transpose;
          o.group_sizes = {0, 0, z.G};
          if (opt >= 1) o.offset = off.view(), o.pertoken_scale = p.view();
          const ConstTensorView scale = opt == 1 ? s64v : s.view();
          check_equivalent(
              [&](std::vector<TensorView>& out) { xquant::quant_matmul_out(out[0], x1.view, x2.view, scale, o); },
              {{out_dt, {z.M, z.N}}},
              "quant_matmul A8W4 transpose " + std::to_string(transpose) + " [" + std::to_string(z.M) + ", " +
                  std::to_string(z.K) + ", " + std::to_string(z.N) + "] G " + std::to_string(z.G) + " opt " +
                  std::to_string(opt) + " -> " + std::string(xquant::dtype_name(out_dt)));
        }
}

// Decode (M <= 24: 128-column blocks, 16-row chunks of k) and prefill (M > 24: 96-row tiles, 128-column
// blocks, 256-row chunks of k) paths, register blocks of 4 / 8 rows and their shorter tails.
TEST(CpuEquivalence, WeightQuantBatchMatmul) {
  const auto edges = edge_values();
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Sz {
    std::int64_t M, K, N;
  };
  for (DType dt : {DType::float16, DType::bfloat16})
    for (bool int4 : {false, true})
      for (bool transpose : {false, true})
        for (Sz z : {Sz{1, 8, 8}, Sz{3, 72, 24}, Sz{5, 96, 64}, Sz{6, 40, 72}, Sz{9, 128, 136}, Sz{1, 264, 200},
                     Sz{30, 264, 40}, Sz{100, 40, 136}})
          for (int kind : {0, 1, 2}) {  // per tensor, per channel, per group
            if (kind == 2 && z.K < 64) continue;
            const std::int64_t d = int4 ? 8 : 1;
            const DType qdt = int4 ? DType::int32 : DType::int8;
            Placed w = random_q(qdt, transpose ? Shape{z.N, z.K / d} : Shape{z.K, z.N / d}, rng);
            std::vector<float> xv(static_cast<std::size_t>(z.M * z.K));
            for (auto& v : xv) v = rng() % 13 == 0 ? edges[rng() % edges.size()] : 4.f * u(rng);
            Placed x = placed_floats(dt, {z.M, z.K}, xv, 1);
            const std::int64_t gs = kind == 2 ? 32 : 0, G = kind == 2 ? (z.K + 31) / 32 : 1;
            const Shape ps = kind == 0 ? Shape{1} : kind == 1 ? Shape{z.N} : Shape{G, z.N};
            std::vector<float> sv(static_cast<std::size_t>(xquant::shape_numel(ps))), ov(sv.size()),
                bv(static_cast<std::size_t>(z.N));
            for (auto& s : sv) s = rng() % 11 == 0 ? edges[rng() % edges.size()] : 0.02f * u(rng);
            for (auto& o : ov) o = 9.f * u(rng);
            for (auto& b : bv) b = u(rng);
            Tensor s = make_float(dt, ps, sv), o = make_float(dt, ps, ov), b = make_float(DType::float32, {z.N}, bv);
            for (int opt = 0; opt < 2; ++opt) {
              xquant::WeightQuantMatmulOptions op;
              op.transpose_weight = transpose;
              op.antiquant_group_size = gs;
              if (opt == 1) op.antiquant_offset = o.view(), op.bias = b.view();
              check_equivalent(
                  [&](std::vector<TensorView>& out) {
                    xquant::weight_quant_batchmatmul_out(out[0], x.view, w.view, s, op);
                  },
                  {{dt, {z.M, z.N}}},
                  "weight_quant_batchmatmul " + std::string(xquant::dtype_name(dt)) + " int4 " + std::to_string(int4) +
                      " transpose " + std::to_string(transpose) + " [" + std::to_string(z.M) + ", " +
                      std::to_string(z.K) + ", " + std::to_string(z.N) + "] kind " + std::to_string(kind) + " opt " +
                      std::to_string(opt));
            }
          }
}

}  // namespace
