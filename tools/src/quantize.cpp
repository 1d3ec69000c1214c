// xquant quantize: stream a safetensors checkpoint tensor by tensor through xquant::quantize.
//
// The output header is computed first (every size is known from the input header), then each tensor is
// processed in input order: a min / max pass for its parameters, then pieces of at most kPieceElems
// elements quantized in parallel into a chunk buffer of at most kChunkElems elements, whose round-trip
// error is measured while the piece is in cache, and the chunk is written at its offset. Memory stays
// bounded by the chunk buffer whatever the checkpoint's size; the input is mapped, not read.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "errors.hpp"
#include "files.hpp"
#include "jobs.hpp"
#include "progress.hpp"
#include "writer.hpp"
#include "xquant/quantize.hpp"
#include "xquant/version.hpp"

namespace xqcli {

static_assert(std::endian::native == std::endian::little, "safetensors data is little endian");

namespace {

constexpr std::int64_t kPieceElems = std::int64_t{1} << 18;
constexpr std::int64_t kChunkElems = std::int64_t{1} << 24;
constexpr std::uint64_t kCopyChunk = std::uint64_t{64} << 20;

xquant::DType lib_dtype(StDType dt) {
  switch (dt) {
    case StDType::F16:
      return xquant::DType::float16;
    case StDType::BF16:
      return xquant::DType::bfloat16;
    default:
      return xquant::DType::float32;
  }
}

xquant::Shape lib_shape(const Dims& d) { return xquant::Shape(d.begin(), d.end()); }

struct Job {
  const QuantizeOptions& o;
  const MappedFile& in;
  const Header& h;
  AsyncWriter& out;
  std::uint64_t out_data_start;
  Progress& progress;
  std::uint64_t bytes_done = 0;
  std::size_t tensors_done = 0;

  void copy_tensor(const TensorEntry& t, std::uint64_t out_offset) {
    const std::byte* src = in.data() + h.data_start + t.begin;
    for (std::uint64_t off = 0; off < t.nbytes(); off += kCopyChunk) {
      const std::uint64_t len = std::min(kCopyChunk, t.nbytes() - off);
      out.submit_view(src + off, static_cast<std::size_t>(len), out_data_start + out_offset + off, &in,
                      h.data_start + t.begin + off);
      bytes_done += len;
      progress.update(bytes_done, tensors_done);
    }
  }

  void quantize_tensor(const TensorEntry& t, const Decision& d, std::uint64_t data_off, std::uint64_t scale_off,
                       std::optional<std::uint64_t> zp_off, TensorResult& res) {
    const int bits = o.scheme.bits;
    const std::byte* base = in.data() + h.data_start + t.begin;
    const auto esize = static_cast<std::int64_t>(st_dtype_size(t.dtype));
    const auto channels = static_cast<std::size_t>(d.channels);
    const std::vector<Piece> pieces = plan_pieces(t.shape, d.channel_dim, kPieceElems, bits == 4 ? 8 : 1);

    // Chunks: runs of consecutive pieces of at most kChunkElems elements (at least one piece).
    std::vector<std::pair<std::size_t, std::size_t>> chunks;
    for (std::size_t first = 0; first < pieces.size();) {
      std::size_t last = first;
      std::int64_t count = 0;
      while (last < pieces.size() && (last == first || count + pieces[last].count <= kChunkElems))
        count += pieces[last++].count;
      chunks.emplace_back(first, last);
      first = last;
    }
    // Input pages of a finished chunk leave the resident set (they stay in the page cache).
    const auto release = [&](std::size_t first, std::size_t last) {
      const auto b = static_cast<std::uint64_t>(pieces[first].begin * esize);
      const auto e = static_cast<std::uint64_t>((pieces[last - 1].begin + pieces[last - 1].count) * esize);
      in.release(h.data_start + t.begin + b, e - b);
    };

    // 1. Finite min / max per channel (exact, so the merge order does not matter).
    std::vector<float> lo(channels, std::numeric_limits<float>::infinity());
    std::vector<float> hi(channels, -std::numeric_limits<float>::infinity());
    std::int64_t nonfinite = 0;
    // Tiny tensors (one piece) run on the calling thread: waking the team for each of 100k tensors
    // costs far more than the work. The results do not depend on the thread count either way.
    const bool parallel = pieces.size() > 1;
    for (const auto& chunk : chunks) {
      // Plain copies: clang 14 cannot capture structured bindings in an OpenMP region.
      const std::size_t first = chunk.first, last = chunk.second;
#pragma omp parallel if (parallel)
      {
        std::vector<float> l(channels, std::numeric_limits<float>::infinity());
        std::vector<float> u(channels, -std::numeric_limits<float>::infinity());
        std::int64_t bad = 0;
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t k = static_cast<std::int64_t>(first); k < static_cast<std::int64_t>(last); ++k)
          piece_minmax(base, t.dtype, pieces[static_cast<std::size_t>(k)], l.data(), u.data(), bad);
#pragma omp critical
        {
          for (std::size_t c = 0; c < channels; ++c) {
            lo[c] = std::min(lo[c], l[c]);
            hi[c] = std::max(hi[c], u[c]);
          }
          nonfinite += bad;
        }
      }
      if (chunks.size() > 1) release(first, last);
    }

