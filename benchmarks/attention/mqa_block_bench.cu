// How long one CTA takes to compute a batch-1 decode step's whole MQA attention on tensor cores
// (kernels/mqa_block_attention.cuh), every CTA of a grid as wide as the GPU doing the same, at
// StarCoder's (48 heads) and SantaCoder's (16) shapes, head_dim 128, fp16: the SM clocks each CTA
// spent loading Q, K and V from L2 (cp.async, all landed) and attending (scores, softmax across its
// 16 warps, P V, the output written), median and slowest over the CTAs, beside the whole kernel's
// time per launch (a graph of 20). This is the time a decode chain's CTA would add to compute the
// heads itself instead of waiting at a grid barrier for the CTAs that own them
// (benchmarks/mqabench/NOTES.md, version 42). Usage: mqa_block_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/mqa_block_attention.h"

using namespace mqa;  // NOLINT

int main() {
  int device = 0, sms = 0, khz = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("mqa_block_bench: %s, %d SMs, SM clock %.3f GHz (attribute)\n", prop.name, sms,
              khz / 1e6);
  bench::Stream stream;
  constexpr int D = 128, kBlock = 16, kBlocks = 16;
  bench::DeviceBuffer q(64 * D * 2), kc(kBlocks * kBlock * D * 2), vc(kBlocks * kBlock * D * 2);
  bench::Fill(DType::kF16, q.ptr, 64 * D, 1);
  bench::Fill(DType::kF16, kc.ptr, kBlocks * kBlock * D, 2);
  bench::Fill(DType::kF16, vc.ptr, kBlocks * kBlock * D, 3);
  std::vector<int32_t> table(kBlocks);
  for (int i = 0; i < kBlocks; ++i) table[i] = (i * 7 + 3) % kBlocks;
  bench::DeviceBuffer td(kBlocks * 4);
  CHECK_CUDA(cudaMemcpy(td.ptr, table.data(), kBlocks * 4, cudaMemcpyHostToDevice));
  bench::DeviceBuffer out(static_cast<size_t>(sms) * 64 * D * 2), clocks(sms * 2 * 8);
  std::printf("%-8s %-8s %-14s %-26s %-26s\n", "heads", "context", "kernel us",
              "loads us (median / max)", "attention us (median / max)");
  for (const int heads : {48, 16}) {
    for (const int ctx : {128, 256}) {
      MqaBlockAttentionParams p;
      p.query = q.ptr;
      p.key_cache = kc.ptr;
      p.value_cache = vc.ptr;
      p.block_table = static_cast<const int32_t*>(td.ptr);
      p.block_size = kBlock;
      p.context = ctx;
      p.heads = heads;
      p.scale = 0.0884f;
      p.output = out.ptr;
      p.grid = sms;
      const double us = bench::TimeGraphUs(stream.s, 20, 3, 10, [&](int, cudaStream_t s) {
        const absl::Status st = MqaBlockAttentionCuda(p, s);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          std::exit(1);
        }
      });
      p.clocks = static_cast<long long*>(clocks.ptr);
      if (!MqaBlockAttentionCuda(p, stream.s).ok()) return 1;
      CHECK_CUDA(cudaStreamSynchronize(stream.s));
      std::vector<long long> c(2 * sms);
      CHECK_CUDA(cudaMemcpy(c.data(), clocks.ptr, c.size() * 8, cudaMemcpyDeviceToHost));
      std::vector<double> load, attend;
      for (int i = 0; i < sms; ++i) {
        load.push_back(c[2 * i] / (khz / 1e3));
        attend.push_back(c[2 * i + 1] / (khz / 1e3));
      }
      std::printf("%-8d %-8d %-14.2f %6.2f / %-17.2f %6.2f / %-17.2f\n", heads, ctx, us,
                  bench::Median(load), *std::max_element(load.begin(), load.end()),
                  bench::Median(attend), *std::max_element(attend.begin(), attend.end()));
    }
  }
  return 0;
}
