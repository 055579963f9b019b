#include "kernels/ops.h"

#include "absl/strings/str_cat.h"

#ifdef MQA_WITH_CUDA
#include "kernels/activation_cuda.h"
#include "kernels/decode_chain_cuda.h"
#include "kernels/embedding_cuda.h"
#include "kernels/gemm_cuda.h"
#include "kernels/kv_cache_cuda.h"
#include "kernels/layer_norm_cuda.h"
#include "kernels/paged_attention_cuda.h"
#endif

namespace mqa {
namespace {

#ifdef MQA_WITH_CUDA
cudaStream_t Stream(const OpContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

absl::StatusOr<CudaGemm*> GemmOf(const OpContext& ctx) {
  if (ctx.gemm == nullptr) {
    return absl::FailedPreconditionError("CUDA GEMM: the OpContext carries no CudaGemm");
  }
  return static_cast<CudaGemm*>(ctx.gemm);
}
#else
absl::Status NoCuda(const char* op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": mqaserve was built without CUDA"));
}
#endif

}  // namespace

absl::Status LayerNorm(const OpContext& ctx, const LayerNormParams& p) {
  if (ctx.skip & kSkipLayerNorm) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return LayerNormCpu(p);
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
      return LayerNormCuda(p, Stream(ctx), ctx.pdl,
                           ctx.ln_registers ? LayerNormCudaKernel::kRegisters
                                            : LayerNormCudaKernel::kThreePass);
#else
      return NoCuda("LayerNorm");
#endif
  }
  return absl::InternalError("LayerNorm: unknown device");
}

absl::Status BiasActivation(const OpContext& ctx, const BiasActivationParams& p) {
  if (ctx.skip & kSkipActivation) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return BiasActivationCpu(p);
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
      return BiasActivationCuda(p, Stream(ctx), ctx.pdl);
#else
      return NoCuda("BiasActivation");
#endif
  }
  return absl::InternalError("BiasActivation: unknown device");
}

absl::Status Embedding(const OpContext& ctx, const EmbeddingParams& p) {
  if (ctx.skip & kSkipActivation) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return EmbeddingCpu(p);
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
      return EmbeddingCuda(p, Stream(ctx));
#else
      return NoCuda("Embedding");
#endif
  }
  return absl::InternalError("Embedding: unknown device");
}

absl::Status Gemm(const OpContext& ctx, const GemmParams& p) {
  if (ctx.skip & kSkipGemm) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return GemmCpu(p);
    case Device::kCuda: {
#ifdef MQA_WITH_CUDA
      if (p.alpha != 1.0f || p.beta != 0.0f) {
        return absl::UnimplementedError("Gemm on CUDA: alpha 1 and beta 0 only");
      }
      ASSIGN_OR_RETURN(CudaGemm * gemm, GemmOf(ctx));
      return gemm->Run(p, GemmEpilogue{}, Stream(ctx));
#else
      return NoCuda("Gemm");
#endif
    }
  }
  return absl::InternalError("Gemm: unknown device");
}

absl::Status Linear(const OpContext& ctx, const LinearParams& p) {
  if (ctx.skip & kSkipGemm) return absl::OkStatus();
  BiasActivationParams post;
  post.input = p.gemm.c;
  post.bias = p.bias;
  post.residual = p.residual;
  post.output = p.residual != nullptr ? p.residual : p.gemm.c;
  post.rows = p.gemm.m;
  post.cols = p.gemm.n;
  post.activation = p.activation;
  post.dtype = p.gemm.dtype;
  if (p.gemm.ldc != p.gemm.n) {
    return absl::InvalidArgumentError("Linear: C must be contiguous (ldc == n)");
  }
  switch (ctx.device) {
    case Device::kCpu:
      RETURN_IF_ERROR(GemmCpu(p.gemm));
      return BiasActivationCpu(post);
    case Device::kCuda: {
#ifdef MQA_WITH_CUDA
      ASSIGN_OR_RETURN(CudaGemm * gemm, GemmOf(ctx));
      GemmEpilogue e;
      e.bias = p.bias;
      e.activation = p.activation;
      e.release_dependents_early = p.release_dependents_early;
      GemmParams g = p.gemm;
      if (p.residual != nullptr && p.activation == Activation::kIdentity) {
        g.c = p.residual;  // residual += A B^T + bias, in the epilogue (beta = 1)
        e.accumulate = true;
        return gemm->Run(g, e, Stream(ctx));
      }
      if (p.residual == nullptr && p.activation != Activation::kGeluErf) {
        return gemm->Run(g, e, Stream(ctx));
      }
      RETURN_IF_ERROR(gemm->Run(g, GemmEpilogue{}, Stream(ctx)));
      return BiasActivationCuda(post, Stream(ctx), ctx.pdl);
#else
      return NoCuda("Linear");
#endif
    }
  }
  return absl::InternalError("Linear: unknown device");
}

