// The compressed-tensors presets (tools/src/ct_presets.cpp): the presets and their options, which
// modules are quantized, the config they write, the stored scale of a group with its refusals, and the
// numbers of one run of groups (ct_quantize_groups) against an independent formula. Expected values
// are written here by hand or computed by an independent formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "compressed_tensors.hpp"
#include "entry.hpp"
#include "errors.hpp"
#include "passes.hpp"
#include "xquant/half.hpp"

namespace {

using namespace xqcli;
using xqcli::test_support::entry;

ExportOptions preset(const std::string& name, std::int64_t group = 128, bool given = false) {
  ExportOptions e;
  e.preset = name;
  e.group_size = group;
  e.group_size_given = given;
  return e;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CliError& e) {
    EXPECT_EQ(e.exit_code(), kExitBadInput);
    return e.what();
  }
  ADD_FAILURE() << "no CliError";
  return "";
}

// ---- presets ----

TEST(Presets, AsCompressedTensorsNamesThem) {
  const Preset w4 = make_preset(preset("W4A16"));
  EXPECT_EQ(w4.bits, 4);
  EXPECT_TRUE(w4.packed);
  EXPECT_FALSE(w4.act8);
  EXPECT_EQ(w4.group, 128);
  const Preset w8 = make_preset(preset("W8A16", 0, true));
  EXPECT_EQ(w8.bits, 8);
  EXPECT_TRUE(w8.packed);
  EXPECT_EQ(w8.group, 0);
  const Preset a8 = make_preset(preset("W8A8"));  // the default --group-size 128 does not apply
  EXPECT_EQ(a8.bits, 8);
  EXPECT_FALSE(a8.packed);
  EXPECT_TRUE(a8.act8);
  EXPECT_EQ(a8.group, 0);
}

TEST(Presets, BadOptionsNameTheOptionAndTheValue) {
  EXPECT_NE(error_of([] {
              make_preset(preset("W4A8"));
            }).find("--preset: unknown preset 'W4A8', expected W4A16, W8A16 or W8A8"),
            std::string::npos);
  for (std::int64_t g : {-8, 12, 1})
    EXPECT_NE(error_of([&] { make_preset(preset("W4A16", g, true)); }).find("got " + std::to_string(g)),
              std::string::npos);
  EXPECT_NE(error_of([] { make_preset(preset("W8A8", 64, true)); }).find("W8A8 has one scale per output channel"),
            std::string::npos);
  EXPECT_EQ(make_preset(preset("W8A8", 0, true)).group, 0);
}

TEST(Presets, ModuleNames) {
  for (const char* m :
       {"model.embed_tokens", "bert.embeddings.word_embeddings", "transformer.wte", "transformer.wpe", "shared"})
    EXPECT_TRUE(is_embedding_module(m)) << m;
  EXPECT_FALSE(is_embedding_module("gpt_neox.embed_out"));
  EXPECT_FALSE(is_embedding_module("model.layers.0.mlp.up_proj"));
  for (const char* m : {"lm_head", "gpt_neox.embed_out", "model.layers.3.block_sparse_moe.gate", "x.router",
                        "model.layers.0.mlp.shared_expert_gate", "cls.predictions.decoder"})
    EXPECT_TRUE(is_default_ignored_module(m)) << m;
  EXPECT_FALSE(is_default_ignored_module("model.layers.0.mlp.gate_proj"));
}

TEST(Presets, Decisions) {
  const Preset w4 = make_preset(preset("W4A16"));
  const Filters none;
  const CtDecision up =
      decide_ct(entry("model.layers.0.mlp.up_proj.weight", StDType::BF16, {512, 256}), w4, none, false);
  EXPECT_TRUE(up.quantize);
  EXPECT_FALSE(up.ignore);
  EXPECT_EQ(up.module, "model.layers.0.mlp.up_proj");
  const CtDecision head = decide_ct(entry("lm_head.weight", StDType::BF16, {512, 256}), w4, none, false);
  EXPECT_FALSE(head.quantize);
  EXPECT_TRUE(head.ignore);
  EXPECT_FALSE(head.warn);
  const CtDecision emb = decide_ct(entry("model.embed_tokens.weight", StDType::BF16, {512, 256}), w4, none, false);
  EXPECT_FALSE(emb.quantize);
  EXPECT_EQ(emb.reason, "embedding (not a Linear layer)");
  const CtDecision norm = decide_ct(entry("model.norm.weight", StDType::BF16, {256}), w4, none, false);
  EXPECT_FALSE(norm.quantize);
  EXPECT_FALSE(norm.ignore);  // not a Linear: not listed
  const CtDecision i8 = decide_ct(entry("x.weight", StDType::I8, {8, 128}), w4, none, false);
  EXPECT_FALSE(i8.quantize);
  EXPECT_TRUE(i8.ignore);
  // --targets replaces the default dense set; a tied lm_head stays dense with a warning
  const Filters heads{compile_patterns({"lm_head"}, "--targets"), {}};
  EXPECT_TRUE(decide_ct(entry("lm_head.weight", StDType::F32, {512, 256}), w4, heads, false).quantize);
  const CtDecision tied = decide_ct(entry("lm_head.weight", StDType::F32, {512, 256}), w4, heads, true);
  EXPECT_FALSE(tied.quantize);
  EXPECT_TRUE(tied.warn);
  const Filters ign{{}, compile_patterns({"up_proj$"}, "--ignore")};
  EXPECT_EQ(decide_ct(entry("a.up_proj.weight", StDType::F32, {8, 128}), w4, ign, false).reason, "matched by --ignore");
  // K not divisible by the group size, or (per channel) by the values per packed word
  const CtDecision k100 =
      decide_ct(entry("a.weight", StDType::F32, {8, 100}), make_preset(preset("W4A16", 0, true)), none, false);
  EXPECT_TRUE(k100.warn);
  EXPECT_NE(k100.reason.find("not divisible by 8 (values per packed int32)"), std::string::npos);
  EXPECT_TRUE(decide_ct(entry("a.weight", StDType::F32, {8, 100}), make_preset(preset("W8A8")), none, false).quantize);
  const CtDecision g = decide_ct(entry("a.weight", StDType::F32, {8, 64}), w4, none, false);
  EXPECT_TRUE(g.warn);
  EXPECT_EQ(g.reason, "input dimension 64 is not divisible by the group size 128");
}