    // 2. Parameters: the stored scale is the step s; quint4x2 (div_mode=false) multiplies by 1 / s.
    const QParams params = compute_params(lo, hi, bits, o.scheme.symmetric);
    const auto as_bytes = [](const std::vector<float>& v) {
      std::vector<std::byte> b(v.size() * 4);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    out.submit(as_bytes(params.scale), out_data_start + scale_off);
    if (zp_off) out.submit(as_bytes(params.zero_point), out_data_start + *zp_off);
    std::vector<float> call_scale = params.scale;
    if (bits == 4)
      for (auto& s : call_scale) s = 1.0f / s;  // the multiplier of y = rint(x * scale + offset)
    const xquant::QuantDType qdtype = bits == 4 ? xquant::QuantDType::quint4x2 : xquant::QuantDType::qint8;
    const xquant::DType store = bits == 4 ? xquant::DType::int32 : xquant::DType::int8;
    const bool div_mode = bits == 8;

    // 3. Quantize chunk by chunk; pieces of a chunk in parallel.
    std::vector<ErrorStats> errors(pieces.size());
    for (const auto& chunk : chunks) {
      const std::size_t first = chunk.first, last = chunk.second;
      std::int64_t count = 0;
      for (std::size_t k = first; k < last; ++k) count += pieces[k].count;
      const std::int64_t chunk_begin = pieces[first].begin;
      const auto chunk_bytes = static_cast<std::size_t>(bits == 4 ? count / 2 : count);
      std::vector<std::byte> buffer = out.buffer();
      buffer.resize(chunk_bytes);
      std::byte* obytes = buffer.data();  // operator new's alignment: enough for int32 words
      std::string failure;
#pragma omp parallel if (parallel)
      {
        std::vector<std::byte> staging;
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t kk = static_cast<std::int64_t>(first); kk < static_cast<std::int64_t>(last); ++kk) {
          const Piece& p = pieces[static_cast<std::size_t>(kk)];
          try {
            const std::byte* src = base + p.begin * esize;
            if (reinterpret_cast<std::uintptr_t>(src) % static_cast<std::uintptr_t>(esize) != 0) {
              // The library reads typed elements: give it an aligned copy of a misaligned run.
              staging.resize(static_cast<std::size_t>(p.count * esize) + 8);
              const std::uintptr_t addr = reinterpret_cast<std::uintptr_t>(staging.data());
              std::byte* aligned = staging.data() + ((8 - addr % 8) % 8);  // the first 8-byte boundary
              std::memcpy(aligned, src, static_cast<std::size_t>(p.count * esize));
              src = aligned;
            }
            std::byte* dst = obytes + (bits == 4 ? (p.begin - chunk_begin) / 2 : p.begin - chunk_begin);
            const xquant::ConstTensorView xin(src, lib_dtype(t.dtype), lib_shape(p.shape));
            const xquant::TensorView yout(dst, store, lib_shape(quantized_shape(p.shape, bits)));
            const xquant::ConstTensorView sv(call_scale.data() + p.ch_begin, xquant::DType::float32, {p.ch_count});
            std::optional<xquant::ConstTensorView> zv;
            if (!o.scheme.symmetric)
              zv = xquant::ConstTensorView(params.zero_point.data() + p.ch_begin, xquant::DType::float32, {p.ch_count});
            std::int64_t axis = 0;
            if (bits == 8)
              axis = p.ch_dim >= 0 ? p.ch_dim : 0;
            else
              axis = (p.ch_count > 1 && p.ch_dim == static_cast<std::int64_t>(p.shape.size()) - 2) ? -2 : -1;
            xquant::quantize_out(yout, xin, sv, zv, qdtype, axis, div_mode);
            errors[static_cast<std::size_t>(kk)] =
                piece_error(base, t.dtype, p, dst, bits, params.scale.data(), params.zero_point.data());
          } catch (const std::exception& e) {
#pragma omp critical
            if (failure.empty()) failure = e.what();
          }
        }
      }
      if (!failure.empty()) bad_input("tensor " + quote_name(t.name) + ": " + failure);
      out.submit(std::move(buffer),
                 out_data_start + data_off + static_cast<std::uint64_t>(bits == 4 ? chunk_begin / 2 : chunk_begin));
      bytes_done += static_cast<std::uint64_t>(count * esize);
      progress.update(bytes_done, tensors_done);
      release(first, last);
    }
    // Piece order, not thread order: the sums do not depend on the thread count.
    for (const auto& e : errors) res.error.merge(e);
    res.error.nonfinite = nonfinite;
  }
};

std::string gb_per_s(std::uint64_t bytes, double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0);
  return buf;
}

}  // namespace

