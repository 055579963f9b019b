// ModelConfig: what mqaserve needs from a GPT-BigCode config.json, in native types.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/dtype.h"

namespace mqa {

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t n_positions = 0;   // max positions (wpe rows)
  int64_t n_embd = 0;        // hidden size E
  int64_t n_layer = 0;
  int64_t n_head = 0;        // query heads H
  int64_t n_inner = 0;       // MLP width (config null -> 4 * n_embd)
  int64_t num_kv_heads = 1;  // 1 when multi_query, else n_head
  bool multi_query = true;
  float layer_norm_epsilon = 1e-5f;
  float initializer_range = 0.02f;
  bool scale_attn_weights = true;
  std::string activation = "gelu_pytorch_tanh";  // gelu_pytorch_tanh | gelu | gelu_new
  DType checkpoint_dtype = DType::kF32;          // torch_dtype / dtype
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  int64_t head_dim() const { return n_embd / n_head; }
  // Rows of c_attn's output: H*D queries plus K and V for each KV head.
  int64_t qkv_rows() const { return n_embd + 2 * num_kv_heads * head_dim(); }
};

// Parses config.json text; `source` names the file in errors.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source);
// Reads DIR/config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace mqa
