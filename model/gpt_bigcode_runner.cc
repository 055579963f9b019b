#include "model/gpt_bigcode_runner.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/device_info.h"
#include "runtime/status.h"

#ifdef MQA_WITH_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_check.h"
#endif

namespace mqa {

absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> GptBigCodeRunner::Create(
    GptBigCodeWeights weights, Collectives* collectives, const GptBigCodeRunnerOptions& options) {
  if (collectives == nullptr) return absl::InvalidArgumentError("GptBigCodeRunner: no collectives");
  if (collectives->rank() != weights.shard.rank ||
      collectives->world_size() != weights.shard.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptBigCodeRunner: collectives are rank ", collectives->rank(), " of ",
                     collectives->world_size(), ", weights are rank ", weights.shard.rank, " of ",
                     weights.shard.world_size));
  }
  if (!weights.wte.defined()) return absl::InvalidArgumentError("GptBigCodeRunner: no weights");
  if (options.device == Device::kCpu && weights.wte.device() != Device::kCpu) {
    return absl::InvalidArgumentError("GptBigCodeRunner: weights are on the GPU, device is cpu");
  }
  if (options.device == Device::kCuda) {
    const DType dt = weights.wte.dtype();
    if (dt != DType::kF16 && dt != DType::kBF16) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptBigCodeRunner: the CUDA backend runs float16 or bfloat16 weights, not ",
                       std::string(DTypeName(dt)), " (LoadOptions::dtype)"));
    }
    RETURN_IF_ERROR(UploadWeightsToCuda(weights));
  }
  auto runner =
      std::unique_ptr<GptBigCodeRunner>(new GptBigCodeRunner(std::move(weights), collectives));
  const GptBigCodeWeights& w = runner->weights_;

  GptBigCodeOptions model_options;
  model_options.max_batched_tokens = options.max_batched_tokens;
  model_options.max_logits_rows = options.max_logits_rows;
  model_options.cuda_graphs = options.cuda_graphs;
  model_options.max_graph_batch = options.max_graph_batch;
  model_options.max_graph_query = options.max_graph_query;
  model_options.skinny_gemm = options.skinny_gemm;
  model_options.pdl = options.pdl;
  model_options.fuse_small_kernels = options.fuse_small_kernels;
  model_options.fuse_layer_norms = options.fuse_layer_norms;
  model_options.gemm_autotune = options.gemm_autotune;
  model_options.gemm_autotune_max_m = options.gemm_autotune_max_m;
  model_options.ln_registers = options.ln_registers;
  model_options.greedy_cluster = options.greedy_cluster;
  model_options.gemm_split_k = options.gemm_split_k;
  model_options.gemm_stream_tc = options.gemm_stream_tc;
  model_options.attention_variant = options.attention_variant;
  model_options.gemm_deep_unroll = options.gemm_deep_unroll;
  model_options.decode_chain = options.decode_chain;
  model_options.decode_chain_min_layer_bytes = options.decode_chain_min_layer_bytes;
  model_options.decode_chain_attention = options.decode_chain_attention;
  model_options.decode_chain_attention_max_context = options.decode_chain_attention_max_context;
  model_options.decode_chain_half_fold = options.decode_chain_half_fold;
  model_options.decode_chain_fused_mlp = options.decode_chain_fused_mlp;
  model_options.tail_attention = options.tail_attention;
  model_options.tail_cluster_merge = options.tail_cluster_merge;
  model_options.tail_release_early = options.tail_release_early;
  model_options.tail_attention_proj = options.tail_attention_proj;

  PagedKvCache::Shape shape;
  shape.num_layers = w.config.n_layer;
  shape.kv_heads = w.shard.kv_heads_per_rank;
  shape.head_dim = w.config.head_dim();
  shape.block_size = options.block_size;
  shape.num_blocks = options.num_kv_blocks;
  if (shape.num_blocks <= 0 && options.kv_cache_bytes <= 0 && options.device == Device::kCuda &&
      options.gpu_memory_utilization > 0) {
    // The pool takes what the model leaves: the model (and a profiling step) first.
    if (!PagedKvCache::IsSupportedBlockSize(shape.block_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block size ", shape.block_size, " is not supported (8, 16 or 32)"));
    }
    ASSIGN_OR_RETURN(runner->model_, GptBigCode::Create(w, model_options));
    RETURN_IF_ERROR(runner->SizeKvPoolFromFreeMemory(options, shape));
    ASSIGN_OR_RETURN(runner->cache_, PagedKvCache::Allocate(shape, w.wte.dtype(), w.wte.device()));
    return runner;
  }
  if (shape.num_blocks <= 0) {
    const int64_t per_block = PagedKvCache::BytesPerBlock(shape, w.wte.dtype());
    const int64_t blocks = per_block > 0 ? options.kv_cache_bytes / per_block : 0;
    if (blocks <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GptBigCodeRunner: set num_kv_blocks or a kv_cache_bytes of at least one block (",
          per_block, " bytes)", options.device == Device::kCuda ? " or gpu_memory_utilization" : ""));
    }
    shape.num_blocks = static_cast<int>(std::min<int64_t>(blocks, INT32_MAX / 64));
  }
  ASSIGN_OR_RETURN(runner->cache_, PagedKvCache::Allocate(shape, w.wte.dtype(), w.wte.device()));
  ASSIGN_OR_RETURN(runner->model_, GptBigCode::Create(w, model_options));
  return runner;
}

