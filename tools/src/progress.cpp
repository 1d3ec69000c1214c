#include "progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace xqcli {

bool progress_wanted(bool quiet) { return !quiet && ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool enabled, std::string label, std::uint64_t total_bytes, std::size_t total_tensors)
    : enabled_(enabled),
      label_(std::move(label)),
      total_bytes_(total_bytes),
      total_tensors_(total_tensors),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { clear(); }

std::string Progress::bytes_str(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

void Progress::update(std::uint64_t bytes_done, std::size_t tensors_done) {
  bytes_ = bytes_done;
  tensors_ = tensors_done;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && tensors_ < total_tensors_) return;
  last_draw_ = now;
  draw();
}

void Progress::draw() {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_bytes_ ? static_cast<double>(bytes_) / static_cast<double>(total_bytes_) : 1.0;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<std::size_t>(kWidth), ' ');
  for (int i = 0; i < filled && i < kWidth; ++i) bar[static_cast<std::size_t>(i)] = '=';
  if (filled < kWidth) bar[static_cast<std::size_t>(filled)] = '>';
  const double rate = elapsed > 0 ? static_cast<double>(bytes_) / elapsed : 0.0;
  std::string eta = "--:--";
  if (rate > 0 && bytes_ > 0) {
    const long long left = std::llround(static_cast<double>(total_bytes_ - bytes_) / rate);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld:%02lld", left / 60, left % 60);
    eta = buf;
  }
  char line[256];
  std::snprintf(line, sizeof line, "\r%s [%s] %3d%%  %zu/%zu tensors  %s / %s  %s/s  ETA %s\x1b[K", label_.c_str(),
                bar.c_str(), static_cast<int>(frac * 100.0), tensors_, total_tensors_,
                bytes_str(static_cast<double>(bytes_)).c_str(), bytes_str(static_cast<double>(total_bytes_)).c_str(),
                bytes_str(rate).c_str(), eta.c_str());
  std::fputs(line, stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear() {
  if (!enabled_ || !drawn_) return;
  std::fputs("\r\x1b[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace xqcli
