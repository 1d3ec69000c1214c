// Planning (xquant/plan.hpp): each plan_<op> reports exactly the error its operator reports for the same
// dtypes and shapes (code, argument, message), and returns the shapes of the operator's outputs; value
// checks (amax, group_index) are not made.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "xquant/plan.hpp"

namespace {

using namespace xqtest;
using xquant::Error;
using xquant::QuantDType;
using xquant::TensorSpec;

struct Outcome {
  bool ok = true;
  int code = 0;
  std::string argument, message;
  bool operator==(const Outcome&) const = default;
};

Outcome outcome(const std::function<void()>& f) {
  try {
    f();
    return {};
  } catch (const Error& e) {
    return {false, static_cast<int>(e.code()), std::string(e.argument()), e.what()};
  }
}

// A tensor of ones (valid amax / scales everywhere).
Tensor ones(DType dt, const Shape& shape) {
  const auto n = static_cast<std::size_t>(xquant::shape_numel(shape));
  if (xquant::is_floating(dt)) return make_float(dt, shape, std::vector<float>(n, 1.0f));
  if (dt == DType::int32) return make_typed<std::int32_t>(dt, shape, std::vector<std::int32_t>(n, 1));
  return make_typed<std::int8_t>(dt, shape, std::vector<std::int8_t>(n, 1));
}

TensorSpec spec(const Tensor& t) { return {t.dtype(), t.shape()}; }

struct Case {
  const char* name;
  std::function<void()> call, plan;
};

TEST(Plan, ErrorsEqualTheOperatorsErrors) {
  const DType f32 = DType::float32, i8 = DType::int8, i32 = DType::int32;
  const Tensor x = ones(f32, {4, 8}), x12 = ones(f32, {4, 12}), a1 = ones(f32, {1}), a3 = ones(f32, {3}),
               a8 = ones(f32, {8}), xi8 = ones(i8, {4, 8}), g2 = ones(i32, {2}), s28 = ones(f32, {2, 8}),
               x1 = ones(f32, {8}), lo = ones(f32, {3}), sc41 = ones(f32, {4, 1}), sc31 = ones(f32, {3, 1});
  Tensor out8 = ones(i8, {4, 8});
  const std::vector<Case> cases = {
      {"fq amax elements", [&] { xquant::fake_tensor_quant(x, a3); },
       [&] { xquant::plan_fake_tensor_quant(spec(x), spec(a3)); }},
      {"fq inputs dtype", [&] { xquant::fake_tensor_quant(xi8, a1); },
       [&] { xquant::plan_fake_tensor_quant(spec(xi8), spec(a1)); }},
      {"fq num_bits", [&] { xquant::fake_tensor_quant(x, a1, {.num_bits = 33}); },
       [&] { xquant::plan_fake_tensor_quant(spec(x), spec(a1), {.num_bits = 33}); }},
      {"fq axis", [&] { xquant::fake_tensor_quant_with_axis(x, a3, 1); },
       [&] { xquant::plan_fake_tensor_quant_with_axis(spec(x), spec(a3), 1); }},
      {"fq axis range", [&] { xquant::fake_tensor_quant_with_axis(x, a8, 2); },
       [&] { xquant::plan_fake_tensor_quant_with_axis(spec(x), spec(a8), 2); }},
      {"fq backward grad", [&] { xquant::fake_tensor_quant_backward(x12, x, a1, std::nullopt); },
       [&] { xquant::plan_fake_tensor_quant_backward(spec(x12), spec(x), spec(a1), std::nullopt); }},
      {"quantize channels", [&] { xquant::quantize(x, a3, std::nullopt, QuantDType::qint8, 1, true); },
       [&] { xquant::plan_quantize(spec(x), spec(a3), std::nullopt, QuantDType::qint8, 1, true); }},
      {"quantize int4 H", [&] { xquant::quantize(x12, a1, std::nullopt, QuantDType::quint4x2, -1, false); },
       [&] { xquant::plan_quantize(spec(x12), spec(a1), std::nullopt, QuantDType::quint4x2, -1, false); }},
      {"quantize mode", [&] { xquant::quantize(x, a1, std::nullopt, QuantDType::quint4x2, -1, true); },
       [&] { xquant::plan_quantize(spec(x), spec(a1), std::nullopt, QuantDType::quint4x2, -1, true); }},
      {"dynamic rank", [&] { xquant::dynamic_quant_asymmetric(x1); },
       [&] {
         xquant::plan_dynamic_quant_asymmetric(spec(x1), std::nullopt, std::nullopt, QuantDType::qint8,
                                               xquant::DynamicQuantMode::pertoken);
       }},
      {"dynamic smooth", [&] { xquant::dynamic_quant(x, a3); },
       [&] { xquant::plan_dynamic_quant(spec(x), spec(a3), std::nullopt, QuantDType::qint8); }},
      {"dynamic group without smooth", [&] { xquant::dynamic_quant(x, std::nullopt, g2); },
       [&] { xquant::plan_dynamic_quant(spec(x), std::nullopt, spec(g2), QuantDType::qint8); }},
      {"dynamic group shape",
       [&] {
         xquant::dynamic_quant(x, ones(f32, {3, 8}).view(), g2);
       },
       [&] {
         xquant::plan_dynamic_quant(spec(x), TensorSpec{f32, {3, 8}}, spec(g2), QuantDType::qint8);
       }},
      {"anti x dtype", [&] { xquant::anti_quant(x, a1, std::nullopt, DType::float16, QuantDType::qint8); },
       [&] { xquant::plan_anti_quant(spec(x), spec(a1), std::nullopt, QuantDType::qint8); }},
      {"anti scale", [&] { xquant::anti_quant(xi8, a3, std::nullopt, DType::float16, QuantDType::qint8); },
       [&] { xquant::plan_anti_quant(spec(xi8), spec(a3), std::nullopt, QuantDType::qint8); }},
      {"ulq broadcast", [&] { xquant::acts_ulq(x, lo, a1); },
       [&] { xquant::plan_acts_ulq(spec(x), spec(lo), spec(a1), 8); }},
      {"ulq num_bits", [&] { xquant::acts_ulq(x, a1, a1, false, 1); },
       [&] { xquant::plan_acts_ulq(spec(x), spec(a1), spec(a1), 1); }},
      {"ulq backward shape",
       [&] {
         xquant::acts_ulq_backward(x, {4, 8}, a1, a1, s28, x, x);
       },
       [&] {
         xquant::plan_acts_ulq_backward(spec(x), {4, 8}, spec(a1), spec(a1), spec(s28), spec(x), spec(x), 8);
       }},
      {"tile scale rows",
       [&] {
         xquant::tile_quant({out8.data(), i8, 4, 8, 8}, {x.data(), f32, 4, 8, 8}, {sc31.data(), f32, 3, 1, 1},
                            xquant::QuantMode::SYM, std::nullopt);
       },
       [&] { xquant::plan_tile_quant(spec(out8), spec(x), spec(sc31), xquant::QuantMode::SYM, std::nullopt); }},
      {"tile offset for SYM",
       [&] {
         xquant::tile_quant({out8.data(), i8, 4, 8, 8}, {x.data(), f32, 4, 8, 8}, {sc41.data(), f32, 4, 1, 1},
                            xquant::QuantMode::SYM, xquant::ConstTileView{sc41.data(), f32, 4, 1, 1});
       },
       [&] { xquant::plan_tile_quant(spec(out8), spec(x), spec(sc41), xquant::QuantMode::SYM, spec(sc41)); }},
  };
  for (const Case& c : cases) {
    const Outcome call = outcome(c.call), plan = outcome(c.plan);
    EXPECT_FALSE(call.ok) << c.name << ": the operator accepted the bad call";
    EXPECT_EQ(plan, call) << c.name << ": plan says '" << plan.message << "', the operator '" << call.message << "'";
  }
}

TEST(Plan, ShapesAreTheOutputsShapes) {
  const DType f32 = DType::float32;
  EXPECT_EQ(xquant::plan_quantize({f32, {2, 3, 16}}, {f32, {16}}, std::nullopt, QuantDType::quint4x2, -1, false),
            (Shape{2, 3, 2}));
  const auto d = xquant::plan_dynamic_quant_asymmetric({f32, {2, 3, 16}}, std::nullopt, std::nullopt,
                                                       QuantDType::quint4x2, xquant::DynamicQuantMode::pertoken);
  EXPECT_EQ(d.y_shape, (Shape{2, 3, 2}));
  EXPECT_EQ(d.y_dtype, DType::int32);
  EXPECT_EQ(d.param_shape, (Shape{2, 3}));
  EXPECT_EQ(xquant::plan_anti_quant({DType::int32, {4, 2}}, {f32, {16}}, std::nullopt, QuantDType::quint4x2),
            (Shape{4, 16}));
  EXPECT_EQ(xquant::plan_acts_ulq({f32, {4, 1, 8}}, {f32, {3, 1}}, {f32, {1}}, 8), (Shape{4, 3, 8}));
  // Values are not checked: a negative amax, group_index ends beyond the rows.
  EXPECT_EQ(xquant::plan_fake_tensor_quant({f32, {5}}, {f32, {1}}), (Shape{5}));
  EXPECT_NO_THROW(xquant::plan_dynamic_quant({f32, {4, 8}}, TensorSpec{f32, {2, 8}}, TensorSpec{DType::int32, {2}},
                                             QuantDType::qint8));
}

}  // namespace
