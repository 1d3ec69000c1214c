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

ExportOptions preset(const std::string& name, std::int64_t group = 128, bool given = false,
                     const char* rule = "compressed-tensors") {
  ExportOptions e;
  e.preset = name;
  e.group_size = group;
  e.group_size_given = given;
  e.scale_rule = rule;
  return e;
}

CtSelection selection(std::vector<std::string> targets, std::vector<std::string> ignore) {
  ExportOptions e;
  e.targets = std::move(targets);
  e.ignore = std::move(ignore);
  return compile_selection(e);
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
  EXPECT_NE(
      error_of([] {
        make_preset(preset("W4A8"));
      }).find("--preset: unknown preset 'W4A8', expected W4A16, W4A16_ASYM, W8A16, W8A8, FP8_DYNAMIC or NVFP4A16"),
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

TEST(Presets, NamesAreCaseInsensitive) {
  EXPECT_EQ(make_preset(preset("w4a16")).name, "W4A16");
  const Preset a = make_preset(preset("w4a16_asym"));
  EXPECT_EQ(a.name, "W4A16_ASYM");
  EXPECT_FALSE(a.symmetric);
  EXPECT_EQ(a.group, 128);
  EXPECT_TRUE(make_preset(preset("w8A8")).act8);
  const auto cfg = nlohmann::json::parse(quantization_config_json(a, {}));
  EXPECT_EQ(cfg["config_groups"]["group_0"]["weights"]["symmetric"], false);
  EXPECT_EQ(cfg["format"], "pack-quantized");
  EXPECT_NE(error_of([] { make_preset(preset("W4A16_ASYM", 128, false, "amax-qmax")); }).find("symmetric"),
            std::string::npos);
}

TEST(Selection, CompressedTensorsSyntax) {
  // class names (inferred), exact names, re: anchored at the start only (Python's re.match)
  const CtSelector lin{"Linear", nullptr};
  EXPECT_TRUE(selector_matches(lin, "model.layers.0.mlp.down_proj", "Linear"));
  EXPECT_FALSE(selector_matches(lin, "model.embed_tokens", "Embedding"));
  EXPECT_EQ(inferred_class("model.embed_tokens"), "Embedding");
  EXPECT_EQ(inferred_class("lm_head"), "Linear");
  CtSelection s = selection({"re:.*down_proj$", "re:model", "lm_head", "re:mlp"}, {});
  EXPECT_TRUE(selector_matches(s.targets[0], "model.layers.0.mlp.down_proj", "Linear"));
  EXPECT_FALSE(selector_matches(s.targets[0], "model.layers.0.mlp.down_proj_x", "Linear"));
  EXPECT_TRUE(selector_matches(s.targets[1], "model.layers.0.mlp.down_proj", "Linear"));  // a prefix is enough
  EXPECT_TRUE(selector_matches(s.targets[2], "lm_head", "Linear"));
  EXPECT_FALSE(selector_matches(s.targets[2], "model.lm_head", "Linear"));               // exact names only
  EXPECT_FALSE(selector_matches(s.targets[3], "model.layers.0.mlp.up_proj", "Linear"));  // re.match, not search
  EXPECT_NE(error_of([] { selection({"re:(unclosed"}, {}); }).find("--targets: bad regular expression"),
            std::string::npos);
  // entries that match nothing are one error naming each, with a hint for a plain regex
  CtSelection none = selection({"Linear"}, {"proj$"});
  none.targets[0].matched = true;
  const std::string msg = error_of([&] { check_all_matched(none); });
  EXPECT_NE(msg.find("--ignore 'proj$'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("write re:proj$"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("--targets"), std::string::npos) << msg;  // the matched entry is not named
}

TEST(Presets, Decisions) {
  const Preset w4 = make_preset(preset("W4A16"));
  CtSelection none;
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
  CtSelection heads = selection({"lm_head"}, {});
  EXPECT_TRUE(decide_ct(entry("lm_head.weight", StDType::F32, {512, 256}), w4, heads, false).quantize);
  const CtDecision tied = decide_ct(entry("lm_head.weight", StDType::F32, {512, 256}), w4, heads, true);
  EXPECT_FALSE(tied.quantize);
  EXPECT_TRUE(tied.warn);
  CtSelection ign = selection({}, {"re:.*up_proj$"});
  EXPECT_EQ(decide_ct(entry("a.up_proj.weight", StDType::F32, {8, 128}), w4, ign, false).reason, "matched by --ignore");
  EXPECT_TRUE(ign.ignore[0].matched);
  // --targets Linear: every Linear, output heads included (as compressed-tensors); embeddings never
  CtSelection lin = selection({"Linear"}, {});
  EXPECT_TRUE(decide_ct(entry("lm_head.weight", StDType::F32, {512, 256}), w4, lin, false).quantize);
  EXPECT_FALSE(decide_ct(entry("model.embed_tokens.weight", StDType::F32, {512, 256}), w4, lin, false).quantize);
  // K not divisible by the group size, or (per channel) by the values per packed word
  const CtDecision k100 =
      decide_ct(entry("a.weight", StDType::F32, {8, 100}), make_preset(preset("W4A16", 0, true)), none, false);
  EXPECT_TRUE(k100.warn);
  EXPECT_TRUE(k100.partial);
  EXPECT_NE(k100.reason.find("not divisible by 8 (values per packed int32)"), std::string::npos);
  EXPECT_TRUE(decide_ct(entry("a.weight", StDType::F32, {8, 100}), make_preset(preset("W8A8")), none, false).quantize);
  const CtDecision g = decide_ct(entry("a.weight", StDType::F32, {8, 64}), w4, none, false);
  EXPECT_TRUE(g.warn);
  EXPECT_EQ(g.reason, "input dimension 64 is not divisible by the group size 128");
  EXPECT_TRUE(g.partial);
}

TEST(Presets, PartialGroupsMessage) {
  // SmolLM2: hidden 576, MLP 1536: 128 divides 1536 but not 576
  const std::string m = partial_groups_message(make_preset(preset("W4A16")), {576, 576}, {576, 576, 1536});
  EXPECT_EQ(m,
            "2 of 3 targeted Linear layers have an input width (576) that the group size 128 does not divide; "
            "--group-size values that divide every layer: 192, 96, 64, 48, 32, 24, 16, 8, 0 (one scale per output "
            "channel) (or --keep-partial-dense to keep those layers dense)");
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

TEST(Scale, CompressedTensorsRule) {
  const Preset w4 = make_preset(preset("W4A16")), w8 = make_preset(preset("W8A16"));
  const Preset a4 = make_preset(preset("W4A16_ASYM"));
  // symmetric: max(|min|, |max|) / ((qmax - qmin) / 2)
  EXPECT_EQ(ct_qparams(-3.0f, 1.0f, w4, StDType::F32).widened, 3.0f / 7.5f);
  EXPECT_EQ(ct_qparams(-1.0f, 3.0f, w8, StDType::F32).widened, 3.0f / 127.5f);
  EXPECT_EQ(ct_qparams(0.5f, 3.0f, w8, StDType::F32).widened, 3.0f / 127.5f);  // min clamped to 0
  const CtScale b = ct_qparams(-1.0f, 1.0f, w4, StDType::BF16);
  EXPECT_EQ(b.bits, xquant::float_to_bfloat16(1.0f / 7.5f));
  EXPECT_EQ(b.zero_point, 0.0f);
  // asymmetric: (max - min) / 15, zp = rint(clamp(-8 - min / s, -8, 7))
  const CtScale a = ct_qparams(-1.0f, 2.0f, a4, StDType::F32);
  EXPECT_EQ(a.widened, 3.0f / 15.0f);
  EXPECT_EQ(a.zero_point, std::nearbyint(-8.0f - (-1.0f / (3.0f / 15.0f))));  // -8 + 5 = -3
  EXPECT_EQ(ct_qparams(0.25f, 2.0f, a4, StDType::F32).zero_point, -8.0f);     // min clamped to 0
  EXPECT_EQ(ct_qparams(-2.0f, -0.5f, a4, StDType::F32).zero_point, 7.0f);     // max clamped to 0
  // all-zero groups: the scale dtype's epsilon, zero point 0
  EXPECT_EQ(ct_qparams(0.0f, 0.0f, w4, StDType::F32).widened, FLT_EPSILON);
  EXPECT_EQ(ct_qparams(0.0f, 0.0f, w4, StDType::BF16).widened, 0.0078125f);
  EXPECT_EQ(ct_qparams(0.0f, 0.0f, w8, StDType::F16).widened, 0.0009765625f);
  const CtScale z = ct_qparams(0.0f, 0.0f, a4, StDType::F32);
  EXPECT_EQ(z.widened, FLT_EPSILON);
  EXPECT_EQ(z.zero_point, 0.0f);
  // a float16 scale that underflows to 0 is the epsilon too; a float32 subnormal scale is kept
  EXPECT_EQ(ct_qparams(0.0f, 1e-9f, w8, StDType::F16).widened, 0.0009765625f);
  EXPECT_EQ(ct_qparams(0.0f, 1e-38f, w8, StDType::F32).widened, 1e-38f / 127.5f);
  EXPECT_GT(1e-38f / 127.5f, 0.0f);
  // the old rule under the option
  EXPECT_EQ(ct_qparams(-3.0f, 1.0f, make_preset(preset("W4A16", 128, false, "amax-qmax")), StDType::F32).widened,
            3.0f / 7.0f);
  // overflow: 8 * s' is what the loader computes for q = -8
  EXPECT_FALSE(ct_qparams(-65000.0f, 0.0f, w4, StDType::F16).ok);
  EXPECT_TRUE(ct_qparams(-60000.0f, 0.0f, w4, StDType::F16).ok);
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
  for (const bool old_rule : {false, true}) {
    const Preset p = make_preset(preset("W8A16", 16, true, old_rule ? "amax-qmax" : "compressed-tensors"));
    std::vector<std::byte> q(48), s(6);
    const ErrorStats e = ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 3, 16, p,
                                            StDType::BF16, q.data(), s.data());
    EXPECT_EQ(e.nonfinite, 1);
    double sig = 0, noi = 0;
    for (int g = 0; g < 3; ++g) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) {
        const float v = x[static_cast<std::size_t>(g * 16 + i)];
        if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
      }
      const std::uint16_t sb = xquant::float_to_bfloat16(amax / (old_rule ? 127.0f : 127.5f));
      std::uint16_t got;
      std::memcpy(&got, s.data() + g * 2, 2);
      EXPECT_EQ(got, sb);
      const float sw = xquant::bfloat16_to_float(sb);
      for (int i = 0; i < 16; ++i) {
        const float v = x[static_cast<std::size_t>(g * 16 + i)];
        const float r = std::isnan(v) ? 0.0f : std::nearbyint(v / sw);  // half to even (default rounding mode)
        const int qi = static_cast<int>(std::max(-128.0f, std::min(127.0f, r)));
        EXPECT_EQ(static_cast<int>(static_cast<std::uint8_t>(q[static_cast<std::size_t>(g * 16 + i)])), qi + 128)
            << g << " " << i;
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
}

TEST(Groups, W4A16AsymAgainstAnIndependentFormula) {
  // 2 groups of 8 float32 values with float32 scales: q = rint(clamp(x / s + zp, -8, 7)), stored + 8
  const std::vector<float> x = {-1.0f, -0.5f, 0.0f, 0.3f, 0.7f, 1.1f, 1.6f, 2.0f,
                                0.1f,  0.2f,  0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  const Preset p = make_preset(preset("W4A16_ASYM", 8, true));
  std::vector<std::byte> q(8), s(8);
  std::vector<std::int8_t> zp(2);
  ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 2, 8, p, StDType::F32, q.data(),
                     s.data(), 0, 1, zp.data());
  for (int g = 0; g < 2; ++g) {
    float lo = 0, hi = 0;
    for (int i = 0; i < 8; ++i) {
      lo = std::min(lo, x[static_cast<std::size_t>(g * 8 + i)]);
      hi = std::max(hi, x[static_cast<std::size_t>(g * 8 + i)]);
    }
    const float sc = (hi - lo) / 15.0f;
    const float z = std::nearbyint(std::max(-8.0f, std::min(7.0f, -8.0f - lo / sc)));
    float got;
    std::memcpy(&got, s.data() + g * 4, 4);
    EXPECT_EQ(got, sc);
    EXPECT_EQ(zp[static_cast<std::size_t>(g)], static_cast<int>(z));
    for (int i = 0; i < 8; ++i) {
      const float v = x[static_cast<std::size_t>(g * 8 + i)] / sc + z;
      const int qi = static_cast<int>(std::nearbyint(std::max(-8.0f, std::min(7.0f, v))));
      const int k = g * 8 + i;
      const int nib = (static_cast<int>(q[static_cast<std::size_t>(k / 2)]) >> (4 * (k % 2))) & 0xF;
      EXPECT_EQ(nib, qi + 8) << g << " " << i;
    }
  }
}

// The squared round-trip error of one group with the parameters of [lo, hi], written here again.
double group_error(const std::vector<float>& x, float lo, float hi, const Preset& p, StDType sdt) {
  const CtScale s = ct_qparams(lo, hi, p, sdt);
  const float qmin = p.bits == 4 ? -8.0f : -128.0f, qmax = p.bits == 4 ? 7.0f : 127.0f;
  double sum = 0;
  for (const float v : x) {
    const float q = std::nearbyint(std::min(qmax, std::max(qmin, v / s.widened + s.zero_point)));
    const float e = v - (q - s.zero_point) * s.widened;
    sum += static_cast<double>(e) * e;
  }
  return sum;
}

TEST(Groups, MseObserverNeverWorseThanMinMax) {
  // 200 groups of 64: Gaussian, some with one outlier (where clipping pays)
  std::uint32_t seed = 12345;
  const auto rnd = [&] {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / 16777216.0f;
  };
  for (const char* name : {"W4A16", "W4A16_ASYM", "W8A16"}) {
    ExportOptions e = preset(name, 64, true);
    e.observer = "mse";
    const Preset p = make_preset(e);
    int improved = 0;
    for (int g = 0; g < 200; ++g) {
      std::vector<float> x(64);
      for (auto& v : x) v = (rnd() + rnd() + rnd() - 1.5f) * 0.05f;
      if (g % 3 == 0) x[static_cast<std::size_t>(g % 64)] = 0.4f;
      float lo = 0, hi = 0;
      for (const float v : x) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      float mlo = lo, mhi = hi;
      const int i = ct_mse_range(x.data(), 64, mlo, mhi, p, StDType::BF16);
      ASSERT_GE(i, 0);
      ASSERT_LT(i, 20);
      const float f = 1.0f - static_cast<float>(i) / 100.0f;
      EXPECT_EQ(mlo, lo * f);
      EXPECT_EQ(mhi, hi * f);
      const double e_mse = group_error(x, mlo, mhi, p, StDType::BF16);
      const double e_mm = group_error(x, lo, hi, p, StDType::BF16);
      EXPECT_LE(e_mse, e_mm) << name << " group " << g;
      // and no factor of the grid is better than the one chosen
      for (int j = 0; j < 20; ++j) {
        const float fj = 1.0f - static_cast<float>(j) / 100.0f;
        EXPECT_LE(e_mse, group_error(x, lo * fj, hi * fj, p, StDType::BF16)) << name << " " << g << " " << j;
      }
      improved += e_mse < e_mm ? 1 : 0;
    }
    EXPECT_GE(improved, 10) << name;  // the search does something (W8A16: 20 of 200 improve)
  }
  ExportOptions bad_rule = preset("W4A16", 128, false, "amax-qmax");
  bad_rule.observer = "mse";
  EXPECT_NE(error_of([&] { make_preset(bad_rule); }).find("--observer mse"), std::string::npos);
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
  EXPECT_NE(msg.find("row 1, columns [0, 8): amax 2000000 gives the scale +Inf in F16"), std::string::npos) << msg;
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

// ---- FP8_DYNAMIC and NVFP4A16 ----

// Independent references: the nearest value of a table, ties to the even code, by brute force over every
// finite code (no shared conversion code).
float e4m3_ref_value(int code) {  // code 0 .. 126 (0x7F is NaN): E4M3 with bias 7, subnormals below 2^-6
  const int e = code >> 3, m = code & 7;
  return e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}
std::uint8_t e4m3_ref(double v) {  // v finite, |v| <= 448
  int best = 0;
  for (int c = 1; c <= 126; ++c) {
    const double dc = std::fabs(std::fabs(v) - e4m3_ref_value(c)), db = std::fabs(std::fabs(v) - e4m3_ref_value(best));
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  return static_cast<std::uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}
const float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
std::uint8_t e2m1_ref(float v) {  // v finite, |v| <= 6; sign bit when v < 0
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float dc = std::fabs(std::fabs(v) - kE2m1[c]), db = std::fabs(std::fabs(v) - kE2m1[best]);
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  return static_cast<std::uint8_t>(best | (v < 0.0f ? 8 : 0));
}

TEST(FloatPresets, AsCompressedTensorsDefinesThem) {
  const Preset f8 = make_preset(preset("fp8_dynamic"));  // the default --group-size 128 does not apply
  EXPECT_EQ(f8.name, "FP8_DYNAMIC");
  EXPECT_EQ(f8.kind, CtKind::Fp8);
  EXPECT_EQ(f8.bits, 8);
  EXPECT_FALSE(f8.packed);
  EXPECT_TRUE(f8.act8);
  EXPECT_EQ(f8.group, 0);
  const Preset f4 = make_preset(preset("nvfp4a16"));
  EXPECT_EQ(f4.name, "NVFP4A16");
  EXPECT_EQ(f4.kind, CtKind::Nvfp4);
  EXPECT_EQ(f4.bits, 4);
  EXPECT_TRUE(f4.packed);
  EXPECT_FALSE(f4.act8);
  EXPECT_EQ(f4.group, 16);
  EXPECT_EQ(make_preset(preset("NVFP4A16", 16, true)).group, 16);
  EXPECT_EQ(make_preset(preset("FP8_DYNAMIC", 0, true)).group, 0);
  EXPECT_NE(error_of([] {
              make_preset(preset("FP8_DYNAMIC", 64, true));
            }).find("--group-size: FP8_DYNAMIC has one scale per output channel (float-quantized), expected 0; got 64"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_preset(preset("NVFP4A16", 32, true));
            }).find("--group-size: NVFP4A16 has groups of 16 (nvfp4-pack-quantized), expected 16; got 32"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { make_preset(preset("FP8_DYNAMIC", 128, false, "amax-qmax")); }).find("--scale-rule amax-qmax"),
      std::string::npos);
  ExportOptions mse = preset("NVFP4A16");
  mse.observer = "mse";
  EXPECT_NE(error_of([&] { make_preset(mse); }).find("--observer mse"), std::string::npos);
  // K must be a multiple of 16 for NVFP4A16 (rule 6); FP8_DYNAMIC takes any K
  CtSelection sel = selection({}, {});
  EXPECT_TRUE(decide_ct(entry("m.layers.0.mlp.up_proj.weight", StDType::BF16, {4, 100}), f8, sel, false).quantize);
  const CtDecision d = decide_ct(entry("m.layers.0.mlp.up_proj.weight", StDType::BF16, {4, 40}), f4, sel, false);
  EXPECT_FALSE(d.quantize);
  EXPECT_TRUE(d.partial);
  EXPECT_TRUE(decide_ct(entry("m.layers.0.mlp.up_proj.weight", StDType::BF16, {4, 48}), f4, sel, false).quantize);
  EXPECT_NE(partial_groups_message(f4, {40}, {40, 48}).find("NVFP4A16's groups of 16 do not divide"),
            std::string::npos);
}

TEST(FloatPresets, QuantizationConfigsAreCompressedTensorsOnes) {
  EXPECT_EQ(
      quantization_config_json(make_preset(preset("FP8_DYNAMIC")), {"lm_head"}),
      R"({"quant_method":"compressed-tensors","format":"float-quantized","quantization_status":"compressed",)"
      R"("config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":8,"type":"float","symmetric":true,)"
      R"("group_size":null,"strategy":"channel","dynamic":false},"input_activations":{"num_bits":8,"type":"float",)"
      R"("symmetric":true,"group_size":null,"strategy":"token","dynamic":true},"output_activations":null}},)"
      R"("ignore":["lm_head"],"kv_cache_scheme":null,"global_compression_ratio":null})");
  EXPECT_EQ(
      quantization_config_json(make_preset(preset("NVFP4A16")), {"lm_head"}),
      R"({"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized","quantization_status":"compressed",)"
      R"("config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"float","symmetric":true,)"
      R"("group_size":16,"strategy":"tensor_group","dynamic":false,"scale_dtype":"torch.float8_e4m3fn"},)"
      R"("input_activations":null,"output_activations":null}},)"
      R"("ignore":["lm_head"],"kv_cache_scheme":null,"global_compression_ratio":null})");
}

TEST(FloatPresets, Fp8ScaleIsAmaxOver448RoundedOnce) {
  const CtScale f = ct_fp8_scale(3.0f, StDType::F32);
  EXPECT_TRUE(f.ok);
  EXPECT_EQ(f.widened, 3.0f / 448.0f);
  const CtScale b = ct_fp8_scale(1.0f, StDType::BF16);
  EXPECT_EQ(b.bits, xquant::float_to_bfloat16(1.0f / 448.0f));
  EXPECT_EQ(b.widened, xquant::bfloat16_to_float(xquant::float_to_bfloat16(1.0f / 448.0f)));
  EXPECT_EQ(ct_fp8_scale(1.0f, StDType::F16).bits, xquant::float_to_half(1.0f / 448.0f));
  // an all-zero row: the epsilon of the scale dtype (as the int presets); a float16 scale that underflows too
  EXPECT_EQ(ct_fp8_scale(0.0f, StDType::F32).widened, FLT_EPSILON);
  EXPECT_EQ(ct_fp8_scale(0.0f, StDType::BF16).widened, 0.0078125f);
  EXPECT_EQ(ct_fp8_scale(0.0f, StDType::F16).widened, 0.0009765625f);
  EXPECT_EQ(ct_fp8_scale(1e-12f, StDType::F16).widened, 0.0009765625f);
  EXPECT_EQ(ct_fp8_scale(1e-40f, StDType::F32).widened, 1e-40f / 448.0f);  // a float32 subnormal scale is kept
  // float16 cannot hold 448 * s' (the largest dequantized value) once amax exceeds about 65504
  EXPECT_TRUE(ct_fp8_scale(60000.0f, StDType::F16).ok);
  const CtScale big = ct_fp8_scale(70000.0f, StDType::F16);
  EXPECT_TRUE(std::isfinite(big.widened));
  EXPECT_FALSE(big.ok);
  EXPECT_TRUE(ct_fp8_scale(FLT_MAX, StDType::F32).ok);
}

TEST(FloatPresets, Fp8RoundsToNearestEvenAndSaturates) {
  // exact E4M3 values, the ties between neighbours (to the even mantissa), saturation at 448
  EXPECT_EQ(ct_fp8_quantize(1.0f, 1.0f), 0x38);
  EXPECT_EQ(ct_fp8_quantize(1.0625f, 1.0f), 0x38);  // between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(ct_fp8_quantize(1.1875f, 1.0f), 0x3A);  // between 1.125 (0x39) and 1.25 (0x3A): even
  EXPECT_EQ(ct_fp8_quantize(1.0625001f, 1.0f), 0x39);
  EXPECT_EQ(ct_fp8_quantize(-1.0625f, 1.0f), 0xB8);
  EXPECT_EQ(ct_fp8_quantize(448.0f, 1.0f), 0x7E);
  EXPECT_EQ(ct_fp8_quantize(464.0f, 1.0f), 0x7E);  // a tie with 480 (not E4M3): clamped to 448 first
  EXPECT_EQ(ct_fp8_quantize(1e30f, 1.0f), 0x7E);
  EXPECT_EQ(ct_fp8_quantize(-1e30f, 1.0f), 0xFE);
  EXPECT_EQ(ct_fp8_quantize(std::ldexp(1.0f, -10), 1.0f), 0x00);  // half the smallest subnormal: even 0
  EXPECT_EQ(ct_fp8_quantize(std::ldexp(3.0f, -10), 1.0f), 0x02);  // 1.5 subnormal steps: even 2
  EXPECT_EQ(ct_fp8_quantize(std::ldexp(1.0f, -10) * 1.01f, 1.0f), 0x01);
  EXPECT_EQ(ct_fp8_quantize(-0.0f, 1.0f), 0x80);
  EXPECT_EQ(ct_fp8_quantize(0.0f, 1.0f), 0x00);
  EXPECT_EQ(ct_fp8_quantize(3.0f, 2.0f), 0x3C);  // x / s: 1.5
  // against the brute-force nearest-even reference on a sweep of quotients
  for (int i = -20000; i <= 20000; ++i) {
    const float x = static_cast<float>(i) * 0.0123f, s = 0.0311f;
    const double v = std::clamp(static_cast<double>(x / s), -448.0, 448.0);
    ASSERT_EQ(ct_fp8_quantize(x, s), e4m3_ref(v)) << x;
  }
}

TEST(FloatPresets, Nvfp4GlobalScaleIsTheReciprocalTimes2688) {
  // torch's 2688.0 / t is t.reciprocal() * 2688.0: two float32 roundings (products of two floats are
  // exact in double, so the float of the double product is the float32 product)
  int differs = 0;
  for (const float a : {1.0f, 3.0f, 0.3f, 7.77f, 0.0123f, 1e-20f, 1e30f, 123.456f}) {
    const float want = static_cast<float>(static_cast<double>(1.0f / a) * 2688.0);
    EXPECT_EQ(ct_nvfp4_global_scale(a), want) << a;
    differs += want != static_cast<float>(2688.0 / static_cast<double>(a)) ? 1 : 0;
  }
  EXPECT_GT(differs, 0);  // so the test tells the two formulas apart
  EXPECT_EQ(ct_nvfp4_global_scale(1.0f), 2688.0f);
  // an all-zero tensor, or one so small that the scale overflows: 1 (generate_gparam's nan_to_num)
  EXPECT_EQ(ct_nvfp4_global_scale(0.0f), 1.0f);
  EXPECT_EQ(ct_nvfp4_global_scale(1e-37f), 1.0f);
  EXPECT_TRUE(std::isfinite(ct_nvfp4_global_scale(1e-35f)));
  EXPECT_GT(ct_nvfp4_global_scale(1e-35f), 1e38f);
}

TEST(FloatPresets, Nvfp4GroupScaleIsE4m3OfGsTimesAmaxOver6) {
  // gs = 1: the E4M3 of amax / 6
  CtScale s = ct_nvfp4_scale(6.0f, 1.0f);
  EXPECT_EQ(s.bits, 0x38u);  // 1.0
  EXPECT_EQ(s.widened, 1.0f);
  EXPECT_EQ(s.largest, 6.0f);
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(ct_nvfp4_scale(6.375f, 1.0f).bits, 0x38u);  // 1.0625: a tie, to the even 1.0
  EXPECT_EQ(ct_nvfp4_scale(7.125f, 1.0f).bits, 0x3Au);  // 1.1875: a tie, to the even 1.25
  // the global scale: fl(gs * fl(amax / 6)), then E4M3; the effective scale E4M3 / gs
  const float gs = ct_nvfp4_global_scale(2.0f);  // 1344
  s = ct_nvfp4_scale(2.0f, gs);
  EXPECT_EQ(s.bits, 0x7Eu);  // 448
  EXPECT_EQ(s.widened, 448.0f / gs);
  s = ct_nvfp4_scale(0.3f, gs);
  EXPECT_EQ(s.bits, e4m3_ref(gs * (0.3f / 6.0f)));
  EXPECT_EQ(s.widened, e4m3_ref_value(e4m3_ref(gs * (0.3f / 6.0f))) / gs);
  // clamped to 448 (rounding can push the largest group just above it)
  EXPECT_EQ(ct_nvfp4_scale(1e30f, 1.0f).bits, 0x7Eu);
  // an all-zero group, or one below half the smallest E4M3 subnormal: 0.125 (E4M3's eps, compressed-tensors)
  EXPECT_EQ(ct_nvfp4_scale(0.0f, gs).bits, 0x20u);
  EXPECT_EQ(ct_nvfp4_scale(0.0f, gs).widened, 0.125f / gs);
  EXPECT_EQ(ct_nvfp4_scale(1e-9f, 1.0f).bits, 0x20u);
  EXPECT_EQ(ct_nvfp4_scale(6.0f * std::ldexp(1.0f, -9), 1.0f).bits, 0x01u);  // the smallest subnormal stays
}

TEST(FloatPresets, Fp4RoundsToNearestEvenWithCompressedTensorsSigns) {
  // every tie goes to the even code; beyond 6 saturates; the sign bit only for a negative quotient
  const std::pair<float, int> cases[] = {{0.0f, 0},       {0.25f, 0}, {0.2500001f, 1}, {0.5f, 1},  {0.75f, 2},
                                         {0.7499999f, 1}, {1.25f, 2}, {1.2500001f, 3}, {1.75f, 4}, {2.5f, 4},
                                         {2.5000002f, 5}, {3.5f, 6},  {4.0f, 6},       {5.0f, 6},  {5.0000005f, 7},
                                         {6.0f, 7},       {1e30f, 7}};
  for (const auto& [v, c] : cases) {
    EXPECT_EQ(ct_fp4_quantize(v, 1.0f), c) << v;
    EXPECT_EQ(ct_fp4_quantize(-v, 1.0f), v == 0.0f ? 0 : c | 8) << -v;  // -0.0 -> +0 (torch.sign(-0.0) is 0)
  }
  EXPECT_EQ(ct_fp4_quantize(-0.1f, 1.0f), 8);  // rounds to zero, keeps the sign: -0 (code 8)
  EXPECT_EQ(ct_fp4_quantize(3.0f, 0.5f), 7);   // x / s = 6
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(ct_fp4_value(static_cast<std::uint8_t>(c)), (c & 8 ? -1.0f : 1.0f) * kE2m1[c & 7]);
  for (int i = -8000; i <= 8000; ++i) {
    const float x = static_cast<float>(i) * 0.001f, s = 0.77f;
    ASSERT_EQ(ct_fp4_quantize(x, s), e2m1_ref(std::clamp(x / s, -6.0f, 6.0f))) << x;
  }
}

TEST(FloatPresets, Fp8GroupsAgainstAnIndependentFormula) {
  // 3 rows of 24 float32 values (one scale per row), bfloat16 scales; row 2 all zero
  std::vector<float> x(72, 0.0f);
  for (std::size_t i = 0; i < 48; ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i / 24));
  x[3] = -0.0f;
  const Preset p = make_preset(preset("FP8_DYNAMIC"));
  std::vector<std::byte> q(72), s(6);
  const ErrorStats e = ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 3, 24, p,
                                          StDType::BF16, q.data(), s.data(), 0, 1);
  EXPECT_EQ(e.nonfinite, 0);
  for (int g = 0; g < 3; ++g) {
    float amax = 0;
    for (int i = 0; i < 24; ++i) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(g * 24 + i)]));
    std::uint16_t sb = xquant::float_to_bfloat16(amax / 448.0f);
    if (amax == 0) sb = xquant::float_to_bfloat16(0.0078125f);
    std::uint16_t got;
    std::memcpy(&got, s.data() + g * 2, 2);
    EXPECT_EQ(got, sb) << g;
    const float sw = xquant::bfloat16_to_float(sb);
    for (int i = 0; i < 24; ++i) {
      const float v = x[static_cast<std::size_t>(g * 24 + i)];
      EXPECT_EQ(static_cast<int>(q[static_cast<std::size_t>(g * 24 + i)]),
                static_cast<int>(e4m3_ref(std::clamp(static_cast<double>(v / sw), -448.0, 448.0))))
          << g << " " << i;
    }
  }
  EXPECT_EQ(static_cast<int>(q[3]), 0x80);  // -0.0 keeps its sign in E4M3
  EXPECT_STREQ(e.round_trip(), "lossy");
}

