// Exhaustive check of the fast exact division (src/cpu/fastdiv-inl.h) against the divider.
//
//   build/release/bench/exhaustive_div [--target NAME] [--random N] [--every-scale K] [--integers B] [--quick]
//                                      [--all-x S]
//
// --target: a Highway target of this build and CPU (avx2, avx3; neon, sve, sve2, sve_256, sve2_128 on
// aarch64). --all-x S: part 1 below for only the first S selected scales (0: none), e.g. under qemu, where
// one sweep of 2^32 dividends takes minutes; parts 2-4 still cover every dividend for their scales.
//
// 1. Every float32 bit pattern x (2^32, NaN, Inf, zeros, subnormals included) for a set of scales:
//    powers of two, the four largest significands (the ones the proof leaves to this check), the
//    extremes of the allowed divisor range, scales that make quotients subnormal or huge, and the scales
//    the operators use. For each: DivExact (fast path or fallback, as the kernels call it) must equal
//    hn::Div in every bit; the two-step sequence must equal it on every lane of the domain; the one-step
//    sequence is counted too (it is not always correct: the reason for the second step).
// 2. --random N: N random scales (random significand and exponent), every x significand of one binade
//    (both signs): by exact scaling this covers every x in the domain for those scales.
// 3. --every-scale K: every one of the 2^23 scale significands against K random x significands.
// 4. --integers B (default xquant::detail::kOneStepIntegerBits): every integer 1 .. 2^B against every scale
//    significand: the one-step sequence must be exact there (fake quantization's q / scale uses it).
// Exit status 1 if any fast-path result differs from the divider. Runs on the OpenMP threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "exhaustive_div.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/fastdiv-inl.h"
#include "hwy/highway.h"

#ifndef XQUANT_EXHAUSTIVE_DIV_ONCE
#define XQUANT_EXHAUSTIVE_DIV_ONCE
struct DivStats {
  std::uint64_t lanes = 0, in_domain = 0;
  std::uint64_t bad_exact = 0;  // DivExact != divider (any lane): must be 0
  std::uint64_t bad_two = 0;    // two-step != divider on a lane in the domain: must be 0
  std::uint64_t bad_one = 0;    // one-step != divider on a lane in the domain (informational)
  std::uint32_t first_bad_two = 0, first_bad_one = 0, first_bad_exact = 0;
  void add(const DivStats& o) {
    if (bad_two == 0 && o.bad_two) first_bad_two = o.first_bad_two;
    if (bad_one == 0 && o.bad_one) first_bad_one = o.first_bad_one;
    if (bad_exact == 0 && o.bad_exact) first_bad_exact = o.first_bad_exact;
    lanes += o.lanes;
    in_domain += o.in_domain;
    bad_exact += o.bad_exact;
    bad_two += o.bad_two;
    bad_one += o.bad_one;
  }
};
#endif

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

