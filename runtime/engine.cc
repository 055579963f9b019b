#include "runtime/engine.h"

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/guided.h"
#include "runtime/status.h"

namespace mqa {
namespace {

int WatermarkBlocks(const EngineOptions& options, int num_blocks) {
  return static_cast<int>(options.watermark * num_blocks);
}

BlockManagerOptions MakeBlockManagerOptions(const EngineOptions& options,
                                            const ModelRunner* runner) {
  MQA_CHECK(runner != nullptr);
  MQA_CHECK_OK(Engine::ValidateOptions(options, *runner));
  BlockManagerOptions block_options;
  block_options.num_blocks = runner->num_kv_blocks();
  block_options.block_size = runner->block_size();
  block_options.watermark_blocks = WatermarkBlocks(options, runner->num_kv_blocks());
  block_options.enable_prefix_caching = options.enable_prefix_caching;
  return block_options;
}

SchedulerOptions MakeSchedulerOptions(const EngineOptions& options) {
  SchedulerOptions scheduler_options;
  scheduler_options.max_num_seqs = options.max_num_seqs;
  scheduler_options.max_num_batched_tokens = options.max_num_batched_tokens;
  scheduler_options.enable_chunked_prefill = options.enable_chunked_prefill;
  scheduler_options.max_prompt_logprob_rows = options.max_prompt_logprob_rows;
  scheduler_options.speculative = options.speculative;
  scheduler_options.max_model_len = options.max_model_len;
  scheduler_options.priority = options.priority_scheduling;
  return scheduler_options;
}

}  // namespace

void RequestOutputQueue::Push(RequestOutput output) {
  // Notified under the lock: once a waiter has the last output it may destroy the queue, so
  // nothing here may touch it after the lock is released.
  std::lock_guard<std::mutex> lock(mu_);
  outputs_.push_back(std::move(output));
  cv_.notify_all();
}

std::optional<RequestOutput> RequestOutputQueue::Pop(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !outputs_.empty(); };
  if (timeout == absl::InfiniteDuration()) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), ready)) {
    return std::nullopt;
  }
  RequestOutput output = std::move(outputs_.front());
  outputs_.pop_front();
  return output;
}

std::function<void(RequestOutput)> RequestOutputQueue::Callback() {
  return [this](RequestOutput output) { Push(std::move(output)); };
}

absl::Status Engine::ValidateOptions(const EngineOptions& options, const ModelRunner& runner) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (options.max_num_seqs < 1) return bad("max_num_seqs must be >= 1, got ", options.max_num_seqs);
  if (options.max_num_batched_tokens < 1) {
    return bad("max_num_batched_tokens must be >= 1, got ", options.max_num_batched_tokens);
  }
  if (options.max_num_batched_tokens < options.max_num_seqs) {
    // Otherwise decodes alone could fill every step and starve a running prompt.
    return bad("max_num_batched_tokens (", options.max_num_batched_tokens,
               ") must be >= max_num_seqs (", options.max_num_seqs, ")");
  }
  if (options.max_model_len < 2)
    return bad("max_model_len must be >= 2, got ", options.max_model_len);
  if (!options.enable_chunked_prefill && options.max_num_batched_tokens < options.max_model_len) {
    return bad("without chunked prefill max_num_batched_tokens (", options.max_num_batched_tokens,
               ") must be >= max_model_len (", options.max_model_len, ")");
  }
  if (options.max_queued_requests < 0) {
    return bad("max_queued_requests must be >= 0, got ", options.max_queued_requests);
  }
  if (options.max_prompt_logprob_rows < 0) {
    return bad("max_prompt_logprob_rows must be >= 0, got ", options.max_prompt_logprob_rows);
  }
  if (options.keep_alive_interval <= absl::ZeroDuration()) {
    return bad("keep_alive_interval must be positive");
  }
  if (!(options.watermark >= 0.0 && options.watermark < 1.0)) {
    return bad("watermark must be in [0, 1), got ", options.watermark);
  }
  if (runner.num_kv_blocks() < 1 || runner.block_size() < 1) {
    return bad("the runner has ", runner.num_kv_blocks(), " KV blocks of ", runner.block_size(),
               " tokens");
  }
  if (runner.vocab_size() < 1) return bad("vocab_size must be >= 1, got ", runner.vocab_size());
  if (options.eos_token_id >= runner.vocab_size()) {
    return bad("eos_token_id ", options.eos_token_id, " is outside the vocabulary of ",
               runner.vocab_size());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ModelRunner> runner,
                                                       EngineOptions options) {
  if (runner == nullptr) return absl::InvalidArgumentError("Engine needs a ModelRunner");
  RETURN_IF_ERROR(ValidateOptions(options, *runner));
  return std::make_unique<Engine>(std::move(runner), options);
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, EngineOptions options)
    : options_(options),
      runner_(std::move(runner)),
      block_manager_(MakeBlockManagerOptions(options_, runner_.get())),
      scheduler_(MakeSchedulerOptions(options_), &block_manager_),
      seed_rng_(options.seed) {
  const int threads =
      options_.host_threads > 0
          ? options_.host_threads
          : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  host_pool_ = std::make_unique<WorkerPool>(threads);
  PublishMetrics();
}

