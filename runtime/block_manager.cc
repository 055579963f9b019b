#include "runtime/block_manager.h"

#include <algorithm>

#include "runtime/status.h"

namespace mqa {
namespace {

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t HashBlockTokens(uint64_t parent_hash, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix(parent_hash + 0x9E3779B97F4A7C15ull);
  for (int32_t t : tokens) h = Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 1));
  return h;
}

BlockManager::BlockManager(BlockManagerOptions options) : options_(options) {
  MQA_CHECK(options_.num_blocks > 0);
  MQA_CHECK(options_.block_size > 0);
  MQA_CHECK(options_.watermark_blocks >= 0 && options_.watermark_blocks < options_.num_blocks);
  blocks_.resize(options_.num_blocks);
  free_list_.reserve(options_.num_blocks);
  // Popped from the back: hands out block 0 first.
  for (int32_t b = options_.num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

AllocStatus BlockManager::CanAllocate(const SequenceGroup& group) const {
  std::vector<Sequence*> seqs = group.UnfinishedSeqs();
  MQA_CHECK(!seqs.empty());
  const int shared = seqs.front()->prompt_len() / block_size();
  int needed = BlocksFor(seqs.front()->num_tokens());
  for (size_t i = 1; i < seqs.size(); ++i) needed += BlocksFor(seqs[i]->num_tokens()) - shared;
  if (needed > num_blocks() - options_.watermark_blocks) return AllocStatus::kNever;
  if (NumFreeBlocks() - needed < options_.watermark_blocks) return AllocStatus::kLater;
  return AllocStatus::kOk;
}

void BlockManager::Allocate(SequenceGroup& group) {
  std::vector<Sequence*> seqs = group.UnfinishedSeqs();
  MQA_CHECK(!seqs.empty());
  Sequence& leader = *seqs.front();
  MQA_CHECK(!tables_.contains(leader.seq_id()));
  Table& table = tables_[leader.seq_id()];
  const int bs = block_size();
  const int num_blocks_needed = BlocksFor(leader.num_tokens());

  // A prompt whose every position must yield logits (prompt log-probabilities) starts from
  // scratch; its blocks still enter the cache once computed.
  if (options_.enable_prefix_caching && !group.NeedsPromptLogprobs()) {
    // Only blocks that end before the last token: the last token is always computed, so that
    // the step yields its logits and never writes into a shared cached block.
    const int reusable = (leader.num_tokens() - 1) / bs;
    cache_query_tokens_ += leader.num_tokens();
    uint64_t parent = 0;
    for (int i = 0; i < reusable; ++i) {
      auto tokens = absl::MakeConstSpan(leader.tokens()).subspan(i * bs, bs);
      const uint64_t hash = HashBlockTokens(parent, tokens);
      ++cache_queries_;
      std::optional<int32_t> hit = Lookup(hash, parent, tokens);
      if (!hit.has_value()) break;
      ++cache_hits_;
      Block& block = blocks_[*hit];
      if (block.ref_count == 0) evictor_.erase({block.last_release, *hit});
      ++block.ref_count;
      table.blocks.push_back(*hit);
      table.hashes.push_back(hash);
      parent = hash;
    }
  }
  leader.set_num_computed_tokens(static_cast<int>(table.blocks.size()) * bs);
  leader.set_prefix_owner(-1, 0);
  while (static_cast<int>(table.blocks.size()) < num_blocks_needed) {
    table.blocks.push_back(AllocateFresh());
  }
  leader.set_status(SequenceStatus::kRunning);

  // The other samples (a group readmitted after preemption) share the leader's full prompt
  // blocks and compute the rest of their own tokens.
  const int shared = leader.prompt_len() / bs;
  for (size_t s = 1; s < seqs.size(); ++s) {
    Sequence& seq = *seqs[s];
    MQA_CHECK(!tables_.contains(seq.seq_id()));
    MQA_CHECK(seq.num_tokens() > shared * bs);
    Table& own = tables_[seq.seq_id()];
    const Table& lead = tables_.at(leader.seq_id());
    for (int i = 0; i < shared; ++i) {
      own.blocks.push_back(lead.blocks[i]);
      ++blocks_[lead.blocks[i]].ref_count;
    }
    own.hashes.assign(lead.hashes.begin(),
                      lead.hashes.begin() + std::min<size_t>(shared, lead.hashes.size()));
    while (static_cast<int>(own.blocks.size()) < BlocksFor(seq.num_tokens())) {
      own.blocks.push_back(AllocateFresh());
    }
    seq.set_num_computed_tokens(shared * bs);
    if (shared * bs > leader.num_computed_tokens()) {
      seq.set_prefix_owner(leader.seq_id(), shared * bs);
    } else {
      seq.set_prefix_owner(-1, 0);
    }
    seq.set_status(SequenceStatus::kRunning);
  }
}

int BlockManager::NumBlocksToAppend(absl::Span<Sequence* const> seqs) const {
  absl::flat_hash_map<int32_t, int> released;  // references dropped by earlier copies
  int needed = 0;
  for (const Sequence* seq : seqs) {
    const Table& table = tables_.at(seq->seq_id());
    const size_t index = (seq->num_tokens() - 1) / block_size();
    if (index == table.blocks.size()) {
      ++needed;
      continue;
    }
    const int32_t block = table.blocks[index];
    if (blocks_[block].ref_count - released[block] > 1) {
      ++needed;
      ++released[block];
    }
  }
  return needed;
}

std::optional<BlockCopy> BlockManager::AppendSlot(const Sequence& seq) {
  Table& table = tables_.at(seq.seq_id());
  const size_t index = (seq.num_tokens() - 1) / block_size();
  if (index == table.blocks.size()) {
    table.blocks.push_back(AllocateFresh());
    return std::nullopt;
  }
  MQA_CHECK(index + 1 == table.blocks.size());
  const int32_t block = table.blocks[index];
  // A cached block is full and computed; the slot of an uncomputed token never lies in one.
  MQA_CHECK(!blocks_[block].hashed);
  if (blocks_[block].ref_count == 1) return std::nullopt;
  const int32_t copy = AllocateFresh();
  --blocks_[block].ref_count;
  table.blocks[index] = copy;
  return BlockCopy{block, copy};
}

int BlockManager::NumBlocksToReserve(const Sequence& seq, int num_tokens) const {
  return std::max(0,
                  BlocksFor(num_tokens) - static_cast<int>(tables_.at(seq.seq_id()).blocks.size()));
}

void BlockManager::Reserve(const Sequence& seq, int num_tokens) {
  Table& table = tables_.at(seq.seq_id());
  MQA_CHECK(!table.blocks.empty() && blocks_[table.blocks.back()].ref_count == 1);
  while (static_cast<int>(table.blocks.size()) < BlocksFor(num_tokens)) {
    table.blocks.push_back(AllocateFresh());
  }
}

void BlockManager::Trim(const Sequence& seq) {
  Table& table = tables_.at(seq.seq_id());
  const size_t keep = BlocksFor(seq.num_tokens());
  MQA_CHECK(table.hashes.size() <= keep);
  while (table.blocks.size() > keep) {
    Release(table.blocks.back());
    table.blocks.pop_back();
  }
}

void BlockManager::Fork(const Sequence& parent, const Sequence& child) {
  MQA_CHECK(!tables_.contains(child.seq_id()));
  const Table parent_table = tables_.at(parent.seq_id());
  for (int32_t block : parent_table.blocks) ++blocks_[block].ref_count;
  tables_[child.seq_id()] = parent_table;
}

void BlockManager::Free(int64_t seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) Release(*b);
  tables_.erase(it);
}

void BlockManager::MarkComputed(const Sequence& seq) {
  if (!options_.enable_prefix_caching) return;
  Table& table = tables_.at(seq.seq_id());
  const int bs = block_size();
  const size_t full = std::min<size_t>(seq.num_computed_tokens() / bs, table.blocks.size());
  for (size_t i = table.hashes.size(); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : table.hashes[i - 1];
    auto tokens = absl::MakeConstSpan(seq.tokens()).subspan(i * bs, bs);
    const uint64_t hash = HashBlockTokens(parent, tokens);
    table.hashes.push_back(hash);
    Block& block = blocks_[table.blocks[i]];
    if (block.hashed) {
      MQA_CHECK(block.hash == hash);
      continue;
    }
    // Another block already holds the same prefix (two equal prompts computed at once): this
    // one stays private and returns to the free list when released.
    if (cache_.contains(hash)) continue;
    block.hashed = true;
    block.hash = hash;
    block.parent_hash = parent;
    block.tokens.assign(tokens.begin(), tokens.end());
    cache_[hash] = table.blocks[i];
  }
}

const std::vector<int32_t>& BlockManager::BlockTable(int64_t seq_id) const {
  return tables_.at(seq_id).blocks;
}

int32_t BlockManager::Slot(int64_t seq_id, int position) const {
  const std::vector<int32_t>& blocks = tables_.at(seq_id).blocks;
  MQA_CHECK(position >= 0 && position / block_size() < static_cast<int>(blocks.size()));
  return blocks[position / block_size()] * block_size() + position % block_size();
}

bool BlockManager::OwnsBlockAt(int64_t seq_id, int position) const {
  const auto it = tables_.find(seq_id);
  if (it == tables_.end() || position < 0) return false;
  const std::vector<int32_t>& blocks = it->second.blocks;
  const size_t index = static_cast<size_t>(position / block_size());
  return index < blocks.size() && blocks_[blocks[index]].ref_count == 1;
}

double BlockManager::Usage() const {
  return 1.0 - static_cast<double>(NumFreeBlocks()) / num_blocks();
}

int32_t BlockManager::AllocateFresh() {
  int32_t block;
  if (!free_list_.empty()) {
    block = free_list_.back();
    free_list_.pop_back();
  } else {
    MQA_CHECK(!evictor_.empty());  // callers check NumFreeBlocks first
    block = evictor_.begin()->second;
    evictor_.erase(evictor_.begin());
    Unhash(block);
  }
  MQA_CHECK(blocks_[block].ref_count == 0);
  blocks_[block].ref_count = 1;
  return block;
}

void BlockManager::Release(int32_t block_id) {
  Block& block = blocks_[block_id];
  MQA_CHECK(block.ref_count > 0);
  if (--block.ref_count > 0) return;
  if (block.hashed) {
    block.last_release = ++clock_;
    evictor_.insert({block.last_release, block_id});
  } else {
    free_list_.push_back(block_id);
  }
}

std::optional<int32_t> BlockManager::Lookup(uint64_t hash, uint64_t parent_hash,
                                            absl::Span<const int32_t> tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return std::nullopt;
  const Block& block = blocks_[it->second];
  if (block.parent_hash != parent_hash ||
      !std::equal(tokens.begin(), tokens.end(), block.tokens.begin(), block.tokens.end())) {
    return std::nullopt;  // a hash collision
  }
  return it->second;
}

int64_t BlockManager::ResetPrefixCache() {
  const int64_t dropped = static_cast<int64_t>(evictor_.size());
  for (const auto& [released, block] : evictor_) {
    Unhash(block);
    free_list_.push_back(block);
  }
  evictor_.clear();
  return dropped;
}

void BlockManager::Unhash(int32_t block_id) {
  Block& block = blocks_[block_id];
  MQA_CHECK(block.hashed);
  auto it = cache_.find(block.hash);
  MQA_CHECK(it != cache_.end() && it->second == block_id);
  cache_.erase(it);
  block.hashed = false;
  block.tokens.clear();
}

void BlockManager::CheckInvariants() const {
  std::vector<int> refs(num_blocks(), 0);
  for (const auto& [seq_id, table] : tables_) {
    MQA_CHECK(table.hashes.size() <= table.blocks.size());
    for (int32_t block : table.blocks) {
      MQA_CHECK(block >= 0 && block < num_blocks());
      ++refs[block];
    }
  }
  std::vector<int> listed(num_blocks(), 0);
  for (int32_t block : free_list_) {
    MQA_CHECK(blocks_[block].ref_count == 0 && !blocks_[block].hashed);
    ++listed[block];
  }
  for (const auto& [release, block] : evictor_) {
    MQA_CHECK(blocks_[block].ref_count == 0 && blocks_[block].hashed);
    MQA_CHECK(blocks_[block].last_release == release);
    ++listed[block];
  }
  int hashed = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    MQA_CHECK(refs[b] == blocks_[b].ref_count);  // no leak, no double ownership
    MQA_CHECK(listed[b] == (blocks_[b].ref_count == 0 ? 1 : 0));
    if (blocks_[b].hashed) {
      ++hashed;
      auto it = cache_.find(blocks_[b].hash);
      MQA_CHECK(it != cache_.end() && it->second == b);
      MQA_CHECK(static_cast<int>(blocks_[b].tokens.size()) == block_size());
    }
  }
  MQA_CHECK(hashed == static_cast<int>(cache_.size()));
}

}  // namespace mqa
