#include "runtime/grammar.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "runtime/guided.h"
#include "runtime/worker_pool.h"

namespace mqa {
namespace {

std::shared_ptr<const GuideVocab> NoVocab() { return std::make_shared<GuideVocab>(); }

std::shared_ptr<const GrammarGuide> Compile(const std::string& grammar,
                                            std::shared_ptr<const GuideVocab> vocab = NoVocab()) {
  auto guide = GrammarGuide::Compile(grammar, std::move(vocab));
  EXPECT_TRUE(guide.ok()) << guide.status() << "\ngrammar:\n" << grammar;
  return guide.ok() ? *guide : nullptr;
}

bool FullMatch(const Guide& g, const std::string& text) {
  return g.Accepting(g.AdvanceBytes(Guide::start(), text));
}

// Every string over `alphabet` up to `max_length`: the grammar and the regex agree on which are
// sentences and on which can still become one.
void ExpectSameLanguage(const std::string& grammar, const std::string& regex,
                        const std::string& alphabet, int max_length) {
  SCOPED_TRACE(grammar);
  std::shared_ptr<const GrammarGuide> g = Compile(grammar);
  auto r = RegexGuide::Compile(regex, NoVocab());
  ASSERT_TRUE(g != nullptr && r.ok()) << r.status();
  std::vector<std::string> level = {""};
  int checked = 0;
  for (int length = 0; length <= max_length; ++length) {
    std::vector<std::string> next;
    for (const std::string& text : level) {
      const int gs = g->AdvanceBytes(Guide::start(), text);
      const int rs = (*r)->AdvanceBytes(Guide::start(), text);
      ASSERT_EQ(gs == Guide::kDead, rs == Guide::kDead) << "'" << text << "'";
      ASSERT_EQ(g->Accepting(gs), (*r)->Accepting(rs)) << "'" << text << "'";
      ASSERT_EQ(g->Complete(gs), (*r)->Complete(rs)) << "'" << text << "'";
      ++checked;
      if (gs == Guide::kDead) continue;  // no extension of a dead text lives
      for (char c : alphabet) next.push_back(text + c);
    }
    level = std::move(next);
  }
  EXPECT_GT(checked, 30);
}

TEST(GrammarGuide, AgreesWithTheRegexOfTheSameLanguage) {
  ExpectSameLanguage(R"(root ::= ("ab" | "c")* "d"{1,3} [x-z]?)", "(ab|c)*d{1,3}[x-z]?", "abcdxy",
                     7);
  ExpectSameLanguage("root ::= item (\",\" item)*\nitem ::= [0-9]+ | \"-\" [0-9]{2}",
                     "(?:[0-9]+|-[0-9]{2})(?:,(?:[0-9]+|-[0-9]{2}))*", "12-,a", 7);
  ExpectSameLanguage("root ::= \"x\"{2,} | \"y\"{,2} \"z\"{3}", "x{2,}|y{0,2}z{3}", "xyz", 8);
  ExpectSameLanguage("root ::= [^a-c\\n] [abc]?", "[^a-c\\n][abc]?", "abcd\nz", 4);
}

// What a regex cannot say: balanced brackets, nested to any depth.
TEST(GrammarGuide, ContextFreeNesting) {
  std::shared_ptr<const GrammarGuide> g = Compile(
      "# balanced brackets, each pair maybe holding a digit\n"
      "root ::= pair+\n"
      "pair ::= \"(\" [0-9]? pair* \")\"   # nested\n"
      "  | \"[\" pair* \"]\"\n");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"()", "(1)", "([])", "(()[()])()", "((((((((((((((((9))))))))))))))))"}) {
    EXPECT_TRUE(FullMatch(*g, ok)) << ok;
  }
  for (const char* bad : {"", "(", "(]", "(12)", "())", "[1]", "((())"}) {
    EXPECT_FALSE(FullMatch(*g, bad)) << bad;
  }
  EXPECT_EQ(g->AdvanceBytes(Guide::start(), "(()]"), Guide::kDead);
  EXPECT_NE(g->AdvanceBytes(Guide::start(), "((((("), Guide::kDead);
  // Nesting is bounded (GrammarGuide::kMaxDepth): past it the text is a dead end.
  const int deep = g->AdvanceBytes(Guide::start(), std::string(200, '('));
  EXPECT_NE(deep, Guide::kDead);
  EXPECT_EQ(g->AdvanceBytes(deep, std::string(GrammarGuide::kMaxDepth, '(')), Guide::kDead);
}

