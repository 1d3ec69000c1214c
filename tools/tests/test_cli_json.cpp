// The JSON reader of model directories (tools/src/json.hpp) and the output-path rule (files.hpp,
// check_apart / resolve_path / temp_template): nesting limit, linear time, values kept byte for byte,
// typed errors naming the key; outputs that are, contain or lie inside an input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "errors.hpp"
#include "files.hpp"
#include "json.hpp"

namespace {

namespace fs = std::filesystem;
using namespace xqcli;

// The message of the CliError that `f` throws (fails the test when it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CliError& e) {
    EXPECT_EQ(e.exit_code(), kExitBadInput);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string reparse_dump(const std::string& text, int indent = -1) { return json::parse(text, "t").dump(indent); }

TEST(Json, KeepsNumbersAndStringsAsWritten) {
  // Python's json.dumps writes these; transformers reads them. Each must come back byte for byte.
  const std::string text =
      R"({"big":123456789012345678901234567890,"neg":-98765432109876543210987,"inf":Infinity,"ninf":-Infinity,)"
      R"("nan":NaN,"f":1.0,"e":1E+5,"z":-0,"tiny":5e-324,"esc":"caf\u00e9 \"q\" \/ \ud83d\ude00 \ud800",)"
      R"("u":"ünï","a":[1,2.50,[]],"o":{}})";
  EXPECT_EQ(reparse_dump(text), text);
  const json::Value v = json::parse(text, "t");
  EXPECT_EQ(v["esc"].text(), "caf\xC3\xA9 \"q\" / \xF0\x9F\x98\x80 \xED\xA0\x80");
  EXPECT_FALSE(v["inf"].is_finite_number());
  EXPECT_FALSE(v["big"].as_int64().has_value());
  EXPECT_TRUE(v["big"].is_integer_text());
}

TEST(Json, IndentedLayoutIsNlohmanns) {
  const std::string text = R"({"a": [1, {"b": null, "c": [true, false]}, "x\ty", []], "d": {}, "e": {"f": "g"}})";
  EXPECT_EQ(reparse_dump(text, 2), nlohmann::ordered_json::parse(text).dump(2));
  EXPECT_EQ(reparse_dump(text), nlohmann::ordered_json::parse(text).dump());
  // Built values (no source text) are escaped as nlohmann escapes them.
  json::Value o = json::Value::object();
  o.set("k\n\x01", json::Value::string("v\"\\\x1f\xC3\xA9"));
  nlohmann::ordered_json expected = nlohmann::ordered_json::object();
  expected["k\n\x01"] = "v\"\\\x1f\xC3\xA9";
  EXPECT_EQ(o.dump(), expected.dump());
}

TEST(Json, DepthLimitIsAClearError) {
  const std::string ok = std::string(json::kMaxDepth, '[') + std::string(json::kMaxDepth, ']');
  EXPECT_EQ(reparse_dump(ok), ok);
  const std::string over = std::string(json::kMaxDepth + 1, '[') + std::string(json::kMaxDepth + 1, ']');
  EXPECT_NE(error_of([&] { json::parse(over, "cfg.json"); }).find("nested deeper than 256 levels"), std::string::npos);
  // A million levels: an error, not a stack overflow.
  std::string deep;
  for (int i = 0; i < 1000000; ++i) deep += i % 2 ? "[" : "{\"k\":";
  const std::string msg = error_of([&] { json::parse(deep, "m/config.json"); });
  EXPECT_EQ(msg.rfind("m/config.json: malformed JSON at line 1, column ", 0), 0u) << msg;
  EXPECT_NE(msg.find("nested deeper"), std::string::npos) << msg;
}

