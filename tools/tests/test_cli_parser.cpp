// The safetensors header parser and writer of the xquant tool: every malformed input of issue 5
// section 3 as a small crafted buffer (clear message, exit code 1, no crash), and writer -> parser
// round trips.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"
#include "safetensors.hpp"

namespace {

using xqcli::CliError;
using xqcli::Header;
using xqcli::StDType;

// A file image: 8-byte little-endian length (the JSON's size unless `len` is given), JSON, data.
std::vector<std::byte> image(const std::string& json, std::size_t data_bytes, std::optional<std::uint64_t> len = {}) {
  std::vector<std::byte> f(8 + json.size() + data_bytes, std::byte{0x5A});
  const std::uint64_t n = len.value_or(json.size());
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(f.data() + 8, json.data(), json.size());
  return f;
}

Header parse(const std::vector<std::byte>& f) { return xqcli::parse_header(f.data(), f.size()); }

// Expects bad input (exit code 1) with a message containing `needle`.
void expect_bad(const std::vector<std::byte>& f, const std::string& needle) {
  try {
    parse(f);
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const CliError& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

TEST(Parser, ValidFileWithMetadataAndEmptyTensor) {
  const std::string j =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,2],"data_offsets":[24,32]},)"
      R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"e":{"dtype":"I8","shape":[0,4],"data_offsets":[24,24]},)"
      R"("s":{"dtype":"BF16","shape":[],"data_offsets":[32,34]}})";
  const Header h = parse(image(j, 34));
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.header_len, j.size());
  EXPECT_EQ(h.data_start, 8 + j.size());
  EXPECT_EQ(h.data_size, 34u);
  // Data order (by data_offsets): a [0,24), e [24,24) (empty), b [24,32), s [32,34).
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "e");
  EXPECT_EQ(h.tensors[2].name, "b");
  EXPECT_EQ(h.tensors[3].name, "s");
  EXPECT_EQ(h.tensors[0].dtype, StDType::F32);
  EXPECT_EQ(h.tensors[0].numel, 6);
  EXPECT_EQ(h.tensors[1].numel, 0);
  EXPECT_EQ(h.tensors[3].numel, 1);  // rank 0: one element
  EXPECT_EQ(h.tensors[3].shape.size(), 0u);
  ASSERT_NE(h.find("b"), nullptr);
  EXPECT_EQ(h.find("b")->nbytes(), 8u);
  EXPECT_EQ(h.find("zz"), nullptr);
}

TEST(Parser, EmptyObjectAndTrailingPaddingAreValid) {
  EXPECT_EQ(parse(image("{}", 0)).tensors.size(), 0u);
  EXPECT_EQ(parse(image("{}      ", 0)).tensors.size(), 0u);
}

TEST(Parser, TruncatedFiles) {
  for (std::size_t n : {0u, 1u, 7u}) {
    std::vector<std::byte> f(n, std::byte{0});
    try {
      xqcli::parse_header(f.data(), f.size());
      ADD_FAILURE() << n;
    } catch (const CliError& e) {
      EXPECT_EQ(e.exit_code(), 1);
      EXPECT_NE(std::string(e.what()).find("truncated file"), std::string::npos) << e.what();
    }
  }
}

TEST(Parser, HeaderLengthBeyondTheFile) {
  expect_bad(image("{}", 0, 3), "header length 3 exceeds the file");
  expect_bad(image("{}", 0, std::uint64_t{1} << 62), "exceeds the file");
  expect_bad(image("{}", 0, std::uint64_t{1} << 63), "exceeds the file");
  expect_bad(image("{}", 0, ~std::uint64_t{0}), "exceeds the file");
  // The data section is cut short: the offsets run past the end.
  expect_bad(image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12), "out of range");
}

TEST(Parser, HeaderLengthAboveTheLimit) {
  const std::uint64_t n = xqcli::kMaxHeaderLen + 1;
  std::vector<std::byte> f(8 + n, std::byte{' '});
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  expect_bad(f, "above the limit");
}

TEST(Parser, MalformedJson) {
  expect_bad(image("{", 0), "malformed JSON header");
  expect_bad(image("", 0), "malformed JSON header");
  expect_bad(image(R"({"a": {"dtype": "F32",})", 0), "malformed JSON header");
  expect_bad(image("{} trailing", 0), "malformed JSON header");
  expect_bad(image(std::string("{\"\xff\":1}"), 0), "malformed JSON header");  // invalid UTF-8
  expect_bad(image(std::string("{\"a\0\":{}}", 9), 0), "NUL byte");
  expect_bad(image("[1, 2]", 0), "must be an object");
  expect_bad(image("17", 0), "must be an object");
}

