// One /v1/chat/completions call in flight: the CompletionJob of its rendered prompt (n choices),
// rendered in OpenAI's chat shapes.
//
//   plain:   {"object": "chat.completion", "choices": [{"index", "message": {"role": "assistant",
//            "content"}, "finish_reason", "stop_reason", "logprobs": null}], "usage"}
//   stream:  "chat.completion.chunk" events: each choice's first delta {"role": "assistant",
//            "content": "" (or the echoed text)}, then {"content": new text}, then an empty delta
//            with its finish_reason; the usage chunk when asked for; `data: [DONE]`.
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

namespace mqa {

class ChatJob : public CompletionJobView {
 public:
  // The chunks' id, model, created and include_usage are `inner`'s; logprobs: the choices carry
  // OpenAI's chat logprobs ({"content": [...]}); echo: text each choice's content starts with (in
  // the stream, the opening delta's content), vLLM's chat `echo`.
  ChatJob(std::shared_ptr<CompletionJob> inner, bool logprobs, std::string echo = "");

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

  const bool logprobs_;
  const std::string echo_;
  const int num_choices_;
  std::vector<size_t> streamed_bytes_;  // per choice: text already sent
  std::vector<size_t> streamed_tokens_;  // per choice: tokens whose logprobs were sent
  std::vector<bool> finish_sent_;
};

}  // namespace mqa
