// Shared by the CUDA kernel benchmarks (attention, gemm, gemm_stream, small_kernels): the
// exit-on-error check macros, a hash-based random fill, RAII device buffers / events / streams,
// and the CUDA-graph and copy-ceiling timing that each bench prints its figures against.
// Benchmarks are tools, not library code: a failing CUDA call prints where and exits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "runtime/dtype.h"

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

namespace mqa::bench {

// Uniform [-1, 1) from a hash of the index and the seed (multiples of 2^-23, exact in float).
__device__ __forceinline__ float HashUniform(size_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return (x & 0xffffff) / 8388608.0f - 1.0f;
}

// p[i] = scale * HashUniform(i, seed) + offset, for T = __half, __nv_bfloat16 or float.
template <typename T>
__global__ void FillRandom(T* p, size_t n, uint32_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float f = scale * HashUniform(i, seed) + offset;
    if constexpr (std::is_same_v<T, __half>) {
      p[i] = __float2half(f);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      p[i] = __float2bfloat16(f);
    } else {
      static_assert(std::is_same_v<T, float>);
      p[i] = f;
    }
  }
}

// FillRandom on the legacy stream over `n` elements of type T at `p`, offset 0.
template <typename T>
void Fill(void* p, size_t n, uint32_t seed, float scale = 1.0f) {
  FillRandom<T><<<1024, 256>>>(static_cast<T*>(p), n, seed, scale, 0.0f);
  CHECK_CUDA(cudaGetLastError());
}

// The same for a 16-bit `t`: fp16 for DType::kF16, bf16 otherwise.
inline void Fill(DType t, void* p, size_t n, uint32_t seed, float scale = 1.0f) {
  if (t == DType::kF16) {
    Fill<__half>(p, n, seed, scale);
  } else {
    Fill<__nv_bfloat16>(p, n, seed, scale);
  }
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { CHECK_CUDA(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A non-blocking stream, destroyed with the object.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// A pair of events around the timed work; Ms() waits for `b` and returns b - a.
struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  float Ms() const {
    float ms = 0;
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// fn(i, s) for i < calls captured into a new graph on `s` (the caller destroys it).
template <typename F>
cudaGraph_t CaptureGraph(cudaStream_t s, int calls, F&& fn) {
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) fn(i, s);
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  return graph;
}

// Microseconds per call of a graph of `calls` calls: instantiated, launched `warmups` times, then
// the median over `reps` timed replays on `s`, divided by `calls`.
inline double ReplayGraphUs(cudaStream_t s, cudaGraph_t graph, int calls, int warmups, int reps) {
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < warmups; ++i) CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  Events ev;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(ev.a, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(ev.b, s));
    t.push_back(1000.0 * ev.Ms() / calls);
  }
  cudaGraphExecDestroy(exec);
  return Median(t);
}

// CaptureGraph then ReplayGraphUs; fn(i, s) returns nothing (it exits on failure).
template <typename F>
double TimeGraphUs(cudaStream_t s, int calls, int warmups, int reps, F&& fn) {
  cudaGraph_t graph = CaptureGraph(s, calls, fn);
  const double us = ReplayGraphUs(s, graph, calls, warmups, reps);
  cudaGraphDestroy(graph);
  return us;
}

// The copy ceiling's transfer: a device-to-device cudaMemcpy of this many bytes.
inline constexpr size_t kCopyCeilingBytes = size_t{2} << 30;

// Median milliseconds of a kCopyCeilingBytes device-to-device copy on `s` (five timed copies
// after one warm-up); the bandwidth counts read + write: 2 * kCopyCeilingBytes / time.
inline double CopyCeilingMs(cudaStream_t s) {
  DeviceBuffer src(kCopyCeilingBytes), dst(kCopyCeilingBytes);
  Fill<__half>(src.ptr, kCopyCeilingBytes / 2, 1);
  CHECK_CUDA(cudaDeviceSynchronize());
  Events ev;
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    CHECK_CUDA(cudaEventRecord(ev.a, s));
    CHECK_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, kCopyCeilingBytes, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaEventRecord(ev.b, s));
    const float ms = ev.Ms();
    if (r > 0) t.push_back(ms);  // the first is a warm-up
  }
  return Median(t);
}

}  // namespace mqa::bench
