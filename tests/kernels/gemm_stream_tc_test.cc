// StreamTcGemmCuda (the weight-streaming tensor-core decode GEMM) against GemmCpu +
// BiasActivationCpu on fresh random fp16 / bf16 inputs: m = 1 .. 64 (every padding of m), n that
// is and is not a multiple of the 128-row block, k from one partial tile to thousands of columns,
// padded strides; every epilogue (none, bias, bias + GELU-tanh, bias + residual accumulate); the
// grid variants (default, the deepest split over k, no workspace: one row block per CTA), each
// in the cp.async form and the Hopper TMA + wgmma form (StreamTcTuning::tma). Each
// call runs twice on one workspace (results bit-equal, the counters back at zero), alternately
// with PDL; C is poisoned first and its row padding must stay untouched. One run is captured
// into a CUDA graph. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/gemm_stream_tc.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;
using testing::RandomRounded;
using testing::RelError;
using testing::Widen;

struct Shape {
  int64_t m, n, k, pad;  // pad: extra elements at the end of each row of A, B and C
};

// Inputs of one shape on the host (rounded to the dtype) and the device, and the product A B^T.
struct Problem {
  Shape s;
  DType t;
  std::vector<float> a, b, bias, c0, prod;
  std::unique_ptr<DeviceMem> da, db, dbias;
  std::vector<uint16_t> c0_bits;  // [m, ldc]: the residual, NaN in the row padding

  int64_t lda() const { return s.k + s.pad; }
  int64_t ldc() const { return s.n + s.pad; }

  Problem(const Shape& shape, DType dtype, std::mt19937& rng) : s(shape), t(dtype) {
    auto ab = RandomRounded(a, s.m * lda(), t, rng);
    auto bb = RandomRounded(b, s.n * lda(), t, rng, 0.05f);
    auto biasb = RandomRounded(bias, s.n, t, rng);
    std::vector<float> c_full;
    c0_bits = RandomRounded(c_full, s.m * ldc(), t, rng);
    c0.resize(s.m * s.n);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < ldc(); ++j) {
        if (j < s.n) {
          c0[i * s.n + j] = c_full[i * ldc() + j];
        } else {
          c0_bits[i * ldc() + j] = 0xffff;
        }
      }
    }
    da = DeviceMem::From(ab);
    db = DeviceMem::From(bb);
    dbias = DeviceMem::From(biasb);
    prod.resize(s.m * s.n);
    GemmParams c;
    c.a = a.data();
    c.b = b.data();
    c.c = prod.data();
    c.lda = lda();
    c.ldb = lda();
    c.ldc = s.n;
    c.m = s.m;
    c.n = s.n;
    c.k = s.k;
    c.dtype = DType::kF32;
    EXPECT_TRUE(GemmCpu(c).ok());
  }

  GemmParams Params(void* c) const {
    GemmParams p;
    p.a = da->get();
    p.b = db->get();
    p.c = c;
    p.lda = lda();
    p.ldb = lda();
    p.ldc = ldc();
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.dtype = t;
    return p;
  }

  // epilogue: 0 none, 1 bias, 2 bias + GELU-tanh, 3 bias + accumulate.
  GemmEpilogue Epilogue(int epilogue) const {
    GemmEpilogue e;
    e.bias = epilogue >= 1 ? dbias->get() : nullptr;
    e.activation = epilogue == 2 ? Activation::kGeluTanh : Activation::kIdentity;
    e.accumulate = epilogue == 3;
    return e;
  }

  std::vector<float> Want(int epilogue) const {
    std::vector<float> want(s.m * s.n);
    BiasActivationParams post;
    post.input = prod.data();
    post.bias = epilogue >= 1 ? bias.data() : nullptr;
    post.residual = epilogue == 3 ? c0.data() : nullptr;
    post.output = want.data();
    post.rows = s.m;
    post.cols = s.n;
    post.activation = epilogue == 2 ? Activation::kGeluTanh : Activation::kIdentity;
    EXPECT_TRUE(BiasActivationCpu(post).ok());
    return want;
  }

  // A fresh C on the device: the residual for accumulate, else poison (NaN); the row padding is
  // poison either way.
  std::unique_ptr<DeviceMem> FreshC(int epilogue) const {
    auto dc = DeviceMem::From(c0_bits);
    if (epilogue != 3) dc->Poison();
    return dc;
  }

  // The [m, n] part of a downloaded C; fails the test if the row padding was written.
  std::vector<float> Dense(const std::vector<uint16_t>& bits) const {
    std::vector<uint16_t> dense(s.m * s.n);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < ldc(); ++j) {
        if (j < s.n) {
          dense[i * s.n + j] = bits[i * ldc() + j];
        } else {
          EXPECT_EQ(bits[i * ldc() + j], 0xffff) << "padding written at row " << i;
        }
      }
    }
    return Widen(dense, t);
  }
};

