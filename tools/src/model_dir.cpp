#include "model_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "errors.hpp"
#include "xquant/version.hpp"

namespace xqcli {

namespace {

std::string dir_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string base_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool exists_regular(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool exists_any(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// ---- removal of a temporary directory tree, also from a signal handler (syscalls only) ----

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

// Removes everything below the open directory `fd` (depth-limited), then closes it.
void remove_below(int fd, int depth) noexcept {
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    bool removed = false;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<LinuxDirent64*>(buf + off);
      off += d->d_reclen;
      const char* name = d->d_name;
      if ((name[0] == '.' && name[1] == '\0') || (name[0] == '.' && name[1] == '.' && name[2] == '\0')) continue;
      if (::unlinkat(fd, name, 0) == 0) {
        removed = true;
        continue;
      }
      if (depth < 16) {
        const int sub = ::openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) remove_below(sub, depth + 1);
      }
      if (::unlinkat(fd, name, AT_REMOVEDIR) == 0) removed = true;
    }
    // Entries were removed while reading: start over from the beginning.
    if (removed) ::lseek(fd, 0, SEEK_SET);
  }
  ::close(fd);
}

void remove_tree(const char* path) noexcept {
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) remove_below(fd, 0);
  ::rmdir(path);
}

constexpr std::size_t kPathMax = 4096;
char g_temp_dir[kPathMax];
volatile sig_atomic_t g_temp_dir_set = 0;

// Called by files.cpp's handler of every cleanup signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE,
// SIGUSR1, SIGALRM, SIGXCPU, ..., SIGBUS) before it removes its files and exits.
void remove_temp_dir_on_signal() noexcept {
  if (g_temp_dir_set) remove_tree(g_temp_dir);
}

void install_dir_cleanup() {
  install_signal_cleanup();
  set_signal_cleanup_hook(remove_temp_dir_on_signal);
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Lists the regular files below a model directory, following only the symbolic links that stay inside
// one of `roots` and entering no directory twice on one path.
class Lister {
 public:
  Lister(std::string root, std::vector<std::string> roots, std::vector<std::string>& out,
         std::vector<std::string>& skipped)
      : root_(std::move(root)), roots_(std::move(roots)), out_(out), skipped_(skipped) {}

  void run() {
    struct stat st {};
    if (::stat(root_.c_str(), &st) != 0) io_error("cannot stat " + root_, errno);
    ancestors_.emplace_back(st.st_dev, st.st_ino);
    list("", 0);
  }

 private:
  static constexpr int kMaxDepth = 8;

  bool inside_roots(const std::string& real) const {
    for (const auto& r : roots_)
      if (path_within(real, r)) return true;
    return false;
  }

  void list(const std::string& rel, int depth) {
    const std::string dir = rel.empty() ? root_ : join(root_, rel);
    DIR* d = ::opendir(dir.c_str());
    if (!d) io_error("cannot list " + dir, errno);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;  // ".", "..", hidden files (.git, .cache, our own temporaries)
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      const std::string r = rel.empty() ? n : rel + "/" + n;
      const std::string full = join(root_, r);
      if (is_symlink(full)) {
        std::unique_ptr<char, decltype(&std::free)> real(::realpath(full.c_str(), nullptr), &std::free);
        if (!real) continue;  // a dangling link (or a loop of links): nothing to copy
        if (!inside_roots(real.get())) {
          skipped_.push_back(r + ": a symbolic link to " + real.get() + ", outside the model directory (not followed)");
          continue;
        }
      }
      struct stat st {};
      if (::stat(full.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
        if (std::find(ancestors_.begin(), ancestors_.end(), id) != ancestors_.end()) {
          skipped_.push_back(r + ": a directory that contains itself (a symbolic link loop; not followed)");
          continue;
        }
        if (depth >= kMaxDepth) {
          skipped_.push_back(r + ": deeper than " + std::to_string(kMaxDepth) + " levels of directories (not copied)");
          continue;
        }
        ancestors_.push_back(id);
        list(r, depth + 1);
        ancestors_.pop_back();
      } else if (S_ISREG(st.st_mode)) {
        out_.push_back(r);
      }
    }
  }

  std::string root_;
  std::vector<std::string> roots_;
  std::vector<std::string>& out_;
  std::vector<std::string>& skipped_;
  std::vector<std::pair<dev_t, ino_t>> ancestors_;
};

// The directories a model's files may link into: the model directory, and for a Hugging Face cache
// snapshot (".../models--org--name/snapshots/REV") the cache's ".../models--org--name/blobs".
std::vector<std::string> model_roots(const std::string& path) {
  std::vector<std::string> roots{resolve_path(path)};
  const std::string parent = dir_of(roots[0]);
  if (base_of(parent) == "snapshots") {
    const std::string blobs = join(dir_of(parent), "blobs");
    if (is_directory(blobs)) roots.push_back(resolve_path(blobs));
  }
  return roots;
}

}  // namespace

