// xquant quantize / dequantize / inspect end to end on real files: the stored values against an
// independent formula, kept tensors byte for byte, the atomic writer, the input errors, misaligned data,
// a tensor spanning several pieces and chunks, and the JSON report.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "errors.hpp"
#include "files.hpp"
#include "jobs.hpp"
#include "passes.hpp"
#include "xquant/half.hpp"

namespace {

namespace fs = std::filesystem;
using namespace xqcli;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/xquant-cli-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
};

struct SrcTensor {
  std::string name;
  StDType dtype;
  Dims shape;
  std::vector<float> values;   // converted to dtype when written (F32 / F16 / BF16), or raw bytes
  std::vector<std::byte> raw;  // used when non-empty
};

std::vector<std::byte> encode(const SrcTensor& t) {
  if (!t.raw.empty()) return t.raw;
  std::vector<std::byte> b(t.values.size() * st_dtype_size(t.dtype));
  for (std::size_t i = 0; i < t.values.size(); ++i) {
    if (t.dtype == StDType::F32) {
      std::memcpy(b.data() + 4 * i, &t.values[i], 4);
    } else {
      const std::uint16_t h =
          t.dtype == StDType::F16 ? xquant::float_to_half(t.values[i]) : xquant::float_to_bfloat16(t.values[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

// Writes a safetensors file; `pad` extra spaces after the JSON misalign the data section.
void write_file(const std::string& path, const std::vector<SrcTensor>& ts, std::size_t pad = 0,
                const std::map<std::string, std::string>& meta = {{"format", "pt"}}) {
  std::vector<OutTensor> outs;
  std::map<std::string, std::vector<std::byte>> data;
  for (const auto& t : ts) {
    data[t.name] = encode(t);
    outs.push_back({t.name, t.dtype, t.shape, data[t.name].size(), 0});
  }
  const std::uint64_t size = layout_tensors(outs);
  std::string prefix = build_header(outs, meta);
  prefix.append(pad, ' ');
  const std::uint64_t n = prefix.size() - 8;
  for (int i = 0; i < 8; ++i) prefix[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::vector<std::byte> file(prefix.size() + size);
  std::memcpy(file.data(), prefix.data(), prefix.size());
  for (const auto& o : outs) std::memcpy(file.data() + prefix.size() + o.offset, data[o.name].data(), o.nbytes);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
}

struct Loaded {
  std::vector<std::byte> bytes;
  Header h;
  const std::byte* data(const std::string& name) const {
    const auto* t = h.find(name);
    if (!t) throw std::runtime_error("no tensor " + name);
    return bytes.data() + h.data_start + t->begin;
  }
  std::vector<float> floats(const std::string& name) const {
    const auto* t = h.find(name);
    if (!t) throw std::runtime_error("no tensor " + name);
    std::vector<float> v(static_cast<std::size_t>(t->numel));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_element(data(name), t->dtype, static_cast<std::int64_t>(i));
    return v;
  }
};

Loaded load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(f)), {});
  Loaded l;
  l.bytes.resize(s.size());
  std::memcpy(l.bytes.data(), s.data(), s.size());
  l.h = parse_header(l.bytes.data(), l.bytes.size());
  return l;
}

// Deterministic pseudo-random values in [-1, 1) times a per-row gain.
std::vector<float> values(std::size_t n, std::uint32_t seed, std::size_t row = 0) {
  std::vector<float> v(n);
  std::uint32_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float u = static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f;
    const float gain = row ? 1.0f + static_cast<float>((i / row) % 5) : 1.0f;
    v[i] = u * gain;
  }
  return v;
}

// Round half to even, written independently of the library (no rint): floor, then the fraction.
double rne(double v) {
  const double f = std::floor(v);
  const double d = v - f;
  if (d > 0.5) return f + 1.0;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}
int sat(double v, int lo, int hi) {
  return std::isnan(v) ? 0 : static_cast<int>(std::min<double>(hi, std::max<double>(lo, v)));
}

float widened(StDType dt, float v) {
  if (dt == StDType::F16) return xquant::half_to_float(xquant::float_to_half(v));
  if (dt == StDType::BF16) return xquant::bfloat16_to_float(xquant::float_to_bfloat16(v));
  return v;
}

QuantizeOptions options(const std::string& in, const std::string& out) {
  QuantizeOptions o;
  o.input = in;
  o.output = out;
  o.quiet = true;
  return o;
}

template <typename F>
void expect_cli_error(F&& f, int code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << needle;
  } catch (const CliError& e) {
    EXPECT_EQ(e.exit_code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Checks every stored value of tensor `name` against the formula, and the parameters against the data.
void check_quantized(const Loaded& out, const std::string& name, StDType src_dt, const Dims& shape,
                     const std::vector<float>& src, const QuantScheme& s) {
  SCOPED_TRACE(name);
  const std::int64_t rank = static_cast<std::int64_t>(shape.size());
  const std::int64_t d = s.per_channel ? (s.axis < 0 ? s.axis + rank : s.axis) : -1;
  const NormalForm nf = normal_form(shape, d);
  const auto scale = out.floats(name + ".scale");
  const std::vector<float> zp = s.symmetric ? std::vector<float>(scale.size(), 0.0f) : out.floats(name + ".zero_point");
  ASSERT_EQ(static_cast<std::int64_t>(scale.size()), nf.channels);
  EXPECT_EQ(out.h.find(name + ".scale")->shape, param_shape(shape, d));
  const int qmax = s.bits == 4 ? 7 : 127, qmin = s.bits == 4 ? -8 : -128;
  // Parameters from the data.
  for (std::int64_t c = 0; c < nf.channels; ++c) {
    float lo = 0, hi = 0;  // the range always contains 0
    for (std::int64_t o = 0; o < nf.outer; ++o)
      for (std::int64_t k = 0; k < nf.inner; ++k) {
        const float x = widened(src_dt, src[static_cast<std::size_t>((o * nf.channels + c) * nf.inner + k)]);
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
    const auto cc = static_cast<std::size_t>(c);
    if (s.symmetric) {
      const float amax = std::max(-lo, hi);
      EXPECT_EQ(scale[cc], amax == 0.0f ? 1.0f : amax / static_cast<float>(qmax)) << c;
    } else if (hi > lo) {
      EXPECT_EQ(scale[cc], static_cast<float>((static_cast<double>(hi) - lo) / (qmax - qmin))) << c;
      EXPECT_EQ(zp[cc], static_cast<float>(qmax - static_cast<double>(hi) / scale[cc])) << c;
    }
  }
  // Stored values: int8 y = sat(rne(x / s + zp)); int4 y = sat(rne(x * (1 / s) + zp)), packed.
  const std::byte* q = out.data(name);
  const auto n = static_cast<std::int64_t>(src.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::size_t>((i / nf.inner) % nf.channels);
    const float x = widened(src_dt, src[static_cast<std::size_t>(i)]);
    const float v = s.bits == 8 ? x / scale[c] + zp[c] : x * (1.0f / scale[c]) + zp[c];
    const int want = sat(rne(v), qmin, qmax);
    int got;
    if (s.bits == 8) {
      got = static_cast<int>(static_cast<std::int8_t>(q[i]));
    } else {
      std::uint32_t w;
      std::memcpy(&w, q + (i / 8) * 4, 4);
      got = static_cast<int>((w >> (4 * (i % 8))) & 0xF);
      if (got >= 8) got -= 16;
    }
    ASSERT_EQ(got, want) << "element " << i << " x " << x;
  }
}

TEST(Quantize, Int8PerChannelKeepsTheRestByteForByte) {
  TempDir dir;
  auto w = values(5 * 12, 1, 12);
  std::fill(w.begin() + 24, w.begin() + 36, 0.0f);  // row 2 all zero
  const std::vector<SrcTensor> src = {
      {"w", StDType::F32, {5, 12}, w, {}},
      {"h", StDType::F16, {3, 16}, values(48, 2), {}},
      {"e", StDType::BF16, {4, 8}, values(32, 3, 8), {}},
      {"bias", StDType::F32, {5}, values(5, 4), {}},
      {"ids", StDType::I64, {2}, {}, std::vector<std::byte>(16, std::byte{7})},
  };
  write_file(dir / "in.safetensors", src);
  const auto o = options(dir / "in.safetensors", dir / "out.safetensors");
  const QuantizeResult r = run_quantize(o);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"in.safetensors", "out.safetensors"}));
  const Loaded out = load(dir / "out.safetensors");
  EXPECT_EQ(out.h.metadata.at("format"), "pt");  // the input's metadata is kept
  EXPECT_EQ(out.h.metadata.at("xquant.bits"), "8");
  EXPECT_EQ(out.h.metadata.at("xquant.scheme"), "per-channel");
  EXPECT_EQ(out.h.metadata.at("xquant.mode"), "symmetric");
  EXPECT_EQ(out.h.metadata.at("xquant.axis"), "0");
  EXPECT_EQ(out.h.tensors.size(), 2u + 3u * 2u);
  for (const auto& s : src) {
    if (s.name == "bias" || s.name == "ids") {
      const auto e = encode(s);
      EXPECT_EQ(out.h.find(s.name)->dtype, s.dtype);
      EXPECT_EQ(std::memcmp(out.data(s.name), e.data(), e.size()), 0) << s.name;
      continue;
    }
    EXPECT_EQ(out.h.find(s.name)->dtype, StDType::I8);
    EXPECT_EQ(out.h.find(s.name)->shape, s.shape);
    check_quantized(out, s.name, s.dtype, s.shape, s.values, o.scheme);
  }
  EXPECT_EQ(out.floats("w.scale")[2], 1.0f);  // the all-zero row
  // Every data offset is aligned to its element size (as the official writer lays files out).
  for (const auto& t : out.h.tensors) EXPECT_EQ((out.h.data_start + t.begin) % st_dtype_size(t.dtype), 0u) << t.name;
  ASSERT_EQ(r.tensors.size(), 5u);
  EXPECT_EQ(r.file_bytes_out, out.bytes.size());
  for (const auto& t : r.tensors) {
    if (!t.quantized) continue;
    EXPECT_GT(t.error.sqnr_db(), 30.0) << t.name;
    EXPECT_GT(t.error.max_abs, 0.0) << t.name;
  }
}

TEST(Quantize, Int4AndAsymmetricSchemes) {
  TempDir dir;
  const std::vector<SrcTensor> src = {
      {"a", StDType::F32, {6, 16}, values(96, 11, 16), {}},
      {"b", StDType::BF16, {2, 3, 24}, values(144, 12, 24), {}},
      {"c", StDType::F16, {4, 8}, values(32, 13), {}},
  };
  write_file(dir / "in.safetensors", src);
  struct Case {
    int bits;
    bool per_channel;
    std::int64_t axis;
    bool symmetric;
  };
  for (const Case& k : {Case{4, true, 0, true}, Case{4, true, -1, false}, Case{4, false, 0, false},
                        Case{8, true, -1, false}, Case{8, false, 0, true}, Case{8, true, 1, true}}) {
    SCOPED_TRACE(std::to_string(k.bits) + " " + std::to_string(k.per_channel) + " " + std::to_string(k.axis) + " " +
                 std::to_string(k.symmetric));
    auto o = options(dir / "in.safetensors", dir / "out.safetensors");
    o.force = true;
    o.scheme = {k.bits, k.per_channel, k.axis, k.symmetric};
    const QuantizeResult r = run_quantize(o);
    const Loaded out = load(dir / "out.safetensors");
    for (const auto& s : src) {
      const Decision d = decide(*load(dir / "in.safetensors").h.find(s.name), o.scheme, {});
      const auto& res =
          *std::find_if(r.tensors.begin(), r.tensors.end(), [&](const TensorResult& t) { return t.name == s.name; });
      EXPECT_EQ(res.quantized, d.quantize) << s.name;
      if (!d.quantize) {
        EXPECT_TRUE(res.warned);  // axis 0 of the rank-3 tensor with int4
        continue;
      }
      EXPECT_EQ(out.h.find(s.name)->dtype, k.bits == 4 ? StDType::I32 : StDType::I8);
      EXPECT_EQ(out.h.find(s.name)->shape, quantized_shape(s.shape, k.bits));
      EXPECT_EQ(out.h.find(s.name + ".zero_point") != nullptr, !k.symmetric);
      check_quantized(out, s.name, s.dtype, s.shape, s.values, o.scheme);
    }
  }
}

TEST(Quantize, DequantizeRoundTripStaysWithinHalfAStep) {
  TempDir dir;
  const std::vector<SrcTensor> src = {
      {"a", StDType::F32, {8, 32}, values(256, 21, 32), {}},
      {"b", StDType::BF16, {4, 16}, values(64, 22), {}},
      {"n", StDType::F32, {4}, values(4, 23), {}},
  };
  write_file(dir / "in.safetensors", src);
  for (int bits : {8, 4})
    for (bool sym : {true, false}) {
      auto o = options(dir / "in.safetensors", dir / "q.safetensors");
      o.force = true;
      o.scheme.bits = bits;
      o.scheme.symmetric = sym;
      run_quantize(o);
      DequantizeOptions d;
      d.input = dir / "q.safetensors";
      d.output = dir / "d.safetensors";
      d.force = true;
      d.quiet = true;
      d.dtype = StDType::F32;
      run_dequantize(d);
      const Loaded q = load(dir / "q.safetensors");
      const Loaded dq = load(dir / "d.safetensors");
      EXPECT_EQ(dq.h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));  // xquant.* removed
      EXPECT_EQ(dq.h.tensors.size(), 3u);
      EXPECT_EQ(dq.floats("n"), src[2].values);
      for (const auto& s : {src[0], src[1]}) {
        const auto scale = q.floats(s.name + ".scale");
        const auto back = dq.floats(s.name);
        EXPECT_EQ(dq.h.find(s.name)->dtype, StDType::F32);
        EXPECT_EQ(dq.h.find(s.name)->shape, s.shape);
        const std::int64_t inner = s.shape[1];
        for (std::size_t i = 0; i < back.size(); ++i) {
          const float x = widened(s.dtype, s.values[i]);
          const double step = scale[i / static_cast<std::size_t>(inner)];
          ASSERT_LE(std::fabs(static_cast<double>(x) - back[i]), 0.5 * step * (1 + 1e-4)) << s.name << " " << i;
        }
      }
      // Back to the original dtypes by default.
      d.dtype.reset();
      run_dequantize(d);
      EXPECT_EQ(load(dir / "d.safetensors").h.find("b")->dtype, StDType::BF16);
    }
}

TEST(Quantize, NonFiniteValuesAreCountedAndFollowTheOperator) {
  TempDir dir;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {1.0f, std::nanf(""), -2.0f, inf, -inf, 0.5f, 0.25f, -1.0f};
  write_file(dir / "in.safetensors", {{"w", StDType::F32, {2, 4}, v, {}}});
  const auto o = options(dir / "in.safetensors", dir / "out.safetensors");
  const QuantizeResult r = run_quantize(o);
  EXPECT_EQ(r.tensors[0].error.nonfinite, 3);
  const Loaded out = load(dir / "out.safetensors");
  const auto* q = reinterpret_cast<const std::int8_t*>(out.data("w"));
  EXPECT_EQ(out.floats("w.scale"), (std::vector<float>{2.0f / 127.0f, 1.0f / 127.0f}));
  EXPECT_EQ(q[1], 0);     // NaN -> 0
  EXPECT_EQ(q[3], 127);   // +Inf saturates
  EXPECT_EQ(q[4], -128);  // -Inf saturates
  EXPECT_TRUE(std::isfinite(r.tensors[0].error.sqnr_db()));
}

TEST(Quantize, MisalignedDataSectionGivesTheSameResult) {
  TempDir dir;
  const std::vector<SrcTensor> src = {{"w", StDType::F32, {4, 24}, values(96, 31, 24), {}},
                                      {"h", StDType::F16, {3, 8}, values(24, 32), {}}};
  write_file(dir / "aligned.safetensors", src, 0);
  write_file(dir / "odd.safetensors", src, 3);  // data section starts at an odd offset
  EXPECT_NE(load(dir / "odd.safetensors").h.data_start % 2, 0u);
  for (int bits : {8, 4}) {
    auto a = options(dir / "aligned.safetensors", dir / "a.out");
    auto b = options(dir / "odd.safetensors", dir / "b.out");
    a.scheme.bits = b.scheme.bits = bits;
    a.force = b.force = true;
    run_quantize(a);
    run_quantize(b);
    const Loaded x = load(dir / "a.out"), y = load(dir / "b.out");
    EXPECT_EQ(x.bytes, y.bytes);
  }
}

TEST(Quantize, ManyPiecesAndChunks) {
  TempDir dir;
  // 4100 x 4104 float16: 16.8 M elements, more than one 16 M-element chunk, 65 pieces.
  const Dims shape = {4100, 4104};
  const std::vector<SrcTensor> src = {{"big", StDType::F16, shape, values(4100u * 4104u, 41, 4104), {}}};
  write_file(dir / "in.safetensors", src);
  for (int bits : {8, 4}) {
    auto o = options(dir / "in.safetensors", dir / "out.safetensors");
    o.force = true;
    o.scheme.bits = bits;
    o.scheme.axis = bits == 4 ? 0 : 1;
    o.threads = 2;
    const QuantizeResult r = run_quantize(o);
    check_quantized(load(dir / "out.safetensors"), "big", StDType::F16, shape, src[0].values, o.scheme);
    // The error sums are the same with one thread (fixed piece order).
    o.threads = 1;
    const QuantizeResult r1 = run_quantize(o);
    EXPECT_EQ(r.tensors[0].error.noise, r1.tensors[0].error.noise);
    EXPECT_EQ(r.tensors[0].error.signal, r1.tensors[0].error.signal);
  }
  configure_threads(0);
}

TEST(Quantize, RefusesBadOptionsAndInputs) {
  TempDir dir;
  write_file(dir / "in.safetensors", {{"w", StDType::F32, {2, 12}, values(24, 51), {}}});
  auto o = options(dir / "in.safetensors", dir / "out.safetensors");
  o.scheme.bits = 4;
  o.strict = true;
  expect_cli_error([&] { run_quantize(o); }, 1, "cannot be quantized with these options (--strict): int4 packs");
  o.strict = false;
  run_quantize(o);  // kept with a warning
  EXPECT_EQ(load(dir / "out.safetensors").h.find("w")->dtype, StDType::F32);
  // An existing output is refused without --force, and left as it was.
  const auto before = load(dir / "out.safetensors").bytes;
  o.scheme.bits = 8;
  expect_cli_error([&] { run_quantize(o); }, 1, "exists (use --force to replace it)");
  EXPECT_EQ(load(dir / "out.safetensors").bytes, before);
  o.force = true;
  run_quantize(o);
  EXPECT_NE(load(dir / "out.safetensors").bytes, before);
  // Quantizing a quantized file.
  auto again = options(dir / "out.safetensors", dir / "again.safetensors");
  expect_cli_error([&] { run_quantize(again); }, 1, "already quantized by xquant");
  // Dequantizing a plain file.
  DequantizeOptions d;
  d.input = dir / "in.safetensors";
  d.output = dir / "d.safetensors";
  expect_cli_error([&] { run_dequantize(d); }, 1, "not quantized by xquant");
  // A name that the scale would take.
  write_file(dir / "clash.safetensors",
             {{"w", StDType::F32, {2, 8}, values(16, 52), {}}, {"w.scale", StDType::F32, {2}, values(2, 53), {}}});
  auto clash = options(dir / "clash.safetensors", dir / "c.safetensors");
  expect_cli_error([&] { run_quantize(clash); }, 1, "tensor 'w.scale' already exists");
  // Input errors: missing (I/O, 2), a directory, an empty file, a truncated file (bad input, 1).
  auto missing = options(dir / "nope.safetensors", dir / "m.safetensors");
  expect_cli_error([&] { run_quantize(missing); }, 2, "cannot open " + (dir / "nope.safetensors"));
  auto directory = options(dir.path.string(), dir / "m.safetensors");
  expect_cli_error([&] { run_quantize(directory); }, 1, "not a regular file");
  std::ofstream(dir / "empty.safetensors").close();
  auto empty = options(dir / "empty.safetensors", dir / "m.safetensors");
  expect_cli_error([&] { run_quantize(empty); }, 1, "truncated file: 0 bytes");
  fs::resize_file(dir / "in.safetensors", fs::file_size(dir / "in.safetensors") - 4);
  auto cut = options(dir / "in.safetensors", dir / "m.safetensors");
  expect_cli_error([&] { run_quantize(cut); }, 1, "out of range");
  // An output directory that does not exist is an I/O error.
  auto nodir = options(dir / "clash.safetensors", dir / "no/such/dir/out.safetensors");
  nodir.exclude = {"w"};
  expect_cli_error([&] { run_quantize(nodir); }, 2, "cannot create a temporary file");
  // A bad regular expression is a usage error.
  auto re = options(dir / "clash.safetensors", dir / "r.safetensors");
  re.include = {"[a-"};
  expect_cli_error([&] { run_quantize(re); }, 1, "--include: invalid regular expression");
  // None of the failures left a file behind.
  EXPECT_EQ(dir.entries(),
            (std::vector<std::string>{"clash.safetensors", "empty.safetensors", "in.safetensors", "out.safetensors"}));
}

TEST(AtomicOutput, UncommittedOutputLeavesNothing) {
  TempDir dir;
  {
    AtomicOutput out(dir / "x.safetensors", false);
    out.write_at("abc", 3, 0);
    EXPECT_EQ(dir.entries().size(), 1u);  // the temporary file
    EXPECT_EQ(dir.entries()[0].rfind(".x.safetensors.xquant-", 0), 0u);
  }
  EXPECT_TRUE(dir.entries().empty());
  {
    AtomicOutput out(dir / "x.safetensors", false);
    out.write_at("abcd", 4, 2);
    out.write_at("xy", 2, 0);
    out.commit();
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"x.safetensors"}));
  std::ifstream f(dir / "x.safetensors", std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(s, std::string("xyabcd"));
  struct stat st {};
  ASSERT_EQ(::stat((dir / "x.safetensors").c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);  // not mkstemp's 0600
  // A file that appears while writing is not replaced without force.
  AtomicOutput late(dir / "y.safetensors", false);
  std::ofstream(dir / "y.safetensors") << "theirs";
  expect_cli_error([&] { late.commit(); }, 1, "appeared while writing");
}

TEST(Report, JsonHoldsTensorsAndTotals) {
  TempDir dir;
  write_file(dir / "in.safetensors", {{"w", StDType::F32, {4, 8}, values(32, 61), {}},
                                      {"z", StDType::F32, {2, 8}, std::vector<float>(16, 0.0f), {}},
                                      {"b", StDType::F32, {4}, values(4, 62), {}}});
  auto o = options(dir / "in.safetensors", dir / "out.safetensors");
  o.report_path = dir / "report.json";
  const QuantizeResult r = run_quantize(o);
  std::ifstream f(dir / "report.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["command"], "quantize");
  EXPECT_EQ(j["options"]["bits"], 8);
  ASSERT_EQ(j["tensors"].size(), 3u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& t : j["tensors"]) by[t["name"].get<std::string>()] = t;
  EXPECT_EQ(by["w"]["action"], "quantized");
  const auto& rw =
      *std::find_if(r.tensors.begin(), r.tensors.end(), [](const TensorResult& t) { return t.name == "w"; });
  EXPECT_DOUBLE_EQ(by["w"]["sqnr_db"].get<double>(), rw.error.sqnr_db());
  EXPECT_DOUBLE_EQ(by["w"]["max_abs_error"].get<double>(), rw.error.max_abs);
  EXPECT_TRUE(by["z"]["sqnr_db"].is_null());  // exact round trip of an all-zero tensor
  EXPECT_EQ(by["z"]["max_abs_error"].get<double>(), 0.0);
  EXPECT_EQ(by["b"]["action"], "kept");
  EXPECT_EQ(j["totals"]["quantized"], 2);
  EXPECT_EQ(j["totals"]["file_bytes_out"].get<std::uint64_t>(), fs::file_size(dir / "out.safetensors"));
  EXPECT_EQ(j["totals"]["file_bytes_in"].get<std::uint64_t>(), fs::file_size(dir / "in.safetensors"));
  // An existing report is not overwritten without --force (checked before any work).
  fs::remove(dir / "out.safetensors");
  expect_cli_error([&] { run_quantize(o); }, 1, "report.json exists");
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));
}

