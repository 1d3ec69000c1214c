// xquant dequantize: back to floating point with the stored scales (and zero points) by the library's
// anti_quant (passes.hpp, dequantize_range), streamed in chunks like quantize; tensors that were kept as
// they were are copied.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>
#include <string>

#include "errors.hpp"
#include "files.hpp"
#include "jobs.hpp"
#include "progress.hpp"

namespace xqcli {

namespace {

constexpr std::int64_t kPieceElems = std::int64_t{1} << 18;
constexpr std::int64_t kChunkElems = std::int64_t{1} << 24;
constexpr std::uint64_t kCopyChunk = std::uint64_t{64} << 20;

// The stored tensors of one quantized tensor, checked against the metadata.
struct Source {
  const TensorEntry* data = nullptr;
  const TensorEntry* scale = nullptr;
  const TensorEntry* zero_point = nullptr;
};

Source find_source(const Header& h, const std::string& name, const QuantizedTensorInfo& qi,
                   const QuantizedFileInfo& info) {
  Source s;
  const std::string who = "quantized tensor " + quote_name(name);
  s.data = h.find(name);
  if (!s.data) bad_input(who + " is listed in xquant.tensors but missing from the file");
  const Dims want = quantized_shape(qi.shape, info.bits);
  if (s.data->dtype != quantized_dtype(info.bits) || s.data->shape != want)
    bad_input(who + " is stored as " + std::string(st_dtype_name(s.data->dtype)) + " " + clip(dims_str(s.data->shape)) +
              " but a " + std::to_string(info.bits) + "-bit quantization of " + clip(dims_str(qi.shape)) + " is " +
              std::string(st_dtype_name(quantized_dtype(info.bits))) + " " + clip(dims_str(want)));
  const Dims pshape = param_shape(qi.shape, qi.channel_dim);
  const auto param = [&](const char* suffix, bool required) -> const TensorEntry* {
    const TensorEntry* p = h.find(name + suffix);
    if (!p) {
      if (required) bad_input(who + " has no " + quote_name(name + suffix) + " tensor");
      return nullptr;
    }
    if (p->dtype != StDType::F32 || p->shape != pshape)
      bad_input(quote_name(name + suffix) + " is " + std::string(st_dtype_name(p->dtype)) + " " +
                clip(dims_str(p->shape)) + " but expected F32 " + clip(dims_str(pshape)));
    return p;
  };
  s.scale = param(kScaleSuffix, true);
  s.zero_point = param(kZeroPointSuffix, !info.symmetric);
  return s;
}

std::vector<float> read_floats(const MappedFile& in, const Header& h, const TensorEntry* t) {
  std::vector<float> v(static_cast<std::size_t>(t->numel));
  std::memcpy(v.data(), in.data() + h.data_start + t->begin, v.size() * 4);
  return v;
}

}  // namespace

void run_dequantize(const DequantizeOptions& o) {
  check_threads(o.threads);
  check_can_create(o.output, o.force);
  const MappedFile in(o.input);
  FileHeader parsed = read_file_header(in.data(), in.size(), o.input);
  const Header& h = parsed.header;
  const std::optional<QuantizedFileInfo>& info = parsed.info;
  if (!info) bad_input(o.input + ": not quantized by xquant (no xquant.format_version in its __metadata__)");

  std::map<std::string, Source> sources;
  std::set<std::string> parameter_tensors;
  for (const auto& [name, qi] : info->tensors) {
    Source s;
    try {
      s = find_source(h, name, qi, *info);
    } catch (const CliError& e) {
      throw CliError(e.exit_code(), o.input + ": " + e.what());
    }
    sources[name] = s;
    parameter_tensors.insert(s.scale->name);
    if (s.zero_point) parameter_tensors.insert(s.zero_point->name);
  }

  std::vector<OutTensor> outs;
  for (const auto& t : h.tensors) {
    if (parameter_tensors.count(t.name)) continue;
    const auto qi = info->tensors.find(t.name);
    if (qi == info->tensors.end()) {
      outs.push_back({t.name, t.dtype, t.shape, t.nbytes(), 0});
    } else {
      const StDType dt = o.dtype.value_or(qi->second.dtype);
      const auto n = static_cast<std::uint64_t>(checked_numel(qi->second.shape).value_or(0));
      outs.push_back({t.name, dt, qi->second.shape, n * st_dtype_size(dt), 0});
    }
  }
  const std::uint64_t data_size = layout_tensors(outs);
  std::map<std::string, std::string> metadata;
  for (const auto& [k, v] : h.metadata)
    if (k.rfind("xquant.", 0) != 0) metadata[k] = v;
  const std::string header = build_header(outs, metadata);
  std::map<std::string, const OutTensor*> out_of;
  for (const auto& t : outs) out_of[t.name] = &t;

  configure_threads(o.threads);
  AtomicOutput out(o.output, o.force);
  out.write_at(header.data(), header.size(), 0);
  const std::uint64_t base_off = header.size();
  Progress progress(progress_wanted(o.quiet), "dequantize", data_size, outs.size());
  std::uint64_t done = 0;
  std::size_t tensors_done = 0;
  std::vector<std::byte> buffer;
  for (const auto& t : h.tensors) {
    if (parameter_tensors.count(t.name)) continue;
    const OutTensor& ot = *out_of.at(t.name);
    const auto qi = info->tensors.find(t.name);
    if (qi == info->tensors.end()) {
      const std::byte* src = in.data() + h.data_start + t.begin;
      for (std::uint64_t off = 0; off < t.nbytes(); off += kCopyChunk) {
        const std::uint64_t len = std::min(kCopyChunk, t.nbytes() - off);
        out.write_at(src + off, static_cast<std::size_t>(len), base_off + ot.offset + off);
        in.release(h.data_start + t.begin + off, len);
        done += len;
        progress.update(done, tensors_done);
      }
    } else {
      const Source& s = sources.at(t.name);
      const std::vector<float> scale = read_floats(in, h, s.scale);
      const std::vector<float> zero_point =
          s.zero_point ? read_floats(in, h, s.zero_point) : std::vector<float>(scale.size(), 0.0f);
      const NormalForm nf = normal_form(qi->second.shape, qi->second.channel_dim);
      const std::int64_t n = checked_numel(qi->second.shape).value_or(0);
      const auto osize = static_cast<std::int64_t>(st_dtype_size(ot.dtype));
      const std::byte* q = in.data() + h.data_start + s.data->begin;
      for (std::int64_t cb = 0; cb < n; cb += kChunkElems) {
        const std::int64_t ce = std::min(n, cb + kChunkElems);
        buffer.resize(static_cast<std::size_t>((ce - cb) * osize));
        const std::int64_t npieces = (ce - cb + kPieceElems - 1) / kPieceElems;
        std::string failure;
#pragma omp parallel for schedule(dynamic, 1) if (npieces > 1)
        for (std::int64_t k = 0; k < npieces; ++k) {
          const std::int64_t b = cb + k * kPieceElems;  // a multiple of 8: packed words are not split
          const std::int64_t e = std::min(ce, b + kPieceElems);
          try {
            dequantize_range(q, info->bits, nf, scale.data(), zero_point.data(), b, e, ot.dtype,
                             buffer.data() + (b - cb) * osize);
          } catch (const std::exception& ex) {  // nothing may leave an OpenMP region
#pragma omp critical
            if (failure.empty()) failure = ex.what();
          }
        }
        if (!failure.empty()) bad_input(o.input + ": tensor " + quote_name(t.name) + ": " + failure);
        out.write_at(buffer.data(), buffer.size(), base_off + ot.offset + static_cast<std::uint64_t>(cb * osize));
        const auto qb = static_cast<std::uint64_t>(info->bits == 4 ? cb / 2 : cb);
        const auto qe = static_cast<std::uint64_t>(info->bits == 4 ? ce / 2 : ce);
        in.release(h.data_start + s.data->begin + qb, qe - qb);
        done += buffer.size();
        progress.update(done, tensors_done);
      }
    }
    in.release(h.data_start + t.begin, t.nbytes());
    progress.update(done, ++tensors_done);
  }
  progress.clear();
  out.commit();
}

}  // namespace xqcli
