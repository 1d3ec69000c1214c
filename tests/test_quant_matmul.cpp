// Tests of the quantized matmuls (docs/semantics.md section 9): npu_trans_quant_param's int64 words,
// npu_convert_weight_to_int4pack's nibble order, npu_quant_matmul and npu_weight_quant_batchmatmul against
// goldens computed independently here (plain loops, int64 sums, the documented epilogue order), hand
// values, ties, saturation, NaN / Inf, int4 nibble order, every bias / scale dtype, batch broadcasting,
// empty and odd shapes, the reference and the cpu backend both, and every validation path (nothing is
// written on error). CPU-backend equivalence across SIMD targets and thread counts is in
// test_cpu_equivalence.cpp.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "xquant/runtime.hpp"

namespace {

using namespace xqtest;
using xquant::Backend;
using xquant::ErrorCode;

const Backend kBackends[] = {Backend::reference, Backend::cpu};

struct BackendGuard {
  ~BackendGuard() { xquant::set_backend(Backend::cpu); }
};

// ---- the test's own int4 packing and 16-bit helpers ----
std::vector<std::int32_t> pack4(const std::vector<int>& v) {
  std::vector<std::int32_t> w(v.size() / 8, 0);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t nib = static_cast<std::uint32_t>(v[i]) & 0xFu;
    w[i / 8] = static_cast<std::int32_t>(static_cast<std::uint32_t>(w[i / 8]) | (nib << (4 * (i % 8))));
  }
  return w;
}
float r16(DType dt, float v) {
  return dt == DType::float16 ? xquant::half_to_float(xquant::float_to_half(v))
                              : xquant::bfloat16_to_float(xquant::float_to_bfloat16(v));
}
std::uint16_t bits16(DType dt, float v) {
  if (std::isnan(v)) v = std::bit_cast<float>(0x7FC00000u);  // the documented canonical NaN
  return dt == DType::float16 ? xquant::float_to_half(v) : xquant::float_to_bfloat16(v);
}
std::uint64_t u64(const Tensor& t, std::size_t i) { return static_cast<std::uint64_t>(t.data<std::int64_t>()[i]); }

// ======================================= trans_quant_param =======================================

TEST(TransQuantParam, DocumentedExampleAndFields) {
  // torch_npu's example output 70507248869376 = 0x40203F85E000: scale 1.0458984375, offset 1.
  Tensor s = make_float(DType::float32, {4}, {1.0458984375f, 1.0458984375f, 1.0458984375f, 1.0458984375f});
  Tensor o = make_float(DType::float32, {4}, {1.0f, -2.0f, -1.0f, 0.0f});
  Tensor w = xquant::trans_quant_param(s, o.view());
  ASSERT_EQ(w.dtype(), DType::int64);
  EXPECT_EQ(u64(w, 0), 70507248869376ull);
  EXPECT_EQ(u64(w, 1), 0x3F85E000ull | (1ull << 46) | (0x1FEull << 37));
  EXPECT_EQ(u64(w, 2), 0x3F85E000ull | (1ull << 46) | (0x1FFull << 37));
  EXPECT_EQ(u64(w, 3), 0x3F85E000ull | (1ull << 46));
  Tensor w0 = xquant::trans_quant_param(s);  // no offset: no field
  EXPECT_EQ(u64(w0, 0), 0x3F85E000ull | (1ull << 46));
}

TEST(TransQuantParam, TruncationRoundingAndOffsetRules) {
  const std::uint32_t in[] = {0x3F8FFFFFu, 0x3F801000u, 0x3F800FFFu, 0xBF801000u, 0x7F7FF000u, 0x7F800001u};
  std::vector<float> sv;
  for (std::uint32_t b : in) sv.push_back(std::bit_cast<float>(b));
  Tensor s = make_float(DType::float32, {6}, sv);
  Tensor t0 = xquant::trans_quant_param(s, std::nullopt, 0);
  Tensor t1 = xquant::trans_quant_param(s, std::nullopt, 1);
  const std::uint32_t want0[] = {0x3F8FE000u, 0x3F800000u, 0x3F800000u, 0xBF800000u, 0x7F7FE000u, 0x7F800000u};
  const std::uint32_t want1[] = {0x3F900000u, 0x3F802000u, 0x3F800000u, 0xBF802000u, 0x7F800000u, 0x7F800000u};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(u64(t0, i), want0[i] | (1ull << 46)) << i;
    EXPECT_EQ(u64(t1, i), want1[i] | (1ull << 46)) << i;
  }
  // offset: rint (ties to even), clamp to [-256, 255], NaN -> 0; a [1] scale broadcasts to the offsets
  Tensor one = make_float(DType::float32, {1}, {1.0f});
  Tensor o = make_float(DType::float32, {9}, {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 300.f, -300.f, kNaN, -kInf});
  Tensor w = xquant::trans_quant_param(one, o.view());
  ASSERT_EQ(w.shape(), (Shape{9}));
  const int want_o[] = {0, 2, 2, 0, -2, 255, -256, 0, -256};
  for (int i = 0; i < 9; ++i)
    EXPECT_EQ(u64(w, i), 0x3F800000ull | (1ull << 46) | ((static_cast<std::uint64_t>(want_o[i]) & 0x1FFu) << 37)) << i;
  // a [1] offset broadcasts to the scales; 2-D [1, n] keeps its shape
  Tensor s2 = make_float(DType::float32, {1, 3}, {1.f, 2.f, 4.f});
  Tensor o2 = make_float(DType::float32, {1, 3}, {1.f, 1.f, 1.f});
  Tensor w2 = xquant::trans_quant_param(s2, o2.view());
  EXPECT_EQ(w2.shape(), (Shape{1, 3}));
  EXPECT_EQ(u64(w2, 2), 0x40800000ull | (1ull << 46) | (1ull << 37));
  Tensor o1 = make_float(DType::float32, {1}, {3.f});
  Tensor s3 = make_float(DType::float32, {3}, {1.f, 2.f, 4.f});
  EXPECT_EQ(xquant::trans_quant_param(s3, o1.view()).shape(), (Shape{3}));
}

TEST(TransQuantParamErrors, EveryArgument) {
  Tensor s = make_float(DType::float32, {3}, {1.f, 2.f, 3.f});
  Tensor out(DType::int64, {3});
  fill_bytes(out);
  expect_error([&] { xquant::trans_quant_param_out(out, s, std::nullopt, 2); }, ErrorCode::invalid_argument,
               "round_mode", {"2"});
  Tensor sb = make_float(DType::bfloat16, {3}, {1.f, 2.f, 3.f});
  expect_error([&] { xquant::trans_quant_param_out(out, sb); }, ErrorCode::dtype_mismatch, "scale", {"bfloat16"});
  Tensor s2 = make_float(DType::float32, {3, 1}, {1.f, 2.f, 3.f});
  expect_error([&] { xquant::trans_quant_param_out(out, s2); }, ErrorCode::shape_mismatch, "scale", {"[3, 1]"});
  Tensor o2 = make_float(DType::float32, {2}, {1.f, 2.f});
  expect_error([&] { xquant::trans_quant_param_out(out, s, o2.view()); }, ErrorCode::shape_mismatch, "offset", {"[2]"});
  Tensor bad_out(DType::int32, {3});
  expect_error([&] { xquant::trans_quant_param_out(bad_out, s); }, ErrorCode::dtype_mismatch, "out");
  EXPECT_TRUE(all_bytes(out));
}

