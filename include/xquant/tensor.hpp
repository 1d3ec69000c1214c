// Tensor views (non-owning) and owning tensors. Tensors are dense and row-major (C-contiguous).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "xquant/device.hpp"
#include "xquant/dtype.hpp"

namespace xquant {

using Shape = std::vector<std::int64_t>;

// Number of elements of a shape (1 for a rank-0 shape). Throws Error if a dimension is negative or the
// product does not fit int64.
std::int64_t shape_numel(const Shape& shape);
// "[2, 3, 4]"
std::string shape_str(const Shape& shape);

// A writable, non-owning, dense row-major view.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  Shape shape;
  Device device{};  // where data lives (xquant/device.hpp)

  TensorView() = default;
  TensorView(void* d, DType dt, Shape s, Device dev = {}) : data(d), dtype(dt), shape(std::move(s)), device(dev) {}
  template <typename T>
  T* ptr() const noexcept {
    return static_cast<T*>(data);
  }
  std::int64_t numel() const { return shape_numel(shape); }
  std::int64_t dim() const noexcept { return static_cast<std::int64_t>(shape.size()); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
};

// A read-only, non-owning, dense row-major view. Every TensorView converts to it.
struct ConstTensorView {
  const void* data = nullptr;
  DType dtype = DType::float32;
  Shape shape;
  Device device{};

  ConstTensorView() = default;
  ConstTensorView(const void* d, DType dt, Shape s, Device dev = {})
      : data(d), dtype(dt), shape(std::move(s)), device(dev) {}
  ConstTensorView(const TensorView& v) : data(v.data), dtype(v.dtype), shape(v.shape), device(v.device) {}  // NOLINT
  template <typename T>
  const T* ptr() const noexcept {
    return static_cast<const T*>(data);
  }
  std::int64_t numel() const { return shape_numel(shape); }
  std::int64_t dim() const noexcept { return static_cast<std::int64_t>(shape.size()); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
};

// An owning, dense tensor, on the CPU or (Tensor(dtype, shape, Device::cuda(i))) in CUDA device memory,
// allocated and freed stream-ordered on the current CUDA stream (CudaStreamGuard). Host allocations of 2 MiB or more
// are aligned to 2 MiB and advised as transparent huge pages (madvise(MADV_HUGEPAGE)): fresh 4 KiB page faults cost
// ~100 ms per 400 MB. Smaller ones are 64-byte aligned. Contents are uninitialized unless created by zeros().
// Move-only.
class Tensor {
 public:
  Tensor() = default;                // empty: shape [0]
  Tensor(DType dtype, Shape shape);  // uninitialized contents
  Tensor(DType dtype, Shape shape, Device device);
  static Tensor zeros(DType dtype, Shape shape);
  // A copy of a view's data.
  static Tensor copy_of(const ConstTensorView& v);
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  std::int64_t numel() const noexcept { return numel_; }
  std::int64_t dim() const noexcept { return static_cast<std::int64_t>(shape_.size()); }
  std::size_t nbytes() const noexcept { return nbytes_; }
  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  template <typename T>
  T* data() noexcept {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const noexcept {
    return static_cast<const T*>(data_);
  }

  Device device() const noexcept { return device_; }
  TensorView view() noexcept { return {data_, dtype_, shape_, device_}; }
  ConstTensorView view() const noexcept { return {data_, dtype_, shape_, device_}; }
  operator TensorView() noexcept { return view(); }             // NOLINT
  operator ConstTensorView() const noexcept { return view(); }  // NOLINT

 private:
  void release() noexcept;
  void* data_ = nullptr;
  DType dtype_ = DType::float32;
  Shape shape_{0};  // a default-constructed tensor is empty: shape [0], no data
  std::int64_t numel_ = 0;
  std::size_t nbytes_ = 0;
  std::size_t mapped_bytes_ = 0;  // > 0 when data_ comes from mmap
  Device device_{};
  void* stream_ = nullptr;  // CUDA: the stream the memory was allocated on (and is freed on)
};

// A 2-D row-major tile with a row pitch (the physical row length in elements, >= cols), as the pypto
// tile operations see UB tiles: element (i, j) is at data[i * row_pitch + j].
struct TileView {
  void* data = nullptr;
  DType dtype = DType::float32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_pitch = 0;
  Device device{};
};

struct ConstTileView {
  const void* data = nullptr;
  DType dtype = DType::float32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_pitch = 0;
  Device device{};

  ConstTileView() = default;
  ConstTileView(const void* d, DType dt, std::int64_t r, std::int64_t c, std::int64_t pitch, Device dev = {})
      : data(d), dtype(dt), rows(r), cols(c), row_pitch(pitch), device(dev) {}
  ConstTileView(const TileView& t)  // NOLINT
      : data(t.data), dtype(t.dtype), rows(t.rows), cols(t.cols), row_pitch(t.row_pitch), device(t.device) {}
};

}  // namespace xquant
