// Tests of npu_anti_quant (SPEC section 7): hand-computed values, an independent scalar oracle written
// here, NaN / Inf, narrowing, int4 nibble order, scale broadcasting, bfloat16 scales, the round trip with
// quantize, and every validation path (nothing written on error).
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
using xquant::ErrorCode;
using xquant::QuantDType;

const DType kDsts[] = {DType::float16, DType::bfloat16, DType::float32};

// The oracle's own int4 decoding: nibble j of word k is element 8k + j, two's complement.
int nibble(const std::vector<std::int32_t>& words, std::int64_t i) {
  const auto w = static_cast<std::uint32_t>(words[static_cast<std::size_t>(i / 8)]);
  const int v = static_cast<int>((w >> (4 * (i % 8))) & 0xFu);
  return v >= 8 ? v - 16 : v;
}

// Bits of the narrowed float (float32: its bits) and the oracle result of one element.
std::uint32_t bits_of(DType dt, float v) {
  if (std::isnan(v)) v = std::bit_cast<float>(0x7FC00000u);  // canonical NaN, documented
  switch (dt) {
    case DType::float16:
      return xquant::float_to_half(v);
    case DType::bfloat16:
      return xquant::float_to_bfloat16(v);
    default:
      return std::bit_cast<std::uint32_t>(v);
  }
}
std::vector<std::uint32_t> out_bits(const Tensor& t) {
  std::vector<std::uint32_t> b(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = t.dtype() == DType::float32 ? t.data<std::uint32_t>()[i] : t.data<std::uint16_t>()[i];
  return b;
}

// q: logical values; scale / offset widened; per-column when their size is H > 1 (or == H).
std::vector<std::uint32_t> oracle(DType dt, const std::vector<int>& q, std::int64_t H, const std::vector<float>& s,
                                  const std::vector<float>* o) {
  std::vector<std::uint32_t> want(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    const std::size_t c = s.size() == 1 ? 0 : i % static_cast<std::size_t>(H);
    const float off = o ? (*o)[c] : 0.0f;
    const float sum = static_cast<float>(q[i]) + off;  // rounded add
    const float v = sum * s[c];                        // rounded multiply
    want[i] = bits_of(dt, v);
  }
  return want;
}

Tensor scale_tensor(DType dt, const std::vector<float>& v) {
  return make_float(dt, {static_cast<std::int64_t>(v.size())}, v);
}
std::vector<float> widen(const Tensor& t) { return to_floats(t); }

TEST(AntiQuant, HandValuesInt8) {
  Tensor x = make_typed<std::int8_t>(DType::int8, {1, 5}, {-128, -1, 0, 1, 127});
  Tensor s = scale_tensor(DType::float32, {0.5f});
  Tensor o = scale_tensor(DType::float32, {2.0f});
  // (q + 2) * 0.5 = -63, 0.5, 1, 1.5, 64.5: exact in every dst dtype.
  for (DType dt : kDsts) {
    const Tensor y = xquant::anti_quant(x, s, o, dt);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(y.shape(), (Shape{1, 5}));
    expect_floats_bitexact(to_floats(y), {-63.0f, 0.5f, 1.0f, 1.5f, 64.5f});
  }
  // No offset: q * scale. float16 default.
  const Tensor y = xquant::anti_quant(x, s);
  EXPECT_EQ(y.dtype(), DType::float16);
  expect_floats_bitexact(to_floats(y), {-64.0f, -0.5f, 0.0f, 0.5f, 63.5f});
}

TEST(AntiQuant, NarrowingRoundsToNearestEvenOnce) {
  // 1 * (1/3): float32 0x3EAAAAAB -> float16 0x3555, bfloat16 0x3EAB.
  Tensor x = make_typed<std::int8_t>(DType::int8, {1}, {1});
  Tensor s = scale_tensor(DType::float32, {1.0f / 3.0f});
  EXPECT_EQ(xquant::anti_quant(x, s, std::nullopt, DType::float16).data<std::uint16_t>()[0], 0x3555);
  EXPECT_EQ(xquant::anti_quant(x, s, std::nullopt, DType::bfloat16).data<std::uint16_t>()[0], 0x3EAB);
  // float16 ties above 2048 (spacing 2): 2049 -> 2048, 2051 -> 2052, 2053 -> 2052.
  Tensor xt = make_typed<std::int8_t>(DType::int8, {3}, {1, 3, 5});
  Tensor one = scale_tensor(DType::float32, {1.0f});
  Tensor off = scale_tensor(DType::float32, {2048.0f});
  expect_floats_bitexact(to_floats(xquant::anti_quant(xt, one, off)), {2048.0f, 2052.0f, 2052.0f});
  // The add is rounded before the multiply (no FMA): 1 + 2^24 -> 2^24, 3 + 2^24 -> 2^24 + 4, then * 1.
  Tensor big = scale_tensor(DType::float32, {16777216.0f});
  expect_floats_bitexact(to_floats(xquant::anti_quant(xt, one, big, DType::float32)),
                         {16777216.0f, 16777220.0f, 16777220.0f});
  // And with a scale of 3: (3 + 2^24) rounds to 2^24 + 4 first; * 3 = 50331660 exactly.
  Tensor three = scale_tensor(DType::float32, {3.0f});
  EXPECT_EQ(xquant::anti_quant(xt, three, big, DType::float32).data<float>()[1], 50331660.0f);
  // Overflow on narrowing: 127 * 1000 -> float16 +Inf, bfloat16 finite.
  Tensor x127 = make_typed<std::int8_t>(DType::int8, {2}, {127, -128});
  Tensor k = scale_tensor(DType::float32, {1000.0f});
  EXPECT_EQ(xquant::anti_quant(x127, k).data<std::uint16_t>()[0], 0x7C00);
  EXPECT_EQ(xquant::anti_quant(x127, k).data<std::uint16_t>()[1], 0xFC00);
  expect_floats_bitexact(to_floats(xquant::anti_quant(x127, k, std::nullopt, DType::bfloat16)),
                         {126976.0f, -128000.0f});
}

TEST(AntiQuant, NaNAndInfinity) {
  Tensor x = make_typed<std::int8_t>(DType::int8, {3}, {-2, 0, 5});
  const float payload = std::bit_cast<float>(0x7FC12345u);
  const float neg_payload = std::bit_cast<float>(0xFFC00001u);
  for (DType dt : kDsts) {
    const std::uint32_t canon = dt == DType::float32 ? 0x7FC00000u : dt == DType::float16 ? 0x7E00u : 0x7FC0u;
    // NaN scale (with a payload, or negative): every output is the canonical quiet NaN.
    for (float n : {payload, neg_payload}) {
      const auto got = out_bits(xquant::anti_quant(x, scale_tensor(DType::float32, {n}), std::nullopt, dt));
      EXPECT_EQ(got, (std::vector<std::uint32_t>{canon, canon, canon})) << xquant::dtype_name(dt);
      // NaN offset too, and both NaN (which operand a multiply propagates is not observable).
      const auto both = out_bits(
          xquant::anti_quant(x, scale_tensor(DType::float32, {neg_payload}), scale_tensor(DType::float32, {n}), dt));
      EXPECT_EQ(both, (std::vector<std::uint32_t>{canon, canon, canon})) << xquant::dtype_name(dt);
    }
    // Inf scale: -2 * Inf = -Inf, 0 * Inf = NaN, 5 * Inf = +Inf.
    const auto inf = out_bits(xquant::anti_quant(x, scale_tensor(DType::float32, {kInf}), std::nullopt, dt));
    EXPECT_EQ(inf, (std::vector<std::uint32_t>{bits_of(dt, -kInf), canon, bits_of(dt, kInf)}));
    // -Inf offset: (q - Inf) * 2 = -Inf everywhere; offset +Inf with scale 0: NaN.
    const auto ninf = out_bits(
        xquant::anti_quant(x, scale_tensor(DType::float32, {2.0f}), scale_tensor(DType::float32, {-kInf}), dt));
    EXPECT_EQ(ninf, (std::vector<std::uint32_t>(3, bits_of(dt, -kInf))));
    const auto zinf =
        out_bits(xquant::anti_quant(x, scale_tensor(DType::float32, {0.0f}), scale_tensor(DType::float32, {kInf}), dt));
    EXPECT_EQ(zinf, (std::vector<std::uint32_t>{canon, canon, canon}));
  }
  // Signed zeros follow the formula: 0 * -1 = -0, (-2 + 2) * -1 = -0.
  Tensor z = make_typed<std::int8_t>(DType::int8, {2}, {0, -2});
  const Tensor y = xquant::anti_quant(z, scale_tensor(DType::float32, {-1.0f}), scale_tensor(DType::float32, {0.0f}),
                                      DType::float32);
  EXPECT_EQ(y.data<std::uint32_t>()[0], 0x80000000u);
  EXPECT_EQ(y.data<float>()[1], 2.0f);
}

TEST(AntiQuant, Int4NibbleOrderAndLogicalShape) {
  // Word 0x76543210: elements 0..7 = 0..7; word 0xFEDCBA98: elements = -8..-1.
  Tensor x = make_typed<std::int32_t>(DType::int32, {2, 1}, {0x76543210, static_cast<std::int32_t>(0xFEDCBA98u)});
  Tensor s = scale_tensor(DType::float32, {1.0f});
  const Tensor y = xquant::anti_quant(x, s, std::nullopt, DType::float32, QuantDType::quint4x2);
  EXPECT_EQ(y.shape(), (Shape{2, 8}));
  expect_floats_bitexact(to_floats(y), {0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1});
  // Per-column scale over the logical last dimension 8.
  Tensor s8 = scale_tensor(DType::float32, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor o8 = scale_tensor(DType::float32, {1, 1, 1, 1, 1, 1, 1, 1});
  const Tensor y8 = xquant::anti_quant(x, s8, o8, DType::float32, QuantDType::quint4x2);
  expect_floats_bitexact(to_floats(y8), {1, 4, 9, 16, 25, 36, 49, 64, -7, -12, -15, -16, -15, -12, -7, 0});
}

TEST(AntiQuant, RandomAgainstOracleBroadcastAndBf16Scales) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> qd(-128, 127), nd(-8, 7);
  std::uniform_real_distribution<float> fd(-3.0f, 3.0f);
  const xquant::Backend saved = xquant::get_backend();
  for (xquant::Backend b : {xquant::Backend::cpu, xquant::Backend::reference}) {
    xquant::set_backend(b);
    for (bool int4 : {false, true})
      for (std::int64_t H : {8, 24, 200})
        for (std::int64_t n : {std::int64_t{1}, H})
          for (DType sdt : {DType::float32, DType::bfloat16})
            for (bool with_offset : {false, true})
              for (DType dt : kDsts) {
                const Shape shape{3, 5, H};
                const std::int64_t numel = 15 * H;
                std::vector<int> q(static_cast<std::size_t>(numel));
                for (int& v : q) v = int4 ? nd(rng) : qd(rng);
                Tensor x;
                if (int4) {
                  std::vector<std::int32_t> words(static_cast<std::size_t>(numel / 8), 0);
                  for (std::int64_t i = 0; i < numel; ++i) {
                    auto w = static_cast<std::uint32_t>(words[static_cast<std::size_t>(i / 8)]);
                    w |= (static_cast<std::uint32_t>(q[static_cast<std::size_t>(i)]) & 0xFu) << (4 * (i % 8));
                    words[static_cast<std::size_t>(i / 8)] = static_cast<std::int32_t>(w);
                  }
                  for (std::int64_t i = 0; i < numel; ++i) ASSERT_EQ(nibble(words, i), q[static_cast<std::size_t>(i)]);
                  x = make_typed<std::int32_t>(DType::int32, {3, 5, H / 8}, words);
                } else {
                  std::vector<std::int8_t> q8(q.begin(), q.end());
                  x = make_typed<std::int8_t>(DType::int8, shape, q8);
                }
                std::vector<float> sv(static_cast<std::size_t>(n)), ov(sv.size());
                for (float& v : sv) v = fd(rng);
                for (float& v : ov) v = fd(rng) * 10.0f;
                Tensor s = scale_tensor(sdt, sv), o = scale_tensor(sdt, ov);
                const std::vector<float> sw = widen(s), ow = widen(o);
                const Tensor y =
                    xquant::anti_quant(x, s, with_offset ? std::optional<ConstTensorView>(o) : std::nullopt, dt,
                                       int4 ? QuantDType::quint4x2 : QuantDType::qint8);
                ASSERT_EQ(y.shape(), shape);
                EXPECT_EQ(out_bits(y), oracle(dt, q, H, sw, with_offset ? &ow : nullptr))
                    << "int4 " << int4 << " H " << H << " n " << n << " dst " << xquant::dtype_name(dt);
              }
  }
  xquant::set_backend(saved);
}

TEST(AntiQuant, RoundTripWithQuantizeWithinOneStep) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> fd(-1.0f, 1.0f);
  const std::int64_t H = 64;
  std::vector<float> xs(static_cast<std::size_t>(4 * H));
  for (float& v : xs) v = fd(rng);
  Tensor x = make_float(DType::float32, {4, H}, xs);
  // int8, div mode: q = rint(x / s + zp); anti_quant(q, s, -zp) = (q - zp) * s.
  const float s = 1.0f / 100.0f, zp = 3.0f;
  Tensor q = xquant::quantize(x, scale_tensor(DType::float32, {s}), scale_tensor(DType::float32, {zp}),
                              QuantDType::qint8, 1, true);
  const auto back = to_floats(
      xquant::anti_quant(q, scale_tensor(DType::float32, {s}), scale_tensor(DType::float32, {-zp}), DType::float32));
  for (std::size_t i = 0; i < xs.size(); ++i) EXPECT_LE(std::fabs(back[i] - xs[i]), s) << i;
  // int4, mul mode: q = rint(x * 4 + 0.5) in [-8, 7] (|x| <= 1 stays in range); back = (q - 0.5) / 4.
  Tensor q4 = xquant::quantize(x, scale_tensor(DType::float32, {4.0f}), scale_tensor(DType::float32, {0.5f}),
                               QuantDType::quint4x2, -1, false);
  const auto back4 =
      to_floats(xquant::anti_quant(q4, scale_tensor(DType::float32, {0.25f}), scale_tensor(DType::float32, {-0.5f}),
                                   DType::float32, QuantDType::quint4x2));
  for (std::size_t i = 0; i < xs.size(); ++i) EXPECT_LE(std::fabs(back4[i] - xs[i]), 0.25f) << i;
}

