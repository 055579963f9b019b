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
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/gemm_cuda.h"
#include "kernels/gemm_stream_tc.h"

namespace mqa {
namespace {

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CHECK_OK(x)                                                                          \
  do {                                                                                       \
    absl::Status s_ = (x);                                                                   \
    if (!s_.ok()) {                                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_.ToString().c_str()); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr int kCallsPerGraph = 20;
constexpr int kReplays = 7;
constexpr size_t kRotateBytes = size_t{400} << 20;  // weights touched per graph, at least

__global__ void FillRandom(__half* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = __float2half(scale * ((x & 0xffffff) / 8388608.0f - 1.0f));
  }
}

void Fill(void* p, size_t n, uint32_t seed, float scale) {
  FillRandom<<<1024, 256>>>(static_cast<__half*>(p), n, seed, scale);
  CHECK_CUDA(cudaGetLastError());
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { CHECK_CUDA(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call: fn(i, stream) for i < kCallsPerGraph captured into one graph, replayed.
template <typename F>
double TimeGraphUs(cudaStream_t s, F&& fn) {
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCallsPerGraph; ++i) fn(i, s);
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaGraphLaunch(exec, s));  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int r = 0; r < kReplays; ++r) {
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1000.0 * ms / kCallsPerGraph);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(t);
}

double CopyCeilingTBs(cudaStream_t s) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer src(bytes), dst(bytes);
  Fill(src.ptr, bytes / 2, 1, 1.0f);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    CHECK_CUDA(cudaEventRecord(a, s));
    CHECK_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 2.0 * bytes / (Median(t) * 1e-3) / 1e12;
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
    } else {
      std::fprintf(stderr,
                   "usage: gemm_stream_bench [--model starcoder|santacoder] [--m M] "
                   "[--ctas-per-sm N] [--min-tiles N]\n");
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
  std::printf("tuning: ctas_per_sm %d, min_tiles_per_cta %d (0: defaults)\n",
              args.tuning.ctas_per_sm, args.tuning.min_tiles_per_cta);

  // One pool of weight copies for every shape (the largest needs two 604 MB copies).
  const size_t pool_bytes = size_t{1300} << 20;
  DeviceBuffer pool(pool_bytes);
  Fill(pool.ptr, pool_bytes / 2, 7, 0.05f);
  const int64_t max_m = 64, max_k = 24576, max_n = 49152;
  DeviceBuffer a(max_m * max_k * 2), c(max_m * max_n * 2), bias(max_n * 2);
  Fill(a.ptr, max_m * max_k, 11, 1.0f);
  Fill(c.ptr, max_m * max_n, 13, 1.0f);
  Fill(bias.ptr, max_n, 17, 0.1f);
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