TEST(Parser, DuplicateNames) {
  expect_bad(
      image(
          R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"I8","shape":[1],"data_offsets":[1,2]}})",
          2),
      "names tensor 'a' twice");
  // The same key inside different objects is fine.
  EXPECT_EQ(parse(image(R"({"__metadata__":{"a":"x"},"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1))
                .tensors.size(),
            1u);
}

TEST(Parser, BadMetadata) {
  expect_bad(image(R"({"__metadata__":[1]})", 0), "__metadata__ must be an object");
  expect_bad(image(R"({"__metadata__":{"k":1}})", 0), "'k' is number");
}

TEST(Parser, BadEntries) {
  expect_bad(image(R"({"a":[1]})", 0), "tensor 'a': expected an object");
  expect_bad(image(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1), "missing \"dtype\"");
  expect_bad(image(R"({"a":{"dtype":"I8","data_offsets":[0,1]}})", 1), "missing \"shape\"");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1]}})", 1), "missing \"data_offsets\"");
  expect_bad(image(R"({"a":{"dtype":8,"shape":[1],"data_offsets":[0,1]}})", 1), "\"dtype\" must be a string");
}

TEST(Parser, UnknownDtype) {
  for (const char* dt : {"F8_E4M3FN", "f32", "Q4_0", "", "FLOAT32"})
    expect_bad(image(std::string(R"({"a":{"dtype":")") + dt + R"(","shape":[1],"data_offsets":[0,1]}})", 1),
               std::string("unknown dtype '") + dt + "'");
}

TEST(Parser, BadShapes) {
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[-1],"data_offsets":[0,1]}})", 1), "non-negative integers");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1.0],"data_offsets":[0,1]}})", 1), "non-negative integers");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":["1"],"data_offsets":[0,1]}})", 1), "non-negative integers");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":4,"data_offsets":[0,1]}})", 1), "must be an array");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[9223372036854775808],"data_offsets":[0,1]}})", 1),
             "non-negative integers");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", 1), "64 bits");
  expect_bad(image(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,1]}})", 1), "too large");
}

TEST(Parser, BadDataOffsets) {
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0]}})", 1), "must be [begin, end]");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1,2]}})", 1), "must be [begin, end]");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[-1,0]}})", 1), "two non-negative integers");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[0],"data_offsets":[1,0]}})", 1), "end before they begin");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[4,5]}})", 4),
             "out of range: the data section has 4 bytes");
  expect_bad(image(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[18446744073709551615,18446744073709551615]}})", 4),
             "two non-negative integers");
}

TEST(Parser, ShapeSizeMismatch) {
  expect_bad(image(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
             "shape/size mismatch: dtype F32 and shape [2, 3] need 24 bytes but data_offsets [0, 20] span 20");
  expect_bad(image(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8), "shape/size mismatch");
}

TEST(Parser, OverlappingData) {
  expect_bad(
      image(
          R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
          16),
      "tensors 'a' [0, 16) and 'b' [8, 16) overlap");
  expect_bad(
      image(
          R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
          4),
      "overlap");
  // A tensor inside a larger one that is not its neighbour in order.
  expect_bad(
      image(
          R"({"a":{"dtype":"I8","shape":[10],"data_offsets":[0,10]},"b":{"dtype":"I8","shape":[2],"data_offsets":[2,4]},)"
          R"("c":{"dtype":"I8","shape":[2],"data_offsets":[6,8]}})",
          10),
      "overlap");
  // Adjacent is not overlapping.
  EXPECT_EQ(
      parse(
          image(
              R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"I8","shape":[2],"data_offsets":[2,4]}})",
              4))
          .tensors.size(),
      2u);
}

