// The safetensors header: parsing with full validation (every malformed input gets a message, never a
// crash or an out-of-range read) and writing.
#include "safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
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

// `size` in bits, in the order of StDType.
constexpr std::array<DTypeInfo, 22> kDTypes{{
    {StDType::BOOL, "BOOL", 8},
    {StDType::U8, "U8", 8},
    {StDType::I8, "I8", 8},
    {StDType::F8_E5M2, "F8_E5M2", 8},
    {StDType::F8_E4M3, "F8_E4M3", 8},
    {StDType::F8_E8M0, "F8_E8M0", 8},
    {StDType::I16, "I16", 16},
    {StDType::U16, "U16", 16},
    {StDType::F16, "F16", 16},
    {StDType::BF16, "BF16", 16},
    {StDType::I32, "I32", 32},
    {StDType::U32, "U32", 32},
    {StDType::F32, "F32", 32},
    {StDType::F64, "F64", 64},
    {StDType::I64, "I64", 64},
    {StDType::U64, "U64", 64},
    {StDType::F4, "F4", 4},
    {StDType::F6_E2M3, "F6_E2M3", 6},
    {StDType::F6_E3M2, "F6_E3M2", 6},
    {StDType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {StDType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {StDType::C64, "C64", 64},
}};

const DTypeInfo& info(StDType dt) noexcept { return kDTypes[static_cast<std::size_t>(dt)]; }

// A name in quotes for a message, cut to kMaxQuoted bytes.
std::string q_name(std::string_view s) {
  const std::string c = clip(s);
  std::string r;
  r.reserve(c.size() + 2);
  r.push_back('\'');
  r.append(c);
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
  if (!shape.is_array())
    bad_input(who + ": \"shape\" must be an array of non-negative integers, got " + json_type(shape));
  for (const auto& d : shape) {
    const auto v = as_count(d);
    if (!v) bad_input(who + ": \"shape\" must hold non-negative integers, got " + json_excerpt(d));
    t.shape.push_back(static_cast<std::int64_t>(*v));
  }
  const auto numel = checked_numel(t.shape);
  if (!numel) bad_input(who + ": shape " + dims_str(t.shape) + " has more elements than fit in 64 bits");
  t.numel = *numel;

  const auto& off = j.at("data_offsets");
  if (!off.is_array() || off.size() != 2)
    bad_input(who + ": \"data_offsets\" must be [begin, end], got " + json_excerpt(off));
  const auto b = as_count(off[0]);
  const auto e = as_count(off[1]);
  if (!b || !e) bad_input(who + ": \"data_offsets\" must be two non-negative integers, got " + json_excerpt(off));
  t.begin = *b;
  t.end = *e;
  const std::string offs = "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
  if (t.begin > t.end) bad_input(who + ": data_offsets " + offs + " end before they begin");
  if (t.end > data_size)
    bad_input(who + ": data_offsets " + offs + " are out of range: the data section has " + std::to_string(data_size) +
              " bytes (truncated file?)");

  const std::uint64_t ebits = info(t.dtype).size;
  const auto n = static_cast<std::uint64_t>(t.numel);
  if (n != 0 && ebits > std::numeric_limits<std::uint64_t>::max() / n)
    bad_input(who + ": shape " + clip(dims_str(t.shape)) + " is too large");
  if (n * ebits % 8 != 0)
    bad_input(who + ": dtype " + std::string(info(t.dtype).name) + " has " + std::to_string(ebits) +
              "-bit elements and shape " + clip(dims_str(t.shape)) + " does not fill whole bytes");
  if (n * ebits / 8 != t.nbytes())
    bad_input(who + ": shape/size mismatch: dtype " + std::string(info(t.dtype).name) + " and shape " +
              clip(dims_str(t.shape)) + " need " + std::to_string(n * ebits / 8) + " bytes but data_offsets " + offs +
              " span " + std::to_string(t.nbytes()));
  return t;
}

}  // namespace

std::optional<StDType> parse_st_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}
std::string_view st_dtype_name(StDType dt) noexcept { return info(dt).name; }
std::size_t st_dtype_size(StDType dt) noexcept { return (info(dt).size + 7) / 8; }
std::size_t st_dtype_bits(StDType dt) noexcept { return info(dt).size; }
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
  if (!index.empty()) {
    const auto it = index.find(name);
    return it == index.end() ? nullptr : &tensors[it->second];
  }
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// Builds a nlohmann::json from SAX events, refusing duplicate keys and deep nesting as they arrive
// (nlohmann's callback parser rescans the parent object after every member: quadratic).
class StrictBuilder {
 public:
  using json = nlohmann::json;
  StrictBuilder(std::string what, std::string malformed) : what_(std::move(what)), malformed_(std::move(malformed)) {}

