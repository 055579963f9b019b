#include "runtime/http/tool_calls.h"

#include <cstdint>
#include <utility>

#include "absl/random/random.h"
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

}  // namespace

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
