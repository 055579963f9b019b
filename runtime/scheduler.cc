#include "runtime/scheduler.h"

#include <algorithm>
#include <utility>

#include "runtime/status.h"

namespace mqa {
namespace {

bool Contains(const std::vector<const SequenceGroup*>& groups, const SequenceGroup* group) {
  return std::find(groups.begin(), groups.end(), group) != groups.end();
}

// Whether the prefix this sequence shares with its group's leader has been computed.
bool PrefixReady(const SequenceGroup& group, Sequence& seq) {
  if (seq.prefix_owner_seq_id() < 0) return true;
  const Sequence* owner = group.FindSeq(seq.prefix_owner_seq_id());
  if (owner != nullptr && !owner->finished() &&
      owner->num_computed_tokens() < seq.prefix_owner_tokens()) {
    return false;
  }
  seq.set_prefix_owner(-1, 0);
  return true;
}

// Every unfinished sequence needs exactly its one newest token computed.
bool IsDecoding(const SequenceGroup& group) {
  for (const Sequence* seq : group.UnfinishedSeqs()) {
    if (seq->num_uncomputed_tokens() != 1 || seq->prefix_owner_seq_id() >= 0) return false;
  }
  return true;
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, BlockManager* block_manager)
    : options_(options), block_manager_(block_manager) {
  MQA_CHECK(options_.max_num_seqs > 0);
  MQA_CHECK(options_.max_num_batched_tokens > 0);
}

void Scheduler::AddGroup(std::unique_ptr<SequenceGroup> group) {
  for (const auto& seq : group->seqs()) {
    MQA_CHECK(seq->status() == SequenceStatus::kWaiting);
    MQA_CHECK(!block_manager_->HasBlockTable(seq->seq_id()));
  }
  InsertOrdered(waiting_, std::move(group));
}

bool Scheduler::Before(const SequenceGroup& a, const SequenceGroup& b) const {
  if (options_.priority && a.params().priority != b.params().priority) {
    return a.params().priority < b.params().priority;
  }
  return a.arrival_order() < b.arrival_order();
}

void Scheduler::InsertOrdered(std::deque<std::unique_ptr<SequenceGroup>>& queue,
                              std::unique_ptr<SequenceGroup> group) const {
  auto pos = std::find_if(queue.begin(), queue.end(),
                          [&](const auto& g) { return Before(*group, *g); });
  queue.insert(pos, std::move(group));
}

std::unique_ptr<SequenceGroup> Scheduler::Remove(const std::string& request_id) {
  for (auto* queue : {&waiting_, &running_}) {
    for (auto it = queue->begin(); it != queue->end(); ++it) {
      if ((*it)->request_id() != request_id) continue;
      std::unique_ptr<SequenceGroup> group = std::move(*it);
      queue->erase(it);
      for (const auto& seq : group->seqs()) {
        if (block_manager_->HasBlockTable(seq->seq_id())) {
          block_manager_->Free(seq->seq_id());
          released_seq_ids_.push_back(seq->seq_id());
        }
      }
      return group;
    }
  }
  return nullptr;
}

int Scheduler::NumRunningSeqs() const {
  int n = 0;
  for (const auto& group : running_) n += group->MaxRunningSeqs();
  return n;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  token_budget_ = options_.max_num_batched_tokens;
  prompt_rows_budget_ = options_.max_prompt_logprob_rows;
  in_step_.clear();
  preempted_in_step_.clear();

  // Running requests: decodes first, so a long prompt's chunks take only what they leave.
  std::vector<SequenceGroup*> decoding;
  std::vector<SequenceGroup*> prefilling;
  for (const auto& group : running_) {
    (IsDecoding(*group) ? decoding : prefilling).push_back(group.get());
  }
  for (auto* phase : {&decoding, &prefilling}) {
    for (SequenceGroup* group : *phase) {
      if (Contains(preempted_in_step_, group)) continue;
      ScheduleGroup(*group, /*may_preempt=*/true, out);
    }
  }

  // New (or preempted) requests in scheduling order, unless this step had to preempt: the blocks
  // are short, and readmitting now would only thrash.
  if (preempted_in_step_.empty()) {
    int running_seqs = NumRunningSeqs();
    while (!waiting_.empty() && token_budget_ > 0) {
      SequenceGroup& group = *waiting_.front();
      if (running_seqs + group.MaxRunningSeqs() > options_.max_num_seqs) break;
      if (!options_.enable_chunked_prefill &&
          group.UnfinishedSeqs().front()->num_tokens() > token_budget_) {
        break;
      }
      const AllocStatus status = block_manager_->CanAllocate(group);
      if (status == AllocStatus::kNever) {
        out.refused.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        continue;
      }
      if (status == AllocStatus::kLater) break;
      block_manager_->Allocate(group);
      running_seqs += group.MaxRunningSeqs();
      std::unique_ptr<SequenceGroup> admitted = std::move(waiting_.front());
      waiting_.pop_front();
      // FCFS keeps admission order (the step's order, and whom preemption evicts first: the
      // last); priority scheduling keeps the running list in its order.
      if (options_.priority) {
        InsertOrdered(running_, std::move(admitted));
      } else {
        running_.push_back(std::move(admitted));
      }
      MQA_CHECK(ScheduleGroup(group, /*may_preempt=*/false, out));
    }
  }

  out.num_preempted = static_cast<int>(preempted_in_step_.size());
  FinalizeStepInput(out);
  out.input.finished_seq_ids = std::move(released_seq_ids_);
  released_seq_ids_.clear();
  return out;
}

bool Scheduler::ScheduleGroup(SequenceGroup& group, bool may_preempt, SchedulerOutput& out) {
  std::vector<std::pair<Sequence*, int>> plan;
  std::vector<Sequence*> ending;  // sequences whose last token is computed: they need its slot
  const bool decoding = IsDecoding(group);
  if (decoding) {
    std::vector<Sequence*> seqs = group.UnfinishedSeqs();
    // All samples of a request decode together.
    if (static_cast<int>(seqs.size()) > token_budget_) return true;
    for (Sequence* seq : seqs) plan.emplace_back(seq, 1);
  } else {
    int budget = token_budget_;
    int rows_budget = prompt_rows_budget_;
    for (Sequence* seq : group.UnfinishedSeqs()) {
      if (budget == 0) break;
      if (!PrefixReady(group, *seq)) continue;
      const int remaining = seq->num_uncomputed_tokens();
      int chunk = std::min(remaining, budget);
      if (group.NeedsPromptLogprobs()) chunk = std::min(chunk, rows_budget);
      if (chunk <= 0) continue;
      if (!options_.enable_chunked_prefill && chunk < remaining) continue;
      plan.emplace_back(seq, chunk);
      budget -= chunk;
      if (group.NeedsPromptLogprobs()) rows_budget -= chunk;
    }
  }
  if (plan.empty()) return true;
  for (const auto& [seq, chunk] : plan) {
    if (chunk == seq->num_uncomputed_tokens()) ending.push_back(seq);
  }

  while (block_manager_->NumBlocksToAppend(ending) > block_manager_->NumFreeBlocks()) {
    // Newly admitted requests hold blocks for all their tokens already.
    MQA_CHECK(may_preempt);
    SequenceGroup* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      SequenceGroup* candidate = it->get();
      if (candidate == &group || Contains(in_step_, candidate)) continue;
      victim = candidate;
      break;
    }
    if (victim == nullptr || Before(*victim, group)) {
      Preempt(group);
      return false;
    }
    Preempt(*victim);
  }