class StreamTcGemmTest : public testing::CudaStreamTest<DType> {
 protected:
  void SetUp() override {
    CudaStreamTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    workspace_bytes_ = StreamTcGemmWorkspaceBytes(sms_);
    workspace_ = std::make_unique<DeviceMem>(workspace_bytes_);
    ASSERT_EQ(cudaMemset(workspace_->get(), 0, workspace_bytes_), cudaSuccess);
  }
  void ExpectCountersZero() {
    std::vector<int> counters(StreamTcCounterBytes() / sizeof(int));
    ASSERT_EQ(cudaMemcpy(counters.data(), workspace_->get(), StreamTcCounterBytes(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < counters.size(); ++i) ASSERT_EQ(counters[i], 0) << "counter " << i;
  }

  void GraphCaptureCase(bool tma);

  std::unique_ptr<DeviceMem> workspace_;
  size_t workspace_bytes_ = 0;
};

TEST_P(StreamTcGemmTest, MatchesCpuWithEveryEpilogueAndGrid) {
  const DType t = GetParam();
  const Shape shapes[] = {
      {1, 256, 64, 0},     {9, 1000, 264, 8},  {16, 2304, 2048, 0}, {31, 130, 4104, 0},
      {32, 6400, 6144, 0}, {33, 777, 520, 16}, {64, 4096, 1024, 0}, {64, 300, 8, 8},
      {17, 1, 2056, 0},    {48, 2048, 8192, 0}};
  struct Grid {
    const char* name;
    StreamTcTuning tuning;
    bool workspace;
  };
  const Grid grids[] = {{"default", {}, true},
                        {"deepest split", {.ctas_per_sm = 1, .min_tiles_per_cta = 1}, true},
                        {"no workspace", {}, false},
                        {"tma", {.tma = true}, true},
                        {"tma deepest split, 2 boxes, no hints",
                         {.min_tiles_per_cta = 1, .tma = true, .tma_boxes = 2, .tma_hints = 0},
                         true},
                        {"tma 4 boxes", {.tma = true, .tma_boxes = 4, .tma_hints = 1}, true},
                        {"tma no workspace", {.tma = true}, false}};
  for (const Shape& s : shapes) {
    const Problem pr(s, t, rng_);
    for (const Grid& grid : grids) {
      for (int epi = 0; epi < 4; ++epi) {
        const std::vector<float> want = pr.Want(epi);
        const GemmEpilogue e = pr.Epilogue(epi);
        std::vector<uint16_t> first;
        for (int run = 0; run < 2; ++run) {
          auto dc = pr.FreshC(epi);
          const bool pdl = (epi + run) % 2 == 1;  // no previous kernel: a no-op wait
          const absl::Status st = StreamTcGemmCuda(
              pr.Params(dc->get()), e, stream_, pdl, grid.workspace ? workspace_->get() : nullptr,
              grid.workspace ? workspace_bytes_ : 0, grid.tuning);
          ASSERT_TRUE(st.ok()) << st;
          ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
          const auto bits = dc->Download<uint16_t>();
          EXPECT_LT(RelError(pr.Dense(bits), want), 1e-2)
              << "m " << s.m << " n " << s.n << " k " << s.k << " pad " << s.pad << " epilogue "
              << epi << " grid " << grid.name << " run " << run;
          if (run == 0) {
            first = bits;
          } else {
            EXPECT_TRUE(bits == first) << "second run differs: m " << s.m << " n " << s.n
                                       << " k " << s.k << " grid " << grid.name;
          }
          ExpectCountersZero();
        }
      }
    }
  }
}

// Captured into a graph (with PDL, after another kernel of the same GEMM) and replayed twice.
TEST_P(StreamTcGemmTest, GraphCaptureMatchesCpu) {
  for (const bool tma : {false, true}) GraphCaptureCase(tma);
}

void StreamTcGemmTest::GraphCaptureCase(bool tma) {
  SCOPED_TRACE(tma ? "tma form" : "cp.async form");
  const StreamTcTuning tuning{.tma = tma};
  const DType t = GetParam();
  const Problem pr({32, 2304, 2048, 0}, t, rng_);
  const int epi = 1;
  auto warm = pr.FreshC(epi);
  auto dc = pr.FreshC(epi);
  const GemmEpilogue e = pr.Epilogue(epi);
  cudaStream_t capture = nullptr;
  ASSERT_EQ(cudaStreamCreate(&capture), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status s1 = StreamTcGemmCuda(pr.Params(warm->get()), e, capture, false,
                                           workspace_->get(), workspace_bytes_, tuning);
  const absl::Status s2 = StreamTcGemmCuda(pr.Params(dc->get()), e, capture, true,
                                           workspace_->get(), workspace_bytes_, tuning);
  ASSERT_EQ(cudaStreamEndCapture(capture, &graph), cudaSuccess);
  ASSERT_TRUE(s1.ok()) << s1;
  ASSERT_TRUE(s2.ok()) << s2;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, capture), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(capture), cudaSuccess);
    const std::vector<float> want = pr.Want(epi);
    EXPECT_LT(RelError(pr.Dense(warm->Download<uint16_t>()), want), 1e-2) << "replay " << replay;
    EXPECT_LT(RelError(pr.Dense(dc->Download<uint16_t>()), want), 1e-2) << "replay " << replay;
    ExpectCountersZero();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(capture);
}

// The TMA form as a programmatic dependent of a GEMM that writes its input: the second GEMM's
// producer copies its weights before the wait and its activations (the first GEMM's output, poison
// until then) after it. Eager launches on one stream, the first GEMM's output checked too.
TEST_P(StreamTcGemmTest, TmaFormReadsItsInputAfterThePdlWait) {
  const DType t = GetParam();
  const Problem first({32, 512, 2048, 0}, t, rng_);
  std::vector<float> w2;
  auto w2_bits = RandomRounded(w2, 1000 * 512, t, rng_, 0.05f);
  auto dw2 = DeviceMem::From(w2_bits);
  DeviceMem x(32 * 512 * 2), y(32 * 1000 * 2);
  x.Poison();
  y.Poison();
  const StreamTcTuning tuning{.tma = true};
  // C [32, 1000] = A [32, 512] B [1000, 512]^T, dense.
  auto second = [](const void* a, const void* b, void* c, DType dtype) {
    GemmParams g;
    g.a = a;
    g.b = b;
    g.c = c;
    g.lda = g.ldb = g.k = 512;
    g.ldc = g.n = 1000;
    g.m = 32;
    g.dtype = dtype;
    return g;
  };
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(cudaMemsetAsync(x.get(), 0xff, 32 * 512 * 2, stream_), cudaSuccess);
    ASSERT_TRUE(StreamTcGemmCuda(first.Params(x.get()), first.Epilogue(1), stream_, run == 1,
                                 workspace_->get(), workspace_bytes_, tuning)
                    .ok());
    const absl::Status st =
        StreamTcGemmCuda(second(x.get(), dw2->get(), y.get(), t), GemmEpilogue{}, stream_, true,
                         workspace_->get(), workspace_bytes_, tuning);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<float> xs = Widen(x.Download<uint16_t>(), t);
    EXPECT_LT(RelError(xs, first.Want(1)), 1e-2) << "run " << run;
    std::vector<float> want(32 * 1000);
    ASSERT_TRUE(GemmCpu(second(xs.data(), w2.data(), want.data(), DType::kF32)).ok());
    EXPECT_LT(RelError(Widen(y.Download<uint16_t>(), t), want), 1e-2) << "run " << run;
    ExpectCountersZero();
  }
}

