// OpenAI's tool calls in /v1/chat/completions, as vLLM serves them: tool_choice names a function
// (the output is guided by its parameters' schema and is the call's arguments) or is "required"
// (the output is guided to a list of calls, `[{"name": ..., "parameters": {...}}, ...]`, and read
// back into tool_calls); or "auto" (the default when tools are given), where the model decides
// and a parser of its own format reads the calls out of free text — here the Hermes form (vLLM's
// --tool-call-parser hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
// after any content), which Hermes, Qwen and many fine-tunes' chat templates teach. What the
// request may say is parsed in api_types; this file reads the output.
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
  kAuto,      // "auto": content, calls or both, read by the server's tool-call parser
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

// The tool-call parsers of "auto" (vLLM's --tool-call-parser names).
inline constexpr const char* kToolCallParsers[] = {"hermes"};

// A finished chat answer: its content (null: none) and its calls.
struct ToolAnswer {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
// An "auto" answer read by the Hermes parser: the text before the first `<tool_call>` is the
// content (null when it is only whitespace and calls follow), each block's JSON object
// {"name": string, "arguments": object or JSON text} a call; text between and after the blocks is
// dropped. When a block does not read (bad JSON, unclosed: cut by max_tokens), there are no calls
// and the whole text is the content, as vLLM answers.
ToolAnswer ReadHermesToolCalls(absl::string_view text);
// What a finished answer amounts to under `choice`: kNone the text as content; kNamed one call of
// the named function whose arguments are the text; kRequired the text's list of calls (the text
// as content when it is not a complete list); kAuto ReadHermesToolCalls.
ToolAnswer ReadToolAnswer(const ToolChoice& choice, absl::string_view text);

// The Hermes form while it streams. Fed the whole text so far, returns what may be sent now:
// content up to the first `<tool_call>` (holding back a tail that could be the tag's start, and
// leading whitespace) and each call as its block closes (a block that does not read goes out as
// content, tag and all). At the end (`finished`), held-back text is released as content, and an
// unfinished block's text is sent as content too (the calls already sent stay). Where
// ReadHermesToolCalls finds calls, the stream sends the same calls and content.
class HermesToolCallStreamer {
 public:
  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Delta Feed(absl::string_view text, bool finished);
  int calls_sent() const { return calls_sent_; }

 private:
  size_t sent_ = 0;        // bytes of the text sent (as content) or read (as calls)
  bool in_calls_ = false;  // past the first <tool_call>
  int calls_sent_ = 0;
};

}  // namespace mqa
