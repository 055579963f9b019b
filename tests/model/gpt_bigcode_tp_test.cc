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
#include "tests/parallel/mpi_test_env.h"

namespace mqa {
namespace {

std::string FixtureDir(const std::string& model) {
  const char* src = std::getenv("MQA_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/models/" + model;
}

struct Prompt {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, vocab]
  std::vector<int32_t> greedy;
};

std::vector<Prompt> ReadPrompts(const std::string& dir, int64_t vocab) {
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << dir;
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<Prompt> out;
  for (const auto& p : j["prompts"]) {
    Prompt r;
    r.tokens = p["prompt"].get<std::vector<int32_t>>();
    r.logits.resize(r.tokens.size() * vocab);
    std::ifstream lf(dir + "/" + p["logits_file"].get<std::string>(), std::ios::binary);
    lf.read(reinterpret_cast<char*>(r.logits.data()), r.logits.size() * sizeof(float));
    EXPECT_EQ(static_cast<size_t>(lf.gcount()), r.logits.size() * sizeof(float));
    for (const auto& s : p["greedy"]) r.greedy.push_back(s["token"].get<int32_t>());
    out.push_back(std::move(r));
  }
  return out;
}

// max |got - ref| over the row relative to the row's largest |ref|.
double RowError(const float* got, const float* ref, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return err / scale;
}

// One sequence at a time: `tokens` at positions [start, ...), blocks taken from a shuffled pool.
class Sequence {
 public:
  Sequence(int num_blocks, int block_size, uint32_t seed) : bs_(block_size), free_(num_blocks) {
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
  }
  StepInput Step(const std::vector<int32_t>& tokens, bool all_rows) {
    StepInput in;
    in.seq_ids = {0};
    const int end = len_ + static_cast<int>(tokens.size());
    while (static_cast<int>(table_.size()) * bs_ < end) {
      table_.push_back(free_.back());
      free_.pop_back();
    }
    for (int p = len_; p < end; ++p) {
      in.token_ids.push_back(tokens[p - len_]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(table_[p / bs_] * bs_ + p % bs_);
      if (all_rows || p == end - 1) in.logits_rows.push_back(p - len_);
    }
    in.query_start = {0, static_cast<int32_t>(tokens.size())};
    in.context_lens = {end};
    in.block_tables = table_;
    in.max_blocks_per_seq = static_cast<int>(table_.size());
    len_ = end;
    return in;
  }

 private:
  int bs_;
  int len_ = 0;
  std::vector<int32_t> free_, table_;
};

class TensorParallelFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorParallelFixture, LogitsAndGreedyMatchHf) {
  auto collectives = MakeMpiCollectives(TestWorld());
  ASSERT_TRUE(collectives.ok()) << collectives.status();
  const int rank = (*collectives)->rank();
  LoadOptions load;
  load.model_dir = FixtureDir(GetParam());
  GptBigCodeRunnerOptions options;
  options.block_size = 8;
  options.num_kv_blocks = 64;
  auto runner = CreateGptBigCodeRunnerFromDir(load, collectives->get(), options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_EQ((*runner)->weights().shard.world_size, TestWorld().size());
  const int64_t vocab = (*runner)->vocab_size();
  const std::vector<Prompt> prompts = ReadPrompts(load.model_dir, vocab);
  ASSERT_FALSE(prompts.empty());

  double worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& p = prompts[i];
    Sequence seq(options.num_kv_blocks, options.block_size, 100 + i);
    // The prompt in two chunks (the second one crosses a block boundary for long prompts).
    const size_t split = p.tokens.size() / 3;
    std::vector<float> logits;
    for (auto [b, e] : {std::pair{size_t{0}, split}, std::pair{split, p.tokens.size()}}) {
      if (b == e) continue;
      auto out = (*runner)->Execute(
          seq.Step(std::vector<int32_t>(p.tokens.begin() + b, p.tokens.begin() + e), true));
      ASSERT_TRUE(out.ok()) << out.status();
      if (rank != 0) {
        ASSERT_EQ(out->dim(0), 0);
        continue;
      }
      ASSERT_EQ(out->shape(), (std::vector<int64_t>{static_cast<int64_t>(e - b), vocab}));
      logits.insert(logits.end(), out->data<float>(), out->data<float>() + out->numel());
    }
    if (rank == 0) {
      for (size_t t = 0; t < p.tokens.size(); ++t) {
        const double err = RowError(&logits[t * vocab], &p.logits[t * vocab], vocab);
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-4) << GetParam() << " prompt " << i << " position " << t;
      }
    }
    // Greedy: every rank feeds HF's token, rank 0 checks that its argmax agrees.
    int32_t next = -1;
    if (rank == 0) {
      const float* last = &logits[(p.tokens.size() - 1) * vocab];
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
