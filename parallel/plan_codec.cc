#include "parallel/plan_codec.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {
namespace {

uint64_t Mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

absl::Status ValidateInput(const StepInput& in) {
  const int n = in.num_seqs();
  const int t = in.num_tokens();
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("StepInput: ", parts...));
  };
  if (static_cast<int>(in.query_start.size()) != n + 1)
    return bad("query_start has ", in.query_start.size(), " entries for ", n, " sequences");
  if (in.query_start[0] != 0 || in.query_start[n] != t)
    return bad("query_start must run from 0 to ", t);
  for (int s = 0; s < n; ++s) {
    if (in.query_start[s + 1] < in.query_start[s]) return bad("query_start decreases at ", s);
  }
  if (static_cast<int>(in.positions.size()) != t)
    return bad("positions has ", in.positions.size(), " entries for ", t, " tokens");
  if (static_cast<int>(in.slot_mapping.size()) != t)
    return bad("slot_mapping has ", in.slot_mapping.size(), " entries for ", t, " tokens");
  if (static_cast<int>(in.context_lens.size()) != n)
    return bad("context_lens has ", in.context_lens.size(), " entries for ", n, " sequences");
  if (in.max_blocks_per_seq < 0 ||
      in.block_tables.size() != static_cast<size_t>(n) * in.max_blocks_per_seq) {
    return bad("block_tables has ", in.block_tables.size(), " entries, not ", n, " x ",
               in.max_blocks_per_seq);
  }
  absl::flat_hash_set<int64_t> seen;
  for (int64_t id : in.seq_ids) {
    if (!seen.insert(id).second) return bad("sequence ", id, " appears twice");
  }
  return absl::OkStatus();
}

// The cache slot of position `pos` under the usual rule, or -1 where the row has no such block.
int64_t DerivedSlot(const int32_t* row, int max_blocks, int block_size, int32_t pos) {
  if (pos < 0 || pos / block_size >= max_blocks) return -1;
  return static_cast<int64_t>(row[pos / block_size]) * block_size + pos % block_size;
}

absl::Status DataLoss(auto... parts) {
  return absl::DataLossError(absl::StrCat("StepPlan: ", parts...));
}

}  // namespace

uint64_t HashMirror(const BlockTableMirror& mirror) {
  uint64_t total = 0;
  for (const auto& [seq_id, table] : mirror) {
    uint64_t h = Mix(static_cast<uint64_t>(seq_id) ^ 0x5eb1c0de5eb1c0deull);
    for (int32_t block : table) h = Mix(h ^ static_cast<uint32_t>(block));
    total += Mix(h ^ table.size());  // a sum: independent of the map's iteration order
  }
  return Mix(total ^ mirror.size());
}

absl::StatusOr<pb::StepPlan> PlanEncoder::Encode(const StepInput& in, const Extras& extras) {
  RETURN_IF_ERROR(ValidateInput(in));
  const int bs = options_.block_size;
  const int mb = in.max_blocks_per_seq;
  pb::StepPlan plan;
  plan.set_step(next_step_);
  plan.set_block_size(bs);
  // Frees apply before the batch, on both sides, so that a sequence freed and re-scheduled in
  // the same step arrives with a fresh table.
  for (int64_t id : in.finished_seq_ids) {
    plan.add_finished_seq_ids(id);
    mirror_.erase(id);
  }
  for (int64_t id : extras.aborted_seq_ids) {
    plan.add_aborted_seq_ids(id);
    mirror_.erase(id);
  }
  plan.set_max_blocks_per_seq(mb);
  for (int s = 0; s < in.num_seqs(); ++s) {
    pb::SeqStep* seq = plan.add_seqs();
    seq->set_seq_id(in.seq_ids[s]);
    const int begin = in.query_start[s];
    const int end = in.query_start[s + 1];
    seq->mutable_token_ids()->Add(in.token_ids.begin() + begin, in.token_ids.begin() + end);
    int32_t default_context = 0;
    if (end > begin) {
      const int32_t first = in.positions[begin];
      seq->set_first_position(first);
      bool consecutive = true;
      for (int i = begin; i < end; ++i) consecutive &= in.positions[i] == first + (i - begin);
      if (!consecutive) {
        seq->mutable_positions()->Add(in.positions.begin() + begin, in.positions.begin() + end);
      }
      default_context = in.positions[end - 1] + 1;
    }
    if (in.context_lens[s] != default_context) seq->set_context_len(in.context_lens[s]);

    // The row's meaningful length (header comment), then a delta against the mirror.
    const int32_t* row = in.block_tables.data() + static_cast<size_t>(s) * mb;
    int length = mb;
    while (length > 0 && row[length - 1] == 0) --length;
    const int64_t needed = (static_cast<int64_t>(std::max(in.context_lens[s], 0)) + bs - 1) / bs;
    length = static_cast<int>(std::max<int64_t>(length, std::min<int64_t>(needed, mb)));
    std::vector<int32_t>& known = mirror_[in.seq_ids[s]];
    const bool extends =
        known.size() <= static_cast<size_t>(length) && std::equal(known.begin(), known.end(), row);
    if (extends) {
      seq->mutable_blocks()->Add(row + known.size(), row + length);
    } else {
      seq->set_reset_table(true);
      seq->mutable_blocks()->Add(row, row + length);
    }
    known.assign(row, row + length);

    bool derivable = true;
    for (int i = begin; i < end && derivable; ++i) {
      derivable = DerivedSlot(row, mb, bs, in.positions[i]) == in.slot_mapping[i];
    }
    if (!derivable) {
      seq->mutable_slot_mapping()->Add(in.slot_mapping.begin() + begin,
                                       in.slot_mapping.begin() + end);
    }
  }
  plan.mutable_logits_rows()->Add(in.logits_rows.begin(), in.logits_rows.end());
  for (const BlockCopy& copy : in.block_copies) {
    plan.add_block_copies(copy.src);
    plan.add_block_copies(copy.dst);
  }
  if (options_.send_mirror_hash) plan.set_mirror_hash(HashMirror(mirror_));
  ++next_step_;
  return plan;
}