Engine::~Engine() = default;

absl::Status Engine::AddRequest(EngineRequest request) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const SamplingParams& params = request.params;
  RETURN_IF_ERROR(params.Validate());
  if (request.request_id.empty()) return bad("request id must not be empty");
  if (!request.on_output) return bad("request ", request.request_id, " has no output callback");
  const int prompt_len = static_cast<int>(request.prompt_token_ids.size());
  if (prompt_len == 0) return bad("the prompt is empty");
  if (params.priority != 0 && !options_.priority_scheduling) {
    return bad("priority ", params.priority,
               " needs priority scheduling (--scheduling-policy priority); this server serves "
               "first come, first served");
  }
  for (int32_t t : request.prompt_token_ids) {
    if (t < 0 || t >= runner_->vocab_size()) {
      return bad("prompt token ", t, " is outside the vocabulary of ", runner_->vocab_size());
    }
  }
  if (static_cast<int64_t>(prompt_len) + params.max_tokens > options_.max_model_len) {
    return bad("the prompt (", prompt_len, " tokens) plus max_tokens (", params.max_tokens,
               ") exceeds max_model_len (", options_.max_model_len, ")");
  }
  if (params.n > options_.max_num_seqs || params.n > options_.max_num_batched_tokens) {
    return bad("n = ", params.n, " exceeds max_num_seqs (", options_.max_num_seqs,
               ") or max_num_batched_tokens (", options_.max_num_batched_tokens, ")");
  }
  if (params.prompt_logprobs.has_value()) {
    if (options_.max_prompt_logprob_rows == 0) {
      return bad("prompt log-probabilities are disabled (max_prompt_logprob_rows is 0)");
    }
    if (!options_.enable_chunked_prefill && prompt_len > options_.max_prompt_logprob_rows) {
      return bad("prompt log-probabilities of a ", prompt_len,
                 "-token prompt need chunked prefill (a step computes at most ",
                 options_.max_prompt_logprob_rows, " of them)");
    }
  }
  if (!params.stop.empty() && !request.make_detokenizer) {
    return bad("stop strings need a detokenizer");
  }
  // The most blocks the request can hold at once: shared full prompt blocks plus, per sample,
  // the rest of prompt + max_tokens. Refusing here guarantees that a request alone in the cache
  // always fits, so preemption can never strand it.
  const int full_prompt_blocks = prompt_len / block_manager_.block_size();
  const int64_t worst_case =
      full_prompt_blocks +
      static_cast<int64_t>(params.n) *
          (block_manager_.BlocksFor(prompt_len + std::max(params.max_tokens, 1)) -
           full_prompt_blocks);
  const int usable =
      block_manager_.num_blocks() - WatermarkBlocks(options_, block_manager_.num_blocks());
  if (worst_case > usable) {
    return bad("the request needs up to ", worst_case, " KV-cache blocks of ",
               block_manager_.block_size(), " tokens (prompt ", prompt_len, ", max_tokens ",
               params.max_tokens, ", n ", params.n, "); the cache has ", usable);
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return absl::UnavailableError("the engine is stopped");
    if (live_ids_.contains(request.request_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("request id ", request.request_id, " is already in flight"));
    }
    const int queued = static_cast<int>(inbox_.size()) + published_.num_waiting;
    if (options_.max_queued_requests > 0 && queued >= options_.max_queued_requests) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the waiting queue is full (", options_.max_queued_requests, " requests)"));
    }
    live_ids_.insert(request.request_id);
    inbox_.push_back(std::move(request));
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void Engine::Abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_inbox_.push_back(request_id);
  }
  cv_.notify_one();
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
  reset_cv_.notify_all();
}

