// One /v1/chat/completions call in flight: the CompletionJob of its rendered prompt (n choices),
// rendered in OpenAI's chat shapes.
//
//   plain:   {"object": "chat.completion", "choices": [{"index", "message": {"role": "assistant",
//            "content"}, "finish_reason", "stop_reason", "logprobs": null}], "usage"}
//   stream:  "chat.completion.chunk" events: each choice's first delta {"role": "assistant",
//            "content": "" (or the echoed text)}, then {"content": new text}, then an empty delta
//            with its finish_reason; the usage chunk when asked for; `data: [DONE]`.
//
// With a tool choice (runtime/http/tool_calls.h) the text is the call instead of the content:
//   named:    message {"content": null, "tool_calls": [{"id", "type": "function", "function":
//             {"name", "arguments": the text}}]}; streamed, the first delta names the call and
//             every delta after it carries the arguments' new text.
//   required: the text's list of calls as tool_calls, finish_reason "tool_calls" (the text as
//             content, no calls, when max_tokens cut it); streamed, each call in one delta as soon
//             as its object closes.
//   auto:     the Hermes parser's content and calls (ReadHermesToolCalls; finish_reason
//             "tool_calls" when there are calls); streamed through HermesToolCallStreamer.
//
// Threads: as CompletionJob (the HTTP thread serving the call).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "runtime/http/completion_job.h"
#include "runtime/http/http_job.h"
#include "runtime/http/tool_calls.h"

namespace mqa {

class ChatJob : public CompletionJobView {
 public:
  // The chunks' id, model, created and include_usage are `inner`'s; logprobs: the choices carry
  // OpenAI's chat logprobs ({"content": [...]}); echo: text each choice's content starts with (in
  // the stream, the opening delta's content), vLLM's chat `echo`.
  ChatJob(std::shared_ptr<CompletionJob> inner, bool logprobs, std::string echo = "",
          ToolChoice tool_choice = {});

  bool Drain(absl::Duration timeout, std::string* chunks) override;
  std::string OpeningChunks() override;
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;

 private:
  nlohmann::json ChunkBase() const;
  // {"token", "logprob", "bytes", "top_logprobs": [...]} for tokens [from, to) of choice i.
  nlohmann::json LogprobsContent(int i, size_t from, size_t to) const;
  std::string ChoiceChunk(int index, nlohmann::json delta, const nlohmann::json& finish,
                          nlohmann::json logprobs = nullptr) const;
  // Choice i's finish_reason: "tool_calls" for a finished required-form list of calls.
  nlohmann::json FinishReasonOf(int i) const;
  // Choice i's new text as a delta: content, or the tool calls it completes (auto: what the
  // parser releases of the whole text; `finished`: the rest).
  nlohmann::json TextDelta(int i, const std::string& text, bool finished);
  // Choice i's message of the full response.
  nlohmann::json Message(int i) const;

  const bool logprobs_;
  const std::string echo_;
  const int num_choices_;
  std::vector<size_t> streamed_bytes_;  // per choice: text already sent
  std::vector<size_t> streamed_tokens_;  // per choice: tokens whose logprobs were sent
  std::vector<bool> finish_sent_;
  const ToolChoice tool_choice_;
  std::vector<ToolCallArrayScanner> call_scanners_;  // required: per choice
  std::vector<HermesToolCallStreamer> auto_streamers_;  // auto: per choice
  std::vector<int> calls_streamed_;                  // per choice
  std::vector<std::string> named_call_ids_;          // named: per choice
};

}  // namespace mqa
