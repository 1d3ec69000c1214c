// A one-line progress bar on stderr: tensors done, bytes, rate and ETA. Drawn only when enabled (stderr
// is a terminal and --quiet is not given), at most ten times a second.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace xqcli {

class Progress {
 public:
  Progress(bool enabled, std::string label, std::uint64_t total_bytes, std::size_t total_tensors);
  ~Progress();
  // Bytes of input processed so far and tensors completed.
  void update(std::uint64_t bytes_done, std::size_t tensors_done);
  // Erases the bar (call before printing anything else to stderr or stdout).
  void clear();
  bool enabled() const noexcept { return enabled_; }

  // "1.23 GB", "512.0 kB" (decimal units)
  static std::string bytes_str(double bytes);

 private:
  void draw();
  bool enabled_;
  bool drawn_ = false;
  std::string label_;
  std::uint64_t total_bytes_;
  std::size_t total_tensors_;
  std::uint64_t bytes_ = 0;
  std::size_t tensors_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
};

// Whether the progress bar should be drawn: stderr is a terminal and not quiet.
bool progress_wanted(bool quiet);

}  // namespace xqcli
