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
