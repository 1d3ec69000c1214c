#include "files.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <memory>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "errors.hpp"

namespace xqcli {

void io_error(const std::string& what, int err) { throw CliError(kExitIo, what + ": " + std::strerror(err)); }

namespace {

// ---- signal cleanup: fixed storage, touched by the handler only through async-signal-safe calls ----
constexpr int kSlots = 4;
constexpr std::size_t kPathMax = 4096;
char g_paths[kSlots][kPathMax];
std::atomic<bool> g_used[kSlots];

int register_path(const std::string& path) {
  if (path.size() + 1 > kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (!g_used[i].load() && g_used[i].compare_exchange_strong(expected, true)) {
      std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
      return i;
    }
  }
  return -1;
}

void unregister_path(int slot) {
  if (slot >= 0) g_used[slot].store(false);
}

void write_stderr(std::string_view s) noexcept {
  while (!s.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, s.data(), s.size());
    if (n <= 0) return;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::atomic<void (*)() noexcept> g_hook{nullptr};

extern "C" void on_fatal_signal(int sig) {
  if (auto* hook = g_hook.load()) hook();
  for (int i = 0; i < kSlots; ++i)
    if (g_used[i].load()) ::unlink(g_paths[i]);
  if (sig == SIGBUS) {
    write_stderr(
        "\nxquant: error: the input file became unreadable while mapped (truncated or an I/O error); "
        "no output written\n");
    ::_exit(kExitIo);
  }
  write_stderr(sig == SIGINT ? "\nxquant: interrupted; no output written\n"
                             : "\nxquant: terminated; no output written\n");
  ::_exit(128 + sig);
}

// The signals whose default action ends the process and that a user or the system sends to stop it.
constexpr int kCleanupSignals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,   SIGPIPE, SIGALRM,
                                   SIGUSR1, SIGUSR2, SIGXCPU, SIGVTALRM, SIGPROF};

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

mode_t current_umask() {
  const mode_t m = ::umask(022);
  ::umask(m);
  return m;
}

}  // namespace

sigset_t cleanup_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kCleanupSignals) sigaddset(&set, sig);
  return set;
}

void set_signal_cleanup_hook(void (*hook)() noexcept) { g_hook.store(hook); }

std::string resolve_path(const std::string& path) {
  std::string abs = path;
  if (abs.empty() || abs[0] != '/') {
    std::unique_ptr<char, decltype(&std::free)> cwd(::getcwd(nullptr, 0), &std::free);
    if (!cwd) io_error("cannot get the current directory", errno);
    abs = std::string(cwd.get()) + "/" + abs;
  }
  // Peel components off the end until an existing ancestor resolves.
  std::vector<std::string> rest;  // reversed
  std::string head = abs;
  std::string real;
  for (;;) {
    while (head.size() > 1 && head.back() == '/') head.pop_back();
    std::unique_ptr<char, decltype(&std::free)> r(::realpath(head.c_str(), nullptr), &std::free);
    if (r) {
      real = r.get();
      break;
    }
    if (head == "/") {
      real.assign(1, '/');
      break;
    }
    const auto slash = head.rfind('/');
    rest.push_back(head.substr(slash + 1));
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
  for (auto it = rest.rbegin(); it != rest.rend(); ++it) {
    if (it->empty() || *it == ".") continue;
    if (*it == "..") {
      const auto slash = real.rfind('/');
      real.resize(slash == 0 ? 1 : slash);  // "/a/b" -> "/a", "/a" -> "/"
      continue;
    }
    real += real == "/" ? *it : "/" + *it;
  }
  return real;
}

bool path_within(const std::string& inner, const std::string& outer) {
  if (outer == "/") return true;
  return inner == outer ||
         (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '/');
}

void check_apart(const std::string& path, const char* option, const std::vector<std::string>& inputs) {
  const std::string out = resolve_path(path);
  for (const auto& in : inputs) {
    if (in.empty()) continue;
    const std::string rin = resolve_path(in);
    const char* how = out == rin              ? "is"
                      : path_within(out, rin) ? "lies inside"
                      : path_within(rin, out) ? "contains"
                                              : nullptr;
    if (!how) continue;
    std::string msg = std::string(option) + " " + path + " " + how + " " + in;
    if (out != path || rin != in) msg += " (resolved: " + out + " and " + rin + ")";
    bad_input(msg + "; an output may not be, contain or lie inside an input: choose a path outside it");
  }
}

std::string temp_template(const std::string& path) {
  constexpr std::size_t kNameMax = 255;
  constexpr std::string_view kSuffix = ".xquant-XXXXXX";
  std::string base = base_of(path);
  const std::size_t room = kNameMax - 1 - kSuffix.size();
  if (base.size() > room) base.resize(room);
  // Appended piece by piece: GCC 12's -Wrestrict misreads `a + b + std::string(...)` on aarch64.
  std::string out = dir_of(path);
  out += "/.";
  out += base;
  out += kSuffix;
  return out;
}

void ensure_open_files(std::size_t needed, const std::string& why) {
  constexpr std::size_t kMargin = 64;  // stdio, the inputs being opened and mapped, OpenMP, ...
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const auto want = static_cast<rlim_t>(needed + kMargin);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY || want <= rl.rlim_max ? want : rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
    throw CliError(kExitIo, why + " needs " + std::to_string(needed) + " files open at once (+" +
                                std::to_string(kMargin) + " spare), but the limit of open files is " +
                                std::to_string(rl.rlim_cur) + " (hard limit " + std::to_string(rl.rlim_max) +
                                "): raise it (ulimit -n) or write fewer, larger shards (--max-shard-size)");
}

void install_signal_cleanup() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : kCleanupSignals) sigaddset(&sa.sa_mask, sig);  // one cleanup at a time
  sa.sa_flags = 0;
  ::sigaction(SIGBUS, &sa, nullptr);
  for (int sig : kCleanupSignals) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    // Only a signal with its default action (ending the process) is taken over: an ignored one stays
    // ignored (SIGHUP under nohup: keep running), and a handler installed by whoever embeds this code
    // stays in place (libFuzzer's SIGALRM / SIGUSR1 for its timeouts, for instance).
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
    ::sigaction(sig, &sa, nullptr);
  }
  // Beyond RLIMIT_FSIZE a write fails with EFBIG (an I/O error that removes the temporary file) instead
  // of killing the process.
  ::signal(SIGXFSZ, SIG_IGN);
}

