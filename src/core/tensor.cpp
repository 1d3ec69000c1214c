#include "xquant/tensor.hpp"

#include <pthread.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>
#include <new>
#include <utility>

#include "core/device_ops.hpp"
#include "xquant/error.hpp"

namespace xquant {

std::int64_t shape_numel(const Shape& shape) {
  // A zero dimension anywhere makes the tensor empty, whatever the other dimensions are (as in NumPy).
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d < 0)
      throw Error(ErrorCode::shape_mismatch, "shape",
                  "xquant::shape_numel: shape " + shape_str(shape) + " has a negative dimension");
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (n > INT64_MAX / d)
      throw Error(ErrorCode::shape_mismatch, "shape",
                  "xquant::shape_numel: shape " + shape_str(shape) + " has more than 2^63 elements");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kSmallAlign = 64;

// Freed huge-page mappings are kept (up to a byte limit) and handed out again for allocations of the same
// rounded size: a fresh mapping costs a page fault and a kernel zero-fill per page on first touch (about
// as much as the operator itself), and training / inference loops allocate the same shapes every step.
class MappingCache {
 public:
  void* take(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second == bytes) {
        void* p = it->first;
        free_.erase(it);
        cached_ -= bytes;
        return p;
      }
    return nullptr;
  }
  // Keeps the mapping if it fits under the limit (evicting the oldest ones), else unmaps it.
  void give(void* p, std::size_t bytes) {
    std::vector<std::pair<void*, std::size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (bytes > limit_) {
        evicted.emplace_back(p, bytes);
      } else {
        while (cached_ + bytes > limit_ && !free_.empty()) {
          evicted.push_back(free_.front());
          cached_ -= free_.front().second;
          free_.erase(free_.begin());
        }
        free_.emplace_back(p, bytes);
        cached_ += bytes;
      }
    }
    for (auto& [q, n] : evicted) munmap(q, n);
  }
  void set_limit(std::size_t limit) {
    {
      std::lock_guard<std::mutex> lock(m_);
      limit_ = limit;
    }
    give_back_over_limit();
  }
  std::size_t limit() {
    std::lock_guard<std::mutex> lock(m_);
    return limit_;
  }
  // fork() handlers (see mapping_cache): the cache is held across fork, so the child never inherits it
  // locked by a thread that does not exist there.
  void lock() { m_.lock(); }
  void unlock() { m_.unlock(); }
  void give_back_over_limit() {
    std::vector<std::pair<void*, std::size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(m_);
      while (cached_ > limit_ && !free_.empty()) {
        evicted.push_back(free_.front());
        cached_ -= free_.front().second;
        free_.erase(free_.begin());
      }
    }
    for (auto& [q, n] : evicted) munmap(q, n);
  }

 private:
  std::mutex m_;
  std::vector<std::pair<void*, std::size_t>> free_;  // oldest first
  std::size_t cached_ = 0;
  std::size_t limit_ = std::size_t{2} << 30;  // 2 GiB
};

MappingCache* g_cache = nullptr;  // set once, by mapping_cache()
void lock_cache_for_fork() { g_cache->lock(); }
void unlock_cache_after_fork() { g_cache->unlock(); }  // in the parent, and in the child (the same thread)

// Never destroyed: tensors with static storage duration may be freed after any other static.
MappingCache& mapping_cache() {
  static MappingCache* cache = [] {
    g_cache = new MappingCache;
    // A fork() while another thread is inside take() / give() would copy the mutex locked into the child,
    // whose first large allocation would then wait forever: fork takes the lock first.
    pthread_atfork(&lock_cache_for_fork, &unlock_cache_after_fork, &unlock_cache_after_fork);
    return g_cache;
  }();
  return *cache;
}
// Built while the library loads (static initialization: one thread), not on the first large allocation: a
// fork() while another thread was inside that first call's one-time initialization would leave the child
// waiting on the initialization guard forever (seen under qemu-user, where the window is wide: the child's
// first large allocation hung after the first fork of Runtime.ForkWhileAnotherThreadAllocates).
[[maybe_unused]] MappingCache& g_cache_at_load = mapping_cache();

