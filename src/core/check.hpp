// Argument validation shared by the operators (SPEC rule 6). Every failure throws xquant::Error whose
// message starts with "xquant::<operator>: " and names the argument, the value and the expectation.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "xquant/error.hpp"
#include "xquant/layout.hpp"
#include "xquant/tensor.hpp"

namespace xquant::detail {

[[noreturn]] void fail(ErrorCode code, std::string_view op, std::string_view arg, const std::string& message);
// A broken internal invariant (a bug in xquant, not bad input): throws Error(ErrorCode::internal_error),
// argument "", message "xquant::<where>: internal error (a bug in xquant): <message>".
[[noreturn]] void fail_internal(std::string_view where, const std::string& message);

// A view is usable: shape valid (no negative dims, numel fits int64) and data non-null unless empty.
void check_view(std::string_view op, std::string_view arg, const ConstTensorView& v);
// dtype is float32 / float16 / bfloat16.
void check_floating(std::string_view op, std::string_view arg, DType dt);
// dtype equals `expected`.
void check_dtype(std::string_view op, std::string_view arg, DType got, DType expected);
// shape equals `expected` ("out has shape [2] but expected [3] (the shape of inputs)").
void check_shape(std::string_view op, std::string_view arg, const Shape& got, const Shape& expected,
                 std::string_view expected_what);
// An output view: valid, dtype and shape as expected.
void check_output(std::string_view op, std::string_view arg, const TensorView& out, DType dtype, const Shape& shape,
                  std::string_view shape_what);
// Python-style axis in [-rank, rank) -> [0, rank).
std::int64_t normalize_axis(std::string_view op, std::string_view arg, std::int64_t axis, std::int64_t rank);
// num_bits in [lo, hi].
void check_num_bits(std::string_view op, int num_bits, int lo, int hi);

// Byte ranges [a, a + na) and [b, b + nb) intersect (empty ranges never do).
bool ranges_overlap(const void* a, std::size_t na, const void* b, std::size_t nb) noexcept;
// `out` must not overlap `in` at all.
void check_no_overlap(std::string_view op, std::string_view out_arg, const void* out, std::size_t out_bytes,
                      std::string_view in_arg, const void* in, std::size_t in_bytes);
// `out` may be exactly `in` (elementwise, same layout) but must not partially overlap it.
void check_same_or_disjoint(std::string_view op, std::string_view out_arg, const void* out, std::size_t out_bytes,
                            std::string_view in_arg, const void* in, std::size_t in_bytes);

// The normal form of per-axis problems (xquant/layout.hpp) around an already normalized axis.
ChannelLayout split_at_axis(const Shape& shape, std::int64_t axis);

}  // namespace xquant::detail