int64_t GptBigCodeRunner::kv_bytes_per_token() const {
  PagedKvCache::Shape s = cache_.shape();
  s.block_size = 1;
  return PagedKvCache::BytesPerBlock(s, weights_.wte.dtype());
}

absl::Status GptBigCodeRunner::SizeKvPoolFromFreeMemory(const GptBigCodeRunnerOptions& options,
                                                        PagedKvCache::Shape& shape) {
#ifdef MQA_WITH_CUDA
  const ModelConfig& c = weights_.config;
  const int bs = shape.block_size;
  // Profiling step: max_batched_tokens prompt tokens in sequences of at most n_positions.
  StepInput step;
  int32_t block = 0;
  int64_t left = std::max<int64_t>(1, options.max_batched_tokens);
  while (left > 0) {
    const int len = static_cast<int>(std::min<int64_t>(left, c.n_positions));
    const int first_block = block;
    const int blocks = (len + bs - 1) / bs;
    step.seq_ids.push_back(step.seq_ids.size());
    step.query_start.push_back(step.num_tokens());
    for (int p = 0; p < len; ++p) {
      step.token_ids.push_back(p % c.vocab_size);
      step.positions.push_back(p);
      step.slot_mapping.push_back((first_block + p / bs) * bs + p % bs);
    }
    step.context_lens.push_back(len);
    if (static_cast<int64_t>(step.logits_rows.size()) < options.max_logits_rows) {
      step.logits_rows.push_back(step.num_tokens() - 1);
    }
    block += blocks;
    left -= len;
  }
  step.query_start.push_back(step.num_tokens());
  step.max_blocks_per_seq = static_cast<int>((c.n_positions + bs - 1) / bs);
  step.block_tables.assign(step.num_seqs() * step.max_blocks_per_seq, 0);
  {
    int32_t b = 0;
    for (int s = 0; s < step.num_seqs(); ++s) {
      const int blocks = (step.context_lens[s] + bs - 1) / bs;
      for (int i = 0; i < blocks; ++i) step.block_tables[s * step.max_blocks_per_seq + i] = b++;
    }
  }
  PagedKvCache::Shape profile_shape = shape;
  profile_shape.num_blocks = std::max(1, static_cast<int>(block));
  int64_t profile_bytes = 0;
  {
    ASSIGN_OR_RETURN(PagedKvCache profile,
                     PagedKvCache::Allocate(profile_shape, weights_.wte.dtype(), Device::kCuda));
    profile_bytes = PagedKvCache::BytesPerBlock(profile_shape, weights_.wte.dtype()) *
                    profile_shape.num_blocks;
    ASSIGN_OR_RETURN(Tensor logits, model_->Forward(step, profile, *collectives_));
    (void)logits;
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t per_block = PagedKvCache::BytesPerBlock(shape, weights_.wte.dtype());
  // The profile cache is already freed, so free_bytes counts it back in.
  (void)profile_bytes;
  const double used = static_cast<double>(total_bytes) - static_cast<double>(free_bytes);
  const double budget = options.gpu_memory_utilization * static_cast<double>(total_bytes) - used;
  int64_t blocks = budget > 0 ? static_cast<int64_t>(budget / per_block) : 0;
  blocks = std::min<int64_t>(blocks, INT32_MAX / 64);
  if (collectives_->world_size() > 1) {
    // Every rank must agree: the smallest pool wins.
    ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty({1}, DType::kF32, Device::kCuda));
    ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({collectives_->world_size()}, DType::kF32,
                                               Device::kCuda));
    const float v = static_cast<float>(blocks);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(mine.raw(), &v, sizeof(v), cudaMemcpyHostToDevice));
    RETURN_IF_ERROR(collectives_->AllGather(mine, all));
    std::vector<float> got(collectives_->world_size());
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(got.data(), all.raw(), all.nbytes(), cudaMemcpyDeviceToHost));
    blocks = static_cast<int64_t>(*std::min_element(got.begin(), got.end()));
  }
  if (blocks <= 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no GPU memory left for the KV cache: ", used / (1 << 30), " GiB of ",
        static_cast<double>(total_bytes) / (1 << 30), " GiB used after the profiling step, ",
        "--gpu-memory-utilization ", options.gpu_memory_utilization));
  }
  shape.num_blocks = static_cast<int>(blocks);
  PagedKvCache::Shape token = shape;
  token.block_size = 1;
  const int64_t per_token = PagedKvCache::BytesPerBlock(token, weights_.wte.dtype());
  std::fprintf(stderr,
               "mqaserve: rank %d: # GPU blocks: %lld (%d tokens each; KV bytes per token %lld = "
               "%.1f KiB; %.2f GiB KV cache, %.2f GiB in use, %.2f GiB device, "
               "gpu_memory_utilization %.2f)\n",
               collectives_->rank(), static_cast<long long>(blocks), bs,
               static_cast<long long>(per_token), per_token / 1024.0,
               static_cast<double>(blocks) * per_block / (1 << 30), used / (1 << 30),
               static_cast<double>(total_bytes) / (1 << 30), options.gpu_memory_utilization);
  return absl::OkStatus();
