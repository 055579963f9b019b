#include "model/gpt_bigcode.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

#ifdef MQA_WITH_CUDA
#include "kernels/block_copy.h"
#include "kernels/gemm_cuda.h"
#include "kernels/paged_attention_cuda.h"
#include "kernels/sampling_cuda.h"
#include "runtime/cuda_check.h"
#endif

namespace mqa {
namespace {

absl::Status CheckTensor(const Tensor& t, std::string_view name, std::vector<int64_t> shape,
                         DType dtype, Device device) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("weight ", std::string(name), " is missing"));
  }
  if (t.shape() != shape || t.dtype() != dtype || t.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight ", std::string(name), " is ", t.DebugString(), ", expected ",
                     std::string(DTypeName(dtype)), "[", absl::StrJoin(shape, ", "), "]",
                     device == Device::kCpu ? " cpu" : " cuda"));
  }
  return absl::OkStatus();
}

}  // namespace

// --- PagedKvCache ---------------------------------------------------------------------------

int64_t PagedKvCache::BytesPerBlock(const Shape& s, DType dtype) {
  return 2 * s.num_layers * s.block_size * s.kv_heads * s.head_dim *
         static_cast<int64_t>(DTypeSize(dtype));
}

absl::StatusOr<PagedKvCache> PagedKvCache::Allocate(const Shape& shape, DType dtype,
                                                    Device device) {
  if (!IsSupportedBlockSize(shape.block_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block size ", shape.block_size, " is not supported (8, 16 or 32)"));
  }
  if (shape.num_layers <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: layers ", shape.num_layers, ", kv heads ", shape.kv_heads, ", head_dim ",
        shape.head_dim, ", blocks ", shape.num_blocks, " must all be positive"));
  }
  PagedKvCache cache;
  cache.shape_ = shape;
  const std::vector<int64_t> dims = {shape.num_blocks, shape.block_size, shape.kv_heads,
                                     shape.head_dim};
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    ASSIGN_OR_RETURN(Tensor k, Tensor::Empty(dims, dtype, device));
    ASSIGN_OR_RETURN(Tensor v, Tensor::Empty(dims, dtype, device));
    cache.key_.push_back(std::move(k));
    cache.value_.push_back(std::move(v));
  }
  if (device == Device::kCuda) {
#ifdef MQA_WITH_CUDA
    std::vector<void*> ptrs;
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      ptrs.push_back(cache.key_[l].raw());
      ptrs.push_back(cache.value_[l].raw());
    }
    ASSIGN_OR_RETURN(cache.tensor_table_,
                     Tensor::Empty({static_cast<int64_t>(ptrs.size())}, DType::kI64, device));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(cache.tensor_table_.raw(), ptrs.data(),
                                    ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
#endif
  }
  return cache;
}

absl::Status PagedKvCache::CopyBlock(int src, int dst) {
  if (src < 0 || src >= shape_.num_blocks || dst < 0 || dst >= shape_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("block copy ", src, " -> ", dst, " outside [0, ", shape_.num_blocks, ")"));
  }
  if (src == dst) return absl::OkStatus();
  for (int64_t l = 0; l < shape_.num_layers; ++l) {
    for (Tensor* t : {&key_[l], &value_[l]}) {
      const Tensor from = t->Rows(src, src + 1);
      const Tensor to = t->Rows(dst, dst + 1);
      switch (t->device()) {
        case Device::kCpu:
          std::memcpy(to.raw(), from.raw(), from.nbytes());
          break;
        case Device::kCuda: {
          const BlockCopy copy{src, dst};
          RETURN_IF_ERROR(CopyBlocks(absl::MakeConstSpan(&copy, 1), nullptr));
#ifdef MQA_WITH_CUDA
          CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
#endif
          return absl::OkStatus();
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::CopyBlocks(absl::Span<const BlockCopy> copies, void* cuda_stream) {
  if (copies.empty()) return absl::OkStatus();
  if (key_.empty() || key_[0].device() == Device::kCpu) {
    for (const BlockCopy& c : copies) RETURN_IF_ERROR(CopyBlock(c.src, c.dst));
    return absl::OkStatus();
  }
  std::vector<int32_t> pairs;
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= shape_.num_blocks || c.dst < 0 || c.dst >= shape_.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block copy ", c.src, " -> ", c.dst,
                                                     " outside [0, ", shape_.num_blocks, ")"));
    }
    if (c.src == c.dst) continue;
    pairs.push_back(c.src);
    pairs.push_back(c.dst);
  }
  if (pairs.empty()) return absl::OkStatus();
#ifdef MQA_WITH_CUDA
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (!copy_pairs_.defined() || copy_pairs_.numel() < static_cast<int64_t>(pairs.size())) {
    ASSIGN_OR_RETURN(copy_pairs_, Tensor::Empty({std::max<int64_t>(256, pairs.size())},
                                                DType::kI32, Device::kCuda));
  }
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so `pairs` may go.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy_pairs_.raw(), pairs.data(),
                                       pairs.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       stream));
  BlockCopyParams p;
  p.tensors = static_cast<void* const*>(tensor_table_.raw());
  p.num_tensors = static_cast<int>(tensor_table_.numel());
  p.pairs = copy_pairs_.data<int32_t>();
  p.num_pairs = static_cast<int>(pairs.size() / 2);
  p.block_bytes = key_[0].nbytes() / shape_.num_blocks;
  return BlockCopyCuda(p, stream);
