// Tile quantization (SPEC section 3, pypto quant): the document's example, SYM / ASYM ties and
// saturation, row pitches with padding that must stay untouched, the allocating form and every
// validation path.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {
using namespace xqtest;
using xquant::ConstTileView;
using xquant::ErrorCode;
using xquant::QuantMode;
using xquant::TileView;

// ---------------------------------------------------------------------------------------------------------
// The independent statement of SPEC 3.

double rne(double v) {  // round half to even without rint
  const double f = std::floor(v);
  const double d = v - f;
  if (d > 0.5) return f + 1.0;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

std::int64_t sat(float v, double lo, double hi) {
  if (std::isnan(v)) return 0;
  if (v >= hi) return static_cast<std::int64_t>(hi);
  if (v <= lo) return static_cast<std::int64_t>(lo);
  const double r = rne(static_cast<double>(v));
  return static_cast<std::int64_t>(r < lo ? lo : (r > hi ? hi : r));
}
// SYM: sat_int8(rint(x * s)).
std::int64_t expect_sym(float x, float s) { return sat(x * s, -128.0, 127.0); }
// ASYM: sat_uint8(rint(x * s + o)): a float32 product, a float32 sum, one rounding.
std::int64_t expect_asym(float x, float s, float o) {
  const float p = x * s;
  return sat(p + o, 0.0, 255.0);
}

// A tile owned by a test: rows x pitch elements plus a guard row, every byte a sentinel until written.
template <typename T>
struct Buf {
  std::int64_t rows, cols, pitch;
  std::vector<T> data;
  Buf(std::int64_t r, std::int64_t c, std::int64_t p, T fill) : rows(r), cols(c), pitch(p) {
    data.assign(static_cast<std::size_t>((r + 1) * p + 8), fill);
  }
  T& at(std::int64_t i, std::int64_t j) { return data[static_cast<std::size_t>(i * pitch + j)]; }
  T at(std::int64_t i, std::int64_t j) const { return data[static_cast<std::size_t>(i * pitch + j)]; }
  ConstTileView view(DType dt) const { return {data.data(), dt, rows, cols, pitch}; }
  TileView tile(DType dt) { return {data.data(), dt, rows, cols, pitch}; }
};

constexpr std::uint8_t kSentinel = 0xA5;

// Checks out against the formula in the valid region and the sentinel everywhere else.
template <typename T>
void check_out(const Buf<T>& out, const Buf<float>& src, const Buf<float>& scale, const Buf<float>* offset) {
  int bad = 0;
  for (std::int64_t i = 0; i < out.rows && bad < 10; ++i)
    for (std::int64_t j = 0; j < out.cols && bad < 10; ++j) {
      const std::int64_t want = offset ? expect_asym(src.at(i, j), scale.at(i, 0), offset->at(i, 0))
                                       : expect_sym(src.at(i, j), scale.at(i, 0));
      if (static_cast<std::int64_t>(out.at(i, j)) != want) {
        ++bad;
        ADD_FAILURE() << "(" << i << ", " << j << ") x " << src.at(i, j) << ": got " << static_cast<int>(out.at(i, j))
                      << " want " << want;
      }
    }
  // Padding of every physical row, the rows beyond, and the guard: untouched.
  for (std::size_t k = 0; k < out.data.size(); ++k) {
    const auto i = static_cast<std::int64_t>(k) / out.pitch, j = static_cast<std::int64_t>(k) % out.pitch;
    if (i < out.rows && j < out.cols) continue;
    if (static_cast<std::uint8_t>(out.data[k]) != kSentinel) {
      ADD_FAILURE() << "byte " << k << " outside the valid region was written";
      break;
    }
  }
}

// A deterministic value stream (64-bit LCG).
struct Lcg {
  std::uint64_t s;
  std::uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>(s >> 33);
  }
  float quarter(int lo, int hi) { return static_cast<float>(lo + static_cast<int>(next() % (hi - lo + 1))) * 0.25f; }
};