TEST(Parser, EveryDtypeNameAndSize) {
  const std::vector<std::pair<std::string, std::size_t>> all = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},          {"F8_E5M2", 1},     {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2},        {"I32", 4},         {"U32", 4},     {"F32", 4},     {"F64", 8},
      {"I64", 8},  {"U64", 8}, {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}, {"C64", 8}};
  for (const auto& [name, size] : all) {
    const auto dt = xqcli::parse_st_dtype(name);
    ASSERT_TRUE(dt.has_value()) << name;
    EXPECT_EQ(xqcli::st_dtype_name(*dt), name);
    EXPECT_EQ(xqcli::st_dtype_size(*dt), size) << name;
    const std::string j =
        R"({"t":{"dtype":")" + name + R"(","shape":[3],"data_offsets":[0,)" + std::to_string(3 * size) + "]}}";
    EXPECT_EQ(parse(image(j, 3 * size)).tensors[0].dtype, *dt);
  }
  EXPECT_TRUE(xqcli::st_is_quantizable(StDType::F32));
  EXPECT_TRUE(xqcli::st_is_quantizable(StDType::F16));
  EXPECT_TRUE(xqcli::st_is_quantizable(StDType::BF16));
  EXPECT_FALSE(xqcli::st_is_quantizable(StDType::F64));
  EXPECT_FALSE(xqcli::st_is_quantizable(StDType::I8));
}

// ---- the official reader's rules (issue 11: the parser was more lenient than the Rust crate) ----

const std::string kT = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";

TEST(Strict, ByteOrderMarkNulAndTrailingBytesAfterNulAreRefused) {
  expect_bad(image("\xEF\xBB\xBF{" + kT + "}", 4), "byte-order mark");
  // nlohmann's lexer stops at a NUL: the tensor after it used to be dropped silently.
  expect_bad(image(std::string("{") + kT + "}" + std::string(1, '\0') +
                       R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   8),
             "NUL byte at offset");
  expect_bad(image(std::string("{") + kT + "}" + std::string(3, '\0'), 4), "NUL byte");
}

TEST(Strict, JsonWhitespaceMayPadBothEnds) {
  for (const std::string& pad : {std::string("   "), std::string("\n"), std::string("\t\r\n ")}) {
    EXPECT_EQ(parse(image("{" + kT + "}" + pad, 4)).tensors.size(), 1u);
    EXPECT_EQ(parse(image(pad + "{" + kT + "}", 4)).tensors.size(), 1u);
  }
}

TEST(Strict, DuplicateKeysAnywhereAreRefused) {
  expect_bad(image(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
             "has key 'dtype' twice in the entry of 'a'");
  expect_bad(image(R"({"a":{"dtype":"F32","shape":[1],"shape":[1],"data_offsets":[0,4]}})", 4), "'shape' twice");
  expect_bad(image(R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"},)" + kT + "}", 4), "\"__metadata__\" twice");
  expect_bad(image(R"({"__metadata__":{"k":"1","k":"2"},)" + kT + "}", 4), "'k' twice");
}

TEST(Strict, MetadataNullAndUnknownEntryKeysAreAccepted) {
  EXPECT_TRUE(parse(image(R"({"__metadata__":null,)" + kT + "}", 4)).metadata.empty());
  EXPECT_EQ(
      parse(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":[1,{"x":2}]}})", 4)).tensors.size(),
      1u);
}

TEST(Strict, DataMustBeContiguousAndFullyCovered) {
  expect_bad(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
             "tensor 'a' begins at data offset 4 but the data section begins at 0");
  expect_bad(
      image(
          R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"I8","shape":[2],"data_offsets":[3,5]}})",
          5),
      "tensor 'b' begins at data offset 3 but the previous tensor 'a' ends at 2");
  expect_bad(image("{" + kT + "}", 5), "the tensors cover 4 bytes of the data section but it has 5");
  expect_bad(image("{}", 1), "cover 0 bytes");
  // An empty tensor must sit where the previous one ends, like any other.
  expect_bad(
      image(
          R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"I8","shape":[0],"data_offsets":[2,2]},)"
          R"("b":{"dtype":"I8","shape":[4],"data_offsets":[4,8]}})",
          8),
      "overlap");
  const Header h = parse(image(
      R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"I8","shape":[0],"data_offsets":[4,4]},)"
      R"("f":{"dtype":"I8","shape":[0],"data_offsets":[8,8]},"b":{"dtype":"I8","shape":[4],"data_offsets":[4,8]}})",
      8));
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[1].name, "e");
  EXPECT_EQ(h.tensors[3].name, "f");
}