void cap_openmp_environment() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (!env) return;
  // A comma-separated list of thread counts (one per nesting level), possibly with spaces.
  std::string out;
  bool changed = false;
  for (std::string_view rest(env);;) {
    const std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    std::size_t b = 0, e = item.size();
    while (b < e && (item[b] == ' ' || item[b] == '\t')) ++b;
    while (e > b && (item[e - 1] == ' ' || item[e - 1] == '\t')) --e;
    const std::string_view digits = item.substr(b, e - b);
    const bool numeric = !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
    if (numeric && (digits.size() > 4 || std::stoi(std::string(digits)) > kMaxThreads)) {
      out += std::to_string(kMaxThreads);
      changed = true;
    } else {
      out.append(item);
    }
    if (comma == std::string_view::npos) break;
    out.push_back(',');
    rest.remove_prefix(comma + 1);
  }
  if (changed) ::setenv("OMP_NUM_THREADS", out.c_str(), 1);
}

void check_threads(int threads, const char* option) {
  if (threads < 0 || threads > kMaxThreads)
    bad_input(std::string(option) + " is " + std::to_string(threads) + " but expected a value in [0, " +
              std::to_string(kMaxThreads) + "] (0: every core)");
}

void configure_threads(int threads) {
  check_threads(threads);
  if (threads > 0)
    omp_set_num_threads(threads);
  else if (omp_get_max_threads() > kMaxThreads)
    omp_set_num_threads(kMaxThreads);  // a huge OMP_NUM_THREADS
  omp_set_max_active_levels(1);
}