  for (const auto& [seq, chunk] : plan) {
    if (chunk == seq->num_uncomputed_tokens()) {
      if (std::optional<BlockCopy> copy = block_manager_->AppendSlot(*seq)) {
        out.input.block_copies.push_back(*copy);
      }
    }
    std::vector<int32_t> draft;
    if (decoding) draft = Speculate(group, *seq);
    token_budget_ -= chunk + static_cast<int>(draft.size());
    prompt_rows_budget_ -= static_cast<int>(draft.size());
    AddToStep(group, *seq, chunk, out, std::move(draft));
  }
  in_step_.push_back(&group);
  return true;
}

void Scheduler::Preempt(SequenceGroup& group) {
  for (Sequence* seq : group.UnfinishedSeqs()) {
    block_manager_->Free(seq->seq_id());
    released_seq_ids_.push_back(seq->seq_id());
    seq->set_num_computed_tokens(0);
    seq->set_prefix_owner(-1, 0);
    seq->set_status(SequenceStatus::kWaiting);
  }
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& g) { return g.get() == &group; });
  MQA_CHECK(it != running_.end());
  std::unique_ptr<SequenceGroup> owned = std::move(*it);
  running_.erase(it);
  // Back into the waiting queue at its place in scheduling order (normally the front).
  InsertOrdered(waiting_, std::move(owned));
  preempted_in_step_.push_back(&group);
  ++num_preemptions_;
}

