// The CUDA side of GptBigCode (model/gpt_bigcode.h): the stream, GEMM and device buffers, index
// staging, decode steps as CUDA graphs per (batch bucket, context bucket), fp32 logits and
// sampling on the device. Compiled in every build; without CUDA the entry points report it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "model/gpt_bigcode.h"
#include "runtime/status.h"

#ifdef MQA_WITH_CUDA
#include "kernels/decode_chain_cuda.h"
#include "kernels/device_info.h"
#include "kernels/gemm_cuda.h"
#include "kernels/paged_attention_cuda.h"
#include "kernels/sampling_cuda.h"
#include "runtime/cuda_check.h"
#endif

namespace mqa {

#ifdef MQA_WITH_CUDA

namespace {

// Pinned host memory that grows (its old contents are dropped).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr_, bytes));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

int64_t BatchBucket(int64_t n) {
  if (n <= 8) {
    int64_t b = 1;
    while (b < n) b *= 2;
    return b;
  }
  if (n <= 64) return (n + 7) / 8 * 8;
  return (n + 31) / 32 * 32;
}

int ContextBucket(int max_context_len) {
  int c = 256;
  while (c < max_context_len) c *= 2;
  return c;
}

}  // namespace

struct GptBigCode::CudaState {
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudaGemm> gemm;
  Tensor attention_workspace;
  Tensor tail_workspace;   // GemmTailAttention's counters and partials
  Tensor chain_workspace;  // DecodeChainCuda's counters (two slots: consecutive layers)
  Tensor chain_timeline;   // set_decode_chain_timeline's buffer (empty: off)
  Tensor tail_stamps;      // set_tail_timeline's buffer (empty: off)
  std::unique_ptr<DecodeChainSmShares> chain_shares;  // set_decode_chain_sm_shares' copy
  Tensor indices;  // device int32 staging of StepIndices
  // Host staging, two of each: the buffers of launch k + 1 are written while launch k's copies
  // may still be queued (LaunchSample). `slot` is the one the next launch writes.
  PinnedBuffer host_indices[2];
  PinnedBuffer host_params[2];
  PinnedBuffer host_tokens[2];
  cudaEvent_t sampled[2] = {nullptr, nullptr};  // the launch's tokens are in host_tokens[slot]
  int64_t sampled_rows[2] = {0, 0};
  int slot = 0;
  std::deque<int> pending;  // slots launched and not yet collected, oldest first
  // Rows the newest launch sampled (what feed_rows may use): that launch wrote the other slot.
  int64_t last_sampled_rows() const { return sampled_rows[slot ^ 1]; }
  Tensor params;  // device RowSamplingParams
  Tensor tokens;  // device int32
  bool graphs_enabled = false;
  bool greedy_cluster = false;  // GptBigCodeOptions::greedy_cluster
  int64_t max_graph_batch = 0;
  int max_graph_query = 1;
  using Key = std::tuple<int64_t, int, int64_t, const void*>;  // batch, context, query, cache
  std::map<Key, cudaGraphExec_t> graphs;
  std::set<Key> seen;  // buckets run once eagerly (plans and kernel attributes set up)
  cudaEvent_t graph_events[2] = {nullptr, nullptr};  // set_time_graphs
  bool graph_timed = false;                          // the last step launched a timed graph

  void ClearGraphs() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
    seen.clear();
  }
  ~CudaState() {
    ClearGraphs();
    for (cudaEvent_t e : graph_events) {
      if (e) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : sampled) {
      if (e) cudaEventDestroy(e);
    }
    gemm.reset();
    if (stream) cudaStreamDestroy(stream);
  }
};

void GptBigCode::CudaStateDeleter::operator()(CudaState* s) const { delete s; }

GptBigCode::~GptBigCode() {
  if (cuda_ && cuda_->stream) cudaStreamSynchronize(cuda_->stream);
}

void GptBigCode::ClearCudaGraphs() {
  if (cuda_) cuda_->ClearGraphs();
}

void GptBigCode::set_time_graphs(bool on) {
  if (!cuda_) return;
  for (cudaEvent_t& e : cuda_->graph_events) {
    if (on && !e) {
      if (cudaEventCreate(&e) != cudaSuccess) e = nullptr;
    } else if (!on && e) {
      cudaEventDestroy(e);
      e = nullptr;
    }
  }
  cuda_->graph_timed = false;
}

double GptBigCode::last_graph_ms() const {
  if (!cuda_ || !cuda_->graph_timed || !cuda_->graph_events[1]) return -1;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, cuda_->graph_events[0], cuda_->graph_events[1]) != cudaSuccess) {
    return -1;
  }
  return ms;
}

void GptBigCode::set_skinny_gemm(bool on, int rows_per_warp) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_skinny(on);
  cuda_->gemm->set_skinny_rows_per_warp(rows_per_warp);
  ClearCudaGraphs();
}

absl::Status GptBigCode::set_fast_paths(bool pdl, bool fuse_small_kernels, bool fuse_layer_norms) {
  if (!cuda_ || !cuda_->gemm) return absl::OkStatus();
  ctx_.pdl = pdl;
  cuda_->gemm->set_pdl(pdl);
  fuse_ = fuse_small_kernels || fuse_layer_norms;
  fuse_kv_ = fuse_small_kernels;
  ClearCudaGraphs();
  return fuse_ ? EnsureLnSums() : absl::OkStatus();
}

