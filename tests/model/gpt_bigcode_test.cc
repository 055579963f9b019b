// GptBigCode / GptBigCodeRunner on a random tiny model (one rank): logits against a dense,
// non-paged double-precision reimplementation of HF's GPTBigCode (full causal attention over the
// whole sequence), and equivalence of one prefill, chunked prefill, token-by-token decode and
// mixed batches over random (non-contiguous, interleaved) block tables, block sizes 8/16/32.
#include "model/gpt_bigcode.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ops.h"
#include "model/gpt_bigcode_runner.h"
#include "parallel/collectives.h"
#include "tests/model/gpt_bigcode_test_util.h"

namespace mqa {
namespace {

using testing_util::DenseReference;
using testing_util::ExpectLogitsNear;
using testing_util::PagedSession;
using testing_util::RandomWeights;
using testing_util::TinyConfig;

struct ModelCase {
  bool multi_query;
  int block_size;
};

std::string CaseName(const ::testing::TestParamInfo<ModelCase>& info) {
  return std::string(info.param.multi_query ? "Mqa" : "Mha") + "Block" +
         std::to_string(info.param.block_size);
}

class GptBigCodeTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    config_ = TinyConfig(GetParam().multi_query);
    collectives_ = MakeLocalCollectives();
    GptBigCodeRunnerOptions options;
    options.block_size = GetParam().block_size;
    options.num_kv_blocks = 64;
    options.max_batched_tokens = 16;  // smaller than a prompt: the workspace must grow
    options.max_logits_rows = 4;
    weights_ = RandomWeights(config_, /*seed=*/GetParam().block_size + 17 * GetParam().multi_query);
    auto runner = GptBigCodeRunner::Create(weights_, collectives_.get(), options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  std::vector<int32_t> RandomTokens(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (auto& v : t) v = static_cast<int32_t>(rng() % config_.vocab_size);
    return t;
  }

  ModelConfig config_;
  GptBigCodeWeights weights_;
  std::unique_ptr<Collectives> collectives_;
  std::unique_ptr<GptBigCodeRunner> runner_;
};

TEST_P(GptBigCodeTest, OnePrefillMatchesDenseReferenceAtEveryPosition) {
  const std::vector<int32_t> prompt = RandomTokens(37, 1);
  const auto ref = DenseReference(weights_, prompt);
  PagedSession session(runner_.get(), /*seed=*/3);
  const int s = session.AddSequence(prompt);
  const auto got = session.Step({{s, 37}}, /*all_rows=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 37u);
  for (int p = 0; p < 37; ++p)
    ExpectLogitsNear((*got)[p].logits, ref[p], "position " + std::to_string(p));
}

TEST_P(GptBigCodeTest, ChunkedPrefillAndDecodeMatchOnePrefill) {
  const std::vector<int32_t> prompt = RandomTokens(41, 2);
  const auto ref = DenseReference(weights_, prompt);
  // Chunks that start and end inside blocks and across block boundaries, then single tokens.
  PagedSession session(runner_.get(), /*seed=*/4);
  const int s = session.AddSequence(prompt);
  std::vector<std::vector<float>> logits;
  for (int chunk : {5, 1, 12, 3, 9}) {
    auto got = session.Step({{s, chunk}}, /*all_rows=*/true);
    ASSERT_TRUE(got.ok()) << got.status();
    for (auto& row : *got) logits.push_back(row.logits);
  }
  while (session.cached(s) < 41) {
    auto got = session.Step({{s, 1}}, /*all_rows=*/true);
    ASSERT_TRUE(got.ok()) << got.status();
    logits.push_back((*got)[0].logits);
  }
  ASSERT_EQ(logits.size(), 41u);
  for (int p = 0; p < 41; ++p) ExpectLogitsNear(logits[p], ref[p], "position " + std::to_string(p));
}

TEST_P(GptBigCodeTest, MixedBatchOfPrefillsAndDecodes) {
  // Three sequences whose blocks interleave in the pool; each step mixes a new prompt's prefill,
  // chunk continuations and decodes, and asks for a scattered subset of rows.
  std::vector<std::vector<int32_t>> tokens = {RandomTokens(30, 10), RandomTokens(26, 11),
                                              RandomTokens(20, 12)};
  std::vector<std::vector<std::vector<double>>> refs;
  for (const auto& t : tokens) refs.push_back(DenseReference(weights_, t));
  PagedSession session(runner_.get(), /*seed=*/5);
  const int a = session.AddSequence(tokens[0]);
  const int b = session.AddSequence(tokens[1]);
  const int c = session.AddSequence(tokens[2]);
  const std::vector<std::vector<std::pair<int, int>>> steps = {
      {{a, 9}, {b, 1}},          {{b, 13}, {a, 1}, {c, 4}}, {{c, 1}, {a, 11}, {b, 1}},
      {{a, 1}, {b, 1}, {c, 14}}, {{c, 1}, {b, 10}, {a, 8}},
  };
  std::mt19937 rng(6);
  for (const auto& step : steps) {
    auto got = session.Step(step, /*all_rows=*/false, &rng);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_FALSE(got->empty());
    for (const auto& row : *got) {
      ExpectLogitsNear(
          row.logits, refs[row.seq][row.position],
          "seq " + std::to_string(row.seq) + " position " + std::to_string(row.position));
    }
  }
  for (int s : {a, b, c}) EXPECT_EQ(session.cached(s), static_cast<int>(tokens[s].size()));
}

TEST_P(GptBigCodeTest, BlockCopyForksASharedPartialBlock) {
  // Sequence A's prompt fills one and a half blocks; B shares A's full blocks and gets a copy of
  // its partial last block (copy-on-write), then both continue with different tokens.
  const int bs = GetParam().block_size;
  const int shared_len = bs + bs / 2;
  std::vector<int32_t> a_tokens = RandomTokens(shared_len + 5, 20);
  std::vector<int32_t> b_tokens(a_tokens.begin(), a_tokens.begin() + shared_len);
  for (int32_t t : RandomTokens(5, 21)) b_tokens.push_back(t);
  const auto ref_a = DenseReference(weights_, a_tokens);
  const auto ref_b = DenseReference(weights_, b_tokens);
  PagedSession session(runner_.get(), /*seed=*/7);
  const int a = session.AddSequence(a_tokens);
  ASSERT_TRUE(session.Step({{a, shared_len}}, true).ok());
  const int b = session.Fork(a, b_tokens);  // queues the block copy for the next step
  for (int i = 0; i < 5; ++i) {
    auto got = session.Step({{a, 1}, {b, 1}}, true);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectLogitsNear((*got)[0].logits, ref_a[shared_len + i], "A");
    ExpectLogitsNear((*got)[1].logits, ref_b[shared_len + i], "B");
  }
}

TEST_P(GptBigCodeTest, ReportsOnlyRequestedRowsInRequestedOrder) {
  const std::vector<int32_t> prompt = RandomTokens(12, 30);
  const auto ref = DenseReference(weights_, prompt);
  PagedSession session(runner_.get(), /*seed=*/8);
  const int s = session.AddSequence(prompt);
  StepInput in = session.BuildStep({{s, 12}});
  in.logits_rows = {11, 0, 11, 5};
  auto logits = runner_->Execute(in);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->shape(), (std::vector<int64_t>{4, config_.vocab_size}));
  const int order[] = {11, 0, 11, 5};
  for (int i = 0; i < 4; ++i) {
    const float* row = logits->data<float>() + i * config_.vocab_size;
    ExpectLogitsNear(std::vector<float>(row, row + config_.vocab_size), ref[order[i]], "row");
  }
}

// The benchmark-only skip knob (mqabench --skip): a skipped op really is left out (the logits
// move away from the reference), and clearing the knob restores the exact forward.
TEST_P(GptBigCodeTest, SkippedOpsLeaveTheStepAndClearingRestoresIt) {
  const std::vector<int32_t> first = RandomTokens(20, 40), second = RandomTokens(20, 41);
  const auto ref = DenseReference(weights_, second);
  PagedSession session(runner_.get(), /*seed=*/9);
  ASSERT_TRUE(session.Step({{session.AddSequence(first), 20}}, /*all_rows=*/false).ok());
  runner_->model().set_skip_ops(kSkipAttention);
  const int s = session.AddSequence(second);
  const auto skipped = session.Step({{s, 20}}, /*all_rows=*/false);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  double diff = 0;
  for (size_t i = 0; i < ref[19].size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>((*skipped)[0].logits[i]) - ref[19][i]));
  }
  EXPECT_GT(diff, 1e-3) << "attention was not skipped";
  runner_->model().set_skip_ops(0);
  const int t = session.AddSequence(second);
  const auto again = session.Step({{t, 20}}, /*all_rows=*/false);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectLogitsNear((*again)[0].logits, ref[19], "after clearing the skip");
}