WeightFile open_weight_file(const std::string& path) {
  WeightFile w;
  w.name = base_of(path);
  w.path = path;
  w.map = std::make_unique<MappedFile>(w.path);
  try {
    w.header = parse_header(w.map->data(), w.map->size());
  } catch (const CliError& e) {
    throw CliError(e.exit_code(), w.path + ": " + e.what());
  }
  return w;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open " + path, errno);
  std::string s;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      io_error("cannot read " + path, err);
    }
    if (n == 0) break;
    s.append(buf, static_cast<std::size_t>(n));
    if (s.size() > (std::size_t{256} << 20)) {
      ::close(fd);
      bad_input(path + ": larger than 256 MiB, not a configuration file");
    }
  }
  ::close(fd);
  return s;
}

ModelDir open_model_dir(const std::string& path, bool quiet) {
  ModelDir m;
  m.path = path;
  const std::string cfg = join(path, kConfigFile);
  if (!exists_regular(cfg)) bad_input(path + ": not a regular file, and not a model directory: it has no config.json");
  m.config = json::parse_file(cfg);
  if (!m.config.is_object()) bad_input(cfg + ": expected a JSON object, got " + std::string(m.config.type_name()));

  const bool single = exists_regular(join(path, kSingleWeights));
  const bool index = exists_regular(join(path, kWeightsIndex));
  if (single && index)
    bad_input(path + ": has both model.safetensors and model.safetensors.index.json; expected one of them");
  if (!single && !index) {
    const bool bin =
        exists_regular(join(path, "pytorch_model.bin")) || exists_regular(join(path, "pytorch_model.bin.index.json"));
    bad_input(path + ": no weights: expected model.safetensors or model.safetensors.index.json" +
              std::string(bin ? " (PyTorch .bin weights are not read; save the model with safe_serialization)" : ""));
  }
  std::set<std::string> weight_names;
  if (single) {
    m.files.push_back(open_weight_file(join(path, kSingleWeights)));
    weight_names.insert(kSingleWeights);
  } else {
    m.sharded = true;
    const std::string ipath = join(path, kWeightsIndex);
    m.index = json::parse_file(ipath);
    if (!m.index.is_object() || !m.index["weight_map"].is_object())
      bad_input(ipath + ": expected a JSON object with a \"weight_map\" object");
    std::unordered_map<std::string, std::string> wmap;
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : m.index["weight_map"].members()) {
      const std::string who = ipath + ": weight_map[" + quote_name(tensor) + "]";
      if (!file.is_string()) bad_input(who + " must be a file name, got " + file.type_name() + " " + file.excerpt());
      const std::string& f = file.text();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || f[0] == '.')
        bad_input(who + " is " + quote_name(f) + ", expected a file name in the directory");
      wmap.emplace(tensor, f);
      shard_names.insert(f);
    }
    if (shard_names.empty()) bad_input(ipath + ": the weight_map is empty");
    for (const auto& f : shard_names) {
      if (!exists_regular(join(path, f)))
        bad_input(ipath + ": names shard '" + f + "', which does not exist in " + path);
      m.files.push_back(open_weight_file(join(path, f)));
      weight_names.insert(f);
    }
    std::unordered_map<std::string, std::string> found;  // tensor -> the shard holding it
    for (const auto& w : m.files)
      for (const auto& t : w.header.tensors) {
        const auto [it, fresh] = found.emplace(t.name, w.name);
        if (!fresh) bad_input(path + ": tensor '" + t.name + "' is in two shards, " + it->second + " and " + w.name);
      }
    for (const auto& w : m.files)
      for (const auto& t : w.header.tensors) {
        const auto e = wmap.find(t.name);
        if (e == wmap.end()) bad_input(ipath + ": tensor '" + t.name + "' of " + w.name + " has no weight_map entry");
        if (e->second != w.name)
          bad_input(ipath + ": maps tensor '" + t.name + "' to " + e->second + " but it is in " + w.name);
      }
    for (const auto& [tensor, f] : m.index["weight_map"].members())
      if (!found.count(tensor))
        bad_input(ipath + ": maps tensor '" + tensor + "' to " + f.text() + ", which does not hold it");
  }
  for (const auto& w : m.files) m.weight_bytes += w.map->size();

  m.inputs = model_roots(path);
  std::vector<std::string> all;
  Lister(path, m.inputs, all, m.not_followed).run();
  for (auto& f : all)
    if (f != kConfigFile && f != kWeightsIndex && !weight_names.count(f)) m.other_files.push_back(std::move(f));
  if (!quiet)
    for (const auto& s : m.not_followed)
      std::fprintf(stderr, "xquant: warning: %s\n", utf8_safe(join(path, s)).c_str());
  return m;
}

