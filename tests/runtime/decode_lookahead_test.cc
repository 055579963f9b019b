// Decode lookahead's prediction and matching (runtime/decode_lookahead.h), without a model.
#include "runtime/decode_lookahead.h"

#include <gtest/gtest.h>

#include <vector>

namespace mqa {
namespace {

// A decode step of two sequences: seq 10 at position 5 (block 3 of size 8: slot 29), seq 11 at
// position 17 (its third block, 6: slot 49).
StepInput TwoSeqDecode() {
  StepInput in;
  in.seq_ids = {10, 11};
  in.token_ids = {100, 101};
  in.positions = {5, 17};
  in.query_start = {0, 1, 2};
  in.context_lens = {6, 18};
  in.slot_mapping = {3 * 8 + 5, 6 * 8 + 1};
  in.max_blocks_per_seq = 3;
  in.block_tables = {3, 0, 0, 1, 2, 6};
  in.logits_rows = {0, 1};
  return in;
}

std::vector<RowSamplingParams> TwoRows() {
  std::vector<RowSamplingParams> p(2);
  p[0].seed = 7;
  p[0].offset = 3;
  p[1].temperature = 0.7f;
  p[1].top_k = 20;
  p[1].top_p = 0.9f;
  p[1].seed = 8;
  p[1].offset = 12;
  return p;
}

TEST(DecodeLookahead, PredictsTheNextDecodeStep) {
  const StepInput in = TwoSeqDecode();
  const auto next = PredictNextDecodeStep(in, TwoRows(), 8, 2048);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->input.seq_ids, in.seq_ids);
  EXPECT_EQ(next->input.positions, (std::vector<int32_t>{6, 18}));
  EXPECT_EQ(next->input.context_lens, (std::vector<int32_t>{7, 19}));
  EXPECT_EQ(next->input.slot_mapping, (std::vector<int32_t>{30, 50}));
  EXPECT_EQ(next->input.block_tables, in.block_tables);
  EXPECT_EQ(next->input.query_start, in.query_start);
  EXPECT_EQ(next->input.logits_rows, in.logits_rows);
  ASSERT_EQ(next->params.size(), 2u);
  EXPECT_EQ(next->params[0].offset, 4u);
  EXPECT_EQ(next->params[1].offset, 13u);
  EXPECT_EQ(next->params[1].seed, 8u);
  EXPECT_EQ(next->params[1].top_k, 20);
}

TEST(DecodeLookahead, RefusesWhatItCannotPredict) {
  const std::vector<RowSamplingParams> rows = TwoRows();
  {  // the next slot of seq 10 would start block 1 of its table (position 8)
    StepInput in = TwoSeqDecode();
    in.positions[0] = 7;
    in.context_lens[0] = 8;
    in.slot_mapping[0] = 3 * 8 + 7;
    EXPECT_FALSE(PredictNextDecodeStep(in, rows, 8, 2048).has_value());
  }
  {  // the next position is the model's last + 1
    EXPECT_FALSE(PredictNextDecodeStep(TwoSeqDecode(), rows, 8, 18).has_value());
    EXPECT_TRUE(PredictNextDecodeStep(TwoSeqDecode(), rows, 8, 19).has_value());
  }
  {  // a prompt chunk: two tokens of one sequence
    StepInput in = TwoSeqDecode();
    in.seq_ids = {10};
    in.query_start = {0, 2};
    in.context_lens = {7};
    in.logits_rows = {1};
    EXPECT_FALSE(PredictNextDecodeStep(in, {rows[0]}, 8, 2048).has_value());
  }
  {  // a block copy before the step
    StepInput in = TwoSeqDecode();
    in.block_copies.push_back({1, 4});
    EXPECT_FALSE(PredictNextDecodeStep(in, rows, 8, 2048).has_value());
  }
  {  // a sequence without a logits row (mid-prompt)
    StepInput in = TwoSeqDecode();
    in.logits_rows = {0};
    EXPECT_FALSE(PredictNextDecodeStep(in, {rows[0]}, 8, 2048).has_value());
  }
  {  // sampling rows that do not match the logits rows
    EXPECT_FALSE(PredictNextDecodeStep(TwoSeqDecode(), {rows[0]}, 8, 2048).has_value());
  }
  {  // context length not position + 1
    StepInput in = TwoSeqDecode();
    in.context_lens[1] = 20;
    EXPECT_FALSE(PredictNextDecodeStep(in, rows, 8, 2048).has_value());
  }
}

TEST(DecodeLookahead, MatchesOnlyTheSameStepWithTheFedTokens) {
  auto predicted = PredictNextDecodeStep(TwoSeqDecode(), TwoRows(), 8, 2048);
  ASSERT_TRUE(predicted.has_value());
  const std::vector<int32_t> fed = {42, 43};
  // Not yet the step the engine asks for: its token ids are still the step before's.
  EXPECT_EQ(predicted->input.token_ids, TwoSeqDecode().token_ids);
  predicted->input.token_ids = fed;  // as the runner fills them in once launched
  // What the engine builds for the next step: the sampled tokens, everything one further.
  StepInput step = predicted->input;
  step.token_ids = fed;
  const std::vector<RowSamplingParams> params = predicted->params;
  EXPECT_TRUE(IsPredictedStep(*predicted, step, params));

  auto differs = [&](auto change) {
    StepInput s = step;
    std::vector<RowSamplingParams> p = params;
    change(s, p);
    return !IsPredictedStep(*predicted, s, p);
  };
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.token_ids[1] = 44; }));
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.seq_ids = {11, 10}; }));
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.slot_mapping[0] += 1; }));
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.block_tables[2] = 9; }));
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.block_copies.push_back({1, 2}); }));
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.finished_seq_ids.push_back(12); }));
  EXPECT_TRUE(differs([](StepInput& s, auto&) { s.context_lens[0] += 1; }));
  EXPECT_TRUE(differs([](auto&, std::vector<RowSamplingParams>& p) { p[0].offset += 1; }));
  EXPECT_TRUE(differs([](auto&, std::vector<RowSamplingParams>& p) { p[1].temperature = 1; }));
  EXPECT_TRUE(differs([](auto&, std::vector<RowSamplingParams>& p) { p[1].seed = 9; }));
  EXPECT_TRUE(differs([](auto&, std::vector<RowSamplingParams>& p) { p.pop_back(); }));
  EXPECT_TRUE(differs([](StepInput& s, std::vector<RowSamplingParams>& p) {
    // One sequence left (the other finished): a different step.
    s.seq_ids.pop_back();
    s.token_ids.pop_back();
    s.positions.pop_back();
    s.context_lens.pop_back();
    s.slot_mapping.pop_back();
    s.query_start.pop_back();
    s.logits_rows.pop_back();
    s.block_tables.resize(3);
    p.pop_back();
  }));
}

}  // namespace
}  // namespace mqa
