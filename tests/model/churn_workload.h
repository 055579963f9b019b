// A serving workload that keeps changing under the engine, for decode lookahead
// (runtime/decode_lookahead.h) on the CPU and the CUDA runner: seeded sampling (temperature,
// top-k, top-p) and greedy requests, stop tokens that end samples at steps nobody can predict,
// requests arriving while others decode, and a request of two samples (forked samples share
// their prompt's last block until it is copied on write).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/decode_lookahead.h"
#include "runtime/engine.h"
#include "tests/model/hf_fixture.h"

namespace mqa::testing {

struct ChurnResult {
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // [request][sample]
  std::vector<std::vector<std::string>> finish;           // [request][sample]
  int64_t steps = 0;
  LookaheadStats lookahead;  // the caller's runner's, filled in by the caller
};

// Eight requests over `refs`' prompts (three at once, then one every six steps), stepped until
// idle. Failures are reported through gtest.
inline ChurnResult RunChurnWorkload(Engine& engine, const std::vector<HfReference>& refs) {
  constexpr int kRequests = 8;
  ChurnResult result;
  result.tokens.assign(kRequests, {});
  result.finish.assign(kRequests, {});
  std::vector<RequestOutputQueue> queues(kRequests);
  auto submit = [&](int i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids = refs[i % refs.size()].prompt;
    r.params.max_tokens = 30 + 3 * i;
    r.params.seed = 1000 + i;
    if (i % 4 != 3) {  // one in four greedy
      r.params.temperature = 0.8f + 0.1f * static_cast<float>(i % 3);
      r.params.top_k = i % 2 == 0 ? 40 : -1;
      r.params.top_p = i % 3 == 0 ? 0.9f : 1.0f;
    }
    if (i == 2) r.params.n = 2;
    // About one token in twenty ends a sample.
    for (int32_t t = 7; t < 1000; t += 20) r.params.stop_token_ids.push_back(t);
    r.on_output = queues[i].Callback();
    const absl::Status added = engine.AddRequest(std::move(r));
    EXPECT_TRUE(added.ok()) << added;
  };
  for (int i = 0; i < 3; ++i) submit(i);
  int next = 3;
  for (int step = 0; engine.HasWork() || next < kRequests; ++step) {
    if (next < kRequests && step % 6 == 5) submit(next++);  // arrivals while others decode
    if (!engine.HasWork()) continue;
    const absl::Status st = engine.Step();
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) break;
  }
  for (int i = 0; i < kRequests; ++i) {
    bool finished = false;
    while (auto out = queues[i].Pop(absl::ZeroDuration())) {
      EXPECT_TRUE(out->error.ok()) << out->error;
      for (const SampleOutput& sample : out->samples) {
        if (result.tokens[i].size() <= static_cast<size_t>(sample.index)) {
          result.tokens[i].resize(sample.index + 1);
          result.finish[i].resize(sample.index + 1);
        }
        auto& t = result.tokens[i][sample.index];
        t.insert(t.end(), sample.token_ids.begin(), sample.token_ids.end());
        if (sample.finish_reason.has_value()) {
          result.finish[i][sample.index] = FinishReasonName(*sample.finish_reason);
        }
      }
      finished = finished || out->finished;
    }
    EXPECT_TRUE(finished) << "request " << i;
  }
  result.steps = engine.metrics().num_steps;
  return result;
}

// The run with lookahead (`on`) gave the run without it (`off`) token for token, and its runner
// used more than `min_used` predicted steps; with min_used >= 20, it also dropped some.
inline void ExpectLookaheadChangesNothing(const ChurnResult& off, const ChurnResult& on,
                                          const char* where, int min_used) {
  EXPECT_EQ(on.tokens, off.tokens) << where;
  EXPECT_EQ(on.finish, off.finish) << where;
  int stopped = 0;
  for (const auto& request : off.finish) {
    stopped += static_cast<int>(std::count(request.begin(), request.end(), "stop"));
  }
  EXPECT_GE(stopped, 3) << where << ": too few samples ended by a stop token to drop a step";
  std::printf(
      "%s: lookahead under churn: %lld predicted steps launched, %lld used, %lld dropped, in "
      "%lld engine steps (%d samples stopped by a stop token)\n",
      where, static_cast<long long>(on.lookahead.launched),
      static_cast<long long>(on.lookahead.used), static_cast<long long>(on.lookahead.dropped),
      static_cast<long long>(on.steps), stopped);
  EXPECT_EQ(off.lookahead.launched, 0) << where;
  EXPECT_EQ(on.lookahead.failed, 0) << where;
  EXPECT_GT(on.lookahead.used, min_used) << where;
  if (min_used >= 20) EXPECT_GT(on.lookahead.dropped, 0) << where;
  // A step predicted after the last request's last token may still be pending (an idle engine's
  // KeepAlive drops it).
  const int64_t pending = on.lookahead.launched - on.lookahead.used - on.lookahead.dropped;
  EXPECT_GE(pending, 0) << where;
  EXPECT_LE(pending, 1) << where;
}

}  // namespace mqa::testing
