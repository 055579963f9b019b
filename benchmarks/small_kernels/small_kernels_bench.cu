// Latency of the small kernels of a decode step, today's kernel beside the new one, each call
// timed inside a CUDA graph of kCallsPerGraph calls (as the decode step runs them):
//   layer norm (fp16): LayerNormCudaKernel::kThreePass vs kRegisters, without and with PDL,
//     the calls chained (a -> b -> a ...) so that each reads the previous one's output;
//   sampling (fp32 logits, vocab 49152): SampleTokensCudaKernel::kOneCtaPerRow vs
//     kGreedyCluster, greedy batches and a batch with every other row sampled.
// The floor beside them: an empty kernel in the same graph (launch and scheduling alone, no
// memory traffic), without and with PDL. Prints µs per call.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/layer_norm_cuda.h"
#include "kernels/sampling_cuda.h"

namespace mqa {
namespace {

constexpr int kCallsPerGraph = 50;
constexpr int kReps = 21;

__global__ void EmptyKernel() {
  fwd::PdlWait();
  fwd::PdlTrigger();
}

// µs per call: `call(i, stream)` captured kCallsPerGraph times into one graph, the graph replayed
// kReps times after a warm-up; the median replay over kCallsPerGraph.
double TimeGraphUs(const std::function<void(int, cudaStream_t)>& call) {
  bench::Stream s;
  const double us = bench::TimeGraphUs(s.s, kCallsPerGraph, /*warmups=*/3, kReps, call);
  CHECK_CUDA(cudaGetLastError());
  return us;
}

double EmptyKernelUs(bool pdl) {
  return TimeGraphUs([&](int, cudaStream_t s) {
    CHECK_CUDA(fwd::LaunchMaybePdl(pdl, EmptyKernel, dim3(1), dim3(32), s));
  });
}

void BenchLayerNorm() {
  constexpr int64_t kMaxRows = 32, kMaxCols = 6144;
  __half *a, *b, *w, *bias;
  CHECK_CUDA(cudaMalloc(&a, kMaxRows * kMaxCols * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&b, kMaxRows * kMaxCols * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&w, kMaxCols * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&bias, kMaxCols * sizeof(__half)));
  bench::FillRandom<__half><<<256, 256>>>(a, kMaxRows * kMaxCols, 1, 3.0f, 0.5f);
  bench::FillRandom<__half><<<64, 256>>>(w, kMaxCols, 2, 0.5f, 1.0f);
  bench::FillRandom<__half><<<64, 256>>>(bias, kMaxCols, 3, 0.5f, 0.0f);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("layer norm fp16, µs per call (graph of %d chained calls)\n", kCallsPerGraph);
  std::printf("%6s %6s | %10s %10s | %10s %10s\n", "rows", "cols", "3pass", "registers",
              "3pass+pdl", "regs+pdl");
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 2048}, {1, 6144}, {8, 6144}, {32, 6144}}) {
    double us[2][2];
    for (int pdl = 0; pdl < 2; ++pdl) {
      for (int k = 0; k < 2; ++k) {
        const LayerNormCudaKernel kernel =
            k == 0 ? LayerNormCudaKernel::kThreePass : LayerNormCudaKernel::kRegisters;
        us[pdl][k] = TimeGraphUs([&](int i, cudaStream_t s) {
          LayerNormParams p;
          p.input = i % 2 ? b : a;
          p.output = i % 2 ? a : b;
          p.weight = w;
          p.bias = bias;
          p.rows = rows;
          p.cols = cols;
          p.dtype = DType::kF16;
          CHECK_OK(LayerNormCuda(p, s, pdl == 1, kernel));
        });
      }
    }
    std::printf("%6ld %6ld | %10.2f %10.2f | %10.2f %10.2f\n", rows, cols, us[0][0], us[0][1],
                us[1][0], us[1][1]);
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(w);
  cudaFree(bias);
}

void BenchSampling() {
  constexpr int64_t kMaxRows = 8, kVocab = 49152;
  float* logits;
  RowSamplingParams* params;
  int32_t* tokens;
  CHECK_CUDA(cudaMalloc(&logits, kMaxRows * kVocab * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&params, 2 * kMaxRows * sizeof(RowSamplingParams)));
  CHECK_CUDA(cudaMalloc(&tokens, kMaxRows * sizeof(int32_t)));
  bench::FillRandom<float><<<256, 256>>>(logits, kMaxRows * kVocab, 4, 10.0f, 0.0f);
  // params[0, 8): greedy; params[8, 16): every other row sampled (temperature, top-k, top-p).
  std::vector<RowSamplingParams> host(2 * kMaxRows);
  for (int r = 0; r < kMaxRows; ++r) {
    RowSamplingParams& q = host[kMaxRows + r];
    if (r % 2) {
      q.temperature = 0.8f;
      q.top_k = 50;
      q.top_p = 0.95f;
      q.seed = 1234 + r;
    }
  }
  CHECK_CUDA(cudaMemcpy(params, host.data(), host.size() * sizeof(RowSamplingParams),
                        cudaMemcpyHostToDevice));
  std::printf("\nsampling, vocab %ld fp32 logits, µs per call (graph of %d calls)\n", kVocab,
              kCallsPerGraph);
  std::printf("%6s %-7s | %10s %10s\n", "rows", "params", "1cta/row", "cluster");
  struct Case {
    int64_t rows;
    bool mixed;
  };
  for (Case c : {Case{1, false}, Case{8, false}, Case{8, true}}) {
    double us[2];
    for (int k = 0; k < 2; ++k) {
      const SampleTokensCudaKernel kernel =
          k == 0 ? SampleTokensCudaKernel::kOneCtaPerRow : SampleTokensCudaKernel::kGreedyCluster;
      us[k] = TimeGraphUs([&](int, cudaStream_t s) {
        SampleTokensParams p;
        p.logits = logits;
        p.rows = c.rows;
        p.vocab = kVocab;
        p.ld = kVocab;
        p.params = params + (c.mixed ? kMaxRows : 0);
        p.tokens = tokens;
        CHECK_OK(SampleTokensCuda(p, s, kernel));
      });
    }
    std::printf("%6ld %-7s | %10.2f %10.2f\n", c.rows, c.mixed ? "mixed" : "greedy", us[0], us[1]);
  }
  cudaFree(logits);
  cudaFree(params);
  cudaFree(tokens);
}

}  // namespace
}  // namespace mqa

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s\n", prop.name);
  std::printf("floor: an empty kernel in the same graph: %.2f µs per call, %.2f with PDL\n\n",
              mqa::EmptyKernelUs(false), mqa::EmptyKernelUs(true));
  mqa::BenchLayerNorm();
  mqa::BenchSampling();
  return 0;
}
