// One /v1/completions call with use_beam_search: vLLM's beam search, run as vLLM runs it over an
// engine that only samples. Each step asks the engine for one token of every live beam (the
// prompt plus the beam's tokens: the prefix cache holds their shared full blocks) with its 2 x
// width most likely next tokens and their log-probabilities; every beam x candidate is scored
// (cumulative log-probability / (prompt + output length) ^ length_penalty, EOS not counted), those
// ending in EOS are set aside as finished, and the best `width` of the rest go on. After
// max_tokens steps (or when none is left) the best `width` of all, finished and not, are the
// choices: finish_reason "stop" for those that ended in EOS, "length" for the others.
//
// Threads: Callback()s run on the engine thread and only queue outputs; everything else belongs to
// the HTTP thread serving the call, which also submits each next step from Drain. Held by
// shared_ptr so that a late callback stays safe.
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
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/http/completion_job.h"
#include "runtime/http/http_job.h"
#include "runtime/http/metrics.h"

namespace mqa {

struct BeamSearchOptions {
  float length_penalty = 1.0f;
  bool ignore_eos = false;  // EOS is then a token like any other
  int32_t eos_token_id = -1;
};

class BeamSearchJob : public HttpJob, public std::enable_shared_from_this<BeamSearchJob> {
 public:
  // `options.n` is the beam width; each prompt's max_tokens the steps. `submit` hands the engine
  // one request; `abort` withdraws one.
  BeamSearchJob(CompletionJobOptions options, std::vector<PreparedPrompt> prompts,
                BeamSearchOptions beam, const Tokenizer* tokenizer, ServerMetrics* metrics,
                std::function<absl::Status(EngineRequest)> submit,
                std::function<void(const std::string&)> abort);

  // Submits every prompt's first step (the job must be owned by a shared_ptr).
  absl::Status Start();

  // HttpJob. Streamed, the choices come whole when the search ends (beams change until then).
  bool Drain(absl::Duration timeout, std::string* chunks) override;
  bool finished() const override;
  const absl::Status& error() const override { return error_; }
  std::vector<std::string> UnfinishedEngineIds() const override;
  std::string OpeningChunks() override { return ""; }
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;
  std::string Summary() const override;

 private:
  struct Beam {
    std::vector<int32_t> tokens;  // generated so far
    double logprob = 0.0;         // cumulative
    bool ended = false;           // its last token is EOS
  };
  struct Search {
    std::vector<Beam> live;
    std::vector<Beam> finished;
    int step = 0;
    // This step's answers, one per live beam: the most likely next tokens.
    std::vector<std::optional<std::vector<TokenLogprob>>> next;
    std::vector<std::vector<TokenLogprob>> arriving;  // per live beam, until its request ends
    int pending = 0;
    bool done = false;
    std::vector<Beam> choices;  // when done: the best `width`, best first
  };
  struct Arrived {
    int prompt_index, step, beam;
    RequestOutput output;
  };

  std::string EngineId(int prompt_index, int step, int beam) const;
  double Score(int prompt_index, const Beam& beam) const;
  absl::Status SubmitStep(int prompt_index);
  // The step's answers are all in: rank the candidates, then submit the next step or finish.
  absl::Status Advance(int prompt_index);
  void Finish(int prompt_index);
  // A step failed: the whole call fails, and every beam still running is withdrawn.
  void EndAll();
  // {"id", "object", "created", "model", "choices"}.
  nlohmann::json Body(nlohmann::json choices) const;
  nlohmann::json Choices() const;
  nlohmann::json UsageJson() const;

  const CompletionJobOptions options_;
  const std::vector<PreparedPrompt> prompts_;
  const BeamSearchOptions beam_;
  const Tokenizer* tokenizer_;
  ServerMetrics* metrics_;
  const std::function<absl::Status(EngineRequest)> submit_;
  const std::function<void(const std::string&)> abort_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Arrived> queue_;

  // HTTP thread.
  std::vector<Search> searches_;  // per prompt
  absl::Status error_;
  bool sent_ = false;  // streaming: the choices went out
};

}  // namespace mqa
