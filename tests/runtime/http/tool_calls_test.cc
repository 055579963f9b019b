#include "runtime/http/tool_calls.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace mqa {
namespace {

TEST(ToolCallsTest, ReadsTheRequiredFormsList) {
  std::optional<std::vector<ToolCall>> calls = ReadToolCallList(
      R"([{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}},)"
      R"( {"name": "now", "parameters": {}}])");
  ASSERT_TRUE(calls.has_value());
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "get_weather");
  EXPECT_EQ((*calls)[0].arguments, R"({"city":"Paris","days":[1,2]})");
  EXPECT_EQ((*calls)[1].name, "now");
  EXPECT_EQ((*calls)[1].arguments, "{}");
  // The model's key order, not sorted.
  EXPECT_EQ(ReadToolCallList(R"([{"name": "f", "parameters": {"z": 1, "a": 2}}])")->at(0).arguments,
            R"({"z":1,"a":2})");
  for (const char* not_calls :
       {"", "[]", R"([{"name": "f", "parameters": {"a": 1})",  // cut short
        R"({"name": "f", "parameters": {}})",                  // not a list
        R"([{"name": 5, "parameters": {}}])", R"([{"name": "f", "parameters": [1]}])",
        R"([{"name": "f"}])", R"([{"name": "f", "parameters": {}}, 3])"}) {
    EXPECT_FALSE(ReadToolCallList(not_calls).has_value()) << not_calls;
  }
}

// Fed the text a few bytes at a time, the scanner gives each call once, when its object closes;
// braces, brackets and quotes inside strings do not count.
TEST(ToolCallsTest, ScannerGivesEachCallWhenItsObjectCloses) {
  const std::string text =
      R"([{"name": "a", "parameters": {"s": "}]{[\"", "n": {"x": [1, {"y": 2}]}}}, )"
      R"({"name": "b", "parameters": {"t": "\\"}}])";
  for (size_t step : {1, 2, 3, 7, 1000}) {
    ToolCallArrayScanner scanner;
    std::vector<ToolCall> calls;
    std::vector<size_t> seen_at;
    for (size_t end = 0; end < text.size();) {
      end = std::min(text.size(), end + step);
      for (ToolCall& call : scanner.Feed(text.substr(0, end))) {
        calls.push_back(call);
        seen_at.push_back(end);
      }
    }
    ASSERT_EQ(calls.size(), 2u) << "step " << step;
    EXPECT_EQ(calls[0].name, "a");
    EXPECT_EQ(calls[0].arguments, R"({"s":"}]{[\"","n":{"x":[1,{"y":2}]}})");
    EXPECT_EQ(calls[1].name, "b");
    EXPECT_EQ(calls[1].arguments, R"({"t":"\\"})");
    // The first call is given before the second object starts, once its closing brace arrives.
    const size_t first_close = text.find("}}}, ") + 3;
    if (step == 1) EXPECT_EQ(seen_at[0], first_close);
  }
}

