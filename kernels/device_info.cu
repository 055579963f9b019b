#include <vector>

#include "kernels/device_info.h"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

__global__ void FillRamp(float* out, int n, float scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(i) * scale;
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

absl::StatusOr<DeviceInfo> GetDeviceInfo(int ordinal) {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.name = prop.name;
  info.multiprocessors = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&info.free_memory, &info.total_memory));
  return info;
}

absl::StatusOr<int> CurrentDeviceSms() {
  static thread_local int cached_device = -1;
  static thread_local int cached_sms = 0;
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device != cached_device) {
    int sms = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
    cached_sms = sms;
  }
  return cached_sms;
}

absl::Status SetCudaDevice(int ordinal) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaSmokeSum(int n, float scale) {
  float* d = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d, sizeof(float) * n));
  FillRamp<<<(n + 255) / 256, 256>>>(d, n, scale);
  cudaError_t launch = cudaGetLastError();
  std::vector<float> h(n);
  cudaError_t copy = cudaMemcpy(h.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost);
  cudaFree(d);
  CUDA_RETURN_IF_ERROR(launch);
  CUDA_RETURN_IF_ERROR(copy);
  double sum = 0;
  for (float v : h) sum += v;
  return sum;
}

}  // namespace mqa