#else
  (void)cuda_stream;
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
}

// --- Step validation ------------------------------------------------------------------------

absl::Status ValidateStepInput(const StepInput& in, const ModelConfig& config, int num_blocks,
                               int block_size) {
  const int64_t n = in.num_tokens();
  const int64_t s = in.num_seqs();
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("step input: ", parts...));
  };
  if (static_cast<int64_t>(in.positions.size()) != n ||
      static_cast<int64_t>(in.slot_mapping.size()) != n) {
    return bad(n, " tokens but ", in.positions.size(), " positions and ", in.slot_mapping.size(),
               " slots");
  }
  if (static_cast<int64_t>(in.query_start.size()) != s + 1 ||
      static_cast<int64_t>(in.context_lens.size()) != s) {
    return bad(s, " sequences but ", in.query_start.size(), " query_start entries and ",
               in.context_lens.size(), " context_lens");
  }
  if (in.max_blocks_per_seq < 0 ||
      static_cast<int64_t>(in.block_tables.size()) != s * in.max_blocks_per_seq) {
    return bad("block_tables has ", in.block_tables.size(), " entries, expected ", s, " x ",
               in.max_blocks_per_seq);
  }
  if (in.query_start[0] != 0 || in.query_start[s] != n) {
    return bad("query_start must run from 0 to ", n);
  }
  for (int64_t i = 0; i < s; ++i) {
    const int64_t q_len = in.query_start[i + 1] - in.query_start[i];
    const int64_t ctx = in.context_lens[i];
    if (q_len < 0) return bad("query_start decreases at sequence ", i);
    if (ctx < q_len) return bad("sequence ", i, ": context ", ctx, " < query length ", q_len);
    const int64_t used_blocks = (ctx + block_size - 1) / block_size;
    if (used_blocks > in.max_blocks_per_seq) {
      return bad("sequence ", i, ": context ", ctx, " needs ", used_blocks, " blocks of ",
                 block_size, ", table has ", in.max_blocks_per_seq);
    }
    for (int64_t b = 0; b < used_blocks; ++b) {
      const int32_t block = in.block_tables[i * in.max_blocks_per_seq + b];
      if (block < 0 || block >= num_blocks) {
        return bad("sequence ", i, " logical block ", b, " -> ", block, " outside [0, ", num_blocks,
                   ")");
      }
    }
  }
  const int64_t num_slots = static_cast<int64_t>(num_blocks) * block_size;
  for (int64_t t = 0; t < n; ++t) {
    if (in.token_ids[t] < 0 || in.token_ids[t] >= config.vocab_size) {
      return bad("token ", t, " id ", in.token_ids[t], " outside [0, ", config.vocab_size, ")");
    }
    if (in.positions[t] < 0 || in.positions[t] >= config.n_positions) {
      return bad("token ", t, " position ", in.positions[t], " outside [0, ", config.n_positions,
                 ")");
    }
    if (in.slot_mapping[t] >= num_slots) {
      return bad("token ", t, " slot ", in.slot_mapping[t], " outside the pool of ", num_slots);
    }
  }
  for (int32_t row : in.logits_rows) {
    if (row < 0 || row >= n) return bad("logits row ", row, " outside [0, ", n, ")");
  }
  for (const BlockCopy& c : in.block_copies) {
    if (c.src < 0 || c.src >= num_blocks || c.dst < 0 || c.dst >= num_blocks) {
      return bad("block copy ", c.src, " -> ", c.dst, " outside [0, ", num_blocks, ")");
    }
  }
  return absl::OkStatus();
}

// --- GptBigCode -------------------------------------------------------------------------------

GptBigCode::GptBigCode(const GptBigCodeWeights& weights, Activation activation)
    : w_(weights), activation_(activation) {}

