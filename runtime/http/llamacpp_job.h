// One llama.cpp-API call in flight (POST /completion, /completions, /infill): the CompletionJob
// that talks to the engine (one prompt, one sample), rendered in llama.cpp server's shapes.
//
//   plain:   {"content", "stop": true, "model", "prompt", "tokens_predicted", "tokens_evaluated",
//            "tokens_cached", "stopped_eos", "stopped_word", "stopped_limit", "stopping_word",
//            "truncated", "has_new_line", "generation_settings", "timings"} and, with n_probs,
//            "completion_probabilities": [{"content", "probs": [{"tok_str", "prob"}]}]
//   stream:  `data: {"content": new text, "stop": false}` events, then one with "content": "",
//            "stop": true and the fields above; an error is `data: {"error": {...}}`. No [DONE].
//
// Threads: as CompletionJob (the HTTP thread serving the call).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "runtime/http/completion_job.h"

namespace mqa {

struct LlamaCppJobOptions {
  std::string model;
  std::string prompt;  // as the client gave it (a token list as text), echoed in "prompt"
  int n_probs = 0;
  nlohmann::json generation_settings;
};

class LlamaCppJob : public CompletionJobView {
 public:
  LlamaCppJob(std::shared_ptr<CompletionJob> inner, LlamaCppJobOptions options);

  bool Drain(absl::Duration timeout, std::string* chunks) override;
  std::string OpeningChunks() override { return ""; }
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;

 private:
  // The final object: every field but the content (the caller sets it).
  nlohmann::json Final() const;
  // completion_probabilities for tokens [from, to).
  nlohmann::json Probabilities(size_t from, size_t to) const;

  const LlamaCppJobOptions options_;
  const absl::Time start_;
  std::optional<absl::Time> first_token_, last_token_;
  size_t streamed_bytes_ = 0;
  size_t streamed_tokens_ = 0;
  bool final_sent_ = false;
};

}  // namespace mqa