std::vector<std::string> files_to_copy(const ModelDir& m, const std::vector<std::string>& written, bool quiet) {
  const std::set<std::string> names(written.begin(), written.end());
  std::vector<std::string> copy;
  for (const auto& f : m.other_files) {
    if (!names.count(f)) {
      copy.push_back(f);
      continue;
    }
    if (!quiet)
      std::fprintf(stderr, "xquant: warning: not copying %s: the output writes its own %s\n",
                   utf8_safe(join(m.path, f)).c_str(), utf8_safe(f).c_str());
  }
  return copy;
}

std::uint64_t parse_size(const std::string& text, const char* option) {
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  const std::string num = text.substr(0, i), unit = text.substr(i);
  const auto bad = [&]() -> std::uint64_t {
    bad_input(std::string(option) + ": '" + text + "' is not a size (expected e.g. 5GB, 500MB, 2GiB or a byte count)");
  };
  if (num.empty() || num.size() > 15) return bad();
  std::uint64_t mult = 1;
  static const std::pair<const char*, std::uint64_t> units[] = {{"", 1},
                                                                {"B", 1},
                                                                {"kB", 1000},
                                                                {"KB", 1000},
                                                                {"MB", 1000000},
                                                                {"GB", 1000000000},
                                                                {"TB", 1000000000000},
                                                                {"KiB", 1ull << 10},
                                                                {"MiB", 1ull << 20},
                                                                {"GiB", 1ull << 30},
                                                                {"TiB", 1ull << 40}};
  bool known = false;
  for (const auto& [u, v] : units)
    if (unit == u) {
      mult = v;
      known = true;
    }
  if (!known) return bad();
  const std::uint64_t n = std::stoull(num);
  if (n == 0) bad_input(std::string(option) + ": must be positive, got '" + text + "'");
  if (n > UINT64_MAX / mult) return bad();
  return n * mult;
}

std::optional<std::string> why_not_replaceable(const std::string& target) {
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) return std::nullopt;  // nothing to replace
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  if (exists_regular(join(target, kOutputMarker))) return std::nullopt;
  DIR* d = ::opendir(target.c_str());
  if (!d) return std::string("cannot be listed (") + std::strerror(errno) + ")";
  bool empty = true;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  ::closedir(d);
  if (empty) return std::nullopt;
  return std::string("is a directory that xquant did not write (it has no ") + kOutputMarker +
         " file) and is not empty";
}

void check_can_create_dir(const std::string& target, const std::string& input, bool force) {
  check_apart(target, "-o", {input});
  if (!exists_any(target)) {
    if (!is_directory(dir_of(target)))
      io_error("cannot create " + target + ": its parent directory " + dir_of(target) + " does not exist", ENOENT);
    return;
  }
  if (!force) bad_input("output " + target + " exists (use --force to replace it)");
  if (const auto why = why_not_replaceable(target))
    bad_input("output " + target + " " + *why +
              "; --force replaces only an empty directory or one that xquant wrote: "
              "remove it yourself or choose another output");
}

// ---- OutputDir ----

OutputDir::OutputDir(const std::string& target, bool force) : target_(target), force_(force) {
  while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
  if (exists_any(target_)) {
    if (!force) bad_input("output " + target_ + " exists (use --force to replace it)");
    if (const auto why = why_not_replaceable(target_))
      bad_input("output " + target_ + " " + *why +
                "; --force replaces only an empty directory or one that xquant wrote");
  }
  install_dir_cleanup();
  std::string tmpl = temp_template(target_);
  if (tmpl.size() + 1 > kPathMax) bad_input("output path too long: " + target_);
  // Every cleanup signal is held while the directory is created and registered.
  sigset_t block = cleanup_signal_set(), old;
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  const char* made = ::mkdtemp(tmpl.data());
  const int err = errno;
  if (made) {
    temp_ = tmpl;
    std::memcpy(g_temp_dir, temp_.c_str(), temp_.size() + 1);
    g_temp_dir_set = 1;
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!made) io_error("cannot create a temporary directory beside " + target_, err);
  // mkdtemp makes it 0700; give it the mode of a plain mkdir (0777 less the umask).
  const mode_t um = ::umask(022);
  ::umask(um);
  ::chmod(temp_.c_str(), 0777 & ~um);
  try {
    write_file(kOutputMarker,
               std::string("This directory was written by xquant ") + xquant::kVersion +
                   ". `xquant ... -o DIR --force` replaces a directory holding this file (and no other).\n");
  } catch (...) {
    g_temp_dir_set = 0;
    remove_tree(temp_.c_str());
    throw;
  }
}