absl::StatusOr<std::unique_ptr<GptBigCode>> GptBigCode::Create(const GptBigCodeWeights& w,
                                                               const GptBigCodeOptions& options) {
  const ModelConfig& c = w.config;
  const ShardInfo& s = w.shard;
  ASSIGN_OR_RETURN(const Activation activation, ParseActivation(c.activation));
  if (c.n_head <= 0 || c.n_embd % c.n_head != 0 || c.n_layer <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: n_embd ", c.n_embd, ", n_head ", c.n_head, ", n_layer ", c.n_layer));
  }
  if (s.world_size <= 0 || s.rank < 0 || s.rank >= s.world_size ||
      s.heads_per_rank * s.world_size != c.n_head ||
      s.kv_heads_per_rank != (c.multi_query ? 1 : s.heads_per_rank) ||
      s.vocab_shard * s.world_size < c.vocab_size || s.inner_shard * s.world_size != c.n_inner) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard info (rank ", s.rank, " of ", s.world_size, ", heads ",
                     s.heads_per_rank, ", kv heads ", s.kv_heads_per_rank, ", vocab ",
                     s.vocab_shard, ", inner ", s.inner_shard, ") does not fit the config"));
  }
  if (static_cast<int64_t>(w.layers.size()) != c.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights have ", w.layers.size(), " layers, config ", c.n_layer));
  }
  if (options.max_batched_tokens <= 0 || options.max_logits_rows <= 0) {
    return absl::InvalidArgumentError("max_batched_tokens and max_logits_rows must be positive");
  }
  auto model = std::unique_ptr<GptBigCode>(new GptBigCode(w, activation));
  GptBigCode& m = *model;
  if (!w.wte.defined()) return absl::InvalidArgumentError("weight wte is missing");
  m.dtype_ = w.wte.dtype();
  m.ctx_.device = w.wte.device();
  m.embd_ = c.n_embd;
  m.head_dim_ = c.head_dim();
  m.heads_ = s.heads_per_rank;
  m.kv_heads_ = s.kv_heads_per_rank;
  m.qkv_cols_ = (m.heads_ + 2 * m.kv_heads_) * m.head_dim_;
  m.inner_ = s.inner_shard;
  m.vocab_shard_ = s.vocab_shard;

  const int64_t E = m.embd_;
  const DType dt = m.dtype_;
  const Device dev = m.ctx_.device;
  RETURN_IF_ERROR(CheckTensor(w.wte, "wte", {m.vocab_shard_, E}, dt, dev));
  RETURN_IF_ERROR(CheckTensor(w.wpe, "wpe", {c.n_positions, E}, dt, dev));
  RETURN_IF_ERROR(CheckTensor(w.ln_f_w, "ln_f.weight", {E}, dt, dev));
  RETURN_IF_ERROR(CheckTensor(w.ln_f_b, "ln_f.bias", {E}, dt, dev));
  RETURN_IF_ERROR(CheckTensor(w.lm_head, "lm_head", {m.vocab_shard_, E}, dt, dev));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = absl::StrCat("h.", l, ".");
    RETURN_IF_ERROR(CheckTensor(L.ln_1_w, p + "ln_1.weight", {E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.ln_1_b, p + "ln_1.bias", {E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.c_attn_w, p + "attn.c_attn.weight", {m.qkv_cols_, E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.c_attn_b, p + "attn.c_attn.bias", {m.qkv_cols_}, dt, dev));
    RETURN_IF_ERROR(
        CheckTensor(L.c_proj_w, p + "attn.c_proj.weight", {E, m.heads_ * m.head_dim_}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.c_proj_b, p + "attn.c_proj.bias", {E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.ln_2_w, p + "ln_2.weight", {E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.ln_2_b, p + "ln_2.bias", {E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.c_fc_w, p + "mlp.c_fc.weight", {m.inner_, E}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.c_fc_b, p + "mlp.c_fc.bias", {m.inner_}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.mlp_proj_w, p + "mlp.c_proj.weight", {E, m.inner_}, dt, dev));
    RETURN_IF_ERROR(CheckTensor(L.mlp_proj_b, p + "mlp.c_proj.bias", {E}, dt, dev));
  }
  if (dev == Device::kCuda) RETURN_IF_ERROR(m.InitCuda(options));
  RETURN_IF_ERROR(m.EnsureWorkspace(options.max_batched_tokens, options.max_logits_rows));
  return model;
}

absl::Status GptBigCode::EnsureWorkspace(int64_t tokens, int64_t logits_rows) {
  const Device dev = ctx_.device;
  if (tokens > token_capacity_) {
    ASSIGN_OR_RETURN(hidden_, Tensor::Empty({tokens, embd_}, dtype_, dev));
    ASSIGN_OR_RETURN(normed_, Tensor::Empty({tokens, embd_}, dtype_, dev));
    ASSIGN_OR_RETURN(qkv_, Tensor::Empty({tokens, qkv_cols_}, dtype_, dev));
    ASSIGN_OR_RETURN(attn_, Tensor::Empty({tokens, heads_ * head_dim_}, dtype_, dev));
    ASSIGN_OR_RETURN(proj_, Tensor::Empty({tokens, embd_}, dtype_, dev));
    ASSIGN_OR_RETURN(mlp_, Tensor::Empty({tokens, inner_}, dtype_, dev));
    token_capacity_ = tokens;
    if (dev == Device::kCuda) ClearCudaGraphs();
  }
  if (logits_rows > logits_capacity_) {
    const int64_t T = w_.shard.world_size;
    ASSIGN_OR_RETURN(rows_, Tensor::Empty({logits_rows, embd_}, dtype_, dev));
    ASSIGN_OR_RETURN(rows_normed_, Tensor::Empty({logits_rows, embd_}, dtype_, dev));
    ASSIGN_OR_RETURN(local_logits_, Tensor::Empty({logits_rows, vocab_shard_}, dtype_, dev));
    ASSIGN_OR_RETURN(gathered_logits_, Tensor::Empty({T * logits_rows, vocab_shard_}, dtype_, dev));
    if (dev == Device::kCuda) {
      ASSIGN_OR_RETURN(logits_f32_,
                       Tensor::Empty({logits_rows, w_.config.vocab_size}, DType::kF32, dev));
      ClearCudaGraphs();
    }
    logits_capacity_ = logits_rows;
  }
  return absl::OkStatus();
}

absl::StatusOr<GptBigCode::StepIndices> GptBigCode::StageIndices(const StepInput& in) const {
  StepIndices idx;
  for (int32_t c : in.context_lens) idx.max_context_len = std::max(idx.max_context_len, c);
  idx.num_tokens = in.num_tokens();
  idx.num_seqs = in.num_seqs();
  idx.max_blocks_per_seq = in.max_blocks_per_seq;
  idx.num_logits_rows = static_cast<int64_t>(in.logits_rows.size());
  idx.token_ids = in.token_ids.data();
  idx.positions = in.positions.data();
  idx.query_start = in.query_start.data();
  idx.context_lens = in.context_lens.data();
  idx.slot_mapping = in.slot_mapping.data();
  idx.block_tables = in.block_tables.data();
  idx.logits_rows = in.logits_rows.data();
  return idx;
}

absl::StatusOr<Tensor> GptBigCode::Forward(const StepInput& in, PagedKvCache& cache,
                                           Collectives& collectives) {
  const int64_t n = in.num_tokens();
  const int64_t num_rows = static_cast<int64_t>(in.logits_rows.size());
  const int rank = w_.shard.rank;
  if (collectives.world_size() != w_.shard.world_size || collectives.rank() != rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("collectives are rank ", collectives.rank(), " of ", collectives.world_size(),
                     ", weights rank ", rank, " of ", w_.shard.world_size));
  }
  if (cache.shape().num_layers != w_.config.n_layer || cache.shape().kv_heads != kv_heads_ ||
      cache.shape().head_dim != head_dim_) {
    return absl::FailedPreconditionError("KV cache shape does not fit the model");
  }
  if (n == 0) {
    if (num_rows != 0) return absl::InvalidArgumentError("logits rows in an empty step");
    return Tensor::Cpu({0, w_.config.vocab_size});
  }
  if (ctx_.device == Device::kCuda) {
#ifdef MQA_WITH_CUDA
    if (pending_launches() > 0) {
      return absl::FailedPreconditionError("Forward with LaunchSample steps not collected");
    }
    int64_t rows = 0;
    RETURN_IF_ERROR(ForwardCuda(in, cache, collectives, &rows));
    if (rank != 0) return Tensor::Cpu({0, w_.config.vocab_size});
    ASSIGN_OR_RETURN(Tensor out, LogitsToHostCuda(num_rows));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream)));
    return out;
#else
    return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
  }
  RETURN_IF_ERROR(EnsureWorkspace(n, num_rows));
  ASSIGN_OR_RETURN(const StepIndices idx, StageIndices(in));
  RETURN_IF_ERROR(Trunk(idx, cache, collectives));
  return Logits(num_rows, idx, collectives);
}

