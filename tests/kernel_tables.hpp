// Every backend's kernel table has a kernel for every family: operators call the table's entries without
// a null check (the old per-call check, require_kernel, was removed as dead code). Shared by the CPU
// tests (test_runtime.cpp) and the CUDA tests (test_cuda_equivalence.cpp, which needs no GPU for it).
#pragma once
#include <gtest/gtest.h>

#include "core/kernels.hpp"

namespace xqtest {

inline void expect_complete_table(const xquant::detail::KernelTable& t) {
  SCOPED_TRACE(t.name);
  EXPECT_NE(t.fake_quant, nullptr);
  EXPECT_NE(t.fake_quant_backward, nullptr);
  EXPECT_NE(t.quantize, nullptr);
  EXPECT_NE(t.tile_quant, nullptr);
  EXPECT_NE(t.dynamic_quant, nullptr);
  EXPECT_NE(t.acts_ulq, nullptr);
  EXPECT_NE(t.acts_ulq_backward, nullptr);
  EXPECT_NE(t.anti_quant, nullptr);
  EXPECT_NE(t.quant_matmul, nullptr);
  EXPECT_NE(t.weight_quant_matmul, nullptr);
}

}  // namespace xqtest
