// What a kernel boundary costs in a batch-1 decode step, by the way the next kernel learns that
// its input is ready. A graph of kernels, each streaming its own weights (a CTA its contiguous
// share) and then reading a vector the previous kernel wrote, as the skinny GEMMs of a decode
// step do; four handovers side by side:
//   plain    stream order, no PDL: a kernel starts when the previous one has completed;
//   pdl      PDL as the skinny GEMM uses it: the first weights loaded, griddepcontrol.wait, then
//            launch_dependents (the next kernel becomes resident once every CTA passed the wait);
//   pdl-early  launch_dependents at the start, griddepcontrol.wait before the input;
//   flag     launch_dependents at the start, and instead of griddepcontrol.wait a counter: every
//            CTA adds 1 (release) after its output is written, the next kernel's CTAs poll it
//            (acquire) until all of the previous kernel's CTAs have;
// each with `pre` KiB of a CTA's weights requested into shared memory (cp.async) before the wait,
// the rest of its share either loaded before the wait too, or (a GEMV's constraint: its fold needs
// the input) streamed after it.
// Weights per kernel: none (the boundary alone), SantaCoder's four projections a layer (9.4, 8.4,
// 33.6, 33.6 MB) or StarCoder-sized 9.4 MB ones. Prints µs per kernel, the graph's weight rate and
// the device-to-device copy rate of the same run (read + write), the ceiling.
//
//   handover_bench [--kernels N] [--ctas C]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/forward_cuda_common.cuh"

namespace mqa {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;     // 16-byte loads in flight a thread after the wait
constexpr int kVector = 2048;  // floats a kernel reads from the previous one

enum class Handover { kPlain, kPdl, kPdlEarly, kFlag };
const char* Name(Handover h) {
  switch (h) {
    case Handover::kPlain: return "plain";
    case Handover::kPdl: return "pdl";
    case Handover::kPdlEarly: return "pdl-early";
    case Handover::kFlag: return "flag";
  }
  return "?";
}

struct StageArgs {
  const uint4* w;     // this kernel's weights
  int64_t chunks;     // 16-byte chunks of them
  int pre_chunks;     // chunks a CTA copies to shared memory before the wait (<= its share)
  const float* in;    // the previous kernel's output (kVector floats)
  float* out;         // this kernel's output (kVector floats)
  unsigned* counter;  // kFlag: this kernel's counter; counter[-1] is the previous kernel's
  unsigned prev_ctas;
  bool first;  // the graph's first kernel (nothing to wait for)
  // A GEMV's constraint: only the shared-memory part is loaded before the wait; the rest of the
  // share streams after it (a fold needs the input).
  bool stream_after_wait;
};

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t Fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <Handover H>
__global__ void __launch_bounds__(kThreads) StageKernel(const StageArgs a) {
  extern __shared__ uint4 smem[];
  const int t = threadIdx.x;
  if constexpr (H == Handover::kPdlEarly || H == Handover::kFlag) fwd::PdlTrigger();
  const int64_t share = (a.chunks + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * share;
  const int64_t end = min(a.chunks, begin + share);
  const int64_t pre_end = min(end, begin + a.pre_chunks);
  for (int64_t i = begin + t; i < pre_end; i += kThreads) {
    fwd::CpAsync16(fwd::SmemAddr(&smem[i - begin]), &a.w[i], true);
  }
  fwd::CpAsyncCommit();
  uint32_t acc = 0;
  // The rest of the share: independent loads kUnroll deep.
  auto stream_rest = [&] {
    int64_t i = pre_end + t;
    for (; i + (kUnroll - 1) * kThreads < end; i += kUnroll * kThreads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(&a.w[i + u * kThreads]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc ^= Fold(v[u]);
    }
    for (; i < end; i += kThreads) acc ^= Fold(__ldg(&a.w[i]));
  };
  if (!a.stream_after_wait) stream_rest();

  if constexpr (H == Handover::kPdl || H == Handover::kPdlEarly) fwd::PdlWait();
  if constexpr (H == Handover::kPdl) fwd::PdlTrigger();
  if constexpr (H == Handover::kFlag) {
    if (!a.first && t == 0) {
      while (LoadAcquire(a.counter - 1) < a.prev_ctas) __nanosleep(20);
    }
    __syncthreads();
  }
  float sum = 0.0f;
  for (int j = t; j < kVector; j += kThreads) sum += a.in[j];
  if (a.stream_after_wait) stream_rest();
  fwd::CpAsyncWait<0>();
  __syncthreads();
  for (int64_t j = begin + t; j < pre_end; j += kThreads) acc ^= Fold(smem[j - begin]);
  // Each CTA writes its slice of the output vector.
  for (int j = blockIdx.x * kThreads + t; j < kVector; j += gridDim.x * kThreads) {
    a.out[j] = sum + static_cast<float>(acc & 0xff) * 1e-3f;
  }
  if constexpr (H == Handover::kFlag) {
    __syncthreads();
    if (t == 0) {
      __threadfence();
      atomicAdd(a.counter, 1u);
    }
  }
}

struct Workload {
  const char* name;
  std::vector<int64_t> bytes;  // a pattern of weight bytes per kernel, repeated
};

double RunUs(Handover h, const Workload& wl, int kernels, int ctas, int pre_kib, bool after,
             const uint4* w, float* vecs, unsigned* counters, int64_t* total_bytes) {
  using Kernel = void (*)(StageArgs);
  Kernel k = h == Handover::kPlain      ? StageKernel<Handover::kPlain>
             : h == Handover::kPdl      ? StageKernel<Handover::kPdl>
             : h == Handover::kPdlEarly ? StageKernel<Handover::kPdlEarly>
                                        : StageKernel<Handover::kFlag>;
  const size_t smem = static_cast<size_t>(pre_kib) * 1024;
  CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(std::max<size_t>(smem, 1))));
  bench::Stream s;
  int64_t offset = 0;
  *total_bytes = 0;
  std::vector<StageArgs> args(kernels);
  for (int i = 0; i < kernels; ++i) {
    const int64_t bytes = wl.bytes[i % wl.bytes.size()];
    StageArgs& a = args[i];
    a.w = w + offset / 16;
    a.chunks = bytes / 16;
    a.pre_chunks = static_cast<int>(smem / 16);
    a.in = vecs + (i % 2) * kVector;
    a.out = vecs + ((i + 1) % 2) * kVector;
    a.counter = counters + 1 + i;
    a.prev_ctas = static_cast<unsigned>(ctas);
    a.first = i == 0;
    a.stream_after_wait = after;
    offset += (bytes + 255) / 256 * 256;
    *total_bytes += bytes;
  }
  cudaGraph_t graph = bench::CaptureGraph(s.s, 1, [&](int, cudaStream_t st) {
    CHECK_CUDA(cudaMemsetAsync(counters, 0, sizeof(unsigned) * (kernels + 1), st));
    for (int i = 0; i < kernels; ++i) {
      CHECK_CUDA(fwd::LaunchMaybePdlSmem(h != Handover::kPlain && i > 0, k, dim3(ctas),
                                         dim3(kThreads), smem, st, args[i]));
    }
  });
  const double us = bench::ReplayGraphUs(s.s, graph, kernels, /*warmups=*/3, /*reps=*/15);
  cudaGraphDestroy(graph);
  CHECK_CUDA(cudaGetLastError());
  return us;
}

}  // namespace
}  // namespace mqa