absl::StatusOr<std::vector<int32_t>> GptBigCode::ForwardSample(
    const StepInput& in, PagedKvCache& cache, Collectives& collectives,
    absl::Span<const RowSamplingParams> params, Tensor* logits_out) {
  if (params.size() != in.logits_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardSample: ", params.size(),
                                                   " sampling rows for ", in.logits_rows.size(),
                                                   " logits rows"));
  }
  const int64_t vocab = w_.config.vocab_size;
  if (ctx_.device == Device::kCpu || in.num_tokens() == 0) {
    ASSIGN_OR_RETURN(Tensor logits, Forward(in, cache, collectives));
    if (logits_out != nullptr) *logits_out = logits;
    std::vector<int32_t> tokens(logits.dim(0));
    SampleTokensParams sp;
    sp.logits = logits.data<float>();
    sp.rows = logits.dim(0);
    sp.vocab = vocab;
    sp.ld = vocab;
    sp.params = params.data();
    sp.tokens = tokens.data();
    RETURN_IF_ERROR(SampleTokensCpu(sp));
    return tokens;
  }
#ifdef MQA_WITH_CUDA
  if (pending_launches() > 0) {
    return absl::FailedPreconditionError("ForwardSample with LaunchSample steps not collected");
  }
  int64_t rows = 0;
  RETURN_IF_ERROR(ForwardCuda(in, cache, collectives, &rows));
  if (w_.shard.rank != 0) return std::vector<int32_t>{};
  if (logits_out != nullptr) {
    // Ordered before the sampling on the stream; CollectSampleCuda's wait covers it.
    ASSIGN_OR_RETURN(*logits_out, LogitsToHostCuda(rows));
  }
  RETURN_IF_ERROR(LaunchSampleCuda(params));
  return CollectSampleCuda();
#else
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
}

absl::Status GptBigCode::LaunchSample(const StepInput& in, PagedKvCache& cache,
                                      Collectives& collectives,
                                      absl::Span<const RowSamplingParams> params, int feed_rows) {
  if (params.size() != in.logits_rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchSample: ", params.size(),
                                                   " sampling rows for ", in.logits_rows.size(),
                                                   " logits rows"));
  }
  if (pending_launches() >= 2) {
    return absl::FailedPreconditionError("LaunchSample: two launches outstanding; collect first");
  }
  if (w_.shard.world_size > 1) {
    // The sampled tokens live on rank 0 only; the other ranks' inputs come from the host.
    return absl::FailedPreconditionError("LaunchSample needs one rank (tensor parallel size 1)");
  }
  if (feed_rows < 0 || feed_rows > in.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchSample: feed_rows ", feed_rows, " with ",
                                                   in.num_tokens(), " token rows"));
  }
  if (ctx_.device == Device::kCuda)
    return LaunchStepCuda(in, cache, collectives, params, feed_rows);
  if (feed_rows > static_cast<int>(cpu_last_sampled_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchSample: feed_rows ", feed_rows, " and ",
                                                   cpu_last_sampled_.size(),
                                                   " rows sampled by the previous launch"));
  }
  StepInput fed = in;
  std::copy_n(cpu_last_sampled_.begin(), feed_rows, fed.token_ids.begin());
  ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ForwardSample(fed, cache, collectives, params));
  cpu_last_sampled_ = tokens;
  cpu_pending_.push_back(std::move(tokens));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> GptBigCode::CollectSample() {
  if (ctx_.device == Device::kCuda) {
    if (pending_cuda_launches() == 0) {
      return absl::FailedPreconditionError("CollectSample: nothing launched");
    }
    return CollectSampleCuda();
  }
  if (cpu_pending_.empty()) return absl::FailedPreconditionError("CollectSample: nothing launched");
  std::vector<int32_t> tokens = std::move(cpu_pending_.front());
  cpu_pending_.pop_front();
  return tokens;
}