std::vector<int32_t> Scheduler::Speculate(const SequenceGroup& group, const Sequence& seq) {
  const SpeculativeConfig& config = options_.speculative;
  if (!config.enabled()) return {};
  // Each accepted draft and the token after the last one are output tokens: the drafts stop one
  // short of max_tokens and of the longest sequence.
  int most = std::min({config.num_speculative_tokens, token_budget_ - 1, prompt_rows_budget_,
                       group.params().max_tokens - seq.num_output_tokens() - 1});
  if (options_.max_model_len > 0)
    most = std::min(most, options_.max_model_len - seq.num_tokens() - 1);
  if (most <= 0) return {};
  std::vector<int32_t> draft = ProposeNgramDraft(seq.tokens(), config, most);
  if (draft.empty()) return draft;
  const int num_tokens = seq.num_tokens() + static_cast<int>(draft.size());
  // Speculation never preempts: without free blocks the step is an ordinary decode.
  if (block_manager_->NumBlocksToReserve(seq, num_tokens) > block_manager_->NumFreeBlocks()) {
    return {};
  }
  block_manager_->Reserve(seq, num_tokens);
  return draft;
}

void Scheduler::AddToStep(SequenceGroup& group, Sequence& seq, int num_tokens, SchedulerOutput& out,
                          std::vector<int32_t> draft) {
  StepInput& in = out.input;
  if (in.query_start.empty()) in.query_start.push_back(0);
  const int start = seq.num_computed_tokens();
  const auto num_draft = static_cast<int>(draft.size());
  // The sequence's tokens, then the drafts at the positions after them.
  for (int p = start; p < start + num_tokens + num_draft; ++p) {
    in.token_ids.push_back(p < start + num_tokens ? seq.tokens()[p]
                                                  : draft[p - start - num_tokens]);
    in.positions.push_back(p);
    in.slot_mapping.push_back(block_manager_->Slot(seq.seq_id(), p));
  }
  in.seq_ids.push_back(seq.seq_id());
  in.query_start.push_back(in.num_tokens());
  in.context_lens.push_back(start + num_tokens + num_draft);
  ScheduledSeq scheduled{&group, &seq, num_tokens, -1};
  scheduled.first_position = start;
  if (group.NeedsPromptLogprobs()) {
    // Every computed position before the prompt's last scores the token after it.
    const int end = std::min(start + num_tokens, seq.prompt_len() - 1);
    scheduled.prompt_rows_index = static_cast<int>(in.logits_rows.size());
    for (int p = start; p < end; ++p) {
      in.logits_rows.push_back(in.num_tokens() - num_tokens + (p - start));
      ++scheduled.num_prompt_rows;
    }
    // A prompt's last token alone (scheduled like a decode) adds no prompt row.
    prompt_rows_budget_ -= scheduled.num_prompt_rows;
  }
  if (start + num_tokens == seq.num_tokens()) {
    scheduled.logits_index = static_cast<int>(in.logits_rows.size());
    // Before the fork, the prompt's last row yields every sample's first token.
    if (!group.forked()) scheduled.num_draws = group.params().n;
    const int last_row = in.num_tokens() - 1 - num_draft;
    for (int d = 0; d < scheduled.num_draws; ++d) in.logits_rows.push_back(last_row);
    for (int i = 1; i <= num_draft; ++i) in.logits_rows.push_back(last_row + i);
  }
  scheduled.draft = std::move(draft);
  out.scheduled.push_back(std::move(scheduled));
}

