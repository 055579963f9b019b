#include "model/weights_loader.h"

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/model/safetensors_writer.h"

namespace mqa {
namespace {

using nlohmann::json;
using Shape = std::vector<int64_t>;

// A tiny GPT-BigCode with random full (unsharded) weights, kept as floats exactly
// representable in the file dtype.
struct TinyModel {
  json config;
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::vector<float>> values;
};

constexpr int64_t kVocab = 37;  // not a multiple of 2 or 4: exercises the vocab padding
constexpr int64_t kPositions = 8;
constexpr int64_t kEmbd = 16;
constexpr int64_t kHeads = 4;
constexpr int64_t kHeadDim = kEmbd / kHeads;
constexpr int64_t kLayers = 2;
constexpr int64_t kInner = 24;

json TinyConfig(bool multi_query) {
  return {{"model_type", "gpt_bigcode"}, {"vocab_size", kVocab},
          {"n_positions", kPositions},   {"n_embd", kEmbd},
          {"n_layer", kLayers},          {"n_head", kHeads},
          {"n_inner", kInner},           {"multi_query", multi_query},
          {"initializer_range", 0.02},   {"torch_dtype", "float32"}};
}

TinyModel MakeTiny(bool multi_query, bool untied_lm_head, DType dtype, uint32_t seed) {
  TinyModel m;
  m.config = TinyConfig(multi_query);
  const int64_t qkv = kEmbd + 2 * (multi_query ? 1 : kHeads) * kHeadDim;
  m.shapes["transformer.wte.weight"] = {kVocab, kEmbd};
  m.shapes["transformer.wpe.weight"] = {kPositions, kEmbd};
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i, ".");
    m.shapes[p + "ln_1.weight"] = {kEmbd};
    m.shapes[p + "ln_1.bias"] = {kEmbd};
    m.shapes[p + "attn.c_attn.weight"] = {qkv, kEmbd};
    m.shapes[p + "attn.c_attn.bias"] = {qkv};
    m.shapes[p + "attn.c_proj.weight"] = {kEmbd, kEmbd};
    m.shapes[p + "attn.c_proj.bias"] = {kEmbd};
    m.shapes[p + "ln_2.weight"] = {kEmbd};
    m.shapes[p + "ln_2.bias"] = {kEmbd};
    m.shapes[p + "mlp.c_fc.weight"] = {kInner, kEmbd};
    m.shapes[p + "mlp.c_fc.bias"] = {kInner};
    m.shapes[p + "mlp.c_proj.weight"] = {kEmbd, kInner};
    m.shapes[p + "mlp.c_proj.bias"] = {kEmbd};
  }
  m.shapes["transformer.ln_f.weight"] = {kEmbd};
  m.shapes["transformer.ln_f.bias"] = {kEmbd};
  if (untied_lm_head) m.shapes["lm_head.weight"] = {kVocab, kEmbd};
  std::mt19937 rng(seed);
  for (const auto& [name, shape] : m.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    m.values[name] = testing::RandomValues(n, dtype, rng);
  }
  return m;
}

testing::StTensor Encode(const TinyModel& m, const std::string& name, DType dtype) {
  return {name, testing::SafetensorsDTypeName(dtype), m.shapes.at(name),
          testing::EncodeFloats(m.values.at(name), dtype)};
}