int GptBigCode::pending_launches() const {
  return ctx_.device == Device::kCuda ? pending_cuda_launches()
                                      : static_cast<int>(cpu_pending_.size());
}

absl::Status GptBigCode::Trunk(const StepIndices& idx, PagedKvCache& cache,
                               Collectives& collectives) {
  const int64_t n = idx.num_tokens;
  const int rank = w_.shard.rank;
  // Embedding: this rank's vocab shard (zeros for other ranks' tokens), positions added once.
  EmbeddingParams emb;
  emb.ids = idx.token_ids;
  emb.positions = idx.positions;
  emb.table = w_.wte.raw();
  emb.table_start = static_cast<int64_t>(rank) * vocab_shard_;
  emb.table_rows = vocab_shard_;
  emb.position_table = rank == 0 ? w_.wpe.raw() : nullptr;
  emb.position_rows = w_.config.n_positions;
  emb.output = hidden_.raw();
  emb.num_tokens = n;
  emb.hidden = embd_;
  emb.dtype = dtype_;
  RETURN_IF_ERROR(Embedding(ctx_, emb));
  if (w_.shard.world_size > 1) {
    Tensor h = hidden_.Rows(0, n);
    RETURN_IF_ERROR(collectives.AllReduceSum(h));
  }
  qkv_ready_ = false;
  for (int64_t l = 0; l < w_.config.n_layer; ++l) {
    RETURN_IF_ERROR(Layer(l, idx, cache, collectives));
  }
  return absl::OkStatus();
}

absl::Status GptBigCode::RowParallelResidual(const GemmParams& gemm, const Tensor& bias,
                                             Collectives& collectives, bool release_early) {
  LinearParams lin;
  lin.gemm = gemm;
  lin.bias = bias.raw();
  lin.release_dependents_early = release_early;
  if (w_.shard.world_size == 1) {
    lin.residual = hidden_.raw();
    return Linear(ctx_, lin);
  }
  // The bias is zero on ranks other than 0 (weights.h), so adding it before the sum adds it once.
  RETURN_IF_ERROR(Linear(ctx_, lin));
  const int64_t n = gemm.m;
  Tensor partial = proj_.Rows(0, n);
  RETURN_IF_ERROR(collectives.AllReduceSum(partial));
  BiasActivationParams p;
  p.rows = n;
  p.cols = embd_;
  p.dtype = dtype_;
  p.input = proj_.raw();
  p.residual = hidden_.raw();
  p.output = hidden_.raw();
  return BiasActivation(ctx_, p);
}

LinearFusion GptBigCode::FusedLayerNorm(const LayerNormParams& ln, size_t i, int64_t n) const {
  LinearFusion f;
  f.ln_weight = ln.weight;
  f.ln_bias = ln.bias;
  f.ln_epsilon = ln.epsilon;
  if (i < ln_sums_.size()) {
    const float* s = static_cast<const float*>(ln_sums_[i].raw());
    f.ln_wsum = s;
    f.ln_bsum = s + n;
  }
  return f;
}

