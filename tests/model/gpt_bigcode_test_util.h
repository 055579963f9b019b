// Test helpers for the GPT-BigCode forward: a tiny random model, a dense double-precision
// reimplementation of HF's GPTBigCode forward (no cache, full causal attention), and a toy block
// manager (PagedSession) that turns "run these chunks of these sequences" into StepInputs with
// random, non-contiguous physical blocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "model/weights.h"
#include "runtime/model_runner.h"

namespace mqa::testing_util {

inline ModelConfig TinyConfig(bool multi_query) {
  ModelConfig c;
  c.vocab_size = 97;  // odd: no accidental alignment
  c.n_positions = 64;
  c.n_embd = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_inner = 128;
  c.multi_query = multi_query;
  c.num_kv_heads = multi_query ? 1 : c.n_head;
  c.layer_norm_epsilon = 1e-5f;
  c.activation = "gelu_pytorch_tanh";
  return c;
}

inline Tensor RandomTensor(std::vector<int64_t> shape, std::mt19937& rng, float mean,
                           float stddev) {
  Tensor t = Tensor::Cpu(std::move(shape));
  std::normal_distribution<float> normal(mean, stddev);
  for (float& v : t.span<float>()) v = normal(rng);
  return t;
}

// One rank (T = 1) of a random model, scaled so that activations, attention scores and logits
// are O(1)..O(10): attention is neither uniform nor one-hot, GELU is not linear.
inline GptBigCodeWeights RandomWeights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  GptBigCodeWeights w;
  w.config = c;
  w.shard.heads_per_rank = c.n_head;
  w.shard.kv_heads_per_rank = c.multi_query ? 1 : c.n_head;
  w.shard.vocab_shard = c.vocab_size;
  w.shard.inner_shard = c.n_inner;
  const int64_t E = c.n_embd;
  const float e_scale = 1.0f / std::sqrt(static_cast<float>(E));
  w.wte = RandomTensor({c.vocab_size, E}, rng, 0.0f, 1.0f);
  w.wpe = RandomTensor({c.n_positions, E}, rng, 0.0f, 0.5f);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights L;
    L.ln_1_w = RandomTensor({E}, rng, 1.0f, 0.2f);
    L.ln_1_b = RandomTensor({E}, rng, 0.0f, 0.2f);
    L.c_attn_w = RandomTensor({c.qkv_rows(), E}, rng, 0.0f, 2.0f * e_scale);
    L.c_attn_b = RandomTensor({c.qkv_rows()}, rng, 0.0f, 0.2f);
    L.c_proj_w = RandomTensor({E, E}, rng, 0.0f, e_scale);
    L.c_proj_b = RandomTensor({E}, rng, 0.0f, 0.2f);
    L.ln_2_w = RandomTensor({E}, rng, 1.0f, 0.2f);
    L.ln_2_b = RandomTensor({E}, rng, 0.0f, 0.2f);
    L.c_fc_w = RandomTensor({c.n_inner, E}, rng, 0.0f, e_scale);
    L.c_fc_b = RandomTensor({c.n_inner}, rng, 0.0f, 0.2f);
    L.mlp_proj_w = RandomTensor({E, c.n_inner}, rng, 0.0f, 1.0f / std::sqrt(float(c.n_inner)));
    L.mlp_proj_b = RandomTensor({E}, rng, 0.0f, 0.2f);
    w.layers.push_back(std::move(L));
  }
  w.ln_f_w = RandomTensor({E}, rng, 1.0f, 0.2f);
  w.ln_f_b = RandomTensor({E}, rng, 0.0f, 0.2f);
  w.lm_head = w.wte;  // tied
  return w;
}