absl::Status GptBigCode::EnsureLnSums() {
  if (!ln_sums_.empty()) return absl::OkStatus();
  std::vector<Tensor> sums;
  auto add = [&](const Tensor& w, int64_t n, const Tensor& ln_w, const Tensor& ln_b) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({2, n}, DType::kF32, Device::kCuda));
    float* ws = static_cast<float*>(t.raw());
    RETURN_IF_ERROR(LayerNormFoldSumsCuda(w.raw(), embd_, n, embd_, dtype_, ln_w.raw(), ln_b.raw(),
                                          ws, ws + n, cuda_->stream));
    sums.push_back(std::move(t));
    return absl::OkStatus();
  };
  for (const LayerWeights& L : w_.layers) {
    RETURN_IF_ERROR(add(L.c_attn_w, qkv_cols_, L.ln_1_w, L.ln_1_b));
    RETURN_IF_ERROR(add(L.c_fc_w, inner_, L.ln_2_w, L.ln_2_b));
  }
  RETURN_IF_ERROR(add(w_.lm_head, vocab_shard_, w_.ln_f_w, w_.ln_f_b));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda_->stream));
  ln_sums_ = std::move(sums);
  return absl::OkStatus();
}

void GptBigCode::set_decode_chain(bool on, int spare_sms, int attention, int max_inflight,
                                  int64_t min_layer_bytes) {
  if (!cuda_) return;
  chain_ = on;
  if (spare_sms >= 0) ctx_.chain_spare_sms = spare_sms;
  if (attention >= 0) chain_attention_ = attention != 0;
  if (max_inflight >= 0) ctx_.chain_max_inflight = max_inflight;
  if (min_layer_bytes >= 0) chain_min_layer_bytes_ = min_layer_bytes;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_stage_bytes(int bytes) {
  ctx_.chain_stage_bytes = bytes;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_ll_inputs(int ll) {
  ctx_.chain_ll_inputs = ll;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_head_hold(int hold) {
  ctx_.chain_head_hold = hold;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_mma_fold(int mma) {
  ctx_.chain_mma_fold = mma;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_half_fold(int half) {
  ctx_.chain_half_fold = half;
  ClearCudaGraphs();
}

absl::Status GptBigCode::set_decode_chain_fused_mlp(bool on, int pool) {
  if (!cuda_) return absl::FailedPreconditionError("decode chain fused MLP: no CUDA model");
  ClearCudaGraphs();
  ctx_.chain_fused_mlp = on ? 1 : 0;
  ctx_.chain_fused_pool = pool;
  if (!on) {
    mlp_proj_wt_.clear();
    return absl::OkStatus();
  }
  if (!mlp_proj_wt_.empty()) return absl::OkStatus();
  std::vector<Tensor> wt;
  for (const LayerWeights& L : w_.layers) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({inner_, embd_}, dtype_, Device::kCuda));
    RETURN_IF_ERROR(
        DecodeChainTransposeCuda(L.mlp_proj_w.raw(), t.raw(), embd_, inner_, cuda_->stream));
    wt.push_back(std::move(t));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda_->stream));
  mlp_proj_wt_ = std::move(wt);
  return absl::OkStatus();
}

void GptBigCode::set_decode_chain_early_release(bool on) {
  chain_early_release_ = on;
  ClearCudaGraphs();
}

void GptBigCode::set_attention_release_early(bool on) {
  attention_release_early_ = on;
  ClearCudaGraphs();
}

void GptBigCode::set_tail_attention(bool on) {
  tail_attention_ = on;
  ClearCudaGraphs();
}

void GptBigCode::set_tail_cluster_merge(bool on) {
  tail_cluster_merge_ = on;
  ClearCudaGraphs();
}

void GptBigCode::set_tail_attention_proj(bool on) {
  tail_attention_proj_ = on;
  ClearCudaGraphs();
}

void GptBigCode::set_tail_release_early(int mask) {
  tail_release_early_ = mask;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_steal_chunks(int chunks) {
  ctx_.chain_steal_chunks = chunks;
  ClearCudaGraphs();
}

void GptBigCode::set_decode_chain_sm_shares(const DecodeChainSmShares* shares) {
  if (!cuda_) return;
  cuda_->chain_shares =
      shares == nullptr ? nullptr : std::make_unique<DecodeChainSmShares>(*shares);
  ctx_.chain_sm_shares = cuda_->chain_shares.get();
  ClearCudaGraphs();
}

namespace {

// A timeline buffer of `words` 64-bit words on the device, zeroed.
absl::StatusOr<Tensor> ZeroedWords(int64_t words) {
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({words * 2}, DType::kI32, Device::kCuda));
  CUDA_RETURN_IF_ERROR(cudaMemset(t.raw(), 0, t.nbytes()));
  return t;
}

// A timeline buffer's words once the stream's work is done.
absl::StatusOr<std::vector<unsigned long long>> DownloadWords(const Tensor& t,
                                                              cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<unsigned long long> h(t.nbytes() / sizeof(unsigned long long));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(h.data(), t.raw(), h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

absl::Status GptBigCode::set_decode_chain_timeline(bool on) {
  if (!cuda_) return absl::FailedPreconditionError("decode chain timeline: no CUDA model");
  ClearCudaGraphs();
  ctx_.chain_timeline = nullptr;
  ctx_.chain_timelines = 0;
  cuda_->chain_timeline = Tensor();
  if (!on) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int sms, CurrentDeviceSms());
  const size_t stride = DecodeChainTimelineWords(sms);
  const int layers = static_cast<int>(w_.config.n_layer);
  ASSIGN_OR_RETURN(cuda_->chain_timeline, ZeroedWords(static_cast<int64_t>(stride * layers)));
  ctx_.chain_timeline = static_cast<unsigned long long*>(cuda_->chain_timeline.raw());
  ctx_.chain_timeline_stride = stride;
  ctx_.chain_timelines = layers;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<unsigned long long>> GptBigCode::decode_chain_timeline() const {
  if (!cuda_ || ctx_.chain_timeline == nullptr) return std::vector<unsigned long long>();
  return DownloadWords(cuda_->chain_timeline, cuda_->stream);
}

// Room for a launch of kTailTimelineCtas CTAs (SantaCoder's QKV: 288 GEMM CTAs and 64 attention
// CTAs).
constexpr int64_t kTailTimelineCtas = 4096;

absl::Status GptBigCode::set_tail_timeline(int layer) {
  if (!cuda_) return absl::FailedPreconditionError("tail timeline: no CUDA model");
  ClearCudaGraphs();
  ctx_.tail_stamps = nullptr;
  ctx_.tail_stamps_layer = -1;
  cuda_->tail_stamps = Tensor();
  if (layer < 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(cuda_->tail_stamps, ZeroedWords(kTailTimelineCtas * kGemmTailStampWords));
  ctx_.tail_stamps = static_cast<unsigned long long*>(cuda_->tail_stamps.raw());
  ctx_.tail_stamps_layer = layer;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<unsigned long long>> GptBigCode::tail_timeline() const {
  if (!cuda_ || ctx_.tail_stamps == nullptr) return std::vector<unsigned long long>();
  return DownloadWords(cuda_->tail_stamps, cuda_->stream);
}

void GptBigCode::set_gemm_kernels(bool split_k, int stream_tc, bool deep_unroll, int half_fold) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_skinny_split_k(split_k);
  cuda_->gemm->set_stream_tc(stream_tc > 0);
  cuda_->gemm->set_stream_tc_tma(stream_tc == 2);
  cuda_->gemm->set_skinny_deep_unroll(deep_unroll);
  if (half_fold >= 0) cuda_->gemm->set_skinny_half_fold(half_fold != 0);
  ClearCudaGraphs();
}

void GptBigCode::set_gemm_stream_tma_knobs(int boxes, int hints) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_stream_tc_tma(cuda_->gemm->stream_tc_tma(), boxes, hints);
  ClearCudaGraphs();
}

void GptBigCode::set_gemm_stage_bytes(int bytes) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_skinny_stage_bytes(bytes);
  ClearCudaGraphs();
}

void GptBigCode::set_gemm_occupancy(bool on) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_skinny_occupancy(on);
  ClearCudaGraphs();
}

void GptBigCode::set_gemm_early_epilogue(bool on) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_skinny_early_epilogue(on);
  ClearCudaGraphs();
}

void GptBigCode::set_gemm_evict_first(bool on) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_skinny_evict_first(on);
  ClearCudaGraphs();
}

void GptBigCode::set_small_kernels(bool ln_registers, bool greedy_cluster) {
  if (!cuda_) return;
  ctx_.ln_registers = ln_registers;
  cuda_->greedy_cluster = greedy_cluster;
  ClearCudaGraphs();
}

void GptBigCode::set_attention(int variant, int warps_m, int splits, int tile_tokens) {
  if (!cuda_) return;
  ctx_.attention_variant = variant;
  ctx_.attention_warps_m = warps_m;
  ctx_.attention_splits = splits;
  ctx_.attention_tile_tokens = tile_tokens;
  // The in-kernel merges' counters (variants 2, 4-7, 9) sit where other variants put partials:
  // zero them again.
  if (ctx_.attention_workspace != nullptr) {
    cudaMemset(ctx_.attention_workspace, 0, ctx_.attention_workspace_bytes);
  }
  ClearCudaGraphs();
}

void GptBigCode::set_skip_ops(uint32_t skip) {
  ctx_.skip = skip;
  if (cuda_) ClearCudaGraphs();
}

int GptBigCode::num_cuda_graphs() const {
  return cuda_ ? static_cast<int>(cuda_->graphs.size()) : 0;
}

std::vector<std::pair<int, int>> GptBigCode::DecodeGraphShapes(int max_batch,
                                                               int max_context) const {
  std::vector<std::pair<int, int>> shapes;
  if (!cuda_ || !cuda_->graphs_enabled || max_context < 1) return shapes;
  const int most = static_cast<int>(std::min<int64_t>(max_batch, cuda_->max_graph_batch));
  std::vector<int> batches;  // the largest count of each bucket
  for (int n = 1; n <= most; ++n) {
    if (n == most || BatchBucket(n + 1) != BatchBucket(n)) batches.push_back(n);
  }
  for (int c = ContextBucket(1);; c *= 2) {
    const int context = std::min(c, max_context);
    for (int n : batches) shapes.emplace_back(n, context);
    if (context == max_context) break;
  }
  return shapes;
}

void GptBigCode::set_gemm_autotune(bool on, int max_m) {
  if (!cuda_ || !cuda_->gemm) return;
  cuda_->gemm->set_autotune(on, max_m);
  ClearCudaGraphs();
}

void GptBigCode::FreezeGemmAutotune() {
  if (cuda_ && cuda_->gemm) cuda_->gemm->freeze_autotune();
}

std::string GptBigCode::gemm_autotune_summary() const {
  if (!cuda_ || !cuda_->gemm) return "";
  const CudaGemm::AutotuneStats& s = cuda_->gemm->autotune_stats();
  char line[256];
  std::snprintf(line, sizeof(line),
                "gemm autotune: %d shapes tuned (%d algorithms timed), %d changed algorithm; one "
                "run of each: heuristic %.3f ms, tuned %.3f ms; %.2f s spent tuning",
                s.shapes, s.candidates, s.changed, s.first_ms, s.best_ms, s.seconds);
  if (s.decode_changes.empty()) return line;
  return std::string(line) + "\n  decode shapes changed: " + s.decode_changes;
}

absl::Status GptBigCode::InitCuda(const GptBigCodeOptions& options) {
  if (dtype_ != DType::kF16 && dtype_ != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA backend runs float16 or bfloat16 "
                                                   "weights, not ",
                                                   std::string(DTypeName(dtype_))));
  }
  cuda_.reset(new CudaState());
  // A blocking stream: it orders itself with the legacy default stream that collectives and
  // plain cudaMemcpy calls use.
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&cuda_->stream));
  ctx_.stream = cuda_->stream;
  CudaGemm::Options gemm_options;
  gemm_options.skinny = options.skinny_gemm;
  gemm_options.autotune = options.gemm_autotune;
  gemm_options.autotune_max_m = options.gemm_autotune_max_m;
  gemm_options.skinny_split_k = options.gemm_split_k;
  gemm_options.skinny_deep_unroll = options.gemm_deep_unroll;
  gemm_options.skinny_half_fold = options.gemm_half_fold;
  gemm_options.skinny_stage_bytes = options.gemm_stage_bytes;
  gemm_options.skinny_occupancy = options.gemm_occupancy;
  gemm_options.stream_tc = options.gemm_stream_tc;
  gemm_options.stream_tc_tma = options.gemm_stream_tc_tma;
  ASSIGN_OR_RETURN(cuda_->gemm, CudaGemm::Create(gemm_options));
  ctx_.gemm = cuda_->gemm.get();
  ctx_.pdl = options.pdl;
  cuda_->gemm->set_pdl(options.pdl);
  fuse_ = options.fuse_small_kernels || options.fuse_layer_norms;
  fuse_kv_ = options.fuse_small_kernels;
  if (fuse_) RETURN_IF_ERROR(EnsureLnSums());
  chain_ = options.decode_chain;
  chain_min_layer_bytes_ = options.decode_chain_min_layer_bytes;
  ctx_.chain_spare_sms = options.decode_chain_spare_sms;
  ctx_.chain_max_inflight = options.decode_chain_max_inflight;
  ctx_.chain_stage_bytes = options.decode_chain_stage_bytes;
  ctx_.chain_ll_inputs = options.decode_chain_ll_inputs;
  ctx_.chain_head_hold = options.decode_chain_head_hold;
  ctx_.chain_mma_fold = options.decode_chain_mma_fold;
  ctx_.chain_half_fold = options.decode_chain_half_fold;
  ctx_.chain_steal_chunks = options.decode_chain_steal_chunks;
  if (options.decode_chain_fused_mlp) {
    RETURN_IF_ERROR(set_decode_chain_fused_mlp(true, options.decode_chain_fused_pool));
  }
  chain_attention_ = options.decode_chain_attention;
  chain_attention_max_context_ = options.decode_chain_attention_max_context;
  chain_early_release_ = options.decode_chain_early_release;
  tail_attention_ = options.tail_attention;
  tail_cluster_merge_ = options.tail_cluster_merge;
  tail_release_early_ = options.tail_release_early;
  tail_attention_proj_ = options.tail_attention_proj;
  ctx_.ln_registers = options.ln_registers;
  ctx_.attention_variant = options.attention_variant;
  cuda_->greedy_cluster = options.greedy_cluster;
  cuda_->graphs_enabled = options.cuda_graphs && w_.shard.world_size == 1;
  cuda_->max_graph_batch = options.max_graph_batch;
  cuda_->max_graph_query = std::clamp(options.max_graph_query, 1, 8);

  constexpr int kChainSlots = 2;
  ASSIGN_OR_RETURN(cuda_->chain_workspace,
                   Tensor::Empty({static_cast<int64_t>(DecodeChainWorkspaceBytes(kChainSlots))},
                                 DType::kI32, Device::kCuda));
  CUDA_RETURN_IF_ERROR(
      cudaMemset(cuda_->chain_workspace.raw(), 0, cuda_->chain_workspace.nbytes()));
  ctx_.chain_workspace = cuda_->chain_workspace.raw();
  ctx_.chain_slots = kChainSlots;
  // The QKV GEMM's tail attention (zeroed once; each launch leaves its counters zeroed).
  const size_t tail_bytes = GemmTailAttentionWorkspaceBytes(static_cast<int>(heads_));
  ASSIGN_OR_RETURN(
      cuda_->tail_workspace,
      Tensor::Empty({static_cast<int64_t>((tail_bytes + 3) / 4)}, DType::kI32, Device::kCuda));
  CUDA_RETURN_IF_ERROR(cudaMemset(cuda_->tail_workspace.raw(), 0, tail_bytes));
  ctx_.tail_workspace = cuda_->tail_workspace.raw();
  ctx_.tail_workspace_bytes = tail_bytes;

  // Split-KV scratch for the largest shapes expected: decode batches at the longest context and
  // one full prefill chunk; a smaller one only means fewer splits.
  PagedAttentionParams p;
  void* const fake = reinterpret_cast<void*>(256);  // sizing only: aligned, never dereferenced
  p.query = fake;
  p.output = fake;
  p.key_cache = fake;
  p.value_cache = fake;
  p.block_tables = p.query_start = p.context_lens = reinterpret_cast<const int32_t*>(256);
  p.num_heads = static_cast<int>(heads_);
  p.num_kv_heads = static_cast<int>(kv_heads_);
  p.head_dim = static_cast<int>(head_dim_);
  p.query_stride = qkv_cols_;
  p.block_size = 16;
  p.max_context_len = static_cast<int>(ContextBucket(static_cast<int>(w_.config.n_positions)));
  p.max_blocks_per_seq = p.max_context_len / p.block_size;
  p.dtype = dtype_;
  // Sized for the model's variant and for 15 (set_attention may switch to it; 13-15 plan their
  // splits for their own CTAs an SM).
  auto need = [&](const PagedAttentionParams& q) {
    PagedAttentionTuning tuning;
    tuning.variant = options.attention_variant;
    const size_t own = PagedAttentionCudaWorkspaceBytes(q, tuning);
    tuning.variant = 15;
    return std::max(own, PagedAttentionCudaWorkspaceBytes(q, tuning));
  };
  size_t bytes = 0;
  for (int64_t b = 1; b <= std::max<int64_t>(256, options.max_graph_batch); b *= 2) {
    p.num_seqs = p.num_tokens = static_cast<int>(b);
    p.max_query_len = 1;
    bytes = std::max(bytes, need(p));
  }
  p.num_seqs = 1;
  p.num_tokens = static_cast<int>(std::min<int64_t>(options.max_batched_tokens, INT32_MAX));
  p.max_query_len = p.num_tokens;
  bytes = std::max(bytes, need(p));
  bytes = std::min<size_t>(bytes, size_t{512} << 20);
  if (bytes > 0) {
    ASSIGN_OR_RETURN(cuda_->attention_workspace,
                     Tensor::Empty({static_cast<int64_t>(bytes)}, DType::kI32, Device::kCuda));
    // Zeroed once: the in-kernel merge variants count split arrivals there (and leave it zeroed).
    CUDA_RETURN_IF_ERROR(cudaMemset(cuda_->attention_workspace.raw(), 0,
                                    cuda_->attention_workspace.nbytes()));
    ctx_.attention_workspace = cuda_->attention_workspace.raw();
    ctx_.attention_workspace_bytes = cuda_->attention_workspace.nbytes();
  }
  return absl::OkStatus();
}

