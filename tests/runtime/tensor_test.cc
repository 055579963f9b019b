#include "runtime/tensor.h"

#include <gtest/gtest.h>

namespace mqa {
namespace {

TEST(Tensor, RowsShareTheBuffer) {
  Tensor t = Tensor::Cpu({4, 3});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor r = t.Rows(1, 3);
  EXPECT_EQ(r.dim(0), 2);
  EXPECT_EQ(r.data<float>()[0], 3.0f);
  r.data<float>()[0] = -1;
  EXPECT_EQ(t.data<float>()[3], -1.0f);
  EXPECT_EQ(t.Reshape({12}).dim(0), 12);
}

TEST(Tensor, ConvertFloatsBetweenDtypes) {
  const float src[3] = {1.5f, -2.25f, 0.1f};
  uint16_t half[3];
  float back[3];
  ConvertFloats(src, DType::kF32, half, DType::kF16, 3);
  ConvertFloats(half, DType::kF16, back, DType::kF32, 3);
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], -2.25f);
  EXPECT_NEAR(back[2], 0.1f, 1e-4);
  ConvertFloats(src, DType::kF32, half, DType::kBF16, 3);
  ConvertFloats(half, DType::kBF16, back, DType::kF32, 3);
  EXPECT_EQ(back[1], -2.25f);
}

#ifndef MQA_WITH_CUDA
TEST(Tensor, CudaAllocationFailsClearlyInCpuBuild) {
  auto t = Tensor::Empty({2}, DType::kF32, Device::kCuda);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
}
#endif

}  // namespace
}  // namespace mqa
