// libFuzzer harness for the xquant command-line tool's safetensors reader and front end (issue 11).
//
// Each input is taken as a whole .safetensors file. The harness parses its header (parse_header), reads
// the xquant metadata, decides and plans every tensor, then writes the input to a temporary file and
// runs the three commands on it as the binary would: inspect (table and JSON), dequantize, and, for a
// small file, quantize (int8 per-channel and int4 asymmetric) followed by dequantize of the result.
// Errors (CliError, xquant::Error) are expected and ignored; a crash, a sanitizer report, a leak or a
// hang is a bug. Every crash found becomes a regression test in tools/tests/.
//
// Build by hand (the fuzz/CMakeLists.txt target `fuzz_safetensors` does the same):
//
//   export CMAKE_CXX_COMPILER_LAUNCHER=ccache
//   cmake -S . -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
//     -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" -DXQUANT_BUILD_TESTS=OFF \
//     -DXQUANT_BUILD_BENCH=OFF -DXQUANT_BUILD_EXAMPLES=OFF
//   cmake --build build/fuzz --target xquant_cli_core -j2
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fopenmp -Itools/src -Iinclude \
//     fuzz/fuzz_safetensors.cpp build/fuzz/tools/libxquant_cli_core.a build/fuzz/libxquant.a \
//     -o build/fuzz/fuzz_safetensors        # add the library's own dependencies if it has any (-lhwy)
//
// Run (the seed corpus is made by fuzz/make_safetensors_corpus.py; new inputs go to the first folder):
//
//   mkdir -p build/fuzz/corpus && build/fuzz/fuzz_safetensors build/fuzz/corpus fuzz/corpus/safetensors \
//     -max_len=65536 -timeout=10 -rss_limit_mb=2048 -max_total_time=300
//
// Reproduce a crash: build/fuzz/fuzz_safetensors crash-<sha1>.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "errors.hpp"
#include "jobs.hpp"
#include "plan.hpp"
#include "safetensors.hpp"
#include "xquant/error.hpp"

namespace {

// A private folder for the temporary input and outputs, removed at exit.
struct Workdir {
  std::string path;
  std::FILE* devnull = nullptr;
  Workdir() {
    char tmpl[] = "/tmp/xquant-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    path = tmpl;
    devnull = std::fopen("/dev/null", "w");
    if (!devnull) std::abort();
  }
  ~Workdir() {
    for (const char* f : {"/in.safetensors", "/q.safetensors", "/d.safetensors", "/dq.safetensors", "/r.json"})
      ::unlink((path + f).c_str());
    ::rmdir(path.c_str());
    std::fclose(devnull);
  }
};

Workdir& work() {
  static Workdir w;
  return w;
}

template <class F>
bool attempt(F&& f) {
  try {
    f();
    return true;
  } catch (const xqcli::CliError&) {
  } catch (const xquant::Error&) {
  } catch (const std::bad_alloc&) {
  }
  return false;
}

// The pure parts on the buffer itself: parse, metadata, decisions, pieces.
void pure_paths(const std::byte* data, std::size_t size) {
  xqcli::Header h;
  if (!attempt([&] { h = xqcli::parse_header(data, size); })) return;
  attempt([&] { (void)xqcli::parse_quant_metadata(h.metadata); });
  const xqcli::Filters filters;
  for (int bits : {8, 4}) {
    xqcli::QuantScheme scheme;
    scheme.bits = bits;
    scheme.axis = bits == 4 ? -1 : 0;
    for (const auto& t : h.tensors) {
      (void)h.find(t.name);
      (void)xqcli::utf8_safe(xqcli::clip(t.name));
      const xqcli::Decision d = xqcli::decide(t, scheme, filters);
      if (!d.quantize) continue;
      std::int64_t covered = 0;
      for (const auto& p : xqcli::plan_pieces(t.shape, d.channel_dim, 1 << 12, bits == 4 ? 8 : 1)) covered += p.count;
      if (covered != t.numel) std::abort();  // the pieces must cover the tensor exactly
      (void)xqcli::normal_form(t.shape, d.channel_dim);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  pure_paths(bytes, size);

  Workdir& w = work();
  const std::string in = w.path + "/in.safetensors";
  {
    std::FILE* f = std::fopen(in.c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
  }
  xqcli::configure_threads(1);
  attempt([&] { xqcli::run_inspect({in, false}, w.devnull); });
  attempt([&] { xqcli::run_inspect({in, true}, w.devnull); });

  xqcli::DequantizeOptions d;
  d.input = in;
  d.output = w.path + "/d.safetensors";
  d.force = true;
  d.quiet = true;
  d.threads = 1;
  attempt([&] { xqcli::run_dequantize(d); });

  if (size <= (std::size_t{1} << 20)) {
    for (int variant = 0; variant < 2; ++variant) {
      xqcli::QuantizeOptions q;
      q.input = in;
      q.output = w.path + "/q.safetensors";
      q.report_path = w.path + "/r.json";
      q.force = true;
      q.quiet = true;
      q.threads = 1;
      if (variant == 1) {
        q.scheme.bits = 4;
        q.scheme.axis = -1;
        q.scheme.symmetric = false;
      }
      if (attempt([&] { (void)xqcli::run_quantize(q); })) {
        xqcli::DequantizeOptions back = d;
        back.input = q.output;
        back.output = w.path + "/dq.safetensors";
        // A file that quantize wrote must read back.
        if (!attempt([&] { xqcli::run_dequantize(back); })) std::abort();
      }
    }
  }
  return 0;
}
