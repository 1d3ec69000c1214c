#include "core/check.hpp"

#include <cstdint>

namespace xquant::detail {

void fail(ErrorCode code, std::string_view op, std::string_view arg, const std::string& message) {
  throw Error(code, std::string(arg), "xquant::" + std::string(op) + ": " + message);
}

void fail_internal(std::string_view where, const std::string& message) {
  throw Error(ErrorCode::internal_error, std::string(),
              "xquant::" + std::string(where) + ": internal error (a bug in xquant): " + message);
}

void check_view(std::string_view op, std::string_view arg, const ConstTensorView& v) {
  bool empty = false;
  for (std::int64_t d : v.shape) {
    if (d < 0)
      fail(ErrorCode::shape_mismatch, op, arg,
           std::string(arg) + " has shape " + shape_str(v.shape) + " with a negative dimension");
    empty = empty || d == 0;
  }
  std::int64_t n = 1;
  if (!empty)
    for (std::int64_t d : v.shape) {
      if (n > INT64_MAX / d)
        fail(ErrorCode::shape_mismatch, op, arg,
             std::string(arg) + " has shape " + shape_str(v.shape) + " whose element count overflows int64");
      n *= d;
    }
  if (!empty && v.data == nullptr)
    fail(ErrorCode::invalid_argument, op, arg,
         std::string(arg) + " has shape " + shape_str(v.shape) + " but its data pointer is null");
}

void check_floating(std::string_view op, std::string_view arg, DType dt) {
  if (!is_floating(dt))
    fail(ErrorCode::dtype_mismatch, op, arg,
         std::string(arg) + " has dtype " + std::string(dtype_name(dt)) + " but expected float32, float16 or bfloat16");
}

void check_dtype(std::string_view op, std::string_view arg, DType got, DType expected) {
  if (got != expected)
    fail(ErrorCode::dtype_mismatch, op, arg,
         std::string(arg) + " has dtype " + std::string(dtype_name(got)) + " but expected " +
             std::string(dtype_name(expected)));
}

void check_shape(std::string_view op, std::string_view arg, const Shape& got, const Shape& expected,
                 std::string_view expected_what) {
  if (got != expected)
    fail(ErrorCode::shape_mismatch, op, arg,
         std::string(arg) + " has shape " + shape_str(got) + " but expected " + shape_str(expected) + " (" +
             std::string(expected_what) + ")");
}

void check_output(std::string_view op, std::string_view arg, const TensorView& out, DType dtype, const Shape& shape,
                  std::string_view shape_what) {
  check_view(op, arg, out);
  check_dtype(op, arg, out.dtype, dtype);
  check_shape(op, arg, out.shape, shape, shape_what);
}

std::int64_t normalize_axis(std::string_view op, std::string_view arg, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis >= rank)
    fail(ErrorCode::invalid_argument, op, arg,
         std::string(arg) + " is " + std::to_string(axis) + " but expected a value in [" + std::to_string(-rank) +
             ", " + std::to_string(rank - 1) + "] for a tensor of rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

void check_num_bits(std::string_view op, int num_bits, int lo, int hi) {
  if (num_bits < lo || num_bits > hi)
    fail(ErrorCode::invalid_argument, op, "num_bits",
         "num_bits is " + std::to_string(num_bits) + " but expected a value in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]");
}

bool ranges_overlap(const void* a, std::size_t na, const void* b, std::size_t nb) noexcept {
  if (na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

void check_no_overlap(std::string_view op, std::string_view out_arg, const void* out, std::size_t out_bytes,
                      std::string_view in_arg, const void* in, std::size_t in_bytes) {
  if (ranges_overlap(out, out_bytes, in, in_bytes))
    fail(ErrorCode::aliasing, op, out_arg,
         std::string(out_arg) + " overlaps " + std::string(in_arg) + " in memory but expected disjoint buffers");
}

void check_same_or_disjoint(std::string_view op, std::string_view out_arg, const void* out, std::size_t out_bytes,
                            std::string_view in_arg, const void* in, std::size_t in_bytes) {
  if (out == in && out_bytes == in_bytes) return;
  if (ranges_overlap(out, out_bytes, in, in_bytes))
    fail(ErrorCode::aliasing, op, out_arg,
         std::string(out_arg) + " partially overlaps " + std::string(in_arg) +
             " in memory but expected the same buffer or a disjoint one");
}

ChannelLayout split_at_axis(const Shape& shape, std::int64_t axis) {
  ChannelLayout s;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(shape.size()); ++i) {
    if (i < axis)
      s.outer *= shape[i];
    else if (i == axis)
      s.channels = shape[i];
    else
      s.inner *= shape[i];
  }
  return s;
}

}  // namespace xquant::detail

namespace xquant {

ChannelLayout channel_layout(const Shape& shape, std::int64_t axis) {
  const std::int64_t rank = static_cast<std::int64_t>(shape.size());
  return detail::split_at_axis(shape, detail::normalize_axis("channel_layout", "axis", axis, rank));
}

ChannelLayout per_tensor_layout(const Shape& shape) { return ChannelLayout{1, 1, shape_numel(shape)}; }

}  // namespace xquant
