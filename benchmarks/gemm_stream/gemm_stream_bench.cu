// Decode-GEMM benchmark: the weight-streaming tensor-core kernel (StreamTcGemmCuda, with and
// without PDL launch) against cuBLASLt (CudaGemm with the skinny kernel off) on the StarCoder and
// SantaCoder projections at m = 8, 16, 32, 64, fp16, each with its model epilogue (QKV: bias;
// attention out and MLP down: bias + residual; MLP up: bias + GELU-tanh; lm_head: none).
//
// Time per call: a CUDA graph of 20 calls over rotating copies of the weight (>= 400 MB in all, so
// that the weights come from HBM, not L2), median of several replays. TB/s counts weight bytes
// only, beside the device-to-device copy ceiling measured in the same run (2 GiB cudaMemcpy,
// read + write bytes). Then one line per model and m: a decode step's GEMM time (layers x the
// four projections + lm_head) for each path.
//
//   gemm_stream_bench [--model starcoder|santacoder] [--m 32] [--ctas-per-sm N] [--min-tiles N]
//                     [--tma] [--tma-boxes 1|2|4] [--tma-hints 0|1]
//                     (the kernel's Hopper form and its knobs: StreamTcTuning::tma, tma_boxes,
//                     tma_hints)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/gemm_cuda.h"
#include "kernels/gemm_stream_tc.h"

namespace mqa {
namespace {

constexpr int kCallsPerGraph = 20;
constexpr int kReplays = 7;
constexpr size_t kRotateBytes = size_t{400} << 20;  // weights touched per graph, at least

using bench::DeviceBuffer;
using bench::Fill;

// Microseconds per call: fn(i, stream) for i < kCallsPerGraph captured into one graph, replayed.
template <typename F>
double TimeGraphUs(cudaStream_t s, F&& fn) {
  return bench::TimeGraphUs(s, kCallsPerGraph, /*warmups=*/1, kReplays, fn);
}

double CopyCeilingTBs(cudaStream_t s) {
  return 2.0 * bench::kCopyCeilingBytes / (bench::CopyCeilingMs(s) * 1e-3) / 1e12;
}

struct Projection {
  const char* name;
  int64_t n, k;
  int epilogue;  // 0 none, 1 bias, 2 bias + GELU-tanh, 3 bias + residual
  int per_step;  // calls per decode step: the layer count, or 1 for lm_head
};

struct Model {
  const char* name;
  std::vector<Projection> projections;
};

std::vector<Model> Models() {
  return {{"starcoder",
           {{"qkv", 6400, 6144, 1, 40},
            {"attn_out", 6144, 6144, 3, 40},
            {"mlp_up", 24576, 6144, 2, 40},
            {"mlp_down", 6144, 24576, 3, 40},
            {"lm_head", 49152, 6144, 0, 1}}},
          {"santacoder",
           {{"qkv", 2304, 2048, 1, 24},
            {"attn_out", 2048, 2048, 3, 24},
            {"mlp_up", 8192, 2048, 2, 24},
            {"mlp_down", 2048, 8192, 3, 24},
            {"lm_head", 49152, 2048, 0, 1}}}};
}

struct Args {
  std::string model;  // empty: both
  int m = 0;          // 0: 8, 16, 32, 64
  StreamTcTuning tuning;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--model" && has_value) {
      a.model = argv[++i];
    } else if (flag == "--m" && has_value) {
      a.m = std::atoi(argv[++i]);
    } else if (flag == "--ctas-per-sm" && has_value) {
      a.tuning.ctas_per_sm = std::atoi(argv[++i]);
    } else if (flag == "--min-tiles" && has_value) {
      a.tuning.min_tiles_per_cta = std::atoi(argv[++i]);
    } else if (flag == "--tma") {
      a.tuning.tma = true;
    } else if (flag == "--tma-boxes" && has_value) {
      a.tuning.tma_boxes = std::atoi(argv[++i]);
    } else if (flag == "--tma-hints" && has_value) {
      a.tuning.tma_hints = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: gemm_stream_bench [--model starcoder|santacoder] [--m M] "
                   "[--ctas-per-sm N] [--min-tiles N] [--tma] [--tma-boxes N] "
                   "[--tma-hints 0|1]\n");
      std::exit(2);
    }
  }
  return a;
}