absl::Status GptBigCode::Layer(int64_t l, const StepIndices& idx, PagedKvCache& cache,
                               Collectives& collectives) {
  const LayerWeights& L = w_.layers[l];
  const int64_t n = idx.num_tokens;
  const int64_t D = head_dim_;

  LayerNormParams ln;
  ln.input = hidden_.raw();
  ln.output = normed_.raw();
  ln.weight = L.ln_1_w.raw();
  ln.bias = L.ln_1_b.raw();
  ln.rows = n;
  ln.cols = embd_;
  ln.epsilon = w_.config.layer_norm_epsilon;
  ln.dtype = dtype_;

  LinearParams qkv_lin;
  GemmParams& gemm = qkv_lin.gemm;
  gemm.a = normed_.raw();
  gemm.lda = embd_;
  gemm.b = L.c_attn_w.raw();
  gemm.ldb = embd_;
  gemm.c = qkv_.raw();
  gemm.ldc = qkv_cols_;
  gemm.m = n;
  gemm.n = qkv_cols_;
  gemm.k = embd_;
  gemm.dtype = dtype_;
  qkv_lin.bias = L.c_attn_b.raw();
  const float scale =
      w_.config.scale_attn_weights ? static_cast<float>(1.0 / std::sqrt(double(D))) : 1.0f;
  // Batch-1 decode on one rank: the rest of the layer and the next layer's ln_1 + QKV as one
  // chain, with the attention (and its KV write) as the chain's first phase where the context is
  // short; Unimplemented or InvalidArgument: nothing ran, the separate kernels below do it.
  const int64_t layer_bytes =
      (qkv_cols_ * embd_ + embd_ * heads_ * D + 2 * inner_ * embd_) * DTypeSize(dtype_);
  const bool chain_step = chain_ && layer_bytes >= chain_min_layer_bytes_ && n == 1 &&
                          w_.shard.world_size == 1 && activation_ != Activation::kGeluErf;

  // fuse_ (CUDA decode): ln_1 (and with fuse_kv_ the KV-cache write) inside the QKV GEMM; else
  // (and always on the CPU) the ops below. A one-token step outside the chain may take the
  // attention (with the KV write) into the same launch (tail_attention_).
  bool qkv_fused = false, kv_written = false, tail_done = false, proj_done = false;
  const bool qkv_ready = qkv_ready_;  // done by the previous layer's decode chain
  qkv_ready_ = false;
  if (fuse_ && !qkv_ready) {
    const LinearFusion ln_only = FusedLayerNorm(ln, 2 * l, qkv_cols_);  // ln holds ln_1 here
    LinearFusion with_kv = ln_only;
    with_kv.key_cache = cache.key(l).raw();
    with_kv.value_cache = cache.value(l).raw();
    with_kv.slot_mapping = idx.slot_mapping;
    with_kv.kv_col0 = heads_ * D;
    with_kv.kv_width = kv_heads_ * D;
    LinearParams fused = qkv_lin;
    fused.gemm.a = hidden_.raw();
    if (tail_attention_ && n == 1 && !chain_step && w_.shard.world_size == 1 &&
        ctx_.tail_workspace != nullptr &&
        (ctx_.skip & (kSkipGemm | kSkipAttention | kSkipKvWrite)) == 0) {
      LinearFusion f = with_kv;
      LinearParams with_tail = fused;
      with_tail.release_dependents_early = (tail_release_early_ & kTailReleaseQkv) != 0;
      f.tail = {.output = attn_.raw(),
                .block_table = idx.block_tables,
                .context_len = idx.context_lens,
                .heads = static_cast<int>(heads_),
                .kv_heads = static_cast<int>(kv_heads_),
                .head_dim = static_cast<int>(D),
                .block_size = cache.block_size(),
                .max_context = idx.max_context_len,
                .scale = scale,
                .workspace = ctx_.tail_workspace,
                .workspace_bytes = ctx_.tail_workspace_bytes,
                .cluster_merge = tail_cluster_merge_,
                .stamps = l == ctx_.tail_stamps_layer ? ctx_.tail_stamps : nullptr};
      absl::Status st;
      if (tail_attention_proj_) {  // attn.c_proj with its residual too, if the launch takes it
        LinearFusion with_proj = f;
        with_proj.tail.proj_weight = L.c_proj_w.raw();
        with_proj.tail.proj_bias = L.c_proj_b.raw();
        with_proj.tail.hidden = hidden_.raw();
        with_proj.tail.proj_n = static_cast<int>(embd_);
        st = FusedLinear(ctx_, with_tail, with_proj);
        if (!st.ok() && !absl::IsUnimplemented(st)) return st;
        proj_done = st.ok();
      }
      if (!proj_done) st = FusedLinear(ctx_, with_tail, f);
      if (!st.ok() && !absl::IsUnimplemented(st)) return st;
      tail_done = qkv_fused = kv_written = st.ok();
      tail_runs_ += tail_done;
      tail_proj_runs_ += proj_done;
    }
    if (!qkv_fused) {
      const absl::Status st = FusedLinear(ctx_, fused, fuse_kv_ ? with_kv : ln_only);
      if (!st.ok() && !absl::IsUnimplemented(st)) return st;
      qkv_fused = st.ok();
      kv_written = qkv_fused && fuse_kv_;
    }
  }
  if (!qkv_fused && !qkv_ready) {
    RETURN_IF_ERROR(LayerNorm(ctx_, ln));
    RETURN_IF_ERROR(Linear(ctx_, qkv_lin));
  }

  // qkv rows: [Q: heads * D | K: kv_heads * D | V: kv_heads * D].
  const size_t elem = DTypeSize(dtype_);
  const char* qkv = static_cast<const char*>(qkv_.raw());
  KvCacheWriteParams kv;
  kv.key = qkv + heads_ * D * elem;
  kv.value = qkv + (heads_ + kv_heads_) * D * elem;
  kv.key_stride = qkv_cols_;
  kv.value_stride = qkv_cols_;
  kv.key_cache = cache.key(l).raw();
  kv.value_cache = cache.value(l).raw();
  kv.slot_mapping = idx.slot_mapping;
  kv.num_tokens = static_cast<int>(n);
  kv.num_kv_heads = static_cast<int>(kv_heads_);
  kv.head_dim = static_cast<int>(D);
  kv.block_size = cache.block_size();
  kv.dtype = dtype_;

  PagedAttentionParams att;
  att.query = qkv;
  att.query_stride = qkv_cols_;
  att.output = attn_.raw();
  att.key_cache = cache.key(l).raw();
  att.value_cache = cache.value(l).raw();
  att.block_tables = idx.block_tables;
  att.query_start = idx.query_start;
  att.context_lens = idx.context_lens;
  att.num_seqs = idx.num_seqs;
  att.num_tokens = static_cast<int>(n);
  att.num_heads = static_cast<int>(heads_);
  att.num_kv_heads = static_cast<int>(kv_heads_);
  att.head_dim = static_cast<int>(D);
  att.block_size = cache.block_size();
  att.max_blocks_per_seq = idx.max_blocks_per_seq;
  att.max_context_len = idx.max_context_len;
  att.max_query_len = idx.max_query_len;
  att.scale = scale;
  att.dtype = dtype_;
  // The attention's merge kernel lets the chain after it launch early (its CTAs stream weights
  // while the attention runs).
  att.release_dependents_early = (chain_step && chain_early_release_) || attention_release_early_;
  DecodeChainParams chain;
  const bool next = l + 1 < w_.config.n_layer;
  auto run_chain = [&]() -> absl::StatusOr<bool> {
    const absl::Status st = DecodeChain(ctx_, chain, static_cast<int>(l & 1), static_cast<int>(l));
    if (st.ok()) {
      ++chain_runs_;
      chain_attention_runs_ += chain.has_attention ? 1 : 0;
      last_chain_attention_ = chain.has_attention;
      qkv_ready_ = next;
      return true;
    }
    if (!absl::IsUnimplemented(st) && !absl::IsInvalidArgument(st)) return st;
    if (!chain_refusal_logged_) {  // once a model: the separate kernels run instead
      chain_refusal_logged_ = true;
      std::fprintf(stderr, "mqaserve: a decode chain was refused (%s); separate kernels instead\n",
                   st.ToString().c_str());
    }
    return false;
  };
  if (chain_step) {
    chain.dtype = dtype_;
    chain.num_phases = next ? 4 : 3;
    const float eps = w_.config.layer_norm_epsilon;
    chain.phases[0] = {.weight = L.c_proj_w.raw(),
                       .bias = L.c_proj_b.raw(),
                       .input = attn_.raw(),
                       .output = hidden_.raw(),
                       .accumulate = true,
                       .n = embd_,
                       .k = heads_ * D};
    chain.phases[1] = {.weight = L.c_fc_w.raw(),
                       .bias = L.c_fc_b.raw(),
                       .input = hidden_.raw(),
                       .ln_weight = L.ln_2_w.raw(),
                       .ln_bias = L.ln_2_b.raw(),
                       .ln_epsilon = eps,
                       .output = mlp_.raw(),
                       .activation = activation_,
                       .n = inner_,
                       .k = embd_};
    chain.phases[2] = {.weight = L.mlp_proj_w.raw(),
                       .bias = L.mlp_proj_b.raw(),
                       .input = mlp_.raw(),
                       .output = hidden_.raw(),
                       .accumulate = true,
                       .n = embd_,
                       .k = inner_,
                       .weight_t = mlp_proj_wt_.empty() ? nullptr : mlp_proj_wt_[l].raw()};
    if (next) {
      const LayerWeights& N = w_.layers[l + 1];
      chain.phases[3] = {.weight = N.c_attn_w.raw(),
                         .bias = N.c_attn_b.raw(),
                         .input = hidden_.raw(),
                         .ln_weight = N.ln_1_w.raw(),
                         .ln_bias = N.ln_1_b.raw(),
                         .ln_epsilon = eps,
                         .output = qkv_.raw(),
                         .n = qkv_cols_,
                         .k = embd_};
    }
    const int chain_attention_max_context =
        chain_attention_max_context_ > 0 ? chain_attention_max_context_
                                         : DecodeChainShortAttentionMaxContext(static_cast<int>(D));
    if (chain_attention_ && !kv_written && idx.num_seqs == 1 &&
        idx.max_context_len <= chain_attention_max_context) {
      chain.has_attention = true;
      chain.attention = {.qkv = qkv,
                         .key_cache = cache.key(l).raw(),
                         .value_cache = cache.value(l).raw(),
                         .block_table = idx.block_tables,
                         .context_len = idx.context_lens,
                         .slot = idx.slot_mapping,
                         .output = attn_.raw(),
                         .heads = static_cast<int>(heads_),
                         .kv_heads = static_cast<int>(kv_heads_),
                         .head_dim = static_cast<int>(D),
                         .block_size = cache.block_size(),
                         .max_context = idx.max_context_len,
                         .scale = att.scale};
      ASSIGN_OR_RETURN(const bool done, run_chain());
      if (done) return absl::OkStatus();
      chain.has_attention = false;
    }
  }

  // The KV write, unless the QKV GEMM did it, goes with the attention: written first, or on the
  // GPU inside the attention kernel where its variant fuses it (14, 15, 16).
  if (!tail_done) RETURN_IF_ERROR(PagedAttention(ctx_, att, kv_written ? nullptr : &kv));
  if (chain_step) {
    ASSIGN_OR_RETURN(const bool done, run_chain());
    if (done) return absl::OkStatus();
  }

  gemm.a = attn_.raw();
  gemm.lda = heads_ * D;
  gemm.b = L.c_proj_w.raw();
  gemm.ldb = heads_ * D;
  gemm.c = proj_.raw();
  gemm.ldc = embd_;
  gemm.n = embd_;
  gemm.k = heads_ * D;
  // Behind the tail, attn.c_proj (and with its other bits c_fc, mlp.c_proj) may release the next
  // kernel as it starts (tail_release_early_).
  const auto release_early = [&](int bit) { return tail_done && (tail_release_early_ & bit) != 0; };
  if (!proj_done) {
    RETURN_IF_ERROR(
        RowParallelResidual(gemm, L.c_proj_b, collectives, release_early(kTailReleaseAttnProj)));
  }

  ln.weight = L.ln_2_w.raw();
  ln.bias = L.ln_2_b.raw();

  LinearParams fc;
  fc.gemm = gemm;
  fc.gemm.a = normed_.raw();
  fc.gemm.lda = embd_;
  fc.gemm.b = L.c_fc_w.raw();
  fc.gemm.ldb = embd_;
  fc.gemm.c = mlp_.raw();
  fc.gemm.ldc = inner_;
  fc.gemm.n = inner_;
  fc.gemm.k = embd_;
  fc.bias = L.c_fc_b.raw();
  fc.activation = activation_;
  bool fc_fused = false;
  if (fuse_) {
    LinearFusion f = FusedLayerNorm(ln, 2 * l + 1, inner_);
    LinearParams fused = fc;
    fused.gemm.a = hidden_.raw();
    fused.release_dependents_early = release_early(kTailReleaseFc);
    const absl::Status st = FusedLinear(ctx_, fused, f);
    if (!st.ok() && !absl::IsUnimplemented(st)) return st;
    fc_fused = st.ok();
  }
  if (!fc_fused) {
    RETURN_IF_ERROR(LayerNorm(ctx_, ln));
    RETURN_IF_ERROR(Linear(ctx_, fc));
  }

  gemm.a = mlp_.raw();
  gemm.lda = inner_;
  gemm.b = L.mlp_proj_w.raw();
  gemm.ldb = inner_;
  gemm.c = proj_.raw();
  gemm.ldc = embd_;
  gemm.n = embd_;
  gemm.k = inner_;
  return RowParallelResidual(gemm, L.mlp_proj_b, collectives, release_early(kTailReleaseMlpProj));
}

