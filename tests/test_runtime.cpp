// Runtime settings: threads, backend, the SIMD target name and the large-allocation cache.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "backends/registry.hpp"
#include "kernel_tables.hpp"
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

// The child's wait status, or -1 when it has not ended within `seconds` (it is then killed).
int wait_for_child(pid_t pid, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (done == pid) return status;
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// Every operator family on inputs large enough to split across threads (>= 2 MiB of traffic), each
// result as its bytes. 2^20 float32 elements per input.
std::vector<std::vector<unsigned char>> run_parallel_operators() {
  constexpr std::int64_t kRows = 1024, kCols = 1024;
  Tensor x(DType::float32, {kRows, kCols});
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = static_cast<float>((i * 7919) % 2001 - 1000) / 97.0f;
  Tensor amax = make_float(DType::float32, {1}, {8.0f});
  std::vector<float> cols(kCols);
  for (std::int64_t c = 0; c < kCols; ++c) cols[static_cast<std::size_t>(c)] = 1.0f + static_cast<float>(c % 13);
  Tensor amax_axis = make_float(DType::float32, {kCols}, cols);
  Tensor scales = make_float(DType::float32, {kCols}, cols);
  Tensor clamp_min = make_float(DType::float32, {1}, {-4.0f}), clamp_max = make_float(DType::float32, {1}, {5.0f});

  std::vector<Tensor> out;
  out.push_back(xquant::fake_tensor_quant(x, amax));
  xquant::FakeQuantGrads g = xquant::fake_tensor_quant_backward(x, x, amax_axis, 1);  // per-axis sums
  out.push_back(std::move(g.grad_inputs));
  out.push_back(std::move(g.grad_amax));
  xquant::DynamicQuantResult d = xquant::dynamic_quant_asymmetric(x);
  out.push_back(std::move(d.y));
  out.push_back(std::move(d.scale));
  out.push_back(std::move(d.offset));
  out.push_back(xquant::quantize(x, scales, std::nullopt, xquant::QuantDType::qint8, 1));
  xquant::ActsUlqResult u = xquant::acts_ulq(x, clamp_min, clamp_max);
  xquant::ActsUlqGrads ug = xquant::acts_ulq_backward(x, x.shape(), clamp_min, clamp_max, u.clamp_min_mask,
                                                      u.clamp_max_mask, u.x_clamped_loss);
  out.push_back(std::move(u.y));
  out.push_back(std::move(ug.x_grad));
  out.push_back(std::move(ug.clamp_min_grad));
  out.push_back(std::move(ug.clamp_max_grad));
  std::vector<std::vector<unsigned char>> bytes;
  for (const Tensor& t : out) {
    const auto* p = static_cast<const unsigned char*>(t.data());
    bytes.emplace_back(p, p + t.nbytes());
  }
  return bytes;
}

// Regression (issue #17): after one parallel operator, a fork()ed child that called an operator hung in
// libgomp, whose thread pool does not exist in the child. The child now runs every operator on its
// calling thread, with the parent's results bit for bit.
TEST(Runtime, ForkedChildRunsOperatorsAfterParallelOne) {
  xquant::set_num_threads(2);  // two threads even on a one-core machine: the parent starts an OpenMP team
  const std::vector<std::vector<unsigned char>> want = run_parallel_operators();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed: " << std::strerror(errno);
  if (pid == 0) {
    // The child: no gtest assertions here (they would land in the child's copy of the test state); the
    // exit status says what happened. _exit skips the parent's atexit handlers and gtest's teardown.
    int status = 0;
    try {
      if (run_parallel_operators() != want)
        status = 2;
      else if (run_parallel_operators() != want)
        status = 4;  // a second round: nothing left half-set-up
      else if (xquant::get_num_threads() != 1)
        status = 3;
    } catch (...) {
      status = 5;
    }
    _exit(status);
  }
  // The parent: a hung child fails the test instead of blocking it.
  const int status = wait_for_child(pid, 120);
  ASSERT_NE(status, -1) << "the forked child did not finish its operators within 120 s (hung in the OpenMP runtime?)";
  ASSERT_TRUE(WIFEXITED(status)) << "the child died from signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2/4: a result differs from the parent's; 3: get_num_threads() != 1 in the "
                                       "child; 5: an operator threw";
  // The parent's own pool is untouched: it still runs in parallel with the same results.
  EXPECT_EQ(xquant::get_num_threads(), 2);
  EXPECT_EQ(run_parallel_operators(), want);
  xquant::set_num_threads(0);
  // Leave the large-allocation cache empty, as the other tests expect to find it.
  const std::size_t limit = xquant::get_memory_cache_limit();
  xquant::set_memory_cache_limit(0);
  xquant::set_memory_cache_limit(limit);
}

// Regression: a fork() while another thread was inside the large-allocation cache (take / give) copied
// its mutex locked into the child, whose first large allocation then waited forever.
TEST(Runtime, ForkWhileAnotherThreadAllocates) {
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) Tensor t(DType::float32, {1 << 20});  // 4 MiB: through the cache, twice per round
  });
  int forks = 0, hung = 0, failed = 0;
  for (; forks < 200 && hung == 0; ++forks) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed: " << std::strerror(errno);
    if (pid == 0) {
      Tensor t(DType::float32, {1 << 20});
      _exit(t.data() != nullptr ? 0 : 1);
    }
    const int status = wait_for_child(pid, 20);
    if (status == -1)
      ++hung;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      ++failed;
  }
  stop.store(true);
  churn.join();
  EXPECT_EQ(hung, 0) << "a child hung on its first large allocation (after " << forks << " forks)";
  EXPECT_EQ(failed, 0);
  const std::size_t limit = xquant::get_memory_cache_limit();  // leave the cache empty for the next test
  xquant::set_memory_cache_limit(0);
  xquant::set_memory_cache_limit(limit);
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

TEST(Runtime, EveryKernelTableIsComplete) {
  xqtest::expect_complete_table(xquant::detail::reference_kernels());
  for (xquant::Backend b : {xquant::Backend::cpu, xquant::Backend::reference}) {
    const xquant::detail::KernelTable* t = xquant::detail::find_kernels(b);
    if (t != nullptr) xqtest::expect_complete_table(*t);  // cpu is absent when built with XQUANT_CPU_SIMD=OFF
  }
  // The CUDA table: tests/test_cuda_equivalence.cpp (CudaTable.Complete, CUDA builds only).
}

}  // namespace
