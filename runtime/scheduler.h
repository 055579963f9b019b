// Scheduler: iteration-level continuous batching over a waiting and a running queue.
//
// Each step (Schedule) it picks, within a token budget (max_num_batched_tokens) and a sequence
// budget (max_num_seqs): first running sequences that decode one token, then running prompts
// (chunked: a long prompt takes what budget is left, so decodes never wait behind it), then new
// requests from the waiting queue in arrival order (FCFS: the head blocks those behind it). When
// a running sequence needs a block and none is free, the newest running request not yet in the
// step is preempted by recompute: its blocks are released and it returns to the front of the
// waiting queue, to recompute its prompt and output so far when readmitted.
//
// Thread ownership: the engine thread only. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "runtime/block_manager.h"
#include "runtime/model_runner.h"
#include "runtime/sequence.h"
#include "runtime/speculative.h"

namespace mqa {

struct SchedulerOptions {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  // Without chunked prefill a prompt runs in one step or waits (needs max_num_batched_tokens at
  // least as long as the longest prompt).
  bool enable_chunked_prefill = true;
  // Prompt tokens a step may compute for prompt log-probabilities (SequenceGroup::
  // NeedsPromptLogprobs), each of which costs a logits row: such a prompt runs in chunks of at
  // most this many tokens, so a step's logits rows stay within max_num_seqs plus this.
  int max_prompt_logprob_rows = 256;
  // Speculative decoding (runtime/speculative.h): a decoding sequence of an eligible request also
  // computes up to num_speculative_tokens draft tokens a step, each taking a token of the step's
  // budget and a logits row of the prompt-logprob rows' (so that a step's logits rows stay
  // within max_num_seqs + max_prompt_logprob_rows), and blocks only if free ones are left.
  SpeculativeConfig speculative;
  int max_model_len = 0;  // positions a draft may reach (0: no limit)
  // Order groups by (SamplingParams::priority, arrival) instead of arrival: the waiting queue,
  // the running list (the step's order) and the choice of whom to preempt (the last).
  bool priority = false;
};

// One sequence's share of a step.
struct ScheduledSeq {
  SequenceGroup* group = nullptr;
  Sequence* seq = nullptr;
  int num_tokens = 0;     // tokens computed this step, from seq->num_computed_tokens()
  int logits_index = -1;  // row of the step's logits to sample from; -1: mid-prompt chunk
  // Rows from logits_index holding this same row: n for a prompt's last token before the group
  // forks into its n samples (one draw each, e.g. on the device), else 1.
  int num_draws = 1;
  // Prompt log-probabilities: logits rows [prompt_rows_index, prompt_rows_index + num_prompt_rows)
  // hold positions first_position, first_position + 1, ..., each scoring the prompt token after it.
  int prompt_rows_index = -1;
  int num_prompt_rows = 0;
  int first_position = 0;
  // Speculative decoding: the draft tokens computed after the sequence's last token, at positions
  // num_tokens() ... ; logits rows logits_index + 1 ... hold them (row logits_index + i gives the
  // model's token after draft i - 1). The engine then calls Scheduler::OnDraftsChecked.
  std::vector<int32_t> draft;
};

struct SchedulerOutput {
  StepInput input;                      // what the ModelRunner executes
  std::vector<ScheduledSeq> scheduled;  // parallel to input.seq_ids
  // Waiting requests that can never fit the KV cache, removed from the queues; the engine
  // finishes them with FinishReason::kAbort.
  std::vector<std::unique_ptr<SequenceGroup>> refused;
  int num_preempted = 0;  // requests preempted in this step

  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  const SchedulerOptions& options() const { return options_; }
  Scheduler(SchedulerOptions options, BlockManager* block_manager);

  // Queues a new request (its one sequence must be waiting, without blocks).
  void AddGroup(std::unique_ptr<SequenceGroup> group);
  // Removes a request from whichever queue holds it and releases its blocks at once; returns it
  // (nullptr when unknown). Its unfinished sequences are left for the caller to finish.
  std::unique_ptr<SequenceGroup> Remove(const std::string& request_id);

  // Decides the next step. Empty when nothing can run.
  SchedulerOutput Schedule();
  // After the runner executed `output`: advances computed tokens and fills the prefix cache.
  void OnStepExecuted(const SchedulerOutput& output);

  // After the engine appended the model's tokens for a sequence that had drafts (and it did not
  // finish): the accepted drafts' KV counts as computed (all but its newest token), full blocks
  // join the prefix cache, and blocks held for rejected drafts are released.
  void OnDraftsChecked(Sequence& seq);
  // Creates sample `sample_index` of a running group from `parent`, sharing its blocks.
  Sequence* Fork(SequenceGroup& group, const Sequence& parent, int64_t new_seq_id,
                 int sample_index);
  // Finishes a sequence and releases its blocks at once.
  void FinishSeq(Sequence& seq, FinishReason reason);
  // Removes and returns the running requests whose sequences have all finished.
  std::vector<std::unique_ptr<SequenceGroup>> TakeFinishedGroups();

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int NumRunningSeqs() const;
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const std::deque<std::unique_ptr<SequenceGroup>>& waiting() const { return waiting_; }
  const std::deque<std::unique_ptr<SequenceGroup>>& running() const { return running_; }

  // Checks the block manager's invariants and that exactly the running, unfinished sequences
  // hold block tables. For tests.
  void CheckInvariants() const;

 private:
  // The scheduling order: (priority, arrival) with SchedulerOptions::priority, else arrival.
  bool Before(const SequenceGroup& a, const SequenceGroup& b) const;
  // Inserts `group` into `queue` after every group not after it (stable for equal keys).
  void InsertOrdered(std::deque<std::unique_ptr<SequenceGroup>>& queue,
                     std::unique_ptr<SequenceGroup> group) const;
  // Plans `group`'s sequences into `out` within the budget, preempting newer groups for blocks
  // when `may_preempt`. Returns false when `group` itself was preempted.
  bool ScheduleGroup(SequenceGroup& group, bool may_preempt, SchedulerOutput& out);
  void Preempt(SequenceGroup& group);
  // Draft tokens for a decoding sequence whose last slot is ready, with their blocks reserved;
  // empty when the request or the budgets do not allow any.
  std::vector<int32_t> Speculate(const SequenceGroup& group, const Sequence& seq);
  void AddToStep(SequenceGroup& group, Sequence& seq, int num_tokens, SchedulerOutput& out,
                 std::vector<int32_t> draft = {});
  void FinalizeStepInput(SchedulerOutput& out) const;

  SchedulerOptions options_;
  BlockManager* block_manager_;  // not owned
  std::deque<std::unique_ptr<SequenceGroup>> waiting_;
  std::deque<std::unique_ptr<SequenceGroup>> running_;
  std::vector<int64_t> released_seq_ids_;  // since the last Schedule()
  // Per-Schedule() state.
  int token_budget_ = 0;
  int prompt_rows_budget_ = 0;
  std::vector<const SequenceGroup*> in_step_;
  std::vector<const SequenceGroup*> preempted_in_step_;
  int64_t num_preemptions_ = 0;
};

}  // namespace mqa
