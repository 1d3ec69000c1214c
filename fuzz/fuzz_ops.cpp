// libFuzzer harness for every public operator of xquant (docs/testing.md, "Fuzzing and thread-safety
// checks").
//
// One input = one operator call. The first bytes choose the operator and its arguments (dtypes, small
// shapes, axes, num_bits, modes, optional tensors, aliasing between outputs and inputs, null data
// pointers), deliberately including invalid ones; the bytes left after the arguments are the tensors'
// contents (raw, so NaN / Inf / subnormals occur). Every tensor lives in its own exactly-sized heap buffer
// (AddressSanitizer catches any access past it); outputs start as a marker pattern.
//
// Then:
//   - the call runs on the reference backend. If it throws xquant::Error, every buffer (outputs, in-place
//     inputs) must still hold its original bytes, and the cpu backend must throw the same error;
//   - if it succeeds, bytes outside the outputs' element ranges (inputs, tile padding) must be unchanged,
//     and the cpu backend with 1 thread and with 3 threads (parallel split threshold lowered to 0, and
//     non-temporal stores forced for the 3-thread run) must produce the same bytes in every buffer and
//     the same returned tensors.
// Any other exception, any difference, or a sanitizer report is a crash.
//
// Only the public API is used (xquant/xquant.hpp, xquant/runtime.hpp), plus two test hooks of the cpu
// backend (xquant::detail::set_parallel_min_bytes / set_stream_min_bytes, src/cpu/parallel.hpp), declared
// weak here: if a refactor removes them, the harness still builds and runs, only without forced splits.
//
// The same code is compiled into tests/test_fuzz_regressions.cpp (with XQUANT_FUZZ_OPS_NO_ENTRY) to
// replay the inputs of fuzz/corpus/ops/regressions/ in the normal test suite.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xquant/runtime.hpp"
#include "xquant/xquant.hpp"

namespace xquant::detail {
// Test hooks of the cpu backend (src/core/runtime.cpp). Weak: null if the library no longer has them.
[[gnu::weak]] std::int64_t parallel_min_bytes();
[[gnu::weak]] void set_parallel_min_bytes(std::int64_t);
[[gnu::weak]] std::int64_t stream_min_bytes();
[[gnu::weak]] void set_stream_min_bytes(std::int64_t);
}  // namespace xquant::detail

