#include "json.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "errors.hpp"
#include "model_dir.hpp"
#include "safetensors.hpp"

namespace xqcli::json {

// ---- Value ----

Value::~Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;

Value Value::integer(std::int64_t v) { return number_text(std::to_string(v)); }

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}

Value Value::number_text(std::string text) {
  Value v;
  v.kind_ = Kind::Number;
  v.text_ = std::move(text);
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.text_ = std::move(s);
  return v;
}

Value Value::array() {
  Value v;
  v.kind_ = Kind::Array;
  return v;
}

Value Value::object() {
  Value v;
  v.kind_ = Kind::Object;
  return v;
}

const char* Value::type_name() const noexcept {
  switch (kind_) {
    case Kind::Null:
      return "null";
    case Kind::Bool:
      return "boolean";
    case Kind::Number:
      return "number";
    case Kind::String:
      return "string";
    case Kind::Array:
      return "array";
    case Kind::Object:
      return "object";
  }
  return "?";
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::Object) return nullptr;
  const auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &members_[it->second].value;
}

const Value& Value::operator[](std::string_view key) const {
  static const Value null;
  const Value* v = find(key);
  return v ? *v : null;
}

void Value::set(const std::string& key, Value v) {
  if (kind_ == Kind::Null) kind_ = Kind::Object;
  const auto it = index_.find(key);
  if (it != index_.end()) {
    members_[it->second].value = std::move(v);
    return;
  }
  index_.emplace(key, members_.size());
  members_.push_back(Member{key, std::move(v)});
}

bool Value::erase(std::string_view key) {
  const auto it = index_.find(std::string(key));
  if (it == index_.end()) return false;
  const std::size_t at = it->second;
  members_.erase(members_.begin() + static_cast<std::ptrdiff_t>(at));
  index_.erase(it);
  for (auto& [k, i] : index_)
    if (i > at) --i;
  return true;
}

void Value::push_back(Value v) { items_.push_back(std::move(v)); }

std::size_t Value::size() const noexcept {
  return kind_ == Kind::Object ? members_.size() : kind_ == Kind::Array ? items_.size() : 0;
}

bool Value::empty() const noexcept { return size() == 0; }

bool Value::is_integer_text() const {
  if (kind_ != Kind::Number) return false;
  std::size_t i = text_[0] == '-' ? 1 : 0;
  if (i >= text_.size()) return false;
  for (; i < text_.size(); ++i)
    if (text_[i] < '0' || text_[i] > '9') return false;
  return true;
}

