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
#include <map>
#include <set>

#include "errors.hpp"

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
struct sigaction g_previous[3];
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGBUS};

extern "C" void on_signal_remove_dir(int sig) {
  if (g_temp_dir_set) remove_tree(g_temp_dir);
  // Chain to the handler of files.cpp (removes its temporary files, prints, exits with the code).
  for (int i = 0; i < 3; ++i)
    if (kSignals[i] == sig && g_previous[i].sa_handler != SIG_DFL && g_previous[i].sa_handler != SIG_IGN &&
        !(g_previous[i].sa_flags & SA_SIGINFO)) {
      g_previous[i].sa_handler(sig);
    }
  ::_exit(sig == SIGBUS ? kExitIo : 128 + sig);
}

void install_dir_cleanup() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  install_signal_cleanup();  // files.cpp's handler first, so ours can chain to it
  struct sigaction sa {};
  sa.sa_handler = on_signal_remove_dir;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &g_previous[i]);
}

nlohmann::ordered_json parse_json_file(const std::string& path) {
  const std::string text = read_small_file(path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad_input(path + ": malformed JSON: " + e.what());
  }
}

void list_files(const std::string& root, const std::string& rel, int depth, std::vector<std::string>& out) {
  const std::string dir = rel.empty() ? root : join(root, rel);
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
    struct stat st {};
    if (::stat(join(root, r).c_str(), &st) != 0) continue;  // a dangling link: nothing to copy
    if (S_ISDIR(st.st_mode)) {
      if (depth < 8) list_files(root, r, depth + 1, out);
    } else if (S_ISREG(st.st_mode)) {
      out.push_back(r);
    }
  }
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

ModelDir open_model_dir(const std::string& path) {
  ModelDir m;
  m.path = path;
  const std::string cfg = join(path, kConfigFile);
  if (!exists_regular(cfg)) bad_input(path + ": not a regular file, and not a model directory: it has no config.json");
  m.config = parse_json_file(cfg);
  if (!m.config.is_object()) bad_input(cfg + ": expected a JSON object, got " + std::string(m.config.type_name()));

  const bool single = exists_regular(join(path, kSingleWeights));
  const bool index = exists_regular(join(path, kWeightsIndex));
  if (single && index)
    bad_input(path + ": has both model.safetensors and model.safetensors.index.json; expected one of them");
  if (!single && !index) {
    const bool bin = exists_regular(join(path, "pytorch_model.bin")) || exists_regular(join(path, "pytorch_model.bin.index.json"));
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
    m.index = parse_json_file(ipath);
    if (!m.index.is_object() || !m.index.contains("weight_map") || !m.index["weight_map"].is_object())
      bad_input(ipath + ": expected a JSON object with a \"weight_map\" object");
    std::map<std::string, std::string> wmap;
    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : m.index["weight_map"].items()) {
      if (!file.is_string()) bad_input(ipath + ": weight_map['" + tensor + "'] must be a file name, got " + file.dump());
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || f[0] == '.')
        bad_input(ipath + ": weight_map['" + tensor + "'] is '" + f + "', expected a file name in the directory");
      wmap[tensor] = f;
      shard_names.insert(f);
    }
    if (shard_names.empty()) bad_input(ipath + ": the weight_map is empty");
    for (const auto& f : shard_names) {
      if (!exists_regular(join(path, f)))
        bad_input(ipath + ": names shard '" + f + "', which does not exist in " + path);
      m.files.push_back(open_weight_file(join(path, f)));
      weight_names.insert(f);
    }
    std::map<std::string, std::string> found;  // tensor -> the shard holding it
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
    for (const auto& [tensor, f] : wmap)
      if (!found.count(tensor)) bad_input(ipath + ": maps tensor '" + tensor + "' to " + f + ", which does not hold it");
  }
  for (const auto& w : m.files) m.weight_bytes += w.map->size();

  std::vector<std::string> all;
  list_files(path, "", 0, all);
  for (auto& f : all)
    if (f != kConfigFile && f != kWeightsIndex && !weight_names.count(f)) m.other_files.push_back(std::move(f));
  return m;
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
  static const std::pair<const char*, std::uint64_t> units[] = {
      {"", 1},           {"B", 1},
      {"kB", 1000},      {"KB", 1000},       {"MB", 1000000},      {"GB", 1000000000}, {"TB", 1000000000000},
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
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

void check_can_create_dir(const std::string& target, const std::string& input, bool force) {
  struct stat st {}, in {};
  if (::stat(target.c_str(), &st) == 0 && ::stat(input.c_str(), &in) == 0 && st.st_dev == in.st_dev &&
      st.st_ino == in.st_ino)
    bad_input("output " + target + " is the input directory; write the quantized model somewhere else");
  if (exists_any(target) && !force) bad_input("output " + target + " exists (use --force to replace it)");
  if (!is_directory(dir_of(target))) {
    errno = ENOENT;
    io_error("cannot create " + target + ": its parent directory " + dir_of(target) + " does not exist", ENOENT);
  }
}

// ---- OutputDir ----

OutputDir::OutputDir(const std::string& target, bool force) : target_(target), force_(force) {
  while (target_.size() > 1 && target_.back() == '/') target_.pop_back();
  if (exists_any(target_) && !force) bad_input("output " + target_ + " exists (use --force to replace it)");
  install_dir_cleanup();
  std::string tmpl = dir_of(target_) + "/." + base_of(target_) + ".xquant-XXXXXX";
  if (tmpl.size() + 1 > kPathMax) bad_input("output path too long: " + target_);
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
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
    if (::mkdir(d.c_str(), 0777) == 0) dirs_.push_back(d);
    else if (errno != EEXIST) io_error("cannot create directory " + d, errno);
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
      // Swap the new directory in atomically; the old target is then at temp_ and is removed.
      if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0)
        io_error("cannot replace " + target_ + " with " + temp_, errno);
      replaced = true;
    } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
      // A file system without renameat2 flags: check, then rename (not atomic against a racing writer).
      if (exists_any(target_)) {
        if (!force_) bad_input("output " + target_ + " appeared while writing (use --force to replace it)");
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
