// Reference kernels of ActsULQ (SPEC section 5), scalar float32, one SPEC formula per line.
//
// The problem arrives as a BroadcastPlan: a row-major output of plan.shape (rank 0 = one element) and, per
// operand, an element stride per output dimension: 0 where the operand's left-padded shape is 1
// (broadcast), its row-major stride otherwise. Every value is widened to float32 with load_float, computed
// in float32 in exactly SPEC's order (no FMA: the build uses -ffp-contract=off) and narrowed once with
// store_float. LEVELS, the per-(clamp_min, clamp_max) parameters and the per-element forward math live
// in params/acts_ulq.hpp (shared by every backend).
#include <cstdint>

#include "core/numeric.hpp"
#include "ref/ref.hpp"

namespace xquant::detail::ref {

namespace {

inline std::int64_t plan_numel(const BroadcastPlan& plan) noexcept {
  std::int64_t n = 1;
  for (int d = 0; d < plan.rank; ++d) n *= plan.shape[d];
  return n;
}

// ---------------------------------------------------------------------------------------------------
// Backward: reductions onto a broadcast operand
// ---------------------------------------------------------------------------------------------------

// The output positions that broadcast onto one element of a target operand (x, clamp_min or clamp_max):
// the target's own dimensions are fixed, its broadcast dimensions (stride 0) run over the whole output
// extent. for_each visits them in increasing flat output index (row-major over the broadcast dims).
class Preimage {
 public:
  Preimage(const std::int64_t* out_stride, const std::int64_t* free_extent, int free_rank) noexcept
      : out_stride_(out_stride), free_extent_(free_extent), free_rank_(free_rank) {}

  void set_base(std::int64_t base) noexcept { base_ = base; }

  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (int k = 0; k < free_rank_; ++k)
      if (free_extent_[k] == 0) return;  // an empty output dimension: no positions
    std::int64_t idx[kMaxRank] = {};
    std::int64_t o = base_;
    for (;;) {
      visit(o);
      int k = free_rank_ - 1;  // odometer over the broadcast dims, last fastest
      for (; k >= 0; --k) {
        o += out_stride_[k];
        if (++idx[k] < free_extent_[k]) break;
        o -= out_stride_[k] * free_extent_[k];
        idx[k] = 0;
      }
      if (k < 0) return;
    }
  }

 private:
  const std::int64_t* out_stride_;   // output strides of the broadcast dims
  const std::int64_t* free_extent_;  // output extents of the broadcast dims
  int free_rank_;
  std::int64_t base_ = 0;  // flat output index of the first position
};

// Calls visit(t, preimage) for every element t of the target (dense, row-major, t = 0, 1, ... in order).
// `stride` is the target's BroadcastPlan stride: 0 exactly on the dims where its left-padded shape is 1, so
// its shape is (stride[d] == 0 ? 1 : plan.shape[d]). (A target with a 0 dim has a 0 dim in that shape too:
// its last 0 dim has a non-zero row-major stride. It is visited zero times.)
template <typename Visit>
void for_each_target(const BroadcastPlan& plan, const std::int64_t* stride, Visit&& visit) {
  std::int64_t out_stride[kMaxRank];  // row-major strides of the output
  std::int64_t acc = 1;
  for (int d = plan.rank - 1; d >= 0; --d) {
    out_stride[d] = acc;
    acc *= plan.shape[d];
  }
  // Split the output dims into the target's own dims (kept) and its broadcast dims (free).
  std::int64_t kept_stride[kMaxRank], kept_extent[kMaxRank], free_stride[kMaxRank], free_extent[kMaxRank];
  int kept_rank = 0, free_rank = 0;
  std::int64_t target_numel = 1;
  for (int d = 0; d < plan.rank; ++d) {
    if (stride[d] == 0) {
      free_stride[free_rank] = out_stride[d];
      free_extent[free_rank++] = plan.shape[d];
    } else {
      kept_stride[kept_rank] = out_stride[d];
      kept_extent[kept_rank++] = plan.shape[d];
      target_numel *= plan.shape[d];
    }
  }
  Preimage pre(free_stride, free_extent, free_rank);
  std::int64_t idx[kMaxRank] = {};
  std::int64_t base = 0;  // flat output index of target t's first preimage position
  for (std::int64_t t = 0; t < target_numel; ++t) {
    pre.set_base(base);
    visit(t, pre);
    for (int k = kept_rank - 1; k >= 0; --k) {  // odometer over the kept dims, last fastest
      base += kept_stride[k];
      if (++idx[k] < kept_extent[k]) break;
      base -= kept_stride[k] * kept_extent[k];
      idx[k] = 0;
    }
  }
}

}  // namespace