#else
  (void)options;
  (void)shape;
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
}

absl::Status GptBigCodeRunner::PrepareStep(const StepInput& input) {
  RETURN_IF_ERROR(
      ValidateStepInput(input, weights_.config, cache_.num_blocks(), cache_.block_size()));
  return cache_.CopyBlocks(input.block_copies, model_->cuda_stream());
}

absl::StatusOr<Tensor> GptBigCodeRunner::Execute(const StepInput& input) {
  RETURN_IF_ERROR(DropLookahead());
  RETURN_IF_ERROR(PrepareStep(input));
  return model_->Forward(input, cache_, *collectives_);
}

absl::Status GptBigCodeRunner::DropLookahead() {
  if (!lookahead_.has_value()) return absl::OkStatus();
  lookahead_.reset();
  ++lookahead_stats_.dropped;
  return model_->CollectSample().status();  // waits for it; its tokens are not wanted
}

std::optional<LookaheadStep> GptBigCodeRunner::PredictNext(
    const StepInput& input, absl::Span<const RowSamplingParams> params) const {
  return PredictNextDecodeStep(input, params, cache_.block_size(),
                               static_cast<int>(weights_.config.n_positions));
}

void GptBigCodeRunner::LaunchLookahead(std::optional<LookaheadStep> next) {
  if (!next.has_value()) return;
  absl::Status st = PrepareStep(next->input);
  if (st.ok()) {
    st = model_->LaunchSample(next->input, cache_, *collectives_, next->params,
                              next->input.num_tokens());
  }
  if (!st.ok()) {
    // Not the engine's step: the step it asked for still returns its tokens (a device error
    // shows in their collection), and the next one runs as if nothing had been predicted.
    ++lookahead_stats_.failed;
    if (lookahead_stats_.failed == 1) {
      std::fprintf(stderr, "mqaserve: decode lookahead: a predicted step failed to launch: %s\n",
                   st.ToString().c_str());
    }
    return;
  }
  lookahead_ = std::move(next);
  ++lookahead_stats_.launched;
}

