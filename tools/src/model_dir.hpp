// Hugging Face model directories: reading one (config.json, the weights as model.safetensors or as
// shards listed by model.safetensors.index.json, every other file), and writing one atomically (a
// temporary directory beside the target, renamed into place at the end). See docs/cli.md,
// "Model directories".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "files.hpp"
#include "safetensors.hpp"

namespace xqcli {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kSingleWeights = "model.safetensors";
inline constexpr const char* kWeightsIndex = "model.safetensors.index.json";

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
  nlohmann::ordered_json config;          // config.json (an object)
  bool sharded = false;                   // the weights are listed by model.safetensors.index.json
  nlohmann::ordered_json index;           // the index (sharded only)
  std::vector<WeightFile> files;          // the weight files, in the order of their names
  std::vector<std::string> other_files;   // every other regular file, relative paths, sorted
  std::uint64_t weight_bytes = 0;         // total size of the weight files
};

// Opens and validates a model directory. Bad input (exit 1): no config.json or a config.json that is
// not a JSON object, neither model.safetensors nor model.safetensors.index.json (or both), an index
// without a "weight_map" of strings, a shard name with a '/' or that does not exist, a tensor that the
// index maps to a shard that lacks it, a tensor in two shards or in no index entry, and every problem
// of a safetensors header. Entries whose names start with '.' are neither read nor copied.
ModelDir open_model_dir(const std::string& path);

// Parses a size: bytes, or a number with kB / MB / GB / TB (powers of 1000) or KiB / MiB / GiB / TiB
// (powers of 1024), e.g. "5GB" (transformers' spelling). A bad value is a usage error naming `option`.
std::uint64_t parse_size(const std::string& text, const char* option);

// The output directory, built in ".<name>.xquant-XXXXXX" beside `target` and renamed into place by
// commit(): without `force` the rename refuses an existing target; with `force` the old target is
// swapped out atomically and then removed. Without commit() (an error, an exception) the temporary
// directory and everything in it is removed; on SIGINT / SIGTERM / SIGBUS a signal handler removes it.
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

// Refuses (exit 1) when `target` exists and not `force`, and always when it is the input directory.
void check_can_create_dir(const std::string& target, const std::string& input, bool force);

// Reads a whole small file (config.json, an index); exit 2 when it cannot be read.
std::string read_small_file(const std::string& path);

}  // namespace xqcli