// ---------------------------------------------------------------------------------------------------------

TEST(TileQuant, DocumentExample) {
  // src [64, 128]: row r starts at -16 + 32 r, stepping by 0.25; scale 4 for every row.
  const std::int64_t M = 64, N = 128;
  Buf<float> src(M, N, N, 0.f), scale(M, 1, 1, 4.f);
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t j = 0; j < N; ++j)
      src.at(r, j) = -16.f + 32.f * static_cast<float>(r) + 0.25f * static_cast<float>(j);
  Buf<std::int8_t> out(M, N, N, static_cast<std::int8_t>(kSentinel));
  xquant::tile_quant(out.tile(DType::int8), src.view(DType::float32), scale.view(DType::float32), QuantMode::SYM);
  // The document's printed values.
  for (std::int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(out.at(0, j), -64 + j);
    EXPECT_EQ(out.at(1, j), 64 + j);
    EXPECT_EQ(out.at(2, j), 127);
    EXPECT_EQ(out.at(3, j), 127);
  }
  // Row 0 is -64 .. 63 exactly; row 1 reaches 127 at column 63 and saturates after.
  for (std::int64_t j = 0; j < N; ++j) EXPECT_EQ(out.at(0, j), -64 + j);
  for (std::int64_t j = 0; j < N; ++j) EXPECT_EQ(out.at(1, j), j <= 63 ? 64 + j : 127);
  check_out(out, src, scale, nullptr);
  // The allocating form gives the same dense result.
  Tensor t = xquant::tile_quant(src.view(DType::float32), scale.view(DType::float32));
  ASSERT_EQ(t.shape(), (Shape{M, N}));
  ASSERT_EQ(t.dtype(), DType::int8);
  EXPECT_EQ(std::memcmp(t.data(), out.data.data(), static_cast<std::size_t>(M * N)), 0);
}

TEST(TileQuant, SymTiesAndSaturation) {
  const std::vector<float> x = {0.5f,    1.5f,  2.5f,   -0.5f, -1.5f, -2.5f, 126.5f,  127.5f,   -127.5f,
                                -128.5f, 200.f, -200.f, kInf,  -kInf, kNaN,  3.4e38f, -3.4e38f, 0.f};
  const std::vector<int> want = {0, 2, 2, 0, -2, -2, 126, 127, -128, -128, 127, -128, 127, -128, 0, 127, -128, 0};
  const auto n = static_cast<std::int64_t>(x.size());
  Buf<float> src(1, n, n, 0.f), scale(1, 1, 1, 1.f);
  for (std::int64_t j = 0; j < n; ++j) src.at(0, j) = x[j];
  Buf<std::int8_t> out(1, n, n, static_cast<std::int8_t>(kSentinel));
  xquant::tile_quant(out.tile(DType::int8), src.view(DType::float32), scale.view(DType::float32), QuantMode::SYM);
  for (std::int64_t j = 0; j < n; ++j) EXPECT_EQ(out.at(0, j), want[j]) << "x " << x[j];
  check_out(out, src, scale, nullptr);
  // Ties made by the multiplier: 1 * 0.5, 3 * 0.5, 5 * 0.5, negated.
  Buf<float> s2(1, 6, 6, 0.f), half(1, 1, 1, 0.5f);
  const float y[] = {1.f, 3.f, 5.f, -1.f, -3.f, -5.f};
  for (int j = 0; j < 6; ++j) s2.at(0, j) = y[j];
  Tensor t = xquant::tile_quant(s2.view(DType::float32), half.view(DType::float32), QuantMode::SYM);
  EXPECT_EQ(to_vector<std::int8_t>(t), (std::vector<std::int8_t>{0, 2, 2, 0, -2, -2}));
}