INSTANTIATE_TEST_SUITE_P(Models, GptBigCodeTest,
                         ::testing::Values(ModelCase{true, 8}, ModelCase{true, 16},
                                           ModelCase{true, 32}, ModelCase{false, 8},
                                           ModelCase{false, 16}, ModelCase{false, 32}),
                         CaseName);

TEST(GptBigCodeReference, DetectsAWrongModel) {
  // The comparison can fail: a perturbed weight moves the logits past the tolerance.
  const ModelConfig config = TinyConfig(true);
  GptBigCodeWeights w = RandomWeights(config, 1);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  const auto ref = DenseReference(w, prompt);
  w.layers[1].c_fc_b.data<float>()[3] += 0.05f;
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions options;
  options.num_kv_blocks = 8;
  auto runner = GptBigCodeRunner::Create(w, collectives.get(), options);
  ASSERT_TRUE(runner.ok());
  PagedSession session(runner->get(), 1);
  const int s = session.AddSequence(prompt);
  auto got = session.Step({{s, 6}}, true);
  ASSERT_TRUE(got.ok());
  EXPECT_GT(testing_util::MaxRelError((*got)[5].logits, ref[5]), 1e-3);
}

TEST(GptBigCodeRunnerErrors, RejectsBadStepsBeforeRunning) {
  const ModelConfig config = TinyConfig(true);
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions options;
  options.num_kv_blocks = 4;
  options.block_size = 8;
  auto runner = GptBigCodeRunner::Create(RandomWeights(config, 2), collectives.get(), options);
  ASSERT_TRUE(runner.ok());
  PagedSession session(runner->get(), 2);
  const int s = session.AddSequence({1, 2, 3});
  const StepInput good = session.BuildStep({{s, 3}});
  ASSERT_TRUE((*runner)->Execute(good).ok());

  auto expect_invalid = [&](StepInput in, const char* what) {
    EXPECT_EQ((*runner)->Execute(in).status().code(), absl::StatusCode::kInvalidArgument) << what;
  };
  StepInput in = good;
  in.token_ids[1] = static_cast<int32_t>(config.vocab_size);
  expect_invalid(in, "token id");
  in = good;
  in.positions[2] = static_cast<int32_t>(config.n_positions);
  expect_invalid(in, "position");
  in = good;
  in.slot_mapping[0] = 4 * 8;
  expect_invalid(in, "slot");
  in = good;
  in.block_tables[0] = 4;
  expect_invalid(in, "block table");
  in = good;
  in.context_lens[0] = 2;
  expect_invalid(in, "context shorter than query");
  in = good;
  in.logits_rows = {3};
  expect_invalid(in, "logits row");
  in = good;
  in.block_copies = {{0, 9}};
  expect_invalid(in, "block copy");
  in = good;
  in.query_start = {0, 2};
  expect_invalid(in, "query_start");
}