TEST(Presets, QuantizationConfigOfW4A16IsTheDocumentedOne) {
  const std::string got = quantization_config_json(make_preset(preset("W4A16")), {"lm_head", "model.embed_tokens"});
  EXPECT_EQ(
      got,
      R"({"quant_method":"compressed-tensors","format":"pack-quantized","quantization_status":"compressed",)"
      R"("config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","symmetric":true,)"
      R"("group_size":128,"strategy":"group","dynamic":false},"input_activations":null,"output_activations":null}},)"
      R"("ignore":["lm_head","model.embed_tokens"],"kv_cache_scheme":null,"global_compression_ratio":null})");
  const auto a8 = nlohmann::json::parse(quantization_config_json(make_preset(preset("W8A8")), {}));
  EXPECT_EQ(a8["format"], "int-quantized");
  EXPECT_EQ(a8["config_groups"]["group_0"]["weights"]["strategy"], "channel");
  EXPECT_TRUE(a8["config_groups"]["group_0"]["weights"]["group_size"].is_null());
  EXPECT_EQ(a8["config_groups"]["group_0"]["input_activations"]["strategy"], "token");
  EXPECT_EQ(a8["config_groups"]["group_0"]["input_activations"]["dynamic"], true);
}

// ---- the scale of a group ----

TEST(Scale, RoundedToTheScaleDtypeWithGuards) {
  // amax / qmax in float32, then round to nearest even
  const CtScale b = ct_scale(1.0f, 4, StDType::BF16);
  EXPECT_TRUE(b.ok);
  EXPECT_EQ(b.bits, xquant::float_to_bfloat16(1.0f / 7.0f));
  EXPECT_EQ(b.widened, xquant::bfloat16_to_float(xquant::float_to_bfloat16(1.0f / 7.0f)));
  const CtScale h = ct_scale(3.0f, 8, StDType::F16);
  EXPECT_EQ(h.bits, xquant::float_to_half(3.0f / 127.0f));
  const CtScale f = ct_scale(3.0f, 8, StDType::F32);
  EXPECT_EQ(f.widened, 3.0f / 127.0f);
  // all-zero group: 1; tiny: FLT_MIN; a float16 scale that rounds to 0: the smallest subnormal 2^-24
  EXPECT_EQ(ct_scale(0.0f, 4, StDType::F32).widened, 1.0f);
  EXPECT_EQ(ct_scale(1e-44f, 8, StDType::F32).widened, FLT_MIN);
  const CtScale u = ct_scale(1e-9f, 8, StDType::F16);
  EXPECT_EQ(u.bits, 1u);
  EXPECT_EQ(u.widened, std::ldexp(1.0f, -24));
  EXPECT_TRUE(u.ok);
}

TEST(Scale, RefusedWhenTheScaleDtypeCannotHoldIt) {
  // amax / 7 rounds to +Inf in float16 (issue 17: +Inf scales and NaN weights were written)
  const CtScale inf = ct_scale(1e6f, 4, StDType::F16);
  EXPECT_FALSE(inf.ok);
  EXPECT_TRUE(std::isinf(inf.widened));
  // finite scale, but 7 * s' overflows float16 (what the loader computes)
  const CtScale big = ct_scale(7e4f, 4, StDType::F16);
  EXPECT_TRUE(std::isfinite(big.widened));
  EXPECT_TRUE(std::isinf(big.largest));
  EXPECT_FALSE(big.ok);
  EXPECT_NE(ct_scale_problem(7e4f, 4, StDType::F16, big).find("F16 cannot hold"), std::string::npos);
  // the largest float16 weight: 65504 / 7 rounds up to 9360 and 7 * 9360 = 65520 rounds to +Inf in
  // float16 (65504 / 127 -> 516, * 127 = 65532 likewise): the weight 65504 would load as +Inf
  EXPECT_FALSE(ct_scale(65504.0f, 4, StDType::F16).ok);
  EXPECT_FALSE(ct_scale(65504.0f, 8, StDType::F16).ok);
  EXPECT_TRUE(ct_scale(60000.0f, 4, StDType::F16).ok);  // 8570 * 7 = 59990 -> 59968
  EXPECT_TRUE(ct_scale(60000.0f, 8, StDType::F16).ok);
  EXPECT_TRUE(ct_scale(1e30f, 4, StDType::BF16).ok);
  EXPECT_TRUE(ct_scale(FLT_MAX / 2, 8, StDType::F32).ok);
}

