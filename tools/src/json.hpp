// The JSON reader of the files the CLI reads from a model directory (config.json, the weights index):
// one parser with a nesting limit (a clear error, never a stack overflow), linear-time parsing and key
// lookup (a hash index beside the ordered members), duplicate keys refused, and numbers and strings kept
// as the text of the file, so that config.json written back into an output keeps integers beyond 64 bits,
// Python's `Infinity` / `-Infinity` / `NaN` and every escape byte for byte. Typed accessors refuse a
// mistyped, fractional or out-of-range value with a message naming the file and the key. See
// docs/cli.md, "Model directories".
//
// The safetensors header has its own stricter reader (safetensors.cpp: the official reader's rules, no
// NaN / Infinity), which builds on nlohmann's SAX parser with the same depth and duplicate-key checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace xqcli::json {

// Containers nested deeper than this are refused (transformers' configs nest 3-4 levels).
inline constexpr std::size_t kMaxDepth = 256;

class Value {
 public:
  enum class Kind : std::uint8_t { Null, Bool, Number, String, Array, Object };
  struct Member;  // {key, value}, below

  Value() = default;  // null
  // Defined in json.cpp, where Member is complete (clang instantiates them at the class's end otherwise).
  ~Value();
  Value(const Value&);
  Value(Value&&) noexcept;
  Value& operator=(const Value&);
  Value& operator=(Value&&) noexcept;

  static Value boolean(bool b);
  // A number from its JSON text (a JSON number, or Infinity / -Infinity / NaN); not validated here.
  static Value number_text(std::string text);
  static Value integer(std::int64_t v);
  static Value string(std::string s);
  static Value array();
  static Value object();

  Kind kind() const noexcept { return kind_; }
  bool is_null() const noexcept { return kind_ == Kind::Null; }
  bool is_bool() const noexcept { return kind_ == Kind::Bool; }
  bool is_number() const noexcept { return kind_ == Kind::Number; }
  bool is_string() const noexcept { return kind_ == Kind::String; }
  bool is_array() const noexcept { return kind_ == Kind::Array; }
  bool is_object() const noexcept { return kind_ == Kind::Object; }
  // "null", "boolean", "number", "string", "array", "object" (as nlohmann names them).
  const char* type_name() const noexcept;

  // Objects (on anything else: absent). Lookup is a hash-table probe.
  const Value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // The member `key`, or a null value when it is absent.
  const Value& operator[](std::string_view key) const;
  // Replaces the member's value in place, or appends the member at the end (a null becomes an object).
  void set(const std::string& key, Value v);
  // Removes the member (order of the others kept); false when absent.
  bool erase(std::string_view key);
  const std::vector<Member>& members() const noexcept { return members_; }

  // Arrays.
  const std::vector<Value>& items() const noexcept { return items_; }
  void push_back(Value v);

  // Members of an object, items of an array, else 0.
  std::size_t size() const noexcept;
  bool empty() const noexcept;

  bool as_bool() const noexcept { return b_; }
  // String: the decoded text (UTF-8; an escaped lone surrogate as its 3-byte encoding). Number: the text.
  const std::string& text() const noexcept { return text_; }

  // Numbers. The integer value when the text is an integer (no fraction, no exponent) that fits.
  std::optional<std::int64_t> as_int64() const;
  bool is_integer_text() const;
  // Whether the number is finite in double precision (not Infinity / NaN, not 1e400).
  bool is_finite_number() const;
  double as_double() const;  // strtod of the text (Infinity / NaN included)

  // The JSON text: indent < 0 compact, else one member or item per line indented by `indent` spaces
  // (the layout of nlohmann's dump(indent)). Numbers and parsed strings are written as they were read.
  std::string dump(int indent = -1) const;
  // dump() clipped to about `max` bytes (for messages).
  std::string excerpt(std::size_t max = 60) const;

  // The same value as nlohmann::ordered_json (for output built with nlohmann): numbers that are exact
  // integers of 64 bits become integers, other finite numbers doubles, and numbers that JSON cannot
  // write (Infinity, NaN, out of double range) or that would change (integers beyond 64 bits) their text
  // as a string.
  nlohmann::ordered_json to_nlohmann() const;
  // A value from nlohmann (for inserting output built with nlohmann into a parsed document).
  static Value from_nlohmann(const nlohmann::ordered_json& j);

 private:
  friend class Parser;
  void dump_to(std::string& out, int indent, int level) const;

  Kind kind_ = Kind::Null;
  bool b_ = false;
  std::string text_;
  std::string raw_;  // a parsed string's token as in the file (quotes included); empty when built
  std::vector<Value> items_;
  std::vector<Member> members_;
  std::unordered_map<std::string, std::size_t> index_;  // key -> position in members_
};

struct Value::Member {
  std::string key;
  Value value;
};

// Parses `text`. Errors are bad input (exit 1): "<what>: malformed JSON at line L, column C: ..." with
// `what` the file's path; a byte-order mark, invalid UTF-8, a control character in a string, a
// duplicate key, nesting deeper than kMaxDepth and trailing text are refused. Accepts what Python's
// json module writes: standard JSON plus Infinity, -Infinity and NaN.
Value parse(std::string_view text, const std::string& what);

// Reads and parses a file (at most 256 MiB; exit 2 when it cannot be read).
Value parse_file(const std::string& path);

// Typed access with errors naming the value (`who`, e.g. "m/config.json: quantization_config.format"):
// each is bad input when the value has another type, a fraction or an exponent (for integers), or is out
// of [lo, hi].
const std::string& get_string(const Value& v, const std::string& who);
bool get_bool(const Value& v, const std::string& who);
std::int64_t get_int(const Value& v, const std::string& who, std::int64_t lo, std::int64_t hi);

}  // namespace xqcli::json
