#include "model/generation_config.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace mqa {
namespace {

using json = nlohmann::json;

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(GenerationConfig, SamplingDefaultsAndEosIds) {
  absl::StatusOr<GenerationDefaults> d = ReadGenerationConfig(
      Write("gc_full.json", R"({"bos_token_id": 0, "eos_token_id": [0, 49155], "do_sample": true,
        "temperature": 0.2, "top_p": 0.95, "top_k": 0, "max_new_tokens": 256,
        "repetition_penalty": 1.1, "transformers_version": "4.40.0"})"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->sampling, json({{"temperature", 0.2},
                               {"top_p", 0.95},
                               {"top_k", -1},  // transformers' 0: no top-k
                               {"max_tokens", 256},
                               {"repetition_penalty", 1.1}}));
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{0, 49155}));

  // StarCoder's own: ids only.
  d = ReadGenerationConfig(Write(
      "gc_ids.json", R"({"_from_model_config": true, "bos_token_id": 0, "eos_token_id": 0})"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->sampling.empty());
  EXPECT_EQ(d->eos_token_ids, std::vector<int32_t>{0});
  // No file: nothing.
  d = ReadGenerationConfig(::testing::TempDir() + "no_such_generation_config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->sampling.empty() && d->eos_token_ids.empty());
}

TEST(GenerationConfig, BadFieldsNameTheFileAndTheField) {
  const std::pair<const char*, const char*> bad[] = {
      {"{not json", "not a JSON object"},
      {"[1]", "not a JSON object"},
      {R"({"temperature": "hot"})", "\"temperature\""},
      {R"({"temperature": -1})", "\"temperature\""},
      {R"({"top_p": 0})", "\"top_p\""},
      {R"({"top_p": 1.5})", "\"top_p\""},
      {R"({"top_k": 2.5})", "\"top_k\""},
      {R"({"min_p": 2})", "\"min_p\""},
      {R"({"repetition_penalty": 0})", "\"repetition_penalty\""},
      {R"({"max_new_tokens": 0})", "\"max_new_tokens\""},
      {R"({"eos_token_id": "x"})", "\"eos_token_id\""},
      {R"({"eos_token_id": [0, -2]})", "\"eos_token_id\""},
  };
  for (const auto& [text, field] : bad) {
    const std::string path = Write("gc_bad.json", text);
    absl::StatusOr<GenerationDefaults> d = ReadGenerationConfig(path);
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(d.status().message(), path)) << d.status();
    EXPECT_TRUE(absl::StrContains(d.status().message(), field)) << d.status();
  }
}

}  // namespace
}  // namespace mqa