TEST(Strict, SubByteDtypesMustFillWholeBytes) {
  EXPECT_EQ(parse(image(R"({"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}})", 3)).tensors[0].dtype,
            StDType::F4);
  EXPECT_EQ(parse(image(R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3)).tensors[0].dtype,
            StDType::F6_E2M3);
  EXPECT_EQ(parse(image(R"({"a":{"dtype":"F6_E3M2","shape":[0],"data_offsets":[0,0]}})", 0)).tensors[0].numel, 0);
  expect_bad(image(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
             "4-bit elements and shape [3] does not fill whole bytes");
  expect_bad(image(R"({"a":{"dtype":"F6_E2M3","shape":[1],"data_offsets":[0,1]}})", 1), "does not fill whole bytes");
  expect_bad(image(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,4]}})", 4), "need 2 bytes");
  EXPECT_EQ(xqcli::st_dtype_bits(StDType::F4), 4u);
  EXPECT_EQ(xqcli::st_dtype_size(StDType::F4), 1u);
  EXPECT_EQ(xqcli::st_dtype_bits(StDType::F6_E3M2), 6u);
}

// ---- hostile headers: deep nesting, huge values in messages, many tensors (issue 11) ----

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
std::string deep_object(std::size_t depth) {
  std::string s;
  for (std::size_t i = 0; i < depth; ++i) s += "{\"k\":";
  return s + "1" + std::string(depth, '}');
}

TEST(Hostile, DeepNestingIsRefusedWithoutRecursion) {
  const std::size_t deep = 100'000;
  for (const std::string& j : {R"({"a":{"dtype":"F32","shape":)" + nested(deep) + R"(,"data_offsets":[0,4]}})",
                               R"({"a":{"dtype":"F32","shape":[1],"data_offsets":)" + nested(deep) + "}}",
                               "{\"__metadata__\":" + nested(deep) + "}", nested(deep), deep_object(deep)}) {
    try {
      parse(image(j, 4));
      ADD_FAILURE() << "accepted";
    } catch (const CliError& e) {
      EXPECT_NE(std::string(e.what()).find("the JSON header nesting deeper than 16 levels"), std::string::npos)
          << xqcli::clip(e.what(), 300);
      EXPECT_LT(std::string(e.what()).size(), 200u);
    }
  }
  // 16 levels parse (and then fail validation as a shape).
  expect_bad(image(R"({"a":{"dtype":"F32","shape":)" + nested(14) + R"(,"data_offsets":[0,4]}})", 4),
             "non-negative integers, got [[[[");
}

TEST(Hostile, QuotedValuesAreCut) {
  const std::string big(100'000, 'x');
  for (const std::string& j :
       {R"({"a":{"dtype":"F32","shape":[")" + big + R"("],"data_offsets":[0,4]}})",
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[")" + big + R"(",4]}})",
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,)" + std::string(50'000, '1') + "]}}",
        R"({"a":{"dtype":")" + big + R"(","shape":[1],"data_offsets":[0,4]}})",
        R"({")" + big + R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
        R"({")" + big + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},")" + big + R"(":1})",
        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"s":")" + big}) {
    try {
      parse(image(j, 4));
      ADD_FAILURE() << "accepted";
    } catch (const CliError& e) {
      const std::string m = e.what();
      EXPECT_LT(m.size(), 600u) << m.substr(0, 600);
      EXPECT_NE(m.find("..."), std::string::npos) << m.substr(0, 600) << " for " << j.substr(0, 100);
    }
  }
}