QuantizeResult run_quantize(const QuantizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const Filters filters{compile_patterns(o.include, "--include"), compile_patterns(o.exclude, "--exclude")};
  if (o.scheme.bits != 8 && o.scheme.bits != 4) bad_input("--bits must be 8 or 4");
  check_threads(o.threads);
  check_can_create(o.output, o.force);
  if (!o.report_path.empty()) check_can_create(o.report_path, o.force);
  if (!o.report_path.empty() && o.report_path == o.output)
    bad_input("--report " + o.report_path + " is the output file too");

  const MappedFile in(o.input);
  Header h;
  try {
    h = parse_header(in.data(), in.size());
  } catch (const CliError& e) {
    throw CliError(e.exit_code(), o.input + ": " + e.what());
  }
  bool quantized = false;
  try {
    quantized = parse_quant_metadata(h.metadata).has_value();
  } catch (const CliError& e) {
    throw CliError(e.exit_code(), o.input + ": " + e.what());
  }
  if (quantized) bad_input(o.input + ": already quantized by xquant (its __metadata__ has xquant.format_version)");

  // Decide every tensor and lay out the output before reading any data.
  QuantizeResult result;
  std::set<std::string> names;
  for (const auto& t : h.tensors) names.insert(t.name);
  std::vector<Decision> decisions;
  std::vector<OutTensor> outs;
  QuantizedFileInfo qinfo;
  qinfo.bits = o.scheme.bits;
  qinfo.per_channel = o.scheme.per_channel;
  qinfo.symmetric = o.scheme.symmetric;
  qinfo.axis = o.scheme.per_channel ? std::to_string(o.scheme.axis) : "none";
  for (const auto& t : h.tensors) {
    Decision d = decide(t, o.scheme, filters);
    if (d.warn && o.strict)
      bad_input("tensor " + quote_name(t.name) + " cannot be quantized with these options (--strict): " + d.reason);
    TensorResult r;
    r.name = t.name;
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.bytes_in = t.nbytes();
    r.quantized = d.quantize;
    r.reason = d.reason;
    r.warned = d.warn;
    if (d.quantize) {
      for (const char* suffix : {kScaleSuffix, kZeroPointSuffix})
        if (names.count(t.name + suffix))
          bad_input(o.input + ": tensor " + quote_name(t.name + suffix) + " already exists, so the parameters of " +
                    quote_name(t.name) + " cannot be stored under that name");
      r.channel_dim = d.channel_dim;
      r.channels = d.channels;
      r.stored_dtype = quantized_dtype(o.scheme.bits);
      r.stored_shape = quantized_shape(t.shape, o.scheme.bits);
      const auto qbytes = static_cast<std::uint64_t>(o.scheme.bits == 4 ? t.numel / 2 : t.numel);
      const auto pbytes = static_cast<std::uint64_t>(d.channels) * 4;
      outs.push_back({t.name, r.stored_dtype, r.stored_shape, qbytes, 0});
      outs.push_back({t.name + kScaleSuffix, StDType::F32, param_shape(t.shape, d.channel_dim), pbytes, 0});
      if (!o.scheme.symmetric)
        outs.push_back({t.name + kZeroPointSuffix, StDType::F32, param_shape(t.shape, d.channel_dim), pbytes, 0});
      r.bytes_out = qbytes + pbytes * (o.scheme.symmetric ? 1 : 2);
      qinfo.tensors[t.name] = {t.dtype, t.shape, d.channel_dim};
    } else {
      r.stored_dtype = t.dtype;
      r.stored_shape = t.shape;
      r.bytes_out = t.nbytes();
      outs.push_back({t.name, t.dtype, t.shape, t.nbytes(), 0});
    }
    decisions.push_back(d);
    result.tensors.push_back(std::move(r));
  }
  const std::uint64_t data_size = layout_tensors(outs);
  std::map<std::string, std::string> metadata = h.metadata;
  for (auto& [k, v] : quant_metadata(qinfo)) metadata[k] = v;
  const std::string header = build_header(outs, metadata);
  std::map<std::string, std::uint64_t> offset_of;
  for (const auto& t : outs) offset_of[t.name] = t.offset;

  if (!o.quiet)
    for (const auto& r : result.tensors)
      if (r.warned)
        std::fprintf(stderr, "xquant: warning: keeping '%s' as %s: %s\n", r.name.c_str(),
                     std::string(st_dtype_name(r.dtype)).c_str(), r.reason.c_str());

  configure_threads(o.threads);
  AtomicOutput out(o.output, o.force);
  // The report's temporary file too, before any work: an unwritable report fails the run early, and
  // neither file is renamed into place unless both were written and synced.
  std::optional<AtomicOutput> rep;
  if (!o.report_path.empty()) rep.emplace(o.report_path, o.force);
  out.write_at(header.data(), header.size(), 0);
  std::uint64_t total_bytes = 0;
  for (const auto& t : h.tensors) total_bytes += t.nbytes();
  Progress progress(progress_wanted(o.quiet), "quantize", total_bytes, h.tensors.size());
  AsyncWriter writer(out);
  Job job{o, in, h, writer, header.size(), progress};
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorEntry& t = h.tensors[i];
    if (decisions[i].quantize) {
      std::optional<std::uint64_t> zp;
      if (!o.scheme.symmetric) zp = offset_of.at(t.name + kZeroPointSuffix);
      job.quantize_tensor(t, decisions[i], offset_of.at(t.name), offset_of.at(t.name + kScaleSuffix), zp,
                          result.tensors[i]);
      result.total.merge(result.tensors[i].error);
    } else {
      job.copy_tensor(t, offset_of.at(t.name));
    }
    ++job.tensors_done;
    progress.update(job.bytes_done, job.tensors_done);
  }
  writer.finish();
  in.release(h.data_start, h.data_size);
  progress.clear();
  out.sync();
  result.file_bytes_in = in.size();
  result.file_bytes_out = header.size() + data_size;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (rep) {
    const std::string json = report_json(o, result) + "\n";
    rep->write_at(json.data(), json.size(), 0);
    rep->sync();
  }
  // Everything is written and synced: only the renames are left.
  out.commit();
  if (rep) rep->commit();
  return result;
}

