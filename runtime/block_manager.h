// BlockManager: rank 0's authority over the paged KV cache's physical blocks.
//
// Each sequence holding KV has a block table (logical block i -> physical block). Blocks are
// reference-counted: samples of one request share the prompt's blocks after a fork, and a shared
// partial block is copied on write (AppendSlot returns the BlockCopy the runner must apply before
// the forward pass). With prefix caching, a full block whose KV has been computed is registered
// under hash(parent block's hash, its tokens); later sequences with the same prefix reuse it.
// A cached block whose reference count drops to 0 stays cached (and counts as free) until it is
// evicted, least recently released first, when a fresh block is needed.
//
// Thread ownership: the engine thread only. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "runtime/model_runner.h"
#include "runtime/sequence.h"

namespace mqa {

struct BlockManagerOptions {
  int num_blocks = 0;
  int block_size = 16;  // tokens per block; the CUDA kernels support 8, 16 and 32
  // Admission (CanAllocate) keeps this many blocks free for running sequences to grow into, so
  // that a new prompt does not immediately force a preemption.
  int watermark_blocks = 0;
  bool enable_prefix_caching = false;
};

enum class AllocStatus : uint8_t {
  kOk,     // can allocate now
  kLater,  // not enough free blocks now
  kNever,  // needs more blocks than the cache has (minus the watermark)
};

class BlockManager {
 public:
  explicit BlockManager(BlockManagerOptions options);

  int block_size() const { return options_.block_size; }
  int num_blocks() const { return options_.num_blocks; }
  bool prefix_caching() const { return options_.enable_prefix_caching; }

  // Blocks to hold `num_tokens` tokens.
  int BlocksFor(int num_tokens) const { return (num_tokens + block_size() - 1) / block_size(); }

  // Whether the unfinished sequences of a waiting group fit (conservatively, ignoring cache hits).
  AllocStatus CanAllocate(const SequenceGroup& group) const;
  // Gives every unfinished sequence of a waiting group a block table for all its tokens. The
  // first unfinished sequence (the leader) reuses cached full blocks (setting its
  // num_computed_tokens past them; the block holding its last token is never reused, so at least
  // one token is computed; none is reused while the group NeedsPromptLogprobs); the others share
  // the leader's full prompt blocks and wait for the leader to compute them
  // (Sequence::set_prefix_owner). Requires CanAllocate() == kOk.
  void Allocate(SequenceGroup& group);

  // Free blocks needed so that every sequence in `seqs` can AppendSlot.
  int NumBlocksToAppend(absl::Span<Sequence* const> seqs) const;
  // Makes the slot of the sequence's last token writable: a new block when the table is full, a
  // copy when the last block is shared (returned; the runner copies src to dst before the step).
  // Requires a free block when one is needed (NumBlocksToAppend).
  std::optional<BlockCopy> AppendSlot(const Sequence& seq);
  // Speculative decoding (runtime/speculative.h): a sequence whose step also computes draft
  // tokens after its last one holds blocks for them from the scheduler's decision until the
  // engine has checked them. Fresh blocks needed for the table to hold `num_tokens` tokens (its
  // last block must be its own: AppendSlot ran first), and their allocation (requires that many
  // free blocks).
  int NumBlocksToReserve(const Sequence& seq, int num_tokens) const;
  void Reserve(const Sequence& seq, int num_tokens);
  // Releases the blocks past those that hold the sequence's tokens (drafts that were rejected).
  void Trim(const Sequence& seq);
  // `child` shares all of `parent`'s blocks.
  void Fork(const Sequence& parent, const Sequence& child);
  // Releases the sequence's blocks (last block first, so that a prefix's tail is evicted first).
  // No-op for a sequence without a table.
  void Free(int64_t seq_id);
  // Registers the sequence's full, computed blocks in the prefix cache (after the step ran).
  void MarkComputed(const Sequence& seq);

  bool HasBlockTable(int64_t seq_id) const { return tables_.contains(seq_id); }
  const std::vector<int32_t>& BlockTable(int64_t seq_id) const;
  // Physical slot (block * block_size + offset) of a token position.
  int32_t Slot(int64_t seq_id, int position) const;
  // Whether the block holding `position` in the sequence's table is referenced by this sequence
  // only (false when the table has no such block): a write there cannot reach another sequence.
  bool OwnsBlockAt(int64_t seq_id, int position) const;

  // Unreferenced blocks: never used or released, plus cached blocks that can be evicted.
  int NumFreeBlocks() const { return static_cast<int>(free_list_.size() + evictor_.size()); }
  int NumCachedFreeBlocks() const { return static_cast<int>(evictor_.size()); }
  // Fraction of blocks referenced by some sequence, 0..1.
  double Usage() const;
  int64_t prefix_cache_queried_blocks() const { return cache_queries_; }
  int64_t prefix_cache_hit_blocks() const { return cache_hits_; }
  // vLLM's prefix-cache counters, in tokens: the prompt tokens of the groups looked up in the
  // cache, and those found there.
  int64_t prefix_cache_queried_tokens() const { return cache_query_tokens_; }
  int64_t prefix_cache_hit_tokens() const { return cache_hits_ * block_size(); }

  // Forgets every cached block no sequence holds (vLLM's reset_prefix_cache): they return to the
  // free list unhashed, so later prompts find none of them. Blocks in use keep their entries (the
  // sequences holding them still share them). Returns how many were forgotten.
  int64_t ResetPrefixCache();

  // Aborts with a message when a reference count disagrees with the tables, a block is both
  // free and referenced, or the cache index is inconsistent. For tests and debug builds.
  void CheckInvariants() const;

 private:
  struct Block {
    int ref_count = 0;
    bool hashed = false;  // registered in cache_
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // a hashed block's tokens, to rule out hash collisions
    uint64_t last_release = 0;    // LRU clock when its ref count last dropped to 0
  };
  struct Table {
    std::vector<int32_t> blocks;
    // Hash chain of the first hashes.size() blocks (full and computed).
    std::vector<uint64_t> hashes;
  };

  int32_t AllocateFresh();
  void Release(int32_t block);
  // The cached block holding these tokens after this parent, if any.
  std::optional<int32_t> Lookup(uint64_t hash, uint64_t parent_hash,
                                absl::Span<const int32_t> tokens) const;
  void Unhash(int32_t block);

  BlockManagerOptions options_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_list_;                  // ref 0, not cached
  std::set<std::pair<uint64_t, int32_t>> evictor_;  // ref 0, cached: (last_release, block)
  absl::flat_hash_map<uint64_t, int32_t> cache_;    // hash -> block
  absl::flat_hash_map<int64_t, Table> tables_;      // seq id -> table
  uint64_t clock_ = 0;
  int64_t cache_queries_ = 0;
  int64_t cache_hits_ = 0;
  int64_t cache_query_tokens_ = 0;
};

// The prefix-cache key of a full block: a hash of the parent's key and the block's tokens.
uint64_t HashBlockTokens(uint64_t parent_hash, absl::Span<const int32_t> tokens);

}  // namespace mqa