  bool null() { return place(json(nullptr)); }
  bool boolean(bool v) { return place(json(v)); }
  bool number_integer(json::number_integer_t v) { return place(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return place(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return place(json(v)); }
  bool string(json::string_t& v) { return place(json(std::move(v))); }
  bool binary(json::binary_t&) { return fail(what_ + ": binary values are not JSON"); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    json& obj = *stack_.back();
    if (obj.contains(k)) {
      if (stack_.size() == 1)
        return fail(k == "__metadata__" ? what_ + " has \"__metadata__\" twice"
                                        : what_ + " names tensor " + q_name(k) + " twice");
      return fail(what_ + " has key " + q_name(k) + " twice in the entry of " + q_name(top_key_));
    }
    if (stack_.size() == 1) top_key_ = k;
    slot_ = &obj[k];
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    return fail(malformed_ + clip(e.what(), 4 * kMaxQuoted));
  }

  json root;
  std::string error;

 private:
  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }
  json* put(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool place(json&& v) {
    put(std::move(v));
    return true;
  }
  bool open(json&& v) {
    if (stack_.size() >= kMaxJsonDepth)
      return fail(what_ + " nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    // Only the innermost container grows while it is open, so the pointer stays valid until close().
    stack_.push_back(put(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  std::string what_;
  std::string malformed_;
  std::vector<json*> stack_;
  json* slot_ = nullptr;
  std::string top_key_;
};

}  // namespace

nlohmann::json parse_json_strict(std::string_view text, const std::string& what, const std::string& malformed) {
  // nlohmann's lexer skips a byte-order mark and takes a NUL byte for the end of the input; the
  // official reader (serde_json) refuses both.
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF")
    bad_input(what + " starts with a UTF-8 byte-order mark, which JSON does not allow here");
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    bad_input(what + " holds a NUL byte at offset " + std::to_string(nul) +
              " (only spaces, tabs and line breaks may pad the JSON)");
  StrictBuilder b(what, malformed);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &b);
  } catch (const nlohmann::json::exception& e) {
    bad_input(malformed + clip(e.what(), 4 * kMaxQuoted));
  }
  if (!ok) bad_input(b.error.empty() ? malformed + "parse error" : b.error);
  return std::move(b.root);
}

std::string quote_name(std::string_view s) { return q_name(s); }

std::string clip(std::string_view s, std::size_t max) {
  if (s.size() <= max) return std::string(s);
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a character
  return std::string(s.substr(0, n)) + "...";
}

std::string json_excerpt(const nlohmann::json& j) {
  // Nesting is bounded by the parser, so dump() cannot recurse deeply; replace keeps it UTF-8.
  return clip(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::string utf8_safe(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = p[i];
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80)
      len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool valid = len > 0 && i + len <= n;
    for (std::size_t k = 1; valid && k < len; ++k) {
      const unsigned b = p[i + k];
      valid = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (valid) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
      ++i;
    }
  }
  return out;
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

  const std::string_view text(reinterpret_cast<const char*>(file + 8), static_cast<std::size_t>(n));
  const nlohmann::json j = parse_json_strict(text, "the JSON header", "malformed JSON header: ");
  if (!j.is_object()) bad_input("the JSON header must be an object, got " + json_type(j));

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;  // the official reader takes null for no metadata
      if (!value.is_object()) bad_input("__metadata__ must be an object of strings, got " + json_type(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          bad_input("__metadata__ must map strings to strings, but " + q_name(mk) + " is " + json_type(mv));
        h.metadata.emplace_hint(h.metadata.end(), mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, h.data_size));
  }

  // The official reader's order and rule: sorted by data_offsets, each tensor begins where the previous
  // one ends (the first at 0), and the last one ends at the end of the file.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  std::uint64_t covered = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < covered)
      bad_input("tensors " + q_name(prev->name) + " [" + std::to_string(prev->begin) + ", " +
                std::to_string(prev->end) + ") and " + q_name(t.name) + " [" + std::to_string(t.begin) + ", " +
                std::to_string(t.end) + ") overlap in the data section");
    if (t.begin > covered)
      bad_input("tensor " + q_name(t.name) + " begins at data offset " + std::to_string(t.begin) + " but " +
                (prev ? "the previous tensor " + q_name(prev->name) + " ends at " + std::to_string(covered)
                      : std::string("the data section begins at 0")) +
                ": a hole in the data section (tensors must be contiguous)");
    covered = t.end;
    prev = &t;
  }
  if (covered != h.data_size)
    bad_input("the tensors cover " + std::to_string(covered) + " bytes of the data section but it has " +
              std::to_string(h.data_size) + " (extra bytes at the end of the file)");
  for (std::size_t i = 0; i < h.tensors.size(); ++i) h.index.emplace(h.tensors[i].name, i);
  return h;
}

std::string json_object_text(const std::map<std::string, std::string>& m) {
  std::string text = "{";
  for (const auto& [k, v] : m) {
    if (text.size() > 1) text.push_back(',');
    text += nlohmann::json(k).dump();
    text.push_back(':');
    text += nlohmann::json(v).dump();
  }
  text.push_back('}');
  return text;
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
  // Written member by member: nlohmann's ordered_json finds a key by a linear scan, so building one
  // object of 100k tensors was quadratic. The text is what ordered_json's dump() gave.
  std::string text = "{";
  bool first = true;
  if (!metadata.empty()) {
    text += "\"__metadata__\":";
    text += json_object_text(metadata);
    first = false;
  }
  for (const auto& t : tensors) {
    if (!first) text.push_back(',');
    first = false;
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(st_dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {t.offset, t.offset + t.nbytes};
    text += nlohmann::json(t.name).dump();
    text.push_back(':');
    text += e.dump();
  }
  text.push_back('}');
  // Invalid UTF-8 in a name cannot reach here: names come from a parsed header or from those names.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::string out(8, '\0');
  std::uint64_t n = text.size();
  for (std::size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace xqcli