// ---- one run of groups ----

TEST(Groups, W8A16AgainstAnIndependentFormula) {
  // 3 groups of 16 float32 values, bfloat16 scales
  std::vector<float> x(48);
  for (std::size_t i = 0; i < 48; ++i) {
    const std::size_t group = i / 16;
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(group));
  }
  x[20] = std::numeric_limits<float>::quiet_NaN();
  const Preset p = make_preset(preset("W8A16", 16, true));
  std::vector<std::byte> q(48), s(6);
  const ErrorStats e = ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 3, 16, p,
                                          StDType::BF16, q.data(), s.data());
  EXPECT_EQ(e.nonfinite, 1);
  double sig = 0, noi = 0;
  for (std::size_t g = 0; g < 3; ++g) {
    float amax = 0;
    for (std::size_t i = 0; i < 16; ++i) {
      const float v = x[g * 16 + i];
      if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
    }
    const std::uint16_t sb = xquant::float_to_bfloat16(amax / 127.0f);
    std::uint16_t got;
    std::memcpy(&got, s.data() + g * 2, 2);
    EXPECT_EQ(got, sb);
    const float sw = xquant::bfloat16_to_float(sb);
    for (std::size_t i = 0; i < 16; ++i) {
      const float v = x[g * 16 + i];
      const float r = std::isnan(v) ? 0.0f : std::nearbyint(v / sw);  // half to even (default rounding mode)
      const int qi = static_cast<int>(std::max(-128.0f, std::min(127.0f, r)));
      EXPECT_EQ(static_cast<int>(static_cast<std::uint8_t>(q[g * 16 + i])), qi + 128) << g << " " << i;
      if (std::isfinite(v)) {
        sig += static_cast<double>(v) * v;
        const double d = static_cast<double>(v) - static_cast<double>(static_cast<float>(qi) * sw);
        noi += d * d;
      }
    }
  }
  EXPECT_NEAR(e.signal, sig, 1e-5 * sig);
  EXPECT_NEAR(e.noise, noi, 1e-4 * noi);
  EXPECT_STREQ(e.round_trip(), "lossy");
}

TEST(Groups, AScaleThatCannotBeStoredThrowsNamingThePlace) {
  std::vector<float> x(32, 0.5f);
  x[21] = 2e6f;  // row 1 (rows of 16: 2 groups of 8), column 5: group 0 of that row
  const Preset p = make_preset(preset("W4A16", 8, true));
  std::vector<std::byte> q(16), s(8, std::byte{0});
  const std::string msg = error_of([&] {
    ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 4, 8, p, StDType::F16, q.data(),
                       s.data(), 0, 2);
  });
  EXPECT_NE(msg.find("row 1, columns [0, 8): amax 2000000 / 7 gives the scale +Inf in F16"), std::string::npos) << msg;
}

TEST(Groups, HugeWeightsKeepAFiniteReport) {
  // squares near 1e60 overflow float32 lanes: the group is summed in double
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[static_cast<std::size_t>(i)] = (static_cast<float>(i) - 7.5f) * 1e29f;
  const Preset p = make_preset(preset("W8A16", 16, true));
  std::vector<std::byte> q(16), s(2);
  const ErrorStats e = ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 1, 16, p,
                                          StDType::BF16, q.data(), s.data());
  EXPECT_TRUE(std::isfinite(e.signal));
  EXPECT_TRUE(std::isfinite(e.noise));
  EXPECT_GT(e.noise, 0.0);
  EXPECT_TRUE(std::isfinite(e.sqnr_db()));
  EXPECT_STREQ(e.round_trip(), "lossy");
}

// ---- what the report says ----

TEST(Report, ANaNIsNeverAnExactRoundTrip) {
  ErrorStats exact;
  exact.signal = 4.0;
  EXPECT_STREQ(exact.round_trip(), "exact");
  EXPECT_EQ(exact.sqnr_text(), "exact");
  ErrorStats nan;
  nan.signal = 4.0;
  nan.noise = std::numeric_limits<double>::quiet_NaN();
  EXPECT_STREQ(nan.round_trip(), "non-finite");
  EXPECT_EQ(nan.sqnr_text(), "not finite");
  ErrorStats inf;
  inf.signal = std::numeric_limits<double>::infinity();
  inf.noise = std::numeric_limits<double>::infinity();
  EXPECT_STREQ(inf.round_trip(), "non-finite");
  ErrorStats lossy;
  lossy.signal = 100.0;
  lossy.noise = 1.0;
  EXPECT_EQ(lossy.sqnr_text(), "20.00 dB");
}

}  // namespace