std::optional<std::int64_t> Value::as_int64() const {
  if (!is_integer_text()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text_.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0') return std::nullopt;
  return static_cast<std::int64_t>(v);
}

double Value::as_double() const { return std::strtod(text_.c_str(), nullptr); }

bool Value::is_finite_number() const { return kind_ == Kind::Number && std::isfinite(as_double()); }

namespace {

void escape_to(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    // A lone surrogate (decoded from a \u escape as its 3-byte form, which is not UTF-8) goes back out as
    // the escape it came from.
    if (static_cast<unsigned char>(c) == 0xED && i + 2 < s.size() &&
        (static_cast<unsigned char>(s[i + 1]) & 0xE0) == 0xA0) {
      const unsigned cp = 0xD000u | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6) |
                          (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
      out += "\\u";
      for (int sh = 12; sh >= 0; sh -= 4) out += hex[(cp >> sh) & 15];
      i += 2;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += hex[static_cast<unsigned char>(c) >> 4];
          out += hex[static_cast<unsigned char>(c) & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace

void Value::dump_to(std::string& out, int indent, int level) const {
  const auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(lvl), ' ');
  };
  switch (kind_) {
    case Kind::Null:
      out += "null";
      return;
    case Kind::Bool:
      out += b_ ? "true" : "false";
      return;
    case Kind::Number:
      out += text_;
      return;
    case Kind::String:
      if (!raw_.empty())
        out += raw_;
      else
        escape_to(out, text_);
      return;
    case Kind::Array:
      if (items_.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < items_.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        items_[i].dump_to(out, indent, level + 1);
      }
      newline(level);
      out += ']';
      return;
    case Kind::Object:
      if (members_.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (std::size_t i = 0; i < members_.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        escape_to(out, members_[i].key);
        out += indent < 0 ? ":" : ": ";
        members_[i].value.dump_to(out, indent, level + 1);
      }
      newline(level);
      out += '}';
      return;
  }
}

std::string Value::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

std::string Value::excerpt(std::size_t max) const { return utf8_safe(clip(dump(), max)); }

nlohmann::ordered_json Value::to_nlohmann() const {
  using OJ = nlohmann::ordered_json;
  switch (kind_) {
    case Kind::Null:
      return OJ(nullptr);
    case Kind::Bool:
      return OJ(b_);
    case Kind::Number: {
      if (const auto i = as_int64()) return OJ(*i);
      if (is_integer_text() && text_[0] != '-') {
        errno = 0;
        char* end = nullptr;
        const unsigned long long u = std::strtoull(text_.c_str(), &end, 10);
        if (errno != ERANGE && *end == '\0') return OJ(static_cast<std::uint64_t>(u));
      }
      if (!is_integer_text() && is_finite_number()) return OJ(as_double());
      return OJ(text_);
    }
    case Kind::String:
      return OJ(text_);
    case Kind::Array: {
      OJ a = OJ::array();
      for (const auto& v : items_) a.push_back(v.to_nlohmann());
      return a;
    }
    case Kind::Object: {
      OJ o = OJ::object();
      for (const auto& m : members_) o.push_back({m.key, m.value.to_nlohmann()});
      return o;
    }
  }
  return OJ(nullptr);
}

Value Value::from_nlohmann(const nlohmann::ordered_json& j) {
  // nlohmann writes every value it can hold as valid JSON; our parser reads it back as it is.
  return parse(j.dump(), "a generated JSON value");
}

// ---- parser ----

class Parser {
 public:
  Parser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  Value run() {
    if (s_.size() >= 3 && s_.substr(0, 3) == "\xEF\xBB\xBF")
      bad_input(what_ + ": starts with a UTF-8 byte-order mark, which JSON does not allow");
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (p_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < p_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    bad_input(what_ + ": malformed JSON at line " + std::to_string(line) + ", column " + std::to_string(col) + ": " +
              msg);
  }

  bool at_end() const noexcept { return p_ >= s_.size(); }
  char peek() const noexcept { return at_end() ? '\0' : s_[p_]; }

  void skip_ws() {
    while (!at_end() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) ++p_;
  }

  bool take_word(std::string_view w) {
    if (s_.substr(p_, w.size()) != w) return false;
    p_ += w.size();
    return true;
  }

  std::string got() const {
    if (at_end()) return "the end of the file";
    const unsigned char c = static_cast<unsigned char>(s_[p_]);
    if (c < 0x20 || c >= 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
    }
    return std::string("'") + static_cast<char>(c) + "'";
  }

  Value value(std::size_t depth) {
    switch (peek()) {
      case '{':
        return object(depth + 1);
      case '[':
        return array(depth + 1);
      case '"': {
        const std::size_t start = p_;
        Value v = Value::string(string());
        v.raw_ = std::string(s_.substr(start, p_ - start));
        return v;
      }
      case 't':
        if (take_word("true")) return Value::boolean(true);
        break;
      case 'f':
        if (take_word("false")) return Value::boolean(false);
        break;
      case 'n':
        if (take_word("null")) return Value();
        break;
      case 'N':
        if (take_word("NaN")) return Value::number_text("NaN");
        break;
      case 'I':
        if (take_word("Infinity")) return Value::number_text("Infinity");
        break;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
    }
    fail("expected a value, got " + got());
  }

  void open(std::size_t depth) {
    if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels (arrays and objects)");
    ++p_;
    skip_ws();
  }

  Value object(std::size_t depth) {
    open(depth);
    Value v = Value::object();
    if (peek() == '}') {
      ++p_;
      return v;
    }
    for (;;) {
      if (peek() != '"') fail("expected a key (a string) in an object, got " + got());
      const std::size_t key_at = p_;
      std::string key = string();
      if (v.index_.count(key)) {
        p_ = key_at;
        fail("duplicate key " + quote_name(key));
      }
      skip_ws();
      if (peek() != ':') fail("expected ':' after a key, got " + got());
      ++p_;
      skip_ws();
      Value item = value(depth);
      v.index_.emplace(key, v.members_.size());
      v.members_.push_back(Value::Member{std::move(key), std::move(item)});
      skip_ws();
      if (peek() == ',') {
        ++p_;
        skip_ws();
        continue;
      }
      if (peek() == '}') {
        ++p_;
        return v;
      }
      fail("expected ',' or '}' in an object, got " + got());
    }
  }

  Value array(std::size_t depth) {
    open(depth);
    Value v = Value::array();
    if (peek() == ']') {
      ++p_;
      return v;
    }
    for (;;) {
      v.items_.push_back(value(depth));
      skip_ws();
      if (peek() == ',') {
        ++p_;
        skip_ws();
        continue;
      }
      if (peek() == ']') {
        ++p_;
        return v;
      }
      fail("expected ',' or ']' in an array, got " + got());
    }
  }

  Value number() {
    const std::size_t start = p_;
    if (peek() == '-') {
      ++p_;
      if (take_word("Infinity")) return Value::number_text("-Infinity");
    }
    const auto digits = [&] {
      const std::size_t b = p_;
      while (!at_end() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
      return p_ - b;
    };
    if (peek() == '0') {
      ++p_;
      if (peek() >= '0' && peek() <= '9') fail("a number with a leading zero");
    } else if (digits() == 0) {
      fail("expected a digit, got " + got());
    }
    if (peek() == '.') {
      ++p_;
      if (digits() == 0) fail("expected a digit after '.', got " + got());
    }
    if (peek() == 'e' || peek() == 'E') {
      ++p_;
      if (peek() == '+' || peek() == '-') ++p_;
      if (digits() == 0) fail("expected a digit in the exponent, got " + got());
    }
    return Value::number_text(std::string(s_.substr(start, p_ - start)));
  }

  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = peek();
      unsigned d;
      if (c >= '0' && c <= '9')
        d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<unsigned>(c - 'A' + 10);
      else
        fail("expected 4 hexadecimal digits after \\u, got " + got());
      v = v * 16 + d;
      ++p_;
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // One UTF-8 sequence starting at p_ (a byte >= 0x80), copied to `out`; invalid UTF-8 is refused.
  void utf8_char(std::string& out) {
    const auto b0 = static_cast<unsigned char>(s_[p_]);
    std::size_t n;
    unsigned cp, min;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      n = 2, cp = b0 & 0x1Fu, min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      n = 3, cp = b0 & 0x0Fu, min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      n = 4, cp = b0 & 0x07u, min = 0x10000;
    } else {
      fail("invalid UTF-8 (" + got() + ")");
    }
    if (p_ + n > s_.size()) fail("invalid UTF-8 (a truncated sequence)");
    for (std::size_t i = 1; i < n; ++i) {
      const auto b = static_cast<unsigned char>(s_[p_ + i]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8 (" + got() + " starts a broken sequence)");
      cp = (cp << 6) | (b & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8 (" + got() + ")");
    out.append(s_.substr(p_, n));
    p_ += n;
  }

  std::string string() {
    ++p_;  // the opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("a string without its closing quote");
      const char c = s_[p_];
      if (c == '"') {
        ++p_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character (" + got() + ") in a string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        utf8_char(out);
        continue;
      }
      if (c != '\\') {
        out += c;
        ++p_;
        continue;
      }
      ++p_;
      const char e = peek();
      ++p_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF && s_.substr(p_, 2) == "\\u") {
            const std::size_t save = p_;
            p_ += 2;
            const unsigned lo = hex4();
            if (lo >= 0xDC00 && lo <= 0xDFFF)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
              p_ = save;  // a lone high surrogate; the next escape stands alone
          }
          put_utf8(out, cp);  // a lone surrogate (Python writes them) as its 3-byte form
          break;
        }
        default:
          --p_;
          fail("invalid escape \\" + got());
      }
    }
  }

  std::string_view s_;
  const std::string& what_;
  std::size_t p_ = 0;
};

Value parse(std::string_view text, const std::string& what) { return Parser(text, what).run(); }

Value parse_file(const std::string& path) { return parse(read_small_file(path), path); }

// ---- typed access ----

const std::string& get_string(const Value& v, const std::string& who) {
  if (!v.is_string()) bad_input(who + ": expected a string, got " + v.type_name() + " " + v.excerpt());
  return v.text();
}

bool get_bool(const Value& v, const std::string& who) {
  if (!v.is_bool()) bad_input(who + ": expected true or false, got " + v.type_name() + " " + v.excerpt());
  return v.as_bool();
}

std::int64_t get_int(const Value& v, const std::string& who, std::int64_t lo, std::int64_t hi) {
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (!v.is_integer_text()) bad_input(who + ": expected " + range + ", got " + v.type_name() + " " + v.excerpt());
  const auto i = v.as_int64();
  if (!i || *i < lo || *i > hi) bad_input(who + ": expected " + range + ", got " + v.excerpt());
  return *i;
}

}  // namespace xqcli::json