// ---- the report ----

namespace {

nlohmann::ordered_json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::vector<std::string> safe_list(const std::vector<std::string>& v) {
  std::vector<std::string> r;
  r.reserve(v.size());
  for (const auto& s : v) r.push_back(utf8_safe(s));
  return r;
}

std::string scheme_str(const QuantScheme& s) {
  return std::string(s.bits == 4 ? "int4 (quint4x2)" : "int8") + ", " +
         (s.per_channel ? "per-channel (axis " + std::to_string(s.axis) + ")" : "per-tensor") + ", " +
         (s.symmetric ? "symmetric" : "asymmetric");
}

}  // namespace

std::string report_json(const QuantizeOptions& o, const QuantizeResult& r) {
  using J = nlohmann::ordered_json;
  J j = J::object();
  j["xquant_version"] = xquant::kVersion;
  j["command"] = "quantize";
  j["input"] = utf8_safe(o.input);
  j["output"] = utf8_safe(o.output);
  j["options"] = {{"bits", o.scheme.bits},
                  {"scheme", o.scheme.per_channel ? "per-channel" : "per-tensor"},
                  {"axis", o.scheme.axis},
                  {"mode", o.scheme.symmetric ? "symmetric" : "asymmetric"},
                  {"include", safe_list(o.include)},
                  {"exclude", safe_list(o.exclude)},
                  {"strict", o.strict},
                  {"threads", o.threads}};
  J tensors = J::array();
  std::size_t quantized = 0, warned = 0;
  std::uint64_t q_in = 0, q_out = 0;
  for (const auto& t : r.tensors) {
    J e = J::object();
    e["name"] = t.name;
    e["dtype"] = std::string(st_dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["action"] = t.quantized ? "quantized" : "kept";
    if (t.quantized) {
      ++quantized;
      q_in += t.bytes_in;
      q_out += t.bytes_out;
      e["stored_dtype"] = std::string(st_dtype_name(t.stored_dtype));
      e["stored_shape"] = t.stored_shape;
      e["axis"] = t.channel_dim < 0 ? J(nullptr) : J(t.channel_dim);
      e["channels"] = t.channels;
      e["sqnr_db"] = number_or_null(t.error.sqnr_db());
      e["round_trip"] = t.error.round_trip();
      e["max_abs_error"] = number_or_null(t.error.max_abs);
      e["nonfinite"] = t.error.nonfinite;
    } else {
      e["reason"] = t.reason;
      e["warning"] = t.warned;
      if (t.warned) ++warned;
    }
    e["bytes_in"] = t.bytes_in;
    e["bytes_out"] = t.bytes_out;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  j["totals"] = {
      {"tensors", r.tensors.size()},
      {"quantized", quantized},
      {"kept", r.tensors.size() - quantized},
      {"warnings", warned},
      {"file_bytes_in", r.file_bytes_in},
      {"file_bytes_out", r.file_bytes_out},
      {"compression_ratio",
       r.file_bytes_out ? static_cast<double>(r.file_bytes_in) / static_cast<double>(r.file_bytes_out) : 0.0},
      {"quantized_bytes_in", q_in},
      {"quantized_bytes_out", q_out},
      {"seconds", r.seconds},
      {"gb_per_s", r.seconds > 0 ? static_cast<double>(r.file_bytes_in) / r.seconds / 1e9 : 0.0},
      {"sqnr_db", number_or_null(r.total.sqnr_db())},
      {"round_trip", quantized ? J(r.total.round_trip()) : J(nullptr)},
      {"max_abs_error", number_or_null(r.total.max_abs)}};
  return j.dump(2);
}

void print_summary(std::FILE* out, const QuantizeResult& r, const char* stored, const char* kept_heading,
                   const char* size_what) {
  std::size_t w = 6;
  for (const auto& t : r.tensors)
    if (t.quantized) w = std::max(w, std::min<std::size_t>(t.name.size(), 64));
  std::size_t quantized = 0;
  std::map<std::string, std::size_t> kept;
  for (const auto& t : r.tensors) {
    if (t.quantized) {
      if (quantized++ == 0)
        std::fprintf(out, "\n%-*s  %-5s  %-14s %-6s %9s  %12s\n", static_cast<int>(w), "tensor", "dtype", "shape",
                     "stored", "SQNR dB", "max abs err");
      // An exact round trip says "exact", a NaN / overflow "not finite": never "inf".
      const std::string rt = t.error.round_trip();
      const double sq = t.error.sqnr_db();
      std::fprintf(out, "%-*s  %-5s  %-14s %-6s %9s  %12s\n", static_cast<int>(w), t.name.c_str(),
                   std::string(st_dtype_name(t.dtype)).c_str(), dims_str(t.shape).c_str(),
                   stored ? stored : std::string(st_dtype_name(t.stored_dtype)).c_str(),
                   rt == "exact"                        ? "exact"
                   : rt == "lossy" && std::isfinite(sq) ? fmt("%.2f", sq).c_str()
                                                        : "not finite",
                   fmt("%.3e", t.error.max_abs).c_str());
      if (rt == "non-finite")
        std::fprintf(out, "%-*s  (the round-trip error is not finite: a dequantized value overflowed or is NaN)\n",
                     static_cast<int>(w), "");
      if (t.error.nonfinite)
        std::fprintf(out, "%-*s  (%lld NaN/Inf values: excluded from the scales, NaN -> 0, +-Inf saturate)\n",
                     static_cast<int>(w), "", static_cast<long long>(t.error.nonfinite));
    } else {
      ++kept[t.warned ? "warning: " + t.reason : t.reason];
    }
  }
  if (!kept.empty()) {
    std::fprintf(out, "\n%s (%zu):\n", kept_heading, r.tensors.size() - quantized);
    for (const auto& [reason, n] : kept) std::fprintf(out, "  %zu x %s\n", n, reason.c_str());
  }
  const double ratio =
      r.file_bytes_out ? static_cast<double>(r.file_bytes_in) / static_cast<double>(r.file_bytes_out) : 0.0;
  std::fprintf(out, "\ntotal: %zu of %zu tensors quantized, SQNR %s, max abs err %.3e\n", quantized, r.tensors.size(),
               quantized == 0 ? "-" : r.total.sqnr_text().c_str(), r.total.max_abs);
  std::fprintf(out, "size:  %s -> %s%s (%.2fx %s)\n", Progress::bytes_str(static_cast<double>(r.file_bytes_in)).c_str(),
               Progress::bytes_str(static_cast<double>(r.file_bytes_out)).c_str(), size_what,
               ratio >= 1.0 || ratio == 0.0 ? ratio : 1.0 / ratio, ratio >= 1.0 || ratio == 0.0 ? "smaller" : "larger");
  std::fprintf(out, "time:  %.3f s, %s GB/s\n", r.seconds, gb_per_s(r.file_bytes_in, r.seconds).c_str());
}

void print_report(std::FILE* out, const QuantizeOptions& o, const QuantizeResult& r) {
  std::fprintf(out, "xquant %s quantize: %s -> %s\n", xquant::kVersion, utf8_safe(o.input).c_str(),
               utf8_safe(o.output).c_str());
  std::fprintf(out, "scheme: %s\n", scheme_str(o.scheme).c_str());
  print_summary(out, r, nullptr, "kept as is", "");
  if (!o.report_path.empty()) std::fprintf(out, "report: %s\n", utf8_safe(o.report_path).c_str());
}

}  // namespace xqcli