// ======================================= convert_weight_to_int4pack =======================================

TEST(ConvertWeightToInt4Pack, NibbleOrderShapesAndRoundTrip) {
  // section 1.1: -2, 1, 2, 3, 7, -8, 0, 7 pack into 0x7087321E (first element in the lowest nibble)
  Tensor w = make_typed<std::int32_t>(DType::int32, {2, 8}, {-2, 1, 2, 3, 7, -8, 0, 7, 0, 1, 2, 3, 4, 5, 6, 7});
  Tensor p = xquant::convert_weight_to_int4pack(w);
  ASSERT_EQ(p.shape(), (Shape{2, 1}));
  EXPECT_EQ(static_cast<std::uint32_t>(p.data<std::int32_t>()[0]), 0x7087321Eu);
  EXPECT_EQ(static_cast<std::uint32_t>(p.data<std::int32_t>()[1]), 0x76543210u);
  // anti_quant reads the same order back
  std::mt19937 rng(5);
  std::vector<int> vals(3 * 24);
  for (auto& v : vals) v = static_cast<int>(rng() % 16) - 8;
  Tensor wv = make_typed<std::int32_t>(DType::int32, {3, 24}, std::vector<std::int32_t>(vals.begin(), vals.end()));
  Tensor pk = xquant::convert_weight_to_int4pack(wv);
  EXPECT_EQ(to_vector<std::int32_t>(pk), pack4(vals));
  Tensor one = make_float(DType::float32, {1}, {1.f});
  Tensor back = xquant::anti_quant(pk, one, std::nullopt, DType::float32, xquant::QuantDType::quint4x2);
  const auto bf = to_floats(back);
  for (std::size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(bf[i], static_cast<float>(vals[i])) << i;
  // empty
  Tensor e(DType::int32, {0, 8});
  EXPECT_EQ(xquant::convert_weight_to_int4pack(e).shape(), (Shape{0, 1}));
}

TEST(ConvertWeightToInt4PackErrors, EveryArgument) {
  Tensor w = make_typed<std::int32_t>(DType::int32, {1, 16}, {0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 8, 0, 0, 0, 0});
  Tensor out(DType::int32, {1, 2});
  fill_bytes(out);
  expect_error([&] { xquant::convert_weight_to_int4pack_out(out, w); }, ErrorCode::invalid_argument, "weight",
               {"value 8", "index 11", "[-8, 7]"});
  EXPECT_TRUE(all_bytes(out));  // nothing written, not even the valid first word
  Tensor w7 = make_typed<std::int32_t>(DType::int32, {1, 7}, {0, 0, 0, 0, 0, 0, 0});
  expect_error([&] { xquant::convert_weight_to_int4pack(w7); }, ErrorCode::shape_mismatch, "weight", {"multiple of 8"});
  Tensor w8 = make_typed<std::int8_t>(DType::int8, {1, 8}, {0, 0, 0, 0, 0, 0, 0, 0});
  expect_error([&] { xquant::convert_weight_to_int4pack(w8); }, ErrorCode::dtype_mismatch, "weight", {"int8"});
  Tensor ok = make_typed<std::int32_t>(DType::int32, {1, 16}, std::vector<std::int32_t>(16, -8));
  Tensor bad(DType::int32, {2, 1});
  expect_error([&] { xquant::convert_weight_to_int4pack_out(bad, ok); }, ErrorCode::shape_mismatch, "out");
}

// ======================================= quant_matmul =======================================

// One quant_matmul problem, built from logical int values; golden computed here.
struct Qmm {
  bool int4 = false, transpose = false;
  Shape b1, b2;  // batch dims
  std::int64_t M = 1, K = 1, N = 1;
  std::vector<int> x1, x2;  // logical values: x1 [B1][M][K]; x2 [B2][K][N] (always in K x N order here)
  DType scale_dt = DType::float32;
  std::vector<float> scale;   // [1] or [N] (float values; int64: encoded with trans_quant_param)
  std::vector<float> offset;  // explicit offset (float32), or the int64 offsets when scale_dt == int64
  std::vector<float> pertoken;
  DType bias_dt = DType::int32;
  std::vector<float> bias;  // values (int32: integral)
  bool bias_batched = false;
  DType out_dt = DType::int8;

  std::int64_t nb(const Shape& s) const { return xquant::shape_numel(s); }
  Shape bshape() const {
    const std::size_t r = std::max(b1.size(), b2.size());
    Shape o(r);
    for (std::size_t i = 0; i < r; ++i) {
      const std::int64_t d1 = i + b1.size() >= r ? b1[i + b1.size() - r] : 1;
      const std::int64_t d2 = i + b2.size() >= r ? b2[i + b2.size() - r] : 1;
      o[i] = d1 == 1 ? d2 : d1;
    }
    return o;
  }
  Shape out_shape() const {
    Shape s = bshape();
    s.push_back(M);
    s.push_back(N);
    return s;
  }
  // batch index of operand with dims `bd` for output batch b
  std::int64_t src_batch(const Shape& bd, std::int64_t b) const {
    const Shape o = bshape();
    std::int64_t idx = 0, stride = 1;
    for (std::int64_t i = static_cast<std::int64_t>(o.size()) - 1; i >= 0; --i) {
      const std::int64_t c = b % o[i];
      b /= o[i];
      const std::int64_t j = i - static_cast<std::int64_t>(o.size() - bd.size());
      if (j >= 0) {
        if (bd[j] != 1) idx += c * stride;
        stride *= bd[j];
      }
    }
    return idx;
  }

  Tensor x1_tensor() const {
    Shape s = b1;
    s.push_back(M);
    s.push_back(int4 ? K / 8 : K);
    if (int4) return make_typed<std::int32_t>(DType::int32, s, pack4(x1));
    return make_typed<std::int8_t>(DType::int8, s, std::vector<std::int8_t>(x1.begin(), x1.end()));
  }
  Tensor x2_tensor() const {
    // storage: [B2][K][N], or transposed [B2][N][K]
    std::vector<int> st(x2.size());
    const std::int64_t B = nb(b2);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t k = 0; k < K; ++k)
        for (std::int64_t n = 0; n < N; ++n)
          st[static_cast<std::size_t>(b * K * N + (transpose ? n * K + k : k * N + n))] =
              x2[static_cast<std::size_t>(b * K * N + k * N + n)];
    Shape s = b2;
    const std::int64_t inner = transpose ? K : N;
    s.push_back(transpose ? N : K);
    s.push_back(int4 ? inner / 8 : inner);
    if (int4) return make_typed<std::int32_t>(DType::int32, s, pack4(st));
    return make_typed<std::int8_t>(DType::int8, s, std::vector<std::int8_t>(st.begin(), st.end()));
  }
  Tensor scale_tensor() const {
    const std::int64_t n = static_cast<std::int64_t>(scale.size());
    if (scale_dt != DType::int64) return make_float(scale_dt, {n}, scale);
    Tensor s = make_float(DType::float32, {n}, scale);
    if (offset.empty()) return xquant::trans_quant_param(s);
    Tensor o = make_float(DType::float32, {static_cast<std::int64_t>(offset.size())}, offset);
    return xquant::trans_quant_param(s, o.view());
  }
  Tensor bias_tensor() const {
    const Shape s = bias_batched ? Shape{out_shape()[0], 1, N} : Shape{N};
    if (bias_dt == DType::int32) {
      std::vector<std::int32_t> v;
      for (float f : bias) v.push_back(static_cast<std::int32_t>(f));
      return make_typed<std::int32_t>(DType::int32, s, v);
    }
    return make_float(bias_dt, s, bias);
  }

  // The golden, element by element, in the documented order.
  std::vector<std::uint32_t> golden() const {
    const Shape os = out_shape();
    const std::int64_t B = nb(bshape());
    std::vector<std::uint32_t> r(static_cast<std::size_t>(B * M * N));
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t i1 = src_batch(b1, b), i2 = src_batch(b2, b);
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          std::int64_t sum = 0;
          for (std::int64_t k = 0; k < K; ++k)
            sum += static_cast<std::int64_t>(x1[static_cast<std::size_t>((i1 * M + m) * K + k)]) *
                   x2[static_cast<std::size_t>((i2 * K + k) * N + n)];
          std::int32_t a = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(sum)));
          const std::size_t bi = static_cast<std::size_t>((bias_batched ? b * N : 0) + n);
          if (!bias.empty() && bias_dt == DType::int32)
            a = static_cast<std::int32_t>(static_cast<std::uint32_t>(a) +
                                          static_cast<std::uint32_t>(static_cast<std::int32_t>(bias[bi])));
          const std::size_t o = static_cast<std::size_t>((b * M + m) * N + n);
          if (out_dt == DType::int32) {
            r[o] = static_cast<std::uint32_t>(a);
            continue;
          }
          const std::size_t c = scale.size() == 1 ? 0 : static_cast<std::size_t>(n);
          const std::size_t oc = offset.size() == 1 ? 0 : static_cast<std::size_t>(n);
          float s = scale[c], off = 0.0f;
          bool has_off = !offset.empty();
          if (scale_dt == DType::bfloat16) s = r16(DType::bfloat16, s);
          if (scale_dt == DType::int64) {  // 19 bits kept; offset rounded, clamped to 9 bits
            s = std::bit_cast<float>(std::bit_cast<std::uint32_t>(s) & 0xFFFFE000u);
            has_off = true;
            off = offset.empty() ? 0.0f : std::clamp(std::nearbyint(offset[oc]), -256.f, 255.f);
          } else if (has_off) {
            off = offset[oc];
          }
          float v = static_cast<float>(a);
          v = v * s;
          if (!pertoken.empty()) v = v * pertoken[static_cast<std::size_t>(m)];
          if (!bias.empty() && bias_dt != DType::int32) {
            const float bv = bias_dt == DType::float32 ? bias[bi] : r16(bias_dt, bias[bi]);
            v = v + bv;
          }
          if (has_off) v = v + off;
          if (out_dt == DType::int8) {
            const float rr = std::nearbyint(v);
            const int q = std::isnan(rr) ? 0 : rr > 127.f ? 127 : rr < -128.f ? -128 : static_cast<int>(rr);
            r[o] = static_cast<std::uint32_t>(q) & 0xFFu;
          } else {
            r[o] = bits16(out_dt, v);
          }
        }
    }
    return r;
  }
  std::vector<std::uint32_t> got(const Tensor& t) const {
    std::vector<std::uint32_t> r(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < r.size(); ++i) {
      switch (t.dtype()) {
        case DType::int8:
          r[i] = static_cast<std::uint32_t>(t.data<std::int8_t>()[i]) & 0xFFu;
          break;
        case DType::int32:
          r[i] = static_cast<std::uint32_t>(t.data<std::int32_t>()[i]);
          break;
        default:
          r[i] = t.data<std::uint16_t>()[i];
      }
    }
    return r;
  }
  Tensor run() const {
    Tensor a = x1_tensor(), b = x2_tensor(), s = scale_tensor();
    Tensor o = offset.empty() || scale_dt == DType::int64
                   ? Tensor()
                   : make_float(DType::float32, {static_cast<std::int64_t>(offset.size())}, offset);
    Tensor p = pertoken.empty() ? Tensor() : make_float(DType::float32, {M}, pertoken);
    Tensor bi = bias.empty() ? Tensor() : bias_tensor();
    xquant::QuantMatmulOptions opt;
    if (!offset.empty() && scale_dt != DType::int64) opt.offset = o.view();
    if (!pertoken.empty()) opt.pertoken_scale = p.view();
    if (!bias.empty()) opt.bias = bi.view();
    opt.transpose_x2 = transpose;
    return xquant::quant_matmul(a, b, s, opt, out_dt);
  }
  void check(const std::string& what) const {
    BackendGuard g;
    const auto want = golden();
    for (Backend be : kBackends) {
      xquant::set_backend(be);
      Tensor t = run();
      ASSERT_EQ(t.shape(), out_shape()) << what;
      ASSERT_EQ(t.dtype(), out_dt) << what;
      const auto have = got(t);
      for (std::size_t i = 0; i < want.size(); ++i)
        if (have[i] != want[i]) {
          ADD_FAILURE() << what << " backend " << (be == Backend::cpu ? "cpu" : "reference") << " element " << i
                        << ": got 0x" << std::hex << have[i] << " want 0x" << want[i];
          return;
        }
    }
  }
};