absl::StatusOr<int64_t> Engine::ResetPrefixCache(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) return absl::UnavailableError("the engine stopped");
  const int64_t ticket = ++resets_asked_;
  cv_.notify_all();
  if (!reset_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                          [&] { return resets_done_ >= ticket || stopped_; }) ||
      resets_done_ < ticket) {
    return absl::UnavailableError("the engine did not reset its prefix cache (not running)");
  }
  return last_reset_blocks_;
}

bool Engine::HasWork() {
  std::lock_guard<std::mutex> lock(mu_);
  return !inbox_.empty() || !abort_inbox_.empty() || scheduler_.has_work();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineMetrics metrics = published_;
  metrics.num_waiting += static_cast<int>(inbox_.size());
  return metrics;
}

void Engine::TakeInbox() {
  std::deque<EngineRequest> requests;
  std::vector<std::string> aborts;
  int64_t resets = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests.swap(inbox_);
    aborts.swap(abort_inbox_);
    resets = resets_asked_;
  }
  if (resets > resets_done_) {  // resets_done_ is written only here, on this thread
    const int64_t dropped = block_manager_.ResetPrefixCache();
    {
      std::lock_guard<std::mutex> lock(mu_);
      resets_done_ = resets;
      last_reset_blocks_ = dropped;
    }
    reset_cv_.notify_all();
  }
  for (EngineRequest& request : requests) {
    const SamplingParams& params = request.params;
    const uint64_t seed = params.seed.has_value() ? *params.seed : seed_rng_();
    auto group =
        std::make_unique<SequenceGroup>(request.request_id, next_arrival_++, next_seq_id_++,
                                        request.prompt_token_ids, params, seed);
    RequestState state;
    state.samples.resize(params.n);
    for (SampleState& sample : state.samples) {
      if (request.make_detokenizer) sample.detokenizer = request.make_detokenizer();
      if (!params.stop.empty()) {
        sample.stop_matcher.emplace(params.stop, params.include_stop_str_in_output);
      }
    }
    counters_.prompt_tokens += static_cast<int64_t>(request.prompt_token_ids.size());
    state.request = std::move(request);
    requests_.emplace(group->request_id(), std::move(state));
    scheduler_.AddGroup(std::move(group));
  }
  for (const std::string& id : aborts) {
    std::unique_ptr<SequenceGroup> group = scheduler_.Remove(id);
    if (group != nullptr) AbortGroup(*group, absl::OkStatus());
  }
}

