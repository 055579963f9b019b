#include "runtime/sequence.h"

#include <utility>

#include "runtime/status.h"

namespace mqa {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "unknown";
}

uint64_t SampleSeed(uint64_t request_seed, int sample_index) {
  // SplitMix64 finaliser over (seed, index): nearby seeds and indices give unrelated streams.
  uint64_t z = request_seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(sample_index) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Sequence::Sequence(int64_t seq_id, int sample_index, std::vector<int32_t> prompt,
                   uint64_t request_seed)
    : seq_id_(seq_id),
      sample_index_(sample_index),
      tokens_(std::move(prompt)),
      prompt_len_(static_cast<int>(tokens_.size())),
      rng_(SampleSeed(request_seed, sample_index)) {}

std::unique_ptr<Sequence> Sequence::Fork(int64_t new_seq_id, int sample_index,
                                         uint64_t request_seed) const {
  auto child = std::make_unique<Sequence>(new_seq_id, sample_index, tokens_, request_seed);
  child->prompt_len_ = prompt_len_;
  child->num_computed_tokens_ = num_computed_tokens_;
  child->status_ = status_;
  return child;
}

SequenceGroup::SequenceGroup(std::string request_id, int64_t arrival_order, int64_t first_seq_id,
                             std::vector<int32_t> prompt, SamplingParams params, uint64_t seed)
    : request_id_(std::move(request_id)),
      arrival_order_(arrival_order),
      params_(std::move(params)),
      seed_(seed) {
  MQA_CHECK(!prompt.empty());
  seqs_.push_back(std::make_unique<Sequence>(first_seq_id, 0, std::move(prompt), seed_));
}

std::vector<Sequence*> SequenceGroup::UnfinishedSeqs() const {
  std::vector<Sequence*> out;
  for (const auto& seq : seqs_) {
    if (!seq->finished()) out.push_back(seq.get());
  }
  return out;
}

Sequence* SequenceGroup::FindSeq(int64_t seq_id) const {
  for (const auto& seq : seqs_) {
    if (seq->seq_id() == seq_id) return seq.get();
  }
  return nullptr;
}

int SequenceGroup::MaxRunningSeqs() const {
  if (!forked()) return params_.n;
  return static_cast<int>(UnfinishedSeqs().size());
}

bool SequenceGroup::finished() const {
  if (!forked()) return seqs_.front()->finished();
  for (const auto& seq : seqs_) {
    if (!seq->finished()) return false;
  }
  return true;
}

}  // namespace mqa
