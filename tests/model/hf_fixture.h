// Reading the Hugging Face reference fixtures (tests/fixtures/models/<name>, written by
// tests/fixtures/make_fixtures.py) and building single-sequence steps over a paged KV cache, for
// the parity tests of the CPU forward, the tensor-parallel forward, the engine and the CUDA path.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/model_runner.h"

namespace mqa::testing {

inline std::string FixtureModelDir(const std::string& model) {
  const char* src = std::getenv("MQA_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/models/" + model;
}

struct HfReference {
  std::vector<int32_t> prompt;
  std::vector<float> logits;    // [prompt_len, vocab]: HF's fp32 logits at every position
  std::vector<int32_t> greedy;  // HF's greedy continuation
  std::vector<double> margins;  // HF's top-1 minus top-2 logit at each greedy step
};

// The prompts of `dir`/reference.json with their logits files (each must hold prompt_len x vocab
// floats).
inline std::vector<HfReference> LoadHfReferences(const std::string& dir, int64_t vocab) {
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << "missing " << dir << "/reference.json";
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<HfReference> refs;
  for (const auto& p : j["prompts"]) {
    HfReference r;
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

// max |got - ref| over a row, relative to the row's largest |ref|: the scale fp32 rounds at.
inline double RowRelativeError(const float* got, const float* ref, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return err / scale;
}

// One sequence growing step by step; its blocks come from a shuffled pool, so that block tables
// are not contiguous.
class PagedSequence {
 public:
  PagedSequence(int num_blocks, int block_size, uint64_t seed)
      : block_size_(block_size), free_(num_blocks) {
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937_64(seed));
  }

  // `tokens` at the next positions; logits for every row, or the last one only.
  StepInput Step(const std::vector<int32_t>& tokens, bool all_rows) {
    StepInput in;
    in.seq_ids = {1};
    const int end = length_ + static_cast<int>(tokens.size());
    while (static_cast<int>(table_.size()) * block_size_ < end) {
      MQA_CHECK(!free_.empty());
      table_.push_back(free_.back());
      free_.pop_back();
    }
    for (int p = length_; p < end; ++p) {
      in.token_ids.push_back(tokens[p - length_]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(table_[p / block_size_] * block_size_ + p % block_size_);
      if (all_rows || p == end - 1) in.logits_rows.push_back(p - length_);
    }
    in.query_start = {0, static_cast<int32_t>(tokens.size())};
    in.context_lens = {end};
    in.block_tables = table_;
    in.max_blocks_per_seq = static_cast<int>(table_.size());
    length_ = end;
    return in;
  }

 private:
  int block_size_;
  int length_ = 0;
  std::vector<int32_t> free_;
  std::vector<int32_t> table_;
};

}  // namespace mqa::testing
