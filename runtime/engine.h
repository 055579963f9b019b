// Engine: the step loop. Owns the scheduler, block manager, sampler state and model runner; all
// of it lives on one thread (the one calling Run() or Step()).
//
// Thread safety: AddRequest, Abort, Stop and metrics() may be called from any thread. Step() and
// Run() must be called from one thread only (the engine thread). Output callbacks run on the
// engine thread and must return quickly (push to a queue, e.g. RequestOutputQueue).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "runtime/block_manager.h"
#include "runtime/guided.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/sampling_params.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/speculative.h"
#include "runtime/stop_strings.h"
#include "runtime/worker_pool.h"

namespace mqa {

struct EngineOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  // Longest prompt + max_tokens accepted.
  int max_model_len = 2048;
  // Requests accepted but not yet running; AddRequest returns ResourceExhausted beyond it. 0: no
  // limit.
  int max_queued_requests = 0;
  int32_t eos_token_id = -1;  // -1: none
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  // Fraction of the KV blocks kept free when admitting new requests.
  double watermark = 0.01;
  // Seeds the generator that draws a seed for requests without one.
  uint64_t seed = 0;
  // While idle, Run() calls ModelRunner::KeepAlive this often.
  absl::Duration keep_alive_interval = absl::Seconds(1);
  // Where the runner samples on the device (ModelRunner::samples_on_device), requests whose
  // parameters the device sampler covers (DeviceSamplable) are sampled there: only their token ids
  // come back to the host. Others, and every request when off, use the host sampler on copied
  // logits. A request's sampler depends only on its own parameters, never on its batch.
  bool device_sampling = true;
  // Prompt tokens one step may compute for prompt log-probabilities (SamplingParams::
  // prompt_logprobs), each costing a logits row: a step's logits rows stay within max_num_seqs
  // plus this, the size a runner's logits workspace needs. 0 refuses such requests.
  int max_prompt_logprob_rows = 256;
  // Decode lookahead (runtime/decode_lookahead.h, the server's --async-scheduling): on steps where
  // every sequence decodes with device sampling, continues unless its token stops it, and nothing
  // waits, the engine tells the runner (StepInput::may_look_ahead), which may launch the
  // predicted next step before this step's tokens reach the host; the host's work between steps
  // then overlaps the GPU. Outputs are the same either way; a step whose prediction fails (a stop,
  // an arrival) costs the GPU one wasted step. Off: every step starts after the previous one's
  // tokens are processed.
  bool decode_lookahead = false;
  // ... only on steps of at most this many sequences. Above 1, the predicted step after any of
  // them samples EOS is dropped for all the others: a whole step lost for them, where lookahead
  // saves the host's share of one (~0.3% of a batch's step on an H100); so by default a lone
  // sequence only, where a dropped step costs only an arrival during it up to one step of TTFT.
  int decode_lookahead_max_seqs = 1;
  // Speculative decoding by prompt lookup (runtime/speculative.h); off by default.
  SpeculativeConfig speculative;
  // vLLM's --scheduling-policy priority: requests are admitted, stepped and spared from
  // preemption by (SamplingParams::priority, arrival); off: by arrival, and a request with a
  // priority other than 0 is refused.
  bool priority_scheduling = false;
  // Threads (the engine's own included) that sample and score a step's rows on the host — rows of
  // requests the device sampler does not cover, log-probabilities, prompt log-probabilities — in
  // parallel; 0: min(8, hardware threads). Results do not depend on it.
  int host_threads = 0;
};

// New output of one sample since the previous RequestOutput.
struct SampleOutput {
  int index = 0;                       // sample index, 0..n-1
  std::vector<int32_t> token_ids;      // new tokens
  std::vector<SampleResult> logprobs;  // parallel to token_ids when SamplingParams::logprobs is set
  std::string text;                    // new text (with a detokenizer)
  std::optional<FinishReason> finish_reason;  // set once, on the sample's last output
  // The stop string or stop token id (as text) that ended the sample.
  std::string stop_reason;
  std::optional<int32_t> stop_token_id;  // set when a stop token id ended it
};

