#include "writer.hpp"

#include <utility>

namespace xqcli {

namespace {
constexpr std::size_t kMaxPending = 2;
}

AsyncWriter::AsyncWriter(AtomicOutput& out) : out_(out), thread_([this] { loop(); }) {}

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
  cv_.wait(lock, [&] { return jobs_.size() < kMaxPending || error_; });
  rethrow_locked();
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

void AsyncWriter::submit(std::vector<std::byte> data, std::uint64_t offset) {
  Job j;
  j.len = data.size();
  j.owned = std::move(data);
  j.offset = offset;
  push(std::move(j));
}

void AsyncWriter::submit_view(const void* ptr, std::size_t len, std::uint64_t offset, const MappedFile* map,
                              std::uint64_t map_offset) {
  Job j;
  j.ptr = ptr;
  j.len = len;
  j.offset = offset;
  j.map = map;
  j.map_offset = map_offset;
  push(std::move(j));
}

void AsyncWriter::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return (jobs_.empty() && !busy_) || error_; });
  rethrow_locked();
}

void AsyncWriter::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !jobs_.empty() || stop_; });
    if (stop_) return;  // finish() has emptied the queue on success; on failure the rest is dropped
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr err;
    try {
      out_.write_at(job.owned.empty() ? job.ptr : job.owned.data(), job.len, job.offset);
      if (job.map) job.map->release(job.map_offset, job.len);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (err && !error_) error_ = err;
    if (err) jobs_.clear();
    if (!job.owned.empty() && spare_.size() < kMaxPending) spare_.push_back(std::move(job.owned));
    cv_.notify_all();
  }
}

}  // namespace xqcli
