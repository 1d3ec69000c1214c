#include "xquant/tensor.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "xquant/error.hpp"

namespace xquant {

std::int64_t shape_numel(const Shape& shape) {
  // A zero dimension anywhere makes the tensor empty, whatever the other dimensions are (as in NumPy).
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error(ErrorCode::shape_mismatch, "shape", "xquant::shape_numel: shape " + shape_str(shape) + " has a negative dimension");
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (n > INT64_MAX / d)
      throw Error(ErrorCode::shape_mismatch, "shape", "xquant::shape_numel: shape " + shape_str(shape) + " has more than 2^63 elements");
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

[[noreturn]] void throw_oom(std::size_t bytes, const Shape& shape) {
  throw Error(ErrorCode::out_of_memory, "shape",
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
    const std::size_t total = rounded + kHugePage;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw_oom(nbytes_, shape_);
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > base) munmap(p, aligned - base);
    const std::uintptr_t end = base + total;
    if (end > aligned + rounded) munmap(reinterpret_cast<void*>(aligned + rounded), end - (aligned + rounded));
    data_ = reinterpret_cast<void*>(aligned);
    mapped_bytes_ = rounded;
    madvise(data_, rounded, MADV_HUGEPAGE);  // advisory: failure (no THP) only costs speed
  } else {
    data_ = ::operator new(nbytes_, std::align_val_t{kSmallAlign}, std::nothrow);
    if (data_ == nullptr) throw_oom(nbytes_, shape_);
  }
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  if (t.mapped_bytes_ == 0 && t.nbytes_ > 0) std::memset(t.data_, 0, t.nbytes_);  // mmap memory is already zero
  return t;
}

Tensor Tensor::copy_of(const ConstTensorView& v) {
  Tensor t(v.dtype, v.shape);
  if (t.nbytes_ > 0) std::memcpy(t.data_, v.data, t.nbytes_);
  return t;
}

void Tensor::release() noexcept {
  if (data_ != nullptr) {
    if (mapped_bytes_ > 0)
      munmap(data_, mapped_bytes_);
    else
      ::operator delete(data_, std::align_val_t{kSmallAlign});
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
      mapped_bytes_(std::exchange(o.mapped_bytes_, 0)) {
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
  }
  return *this;
}

}  // namespace xquant
