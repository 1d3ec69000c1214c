// Tile quantization (SPEC section 3, pypto quant): validate the four tile views, then run the kernel on the
// [rows, cols] valid region with each tile's own row pitch.
#include "xquant/tile_quant.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "core/device_ops.hpp"
#include "core/kernels.hpp"
#include "ops/spec.hpp"
#include "xquant/plan.hpp"

namespace xquant {

namespace {

using detail::fail;

constexpr std::string_view kOp = "tile_quant";

std::string str(std::int64_t v) { return std::to_string(v); }
std::string dims(std::int64_t rows, std::int64_t cols) {
  // Appended piece by piece: GCC 12 reports a false -Wrestrict on "[" + std::string.
  std::string s(1, '[');
  s += str(rows);
  s += ", ";
  s += str(cols);
  s += ']';
  return s;
}
std::string dims(const ConstTileView& t) { return dims(t.rows, t.cols); }

// Bytes from the first to one past the last valid element: ((rows - 1) * pitch + cols) elements, 0 for
// an empty tile. Only called on tiles that passed check_tile (no overflow).
std::size_t span_bytes(const ConstTileView& t) {
  if (t.rows == 0 || t.cols == 0) return 0;
  return static_cast<std::size_t>((t.rows - 1) * t.row_pitch + t.cols) * dtype_size(t.dtype);
}

struct Expected {
  std::int64_t rows, cols;
  std::string_view what;
};

// One tile: dtype, non-negative sizes, the expected valid shape (if any), pitch >= cols, a span that fits
// in memory, data unless empty.
void check_tile(std::string_view arg, const ConstTileView& t, DType dtype, std::optional<Expected> expected) {
  detail::check_dtype(kOp, arg, t.dtype, dtype);
  if (t.rows < 0 || t.cols < 0)
    fail(ErrorCode::shape_mismatch, kOp, arg,
         std::string(arg) + " has valid shape " + dims(t) + " but expected non-negative rows and cols");
  if (expected && (t.rows != expected->rows || t.cols != expected->cols))
    fail(ErrorCode::shape_mismatch, kOp, arg,
         std::string(arg) + " has valid shape " + dims(t) + " but expected " + dims(expected->rows, expected->cols) +
             " (" + std::string(expected->what) + ")");
  if (t.row_pitch < t.cols)
    fail(ErrorCode::not_contiguous, kOp, arg,
         std::string(arg) + " has row_pitch " + str(t.row_pitch) + " but expected at least its cols " + str(t.cols) +
             " (a row-major tile with padded rows)");
  if (t.rows > 0 && t.cols > 0) {
    const auto limit = static_cast<std::int64_t>(std::numeric_limits<std::int64_t>::max() /
                                                 static_cast<std::int64_t>(dtype_size(t.dtype)));
    if ((t.rows - 1) > (limit - t.cols) / t.row_pitch)
      fail(ErrorCode::shape_mismatch, kOp, arg,
           std::string(arg) + " has valid shape " + dims(t) + " and row_pitch " + str(t.row_pitch) +
               " whose byte span overflows int64");
    if (t.data == nullptr)
      fail(ErrorCode::invalid_argument, kOp, arg,
           std::string(arg) + " has valid shape " + dims(t) + " but its data pointer is null");
  }
}

// Every input: src float32 [M, N]; scale float32 [M, 1]; offset required for ASYM (scale's rows, cols and
// row_pitch) and rejected for SYM.
void check_inputs(const ConstTileView& src, const ConstTileView& scale, QuantMode mode,
                  const std::optional<ConstTileView>& offset) {
  if (mode != QuantMode::SYM && mode != QuantMode::ASYM)
    fail(ErrorCode::invalid_argument, kOp, "mode",
         "mode is " + str(static_cast<int>(mode)) + " but expected SYM or ASYM");
  check_tile("src", src, DType::float32, std::nullopt);
  check_tile("scale", scale, DType::float32, Expected{src.rows, 1, "one value per row of src"});
  if (mode == QuantMode::SYM) {
    if (offset) fail(ErrorCode::invalid_argument, kOp, "offset", "offset is given but mode SYM takes no offset");
    return;
  }
  if (!offset) fail(ErrorCode::invalid_argument, kOp, "offset", "offset is missing but mode ASYM requires it");
  check_tile("offset", *offset, DType::float32, Expected{scale.rows, scale.cols, "the valid shape of scale"});
  if (offset->row_pitch != scale.row_pitch)
    fail(ErrorCode::shape_mismatch, kOp, "offset",
         "offset has row_pitch " + str(offset->row_pitch) + " but expected " + str(scale.row_pitch) +
             " (the row_pitch of scale: the document requires the same physical shape)");
}

}  // namespace

void tile_quant(TileView out, ConstTileView src, ConstTileView scale, QuantMode mode,
                std::optional<ConstTileView> offset) {
  const Device dev = detail::common_device(kOp, {{"src", src.device},
                                                 {"scale", scale.device},
                                                 {"offset", offset ? offset->device : src.device},
                                                 {"out", out.device}});
  const auto kernel = detail::kernels_for(kOp, "src", dev).tile_quant;
  check_inputs(src, scale, mode, offset);
  const ConstTileView cout = out;
  check_tile("out", cout, mode == QuantMode::SYM ? DType::int8 : DType::uint8,
             Expected{src.rows, src.cols, "the valid shape of src"});
  // The bytes out may write must not overlap any byte an input is read from.
  const std::size_t out_bytes = span_bytes(cout);
  detail::check_no_overlap(kOp, "out", out.data, out_bytes, "src", src.data, span_bytes(src));
  detail::check_no_overlap(kOp, "out", out.data, out_bytes, "scale", scale.data, span_bytes(scale));
  if (offset) detail::check_no_overlap(kOp, "out", out.data, out_bytes, "offset", offset->data, span_bytes(*offset));
  if (src.rows == 0 || src.cols == 0) return;

  detail::TileQuantArgs args{};
  args.mode = mode;
  args.rows = src.rows;
  args.cols = src.cols;
  args.src = static_cast<const float*>(src.data);
  args.src_pitch = src.row_pitch;
  args.scale = static_cast<const float*>(scale.data);
  args.scale_pitch = scale.row_pitch;
  args.offset = offset ? static_cast<const float*>(offset->data) : nullptr;
  args.offset_pitch = offset ? offset->row_pitch : 0;
  args.out = out.data;
  args.out_pitch = out.row_pitch;
  kernel(args);
}

Tensor tile_quant(ConstTileView src, ConstTileView scale, QuantMode mode, std::optional<ConstTileView> offset) {
  check_inputs(src, scale, mode, offset);
  detail::common_device(
      kOp, {{"src", src.device}, {"scale", scale.device}, {"offset", offset ? offset->device : src.device}});
  Tensor out(mode == QuantMode::SYM ? DType::int8 : DType::uint8, Shape{src.rows, src.cols}, src.device);
  tile_quant(TileView{out.data(), out.dtype(), src.rows, src.cols, src.cols, src.device}, src, scale, mode, offset);
  return out;
}

void plan_tile_quant(const TensorSpec& out, const TensorSpec& src, const TensorSpec& scale, QuantMode mode,
                     const std::optional<TensorSpec>& offset) {
  const std::pair<std::string_view, const TensorSpec*> specs[] = {
      {"out", &out}, {"src", &src}, {"scale", &scale}, {"offset", offset ? &*offset : nullptr}};
  for (const auto& [arg, s] : specs)
    if (s != nullptr && s->shape.size() != 2)
      fail(ErrorCode::shape_mismatch, kOp, arg,
           std::string(arg) + " has shape " + shape_str(s->shape) + " but expected a 2-D tile");
  const auto tile = [](const TensorSpec& s) {
    return ConstTileView{detail::spec_data(), s.dtype, s.shape[0], s.shape[1], s.shape[1]};
  };
  std::optional<ConstTileView> off;
  if (offset) off = tile(*offset);
  const ConstTileView src_tile = tile(src);
  check_inputs(src_tile, tile(scale), mode, off);
  check_tile("out", tile(out), mode == QuantMode::SYM ? DType::int8 : DType::uint8,
             Expected{src_tile.rows, src_tile.cols, "the valid shape of src"});
}

}  // namespace xquant
