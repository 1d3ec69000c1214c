// The safetensors container: dtypes, a validating header parser and a header writer.
//
// File layout: an 8-byte little-endian unsigned header length N, N bytes of UTF-8 JSON, then the data
// section. The JSON object maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) and may hold "__metadata__", a map of strings to strings.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace xqcli {

// The dtypes of the official reader (the Rust `safetensors` crate 0.8). Sub-byte F4 (4 bits) and
// F6_* (6 bits) are packed: a tensor of them must fill whole bytes.
enum class StDType : std::uint8_t {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64,
  F4,
  F6_E2M3,
  F6_E3M2,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  C64,
};

std::optional<StDType> parse_st_dtype(std::string_view name);
std::string_view st_dtype_name(StDType dt) noexcept;
// Bytes per element, rounded up (1 for the sub-byte F4 / F6_*); st_dtype_bits is exact.
std::size_t st_dtype_size(StDType dt) noexcept;
std::size_t st_dtype_bits(StDType dt) noexcept;
// F32, F16 or BF16: the dtypes that quantize reads.
bool st_is_quantizable(StDType dt) noexcept;

using Dims = std::vector<std::int64_t>;
// "[2, 3]"
std::string dims_str(const Dims& dims);

struct TensorEntry {
  std::string name;
  StDType dtype = StDType::F32;
  Dims shape;
  std::int64_t numel = 0;
  std::uint64_t begin = 0;  // data_offsets, relative to the data section
  std::uint64_t end = 0;
  std::uint64_t nbytes() const noexcept { return end - begin; }
};

struct Header {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::vector<TensorEntry> tensors;             // in data order (by begin offset, then name)
  std::uint64_t header_len = 0;                 // N
  std::uint64_t data_start = 0;                 // 8 + N
  std::uint64_t data_size = 0;                  // file size - data_start
  // Name -> index into `tensors`, filled by parse_header (find() falls back to a scan without it).
  std::map<std::string, std::size_t, std::less<>> index;
  const TensorEntry* find(std::string_view name) const noexcept;
};

// Headers above this size are refused (the official implementation's limit).
inline constexpr std::uint64_t kMaxHeaderLen = 100'000'000;
// JSON nesting deeper than this is refused while parsing, before any value is built (a safetensors
// header needs 3 levels: the object, a tensor entry, its shape; the official reader stops at 128).
inline constexpr std::size_t kMaxJsonDepth = 16;
// Values quoted in error messages are cut to this many bytes and end with "...".
inline constexpr std::size_t kMaxQuoted = 80;

// Parses JSON text strictly: duplicate keys in any object, nesting deeper than kMaxJsonDepth, NUL
// bytes and a byte-order mark are bad input (exit 1) with a message starting with `what` (syntax
// errors: with `malformed`, then the parser's message); linear time, no recursion.
nlohmann::json parse_json_strict(std::string_view text, const std::string& what, const std::string& malformed);
// A JSON value as text for an error message, cut to kMaxQuoted bytes ("..." marks a cut).
std::string json_excerpt(const nlohmann::json& j);
// `s` cut to at most `max` bytes (at a UTF-8 character boundary) with "..." appended when cut.
std::string clip(std::string_view s, std::size_t max = kMaxQuoted);
// 'name' for a message: clip(s) in single quotes.
std::string quote_name(std::string_view s);
// `s` with every byte that is not part of a valid UTF-8 sequence written as the four characters \xNN
// (NN upper-case hex): messages and JSON output stay valid UTF-8 whatever a path or name holds.
std::string utf8_safe(std::string_view s);

// Parses and validates the header of a whole file held in memory (`file` has `file_size` bytes), as
// strictly as the official reader (docs/cli.md, "Bad input never crashes"). Every problem throws
// CliError with exit code 1 and a message saying what is wrong: truncated file, header length beyond
// the file, malformed JSON, duplicate keys, unknown dtype, bad shape, data offsets out of range,
// overlapping, leaving a hole or not covering the data section, shape / size mismatch.
Header parse_header(const std::byte* file, std::uint64_t file_size);

// A tensor of a file being written; offsets are assigned by layout_tensors().
struct OutTensor {
  std::string name;
  StDType dtype = StDType::F32;
  Dims shape;
  std::uint64_t nbytes = 0;
  std::uint64_t offset = 0;  // relative to the data section
};

// Orders tensors as the official writer does (larger element size first, then by name, so every tensor
// starts at a multiple of its element size) and assigns contiguous data offsets. Returns the data size.
std::uint64_t layout_tensors(std::vector<OutTensor>& tensors);

// The file prefix: 8-byte length + JSON header ("__metadata__" first, then tensors in data order), padded
// with spaces so the data section starts at a multiple of 8. Expects layout_tensors() to have run.
std::string build_header(const std::vector<OutTensor>& tensors, const std::map<std::string, std::string>& metadata);

// A JSON object of strings as compact text, keys in the map's order (linear time).
std::string json_object_text(const std::map<std::string, std::string>& m);

// Product of dims, or nullopt when a dimension is negative or the product overflows int64.
std::optional<std::int64_t> checked_numel(const Dims& dims) noexcept;

}  // namespace xqcli
