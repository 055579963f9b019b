// The CUDA layer norm, bias + activation, embedding, block copy and logits conversion against
// their CPU references on fresh random fp16 / bf16 inputs (odd and vectorisable widths), outputs
// poisoned with NaN first. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "kernels/activation_cuda.h"
#include "kernels/block_copy.h"
#include "kernels/embedding_cuda.h"
#include "kernels/layer_norm_cuda.h"
#include "kernels/sampling_cuda.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;
using testing::RandomRounded;
using testing::RelError;
using testing::Widen;

class ForwardKernels : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{std::random_device{}()};
};

TEST_P(ForwardKernels, LayerNormMatchesCpu) {
  const DType t = GetParam();
  for (auto [rows, cols] : {std::pair{1, 6144}, {37, 2048}, {5, 1000}, {300, 264}}) {
    std::vector<float> x, w, b;
    auto xb = RandomRounded(x, size_t(rows) * cols, t, rng_, 3.0f, 0.5f);
    auto wb = RandomRounded(w, cols, t, rng_, 0.5f, 1.0f);
    auto bb = RandomRounded(b, cols, t, rng_, 0.5f);
    auto dx = DeviceMem::From(xb), dw = DeviceMem::From(wb), db = DeviceMem::From(bb);
    for (bool in_place : {false, true}) {
      DeviceMem out(xb.size() * 2);
      out.Poison();
      auto dxi = DeviceMem::From(xb);
      LayerNormParams p;
      p.input = dxi->get();
      p.output = in_place ? dxi->get() : out.get();
      p.weight = dw->get();
      p.bias = db->get();
      p.rows = rows;
      p.cols = cols;
      p.dtype = t;
      // In place also as a PDL launch right after the upload (a real stream, then synchronised).
      cudaStream_t stream = nullptr;
      if (in_place) ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
      ASSERT_TRUE(LayerNormCuda(p, stream, /*pdl=*/in_place).ok());
      if (stream) {
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        cudaStreamDestroy(stream);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> want(x.size());
      LayerNormParams c = p;
      c.input = x.data();
      c.output = want.data();
      c.weight = w.data();
      c.bias = b.data();
      c.dtype = DType::kF32;
      ASSERT_TRUE(LayerNormCpu(c).ok());
      const auto got = Widen((in_place ? *dxi : out).Download<uint16_t>(), t);
      EXPECT_LT(RelError(got, want), 1e-2) << rows << "x" << cols << " in place " << in_place;
    }
  }
}

// LayerNormCudaKernel::kRegisters: rows of 1, 8 and 33 tokens; the model widths, a width it
// covers that is no power of two (1600), one it leaves to kThreePass (1001: not a multiple of
// 16 bytes) and one too wide for it (16392); rows with a large mean (no cancellation in the
// variance). Out of place, in place as a PDL launch, and inside a CUDA graph (two launches in a
// row, the second in place on the first's output), the graph launched twice.
TEST_P(ForwardKernels, LayerNormRegistersMatchesCpu) {
  const DType t = GetParam();
  auto cpu = [](const LayerNormParams& p, const float* x, const std::vector<float>& w,
                const std::vector<float>& b) {
    std::vector<float> y(size_t(p.rows) * p.cols);
    LayerNormParams c = p;
    c.input = x;
    c.output = y.data();
    c.weight = w.data();
    c.bias = b.data();
    c.dtype = DType::kF32;
    EXPECT_TRUE(LayerNormCpu(c).ok());
    return y;
  };
  for (int cols : {2048, 6144, 1600, 1001, 16392}) {
    for (int rows : {1, 8, 33}) {
      for (float mean : {0.5f, 300.0f}) {
        const std::string what =
            std::to_string(rows) + "x" + std::to_string(cols) + " mean " + std::to_string(mean);
        std::vector<float> x, w, b;
        auto xb = RandomRounded(x, size_t(rows) * cols, t, rng_, 3.0f, mean);
        auto wb = RandomRounded(w, cols, t, rng_, 0.5f, 1.0f);
        auto bb = RandomRounded(b, cols, t, rng_, 0.5f);
        auto dw = DeviceMem::From(wb), db = DeviceMem::From(bb);
        const std::vector<float> want = [&] {
          LayerNormParams p;
          p.rows = rows;
          p.cols = cols;
          return cpu(p, x.data(), w, b);
        }();
        // Rounded to the dtype, as the graph's second launch reads it.
        std::vector<float> want_rounded = want;
        for (float& v : want_rounded) v = testing::FromBits(testing::ToBits(v, t), t);
        LayerNormParams p;
        p.weight = dw->get();
        p.bias = db->get();
        p.rows = rows;
        p.cols = cols;
        p.dtype = t;
        for (bool in_place : {false, true}) {
          auto dx = DeviceMem::From(xb);
          DeviceMem out(xb.size() * 2);
          out.Poison();
          p.input = dx->get();
          p.output = in_place ? dx->get() : out.get();
          cudaStream_t stream = nullptr;
          if (in_place) ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
          ASSERT_TRUE(
              LayerNormCuda(p, stream, /*pdl=*/in_place, LayerNormCudaKernel::kRegisters).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          if (stream) cudaStreamDestroy(stream);
          const auto got = Widen((in_place ? *dx : out).Download<uint16_t>(), t);
          EXPECT_LT(RelError(got, want), 1e-2) << what << " in place " << in_place;
        }
        // Graph: out = LN(x) with PDL, then LN(out) in place with PDL; launched twice, the
        // output poisoned before each launch.
        auto dx = DeviceMem::From(xb);
        DeviceMem out(xb.size() * 2);
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        p.input = dx->get();
        p.output = out.get();
        const bool first = LayerNormCuda(p, stream, true, LayerNormCudaKernel::kRegisters).ok();
        p.input = out.get();
        const bool second = LayerNormCuda(p, stream, true, LayerNormCudaKernel::kRegisters).ok();
        cudaGraph_t graph;
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        ASSERT_TRUE(first && second);
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        const std::vector<float> want2 = cpu(p, want_rounded.data(), w, b);
        for (int launch = 0; launch < 2; ++launch) {
          out.Poison();
          ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const auto got = Widen(out.Download<uint16_t>(), t);
          EXPECT_LT(RelError(got, want2), 1e-2) << what << " graph launch " << launch;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(stream);
      }
    }
  }
}

TEST_P(ForwardKernels, BiasActivationMatchesCpu) {
  const DType t = GetParam();
  for (Activation act : {Activation::kIdentity, Activation::kGeluTanh, Activation::kGeluErf}) {
    for (auto [rows, cols] : {std::pair{3, 24576}, {17, 6400}, {9, 333}}) {
      for (int variant = 0; variant < 3; ++variant) {  // bias only, residual only, both
        const bool with_bias = variant != 1, with_res = variant != 0;
        std::vector<float> x, b, r;
        auto xb = RandomRounded(x, size_t(rows) * cols, t, rng_, 2.0f);
        auto bb = RandomRounded(b, cols, t, rng_);
        auto rb = RandomRounded(r, x.size(), t, rng_);
        auto dx = DeviceMem::From(xb), dbias = DeviceMem::From(bb), dr = DeviceMem::From(rb);
        DeviceMem out(xb.size() * 2);
        out.Poison();
        BiasActivationParams p;
        p.input = dx->get();
        p.bias = with_bias ? dbias->get() : nullptr;
        p.residual = with_res ? dr->get() : nullptr;
        p.output = out.get();
        p.rows = rows;
        p.cols = cols;
        p.activation = act;
        p.dtype = t;
        cudaStream_t stream = nullptr;  // variant 2 also as a PDL launch on a real stream
        if (variant == 2) ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
        ASSERT_TRUE(BiasActivationCuda(p, stream, /*pdl=*/variant == 2).ok());
        if (stream) {
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          cudaStreamDestroy(stream);
        }
        std::vector<float> want(x.size());
        BiasActivationParams c = p;
        c.input = x.data();
        c.bias = with_bias ? b.data() : nullptr;
        c.residual = with_res ? r.data() : nullptr;
        c.output = want.data();
        c.dtype = DType::kF32;
        ASSERT_TRUE(BiasActivationCpu(c).ok());
        const auto got = Widen(out.Download<uint16_t>(), t);
        EXPECT_LT(RelError(got, want), 1e-2)
            << rows << "x" << cols << " act " << int(act) << " variant " << variant;
      }
    }
  }
}

TEST_P(ForwardKernels, EmbeddingMatchesCpu) {
  const DType t = GetParam();
  for (int hidden : {6144, 520, 77}) {
    const int vocab = 1000, positions = 300, n = 64, start = 250, rows = 500;  // a vocab shard
    std::vector<float> table, pos;
    auto tb = RandomRounded(table, size_t(rows) * hidden, t, rng_);
    auto pb = RandomRounded(pos, size_t(positions) * hidden, t, rng_);
    std::vector<int32_t> ids(n), ps(n);
    for (int i = 0; i < n; ++i) {
      ids[i] = std::uniform_int_distribution<int>(0, vocab - 1)(rng_);
      ps[i] = std::uniform_int_distribution<int>(0, positions - 1)(rng_);
    }
    auto dt = DeviceMem::From(tb), dp = DeviceMem::From(pb), di = DeviceMem::From(ids),
         dps = DeviceMem::From(ps);
    for (bool with_pos : {true, false}) {
      DeviceMem out(size_t(n) * hidden * 2);
      out.Poison();
      EmbeddingParams p;
      p.ids = di->get<int32_t>();
      p.positions = dps->get<int32_t>();
      p.table = dt->get();
      p.table_start = start;
      p.table_rows = rows;
      p.position_table = with_pos ? dp->get() : nullptr;
      p.position_rows = positions;
      p.output = out.get();
      p.num_tokens = n;
      p.hidden = hidden;
      p.dtype = t;
      ASSERT_TRUE(EmbeddingCuda(p, nullptr).ok());
      std::vector<float> want(size_t(n) * hidden);
      EmbeddingParams c = p;
      c.ids = ids.data();
      c.positions = ps.data();
      c.table = table.data();
      c.position_table = with_pos ? pos.data() : nullptr;
      c.output = want.data();
      c.dtype = DType::kF32;
      ASSERT_TRUE(EmbeddingCpu(c).ok());
      const auto got = Widen(out.Download<uint16_t>(), t);
      if (with_pos) {
        EXPECT_LT(RelError(got, want), 1e-2) << hidden;
      } else {
        EXPECT_EQ(got, want) << hidden;  // a pure gather (and zero rows) is exact
      }
    }
  }
}

TEST_P(ForwardKernels, BlockCopyCopiesEveryTensor) {
  const DType t = GetParam();
  const int tensors = 6, blocks = 40;
  const int64_t block_elems = 16 * 128;
  std::vector<std::vector<uint16_t>> host(tensors);
  std::vector<std::unique_ptr<DeviceMem>> dev;
  std::vector<void*> ptrs;
  for (int i = 0; i < tensors; ++i) {
    std::vector<float> unused;
    host[i] = RandomRounded(unused, size_t(blocks) * block_elems, t, rng_);
    dev.push_back(DeviceMem::From(host[i]));
    ptrs.push_back(dev.back()->get());
  }
  std::vector<int32_t> perm(blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
  // 10 disjoint pairs: sources from the first half of the permutation, destinations the second.
  std::vector<int32_t> pairs;
  for (int i = 0; i < 10; ++i) {
    pairs.push_back(perm[i]);
    pairs.push_back(perm[20 + i]);
  }
  auto dptrs = DeviceMem::From(ptrs), dpairs = DeviceMem::From(pairs);
  BlockCopyParams p;
  p.tensors = dptrs->get<void* const>();
  p.num_tensors = tensors;
  p.pairs = dpairs->get<int32_t>();
  p.num_pairs = 10;
  p.block_bytes = block_elems * 2;
  ASSERT_TRUE(BlockCopyCuda(p, nullptr).ok());
  for (int i = 0; i < tensors; ++i) {
    std::vector<uint16_t> want = host[i];
    for (int j = 0; j < 10; ++j) {
      std::copy_n(host[i].begin() + pairs[2 * j] * block_elems, block_elems,
                  want.begin() + pairs[2 * j + 1] * block_elems);
    }
    EXPECT_EQ(dev[i]->Download<uint16_t>(), want) << "tensor " << i;
  }
}

TEST_P(ForwardKernels, LogitsToFloatInterleavesShards) {
  const DType t = GetParam();
  const int shards = 3, rows = 5, shard = 400, vocab = 1111;  // 89 padding columns dropped
  std::vector<float> in;
  auto ib = RandomRounded(in, size_t(shards) * rows * shard, t, rng_);
  auto din = DeviceMem::From(ib);
  DeviceMem out(size_t(rows) * vocab * 4);
  out.Poison();
  LogitsToFloatParams p;
  p.input = din->get();
  p.shards = shards;
  p.rows = rows;
  p.vocab_shard = shard;
  p.vocab = vocab;
  p.output = out.get<float>();
  p.dtype = t;
  ASSERT_TRUE(LogitsToFloatCuda(p, nullptr).ok());
  std::vector<float> want(size_t(rows) * vocab);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < vocab; ++c) want[r * vocab + c] = in[(c / shard * rows + r) * shard + c % shard];
  }
  EXPECT_EQ(out.Download<float>(), want);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ForwardKernels, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace mqa