TEST(AntiQuant, EmptyInputs) {
  Tensor x(DType::int8, {0, 4});
  const Tensor y = xquant::anti_quant(x, scale_tensor(DType::float32, {1.0f}));
  EXPECT_EQ(y.shape(), (Shape{0, 4}));
  Tensor x0(DType::int8, {3, 0});
  EXPECT_EQ(xquant::anti_quant(x0, scale_tensor(DType::float32, {1.0f})).shape(), (Shape{3, 0}));
  Tensor s0(DType::float32, {0});
  EXPECT_EQ(xquant::anti_quant(x0, s0).shape(), (Shape{3, 0}));
}

// ---------------------------------------------------------------------------------------------------
// Validation: every error names its argument, and the pre-filled output keeps its marker.

void expect_out_error(const std::function<void(TensorView)>& f, DType out_dt, const Shape& out_shape, ErrorCode code,
                      const std::string& arg, const std::vector<std::string>& needles) {
  Tensor out(out_dt, out_shape);
  fill_bytes(out);
  expect_error([&] { f(out); }, code, arg, needles);
  EXPECT_TRUE(all_bytes(out)) << "output written on error (" << arg << ")";
}

TEST(AntiQuantErrors, EveryArgument) {
  Tensor x = make_typed<std::int8_t>(DType::int8, {2, 8}, std::vector<std::int8_t>(16, 1));
  Tensor w = make_typed<std::int32_t>(DType::int32, {2, 1}, {1, 2});
  Tensor s1 = scale_tensor(DType::float32, {1.0f});
  Tensor s8 = scale_tensor(DType::float32, std::vector<float>(8, 1.0f));
  Tensor s3 = scale_tensor(DType::float32, {1, 2, 3});
  Tensor sb = scale_tensor(DType::bfloat16, {1.0f});
  Tensor sh = scale_tensor(DType::float16, {1.0f});
  Tensor s2d = make_float(DType::float32, {1, 8}, std::vector<float>(8, 1.0f));
  const Shape os{2, 8};
  using Opt = std::optional<ConstTensorView>;
  auto call = [](ConstTensorView xx, ConstTensorView ss, Opt oo, QuantDType src) {
    return [=](TensorView out) { xquant::anti_quant_out(out, xx, ss, oo, src); };
  };
  // src_dtype
  expect_out_error(call(x, s1, std::nullopt, QuantDType::quint8), DType::float16, os, ErrorCode::invalid_argument,
                   "src_dtype", {"quint8", "qint8 or quint4x2"});
  expect_out_error(call(x, s1, std::nullopt, QuantDType::qint32), DType::float16, os, ErrorCode::invalid_argument,
                   "src_dtype", {"qint32"});
  // x dtype and rank
  expect_out_error(call(w, s1, std::nullopt, QuantDType::qint8), DType::float16, os, ErrorCode::dtype_mismatch, "x",
                   {"int32", "int8"});
  expect_out_error(call(x, s1, std::nullopt, QuantDType::quint4x2), DType::float16, os, ErrorCode::dtype_mismatch, "x",
                   {"int8", "int32"});
  Tensor r0 = make_typed<std::int8_t>(DType::int8, {}, {1});
  expect_out_error(call(r0, s1, std::nullopt, QuantDType::qint8), DType::float16, {}, ErrorCode::shape_mismatch, "x",
                   {"rank"});
  // scale: dtype, rank, length
  expect_out_error(call(x, sh, std::nullopt, QuantDType::qint8), DType::float16, os, ErrorCode::dtype_mismatch, "scale",
                   {"float16", "float32 or bfloat16"});
  expect_out_error(call(x, s3, std::nullopt, QuantDType::qint8), DType::float16, os, ErrorCode::shape_mismatch, "scale",
                   {"[3]", "[1] or [8]"});
  expect_out_error(call(x, s2d, std::nullopt, QuantDType::qint8), DType::float16, os, ErrorCode::shape_mismatch,
                   "scale", {"[1, 8]"});
  // int4: scale length is checked against the logical last dimension (8), not the stored one (1).
  Tensor s16 = scale_tensor(DType::float32, std::vector<float>(16, 1.0f));
  expect_out_error(call(w, s16, std::nullopt, QuantDType::quint4x2), DType::float16, os, ErrorCode::shape_mismatch,
                   "scale", {"[16]", "[1] or [8]"});
  // offset: dtype and shape must match scale
  expect_out_error(call(x, s1, Opt(sb), QuantDType::qint8), DType::float16, os, ErrorCode::dtype_mismatch, "offset",
                   {"bfloat16", "float32"});
  expect_out_error(call(x, s1, Opt(s8), QuantDType::qint8), DType::float16, os, ErrorCode::shape_mismatch, "offset",
                   {"[8]", "[1]"});
  // out: dtype, shape
  expect_out_error(call(x, s1, std::nullopt, QuantDType::qint8), DType::int8, os, ErrorCode::dtype_mismatch, "out",
                   {"int8", "float16, bfloat16 or float32"});
  expect_out_error(call(x, s1, std::nullopt, QuantDType::qint8), DType::float16, {2, 9}, ErrorCode::shape_mismatch,
                   "out", {"[2, 9]", "[2, 8]"});
  expect_out_error(call(w, s1, std::nullopt, QuantDType::quint4x2), DType::float16, {2, 1}, ErrorCode::shape_mismatch,
                   "out", {"[2, 1]", "[2, 8]"});
  // Allocating form: dst_dtype
  expect_error([&] { xquant::anti_quant(x, s1, std::nullopt, DType::int32); }, ErrorCode::invalid_argument, "dst_dtype",
               {"int32"});
  // A null data pointer
  expect_out_error(call(ConstTensorView(nullptr, DType::int8, {2, 8}), s1, std::nullopt, QuantDType::qint8),
                   DType::float16, os, ErrorCode::invalid_argument, "x", {"null"});
}

