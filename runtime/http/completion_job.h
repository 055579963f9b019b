// One /v1/completions or /v1/infill call in flight: its engine requests (one per prompt), the
// queue their outputs arrive in, and the OpenAI response (or stream of chunks) built from them.
//
// Threads: Callback()'s functions run on the engine thread and only push into the queue (and
// observe the latency metrics); everything else belongs to the one HTTP thread serving the call.
// Held by shared_ptr so that a callback arriving after the HTTP side is gone stays safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/http/http_job.h"
#include "runtime/http/metrics.h"

namespace mqa {

// A prompt ready for the engine.
struct PreparedPrompt {
  std::vector<int32_t> token_ids;
  std::string text;    // for echo
  // Resolved; 0: echo only, nothing to generate (the engine runs the prompt, one sample, only when
  // its log-probabilities are asked for).
  int max_tokens = 0;
};

struct CompletionJobOptions {
  std::string id;  // "cmpl-<n>"; engine request i is "<id>-<i>"
  std::string model;
  int64_t created = 0;  // Unix seconds
  int n = 1;
  // OpenAI's best_of: the choices shown per prompt, the `keep` of its n samples with the highest
  // cumulative log-probability (the engine must score every token); 0: all n, in order.
  int keep = 0;
  bool echo = false;
  // `logprobs` alternatives per token (the logprobs object; with echo it starts with the prompt's
  // tokens). Unset: no logprobs object.
  std::optional<int> logprobs;
  // vLLM's prompt_logprobs: alternatives per prompt token in choices[i].prompt_logprobs.
  std::optional<int> prompt_logprobs;
  bool include_usage = false;
  bool continuous_usage = false;  // with include_usage: every chunk carries the usage so far
  bool return_token_ids = false;
  bool prompt_tokens_details = false;  // usage.prompt_tokens_details.cached_tokens
  absl::Time arrival;  // when the HTTP request came in, for TTFT and end-to-end latency
};

class CompletionJob : public HttpJob, public std::enable_shared_from_this<CompletionJob> {
 public:
  // What one choice (sample) has received so far.
  struct Choice {
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<SampleResult> scores;  // parallel to token_ids when logprobs are asked for
    std::optional<FinishReason> finish_reason;
    std::string stop_reason;  // the stop string or stop token id that ended it ("" for EOS)
    std::optional<int32_t> stop_token_id;  // when a stop token id ended it
    nlohmann::json logprobs;         // the completions API's logprobs object, when asked for
    nlohmann::json prompt_logprobs;  // vLLM's, when asked for
    int64_t text_chars = 0;          // code points in `text`, for text_offset
    bool opened = false;             // streaming: the first chunk has been sent
    // The sum of the tokens' log-probabilities (those scored): what best_of ranks by.
    double CumulativeLogprob() const {
      double sum = 0;
      for (const SampleResult& scored : scores) sum += scored.logprob;
      return sum;
    }
  };

  CompletionJob(CompletionJobOptions options, std::vector<PreparedPrompt> prompts,
                const Tokenizer* tokenizer, ServerMetrics* metrics);

