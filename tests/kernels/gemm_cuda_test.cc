// CudaGemm (cuBLASLt and the skinny decode kernel) against GemmCpu + BiasActivationCpu on fresh
// random fp16 / bf16 inputs: decode (m 1..8) and prefill shapes, odd sizes that fall back to
// cuBLASLt, every epilogue (bias, GELU-tanh, residual accumulate), padded strides; the output is
// poisoned first (except with accumulate, where it holds the residual). Skips without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "kernels/gemm_cuda.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;
using testing::RandomRounded;
using testing::RelError;
using testing::Widen;

struct Shape {
  int64_t m, n, k, pad;  // pad: extra elements at the end of each row of A and B
};

class GemmCudaTest : public ::testing::TestWithParam<std::tuple<DType, int>> {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};
};

TEST_P(GemmCudaTest, MatchesCpuWithEveryEpilogue) {
  const auto [t, rows] = GetParam();  // rows: the skinny kernel's rows per warp; 0: cuBLASLt only
  const bool skinny = rows > 0;
  CudaGemm::Options options;
  options.skinny = skinny;
  options.skinny_rows_per_warp = rows;
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const Shape shapes[] = {{1, 6400, 6144, 0}, {3, 2304, 2048, 8}, {8, 4096, 1024, 0},
                          {5, 1001, 264, 0},  {64, 768, 512, 16}, {300, 520, 256, 0},
                          {2, 77, 40, 0},     {7, 130, 13, 3}};
  for (const Shape& s : shapes) {
    for (int epi = 0; epi < 4; ++epi) {  // none, bias, bias + GELU-tanh, bias + accumulate
      std::vector<float> a, b, bias, c0;
      const int64_t lda = s.k + s.pad, ldb = s.k + s.pad;
      auto ab = RandomRounded(a, s.m * lda, t, rng_);
      auto bb = RandomRounded(b, s.n * ldb, t, rng_, 0.05f);
      auto biasb = RandomRounded(bias, s.n, t, rng_);
      auto cb = RandomRounded(c0, s.m * s.n, t, rng_);
      auto da = DeviceMem::From(ab), db = DeviceMem::From(bb), dbias = DeviceMem::From(biasb);
      auto dc = DeviceMem::From(cb);
      if (epi != 3) dc->Poison();
      GemmParams p;
      p.a = da->get();
      p.b = db->get();
      p.c = dc->get();
      p.lda = lda;
      p.ldb = ldb;
      p.ldc = s.n;
      p.m = s.m;
      p.n = s.n;
      p.k = s.k;
      p.dtype = t;
      GemmEpilogue e;
      e.bias = epi >= 1 ? dbias->get() : nullptr;
      e.activation = epi == 2 ? Activation::kGeluTanh : Activation::kIdentity;
      e.accumulate = epi == 3;
      const absl::Status st = (*gemm)->Run(p, e, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

      std::vector<float> prod(s.m * s.n), want(s.m * s.n);
      GemmParams c = p;
      c.a = a.data();
      c.b = b.data();
      c.c = prod.data();
      c.dtype = DType::kF32;
      ASSERT_TRUE(GemmCpu(c).ok());
      BiasActivationParams post;
      post.input = prod.data();
      post.bias = e.bias ? bias.data() : nullptr;
      post.residual = e.accumulate ? c0.data() : nullptr;
      post.output = want.data();
      post.rows = s.m;
      post.cols = s.n;
      post.activation = e.activation;
      ASSERT_TRUE(BiasActivationCpu(post).ok());
      const auto got = Widen(dc->Download<uint16_t>(), t);
      EXPECT_LT(RelError(got, want), 1e-2)
          << "m " << s.m << " n " << s.n << " k " << s.k << " pad " << s.pad << " epilogue "
          << epi << " skinny " << skinny;
    }
  }
}

TEST_P(GemmCudaTest, SkinnyKernelRefusesWhatItCannotDo) {
  const auto [t, rows] = GetParam();
  if (rows != 2) GTEST_SKIP() << "once is enough";
  GemmParams p;
  p.a = p.b = p.c = reinterpret_cast<void*>(256);
  p.m = 9;
  p.n = p.k = p.lda = p.ldb = p.ldc = 64;
  p.dtype = t;
  EXPECT_TRUE(absl::IsUnimplemented(SkinnyGemmCuda(p, {}, nullptr)));
  p.m = 2;
  p.k = p.lda = p.ldb = 60;  // not a multiple of 8
  EXPECT_TRUE(absl::IsUnimplemented(SkinnyGemmCuda(p, {}, nullptr)));
}

INSTANTIATE_TEST_SUITE_P(All, GemmCudaTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values(0, 1, 2, 4)),
                         [](const auto& info) {
                           const int rows = std::get<1>(info.param);
                           return std::string(DTypeName(std::get<0>(info.param))) +
                                  (rows ? "_skinny" + std::to_string(rows) : "_cublaslt");
                         });

}  // namespace
}  // namespace mqa
