#include "runtime/block_manager.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

namespace mqa {
namespace {

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int n) {
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 1000);
  return tokens;
}

std::unique_ptr<SequenceGroup> MakeGroup(int64_t id, std::vector<int32_t> prompt, int n = 1) {
  SamplingParams params;
  params.n = n;
  return std::make_unique<SequenceGroup>("r" + std::to_string(id), id, id * 100, std::move(prompt),
                                         params, /*seed=*/id);
}

BlockManagerOptions Options(int num_blocks, int block_size, bool prefix_caching,
                            int watermark = 0) {
  BlockManagerOptions options;
  options.num_blocks = num_blocks;
  options.block_size = block_size;
  options.enable_prefix_caching = prefix_caching;
  options.watermark_blocks = watermark;
  return options;
}

// Computes all of a freshly allocated sequence's tokens, as a step would.
void ComputeAll(BlockManager& bm, Sequence& seq) {
  seq.set_num_computed_tokens(seq.num_tokens());
  bm.MarkComputed(seq);
}

TEST(BlockManager, AllocateAndFreeReturnEveryBlock) {
  std::mt19937_64 rng(1);
  BlockManager bm(Options(10, 8, false));
  auto group = MakeGroup(1, RandomTokens(rng, 21));
  ASSERT_EQ(bm.CanAllocate(*group), AllocStatus::kOk);
  bm.Allocate(*group);
  const Sequence& seq = *group->seqs()[0];
  EXPECT_EQ(bm.BlockTable(seq.seq_id()).size(), 3u);
  EXPECT_EQ(bm.NumFreeBlocks(), 7);
  EXPECT_EQ(seq.num_computed_tokens(), 0);
  EXPECT_EQ(bm.Slot(seq.seq_id(), 9), bm.BlockTable(seq.seq_id())[1] * 8 + 1);
  bm.CheckInvariants();
  bm.Free(seq.seq_id());
  EXPECT_EQ(bm.NumFreeBlocks(), 10);
  EXPECT_FALSE(bm.HasBlockTable(seq.seq_id()));
  bm.CheckInvariants();
}

TEST(BlockManager, CanAllocateHonoursWatermarkAndSize) {
  std::mt19937_64 rng(2);
  BlockManager bm(Options(10, 8, false, /*watermark=*/2));
  EXPECT_EQ(bm.CanAllocate(*MakeGroup(1, RandomTokens(rng, 8 * 8 + 1))), AllocStatus::kNever);
  auto big = MakeGroup(2, RandomTokens(rng, 8 * 6));
  ASSERT_EQ(bm.CanAllocate(*big), AllocStatus::kOk);
  bm.Allocate(*big);  // 4 free left
  EXPECT_EQ(bm.CanAllocate(*MakeGroup(3, RandomTokens(rng, 8 * 3))), AllocStatus::kLater);
  EXPECT_EQ(bm.CanAllocate(*MakeGroup(4, RandomTokens(rng, 8 * 2))), AllocStatus::kOk);
}

TEST(BlockManager, ForkSharesBlocksAndCopiesOnWrite) {
  std::mt19937_64 rng(3);
  BlockManager bm(Options(10, 8, false));
  auto group = MakeGroup(1, RandomTokens(rng, 12));  // one full block and a partial one
  bm.Allocate(*group);
  Sequence& parent = *group->seqs()[0];
  ComputeAll(bm, parent);
  std::unique_ptr<Sequence> child = parent.Fork(999, 1, group->seed());
  bm.Fork(parent, *child);
  EXPECT_EQ(bm.NumFreeBlocks(), 8);
  EXPECT_EQ(bm.BlockTable(child->seq_id()), bm.BlockTable(parent.seq_id()));
  // OwnsBlockAt (decode lookahead's check that a write there reaches no other sequence): the
  // shared blocks are nobody's own; a position past the table has no block.
  EXPECT_FALSE(bm.OwnsBlockAt(parent.seq_id(), 12));
  EXPECT_FALSE(bm.OwnsBlockAt(child->seq_id(), 3));
  EXPECT_FALSE(bm.OwnsBlockAt(parent.seq_id(), 16));
  EXPECT_FALSE(bm.OwnsBlockAt(12345, 0));
  parent.AppendToken(5);
  child->AppendToken(6);
  std::vector<Sequence*> both = {&parent, child.get()};
  EXPECT_EQ(bm.NumBlocksToAppend(both), 1);
  const int32_t shared = bm.BlockTable(parent.seq_id())[1];
  std::optional<BlockCopy> copy = bm.AppendSlot(parent);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, shared);
  EXPECT_EQ(copy->dst, bm.BlockTable(parent.seq_id())[1]);
  EXPECT_NE(copy->dst, shared);
  EXPECT_FALSE(bm.AppendSlot(*child).has_value());  // now the child's alone in the old block
  EXPECT_EQ(bm.BlockTable(child->seq_id())[1], shared);
  EXPECT_TRUE(bm.OwnsBlockAt(parent.seq_id(), 13));  // its copy
  EXPECT_TRUE(bm.OwnsBlockAt(child->seq_id(), 13));  // the old block, no longer shared
  EXPECT_FALSE(bm.OwnsBlockAt(child->seq_id(), 7));  // the full prompt block, still shared
  EXPECT_EQ(bm.BlockTable(child->seq_id())[0], bm.BlockTable(parent.seq_id())[0]);
  bm.CheckInvariants();
  bm.Free(parent.seq_id());
  bm.Free(child->seq_id());
  EXPECT_EQ(bm.NumFreeBlocks(), 10);
  bm.CheckInvariants();
}

