// PlanEncoder -> bytes -> PlanDecoder rebuilds the identical StepInput; plans are O(batch), not
// O(context); the mirror hash catches a worker that is out of step.
#include "parallel/plan_codec.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/parallel/step_simulator.h"

namespace mqa {
namespace {

constexpr int kBlockSize = 16;

pb::StepPlan OverTheWire(const pb::StepPlan& plan) {
  std::string bytes;
  EXPECT_TRUE(plan.SerializeToString(&bytes));
  pb::StepPlan parsed;
  EXPECT_TRUE(parsed.ParseFromString(bytes));
  return parsed;
}

TEST(PlanCodec, RandomStepsRoundTripExactly) {
  for (uint64_t seed : {1, 2, 3}) {
    StepSimulator sim(seed, kBlockSize, /*num_blocks=*/400);
    PlanEncoder encoder({.block_size = kBlockSize, .send_mirror_hash = true});
    PlanDecoder decoder({.block_size = kBlockSize});
    int resets = 0, explicit_slots = 0, explicit_positions = 0, frees = 0;
    for (int step = 0; step < 300; ++step) {
      const StepInput in = sim.Next();
      auto plan = encoder.Encode(in);
      ASSERT_TRUE(plan.ok()) << plan.status();
      for (const pb::SeqStep& seq : plan->seqs()) {
        resets += seq.reset_table() && !seq.blocks().empty();
        explicit_slots += seq.slot_mapping_size() > 0;
        explicit_positions += seq.positions_size() > 0;
      }
      frees += plan->finished_seq_ids_size();
      auto out = decoder.Decode(OverTheWire(*plan));
      ASSERT_TRUE(out.ok()) << out.status();
      ExpectSameStepInput(in, *out);
      ASSERT_FALSE(HasFailure()) << "seed " << seed << " step " << step;
      ASSERT_EQ(HashMirror(decoder.mirror()), HashMirror(encoder.mirror()));
    }
    // The simulation exercised every path of the codec.
    EXPECT_GT(resets, 0);
    EXPECT_GT(explicit_slots, 0);
    EXPECT_GT(explicit_positions, 0);
    EXPECT_GT(frees, 0);
  }
}

// `batch` sequences, each with `context` tokens cached and one decode token at position
// `context`, tables holding the blocks of the next token too (the block manager reserves the slot
// ahead), block ids from 1 (no zero padding).
StepInput DecodeBatch(int batch, int context, int first_block_id) {
  StepInput in;
  const int blocks = (context + 1) / kBlockSize + 1;
  in.max_blocks_per_seq = blocks;
  in.query_start.push_back(0);
  for (int s = 0; s < batch; ++s) {
    in.seq_ids.push_back(s);
    in.token_ids.push_back(1000 + 37 * s);
    in.positions.push_back(context);
    const int first = first_block_id + s * 1000;  // a region per sequence, whatever the context
    for (int b = 0; b < blocks; ++b) in.block_tables.push_back(first + b);
    in.slot_mapping.push_back((first + context / kBlockSize) * kBlockSize + context % kBlockSize);
    in.context_lens.push_back(context + 1);
    in.query_start.push_back(s + 1);
    in.logits_rows.push_back(s);
  }
  return in;
}

// Plan bytes of the second of two decode steps (the first one teaches the workers the tables).
size_t SteadyDecodePlanBytes(int batch, int context, size_t* first_plan_bytes = nullptr) {
  PlanEncoder encoder({.block_size = kBlockSize});
  PlanDecoder decoder({.block_size = kBlockSize});
  const StepInput first = DecodeBatch(batch, context - 1, 3);
  auto plan0 = encoder.Encode(first);
  EXPECT_TRUE(plan0.ok());
  if (first_plan_bytes != nullptr) *first_plan_bytes = plan0->ByteSizeLong();
  EXPECT_TRUE(decoder.Decode(*plan0).ok());
  const StepInput second = DecodeBatch(batch, context, 3);
  auto plan1 = encoder.Encode(second);
  EXPECT_TRUE(plan1.ok());
  auto out = decoder.Decode(OverTheWire(*plan1));
  EXPECT_TRUE(out.ok());
  ExpectSameStepInput(second, *out);
  return plan1->ByteSizeLong();
}

TEST(PlanCodec, PlanSizeGrowsWithBatchNotWithContext) {
  size_t first_at_8000 = 0;
  const size_t at_100 = SteadyDecodePlanBytes(8, 100);
  const size_t at_8000 = SteadyDecodePlanBytes(8, 8000, &first_at_8000);
  // Only varint widths differ: each position (100: 1 byte, 8000: 2 bytes) and max_blocks_per_seq.
  EXPECT_LE(at_8000, at_100 + 8 * 1 + 2) << at_100 << " vs " << at_8000;
  EXPECT_GE(at_8000, at_100);
  // Teaching the tables once is O(context); the steady state is not.
  EXPECT_GT(first_at_8000, 20 * at_8000);
  const size_t batch_16 = SteadyDecodePlanBytes(16, 8000);
  const size_t batch_32 = SteadyDecodePlanBytes(32, 8000);
  EXPECT_GT(batch_16, at_8000 * 17 / 10);
  EXPECT_GT(batch_32, batch_16 * 17 / 10);
  EXPECT_LT(at_8000, 8u * 24u);  // a few bytes per sequence
}

TEST(PlanCodec, CrossingABlockBoundarySendsOneBlock) {
  PlanEncoder encoder({.block_size = kBlockSize});
  auto plan0 = encoder.Encode(DecodeBatch(2, 46, 5));  // 3 blocks each
  ASSERT_TRUE(plan0.ok());
  auto plan1 = encoder.Encode(DecodeBatch(2, 47, 5));  // 4 blocks each
  ASSERT_TRUE(plan1.ok());
  ASSERT_EQ(plan1->seqs_size(), 2);
  for (const pb::SeqStep& seq : plan1->seqs()) {
    EXPECT_FALSE(seq.reset_table());
    EXPECT_EQ(seq.blocks_size(), 1);
    EXPECT_EQ(seq.slot_mapping_size(), 0);
    EXPECT_FALSE(seq.has_context_len());
  }
}

TEST(PlanCodec, MirrorHashCatchesATamperedWorker) {
  StepSimulator sim(9, kBlockSize, 200);
  PlanEncoder encoder({.block_size = kBlockSize, .send_mirror_hash = true});
  PlanDecoder decoder({.block_size = kBlockSize});
  bool tampered = false;
  for (int step = 0; step < 50 && !tampered; ++step) {
    auto plan = encoder.Encode(sim.Next());
    ASSERT_TRUE(plan.ok());
    pb::StepPlan received = OverTheWire(*plan);
    for (pb::SeqStep& seq : *received.mutable_seqs()) {
      if (seq.blocks_size() > 0 && step > 5) {  // the worker records a wrong block
        seq.set_blocks(0, seq.blocks(0) + 1);
        tampered = true;
        break;
      }
    }
    auto out = decoder.Decode(received);
    if (tampered) {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
    } else {
      ASSERT_TRUE(out.ok()) << out.status();
    }
  }
  EXPECT_TRUE(tampered);
}

TEST(PlanCodec, OutOfOrderPlansAndBadInputsAreErrors) {
  PlanEncoder encoder({.block_size = kBlockSize});
  PlanDecoder decoder({.block_size = kBlockSize});
  auto plan0 = encoder.Encode(DecodeBatch(2, 40, 1));
  auto plan1 = encoder.Encode(DecodeBatch(2, 41, 1));
  ASSERT_TRUE(plan0.ok() && plan1.ok());
  EXPECT_EQ(decoder.Decode(*plan1).status().code(), absl::StatusCode::kDataLoss);

  PlanDecoder other_block_size({.block_size = 32});
  EXPECT_EQ(other_block_size.Decode(*plan0).status().code(), absl::StatusCode::kDataLoss);

  StepInput bad = DecodeBatch(2, 40, 1);
  bad.seq_ids[1] = bad.seq_ids[0];
  EXPECT_EQ(encoder.Encode(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = DecodeBatch(2, 40, 1);
  bad.query_start.back() = 5;
  EXPECT_EQ(encoder.Encode(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = DecodeBatch(2, 40, 1);
  bad.block_tables.pop_back();
  EXPECT_EQ(encoder.Encode(bad).status().code(), absl::StatusCode::kInvalidArgument);

  // A failed Encode used no plan number: the next plan still follows plan1.
  auto plan2 = encoder.Encode(DecodeBatch(2, 42, 1));
  ASSERT_TRUE(plan2.ok());
  EXPECT_EQ(plan2->step(), 2u);
  const pb::StepPlan last = encoder.EncodeShutdown();
  EXPECT_TRUE(last.shutdown());
  EXPECT_EQ(last.step(), 3u);
}

}  // namespace
}  // namespace mqa