absl::Status Engine::Step() {
  TakeInbox();
  SchedulerOutput plan = scheduler_.Schedule();
  for (auto& group : plan.refused) {
    AbortGroup(*group, absl::ResourceExhaustedError(
                           "the request no longer fits the KV cache after preemption"));
  }
  if (plan.empty()) {
    PublishMetrics();
    return absl::OkStatus();
  }
  for (const ScheduledSeq& s : plan.scheduled) {
    RequestState& state = requests_.at(s.group->request_id());
    if (!state.admitted) {
      state.admitted = true;
      state.num_cached_prompt_tokens = s.seq->num_computed_tokens();
      state.first_scheduled = absl::Now();
    }
  }

  // Rows sampled on the device get their RowSamplingParams; the rest (host sampler) need logits.
  const auto rows = static_cast<int64_t>(plan.input.logits_rows.size());
  const bool on_device = options_.device_sampling && runner_->samples_on_device();
  std::vector<RowSamplingParams> row_params;
  bool host_rows = !on_device && rows > 0;
  if (on_device) {
    row_params.resize(rows);
    for (const ScheduledSeq& s : plan.scheduled) {
      if (s.num_prompt_rows > 0) host_rows = true;
      if (s.logits_index < 0) continue;
      const SamplingParams& params = s.group->params();
      if (!DeviceSamplable(params)) {
        host_rows = true;
        continue;
      }
      // Drawn on the device; the chosen token's score (and the best alternatives) come from the
      // row's logits on the host, without the host sampler's filtering and sort.
      if (params.logprobs.has_value()) host_rows = true;
      // Draw d of the row is sample d's first token before the group forks (num_draws = n),
      // else this sequence's next one.
      for (int d = 0; d < s.num_draws; ++d) {
        RowSamplingParams& row = row_params[s.logits_index + d];
        row.temperature = params.temperature;
        row.top_k = params.top_k;
        row.top_p = params.top_p;
        row.seed = SampleSeed(s.group->seed(), s.num_draws > 1 ? d : s.seq->sample_index());
        // Every draw of a sequence is a device draw: its output count is its draw count.
        row.offset = static_cast<uint64_t>(s.seq->num_output_tokens());
      }
      // Draft row i is drawn as the sequence's output i positions on would be (the same seed, the
      // offset i further), so that the kept tokens are the ones drawn without speculation.
      for (size_t i = 1; i <= s.draft.size(); ++i) {
        row_params[s.logits_index + i] = row_params[s.logits_index];
        row_params[s.logits_index + i].offset += i;
      }
    }
  }
  std::vector<int32_t> device_tokens;
  absl::StatusOr<Tensor> logits = Tensor();
  plan.input.may_look_ahead =
      on_device && !host_rows && options_.decode_lookahead && MayLookAhead(plan);
  if (on_device) {
    absl::StatusOr<SampledStep> sampled = runner_->ExecuteSampled(plan.input, row_params, host_rows);
    if (!sampled.ok()) {
      logits = sampled.status();
    } else {
      device_tokens = std::move(sampled->tokens);
      logits = std::move(sampled->logits);
      if (static_cast<int64_t>(device_tokens.size()) != rows) {
        logits = absl::InternalError(absl::StrCat("the runner sampled ", device_tokens.size(),
                                                  " tokens for ", rows, " logits rows"));
      }
    }
  } else {
    logits = runner_->Execute(plan.input);
  }
  if (logits.ok() && host_rows) {
    const Tensor& t = *logits;
    if (!t.defined() || t.rank() != 2 || t.dim(0) != rows || t.dim(1) != runner_->vocab_size() ||
        t.dtype() != DType::kF32 || t.device() != Device::kCpu) {
      logits = absl::InternalError(
          absl::StrCat("the runner returned logits ", t.defined() ? t.DebugString() : "undefined",
                       "; expected f32 [", rows, ", ", runner_->vocab_size(), "] on the host"));
    }
  }
  if (!logits.ok()) {
    FailAll(logits.status());
    PublishMetrics();
    return logits.status();
  }
  scheduler_.OnStepExecuted(plan);
  ++counters_.num_steps;

  // Each scheduled sequence's draws: its samples (a request's first step forks the other n - 1
  // now, all sharing the prompt's blocks) and a result each, or a speculating sequence's draws for
  // its rows in order. The device's tokens are filled in here; what the host samples or scores
  // (Sample, ScoreToken, prompt log-probabilities) then runs on the host pool, in parallel: each
  // item reads only its rows and its own sequence's tokens and generator, and writes only its
  // own result. Outputs are processed afterwards in step order.
  const int64_t vocab = runner_->vocab_size();
  auto row_at = [&](int index) {
    return host_rows ? absl::Span<const float>(logits->data<float>() + index * vocab,
                                               static_cast<size_t>(vocab))
                     : absl::Span<const float>();
  };
  struct Draws {
    std::vector<Sequence*> samples;
    std::vector<SampleResult> results;  // one a sample, or a speculating sequence's draws
  };
  std::vector<Draws> draws(plan.scheduled.size());
  std::vector<std::function<void()>> host_work;
  for (size_t j = 0; j < plan.scheduled.size(); ++j) {
    const ScheduledSeq& s = plan.scheduled[j];
    if (s.num_prompt_rows > 0) {
      RequestState& state = requests_.at(s.group->request_id());
      // Rows of a chunk run again after a preemption overwrite what they wrote the first time.
      state.prompt_logprobs.resize(s.seq->prompt_len() - 1);
      const int top = *s.group->params().prompt_logprobs;
      for (int r = 0; r < s.num_prompt_rows; ++r) {
        const int position = s.first_position + r;
        host_work.push_back([&row_at, out = &state.prompt_logprobs[position],
                             token = s.seq->tokens()[position + 1],
                             row = s.prompt_rows_index + r, top] {
          *out = ScoreToken(row_at(row), token, top);
        });
      }
    }
    if (s.logits_index < 0 || s.group->params().max_tokens == 0) continue;
    SequenceGroup& group = *s.group;
    const SamplingParams& params = group.params();
    const bool device = on_device && DeviceSamplable(params);
    Draws& d = draws[j];
    if (!s.draft.empty()) {
      const absl::Span<const int32_t> tokens =
          device ? absl::MakeConstSpan(device_tokens) : absl::Span<const int32_t>();
      const int guide_state = GuideState(group, *s.seq);
      host_work.push_back([this, &row_at, seq = &s, out = &d.results, tokens, guide_state] {
        *out = DrawChecks(*seq, tokens, row_at, guide_state);
      });
      continue;
    }
    // Device: draw i of the row block is sample i's first token (num_draws = n before the fork),
    // else this sequence's next one. Host: every sample draws from the prompt's last row.
    const int forks = device ? s.num_draws - 1 : group.forked() ? 0 : params.n - 1;
    d.samples = {s.seq};
    for (int f = 1; f <= forks; ++f) {
      d.samples.push_back(scheduler_.Fork(group, *s.seq, next_seq_id_++, f));
    }
    d.results.resize(d.samples.size());
    for (size_t k = 0; k < d.samples.size(); ++k) {
      SampleResult& result = d.results[k];
      if (device) {
        // The chosen token's score (and the best alternatives) from the row's logits, without
        // the host sampler's filtering and sort.
        result.token_id = device_tokens[s.logits_index + k];
        if (params.logprobs.has_value()) {
          host_work.push_back([&row_at, out = &result, row = s.logits_index + static_cast<int>(k),
                               top = *params.logprobs] {
            *out = ScoreToken(row_at(row), out->token_id, top);
          });
        }
      } else {
        // A sample forked this step has no output yet: its guide state is the start one.
        const int guide_state = GuideState(group, *d.samples[k]);
        host_work.push_back([this, &row_at, out = &result, seq = d.samples[k], p = &params,
                             row = s.logits_index, guide_state] {
          SamplingContext context;
          context.params = p;
          context.prompt_tokens = seq->prompt_tokens();
          context.output_tokens = seq->output_tokens();
          context.eos_token_id = options_.eos_token_id;
          context.rng = &seq->rng();
          if (p->guide != nullptr) context.guide_state = guide_state;
          *out = Sample(row_at(row), context);
        });
      }
    }
  }
  host_pool_->ParallelFor(static_cast<int64_t>(host_work.size()),
                          [&](int64_t i) { host_work[i](); });

  std::vector<SequenceGroup*> order;  // groups with output, in step order
  absl::flat_hash_map<SequenceGroup*, RequestOutput> outputs;
  for (size_t j = 0; j < plan.scheduled.size(); ++j) {
    const ScheduledSeq& s = plan.scheduled[j];
    if (s.logits_index < 0) continue;
    SequenceGroup& group = *s.group;
    RequestState& state = requests_.at(group.request_id());
    if (!outputs.contains(&group)) order.push_back(&group);
    RequestOutput& output = outputs[&group];
    if (group.NeedsPromptLogprobs()) {
      // The prompt's last row: every position before it has been scored.
      output.prompt_logprobs = std::move(state.prompt_logprobs);
      state.prompt_logprobs.clear();
      group.set_prompt_logprobs_done();
    }
    if (group.params().max_tokens == 0) {  // scoring only
      FinishSeq(*s.seq, FinishReason::kLength, output);
      continue;
    }
    const Draws& d = draws[j];
    if (!s.draft.empty()) {
      AcceptDrafts(s, d.results, state, output);
      continue;
    }
    for (size_t k = 0; k < d.samples.size(); ++k) {
      ProcessSample(group, state, *d.samples[k], d.results[k], output);
    }
  }
  // The step's counts are published before its outputs go out, so that a client that has its
  // last token (and then reads /metrics) finds that token counted.
  PublishMetrics();
  for (SequenceGroup* group : order) {
    RequestOutput& output = outputs[group];
    output.finished = group->finished();
    for (const auto& seq : group->seqs()) output.num_generated_tokens += seq->num_output_tokens();
    Deliver(requests_.at(group->request_id()), std::move(output));
  }
  for (const auto& group : scheduler_.TakeFinishedGroups()) requests_.erase(group->request_id());
  PublishMetrics();
  return absl::OkStatus();
}