TEST_P(StreamTcGemmTest, RefusesWhatItDoesNotFuse) {
  const DType t = GetParam();
  const Problem pr({16, 256, 128, 0}, t, rng_);
  auto dc = pr.FreshC(0);
  auto refused = [&](GemmParams p, GemmEpilogue e) {
    EXPECT_FALSE(StreamTcGemmSupported(p, e));
    const absl::Status st = StreamTcGemmCuda(p, e, stream_, false, workspace_->get(),
                                             workspace_bytes_);
    EXPECT_TRUE(absl::IsUnimplemented(st)) << st;
  };
  const GemmParams p = pr.Params(dc->get());
  EXPECT_TRUE(StreamTcGemmSupported(p, GemmEpilogue{}));
  GemmEpilogue e;
  e.activation = Activation::kGeluErf;
  refused(p, e);
  e = GemmEpilogue{};
  e.ln_weight = pr.dbias->get();
  e.ln_bias = pr.dbias->get();
  refused(p, e);
  e = GemmEpilogue{};
  e.key_cache = dc->get();
  refused(p, e);
  GemmParams q = p;
  q.m = 65;
  refused(q, GemmEpilogue{});
  q = p;
  q.k = 124;  // not a multiple of 8
  refused(q, GemmEpilogue{});
  q = p;
  q.a = static_cast<const char*>(p.a) + 2;  // not 16-byte aligned
  q.k = 120;
  refused(q, GemmEpilogue{});
  q = p;
  q.dtype = DType::kF32;
  EXPECT_TRUE(absl::IsInvalidArgument(
      StreamTcGemmCuda(q, GemmEpilogue{}, stream_, false, workspace_->get(), workspace_bytes_)));
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(All, StreamTcGemmTest, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) {
                           return info.param == DType::kF16 ? std::string("f16")
                                                            : std::string("bf16");
                         });

}  // namespace
}  // namespace mqa