// The Hermes parser of "auto": content before the first tag, each block a call (arguments as an
// object, JSON text or absent); anything unreadable gives no calls and the whole text as content.
TEST(ToolCallsTest, HermesBlocksReadAsCalls) {
  ToolAnswer plain = ReadHermesToolCalls("def f(): pass  # <tool not a call");
  EXPECT_EQ(plain.content, "def f(): pass  # <tool not a call");
  EXPECT_TRUE(plain.calls.empty());

  ToolAnswer two = ReadHermesToolCalls(
      "Let me look.\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\": "
      "\"</tool_call>\", \"n\": 2}}\n</tool_call>\n<tool_call>{\"name\": \"ls\"}</tool_call>\n");
  // (A closing tag inside a string ends the block there: the JSON then does not read.)
  EXPECT_TRUE(two.calls.empty());
  EXPECT_TRUE(absl::StartsWith(*two.content, "Let me look."));

  ToolAnswer calls = ReadHermesToolCalls(
      "Let me look.\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"z\": 1, \"a\": "
      "[\"x\"]}}\n</tool_call>\n<tool_call>{\"name\": \"ls\"}</tool_call>"
      "<tool_call>{\"name\": \"cat\", \"arguments\": \"{\\\"f\\\": 1}\"}</tool_call>\n");
  EXPECT_EQ(calls.content, "Let me look.\n");
  ASSERT_EQ(calls.calls.size(), 3u);
  EXPECT_EQ(calls.calls[0].name, "grep");
  EXPECT_EQ(calls.calls[0].arguments, R"({"z":1,"a":["x"]})");  // the model's key order
  EXPECT_EQ(calls.calls[1].name, "ls");
  EXPECT_EQ(calls.calls[1].arguments, "{}");
  EXPECT_EQ(calls.calls[2].arguments, R"({"f": 1})");

  ToolAnswer only = ReadHermesToolCalls(" \n<tool_call>{\"name\": \"ls\"}</tool_call>");
  EXPECT_FALSE(only.content.has_value());  // whitespace before the calls is no content
  ASSERT_EQ(only.calls.size(), 1u);

  for (const char* bad : {"x<tool_call>{\"name\": \"ls\"", "x<tool_call>{\"name\": 3}</tool_call>",
                          "x<tool_call>not json</tool_call>",
                          "x<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
                          "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{</tool_call>"}) {
    ToolAnswer answer = ReadHermesToolCalls(bad);
    EXPECT_TRUE(answer.calls.empty()) << bad;
    EXPECT_EQ(answer.content, bad);
  }
}

// Streamed in any pieces, the Hermes form gives the plain answer's content and calls: text is
// held back only while it could be the tag's start, and released at the end if it was not.
TEST(ToolCallsTest, HermesStreamerMatchesThePlainAnswer) {
  const std::string texts[] = {
      "Let me look.\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"p\": \"<\"}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"ls\"}</tool_call>",
      "no calls, but a < and <tool and <tool_cal at the end <tool_c",
      "<tool_call>{\"name\": \"ls\"}</tool_call>",
      " \n <tool_call>{\"name\": \"ls\"}</tool_call> between <tool_call>{\"name\": "
      "\"a\"}</tool_call> after",
      "  \n",
  };
  for (const std::string& text : texts) {
    const ToolAnswer plain = ReadHermesToolCalls(text);
    for (size_t step : {size_t{1}, size_t{2}, size_t{5}, text.size()}) {
      HermesToolCallStreamer streamer;
      std::string content;
      std::vector<ToolCall> calls;
      for (size_t end = 0; end < text.size();) {
        end = std::min(text.size(), end + step);
        HermesToolCallStreamer::Delta delta =
            streamer.Feed(absl::string_view(text).substr(0, end), end == text.size());
        content += delta.content;
        for (ToolCall& call : delta.calls) calls.push_back(call);
        // Nothing sent as content may be part of a tag.
        EXPECT_EQ(content.find("<tool_call>"), std::string::npos) << text;
      }
      EXPECT_EQ(calls.size(), plain.calls.size()) << text << " step " << step;
      for (size_t k = 0; k < calls.size() && k < plain.calls.size(); ++k) {
        EXPECT_EQ(calls[k].name, plain.calls[k].name);
        EXPECT_EQ(calls[k].arguments, plain.calls[k].arguments);
      }
      EXPECT_EQ(content, plain.content.value_or("")) << text << " step " << step;
      EXPECT_EQ(streamer.calls_sent(), static_cast<int>(calls.size()));
    }
  }
  // Cut short inside a block: the calls already sent stay, the rest comes as content.
  HermesToolCallStreamer cut;
  const std::string partial =
      "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\", \"argu";
  HermesToolCallStreamer::Delta delta = cut.Feed(partial, false);
  ASSERT_EQ(delta.calls.size(), 1u);
  EXPECT_EQ(delta.content, "");
  delta = cut.Feed(partial, true);
  EXPECT_TRUE(delta.calls.empty());
  EXPECT_EQ(delta.content, "<tool_call>{\"name\": \"b\", \"argu");
}

TEST(ToolCallsTest, IdsAreVllmsFormAndDiffer) {
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    std::string id = NewToolCallId();
    ASSERT_TRUE(absl::StartsWith(id, "chatcmpl-tool-")) << id;
    EXPECT_EQ(id.size(), 14u + 32u) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

}  // namespace
}  // namespace mqa
