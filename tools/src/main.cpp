// xquant: quantize safetensors checkpoints to int8 / int4 with the library's npu_quantize, dequantize
// them back, inspect files. See docs/cli.md.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "compressed_tensors.hpp"
#include "errors.hpp"
#include "files.hpp"
#include "jobs.hpp"
#include "model_dir.hpp"
#include "recipe.hpp"
#include "xquant/error.hpp"
#include "xquant/version.hpp"

namespace {

std::optional<xqcli::StDType> parse_out_dtype(const std::string& s) {
  if (s == "original") return std::nullopt;
  if (s == "F32" || s == "float32") return xqcli::StDType::F32;
  if (s == "F16" || s == "float16") return xqcli::StDType::F16;
  return xqcli::StDType::BF16;  // "BF16" / "bfloat16": the option's check admits nothing else
}

int run(int argc, char** argv) {
  CLI::App app{
      "xquant: quantize safetensors checkpoints to int8 / int4 (npu_quantize semantics), dequantize "
      "them, inspect files.\nExit codes: 0 success, 1 usage error or bad input, 2 I/O error, "
      "128 + N stopped by signal N (130: Ctrl-C)."};
  app.name("xquant");
  app.set_version_flag("--version", std::string("xquant ") + xquant::kVersion);
  app.require_subcommand(1);

  // ---- quantize ----
  xqcli::QuantizeOptions q;
  std::string scheme = "per-channel";
  auto* qc = app.add_subcommand("quantize", "Quantize the floating tensors of rank >= 2 of a checkpoint");
  qc->add_option("input", q.input, "Input .safetensors file, or a model directory (compressed-tensors output)")
      ->required();
  qc->add_option("-o,--output", q.output, "Output .safetensors file or model directory (written atomically)")
      ->required();
  qc->add_option("--bits", q.scheme.bits, "8: int8 (qint8); 4: int4 packed eight per int32 (quint4x2)")
      ->check(CLI::IsMember({8, 4}))
      ->default_val(8);
  qc->add_option("--scheme", scheme, "Scales per channel or one per tensor")
      ->check(CLI::IsMember({"per-channel", "per-tensor"}))
      ->default_val("per-channel");
  qc->add_option("--axis", q.scheme.axis, "Channel axis of per-channel scales (negative counts from the end)")
      ->default_val(0);
  bool symmetric = false;
  auto* sym = qc->add_flag("--symmetric", symmetric, "Symmetric: zero point 0, scale = amax / qmax (default)");
  bool asymmetric = false;
  qc->add_flag("--asymmetric", asymmetric, "Asymmetric: min / max range with a float32 zero point")->excludes(sym);
  // One value per occurrence, every occurrence kept (a vector option would otherwise swallow the input path).
  qc->add_option("--include", q.include,
                 "Quantize only tensors whose name matches this POSIX extended regex (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->take_all();
  qc->add_option("--exclude", q.exclude,
                 "Keep tensors whose name matches this POSIX extended regex as they are (repeatable)")
      ->expected(1)
      ->allow_extra_args(false)
      ->take_all();
  qc->add_flag("--strict", q.strict, "Fail (exit 1) on a tensor the options cannot quantize instead of keeping it");
  qc->add_option("--report", q.report_path, "Also write the report as JSON to this file (written atomically)");
  qc->add_option("--threads", q.threads, "Worker threads, at most 1024 (0: all cores)")
      ->check(CLI::Range(0, xqcli::kMaxThreads))
      ->default_val(0);
  qc->add_flag("-f,--force", q.force, "Replace existing output / report files");
  qc->add_flag("-q,--quiet", q.quiet, "No progress bar, warnings or report on the terminal");
  // Model directories and the compressed-tensors format (compressed_tensors.hpp).
  xqcli::ExportOptions ex;
  std::string format, max_shard;
  qc->add_option("--format", format, "compressed-tensors (default for a model directory) or xquant (a single file)")
      ->check(CLI::IsMember({"compressed-tensors", "xquant"}));
  qc->add_option("--preset", ex.preset,
                 "compressed-tensors preset, any case: W4A16 (default), W4A16_ASYM, W8A16, W8A8, FP8_DYNAMIC or "
                 "NVFP4A16");
  qc->add_option("--scale-rule", ex.scale_rule,
                 "compressed-tensors (default: its calculate_qparams in float32) or amax-qmax (xquant's rule before "
                 "issue 19: symmetric amax / qmax)")
      ->check(CLI::IsMember({"compressed-tensors", "amax-qmax"}));
  qc->add_option("--observer", ex.observer,
                 "minmax (default) or mse: search the clipping range of each group that minimises the squared "
                 "error (llm-compressor's MSE observer grid)")
      ->check(CLI::IsMember({"minmax", "mse"}));
  qc->add_flag("--keep-partial-dense", ex.keep_partial_dense,
               "Keep the Linear layers whose input width the group size does not divide dense (default: an error)");
  qc->add_option("--group-size", ex.group_size,
                 "W4A16 / W4A16_ASYM / W8A16: input channels per scale (default 128; 0: per output channel); W8A8 and "
                 "FP8_DYNAMIC are per channel, NVFP4A16 has groups of 16");
  qc->add_option("--ignore", ex.ignore,
                 "Keep these modules dense: a class name (Linear), an exact module name, or re:REGEX (Python "
                 "re.match: from the start of the name); repeatable")
      ->expected(1)
      ->allow_extra_args(false)
      ->take_all();
  qc->add_option("--targets", ex.targets,
                 "Quantize only these modules: a class name (Linear), an exact module name, or re:REGEX; repeatable")
      ->expected(1)
      ->allow_extra_args(false)
      ->take_all();
  std::string recipe_path;
  qc->add_option("--recipe", recipe_path,
                 "An llm-compressor recipe (YAML) with one QuantizationModifier: its scheme, targets and ignore "
                 "(instead of --preset, --group-size, --targets, --ignore); written to the output as recipe.yaml");
  qc->add_option("--max-shard-size", max_shard,
                 "Split the output weights into shards of at most this size (e.g. 5GB, 500MB)");

  // ---- dequantize ----
  xqcli::DequantizeOptions d;
  std::string out_dtype = "original";
  auto* dc = app.add_subcommand("dequantize", "Turn a file written by quantize back into floating point");
  dc->add_option("input", d.input, "Input written by xquant quantize: a .safetensors file or a model directory")
      ->required();
  dc->add_option("-o,--output", d.output, "Output .safetensors file (written atomically)")->required();
  dc->add_option("--dtype", out_dtype, "Output dtype of dequantized tensors (original: as before quantization)")
      ->check(CLI::IsMember({"original", "F32", "F16", "BF16", "float32", "float16", "bfloat16"}))
      ->default_val("original");
  dc->add_option("--threads", d.threads, "Worker threads, at most 1024 (0: all cores)")
      ->check(CLI::Range(0, xqcli::kMaxThreads))
      ->default_val(0);
  dc->add_flag("-f,--force", d.force, "Replace an existing output file");
  dc->add_flag("-q,--quiet", d.quiet, "No progress bar");

  // ---- inspect ----
  xqcli::InspectOptions in;
  auto* ic = app.add_subcommand("inspect", "List the tensors of a .safetensors file");
  ic->add_option("file", in.path, "The .safetensors file or model directory")->required();
  ic->add_flag("--json", in.json, "Print JSON instead of a table");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : xqcli::kExitBadInput;
  }

  // The one rule for outputs (files.hpp, check_apart): -o and --report are not, do not contain and do not
  // lie inside an input (or each other), whatever --force says.
  if (qc->parsed()) {
    xqcli::check_apart(q.output, "-o", {q.input});
    if (!q.report_path.empty()) xqcli::check_apart(q.report_path, "--report", {q.input, q.output});
  } else if (dc->parsed()) {
    xqcli::check_apart(d.output, "-o", {d.input});
  }

  if (qc->parsed() && (format == "compressed-tensors" || (format.empty() && xqcli::is_directory(q.input)))) {
    for (const char* opt : {"--bits", "--scheme", "--axis", "--symmetric", "--asymmetric", "--include", "--exclude"})
      if (qc->count(opt) > 0)
        throw xqcli::CliError(xqcli::kExitBadInput, std::string(opt) +
                                                        " applies to --format xquant; the compressed-tensors "
                                                        "format takes --preset, --group-size, --targets and --ignore");
    ex.group_size_given = qc->count("--group-size") > 0;
    if (!recipe_path.empty()) {
      for (const char* opt : {"--preset", "--group-size", "--targets", "--ignore"})
        if (qc->count(opt) > 0)
          throw xqcli::CliError(xqcli::kExitBadInput,
                                std::string(opt) + " and --recipe: the recipe gives the scheme, targets and ignore");
      const xqcli::Recipe rec = xqcli::read_recipe(recipe_path);
      xqcli::apply_recipe(rec, ex);
      ex.recipe_yaml = xqcli::recipe_yaml(rec);
    }
    if (!max_shard.empty()) ex.max_shard_size = xqcli::parse_size(max_shard, "--max-shard-size");
    const auto result = xqcli::run_export(q, ex);
    if (!q.quiet) xqcli::print_export_report(stdout, q, ex, result);
  } else if (qc->parsed()) {
    for (const char* opt : {"--preset", "--group-size", "--ignore", "--targets", "--max-shard-size", "--scale-rule",
                            "--keep-partial-dense", "--recipe", "--observer"})
      if (qc->count(opt) > 0)
        throw xqcli::CliError(
            xqcli::kExitBadInput,
            std::string(opt) +
                " applies to the compressed-tensors format (a model "
                "directory); --format xquant takes --bits, --scheme, --axis, --include and --exclude");
    if (xqcli::is_directory(q.input))
      throw xqcli::CliError(xqcli::kExitBadInput,
                            q.input + ": --format xquant takes a single .safetensors file, not a model directory");
    q.scheme.per_channel = scheme == "per-channel";
    q.scheme.symmetric = !asymmetric;
    const auto result = xqcli::run_quantize(q);
    if (!q.quiet) xqcli::print_report(stdout, q, result);
  } else if (dc->parsed()) {
    d.dtype = parse_out_dtype(out_dtype);
    if (xqcli::is_directory(d.input))
      xqcli::run_dequantize_dir(d);
    else if (xqcli::is_ct_file(d.input))
      xqcli::run_dequantize_ct_file(d);
    else
      xqcli::run_dequantize(d);
  } else if (ic->parsed()) {
    if (xqcli::is_directory(in.path))
      xqcli::run_inspect_dir(in, stdout);
    else
      xqcli::run_inspect(in, stdout);
  }
  return xqcli::kExitOk;
}

// Messages quote paths and values from the command line and the file: written UTF-8-safe (invalid
// bytes as \xNN).
void print_error(const char* what) { std::fprintf(stderr, "xquant: error: %s\n", xqcli::utf8_safe(what).c_str()); }

}  // namespace

int main(int argc, char** argv) {
  xqcli::cap_openmp_environment();  // before OpenMP starts
  try {
    return run(argc, argv);
  } catch (const xqcli::CliError& e) {
    print_error(e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    print_error("out of memory");
    return xqcli::kExitIo;
  } catch (const xquant::Error& e) {
    print_error(e.what());
    return xqcli::kExitBadInput;
  } catch (const std::exception& e) {
    print_error(e.what());
    return xqcli::kExitBadInput;
  }
}