TEST(Hostile, ClipAndUtf8Safe) {
  EXPECT_EQ(xqcli::clip("abc", 3), "abc");
  EXPECT_EQ(xqcli::clip("abcd", 3), "abc...");
  EXPECT_EQ(xqcli::clip("ab\xc3\xa9", 3), "ab...");  // never inside a character
  EXPECT_EQ(xqcli::utf8_safe("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(xqcli::utf8_safe("a\xff"
                             "b"),
            "a\\xFFb");
  EXPECT_EQ(xqcli::utf8_safe("\xc3"), "\\xC3");                    // truncated sequence
  EXPECT_EQ(xqcli::utf8_safe("\xed\xa0\x80"), "\\xED\\xA0\\x80");  // a UTF-16 surrogate
  EXPECT_EQ(xqcli::utf8_safe("\xc0\xaf"), "\\xC0\\xAF");           // overlong
  EXPECT_EQ(xqcli::utf8_safe("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

// 100k tensors used to take minutes (nlohmann's callback parser rescans the object after each member).
TEST(Hostile, HundredThousandTensorsParseInLinearTime) {
  constexpr int kTensors = 100'000;
  std::string j = R"({"__metadata__":{"format":"pt"})";
  j.reserve(8'000'000);
  for (int i = 0; i < kTensors; ++i)
    j += ",\"model.layers." + std::to_string(i) + ".w\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[" +
         std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  j += "}";
  const auto f = image(j, 4 * kTensors);
  const auto t0 = std::chrono::steady_clock::now();
  const Header h = parse(f);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ timing ] %d tensors, %zu-byte header parsed in %.3f s\n", kTensors, j.size(), s);
  ASSERT_EQ(h.tensors.size(), static_cast<std::size_t>(kTensors));
  EXPECT_EQ(h.tensors[77].name, "model.layers.77.w");
  ASSERT_NE(h.find("model.layers.99999.w"), nullptr);
  EXPECT_EQ(h.find("model.layers.99999.w")->begin, 4u * 99'999);
  EXPECT_EQ(h.find("model.layers.100000.w"), nullptr);
}

TEST(Writer, LayoutAlignsAndOrdersLikeTheOfficialWriter) {
  std::vector<xqcli::OutTensor> t = {
      {"z.small", StDType::I8, {3}, 3, 0}, {"b.half", StDType::F16, {3}, 6, 0}, {"a.half", StDType::BF16, {1}, 2, 0},
      {"w", StDType::I32, {2, 2}, 16, 0},  {"big", StDType::I64, {1}, 8, 0},    {"f", StDType::F32, {3}, 12, 0},
  };
  EXPECT_EQ(xqcli::layout_tensors(t), 47u);
  const std::vector<std::string> order = {"big", "f", "w", "a.half", "b.half", "z.small"};
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].name, order[i]);
    EXPECT_EQ(t[i].offset % xqcli::st_dtype_size(t[i].dtype), 0u) << t[i].name;
  }
  EXPECT_EQ(t[1].offset, 8u);
  EXPECT_EQ(t[5].offset, 44u);
}

TEST(Writer, HeaderRoundTripsThroughTheParser) {
  std::vector<xqcli::OutTensor> t = {
      {"layer.weight", StDType::I8, {4, 8}, 32, 0},
      {"layer.weight.scale", StDType::F32, {4, 1}, 16, 0},
      {"norm", StDType::BF16, {8}, 16, 0},
      {"empty", StDType::F32, {0, 3}, 0, 0},
      {"caf\xc3\xa9 \"quoted\" \\ name", StDType::U8, {2}, 2, 0},
  };
  const std::uint64_t data = xqcli::layout_tensors(t);
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"xquant.bits", "8"}, {"note", "a \"b\"\n"}};
  const std::string prefix = xqcli::build_header(t, meta);
  EXPECT_EQ(prefix.size() % 8, 0u);  // the data section starts 8-byte aligned
  EXPECT_EQ(prefix.substr(8, 16), R"({"__metadata__":)");
  std::vector<std::byte> f(prefix.size() + data, std::byte{0});
  std::memcpy(f.data(), prefix.data(), prefix.size());
  const Header h = parse(f);
  EXPECT_EQ(h.metadata, meta);
  EXPECT_EQ(h.data_start, prefix.size());
  ASSERT_EQ(h.tensors.size(), t.size());
  for (const auto& o : t) {
    const auto* e = h.find(o.name);
    ASSERT_NE(e, nullptr) << o.name;
    EXPECT_EQ(e->dtype, o.dtype);
    EXPECT_EQ(e->shape, o.shape);
    EXPECT_EQ(e->begin, o.offset);
    EXPECT_EQ(e->nbytes(), o.nbytes);
  }
}

TEST(Writer, NoMetadataMeansNoMetadataKey) {
  std::vector<xqcli::OutTensor> t = {{"a", StDType::I8, {1}, 1, 0}};
  xqcli::layout_tensors(t);
  const std::string prefix = xqcli::build_header(t, {});
  EXPECT_EQ(prefix.find("__metadata__"), std::string::npos);
  EXPECT_EQ(prefix.substr(8, 5), R"({"a":)");
}

TEST(Dims, StrAndCheckedNumel) {
  EXPECT_EQ(xqcli::dims_str({}), "[]");
  EXPECT_EQ(xqcli::dims_str({2, 3}), "[2, 3]");
  EXPECT_EQ(xqcli::checked_numel({}).value(), 1);
  EXPECT_EQ(xqcli::checked_numel({2, 0, 5}).value(), 0);
  EXPECT_FALSE(xqcli::checked_numel({-1}).has_value());
  EXPECT_FALSE(xqcli::checked_numel({1LL << 32, 1LL << 31}).has_value());
  EXPECT_EQ(xqcli::checked_numel({1LL << 32, (1LL << 31) - 1}).value(), (1LL << 32) * ((1LL << 31) - 1));
}

}  // namespace