namespace xquant_fuzz {

using xquant::ConstTensorView;
using xquant::ConstTileView;
using xquant::DType;
using xquant::QuantDType;
using xquant::Shape;
using xquant::Tensor;
using xquant::TensorView;
using xquant::TileView;

// Called with a description of a failed check before the harness aborts; the regression test installs
// one that throws, so a failure is reported as a test failure instead of killing the test program.
inline void (*g_on_failure)(const std::string&) = nullptr;

[[noreturn]] inline void fail(const std::string& what) {
  if (g_on_failure != nullptr) g_on_failure(what);
  std::fprintf(stderr, "fuzz_ops: CHECK FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline bool verbose() {
  static const bool v = std::getenv("XQUANT_FUZZ_VERBOSE") != nullptr;
  return v;
}

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::size_t kMaxViewBytes = std::size_t{1} << 16;     // normal cases: 64 KiB per tensor
constexpr std::size_t kMaxBigViewBytes = std::size_t{1} << 20;  // "big" cases (see kBigElements)
// A big case has at least this many elements in its main tensor: above the cpu kernels' 64 Ki-element
// grain, so that even the elementwise loops are split over the threads.
constexpr std::int64_t kBigElements = (std::int64_t{1} << 17) + 1001;

// ---- decoding ----

// Reads the argument bytes from the front of the input; past the end every byte reads as 0 (which
// decodes to a valid, default choice everywhere). The bytes after the arguments are the data pool.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : d_(data), n_(size) {}
  std::uint8_t byte() { return pos_ < n_ ? d_[pos_++] : 0; }
  std::size_t pos() const { return pos_; }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

// Fills buffers with the data pool (the bytes after the arguments), cycled; zeros if there are none.
class Pool {
 public:
  Pool(const std::uint8_t* data, std::size_t size) : d_(data), n_(size) {}
  // (Block copies, not byte loops: the harness's own loops are coverage-instrumented and slow.)
  void fill(std::uint8_t* out, std::size_t len) {
    if (len == 0) return;
    if (n_ == 0) {
      std::memset(out, 0, len);
      return;
    }
    while (len > 0) {
      const std::size_t k = std::min(len, n_ - pos_);
      std::memcpy(out, d_ + pos_, k);
      // Each pass over the pool after the first changes one byte, so long tensors are not purely periodic.
      if (pos_ == 0 && pass_ > 0) out[0] = static_cast<std::uint8_t>(out[0] + pass_ * 37u);
      out += k;
      len -= k;
      pos_ += k;
      if (pos_ == n_) {
        pos_ = 0;
        ++pass_;
      }
    }
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t pos_ = 0;
  unsigned pass_ = 0;
};

constexpr DType kFloatTypes[] = {DType::float32, DType::float16, DType::bfloat16};
constexpr int kNumDTypes = 7;  // DType::float32 .. DType::int64

// A floating dtype (any dtype, invalid for most arguments, for 1 byte value in 8).
DType float_dtype(Reader& r) {
  const std::uint8_t b = r.byte();
  if (b < 224) return kFloatTypes[b % 3];
  return static_cast<DType>(b % kNumDTypes);
}

// `dt` for most byte values, another dtype for the rest.
DType maybe_other_dtype(Reader& r, DType dt) {
  const std::uint8_t b = r.byte();
  return b < 240 ? dt : static_cast<DType>(b % kNumDTypes);
}

// A dimension: mostly 1..8; sometimes 0 or a length around a vector / unroll / chunk boundary; rarely
// negative or huge (only kept where the shape stays empty or invalid, see fit_shape).
std::int64_t dim(Reader& r) {
  static constexpr std::int64_t kSizes[32] = {0,   9,   15,  16,   17,   31,   32,   33,   63,   64,  65,
                                              2,   3,   4,   8,    12,   24,   48,   100,  127,  128, 129,
                                              255, 256, 257, 1000, 1023, 1024, 1025, 2047, 2048, 4097};
  static constexpr std::int64_t kWeird[16] = {-1,
                                              -2,
                                              kI64Min,
                                              kI64Max,
                                              std::int64_t{1} << 31,
                                              (std::int64_t{1} << 31) + 1,
                                              std::int64_t{1} << 32,
                                              std::int64_t{1} << 62,
                                              3037000500,
                                              3037000499,
                                              std::int64_t{1} << 40,
                                              (std::int64_t{1} << 32) - 1,
                                              std::int64_t{1} << 20,
                                              0,
                                              0,
                                              1};
  const std::uint8_t b = r.byte();
  if (b < 192) return 1 + b % 8;
  if (b < 240) return kSizes[b % 32];
  return kWeird[b % 16];
}

Shape decode_shape(Reader& r, int max_rank) {
  const std::uint8_t b = r.byte();
  const int rank = b < 250 ? b % (max_rank + 1) : 9 + b % 2;  // rarely beyond every operator's limit
  Shape s;
  for (int i = 0; i < rank; ++i) s.push_back(dim(r));
  return s;
}

// Element count of a valid shape (all dims >= 0, product fits int64), nullopt otherwise.
std::optional<std::int64_t> numel_of(const Shape& s) {
  bool empty = false;
  for (std::int64_t d : s) {
    if (d < 0) return std::nullopt;
    empty = empty || d == 0;
  }
  if (empty) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : s) {
    if (n > kI64Max / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// Shrinks a valid, non-empty shape until it fits in `max_bytes`: the harness must never describe more
// memory than it allocated (that would be a caller bug, not a library bug). Invalid shapes (negative
// dims, element count overflow) and empty ones are kept as they are: the library must reject or skip
// them without touching memory.
Shape fit_shape(Shape s, DType dt, std::size_t max_bytes) {
  const auto es = static_cast<std::int64_t>(xquant::dtype_size(dt));
  const auto limit = static_cast<std::int64_t>(max_bytes) / es;
  for (int round = 0;; ++round) {
    const auto n = numel_of(s);
    if (!n || *n <= limit) return s;
    for (auto& d : s) {
      if (round == 0 && d > 64)
        d = 1 + d % 64;
      else if (round == 1 && d > 8)
        d = 1 + d % 8;
      else if (round >= 2 && d > 1)
        d = 1;
    }
  }
}

// A shape, usually unchanged; otherwise one plausible mistake (a dimension off by one, missing, extra,
// zero, negative, or the rank-0 shape).
Shape maybe_corrupt_shape(Reader& r, Shape s) {
  const std::uint8_t b = r.byte();
  if (b < 232) return s;
  const std::size_t i = s.empty() ? 0 : (b / 8) % s.size();
  switch (b % 6) {
    case 0:
      s.push_back(1);
      break;
    case 1:
      if (!s.empty()) s.pop_back();
      break;
    case 2:
      if (s.empty())
        s.push_back(2);
      else if (s[i] < kI64Max)
        s[i] += 1;
      break;
    case 3:
      if (!s.empty())
        s[i] = 0;
      else
        s.push_back(0);
      break;
    case 4:
      s.clear();
      break;
    default:
      if (!s.empty())
        s[i] = -1;
      else
        s.push_back(-1);
      break;
  }
  return s;
}

// An axis: mostly in [-5, 5] (byte % 11: 0..5 -> 0..5, 6..10 -> -1..-5); rarely far out of range.
std::int64_t small_axis(Reader& r) {
  static constexpr std::int64_t kWeird[8] = {kI64Min, kI64Max, -100, 100, -9, 9, kI64Min + 1, 1 << 30};
  const std::uint8_t b = r.byte();
  if (b >= 240) return kWeird[b % 8];
  const int v = b % 11;
  return v <= 5 ? v : 5 - v;
}

// num_bits: mostly in [lo, hi]; rarely just outside or absurd.
int num_bits(Reader& r, int lo, int hi) {
  const std::uint8_t b = r.byte();
  if (b < 224) return lo + b % (hi - lo + 1);
  const int weird[8] = {lo - 1, hi + 1, 0, -1, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                        64,     33};
  return weird[b % 8];
}

// ---- tensor values that make valid calls likely (applied to the raw bytes after filling) ----

// amax: clear the sign, and turn Inf / NaN into finite values.
void make_nonneg_finite(DType dt, std::uint8_t* p, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (dt == DType::float32) {
      std::uint32_t u;
      std::memcpy(&u, p + 4 * i, 4);
      u &= 0x7fffffffu;
      if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x40000000u;
      std::memcpy(p + 4 * i, &u, 4);
    } else if (dt == DType::float16 || dt == DType::bfloat16) {
      std::uint16_t u;
      std::memcpy(&u, p + 2 * i, 2);
      u = static_cast<std::uint16_t>(u & 0x7fffu);
      const std::uint16_t exp = dt == DType::float16 ? 0x7c00u : 0x7f80u;
      if ((u & exp) == exp) u = static_cast<std::uint16_t>(u & ~0x4000u);
      std::memcpy(p + 2 * i, &u, 2);
    }
  }
}

// Masks of acts_ulq_backward: 0 or 1 (bit 0 of each element's first byte).
void make_zero_one(DType dt, std::uint8_t* p, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const auto es = static_cast<std::int64_t>(xquant::dtype_size(dt));
    const bool one = (p[es * i] & 1) != 0;
    if (dt == DType::float32) {
      const std::uint32_t u = one ? 0x3f800000u : 0u;
      std::memcpy(p + 4 * i, &u, 4);
    } else if (dt == DType::float16 || dt == DType::bfloat16) {
      const std::uint16_t u = one ? (dt == DType::float16 ? 0x3c00u : 0x3f80u) : 0u;
      std::memcpy(p + 2 * i, &u, 2);
    }
  }
}

// group_index: non-decreasing row ends in [0, rows], the last one == rows.
void make_group_ends(DType dt, std::uint8_t* p, std::int64_t n, std::int64_t rows) {
  if (dt != DType::int32 && dt != DType::int64) return;
  std::int64_t prev = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t v = rows;
    if (i + 1 < n) {
      const std::int64_t room = rows - prev < kI64Max ? rows - prev + 1 : kI64Max;
      v = prev +
          (room > 0 ? static_cast<std::int64_t>(p[xquant::dtype_size(dt) * static_cast<std::size_t>(i)]) % room : 0);
    }
    prev = v;
    if (dt == DType::int32) {
      const auto w = static_cast<std::int32_t>(v);
      std::memcpy(p + 4 * i, &w, 4);
    } else {
      std::memcpy(p + 8 * i, &v, 8);
    }
  }
}

// ---- the case: views over buffers, and the call ----

enum class Role { in, out, inout };

struct ViewSpec {
  std::string name;
  Role role = Role::in;
  DType dtype = DType::float32;
  bool tile = false;
  Shape shape;                                 // tensor views
  std::int64_t rows = 0, cols = 0, pitch = 0;  // tile views
  bool null_data = false;
  int buffer = -1;
  std::size_t offset = 0;                                      // bytes into the buffer
  std::function<void(std::uint8_t*, std::int64_t)> post_fill;  // applied to the view's elements
};

// Bytes a view spans (0 for empty or invalid views).
std::size_t view_bytes(const ViewSpec& v) {
  const auto es = xquant::dtype_size(v.dtype);
  if (!v.tile) {
    const auto n = numel_of(v.shape);
    return n ? static_cast<std::size_t>(*n) * es : 0;
  }
  if (v.rows <= 0 || v.cols <= 0 || v.pitch < 0) return 0;
  return static_cast<std::size_t>(v.rows) * static_cast<std::size_t>(std::max(v.pitch, v.cols)) * es;
}

std::int64_t view_numel(const ViewSpec& v) {
  if (!v.tile) return numel_of(v.shape).value_or(0);
  return v.rows > 0 && v.cols > 0 ? v.rows * v.cols : 0;
}

// What the call sees: the views, materialized over the buffers of one run.
class Ctx {
 public:
  Ctx(const std::vector<ViewSpec>& views, std::vector<std::uint8_t*> ptrs) : views_(views), ptrs_(std::move(ptrs)) {}
  TensorView tv(int i) const {
    const auto& v = views_[static_cast<std::size_t>(i)];
    return TensorView(ptrs_[static_cast<std::size_t>(i)], v.dtype, v.shape);
  }
  ConstTensorView cv(int i) const { return tv(i); }
  TileView tile(int i) const {
    const auto& v = views_[static_cast<std::size_t>(i)];
    return TileView{ptrs_[static_cast<std::size_t>(i)], v.dtype, v.rows, v.cols, v.pitch};
  }
  ConstTileView ctile(int i) const { return tile(i); }

 private:
  const std::vector<ViewSpec>& views_;
  std::vector<std::uint8_t*> ptrs_;
};

struct Case {
  std::string op;
  std::vector<ViewSpec> views;
  std::function<std::vector<Tensor>(const Ctx&)> call;  // returns the allocating forms' results
  std::size_t max_view_bytes = kMaxViewBytes;
  std::string args;  // scalar arguments, for the verbose description

  int add(ViewSpec v) {
    if (!v.tile) v.shape = fit_shape(std::move(v.shape), v.dtype, max_view_bytes);
    views.push_back(std::move(v));
    return static_cast<int>(views.size()) - 1;
  }
  int in(std::string name, DType dt, Shape s) {
    ViewSpec v;
    v.name = std::move(name);
    v.dtype = dt;
    v.shape = std::move(s);
    return add(std::move(v));
  }
  int out(std::string name, DType dt, Shape s) {
    ViewSpec v;
    v.name = std::move(name);
    v.role = Role::out;
    v.dtype = dt;
    v.shape = std::move(s);
    return add(std::move(v));
  }
};

// ---- buffer layout and one execution ----

struct Layout {
  std::vector<std::size_t> sizes;                                          // bytes per buffer
  std::vector<std::vector<std::uint8_t>> init;                             // initial contents
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> writable;  // [begin, end) outputs may write
};

std::uint8_t marker(std::size_t i) { return static_cast<std::uint8_t>(0x5A + 37 * i); }

struct Outcome {
  bool threw = false;
  xquant::ErrorCode code{};
  std::string message;
  std::string argument;
  std::vector<std::vector<std::uint8_t>> buffers;
  std::vector<Tensor> results;
};

Outcome execute(const Case& c, const Layout& L, std::size_t lead) {
  // Exactly-sized heap blocks (plus the case's lead bytes, a multiple of 8 that moves every view's
  // alignment), so AddressSanitizer reports any access past the end.
  std::vector<std::unique_ptr<std::uint8_t[]>> mem;
  for (std::size_t b = 0; b < L.sizes.size(); ++b) {
    mem.emplace_back(new std::uint8_t[lead + L.sizes[b]]);
    std::memset(mem.back().get(), 0xEE, lead);
    if (L.sizes[b] > 0) std::memcpy(mem.back().get() + lead, L.init[b].data(), L.sizes[b]);
  }
  std::vector<std::uint8_t*> ptrs;
  for (const auto& v : c.views)
    ptrs.push_back(v.null_data ? nullptr : mem[static_cast<std::size_t>(v.buffer)].get() + lead + v.offset);
  Outcome o;
  try {
    o.results = c.call(Ctx(c.views, ptrs));
  } catch (const xquant::Error& e) {
    o.threw = true;
    o.code = e.code();
    o.message = e.what();
    o.argument = e.argument();
  }
  for (std::size_t b = 0; b < L.sizes.size(); ++b) {
    for (std::size_t i = 0; i < lead; ++i)
      if (mem[b][i] != 0xEE) fail(c.op + ": a byte before buffer " + std::to_string(b) + " was written");
    o.buffers.emplace_back(mem[b].get() + lead, mem[b].get() + lead + L.sizes[b]);
  }
  return o;
}

// Gives each view a buffer: its own, or (per its layout byte) a place inside an earlier view's buffer
// (aliasing), or a null data pointer.
Layout layout_views(Reader& r, Case& c) {
  Layout L;
  for (std::size_t i = 0; i < c.views.size(); ++i) {
    ViewSpec& v = c.views[i];
    const std::uint8_t b = r.byte();
    const std::size_t bytes = view_bytes(v);
    if (b >= 216 && b < 224) v.null_data = true;
    if (b >= 224 && i > 0) {
      // Alias: start 0..3 elements into the buffer of an earlier view (naturally aligned for its dtype:
      // a misaligned typed pointer would be the caller's bug, not the library's).
      const ViewSpec& host = c.views[(b - 224u) % i];
      if (host.buffer >= 0) {
        const std::size_t es = xquant::dtype_size(v.dtype);
        v.buffer = host.buffer;
        v.offset = (host.offset + es - 1) / es * es + ((b >> 3) & 3u) * es;
        auto& size = L.sizes[static_cast<std::size_t>(v.buffer)];
        size = std::max(size, v.offset + bytes);
        continue;
      }
    }
    v.buffer = static_cast<int>(L.sizes.size());
    v.offset = 0;
    L.sizes.push_back(bytes);
  }
  return L;
}

// Fills inputs from the pool (then their post_fill), outputs with the marker; marks what outputs may write.
void fill_layout(Layout& L, const Case& c, Pool& pool) {
  // Buffers hosting an input (or in-place) view get pool data, pure output buffers the marker.
  std::vector<bool> has_input(L.sizes.size(), false);
  for (const auto& v : c.views)
    if (v.role != Role::out && !v.null_data) has_input[static_cast<std::size_t>(v.buffer)] = true;
  L.init.resize(L.sizes.size());
  L.writable.resize(L.sizes.size());
  static std::vector<std::uint8_t> markers;  // grows once; a byte loop per call would be slow
  for (std::size_t b = 0; b < L.sizes.size(); ++b) {
    L.init[b].resize(L.sizes[b]);
    if (has_input[b]) {
      pool.fill(L.init[b].data(), L.sizes[b]);
    } else {
      for (std::size_t i = markers.size(); i < L.sizes[b]; ++i) markers.push_back(marker(i));
      if (L.sizes[b] > 0) std::memcpy(L.init[b].data(), markers.data(), L.sizes[b]);
    }
  }
  for (const auto& v : c.views) {
    if (v.null_data) continue;
    const auto b = static_cast<std::size_t>(v.buffer);
    const auto es = xquant::dtype_size(v.dtype);
    if (v.post_fill && v.role != Role::out && !v.tile && view_bytes(v) > 0)
      v.post_fill(L.init[b].data() + v.offset, view_numel(v));
    if (v.role == Role::in) continue;
    // The bytes this output may write: its elements (for a tile, only the valid region of each row).
    const std::size_t bytes = view_bytes(v);
    if (!v.tile) {
      if (bytes > 0) L.writable[b].emplace_back(v.offset, v.offset + bytes);
    } else if (bytes > 0) {
      const std::size_t row_bytes = static_cast<std::size_t>(std::max(v.pitch, v.cols)) * es;
      for (std::int64_t row = 0; row < v.rows; ++row) {
        const std::size_t begin = v.offset + static_cast<std::size_t>(row) * row_bytes;
        L.writable[b].emplace_back(begin, begin + static_cast<std::size_t>(v.cols) * es);
      }
    }
  }
}

// ---- the operators ----

using xquant::FakeQuantOptions;

FakeQuantOptions fq_options(Reader& r) {
  FakeQuantOptions o;
  o.num_bits = num_bits(r, 1, 32);
  const std::uint8_t f = r.byte();
  o.is_unsigned = (f & 1) != 0;
  o.narrow_range = (f & 2) == 0;
  return o;
}

std::string fq_str(const FakeQuantOptions& o) {
  return "num_bits=" + std::to_string(o.num_bits) + " is_unsigned=" + std::to_string(o.is_unsigned) +
         " narrow_range=" + std::to_string(o.narrow_range);
}

// The main shape of a case; `big` scales its first dimension up past kBigElements.
Shape main_shape(Reader& r, Case& c, int max_rank, DType dt, bool big) {
  Shape s = fit_shape(decode_shape(r, max_rank), dt, c.max_view_bytes);
  if (big) {
    c.max_view_bytes = kMaxBigViewBytes;
    const auto n = numel_of(s);
    if (s.empty()) s.push_back(1);
    if (n && *n > 0 && *n < kBigElements) s[0] *= (kBigElements + *n - 1) / *n;
    s = fit_shape(std::move(s), dt, c.max_view_bytes);
  }
  return s;
}

// fake_tensor_quant (_out / _inplace / _with_axis_out / _backward_out and the allocating forms).
// kind 0: per-tensor out, 1: in place, 2: per-axis out, 3: backward.
void build_fake_quant(Reader& r, Case& c, int kind, bool alloc, bool big) {
  const DType dt = float_dtype(r);
  const Shape shape = main_shape(r, c, 4, dt, big);
  const std::uint8_t form = r.byte();
  std::optional<std::int64_t> axis;
  if (kind == 2 || (kind == 3 && (form & 1))) axis = small_axis(r);
  const DType amax_dt = float_dtype(r);
  Shape amax_shape;
  if (!axis) {
    static const Shape kPerTensor[8] = {{1}, {1}, {1}, {}, {1, 1}, {2}, {0}, {1, 1, 1}};
    amax_shape = kPerTensor[(form >> 1) % 8];
  } else {
    const auto rank = static_cast<std::int64_t>(shape.size());
    const bool valid = *axis >= -rank && *axis < rank;
    amax_shape = {valid ? shape[static_cast<std::size_t>(*axis < 0 ? *axis + rank : *axis)] : 1};
  }
  amax_shape = maybe_corrupt_shape(r, amax_shape);
  const bool sane_amax = r.byte() < 208;
  const FakeQuantOptions o = fq_options(r);
  c.args = fq_str(o) + (axis ? " axis=" + std::to_string(*axis) : std::string(" per-tensor"));

  const int x = c.in(kind == 1 ? "inputs(inplace)" : "inputs", dt, shape);
  if (kind == 1) c.views[static_cast<std::size_t>(x)].role = Role::inout;
  const int a = c.in("amax", amax_dt, amax_shape);
  if (sane_amax)
    c.views[static_cast<std::size_t>(a)].post_fill = [amax_dt](std::uint8_t* p, std::int64_t n) {
      make_nonneg_finite(amax_dt, p, n);
    };
  if (kind <= 2) {
    c.op = kind == 0 ? "fake_tensor_quant" : kind == 1 ? "fake_tensor_quant_inplace" : "fake_tensor_quant_with_axis";
    if (kind == 1) {
      c.call = [=](const Ctx& k) {
        xquant::fake_tensor_quant_inplace(k.tv(x), k.cv(a), o);
        return std::vector<Tensor>{};
      };
      return;
    }
    if (alloc) {
      c.op += "(alloc)";
      c.call = [=](const Ctx& k) {
        std::vector<Tensor> res;
        if (axis)
          res.push_back(xquant::fake_tensor_quant_with_axis(k.cv(x), k.cv(a), *axis, o));
        else
          res.push_back(xquant::fake_tensor_quant(k.cv(x), k.cv(a), o));
        return res;
      };
      return;
    }
    const int y = c.out("out", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, shape));
    c.call = [=](const Ctx& k) {
      if (axis)
        xquant::fake_tensor_quant_with_axis_out(k.tv(y), k.cv(x), k.cv(a), *axis, o);
      else
        xquant::fake_tensor_quant_out(k.tv(y), k.cv(x), k.cv(a), o);
      return std::vector<Tensor>{};
    };
    return;
  }
  c.op = "fake_tensor_quant_backward";
  const int g = c.in("grad_out", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, shape));
  const bool want_grad_amax = (form & 0x80) == 0;
  if (alloc) {
    c.op += "(alloc)";
    c.call = [=](const Ctx& k) {
      auto grads = xquant::fake_tensor_quant_backward(k.cv(g), k.cv(x), k.cv(a), axis, o, want_grad_amax);
      std::vector<Tensor> res;
      res.push_back(std::move(grads.grad_inputs));
      res.push_back(std::move(grads.grad_amax));
      return res;
    };
    return;
  }
  const int gi = c.out("grad_inputs", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, shape));
  int ga = -1;
  if (want_grad_amax) ga = c.out("grad_amax", maybe_other_dtype(r, amax_dt), maybe_corrupt_shape(r, amax_shape));
  c.call = [=](const Ctx& k) {
    std::optional<TensorView> gav;
    if (ga >= 0) gav = k.tv(ga);
    xquant::fake_tensor_quant_backward_out(k.tv(gi), gav, k.cv(g), k.cv(x), k.cv(a), axis, o);
    return std::vector<Tensor>{};
  };
}