// ---- MappedFile ----

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    io_error("cannot stat " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    bad_input(path + ": not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    bad_input(path + ": truncated file: " + std::to_string(size_) +
              " bytes, but a safetensors file starts with an 8-byte header length");
  }
  void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) io_error("cannot map " + path, err);
  data_ = static_cast<const std::byte*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_));
}

void MappedFile::release(std::uint64_t offset, std::uint64_t len) const noexcept {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t b = (offset + page - 1) / page * page;
  const std::uint64_t e = std::min(offset + len, size_) / page * page;
  if (e > b) ::madvise(const_cast<std::byte*>(data_) + b, static_cast<std::size_t>(e - b), MADV_DONTNEED);
}

// ---- AtomicOutput ----

void check_can_create(const std::string& path, bool force) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) bad_input("output " + path + " is a directory");
    if (!force) bad_input("output " + path + " exists (use --force to replace it)");
  }
}

AtomicOutput::AtomicOutput(const std::string& path, bool force) : path_(path), force_(force) {
  check_can_create(path, force);
  install_signal_cleanup();
  std::string tmpl = temp_template(path);
  // Signals are held while the file is created and registered, so no SIGINT can fall between the two.
  sigset_t block = cleanup_signal_set(), old;
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
  const int create_err = errno;
  if (fd_ >= 0) {
    temp_ = tmpl;
    slot_ = register_path(temp_);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (fd_ < 0) io_error("cannot create a temporary file in " + dir_of(path), create_err);
  // mkstemp creates mode 0600; give the output the mode a plain create would (0666 less the umask).
  if (::fchmod(fd_, 0666 & ~current_umask()) != 0) {
    const int err = errno;
    ::close(fd_);
    ::unlink(temp_.c_str());
    unregister_path(slot_);
    fd_ = -1;
    io_error("cannot set the mode of " + temp_, err);
  }
}

AtomicOutput::~AtomicOutput() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
  unregister_path(slot_);
}

void AtomicOutput::write_at(const void* data, std::size_t len, std::uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::pwrite(fd_, p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error("cannot write " + path_ + " (temporary file " + temp_ + ")", errno);
    }
    p += n;
    len -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
    written_ += static_cast<std::uint64_t>(n);
  }
}

void AtomicOutput::sync() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) io_error("cannot sync " + temp_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) io_error("cannot close " + temp_, errno);
}

void AtomicOutput::commit() {
  sync();
  if (force_) {
    if (::rename(temp_.c_str(), path_.c_str()) != 0) io_error("cannot rename " + temp_ + " to " + path_, errno);
  } else if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno == EEXIST) bad_input("output " + path_ + " appeared while writing (use --force to replace it)");
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      io_error("cannot rename " + temp_ + " to " + path_, errno);
    // A file system without RENAME_NOREPLACE: link() also refuses an existing target.
    if (::link(temp_.c_str(), path_.c_str()) != 0) {
      if (errno == EEXIST) bad_input("output " + path_ + " appeared while writing (use --force to replace it)");
      io_error("cannot rename " + temp_ + " to " + path_, errno);
    }
    ::unlink(temp_.c_str());
  }
  committed_ = true;
  unregister_path(slot_);
  slot_ = -1;
  // Make the rename itself durable.
  const int dfd = ::open(dir_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace xqcli