// The rows whose logits are needed go through ln_f and lm_head into local_logits_ (this rank's
// vocab shard, model dtype).
absl::Status GptBigCode::LogitsRows(const StepIndices& idx) {
  const int64_t num_rows = idx.num_logits_rows;
  EmbeddingParams gather;
  gather.ids = idx.logits_rows;
  gather.table = hidden_.raw();
  gather.table_rows = token_capacity_;
  gather.output = rows_.raw();
  gather.num_tokens = num_rows;
  gather.hidden = embd_;
  gather.dtype = dtype_;
  RETURN_IF_ERROR(Embedding(ctx_, gather));

  LayerNormParams ln;
  ln.input = rows_.raw();
  ln.output = rows_normed_.raw();
  ln.weight = w_.ln_f_w.raw();
  ln.bias = w_.ln_f_b.raw();
  ln.rows = num_rows;
  ln.cols = embd_;
  ln.epsilon = w_.config.layer_norm_epsilon;
  ln.dtype = dtype_;

  GemmParams gemm;
  gemm.a = rows_normed_.raw();
  gemm.lda = embd_;
  gemm.b = w_.lm_head.raw();
  gemm.ldb = embd_;
  gemm.c = local_logits_.raw();
  gemm.ldc = vocab_shard_;
  gemm.m = num_rows;
  gemm.n = vocab_shard_;
  gemm.k = embd_;
  gemm.dtype = dtype_;
  if (fuse_) {  // ln_f inside the lm_head GEMM (CUDA decode)
    LinearFusion f = FusedLayerNorm(ln, 2 * w_.config.n_layer, vocab_shard_);
    LinearParams fused;
    fused.gemm = gemm;
    fused.gemm.a = rows_.raw();
    const absl::Status st = FusedLinear(ctx_, fused, f);
    if (!absl::IsUnimplemented(st)) return st;
  }
  RETURN_IF_ERROR(LayerNorm(ctx_, ln));
  return Gemm(ctx_, gemm);
}