// Repetitions keep the parse stacks flat: a long run revisits the same few states.
TEST(GrammarGuide, RepetitionsDoNotGrowTheStates) {
  std::shared_ptr<const GrammarGuide> g = Compile("root ::= \"<\" [a-z ]* \">\" [0-9]*");
  ASSERT_NE(g, nullptr);
  std::string text = "<";
  for (int i = 0; i < 2000; ++i) text += static_cast<char>('a' + i % 26);
  text += ">";
  for (int i = 0; i < 2000; ++i) text += static_cast<char>('0' + i % 10);
  EXPECT_TRUE(FullMatch(*g, text));
  EXPECT_LE(g->num_states(), 6);
}

TEST(GrammarGuide, Utf8CharactersAndClasses) {
  std::shared_ptr<const GrammarGuide> g = Compile("root ::= [à-ÿ]+ \"\\u00e9\" . \"\\U0001F600\"?");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(FullMatch(*g, "àÿéx"));
  EXPECT_TRUE(FullMatch(*g, "ééé😀"));
  EXPECT_TRUE(FullMatch(*g, "ñé✓😀"));
  EXPECT_FALSE(FullMatch(*g, "aéx"));
  // A character's bytes one at a time: the first byte of 'ñ' lives, of 'a' after it does not,
  // and a lead byte no class character starts with is dead at once.
  const int lead = g->AdvanceBytes(Guide::start(), "\xC3");
  EXPECT_NE(lead, Guide::kDead);
  EXPECT_NE(g->AdvanceBytes(lead, "\xB1"), Guide::kDead);
  EXPECT_EQ(g->AdvanceBytes(lead, "a"), Guide::kDead);
  EXPECT_EQ(g->AdvanceBytes(Guide::start(), "\xE2"), Guide::kDead);  // U+2000.. is past ÿ
  EXPECT_EQ(g->AdvanceBytes(Guide::start(), "\xFF"), Guide::kDead);
}

// The compact JSON object grammar (structured_outputs' disable_any_whitespace): the same objects
// without a space between tokens; any space is refused, even one the default grammar takes.
TEST(GrammarGuide, CompactJsonObjectGrammarTakesNoSpace) {
  std::shared_ptr<const GrammarGuide> tight = Compile(GrammarGuide::JsonObjectGrammar(true));
  std::shared_ptr<const GrammarGuide> spaced = Compile(GrammarGuide::JsonObjectGrammar());
  ASSERT_NE(tight, nullptr);
  ASSERT_NE(spaced, nullptr);
  for (const char* ok : {"{}", R"({"x":"a b","y":[true,null,{}],"z":-0.5e3})",
                         R"({"k":{"k":{"k":{"k":{"k":[]}}}}})"}) {
    EXPECT_TRUE(FullMatch(*tight, ok)) << ok;
    EXPECT_TRUE(FullMatch(*spaced, ok)) << ok;
  }
  for (const char* with_space : {"{ }", R"({"x": 1})", R"({"x":1 })", R"({"y":[1, 2]})"}) {
    EXPECT_FALSE(FullMatch(*tight, with_space)) << with_space;
    EXPECT_TRUE(FullMatch(*spaced, with_space)) << with_space;
  }
}

// The JSON object grammar (response_format json_object) at any depth: random walks through it are
// JSON objects, deeply nested ones are accepted, broken ones are not.
TEST(GrammarGuide, JsonObjectGrammarIsJsonAtAnyDepth) {
  std::shared_ptr<const GrammarGuide> g = Compile(GrammarGuide::JsonObjectGrammar());
  ASSERT_NE(g, nullptr);
  std::string deep = R"({"a": )";
  for (int i = 0; i < 12; ++i) deep += R"([{"b": )";
  deep += "-1.5e3";
  for (int i = 0; i < 12; ++i) deep += "}]";
  deep += "}";
  EXPECT_TRUE(FullMatch(*g, deep));
  EXPECT_TRUE(nlohmann::json::accept(deep));
  for (const char* ok : {"{}", R"({"x": "\u00e9\n", "y": [true, null, {}], "z": 0})",
                         R"({"k":{"k":{"k":{"k":{"k":[]}}}}})"}) {
    EXPECT_TRUE(FullMatch(*g, ok)) << ok;
  }
  for (const char* bad : {"[]", R"({"a" 1})", R"({"a": 01})", R"({"a": [1,]})", R"({'a': 1})",
                          "{\"a\": \"\x01\"}", R"({"a": 1}})"}) {
    EXPECT_FALSE(FullMatch(*g, bad)) << bad;
  }
  std::mt19937 rng(7);
  int objects = 0;
  for (int walk = 0; walk < 200; ++walk) {
    std::string text;
    int state = Guide::start();
    for (int steps = 0; steps < 300 && !g->Complete(state); ++steps) {
      std::vector<char> live;
      for (int b = 0x20; b < 0x7f; ++b) {
        if (g->AdvanceBytes(state, std::string(1, static_cast<char>(b))) != Guide::kDead) {
          live.push_back(static_cast<char>(b));
        }
      }
      ASSERT_FALSE(live.empty()) << text;
      if (steps > 200) {  // close what is open
        std::vector<char> closing;
        for (char c : live) {
          if (c == '}' || c == ']' || c == '"' || c == '0') closing.push_back(c);
        }
        if (!closing.empty()) live = closing;
      }
      text += live[rng() % live.size()];
      state = g->AdvanceBytes(state, text.substr(text.size() - 1));
    }
    if (!g->Complete(state)) continue;
    ++objects;
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << text;
  }
  EXPECT_GT(objects, 150);
}

