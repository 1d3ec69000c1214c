#include "writer.hpp"

#include <utility>

namespace xqcli {

namespace {
// At most two writes pending, or more while they are small (up to kSmallBytes in all, kMaxSmallJobs
// of them): tiny tensors then do not wait for the writer thread one by one.
constexpr std::size_t kMaxPending = 2;
constexpr std::size_t kSmallBytes = std::size_t{16} << 20;
constexpr std::size_t kMaxSmallJobs = 4096;
// The writer thread is woken for a job of at least this size, or when this much (or kWakeJobs jobs)
// is queued, or when the producer waits; small writes go in batches.
constexpr std::size_t kWakeBytes = std::size_t{1} << 20;
constexpr std::size_t kWakeJobs = 256;
}  // namespace

AsyncWriter::AsyncWriter(AtomicOutput& out)
    : AsyncWriter([&out](std::size_t, const void* data, std::size_t len, std::uint64_t offset) {
        out.write_at(data, len, offset);
      }) {}

AsyncWriter::AsyncWriter(WriteSink sink) : sink_(std::move(sink)), thread_([this] { loop(); }) {}

AsyncWriter::~AsyncWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::vector<std::byte> AsyncWriter::buffer() {
  std::lock_guard<std::mutex> lock(mu_);
  if (spare_.empty()) return {};
  std::vector<std::byte> b = std::move(spare_.back());
  spare_.pop_back();
  return b;
}

void AsyncWriter::rethrow_locked() {
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    stop_ = true;
    std::rethrow_exception(e);
  }
}

void AsyncWriter::push(Job job) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto has_room = [&] {
    const std::size_t pending = jobs_.size() + in_flight_;
    return pending < kMaxPending || (pending < kMaxSmallJobs && pending_bytes_ + job.len <= kSmallBytes) || error_;
  };
  if (!has_room()) {
    if (writer_idle_) cv_.notify_all();
    ++waiters_;
    cv_.wait(lock, has_room);
    --waiters_;
  }
  rethrow_locked();
  const std::size_t job_len = job.len;
  pending_bytes_ += job_len;
  jobs_.push_back(std::move(job));
  // Wake the writer only when it sleeps and there is enough to do (a futex call per tiny tensor costs
  // more than its work).
  if (writer_idle_ && (job_len >= kWakeBytes || pending_bytes_ >= kWakeBytes || jobs_.size() >= kWakeJobs))
    cv_.notify_all();
}

void AsyncWriter::submit(std::vector<std::byte> data, std::uint64_t offset, std::size_t file) {
  Job j;
  j.file = file;
  j.len = data.size();
  j.owned = std::move(data);
  j.offset = offset;
  push(std::move(j));
}

void AsyncWriter::submit_view(const void* ptr, std::size_t len, std::uint64_t offset, const MappedFile* map,
                              std::uint64_t map_offset, std::size_t file) {
  Job j;
  j.file = file;
  j.ptr = ptr;
  j.len = len;
  j.offset = offset;
  j.map = map;
  j.map_offset = map_offset;
  push(std::move(j));
}

void AsyncWriter::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (writer_idle_) cv_.notify_all();
  ++waiters_;
  cv_.wait(lock, [&] { return (jobs_.empty() && !busy_) || error_; });
  --waiters_;
  rethrow_locked();
}

void AsyncWriter::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::deque<Job> batch;
  for (;;) {
    writer_idle_ = true;
    cv_.wait(lock, [&] { return !jobs_.empty() || stop_; });
    writer_idle_ = false;
    if (stop_) return;  // finish() has emptied the queue on success; on failure the rest is dropped
    // Everything queued, in one go: one lock round trip per batch, not per (tiny) write. The batch
    // still counts as pending until it is written.
    batch.swap(jobs_);
    in_flight_ = batch.size();
    busy_ = true;
    lock.unlock();
    std::exception_ptr err;
    std::size_t bytes = 0;
    std::vector<std::vector<std::byte>> freed;
    for (Job& job : batch) {
      try {
        if (!err) {
          sink_(job.file, job.owned.empty() ? job.ptr : job.owned.data(), job.len, job.offset);
          if (job.map) job.map->release(job.map_offset, job.len);
        }
      } catch (...) {
        err = std::current_exception();
      }
      bytes += job.len;
      if (!job.owned.empty() && freed.size() < kMaxPending) freed.push_back(std::move(job.owned));
    }
    batch.clear();
    lock.lock();
    busy_ = false;
    in_flight_ = 0;
    pending_bytes_ -= bytes;
    if (err && !error_) error_ = err;
    if (err) {
      jobs_.clear();
      pending_bytes_ = 0;
    }
    for (auto& b : freed)
      if (spare_.size() < kMaxPending) spare_.push_back(std::move(b));
    if (waiters_ > 0) cv_.notify_all();
  }
}

}  // namespace xqcli