std::string qdt_str(QuantDType q) {
  return static_cast<int>(q) < 4 ? std::string(xquant::quant_dtype_name(q))
                                 : "QuantDType(" + std::to_string(static_cast<int>(q)) + ")";
}

void build_quantize(Reader& r, Case& c, bool alloc, bool big) {
  c.op = "quantize";
  const DType dt = float_dtype(r);
  const Shape shape = main_shape(r, c, 4, dt, big);
  const std::uint8_t qb = r.byte();
  const auto q = static_cast<QuantDType>(qb < 248 ? qb % 4 : qb);  // rarely not a QuantDType at all
  const std::uint8_t flags = r.byte();
  const bool div_mode = (flags & 1) == 0;
  const bool with_zp = (flags & 2) != 0;
  const std::int64_t axis = small_axis(r);
  const DType scales_dt = float_dtype(r);
  // The channel axis as the operator will pick it (for a plausible scales shape).
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::int64_t ax = -1;
  if (div_mode) {
    if (axis >= -rank && axis < rank) ax = axis < 0 ? axis + rank : axis;
  } else if (rank >= 2 && axis == -2) {
    ax = rank - 2;
  } else if (rank >= 1 && axis > -2 && axis < rank) {
    ax = rank - 1;
  }
  Shape scales_shape;
  const std::int64_t channels = ax >= 0 ? shape[static_cast<std::size_t>(ax)] : 1;
  switch (r.byte() % 6) {
    case 0:
      scales_shape = {1};
      break;
    case 1:
      scales_shape = {channels};
      break;
    case 2:
      scales_shape.assign(shape.size(), 1);
      if (ax >= 0) scales_shape[static_cast<std::size_t>(ax)] = channels;
      break;
    case 3:
      scales_shape = {};
      break;
    case 4:
      scales_shape = {0};
      break;
    default:
      scales_shape = decode_shape(r, 2);
      break;
  }
  scales_shape = maybe_corrupt_shape(r, scales_shape);
  static constexpr DType kZpTypes[6] = {DType::int8,    DType::uint8,   DType::int32,
                                        DType::float32, DType::float16, DType::bfloat16};
  const std::uint8_t zb = r.byte();
  DType zp_dt = kZpTypes[zb % 6];
  if (!div_mode && zb < 240) zp_dt = scales_dt;
  const Shape zp_shape = maybe_corrupt_shape(r, scales_shape);
  c.args = "dtype=" + qdt_str(q) + " axis=" + std::to_string(axis) + " div_mode=" + std::to_string(div_mode);

  const int x = c.in("input", dt, shape);
  const int s = c.in("scales", scales_dt, scales_shape);
  const int z = with_zp ? c.in("zero_points", zp_dt, zp_shape) : -1;
  if (alloc) {
    c.op += "(alloc)";
    c.call = [=](const Ctx& k) {
      std::optional<ConstTensorView> zp;
      if (z >= 0) zp = k.cv(z);
      std::vector<Tensor> res;
      res.push_back(xquant::quantize(k.cv(x), k.cv(s), zp, q, axis, div_mode));
      return res;
    };
    return;
  }
  Shape out_shape = shape;
  DType out_dt = DType::int8;
  if (static_cast<int>(q) < 4) {
    out_dt = xquant::storage_dtype(q);
    try {
      out_shape = xquant::quantize_output_shape(shape, q);
    } catch (const xquant::Error&) {
    }
  }
  const int y = c.out("out", maybe_other_dtype(r, out_dt), maybe_corrupt_shape(r, out_shape));
  c.call = [=](const Ctx& k) {
    std::optional<ConstTensorView> zp;
    if (z >= 0) zp = k.cv(z);
    xquant::quantize_out(k.tv(y), k.cv(x), k.cv(s), zp, q, axis, div_mode);
    return std::vector<Tensor>{};
  };
}