bool Engine::MayLookAhead(const SchedulerOutput& plan) const {
  if (options_.speculative.enabled() || scheduler_.num_waiting() > 0 ||
      static_cast<int>(plan.scheduled.size()) != scheduler_.NumRunningSeqs() ||
      static_cast<int>(plan.scheduled.size()) > options_.decode_lookahead_max_seqs) {
    return false;
  }
  for (const ScheduledSeq& s : plan.scheduled) {
    const Sequence& seq = *s.seq;
    const SamplingParams& params = s.group->params();
    // After this step the sequence holds num_tokens() + 1 tokens and one more output; it is
    // scheduled again unless that token (or its text) stops it.
    if (s.num_tokens != 1 || s.logits_index < 0 || s.num_draws != 1 || !s.draft.empty() ||
        s.num_prompt_rows > 0 || seq.num_computed_tokens() + 1 != seq.num_tokens() ||
        seq.num_output_tokens() + 1 >= params.max_tokens ||
        seq.num_tokens() + 1 >= options_.max_model_len ||
        !block_manager_.OwnsBlockAt(seq.seq_id(), seq.num_tokens())) {
      return false;
    }
  }
  return true;
}

int Engine::GuideState(const SequenceGroup& group, const Sequence& seq) const {
  if (group.params().guide == nullptr) return Guide::start();
  return requests_.at(group.request_id()).samples[seq.sample_index()].guide_state;
}

