// What CUDA device, if any, this process can use. Tests use it to skip cleanly without a GPU.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace mqa {

struct DeviceInfo {
  std::string name;
  int multiprocessors = 0;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory = 0;
  size_t free_memory = 0;
};

// Number of visible CUDA devices; 0 in a CPU-only build or when the driver finds none.
int CudaDeviceCount();

// Properties of device `ordinal`; an error in a CPU-only build or for a bad ordinal.
absl::StatusOr<DeviceInfo> GetDeviceInfo(int ordinal);

// Multiprocessors of the calling thread's current device, cached per thread (queried again only
// when the thread's device changes): cheap enough for every kernel launch. An error in a
// CPU-only build.
absl::StatusOr<int> CurrentDeviceSms();

// Makes `ordinal` the calling thread's current device (cudaSetDevice); an error in a CPU-only
// build or for a bad ordinal.
absl::Status SetCudaDevice(int ordinal);

// A trivial kernel round-trip (fills a device buffer with `n` floats i*scale and copies back):
// proves that the binary, its bundled libraries and the driver work together.
absl::StatusOr<double> CudaSmokeSum(int n, float scale);

}  // namespace mqa
