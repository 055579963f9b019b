#include "runtime/guided.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "runtime/worker_pool.h"

namespace mqa {
namespace {

std::shared_ptr<const GuideVocab> NoVocab() { return std::make_shared<GuideVocab>(); }

bool FullMatch(const RegexGuide& g, const std::string& text) {
  return g.Accepting(g.AdvanceBytes(RegexGuide::start(), text));
}

// Every string of up to 6 characters over a small alphabet, and random longer ones, matched in
// full by the guide exactly when std::regex_match (ECMAScript) matches it; every prefix of a match
// leaves a live state, and Complete means no longer text matches.
TEST(RegexGuide, AgreesWithStdRegexOnAsciiPatterns) {
  const std::vector<std::string> patterns = {
      "a*",       "(ab|a)*b",      "[0-9]{2,3}", "\\d+(\\.\\d+)?", "x|yz|", "(?:a|b)+c?",
      "[^a]b",    "a{2}",          "a{0,2}b",    "\\w+",           "\\s*",  "[a-c-]+",
      "(a(b)?)+", "\"[^\"]*\"",    "a.b",        "(a|b){1,3}?",    "^ab$",  "[\\d.]+",
      "\\D\\W?",  "(0|[1-9]\\d*)", "a+?b*",      "(?:)",           "a|",    "[-a]\\-"};
  const std::string alphabet = "ab01 .\"-c\n";
  std::mt19937 rng(3);
  for (const std::string& pattern : patterns) {
    SCOPED_TRACE(pattern);
    auto guide = RegexGuide::Compile(pattern, NoVocab());
    ASSERT_TRUE(guide.ok()) << guide.status();
    const std::regex want(pattern, std::regex::ECMAScript);
    std::vector<std::string> texts = {""};
    for (size_t i = 0; i < texts.size() && texts[i].size() < 4; ++i) {
      for (char c : alphabet) texts.push_back(texts[i] + c);
    }
    for (int i = 0; i < 2000; ++i) {
      std::string t(rng() % 12, ' ');
      for (char& c : t) c = alphabet[rng() % alphabet.size()];
      texts.push_back(t);
    }
    for (const std::string& t : texts) {
      ASSERT_EQ(FullMatch(**guide, t), std::regex_match(t, want)) << "text \"" << t << "\"";
      if (!std::regex_match(t, want)) continue;
      for (size_t k = 0; k <= t.size(); ++k) {
        ASSERT_NE((*guide)->AdvanceBytes(RegexGuide::start(), t.substr(0, k)), RegexGuide::kDead);
      }
      if ((*guide)->Complete((*guide)->AdvanceBytes(RegexGuide::start(), t))) {
        for (char c : alphabet) EXPECT_FALSE(std::regex_match(t + c, want)) << t << c;
      }
    }
  }
}

TEST(RegexGuide, MatchesUtf8Characters) {
  auto any = RegexGuide::Compile("^.$", NoVocab());
  ASSERT_TRUE(any.ok());
  EXPECT_TRUE(FullMatch(**any, "é"));
  EXPECT_TRUE(FullMatch(**any, "€"));
  EXPECT_TRUE(FullMatch(**any, "😀"));
  EXPECT_FALSE(FullMatch(**any, "ée"));
  EXPECT_FALSE(FullMatch(**any, "\n"));
  EXPECT_FALSE(FullMatch(**any, "\xff"));
  auto literal = RegexGuide::Compile("é+\\u00e9|[^a]", NoVocab());
  ASSERT_TRUE(literal.ok());
  EXPECT_TRUE(FullMatch(**literal, "ééé"));
  EXPECT_TRUE(FullMatch(**literal, "ü"));  // a negated class admits non-ASCII characters
  EXPECT_FALSE(FullMatch(**literal, "a"));
  EXPECT_FALSE(FullMatch(**literal, "éa"));
}

TEST(RegexGuide, RefusesWhatItDoesNotSupportNamingThePlace) {
  for (const char* bad : {"(", "a)", "a**", "(?=a)", "(?i)a", "\\1", "[z-a]", "[é]", "*a", "a{2,1}",
                          "a{5000}", "[ab", "a\\", "\\q", "a^b", "x{", "a{2}{3}"}) {
    SCOPED_TRACE(bad);
    auto guide = RegexGuide::Compile(bad, NoVocab());
    ASSERT_FALSE(guide.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(guide.status()));
    EXPECT_NE(guide.status().message().find("guided regex"), std::string::npos) << guide.status();
  }
  EXPECT_FALSE(
      RegexGuide::Compile(std::string(100, '(') + "a" + std::string(100, ')'), NoVocab()).ok());
  auto huge = RegexGuide::Compile("(a|b)*a(a|b){16}", NoVocab());  // 2^17 DFA states
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("automaton states"), std::string::npos);
}

TEST(RegexGuide, ChoicePatternTakesEachChoiceLiterally) {
  auto guide =
      RegexGuide::Compile(RegexGuide::ChoicePattern({"a.b", "c+", "(x)", "yes"}), NoVocab());
  ASSERT_TRUE(guide.ok()) << guide.status();
  for (const char* t : {"a.b", "c+", "(x)", "yes"}) EXPECT_TRUE(FullMatch(**guide, t)) << t;
  for (const char* t : {"axb", "cc", "x", "ye", "yess", ""})
    EXPECT_FALSE(FullMatch(**guide, t)) << t;
}

// Token masks: a token is allowed while its bytes keep the text a prefix of a match; EOS once the
// text matches; tokens without bytes never. Masks from several threads at once agree.
TEST(RegexGuide, MasksTokensByTheirBytes) {
  auto vocab = std::make_shared<GuideVocab>();
  vocab->bytes = {"", "a", "b", "ab", "c", "", "ba", "abab"};
  vocab->eos = 5;
  auto guide = RegexGuide::Compile("(ab)+", vocab);
  ASSERT_TRUE(guide.ok()) << guide.status();
  const RegexGuide& g = **guide;
  auto allowed = [&](int state) {
    std::vector<float> logits(8, 1.0f);
    g.Mask(state, absl::MakeSpan(logits));
    std::vector<int> ids;
    for (int t = 0; t < 8; ++t) {
      if (logits[t] != -std::numeric_limits<float>::infinity()) ids.push_back(t);
    }
    return ids;
  };
  EXPECT_EQ(allowed(RegexGuide::start()), (std::vector<int>{1, 3, 7}));
  const int after_a = g.Advance(RegexGuide::start(), {1});
  EXPECT_EQ(allowed(after_a), (std::vector<int>{2, 6}));
  const int after_ab = g.Advance(RegexGuide::start(), {3});
  EXPECT_TRUE(g.Accepting(after_ab));
  EXPECT_FALSE(g.Complete(after_ab));
  EXPECT_EQ(allowed(after_ab), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g.Advance(RegexGuide::start(), {3, 5, 1, 2}), after_ab);  // EOS has no text
  EXPECT_EQ(g.Advance(RegexGuide::start(), {2}), RegexGuide::kDead);

  WorkerPool pool(4);
  std::vector<std::vector<int>> got(64);
  pool.ParallelFor(64, [&](int64_t i) { got[i] = allowed(i % 2 == 0 ? after_a : after_ab); });
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], allowed(i % 2 == 0 ? after_a : after_ab));

  auto done = RegexGuide::Compile("ab", vocab);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE((*done)->Complete((*done)->Advance(RegexGuide::start(), {1, 2})));
}

}  // namespace
}  // namespace mqa