absl::StatusOr<GptBigCode::StepIndices> GptBigCode::StageIndicesCuda(const StepInput& in,
                                                                     int64_t bucket_batch,
                                                                     int bucket_context,
                                                                     int64_t query) {
  const int64_t n = in.num_tokens(), s = in.num_seqs();
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  const bool pad = bucket_batch > 0;
  // Padded (a graph's shape): bucket_batch sequences of `query` tokens each; with query > 1 every
  // token has a logits row.
  const int64_t N = pad ? bucket_batch * query : n;
  const int64_t S = pad ? bucket_batch : s;
  const int64_t R = pad ? (query > 1 ? N : bucket_batch) : rows;
  const int64_t MB = pad ? bucket_context / cache_block_size_ : in.max_blocks_per_seq;
  auto round = [](int64_t x) { return (x + 31) / 32 * 32; };
  const int64_t o_tok = 0, o_pos = o_tok + round(N), o_qs = o_pos + round(N);
  const int64_t o_ctx = o_qs + round(S + 1), o_slot = o_ctx + round(S);
  const int64_t o_bt = o_slot + round(N), o_rows = o_bt + round(S * MB);
  const int64_t total = o_rows + round(R);

  PinnedBuffer& host = cuda_->host_indices[cuda_->slot];
  RETURN_IF_ERROR(host.Reserve(total * sizeof(int32_t)));
  if (!cuda_->indices.defined() || cuda_->indices.numel() < total) {
    // Growing moves the buffer every captured graph reads: they all go. Twice the need, so that
    // after the start-up warm-up (largest decode shape first) no step of the engine's limits,
    // prefill chunks included, grows it again.
    ClearCudaGraphs();
    ASSIGN_OR_RETURN(cuda_->indices, Tensor::Empty({std::max<int64_t>(2 * total, 1 << 16)},
                                                   DType::kI32, Device::kCuda));
  }
  int32_t* h = host.get<int32_t>();
  auto fill = [&](int64_t off, const std::vector<int32_t>& v, int64_t count, int32_t pad_value) {
    std::copy(v.begin(), v.end(), h + off);
    std::fill(h + off + v.size(), h + off + count, pad_value);
  };
  fill(o_tok, in.token_ids, N, 0);
  fill(o_pos, in.positions, N, 0);
  fill(o_ctx, in.context_lens, S, 1);
  fill(o_slot, in.slot_mapping, N, -1);  // padded rows write nothing to the cache
  fill(o_rows, in.logits_rows, R, 0);
  std::copy(in.query_start.begin(), in.query_start.end(), h + o_qs);
  for (int64_t i = s + 1; i <= S; ++i) h[o_qs + i] = static_cast<int32_t>(n + (i - s) * query);
  int max_ctx = 0, max_q = 0;
  for (int64_t i = 0; i < s; ++i) {
    max_ctx = std::max(max_ctx, in.context_lens[i]);
    max_q = std::max(max_q, in.query_start[i + 1] - in.query_start[i]);
  }
  if (pad) {
    std::fill(h + o_bt, h + o_bt + S * MB, 0);
    const int64_t width = std::min<int64_t>(MB, in.max_blocks_per_seq);
    for (int64_t i = 0; i < s; ++i) {
      std::copy_n(in.block_tables.begin() + i * in.max_blocks_per_seq, width, h + o_bt + i * MB);
    }
  } else {
    std::copy(in.block_tables.begin(), in.block_tables.end(), h + o_bt);
  }
  const auto stream = static_cast<cudaStream_t>(ctx_.stream);
  int32_t* d = cuda_->indices.data<int32_t>();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d, h, total * sizeof(int32_t), cudaMemcpyHostToDevice, stream));

  StepIndices idx;
  idx.token_ids = d + o_tok;
  idx.positions = d + o_pos;
  idx.query_start = d + o_qs;
  idx.context_lens = d + o_ctx;
  idx.slot_mapping = d + o_slot;
  idx.block_tables = d + o_bt;
  idx.logits_rows = d + o_rows;
  idx.max_context_len = pad ? bucket_context : max_ctx;
  idx.num_tokens = N;
  idx.num_seqs = static_cast<int>(S);
  idx.max_blocks_per_seq = static_cast<int>(MB);
  idx.max_query_len = pad ? static_cast<int>(query) : max_q;
  idx.num_logits_rows = R;
  return idx;
}