absl::Status FusedLinear(const OpContext& ctx, const LinearParams& p, const LinearFusion& f) {
  if (ctx.skip & kSkipGemm) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return absl::UnimplementedError("FusedLinear: CUDA only");
    case Device::kCuda: {
#ifdef MQA_WITH_CUDA
      if (p.residual != nullptr || p.activation == Activation::kGeluErf) {
        return absl::UnimplementedError("FusedLinear: no residual, no GELU-erf");
      }
      if (p.gemm.ldc != p.gemm.n) {
        return absl::InvalidArgumentError("FusedLinear: C must be contiguous (ldc == n)");
      }
      ASSIGN_OR_RETURN(CudaGemm * gemm, GemmOf(ctx));
      GemmEpilogue e;
      e.bias = p.bias;
      e.activation = p.activation;
      e.ln_weight = f.ln_weight;
      e.ln_bias = f.ln_bias;
      e.ln_epsilon = f.ln_epsilon;
      e.ln_wsum = f.ln_wsum;
      e.ln_bsum = f.ln_bsum;
      e.key_cache = f.key_cache;
      e.value_cache = f.value_cache;
      e.slot_mapping = f.slot_mapping;
      e.kv_col0 = f.kv_col0;
      e.kv_width = f.kv_width;
      e.tail = f.tail;
      e.release_dependents_early = p.release_dependents_early;
      return gemm->Run(p.gemm, e, Stream(ctx));
#else
      return NoCuda("FusedLinear");
#endif
    }
  }
  return absl::InternalError("FusedLinear: unknown device");
}

absl::Status KvCacheWrite(const OpContext& ctx, const KvCacheWriteParams& p) {
  if (ctx.skip & kSkipKvWrite) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return KvCacheWriteCpu(p);
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
      return KvCacheWriteCuda(p, Stream(ctx), ctx.pdl);
#else
      return NoCuda("KvCacheWrite");
#endif
  }
  return absl::InternalError("KvCacheWrite: unknown device");
}

absl::Status PagedAttention(const OpContext& ctx, const PagedAttentionParams& p,
                            const KvCacheWriteParams* kv_write) {
  if (ctx.skip & kSkipKvWrite) kv_write = nullptr;
  if (ctx.skip & kSkipAttention) {
    return kv_write != nullptr ? KvCacheWrite(ctx, *kv_write) : absl::OkStatus();
  }
  switch (ctx.device) {
    case Device::kCpu:
      if (kv_write != nullptr) RETURN_IF_ERROR(KvCacheWriteCpu(*kv_write));
      return PagedAttentionCpu(p);
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
    {
      PagedAttentionTuning tuning;
      tuning.pdl = ctx.pdl;
      tuning.variant = ctx.attention_variant;
      tuning.warps_m = ctx.attention_warps_m;
      tuning.num_splits = ctx.attention_splits;
      tuning.hopper_tile_tokens = ctx.attention_tile_tokens;
      return PagedAttentionCuda(p, Stream(ctx), ctx.attention_workspace,
                                ctx.attention_workspace_bytes, tuning, kv_write);
    }
#else
      return NoCuda("PagedAttention");
#endif
  }
  return absl::InternalError("PagedAttention: unknown device");
}

absl::Status DecodeChain(const OpContext& ctx, const DecodeChainParams& p, int slot,
                         int timeline_index) {
  if (ctx.skip & kSkipGemm) return absl::OkStatus();
  switch (ctx.device) {
    case Device::kCpu:
      return DecodeChainCpu(p);
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
      if (ctx.chain_workspace == nullptr || slot < 0 || slot >= ctx.chain_slots) {
        return absl::UnimplementedError("DecodeChain: no workspace slot in the OpContext");
      }
      DecodeChainTuning tuning;
      tuning.spare_sms = ctx.chain_spare_sms;
      tuning.max_inflight = ctx.chain_max_inflight;
      tuning.stage_bytes = ctx.chain_stage_bytes;
      tuning.ll_inputs = ctx.chain_ll_inputs;
      tuning.head_hold = ctx.chain_head_hold;
      tuning.mma_fold = ctx.chain_mma_fold;
      tuning.half_fold = ctx.chain_half_fold;
      tuning.fused_mlp = ctx.chain_fused_mlp;
      tuning.fused_pool = ctx.chain_fused_pool;
      tuning.steal_chunks = ctx.chain_steal_chunks;
      tuning.sm_shares = ctx.chain_sm_shares;
      if (ctx.chain_timeline != nullptr && timeline_index >= 0 &&
          timeline_index < ctx.chain_timelines) {
        tuning.timeline = ctx.chain_timeline + timeline_index * ctx.chain_timeline_stride;
      }
      if (ctx.skip & kSkipAttention) {
        DecodeChainParams q = p;
        q.has_attention = false;
        return DecodeChainCuda(q, Stream(ctx), ctx.pdl, ctx.chain_workspace, slot, tuning);
      }
      return DecodeChainCuda(p, Stream(ctx), ctx.pdl, ctx.chain_workspace, slot, tuning);
#else
      (void)timeline_index;
      return NoCuda("DecodeChain");
#endif
  }
  return absl::InternalError("DecodeChain: unknown device");
}

}  // namespace mqa