int Main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double ceiling = CopyCeilingTBs(stream);
  std::printf("%s, %d SMs; device-to-device copy ceiling %.2f TB/s (read + write)\n", prop.name,
              sms, ceiling);
  std::printf(
      "tuning: ctas_per_sm %d, min_tiles_per_cta %d (0: defaults), form %s, tma_boxes %d, "
      "tma_hints %d (0 / -1: defaults)\n",
      args.tuning.ctas_per_sm, args.tuning.min_tiles_per_cta,
      args.tuning.tma ? "TMA + wgmma" : "cp.async + mma.sync", args.tuning.tma_boxes,
      args.tuning.tma_hints);

  // One pool of weight copies for every shape (the largest needs two 604 MB copies).
  const size_t pool_bytes = size_t{1300} << 20;
  DeviceBuffer pool(pool_bytes);
  Fill<__half>(pool.ptr, pool_bytes / 2, 7, 0.05f);
  const int64_t max_m = 64, max_k = 24576, max_n = 49152;
  DeviceBuffer a(max_m * max_k * 2), c(max_m * max_n * 2), bias(max_n * 2);
  Fill<__half>(a.ptr, max_m * max_k, 11, 1.0f);
  Fill<__half>(c.ptr, max_m * max_n, 13, 1.0f);
  Fill<__half>(bias.ptr, max_n, 17, 0.1f);
  const size_t ws_bytes = StreamTcGemmWorkspaceBytes(sms);
  DeviceBuffer ws(ws_bytes);
  CHECK_CUDA(cudaMemset(ws.ptr, 0, ws_bytes));
  CudaGemm::Options lt_options;
  lt_options.skinny = false;
  auto lt = CudaGemm::Create(lt_options);
  CHECK_OK(lt.status());
  CHECK_CUDA(cudaDeviceSynchronize());

  const std::vector<int> ms = args.m > 0 ? std::vector<int>{args.m} : std::vector<int>{8, 16, 32, 64};
  struct Summary {
    std::string model;
    int m;
    double tc_pdl_us = 0, tc_us = 0, lt_us = 0, bytes = 0;
  };
  std::vector<Summary> summaries;
  for (const Model& model : Models()) {
    if (!args.model.empty() && args.model != model.name) continue;
    std::printf("\n== %s, fp16; us per call (TB/s of weight bytes)\n", model.name);
    std::printf("%-9s %3s %6s %6s | %16s | %16s | %16s | %s\n", "gemm", "m", "n", "k",
                "stream-tc + PDL", "stream-tc", "cuBLASLt", "speed-up (PDL)");
    for (int m : ms) {
      Summary sum{model.name, m};
      for (const Projection& pj : model.projections) {
        const size_t bytes = static_cast<size_t>(pj.n * pj.k * 2);
        const int copies = static_cast<int>(std::min<size_t>(
            pool_bytes / bytes, std::max<size_t>(2, (kRotateBytes + bytes - 1) / bytes)));
        auto params = [&](int i) {
          GemmParams p;
          p.a = a.ptr;
          p.b = static_cast<char*>(pool.ptr) + static_cast<size_t>(i % copies) * bytes;
          p.c = c.ptr;
          p.lda = pj.k;
          p.ldb = pj.k;
          p.ldc = pj.n;
          p.m = m;
          p.n = pj.n;
          p.k = pj.k;
          p.dtype = DType::kF16;
          return p;
        };
        GemmEpilogue e;
        e.bias = pj.epilogue >= 1 ? bias.ptr : nullptr;
        e.activation = pj.epilogue == 2 ? Activation::kGeluTanh : Activation::kIdentity;
        e.accumulate = pj.epilogue == 3;
        auto tc = [&](bool pdl) {
          return [&, pdl](int i, cudaStream_t s) {
            CHECK_OK(StreamTcGemmCuda(params(i), e, s, pdl, ws.ptr, ws_bytes, args.tuning));
          };
        };
        // Eager calls first: cuBLASLt makes its plan, the kernels their attributes.
        CHECK_OK((*lt)->Run(params(0), e, stream));
        tc(false)(0, stream);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const double us_pdl = TimeGraphUs(stream, tc(true));
        const double us_tc = TimeGraphUs(stream, tc(false));
        const double us_lt = TimeGraphUs(stream, [&](int i, cudaStream_t s) {
          CHECK_OK((*lt)->Run(params(i), e, s));
        });
        auto tbs = [&](double us) { return bytes / (us * 1e-6) / 1e12; };
        std::printf("%-9s %3d %6lld %6lld | %7.1f (%5.2f) | %7.1f (%5.2f) | %7.1f (%5.2f) | %.2fx\n",
                    pj.name, m, static_cast<long long>(pj.n), static_cast<long long>(pj.k),
                    us_pdl, tbs(us_pdl), us_tc, tbs(us_tc), us_lt, tbs(us_lt), us_lt / us_pdl);
        sum.tc_pdl_us += pj.per_step * us_pdl;
        sum.tc_us += pj.per_step * us_tc;
        sum.lt_us += pj.per_step * us_lt;
        sum.bytes += static_cast<double>(pj.per_step) * bytes;
      }
      summaries.push_back(sum);
    }
  }
  std::printf("\n== decode step GEMMs (layers x 4 projections + lm_head); floor = weight bytes at "
              "the copy ceiling\n");
  for (const Summary& s : summaries) {
    const double floor_ms = s.bytes / (ceiling * 1e12) * 1e3;
    std::printf("%-10s m %2d: stream-tc + PDL %.3f ms, stream-tc %.3f ms, cuBLASLt %.3f ms "
                "(%.2fx); %.1f GB, floor %.3f ms\n",
                s.model.c_str(), s.m, s.tc_pdl_us / 1e3, s.tc_us / 1e3, s.lt_us / 1e3,
                s.lt_us / s.tc_pdl_us, s.bytes / 1e9, floor_ms);
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace mqa

int main(int argc, char** argv) { return mqa::Main(argc, argv); }