absl::Status GptBigCode::TrunkAndLogitsCuda(const StepIndices& idx, PagedKvCache& cache,
                                            Collectives& collectives) {
  RETURN_IF_ERROR(Trunk(idx, cache, collectives));
  const int64_t rows = idx.num_logits_rows;
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(LogitsRows(idx));
  const int T = w_.shard.world_size;
  LogitsToFloatParams lp;
  lp.input = local_logits_.raw();
  if (T > 1) {
    const Tensor local = local_logits_.Rows(0, rows);
    Tensor gathered = gathered_logits_.Rows(0, T * rows);
    RETURN_IF_ERROR(collectives.Gather(local, gathered, /*root=*/0));
    if (w_.shard.rank != 0) return absl::OkStatus();
    lp.input = gathered.raw();
  }
  lp.shards = T;
  lp.rows = rows;
  lp.vocab_shard = vocab_shard_;
  lp.vocab = w_.config.vocab_size;
  lp.output = logits_f32_.data<float>();
  lp.dtype = dtype_;
  return LogitsToFloatCuda(lp, static_cast<cudaStream_t>(ctx_.stream));
}

absl::Status GptBigCode::ForwardCuda(const StepInput& in, PagedKvCache& cache,
                                     Collectives& collectives, int64_t* logits_rows,
                                     int feed_rows) {
  const int64_t n = in.num_tokens();
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  *logits_rows = rows;
  cache_block_size_ = cache.block_size();
  cuda_->graph_timed = false;
  const auto stream = static_cast<cudaStream_t>(ctx_.stream);
  // A graph step: every sequence brings q tokens — q = 1 (decode; at most one logits row each),
  // or 1 < q <= max_graph_query with every token's logits row, in order (speculative decoding's
  // check step).
  const int64_t s = in.num_seqs();
  const int64_t q = s > 0 ? in.query_start[1] - in.query_start[0] : 0;
  // (Check steps only up to 8 sequences: a padded bucket of q rows each must stay within the
  // workspaces preallocated for the engine's limits, and batch 1 is where they matter.)
  bool graphed = cuda_->graphs_enabled && s > 0 && s <= cuda_->max_graph_batch && q >= 1 &&
                 q <= cuda_->max_graph_query && (q == 1 || s <= 8) && n == s * q &&
                 (q == 1 ? rows <= n : rows == n);
  for (int64_t i = 0; graphed && i < s; ++i)
    graphed = in.query_start[i + 1] - in.query_start[i] == q;
  for (int64_t r = 0; graphed && q > 1 && r < rows; ++r) graphed = in.logits_rows[r] == r;
  if (!graphed) {
    RETURN_IF_ERROR(EnsureWorkspace(n, rows));
    ASSIGN_OR_RETURN(const StepIndices idx, StageIndicesCuda(in, 0, 0, 1));
    RETURN_IF_ERROR(FeedTokens(idx, feed_rows));
    return TrunkAndLogitsCuda(idx, cache, collectives);
  }
  const int64_t B = BatchBucket(s);
  int max_ctx = 0;
  for (int32_t c : in.context_lens) max_ctx = std::max(max_ctx, c);
  const int C = ContextBucket(max_ctx);
  RETURN_IF_ERROR(EnsureWorkspace(B * q, q > 1 ? B * q : B));
  ASSIGN_OR_RETURN(const StepIndices idx, StageIndicesCuda(in, B, C, q));
  RETURN_IF_ERROR(FeedTokens(idx, feed_rows));
  const CudaState::Key key{B, C, q, cache.key(0).raw()};
  const bool timed = cuda_->graph_events[0] != nullptr && cuda_->graph_events[1] != nullptr;
  auto launch = [&](cudaGraphExec_t exec) -> absl::Status {
    if (timed) CUDA_RETURN_IF_ERROR(cudaEventRecord(cuda_->graph_events[0], stream));
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
    if (timed) CUDA_RETURN_IF_ERROR(cudaEventRecord(cuda_->graph_events[1], stream));
    cuda_->graph_timed = timed;
    return absl::OkStatus();
  };
  if (auto it = cuda_->graphs.find(key); it != cuda_->graphs.end()) return launch(it->second);
  if (!cuda_->seen.contains(key)) {
    // First sight: run eagerly, which also creates the GEMM plans and kernel attributes that a
    // capture must not create.
    cuda_->seen.insert(key);
    return TrunkAndLogitsCuda(idx, cache, collectives);
  }
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status body = TrunkAndLogitsCuda(idx, cache, collectives);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!body.ok()) {
    if (graph) cudaGraphDestroy(graph);
    return body;
  }
  CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(inst);
  cuda_->graphs.emplace(key, exec);
  return launch(exec);
}