TEST(BlockManager, PrefixCacheReusesFullBlocksButNeverTheLastToken) {
  std::mt19937_64 rng(4);
  BlockManager bm(Options(12, 4, true));
  std::vector<int32_t> prompt = RandomTokens(rng, 14);  // blocks: 4 4 4 2
  auto a = MakeGroup(1, prompt);
  bm.Allocate(*a);
  ComputeAll(bm, *a->seqs()[0]);
  const std::vector<int32_t> a_table = bm.BlockTable(a->seqs()[0]->seq_id());
  bm.Free(a->seqs()[0]->seq_id());
  EXPECT_EQ(bm.NumFreeBlocks(), 12);
  EXPECT_EQ(bm.NumCachedFreeBlocks(), 3);

  // Same 14 tokens: 3 full blocks reused, 12 tokens computed already.
  auto b = MakeGroup(2, prompt);
  bm.Allocate(*b);
  const Sequence& sb = *b->seqs()[0];
  EXPECT_EQ(sb.num_computed_tokens(), 12);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bm.BlockTable(sb.seq_id())[i], a_table[i]);
  bm.CheckInvariants();

  // A 12-token prompt equal to the first three blocks: its last block holds its last token and
  // is not reused.
  auto c = MakeGroup(3, std::vector<int32_t>(prompt.begin(), prompt.begin() + 12));
  bm.Allocate(*c);
  const Sequence& sc = *c->seqs()[0];
  EXPECT_EQ(sc.num_computed_tokens(), 8);
  EXPECT_EQ(bm.BlockTable(sc.seq_id())[1], a_table[1]);
  EXPECT_NE(bm.BlockTable(sc.seq_id())[2], a_table[2]);

  // A different second block: only the first is shared.
  std::vector<int32_t> other = prompt;
  other[5] += 1;
  auto d = MakeGroup(4, other);
  bm.Allocate(*d);
  EXPECT_EQ(d->seqs()[0]->num_computed_tokens(), 4);
  bm.CheckInvariants();
  EXPECT_EQ(bm.prefix_cache_hit_blocks(), 3 + 2 + 1);
}

// ResetPrefixCache (vLLM's reset_prefix_cache): the cached blocks nobody holds are forgotten (a
// prompt that would have reused them computes everything again), those a running sequence holds
// stay shared, and the invariants hold throughout.
TEST(BlockManager, ResetPrefixCacheForgetsWhatNoSequenceHolds) {
  std::mt19937_64 rng(5);
  BlockManager bm(Options(16, 4, true));
  const std::vector<int32_t> freed_prompt = RandomTokens(rng, 13),
                             held_prompt = RandomTokens(rng, 9);
  auto a = MakeGroup(1, freed_prompt);
  bm.Allocate(*a);
  ComputeAll(bm, *a->seqs()[0]);
  bm.Free(a->seqs()[0]->seq_id());
  auto held = MakeGroup(2, held_prompt);
  bm.Allocate(*held);
  ComputeAll(bm, *held->seqs()[0]);
  EXPECT_EQ(bm.NumCachedFreeBlocks(), 3);
  EXPECT_EQ(bm.ResetPrefixCache(), 3);
  EXPECT_EQ(bm.NumCachedFreeBlocks(), 0);
  EXPECT_EQ(bm.NumFreeBlocks(), 16 - 3);  // the held sequence's three blocks
  bm.CheckInvariants();
  auto again = MakeGroup(3, freed_prompt);
  bm.Allocate(*again);
  EXPECT_EQ(again->seqs()[0]->num_computed_tokens(), 0) << "a forgotten block was reused";
  auto sharer = MakeGroup(4, held_prompt);
  bm.Allocate(*sharer);
  EXPECT_EQ(sharer->seqs()[0]->num_computed_tokens(), 8) << "a held block stopped being shared";
  bm.CheckInvariants();
  EXPECT_EQ(bm.ResetPrefixCache(), 0);
}

