// The CPU forward against Hugging Face: for every fixture made by tests/fixtures/make_fixtures.py
// (transformers' GPTBigCodeForCausalLM, fp32), the logits at every prompt position and the greedy
// continuation, run through GptBigCodeRunner over the paged KV cache with non-contiguous blocks.
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
#include "parallel/collectives.h"
#include "tests/model/hf_fixture.h"

namespace mqa {
namespace {

using testing::FixtureModelDir;
using testing::HfReference;
using testing::LoadHfReferences;
using testing::PagedSequence;
using testing::RowRelativeError;

class HfParity : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(HfParity, LogitsAndGreedyMatchTransformers) {
  const auto& [model, block_size] = GetParam();
  auto collectives = MakeLocalCollectives();
  LoadOptions load;
  load.model_dir = FixtureModelDir(model);
  GptBigCodeRunnerOptions opts;
  opts.block_size = block_size;
  opts.num_kv_blocks = 64;
  auto runner = CreateGptBigCodeRunnerFromDir(load, collectives.get(), opts);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const int64_t vocab = (*runner)->vocab_size();
  const auto refs = LoadHfReferences(load.model_dir, vocab);
  ASSERT_GE(refs.size(), 5u);

  double worst_rel = 0;
  int compared_steps = 0;
  for (size_t r = 0; r < refs.size(); ++r) {
    const HfReference& ref = refs[r];
    PagedSequence seq(opts.num_kv_blocks, block_size, 17 + r);
    auto logits = (*runner)->Execute(seq.Step(ref.prompt, /*all_rows=*/true));
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->dim(0), static_cast<int64_t>(ref.prompt.size()));
    ASSERT_EQ(logits->dim(1), vocab);
    // Relative to the largest |logit| of the row: the scale that fp32 rounding works at.
    const float* got = logits->data<float>();
    for (size_t row = 0; row < ref.prompt.size(); ++row) {
      const double rel = RowRelativeError(got + row * vocab, ref.logits.data() + row * vocab, vocab);
      worst_rel = std::max(worst_rel, rel);
      ASSERT_LT(rel, 1e-4) << model << " prompt " << r << " position " << row;
    }
    // Greedy: decode one token at a time through the cache.
    int32_t next = static_cast<int32_t>(
        std::max_element(got + (ref.prompt.size() - 1) * vocab, got + ref.prompt.size() * vocab) -
        (got + (ref.prompt.size() - 1) * vocab));
    for (size_t step = 0; step < ref.greedy.size(); ++step) {
      if (ref.margins[step] < 1e-4) break;  // HF's own top-2 are within rounding: stop comparing
      ASSERT_EQ(next, ref.greedy[step]) << model << " prompt " << r << " step " << step;
      ++compared_steps;
      if (step + 1 == ref.greedy.size()) break;
      auto out = (*runner)->Execute(seq.Step({next}, /*all_rows=*/false));
      ASSERT_TRUE(out.ok()) << out.status();
      const float* row = out->data<float>();
      next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
  }
  std::printf("%s block %d: worst relative logit error %.3g, %d greedy steps equal\n",
              model.c_str(), block_size, worst_rel, compared_steps);
  EXPECT_GT(compared_steps, 100);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, HfParity,
    ::testing::Combine(::testing::Values("tiny-mqa-d64", "tiny-mqa-d128", "tiny-mha-d64"),
                       ::testing::Values(8, 16)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param) + "_block" + std::to_string(std::get<1>(info.param));
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace mqa