struct RequestOutput {
  std::string request_id;
  std::vector<SampleOutput> samples;  // the samples with news
  bool finished = false;              // last output of the request
  int num_prompt_tokens = 0;
  int num_generated_tokens = 0;      // all samples, so far
  int num_cached_prompt_tokens = 0;  // prompt tokens found in the prefix cache at admission
  // When the scheduler first ran the request (none while it waits): the end of its queue time.
  std::optional<absl::Time> first_scheduled;
  // SamplingParams::prompt_logprobs: set once, in the first output after the whole prompt ran;
  // entry i scores prompt token i + 1 (token_id) given the tokens before it.
  std::optional<std::vector<SampleResult>> prompt_logprobs;
  // Why an aborted request ended when it was not the client (refused, engine failure).
  absl::Status error;
};

struct EngineRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  // Receives the request's outputs on the engine thread, the last with finished = true.
  std::function<void(RequestOutput)> on_output;
  // Optional: a fresh detokenizer per sample, for text and stop strings (required with stop).
  std::function<std::unique_ptr<IncrementalDetokenizer>()> make_detokenizer;
};

struct EngineMetrics {
  int num_running = 0;  // requests
  int num_waiting = 0;  // requests, including ones not yet picked up by the engine thread
  int num_running_seqs = 0;
  double kv_cache_usage = 0.0;    // 0..1
  int64_t prompt_tokens = 0;      // prompt tokens of admitted requests
  int64_t generation_tokens = 0;  // sampled tokens
  int64_t num_preemptions = 0;
  int64_t prefix_cache_hit_blocks = 0;
  int64_t prefix_cache_queried_blocks = 0;
  int64_t prefix_cache_queried_tokens = 0;  // vLLM's prefix_cache_queries (tokens)
  int64_t prefix_cache_hit_tokens = 0;      // vLLM's prefix_cache_hits (tokens)
  int64_t finished_stop = 0;
  int64_t finished_length = 0;
  int64_t finished_abort = 0;
  int64_t num_steps = 0;
  // Speculative decoding: draft tokens computed, and those the model's tokens confirmed.
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
};

// A thread-safe queue of one request's outputs, for callers that want to block on them.
class RequestOutputQueue {
 public:
  void Push(RequestOutput output);
  // Waits up to `timeout`; nullopt on timeout.
  std::optional<RequestOutput> Pop(absl::Duration timeout = absl::InfiniteDuration());
  // A callback for EngineRequest::on_output that pushes here (the queue must outlive it).
  std::function<void(RequestOutput)> Callback();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> outputs_;
};