// Tile sizes: mostly 0..19; sometimes around the vector boundaries; rarely negative or huge.
std::int64_t tile_dim(Reader& r) {
  static constexpr std::int64_t kWeird[8] = {-1, kI64Max, std::int64_t{1} << 40, kI64Min, 3037000500, -7, 0, 1};
  const std::uint8_t b = r.byte();
  if (b < 192) return b % 20;
  if (b < 248) return 20 + (b - 192) * 3;  // 20 .. 185
  return kWeird[b % 8];
}

ViewSpec tile_spec(std::string name, Role role, DType dt, std::int64_t rows, std::int64_t cols, std::int64_t pitch) {
  ViewSpec v;
  v.name = std::move(name);
  v.role = role;
  v.dtype = dt;
  v.tile = true;
  v.rows = rows;
  v.cols = cols;
  v.pitch = pitch;
  // Never describe more memory than is allocated: a valid tile larger than the limit is shrunk.
  if (rows > 0 && cols > 0 && pitch >= 0) {
    const auto es = static_cast<std::int64_t>(xquant::dtype_size(dt));
    const std::int64_t lim = static_cast<std::int64_t>(kMaxBigViewBytes) / es;
    if (v.rows > 4096) v.rows = 1 + v.rows % 4096;
    if (v.cols > 4096) v.cols = 1 + v.cols % 4096;
    if (v.pitch > 8192) v.pitch = v.cols + v.pitch % 8;
    if (v.rows * std::max(v.pitch, v.cols) > lim) v.rows = std::max<std::int64_t>(1, lim / std::max(v.pitch, v.cols));
  }
  return v;
}

