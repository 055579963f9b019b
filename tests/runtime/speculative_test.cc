#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mqa {
namespace {

TEST(ProposeNgramDraft, TheTokensAfterTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  const SpeculativeConfig config{
      .num_speculative_tokens = 5, .prompt_lookup_max = 3, .prompt_lookup_min = 1};
  // "7 8 9" occurs at 0 and 5; the suffix "7 8 9"'s latest earlier occurrence is at 5.
  const std::vector<int32_t> tokens = {7, 8, 9, 1, 2, 7, 8, 9, 3, 4, 5, 7, 8, 9};
  EXPECT_EQ(ProposeNgramDraft(tokens, config, 5), std::vector<int32_t>({3, 4, 5, 7, 8}));
  EXPECT_EQ(ProposeNgramDraft(tokens, config, 2), std::vector<int32_t>({3, 4}));
  EXPECT_TRUE(ProposeNgramDraft(tokens, config, 0).empty());
  // The continuation may run into the suffix itself, and stops at the end of the text.
  const std::vector<int32_t> cycle = {1, 2, 1, 2, 1};
  EXPECT_EQ(ProposeNgramDraft(cycle, config, 5), std::vector<int32_t>({2, 1}));
  // Shorter n-grams when the longer ones do not repeat; nothing when none of them does.
  const std::vector<int32_t> once = {5, 6, 1, 2, 3, 6};
  EXPECT_EQ(ProposeNgramDraft(once, config, 3), std::vector<int32_t>({1, 2, 3}));
  const SpeculativeConfig two{
      .num_speculative_tokens = 5, .prompt_lookup_max = 3, .prompt_lookup_min = 2};
  EXPECT_TRUE(ProposeNgramDraft(once, two, 3).empty());
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{4}, config, 3).empty());
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{1, 2, 3, 4}, config, 3).empty());
}

TEST(ParseSpeculativeConfig, VllmsNgramFormAndClearErrors) {
  absl::StatusOr<SpeculativeConfig> off = ParseSpeculativeConfig("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  absl::StatusOr<SpeculativeConfig> on = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
          "prompt_lookup_min": 2})");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->num_speculative_tokens, 5);
  EXPECT_EQ(on->prompt_lookup_max, 4);
  EXPECT_EQ(on->prompt_lookup_min, 2);
  absl::StatusOr<SpeculativeConfig> min_only =
      ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 3,
                                 "prompt_lookup_min": 6})");
  ASSERT_TRUE(min_only.ok()) << min_only.status();
  EXPECT_EQ(min_only->prompt_lookup_max, 6);
  const std::pair<const char*, const char*> bad[] = {
      {"{", "JSON object"},
      {R"({"num_speculative_tokens": 5})", "method"},
      {R"({"method": "eagle", "num_speculative_tokens": 5})", "method"},
      {R"({"method": "ngram"})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 16})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": "5"})", "num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 5, "model": "x"})", "model"},
      {R"({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 2,
           "prompt_lookup_min": 3})",
       "prompt_lookup_min"},
  };
  for (const auto& [text, field] : bad) {
    absl::StatusOr<SpeculativeConfig> got = ParseSpeculativeConfig(text);
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(field), std::string::npos) << got.status();
  }
}

}  // namespace
}  // namespace mqa
