// The GPU bundle's first proof: a kernel runs and its result comes back. Skips without a GPU.
#include <gtest/gtest.h>

#include "kernels/device_info.h"

namespace mqa {
namespace {

TEST(CudaSmoke, RampSumMatchesClosedForm) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto info = GetDeviceInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  std::printf("device: %s, %d SMs, sm_%d%d, %.1f GiB\n", info->name.c_str(),
              info->multiprocessors, info->compute_major, info->compute_minor,
              info->total_memory / 1073741824.0);
  const int n = 1 << 20;
  auto sum = CudaSmokeSum(n, 0.5f);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_DOUBLE_EQ(*sum, 0.5 * (static_cast<double>(n) * (n - 1) / 2));
}

// The cached SM count the launchers size their grids by equals the device's, on every call.
TEST(CudaSmoke, CurrentDeviceSmsMatchesTheDevice) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(SetCudaDevice(0).ok());
  auto info = GetDeviceInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  for (int i = 0; i < 2; ++i) {
    const absl::StatusOr<int> sms = CurrentDeviceSms();
    ASSERT_TRUE(sms.ok()) << sms.status();
    EXPECT_EQ(*sms, info->multiprocessors);
  }
}

}  // namespace
}  // namespace mqa