std::vector<SampleResult> Engine::DrawChecks(
    const ScheduledSeq& s, absl::Span<const int32_t> device_tokens,
    absl::FunctionRef<absl::Span<const float>(int)> row_at, int guide_state) const {
  // The model's token after the last token and after each draft, in order, until one differs
  // from its draft. Each is drawn as it would be without speculation: the host sampler's context
  // holds the tokens kept so far and the sequence's generator (which draws only for the rows
  // used); the device drew row i at the sequence's offset + i. For a deterministic draft d,
  // keeping it exactly when the draw equals d accepts it with the model's probability of d and
  // otherwise yields a draw from the model's distribution without d: exact rejection sampling, so
  // sampled output has the distribution (with a seed, the tokens) it has without speculation.
  const Sequence& seq = *s.seq;
  const SamplingParams& params = s.group->params();
  std::vector<int32_t> outputs(seq.output_tokens().begin(), seq.output_tokens().end());
  std::vector<SampleResult> results;
  const auto num_draft = static_cast<int>(s.draft.size());
  for (int i = 0; i <= num_draft; ++i) {
    const int row = s.logits_index + i;
    SampleResult result;
    if (!device_tokens.empty()) {
      result.token_id = device_tokens[row];
      if (params.logprobs.has_value()) {
        result = ScoreToken(row_at(row), result.token_id, *params.logprobs);
      }
    } else {
      SamplingContext context;
      context.params = &params;
      context.prompt_tokens = seq.prompt_tokens();
      context.output_tokens = outputs;
      context.eos_token_id = options_.eos_token_id;
      context.rng = &s.seq->rng();
      if (params.guide != nullptr) context.guide_state = guide_state;
      result = Sample(row_at(row), context);
    }
    results.push_back(result);
    if (i == num_draft || result.token_id != s.draft[i]) break;
    outputs.push_back(result.token_id);
    if (params.guide != nullptr) guide_state = params.guide->Advance(guide_state, {result.token_id});
  }
  return results;
}