// Writes config.json and either one model.safetensors or `shards` files plus the index.
void WriteModel(const std::string& dir, const TinyModel& m, DType dtype, int shards = 1) {
  testing::WriteFileOrDie(dir + "/config.json", m.config.dump());
  if (shards == 1) {
    std::vector<testing::StTensor> all;
    for (const auto& [name, shape] : m.shapes) all.push_back(Encode(m, name, dtype));
    testing::WriteFileOrDie(dir + "/model.safetensors", testing::BuildSafetensors(all));
    return;
  }
  std::vector<std::vector<testing::StTensor>> files(shards);
  json weight_map = json::object();
  int k = 0;
  for (const auto& [name, shape] : m.shapes) {
    const int f = k++ % shards;
    files[f].push_back(Encode(m, name, dtype));
    weight_map[name] = absl::StrCat("model-0000", f + 1, "-of-0000", shards, ".safetensors");
  }
  for (int f = 0; f < shards; ++f) {
    testing::WriteFileOrDie(
        absl::StrCat(dir, "/model-0000", f + 1, "-of-0000", shards, ".safetensors"),
        testing::BuildSafetensors(files[f]));
  }
  testing::WriteFileOrDie(
      dir + "/model.safetensors.index.json",
      json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

float At(const Tensor& t, int64_t i) {
  float v = 0;
  ConvertFloats(static_cast<const char*>(t.raw()) + i * DTypeSize(t.dtype()), t.dtype(), &v,
                DType::kF32, 1);
  return v;
}

float Round(float v, DType dtype) {
  float out = 0;
  uint16_t bits[2];
  ConvertFloats(&v, DType::kF32, bits, dtype, 1);
  ConvertFloats(bits, dtype, &out, DType::kF32, 1);
  return out;
}

std::vector<GptBigCodeWeights> LoadAllRanks(const LoadOptions& base, int world) {
  std::vector<GptBigCodeWeights> ranks;
  for (int r = 0; r < world; ++r) {
    LoadOptions o = base;
    o.rank = r;
    o.world_size = world;
    auto w = LoadWeights(o);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return {};
    ranks.push_back(*std::move(w));
  }
  return ranks;
}

// Checks every rank's shard against the full HF tensors: concatenating the shards (in the
// layout of model/weights.h) reproduces the model.
void ExpectShardsReproduce(const TinyModel& m, const std::vector<GptBigCodeWeights>& ranks,
                           DType dtype, bool untied) {
  const int T = static_cast<int>(ranks.size());
  const bool mq = m.config["multi_query"].get<bool>();
  const int64_t Hl = kHeads / T, D = kHeadDim, local_q = Hl * D;
  const int64_t vs = (kVocab + T - 1) / T, il = kInner / T;
  auto full = [&](const std::string& name, int64_t row, int64_t col = 0) {
    const Shape& s = m.shapes.at(name);
    return Round(m.values.at(name)[row * (s.size() == 2 ? s[1] : 1) + col], dtype);
  };
  for (int r = 0; r < T; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r, " of ", T));
    const GptBigCodeWeights& w = ranks[r];
    EXPECT_EQ(w.shard.rank, r);
    EXPECT_EQ(w.shard.heads_per_rank, Hl);
    EXPECT_EQ(w.shard.kv_heads_per_rank, mq ? 1 : Hl);
    EXPECT_EQ(w.shard.vocab_shard, vs);
    EXPECT_EQ(w.wte.dtype(), dtype);
    ASSERT_EQ(w.wte.shape(), (Shape{vs, kEmbd}));
    for (int64_t i = 0; i < vs; ++i) {
      const int64_t g = r * vs + i;
      for (int64_t e = 0; e < kEmbd; ++e) {
        const float want = g < kVocab ? full("transformer.wte.weight", g, e) : 0.0f;
        ASSERT_EQ(At(w.wte, i * kEmbd + e), want) << "wte row " << g;
        const float head = g >= kVocab ? 0.0f : untied ? full("lm_head.weight", g, e) : want;
        ASSERT_EQ(At(w.lm_head, i * kEmbd + e), head) << "lm_head row " << g;
      }
    }
    EXPECT_EQ(w.lm_head.raw() == w.wte.raw(), !untied);
    ASSERT_EQ(w.wpe.shape(), (Shape{kPositions, kEmbd}));
    EXPECT_EQ(At(w.wpe, 5 * kEmbd + 3), full("transformer.wpe.weight", 5, 3));
    for (int64_t e = 0; e < kEmbd; ++e) {
      ASSERT_EQ(At(w.ln_f_w, e), full("transformer.ln_f.weight", e, 0));
      ASSERT_EQ(At(w.ln_f_b, e), full("transformer.ln_f.bias", e, 0));
    }
    ASSERT_EQ(w.layers.size(), static_cast<size_t>(kLayers));
    for (int64_t li = 0; li < kLayers; ++li) {
      const LayerWeights& l = w.layers[li];
      const std::string p = absl::StrCat("transformer.h.", li, ".");
      for (int64_t e = 0; e < kEmbd; ++e) {
        ASSERT_EQ(At(l.ln_1_w, e), full(p + "ln_1.weight", e));
        ASSERT_EQ(At(l.ln_1_b, e), full(p + "ln_1.bias", e));
        ASSERT_EQ(At(l.ln_2_w, e), full(p + "ln_2.weight", e));
        ASSERT_EQ(At(l.ln_2_b, e), full(p + "ln_2.bias", e));
      }
      // c_attn: HF's output viewed per its forward. MQA: [Q(all heads) | K | V];
      // MHA: .view(n_head, 3 * head_dim) -> per head [q_h | k_h | v_h].
      const int64_t kv_rows = (mq ? 1 : Hl) * D;
      ASSERT_EQ(l.c_attn_w.shape(), (Shape{local_q + 2 * kv_rows, kEmbd}));
      ASSERT_EQ(l.c_attn_b.shape(), (Shape{local_q + 2 * kv_rows}));
      auto hf_row = [&](int64_t head, int part, int64_t d) {  // part 0 q, 1 k, 2 v
        if (mq) return part == 0 ? head * D + d : kEmbd + (part - 1) * D + d;
        return head * 3 * D + part * D + d;
      };
      for (int64_t j = 0; j < Hl; ++j) {
        const int64_t h = r * Hl + j;
        for (int64_t d = 0; d < D; ++d) {
          for (int part = 0; part < 3; ++part) {
            // This rank's layout: [Q of its heads | K rows | V rows]; MQA's K/V are the one
            // shared head (so j does not move them), MHA's are its heads' in order.
            const int64_t local_row =
                part == 0 ? j * D + d : local_q + (part - 1) * kv_rows + (mq ? 0 : j * D) + d;
            const int64_t src = hf_row(h, part, d);
            ASSERT_EQ(At(l.c_attn_b, local_row), full(p + "attn.c_attn.bias", src));
            for (int64_t e = 0; e < kEmbd; ++e) {
              ASSERT_EQ(At(l.c_attn_w, local_row * kEmbd + e),
                        full(p + "attn.c_attn.weight", src, e))
                  << "head " << h << " part " << part << " d " << d;
            }
          }
        }
      }
      ASSERT_EQ(l.c_proj_w.shape(), (Shape{kEmbd, local_q}));
      for (int64_t o = 0; o < kEmbd; ++o) {
        for (int64_t k = 0; k < local_q; ++k) {
          ASSERT_EQ(At(l.c_proj_w, o * local_q + k),
                    full(p + "attn.c_proj.weight", o, r * local_q + k));
        }
        ASSERT_EQ(At(l.c_proj_b, o), r == 0 ? full(p + "attn.c_proj.bias", o) : 0.0f);
        ASSERT_EQ(At(l.mlp_proj_b, o), r == 0 ? full(p + "mlp.c_proj.bias", o) : 0.0f);
      }
      ASSERT_EQ(l.c_fc_w.shape(), (Shape{il, kEmbd}));
      ASSERT_EQ(l.c_fc_b.shape(), (Shape{il}));
      ASSERT_EQ(l.mlp_proj_w.shape(), (Shape{kEmbd, il}));
      for (int64_t i = 0; i < il; ++i) {
        ASSERT_EQ(At(l.c_fc_b, i), full(p + "mlp.c_fc.bias", r * il + i));
        for (int64_t e = 0; e < kEmbd; ++e) {
          ASSERT_EQ(At(l.c_fc_w, i * kEmbd + e), full(p + "mlp.c_fc.weight", r * il + i, e));
          ASSERT_EQ(At(l.mlp_proj_w, e * il + i), full(p + "mlp.c_proj.weight", e, r * il + i));
        }
      }
    }
  }
}

