// StreamingDetokenizer (runtime/detokenizer.h) on the committed HF fixture tokenizer: every
// delta is complete UTF-8, the pieces add up to Decode, stop strings are found across token
// boundaries and the result does not depend on how the text was tokenized.
#include "runtime/detokenizer.h"

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer/unicode.h"

namespace mqa {
namespace {

Tokenizer LoadFixture() {
  const char* dir = std::getenv("MQA_TOKENIZER_FIXTURES");
  const char* src = std::getenv("MQA_SOURCE_DIR");
  const std::string path = dir ? std::string(dir) + "/tokenizer.json"
                               : std::string(src ? src : ".") +
                                     "/tests/fixtures/tokenizer/tokenizer.json";
  auto t = Tokenizer::FromFile(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

struct Streamed {
  std::string text;
  bool stopped = false;
  int stop_index = -1;
};

Streamed Stream(const Tokenizer& t, const std::vector<int32_t>& ids,
                StreamingDetokenizerOptions options) {
  StreamingDetokenizer d(t, std::move(options));
  Streamed out;
  for (int32_t id : ids) {
    const StreamingDetokenizer::Delta delta = d.Push(id);
    EXPECT_TRUE(tok::IsValidUtf8(delta.text));
    out.text += delta.text;
    if (delta.stopped) {
      out.stopped = true;
      out.stop_index = delta.stop_index;
      EXPECT_TRUE(d.Push(id).stopped);
      EXPECT_EQ(d.Push(id).text, "");
      EXPECT_EQ(d.Flush(), "");
      return out;
    }
  }
  out.text += d.Flush();
  return out;
}

// The expected result, computed on the whole text: the occurrence that ends first wins.
Streamed Expected(const std::string& text, const std::vector<std::string>& stops, bool include) {
  size_t best_end = std::string::npos, best_begin = 0;
  int best = -1;
  for (size_t s = 0; s < stops.size(); ++s) {
    if (stops[s].empty()) continue;
    const size_t at = text.find(stops[s]);
    if (at == std::string::npos) continue;
    const size_t end = at + stops[s].size();
    if (end < best_end || (end == best_end && at < best_begin)) {
      best_end = end;
      best_begin = at;
      best = static_cast<int>(s);
    }
  }
  if (best < 0) return {text, false, -1};
  return {text.substr(0, include ? best_end : best_begin), true, best};
}

TEST(StreamingDetokenizerTest, MultiByteCharactersSplitAcrossTokensWaitUntilComplete) {
  const Tokenizer t = LoadFixture();
  // Emoji and CJK are split into byte tokens by this small vocab: a delta may not cut them.
  const std::string text = "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and \xE6\x9D\xB1\xE4\xBA\xAC!";
  const std::vector<int32_t> ids = t.Encode(text);
  StreamingDetokenizer d(t, {});
  std::string all;
  int empty_deltas = 0;
  for (int32_t id : ids) {
    const std::string piece = d.Next(id);
    EXPECT_TRUE(tok::IsValidUtf8(piece));
    empty_deltas += piece.empty();
    all += piece;
  }
  all += d.Flush();
  EXPECT_EQ(all, text);
  EXPECT_GT(empty_deltas, 0);  // some tokens ended mid-character
}

TEST(StreamingDetokenizerTest, RandomIdsAddUpToDecode) {
  const Tokenizer t = LoadFixture();
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(t.vocab_size()) - 1);
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> ids(std::uniform_int_distribution<int>(0, 30)(rng));
    for (int32_t& x : ids) x = id(rng);
    for (bool skip : {false, true}) {
      EXPECT_EQ(Stream(t, ids, {.skip_special_tokens = skip}).text, t.Decode(ids, skip));
    }
  }
}

TEST(StreamingDetokenizerTest, StopStringsAcrossTokenBoundaries) {
  const Tokenizer t = LoadFixture();
  const std::string text =
      "def main():\n    print('hello')\n    return 0\n\n\nclass Foo:\n    pass\n# end \xE6\x9D\xB1";
  struct Case {
    std::vector<std::string> stops;
  };
  const std::vector<Case> cases = {
      {{"\n\n"}},
      {{"return"}},
      {{"ello')\n  "}},                // starts and ends inside tokens
      {{"class", "\n\n\n"}},            // the one ending first wins
      {{"nothere", "\xE6\x9D\xB1"}},    // a multi-byte stop split over byte tokens
      {{"nothere"}},                    // never hit: everything, including held-back text
      {{"# end \xE6\x9D\xB1!"}},        // a prefix that never completes is released by Flush
      {{"", "pass"}},                   // empty stops are ignored
  };
  // Two tokenizations of the same text: as a whole, and character by character.
  const std::vector<int32_t> whole = t.Encode(text);
  std::vector<int32_t> by_char;
  for (size_t i = 0; i < text.size();) {
    const size_t len = tok::DecodeUtf8(text, i).len;
    for (int32_t id : t.Encode(text.substr(i, len))) by_char.push_back(id);
    i += len;
  }
  ASSERT_NE(whole.size(), by_char.size());
  for (const Case& c : cases) {
    for (bool include : {false, true}) {
      const Streamed want = Expected(text, c.stops, include);
      for (const auto* ids : std::vector<const std::vector<int32_t>*>{&whole, &by_char}) {
        const Streamed got = Stream(t, *ids, {.stop_strings = c.stops, .include_stop_string = include});
        EXPECT_EQ(got.text, want.text) << c.stops.back() << " include=" << include;
        EXPECT_EQ(got.stopped, want.stopped) << c.stops.back();
        EXPECT_EQ(got.stop_index, want.stop_index) << c.stops.back();
      }
    }
  }
}

TEST(StreamingDetokenizerTest, RandomStopStringsMatchTheWholeTextAnswer) {
  const Tokenizer t = LoadFixture();
  std::mt19937 rng(5);
  const std::string alphabet = "ab \n\t(x)";
  for (int i = 0; i < 300; ++i) {
    std::string text(std::uniform_int_distribution<int>(0, 60)(rng), ' ');
    for (char& c : text) c = alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops(std::uniform_int_distribution<int>(1, 3)(rng));
    for (std::string& s : stops) {
      s.resize(std::uniform_int_distribution<int>(1, 4)(rng));
      for (char& c : s) c = alphabet[rng() % alphabet.size()];
    }
    const bool include = rng() % 2;
    const Streamed want = Expected(text, stops, include);
    const Streamed got = Stream(t, t.Encode(text), {.stop_strings = stops, .include_stop_string = include});
    ASSERT_EQ(got.text, want.text) << "text [" << text << "]";
    ASSERT_EQ(got.stopped, want.stopped);
  }
}

}  // namespace
}  // namespace mqa