absl::Status GptBigCodeRunner::KeepAlive() { return DropLookahead(); }

GptBigCodeRunner::~GptBigCodeRunner() { (void)DropLookahead(); }

absl::StatusOr<std::vector<int32_t>> GptBigCodeRunner::ExecuteAndSample(
    const StepInput& input, absl::Span<const RowSamplingParams> params) {
  ASSIGN_OR_RETURN(SampledStep step, ExecuteSampled(input, params, /*with_logits=*/false));
  return std::move(step.tokens);
}

namespace {

// A decode step of n sequences at `context` tokens that reads and writes only KV block 0 (every
// block-table entry is 0): the warm-up's and the calibration's steps, before any sequence holds
// blocks.
StepInput BlockZeroDecodeStep(int n, int context, int block_size) {
  StepInput in;
  in.max_blocks_per_seq = (context + block_size - 1) / block_size;
  in.query_start.push_back(0);
  for (int s = 0; s < n; ++s) {
    in.seq_ids.push_back(s);
    in.token_ids.push_back(0);
    in.positions.push_back(context - 1);
    in.slot_mapping.push_back((context - 1) % block_size);
    in.query_start.push_back(s + 1);
    in.context_lens.push_back(context);
    in.logits_rows.push_back(s);
  }
  in.block_tables.assign(static_cast<size_t>(n) * in.max_blocks_per_seq, 0);
  return in;
}

}  // namespace

absl::StatusOr<int> GptBigCodeRunner::WarmUpDecodeGraphs(int max_batch, int max_context) {
  const int before = model_->num_cuda_graphs();
  const int bs = cache_.block_size();
  std::vector<std::pair<int, int>> shapes =
      model_->DecodeGraphShapes(max_batch, std::min<int>(max_context, weights_.config.n_positions));
  // Largest first: a step that outgrows the model's index buffer drops every graph captured
  // before it.
  std::reverse(shapes.begin(), shapes.end());
  for (const auto& [n, context] : shapes) {
    const StepInput in = BlockZeroDecodeStep(n, context, bs);
    const std::vector<RowSamplingParams> greedy(n);
    for (int pass = 0; pass < 2; ++pass) {
      auto tokens = ExecuteAndSample(in, greedy);
      if (!tokens.ok()) {
        return absl::Status(tokens.status().code(),
                            absl::StrCat("warming up the decode graph of ", n, " sequences at ",
                                         context, " tokens: ", tokens.status().message()));
      }
    }
  }
  model_->FreezeGemmAutotune();
  return model_->num_cuda_graphs() - before;
}

absl::StatusOr<DecodeChainShareCalibration> GptBigCodeRunner::CalibrateDecodeChainShares(
    int steps, int context) {
  model_->set_decode_chain_sm_shares(nullptr);
  RETURN_IF_ERROR(model_->set_decode_chain_timeline(true));
  const ModelConfig& c = weights_.config;
  // The timeline's grid: a CTA on every SM (set_decode_chain_timeline sizes it so).
  ASSIGN_OR_RETURN(const int grid, CurrentDeviceSms());
  DecodeChainShareCalibrator calibrator(grid, {c.n_embd, c.n_inner, c.n_embd, c.qkv_rows()});
  const StepInput in = BlockZeroDecodeStep(
      1, std::clamp<int>(context, 1, static_cast<int>(c.n_positions)), cache_.block_size());
  const std::vector<RowSamplingParams> greedy(1);
  absl::Status st;
  for (int step = 0; step < steps && st.ok(); ++step) {
    st = ExecuteAndSample(in, greedy).status();
    absl::StatusOr<std::vector<unsigned long long>> words = model_->decode_chain_timeline();
    if (st.ok()) st = words.status();
    const size_t stride = st.ok() ? words->size() / c.n_layer : 0;
    for (int64_t l = 0; st.ok() && l < c.n_layer; ++l) {
      st = calibrator.AddLaunch(words->data() + l * stride);  // (a layer without a chain: none)
    }
  }
  RETURN_IF_ERROR(model_->set_decode_chain_timeline(false));
  RETURN_IF_ERROR(st);
  ASSIGN_OR_RETURN(DecodeChainShareCalibration cal, calibrator.Finish());
  model_->set_decode_chain_sm_shares(&cal.shares);
  return cal;
}