TEST(GrammarGuide, MasksTokensAndEndsAtTheEnd) {
  auto vocab = std::make_shared<GuideVocab>();
  vocab->bytes = {"", "(", ")", "()", "x", "", ")(", "((", "\xC3", "\xA9"};
  vocab->eos = 5;
  std::shared_ptr<const GrammarGuide> g =
      Compile("root ::= pair+\npair ::= \"(\" pair* \")\"", vocab);
  ASSERT_NE(g, nullptr);
  auto allowed = [&](int state) {
    std::vector<float> logits(vocab->bytes.size(), 1.0f);
    g->Mask(state, absl::MakeSpan(logits));
    std::vector<int> ids;
    for (int t = 0; t < static_cast<int>(logits.size()); ++t) {
      if (logits[t] != -std::numeric_limits<float>::infinity()) ids.push_back(t);
    }
    return ids;
  };
  EXPECT_EQ(allowed(Guide::start()), (std::vector<int>{1, 3, 7}));
  const int open = g->Advance(Guide::start(), {1});
  EXPECT_EQ(allowed(open), (std::vector<int>{1, 2, 3, 6, 7}));  // ")(": "()(" lives
  const int closed = g->Advance(Guide::start(), {3});
  EXPECT_TRUE(g->Accepting(closed));
  EXPECT_FALSE(g->Complete(closed));  // another pair may follow
  EXPECT_EQ(allowed(closed), (std::vector<int>{1, 3, 5, 7}));
  // Masks from several threads at once agree (states are found while masking).
  WorkerPool pool(4);
  std::vector<std::vector<int>> got(32);
  pool.ParallelFor(32, [&](int64_t i) {
    got[i] = allowed(g->Advance(Guide::start(), std::vector<int32_t>(i % 5 + 1, 7)));
  });
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(got[i], allowed(g->Advance(Guide::start(), std::vector<int32_t>(i % 5 + 1, 7))));
  }
  std::shared_ptr<const GrammarGuide> once = Compile("root ::= \"é\"", vocab);
  ASSERT_NE(once, nullptr);
  EXPECT_TRUE(once->Complete(once->Advance(Guide::start(), {8, 9})));
}

TEST(GrammarGuide, RefusesWhatItCannotRunNamingThePlace) {
  const std::pair<const char*, const char*> bad[] = {
      {"root ::= item", "rule 'item' is used but not defined"},
      {"start ::= \"a\"", "no 'root' rule"},
      {"root ::= root \"a\" | \"b\"", "left-recursive"},
      {"root ::= opt root \"x\" | \"y\"\nopt ::= \"z\"?", "left-recursive"},
      {"root ::= (\"a\"?)* \"b\"", "such as (x?)*"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root = \"a\"", "expected ::="},
      {"root ::= \"a", "unterminated literal"},
      {"root ::= [a-", "unterminated character class"},
      {"root ::= [z-a]", "end is before its start"},
      {"root ::= (\"a\"", "expected )"},
      {"root ::= * \"a\"", "nothing before it"},
      {"root ::= \"a\"{3,2}", "n < m"},
      {"root ::= \"a\"{5000}", "over 1000"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= \"a\"\n  ) ", "line 2, column 3"},
  };
  std::string huge = "root ::=";  // 250 000 symbols written out
  for (int i = 0; i < 250; ++i) huge += " \"a\"{1000}";
  auto too_large = GrammarGuide::Compile(huge, NoVocab());
  ASSERT_FALSE(too_large.ok());
  EXPECT_TRUE(absl::StrContains(too_large.status().message(), "too large")) << too_large.status();
  for (const auto& [grammar, message] : bad) {
    auto guide = GrammarGuide::Compile(grammar, NoVocab());
    ASSERT_FALSE(guide.ok()) << grammar;
    EXPECT_EQ(guide.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(guide.status().message(), message))
        << grammar << " -> " << guide.status();
  }
}

}  // namespace
}  // namespace mqa
