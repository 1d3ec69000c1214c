// The three subcommands. Each throws CliError (exit 1 or 2) on failure, after which no output file
// exists (the atomic writer removes its temporary file).
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "passes.hpp"
#include "plan.hpp"
#include "safetensors.hpp"

namespace xqcli {

struct QuantizeOptions {
  std::string input;
  std::string output;
  std::string report_path;  // empty: no JSON report
  QuantScheme scheme;
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  bool strict = false;  // a tensor that the options cannot quantize is an error, not a warning
  bool force = false;
  bool quiet = false;
  int threads = 0;  // 0: OpenMP's default; at most kMaxThreads
};

struct TensorResult {
  std::string name;
  StDType dtype = StDType::F32;
  Dims shape;
  bool quantized = false;
  std::string reason;  // why kept
  bool warned = false;
  std::int64_t channel_dim = -1;
  std::int64_t channels = 1;
  StDType stored_dtype = StDType::F32;
  Dims stored_shape;
  ErrorStats error;
  std::uint64_t bytes_in = 0;   // the tensor's bytes in the input
  std::uint64_t bytes_out = 0;  // its bytes in the output (with scales and zero points)
};

struct QuantizeResult {
  std::vector<TensorResult> tensors;  // in input data order
  std::uint64_t file_bytes_in = 0;
  std::uint64_t file_bytes_out = 0;
  double seconds = 0.0;
  ErrorStats total;  // over every quantized tensor
};

QuantizeResult run_quantize(const QuantizeOptions& o);
void print_report(std::FILE* out, const QuantizeOptions& o, const QuantizeResult& r);
// The part of the printed report after its heading lines, shared with the compressed-tensors export:
// the table of quantized tensors (their stored type named `stored`, or each one's stored_dtype when
// null), the kept ones under `kept_heading` grouped by reason, the totals, the sizes (`size_what`
// after them) and the time.
void print_summary(std::FILE* out, const QuantizeResult& r, const char* stored, const char* kept_heading,
                   const char* size_what);
std::string report_json(const QuantizeOptions& o, const QuantizeResult& r);

struct DequantizeOptions {
  std::string input;
  std::string output;
  std::optional<StDType> dtype;  // nullopt: each tensor's original dtype
  bool force = false;
  bool quiet = false;
  int threads = 0;
};
void run_dequantize(const DequantizeOptions& o);

struct InspectOptions {
  std::string path;
  bool json = false;
};
void run_inspect(const InspectOptions& o, std::FILE* out);

// The most worker threads --threads takes (the library's cap too); OpenMP's default (--threads 0,
// OMP_NUM_THREADS) is lowered to it.
inline constexpr int kMaxThreads = 1024;

// Lowers each number of OMP_NUM_THREADS above kMaxThreads to kMaxThreads. Call before the first
// OpenMP call: LLVM's libomp reads the variable when it starts and fails an internal assertion on a
// huge value (libgomp copes, and omp_set_num_threads() overrides it later).
void cap_openmp_environment();

// Refuses (exit 1) a thread count outside [0, kMaxThreads], naming `option`.
void check_threads(int threads, const char* option = "--threads");

// Applies --threads (0 keeps OpenMP's default, capped at kMaxThreads) and forbids nested parallel
// regions, so a parallel kernel called from the tool's own parallel loop runs on its calling thread.
void configure_threads(int threads);

}  // namespace xqcli
