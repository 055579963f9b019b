#include "runtime/json_schema_regex.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/guided.h"

namespace mqa {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const RegexGuide> Compile(const std::string& pattern) {
  auto guide = RegexGuide::Compile(pattern, std::make_shared<GuideVocab>());
  EXPECT_TRUE(guide.ok()) << guide.status() << "\npattern: " << pattern;
  return guide.ok() ? *guide : nullptr;
}

bool FullMatch(const RegexGuide& g, const std::string& text) {
  return g.Accepting(g.AdvanceBytes(RegexGuide::start(), text));
}

// A random text of the guide's language: random live bytes (printable ASCII preferred, so that
// strings stay readable), stopping at an accepting state with probability 1/4 or when nothing
// can follow. Empty if the walk dies out (it cannot: every state reached is live).
std::string RandomMatch(const RegexGuide& g, std::mt19937& rng) {
  std::string text;
  int state = RegexGuide::start();
  for (int steps = 0; steps < 400; ++steps) {
    if (g.Complete(state) || (g.Accepting(state) && rng() % 4 == 0)) return text;
    std::vector<int> live;
    for (int b = 0; b < 256; ++b) {
      if (g.AdvanceBytes(state, std::string(1, static_cast<char>(b))) != RegexGuide::kDead &&
          (b >= 0x20 && b < 0x7f)) {
        live.push_back(b);
      }
    }
    if (live.empty()) return "";
    if (steps > 150) {  // long enough: close what is open
      std::vector<int> closing;
      for (int b : live) {
        if (b == '}' || b == ']' || b == '"' || b == '0') closing.push_back(b);
      }
      if (!closing.empty()) live = closing;
    }
    const char c = static_cast<char>(live[rng() % live.size()]);
    text += c;
    state = g.AdvanceBytes(state, std::string(1, c));
  }
  return g.Accepting(state) ? text : "";
}

// Every schema's texts: random walks through its automaton parse as JSON and have the schema's
// shape (types, required keys, enum values, array bounds); hand-written documents match or not.
TEST(JsonSchemaRegex, RandomTextsAreJsonOfTheSchema) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer"},
      "score": {"type": "number"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "minItems": 1, "maxItems": 3},
      "ok": {"type": "boolean"},
      "kind": {"$ref": "#/$defs/kind"},
      "extra": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 2, "maxLength": 3}]}
    },
    "required": ["name", "tags", "kind"],
    "$defs": {"kind": {"const": "x-y"}}
  })");
  auto pattern = JsonSchemaToRegex(schema);
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  auto guide = Compile(*pattern);
  ASSERT_NE(guide, nullptr);
  std::mt19937 rng(7);
  int with_optional = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string text = RandomMatch(*guide, rng);
    ASSERT_FALSE(text.empty());
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    ASSERT_TRUE(doc.is_object()) << text;
    ASSERT_TRUE(doc.contains("name") && doc["name"].is_string()) << text;
    const std::string name = doc["name"].get<std::string>();
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (c & 0xc0) != 0x80; }),
              8)
        << text;  // characters (an escape is one)
    ASSERT_TRUE(doc["tags"].is_array()) << text;
    EXPECT_GE(doc["tags"].size(), 1u);
    EXPECT_LE(doc["tags"].size(), 3u);
    for (const json& t : doc["tags"]) EXPECT_TRUE(t == "a" || t == "b" || t == 3) << text;
    EXPECT_EQ(doc["kind"], "x-y") << text;
    if (doc.contains("age")) EXPECT_TRUE(doc["age"].is_number_integer()) << text;  // <= 19 digits
    if (doc.contains("score")) EXPECT_TRUE(doc["score"].is_number()) << text;
    if (doc.contains("ok")) EXPECT_TRUE(doc["ok"].is_boolean()) << text;
    if (doc.contains("extra")) {
      EXPECT_TRUE(doc["extra"].is_null() ||
                  (doc["extra"].is_string() && doc["extra"].get<std::string>().size() >= 2))
          << text;
    }
    with_optional += doc.contains("age") + doc.contains("extra");
  }
  EXPECT_GT(with_optional, 20);  // the optional members do appear
  EXPECT_TRUE(FullMatch(*guide, R"({"name": "bo", "tags": ["a", 3], "kind": "x-y"})"));
  EXPECT_TRUE(FullMatch(
      *guide,
      R"({"name":"","age":-4,"score":1.5e3,"tags":["b"],"ok":true,"kind":"x-y","extra":null})"));
  EXPECT_FALSE(FullMatch(*guide, R"({"name": "bo", "kind": "x-y"})"));  // tags required
  EXPECT_FALSE(FullMatch(*guide, R"({"tags": ["a"], "name": "bo", "kind": "x-y"})"));  // order
  EXPECT_FALSE(FullMatch(*guide, R"({"name": "bo", "tags": [], "kind": "x-y"})"));     // minItems
  EXPECT_FALSE(FullMatch(*guide, R"({"name": "bo", "tags": ["c"], "kind": "x-y"})"));  // enum
  EXPECT_FALSE(FullMatch(*guide, R"({"name": "bo", "age": 1.5, "tags": ["a"], "kind": "x-y"})"));
}