TEST(TileQuant, AsymOneRoundingTiesAndSaturation) {
  // Row 0: scale 2, offset 1: 0.25 * 2 + 1 = 1.5 -> 2 (rounding the product first would give 1);
  // 0.75 * 2 + 1 = 2.5 -> 2; -0.25 * 2 + 1 = 0.5 -> 0; saturation at both ends; NaN -> 0; +-Inf.
  // Row 1: scale 1, offset 0.5: 1 + 0.5 = 1.5 -> 2; 2 + 0.5 = 2.5 -> 2; -1 + 0.5 = -0.5 -> 0.
  const std::vector<float> r0 = {0.25f, 0.75f, -0.25f, 127.f, 127.25f, 200.f, -0.75f, -5.f, kNaN, kInf, -kInf, 3.4e38f};
  const std::vector<int> w0 = {2, 2, 0, 255, 255, 255, 0, 0, 0, 255, 0, 255};
  const std::vector<float> r1 = {1.f, 2.f, -1.f, 254.f, 254.5f, 253.5f, -3.4e38f, 0.f, 100.f, 7.f, 8.f, 9.f};
  const std::vector<int> w1 = {2, 2, 0, 254, 255, 254, 0, 0, 100, 8, 8, 10};
  const std::int64_t n = 12;
  Buf<float> src(2, n, n, 0.f), scale(2, 1, 1, 0.f), offset(2, 1, 1, 0.f);
  for (std::int64_t j = 0; j < n; ++j) {
    src.at(0, j) = r0[j];
    src.at(1, j) = r1[j];
  }
  scale.at(0, 0) = 2.f;
  offset.at(0, 0) = 1.f;
  scale.at(1, 0) = 1.f;
  offset.at(1, 0) = 0.5f;
  Buf<std::uint8_t> out(2, n, n, kSentinel);
  xquant::tile_quant(out.tile(DType::uint8), src.view(DType::float32), scale.view(DType::float32), QuantMode::ASYM,
                     offset.view(DType::float32));
  for (std::int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(out.at(0, j), w0[j]) << "row 0 x " << r0[j];
    EXPECT_EQ(out.at(1, j), w1[j]) << "row 1 x " << r1[j];
  }
  check_out(out, src, scale, &offset);
}

TEST(TileQuant, PitchesPaddingUntouchedAndOwnParameterPitch) {
  struct Geo {
    std::int64_t rows, cols, src_pitch, out_pitch, param_pitch;
  };
  const Geo geos[] = {
      {5, 29, 40, 37, 3}, {1, 1, 1, 1, 1}, {7, 64, 64, 80, 16}, {16, 3, 5, 4, 2}, {3, 130, 131, 256, 1}};
  std::uint64_t seed = 3;
  for (const Geo& g : geos)
    for (QuantMode mode : {QuantMode::SYM, QuantMode::ASYM}) {
      SCOPED_TRACE("rows " + std::to_string(g.rows) + " cols " + std::to_string(g.cols) + " mode " +
                   std::to_string(static_cast<int>(mode)));
      Lcg rng{seed++};
      // Padding of src holds NaN and of scale / offset holds junk: reading it would change the result.
      Buf<float> src(g.rows, g.cols, g.src_pitch, kNaN), scale(g.rows, 1, g.param_pitch, 1000.f),
          offset(g.rows, 1, g.param_pitch, -1000.f);
      for (std::int64_t i = 0; i < g.rows; ++i) {
        for (std::int64_t j = 0; j < g.cols; ++j) src.at(i, j) = rng.quarter(-600, 600);
        scale.at(i, 0) = rng.quarter(1, 12);                                    // 0.25 .. 3
        offset.at(i, 0) = mode == QuantMode::ASYM ? rng.quarter(0, 520) : 0.f;  // 0 .. 130
      }
      if (mode == QuantMode::SYM) {
        Buf<std::int8_t> out(g.rows, g.cols, g.out_pitch, static_cast<std::int8_t>(kSentinel));
        xquant::tile_quant(out.tile(DType::int8), src.view(DType::float32), scale.view(DType::float32), mode);
        check_out(out, src, scale, nullptr);
        Tensor t = xquant::tile_quant(src.view(DType::float32), scale.view(DType::float32), mode);
        ASSERT_EQ(t.shape(), (Shape{g.rows, g.cols}));
        for (std::int64_t i = 0; i < g.rows; ++i)
          for (std::int64_t j = 0; j < g.cols; ++j) EXPECT_EQ(t.data<std::int8_t>()[i * g.cols + j], out.at(i, j));
      } else {
        Buf<std::uint8_t> out(g.rows, g.cols, g.out_pitch, kSentinel);
        xquant::tile_quant(out.tile(DType::uint8), src.view(DType::float32), scale.view(DType::float32), mode,
                           offset.view(DType::float32));
        check_out(out, src, scale, &offset);
        Tensor t =
            xquant::tile_quant(src.view(DType::float32), scale.view(DType::float32), mode, offset.view(DType::float32));
        ASSERT_EQ(t.shape(), (Shape{g.rows, g.cols}));
        ASSERT_EQ(t.dtype(), DType::uint8);
        for (std::int64_t i = 0; i < g.rows; ++i)
          for (std::int64_t j = 0; j < g.cols; ++j) EXPECT_EQ(t.data<std::uint8_t>()[i * g.cols + j], out.at(i, j));
      }
    }
}

