// libFuzzer harness for the model-directory reader of the xquant command-line tool (issue 17): arbitrary
// bytes as config.json or as model.safetensors.index.json of a small, otherwise valid model directory.
//
// The first byte chooses the role of the rest (byte % 3):
//   0: config.json of a plain model (model.safetensors, one Linear weight and a norm): inspect (table and
//      JSON), quantize to compressed-tensors W4A16 (and, when the config already has a
//      quantization_config, dequantize);
//   1: model.safetensors.index.json of a model with two shards (tensors "a.weight", "b.weight"): inspect,
//      quantize;
//   2: config.json of a quantized model (its weights made by quantize from mode 0): inspect, dequantize
//      (the quantization_config reader: mistyped, fractional and huge fields).
// Every time: the JSON reader itself (json::parse) and, for text it accepts, dump() -> parse() -> dump()
// must give the same text (the config.json written into outputs is read back by the same rules).
// Errors (CliError, xquant::Error) are expected and ignored; a crash, a sanitizer report, a leak or a
// hang is a bug. Every crash found becomes a regression test in tools/tests/.
//
// Build and run with scripts/fuzz (preset `fuzz`, target `fuzz_model_dir`, seeds fuzz/corpus/model_dir/
// written by fuzz/make_model_dir_corpus.py); reproduce a crash: build/fuzz/fuzz/fuzz_model_dir crash-<sha1>.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "compressed_tensors.hpp"
#include "errors.hpp"
#include "jobs.hpp"
#include "json.hpp"
#include "model_dir.hpp"
#include "safetensors.hpp"
#include "xquant/error.hpp"

namespace {

namespace fs = std::filesystem;

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

void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// A safetensors file of F32 tensors {name: [rows, cols]} with deterministic values.
std::string safetensors_file(const std::vector<std::pair<std::string, xqcli::Dims>>& tensors) {
  std::vector<xqcli::OutTensor> ts;
  for (const auto& [name, shape] : tensors) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    ts.push_back({name, xqcli::StDType::F32, shape, n * 4, 0});
  }
  const std::uint64_t data = xqcli::layout_tensors(ts);
  std::string out = xqcli::build_header(ts, {{"format", "pt"}});
  for (std::uint64_t i = 0; i < data / 4; ++i) {
    const float v = static_cast<float>(static_cast<int>(i % 29) - 14) / 16.0f;
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  return out;
}

// Private folders for the model directories and outputs (on tmpfs when there is one: fsync is cheap).
struct Workdir {
  std::string path;
  std::FILE* devnull = nullptr;
  Workdir() {
    std::string tmpl = fs::is_directory("/dev/shm") ? "/dev/shm/xquant-fuzz-dir-XXXXXX" : "/tmp/xquant-fuzz-dir-XXXXXX";
    if (!::mkdtemp(tmpl.data())) std::abort();
    path = tmpl;
    devnull = std::fopen("/dev/null", "w");
    if (!devnull) std::abort();
    xqcli::configure_threads(1);
    const std::string plain =
        safetensors_file({{"model.layers.0.mlp.up_proj.weight", {8, 16}}, {"model.norm.weight", {16}}});
    for (const char* d : {"/plain", "/sharded", "/quantized"}) fs::create_directory(path + d);
    write_file(path + "/plain/model.safetensors", plain);
    write_file(path + "/plain/config.json", R"({"model_type": "llama", "torch_dtype": "float32"})");
    write_file(path + "/sharded/config.json", R"({"model_type": "llama"})");
    write_file(path + "/sharded/model-00001-of-00002.safetensors", safetensors_file({{"a.weight", {8, 16}}}));
    write_file(path + "/sharded/model-00002-of-00002.safetensors", safetensors_file({{"b.weight", {4, 8}}}));
    // The quantized model: quantize the plain one once (group size 8) and keep its weights.
    xqcli::QuantizeOptions q;
    q.input = path + "/plain";
    q.output = path + "/q0";
    q.quiet = true;
    q.threads = 1;
    xqcli::ExportOptions e;
    e.group_size = 8;
    xqcli::run_export(q, e);
    fs::copy_file(path + "/q0/model.safetensors", path + "/quantized/model.safetensors");
    fs::remove_all(path + "/q0");
  }
  ~Workdir() {
    std::error_code ec;
    fs::remove_all(path, ec);
    std::fclose(devnull);
  }
};

Workdir& work() {
  static Workdir w;
  return w;
}

void check_round_trip(std::string_view text) {
  xqcli::json::Value v;
  if (!attempt([&] { v = xqcli::json::parse(text, "input"); })) return;
  for (int indent : {-1, 2}) {
    const std::string once = v.dump(indent);
    xqcli::json::Value again;
    if (!attempt([&] { again = xqcli::json::parse(once, "dump"); })) std::abort();  // we wrote what we refuse
    if (again.dump(indent) != once) std::abort();
  }
  (void)v.to_nlohmann().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  check_round_trip(text);

  Workdir& w = work();
  const std::string dir = w.path + (mode == 0 ? "/plain" : mode == 1 ? "/sharded" : "/quantized");
  write_file(dir + (mode == 1 ? "/model.safetensors.index.json" : "/config.json"), text);
  const std::string out = w.path + "/out";

  attempt([&] { xqcli::run_inspect_dir({dir, false}, w.devnull); });
  attempt([&] { xqcli::run_inspect_dir({dir, true}, w.devnull); });
  if (mode != 2) {
    xqcli::QuantizeOptions q;
    q.input = dir;
    q.output = out;
    q.quiet = true;
    q.force = true;
    q.threads = 1;
    xqcli::ExportOptions e;
    e.group_size = 8;
    attempt([&] { xqcli::run_export(q, e); });
  }
  xqcli::DequantizeOptions d;
  d.input = dir;
  d.output = w.path + "/deq";
  d.force = true;
  d.quiet = true;
  d.threads = 1;
  attempt([&] { xqcli::run_dequantize_dir(d); });
  std::error_code ec;
  fs::remove_all(out, ec);
  fs::remove_all(d.output, ec);
  return 0;
}
