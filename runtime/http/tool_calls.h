// OpenAI's tool calls in /v1/chat/completions, as vLLM serves them without a model-specific
// parser: tool_choice names a function (the output is guided by its parameters' schema and is the
// call's arguments) or is "required" (the output is guided to a list of calls,
// `[{"name": ..., "parameters": {...}}, ...]`, and read back into tool_calls). What the request
// may say is parsed in api_types; this file reads the guided output.
//
// Thread safety: values; a ToolCallArrayScanner belongs to one thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mqa {

enum class ToolChoiceMode {
  kNone,      // no calls: the output is the message's content (tools still reach the template)
  kNamed,     // {"type": "function", "function": {"name": ...}}: one call of that function
  kRequired,  // "required": one or more calls of the tools given
};

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kNone;
  std::string name;  // kNamed: the function
};

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text
};

// "chatcmpl-tool-" and 32 random hex digits, vLLM's form.
std::string NewToolCallId();

// One element of the required form's list, {"name": string, "parameters": object}: its call with
// the parameters as compact JSON text (keys in the model's order). nullopt for anything else.
std::optional<ToolCall> ReadToolCallObject(absl::string_view text);

// The whole required-form output: nullopt when it is not a complete, non-empty list of calls
// (cut short by max_tokens).
std::optional<std::vector<ToolCall>> ReadToolCallList(absl::string_view text);

// The required form while it streams: fed the output so far, returns the calls whose objects have
// closed since the last Feed (each once, in order).
class ToolCallArrayScanner {
 public:
  std::vector<ToolCall> Feed(absl::string_view text);

 private:
  size_t scanned_ = 0;  // bytes of the text read
  int depth_ = 0;       // brackets and braces open
  bool in_string_ = false;
  bool escaped_ = false;     // in a string, after a backslash
  size_t object_start_ = 0;  // where the list element being read began
};

}  // namespace mqa