void random_fill(Qmm& q, std::mt19937& rng) {
  const int lo = q.int4 ? -8 : -128, span = q.int4 ? 16 : 256;
  q.x1.resize(static_cast<std::size_t>(q.nb(q.b1) * q.M * q.K));
  q.x2.resize(static_cast<std::size_t>(q.nb(q.b2) * q.K * q.N));
  for (auto& v : q.x1) v = lo + static_cast<int>(rng() % span);
  for (auto& v : q.x2) v = lo + static_cast<int>(rng() % span);
}

TEST(QuantMatmul, HandValues) {
  Qmm q;
  q.M = 1, q.K = 2, q.N = 1;
  q.x1 = {1, 2};
  q.x2 = {3, 4};
  q.scale = {0.5f};
  q.bias = {1.f};  // acc 11, a 12
  Tensor t = q.run();
  EXPECT_EQ(t.data<std::int8_t>()[0], 6);
  q.out_dt = DType::float16;
  EXPECT_EQ(q.run().data<std::uint16_t>()[0], xquant::float_to_half(6.0f));
  q.out_dt = DType::int32;
  EXPECT_EQ(q.run().data<std::int32_t>()[0], 12);  // the accumulator + bias, no scale
  // ties to even: 5 * 0.5 = 2.5 -> 2; 7 * 0.5 = 3.5 -> 4; -5 * 0.5 -> -2
  Qmm t2;
  t2.M = 1, t2.K = 2, t2.N = 3;
  t2.x1 = {1, 1};
  t2.x2 = {1, 3, -1, 4, 4, -4};
  t2.scale = {0.5f};
  Tensor r = t2.run();
  EXPECT_EQ(r.data<std::int8_t>()[0], 2);
  EXPECT_EQ(r.data<std::int8_t>()[1], 4);
  EXPECT_EQ(r.data<std::int8_t>()[2], -2);
  t2.check("ties");
}