// x bit patterns base + [0, count) (count a multiple of 64) divided by s.
DivStats CheckBits(float s, std::uint32_t base, std::uint32_t count) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const std::uint32_t N = static_cast<std::uint32_t>(hn::Lanes(df));
  const FastDivDomain d = fast_div_domain(s, s);
  const DivDomainV<DF> dom(d);
  const auto sv = hn::Set(df, s), rv = hn::Set(df, 1.0f / s);
  auto in_count = hn::Zero(di);
  auto any_two = hn::FirstN(du, 0), any_one = any_two, any_exact = any_two;
  DivStats st;
  // use(in, bad_two, bad_one, bad_exact) for the lanes at b0 (a callback, not a tuple: SVE masks are
  // sizeless and cannot be members).
  auto check = [&](std::uint32_t b0, auto&& use) {
    const auto bits = hn::Add(hn::Iota(du, 0), hn::Set(du, b0));
    const auto x = hn::BitCast(df, bits);
    const auto ref = hn::BitCast(du, hn::Div(x, sv));
    const auto in = hn::RebindMask(du, InDivDomain(df, x, dom));
    const auto two = hn::BitCast(du, DivCore(x, sv, rv));
    const auto one = hn::BitCast(du, DivCoreOneStep(x, sv, rv));
    const auto exact = hn::BitCast(du, d.ok ? DivExact(df, x, sv, rv, dom) : hn::Div(x, sv));
    use(in, hn::And(in, hn::Not(hn::Eq(two, ref))), hn::And(in, hn::Not(hn::Eq(one, ref))),
        hn::Not(hn::Eq(exact, ref)));
  };
  for (std::uint32_t i = 0; i < count; i += N) {
    check(base + i, [&](auto in, auto b2, auto b1, auto be) {
      if (!d.ok) in = hn::And(in, hn::Not(in));  // no fast path for this divisor: nothing is in the domain
      in_count = hn::Sub(in_count, hn::BitCast(di, hn::VecFromMask(du, in)));
      any_two = hn::Or(any_two, hn::And(b2, in));
      any_one = hn::Or(any_one, hn::And(b1, in));
      any_exact = hn::Or(any_exact, be);
    });
  }
  st.lanes = count;
  HWY_ALIGN std::int32_t c[64];
  hn::Store(in_count, di, c);
  for (std::uint32_t k = 0; k < N; ++k) st.in_domain += static_cast<std::uint32_t>(c[k]);
  if (!hn::AllFalse(du, any_two) || !hn::AllFalse(du, any_one) || !hn::AllFalse(du, any_exact)) {
    // Rare: recount lane by lane, remembering the first offender of each kind.
    for (std::uint32_t i = 0; i < count; i += N) {
      check(base + i, [&](auto, auto b2, auto b1, auto be) {
        if (!d.ok) {
          b2 = hn::And(b2, hn::Not(b2));
          b1 = hn::And(b1, hn::Not(b1));
        }
        HWY_ALIGN std::uint32_t m2[64], m1[64], me[64];
        hn::Store(hn::VecFromMask(du, b2), du, m2);
        hn::Store(hn::VecFromMask(du, b1), du, m1);
        hn::Store(hn::VecFromMask(du, be), du, me);
        for (std::uint32_t k = 0; k < N; ++k) {
          const std::uint32_t xb = base + i + k;
          if (m2[k] && st.bad_two++ == 0) st.first_bad_two = xb;
          if (m1[k] && st.bad_one++ == 0) st.first_bad_one = xb;
          if (me[k] && st.bad_exact++ == 0) st.first_bad_exact = xb;
        }
      });
    }
  }
  return st;
}

// Every scale significand in [1, 2) from s_first (bits) for s_count scales, against the given x.
DivStats CheckScales(std::uint32_t s_first, std::uint32_t s_count, const float* xs, std::uint32_t nx) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const std::uint32_t N = static_cast<std::uint32_t>(hn::Lanes(df));
  DivStats st;
  for (std::uint32_t k = 0; k < s_count; ++k) {
    const std::uint32_t sb = s_first + k;
    float s;
    std::memcpy(&s, &sb, 4);
    const DivDomainV<DF> dom(fast_div_domain(s, s));
    const auto sv = hn::Set(df, s), rv = hn::Set(df, 1.0f / s);
    for (std::uint32_t i = 0; i < nx; i += N) {
      const auto x = hn::LoadU(df, xs + i);
      const auto ref = hn::BitCast(du, hn::Div(x, sv));
      const auto in = hn::RebindMask(du, InDivDomain(df, x, dom));
      const auto b2 = hn::And(in, hn::Not(hn::Eq(hn::BitCast(du, DivCore(x, sv, rv)), ref)));
      const auto b1 = hn::And(in, hn::Not(hn::Eq(hn::BitCast(du, DivCoreOneStep(x, sv, rv)), ref)));
      const auto be = hn::Not(hn::Eq(hn::BitCast(du, DivExact(df, x, sv, rv, dom)), ref));
      st.lanes += N;
      st.in_domain += hn::CountTrue(du, in);
      if (!hn::AllFalse(du, b2) && st.bad_two++ == 0) st.first_bad_two = sb;
      if (!hn::AllFalse(du, b1) && st.bad_one++ == 0) st.first_bad_one = sb;
      if (!hn::AllFalse(du, be) && st.bad_exact++ == 0) st.first_bad_exact = sb;
    }
  }
  return st;
}

const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }
bool HasFastDiv() { return kHaveFastDiv; }

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace xquant::detail {
HWY_EXPORT(CheckBits);
HWY_EXPORT(CheckScales);
HWY_EXPORT(TargetNameHere);
HWY_EXPORT(HasFastDiv);
}  // namespace xquant::detail

