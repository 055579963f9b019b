// The weights of one tensor-parallel rank of a GPT-BigCode model, in the layout Forward uses.
// Shapes are [out, in] (PyTorch Linear / safetensors layout) for every matrix; this rank's shard:
//   wte:       [vocab_shard, E]  rows [rank*vocab_shard, (rank+1)*vocab_shard) of wte, zero-padded
//              past vocab_size (vocab padded to a multiple of T); also the tied lm_head
//   wpe:       [n_positions, E]  replicated
//   c_attn_w:  [H/T*D + 2*KV*D, E]  this rank's query rows followed by the K and V rows;
//              c_attn_b the same rows. Output row order, the same for both attention kinds:
//                [Q of heads rank*H/T .. (rank+1)*H/T - 1 (H/T*D) | K (KV*D) | V (KV*D)]
//              multi_query=true: KV = 1, the one K/V head, replicated on every rank (HF rows
//              [E, E + 2D)). multi_query=false: KV = H/T, K rows of this rank's heads in head
//              order, then their V rows. HF stores that case interleaved per head (its forward
//              views c_attn's output as [n_head, 3*D]: rows h*3D + [0, D) = q_h, + [D, 2D) =
//              k_h, + [2D, 3D) = v_h); model/weights_loader.cc regroups it at load.
//   c_proj_w:  [E, H/T*D]  input columns of this rank's heads (row-parallel); c_proj_b on rank 0
//              only (zeros elsewhere) so that the all-reduce adds it once
//   c_fc_w:    [n_inner/T, E] (column-parallel), c_fc_b its slice
//   mlp_proj_w:[E, n_inner/T] (row-parallel), mlp_proj_b on rank 0 only
#pragma once

#include <vector>

#include "model/config.h"
#include "runtime/tensor.h"

namespace mqa {

struct LayerWeights {
  Tensor ln_1_w, ln_1_b;
  Tensor c_attn_w, c_attn_b;
  Tensor c_proj_w, c_proj_b;
  Tensor ln_2_w, ln_2_b;
  Tensor c_fc_w, c_fc_b;
  Tensor mlp_proj_w, mlp_proj_b;
};

struct ShardInfo {
  int rank = 0;
  int world_size = 1;
  int64_t heads_per_rank = 0;   // H / T
  int64_t kv_heads_per_rank = 0;  // 1 (MQA, replicated) or H / T
  int64_t vocab_shard = 0;      // ceil(vocab / T)
  int64_t inner_shard = 0;      // n_inner / T
};

struct GptBigCodeWeights {
  ModelConfig config;
  ShardInfo shard;
  Tensor wte, wpe;
  std::vector<LayerWeights> layers;
  Tensor ln_f_w, ln_f_b;
  Tensor lm_head;  // [vocab_shard, E]; the same buffer as wte when tied
};

}  // namespace mqa