// The A8W4 per-group mode (docs/semantics.md 9.3.1) by hand: x1 = [17, 0 x 7], every weight 1, K = G = 8,
// scale 0.5. hi = [1, 0 x 7], lo = [-7, -8 x 7]: H = 1, L = -63; sum_hi = half(0.5), sum_lo = half(-31.5);
// v = 0.5 * 16 - 31.5 = -23.5 (= (x - 8) @ w * 0.5); with offset 32 (= 8 * sum_k w * 0.5, the correction
// Ascend code passes) v = 8.5 = x @ w * 0.5; pertoken 2 gives 17.
TEST(QuantMatmul, A8W4HandValues) {
  std::vector<std::int8_t> x1v = {17, 0, 0, 0, 0, 0, 0, 0};
  Tensor x1 = make_typed<std::int8_t>(DType::int8, {1, 8}, x1v);
  std::vector<std::int32_t> wv(8, 0x11111111);  // [K = 8, N / 8 = 1]: eight int4 ones per word
  Tensor x2 = make_typed<std::int32_t>(DType::int32, {8, 1}, wv);
  Tensor s = make_float(DType::float32, {1, 8}, std::vector<float>(8, 0.5f));
  xquant::QuantMatmulOptions o;
  o.group_sizes = {0, 0, 8};
  Tensor y = xquant::quant_matmul(x1.view(), x2.view(), s.view(), o, DType::float16);
  ASSERT_EQ(y.shape(), (xquant::Shape{1, 8}));
  for (int n = 0; n < 8; ++n) EXPECT_EQ(y.data<std::uint16_t>()[n], xquant::float_to_half(-23.5f));
  Tensor off = make_float(DType::float32, {1}, {32.0f});
  Tensor pt = make_float(DType::float32, {1, 1}, {2.0f});
  o.offset = off.view();
  y = xquant::quant_matmul(x1.view(), x2.view(), s.view(), o, DType::bfloat16);
  EXPECT_EQ(y.data<std::uint16_t>()[0], xquant::float_to_bfloat16(8.5f));
  o.pertoken_scale = pt.view();
  y = xquant::quant_matmul(x1.view(), x2.view(), s.view(), o, DType::float16);
  EXPECT_EQ(y.data<std::uint16_t>()[7], xquant::float_to_half(17.0f));
  // planning gives the same shape; a bias is refused
  EXPECT_EQ(xquant::quant_matmul_output_shape(x1.view(), x2.view(), s.view(), o, DType::float16), (xquant::Shape{1, 8}));
  Tensor b = make_typed<std::int32_t>(DType::int32, {8}, std::vector<std::int32_t>(8, 0));
  o.bias = b.view();
  EXPECT_THROW(xquant::quant_matmul(x1.view(), x2.view(), s.view(), o, DType::float16), xquant::Error);
}

TEST(QuantMatmul, ScaleForms) {
  // x1 [1, 2] = [1, 2]; x2 [2, 3]: columns give acc = 3, 5, -7
  Tensor x1 = make_typed<std::int8_t>(DType::int8, {1, 2}, {1, 2});
  Tensor x2 = make_typed<std::int8_t>(DType::int8, {2, 3}, {1, 1, -1, 1, 2, -3});
  BackendGuard g;
  for (Backend be : kBackends) {
    xquant::set_backend(be);
    // 2-D [1, N] float32 scale, float16 out: 3 * 0.5, 5 * 0.25, -7 * 2
    Tensor s2 = make_float(DType::float32, {1, 3}, {0.5f, 0.25f, 2.f});
    Tensor r = xquant::quant_matmul(x1, x2, s2, {}, DType::float16);
    EXPECT_EQ(to_floats(r), (std::vector<float>{1.5f, 1.25f, -14.f}));
    // int64 words holding only the float32 bits (no flag, no offset: how vllm-ascend's w8a8 builds
    // deq_scale), 1-D [N]: the low 32 bits are the scale, the offset field is 0 (added: -0 -> +0)
    std::vector<std::int64_t> raw;
    for (float f : {0.5f, -0.25f, 0.0f}) raw.push_back(static_cast<std::int64_t>(std::bit_cast<std::uint32_t>(f)));
    Tensor s64 = make_typed<std::int64_t>(DType::int64, {3}, raw);
    Tensor r64 = xquant::quant_matmul(x1, x2, s64, {}, DType::float16);
    EXPECT_EQ(to_vector<std::uint16_t>(r64),
              (std::vector<std::uint16_t>{xquant::float_to_half(1.5f), xquant::float_to_half(-1.25f), 0x0000}));
    // [1, 1] int64 with an offset from trans_quant_param, int8 out: rint(acc * 0.5 + 3)
    Tensor s11 = xquant::trans_quant_param(make_float(DType::float32, {1, 1}, {0.5f}),
                                           make_float(DType::float32, {1, 1}, {3.f}).view());
    Tensor r8 = xquant::quant_matmul(x1, x2, s11);
    EXPECT_EQ(to_vector<std::int8_t>(r8), (std::vector<std::int8_t>{4, 6, 0}));  // 4.5 -> 4, 5.5 -> 6, -0.5 -> -0
  }
}

TEST(QuantMatmul, SaturationNaNInfAndLargeAccumulators) {
  Qmm q;
  q.M = 2, q.K = 16, q.N = 5;
  q.x1.assign(32, 127);
  q.x1[16] = -128;
  q.x2.assign(80, -128);
  q.scale = {1.f, kNaN, kInf, -kInf, 1e-30f};  // saturation, NaN -> 0, +-Inf, underflow to +-0
  q.check("int8 saturation");
  q.out_dt = DType::float16;  // 127 * -128 * 16 = -260096 overflows float16 to -Inf; NaN canonical
  q.check("float16 overflow and NaN");
  q.out_dt = DType::bfloat16;
  q.check("bfloat16");
  // accumulators beyond 2^24 round when converted to float32 (ties to even)
  Qmm big;
  big.M = 1, big.K = 1100, big.N = 2;
  big.x1.assign(1100, -128);
  big.x2.assign(2200, -128);
  big.x2[1] = 127;
  big.scale = {1.0f};
  big.out_dt = DType::float16;
  big.check("large accumulator");
  big.out_dt = DType::int32;
  big.bias = {2147483647.f - 0.f, -5.f};  // wraps modulo 2^32
  big.bias[0] = 2147483520.f;
  big.check("int32 wrap");
}

