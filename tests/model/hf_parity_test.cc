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
#include "nlohmann/json.hpp"
#include "parallel/collectives.h"

namespace mqa {
namespace {

std::string FixtureDir(const std::string& model) {
  const char* src = std::getenv("MQA_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/models/" + model;
}

struct Reference {
  std::vector<int32_t> prompt;
  std::vector<float> logits;  // [prompt_len, vocab]
  std::vector<int32_t> greedy;
  std::vector<double> margins;
};

std::vector<Reference> LoadReferences(const std::string& dir, int64_t vocab) {
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << "missing " << dir << "/reference.json";
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<Reference> refs;
  for (const auto& p : j["prompts"]) {
    Reference r;
    r.prompt = p["prompt"].get<std::vector<int32_t>>();
    r.logits.resize(r.prompt.size() * vocab);
    std::ifstream lf(dir + "/" + p["logits_file"].get<std::string>(), std::ios::binary);
    lf.read(reinterpret_cast<char*>(r.logits.data()), r.logits.size() * sizeof(float));
    EXPECT_EQ(static_cast<size_t>(lf.gcount()), r.logits.size() * sizeof(float));
    for (const auto& s : p["greedy"]) {
      r.greedy.push_back(s["token"].get<int32_t>());
      r.margins.push_back(s["margin"].get<double>());
    }
    refs.push_back(std::move(r));
  }
  return refs;
}

// Hands out physical blocks in a shuffled order, so block tables are not contiguous.
class BlockPool {
 public:
  BlockPool(int n, uint64_t seed) : free_(n) {
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937_64(seed));
  }
  int32_t Take() {
    MQA_CHECK(!free_.empty());
    int32_t b = free_.back();
    free_.pop_back();
    return b;
  }

 private:
  std::vector<int32_t> free_;
};

// One sequence's step: `tokens` at positions [start, start + tokens.size()); logits for all rows.
StepInput MakeStep(const std::vector<int32_t>& tokens, int start, std::vector<int32_t>& table,
                   BlockPool& pool, int block_size, bool all_logits) {
  StepInput in;
  in.seq_ids = {1};
  const int end = start + static_cast<int>(tokens.size());
  while (static_cast<int>(table.size()) * block_size < end) table.push_back(pool.Take());
  in.token_ids = tokens;
  for (int p = start; p < end; ++p) {
    in.positions.push_back(p);
    in.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
  }
  in.query_start = {0, static_cast<int32_t>(tokens.size())};
  in.context_lens = {end};
  in.max_blocks_per_seq = static_cast<int>(table.size());
  in.block_tables = table;
  if (all_logits) {
    for (int i = 0; i < static_cast<int>(tokens.size()); ++i) in.logits_rows.push_back(i);
  } else {
    in.logits_rows = {static_cast<int32_t>(tokens.size()) - 1};
  }
  return in;
}

class HfParity : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(HfParity, LogitsAndGreedyMatchTransformers) {
  const auto& [model, block_size] = GetParam();
  auto collectives = MakeLocalCollectives();
  LoadOptions load;
  load.model_dir = FixtureDir(model);
  GptBigCodeRunnerOptions opts;
  opts.block_size = block_size;
  opts.num_kv_blocks = 64;
  auto runner = CreateGptBigCodeRunnerFromDir(load, collectives.get(), opts);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const int64_t vocab = (*runner)->vocab_size();
  const auto refs = LoadReferences(load.model_dir, vocab);
  ASSERT_GE(refs.size(), 5u);

  double worst_rel = 0;
  int compared_steps = 0;
  for (size_t r = 0; r < refs.size(); ++r) {
    const Reference& ref = refs[r];
    BlockPool pool(opts.num_kv_blocks, 17 + r);
    std::vector<int32_t> table;
    auto logits = (*runner)->Execute(MakeStep(ref.prompt, 0, table, pool, block_size, true));
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->dim(0), static_cast<int64_t>(ref.prompt.size()));
    ASSERT_EQ(logits->dim(1), vocab);
    // Relative to the largest |logit| of the row: the scale that fp32 rounding works at.
    const float* got = logits->data<float>();
    for (size_t row = 0; row < ref.prompt.size(); ++row) {
      double max_ref = 0, max_diff = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        const double want = ref.logits[row * vocab + v];
        max_ref = std::max(max_ref, std::abs(want));
        max_diff = std::max(max_diff, std::abs(got[row * vocab + v] - want));
      }
      const double rel = max_diff / max_ref;
      worst_rel = std::max(worst_rel, rel);
      ASSERT_LT(rel, 1e-4) << model << " prompt " << r << " position " << row;
    }
    // Greedy: decode one token at a time through the cache.
    int32_t next = static_cast<int32_t>(
        std::max_element(got + (ref.prompt.size() - 1) * vocab, got + ref.prompt.size() * vocab) -
        (got + (ref.prompt.size() - 1) * vocab));
    int pos = static_cast<int>(ref.prompt.size());
    for (size_t step = 0; step < ref.greedy.size(); ++step) {
      if (ref.margins[step] < 1e-4) break;  // HF's own top-2 are within rounding: stop comparing
      ASSERT_EQ(next, ref.greedy[step]) << model << " prompt " << r << " step " << step;
      ++compared_steps;
      if (step + 1 == ref.greedy.size()) break;
      auto out = (*runner)->Execute(MakeStep({next}, pos++, table, pool, block_size, false));
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
