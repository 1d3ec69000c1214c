// Files: the read-only mapped input, and the atomic output (a temporary file in the destination's
// directory, synced and renamed into place only on success; removed on failure, on an exception and on
// SIGINT / SIGTERM).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <signal.h>

namespace xqcli {

// The whole input file mapped read-only. Open / stat / map failures are I/O errors (exit 2); a path
// that is not a regular file or an empty file is bad input (exit 1).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }
  // Drops the pages of [offset, offset + len) from this process's mapping (they stay in the page
  // cache): keeps the resident set bounded while a large file streams through.
  void release(std::uint64_t offset, std::uint64_t len) const noexcept;

 private:
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// Writes `path` atomically. The constructor refuses an existing `path` unless `force` (exit 1) and
// creates ".<name>.xquant-XXXXXX" beside it; commit() syncs, renames into place (without replacing a
// file that appeared meanwhile unless `force`) and syncs the directory. Without commit() the temporary
// file is removed by the destructor; a signal handler removes it on SIGINT / SIGTERM / SIGHUP / ...
// (install_signal_cleanup).
class AtomicOutput {
 public:
  AtomicOutput(const std::string& path, bool force);
  ~AtomicOutput();
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  void write_at(const void* data, std::size_t len, std::uint64_t offset);
  // Syncs and closes the temporary file (I/O errors surface here, before anything is renamed);
  // commit() calls it when it has not run.
  void sync();
  void commit();
  const std::string& temp_path() const noexcept { return temp_; }
  std::uint64_t bytes_written() const noexcept { return written_; }

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  int slot_ = -1;  // signal-cleanup registration
  bool force_ = false;
  bool committed_ = false;
  std::uint64_t written_ = 0;
};

// Refuses (exit 1) when `path` exists and not `force`: checked before any work starts.
void check_can_create(const std::string& path, bool force);

// The absolute path that `path` designates with every symbolic link resolved: realpath() of it, or, for a
// path that does not exist (yet), realpath() of its deepest existing ancestor with the remaining
// components appended ("." dropped, ".." removing the component before it).
std::string resolve_path(const std::string& path);

// Whether resolved path `inner` is `outer` or lies inside it.
bool path_within(const std::string& inner, const std::string& outer);

// The one rule for outputs: refuses (exit 1) an output `path` (named by `option`: "-o", "--report") that
// is, contains or lies inside one of `inputs`, compared after resolve_path(), so that neither writing
// nor --force can overwrite or remove an input.
void check_apart(const std::string& path, const char* option, const std::vector<std::string>& inputs);

// The temporary name beside `path` for the atomic write: ".<name>.xquant-XXXXXX" in its directory, the
// name shortened (bytes) so that the whole stays within NAME_MAX (255 bytes).
std::string temp_template(const std::string& path);

// The signals whose handlers install_signal_cleanup() sets (to block them around a registration).
sigset_t cleanup_signal_set();

// A function the signal handler calls before it exits (async-signal-safe calls only), e.g. to remove a
// temporary directory; nullptr for none.
void set_signal_cleanup_hook(void (*hook)() noexcept);

// Raises the soft limit of open files (RLIMIT_NOFILE) to at least `needed` plus a margin, up to the hard
// limit; fails (exit 2) naming `why` and both limits when that is still too few.
void ensure_open_files(std::size_t needed, const std::string& why);

// Installs the handlers that remove registered temporary files and exit: SIGBUS (exit 2) and the
// terminating signals SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGXCPU,
// SIGVTALRM, SIGPROF (exit 128 + the signal's number), each only while its action is the default: a
// signal that is ignored (nohup) or already handled (libFuzzer's SIGALRM) is left as it is. SIGXFSZ is ignored, so a
// file-size limit is a write error (exit 2). Idempotent.
void install_signal_cleanup();

}  // namespace xqcli