pb::StepPlan PlanEncoder::EncodeShutdown() {
  pb::StepPlan plan;
  plan.set_step(next_step_++);
  plan.set_block_size(options_.block_size);
  plan.set_shutdown(true);
  return plan;
}

absl::StatusOr<StepInput> PlanDecoder::Decode(const pb::StepPlan& plan) {
  if (plan.step() != next_step_) {
    return DataLoss("expected plan ", next_step_, ", got plan ", plan.step());
  }
  if (plan.block_size() != options_.block_size) {
    return DataLoss("rank 0 uses block size ", plan.block_size(), ", this worker ",
                    options_.block_size);
  }
  ++next_step_;
  StepInput in;
  if (plan.shutdown()) return in;
  const int bs = options_.block_size;
  const int mb = plan.max_blocks_per_seq();
  if (mb < 0) return DataLoss("max_blocks_per_seq ", mb);
  for (int64_t id : plan.finished_seq_ids()) mirror_.erase(id);
  for (int64_t id : plan.aborted_seq_ids()) mirror_.erase(id);
  in.finished_seq_ids.assign(plan.finished_seq_ids().begin(), plan.finished_seq_ids().end());

  const int n = plan.seqs_size();
  in.max_blocks_per_seq = mb;
  in.block_tables.assign(static_cast<size_t>(n) * mb, 0);
  in.query_start.reserve(n + 1);
  in.query_start.push_back(0);
  for (int s = 0; s < n; ++s) {
    const pb::SeqStep& seq = plan.seqs(s);
    in.seq_ids.push_back(seq.seq_id());
    std::vector<int32_t>& table = mirror_[seq.seq_id()];
    if (seq.reset_table()) table.clear();
    table.insert(table.end(), seq.blocks().begin(), seq.blocks().end());
    if (table.size() > static_cast<size_t>(mb)) {
      return DataLoss("sequence ", seq.seq_id(), " has ", table.size(), " blocks, more than ", mb);
    }
    int32_t* row = in.block_tables.data() + static_cast<size_t>(s) * mb;
    std::copy(table.begin(), table.end(), row);

    const int count = seq.token_ids_size();
    const int begin = in.num_tokens();
    in.token_ids.insert(in.token_ids.end(), seq.token_ids().begin(), seq.token_ids().end());
    if (seq.positions_size() > 0) {
      if (seq.positions_size() != count) return DataLoss("positions of sequence ", seq.seq_id());
      in.positions.insert(in.positions.end(), seq.positions().begin(), seq.positions().end());
    } else {
      for (int i = 0; i < count; ++i) in.positions.push_back(seq.first_position() + i);
    }
    in.context_lens.push_back(seq.has_context_len() ? seq.context_len()
                              : count > 0           ? in.positions.back() + 1
                                                    : 0);
    if (seq.slot_mapping_size() > 0) {
      if (seq.slot_mapping_size() != count) return DataLoss("slots of sequence ", seq.seq_id());
      in.slot_mapping.insert(in.slot_mapping.end(), seq.slot_mapping().begin(),
                             seq.slot_mapping().end());
    } else {
      for (int i = begin; i < begin + count; ++i) {
        const int64_t slot = DerivedSlot(row, mb, bs, in.positions[i]);
        if (slot < 0) {
          return DataLoss("position ", in.positions[i], " of sequence ", seq.seq_id(),
                          " is past its block table");
        }
        in.slot_mapping.push_back(static_cast<int32_t>(slot));
      }
    }
    in.query_start.push_back(in.num_tokens());
  }
  in.logits_rows.assign(plan.logits_rows().begin(), plan.logits_rows().end());
  if (plan.block_copies_size() % 2 != 0) return DataLoss("block_copies is not (src, dst) pairs");
  for (int i = 0; i < plan.block_copies_size(); i += 2) {
    in.block_copies.push_back(BlockCopy{plan.block_copies(i), plan.block_copies(i + 1)});
  }
  if (plan.has_mirror_hash()) {
    const uint64_t mine = HashMirror(mirror_);
    if (mine != plan.mirror_hash()) {
      return DataLoss("block-table mirror differs from rank 0's after plan ", plan.step(),
                      " (hash ", mine, " vs ", plan.mirror_hash(), ")");
    }
  }
  return in;
}

}  // namespace mqa
