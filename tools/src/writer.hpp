// Writes into an AtomicOutput on a background thread, so that computing the next chunk overlaps
// writing the previous one. At most two writes are pending, or up to 16 MiB of small ones (bounded
// memory); a write error is rethrown
// by the next submit() or by finish().
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "files.hpp"

namespace xqcli {

class AsyncWriter {
 public:
  explicit AsyncWriter(AtomicOutput& out);
  ~AsyncWriter();  // waits for the thread; errors are dropped (the caller is already failing)
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // A buffer to fill (recycled from finished writes when possible).
  std::vector<std::byte> buffer();
  // Writes `data` (owned) at `offset`.
  void submit(std::vector<std::byte> data, std::uint64_t offset);
  // Writes `len` bytes at `ptr`, which must stay valid until finish(): a range of the mapped input
  // `map` at `map_offset`, whose pages are released from the mapping once written.
  void submit_view(const void* ptr, std::size_t len, std::uint64_t offset, const MappedFile* map = nullptr,
                   std::uint64_t map_offset = 0);
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
  };
  void push(Job job);
  void loop();
  void rethrow_locked();

  AtomicOutput& out_;
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
