// One TGI-API call in flight (POST /generate, /generate_stream or /): the CompletionJob that
// talks to the engine (one prompt, one sample), rendered in text-generation-inference's shapes.
//
//   plain:   {"generated_text": ..., "details": {finish_reason, generated_tokens, seed, prefill,
//            tokens, top_tokens}} (details only when asked for; POST / wraps it in a list)
//   stream:  one `data:{"index", "token": {id, text, logprob, special}, "top_tokens",
//            "generated_text", "details"}` event a token; the last carries generated_text (and
//            details when asked for); an error is `data:{"error", "error_type"}`. No end marker.
//   finish_reason: "length", "eos_token" or "stop_sequence".
//   best_of:  the sample with the highest total log-probability answers; with details, the others
//             follow in details.best_of_sequences, each {generated_text, finish_reason,
//             generated_tokens, seed, prefill, tokens, top_tokens}.
//
// Threads: as CompletionJob (the HTTP thread serving the call).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "runtime/http/completion_job.h"
#include "runtime/http/http_job.h"

namespace mqa {

struct TgiJobOptions {
  bool list_response = false;  // POST /: the plain response is a one-element list
  bool return_full_text = false;
  bool details = false;
  bool decoder_input_details = false;
  int top_n_tokens = 0;
  std::optional<uint64_t> seed;  // reported in the details: the seed a sampled request ran with
  // The inner job's samples (n): the most likely is the answer, the others its
  // details.best_of_sequences.
  int best_of = 1;
};

class TgiJob : public CompletionJobView {
 public:
  // `inner` has one prompt and n = best_of (1 when streamed), with logprobs (top_n_tokens
  // alternatives) when streamed, with details or with best_of, and prompt log-probabilities with
  // decoder_input_details.
  TgiJob(std::shared_ptr<CompletionJob> inner, TgiJobOptions options);

  bool Drain(absl::Duration timeout, std::string* chunks) override;
  std::string OpeningChunks() override { return ""; }
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;
  // TGI's error shape, not OpenAI's.
  int ErrorHttpStatus(const absl::Status& status) const override;
  std::string ErrorBody(const absl::Status& status) const override;

 private:
  // {"id", "text", "logprob", "special"}; logprob null without a score.
  nlohmann::json Token(int32_t id, std::optional<float> logprob) const;
  nlohmann::json TopTokens(const SampleResult& scored) const;
  // Of sample i.
  std::string GeneratedText(int i) const;
  const char* FinishReason(int i) const;
  nlohmann::json Details(int i) const;
  // The sample with the highest total log-probability (0 without best_of).
  int Best() const;

  const TgiJobOptions options_;
  size_t streamed_ = 0;  // tokens already sent as events
};

}  // namespace mqa