TEST(QuantMatmul, RandomAgainstGoldenEveryDtypeCombination) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int cases = 0;
  for (bool int4 : {false, true})
    for (bool transpose : {false, true})
      for (auto [M, K, N] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 8, 8},
                             {3, 24, 16},
                             {5, 40, 72},
                             {2, 16, 8},
                             {7, 64, 40}})
        for (DType out_dt : {DType::int8, DType::float16, DType::bfloat16, DType::int32})
          for (DType scale_dt : {DType::float32, DType::bfloat16, DType::int64})
            for (int extras = 0; extras < 4; ++extras) {
              Qmm q;
              q.int4 = int4, q.transpose = transpose, q.M = M, q.K = K, q.N = N, q.out_dt = out_dt,
              q.scale_dt = scale_dt;
              random_fill(q, rng);
              const bool per_col = rng() % 2;
              q.scale.resize(per_col ? N : 1);
              for (auto& s : q.scale) s = u(rng) * (int4 ? 0.05f : 0.002f);
              if (out_dt == DType::int8 && (extras & 1)) {  // explicit offset, or the int64 one
                q.offset.resize(rng() % 2 ? N : 1);
                for (auto& o : q.offset) o = 20.f * u(rng);
                if (scale_dt == DType::int64) q.offset.resize(q.scale.size());
              }
              if (out_dt != DType::int32 && (extras & 2)) {
                q.pertoken.resize(static_cast<std::size_t>(M));
                for (auto& p : q.pertoken) p = 1.f + u(rng);
              }
              const int bias_kind = static_cast<int>(rng() % 5);  // none, int32, float32, float16, bfloat16
              const bool float_out = out_dt == DType::float16 || out_dt == DType::bfloat16;
              if (bias_kind == 1 || (bias_kind > 1 && float_out)) {
                q.bias_dt = bias_kind == 1   ? DType::int32
                            : bias_kind == 2 ? DType::float32
                            : bias_kind == 3 ? DType::float16
                                             : DType::bfloat16;
                q.bias.resize(static_cast<std::size_t>(N));
                for (auto& b : q.bias) b = q.bias_dt == DType::int32 ? std::floor(1000.f * u(rng)) : 5.f * u(rng);
              }
              q.check("int4 " + std::to_string(int4) + " transpose " + std::to_string(transpose) + " M" +
                      std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N) + " out " +
                      std::string(xquant::dtype_name(out_dt)) + " scale " + std::string(xquant::dtype_name(scale_dt)) +
                      " extras " + std::to_string(extras));
              ++cases;
            }
  EXPECT_GT(cases, 900);
}

TEST(QuantMatmul, OddAndEmptyShapesAndBatchBroadcast) {
  std::mt19937 rng(77);
  // odd sizes around the cpu kernel's 2 x 4 blocks, 64 x 64 tiles and vector widths
  for (std::int64_t M : {1, 2, 3, 65})
    for (std::int64_t K : {1, 15, 17, 33, 100})
      for (std::int64_t N : {1, 3, 5, 66})
        for (bool transpose : {false, true}) {
          Qmm q;
          q.M = M, q.K = K, q.N = N, q.transpose = transpose, q.out_dt = DType::float16;
          random_fill(q, rng);
          q.scale = {0.001f};
          q.check("odd M" + std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N));
        }
  // batch broadcasting: [2, 1] x [3] -> [2, 3]; [1] x [4]; x2 2-D with a batched x1; bias [B, 1, N]
  for (auto [b1, b2] : {std::pair<Shape, Shape>{{2, 1}, {3}}, {{1}, {4}}, {{3}, {}}, {{}, {2}}, {{2, 3}, {2, 3}}}) {
    Qmm q;
    q.b1 = b1, q.b2 = b2, q.M = 3, q.K = 16, q.N = 8, q.out_dt = DType::bfloat16;
    random_fill(q, rng);
    q.scale = {0.01f};
    q.check("batch " + xquant::shape_str(b1) + " x " + xquant::shape_str(b2));
    q.int4 = true;
    random_fill(q, rng);
    q.check("batch int4 " + xquant::shape_str(b1) + " x " + xquant::shape_str(b2));
  }
  Qmm qb;
  qb.b1 = {3}, qb.b2 = {3}, qb.M = 2, qb.K = 8, qb.N = 4, qb.bias_batched = true;
  random_fill(qb, rng);
  qb.scale = {0.1f};
  qb.bias = {1, 2, 3, 4, 10, 20, 30, 40, -1, -2, -3, -4};
  qb.check("bias [B, 1, N]");
  // empty: M = 0, N = 0, K = 0 (K = 0: the accumulator is 0, the epilogue still runs), batch 0
  for (auto [M, K, N] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{0, 8, 8}, {2, 8, 0}, {2, 0, 3}}) {
    Qmm q;
    q.M = M, q.K = K, q.N = N, q.out_dt = DType::float16;
    random_fill(q, rng);
    q.scale = {2.f};
    if (N > 0) q.bias = std::vector<float>(static_cast<std::size_t>(N), 3.f), q.bias_dt = DType::float32;
    q.check("empty M" + std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N));
  }
  Qmm q0;
  q0.b1 = {0}, q0.M = 2, q0.K = 8, q0.N = 8;
  random_fill(q0, rng);
  q0.scale = {1.f};
  q0.check("batch 0");
}

TEST(QuantMatmul, Int4NibbleOrder) {
  // x1 = one row of 8 int4 [0, 1, ..., 7] = 0x76543210; x2 = identity-like column picks: x2[k][n] = (k == n)
  Tensor x1 = make_typed<std::int32_t>(DType::int32, {1, 1}, {0x76543210});
  std::vector<int> eye(64, 0);
  for (std::size_t k = 0; k < 8; ++k) eye[k * 8 + k] = 1;
  Tensor x2 = make_typed<std::int32_t>(DType::int32, {8, 1}, pack4(eye));
  Tensor s = make_float(DType::float32, {1}, {1.f});
  BackendGuard g;
  for (Backend be : kBackends) {
    xquant::set_backend(be);
    Tensor r = xquant::quant_matmul(x1, x2, s, {}, DType::int32);
    for (int n = 0; n < 8; ++n) EXPECT_EQ(r.data<std::int32_t>()[n], n) << n;
    // transposed storage [N][K / 8]: row n holds column n of the identity
    xquant::QuantMatmulOptions o;
    o.transpose_x2 = true;
    Tensor r2 = xquant::quant_matmul(x1, x2, s, o, DType::int32);  // the identity is symmetric
    for (int n = 0; n < 8; ++n) EXPECT_EQ(r2.data<std::int32_t>()[n], n) << n;
  }
  // negative nibbles: 0xFEDCBA98 holds -8 .. -1
  Tensor xn = make_typed<std::int32_t>(DType::int32, {1, 1}, {static_cast<std::int32_t>(0xFEDCBA98u)});
  Tensor r = xquant::quant_matmul(xn, x2, s, {}, DType::int32);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(r.data<std::int32_t>()[n], n - 8) << n;
}

