// Errors of the xquant command-line tool and the exit codes they map to (docs/cli.md, "Exit codes").
#pragma once
#include <stdexcept>
#include <string>

namespace xqcli {

// Exit codes: 0 success; 1 the command line or the content of a file is wrong (usage error, malformed
// or truncated input, a tensor that cannot be quantized under --strict, an output that exists without
// --force); 2 the operating system refused an operation (open, read, map, write, sync, rename).
// Stopped by a signal (SIGINT, SIGTERM, SIGHUP, ...): 128 + its number (files.hpp).
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 1;
inline constexpr int kExitIo = 2;

class CliError : public std::runtime_error {
 public:
  CliError(int exit_code, const std::string& message) : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

// The command line or an input file's content is wrong (exit code 1).
[[noreturn]] inline void bad_input(const std::string& message) { throw CliError(kExitBadInput, message); }
// An operating-system call failed (exit code 2); `err` is the errno value, appended as text.
[[noreturn]] void io_error(const std::string& what, int err);

}  // namespace xqcli