// HF GPTBigCode in double, over the whole sequence (positions 0..n-1), weights in the layout of
// model/weights.h (c_attn rows [Q heads | K heads | V heads]). Returns logits [n][vocab].
inline std::vector<std::vector<double>> DenseReference(const GptBigCodeWeights& w,
                                                       const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const int64_t n = static_cast<int64_t>(tokens.size()), E = c.n_embd, H = c.n_head;
  const int64_t D = c.head_dim(), KV = c.num_kv_heads, F = c.n_inner;
  using Mat = std::vector<std::vector<double>>;
  auto f = [](const Tensor& t) { return t.data<float>(); };
  auto layer_norm = [&](const Mat& x, const Tensor& g, const Tensor& b) {
    Mat y(x.size(), std::vector<double>(E));
    for (size_t t = 0; t < x.size(); ++t) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < E; ++i) mean += x[t][i];
      mean /= E;
      for (int64_t i = 0; i < E; ++i) var += (x[t][i] - mean) * (x[t][i] - mean);
      var /= E;
      for (int64_t i = 0; i < E; ++i) {
        y[t][i] = (x[t][i] - mean) / std::sqrt(var + c.layer_norm_epsilon) * f(g)[i] + f(b)[i];
      }
    }
    return y;
  };
  auto linear = [&](const Mat& x, const Tensor& wt, const Tensor* b, int64_t out, int64_t in) {
    Mat y(x.size(), std::vector<double>(out));
    for (size_t t = 0; t < x.size(); ++t) {
      for (int64_t o = 0; o < out; ++o) {
        double acc = b ? f(*b)[o] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += x[t][i] * f(wt)[o * in + i];
        y[t][o] = acc;
      }
    }
    return y;
  };
  Mat h(n, std::vector<double>(E));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < E; ++i) h[t][i] = f(w.wte)[tokens[t] * E + i] + f(w.wpe)[t * E + i];
  }
  const double scale = c.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0;
  for (const LayerWeights& L : w.layers) {
    const Mat qkv =
        linear(layer_norm(h, L.ln_1_w, L.ln_1_b), L.c_attn_w, &L.c_attn_b, c.qkv_rows(), E);
    Mat attn(n, std::vector<double>(H * D, 0.0));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t g = hh / (H / KV);
        std::vector<double> score(t + 1);
        double mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qkv[t][hh * D + d] * qkv[s][H * D + g * D + d];
          score[s] = dot * scale;
          mx = std::max(mx, score[s]);
        }
        double denom = 0;
        for (auto& v : score) denom += (v = std::exp(v - mx));
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t d = 0; d < D; ++d) {
            attn[t][hh * D + d] += score[s] / denom * qkv[s][H * D + KV * D + g * D + d];
          }
        }
      }
    }
    const Mat o = linear(attn, L.c_proj_w, &L.c_proj_b, E, H * D);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < E; ++i) h[t][i] += o[t][i];
    }
    Mat m = linear(layer_norm(h, L.ln_2_w, L.ln_2_b), L.c_fc_w, &L.c_fc_b, F, E);
    for (auto& row : m) {
      for (double& x : row) {
        x = c.activation == "gelu"
                ? 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)))
                : 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      }
    }
    const Mat m2 = linear(m, L.mlp_proj_w, &L.mlp_proj_b, E, F);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < E; ++i) h[t][i] += m2[t][i];
    }
  }
  return linear(layer_norm(h, w.ln_f_w, w.ln_f_b), w.wte, nullptr, c.vocab_size, E);
}

