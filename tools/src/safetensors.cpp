// The safetensors header: parsing with full validation (every malformed input gets a message, never a
// crash or an out-of-range read) and writing.
#include "safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "errors.hpp"

namespace xqcli {

namespace {

struct DTypeInfo {
  StDType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DTypeInfo, 16> kDTypes{{
    {StDType::BOOL, "BOOL", 1},      {StDType::U8, "U8", 1},   {StDType::I8, "I8", 1},
    {StDType::F8_E5M2, "F8_E5M2", 1}, {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::F8_E8M0, "F8_E8M0", 1},
    {StDType::I16, "I16", 2},        {StDType::U16, "U16", 2}, {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2},      {StDType::I32, "I32", 4}, {StDType::U32, "U32", 4},
    {StDType::F32, "F32", 4},        {StDType::F64, "F64", 8}, {StDType::I64, "I64", 8},
    {StDType::U64, "U64", 8},
}};

const DTypeInfo& info(StDType dt) noexcept { return kDTypes[static_cast<std::size_t>(dt)]; }

std::string q_name(std::string_view s) {
  std::string r;
  r.reserve(s.size() + 2);
  r.push_back('\'');
  r.append(s);
  r.push_back('\'');
  return r;
}

std::string json_type(const nlohmann::json& j) { return j.type_name(); }

// A non-negative JSON integer that fits int64, or nullopt.
std::optional<std::uint64_t> as_count(const nlohmann::json& j) {
  if (!j.is_number_unsigned()) return std::nullopt;
  const auto v = j.get<std::uint64_t>();
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
  return v;
}

TensorEntry parse_entry(const std::string& name, const nlohmann::json& j, std::uint64_t data_size) {
  const std::string who = "tensor " + q_name(name);
  if (!j.is_object()) bad_input(who + ": expected an object with dtype, shape and data_offsets, got " + json_type(j));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) bad_input(who + ": missing \"" + key + "\"");
  TensorEntry t;
  t.name = name;

  const auto& dt = j.at("dtype");
  if (!dt.is_string()) bad_input(who + ": \"dtype\" must be a string, got " + json_type(dt));
  const auto parsed = parse_st_dtype(dt.get<std::string>());
  if (!parsed) bad_input(who + ": unknown dtype " + q_name(dt.get<std::string>()));
  t.dtype = *parsed;

  const auto& shape = j.at("shape");
  if (!shape.is_array()) bad_input(who + ": \"shape\" must be an array of non-negative integers, got " + json_type(shape));
  for (const auto& d : shape) {
    const auto v = as_count(d);
    if (!v) bad_input(who + ": \"shape\" must hold non-negative integers, got " + d.dump());
    t.shape.push_back(static_cast<std::int64_t>(*v));
  }
  const auto numel = checked_numel(t.shape);
  if (!numel) bad_input(who + ": shape " + dims_str(t.shape) + " has more elements than fit in 64 bits");
  t.numel = *numel;

  const auto& off = j.at("data_offsets");
  if (!off.is_array() || off.size() != 2)
    bad_input(who + ": \"data_offsets\" must be [begin, end], got " + off.dump());
  const auto b = as_count(off[0]);
  const auto e = as_count(off[1]);
  if (!b || !e) bad_input(who + ": \"data_offsets\" must be two non-negative integers, got " + off.dump());
  t.begin = *b;
  t.end = *e;
  if (t.begin > t.end) bad_input(who + ": data_offsets " + off.dump() + " end before they begin");
  if (t.end > data_size)
    bad_input(who + ": data_offsets " + off.dump() + " are out of range: the data section has " +
              std::to_string(data_size) + " bytes (truncated file?)");