absl::StatusOr<Tensor> GptBigCode::LogitsToHostCuda(int64_t rows) {
  Tensor out = Tensor::Cpu({rows, w_.config.vocab_size}, DType::kF32);
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.raw(), logits_f32_.raw(), out.nbytes(),
                                       cudaMemcpyDeviceToHost,
                                       static_cast<cudaStream_t>(ctx_.stream)));
  return out;
}

absl::Status GptBigCode::FeedTokens(const StepIndices& idx, int feed_rows) {
  if (feed_rows <= 0) return absl::OkStatus();
  // The previous launch's tokens, still on the device, ordered after its sampling kernel.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<int32_t*>(idx.token_ids), cuda_->tokens.raw(),
                                       feed_rows * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                       static_cast<cudaStream_t>(ctx_.stream)));
  return absl::OkStatus();
}

absl::Status GptBigCode::LaunchSampleCuda(absl::Span<const RowSamplingParams> params) {
  const int64_t rows = static_cast<int64_t>(params.size());
  const auto stream = static_cast<cudaStream_t>(ctx_.stream);
  const int slot = cuda_->slot;
  if (!cuda_->sampled[slot]) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&cuda_->sampled[slot], cudaEventDisableTiming));
  }
  if (rows > 0) {
    const size_t param_bytes = rows * sizeof(RowSamplingParams);
    PinnedBuffer& host_params = cuda_->host_params[slot];
    RETURN_IF_ERROR(host_params.Reserve(param_bytes));
    RETURN_IF_ERROR(cuda_->host_tokens[slot].Reserve(rows * sizeof(int32_t)));
    if (!cuda_->tokens.defined() || cuda_->tokens.numel() < rows) {
      const int64_t cap = std::max<int64_t>(rows, 256);
      ASSIGN_OR_RETURN(cuda_->tokens, Tensor::Empty({cap}, DType::kI32, Device::kCuda));
      ASSIGN_OR_RETURN(cuda_->params,
                       Tensor::Empty({cap * static_cast<int64_t>(sizeof(RowSamplingParams))},
                                     DType::kI32, Device::kCuda));
    }
    std::memcpy(host_params.get<void>(), params.data(), param_bytes);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cuda_->params.raw(), host_params.get<void>(),
                                         param_bytes, cudaMemcpyHostToDevice, stream));
    SampleTokensParams sp;
    sp.logits = logits_f32_.data<float>();
    sp.rows = rows;
    sp.vocab = w_.config.vocab_size;
    sp.ld = w_.config.vocab_size;
    sp.params = static_cast<const RowSamplingParams*>(cuda_->params.raw());
    sp.tokens = cuda_->tokens.data<int32_t>();
    RETURN_IF_ERROR(SampleTokensCuda(sp, stream,
                                     cuda_->greedy_cluster ? SampleTokensCudaKernel::kGreedyCluster
                                                           : SampleTokensCudaKernel::kOneCtaPerRow));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(cuda_->host_tokens[slot].get<void>(), cuda_->tokens.raw(),
                                         rows * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(cuda_->sampled[slot], stream));
  cuda_->sampled_rows[slot] = rows;
  cuda_->pending.push_back(slot);
  cuda_->slot ^= 1;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> GptBigCode::CollectSampleCuda() {
  if (cuda_->pending.empty()) return absl::FailedPreconditionError("CollectSample: nothing launched");
  const int slot = cuda_->pending.front();
  cuda_->pending.pop_front();
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(cuda_->sampled[slot]));
  const int32_t* t = cuda_->host_tokens[slot].get<int32_t>();
  return std::vector<int32_t>(t, t + cuda_->sampled_rows[slot]);
}