TEST(GptBigCodeRunnerErrors, RejectsMisshapenWeightsAndBlockSizes) {
  const ModelConfig config = TinyConfig(false);
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions options;
  options.num_kv_blocks = 4;
  GptBigCodeWeights w = RandomWeights(config, 3);
  w.layers[1].c_attn_w = w.layers[1].c_attn_w.Rows(0, config.n_embd);  // MQA-sized rows
  auto bad = GptBigCodeRunner::Create(w, collectives.get(), options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("h.1.attn.c_attn.weight"), std::string::npos)
      << bad.status();

  options.block_size = 12;
  EXPECT_EQ(GptBigCodeRunner::Create(RandomWeights(config, 3), collectives.get(), options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GptBigCodeRunner, SizesThePoolFromAByteBudget) {
  const ModelConfig config = TinyConfig(true);
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions options;
  options.block_size = 16;
  // Per block: 2 (K, V) * layers * 16 tokens * 1 kv head * head_dim * 4 bytes.
  const int64_t per_block = 2 * config.n_layer * 16 * config.head_dim() * 4;
  options.kv_cache_bytes = 10 * per_block + per_block / 2;
  auto runner = GptBigCodeRunner::Create(RandomWeights(config, 4), collectives.get(), options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->num_kv_blocks(), 10);
  EXPECT_EQ((*runner)->block_size(), 16);
  EXPECT_EQ((*runner)->vocab_size(), config.vocab_size);
}

}  // namespace
}  // namespace mqa
