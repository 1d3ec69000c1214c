// The Highway targets the multi-target tests run: every target this CPU supports and the library compiled,
// less those named in the environment variable XQUANT_TEST_SKIP_TARGETS (target names as hwy::TargetName
// spells them, separated by spaces or commas). scripts/test-aarch64 skips NEON under its SVE
// configurations, since the NEON configuration has just run that target on the same binary, and SVE2 at
// 256 and 512 bits (run at 128; see the script); the test `CpuEquivalence.ReportsTargets` prints what was
// skipped and why.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "hwy/targets.h"

namespace xqtest {

inline bool skipped_by_env(std::int64_t target) {
  const char* env = std::getenv("XQUANT_TEST_SKIP_TARGETS");
  if (env == nullptr) return false;
  const std::string list = env, name = hwy::TargetName(target);
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t end = list.find_first_of(" ,", pos);
    const std::size_t stop = end == std::string::npos ? list.size() : end;
    if (list.compare(pos, stop - pos, name) == 0 && stop > pos) return true;
    pos = stop + 1;
  }
  return false;
}

inline std::vector<std::int64_t> tested_targets() {
  std::vector<std::int64_t> out;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets())
    if (!skipped_by_env(t)) out.push_back(t);
  return out;
}

}  // namespace xqtest
