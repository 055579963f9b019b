#include "runtime/decode_lookahead.h"

namespace mqa {

std::optional<LookaheadStep> PredictNextDecodeStep(const StepInput& input,
                                                   absl::Span<const RowSamplingParams> params,
                                                   int block_size, int max_positions) {
  const int n = input.num_seqs();
  if (n == 0 || block_size <= 0 || input.num_tokens() != n ||
      static_cast<int>(input.logits_rows.size()) != n || static_cast<int>(params.size()) != n ||
      static_cast<int>(input.query_start.size()) != n + 1 ||
      static_cast<int>(input.context_lens.size()) != n ||
      static_cast<int>(input.positions.size()) != n ||
      static_cast<int>(input.slot_mapping.size()) != n || !input.block_copies.empty()) {
    return std::nullopt;
  }
  LookaheadStep next;
  next.input.seq_ids = input.seq_ids;
  next.input.token_ids = input.token_ids;
  next.input.query_start = input.query_start;
  next.input.logits_rows = input.logits_rows;
  next.input.block_tables = input.block_tables;
  next.input.max_blocks_per_seq = input.max_blocks_per_seq;
  next.input.positions.resize(n);
  next.input.context_lens.resize(n);
  next.input.slot_mapping.resize(n);
  next.params.assign(params.begin(), params.end());
  for (int s = 0; s < n; ++s) {
    const int32_t position = input.positions[s];
    if (input.query_start[s] != s || input.logits_rows[s] != s ||
        input.context_lens[s] != position + 1 || position + 1 >= max_positions ||
        (position + 1) % block_size == 0) {
      return std::nullopt;  // not a decode row, or the next slot starts a new block
    }
    next.input.positions[s] = position + 1;
    next.input.context_lens[s] = position + 2;
    next.input.slot_mapping[s] = input.slot_mapping[s] + 1;
    next.params[s].offset += 1;
  }
  if (input.query_start[n] != n) return std::nullopt;
  return next;
}

bool IsPredictedStep(const LookaheadStep& predicted, const StepInput& step,
                     absl::Span<const RowSamplingParams> params) {
  const StepInput& p = predicted.input;
  if (step.seq_ids != p.seq_ids || step.token_ids != p.token_ids || step.positions != p.positions ||
      step.query_start != p.query_start || step.context_lens != p.context_lens ||
      step.slot_mapping != p.slot_mapping || step.logits_rows != p.logits_rows ||
      step.max_blocks_per_seq != p.max_blocks_per_seq || step.block_tables != p.block_tables ||
      !step.block_copies.empty() || !step.finished_seq_ids.empty() ||
      params.size() != predicted.params.size()) {
    return false;
  }
  for (size_t r = 0; r < params.size(); ++r) {
    const RowSamplingParams& a = params[r];
    const RowSamplingParams& b = predicted.params[r];
    if (a.temperature != b.temperature || a.top_k != b.top_k || a.top_p != b.top_p ||
        a.seed != b.seed || a.offset != b.offset) {
      return false;
    }
  }
  return true;
}

}  // namespace mqa