  const std::uint64_t esize = info(t.dtype).size;
  const auto n = static_cast<std::uint64_t>(t.numel);
  if (n != 0 && esize > std::numeric_limits<std::uint64_t>::max() / n)
    bad_input(who + ": shape " + dims_str(t.shape) + " is too large");
  if (n * esize != t.nbytes())
    bad_input(who + ": shape/size mismatch: dtype " + std::string(info(t.dtype).name) + " and shape " +
              dims_str(t.shape) + " need " + std::to_string(n * esize) + " bytes but data_offsets " +
              off.dump() + " span " + std::to_string(t.nbytes()));
  return t;
}

}  // namespace

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}
std::string_view st_dtype_name(StDType dt) noexcept { return info(dt).name; }
std::size_t st_dtype_size(StDType dt) noexcept { return info(dt).size; }
bool st_is_quantizable(StDType dt) noexcept { return dt == StDType::F32 || dt == StDType::F16 || dt == StDType::BF16; }

std::string dims_str(const Dims& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

std::optional<std::int64_t> checked_numel(const Dims& dims) noexcept {
  std::int64_t n = 1;
  for (std::int64_t d : dims) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

const TensorEntry* Header::find(std::string_view name) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse_header(const std::byte* file, std::uint64_t file_size) {
  if (file_size < 8)
    bad_input("truncated file: " + std::to_string(file_size) +
              " bytes, but a safetensors file starts with an 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(file[i]);  // little endian
  if (n > file_size - 8)
    bad_input("header length " + std::to_string(n) + " exceeds the file: only " + std::to_string(file_size - 8) +
              " bytes follow the 8-byte length (truncated file, or not a safetensors file)");
  if (n > kMaxHeaderLen)
    bad_input("header length " + std::to_string(n) + " is above the limit of " + std::to_string(kMaxHeaderLen) +
              " bytes");

  Header h;
  h.header_len = n;
  h.data_start = 8 + n;
  h.data_size = file_size - h.data_start;

  const char* text = reinterpret_cast<const char*>(file + 8);
  // Duplicate names would make the file ambiguous (a JSON parser keeps one of them silently).
  std::set<std::string> seen;
  std::string duplicate;
  const nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t ev,
                                                         nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() && duplicate.empty()) {
      auto key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = std::move(key);
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, text + n, on_event);
  } catch (const nlohmann::json::exception& e) {
    bad_input(std::string("malformed JSON header: ") + e.what());
  }
  if (!duplicate.empty()) bad_input("the JSON header names tensor " + q_name(duplicate) + " twice");
  if (!j.is_object()) bad_input("the JSON header must be an object, got " + json_type(j));

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad_input("__metadata__ must be an object of strings, got " + json_type(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          bad_input("__metadata__ must map strings to strings, but " + q_name(mk) + " is " + json_type(mv));
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, h.data_size));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  // Two non-empty tensors overlap when one begins before the previous furthest end.
  const TensorEntry* furthest = nullptr;
  for (const auto& t : h.tensors) {
    if (t.nbytes() == 0) continue;
    if (furthest && t.begin < furthest->end)
      bad_input("tensors " + q_name(furthest->name) + " [" + std::to_string(furthest->begin) + ", " +
                std::to_string(furthest->end) + ") and " + q_name(t.name) + " [" + std::to_string(t.begin) + ", " +
                std::to_string(t.end) + ") overlap in the data section");
    if (!furthest || t.end > furthest->end) furthest = &t;
  }
  return h;
}

std::uint64_t layout_tensors(std::vector<OutTensor>& tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const OutTensor& a, const OutTensor& b) {
    const auto sa = st_dtype_size(a.dtype), sb = st_dtype_size(b.dtype);
    if (sa != sb) return sa > sb;
    return a.name < b.name;
  });
  std::uint64_t offset = 0;
  for (auto& t : tensors) {
    t.offset = offset;
    offset += t.nbytes;
  }
  return offset;
}

std::string build_header(const std::vector<OutTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = std::move(m);
  }
  for (const auto& t : tensors) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(st_dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {t.offset, t.offset + t.nbytes};
    j[t.name] = std::move(e);
  }
  std::string text = j.dump();
  // Invalid UTF-8 in a name cannot reach here: names come from a parsed header or from those names.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::string out(8, '\0');
  std::uint64_t n = text.size();
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace xqcli