int main(int argc, char** argv) {
  using namespace mqa;
  int kernels = 96, ctas = 132;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--kernels")) kernels = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--ctas")) ctas = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  bench::Stream cs;
  const double copy_ms = bench::CopyCeilingMs(cs.s);
  const double copy_gbs = 2.0 * bench::kCopyCeilingBytes / (copy_ms * 1e6);
  std::printf("%s; copy ceiling %.0f GB/s (read + write); %d kernels a graph, %d CTAs x %d "
              "threads\n",
              prop.name, copy_gbs, kernels, ctas, kThreads);
  const std::vector<Workload> workloads = {
      {"boundary only (no weights)", {0}},
      {"SantaCoder layer (9.4, 8.4, 33.6, 33.6 MB)", {9437184, 8388608, 33554432, 33554432}},
      {"9.4 MB each", {9437184}},
  };
  int64_t max_bytes = 0;
  for (const Workload& wl : workloads) {
    int64_t b = 0;
    for (int i = 0; i < kernels; ++i) b += (wl.bytes[i % wl.bytes.size()] + 255) / 256 * 256;
    max_bytes = std::max(max_bytes, b);
  }
  bench::DeviceBuffer w(static_cast<size_t>(std::max<int64_t>(max_bytes, 256)));
  CHECK_CUDA(cudaMemset(w.ptr, 0x3c, static_cast<size_t>(std::max<int64_t>(max_bytes, 256))));
  bench::DeviceBuffer vecs(2 * kVector * sizeof(float));
  CHECK_CUDA(cudaMemset(vecs.ptr, 0, 2 * kVector * sizeof(float)));
  bench::DeviceBuffer counters(sizeof(unsigned) * (kernels + 1));
  for (const bool after : {false, true}) {
    std::printf("\n%s\n", after ? "=== only the shared-memory part before the wait, the rest of the "
                                   "share streamed after it (a GEMV's constraint)"
                                 : "=== the whole share loaded before the wait");
    for (const Workload& wl : workloads) {
      if (after && wl.bytes[0] == 0) continue;  // nothing to stream: the same as above
      std::printf("\n%s: us a kernel (weight rate, %% of copy)\n%-10s", wl.name, "pre KiB");
      const std::vector<int> pres =
          after ? std::vector<int>{0, 32, 64, 96, 192} : std::vector<int>{0, 32, 96};
      for (int pre : pres) std::printf(" | %22d", pre);
      std::printf("\n");
      for (Handover h : {Handover::kPlain, Handover::kPdl, Handover::kPdlEarly, Handover::kFlag}) {
        std::printf("%-10s", Name(h));
        for (int pre : pres) {
          int64_t bytes = 0;
          const double us = RunUs(h, wl, kernels, ctas, pre, after,
                                  static_cast<const uint4*>(w.ptr), static_cast<float*>(vecs.ptr),
                                  static_cast<unsigned*>(counters.ptr), &bytes);
          const double gbs = bytes / (us * kernels * 1e3);
          std::printf(" | %7.2f (%5.0f, %3.0f%%)", us, gbs, 100.0 * gbs / copy_gbs);
        }
        std::printf("\n");
      }
    }
  }
  return 0;
}
