// mqabench --engine: a benchmark's requests through the serving engine (runtime/engine.h) instead
// of mqabench's own minimal step loop, so that the figures include what the server's host side
// costs a step (scheduler, block manager, step input, output processing).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/decode_lookahead.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"

namespace mqa::bench {

struct EngineRequestSpec {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  float temperature = 0.0f;
  float top_p = 1.0f;
  uint64_t seed = 0;
};

struct EngineRunStats {
  double seconds = 0;  // first AddRequest to the last request's end
  int64_t output_tokens = 0;
  int64_t prompt_tokens = 0;
  // Per engine step that ran the model, in order: the step's wall time, the part of it spent
  // inside the runner (ExecuteSampled / Execute), and what `gpu_ms` reported after it (-1: none).
  std::vector<double> step_s, runner_s, gpu_ms;
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;  // EngineMetrics'
};

// Runs `requests` (all queued at once, ignore_eos) through an Engine built on `runner` (borrowed:
// it must outlive the call) with `options`, calling Engine::Step on this thread until every
// request has finished. `gpu_ms`, when set, is read after each step (e.g. the decode graph's
// event time).
absl::StatusOr<EngineRunStats> RunThroughEngine(ModelRunner* runner, const EngineOptions& options,
                                                const std::vector<EngineRequestSpec>& requests,
                                                const std::function<double()>& gpu_ms = nullptr);

// "; decode lookahead: L predicted steps launched, U used, D dropped" for the counts between two
// readings of GptBigCodeRunner::lookahead_stats.
std::string LookaheadSummary(const LookaheadStats& before, const LookaheadStats& after);

}  // namespace mqa::bench
