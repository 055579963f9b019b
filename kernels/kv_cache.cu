// KV-cache write: each token's key and value rows copied to their slots, 16 bytes per thread
// when rows and strides allow it (they do for fp16/bf16 with head_dim a multiple of 8).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/kv_cache_cuda.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

struct CopyArgs {
  const char* key = nullptr;
  const char* value = nullptr;
  int64_t key_stride_bytes = 0;
  int64_t value_stride_bytes = 0;
  char* key_cache = nullptr;
  char* value_cache = nullptr;
  const int32_t* slot_mapping = nullptr;
  int64_t row_bytes = 0;
};

// One CTA per token; Word is uint4 (16-byte path) or unsigned char (fallback).
template <typename Word>
__global__ void __launch_bounds__(128) KvCacheWriteKernel(const CopyArgs a) {
  const int t = blockIdx.x;
  const int64_t slot = a.slot_mapping[t];  // step metadata: may be read before the PDL wait
  fwd::PdlWait();
  fwd::PdlTrigger();
  if (slot < 0) return;
  const int64_t words = a.row_bytes / sizeof(Word);
  const Word* k = reinterpret_cast<const Word*>(a.key + t * a.key_stride_bytes);
  const Word* v = reinterpret_cast<const Word*>(a.value + t * a.value_stride_bytes);
  Word* kc = reinterpret_cast<Word*>(a.key_cache + slot * a.row_bytes);
  Word* vc = reinterpret_cast<Word*>(a.value_cache + slot * a.row_bytes);
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
    kc[i] = k[i];
    vc[i] = v[i];
  }
}

}  // namespace

absl::Status KvCacheWriteCuda(const KvCacheWriteParams& p, cudaStream_t stream, bool pdl) {
  RETURN_IF_ERROR(ValidateKvCacheWriteShape(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  const int64_t esize = static_cast<int64_t>(DTypeSize(p.dtype));
  CopyArgs a;
  a.key = static_cast<const char*>(p.key);
  a.value = static_cast<const char*>(p.value);
  a.key_stride_bytes = p.key_stride * esize;
  a.value_stride_bytes = p.value_stride * esize;
  a.key_cache = static_cast<char*>(p.key_cache);
  a.value_cache = static_cast<char*>(p.value_cache);
  a.slot_mapping = p.slot_mapping;
  a.row_bytes = static_cast<int64_t>(p.num_kv_heads) * p.head_dim * esize;
  bool aligned =
      a.row_bytes % 16 == 0 && a.key_stride_bytes % 16 == 0 && a.value_stride_bytes % 16 == 0;
  for (const void* ptr : {p.key, p.value, static_cast<const void*>(p.key_cache),
                          static_cast<const void*>(p.value_cache)}) {
    aligned = aligned && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  }
  CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdl(
      pdl, aligned ? KvCacheWriteKernel<uint4> : KvCacheWriteKernel<unsigned char>,
      dim3(static_cast<unsigned>(p.num_tokens)), dim3(128), stream, a));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace mqa