TEST(JsonSchemaRegex, AnyJsonObjectIsJsonAndCompilesQuickly) {
  const auto start = std::chrono::steady_clock::now();
  auto guide = Compile(AnyJsonObjectRegex());
  ASSERT_NE(guide, nullptr);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("json_object: %d automaton states, compiled in %.1f ms\n", guide->num_states(), ms);
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    const std::string text = RandomMatch(*guide, rng);
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    EXPECT_TRUE(doc.is_object()) << text;
  }
  EXPECT_TRUE(FullMatch(*guide, R"({"a": [1, {"b": null}], "c": "\u00e9\n"})"));
  EXPECT_FALSE(FullMatch(*guide, R"([1, 2])"));
  EXPECT_FALSE(FullMatch(*guide, R"({"a": })"));
}

TEST(JsonSchemaRegex, StringFormats) {
  const std::pair<const char*, std::vector<std::pair<const char*, bool>>> cases[] = {
      {"date", {{"2026-12-05", true}, {"2026-13-05", false}, {"26-12-05", false}}},
      {"time", {{"07:13:43", true}, {"07:13:43.25+01:00", true}, {"24:00:00", false}}},
      {"date-time", {{"2026-12-05T07:13:43Z", true}, {"2026-12-05 07:13:43Z", false}}},
      {"uuid", {{"123e4567-e89b-12d3-a456-426614174000", true}, {"123e4567", false}}},
      {"email", {{"dev@mqaserve.example", true}, {"dev@localhost", false}, {"@x.y", false}}},
  };
  for (const auto& [format, texts] : cases) {
    auto pattern = JsonSchemaToRegex(json{{"type", "string"}, {"format", format}});
    ASSERT_TRUE(pattern.ok()) << pattern.status();
    auto guide = Compile(*pattern);
    ASSERT_NE(guide, nullptr);
    for (const auto& [text, valid] : texts) {
      EXPECT_EQ(FullMatch(*guide, absl::StrCat("\"", text, "\"")), valid) << format << " " << text;
    }
  }
  EXPECT_FALSE(JsonSchemaToRegex(json{{"type", "string"}, {"format", "ipv6"}}).ok());
}

TEST(JsonSchemaRegex, RefusesWhatItDoesNotSupport) {
  for (const char* bad :
       {R"({"type": "string", "pattern": "a+"})", R"({"$ref": "#/$defs/missing"})",
        R"({"$ref": "http://x"})", R"({"type": "tuple"})", R"({"enum": []})", R"(false)",
        R"({"type": "array", "minItems": 3, "maxItems": 1})", R"(5)",
        R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"}) {
    auto pattern = JsonSchemaToRegex(json::parse(bad));
    EXPECT_TRUE(absl::IsInvalidArgument(pattern.status())) << bad;
    EXPECT_NE(pattern.status().message().find("JSON schema"), std::string::npos) << bad;
  }
}

// compact (vLLM's disable_any_whitespace): the same documents without a space between tokens; a
// space anywhere between tokens is refused (inside strings it is text, and stays).
TEST(JsonSchemaRegex, CompactTakesNoSpaceBetweenTokens) {
  const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type":
      "string"}, "tags": {"type": "array", "items": {"type": "integer"}}, "extra": {}},
      "required": ["name", "tags"]})");
  absl::StatusOr<std::string> tight = JsonSchemaToRegex(schema, /*compact=*/true);
  absl::StatusOr<std::string> spaced = JsonSchemaToRegex(schema);
  ASSERT_TRUE(tight.ok()) << tight.status();
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  auto t = Compile(*tight), d = Compile(*spaced);
  ASSERT_NE(t, nullptr);
  ASSERT_NE(d, nullptr);
  for (const char* ok : {R"({"name":"a b","tags":[]})", R"({"name":"","tags":[1,-2],"extra":{}})",
                         R"({"name":"x","tags":[3],"extra":[true,{"k":null}]})"}) {
    EXPECT_TRUE(FullMatch(*t, ok)) << ok;
    EXPECT_TRUE(FullMatch(*d, ok)) << ok;
  }
  for (const char* spacy :
       {R"({ "name":"a","tags":[]})", R"({"name": "a","tags":[]})", R"({"name":"a", "tags":[]})",
        R"({"name":"a","tags":[1, 2]})", R"({"name":"a","tags":[],"extra":{"k": 1}})"}) {
    EXPECT_FALSE(FullMatch(*t, spacy)) << spacy;
    EXPECT_TRUE(FullMatch(*d, spacy)) << spacy;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {  // what the compact guide generates: JSON, no space between tokens
    const std::string text = RandomMatch(*t, rng);
    ASSERT_FALSE(text.empty());
    ASSERT_TRUE(json::accept(text)) << text;
    bool in_string = false, escaped = false;
    for (char c : text) {  // no space outside a string
      if (in_string) {
        in_string = escaped || c != '"';
        escaped = !escaped && c == '\\';
      } else {
        in_string = c == '"';
        EXPECT_NE(c, ' ') << text;
      }
    }
  }
}

}  // namespace
}  // namespace mqa
