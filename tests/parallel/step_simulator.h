// A toy scheduler for codec and channel tests: random StepInputs shaped like the engine's (new
// sequences with chunked prefill, decoding, finished and preempted sequences, re-scheduling with
// fresh blocks, copy-on-write copies), over a shuffled pool of physical blocks (so block 0 is
// used too). Now and then a step has non-consecutive positions or an unusual slot, to exercise
// the codec's explicit fallbacks. Deterministic for a seed: every rank can run its own copy.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "runtime/model_runner.h"

namespace mqa {

class StepSimulator {
 public:
  StepSimulator(uint64_t seed, int block_size, int num_blocks, int max_prompt = 300,
                int max_chunk = 64)
      : rng_(seed), block_size_(block_size), max_prompt_(max_prompt), max_chunk_(max_chunk) {
    for (int b = 0; b < num_blocks; ++b) free_.push_back(b);
    std::shuffle(free_.begin(), free_.end(), rng_);
  }

  StepInput Next() {
    StepInput in;
    // Finish some sequences; preempt some (their blocks return to the pool; half of the time the
    // engine does not report the free, so the re-scheduled table must replace the mirror's).
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      Seq& seq = it->second;
      const int roll = Uniform(0, 99);
      if (roll < 8 && seq.prompt_left == 0) {
        Release(seq);
        in.finished_seq_ids.push_back(it->first);
        it = seqs_.erase(it);
        continue;
      }
      if (roll < 12 && !seq.table.empty()) {
        Release(seq);
        if (Uniform(0, 1) == 0) in.finished_seq_ids.push_back(it->first);
        seq.prompt_left = seq.context;  // recompute the whole context
        seq.context = 0;
      }
      ++it;
    }
    const int new_seqs = Uniform(0, seqs_.size() < 12 ? 3 : 0);
    for (int i = 0; i < new_seqs; ++i)
      seqs_[next_id_++] = Seq{.prompt_left = Uniform(1, max_prompt_)};

    in.query_start.push_back(0);
    for (auto& [id, seq] : seqs_) {
      const int count = seq.prompt_left > 0 ? std::min(seq.prompt_left, Uniform(1, max_chunk_)) : 1;
      if (!Reserve(seq, seq.context + count)) continue;  // out of blocks: wait
      in.seq_ids.push_back(id);
      for (int i = 0; i < count; ++i) {
        const int pos = seq.context + i;
        in.token_ids.push_back(Uniform(0, 49151));
        in.positions.push_back(pos);
        in.slot_mapping.push_back(seq.table[pos / block_size_] * block_size_ + pos % block_size_);
      }
      seq.context += count;
      seq.prompt_left = std::max(0, seq.prompt_left - count);
      in.context_lens.push_back(seq.context);
      in.query_start.push_back(in.num_tokens());
      in.logits_rows.push_back(in.num_tokens() - 1);
    }
    int max_blocks = 0;
    for (int64_t id : in.seq_ids) max_blocks = std::max<int>(max_blocks, seqs_[id].table.size());
    max_blocks += Uniform(0, 2);  // the engine may pad further
    in.max_blocks_per_seq = max_blocks;
    in.block_tables.assign(in.seq_ids.size() * max_blocks, 0);
    for (size_t s = 0; s < in.seq_ids.size(); ++s) {
      const Seq& seq = seqs_[in.seq_ids[s]];
      std::copy(seq.table.begin(), seq.table.end(), in.block_tables.begin() + s * max_blocks);
    }
    if (Uniform(0, 9) == 0 && !free_.empty()) {
      in.block_copies.push_back(BlockCopy{Uniform(0, 99), free_.back()});
    }
    if (Uniform(0, 9) == 0 && in.num_tokens() > 1) {
      // Odd but legal for the codec: a token written to another slot, a repeated position.
      in.slot_mapping[Uniform(0, in.num_tokens() - 1)] += 1;
      const int t = Uniform(1, in.num_tokens() - 1);
      in.positions[t] = in.positions[t - 1];
    }
    return in;
  }

 private:
  struct Seq {
    int prompt_left = 0;
    int context = 0;
    std::vector<int32_t> table;
  };

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  void Release(Seq& seq) {
    free_.insert(free_.end(), seq.table.begin(), seq.table.end());
    std::shuffle(free_.begin(), free_.end(), rng_);
    seq.table.clear();
  }

  bool Reserve(Seq& seq, int tokens) {
    const size_t needed = (tokens + block_size_ - 1) / block_size_;
    if (needed > seq.table.size() + free_.size()) return false;
    while (seq.table.size() < needed) {
      seq.table.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }

  std::mt19937_64 rng_;
  int block_size_;
  int max_prompt_;
  int max_chunk_;
  std::vector<int32_t> free_;
  std::map<int64_t, Seq> seqs_;
  int64_t next_id_ = 1000;
};

inline void ExpectSameStepInput(const StepInput& want, const StepInput& got) {
  EXPECT_EQ(want.seq_ids, got.seq_ids);
  EXPECT_EQ(want.token_ids, got.token_ids);
  EXPECT_EQ(want.positions, got.positions);
  EXPECT_EQ(want.query_start, got.query_start);
  EXPECT_EQ(want.context_lens, got.context_lens);
  EXPECT_EQ(want.slot_mapping, got.slot_mapping);
  EXPECT_EQ(want.block_tables, got.block_tables);
  EXPECT_EQ(want.max_blocks_per_seq, got.max_blocks_per_seq);
  EXPECT_EQ(want.logits_rows, got.logits_rows);
  ASSERT_EQ(want.block_copies.size(), got.block_copies.size());
  for (size_t i = 0; i < want.block_copies.size(); ++i) {
    EXPECT_EQ(want.block_copies[i].src, got.block_copies[i].src);
    EXPECT_EQ(want.block_copies[i].dst, got.block_copies[i].dst);
  }
  EXPECT_EQ(want.finished_seq_ids, got.finished_seq_ids);
}

}  // namespace mqa