absl::Status GptBigCodeRunner::LaunchSample(const StepInput& input,
                                            absl::Span<const RowSamplingParams> params,
                                            int feed_rows) {
  RETURN_IF_ERROR(DropLookahead());
  RETURN_IF_ERROR(PrepareStep(input));
  return model_->LaunchSample(input, cache_, *collectives_, params, feed_rows);
}

absl::StatusOr<SampledStep> GptBigCodeRunner::ExecuteSampled(
    const StepInput& input, absl::Span<const RowSamplingParams> params, bool with_logits) {
  // Decode lookahead (runtime/decode_lookahead.h): one rank only (the other ranks' inputs come
  // from the host), and never with logits (they would have to be copied for every step).
  const bool look_ahead = input.may_look_ahead && !with_logits && collectives_->world_size() == 1;
  // The engine's step may be the predicted one already running: then it is only collected.
  const bool running =
      lookahead_.has_value() && !with_logits && IsPredictedStep(*lookahead_, input, params);
  if (running) {
    lookahead_.reset();
    ++lookahead_stats_.used;
  } else {
    RETURN_IF_ERROR(DropLookahead());
    RETURN_IF_ERROR(PrepareStep(input));
  }
  std::optional<LookaheadStep> next;
  if (look_ahead) next = PredictNext(input, params);
  SampledStep out;
  if (running || next.has_value()) {
    if (!running) RETURN_IF_ERROR(model_->LaunchSample(input, cache_, *collectives_, params));
    LaunchLookahead(std::move(next));  // the one after it, before this one's tokens are read
    ASSIGN_OR_RETURN(out.tokens, model_->CollectSample());
    if (lookahead_.has_value()) lookahead_->input.token_ids = out.tokens;  // what it was fed
    return out;
  }
  ASSIGN_OR_RETURN(out.tokens, model_->ForwardSample(input, cache_, *collectives_, params,
                                                     with_logits ? &out.logits : nullptr));
  return out;
}

absl::Status UploadWeightsToCuda(GptBigCodeWeights& w) {
#ifdef MQA_WITH_CUDA
  auto upload = [](Tensor& t) -> absl::Status {
    if (!t.defined() || t.device() == Device::kCuda) return absl::OkStatus();
    ASSIGN_OR_RETURN(Tensor d, Tensor::Empty(t.shape(), t.dtype(), Device::kCuda));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(d.raw(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    t = std::move(d);
    return absl::OkStatus();
  };
  const bool tied = w.lm_head.defined() && w.wte.defined() && w.lm_head.raw() == w.wte.raw();
  RETURN_IF_ERROR(upload(w.wte));
  RETURN_IF_ERROR(upload(w.wpe));
  for (LayerWeights& L : w.layers) {
    for (Tensor* t : {&L.ln_1_w, &L.ln_1_b, &L.c_attn_w, &L.c_attn_b, &L.c_proj_w, &L.c_proj_b,
                      &L.ln_2_w, &L.ln_2_b, &L.c_fc_w, &L.c_fc_b, &L.mlp_proj_w, &L.mlp_proj_b}) {
      RETURN_IF_ERROR(upload(*t));
    }
  }
  RETURN_IF_ERROR(upload(w.ln_f_w));
  RETURN_IF_ERROR(upload(w.ln_f_b));
  if (tied) {
    w.lm_head = w.wte;
  } else {
    RETURN_IF_ERROR(upload(w.lm_head));
  }
  return absl::OkStatus();
#else
  (void)w;
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
}

absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> CreateGptBigCodeRunnerFromDir(
    LoadOptions load, Collectives* collectives, const GptBigCodeRunnerOptions& options) {
  if (collectives == nullptr) return absl::InvalidArgumentError("GptBigCodeRunner: no collectives");
  load.rank = collectives->rank();
  load.world_size = collectives->world_size();
  ASSIGN_OR_RETURN(GptBigCodeWeights weights, LoadWeights(load));
  return GptBigCodeRunner::Create(std::move(weights), collectives, options);
}

}  // namespace mqa