absl::StatusOr<Tensor> GptBigCode::Logits(int64_t num_rows, const StepIndices& idx,
                                          Collectives& collectives) {
  const int64_t vocab = w_.config.vocab_size;
  const int T = w_.shard.world_size;
  const int rank = w_.shard.rank;
  if (num_rows == 0) return Tensor::Cpu({0, vocab});
  RETURN_IF_ERROR(LogitsRows(idx));

  // Shard r holds vocab columns [r * vocab_shard, (r + 1) * vocab_shard); after the gather, rank
  // 0 interleaves them into full rows and drops the padding past vocab_size.
  const Tensor local = local_logits_.Rows(0, num_rows);
  Tensor gathered = gathered_logits_.Rows(0, T * num_rows);
  RETURN_IF_ERROR(collectives.Gather(local, gathered, /*root=*/0));
  if (rank != 0) return Tensor::Cpu({0, vocab});
  Tensor out = Tensor::Cpu({num_rows, vocab}, DType::kF32);
  const size_t elem = DTypeSize(dtype_);
  const char* src = static_cast<const char*>(gathered.raw());
  float* dst = out.data<float>();
  for (int r = 0; r < T; ++r) {
    const int64_t col0 = static_cast<int64_t>(r) * vocab_shard_;
    const int64_t cols = std::min(vocab_shard_, vocab - col0);
    if (cols <= 0) continue;
    for (int64_t i = 0; i < num_rows; ++i) {
      ConvertFloats(src + ((r * num_rows + i) * vocab_shard_) * elem, dtype_,
                    dst + i * vocab + col0, DType::kF32, cols);
    }
  }
  return out;
}

}  // namespace mqa