void Scheduler::FinalizeStepInput(SchedulerOutput& out) const {
  StepInput& in = out.input;
  if (in.query_start.empty()) in.query_start.push_back(0);
  int max_blocks = 0;
  for (int64_t seq_id : in.seq_ids) {
    max_blocks = std::max(max_blocks, static_cast<int>(block_manager_->BlockTable(seq_id).size()));
  }
  in.max_blocks_per_seq = max_blocks;
  in.block_tables.assign(static_cast<size_t>(in.num_seqs()) * max_blocks, 0);
  for (int s = 0; s < in.num_seqs(); ++s) {
    const std::vector<int32_t>& table = block_manager_->BlockTable(in.seq_ids[s]);
    std::copy(table.begin(), table.end(), in.block_tables.begin() + s * max_blocks);
  }
}

void Scheduler::OnStepExecuted(const SchedulerOutput& output) {
  for (const ScheduledSeq& s : output.scheduled) {
    s.seq->set_num_computed_tokens(s.seq->num_computed_tokens() + s.num_tokens);
    block_manager_->MarkComputed(*s.seq);
  }
}

void Scheduler::OnDraftsChecked(Sequence& seq) {
  seq.set_num_computed_tokens(seq.num_tokens() - 1);
  block_manager_->MarkComputed(seq);
  block_manager_->Trim(seq);
}

Sequence* Scheduler::Fork(SequenceGroup& group, const Sequence& parent, int64_t new_seq_id,
                          int sample_index) {
  std::unique_ptr<Sequence> child = parent.Fork(new_seq_id, sample_index, group.seed());
  block_manager_->Fork(parent, *child);
  Sequence* raw = child.get();
  group.AddSeq(std::move(child));
  return raw;
}

void Scheduler::FinishSeq(Sequence& seq, FinishReason reason) {
  seq.Finish(reason);
  if (block_manager_->HasBlockTable(seq.seq_id())) {
    block_manager_->Free(seq.seq_id());
    released_seq_ids_.push_back(seq.seq_id());
  }
}

std::vector<std::unique_ptr<SequenceGroup>> Scheduler::TakeFinishedGroups() {
  std::vector<std::unique_ptr<SequenceGroup>> finished;
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->finished()) {
      finished.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return finished;
}

void Scheduler::CheckInvariants() const {
  block_manager_->CheckInvariants();
  // The waiting queue in scheduling order; so is the running list under priority scheduling.
  for (size_t i = 1; i < waiting_.size(); ++i) MQA_CHECK(!Before(*waiting_[i], *waiting_[i - 1]));
  if (options_.priority) {
    for (size_t i = 1; i < running_.size(); ++i) MQA_CHECK(!Before(*running_[i], *running_[i - 1]));
  }
  for (const auto& group : waiting_) {
    for (const auto& seq : group->seqs()) {
      MQA_CHECK(!block_manager_->HasBlockTable(seq->seq_id()));
      MQA_CHECK(seq->finished() || seq->status() == SequenceStatus::kWaiting);
    }
  }
  int seqs = 0;
  for (const auto& group : running_) {
    seqs += group->MaxRunningSeqs();
    for (const auto& seq : group->seqs()) {
      MQA_CHECK(block_manager_->HasBlockTable(seq->seq_id()) == !seq->finished());
      MQA_CHECK(seq->finished() || seq->status() == SequenceStatus::kRunning);
      if (!seq->finished()) {
        MQA_CHECK(seq->num_computed_tokens() < seq->num_tokens());
        MQA_CHECK(static_cast<int>(block_manager_->BlockTable(seq->seq_id()).size()) >=
                  block_manager_->BlocksFor(seq->num_tokens()) - 1);
      }
    }
  }
  MQA_CHECK(seqs <= options_.max_num_seqs);
}

}  // namespace mqa
