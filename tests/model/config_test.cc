#include "model/config.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/model/safetensors_writer.h"

namespace mqa {
namespace {

using nlohmann::json;

// The shape of a transformers 4.28 config (torch_dtype, no num_key_value_heads).
json OldConfig() {
  return json::parse(R"({
    "activation_function": "gelu_pytorch_tanh", "architectures": ["GPTBigCodeForCausalLM"],
    "attention_softmax_in_fp32": true, "attn_pdrop": 0.1, "bos_token_id": 7, "embd_pdrop": 0.1,
    "eos_token_id": 9, "initializer_range": 0.03, "layer_norm_epsilon": 2e-05,
    "model_type": "gpt_bigcode", "multi_query": true, "n_embd": 96, "n_head": 6,
    "n_inner": 200, "n_layer": 3, "n_positions": 128, "scale_attn_weights": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.28.1", "vocab_size": 301
  })");
}

absl::StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "cfg.json"); }

TEST(ConfigTest, OldSpelling) {
  auto c = Parse(OldConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 301);
  EXPECT_EQ(c->n_positions, 128);
  EXPECT_EQ(c->n_embd, 96);
  EXPECT_EQ(c->n_layer, 3);
  EXPECT_EQ(c->n_head, 6);
  EXPECT_EQ(c->head_dim(), 16);
  EXPECT_EQ(c->n_inner, 200);
  EXPECT_TRUE(c->multi_query);
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->qkv_rows(), 96 + 32);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 2e-5f);
  EXPECT_FLOAT_EQ(c->initializer_range, 0.03f);
  EXPECT_FALSE(c->scale_attn_weights);
  EXPECT_EQ(c->activation, "gelu_pytorch_tanh");
  EXPECT_EQ(c->checkpoint_dtype, DType::kBF16);
  EXPECT_EQ(c->bos_token_id, 7);
  EXPECT_EQ(c->eos_token_id, 9);
}

TEST(ConfigTest, NewSpelling) {
  json j = OldConfig();
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  j["num_key_value_heads"] = 1;
  j["activation_function"] = "gelu";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_dtype, DType::kF16);
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->activation, "gelu");
}

TEST(ConfigTest, MultiQueryFalse) {
  json j = OldConfig();
  j["multi_query"] = false;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->multi_query);
  EXPECT_EQ(c->num_kv_heads, 6);
  EXPECT_EQ(c->qkv_rows(), 3 * 96);

  j["num_key_value_heads"] = 6;  // the newer spelling agrees
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 6);

  j["num_key_value_heads"] = 1;  // and disagreeing is an error naming the field
  c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("num_key_value_heads"), std::string::npos);

  j.erase("multi_query");  // num_key_value_heads alone decides
  j["num_key_value_heads"] = 6;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->multi_query);
}

TEST(ConfigTest, NInnerNullIsFourTimesEmbd) {
  json j = OldConfig();
  j["n_inner"] = nullptr;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_inner, 4 * 96);
  j.erase("n_inner");
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_inner, 4 * 96);
}

TEST(ConfigTest, DefaultsWhenOptionalFieldsAbsent) {
  json j = OldConfig();
  for (const char* k :
       {"torch_dtype", "layer_norm_epsilon", "initializer_range", "scale_attn_weights",
        "activation_function", "bos_token_id", "eos_token_id", "multi_query"}) {
    j.erase(k);
  }
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_dtype, DType::kF32);
  EXPECT_TRUE(c->multi_query);
  EXPECT_TRUE(c->scale_attn_weights);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->activation, "gelu_pytorch_tanh");
}

TEST(ConfigTest, UnknownModelTypeIsAnError) {
  json j = OldConfig();
  j["model_type"] = "llama";
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("cfg.json"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("llama"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("gpt_bigcode"), std::string::npos) << c.status();
  j.erase("model_type");
  EXPECT_FALSE(Parse(j).ok());
}

// Each broken field: the error names the file and the field.
TEST(ConfigTest, MissingAndIllTypedFieldsNameFileAndField) {
  struct Case {
    const char* field;
    json value;  // null json with erase=true means "remove the field"
    bool erase;
  };
  const Case cases[] = {
      {"n_embd", nullptr, true},
      {"n_embd", "96", false},
      {"n_head", 6.5, false},
      {"vocab_size", -3, false},
      {"n_layer", nullptr, true},
      {"n_positions", json::array(), false},
      {"multi_query", "yes", false},
      {"layer_norm_epsilon", "small", false},
      {"torch_dtype", "float64", false},
      {"activation_function", "relu", false},
      {"eos_token_id", 301, false},
      {"n_inner", 0, false},
  };
  for (const Case& k : cases) {
    json j = OldConfig();
    if (k.erase) {
      j.erase(k.field);
    } else {
      j[k.field] = k.value;
    }
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << k.field;
    EXPECT_NE(c.status().message().find("cfg.json"), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find(k.field), std::string::npos) << c.status();
  }
}

TEST(ConfigTest, EmbdNotMultipleOfHeads) {
  json j = OldConfig();
  j["n_head"] = 7;
  auto c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("n_head"), std::string::npos) << c.status();
}

TEST(ConfigTest, BadJsonNamesFile) {
  auto c = ParseModelConfig("{\"n_embd\": ", "broken.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("broken.json"), std::string::npos);
  EXPECT_FALSE(ParseModelConfig("[1, 2]", "list.json").ok());
}

TEST(ConfigTest, LoadFromDirectoryAndMissingFile) {
  const std::string dir = testing::MakeTempDir("cfg");
  testing::WriteFileOrDie(dir + "/config.json", OldConfig().dump());
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 301);
  auto missing = LoadModelConfig(dir + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope/config.json"), std::string::npos);
}

// The committed configs/ folders: the published models' shapes.
TEST(ConfigTest, ShippedConfigs) {
  const char* src = std::getenv("MQA_SOURCE_DIR");
  const std::string root = src ? src : MQA_SOURCE_DIR_DEFAULT;
  struct Expect {
    const char* dir;
    int64_t vocab, positions, embd, layers, heads, inner;
  };
  const Expect models[] = {
      {"starcoder", 49152, 8192, 6144, 40, 48, 24576},
      {"starcoderbase-1b", 49152, 8192, 2048, 24, 16, 8192},
      {"santacoder", 49280, 2048, 2048, 24, 16, 8192},  // n_inner null -> 4 * 2048
      {"tiny_starcoder", 49152, 8192, 768, 20, 12, 3072},
  };
  for (const Expect& m : models) {
    auto c = LoadModelConfig(root + "/configs/" + m.dir);
    ASSERT_TRUE(c.ok()) << m.dir << ": " << c.status();
    EXPECT_EQ(c->vocab_size, m.vocab) << m.dir;
    EXPECT_EQ(c->n_positions, m.positions) << m.dir;
    EXPECT_EQ(c->n_embd, m.embd) << m.dir;
    EXPECT_EQ(c->n_layer, m.layers) << m.dir;
    EXPECT_EQ(c->n_head, m.heads) << m.dir;
    EXPECT_EQ(c->n_inner, m.inner) << m.dir;
    EXPECT_TRUE(c->multi_query) << m.dir;
    EXPECT_EQ(c->num_kv_heads, 1) << m.dir;
  }
}

}  // namespace
}  // namespace mqa