[[noreturn]] void throw_oom(std::size_t bytes, const Shape& shape) {
  throw Error(
      ErrorCode::out_of_memory, "shape",
      "xquant::Tensor: cannot allocate " + std::to_string(bytes) + " bytes for a tensor of shape " + shape_str(shape));
}
}  // namespace

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = shape_numel(shape_);
  const std::size_t esize = dtype_size(dtype_);
  if (static_cast<std::uint64_t>(numel_) > SIZE_MAX / esize) throw_oom(SIZE_MAX, shape_);
  nbytes_ = static_cast<std::size_t>(numel_) * esize;
  if (nbytes_ == 0) return;
  if (nbytes_ >= kHugePage) {
    // Map an extra huge page so that a 2 MiB aligned start exists, then trim both ends.
    const std::size_t rounded = (nbytes_ + kHugePage - 1) / kHugePage * kHugePage;
    if (void* cached = mapping_cache().take(rounded)) {
      data_ = cached;
      mapped_bytes_ = rounded;
      return;
    }
    const std::size_t total = rounded + kHugePage;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw_oom(nbytes_, shape_);
    // Keep the kHugePage-aligned `rounded` bytes inside the mapping; unmap the head before and the tail after.
    auto* const base = static_cast<char*>(p);
    const std::size_t head = (kHugePage - reinterpret_cast<std::uintptr_t>(base) % kHugePage) % kHugePage;
    char* const aligned = base + head;
    if (head > 0) munmap(base, head);
    const std::size_t tail = total - head - rounded;
    if (tail > 0) munmap(aligned + rounded, tail);
    data_ = aligned;
    mapped_bytes_ = rounded;
    madvise(data_, rounded, MADV_HUGEPAGE);  // advisory: failure (no THP) only costs speed
  } else {
    data_ = ::operator new (nbytes_, std::align_val_t{kSmallAlign}, std::nothrow);
    if (data_ == nullptr) throw_oom(nbytes_, shape_);
  }
}

Tensor::Tensor(DType dtype, Shape shape, Device device) : dtype_(dtype), shape_(std::move(shape)), device_(device) {
  if (!device.is_cuda()) {
    *this = Tensor(dtype, std::move(shape_));
    return;
  }
  numel_ = shape_numel(shape_);
  const std::size_t esize = dtype_size(dtype_);
  if (static_cast<std::uint64_t>(numel_) > SIZE_MAX / esize) throw_oom(SIZE_MAX, shape_);
  nbytes_ = static_cast<std::size_t>(numel_) * esize;
  if (nbytes_ == 0) return;
  stream_ = current_cuda_stream();
  data_ = detail::device_alloc(device_, nbytes_, stream_, "xquant::Tensor of shape " + shape_str(shape_));
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  if (t.nbytes_ > 0) std::memset(t.data_, 0, t.nbytes_);  // (a reused mapping is not zero)
  return t;
}

Tensor Tensor::copy_of(const ConstTensorView& v) {
  Tensor t(v.dtype, v.shape);
  if (t.nbytes_ > 0) std::memcpy(t.data_, v.data, t.nbytes_);
  return t;
}

void Tensor::release() noexcept {
  if (data_ != nullptr) {
    if (device_.is_cuda())
      detail::device_free(device_, data_, stream_);
    else if (mapped_bytes_ > 0)
      mapping_cache().give(data_, mapped_bytes_);
    else
      ::operator delete (data_, std::align_val_t{kSmallAlign});
  }
  data_ = nullptr;
  mapped_bytes_ = 0;
}

Tensor::~Tensor() { release(); }

Tensor::Tensor(Tensor&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      dtype_(o.dtype_),
      shape_(std::move(o.shape_)),
      numel_(std::exchange(o.numel_, 0)),
      nbytes_(std::exchange(o.nbytes_, 0)),
      mapped_bytes_(std::exchange(o.mapped_bytes_, 0)),
      device_(std::exchange(o.device_, Device{})),
      stream_(std::exchange(o.stream_, nullptr)) {
  o.shape_ = Shape{0};
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
    o.shape_ = Shape{0};
    numel_ = std::exchange(o.numel_, 0);
    nbytes_ = std::exchange(o.nbytes_, 0);
    mapped_bytes_ = std::exchange(o.mapped_bytes_, 0);
    device_ = std::exchange(o.device_, Device{});
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

void set_memory_cache_limit(std::size_t bytes) { mapping_cache().set_limit(bytes); }
std::size_t get_memory_cache_limit() { return mapping_cache().limit(); }

}  // namespace xquant