std::int64_t pitch_for(Reader& r, std::int64_t cols) {
  const std::uint8_t b = r.byte();
  if (b < 240) return cols <= kI64Max - 4 ? cols + b % 5 : cols;
  const std::int64_t weird[4] = {cols > kI64Min ? cols - 1 : cols, -1, 0, kI64Max};
  return weird[b % 4];
}

void build_tile_quant(Reader& r, Case& c, bool alloc, bool big) {
  c.op = "tile_quant";
  std::int64_t rows = tile_dim(r), cols = tile_dim(r);
  if (big && rows > 0 && cols > 0 && rows <= 4096 && cols <= 4096 && rows * cols < kBigElements)
    rows = (kBigElements + cols - 1) / cols;
  const std::int64_t pitch = pitch_for(r, cols);
  const std::uint8_t flags = r.byte();
  const auto mode = (flags & 1) ? xquant::QuantMode::ASYM : xquant::QuantMode::SYM;
  const bool offset_given = ((flags >> 1) & 1) ^ (mode == xquant::QuantMode::ASYM);  // usually as required
  const std::int64_t srows = (flags & 4) && rows < kI64Max ? rows + 1 : rows;
  const std::int64_t scols = (flags & 8) ? ((flags & 16) ? 2 : 0) : 1;
  const std::int64_t spitch = pitch_for(r, scols);
  const std::int64_t opitch = (flags & 32) ? pitch_for(r, scols) : spitch;
  const DType src_dt = maybe_other_dtype(r, DType::float32);
  const DType sc_dt = maybe_other_dtype(r, DType::float32);
  c.args = std::string("mode=") + (mode == xquant::QuantMode::SYM ? "SYM" : "ASYM");
  const int s = c.add(tile_spec("src", Role::in, src_dt, rows, cols, pitch));
  const int sc = c.add(tile_spec("scale", Role::in, sc_dt, srows, scols, spitch));
  const int of = offset_given ? c.add(tile_spec("offset", Role::in, sc_dt, srows, scols, opitch)) : -1;
  if (alloc) {
    c.op += "(alloc)";
    c.call = [=](const Ctx& k) {
      std::optional<ConstTileView> off;
      if (of >= 0) off = k.ctile(of);
      std::vector<Tensor> res;
      res.push_back(xquant::tile_quant(k.ctile(s), k.ctile(sc), mode, off));
      return res;
    };
    return;
  }
  const DType out_dt = maybe_other_dtype(r, mode == xquant::QuantMode::SYM ? DType::int8 : DType::uint8);
  const std::uint8_t ob = r.byte();
  const std::int64_t orows = ob < 240 ? c.views[static_cast<std::size_t>(s)].rows : tile_dim(r);
  const std::int64_t ocols = ob < 240 ? c.views[static_cast<std::size_t>(s)].cols : tile_dim(r);
  const int y = c.add(tile_spec("out", Role::out, out_dt, orows, ocols, pitch_for(r, ocols)));
  c.call = [=](const Ctx& k) {
    std::optional<ConstTileView> off;
    if (of >= 0) off = k.ctile(of);
    xquant::tile_quant(k.tile(y), k.ctile(s), k.ctile(sc), mode, off);
    return std::vector<Tensor>{};
  };
}

