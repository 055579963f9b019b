#include "benchmarks/mqabench/common.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "benchmarks/mqabench/device_fill.h"

namespace mqa::bench {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

StepInput MakeStep(const std::vector<Seq*>& seqs, const std::vector<std::vector<int32_t>>& chunk,
                   int block_size, bool all_rows) {
  StepInput in;
  in.query_start.push_back(0);
  size_t width = 0;
  for (const Seq* s : seqs) width = std::max(width, s->table.size());
  in.max_blocks_per_seq = static_cast<int>(width);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = *seqs[i];
    in.seq_ids.push_back(i);
    const int start = s.context;
    for (size_t j = 0; j < chunk[i].size(); ++j) {
      const int p = start + static_cast<int>(j);
      in.token_ids.push_back(chunk[i][j]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(s.table[p / block_size] * block_size + p % block_size);
    }
    in.query_start.push_back(in.num_tokens());
    in.context_lens.push_back(start + static_cast<int>(chunk[i].size()));
    const int first_row =
        all_rows ? in.query_start.back() - static_cast<int>(chunk[i].size()) : in.num_tokens() - 1;
    for (int row = first_row; row < in.num_tokens(); ++row) in.logits_rows.push_back(row);
    for (size_t b = 0; b < width; ++b)
      in.block_tables.push_back(b < s.table.size() ? s.table[b] : 0);
  }
  return in;
}

namespace {

int64_t WeightBytes(const GptBigCodeWeights& w) {
  int64_t bytes = w.lm_head.nbytes() + w.ln_f_w.nbytes() + w.ln_f_b.nbytes();
  for (const LayerWeights& L : w.layers) {
    for (const Tensor* t :
         {&L.ln_1_w, &L.ln_1_b, &L.c_attn_w, &L.c_attn_b, &L.c_proj_w, &L.c_proj_b, &L.ln_2_w,
          &L.ln_2_b, &L.c_fc_w, &L.c_fc_b, &L.mlp_proj_w, &L.mlp_proj_b}) {
      bytes += t->nbytes();
    }
  }
  return bytes;  // what a decode step reads (wte rows and wpe rows are negligible)
}

}  // namespace

absl::StatusOr<Setup> MakeSetup(const Flags& f, int num_blocks, int64_t max_tokens,
                                int64_t max_rows) {
  Setup s;
  ASSIGN_OR_RETURN(s.config, LoadModelConfig(f.model));
  s.dtype = f.dtype == "bfloat16" ? DType::kBF16 : DType::kF16;
  if (f.dtype == "auto" && s.config.checkpoint_dtype == DType::kBF16) s.dtype = DType::kBF16;
  ASSIGN_OR_RETURN(s.copy_bw, MeasureCopyBandwidth(size_t{4} << 30));
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(GptBigCodeWeights w, MakeDeviceDummyWeights(s.config, s.dtype, f.seed));
  s.weight_bytes = WeightBytes(w);
  std::printf(
      "# %s: %lld layers, E %lld, %lld heads, vocab %lld; %s weights %.2f GB made on the "
      "GPU in %.1f s; copy bandwidth %.2f TB/s (read + write)\n",
      f.model.c_str(), (long long)s.config.n_layer, (long long)s.config.n_embd,
      (long long)s.config.n_head, (long long)s.config.vocab_size,
      std::string(DTypeName(s.dtype)).c_str(), s.weight_bytes / 1e9,
      Seconds(t0, std::chrono::steady_clock::now()), s.copy_bw / 1e12);
  s.collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions o;
  o.device = Device::kCuda;
  o.block_size = f.block_size;
  o.num_kv_blocks = num_blocks;
  o.max_batched_tokens = max_tokens;
  o.max_logits_rows = max_rows;
  o.cuda_graphs = f.cuda_graphs;
  o.max_graph_query = f.graph_query;
  o.skinny_gemm = f.gemm != "cublaslt";
  o.gemm_autotune = f.autotune == "on" || f.autotune == "decode";
  o.gemm_autotune_max_m = f.autotune == "decode" ? kDecodeGemmAutotuneMaxM : 0;
  ASSIGN_OR_RETURN(s.runner, GptBigCodeRunner::Create(std::move(w), s.collectives.get(), o));
  std::printf("# KV bytes per token %lld (%.1f KiB), %d blocks of %d\n",
              (long long)s.runner->kv_bytes_per_token(), s.runner->kv_bytes_per_token() / 1024.0,
              s.runner->num_kv_blocks(), s.runner->block_size());
  return s;
}

}  // namespace mqa::bench
