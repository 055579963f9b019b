// Shared by the forward-kernel GPU tests (cudafwd): device buffers, fp16/bf16 rounding, the
// relative-error norm, NaN poisoning so that every output element must be written, and the
// fixture base that skips without a GPU.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace mqa::testing {

class DeviceMem {
 public:
  explicit DeviceMem(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes == 0 ? 16 : bytes), cudaSuccess);
  }
  ~DeviceMem() { cudaFree(ptr_); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <typename T>
  static std::unique_ptr<DeviceMem> From(const std::vector<T>& v) {
    auto m = std::make_unique<DeviceMem>(v.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(m->ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
    return m;
  }
  void Poison() { EXPECT_EQ(cudaMemset(ptr_, 0xff, bytes_), cudaSuccess); }  // NaN for floats
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> v(bytes_ / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

inline uint16_t ToBits(float x, DType t) {
  return t == DType::kF16 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
}
inline float FromBits(uint16_t b, DType t) {
  return t == DType::kF16 ? HalfBitsToFloat(b) : BFloat16BitsToFloat(b);
}

// Fresh normal(mean, stddev) values, rounded to `t` in place; returns the bits for the device.
inline std::vector<uint16_t> RandomRounded(std::vector<float>& v, size_t n, DType t,
                                           std::mt19937& rng, float stddev = 1.0f,
                                           float mean = 0.0f) {
  std::normal_distribution<float> normal(mean, stddev);
  v.resize(n);
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = ToBits(normal(rng), t);
    v[i] = FromBits(bits[i], t);
  }
  return bits;
}

inline std::vector<float> Widen(const std::vector<uint16_t>& bits, DType t) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = FromBits(bits[i], t);
  return v;
}

// ||got - want|| / ||want||; infinity when `got` holds a NaN (an unwritten, poisoned element).
inline double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// enqueue(stream) (kernel launches, returning their status) captured into a CUDA graph on
// `stream`; the graph launched once and awaited.
template <typename F>
void RunInGraph(cudaStream_t stream, F&& enqueue) {
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status st = enqueue(stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Base of the GPU tests' fixtures: skips without a device; a real stream (the PDL launches are
// not on the legacy one), the device's SM count and a freshly seeded random engine. A derived
// SetUp calls this one first and returns if IsSkipped() or HasFatalFailure().
template <typename Param>
class CudaStreamTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    int device = 0;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::mt19937 rng_{std::random_device{}()};
  cudaStream_t stream_ = nullptr;
  int sms_ = 0;
};

}  // namespace mqa::testing