struct LoadCase {
  bool multi_query;
  DType file_dtype;
  DType target;
  bool untied;
  int shards;
};

class LoadWeightsTest : public ::testing::TestWithParam<LoadCase> {};

TEST_P(LoadWeightsTest, ShardsReproduceTheFullModelAtWorldSizes1_2_4) {
  const LoadCase c = GetParam();
  const TinyModel m = MakeTiny(c.multi_query, c.untied, c.file_dtype, 77);
  const std::string dir = testing::MakeTempDir("model");
  WriteModel(dir, m, c.file_dtype, c.shards);
  for (int T : {1, 2, 4}) {
    LoadOptions o;
    o.model_dir = dir;
    o.dtype = c.target;
    const auto ranks = LoadAllRanks(o, T);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(T));
    ExpectShardsReproduce(m, ranks, c.target, c.untied);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LoadWeightsTest,
                         ::testing::Values(LoadCase{true, DType::kF32, DType::kF32, false, 1},
                                           LoadCase{false, DType::kF32, DType::kF32, false, 1},
                                           LoadCase{true, DType::kBF16, DType::kF32, true, 3},
                                           LoadCase{false, DType::kF16, DType::kF32, true, 2},
                                           LoadCase{true, DType::kF32, DType::kBF16, false, 1},
                                           LoadCase{false, DType::kF32, DType::kF16, false, 2}),
                         [](const ::testing::TestParamInfo<LoadCase>& info) {
                           const LoadCase& c = info.param;
                           return absl::StrCat(c.multi_query ? "mqa" : "mha", "_",
                                               testing::SafetensorsDTypeName(c.file_dtype), "_to_",
                                               testing::SafetensorsDTypeName(c.target),
                                               c.untied ? "_untied" : "_tied", "_", c.shards,
                                               "files");
                         });