TEST(FloatPresets, Nvfp4GroupsAgainstAnIndependentFormula) {
  // 2 rows of 32 (2 groups each), the global scale of the whole tensor given; group 3 all zero
  std::vector<float> x(64, 0.0f);
  for (std::size_t i = 0; i < 48; ++i)
    x[i] = std::cos(0.91f * static_cast<float>(i)) * (0.5f + static_cast<float>(i) / 16.0f);
  x[5] = -0.0f;
  x[6] = -1e-6f;
  float amax = 0;
  for (const float v : x) amax = std::max(amax, std::fabs(v));
  const float gs = ct_nvfp4_global_scale(amax);
  const Preset p = make_preset(preset("NVFP4A16"));
  std::vector<std::byte> q(32), s(4);
  ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 4, 16, p, StDType::F8_E4M3, q.data(),
                     s.data(), 0, 2, nullptr, gs);
  for (int g = 0; g < 4; ++g) {
    float ga = 0;
    for (int i = 0; i < 16; ++i) ga = std::max(ga, std::fabs(x[static_cast<std::size_t>(g * 16 + i)]));
    std::uint8_t sb = e4m3_ref(std::min(gs * (ga / 6.0f), 448.0f));
    if (sb == 0) sb = 0x20;
    EXPECT_EQ(static_cast<int>(s[static_cast<std::size_t>(g)]), sb) << g;
    const float se = e4m3_ref_value(sb) / gs;
    for (int i = 0; i < 16; ++i) {
      const std::size_t k = static_cast<std::size_t>(g * 16 + i);
      const int code = (static_cast<int>(q[k / 2]) >> (4 * (k % 2))) & 0xF;
      EXPECT_EQ(code, e2m1_ref(std::clamp(x[k] / se, -6.0f, 6.0f))) << g << " " << i;
    }
  }
  EXPECT_EQ(static_cast<int>(q[2]) & 0xF0, 0x00);  // x[5] = -0.0: +0
  EXPECT_EQ(static_cast<int>(q[3]) & 0x0F, 0x08);  // x[6] = -1e-6: -0
  EXPECT_EQ(static_cast<int>(s[3]), 0x20);         // the all-zero group
}

TEST(FloatPresets, NaNAndInfWeightsAreRefusedNamingThePlace) {
  for (const char* name : {"FP8_DYNAMIC", "NVFP4A16"}) {
    const Preset p = make_preset(preset(name));
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(64, 0.25f);
      x[16 + 16 + 5] = bad;  // row 1 (rows of 32), column 5
      std::vector<std::byte> q(64), s(8);
      const std::int64_t G = p.kind == CtKind::Fp8 ? 32 : 16;
      const std::string msg = error_of([&] {
        ct_quantize_groups(reinterpret_cast<const std::byte*>(x.data()), StDType::F32, 64 / G, G, p,
                           p.kind == CtKind::Fp8 ? StDType::F32 : StDType::F8_E4M3, q.data(), s.data(), 0, 32 / G,
                           nullptr, 1.0f);
      });
      EXPECT_NE(msg.find(std::string("row 1, column 5: ") + (std::isnan(bad) ? "NaN" : "-Inf") + ": " + name +
                         " refuses NaN and +-Inf weights"),
                std::string::npos)
          << msg;
    }
  }
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
