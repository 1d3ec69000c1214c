// Runtime settings: threads, backend, the SIMD target name and the large-allocation cache.
#include <cstring>

#include "backends/registry.hpp"
#include "test_util.hpp"
#include "xquant/runtime.hpp"

namespace {
using namespace xqtest;

TEST(Runtime, ThreadsAndBackend) {
  xquant::set_num_threads(3);
  EXPECT_EQ(xquant::get_num_threads(), 3);
  xquant::set_num_threads(0);
  EXPECT_GE(xquant::get_num_threads(), 1);
  expect_error([] { xquant::set_num_threads(-1); }, xquant::ErrorCode::invalid_argument, "n", {"-1"});
  xquant::set_backend(xquant::Backend::reference);
  EXPECT_EQ(xquant::get_backend(), xquant::Backend::reference);
  xquant::set_backend(xquant::Backend::cpu);
  EXPECT_EQ(xquant::get_backend(), xquant::Backend::cpu);
  EXPECT_FALSE(xquant::simd_target().empty());
}

// Regression: set_num_threads accepted any positive count (e.g. 1'000'000 OpenMP threads).
TEST(Runtime, ThreadCountIsCapped) {
  static_assert(xquant::kMaxThreads == 1024);
  xquant::set_num_threads(3);
  expect_error([] { xquant::set_num_threads(xquant::kMaxThreads + 1); }, xquant::ErrorCode::invalid_argument, "n",
               {"1025", "1024", "kMaxThreads"});
  expect_error([] { xquant::set_num_threads(1000000); }, xquant::ErrorCode::invalid_argument, "n", {"1000000"});
  EXPECT_EQ(xquant::get_num_threads(), 3) << "a rejected count leaves the setting unchanged";
  xquant::set_num_threads(xquant::kMaxThreads);  // the limit itself is accepted
  EXPECT_EQ(xquant::get_num_threads(), xquant::kMaxThreads);
  xquant::set_num_threads(0);
  EXPECT_GE(xquant::get_num_threads(), 1);
}

// The backend registry: every Backend has a complete kernel table, and active_kernels() follows set_backend.
TEST(Runtime, RegistryHasEveryBackendComplete) {
  namespace d = xquant::detail;
  const std::pair<xquant::Backend, const char*> backends[] = {{xquant::Backend::cpu, "cpu"},
                                                              {xquant::Backend::reference, "reference"}};
  const xquant::Backend saved = xquant::get_backend();
  for (const auto& [b, name] : backends) {
    const d::KernelTable* t = d::find_kernels(b);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_STREQ(t->name, name);
    EXPECT_TRUE(t->fake_quant && t->fake_quant_backward && t->quantize && t->tile_quant && t->dynamic_quant &&
                t->acts_ulq && t->acts_ulq_backward && t->anti_quant)
        << name << ": a kernel entry is missing";
    xquant::set_backend(b);
    EXPECT_EQ(&d::active_kernels(), t) << name;
  }
  EXPECT_EQ(&d::reference_kernels(), d::find_kernels(xquant::Backend::reference));
  xquant::set_backend(saved);
}

TEST(Runtime, LargeAllocationsAreReusedAndZerosStillZero) {
  const std::size_t saved = xquant::get_memory_cache_limit();
  xquant::set_memory_cache_limit(std::size_t{64} << 20);
  void* first = nullptr;
  {
    Tensor a(DType::float32, {1 << 20});  // 4 MiB: huge-page backed
    first = a.data();
    std::memset(a.data(), 0x7F, a.nbytes());
  }
  {
    Tensor b(DType::float32, {1 << 20});
    EXPECT_EQ(b.data(), first) << "a freed mapping of the same size is handed out again";
    std::memset(b.data(), 0x7F, b.nbytes());
  }
  Tensor z = Tensor::zeros(DType::float32, {1 << 20});
  EXPECT_EQ(z.data(), first);
  for (std::int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<std::uint32_t>()[i], 0u) << i;
  // Limit 0: nothing is kept (the freed mapping is unmapped), so nothing can be handed out again.
  xquant::set_memory_cache_limit(0);
  EXPECT_EQ(xquant::get_memory_cache_limit(), 0u);
  xquant::set_memory_cache_limit(saved);
}

// Every backend's kernel table has a kernel for every family: operators call the table's entries without
// a null check (the old per-call check, require_kernel, was removed as dead code).
void expect_complete(const xquant::detail::KernelTable& t) {
  SCOPED_TRACE(t.name);
  EXPECT_NE(t.fake_quant, nullptr);
  EXPECT_NE(t.fake_quant_backward, nullptr);
  EXPECT_NE(t.quantize, nullptr);
  EXPECT_NE(t.tile_quant, nullptr);
  EXPECT_NE(t.dynamic_quant, nullptr);
  EXPECT_NE(t.acts_ulq, nullptr);
  EXPECT_NE(t.acts_ulq_backward, nullptr);
  EXPECT_NE(t.anti_quant, nullptr);
}

TEST(Runtime, EveryKernelTableIsComplete) {
  expect_complete(xquant::detail::reference_kernels());
  for (xquant::Backend b : {xquant::Backend::cpu, xquant::Backend::reference}) {
    const xquant::detail::KernelTable* t = xquant::detail::find_kernels(b);
    if (t != nullptr) expect_complete(*t);  // cpu is absent when built with XQUANT_CPU_SIMD=OFF
  }
  // The CUDA table: tests/test_cuda_equivalence.cpp (CudaTable.Complete, CUDA builds only).
}

}  // namespace
