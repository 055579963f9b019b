// Row gather: one CTA per token, 16 bytes per thread when hidden and pointers allow.
#include "absl/strings/str_cat.h"
#include "kernels/embedding_cuda.h"
#include "kernels/forward_cuda_common.cuh"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

template <typename T, int kVec>
__global__ void __launch_bounds__(256)
    EmbeddingKernel(const int32_t* __restrict__ ids, const int32_t* __restrict__ positions,
                    const T* __restrict__ table, int64_t table_start, int64_t table_rows,
                    const T* __restrict__ pos_table, int64_t pos_rows, T* __restrict__ out,
                    int64_t hidden) {
  using V = fwd::Vec16<T>;
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - table_start;
  const bool in_table = row >= 0 && row < table_rows;
  int64_t pos = -1;
  if (pos_table != nullptr) {
    pos = positions[t];
    if (pos >= pos_rows) pos = -1;
  }
  const int64_t groups = hidden / kVec;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float f[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) f[i] = 0.0f;
    if constexpr (kVec == 1) {
      if (in_table) f[0] = fwd::ToFloat(table[row * hidden + g]);
      if (pos >= 0) f[0] += fwd::ToFloat(pos_table[pos * hidden + g]);
      out[t * hidden + g] = fwd::FromFloat<T>(f[0]);
    } else {
      if (in_table) {
        const V v = reinterpret_cast<const V*>(table + row * hidden)[g];
#pragma unroll
        for (int i = 0; i < kVec; ++i) f[i] = fwd::ToFloat(v.v[i]);
      }
      if (pos >= 0) {
        const V v = reinterpret_cast<const V*>(pos_table + pos * hidden)[g];
#pragma unroll
        for (int i = 0; i < kVec; ++i) f[i] += fwd::ToFloat(v.v[i]);
      }
      V o;
#pragma unroll
      for (int i = 0; i < kVec; ++i) o.v[i] = fwd::FromFloat<T>(f[i]);
      reinterpret_cast<V*>(out + t * hidden)[g] = o;
    }
  }
}

}  // namespace

absl::Status EmbeddingCuda(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.hidden <= 0 || p.table_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("EmbeddingCuda: num_tokens ", p.num_tokens,
                                                   ", hidden ", p.hidden, ", rows ", p.table_rows));
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.ids || !p.table || !p.output || (p.position_table && !p.positions)) {
    return absl::InvalidArgumentError("EmbeddingCuda: null pointer");
  }
  if (p.num_tokens > INT32_MAX) return absl::InvalidArgumentError("EmbeddingCuda: too many tokens");
  return fwd::DispatchFloat(p.dtype, "EmbeddingCuda", [&]<typename T>() -> absl::Status {
    constexpr int kVec = 16 / sizeof(T);
    const T* table = static_cast<const T*>(p.table);
    const T* pos = static_cast<const T*>(p.position_table);
    T* out = static_cast<T*>(p.output);
    const bool vec = p.hidden % kVec == 0 && fwd::Aligned16(table) && fwd::Aligned16(out) &&
                     (!pos || fwd::Aligned16(pos));
    if (vec) {
      EmbeddingKernel<T, kVec><<<p.num_tokens, 256, 0, stream>>>(
          p.ids, p.positions, table, p.table_start, p.table_rows, pos, p.position_rows, out,
          p.hidden);
    } else {
      EmbeddingKernel<T, 1><<<p.num_tokens, 256, 0, stream>>>(p.ids, p.positions, table,
                                                              p.table_start, p.table_rows, pos,
                                                              p.position_rows, out, p.hidden);
    }
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  });
}

}  // namespace mqa