namespace {

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

bool report(const char* what, const DivStats& st, double secs, bool bits_are_x) {
  std::printf(
      "%-34s lanes %12llu  fast path %12llu  two-step wrong %llu  one-step wrong %llu  result wrong %llu  (%.1f s)\n",
      what, static_cast<unsigned long long>(st.lanes), static_cast<unsigned long long>(st.in_domain),
      static_cast<unsigned long long>(st.bad_two), static_cast<unsigned long long>(st.bad_one),
      static_cast<unsigned long long>(st.bad_exact), secs);
  const char* unit = bits_are_x ? "x" : "scale";
  if (st.bad_one)
    std::printf("    first one-step miss: %s bits 0x%08x (%.9g)\n", unit, st.first_bad_one,
                from_bits(st.first_bad_one));
  if (st.bad_two)
    std::printf("    FIRST TWO-STEP MISS: %s bits 0x%08x (%.9g)\n", unit, st.first_bad_two,
                from_bits(st.first_bad_two));
  if (st.bad_exact)
    std::printf("    FIRST RESULT MISS: %s bits 0x%08x (%.9g)\n", unit, st.first_bad_exact,
                from_bits(st.first_bad_exact));
  std::fflush(stdout);
  return st.bad_two == 0 && st.bad_exact == 0;
}

// x bit patterns [begin, end) (multiples of 2^16) for scale s, over the OpenMP threads.
DivStats sweep(float s, std::uint64_t begin, std::uint64_t end) {
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 20;
  const std::int64_t chunks = static_cast<std::int64_t>((end - begin + kChunk - 1) / kChunk);
  std::vector<DivStats> part(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(dynamic, 4)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::uint64_t b = begin + static_cast<std::uint64_t>(c) * kChunk;
    const std::uint64_t n = std::min(kChunk, end - b);
    part[static_cast<std::size_t>(c)] = HWY_DYNAMIC_DISPATCH(xquant::detail::CheckBits)(
        s, static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(n));
  }
  DivStats all;
  for (const auto& p : part) all.add(p);
  return all;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  int random_scales = 256;
  int every_scale_x = 256;
  int integer_bits = xquant::detail::kOneStepIntegerBits;
  bool quick = false;
  int all_x_scales = -1;
  std::string target;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--random" && i + 1 < argc)
      random_scales = std::atoi(argv[++i]);
    else if (a == "--every-scale" && i + 1 < argc)
      every_scale_x = std::atoi(argv[++i]);
    else if (a == "--target" && i + 1 < argc)
      target = argv[++i];
    else if (a == "--integers" && i + 1 < argc)
      integer_bits = std::atoi(argv[++i]);
    else if (a == "--quick")
      quick = true;
    else if (a == "--all-x" && i + 1 < argc)
      all_x_scales = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--target NAME] [--random N] [--every-scale K] [--integers B] [--quick] [--all-x S]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!target.empty()) {
    std::int64_t chosen = 0;
    for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
      std::string name = hwy::TargetName(t);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (name == target) chosen = t;
    }
    if (chosen == 0) {
      std::fprintf(stderr, "target %s is not compiled in or not supported by this CPU\n", target.c_str());
      return 2;
    }
    hwy::SetSupportedTargetsForTest(chosen);
  }
  std::printf("target %s (fast division %s), %d threads\n", HWY_DYNAMIC_DISPATCH(xquant::detail::TargetNameHere)(),
              HWY_DYNAMIC_DISPATCH(xquant::detail::HasFastDiv)() ? "on" : "off: every quotient is divided",
              omp_get_max_threads());
  bool ok = true;

  // Divisors refused by the domain (the kernels divide): negative, zero, subnormal, >= 2^126, non-finite.
  for (float s : {-3.0f, -0.0f, 0.0f, 1e-40f, 0x1p126f, 3e38f, INFINITY, NAN}) {
    if (xquant::detail::fast_div_domain(s, s).ok) {
      std::printf("divisor %g wrongly accepted by fast_div_domain\n", static_cast<double>(s));
      ok = false;
    }
  }

  // 1. every x for selected scales
  std::vector<std::pair<std::string, float>> scales = {
      {"1", 1.0f},
      {"3", 3.0f},
      {"0.1", 0.1f},
      {"127/3 (fake quant, amax 3)", 127.0f / 3.0f},
      {"0.03", 0.03f},
      {"255 (ActsULQ levels)", 255.0f},
      {"1.2345678", 1.2345678f},
      {"1+2^-23", from_bits(0x3F800001u)},
      {"2-2^-23 (largest significand)", from_bits(0x3FFFFFFFu)},
      {"2-2*2^-23", from_bits(0x3FFFFFFEu)},
      {"2-3*2^-23", from_bits(0x3FFFFFFDu)},
      {"2-4*2^-23", from_bits(0x3FFFFFFCu)},
      {"2^-126 (smallest normal)", 0x1p-126f},
      {"(2-2^-23)*2^-126", from_bits(0x00FFFFFFu)},
      {"largest below 2^126", from_bits(0x7E7FFFFFu)},
      {"1e-12 (dynamic quant floor)", 1e-12f},
      {"1e-30", 1e-30f},
      {"1e30", 1e30f},
      {"2^100 (subnormal quotients)", 0x1p100f},
      {"3*2^-120 (huge quotients)", 3.0f * 0x1p-120f},
  };
  if (quick) scales.resize(6);
  if (all_x_scales >= 0 && static_cast<std::size_t>(all_x_scales) < scales.size())
    scales.resize(static_cast<std::size_t>(all_x_scales));
  for (const auto& [name, s] : scales) {
    const double t0 = now();
    const DivStats st = sweep(s, 0, std::uint64_t{1} << 32);
    char what[96];
    std::snprintf(what, sizeof what, "all x / %s", name.c_str());
    ok = report(what, st, now() - t0, true) && ok;
  }

  // 2. random scales, every x significand of one binade, both signs (covers every x in the domain)
  {
    std::mt19937 rng(12345);  // 32-bit outputs
    DivStats all;
    const double t0 = now();
    for (int k = 0; k < random_scales; ++k) {
      const auto exp = static_cast<std::uint32_t>(1 + rng() % 252);  // biased exponent 1..252: [2^-126, 2^126)
      const float s = from_bits((exp << 23) | static_cast<std::uint32_t>(rng() & 0x7FFFFFu));
      all.add(sweep(s, 0x3F800000u, 0x40000000u));
      all.add(sweep(s, 0xBF800000u, 0xC0000000u));
    }
    char what[96];
    std::snprintf(what, sizeof what, "%d random scales, x in +-[1,2)", random_scales);
    ok = report(what, all, now() - t0, true) && ok;
  }

  // 3. every scale significand in [1, 2) against random x significands (both signs, a few binades)
  if (every_scale_x > 0) {
    std::mt19937 rng(777);
    std::vector<float> xs(static_cast<std::size_t>((every_scale_x + 63) / 64 * 64));
    for (auto& x : xs)
      x = from_bits(
          static_cast<std::uint32_t>(((rng() & 1u) << 31) | ((120u + rng() % 16u) << 23) | (rng() & 0x7FFFFFu)));
    const std::uint32_t first = 0x3F800000u, count = 1u << 23, piece = 1u << 14;
    std::vector<DivStats> part(count / piece);
    const double t0 = now();
#pragma omp parallel for schedule(dynamic, 8)
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(part.size()); ++p)
      part[static_cast<std::size_t>(p)] = HWY_DYNAMIC_DISPATCH(xquant::detail::CheckScales)(
          first + static_cast<std::uint32_t>(p) * piece, piece, xs.data(), static_cast<std::uint32_t>(xs.size()));
    DivStats all;
    for (const auto& s : part) all.add(s);
    char what[96];
    std::snprintf(what, sizeof what, "every scale in [1,2) x %zu x", xs.size());
    ok = report(what, all, now() - t0, false) && ok;
  }
  // 4. every integer 1 .. 2^B against every scale significand: the one-step sequence must be exact
  if (integer_bits > 0) {
    std::vector<float> qs;
    for (std::uint32_t q = 1; q <= (1u << integer_bits); ++q) qs.push_back(static_cast<float>(q));
    while (qs.size() % 64) qs.push_back(1.0f);
    const std::uint32_t first = 0x3F800000u, count = 1u << 23, piece = 1u << 10;
    std::vector<DivStats> part(count / piece);
    const double t0 = now();
#pragma omp parallel for schedule(dynamic, 8)
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(part.size()); ++p)
      part[static_cast<std::size_t>(p)] = HWY_DYNAMIC_DISPATCH(xquant::detail::CheckScales)(
          first + static_cast<std::uint32_t>(p) * piece, piece, qs.data(), static_cast<std::uint32_t>(qs.size()));
    DivStats all;
    for (const auto& s : part) all.add(s);
    char what[96];
    std::snprintf(what, sizeof what, "integers 1..2^%d x every scale", integer_bits);
    ok = report(what, all, now() - t0, false) && ok;
    if (all.bad_one != 0) {
      std::printf("    the one-step sequence is NOT exact for integers up to 2^%d\n", integer_bits);
      ok = false;
    }
  }
  std::printf("%s\n", ok ? "PASS: the fast path equals the divider on every lane checked"
                         : "FAIL: the fast path differs from the divider");
  return ok ? 0 : 1;
}
#endif  // HWY_ONCE