TEST(Inspect, TableAndJson) {
  TempDir dir;
  write_file(dir / "in.safetensors", {{"layer.weight", StDType::BF16, {4, 8}, values(32, 71), {}},
                                      {"layer.bias", StDType::F32, {4}, values(4, 72), {}}});
  auto o = options(dir / "in.safetensors", dir / "q.safetensors");
  o.scheme.bits = 4;
  o.scheme.symmetric = false;
  run_quantize(o);
  const auto capture = [](const InspectOptions& io) {
    std::FILE* f = std::tmpfile();
    run_inspect(io, f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
    return s;
  };
  const std::string plain = capture({dir / "in.safetensors", false});
  EXPECT_NE(plain.find("2 tensors"), std::string::npos) << plain;
  EXPECT_NE(plain.find("layer.weight  BF16     [4, 8]"), std::string::npos) << plain;
  EXPECT_NE(plain.find("format: pt"), std::string::npos);
  const std::string q = capture({dir / "q.safetensors", false});
  EXPECT_NE(q.find("quantized by xquant"), std::string::npos) << q;
  EXPECT_NE(q.find("int4, per-channel (axis 0), asymmetric"), std::string::npos) << q;
  EXPECT_NE(q.find("int4 axis 0 of BF16 [4, 8]"), std::string::npos) << q;
  EXPECT_NE(q.find("zero point of layer.weight"), std::string::npos) << q;
  const auto j = nlohmann::json::parse(capture({dir / "q.safetensors", true}));
  EXPECT_EQ(j["quantization"]["bits"], 4);
  std::map<std::string, nlohmann::json> by;
  for (const auto& t : j["tensors"]) by[t["name"].get<std::string>()] = t;
  EXPECT_EQ(by["layer.weight"]["role"], "quantized");
  EXPECT_EQ(by["layer.weight"]["dtype"], "I32");
  EXPECT_EQ(by["layer.weight"]["original_shape"], nlohmann::json::array({4, 8}));
  EXPECT_EQ(by["layer.weight.scale"]["role"], "scale");
  EXPECT_EQ(by["layer.weight.zero_point"]["of"], "layer.weight");
  EXPECT_EQ(by["layer.bias"]["role"], "tensor");
  expect_cli_error([&] { capture({dir / "missing", false}); }, 2, "cannot open");
}

// --threads is capped at kMaxThreads; a huge OMP_NUM_THREADS is lowered before OpenMP starts (LLVM's
// libomp failed an assertion on 2147483647, issue 11).
TEST(Threads, LimitsAndOpenMpEnvironment) {
  EXPECT_NO_THROW(check_threads(0));
  EXPECT_NO_THROW(check_threads(kMaxThreads));
  for (int bad : {-1, kMaxThreads + 1, 2147483647}) {
    try {
      check_threads(bad);
      ADD_FAILURE() << bad;
    } catch (const CliError& e) {
      EXPECT_EQ(e.exit_code(), 1);
      EXPECT_NE(
          std::string(e.what()).find("--threads is " + std::to_string(bad) + " but expected a value in [0, 1024]"),
          std::string::npos)
          << e.what();
    }
  }
  const char* old = std::getenv("OMP_NUM_THREADS");
  const std::string saved = old ? old : "";
  for (const auto& [in, want] :
       std::vector<std::pair<std::string, std::string>>{{"2147483647", "1024"},
                                                        {"4", "4"},
                                                        {"1025", "1024"},
                                                        {"1024", "1024"},
                                                        {" 99999999999999999999 , 3", "1024, 3"},
                                                        {"8,2048", "8,1024"},
                                                        {"abc", "abc"}}) {
    ::setenv("OMP_NUM_THREADS", in.c_str(), 1);
    cap_openmp_environment();
    EXPECT_EQ(std::string(std::getenv("OMP_NUM_THREADS")), want) << in;
  }
  if (old)
    ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    ::unsetenv("OMP_NUM_THREADS");
}

}  // namespace
