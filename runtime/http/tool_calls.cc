#include "runtime/http/tool_calls.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mqa {
namespace {

using ordered_json = nlohmann::ordered_json;

std::optional<ToolCall> CallFrom(const ordered_json& item) {
  if (!item.is_object()) return std::nullopt;
  auto name = item.find("name");
  auto parameters = item.find("parameters");
  if (name == item.end() || !name->is_string() || parameters == item.end() ||
      !parameters->is_object()) {
    return std::nullopt;
  }
  return ToolCall{
      .name = name->get<std::string>(),
      .arguments = parameters->dump(-1, ' ', false, ordered_json::error_handler_t::replace)};
}

constexpr absl::string_view kCallOpen = "<tool_call>";
constexpr absl::string_view kCallClose = "</tool_call>";

// A Hermes block's JSON: {"name": string, "arguments": object (or its JSON text)}.
std::optional<ToolCall> HermesCall(absl::string_view json_text) {
  const ordered_json item = ordered_json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (item.is_discarded() || !item.is_object()) return std::nullopt;
  auto name = item.find("name");
  auto arguments = item.find("arguments");
  if (name == item.end() || !name->is_string()) return std::nullopt;
  ToolCall call{.name = name->get<std::string>(), .arguments = "{}"};
  if (arguments == item.end() || arguments->is_null()) return call;
  if (arguments->is_string()) {
    call.arguments = arguments->get<std::string>();
  } else if (arguments->is_object()) {
    call.arguments = arguments->dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  } else {
    return std::nullopt;
  }
  return call;
}

// The length of the longest tail of `text` that `tag` starts with (and is shorter than it).
size_t PartialTagTail(absl::string_view text, absl::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (absl::StartsWith(tag, text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

ToolAnswer ReadHermesToolCalls(absl::string_view text) {
  const size_t first = text.find(kCallOpen);
  if (first == absl::string_view::npos) return {.content = std::string(text)};
  ToolAnswer answer;
  for (size_t at = first; at != absl::string_view::npos; at = text.find(kCallOpen, at)) {
    const size_t body = at + kCallOpen.size();
    const size_t close = text.find(kCallClose, body);
    if (close == absl::string_view::npos) return {.content = std::string(text)};
    std::optional<ToolCall> call = HermesCall(text.substr(body, close - body));
    if (!call.has_value()) return {.content = std::string(text)};
    answer.calls.push_back(*std::move(call));
    at = close + kCallClose.size();
  }
  const absl::string_view before = text.substr(0, first);
  if (!absl::StripAsciiWhitespace(before).empty()) answer.content = std::string(before);
  return answer;
}

ToolAnswer ReadToolAnswer(const ToolChoice& choice, absl::string_view text) {
  switch (choice.mode) {
    case ToolChoiceMode::kNone:
      break;
    case ToolChoiceMode::kNamed:
      return {.calls = {{.name = choice.name, .arguments = std::string(text)}}};
    case ToolChoiceMode::kRequired:
      if (std::optional<std::vector<ToolCall>> calls = ReadToolCallList(text); calls.has_value()) {
        return {.calls = *std::move(calls)};
      }
      break;
    case ToolChoiceMode::kAuto:
      return ReadHermesToolCalls(text);
  }
  return {.content = std::string(text)};
}

HermesToolCallStreamer::Delta HermesToolCallStreamer::Feed(absl::string_view text, bool finished) {
  Delta delta;
  if (!in_calls_) {
    // (No tag starts before sent_: a tail that could begin one is never sent as content.)
    const size_t open = text.find(kCallOpen, sent_);
    size_t end = text.size();
    if (open != absl::string_view::npos) {
      end = open;
    } else if (!finished) {
      end -= PartialTagTail(text, kCallOpen);
    }
    // Whitespace alone before the calls is no content (ReadHermesToolCalls'): held until
    // something else comes, dropped when a tag does.
    const bool blank = sent_ == 0 && absl::StripAsciiWhitespace(text.substr(0, end)).empty();
    if (blank && open != absl::string_view::npos) sent_ = open;
    if (end > sent_ && (!blank || finished)) {
      delta.content = std::string(text.substr(sent_, end - sent_));
      sent_ = end;
    }
    if (open == absl::string_view::npos) return delta;
    in_calls_ = true;
  }
  // Calls: each closed block after sent_ (whitespace between blocks is dropped).
  while (true) {
    const size_t open = text.find(kCallOpen, sent_);
    if (open == absl::string_view::npos) break;
    const size_t body = open + kCallOpen.size();
    const size_t close = text.find(kCallClose, body);
    if (close == absl::string_view::npos) break;
    std::optional<ToolCall> call = HermesCall(text.substr(body, close - body));
    if (call.has_value()) {
      delta.calls.push_back(*std::move(call));
      ++calls_sent_;
    } else {
      delta.content += std::string(text.substr(open, close + kCallClose.size() - open));
    }
    sent_ = close + kCallClose.size();
  }
  // At the end, a block left open (cut short) is sent as content; other text after the calls is
  // dropped, as ReadHermesToolCalls drops it.
  if (finished && sent_ < text.size()) {
    const size_t open = text.find(kCallOpen, sent_);
    if (open != absl::string_view::npos) delta.content += std::string(text.substr(open));
    sent_ = text.size();
  }
  return delta;
}

std::string NewToolCallId() {
  static thread_local absl::BitGen gen;
  std::string id = "chatcmpl-tool-";
  for (int half = 0; half < 2; ++half) {
    absl::StrAppend(&id, absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
  }
  return id;
}

std::optional<ToolCall> ReadToolCallObject(absl::string_view text) {
  const ordered_json item = ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (item.is_discarded()) return std::nullopt;
  return CallFrom(item);
}

std::optional<std::vector<ToolCall>> ReadToolCallList(absl::string_view text) {
  const ordered_json list = ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (list.is_discarded() || !list.is_array() || list.empty()) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const ordered_json& item : list) {
    std::optional<ToolCall> call = CallFrom(item);
    if (!call.has_value()) return std::nullopt;
    calls.push_back(*std::move(call));
  }
  return calls;
}

std::vector<ToolCall> ToolCallArrayScanner::Feed(absl::string_view text) {
  std::vector<ToolCall> closed;
  for (; scanned_ < text.size(); ++scanned_) {
    const char c = text[scanned_];
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '[' || c == '{') {
      if (depth_ == 1) object_start_ = scanned_;
      ++depth_;
    } else if (c == ']' || c == '}') {
      --depth_;
      if (depth_ == 1 && c == '}') {
        std::optional<ToolCall> call =
            ReadToolCallObject(text.substr(object_start_, scanned_ + 1 - object_start_));
        if (call.has_value()) closed.push_back(*std::move(call));
      }
    }
  }
  return closed;
}

}  // namespace mqa