void Engine::AcceptDrafts(const ScheduledSeq& s, absl::Span<const SampleResult> results,
                          RequestState& state, RequestOutput& output) {
  // The draws are kept in order while the draft each follows matched the one before it.
  Sequence& seq = *s.seq;
  int accepted = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    ProcessSample(*s.group, state, seq, results[i], output);
    if (seq.finished() || i + 1 == results.size()) break;
    ++accepted;  // DrawChecks drew on: the draw equalled draft i
  }
  counters_.spec_draft_tokens += static_cast<int64_t>(s.draft.size());
  counters_.spec_accepted_tokens += accepted;
  if (!seq.finished()) scheduler_.OnDraftsChecked(seq);
}

void Engine::ProcessSample(SequenceGroup& group, RequestState& state, Sequence& seq,
                           const SampleResult& result, RequestOutput& output) {
  const SamplingParams& params = group.params();
  const int32_t token = result.token_id;
  seq.AppendToken(token);
  ++counters_.generation_tokens;
  SampleOutput& sample_output = OutputFor(output, seq.sample_index());
  sample_output.token_ids.push_back(token);
  if (params.logprobs.has_value()) sample_output.logprobs.push_back(result);
  SampleState& sample = state.samples[seq.sample_index()];

  std::optional<FinishReason> reason;
  bool stop_string_hit = false;
  const bool is_eos = token == options_.eos_token_id && !params.ignore_eos;
  const bool is_stop_token = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                       token) != params.stop_token_ids.end();
  if (is_eos || is_stop_token) {
    // Stop tokens end the sample without adding text.
    reason = FinishReason::kStop;
    if (!is_eos) {
      sample_output.stop_reason = std::to_string(token);
      sample_output.stop_token_id = token;
    }
  } else if (sample.detokenizer != nullptr) {
    std::string delta = sample.detokenizer->Next(token);
    if (sample.stop_matcher.has_value() && seq.num_output_tokens() >= params.min_tokens) {
      StopStringMatcher::Result match = sample.stop_matcher->Push(delta);
      sample_output.text += match.text;
      if (match.stopped) {
        reason = FinishReason::kStop;
        stop_string_hit = true;
        sample_output.stop_reason = match.stop;
      }
    } else {
      sample_output.text += delta;
    }
  }
  if (!reason.has_value() && params.guide != nullptr) {
    // A guided sample stops once its text is a whole match that nothing may extend.
    sample.guide_state = params.guide->Advance(sample.guide_state, {token});
    if (params.guide->Complete(sample.guide_state) || sample.guide_state == Guide::kDead) {
      reason = FinishReason::kStop;
    }
  }
  if (!reason.has_value() && (seq.num_output_tokens() >= params.max_tokens ||
                              seq.num_tokens() >= options_.max_model_len)) {
    reason = FinishReason::kLength;
  }
  if (!reason.has_value()) return;
  if (!stop_string_hit) {
    // Not ended by a stop string: release the text still held back.
    std::string tail = sample.detokenizer != nullptr ? sample.detokenizer->Flush() : "";
    if (sample.stop_matcher.has_value()) {
      StopStringMatcher::Result match = sample.stop_matcher->Push(tail);
      sample_output.text += match.text;
      if (!match.stopped) sample_output.text += sample.stop_matcher->Flush();
    } else {
      sample_output.text += tail;
    }
  }
  FinishSeq(seq, *reason, output);
}

SampleOutput& Engine::OutputFor(RequestOutput& output, int sample_index) {
  for (SampleOutput& sample : output.samples) {
    if (sample.index == sample_index) return sample;
  }
  output.samples.emplace_back();
  output.samples.back().index = sample_index;
  return output.samples.back();
}