void build_dynamic_quant(Reader& r, Case& c, bool alloc, bool big) {
  c.op = "dynamic_quant_asymmetric";
  const DType dt = float_dtype(r);
  const std::uint8_t flags = r.byte();
  Shape shape = decode_shape(r, 4);
  if ((flags & 16) && !shape.empty() && shape.back() > 0) shape.back() = (shape.back() + 7) / 8 * 8;
  shape = fit_shape(std::move(shape), dt, c.max_view_bytes);
  if (big) {
    c.max_view_bytes = kMaxBigViewBytes;
    const auto n = numel_of(shape);
    if (shape.size() >= 2 && n && *n > 0 && *n < kBigElements) shape[0] *= (kBigElements + *n - 1) / *n;
    shape = fit_shape(std::move(shape), dt, c.max_view_bytes);
  }
  // scale / offset have x.shape[:-1], which is not empty when only the last dimension is 0: keep it
  // within the memory limit too (the allocating form would otherwise legitimately write terabytes).
  if (shape.size() >= 2) {
    Shape lead = fit_shape(Shape(shape.begin(), shape.end() - 1), DType::float32, c.max_view_bytes);
    lead.push_back(shape.back());
    shape = std::move(lead);
  }
  const std::uint8_t qb = r.byte();
  const QuantDType dst =
      qb < 248 ? ((flags & 1) ? QuantDType::quint4x2 : QuantDType::qint8) : static_cast<QuantDType>(qb % 8);
  const std::uint8_t mb = r.byte();
  const auto mode = mb < 248 ? ((flags & 2) ? xquant::DynamicQuantMode::pertensor : xquant::DynamicQuantMode::pertoken)
                             : static_cast<xquant::DynamicQuantMode>(mb);
  const bool with_smooth = (flags & 4) != 0;
  const bool with_group = (flags & 8) != 0;
  const std::int64_t H = shape.empty() ? 1 : shape.back();
  // S: rows of x (-1 when not representable; group_index is then invalid anyway).
  const std::int64_t S = shape.empty() ? 1 : numel_of(Shape(shape.begin(), shape.end() - 1)).value_or(-1);
  const std::int64_t E = 1 + r.byte() % 4;
  const DType smooth_dt = float_dtype(r);
  const Shape smooth_shape = maybe_corrupt_shape(r, with_group ? Shape{E, H} : Shape{H});
  const DType group_dt = (flags & 32) ? DType::int64 : maybe_other_dtype(r, DType::int32);
  const Shape group_shape = maybe_corrupt_shape(r, Shape{E});
  const bool sane_group = (flags & 64) == 0;
  c.args = "dst_type=" + qdt_str(dst) + " mode=" + std::to_string(static_cast<int>(mode));

  const int x = c.in("x", dt, shape);
  const int sm = with_smooth ? c.in("smooth_scales", smooth_dt, smooth_shape) : -1;
  const int gi = with_group ? c.in("group_index", group_dt, group_shape) : -1;
  if (gi >= 0 && sane_group)
    c.views[static_cast<std::size_t>(gi)].post_fill = [group_dt, S](std::uint8_t* p, std::int64_t n) {
      make_group_ends(group_dt, p, n, S);
    };
  if (alloc) {
    c.op += "(alloc)";
    c.call = [=](const Ctx& k) {
      std::optional<ConstTensorView> smv, giv;
      if (sm >= 0) smv = k.cv(sm);
      if (gi >= 0) giv = k.cv(gi);
      auto res = xquant::dynamic_quant_asymmetric(k.cv(x), smv, giv, dst, mode);
      std::vector<Tensor> v;
      v.push_back(std::move(res.y));
      v.push_back(std::move(res.scale));
      v.push_back(std::move(res.offset));
      return v;
    };
    return;
  }
  Shape y_shape = shape;
  if (dst == QuantDType::quint4x2 && !y_shape.empty()) y_shape.back() /= 8;
  const Shape param_shape =
      mode == xquant::DynamicQuantMode::pertensor || shape.empty() ? Shape{1} : Shape(shape.begin(), shape.end() - 1);
  const int y = c.out("y", maybe_other_dtype(r, dst == QuantDType::quint4x2 ? DType::int32 : DType::int8),
                      maybe_corrupt_shape(r, y_shape));
  const int sc = c.out("scale", maybe_other_dtype(r, DType::float32), maybe_corrupt_shape(r, param_shape));
  const int of = c.out("offset", maybe_other_dtype(r, DType::float32), maybe_corrupt_shape(r, param_shape));
  c.call = [=](const Ctx& k) {
    std::optional<ConstTensorView> smv, giv;
    if (sm >= 0) smv = k.cv(sm);
    if (gi >= 0) giv = k.cv(gi);
    xquant::dynamic_quant_asymmetric_out(k.tv(y), k.tv(sc), k.tv(of), k.cv(x), smv, giv, dst, mode);
    return std::vector<Tensor>{};
  };
}

// A shape that broadcasts against `base` (usually): base itself, a scalar, base with some dims set to 1
// and some leading dims dropped, or something unrelated.
Shape derive_broadcast(Reader& r, const Shape& base) {
  const std::uint8_t b = r.byte();
  switch (b % 5) {
    case 0:
      return base;
    case 1:
      return (b & 8) ? Shape{} : Shape{1};
    case 2:
    case 3: {
      const std::uint8_t ones = r.byte();
      const std::size_t drop = base.empty() ? 0 : (b >> 4) % (base.size() + 1);
      Shape s(base.begin() + static_cast<std::ptrdiff_t>(drop), base.end());
      for (std::size_t i = 0; i < s.size(); ++i)
        if (ones & (1u << (i % 8))) s[i] = 1;
      return s;
    }
    default:
      return decode_shape(r, 4);
  }
}

