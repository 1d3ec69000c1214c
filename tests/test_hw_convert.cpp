// The hardware 16-bit conversions of src/cpu/simd-inl.h against the integer code they replace, on every
// compiled and supported SIMD target that uses them, for every input:
//  - F16C (x86 AVX2 / AVX-512, kHwHalf): StoreF<float16> against FloatToHalfBits and RoundToHalf against
//    RoundToHalfInt for all 2^32 float32 bit patterns; LoadF<float16> against HalfBitsToFloat for all 2^16
//    float16 ones (signaling NaNs included: vcvtph2ps would quiet them, LoadF must not);
//  - AVX512_BF16 (AVX-512 targets, when this CPU has it): StoreBf16Hw for all 2^32 float32 bit patterns,
//    16 per vector: it must store FloatToBf16Bits' bits when no lane is NaN or subnormal, and decline
//    (store nothing) when one is.
// The integer code itself is checked against the scalar reference (core/convert.hpp) by the equivalence
// tests. Sanitizer builds check every 61st block of the float32 sweep (the full sweep runs in the release
// suite) and say so.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test_hw_convert.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu.hpp"
#include "cpu/simd-inl.h"
#include "hwy/highway.h"

#ifndef XQUANT_TEST_HW_CONVERT_ONCE
#define XQUANT_TEST_HW_CONVERT_ONCE
struct ConvertCounts {
  std::uint64_t vectors = 0;
  std::uint64_t half_store = 0;  // lanes where StoreF<float16> differs from FloatToHalfBits
  std::uint64_t half_round = 0;  // lanes where RoundToHalf differs from RoundToHalfInt (NaN: the stored half)
  std::uint64_t bf16 = 0;        // lanes StoreBf16Hw stored wrong, or vectors it accepted / declined wrongly
  std::uint64_t bf16_stored = 0;  // vectors StoreBf16Hw converted
  std::uint32_t first_bad = 0;
  bool any_bad = false;
  void add(const ConvertCounts& o) {
    if (!any_bad && o.any_bad) first_bad = o.first_bad;
    any_bad = any_bad || o.any_bad;
    vectors += o.vectors;
    half_store += o.half_store;
    half_round += o.half_round;
    bf16 += o.bf16;
    bf16_stored += o.bf16_stored;
  }
};
#endif

HWY_BEFORE_NAMESPACE();
namespace xquant::detail::HWY_NAMESPACE {

bool UsesHwHalf() { return kHwHalf; }
bool UsesHwBf16() {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return hw_bf16_wanted();
#else
  return false;
#endif
}

// Float32 bit patterns [first, first + count): every stride-th vector of N lanes (count a multiple of
// N * stride).
ConvertCounts CheckFloats(std::uint64_t first, std::uint64_t count, std::uint64_t stride) {
  const DF df;
  const DU du;
  const std::uint64_t N = hn::Lanes(df);
  const std::uint64_t blocks = count / (N * stride);
  ConvertCounts c;
  HWY_ALIGN std::uint16_t got[kMaxLanes], want[kMaxLanes];
  auto note = [&](std::uint32_t bits) {
    if (!c.any_bad) c.first_bad = bits;
    c.any_bad = true;
  };
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const auto start = static_cast<std::uint32_t>(first + b * N * stride);
    const VF v = hn::BitCast(df, hn::Iota(du, start));
    ++c.vectors;
    if constexpr (kHwHalf) {
      StoreF<DType::float16>(v, got, 0);
      hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), FloatToHalfBits(v))), DU16(), want);
      for (std::uint64_t k = 0; k < N; ++k)
        if (got[k] != want[k]) {
          ++c.half_store;
          note(start + static_cast<std::uint32_t>(k));
        }
      const VF hw = RoundToHalf(v), in = RoundToHalfInt(v);
      const auto nan = hn::IsNaN(in);
      const auto same_bits = hn::RebindMask(df, hn::Eq(hn::BitCast(du, hw), hn::BitCast(du, in)));
      // NaN lanes: both NaN, and the same float16 once stored
      const auto same_half =
          hn::RebindMask(df, hn::Eq(FloatToHalfBits(hw), FloatToHalfBits(in)));
      // bad: a NaN lane without a NaN of the same float16, or another lane with other bits
      const auto bad = hn::Or(hn::AndNot(hn::And(hn::IsNaN(hw), same_half), nan), hn::AndNot(nan, hn::Not(same_bits)));
      if (!hn::AllFalse(df, bad)) {
        c.half_round += hn::CountTrue(df, bad);
        note(start);
      }
    }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if (hw_bf16_wanted()) {
      std::memset(got, 0xAB, sizeof(got));
      const bool stored = StoreBf16Hw</*kStream=*/false>(v, got);
      HWY_ALIGN std::uint32_t lanes[kMaxLanes];
      hn::StoreU(hn::BitCast(du, v), du, lanes);
      bool special = false;
      for (std::uint64_t k = 0; k < N; ++k) {
        const std::uint32_t a = lanes[k] & 0x7FFFFFFFu;
        special = special || a > 0x7F800000u || (a != 0 && a < 0x00800000u);
      }
      if (stored == special) {  // accepted a NaN / subnormal lane, or declined a vector without one
        ++c.bf16;
        note(start);
      }
      if (stored) {
        ++c.bf16_stored;
        hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), FloatToBf16Bits(v))), DU16(), want);
        for (std::uint64_t k = 0; k < N; ++k)
          if (got[k] != want[k]) {
            ++c.bf16;
            note(start + static_cast<std::uint32_t>(k));
          }
      } else {
        for (std::uint64_t k = 0; k < N; ++k)
          if (got[k] != 0xABABu) {  // declined: nothing stored
            ++c.bf16;
            note(start);
          }
      }
    }