class Engine {
 public:
  // InvalidArgument when the options do not fit the runner.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ModelRunner> runner,
                                                        EngineOptions options);
  // Aborts (MQA_CHECK) on invalid options; prefer Create.
  Engine(std::unique_ptr<ModelRunner> runner, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  static absl::Status ValidateOptions(const EngineOptions& options, const ModelRunner& runner);

  // Any thread. Queues a request. InvalidArgument (bad parameters, empty prompt, prompt +
  // max_tokens above max_model_len, a request that could never fit the KV cache), AlreadyExists
  // (request id in flight), ResourceExhausted (max_queued_requests), Unavailable (stopped).
  absl::Status AddRequest(EngineRequest request);
  // Any thread. The request's blocks are released on the engine thread's next turn, and its last
  // output has FinishReason::kAbort. Unknown or finished ids are ignored.
  void Abort(const std::string& request_id);

  // Engine thread. One iteration: take new requests and aborts, schedule, run the model, sample,
  // stream outputs. A runner error fails every request in flight and is returned.
  absl::Status Step();
  // Engine thread. Steps until Stop(); sleeps on a condition variable while idle, waking every
  // keep_alive_interval to call ModelRunner::KeepAlive. Returns the first runner error (of a
  // step or a keep-alive); requests still in flight when it returns are aborted.
  absl::Status Run();
  // Any thread. Makes Run() return; later AddRequest calls are refused.
  void Stop();
  // Any thread, while Run() runs: the engine thread forgets the prefix cache's blocks that no
  // request holds (BlockManager::ResetPrefixCache) before its next step; returns how many.
  // Unavailable when the engine does not get to it within `timeout` (not running, stopped).
  absl::StatusOr<int64_t> ResetPrefixCache(absl::Duration timeout = absl::Seconds(10));

  // Engine thread: true while requests are queued or running.
  bool HasWork();

  EngineMetrics metrics() const;

  // Engine thread, for tests.
  const Scheduler& scheduler() const { return scheduler_; }
  const BlockManager& block_manager() const { return block_manager_; }
  int32_t eos_token_id() const { return options_.eos_token_id; }

 private:
  struct SampleState {
    std::unique_ptr<IncrementalDetokenizer> detokenizer;
    std::optional<StopStringMatcher> stop_matcher;
    // SamplingParams::guide's state after the sample's output, advanced token by token.
    int guide_state = Guide::start();
  };
  struct RequestState {
    EngineRequest request;
    std::vector<SampleState> samples;  // by sample index
    int num_cached_prompt_tokens = 0;
    bool admitted = false;
    std::optional<absl::Time> first_scheduled;
    std::vector<SampleResult> prompt_logprobs;  // filled chunk by chunk while the prompt runs
  };

  void TakeInbox();
  // A speculating sequence's step (ScheduledSeq::draft): DrawChecks draws the model's token at
  // each of its rows (host pool; row_at(i) is logits row i on the host, empty if none came back),
  // AcceptDrafts appends them while the drafts match, counts them, and returns the blocks of
  // rejected drafts.
  // The guide state `seq` has reached (SampleState::guide_state; the start one without a guide).
  int GuideState(const SequenceGroup& group, const Sequence& seq) const;
  // StepInput::may_look_ahead for a step whose rows are all device-sampled (no host rows): every
  // running sequence is in `plan` as a one-token decode that continues by length, none waits, and
  // each one's block for its next token is its own.
  bool MayLookAhead(const SchedulerOutput& plan) const;
  // guide_state: the sample's (GuideState).
  std::vector<SampleResult> DrawChecks(
      const ScheduledSeq& s, absl::Span<const int32_t> device_tokens,
      absl::FunctionRef<absl::Span<const float>(int)> row_at, int guide_state) const;
  void AcceptDrafts(const ScheduledSeq& s, absl::Span<const SampleResult> results,
                    RequestState& state, RequestOutput& output);
  void ProcessSample(SequenceGroup& group, RequestState& state, Sequence& seq,
                     const SampleResult& result, RequestOutput& output);
  SampleOutput& OutputFor(RequestOutput& output, int sample_index);
  void FinishSeq(Sequence& seq, FinishReason reason, RequestOutput& output);
  // Finishes all of a removed group's sequences with kAbort and sends the last output.
  void AbortGroup(SequenceGroup& group, absl::Status error);
  void Deliver(RequestState& state, RequestOutput output);
  void FailAll(const absl::Status& error);
  void PublishMetrics();

  EngineOptions options_;
  std::unique_ptr<ModelRunner> runner_;
  BlockManager block_manager_;
  Scheduler scheduler_;

  // Engine-thread state.
  absl::flat_hash_map<std::string, RequestState> requests_;
  int64_t next_seq_id_ = 0;
  std::unique_ptr<WorkerPool> host_pool_;  // EngineOptions::host_threads
  int64_t next_arrival_ = 0;
  SampleRng seed_rng_;
  EngineMetrics counters_;

  // Shared with other threads, under mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineRequest> inbox_;
  std::vector<std::string> abort_inbox_;
  // ResetPrefixCache's tickets: asked and done (the engine thread's result beside).
  int64_t resets_asked_ = 0, resets_done_ = 0, last_reset_blocks_ = 0;
  std::condition_variable reset_cv_;
  absl::flat_hash_set<std::string> live_ids_;  // accepted and not yet finished
  bool stopped_ = false;
  EngineMetrics published_;
};

}  // namespace mqa