  const CompletionJobOptions& options() const { return options_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int num_prompts() const { return static_cast<int>(prompts_.size()); }
  int num_choices() const { return static_cast<int>(choices_.size()); }
  const PreparedPrompt& prompt(int i) const { return prompts_[i]; }
  std::string EngineRequestId(int prompt_index) const;

  // The on_output callback of prompt `prompt_index`'s engine request (runs on the engine thread;
  // holds a reference to the job). The job must be owned by a shared_ptr.
  std::function<void(RequestOutput)> Callback(int prompt_index);
  // Marks a prompt as never submitted (echo only): it counts as finished from the start.
  void MarkSubmittedNone(int prompt_index);
  // Whether prompt `prompt_index` runs in the engine: it generates, or its prompt is scored.
  bool NeedsEngine(int prompt_index) const;

  // HttpJob. Streaming chunks are OpenAI's `data: {...}` events: OpeningChunks sends the echo of
  // the prompts and the prompt token ids, ClosingChunks an error event, the usage chunk (when asked
  // for) and `data: [DONE]`.
  bool Drain(absl::Duration timeout, std::string* chunks) override;
  bool finished() const override;
  const absl::Status& error() const override { return error_; }
  std::vector<std::string> UnfinishedEngineIds() const override;
  std::string OpeningChunks() override;
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;
  std::string Summary() const override;

  // HTTP thread: choice `ci` (prompt ci / n, sample ci % n) as received so far, and the scores of
  // prompt `p`'s tokens once they arrived (prompt_logprobs).
  const Choice& choice(int ci) const { return choices_[ci]; }
  // {"prompt_tokens", "completion_tokens", "total_tokens"} so far.
  nlohmann::json UsageJson() const;
  // A choice's finish_reason ("stop", "length", "abort") or null while it runs.
  static nlohmann::json FinishReasonJson(const std::optional<FinishReason>& reason);
  // vLLM's stop_reason of a choice: the stop string, the stop token id as a number, or null.
  static nlohmann::json StopReasonJson(const Choice& choice);
  const std::optional<std::vector<SampleResult>>& prompt_scores(int p) const {
    return prompt_scores_[p];
  }
  // Prompt p's tokens the engine found in the prefix cache (0 until its first output).
  int cached_prompt_tokens(int p) const { return cached_prompt_tokens_[p]; }

 private:
  struct Arrived {
    int prompt_index = 0;
    RequestOutput output;
  };
  // Per engine request; touched by the engine thread only (under mu_ for the queue).
  struct Timing {
    std::optional<absl::Time> first_token;
    std::optional<absl::Time> last_token;
  };

  void OnOutput(int prompt_index, RequestOutput output);
  void Fold(const Arrived& arrived, std::string* chunks);
  void AppendLogprobs(Choice& choice, const SampleOutput& sample, nlohmann::json* delta);
  // The prompt's log-probabilities (they arrive once, before its first token) into every choice
  // of the prompt: the echo's part of the logprobs object and vLLM's prompt_logprobs.
  void FoldPromptLogprobs(int prompt_index, const std::vector<SampleResult>& scored,
                          std::string* chunks);
  // One token's entry of a logprobs object, `offset` code points into the choice's text; null
  // log-probability and alternatives without `scored` (a prompt's first token). Returns the
  // token's code points.
  int64_t PushLogprobsEntry(nlohmann::json& object, int32_t token_id, const SampleResult* scored,
                            int64_t offset) const;
  nlohmann::json ChunkBase() const;
  // The choices a response shows, in order: all, or per prompt the `keep` most likely samples.
  std::vector<int> ShownChoices() const;
  std::string ChoiceChunk(int choice_index, const std::string& text,
                          const std::vector<int32_t>& token_ids, const nlohmann::json& logprobs,
                          std::optional<FinishReason> finish_reason, bool first) const;

  const CompletionJobOptions options_;
  const std::vector<PreparedPrompt> prompts_;
  const Tokenizer* tokenizer_;
  ServerMetrics* metrics_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Arrived> queue_;
  std::vector<Timing> timing_;

  // HTTP thread.
  std::vector<Choice> choices_;  // prompt_index * n + sample index
  std::vector<std::optional<std::vector<SampleResult>>> prompt_scores_;  // per prompt
  std::vector<bool> prompt_finished_;
  std::vector<int> cached_prompt_tokens_;  // per prompt
  absl::Status error_;
};

// An HttpJob that renders one CompletionJob in another API's shapes (TgiJob, ChatJob): the
// engine's side — its outputs, when it has finished, its error, the request log's line — and the
// tokenizer are the CompletionJob's; a view draws its events after the job's Drain.
class CompletionJobView : public HttpJob {
 public:
  explicit CompletionJobView(std::shared_ptr<CompletionJob> inner) : inner_(std::move(inner)) {}

  bool finished() const override { return inner_->finished(); }
  const absl::Status& error() const override { return inner_->error(); }
  std::vector<std::string> UnfinishedEngineIds() const override {
    return inner_->UnfinishedEngineIds();
  }
  int ErrorHttpStatus(const absl::Status& status) const override {
    return inner_->ErrorHttpStatus(status);
  }
  std::string ErrorBody(const absl::Status& status) const override {
    return inner_->ErrorBody(status);
  }
  std::string Summary() const override { return inner_->Summary(); }

 protected:
  const CompletionJob& inner() const { return *inner_; }
  // Folds in what arrived (the job renders nothing itself); false on timeout.
  bool DrainInner(absl::Duration timeout) { return inner_->Drain(timeout, nullptr); }

 private:
  const std::shared_ptr<CompletionJob> inner_;
};

}  // namespace mqa