#endif
  }
  return c;
}

// All 2^16 float16 bit patterns: LoadF<float16> against HalfBitsToFloat, bit for bit. Returns the lanes
// that differ.
std::uint64_t CheckHalfLoads() {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  std::vector<std::uint16_t> h(std::size_t{1} << 16);
  for (std::uint32_t i = 0; i < (1u << 16); ++i) h[i] = static_cast<std::uint16_t>(i);
  std::uint64_t bad = 0;
  for (std::size_t i = 0; i < (std::size_t{1} << 16); i += N) {
    const VF hw = LoadF<DType::float16>(h.data(), static_cast<std::int64_t>(i));
    const VF in = HalfBitsToFloat(hn::PromoteTo(du, hn::LoadU(DU16(), h.data() + i)));
    bad += hn::CountTrue(du, hn::Ne(hn::BitCast(du, hw), hn::BitCast(du, in)));
  }
  return bad;
}

}  // namespace xquant::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace xquant::detail {
HWY_EXPORT(UsesHwHalf);
HWY_EXPORT(UsesHwBf16);
HWY_EXPORT(CheckFloats);
HWY_EXPORT(CheckHalfLoads);
}  // namespace xquant::detail

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr std::uint64_t kStride = 61;
#else
constexpr std::uint64_t kStride = 1;
#endif

TEST(HwConvert, EveryInputOnEveryTarget) {
  namespace xd = xquant::detail;
  if (kStride > 1)
    std::printf("note: sanitizer build, every %llu-th block of the float32 sweep (the release suite runs all)\n",
                static_cast<unsigned long long>(kStride));
  int checked = 0;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const bool half = HWY_DYNAMIC_DISPATCH(xd::UsesHwHalf)(), bf16 = HWY_DYNAMIC_DISPATCH(xd::UsesHwBf16)();
    const std::string name = hwy::TargetName(target);
    if (!half && !bf16) {
      std::printf("note: %s converts 16-bit values in integer code only: nothing to compare\n", name.c_str());
      continue;
    }
    ++checked;
    if (half) {
      EXPECT_EQ(HWY_DYNAMIC_DISPATCH(xd::CheckHalfLoads)(), 0u) << "LoadF<float16> on " << name;
    }
    // 2^32 lanes in tasks of 2^24, split over the threads
    const std::uint64_t chunk = std::uint64_t{1} << 24;
    const std::int64_t tasks = static_cast<std::int64_t>((std::uint64_t{1} << 32) / chunk);
    ConvertCounts total;
#pragma omp parallel
    {
      hwy::SetSupportedTargetsForTest(target);
      ConvertCounts mine;
#pragma omp for schedule(dynamic)
      for (std::int64_t t = 0; t < tasks; ++t)
        mine.add(HWY_DYNAMIC_DISPATCH(xd::CheckFloats)(static_cast<std::uint64_t>(t) * chunk, chunk, kStride));
#pragma omp critical
      total.add(mine);
    }
    hwy::SetSupportedTargetsForTest(target);
    EXPECT_EQ(total.half_store, 0u) << "StoreF<float16> on " << name << ", first at float bits 0x" << std::hex
                                    << total.first_bad;
    EXPECT_EQ(total.half_round, 0u) << "RoundToHalf on " << name << ", first near float bits 0x" << std::hex
                                    << total.first_bad;
    EXPECT_EQ(total.bf16, 0u) << "StoreBf16Hw on " << name << ", first near float bits 0x" << std::hex
                              << total.first_bad;
    if (bf16) {
      EXPECT_GT(total.bf16_stored, 0u) << name << ": StoreBf16Hw never converted";
    }
    std::printf("%s: %llu vectors checked; F16C %s, AVX512_BF16 %s (%llu vectors converted)\n", name.c_str(),
                static_cast<unsigned long long>(total.vectors), half ? "yes" : "no", bf16 ? "yes" : "no",
                static_cast<unsigned long long>(total.bf16_stored));
  }
  hwy::SetSupportedTargetsForTest(0);
  if (checked == 0) std::printf("note: no target here uses a hardware 16-bit conversion: nothing checked\n");
}

}  // namespace
#endif  // HWY_ONCE
