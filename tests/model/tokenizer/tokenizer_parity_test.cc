// Parity with Hugging Face `tokenizers`: tests/fixtures/tokenizer/{tokenizer.json,cases.jsonl}
// were written by HF (tests/fixtures/make_fixtures.py); every case must match exactly.
// MQA_TOKENIZER_FIXTURES overrides the folder (for trying other HF-made fixtures).
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "runtime/detokenizer.h"

namespace mqa {
namespace {

std::string FixtureDir() {
  if (const char* dir = std::getenv("MQA_TOKENIZER_FIXTURES")) return dir;
  const char* src = std::getenv("MQA_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/tokenizer";
}

struct Case {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
  std::string decoded;
  std::optional<std::string> decoded_skip_special;
  int line = 0;
};

class ParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = FixtureDir();
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    // A missing fixture is a failure, not a skip: the files are committed.
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_.emplace(*std::move(tok));
    std::ifstream in(dir + "/cases.jsonl");
    ASSERT_TRUE(in) << "cannot open " << dir << "/cases.jsonl";
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line);
      Case c;
      c.line = n;
      if (j.contains("text")) c.text = j["text"].get<std::string>();
      c.ids = j["ids"].get<std::vector<int32_t>>();
      c.decoded = j["decoded"].get<std::string>();
      if (j.contains("decoded_skip_special")) {
        c.decoded_skip_special = j["decoded_skip_special"].get<std::string>();
      }
      cases_.push_back(std::move(c));
    }
    ASSERT_GT(cases_.size(), 10u);
  }

  std::optional<Tokenizer> tokenizer_;
  std::vector<Case> cases_;
};

TEST_F(ParityTest, EncodeMatchesHf) {
  int checked = 0;
  for (const Case& c : cases_) {
    if (!c.text) continue;
    EXPECT_EQ(tokenizer_->Encode(*c.text), c.ids) << "line " << c.line << " text: " << *c.text;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_F(ParityTest, DecodeMatchesHf) {
  for (const Case& c : cases_) {
    EXPECT_EQ(tokenizer_->Decode(c.ids), c.decoded) << "line " << c.line;
    if (c.decoded_skip_special) {
      EXPECT_EQ(tokenizer_->Decode(c.ids, /*skip_special=*/true), *c.decoded_skip_special)
          << "line " << c.line;
    }
  }
}

TEST_F(ParityTest, StreamingConcatenationEqualsDecode) {
  for (const Case& c : cases_) {
    for (bool skip : {false, true}) {
      StreamingDetokenizer detok(*tokenizer_, {.skip_special_tokens = skip});
      std::string streamed;
      for (int32_t id : c.ids) {
        const StreamingDetokenizer::Delta d = detok.Push(id);
        EXPECT_FALSE(d.stopped);
        streamed += d.text;
      }
      streamed += detok.Flush();
      EXPECT_EQ(streamed, tokenizer_->Decode(c.ids, skip)) << "line " << c.line;
      if (!skip) {
        EXPECT_EQ(streamed, c.decoded) << "line " << c.line;
      }
    }
  }
}

}  // namespace
}  // namespace mqa