void build_acts_ulq(Reader& r, Case& c, bool backward, bool alloc, bool big) {
  c.op = backward ? "acts_ulq_backward" : "acts_ulq";
  const DType dt = float_dtype(r);
  const Shape base = main_shape(r, c, 5, dt, big);
  const Shape xs = fit_shape(derive_broadcast(r, base), dt, c.max_view_bytes);
  const Shape mins = fit_shape(derive_broadcast(r, base), dt, c.max_view_bytes);
  const Shape maxs = fit_shape(derive_broadcast(r, base), dt, c.max_view_bytes);
  const std::uint8_t flags = r.byte();
  const bool fixed_min = (flags & 1) != 0;
  const int nb = num_bits(r, 2, 16);
  const DType min_dt = maybe_other_dtype(r, dt), max_dt = maybe_other_dtype(r, dt);
  Shape out = base;
  try {
    out = xquant::acts_ulq_output_shape(xs, mins, maxs);
  } catch (const xquant::Error&) {
  }
  out = fit_shape(std::move(out), dt, c.max_view_bytes);
  c.args = "fixed_min=" + std::to_string(fixed_min) + " num_bits=" + std::to_string(nb);
  if (!backward) {
    const int x = c.in("x", dt, xs);
    const int mn = c.in("clamp_min", min_dt, mins);
    const int mx = c.in("clamp_max", max_dt, maxs);
    if (alloc) {
      c.op += "(alloc)";
      c.call = [=](const Ctx& k) {
        auto res = xquant::acts_ulq(k.cv(x), k.cv(mn), k.cv(mx), fixed_min, nb);
        std::vector<Tensor> v;
        v.push_back(std::move(res.y));
        v.push_back(std::move(res.clamp_min_mask));
        v.push_back(std::move(res.clamp_max_mask));
        v.push_back(std::move(res.x_clamped_loss));
        return v;
      };
      return;
    }
    int o[4];
    const char* names[4] = {"y", "clamp_min_mask", "clamp_max_mask", "x_clamped_loss"};
    for (int i = 0; i < 4; ++i) o[i] = c.out(names[i], maybe_other_dtype(r, dt), maybe_corrupt_shape(r, out));
    c.call = [=](const Ctx& k) {
      xquant::acts_ulq_out(k.tv(o[0]), k.tv(o[1]), k.tv(o[2]), k.tv(o[3]), k.cv(x), k.cv(mn), k.cv(mx), fixed_min, nb);
      return std::vector<Tensor>{};
    };
    return;
  }
  const bool sane_masks = (flags & 2) == 0;
  const int yg = c.in("y_grad", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, out));
  const int mn = c.in("clamp_min", min_dt, mins);
  const int mx = c.in("clamp_max", max_dt, maxs);
  const int mmin = c.in("clamp_min_mask", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, out));
  const int mmax = c.in("clamp_max_mask", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, out));
  const int loss = c.in("x_clamped_loss", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, out));
  if (sane_masks)
    for (int m : {mmin, mmax}) {
      const DType mdt = c.views[static_cast<std::size_t>(m)].dtype;
      c.views[static_cast<std::size_t>(m)].post_fill = [mdt](std::uint8_t* p, std::int64_t n) {
        make_zero_one(mdt, p, n);
      };
    }
  if (alloc) {
    c.op += "(alloc)";
    const Shape x_shape = maybe_corrupt_shape(r, xs);
    c.args += " x_shape=" + xquant::shape_str(x_shape);
    c.call = [=](const Ctx& k) {
      auto g = xquant::acts_ulq_backward(k.cv(yg), x_shape, k.cv(mn), k.cv(mx), k.cv(mmin), k.cv(mmax), k.cv(loss),
                                         fixed_min, nb);
      std::vector<Tensor> v;
      v.push_back(std::move(g.x_grad));
      v.push_back(std::move(g.clamp_min_grad));
      v.push_back(std::move(g.clamp_max_grad));
      return v;
    };
    return;
  }
  const int gx = c.out("x_grad", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, xs));
  const int gmin = c.out("clamp_min_grad", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, mins));
  const int gmax = c.out("clamp_max_grad", maybe_other_dtype(r, dt), maybe_corrupt_shape(r, maxs));
  c.call = [=](const Ctx& k) {
    xquant::acts_ulq_backward_out(k.tv(gx), k.tv(gmin), k.tv(gmax), k.cv(yg), k.cv(mn), k.cv(mx), k.cv(mmin),
                                  k.cv(mmax), k.cv(loss), fixed_min, nb);
    return std::vector<Tensor>{};
  };
}

// ---- checking ----

std::string describe(const Case& c) {
  std::string s = c.op + " " + c.args;
  for (const auto& v : c.views) {
    s += "\n  " + v.name +
         (v.role == Role::in    ? " (in) "
          : v.role == Role::out ? " (out) "
                                : " (inout) ") +
         std::string(xquant::dtype_name(v.dtype)) + " ";
    if (v.tile)
      s += "tile " + std::to_string(v.rows) + "x" + std::to_string(v.cols) + " pitch " + std::to_string(v.pitch);
    else
      s += xquant::shape_str(v.shape);
    if (v.null_data)
      s += " data=nullptr";
    else
      s += " buffer " + std::to_string(v.buffer) + " +" + std::to_string(v.offset);
  }
  return s;
}

std::size_t first_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// XQUANT_FUZZ_DUMP=DIR: on a difference, the buffers (initial, reference, failing run) are written to
// DIR/init-B.bin, DIR/ref-B.bin, DIR/got-B.bin for diagnosis.
void dump_buffers(const Layout& L, const Outcome& ref, const Outcome& got) {
  const char* dir = std::getenv("XQUANT_FUZZ_DUMP");
  if (dir == nullptr) return;
  auto write = [dir](const std::string& name, const std::vector<std::uint8_t>& bytes) {
    if (std::FILE* f = std::fopen((std::string(dir) + "/" + name).c_str(), "wb")) {
      std::fwrite(bytes.data(), 1, bytes.size(), f);
      std::fclose(f);
    }
  };
  for (std::size_t b = 0; b < L.init.size(); ++b) {
    write("init-" + std::to_string(b) + ".bin", L.init[b]);
    write("ref-" + std::to_string(b) + ".bin", ref.buffers[b]);
    if (b < got.buffers.size()) write("got-" + std::to_string(b) + ".bin", got.buffers[b]);
  }
}

bool is_nan_element(DType dt, const std::uint8_t* p) {
  if (dt == DType::float32) {
    std::uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  }
  std::uint16_t u;
  std::memcpy(&u, p, 2);
  if (dt == DType::float16) return (u & 0x7fffu) > 0x7c00u;
  if (dt == DType::bfloat16) return (u & 0x7fffu) > 0x7f80u;
  return false;
}

// XQUANT_FUZZ_NAN_PAYLOADS=any: floating output elements that are NaN in both runs count as equal
// whatever their sign and payload bits (for a backend that does not promise NaN bits, or to keep fuzzing
// past a known NaN-bits finding). Default: NaN bits must match too (docs/semantics.md 1.5).
bool differences_are_nan_payloads(const Case& c, std::size_t b, const std::vector<std::uint8_t>& x,
                                  const std::vector<std::uint8_t>& y) {
  static const bool lenient = [] {
    const char* e = std::getenv("XQUANT_FUZZ_NAN_PAYLOADS");
    return e != nullptr && std::string(e) == "any";
  }();
  if (!lenient || x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    bool explained = false;
    for (const auto& v : c.views) {
      if (v.role == Role::in || v.null_data || v.tile || static_cast<std::size_t>(v.buffer) != b) continue;
      const std::size_t es = xquant::dtype_size(v.dtype);
      if (!xquant::is_floating(v.dtype) || i < v.offset || i >= v.offset + view_bytes(v)) continue;
      const std::size_t start = v.offset + (i - v.offset) / es * es;
      if (is_nan_element(v.dtype, x.data() + start) && is_nan_element(v.dtype, y.data() + start)) explained = true;
    }
    if (!explained) return false;
  }
  return true;
}