TEST(TileQuant, EmptyTiles) {
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{0, 5}, {3, 0}, {0, 0}}) {
    Buf<float> src(rows, cols, 8, 1.f), scale(rows, 1, 1, 1.f);
    Buf<std::int8_t> out(rows, cols, 8, static_cast<std::int8_t>(kSentinel));
    xquant::tile_quant(out.tile(DType::int8), src.view(DType::float32), scale.view(DType::float32));
    for (auto b : out.data) EXPECT_EQ(static_cast<std::uint8_t>(b), kSentinel);
    Tensor t = xquant::tile_quant(src.view(DType::float32), scale.view(DType::float32));
    EXPECT_EQ(t.shape(), (Shape{rows, cols}));
    // Null data is fine for an empty tile.
    xquant::tile_quant(TileView{nullptr, DType::uint8, 0, cols, cols},
                       ConstTileView{nullptr, DType::float32, 0, cols, cols},
                       ConstTileView{nullptr, DType::float32, 0, 1, 1}, QuantMode::ASYM,
                       ConstTileView{nullptr, DType::float32, 0, 1, 1});
  }
}

// ---------------------------------------------------------------------------------------------------------
// Validation: every error names its argument and leaves out (valid region and padding) untouched.

struct TileArgs {
  QuantMode mode;
  Buf<float> src{4, 6, 8, 1.5f};
  Buf<float> scale{4, 1, 2, 2.f};
  Buf<float> offset{4, 1, 2, 3.f};
  std::vector<std::uint8_t> out_bytes = std::vector<std::uint8_t>(4 * 8 + 8, kSentinel);

  ConstTileView s = src.view(DType::float32);
  ConstTileView sc = scale.view(DType::float32);
  std::optional<ConstTileView> off;
  TileView out{out_bytes.data(), DType::int8, 4, 6, 8};

  // Valid arguments for `m`; each test breaks one. (Views point into this object: it is never copied.)
  explicit TileArgs(QuantMode m = QuantMode::SYM) : mode(m) {
    if (m == QuantMode::ASYM) {
      off = offset.view(DType::float32);
      out.dtype = DType::uint8;
    }
  }
  TileArgs(const TileArgs&) = delete;
  TileArgs& operator=(const TileArgs&) = delete;
  void expect(ErrorCode code, const std::string& arg, const std::vector<std::string>& needles = {},
              bool also_allocating = true) {
    expect_error([&] { xquant::tile_quant(out, s, sc, mode, off); }, code, arg, needles);
    for (auto b : out_bytes) ASSERT_EQ(b, kSentinel) << "out was written before validation failed";
    if (also_allocating && arg != "out")
      expect_error([&] { xquant::tile_quant(s, sc, mode, off); }, code, arg, needles);
  }
};

