#include "kernels/device_info.h"

#ifndef MQA_WITH_CUDA
namespace mqa {

int CudaDeviceCount() { return 0; }

absl::StatusOr<DeviceInfo> GetDeviceInfo(int) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}

absl::StatusOr<int> CurrentDeviceSms() {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}

absl::Status SetCudaDevice(int) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}

absl::StatusOr<double> CudaSmokeSum(int, float) {
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
}

}  // namespace mqa
#endif
