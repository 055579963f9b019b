// One OpenAI Responses API call (POST /v1/responses) in flight: the CompletionJob of its
// rendered chat prompt (one sample), rendered as a Response object, and stored once finished
// (without an error) where the request asked for it.
//
//   plain:   {"id": "resp_...", "object": "response", "created_at", "status": "completed" |
//            "incomplete" ("incomplete_details": {"reason": "max_output_tokens"}), "model",
//            "output": [{"type": "message", "id": "msg_...", "role": "assistant", "status",
//            "content": [{"type": "output_text", "text", "annotations": []}]}], "usage":
//            {"input_tokens", "input_tokens_details": {"cached_tokens"}, "output_tokens",
//            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens"}, and the request's
//            instructions, max_output_tokens, temperature, top_p, text, metadata,
//            previous_response_id, store}
//   stream:  `event: <type>` / `data: {..., "sequence_number"}` pairs: response.created,
//            response.in_progress, response.output_item.added, response.content_part.added,
//            response.output_text.delta (each new piece of text), response.output_text.done,
//            response.content_part.done, response.output_item.done, then response.completed or
//            response.incomplete (the whole response); on an error, an `error` event and
//            response.failed. No [DONE] marker (the Responses API has none).
//   tools:   with a tool choice the text is read as content and calls at the end
//            (ReadToolAnswer): a message item when there is content, then a function_call item
//            {"id": "fc_...", "call_id", "name", "arguments", "status"} a call. Streamed, items go
//            out as the sample writes them: a named function's arguments as
//            function_call_arguments.delta pieces; "required" each function_call item whole as its
//            list element closes; "auto" (Hermes) the content as output_text.delta pieces of a
//            message item and each call's item as its <tool_call> block closes. A "required"
//            answer that never became a list goes out as one message item at the end.
//
// Threads: as CompletionJob (the HTTP thread serving the call).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/http/api_types.h"
#include "runtime/http/completion_job.h"
#include "runtime/http/response_store.h"
#include "runtime/http/tool_calls.h"

namespace mqa {

struct ResponsesJobOptions {
  std::string id;  // "resp_..."; its message item is "msg_..." with the same suffix
  std::optional<std::string> instructions;
  std::optional<int> max_output_tokens;
  float temperature = 1.0f;
  float top_p = 1.0f;
  nlohmann::json text_format = {{"type", "text"}};
  nlohmann::json metadata;
  std::optional<std::string> previous_response_id;
  // Non-null: the finished response is kept there under `id` (with `input_items` and the
  // conversation followed by the answer), before the client gets its end.
  std::shared_ptr<ResponseStore> store;
  nlohmann::ordered_json conversation;  // ResponsesRequest::conversation
  nlohmann::json input_items;           // ResponsesRequest::input_items
  // With tools: what the text amounts to (ReadToolAnswer) and the request's tools and
  // tool_choice as given, echoed.
  ToolChoice tool_choice;
  nlohmann::json tools = nlohmann::json::array();
  nlohmann::json tool_choice_given = "auto";
  bool parallel_tool_calls = true;
};

class ResponsesJob : public CompletionJobView {
 public:
  ResponsesJob(std::shared_ptr<CompletionJob> inner, ResponsesJobOptions options);

  bool Drain(absl::Duration timeout, std::string* chunks) override;
  std::string OpeningChunks() override;
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;

 private:
  // The Response object as it stands: "in_progress" until the sample finished.
  nlohmann::json Response(bool failed = false) const;
  // The finished answer's output items: a message (its content, when there is any) and a
  // function_call item a call.
  nlohmann::json OutputItems() const;
  nlohmann::json Message(const std::string& text) const;
  static nlohmann::json TextPart(const std::string& text);
  // A message item's text complete: output_text.done and content_part.done.
  std::string TextDoneEvents(const nlohmann::json& item_id, int index,
                             const std::string& text) const;
  // The events that bring `item` (index `index`) out whole: added, its content, done.
  std::string ItemEvents(int index, const nlohmann::json& item) const;
  bool streams_text() const { return options_.tool_choice.mode == ToolChoiceMode::kNone; }
  std::string Event(const std::string& type, nlohmann::json data) const;
  // The stream's items, as far as the text goes (finished: all of it), appended to `chunks`
  // (mutable state: ClosingChunks, const, sends the last of them).
  void StreamItems(bool finished, std::string* chunks) const;
  // The message item: opened (none open), text added (opening it), closed (done as Message()
  // has it once the sample finished, "completed" before: a call follows it).
  void OpenText(std::string* chunks) const;
  void AddText(const std::string& piece, std::string* chunks) const;
  void CloseText(std::string* chunks) const;
  nlohmann::json CallItem(size_t k, const ToolCall& call) const;

  // Keeps the finished response in options_.store (once).
  void Store();

  const ResponsesJobOptions options_;
  const std::string item_id_;  // msg_<the id's suffix>
  bool stored_ = false;
  mutable int sequence_ = 0;  // the next event's sequence_number
  // The stream: the next item's index, the open message item's text so far (nullopt: none open),
  // calls sent, a named call's arguments sent (nullopt: its item not yet added).
  mutable int next_item_ = 0;
  mutable std::optional<std::string> open_text_;
  mutable size_t calls_sent_ = 0;
  mutable std::optional<size_t> named_sent_;
  mutable HermesToolCallStreamer hermes_;
  mutable ToolCallArrayScanner scanner_;
};

}  // namespace mqa