void check_same(const Case& c, const Layout& L, const Outcome& ref, const Outcome& got, const std::string& config) {
  const std::string head = c.op + " on " + config + ": ";
  if (got.threw) fail(head + "threw '" + got.message + "' where the reference backend succeeded\n" + describe(c));
  for (std::size_t b = 0; b < ref.buffers.size(); ++b)
    if (ref.buffers[b] != got.buffers[b] && !differences_are_nan_payloads(c, b, ref.buffers[b], got.buffers[b])) {
      dump_buffers(L, ref, got);
      fail(head + "buffer " + std::to_string(b) + " differs from the reference backend at byte " +
           std::to_string(first_difference(ref.buffers[b], got.buffers[b])) + "\n" + describe(c));
    }
  if (ref.results.size() != got.results.size()) fail(head + "returned a different number of tensors");
  for (std::size_t t = 0; t < ref.results.size(); ++t) {
    const Tensor& a = ref.results[t];
    const Tensor& b = got.results[t];
    bool same = a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
                (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
    if (!same && a.dtype() == b.dtype() && a.nbytes() == b.nbytes() && a.shape() == b.shape()) {
      // The same leniency for returned tensors, seen as one output view over its own buffer.
      Case one;
      ViewSpec v;
      v.role = Role::out;
      v.dtype = a.dtype();
      v.shape = a.shape();
      v.buffer = 0;
      one.views.push_back(v);
      const auto* pa = static_cast<const std::uint8_t*>(a.data());
      const auto* pb = static_cast<const std::uint8_t*>(b.data());
      same = differences_are_nan_payloads(one, 0, std::vector<std::uint8_t>(pa, pa + a.nbytes()),
                                          std::vector<std::uint8_t>(pb, pb + b.nbytes()));
    }
    if (!same)
      fail(head + "returned tensor " + std::to_string(t) + " differs from the reference backend\n" + describe(c));
  }
}

// Restores the process-wide settings the harness changes.
struct SettingsGuard {
  std::int64_t par = 0, stream = 0;
  SettingsGuard() {
    if (xquant::detail::parallel_min_bytes) par = xquant::detail::parallel_min_bytes();
    if (xquant::detail::stream_min_bytes) stream = xquant::detail::stream_min_bytes();
  }
  ~SettingsGuard() {
    xquant::set_backend(xquant::Backend::cpu);
    xquant::set_num_threads(0);
    if (xquant::detail::set_parallel_min_bytes) xquant::detail::set_parallel_min_bytes(par);
    if (xquant::detail::set_stream_min_bytes) xquant::detail::set_stream_min_bytes(stream);
  }
  void configure(xquant::Backend b, int threads, bool force_split, bool force_stream) const {
    xquant::set_backend(b);
    xquant::set_num_threads(threads);
    if (xquant::detail::set_parallel_min_bytes) xquant::detail::set_parallel_min_bytes(force_split ? 0 : par);
    if (xquant::detail::set_stream_min_bytes) xquant::detail::set_stream_min_bytes(force_stream ? 0 : stream);
  }
};

// Decodes one input into a case and checks it. Returns the reference outcome's success (for statistics).
inline bool run_one(const std::uint8_t* data, std::size_t size) {
  Reader r(data, size);
  Case c;
  const std::uint8_t op = r.byte();
  const std::uint8_t config = r.byte();
  const std::size_t lead = 8u * (config & 7u);
  const bool big = ((config >> 3) & 7u) == 7u;
  const bool alloc = (op / 8) % 4 == 3;  // 1 in 4: the allocating form instead of the out-variant
  switch (op % 8) {
    case 0:
      build_fake_quant(r, c, 0, alloc, big);
      break;
    case 1:
      build_fake_quant(r, c, (op / 32) % 2 ? 1 : 2, alloc, big);
      break;
    case 2:
      build_fake_quant(r, c, 3, alloc, big);
      break;
    case 3:
      build_quantize(r, c, alloc, big);
      break;
    case 4:
      build_tile_quant(r, c, alloc, big);
      break;
    case 5:
      build_dynamic_quant(r, c, alloc, big);
      break;
    case 6:
      build_acts_ulq(r, c, false, alloc, big);
      break;
    default:
      build_acts_ulq(r, c, true, alloc, big);
      break;
  }
  Layout L = layout_views(r, c);
  Pool pool(data + r.pos(), size - std::min(size, r.pos()));
  fill_layout(L, c, pool);

  SettingsGuard settings;
  if (verbose()) std::fprintf(stderr, "fuzz_ops: %s\n", describe(c).c_str());
  settings.configure(xquant::Backend::reference, 1, false, false);
  const Outcome ref = execute(c, L, lead);
  if (verbose())
    std::fprintf(stderr, "  -> %s\n",
                 ref.threw ? (std::string(xquant::error_code_name(ref.code)) + ": " + ref.message).c_str() : "ok");
  if (ref.threw) {
    // A typed error that names the operator and the argument.
    if (ref.argument.empty() || ref.message.rfind("xquant::", 0) != 0)
      fail(c.op + " threw an error without the operator's name or the argument's: '" + ref.message + "'\n" +
           describe(c));
    // Nothing written: every buffer (outputs, in-place inputs, inputs) holds its original bytes.
    for (std::size_t b = 0; b < L.sizes.size(); ++b)
      if (ref.buffers[b] != L.init[b])
        fail(c.op + " threw '" + ref.message + "' but modified buffer " + std::to_string(b) + "\n" + describe(c));
    // The cpu backend validates the same way.
    settings.configure(xquant::Backend::cpu, 3, true, false);
    const Outcome cpu = execute(c, L, lead);
    if (!cpu.threw || cpu.code != ref.code || cpu.message != ref.message)
      fail(c.op + ": the cpu backend " + (cpu.threw ? "threw '" + cpu.message + "'" : std::string("succeeded")) +
           " where the reference backend threw '" + ref.message + "'\n" + describe(c));
    for (std::size_t b = 0; b < L.sizes.size(); ++b)
      if (cpu.buffers[b] != L.init[b])
        fail(c.op + " threw on the cpu backend but modified buffer " + std::to_string(b) + "\n" + describe(c));
    return false;
  }
  // Success: only the outputs' elements may have changed (compare with the outputs' bytes put back).
  for (std::size_t b = 0; b < L.sizes.size(); ++b) {
    std::vector<std::uint8_t> rest = ref.buffers[b];
    for (const auto& [begin, end] : L.writable[b])
      std::memcpy(rest.data() + begin, L.init[b].data() + begin, end - begin);
    if (rest != L.init[b])
      fail(c.op + " wrote byte " + std::to_string(first_difference(rest, L.init[b])) + " of buffer " +
           std::to_string(b) + ", which belongs to no output element (an input or tile padding)\n" + describe(c));
  }
  settings.configure(xquant::Backend::cpu, 1, true, false);
  check_same(c, L, ref, execute(c, L, lead), "cpu backend, 1 thread");
  settings.configure(xquant::Backend::cpu, 3, true, true);
  check_same(c, L, ref, execute(c, L, lead), "cpu backend, 3 threads, forced split and streaming stores");
  return true;
}

}  // namespace xquant_fuzz

#ifndef XQUANT_FUZZ_OPS_NO_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  xquant_fuzz::run_one(data, size);
  return 0;
}
#endif