TEST(BlockManager, EvictsLeastRecentlyReleasedTailFirst) {
  std::mt19937_64 rng(5);
  BlockManager bm(Options(10, 4, true));
  std::vector<int32_t> p1 = RandomTokens(rng, 13);  // 3 full blocks + 1
  std::vector<int32_t> p2 = RandomTokens(rng, 13);
  auto a = MakeGroup(1, p1);
  bm.Allocate(*a);
  ComputeAll(bm, *a->seqs()[0]);
  auto b = MakeGroup(2, p2);
  bm.Allocate(*b);
  ComputeAll(bm, *b->seqs()[0]);
  bm.Free(a->seqs()[0]->seq_id());  // released first: evicted first, tail block first
  bm.Free(b->seqs()[0]->seq_id());
  EXPECT_EQ(bm.NumCachedFreeBlocks(), 6);
  EXPECT_EQ(bm.NumFreeBlocks(), 10);

  // 5 blocks of unrelated tokens: the 4 uncached free blocks, then a's last full block.
  auto c = MakeGroup(3, RandomTokens(rng, 4 * 5));
  bm.Allocate(*c);
  EXPECT_EQ(bm.NumCachedFreeBlocks(), 5);
  bm.CheckInvariants();
  bm.Free(c->seqs()[0]->seq_id());  // never computed: not cached
  EXPECT_EQ(bm.NumCachedFreeBlocks(), 5);

  auto a2 = MakeGroup(4, p1);
  bm.Allocate(*a2);
  EXPECT_EQ(a2->seqs()[0]->num_computed_tokens(), 8);  // blocks 0 and 1 of a survived
  auto b2 = MakeGroup(5, p2);
  bm.Allocate(*b2);
  EXPECT_EQ(b2->seqs()[0]->num_computed_tokens(), 12);  // all of b survived
  bm.CheckInvariants();
}

TEST(BlockManager, ReadmittedGroupSharesThePromptWithItsLeader) {
  std::mt19937_64 rng(6);
  BlockManager bm(Options(16, 4, false));
  auto group = MakeGroup(1, RandomTokens(rng, 10), /*n=*/3);
  Sequence& leader = *group->seqs()[0];
  for (int i = 1; i < 3; ++i) group->AddSeq(leader.Fork(100 + i, i, group->seed()));
  for (const auto& seq : group->seqs()) {
    for (int k = 0; k < 3 + seq->sample_index(); ++k) seq->AppendToken(7 + k);
  }
  // Lengths 13, 14, 15: leader 4 blocks; the others share the two full prompt blocks.
  ASSERT_EQ(bm.CanAllocate(*group), AllocStatus::kOk);
  bm.Allocate(*group);
  EXPECT_EQ(bm.NumFreeBlocks(), 16 - 4 - 2 - 2);
  for (int i = 1; i < 3; ++i) {
    const Sequence& seq = *group->seqs()[i];
    EXPECT_EQ(seq.num_computed_tokens(), 8);
    EXPECT_EQ(seq.prefix_owner_seq_id(), leader.seq_id());
    EXPECT_EQ(bm.BlockTable(seq.seq_id())[1], bm.BlockTable(leader.seq_id())[1]);
  }
  bm.CheckInvariants();
}

// Random operations on sequences; the invariants hold after each, and freeing everything
// returns every block.
TEST(BlockManager, RandomisedOperationsKeepInvariants) {
  for (bool caching : {false, true}) {
    std::mt19937_64 rng(caching ? 11 : 12);
    BlockManager bm(Options(48, 4, caching));
    std::vector<std::unique_ptr<SequenceGroup>> groups;
    std::vector<Sequence*> live;
    const std::vector<int32_t> shared_prefix = RandomTokens(rng, 9);
    int64_t next_id = 0;
    for (int op = 0; op < 4000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 3) {
        std::vector<int32_t> prompt = RandomTokens(rng, 1 + static_cast<int>(rng() % 14));
        if (rng() % 2) prompt.insert(prompt.begin(), shared_prefix.begin(), shared_prefix.end());
        auto group = MakeGroup(next_id++, prompt);
        if (bm.CanAllocate(*group) != AllocStatus::kOk) continue;
        bm.Allocate(*group);
        Sequence* seq = group->seqs()[0].get();
        ComputeAll(bm, *seq);
        live.push_back(seq);
        groups.push_back(std::move(group));
      } else if (kind < 6 && !live.empty()) {
        const size_t i = rng() % live.size();
        Sequence* seq = live[i];
        seq->AppendToken(static_cast<int32_t>(rng() % 3));
        if (bm.NumBlocksToAppend({&seq, 1}) > bm.NumFreeBlocks()) {
          bm.Free(seq->seq_id());  // as a preemption would
          live.erase(live.begin() + i);
          continue;
        }
        bm.AppendSlot(*seq);
        ComputeAll(bm, *seq);
      } else if (kind < 8 && !live.empty()) {
        Sequence* parent = live[rng() % live.size()];
        auto group = MakeGroup(next_id++, {1});
        std::unique_ptr<Sequence> child = parent->Fork(1000000 + next_id, 1, 0);
        bm.Fork(*parent, *child);
        live.push_back(child.get());
        group->AddSeq(std::move(child));
        groups.push_back(std::move(group));
      } else if (!live.empty()) {
        const size_t i = rng() % live.size();
        bm.Free(live[i]->seq_id());
        live.erase(live.begin() + i);
      }
      bm.CheckInvariants();
    }
    for (Sequence* seq : live) bm.Free(seq->seq_id());
    bm.CheckInvariants();
    EXPECT_EQ(bm.NumFreeBlocks(), 48);
    if (caching) EXPECT_GT(bm.prefix_cache_hit_blocks(), 0);
  }
}

}  // namespace
}  // namespace mqa