TEST(Json, RefusesWhatPythonRefuses) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "expected a value, got the end of the file"},
      {"{\"a\":1,\"a\":2}", "duplicate key 'a'"},
      {"\xEF\xBB\xBF{}", "byte-order mark"},
      {"{} x", "unexpected text after the JSON value"},
      {"[01]", "leading zero"},
      {"[1.]", "expected a digit after '.'"},
      {"[1e]", "expected a digit in the exponent"},
      {"[-]", "expected a digit"},
      {"[nan]", "expected a value"},
      {"[Infinityx]", "expected ',' or ']'"},
      {"[\"a\x01\"]", "control character (byte 0x01)"},
      {"[\"\xC3\"]", "invalid UTF-8"},
      {"[\"\xFF\"]", "invalid UTF-8 (byte 0xFF)"},
      {"[\"\xED\xA0\x80\"]", "invalid UTF-8"},  // an encoded surrogate
      {"[\"\\x\"]", "invalid escape"},
      {"[\"\\u12G4\"]", "4 hexadecimal digits"},
      {"{\"a\" 1}", "expected ':'"},
      {"{1:2}", "expected a key"},
      {"[1 2]", "expected ',' or ']'"},
      {"\"abc", "without its closing quote"},
      {"[\0]", "expected a value"},
  };
  for (const auto& [text, needle] : cases) {
    const std::string t(text, text[0] == '[' && text[1] == '\0' ? 3 : std::strlen(text));
    const std::string msg = error_of([&] { json::parse(t, "f.json"); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "input " << t << ": " << msg;
    EXPECT_EQ(msg.rfind("f.json: ", 0), 0u) << msg;
  }
  EXPECT_NE(error_of([&] { json::parse("{\n  \"a\": 1,\n  \"b\": x}", "f"); }).find("line 3, column 8"),
            std::string::npos);
}

TEST(Json, LinearTimeForManyMembers) {
  // ordered_json parses such an object in quadratic time (a linear scan per key): 200,000 keys would
  // take minutes. Here: parse, look every key up, dump.
  std::string text = "{";
  constexpr int kN = 200000;
  for (int i = 0; i < kN; ++i) {
    text.append(i ? ",\"t" : "\"t")
        .append(std::to_string(i))
        .append("\":\"f")
        .append(std::to_string(i % 7))
        .append("\"");
  }
  text += "}";
  const auto t0 = std::chrono::steady_clock::now();
  const json::Value v = json::parse(text, "index");
  std::size_t found = 0;
  for (int i = 0; i < kN; ++i) found += v.contains(std::string(1, 't').append(std::to_string(i)));
  EXPECT_EQ(found, static_cast<std::size_t>(kN));
  EXPECT_EQ(v.dump(), text);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

TEST(Json, EditKeepsOrderAndIndex) {
  json::Value v = json::parse(R"({"a":1,"b":2,"c":3})", "t");
  EXPECT_TRUE(v.erase("a"));
  EXPECT_FALSE(v.erase("zz"));
  v.set("b", json::Value::string("x"));
  v.set("d", json::Value::integer(-4));
  EXPECT_EQ(v.dump(), R"({"b":"x","c":3,"d":-4})");
  EXPECT_EQ(v["c"].text(), "3");
  EXPECT_TRUE(v["missing"].is_null());
  EXPECT_TRUE(v["c"]["x"].is_null());  // not an object: nothing inside
}

TEST(Json, TypedAccessNamesTheKeyAndRefusesInexactNumbers) {
  const json::Value v = json::parse(
      R"({"n":4,"frac":4.7,"whole":4.0,"huge":1e300,"big":99999999999999999999,"s":"x","b":true,"neg":-3})", "t");
  EXPECT_EQ(json::get_int(v["n"], "c.json: w.num_bits", 4, 8), 4);
  for (const char* k : {"frac", "whole", "huge", "big", "s", "b"}) {
    const std::string msg = error_of([&] { json::get_int(v[k], std::string("c.json: w.") + k, 4, 8); });
    EXPECT_EQ(msg.rfind(std::string("c.json: w.") + k + ": expected an integer from 4 to 8, got ", 0), 0u) << msg;
  }
  EXPECT_NE(error_of([&] { json::get_int(v["frac"], "k", 4, 8); }).find("got number 4.7"), std::string::npos);
  EXPECT_NE(error_of([&] { json::get_int(v["neg"], "k", 1, 9); }).find("got -3"), std::string::npos);
  EXPECT_EQ(json::get_string(v["s"], "k"), "x");
  EXPECT_NE(error_of([&] {
              json::get_string(v["n"], "c.json: q.format");
            }).find("c.json: q.format: expected a string, got number 4"),
            std::string::npos);
  EXPECT_TRUE(json::get_bool(v["b"], "k"));
  EXPECT_NE(error_of([&] { json::get_bool(v["s"], "k.sym"); }).find("k.sym: expected true or false"),
            std::string::npos);
}

TEST(Json, ToNlohmannWritesOnlyValidJson) {
  const json::Value v = json::parse(R"({"i":-5,"u":18446744073709551615,"big":1234567890123456789012,"f":0.5,)"
                                    R"("inf":Infinity,"nan":NaN,"over":1e999,"s":"\u00e9","a":[null,true]})",
                                    "t");
  const auto j = v.to_nlohmann();
  EXPECT_EQ(j.dump(), R"({"i":-5,"u":18446744073709551615,"big":"1234567890123456789012","f":0.5,"inf":"Infinity",)"
                      R"("nan":"NaN","over":"1e999","s":"é","a":[null,true]})");
  EXPECT_EQ(json::Value::from_nlohmann(j).dump(), j.dump());
}

// ---- the output-path rule ----

struct TempTree {
  fs::path root;
  TempTree() {
    char tmpl[] = "/tmp/xquant-json-test-XXXXXX";
    root = fs::canonical(::mkdtemp(tmpl));
  }
  ~TempTree() { fs::remove_all(root); }
  std::string p(const std::string& rel) const { return (root / rel).string(); }
};

TEST(OutputRule, ResolvesLinksDotsAndMissingTails) {
  TempTree t;
  fs::create_directories(t.p("models/llama"));
  fs::create_directory_symlink(t.p("models"), t.p("link"));
  EXPECT_EQ(resolve_path(t.p("link/llama")), t.p("models/llama"));
  EXPECT_EQ(resolve_path(t.p("link/new/deeper")), t.p("models/new/deeper"));
  EXPECT_EQ(resolve_path(t.p("models/llama/../llama/./x/..")), t.p("models/llama"));
  EXPECT_EQ(resolve_path(t.p("models/nothere/..")), t.p("models"));
  EXPECT_EQ(resolve_path("/"), "/");
  EXPECT_TRUE(path_within("/a/b", "/a"));
  EXPECT_TRUE(path_within("/a", "/a"));
  EXPECT_FALSE(path_within("/ab", "/a"));
  EXPECT_TRUE(path_within("/x", "/"));
}

TEST(OutputRule, RefusesOutputsThatAreContainOrLieInsideAnInput) {
  TempTree t;
  fs::create_directories(t.p("models/llama"));
  fs::create_directories(t.p("models/llama2"));
  fs::create_directory_symlink(t.p("models"), t.p("link"));
  const std::string in = t.p("models/llama");
  const std::pair<std::string, const char*> refused[] = {
      {t.p("models"), " contains "},
      {t.p("models/llama/.."), " contains "},
      {t.p("link"), " contains "},
      {t.p("models/llama"), " is "},
      {t.p("link/llama/"), " is "},
      {t.p("models/llama/quantized"), " lies inside "},
      {t.p("models/llama/config.json"), " lies inside "},
      {t.root.string(), " contains "},
  };
  for (const auto& c : refused) {  // not a structured binding: clang 14 cannot capture one in a lambda
    const std::string& out = c.first;
    const char* how = c.second;
    const std::string msg = error_of([&] { check_apart(out, "-o", {in}); });
    EXPECT_NE(msg.find(how), std::string::npos) << out << ": " << msg;
    EXPECT_EQ(msg.rfind("-o " + out, 0), 0u) << msg;
  }
  EXPECT_NO_THROW(check_apart(t.p("models/llama2"), "-o", {in}));
  EXPECT_NO_THROW(check_apart(t.p("models/llama-w4a16"), "-o", {in}));
  EXPECT_NO_THROW(check_apart(t.p("link/other/x"), "--report", {in, t.p("out")}));
  EXPECT_NE(error_of([&] {
              check_apart(t.p("out/r.json"), "--report", {in, t.p("out")});
            }).find("--report "),
            std::string::npos);
}

TEST(OutputRule, TempNamesFitNameMax) {
  const std::string name(255, 'n');
  const std::string tmpl = temp_template("/some/dir/" + name);
  EXPECT_EQ(tmpl.rfind("/some/dir/.nnn", 0), 0u);
  EXPECT_EQ(tmpl.size() - std::string("/some/dir/").size(), 255u);
  EXPECT_EQ(tmpl.substr(tmpl.size() - 14), ".xquant-XXXXXX");
  EXPECT_EQ(temp_template("out"), "./.out.xquant-XXXXXX");
}

}  // namespace