absl::Status GptBigCode::LaunchStepCuda(const StepInput& in, PagedKvCache& cache,
                                        Collectives& collectives,
                                        absl::Span<const RowSamplingParams> params, int feed_rows) {
  if (!cuda_) return absl::FailedPreconditionError("LaunchSample: the CUDA backend is not ready");
  if (feed_rows > cuda_->last_sampled_rows()) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchSample: feed_rows ", feed_rows, " and ",
                                                   cuda_->last_sampled_rows(),
                                                   " rows sampled by the previous launch"));
  }
  int64_t rows = 0;
  RETURN_IF_ERROR(ForwardCuda(in, cache, collectives, &rows, feed_rows));
  return LaunchSampleCuda(params);
}

int GptBigCode::pending_cuda_launches() const {
  return cuda_ ? static_cast<int>(cuda_->pending.size()) : 0;
}

#else  // !MQA_WITH_CUDA

struct GptBigCode::CudaState {};
void GptBigCode::CudaStateDeleter::operator()(CudaState* s) const { delete s; }
GptBigCode::~GptBigCode() = default;
void GptBigCode::ClearCudaGraphs() {}
void GptBigCode::set_skinny_gemm(bool, int) {}
absl::Status GptBigCode::set_fast_paths(bool, bool, bool) { return absl::OkStatus(); }
void GptBigCode::set_decode_chain(bool, int, int, int, int64_t) {}
void GptBigCode::set_decode_chain_early_release(bool) {}
void GptBigCode::set_attention_release_early(bool) {}
void GptBigCode::set_tail_attention(bool) {}
void GptBigCode::set_tail_cluster_merge(bool) {}
void GptBigCode::set_tail_release_early(int) {}
void GptBigCode::set_tail_attention_proj(bool) {}
void GptBigCode::set_decode_chain_stage_bytes(int) {}
void GptBigCode::set_decode_chain_ll_inputs(int) {}
void GptBigCode::set_decode_chain_head_hold(int) {}
void GptBigCode::set_decode_chain_mma_fold(int) {}
void GptBigCode::set_decode_chain_half_fold(int) {}
absl::Status GptBigCode::set_decode_chain_fused_mlp(bool, int) {
  return absl::FailedPreconditionError("decode chain fused MLP: built without CUDA");
}
void GptBigCode::set_decode_chain_steal_chunks(int) {}
void GptBigCode::set_decode_chain_sm_shares(const DecodeChainSmShares*) {}
absl::Status GptBigCode::set_decode_chain_timeline(bool) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}
absl::StatusOr<std::vector<unsigned long long>> GptBigCode::decode_chain_timeline() const {
  return std::vector<unsigned long long>();
}
absl::Status GptBigCode::set_tail_timeline(int) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}
absl::StatusOr<std::vector<unsigned long long>> GptBigCode::tail_timeline() const {
  return std::vector<unsigned long long>();
}
int GptBigCode::num_cuda_graphs() const { return 0; }
std::vector<std::pair<int, int>> GptBigCode::DecodeGraphShapes(int, int) const { return {}; }
void GptBigCode::set_time_graphs(bool) {}
void GptBigCode::set_attention(int, int, int, int) {}
void GptBigCode::set_skip_ops(uint32_t skip) { ctx_.skip = skip; }
absl::Status GptBigCode::LaunchStepCuda(const StepInput&, PagedKvCache&, Collectives&,
                                        absl::Span<const RowSamplingParams>, int) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}
absl::StatusOr<std::vector<int32_t>> GptBigCode::CollectSampleCuda() {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}
int GptBigCode::pending_cuda_launches() const { return 0; }
double GptBigCode::last_graph_ms() const { return -1; }
void GptBigCode::set_gemm_autotune(bool, int) {}
void GptBigCode::FreezeGemmAutotune() {}
void GptBigCode::set_small_kernels(bool, bool) {}
void GptBigCode::set_gemm_kernels(bool, int, bool, int) {}
void GptBigCode::set_gemm_stream_tma_knobs(int, int) {}
void GptBigCode::set_gemm_stage_bytes(int) {}
void GptBigCode::set_gemm_occupancy(bool) {}
void GptBigCode::set_gemm_early_epilogue(bool) {}
void GptBigCode::set_gemm_evict_first(bool) {}
std::string GptBigCode::gemm_autotune_summary() const { return ""; }
absl::Status GptBigCode::InitCuda(const GptBigCodeOptions&) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}

#endif  // MQA_WITH_CUDA

}  // namespace mqa