// max |got - ref| relative to the row's largest |ref| (element-wise relative error is
// meaningless for logits near zero).
inline double MaxRelError(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(got[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / scale;
}

inline void ExpectLogitsNear(const std::vector<float>& got, const std::vector<double>& ref,
                             const std::string& what, double tolerance = 1e-4) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  EXPECT_LE(MaxRelError(got, ref), tolerance) << what;
}

// A toy block manager over a runner's pool: physical blocks handed out in a shuffled order, so
// tables are non-contiguous and sequences interleave.
class PagedSession {
 public:
  struct Row {
    int seq = 0;
    int position = 0;
    std::vector<float> logits;
  };

  PagedSession(ModelRunner* runner, uint32_t seed) : runner_(runner), bs_(runner->block_size()) {
    for (int b = 0; b < runner->num_kv_blocks(); ++b) free_.push_back(b);
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }

  int AddSequence(std::vector<int32_t> tokens) {
    seqs_.push_back({std::move(tokens), 0, {}});
    return static_cast<int>(seqs_.size()) - 1;
  }

  // A new sequence that shares `parent`'s cached prefix: its full blocks by reference, its
  // partial last block by a copy queued for the next step.
  int Fork(int parent, std::vector<int32_t> tokens) {
    Seq child{std::move(tokens), seqs_[parent].cached, seqs_[parent].blocks};
    if (child.cached % bs_ != 0) {
      const int copy = Allocate();
      copies_.push_back({child.blocks.back(), copy});
      child.blocks.back() = copy;
    }
    seqs_.push_back(std::move(child));
    return static_cast<int>(seqs_.size()) - 1;
  }

  int cached(int s) const { return seqs_[s].cached; }

  // The step that runs `chunks` ({sequence, tokens}); allocates blocks, does not advance.
  // logits_rows: the last row of each sequence.
  StepInput BuildStep(const std::vector<std::pair<int, int>>& chunks) {
    StepInput in;
    in.query_start.push_back(0);
    for (const auto& [s, len] : chunks) {
      Seq& seq = seqs_[s];
      const int end = seq.cached + len;
      while (static_cast<int>(seq.blocks.size()) * bs_ < end) seq.blocks.push_back(Allocate());
      for (int p = seq.cached; p < end; ++p) {
        in.token_ids.push_back(seq.tokens[p]);
        in.positions.push_back(p);
        in.slot_mapping.push_back(seq.blocks[p / bs_] * bs_ + p % bs_);
      }
      in.seq_ids.push_back(s);
      in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
      in.context_lens.push_back(end);
      in.logits_rows.push_back(static_cast<int32_t>(in.token_ids.size()) - 1);
      in.max_blocks_per_seq =
          std::max(in.max_blocks_per_seq, static_cast<int>(seq.blocks.size()) + 1);
    }
    in.block_tables.assign(chunks.size() * in.max_blocks_per_seq, 0);
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& blocks = seqs_[chunks[i].first].blocks;
      std::copy(blocks.begin(), blocks.end(), in.block_tables.begin() + i * in.max_blocks_per_seq);
    }
    in.block_copies = std::move(copies_);
    copies_.clear();
    return in;
  }

  // Runs `chunks` and advances the sequences. all_rows: logits for every token row, in order;
  // otherwise each sequence's last row plus a random subset, in a shuffled order.
  absl::StatusOr<std::vector<Row>> Step(const std::vector<std::pair<int, int>>& chunks,
                                        bool all_rows, std::mt19937* rng = nullptr) {
    StepInput in = BuildStep(chunks);
    std::vector<std::pair<int, int>> row_owner;  // token row -> (sequence, position)
    for (const auto& [s, len] : chunks) {
      for (int j = 0; j < len; ++j) row_owner.push_back({s, seqs_[s].cached + j});
    }
    if (all_rows) {
      in.logits_rows.resize(in.num_tokens());
      for (int t = 0; t < in.num_tokens(); ++t) in.logits_rows[t] = t;
    } else if (rng != nullptr) {
      for (int t = 0; t < in.num_tokens(); ++t) {
        if ((*rng)() % 4 == 0) in.logits_rows.push_back(t);
      }
      std::shuffle(in.logits_rows.begin(), in.logits_rows.end(), *rng);
    }
    absl::StatusOr<Tensor> logits = runner_->Execute(in);
    if (!logits.ok()) return logits.status();
    const int64_t vocab = runner_->vocab_size();
    if (logits->shape() !=
        std::vector<int64_t>{static_cast<int64_t>(in.logits_rows.size()), vocab}) {
      return absl::InternalError("logits of the wrong shape: " + logits->DebugString());
    }
    for (const auto& [s, len] : chunks) seqs_[s].cached += len;
    std::vector<Row> rows;
    for (size_t i = 0; i < in.logits_rows.size(); ++i) {
      const float* p = logits->data<float>() + i * vocab;
      const auto [s, pos] = row_owner[in.logits_rows[i]];
      rows.push_back({s, pos, std::vector<float>(p, p + vocab)});
    }
    return rows;
  }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    int cached = 0;
    std::vector<int32_t> blocks;
  };
  int Allocate() {
    EXPECT_FALSE(free_.empty()) << "test pool too small";
    const int b = free_.back();
    free_.pop_back();
    return b;
  }

  ModelRunner* runner_;
  int bs_;
  std::vector<int32_t> free_;
  std::vector<Seq> seqs_;
  std::vector<BlockCopy> copies_;
};

}  // namespace mqa::testing_util
