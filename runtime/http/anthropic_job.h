// One Anthropic Messages API call (POST /v1/messages) in flight: the CompletionJob of its
// rendered chat prompt (one sample), rendered in Anthropic's shapes.
//
//   plain:   {"id": "msg_...", "type": "message", "role": "assistant", "model", "content":
//            [{"type": "text", "text"}], "stop_reason": "end_turn" | "max_tokens" |
//            "stop_sequence", "stop_sequence", "usage": {"input_tokens", "output_tokens",
//            "cache_read_input_tokens", "cache_creation_input_tokens"}}
//   stream:  `event: <type>` / `data: {...}` pairs: message_start, content_block_start, ping,
//            content_block_delta (text_delta, each new piece of text), content_block_stop,
//            message_delta (stop_reason, output_tokens), message_stop; on an error, an `error`
//            event. Errors in Anthropic's body shape (AnthropicErrorBody).
//   tools:   with a tool choice the text is read as content and calls at the end (ReadToolAnswer):
//            a text block when there is content, a tool_use block a call, stop_reason "tool_use".
//            Streamed, blocks go out as the sample writes them: a named tool's input as
//            input_json_delta pieces of its arguments' text; "any" (the required form) each
//            tool_use block whole as its list element closes; "auto" (Hermes) the content as
//            text_delta pieces and each call's block as its <tool_call> block closes
//            (HermesToolCallStreamer, as chat streams them). A "any" answer that never became a
//            list of calls goes out as one text block at the end.
//
// Threads: as CompletionJob (the HTTP thread serving the call).
#pragma once

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/http/completion_job.h"
#include "runtime/http/tool_calls.h"

namespace mqa {

class AnthropicJob : public CompletionJobView {
 public:
  // `tool_choice`: what the text amounts to with tools (ReadToolAnswer).
  explicit AnthropicJob(std::shared_ptr<CompletionJob> inner, ToolChoice tool_choice = {});

  bool Drain(absl::Duration timeout, std::string* chunks) override;
  std::string OpeningChunks() override;
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;
  std::string ErrorBody(const absl::Status& status) const override;

 private:
  // The message as it stands (content empty and no stop reason until it finished, with
  // `in_progress`).
  nlohmann::json MessageObject(bool in_progress) const;
  // {"stop_reason", "stop_sequence"} of the finished sample.
  nlohmann::json StopFields() const;
  nlohmann::json Usage() const;
  // The finished answer's content blocks: [{"type": "text"}] without tools; with them a text
  // block when there is content and a {"type": "tool_use", "id", "name", "input"} block a call.
  nlohmann::json ContentBlocks() const;
  bool streams_text() const { return tool_choice_.mode == ToolChoiceMode::kNone; }
  // The stream's blocks, as far as the text goes (finished: all of it), appended to `chunks`.
  // Mutable state: ClosingChunks (const) sends the last of them.
  void StreamBlocks(bool finished, std::string* chunks) const;
  // A block's events: a text block opened (none open), text (opening its block, or continuing an
  // open one), a block closed, a tool_use block opened / its input continued / whole.
  void OpenText(std::string* chunks) const;
  void AddText(const std::string& piece, std::string* chunks) const;
  void CloseBlock(std::string* chunks) const;
  void OpenToolUse(const std::string& name, std::string* chunks) const;  // closes an open one
  void InputDelta(const std::string& partial_json, std::string* chunks) const;
  void WholeToolUse(const ToolCall& call, std::string* chunks) const;
  std::string ToolUseId(size_t k) const;

  const std::string id_;  // msg_<n>
  const ToolChoice tool_choice_;
  // The stream: the next block's index, whether a block is open, calls sent, bytes of the text
  // sent (as text, or as a named tool's input).
  mutable int next_block_ = 0;
  mutable bool block_open_ = false;
  mutable size_t calls_sent_ = 0;
  mutable size_t sent_bytes_ = 0;
  mutable HermesToolCallStreamer hermes_;
  mutable ToolCallArrayScanner scanner_;
};

}  // namespace mqa
