// xquant inspect: the tensors of a safetensors file (name, dtype, shape, size) and, for a file written
// by xquant quantize, the quantization of each tensor.
#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "errors.hpp"
#include "files.hpp"
#include "jobs.hpp"
#include "progress.hpp"

namespace xqcli {

namespace {

struct Role {
  std::string kind = "tensor";  // tensor | quantized | scale | zero_point
  std::string of;               // for scale / zero_point: the quantized tensor
};

std::string axis_str(std::int64_t d) { return d < 0 ? "per-tensor" : "axis " + std::to_string(d); }

}  // namespace

void run_inspect(const InspectOptions& o, std::FILE* out) {
  const MappedFile in(o.path);
  FileHeader parsed = read_file_header(in.data(), in.size(), o.path);
  const Header& h = parsed.header;
  const std::optional<QuantizedFileInfo>& info = parsed.info;
  std::map<std::string, Role> roles;
  if (info)
    for (const auto& [name, qi] : info->tensors) {
      roles[name].kind = "quantized";
      roles[name + kScaleSuffix] = {"scale", name};
      if (!info->symmetric) roles[name + kZeroPointSuffix] = {"zero_point", name};
    }

  if (o.json) {
    using J = nlohmann::ordered_json;
    J j = J::object();
    j["file"] = utf8_safe(o.path);
    j["file_size"] = in.size();
    j["header_size"] = h.header_len;
    J meta = J::object();
    for (const auto& [k, v] : h.metadata) meta[k] = v;
    j["metadata"] = std::move(meta);
    if (info)
      j["quantization"] = {
          {"bits", info->bits},
          {"scheme", info->per_channel ? "per-channel" : "per-tensor"},
          {"axis", info->axis},
          {"mode", info->symmetric ? "symmetric" : "asymmetric"},
          {"xquant_version", h.metadata.count("xquant.version") ? h.metadata.at("xquant.version") : ""}};
    else
      j["quantization"] = nullptr;
    J tensors = J::array();
    for (const auto& t : h.tensors) {
      J e = J::object();
      e["name"] = t.name;
      e["dtype"] = std::string(st_dtype_name(t.dtype));
      e["shape"] = t.shape;
      e["nbytes"] = t.nbytes();
      e["data_offsets"] = {t.begin, t.end};
      const auto r = roles.find(t.name);
      const Role role = r == roles.end() ? Role{} : r->second;
      e["role"] = role.kind;
      if (!role.of.empty()) e["of"] = role.of;
      if (role.kind == "quantized") {
        const auto& qi = info->tensors.at(t.name);
        e["original_dtype"] = std::string(st_dtype_name(qi.dtype));
        e["original_shape"] = qi.shape;
        e["axis"] = qi.channel_dim < 0 ? J(nullptr) : J(qi.channel_dim);
      }
      tensors.push_back(std::move(e));
    }
    j["tensors"] = std::move(tensors);
    std::fprintf(out, "%s\n", j.dump(2).c_str());
    return;
  }

  std::uint64_t data_bytes = 0;
  for (const auto& t : h.tensors) data_bytes += t.nbytes();
  std::fprintf(out, "%s: %s, %zu tensors, header %llu bytes, data %s\n", utf8_safe(o.path).c_str(),
               Progress::bytes_str(static_cast<double>(in.size())).c_str(), h.tensors.size(),
               static_cast<unsigned long long>(h.header_len),
               Progress::bytes_str(static_cast<double>(data_bytes)).c_str());
  if (info)
    std::fprintf(out, "quantized by xquant %s: int%d, %s%s, %s\n",
                 h.metadata.count("xquant.version") ? h.metadata.at("xquant.version").c_str() : "?", info->bits,
                 info->per_channel ? "per-channel" : "per-tensor",
                 info->per_channel ? (" (axis " + info->axis + ")").c_str() : "",
                 info->symmetric ? "symmetric" : "asymmetric");
  bool any_meta = false;
  for (const auto& [k, v] : h.metadata) {
    if (k.rfind("xquant.", 0) == 0) continue;
    if (!any_meta) std::fprintf(out, "metadata:\n");
    any_meta = true;
    std::fprintf(out, "  %s: %s\n", k.c_str(), v.c_str());
  }
  std::size_t w = 4;
  for (const auto& t : h.tensors) w = std::max(w, std::min<std::size_t>(t.name.size(), 64));
  std::fprintf(out, "\n%-*s  %-7s  %-18s  %12s%s\n", static_cast<int>(w), "name", "dtype", "shape", "size",
               info ? "  quantization" : "");
  for (const auto& t : h.tensors) {
    std::string q;
    if (info) {
      const auto r = roles.find(t.name);
      if (r == roles.end()) {
        q = "-";
      } else if (r->second.kind == "quantized") {
        const auto& qi = info->tensors.at(t.name);
        q = "int" + std::to_string(info->bits) + " " + axis_str(qi.channel_dim) + " of " +
            std::string(st_dtype_name(qi.dtype)) + " " + dims_str(qi.shape);
      } else {
        q = (r->second.kind == "scale" ? "scale of " : "zero point of ") + r->second.of;
      }
    }
    std::fprintf(out, "%-*s  %-7s  %-18s  %12s%s%s\n", static_cast<int>(w), t.name.c_str(),
                 std::string(st_dtype_name(t.dtype)).c_str(), dims_str(t.shape).c_str(),
                 Progress::bytes_str(static_cast<double>(t.nbytes())).c_str(), info ? "  " : "", q.c_str());
  }
}

}  // namespace xqcli