void Engine::FinishSeq(Sequence& seq, FinishReason reason, RequestOutput& output) {
  scheduler_.FinishSeq(seq, reason);
  OutputFor(output, seq.sample_index()).finish_reason = reason;
  switch (reason) {
    case FinishReason::kStop:
      ++counters_.finished_stop;
      break;
    case FinishReason::kLength:
      ++counters_.finished_length;
      break;
    case FinishReason::kAbort:
      ++counters_.finished_abort;
      break;
  }
}

void Engine::AbortGroup(SequenceGroup& group, absl::Status error) {
  auto it = requests_.find(group.request_id());
  MQA_CHECK(it != requests_.end());
  RequestOutput output;
  for (int i = 0; i < group.params().n; ++i) {
    const Sequence* existing = nullptr;
    for (const auto& seq : group.seqs()) {
      if (seq->sample_index() == i) existing = seq.get();
    }
    if (existing != nullptr && existing->finished()) continue;
    OutputFor(output, i).finish_reason = FinishReason::kAbort;
    ++counters_.finished_abort;
  }
  for (const auto& seq : group.seqs()) {
    if (!seq->finished()) scheduler_.FinishSeq(*seq, FinishReason::kAbort);
  }
  output.finished = true;
  output.error = std::move(error);
  for (const auto& seq : group.seqs()) output.num_generated_tokens += seq->num_output_tokens();
  Deliver(it->second, std::move(output));
  requests_.erase(it);
}

void Engine::Deliver(RequestState& state, RequestOutput output) {
  output.request_id = state.request.request_id;
  output.num_prompt_tokens = static_cast<int>(state.request.prompt_token_ids.size());
  output.num_cached_prompt_tokens = state.num_cached_prompt_tokens;
  output.first_scheduled = state.first_scheduled;
  if (output.finished) {
    std::lock_guard<std::mutex> lock(mu_);
    live_ids_.erase(state.request.request_id);
  }
  state.request.on_output(std::move(output));
}

void Engine::FailAll(const absl::Status& error) {
  std::vector<std::string> ids;
  for (const auto& [id, state] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (const std::string& id : ids) {
    std::unique_ptr<SequenceGroup> group = scheduler_.Remove(id);
    MQA_CHECK(group != nullptr);
    AbortGroup(*group, error);
  }
}

absl::Status Engine::Run() {
  absl::Status result;
  bool idle_step = false;
  while (true) {
    bool keep_alive_due = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] {
        return stopped_ || !inbox_.empty() || !abort_inbox_.empty() ||
               resets_asked_ > resets_done_ || (scheduler_.has_work() && !idle_step);
      };
      if (idle_step) {
        // Work that could not be scheduled (should not happen): do not spin on it.
        cv_.wait_for(lock, std::chrono::milliseconds(1), ready);
      } else {
        keep_alive_due =
            !cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.keep_alive_interval), ready);
      }
      if (stopped_) break;
    }
    if (keep_alive_due) {
      result = runner_->KeepAlive();
      if (!result.ok()) break;
      continue;
    }
    const int64_t steps = counters_.num_steps;
    result = Step();
    if (!result.ok()) break;
    idle_step = counters_.num_steps == steps && scheduler_.has_work();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  TakeInbox();
  FailAll(result.ok() ? absl::UnavailableError("the engine stopped") : result);
  PublishMetrics();
  return result;
}

void Engine::PublishMetrics() {
  counters_.num_running = scheduler_.num_running();
  counters_.num_waiting = scheduler_.num_waiting();
  int seqs = 0;
  for (const auto& group : scheduler_.running()) {
    seqs += static_cast<int>(group->UnfinishedSeqs().size());
  }
  counters_.num_running_seqs = seqs;
  counters_.kv_cache_usage = block_manager_.Usage();
  counters_.num_preemptions = scheduler_.num_preemptions();
  counters_.prefix_cache_hit_blocks = block_manager_.prefix_cache_hit_blocks();
  counters_.prefix_cache_queried_blocks = block_manager_.prefix_cache_queried_blocks();
  counters_.prefix_cache_queried_tokens = block_manager_.prefix_cache_queried_tokens();
  counters_.prefix_cache_hit_tokens = block_manager_.prefix_cache_hit_tokens();
  std::lock_guard<std::mutex> lock(mu_);
  published_ = counters_;
}

}  // namespace mqa
