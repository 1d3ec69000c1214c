// Writes on a background thread, so that computing the next chunk overlaps writing the previous one:
// into an AtomicOutput (one file) or through a WriteSink (several files, e.g. those of an OutputDir).
// At most two writes are pending, or up to 16 MiB of small ones (bounded memory); a write error is
// rethrown by the next submit() or by finish().
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "files.hpp"

namespace xqcli {

// Writes `len` bytes at `data` to `offset` of the caller's file number `file` (throws on failure).
using WriteSink = std::function<void(std::size_t file, const void* data, std::size_t len, std::uint64_t offset)>;

class AsyncWriter {
 public:
  explicit AsyncWriter(AtomicOutput& out);  // every write goes to `out` (file number ignored)
  explicit AsyncWriter(WriteSink sink);
  ~AsyncWriter();  // waits for the thread; errors are dropped (the caller is already failing)
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // A buffer to fill (recycled from finished writes when possible).
  std::vector<std::byte> buffer();
  // Writes `data` (owned) at `offset` of file `file`.
  void submit(std::vector<std::byte> data, std::uint64_t offset, std::size_t file = 0);
  // Writes `len` bytes at `ptr` to `offset` of file `file`; `ptr` must stay valid until finish(): a
  // range of the mapped input `map` at `map_offset`, whose pages are released from the mapping once
  // written.
  void submit_view(const void* ptr, std::size_t len, std::uint64_t offset, const MappedFile* map = nullptr,
                   std::uint64_t map_offset = 0, std::size_t file = 0);
  // Waits until everything is written; rethrows the first write error.
  void finish();

 private:
  struct Job {
    std::vector<std::byte> owned;
    const void* ptr = nullptr;
    std::size_t len = 0;
    std::uint64_t offset = 0;
    const MappedFile* map = nullptr;
    std::uint64_t map_offset = 0;
    std::size_t file = 0;
  };
  void push(Job job);
  void loop();
  void rethrow_locked();

  WriteSink sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::size_t pending_bytes_ = 0;  // of the queued and in-flight jobs
  std::size_t in_flight_ = 0;      // jobs the writer thread took and is writing
  int waiters_ = 0;                // threads in push() or finish() waiting on cv_
  bool writer_idle_ = false;       // the writer thread waits on cv_ for a job
  std::vector<std::vector<std::byte>> spare_;
  std::exception_ptr error_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace xqcli