void acts_ulq(const ActsUlqArgs& args) {
  const BroadcastPlan& plan = args.plan;
  const DType dt = args.dt;
  const float levels = acts_ulq_levels(args.num_bits);
  const std::int64_t numel = plan_numel(plan);
  // Walk the output row-major; ix / imin / imax follow the operands' (broadcast) element offsets.
  std::int64_t idx[kMaxRank] = {};
  std::int64_t ix = 0, imin = 0, imax = 0;
  for (std::int64_t i = 0; i < numel; ++i) {
    const ActsUlqParams p = init_acts_ulq_params(load_float(dt, args.clamp_min, imin),
                                                 load_float(dt, args.clamp_max, imax), args.fixed_min, levels);
    const ActsUlqElement e = acts_ulq_element(load_float(dt, args.x, ix), p, levels);
    store_float(dt, args.y, i, e.y);
    store_float(dt, args.clamp_min_mask, i, e.clamp_min_mask);
    store_float(dt, args.clamp_max_mask, i, e.clamp_max_mask);
    store_float(dt, args.x_clamped_loss, i, e.x_clamped_loss);
    for (int d = plan.rank - 1; d >= 0; --d) {
      ix += plan.stride_x[d];
      imin += plan.stride_min[d];
      imax += plan.stride_max[d];
      if (++idx[d] < plan.shape[d]) break;
      ix -= plan.stride_x[d] * plan.shape[d];
      imin -= plan.stride_min[d] * plan.shape[d];
      imax -= plan.stride_max[d] * plan.shape[d];
      idx[d] = 0;
    }
  }
}

// Each gradient element is the CanonicalSum of its terms over the output positions that broadcast onto it,
// in increasing flat output index (one term: exactly that term, so the non-broadcast case is elementwise).
//   x_grad term         = (y_grad * min_mask) * max_mask
//   clamp_min_grad term = y_grad * ((1 - min_mask) - x_clamped_loss);   0 where fixed_min or clamp_min > 0
//   clamp_max_grad term = y_grad * (x_clamped_loss + (1 - max_mask));   0 where clamp_max < LEVELS * EPS
// A zeroed element skips its sum (the result is the same).
void acts_ulq_backward(const ActsUlqBackwardArgs& args) {
  const BroadcastPlan& plan = args.plan;
  const DType dt = args.dt;
  const float floor_max = acts_ulq_floor_max(acts_ulq_levels(args.num_bits));  // LEVELS * EPS
  auto y_grad = [&](std::int64_t o) { return load_float(dt, args.y_grad, o); };
  auto min_mask = [&](std::int64_t o) { return load_float(dt, args.clamp_min_mask, o); };
  auto max_mask = [&](std::int64_t o) { return load_float(dt, args.clamp_max_mask, o); };
  auto loss = [&](std::int64_t o) { return load_float(dt, args.x_clamped_loss, o); };

  for_each_target(plan, plan.stride_x, [&](std::int64_t t, const Preimage& pre) {
    CanonicalSum sum;
    pre.for_each([&](std::int64_t o) { sum.add((y_grad(o) * min_mask(o)) * max_mask(o)); });
    store_float(dt, args.x_grad, t, sum.result());
  });

  for_each_target(plan, plan.stride_min, [&](std::int64_t t, const Preimage& pre) {
    float g = 0.0f;
    if (!(args.fixed_min || load_float(dt, args.clamp_min, t) > 0.0f)) {
      CanonicalSum sum;
      pre.for_each([&](std::int64_t o) { sum.add(y_grad(o) * ((1.0f - min_mask(o)) - loss(o))); });
      g = sum.result();
    }
    store_float(dt, args.clamp_min_grad, t, g);
  });

  for_each_target(plan, plan.stride_max, [&](std::int64_t t, const Preimage& pre) {
    float g = 0.0f;
    if (!(load_float(dt, args.clamp_max, t) < floor_max)) {
      CanonicalSum sum;
      pre.for_each([&](std::int64_t o) { sum.add(y_grad(o) * (loss(o) + (1.0f - max_mask(o)))); });
      g = sum.result();
    }
    store_float(dt, args.clamp_max_grad, t, g);
  });
}

}  // namespace xquant::detail::ref