TEST(TileQuantErrors, BaselinesAreValid) {
  TileArgs a;
  xquant::tile_quant(a.out, a.s, a.sc, a.mode, a.off);
  EXPECT_EQ(static_cast<std::int8_t>(a.out_bytes[0]), 3);  // 1.5 * 2
  EXPECT_EQ(a.out_bytes[6], kSentinel);                    // padding
  TileArgs b(QuantMode::ASYM);
  xquant::tile_quant(b.out, b.s, b.sc, b.mode, b.off);
  EXPECT_EQ(b.out_bytes[0], 6);  // 1.5 * 2 + 3
}

TEST(TileQuantErrors, Dtypes) {
  {
    TileArgs a;
    a.s.dtype = DType::float16;
    a.expect(ErrorCode::dtype_mismatch, "src", {"float16", "float32"});
  }
  {
    TileArgs a;
    a.sc.dtype = DType::bfloat16;
    a.expect(ErrorCode::dtype_mismatch, "scale", {"bfloat16"});
  }
  {
    TileArgs a;
    a.out.dtype = DType::uint8;
    a.expect(ErrorCode::dtype_mismatch, "out", {"uint8", "int8"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.out.dtype = DType::int8;
    a.expect(ErrorCode::dtype_mismatch, "out", {"int8", "uint8"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.off->dtype = DType::int32;
    a.expect(ErrorCode::dtype_mismatch, "offset", {"int32"});
  }
}

TEST(TileQuantErrors, ModeAndOffsetPresence) {
  {
    TileArgs a;
    a.mode = static_cast<QuantMode>(7);
    a.expect(ErrorCode::invalid_argument, "mode", {"7"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.off.reset();
    a.expect(ErrorCode::invalid_argument, "offset", {"ASYM"});
  }
  {
    TileArgs a;
    a.off = a.offset.view(DType::float32);
    a.expect(ErrorCode::invalid_argument, "offset", {"SYM"});
  }
}

TEST(TileQuantErrors, Shapes) {
  {
    TileArgs a;
    a.out.rows = 3;
    a.expect(ErrorCode::shape_mismatch, "out", {"[3, 6]", "[4, 6]"});
  }
  {
    TileArgs a;
    a.out.cols = 5;
    a.expect(ErrorCode::shape_mismatch, "out", {"[4, 5]"});
  }
  {
    TileArgs a;
    a.sc.cols = 2;
    a.expect(ErrorCode::shape_mismatch, "scale", {"[4, 2]", "[4, 1]"});
  }
  {
    TileArgs a;
    a.sc.rows = 3;
    a.expect(ErrorCode::shape_mismatch, "scale", {"[3, 1]", "[4, 1]"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.off->rows = 3;
    a.expect(ErrorCode::shape_mismatch, "offset", {"[3, 1]"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.off->cols = 2;
    a.off->row_pitch = 2;
    a.expect(ErrorCode::shape_mismatch, "offset");
  }
  {  // offset's physical shape must equal scale's: same row pitch
    TileArgs a(QuantMode::ASYM);
    a.off->row_pitch = 3;
    a.expect(ErrorCode::shape_mismatch, "offset", {"row_pitch 3", "2"});
  }
  {
    TileArgs a;
    a.s.rows = -1;
    a.expect(ErrorCode::shape_mismatch, "src", {"non-negative"});
  }
  {
    TileArgs a;
    a.out.cols = -6;
    a.expect(ErrorCode::shape_mismatch, "out");
  }
}

TEST(TileQuantErrors, Pitches) {
  {
    TileArgs a;
    a.s.row_pitch = 5;
    a.expect(ErrorCode::not_contiguous, "src", {"row_pitch 5", "6"});
  }
  {
    TileArgs a;
    a.out.row_pitch = 5;
    a.expect(ErrorCode::not_contiguous, "out", {"row_pitch 5"});
  }
  {
    TileArgs a;
    a.sc.row_pitch = 0;
    a.expect(ErrorCode::not_contiguous, "scale", {"row_pitch 0"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.sc.row_pitch = 0;
    a.off->row_pitch = 0;
    a.expect(ErrorCode::not_contiguous, "scale");
  }
  {
    TileArgs a;
    a.s.row_pitch = -8;
    a.expect(ErrorCode::not_contiguous, "src");
  }
  {  // an empty [0, 1] scale still needs a pitch >= 1
    TileArgs a;
    a.s.rows = 0;
    a.out.rows = 0;
    a.sc.rows = 0;
    a.sc.row_pitch = 0;
    a.expect(ErrorCode::not_contiguous, "scale");
  }
  {  // a span that does not fit in memory
    TileArgs a;
    a.s.row_pitch = INT64_MAX / 2;
    a.expect(ErrorCode::shape_mismatch, "src", {"overflow"});
  }
}

TEST(TileQuantErrors, NullData) {
  {
    TileArgs a;
    a.s.data = nullptr;
    a.expect(ErrorCode::invalid_argument, "src", {"null"});
  }
  {
    TileArgs a;
    a.sc.data = nullptr;
    a.expect(ErrorCode::invalid_argument, "scale", {"null"});
  }
  {
    TileArgs a(QuantMode::ASYM);
    a.off->data = nullptr;
    a.expect(ErrorCode::invalid_argument, "offset", {"null"});
  }
  {
    TileArgs a;
    a.out.data = nullptr;
    expect_error([&] { xquant::tile_quant(a.out, a.s, a.sc, a.mode, a.off); }, ErrorCode::invalid_argument, "out",
                 {"null"});
  }
}

TEST(TileQuantErrors, Overlap) {
  // One float buffer: src [2, 4] pitch 6 at floats 0..9 (span), scale [2, 1] pitch 2 at 12..14,
  // offset at 16..18.
  std::vector<float> buf(40, 1.f);
  const std::vector<float> before = buf;
  const ConstTileView src{buf.data(), DType::float32, 2, 4, 6};
  const ConstTileView scale{buf.data() + 12, DType::float32, 2, 1, 2};
  const ConstTileView offset{buf.data() + 16, DType::float32, 2, 1, 2};
  auto* bytes = reinterpret_cast<std::uint8_t*>(buf.data());
  auto check = [&](std::size_t byte_offset, QuantMode mode, const std::string& in_arg) {
    const TileView out{bytes + byte_offset, mode == QuantMode::SYM ? DType::int8 : DType::uint8, 2, 4, 4};
    std::optional<ConstTileView> off;
    if (mode == QuantMode::ASYM) off = offset;
    expect_error([&] { xquant::tile_quant(out, src, scale, mode, off); }, ErrorCode::aliasing, "out", {in_arg});
    EXPECT_EQ(std::memcmp(buf.data(), before.data(), buf.size() * sizeof(float)), 0);
  };
  check(0, QuantMode::SYM, "src");               // same start
  check(4 * 9 + 3, QuantMode::SYM, "src");       // out's first byte is src's last valid byte
  check(4 * 14 - 2, QuantMode::SYM, "scale");    // out's tail reaches scale[1]
  check(4 * 18 - 1, QuantMode::ASYM, "offset");  // out's first byte is offset's last byte
  // src's padding after its last valid element (floats 10, 11) is outside every span: allowed.
  const TileView ok{bytes + 4 * 10, DType::int8, 2, 4, 4};  // bytes 40..47 (span 8 bytes)
  xquant::tile_quant(ok, src, scale);
  EXPECT_EQ(bytes[40], 1);
  EXPECT_EQ(bytes[47], 1);
}

}  // namespace