OutputDir::~OutputDir() {
  if (!committed_ && !temp_.empty()) {
    g_temp_dir_set = 0;
    remove_tree(temp_.c_str());
  }
}

int OutputDir::create_file(const std::string& rel) {
  // Parent directories of a nested file.
  for (std::size_t pos = rel.find('/'); pos != std::string::npos; pos = rel.find('/', pos + 1)) {
    const std::string d = join(temp_, rel.substr(0, pos));
    if (::mkdir(d.c_str(), 0777) == 0)
      dirs_.push_back(d);
    else if (errno != EEXIST)
      io_error("cannot create directory " + d, errno);
  }
  const std::string p = join(temp_, rel);
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) io_error("cannot create " + p, errno);
  return fd;
}

void OutputDir::write_at(int fd, const void* data, std::size_t len, std::uint64_t offset, const std::string& rel) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::pwrite(fd, p, len, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      io_error("cannot write " + join(target_, rel) + " (in " + temp_ + ")", errno);
    }
    p += n;
    len -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

void OutputDir::close_file(int fd, const std::string& rel) {
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    io_error("cannot sync " + join(temp_, rel), err);
  }
  if (::close(fd) != 0) io_error("cannot close " + join(temp_, rel), errno);
}

void OutputDir::write_file(const std::string& rel, const std::string& content) {
  const int fd = create_file(rel);
  try {
    write_at(fd, content.data(), content.size(), 0, rel);
  } catch (...) {
    ::close(fd);
    throw;
  }
  close_file(fd, rel);
}

void OutputDir::copy_file(const std::string& src, const std::string& rel) {
  const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) io_error("cannot open " + src, errno);
  int out = -1;
  try {
    out = create_file(rel);
    bool fallback = false;
    for (;;) {
      ssize_t n;
      if (!fallback) {
        n = ::copy_file_range(in, nullptr, out, nullptr, std::size_t{1} << 30, 0);
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
          fallback = true;
          continue;
        }
      } else {
        static thread_local std::vector<char> buf(std::size_t{1} << 20);
        n = ::read(in, buf.data(), buf.size());
        if (n > 0) {
          const off_t at = ::lseek(out, 0, SEEK_CUR);
          write_at(out, buf.data(), static_cast<std::size_t>(n), static_cast<std::uint64_t>(at), rel);
          ::lseek(out, at + n, SEEK_SET);
        }
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        io_error("cannot copy " + src + " to " + join(temp_, rel), errno);
      }
      if (n == 0) break;
    }
    close_file(out, rel);
    out = -1;
  } catch (...) {
    if (out >= 0) ::close(out);
    ::close(in);
    throw;
  }
  ::close(in);
}

void OutputDir::commit() {
  const auto sync_dir = [](const std::string& d) {
    const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
  };
  for (const auto& d : dirs_) sync_dir(d);
  sync_dir(temp_);
  bool replaced = false;
  if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) {
      if (!force_) bad_input("output " + target_ + " appeared while writing (use --force to replace it)");
      // Swap the new directory in atomically; the old target is then at temp_ and is removed, unless it
      // changed since the check into something --force may not replace: then it is swapped back.
      if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0)
        io_error("cannot replace " + target_ + " with " + temp_, errno);
      if (const auto why = why_not_replaceable(temp_)) {
        if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0)
          io_error("cannot swap back " + target_ + " (now at " + temp_ + ")", errno);
        bad_input("output " + target_ + " changed while writing and now " + *why + "; not replaced");
      }
      replaced = true;
    } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
      // A file system without renameat2 flags: check, then rename (not atomic against a racing writer).
      if (exists_any(target_)) {
        if (!force_) bad_input("output " + target_ + " appeared while writing (use --force to replace it)");
        if (const auto why = why_not_replaceable(target_))
          bad_input("output " + target_ + " changed while writing and now " + *why + "; not replaced");
        g_temp_dir_set = 0;
        const std::string old = temp_ + ".old";
        if (::rename(target_.c_str(), old.c_str()) != 0) io_error("cannot move " + target_ + " aside", errno);
        if (::rename(temp_.c_str(), target_.c_str()) != 0) io_error("cannot rename " + temp_ + " to " + target_, errno);
        committed_ = true;
        remove_tree(old.c_str());
        sync_dir(dir_of(target_));
        return;
      }
      if (::rename(temp_.c_str(), target_.c_str()) != 0) io_error("cannot rename " + temp_ + " to " + target_, errno);
    } else {
      io_error("cannot rename " + temp_ + " to " + target_, errno);
    }
  }
  committed_ = true;
  if (replaced) {
    remove_tree(temp_.c_str());  // the old target (a directory or a file)
    ::unlink(temp_.c_str());
  }
  g_temp_dir_set = 0;
  sync_dir(dir_of(target_));
}

}  // namespace xqcli