TEST(QuantMatmulErrors, EveryArgument) {
  Tensor x1 = make_typed<std::int8_t>(DType::int8, {2, 4}, std::vector<std::int8_t>(8, 1));
  Tensor x2 = make_typed<std::int8_t>(DType::int8, {4, 3}, std::vector<std::int8_t>(12, 1));
  Tensor s = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  Tensor out(DType::int8, {2, 3});
  fill_bytes(out);
  auto run = [&](const xquant::QuantMatmulOptions& o, ConstTensorView a = {}, ConstTensorView b = {},
                 ConstTensorView sc = {}) {
    xquant::quant_matmul_out(out, a.data ? a : ConstTensorView(x1), b.data ? b : ConstTensorView(x2),
                             sc.data ? sc : ConstTensorView(s), o);
  };
  Tensor x2w = make_typed<std::int32_t>(DType::int32, {4, 1}, {0, 0, 0, 0});
  expect_error([&] { run({}, {}, x2w); }, ErrorCode::dtype_mismatch, "x2", {"int32", "int8"});
  Tensor x1f = make_float(DType::float32, {2, 4}, std::vector<float>(8, 1.f));
  expect_error([&] { run({}, x1f); }, ErrorCode::dtype_mismatch, "x1", {"float32"});
  Tensor x2k = make_typed<std::int8_t>(DType::int8, {5, 3}, std::vector<std::int8_t>(15, 1));
  expect_error([&] { run({}, {}, x2k); }, ErrorCode::shape_mismatch, "x2", {"K = 5", "K = 4"});
  Tensor x1r = make_typed<std::int8_t>(DType::int8, {4}, std::vector<std::int8_t>(4, 1));
  expect_error([&] { run({}, x1r); }, ErrorCode::shape_mismatch, "x1", {"rank 1"});
  Tensor x1b = make_typed<std::int8_t>(DType::int8, {2, 2, 4}, std::vector<std::int8_t>(16, 1));
  Tensor x2b = make_typed<std::int8_t>(DType::int8, {3, 4, 3}, std::vector<std::int8_t>(36, 1));
  expect_error([&] { xquant::quant_matmul(x1b, x2b, s); }, ErrorCode::shape_mismatch, "x2", {"broadcast"});
  Tensor s2 = make_float(DType::float32, {2}, {1.f, 1.f});
  expect_error([&] { run({}, {}, {}, s2); }, ErrorCode::shape_mismatch, "scale", {"[2]", "[3]"});
  Tensor s16 = make_float(DType::float16, {3}, {1.f, 1.f, 1.f});
  expect_error([&] { run({}, {}, {}, s16); }, ErrorCode::dtype_mismatch, "scale", {"float16"});
  Tensor off = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  xquant::QuantMatmulOptions o;
  o.offset = off.view();
  expect_error([&] { xquant::quant_matmul(x1, x2, s, o, DType::float16); }, ErrorCode::invalid_argument, "offset",
               {"float16"});
  Tensor s64 = xquant::trans_quant_param(s);
  expect_error([&] { run(o, {}, {}, s64); }, ErrorCode::invalid_argument, "offset", {"int64"});
  xquant::QuantMatmulOptions p;
  Tensor pt = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  p.pertoken_scale = pt.view();
  expect_error([&] { run(p); }, ErrorCode::shape_mismatch, "pertoken_scale", {"[3]", "[2]"});
  Tensor pt2 = make_float(DType::float32, {2}, {1.f, 1.f});
  p.pertoken_scale = pt2.view();
  expect_error([&] { xquant::quant_matmul(x1, x2, s, p, DType::int32); }, ErrorCode::invalid_argument, "pertoken_scale",
               {"int32"});
  xquant::QuantMatmulOptions b;
  Tensor bf = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  b.bias = bf.view();
  expect_error([&] { run(b); }, ErrorCode::invalid_argument, "bias", {"float16 or bfloat16 output"});
  Tensor bi = make_typed<std::int32_t>(DType::int32, {4}, {1, 1, 1, 1});
  b.bias = bi.view();
  expect_error([&] { run(b); }, ErrorCode::shape_mismatch, "bias", {"[4]", "[3]"});
  Tensor bu = make_typed<std::uint8_t>(DType::uint8, {3}, {1, 1, 1});
  b.bias = bu.view();
  expect_error([&] { run(b); }, ErrorCode::dtype_mismatch, "bias", {"uint8"});
  expect_error([&] { xquant::quant_matmul(x1, x2, s, {}, DType::float32); }, ErrorCode::invalid_argument,
               "output_dtype", {"float32"});
  Tensor out_bad(DType::int8, {3, 2});
  expect_error([&] { xquant::quant_matmul_out(out_bad, x1, x2, s); }, ErrorCode::shape_mismatch, "out",
               {"[3, 2]", "[2, 3]"});
  Tensor out_f32(DType::float32, {2, 3});
  expect_error([&] { xquant::quant_matmul_out(out_f32, x1, x2, s); }, ErrorCode::dtype_mismatch, "out", {"float32"});
  EXPECT_TRUE(all_bytes(out));
  // out overlapping an input
  expect_error(
      [&] {
        xquant::quant_matmul_out(TensorView(x2.data(), DType::int8, {2, 3}), x1, x2, s);
      },
      ErrorCode::aliasing, "out");
  EXPECT_EQ(to_vector<std::int8_t>(x2), std::vector<std::int8_t>(12, 1));
  // the shape planner gives the same answers without computing
  EXPECT_EQ(xquant::quant_matmul_output_shape(x1b, x2, s), (Shape{2, 2, 3}));
}

// ======================================= weight_quant_batchmatmul =======================================

struct Wqm {
  DType dt = DType::float16;
  bool int4 = false, transpose = false;
  Shape lead{1};  // x's leading dims (rows)
  std::int64_t K = 8, N = 8, group = 0;
  std::vector<float> x;              // [rows][K], values representable in dt
  std::vector<int> w;                // [K][N] logical
  std::vector<float> scale, offset;  // [G][N] or [N] or [1] (values representable in dt)
  Shape param_shape;
  DType bias_dt = DType::float32;
  std::vector<float> bias;

