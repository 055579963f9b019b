// Tensor parallelism of the forward (run under mpirun with 2 and 4 ranks): every HF fixture,
// loaded as this rank's shard and run over MPI collectives, gives HF's logits on rank 0 at every
// prompt position (prefill split into two chunks) and HF's greedy continuation. Covers the
// vocab-parallel embedding and lm_head (vocab 1001 is padded to a multiple of the world size
// and trimmed), the head split of c_attn (MQA: K/V replicated; multi_query=false: K/V heads
// split), the row-parallel all-reduces with biases added once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/gpt_bigcode_runner.h"
#include "nlohmann/json.hpp"
#include "parallel/collectives.h"
#include "tests/model/hf_fixture.h"
#include "tests/parallel/mpi_test_env.h"

namespace mqa {
namespace {

using testing::FixtureModelDir;
using testing::PagedSequence;
using testing::RowRelativeError;

class TensorParallelFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorParallelFixture, LogitsAndGreedyMatchHf) {
  auto collectives = MakeMpiCollectives(TestWorld());
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  const int rank = (*collectives)->rank();
  LoadOptions load;
  load.model_dir = FixtureModelDir(GetParam());
  GptBigCodeRunnerOptions options;
  options.block_size = 8;
  options.num_kv_blocks = 64;
  auto runner = CreateGptBigCodeRunnerFromDir(load, collectives->get(), options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_EQ((*runner)->weights().shard.world_size, TestWorld().size());
  const int64_t vocab = (*runner)->vocab_size();
  const std::vector<testing::HfReference> prompts = testing::LoadHfReferences(load.model_dir, vocab);
  ASSERT_FALSE(prompts.empty());

  double worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const testing::HfReference& p = prompts[i];
    PagedSequence seq(options.num_kv_blocks, options.block_size, 100 + i);
    // The prompt in two chunks (the second one crosses a block boundary for long prompts).
    const size_t split = p.prompt.size() / 3;
    std::vector<float> logits;
    for (auto [b, e] : {std::pair{size_t{0}, split}, std::pair{split, p.prompt.size()}}) {
      if (b == e) continue;
      auto out = (*runner)->Execute(
          seq.Step(std::vector<int32_t>(p.prompt.begin() + b, p.prompt.begin() + e), true));
      ASSERT_TRUE(out.ok()) << out.status();
      if (rank != 0) {
        ASSERT_EQ(out->dim(0), 0);
        continue;
      }
      ASSERT_EQ(out->shape(), (std::vector<int64_t>{static_cast<int64_t>(e - b), vocab}));
      logits.insert(logits.end(), out->data<float>(), out->data<float>() + out->numel());
    }
    if (rank == 0) {
      for (size_t t = 0; t < p.prompt.size(); ++t) {
        const double err = RowRelativeError(&logits[t * vocab], &p.logits[t * vocab], vocab);
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-4) << GetParam() << " prompt " << i << " position " << t;
      }
    }
    // Greedy: every rank feeds HF's token, rank 0 checks that its argmax agrees.
    int32_t next = -1;
    if (rank == 0) {
      const float* last = &logits[(p.prompt.size() - 1) * vocab];
      next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    }
    for (size_t s = 0; s < p.greedy.size(); ++s) {
      if (rank == 0) EXPECT_EQ(next, p.greedy[s]) << GetParam() << " prompt " << i << " step " << s;
      if (s + 1 == p.greedy.size()) break;
      auto out = (*runner)->Execute(seq.Step({p.greedy[s]}, false));
      ASSERT_TRUE(out.ok()) << out.status();
      if (rank == 0) {
        const float* row = out->data<float>();
        next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      }
    }
  }
  if (rank == 0) {
    std::printf("%s on %d ranks: worst relative logit error %.2e\n", GetParam(), TestWorld().size(),
                worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelFixture,
                         ::testing::Values("tiny-mqa-d64", "tiny-mqa-d128", "tiny-mha-d64"));

}  // namespace
}  // namespace mqa