TEST(LoadWeightsErrors, ShapeMismatchWithConfigNamesFileTensorAndShapes) {
  TinyModel m = MakeTiny(true, false, DType::kF32, 5);
  const std::string name = "transformer.h.1.mlp.c_fc.weight";
  m.shapes[name] = {20, kEmbd};
  m.values[name].resize(20 * kEmbd);
  const std::string dir = testing::MakeTempDir("bad_shape");
  WriteModel(dir, m, DType::kF32);
  LoadOptions o;
  o.model_dir = dir;
  auto w = LoadWeights(o);
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  for (const std::string& part :
       {dir + "/model.safetensors", name, std::string("[20, 16]"), std::string("[24, 16]")}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from " << msg;
  }
}

TEST(LoadWeightsErrors, MissingTensorNamesIt) {
  TinyModel m = MakeTiny(true, false, DType::kF32, 6);
  m.shapes.erase("transformer.ln_f.bias");
  const std::string dir = testing::MakeTempDir("missing");
  WriteModel(dir, m, DType::kF32, 2);
  LoadOptions o;
  o.model_dir = dir;
  auto w = LoadWeights(o);
  ASSERT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
  EXPECT_NE(w.status().message().find("transformer.ln_f.bias"), std::string::npos);
  EXPECT_NE(w.status().message().find("model.safetensors.index.json"), std::string::npos);
}

TEST(LoadWeightsErrors, BadOptions) {
  const std::string dir = testing::MakeTempDir("opts");
  testing::WriteFileOrDie(dir + "/config.json", TinyConfig(true).dump());
  LoadOptions o;
  o.model_dir = dir;
  o.load_format = "dummy";
  o.world_size = 3;  // 4 heads
  auto w = LoadWeights(o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("n_head (4)"), std::string::npos) << w.status();
  o.world_size = 2;
  o.rank = 2;
  EXPECT_FALSE(LoadWeights(o).ok());
  o.rank = 0;
  o.load_format = "pickle";
  EXPECT_NE(LoadWeights(o).status().message().find("pickle"), std::string::npos);
  o.load_format = "auto";  // no checkpoint in the folder: not silently random
  auto a = LoadWeights(o);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound) << a.status();
  EXPECT_NE(a.status().message().find("dummy"), std::string::npos);
}