TEST(AntiQuantErrors, Overlap) {
  // out overlapping x, scale or offset is rejected; nothing is written.
  std::vector<std::uint8_t> buf(256, 0xA5);
  ConstTensorView x(buf.data(), DType::int8, {1, 8});
  Tensor s = scale_tensor(DType::float32, {1.0f});
  Tensor o = scale_tensor(DType::float32, {1.0f});
  TensorView out(buf.data() + 4, DType::float16, {1, 8});
  std::vector<std::uint8_t> before = buf;
  expect_error([&] { xquant::anti_quant_out(out, x, s, std::nullopt); }, ErrorCode::aliasing, "out", {"x"});
  EXPECT_EQ(buf, before);
  Tensor host(DType::float32, {8});
  fill_bytes(host);
  TensorView out2(host.data(), DType::float16, {1, 8});
  ConstTensorView s_in(host.data(), DType::float32, {1});
  expect_error([&] { xquant::anti_quant_out(out2, x, s_in, std::nullopt); }, ErrorCode::aliasing, "out", {"scale"});
  expect_error([&] { xquant::anti_quant_out(out2, x, s, ConstTensorView(host.data(), DType::float32, {1})); },
               ErrorCode::aliasing, "out", {"offset"});
  EXPECT_TRUE(all_bytes(host));
}

}  // namespace
