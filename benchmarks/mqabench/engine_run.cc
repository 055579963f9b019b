#include "benchmarks/mqabench/engine_run.h"

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Forwards to a borrowed runner and keeps the time of its last step call.
class TimedRunner final : public ModelRunner {
 public:
  explicit TimedRunner(ModelRunner* inner) : inner_(inner) {}

  absl::StatusOr<Tensor> Execute(const StepInput& input) override {
    const auto t0 = Clock::now();
    auto out = inner_->Execute(input);
    last_s_ = Seconds(t0, Clock::now());
    return out;
  }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  absl::StatusOr<SampledStep> ExecuteSampled(const StepInput& input,
                                             absl::Span<const RowSamplingParams> params,
                                             bool with_logits) override {
    const auto t0 = Clock::now();
    auto out = inner_->ExecuteSampled(input, params, with_logits);
    last_s_ = Seconds(t0, Clock::now());
    return out;
  }
  absl::Status KeepAlive() override { return inner_->KeepAlive(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int block_size() const override { return inner_->block_size(); }

  double last_s() const { return last_s_; }

 private:
  ModelRunner* inner_;
  double last_s_ = 0;
};

}  // namespace

absl::StatusOr<EngineRunStats> RunThroughEngine(ModelRunner* runner, const EngineOptions& options,
                                                const std::vector<EngineRequestSpec>& requests,
                                                const std::function<double()>& gpu_ms) {
  auto timed = std::make_unique<TimedRunner>(runner);
  TimedRunner* t = timed.get();
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(std::move(timed), options));
  EngineRunStats stats;
  size_t finished = 0;
  absl::Status failure;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("bench-", i);
    r.prompt_token_ids = requests[i].prompt;
    r.params.max_tokens = requests[i].max_tokens;
    r.params.temperature = requests[i].temperature;
    r.params.top_p = requests[i].top_p;
    r.params.seed = requests[i].seed;
    r.params.ignore_eos = true;
    r.on_output = [&](RequestOutput out) {
      for (const SampleOutput& s : out.samples) stats.output_tokens += s.token_ids.size();
      if (!out.error.ok() && failure.ok()) failure = out.error;
      if (out.finished) ++finished;
    };
    stats.prompt_tokens += requests[i].prompt.size();
    RETURN_IF_ERROR(engine->AddRequest(std::move(r)));
  }
  while (finished < requests.size() && failure.ok()) {
    const int64_t before = engine->metrics().num_steps;
    const auto a = Clock::now();
    RETURN_IF_ERROR(engine->Step());
    const double wall = Seconds(a, Clock::now());
    if (engine->metrics().num_steps == before) {
      return absl::InternalError("the engine made no progress (nothing schedulable)");
    }
    stats.step_s.push_back(wall);
    stats.runner_s.push_back(t->last_s());
    stats.gpu_ms.push_back(gpu_ms ? gpu_ms() : -1.0);
  }
  stats.seconds = Seconds(t0, Clock::now());
  stats.spec_draft_tokens = engine->metrics().spec_draft_tokens;
  stats.spec_accepted_tokens = engine->metrics().spec_accepted_tokens;
  RETURN_IF_ERROR(failure);
  return stats;
}

std::string LookaheadSummary(const LookaheadStats& before, const LookaheadStats& after) {
  return absl::StrCat("; decode lookahead: ", after.launched - before.launched,
                      " predicted steps launched, ", after.used - before.used, " used, ",
                      after.dropped - before.dropped, " dropped",
                      after.failed > before.failed
                          ? absl::StrCat(", ", after.failed - before.failed, " failed to launch")
                          : "");
}

}  // namespace mqa::bench