TEST(LoadWeightsProgress, ReportsEveryTensorAndByte) {
  const TinyModel m = MakeTiny(true, false, DType::kF32, 8);
  const std::string dir = testing::MakeTempDir("progress");
  WriteModel(dir, m, DType::kF32);
  LoadOptions o;
  o.model_dir = dir;
  o.world_size = 2;
  o.rank = 1;
  uint64_t last_bytes = 0;
  int64_t last_tensors = 0, calls = 0;
  o.progress = [&](uint64_t bytes, int64_t tensors) {
    EXPECT_GT(bytes, last_bytes);
    EXPECT_EQ(tensors, last_tensors + 1);
    last_bytes = bytes;
    last_tensors = tensors;
    ++calls;
  };
  auto w = LoadWeights(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(calls, 4 + 12 * kLayers);
  uint64_t total = w->wte.nbytes() + w->wpe.nbytes() + w->ln_f_w.nbytes() + w->ln_f_b.nbytes();
  for (const LayerWeights& l : w->layers) {
    for (const Tensor* t :
         {&l.ln_1_w, &l.ln_1_b, &l.c_attn_w, &l.c_attn_b, &l.c_proj_w, &l.c_proj_b, &l.ln_2_w,
          &l.ln_2_b, &l.c_fc_w, &l.c_fc_b, &l.mlp_proj_w, &l.mlp_proj_b}) {
      total += t->nbytes();
    }
  }
  EXPECT_EQ(last_bytes, total);
}

// A bare GPTBigCodeModel checkpoint has no "transformer." prefix.
TEST(LoadWeightsPrefix, UnprefixedNames) {
  TinyModel m = MakeTiny(true, false, DType::kF32, 9);
  TinyModel bare = m;
  bare.shapes.clear();
  bare.values.clear();
  for (const auto& [name, shape] : m.shapes) {
    const std::string n = name.substr(std::string("transformer.").size());
    bare.shapes[n] = shape;
    bare.values[n] = m.values.at(name);
  }
  const std::string dir = testing::MakeTempDir("bare");
  WriteModel(dir, bare, DType::kF32);
  LoadOptions o;
  o.model_dir = dir;
  auto w = LoadWeights(o);
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectShardsReproduce(m, {*w}, DType::kF32, false);
}

// --- Dummy weights ----------------------------------------------------------------------------

TEST(DummyWeights, ShapesValuesAndWorldSizeConsistency) {
  const std::string dir = testing::MakeTempDir("dummy");
  json cfg = TinyConfig(false);
  cfg["n_embd"] = 64;
  cfg["vocab_size"] = 1001;
  cfg["initializer_range"] = 0.05;
  testing::WriteFileOrDie(dir + "/config.json", cfg.dump());
  LoadOptions o;
  o.model_dir = dir;
  o.load_format = "dummy";
  o.seed = 42;
  const auto one = LoadAllRanks(o, 1);
  const auto two = LoadAllRanks(o, 2);
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(two.size(), 2u);

  // The dummy model at T=2 is the T=1 model, sharded.
  TinyModel m;
  m.config = cfg;
  const GptBigCodeWeights& w = one[0];
  const int64_t E = 64, V = 1001, D = E / kHeads;
  auto flat = [](const Tensor& t) {
    std::vector<float> v(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = At(t, i);
    return v;
  };
  m.shapes["transformer.wte.weight"] = {V, E};
  m.values["transformer.wte.weight"] = flat(w.wte);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < two[r].wte.dim(0); ++i) {
      const int64_t g = r * two[r].wte.dim(0) + i;
      for (int64_t e = 0; e < E; ++e) {
        ASSERT_EQ(At(two[r].wte, i * E + e), g < V ? At(w.wte, g * E + e) : 0.0f);
      }
    }
    // MHA c_attn, rank r's Q rows: head h = r*2 + j at HF rows h*3D .. +D, which in the T=1
    // layout sit at Q row h*D.
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t h = r * 2 + j;
      for (int64_t e = 0; e < E; ++e) {
        ASSERT_EQ(At(two[r].layers[1].c_attn_w, (j * D) * E + e),
                  At(w.layers[1].c_attn_w, (h * D) * E + e));
        ASSERT_EQ(At(two[r].layers[1].c_attn_w, (2 * D * 2 + j * D + 1) * E + e),  // V rows
                  At(w.layers[1].c_attn_w, (2 * E + h * D + 1) * E + e));
      }
    }
  }

  // Shapes, the initializer's statistics, layer norms 1 and biases 0.
  ASSERT_EQ(w.layers[0].c_attn_w.shape(), (Shape{3 * E, E}));
  ASSERT_EQ(w.layers[0].c_fc_w.shape(), (Shape{kInner, E}));
  double sum = 0, sq = 0;
  for (float v : m.values["transformer.wte.weight"]) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(V * E);
  EXPECT_NEAR(sum / n, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / n), 0.05, 0.0025);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(At(w.layers[0].ln_1_w, e), 1.0f);
    EXPECT_EQ(At(w.layers[0].ln_1_b, e), 0.0f);
    EXPECT_EQ(At(w.layers[1].c_proj_b, e), 0.0f);
  }
  EXPECT_EQ(w.lm_head.raw(), w.wte.raw());

  // Another seed gives other weights; a target dtype is honoured.
  o.seed = 43;
  o.dtype = DType::kBF16;
  auto other = LoadWeights(o);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->wte.dtype(), DType::kBF16);
  EXPECT_EQ(other->layers[0].c_fc_w.dtype(), DType::kBF16);
  int same = 0;
  for (int64_t i = 0; i < 100; ++i) same += At(other->wte, i) == At(w.wte, i);
  EXPECT_LT(same, 5);
}

}  // namespace
}  // namespace mqa
