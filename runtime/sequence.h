// Sequences and sequence groups (requests), the unit the scheduler and block manager work on.
//
// Ownership: the Scheduler owns every SequenceGroup (and, through it, every Sequence) from
// Scheduler::AddGroup until the group finishes; all access is on the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "runtime/sampling_params.h"

namespace mqa {

enum class SequenceStatus : uint8_t {
  kWaiting,   // no KV blocks; in the scheduler's waiting queue (new or preempted)
  kRunning,   // holds KV blocks
  kFinished,  // blocks released; finish_reason says why
};

enum class FinishReason : uint8_t {
  kStop,    // EOS, a stop token id or a stop string
  kLength,  // max_tokens or max_model_len
  kAbort,   // aborted by the client, refused after admission, or failed by the engine
};

const char* FinishReasonName(FinishReason reason);  // "stop" | "length" | "abort"

// The per-sample random generator: seeded from (request seed, sample index) so that a sample's
// draws depend on nothing else in the batch.
using SampleRng = std::mt19937_64;
uint64_t SampleSeed(uint64_t request_seed, int sample_index);

class Sequence {
 public:
  Sequence(int64_t seq_id, int sample_index, std::vector<int32_t> prompt, uint64_t request_seed);

  int64_t seq_id() const { return seq_id_; }
  int sample_index() const { return sample_index_; }

  // Prompt followed by the generated tokens.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int prompt_len() const { return prompt_len_; }
  int num_output_tokens() const { return num_tokens() - prompt_len_; }
  absl::Span<const int32_t> prompt_tokens() const {
    return absl::MakeConstSpan(tokens_).first(prompt_len_);
  }
  absl::Span<const int32_t> output_tokens() const {
    return absl::MakeConstSpan(tokens_).subspan(prompt_len_);
  }
  void AppendToken(int32_t token) { tokens_.push_back(token); }

  // Tokens whose KV is in the cache. The scheduler computes tokens [num_computed, num_tokens);
  // the step that computes the last one yields the logits for the next token.
  int num_computed_tokens() const { return num_computed_tokens_; }
  void set_num_computed_tokens(int n) { num_computed_tokens_ = n; }
  int num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens_; }

  // After recompute admission of a group with several samples, the other samples share the
  // prompt's full blocks with one sequence (the leader) that computes them; they may run only
  // once the leader's num_computed_tokens has reached `prefix_owner_tokens`.
  int64_t prefix_owner_seq_id() const { return prefix_owner_seq_id_; }
  int prefix_owner_tokens() const { return prefix_owner_tokens_; }
  void set_prefix_owner(int64_t seq_id, int tokens) {
    prefix_owner_seq_id_ = seq_id;
    prefix_owner_tokens_ = tokens;
  }

  SequenceStatus status() const { return status_; }
  void set_status(SequenceStatus status) { status_ = status; }
  bool finished() const { return status_ == SequenceStatus::kFinished; }
  std::optional<FinishReason> finish_reason() const { return finish_reason_; }
  void Finish(FinishReason reason) {
    status_ = SequenceStatus::kFinished;
    finish_reason_ = reason;
  }

  SampleRng& rng() { return rng_; }

  // A new sample continuing from this one's tokens, with the generator of `sample_index`.
  // The caller (Scheduler::Fork) shares the block table.
  std::unique_ptr<Sequence> Fork(int64_t new_seq_id, int sample_index, uint64_t request_seed) const;

 private:
  int64_t seq_id_;
  int sample_index_;
  std::vector<int32_t> tokens_;
  int prompt_len_;
  int num_computed_tokens_ = 0;
  int64_t prefix_owner_seq_id_ = -1;
  int prefix_owner_tokens_ = 0;
  SequenceStatus status_ = SequenceStatus::kWaiting;
  std::optional<FinishReason> finish_reason_;
  SampleRng rng_;
};

// One request: n samples of one prompt. Starts with one sequence; when the prompt's logits are
// first sampled the engine forks it into n (Scheduler::Fork), sharing the prompt's blocks.
class SequenceGroup {
 public:
  SequenceGroup(std::string request_id, int64_t arrival_order, int64_t first_seq_id,
                std::vector<int32_t> prompt, SamplingParams params, uint64_t seed);

  const std::string& request_id() const { return request_id_; }
  // Smaller is older; FCFS order.
  int64_t arrival_order() const { return arrival_order_; }
  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }
  int prompt_len() const { return seqs_.front()->prompt_len(); }

  // All sequences ever created for this request, in sample order (finished ones included).
  const std::vector<std::unique_ptr<Sequence>>& seqs() const { return seqs_; }
  std::vector<Sequence*> UnfinishedSeqs() const;
  Sequence* FindSeq(int64_t seq_id) const;
  void AddSeq(std::unique_ptr<Sequence> seq) { seqs_.push_back(std::move(seq)); }

  // True while the prompt's log-probabilities are asked for and not yet all computed: the prompt
  // then runs from its first token (no prefix cache) and every prompt row yields logits.
  bool NeedsPromptLogprobs() const {
    return params_.prompt_logprobs.has_value() && !prompt_logprobs_done_;
  }
  void set_prompt_logprobs_done() { prompt_logprobs_done_ = true; }

  // True once all n samples exist.
  bool forked() const { return static_cast<int>(seqs_.size()) == params_.n; }
  // The most sequences this group may run at once (n before the fork).
  int MaxRunningSeqs() const;
  bool finished() const;

 private:
  std::string request_id_;
  int64_t arrival_order_;
  SamplingParams params_;
  uint64_t seed_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  bool prompt_logprobs_done_ = false;
};

}  // namespace mqa
