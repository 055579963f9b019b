#include "benchmarks/mqabench/device_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemm_cuda.h"
#include "model/weights_loader.h"
#include "runtime/cuda_check.h"

namespace mqa::bench {
namespace {

__device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void FillKernel(T* out, int64_t n, uint64_t key, float stddev, float constant) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = constant;
    if (stddev > 0) {
      const float u = static_cast<float>(Mix(key ^ Mix(i)) >> 40) * (1.0f / 16777216.0f);
      v = (2.0f * u - 1.0f) * 1.7320508f * stddev;  // uniform with this standard deviation
    }
    if constexpr (std::is_same_v<T, __half>) {
      out[i] = __float2half_rn(v);
    } else {
      out[i] = __float2bfloat16_rn(v);
    }
  }
}

absl::StatusOr<Tensor> Make(std::vector<int64_t> shape, DType dtype, uint64_t key, float stddev,
                            float constant) {
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(std::move(shape), dtype, Device::kCuda));
  const int64_t n = t.numel();
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 132 * 32));
  if (dtype == DType::kF16) {
    FillKernel<<<blocks, 256>>>(t.data<__half>(), n, key, stddev, constant);
  } else {
    FillKernel<<<blocks, 256>>>(t.data<__nv_bfloat16>(), n, key, stddev, constant);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return t;
}

}  // namespace

absl::StatusOr<GptBigCodeWeights> MakeDeviceDummyWeights(const ModelConfig& c, DType dtype,
                                                         uint64_t seed) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError("dummy device weights: float16 or bfloat16");
  }
  GptBigCodeWeights w;
  w.config = c;
  ASSIGN_OR_RETURN(w.shard, MakeShardInfo(c, 0, 1));
  const float sd = c.initializer_range;
  const int64_t E = c.n_embd, D = c.head_dim();
  const int64_t qkv = (w.shard.heads_per_rank + 2 * w.shard.kv_heads_per_rank) * D;
  uint64_t key = seed * 1000003 + 17;
  auto matrix = [&](std::vector<int64_t> shape) { return Make(std::move(shape), dtype, ++key, sd, 0); };
  auto ones = [&](int64_t n) { return Make({n}, dtype, ++key, 0, 1.0f); };
  auto zeros = [&](int64_t n) { return Make({n}, dtype, ++key, 0, 0.0f); };
  ASSIGN_OR_RETURN(w.wte, matrix({w.shard.vocab_shard, E}));
  ASSIGN_OR_RETURN(w.wpe, matrix({c.n_positions, E}));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights L;
    ASSIGN_OR_RETURN(L.ln_1_w, ones(E));
    ASSIGN_OR_RETURN(L.ln_1_b, zeros(E));
    ASSIGN_OR_RETURN(L.c_attn_w, matrix({qkv, E}));
    ASSIGN_OR_RETURN(L.c_attn_b, zeros(qkv));
    ASSIGN_OR_RETURN(L.c_proj_w, matrix({E, w.shard.heads_per_rank * D}));
    ASSIGN_OR_RETURN(L.c_proj_b, zeros(E));
    ASSIGN_OR_RETURN(L.ln_2_w, ones(E));
    ASSIGN_OR_RETURN(L.ln_2_b, zeros(E));
    ASSIGN_OR_RETURN(L.c_fc_w, matrix({w.shard.inner_shard, E}));
    ASSIGN_OR_RETURN(L.c_fc_b, zeros(w.shard.inner_shard));
    ASSIGN_OR_RETURN(L.mlp_proj_w, matrix({E, w.shard.inner_shard}));
    ASSIGN_OR_RETURN(L.mlp_proj_b, zeros(E));
    w.layers.push_back(std::move(L));
  }
  ASSIGN_OR_RETURN(w.ln_f_w, ones(E));
  ASSIGN_OR_RETURN(w.ln_f_b, zeros(E));
  w.lm_head = w.wte;
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return w;
}

absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes) {
  ASSIGN_OR_RETURN(Tensor a, Make({static_cast<int64_t>(bytes / 2)}, DType::kF16, 1, 1.0f, 0));
  ASSIGN_OR_RETURN(Tensor b, Tensor::Empty({static_cast<int64_t>(bytes / 2)}, DType::kF16,
                                           Device::kCuda));
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice));
  const int reps = 10;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(i % 2 ? a.raw() : b.raw(), i % 2 ? b.raw() : a.raw(),
                                         a.nbytes(), cudaMemcpyDeviceToDevice));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * a.nbytes() * reps / (ms * 1e-3);
}

absl::StatusOr<double> MeasureGemmRate(int64_t size, DType dtype) {
  ASSIGN_OR_RETURN(Tensor a, Make({size, size}, dtype, 2, 1.0f, 0));
  ASSIGN_OR_RETURN(Tensor b, Make({size, size}, dtype, 3, 1.0f, 0));
  ASSIGN_OR_RETURN(Tensor c, Tensor::Empty({size, size}, dtype, Device::kCuda));
  CudaGemm::Options o;
  o.skinny = false;
  ASSIGN_OR_RETURN(auto gemm, CudaGemm::Create(o));
  GemmParams p;
  p.a = a.raw();
  p.b = b.raw();
  p.c = c.raw();
  p.m = p.n = p.k = p.lda = p.ldb = p.ldc = size;
  p.dtype = dtype;
  RETURN_IF_ERROR(gemm->Run(p, {}, nullptr));
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  const int reps = 10;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) RETURN_IF_ERROR(gemm->Run(p, {}, nullptr));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * size * size * size * reps / (ms * 1e-3);
}

}  // namespace mqa::bench