  std::int64_t rows() const { return xquant::shape_numel(lead); }
  std::vector<std::uint16_t> golden() const {
    const std::int64_t M = rows();
    std::vector<std::uint16_t> r(static_cast<std::size_t>(M * N));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (std::int64_t k = 0; k < K; ++k) {
          const std::int64_t g = group ? k / group : 0;
          const std::size_t p = scale.size() == 1 ? 0 : static_cast<std::size_t>(g * N + n);
          float v = static_cast<float>(w[static_cast<std::size_t>(k * N + n)]);
          if (!offset.empty()) v = r16(dt, v + offset[p]);
          v = r16(dt, v * scale[p]);
          const float prod = x[static_cast<std::size_t>(m * K + k)] * v;
          acc = acc + prod;
        }
        if (!bias.empty())
          acc = acc + (bias_dt == DType::float32 ? bias[static_cast<std::size_t>(n)]
                                                 : r16(bias_dt, bias[static_cast<std::size_t>(n)]));
        r[static_cast<std::size_t>(m * N + n)] = bits16(dt, acc);
      }
    return r;
  }
  Tensor run() const {
    Shape xs = lead;
    xs.push_back(K);
    Tensor xt = make_float(dt, xs, x);
    std::vector<int> st(w.size());
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t n = 0; n < N; ++n)
        st[static_cast<std::size_t>(transpose ? n * K + k : k * N + n)] = w[static_cast<std::size_t>(k * N + n)];
    const std::int64_t inner = transpose ? K : N;
    const Shape ws{transpose ? N : K, int4 ? inner / 8 : inner};
    Tensor wt = int4 ? make_typed<std::int32_t>(DType::int32, ws, pack4(st))
                     : make_typed<std::int8_t>(DType::int8, ws, std::vector<std::int8_t>(st.begin(), st.end()));
    Tensor s = make_float(dt, param_shape, scale);
    Tensor o = offset.empty() ? Tensor() : make_float(dt, param_shape, offset);
    Tensor b = bias.empty() ? Tensor() : make_float(bias_dt, {N}, bias);
    xquant::WeightQuantMatmulOptions opt;
    if (!offset.empty()) opt.antiquant_offset = o.view();
    if (!bias.empty()) opt.bias = b.view();
    opt.antiquant_group_size = group;
    opt.transpose_weight = transpose;
    return xquant::weight_quant_batchmatmul(xt, wt, s, opt);
  }
  void check(const std::string& what) const {
    BackendGuard g;
    const auto want = golden();
    for (Backend be : kBackends) {
      xquant::set_backend(be);
      Tensor t = run();
      Shape os = lead;
      os.push_back(N);
      ASSERT_EQ(t.shape(), os) << what;
      ASSERT_EQ(t.dtype(), dt) << what;
      for (std::size_t i = 0; i < want.size(); ++i)
        if (t.data<std::uint16_t>()[i] != want[i]) {
          ADD_FAILURE() << what << " backend " << (be == Backend::cpu ? "cpu" : "reference") << " element " << i
                        << ": got 0x" << std::hex << t.data<std::uint16_t>()[i] << " want 0x" << want[i];
          return;
        }
    }
  }
};

void random_fill(Wqm& q, std::mt19937& rng, int param_kind) {  // 0 per tensor, 1 per channel, 2 per group
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  q.x.resize(static_cast<std::size_t>(q.rows() * q.K));
  for (auto& v : q.x) v = r16(q.dt, 4.f * u(rng));
  q.w.resize(static_cast<std::size_t>(q.K * q.N));
  for (auto& v : q.w) v = q.int4 ? static_cast<int>(rng() % 16) - 8 : static_cast<int>(rng() % 256) - 128;
  const std::int64_t G = param_kind == 2 ? (q.K + q.group - 1) / q.group : 1;
  const std::int64_t n = param_kind == 0 ? 1 : G * q.N;
  q.param_shape = param_kind == 0   ? Shape{1}
                  : param_kind == 1 ? (rng() % 2 ? Shape{q.N} : Shape{1, q.N})
                                    : Shape{G, q.N};
  q.scale.resize(static_cast<std::size_t>(n));
  for (auto& s : q.scale) s = r16(q.dt, 0.01f * u(rng));
  if (rng() % 2) {
    q.offset.resize(static_cast<std::size_t>(n));
    for (auto& o : q.offset) o = r16(q.dt, 10.f * u(rng));
  }
}

TEST(WeightQuantBatchMatmul, RandomAgainstGolden) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (DType dt : {DType::float16, DType::bfloat16})
    for (bool int4 : {false, true})
      for (bool transpose : {false, true})
        for (int kind : {0, 1, 2})
          for (auto [lead, K, N] : {std::tuple<Shape, std::int64_t, std::int64_t>{{1}, 64, 8},
                                    {{3}, 72, 24},
                                    {{2, 5}, 160, 72},
                                    {{17}, 96, 136},
                                    {{4}, 8, 8}}) {
            Wqm q;
            q.dt = dt, q.int4 = int4, q.transpose = transpose, q.lead = lead, q.K = K, q.N = N;
            if (kind == 2) {
              if (K <= 32) continue;
              q.group = K > 64 ? 64 : 32;
            }
            random_fill(q, rng, kind);
            if (rng() % 2) {
              q.bias_dt = rng() % 2 ? DType::float32 : dt;
              q.bias.resize(static_cast<std::size_t>(N));
              for (auto& b : q.bias) b = r16(q.bias_dt == DType::float32 ? DType::bfloat16 : q.bias_dt, 3.f * u(rng));
            }
            q.check(std::string(xquant::dtype_name(dt)) + " int4 " + std::to_string(int4) + " transpose " +
                    std::to_string(transpose) + " kind " + std::to_string(kind) + " K" + std::to_string(K) + " N" +
                    std::to_string(N));
          }
}

TEST(WeightQuantBatchMatmul, HandValuesRoundingAndNaN) {
  // dequantization rounds to x's dtype twice: q = 1, offset = 2^-11 (float16: 1 + 2^-11 is a tie -> 1),
  // scale 3: w = 3. One rounding at the end instead would give (1 + 2^-11) * 3 = 3.00146484 -> float16
  // 3.00195312, and the sum of 8 products 24.015625 instead of 24.
  Wqm q;
  q.lead = {1}, q.K = 8, q.N = 8;
  q.x.assign(8, 1.0f);
  q.w.assign(64, 1);
  q.param_shape = {1};
  q.scale = {3.0f};
  q.offset = {std::ldexp(1.0f, -11)};
  auto g = q.golden();
  EXPECT_EQ(g[0], xquant::float_to_half(24.0f));  // 8 * (3 * round16(1 + 2^-11) = 3)
  q.check("double rounding");
  // NaN and Inf in the scale: canonical NaN out; float16 overflow to Inf
  q.scale = {kNaN};
  q.check("NaN scale");
  q.offset.clear();
  q.scale = {60000.f};
  q.x.assign(8, 2.0f);
  q.check("overflow");
  // summation order: 1 + 2^-24 ... sequential k order is observable
  Wqm s;
  s.dt = DType::bfloat16, s.lead = {1}, s.K = 8, s.N = 8;
  s.x = {1.f, std::ldexp(1.f, -9), std::ldexp(1.f, -9), std::ldexp(1.f, -9), -1.f, 0.f, 0.f, 0.f};
  s.w.assign(64, 1);
  s.param_shape = {1};
  s.scale = {1.f};
  s.check("order");
}

TEST(WeightQuantBatchMatmul, EmptyShapes) {
  std::mt19937 rng(3);
  for (auto [lead, K, N] : {std::tuple<Shape, std::int64_t, std::int64_t>{{0}, 8, 8}, {{2}, 8, 0}, {{2}, 0, 8}}) {
    Wqm q;
    q.lead = lead, q.K = K, q.N = N;
    random_fill(q, rng, 1);
    if (N > 0) q.bias = std::vector<float>(static_cast<std::size_t>(N), 1.5f);
    q.check("empty " + xquant::shape_str(lead) + " K" + std::to_string(K) + " N" + std::to_string(N));
  }
}

