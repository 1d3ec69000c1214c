// Hugging Face model directories: reading one (config.json, the weights as model.safetensors or as
// shards listed by model.safetensors.index.json, every other file), and writing one atomically (a
// temporary directory beside the target, renamed into place at the end). See docs/cli.md,
// "Model directories".
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "files.hpp"
#include "json.hpp"
#include "safetensors.hpp"

namespace xqcli {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kSingleWeights = "model.safetensors";
inline constexpr const char* kWeightsIndex = "model.safetensors.index.json";
// The file that marks a directory written by xquant: --force replaces such a directory (or an empty one),
// never any other (docs/cli.md, "Model directories").
inline constexpr const char* kOutputMarker = ".xquant-output";

// Whether `path` is a directory (following symlinks).
bool is_directory(const std::string& path);

// One safetensors file of a model directory, mapped, with its validated header.
struct WeightFile {
  std::string name;  // file name inside the directory
  std::string path;  // directory + "/" + name
  std::unique_ptr<MappedFile> map;
  Header header;
};

// Maps and validates one safetensors file (errors prefixed with its path).
WeightFile open_weight_file(const std::string& path);

struct ModelDir {
  std::string path;
  json::Value config;                     // config.json (an object)
  bool sharded = false;                   // the weights are listed by model.safetensors.index.json
  json::Value index;                      // the index (sharded only)
  std::vector<WeightFile> files;          // the weight files, in the order of their names
  std::vector<std::string> other_files;   // every other regular file, relative paths, sorted
  std::vector<std::string> not_followed;  // entries left out: "rel: why" (links leaving the directory, loops)
  std::vector<std::string> inputs;        // the resolved directories the model's files may come from
  std::uint64_t weight_bytes = 0;         // total size of the weight files
};

// Opens and validates a model directory. Bad input (exit 1): no config.json or a config.json that is
// not a JSON object, neither model.safetensors nor model.safetensors.index.json (or both), an index
// without a "weight_map" of strings, a shard name with a '/' or that does not exist, a tensor that the
// index maps to a shard that lacks it, a tensor in two shards or in no index entry, and every problem
// of a safetensors header. Entries whose names start with '.' are neither read nor copied. Symbolic
// links among the other files and directories are followed only when they stay inside the model
// directory (or, for a Hugging Face cache snapshot `.../snapshots/REV`, inside the cache's `blobs/`), and
// a directory is not entered twice on one path (loops, by device and inode); each entry left out is in
// `not_followed` and, unless `quiet`, printed as a warning on stderr.
ModelDir open_model_dir(const std::string& path, bool quiet = false);

// The other files of `m` to copy into an output that also writes the files `written` (config.json, the
// weights, the index): a stray file of the input with one of those names is left out with a warning
// (unless `quiet`) instead of colliding with the output's own file.
std::vector<std::string> files_to_copy(const ModelDir& m, const std::vector<std::string>& written, bool quiet);

// Parses a size: bytes, or a number with kB / MB / GB / TB (powers of 1000) or KiB / MiB / GiB / TiB
// (powers of 1024), e.g. "5GB" (transformers' spelling). A bad value is a usage error naming `option`.
std::uint64_t parse_size(const std::string& text, const char* option);

// The output directory, built in ".<name>.xquant-XXXXXX" beside `target` (temp_template) with the marker
// file kOutputMarker, and renamed into place by commit(): without `force` the rename refuses an existing
// target; with `force` an existing target that is replaceable (replaceable_output) is swapped out
// atomically and then removed, anything else is refused. Without commit() (an error, an exception) the
// temporary directory and everything in it is removed; on every signal of install_signal_cleanup the
// signal handler removes it.
class OutputDir {
 public:
  OutputDir(const std::string& target, bool force);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::string& temp_path() const noexcept { return temp_; }
  // Creates file `rel` (and its parent directories) inside the temporary directory; returns the fd.
  int create_file(const std::string& rel);
  // Writes `len` bytes at `offset` of `fd` (exit 2 on failure).
  void write_at(int fd, const void* data, std::size_t len, std::uint64_t offset, const std::string& rel);
  // fsync + close.
  void close_file(int fd, const std::string& rel);
  // Writes a whole small file.
  void write_file(const std::string& rel, const std::string& content);
  // Copies `src` to `rel` in bounded memory (copy_file_range, falling back to read / write).
  void copy_file(const std::string& src, const std::string& rel);
  void commit();

 private:
  std::string target_;
  std::string temp_;
  bool force_ = false;
  bool committed_ = false;
  std::vector<std::string> dirs_;  // subdirectories created, to sync at commit
};

// Whether `force` may replace `target` as an output directory: it is a directory (not a symbolic link)
// that is empty or holds kOutputMarker. Otherwise the reason it may not, for the message.
std::optional<std::string> why_not_replaceable(const std::string& target);

// Refuses (exit 1) an output directory `target` that is, contains or lies inside the input directory
// `input` (check_apart), that exists without `force`, or that exists and is not replaceable.
void check_can_create_dir(const std::string& target, const std::string& input, bool force);

// Reads a whole small file (config.json, an index); exit 2 when it cannot be read.
std::string read_small_file(const std::string& path);

}  // namespace xqcli