TEST(WeightQuantBatchMatmulErrors, EveryArgument) {
  Tensor x = make_float(DType::float16, {2, 64}, std::vector<float>(128, 1.f));
  Tensor w = make_typed<std::int8_t>(DType::int8, {64, 8}, std::vector<std::int8_t>(512, 1));
  Tensor s = make_float(DType::float16, {8}, std::vector<float>(8, 1.f));
  Tensor out(DType::float16, {2, 8});
  fill_bytes(out);
  xquant::WeightQuantMatmulOptions o;
  auto run = [&](ConstTensorView xv, ConstTensorView wv, ConstTensorView sv) {
    xquant::weight_quant_batchmatmul_out(out, xv, wv, sv, o);
  };
  Tensor x32 = make_float(DType::float32, {2, 64}, std::vector<float>(128, 1.f));
  expect_error([&] { run(x32, w, s); }, ErrorCode::dtype_mismatch, "x", {"float32"});
  Tensor w16 = make_float(DType::float16, {64, 8}, std::vector<float>(512, 1.f));
  expect_error([&] { run(x, w16, s); }, ErrorCode::dtype_mismatch, "weight", {"float16"});
  Tensor wk = make_typed<std::int8_t>(DType::int8, {63, 8}, std::vector<std::int8_t>(504, 1));
  expect_error([&] { run(x, wk, s); }, ErrorCode::shape_mismatch, "weight", {"K = 63", "K = 64"});
  Tensor sb = make_float(DType::bfloat16, {8}, std::vector<float>(8, 1.f));
  expect_error([&] { run(x, w, sb); }, ErrorCode::dtype_mismatch, "antiquant_scale", {"bfloat16", "float16"});
  Tensor s3 = make_float(DType::float16, {3}, std::vector<float>(3, 1.f));
  expect_error([&] { run(x, w, s3); }, ErrorCode::shape_mismatch, "antiquant_scale", {"[3]"});
  o.antiquant_group_size = 16;
  expect_error([&] { run(x, w, s); }, ErrorCode::invalid_argument, "antiquant_group_size", {"16"});
  o.antiquant_group_size = 64;  // must be < K
  expect_error([&] { run(x, w, s); }, ErrorCode::invalid_argument, "antiquant_group_size", {"64"});
  o.antiquant_group_size = 32;
  expect_error([&] { run(x, w, s); }, ErrorCode::shape_mismatch, "antiquant_scale", {"[2, 8]"});
  o.antiquant_group_size = 0;
  Tensor ob = make_float(DType::float16, {1, 8}, std::vector<float>(8, 1.f));
  o.antiquant_offset = ob.view();
  expect_error([&] { run(x, w, s); }, ErrorCode::shape_mismatch, "antiquant_offset", {"[1, 8]"});
  o.antiquant_offset.reset();
  Tensor bb = make_float(DType::float32, {9}, std::vector<float>(9, 1.f));
  o.bias = bb.view();
  expect_error([&] { run(x, w, s); }, ErrorCode::shape_mismatch, "bias", {"[9]"});
  o.bias.reset();
  Tensor out_bad(DType::bfloat16, {2, 8});
  expect_error([&] { xquant::weight_quant_batchmatmul_out(out_bad, x, w, s); }, ErrorCode::dtype_mismatch, "out");
  EXPECT_TRUE(all_bytes(out));
  EXPECT_EQ(xquant::weight_quant_batchmatmul_output_shape(x, w, s), (Shape{2, 8}));
}

}  // namespace

// ======================================= planning (xquant/plan.hpp) =======================================

namespace {

// The call's error (code and message) for a planning entry, or "ok".
template <class F>
std::string outcome(F&& f) {
  try {
    f();
    return "ok";
  } catch (const xquant::Error& e) {
    return std::to_string(static_cast<int>(e.code())) + " " + e.what();
  }
}

xquant::TensorSpec spec(const Tensor& t) { return xquant::spec_of(t.view()); }

}  // namespace

TEST(MatmulPlanning, SameShapesAndErrorsAsTheCalls) {
  Tensor x1 = make_typed<std::int8_t>(DType::int8, {2, 4}, std::vector<std::int8_t>(8, 1));
  Tensor x2 = make_typed<std::int8_t>(DType::int8, {4, 3}, std::vector<std::int8_t>(12, 1));
  Tensor x2t = make_typed<std::int8_t>(DType::int8, {3, 4}, std::vector<std::int8_t>(12, 1));
  Tensor s = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  Tensor pt = make_float(DType::float32, {2}, {1.f, 1.f});
  Tensor bad_pt = make_float(DType::float32, {3}, {1.f, 1.f, 1.f});
  EXPECT_EQ(xquant::plan_quant_matmul(spec(x1), spec(x2), spec(s), std::nullopt, spec(pt), std::nullopt, false,
                                      DType::float16),
            (Shape{2, 3}));
  EXPECT_EQ(xquant::plan_quant_matmul(spec(x1), spec(x2t), spec(s), std::nullopt, std::nullopt, std::nullopt, true,
                                      DType::int8),
            (Shape{2, 3}));
  xquant::QuantMatmulOptions o;
  o.pertoken_scale = bad_pt.view();
  const std::string call = outcome([&] { xquant::quant_matmul(x1, x2, s, o, DType::float16); });
  const std::string plan = outcome([&] {
    xquant::plan_quant_matmul(spec(x1), spec(x2), spec(s), std::nullopt, spec(bad_pt), std::nullopt, false,
                              DType::float16);
  });
  EXPECT_NE(call, "ok");
  EXPECT_EQ(plan, call);

  Tensor x = make_float(DType::float16, {3, 64}, std::vector<float>(192, 1.f));
  Tensor w = make_typed<std::int8_t>(DType::int8, {64, 8}, std::vector<std::int8_t>(512, 1));
  Tensor gs = make_float(DType::float16, {2, 8}, std::vector<float>(16, 1.f));
  EXPECT_EQ(xquant::plan_weight_quant_batchmatmul(spec(x), spec(w), spec(gs), std::nullopt, std::nullopt, 32, false),
            (Shape{3, 8}));
  xquant::WeightQuantMatmulOptions wo;
  wo.antiquant_group_size = 48;
  EXPECT_EQ(outcome([&] {
              xquant::plan_weight_quant_batchmatmul(spec(x), spec(w), spec(gs), std::nullopt, std::nullopt, 48, false);
            }),
            outcome([&] { xquant::weight_quant_batchmatmul(x, w, gs, wo); }));

  Tensor sc = make_float(DType::float32, {1}, {0.5f});
  Tensor off = make_float(DType::float32, {5}, {0.f, 1.f, 2.f, 3.f, 4.f});
  EXPECT_EQ(xquant::plan_trans_quant_param(spec(sc), spec(off), 0), (Shape{5}));
  EXPECT_EQ(outcome([&] { xquant::plan_trans_quant_param(spec(sc), spec(off), 7); }),
            outcome([&] { xquant::trans_quant_param(sc, off.view(), 7); }));
  Tensor v = make_typed<std::int32_t>(DType::int32, {2, 16}, std::vector<std::int32_t>(32, 1));
  Tensor v12 = make_typed<std::int32_t>(DType::int32, {2, 12}, std::vector<std::int32_t>(24, 1));
  EXPECT_EQ(xquant::plan_convert_weight_to_int4pack(spec(v)), (Shape{2, 2}));
  EXPECT_EQ(outcome([&] { xquant::plan_convert_weight_to_int4pack(spec(v12)); }),
            outcome([&] { xquant::convert_weight_to_int4pack(v12); }));
}
