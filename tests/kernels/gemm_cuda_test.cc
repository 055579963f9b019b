// CudaGemm (cuBLASLt and the skinny decode kernel) against GemmCpu + BiasActivationCpu on fresh
// random fp16 / bf16 inputs: decode (m 1..8) and prefill shapes, odd sizes that fall back to
// cuBLASLt, every epilogue (bias, GELU-tanh, residual accumulate), padded strides; the output is
// poisoned first (except with accumulate, where it holds the residual); the same with cuBLASLt
// autotuning on; the split-K decode kernel (GemmSplitKTest): every epilogue and the fused ones,
// run repeatedly on one workspace and in CUDA graphs. Skips without a GPU.
#include "kernels/gemm_cuda.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/layer_norm.h"
#include "runtime/status.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;
using testing::RandomRounded;
using testing::RelError;
using testing::RunInGraph;
using testing::Widen;

struct Shape {
  int64_t m, n, k, pad;  // pad: extra elements at the end of each row of A and B
};

class GemmCudaTest : public testing::CudaStreamTest<std::tuple<DType, int>> {};

// One case of the epilogue tests: fresh random A [m, k + pad], B [n, k + pad], bias [n] and C
// [m, n] (the residual) rounded to `t`, on the host and the device; the GemmParams and
// GemmEpilogue of epilogue `epi` (0 none, 1 bias, 2 bias + GELU-tanh, 3 bias + accumulate); and
// the CPU reference `want`, GemmCpu then BiasActivationCpu.
struct EpilogueCase {
  std::vector<float> a, b, bias, c0, want;
  std::vector<uint16_t> c0_bits;
  std::unique_ptr<DeviceMem> da, db, dbias, dc;  // dc starts as the residual
  GemmParams p;
  GemmEpilogue e;

  // Before a run: C back to the residual with accumulate, else poisoned.
  void ResetC() const {
    if (e.accumulate) {
      ASSERT_EQ(
          cudaMemcpy(dc->get(), c0_bits.data(), c0_bits.size() * 2, cudaMemcpyHostToDevice),
          cudaSuccess);
    } else {
      dc->Poison();
    }
  }
};

void MakeEpilogueCase(const Shape& s, int epi, DType t, std::mt19937& rng, EpilogueCase& ec) {
  const int64_t lda = s.k + s.pad, ldb = s.k + s.pad;
  auto ab = RandomRounded(ec.a, s.m * lda, t, rng);
  auto bb = RandomRounded(ec.b, s.n * ldb, t, rng, 0.05f);
  auto biasb = RandomRounded(ec.bias, s.n, t, rng);
  ec.c0_bits = RandomRounded(ec.c0, s.m * s.n, t, rng);
  ec.da = DeviceMem::From(ab);
  ec.db = DeviceMem::From(bb);
  ec.dbias = DeviceMem::From(biasb);
  ec.dc = DeviceMem::From(ec.c0_bits);
  GemmParams& p = ec.p;
  p.a = ec.da->get();
  p.b = ec.db->get();
  p.c = ec.dc->get();
  p.lda = lda;
  p.ldb = ldb;
  p.ldc = s.n;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.dtype = t;
  GemmEpilogue& e = ec.e;
  e.bias = epi >= 1 ? ec.dbias->get() : nullptr;
  e.activation = epi == 2 ? Activation::kGeluTanh : Activation::kIdentity;
  e.accumulate = epi == 3;

  std::vector<float> prod(s.m * s.n);
  ec.want.resize(s.m * s.n);
  GemmParams c = p;
  c.a = ec.a.data();
  c.b = ec.b.data();
  c.c = prod.data();
  c.dtype = DType::kF32;
  ASSERT_TRUE(GemmCpu(c).ok());
  BiasActivationParams post;
  post.input = prod.data();
  post.bias = e.bias ? ec.bias.data() : nullptr;
  post.residual = e.accumulate ? ec.c0.data() : nullptr;
  post.output = ec.want.data();
  post.rows = s.m;
  post.cols = s.n;
  post.activation = e.activation;
  ASSERT_TRUE(BiasActivationCpu(post).ok());
}

TEST_P(GemmCudaTest, MatchesCpuWithEveryEpilogue) {
  const auto [t, rows] = GetParam();  // rows: the skinny kernel's rows per warp; 0: cuBLASLt only
  const bool skinny = rows > 0;
  CudaGemm::Options options;
  options.skinny = skinny;
  options.skinny_rows_per_warp = rows;
  options.skinny_max_m = CudaGemm::kSkinnyMaxM;  // the skinny kernel up to m = 8
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const Shape shapes[] = {{1, 6400, 6144, 0}, {3, 2304, 2048, 8}, {8, 4096, 1024, 0},
                          {5, 1001, 264, 0},  {64, 768, 512, 16}, {300, 520, 256, 0},
                          {2, 77, 40, 0},     {7, 130, 13, 3}};
  for (const Shape& s : shapes) {
    for (int epi = 0; epi < 4; ++epi) {  // none, bias, bias + GELU-tanh, bias + accumulate
      EpilogueCase ec;
      ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, epi, t, rng_, ec));
      ASSERT_NO_FATAL_FAILURE(ec.ResetC());
      (*gemm)->set_pdl(epi % 2 == 1);  // PDL launch (no previous kernel: a no-op wait)
      const absl::Status st = (*gemm)->Run(ec.p, ec.e, stream_);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = Widen(ec.dc->Download<uint16_t>(), t);
      EXPECT_LT(RelError(got, ec.want), 1e-2)
          << "m " << s.m << " n " << s.n << " k " << s.k << " pad " << s.pad << " epilogue "
          << epi << " skinny " << skinny;
    }
  }
}

// The fused decode paths (GemmEpilogue::ln_weight, key_cache) with and without PDL launch:
// C = act(LN(A) B^T + bias) against LayerNormCpu -> rounding to the dtype -> GemmCpu ->
// BiasActivationCpu; the K/V columns land at their slots (bit-equal to C's), every other cache row
// keeps its old contents. C poisoned. cuBLASLt-only refuses the fusion (Unimplemented). A's rows
// have a mean as large as their spread, so that the skinny kernel's folded form (which subtracts
// mean x sum_j B[col][j] w_j at the end) is checked where that term is not small; its sums come
// from LayerNormFoldSumsCuda.
struct FShape {
  int64_t m, n, k, pad, kv_width;  // n = q columns + 2 kv_width
};
constexpr FShape kFusedShapes[] = {{1, 2048 + 256, 2048, 0, 128},
                                   {3, 640 + 2 * 64, 512, 8, 64},
                                   {8, 1000, 264, 0, 0},
                                   {2, 4096, 1024, 0, 0}};

enum class RunMode { kEager, kGraph, kRefused };

// gemm.Run(p, e) captured into a CUDA graph on `stream`; the graph launched once and awaited.
void RunInGraph(CudaGemm& gemm, const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream) {
  RunInGraph(stream, [&](cudaStream_t s) { return gemm.Run(p, e, s); });
}

// Runs one fused case through `gemm` (eagerly, or captured into a CUDA graph and replayed) and
// checks it; kRefused expects Unimplemented.
void CheckFused(CudaGemm& gemm, DType t, const FShape& s, int variant, RunMode mode,
                std::mt19937& rng, cudaStream_t stream) {
  const bool pdl = variant & 1;  // bit 0: PDL, bit 1: GELU-tanh
  const Activation act = variant & 2 ? Activation::kGeluTanh : Activation::kIdentity;
  gemm.set_pdl(pdl);
  const int64_t lda = s.k + s.pad;
  std::vector<float> a, b, bias, lw, lb, cache0;
  auto ab = RandomRounded(a, s.m * lda, t, rng, 2.0f, 2.0f);
  auto bb = RandomRounded(b, s.n * s.k, t, rng, 0.05f);
  auto biasb = RandomRounded(bias, s.n, t, rng);
  auto lwb = RandomRounded(lw, s.k, t, rng, 0.5f, 1.0f);
  auto lbb = RandomRounded(lb, s.k, t, rng, 0.5f);
  const int64_t num_slots = 3 * s.m + 2;
  auto cb = RandomRounded(cache0, num_slots * std::max<int64_t>(s.kv_width, 1) * 2, t, rng);
  std::vector<int32_t> slots(s.m);
  for (int64_t i = 0; i < s.m; ++i) slots[i] = i == 1 ? -1 : static_cast<int32_t>(3 * i + 1);
  auto da = DeviceMem::From(ab), db = DeviceMem::From(bb), dbias = DeviceMem::From(biasb);
  auto dlw = DeviceMem::From(lwb), dlb = DeviceMem::From(lbb), dslots = DeviceMem::From(slots);
  const std::vector<uint16_t> kc(cb.begin(), cb.begin() + cb.size() / 2);
  const std::vector<uint16_t> vc(cb.begin() + cb.size() / 2, cb.end());
  auto dk = DeviceMem::From(kc), dv = DeviceMem::From(vc);
  DeviceMem dc(s.m * s.n * 2);
  dc.Poison();
  GemmParams p;
  p.a = da->get();
  p.b = db->get();
  p.c = dc.get();
  p.lda = lda;
  p.ldb = s.k;
  p.ldc = s.n;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.dtype = t;
  GemmEpilogue e;
  e.bias = dbias->get();
  e.activation = act;
  e.ln_weight = dlw->get();
  e.ln_bias = dlb->get();
  e.ln_epsilon = 1e-5f;
  DeviceMem sums(2 * s.n * sizeof(float));
  ASSERT_TRUE(LayerNormFoldSumsCuda(p.b, p.ldb, s.n, s.k, t, e.ln_weight, e.ln_bias,
                                    sums.get<float>(), sums.get<float>() + s.n, stream)
                  .ok());
  e.ln_wsum = sums.get<float>();
  e.ln_bsum = sums.get<float>() + s.n;
  const int64_t kv_col0 = s.n - 2 * s.kv_width;
  if (s.kv_width > 0) {
    e.key_cache = dk->get();
    e.value_cache = dv->get();
    e.slot_mapping = dslots->get<int32_t>();
    e.kv_col0 = kv_col0;
    e.kv_width = s.kv_width;
  }
  if (mode == RunMode::kGraph) {
    ASSERT_NO_FATAL_FAILURE(RunInGraph(gemm, p, e, stream));
  } else {
    const absl::Status st = gemm.Run(p, e, stream);
    if (mode == RunMode::kRefused) {
      EXPECT_TRUE(absl::IsUnimplemented(st)) << st;
      return;
    }
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<float> dense(s.m * s.k), normed(s.m * s.k);
  for (int64_t i = 0; i < s.m; ++i) {
    std::copy_n(a.begin() + i * lda, s.k, dense.begin() + i * s.k);
  }
  LayerNormParams ln;
  ln.input = dense.data();
  ln.output = normed.data();
  ln.weight = lw.data();
  ln.bias = lb.data();
  ln.rows = s.m;
  ln.cols = s.k;
  ASSERT_TRUE(LayerNormCpu(ln).ok());
  for (float& x : normed) x = testing::FromBits(testing::ToBits(x, t), t);
  std::vector<float> prod(s.m * s.n), want(s.m * s.n);
  GemmParams c = p;
  c.a = normed.data();
  c.lda = s.k;
  c.b = b.data();
  c.c = prod.data();
  c.dtype = DType::kF32;
  ASSERT_TRUE(GemmCpu(c).ok());
  BiasActivationParams post;
  post.input = prod.data();
  post.bias = bias.data();
  post.output = want.data();
  post.rows = s.m;
  post.cols = s.n;
  post.activation = act;
  ASSERT_TRUE(BiasActivationCpu(post).ok());
  const auto got_bits = dc.Download<uint16_t>();
  EXPECT_LT(RelError(Widen(got_bits, t), want), 1e-2)
      << "m " << s.m << " n " << s.n << " k " << s.k << " variant " << variant
      << (mode == RunMode::kGraph ? " (graph)" : "");
  if (s.kv_width == 0) return;
  const auto got_k = dk->Download<uint16_t>(), got_v = dv->Download<uint16_t>();
  std::vector<uint16_t> want_k = kc, want_v = vc;
  for (int64_t i = 0; i < s.m; ++i) {
    if (slots[i] < 0) continue;
    for (int64_t j = 0; j < s.kv_width; ++j) {
      want_k[slots[i] * s.kv_width + j] = got_bits[i * s.n + kv_col0 + j];
      want_v[slots[i] * s.kv_width + j] = got_bits[i * s.n + kv_col0 + s.kv_width + j];
    }
  }
  EXPECT_EQ(got_k, want_k) << "m " << s.m << " variant " << variant;
  EXPECT_EQ(got_v, want_v) << "m " << s.m << " variant " << variant;
}

TEST_P(GemmCudaTest, FusedLayerNormAndKvWriteMatchCpu) {
  const auto [t, rows] = GetParam();
  CudaGemm::Options options;
  options.skinny = rows > 0;
  options.skinny_rows_per_warp = rows;
  options.skinny_max_m = CudaGemm::kSkinnyMaxM;  // the skinny kernel up to m = 8
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const FShape& s : kFusedShapes) {
    for (int variant = 0; variant < 4; ++variant) {
      CheckFused(**gemm, t, s, variant, rows == 0 ? RunMode::kRefused : RunMode::kEager, rng_,
                 stream_);
    }
  }
}

// Options::autotune: each shape is timed over several cuBLASLt algorithms on its first run, then
// the cached choice is used. Every epilogue, each shape run twice (tuning run and cached run), C
// poisoned before each run (accumulate: reset to the residual, which timing must not add into
// more than once). A shape first seen inside a graph capture is not tuned and still correct.
TEST_P(GemmCudaTest, AutotuneMatchesCpu) {
  const auto [t, rows] = GetParam();
  if (rows != 0) GTEST_SKIP() << "cuBLASLt only";
  CudaGemm::Options options;
  options.skinny = false;
  options.autotune = true;
  options.skinny_max_m = CudaGemm::kSkinnyMaxM;  // the skinny kernel up to m = 8
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  CudaGemm& g = **gemm;
  const Shape shapes[] = {{32, 6400, 6144, 0}, {32, 1024, 4096, 8}, {300, 520, 256, 0},
                          {48, 768, 512, 0}};
  int tuned_shapes = 0;
  for (size_t si = 0; si < std::size(shapes); ++si) {
    const Shape& s = shapes[si];
    const bool in_graph = si == std::size(shapes) - 1;
    for (int epi = 0; epi < 4; ++epi) {  // none, bias, bias + GELU-tanh, bias + accumulate
      EpilogueCase ec;
      ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, epi, t, rng_, ec));
      const GemmParams& p = ec.p;
      const GemmEpilogue& e = ec.e;

      // Eager shapes: the tuning run, then the cached choice. The graph shape (as the model does
      // it): an eager run with autotune off (the plan is made), a captured run with autotune on
      // (no tuning while capturing), then an eager run that tunes.
      const int runs = in_graph ? 3 : 2;
      for (int run = 0; run < runs; ++run) {
        ASSERT_NO_FATAL_FAILURE(ec.ResetC());
        const int before = g.autotune_stats().shapes;
        g.set_autotune(!(in_graph && run == 0));
        if (in_graph && run == 1) {
          ASSERT_NO_FATAL_FAILURE(RunInGraph(g, p, e, stream_));
          EXPECT_EQ(g.autotune_stats().shapes, before) << "tuned while capturing";
        } else {
          const absl::Status st = g.Run(p, e, stream_);
          ASSERT_TRUE(st.ok()) << st;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          // A shape is tuned on its first eager run with autotune on, and only then.
          const bool tunes = in_graph ? run == 2 : run == 0;
          EXPECT_EQ(g.autotune_stats().shapes, before + (tunes ? 1 : 0))
              << "m " << s.m << " epilogue " << epi << " run " << run;
          tuned_shapes = g.autotune_stats().shapes;
        }
        const auto got = Widen(ec.dc->Download<uint16_t>(), t);
        EXPECT_LT(RelError(got, ec.want), 1e-2)
            << "m " << s.m << " n " << s.n << " k " << s.k << " epilogue " << epi << " run "
            << run << (in_graph ? " (graph shape)" : "");
      }
    }
  }
  EXPECT_EQ(tuned_shapes, static_cast<int>(std::size(shapes)) * 4);
  EXPECT_GT(g.autotune_stats().candidates, 0);
  EXPECT_GT(g.autotune_stats().best_ms, 0.0);
  EXPECT_LE(g.autotune_stats().best_ms, g.autotune_stats().first_ms * 1.02);
}

// Options::autotune_max_m: with autotune on, only shapes of at most that many rows are tuned (the
// decode batches); a larger one (a prefill chunk) keeps the heuristic's choice and stays correct.
TEST_P(GemmCudaTest, AutotuneMaxMTunesOnlySmallShapes) {
  const auto [t, rows] = GetParam();
  if (rows != 0) GTEST_SKIP() << "cuBLASLt only";
  CudaGemm::Options options;
  options.skinny = false;
  options.autotune = true;
  options.autotune_max_m = 32;
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  CudaGemm& g = **gemm;
  const Shape shapes[] = {{32, 1024, 4096, 0}, {33, 1024, 4096, 0}, {300, 520, 256, 0}};
  for (const Shape& s : shapes) {
    EpilogueCase ec;
    ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, /*epilogue=*/1, t, rng_, ec));
    ASSERT_NO_FATAL_FAILURE(ec.ResetC());
    const int before = g.autotune_stats().shapes;
    const absl::Status st = g.Run(ec.p, ec.e, stream_);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(g.autotune_stats().shapes, before + (s.m <= 32 ? 1 : 0)) << "m " << s.m;
    const auto got = Widen(ec.dc->Download<uint16_t>(), t);
    EXPECT_LT(RelError(got, ec.want), 1e-2) << "m " << s.m;
  }
  EXPECT_EQ(g.autotune_stats().shapes, 1);
}

// Frozen autotuning (the server after its decode warm-up): a shape tuned before keeps its choice
// without another timing pass, a new one runs the heuristic's algorithm untimed; turning tuning on
// again unfreezes. Every result still matches the CPU.
TEST_P(GemmCudaTest, AutotuneFrozenTunesNoNewShape) {
  const auto [t, rows] = GetParam();
  if (rows != 0) GTEST_SKIP() << "cuBLASLt only";
  CudaGemm::Options options;
  options.skinny = false;
  options.autotune = true;
  options.autotune_max_m = 256;
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  CudaGemm& g = **gemm;
  auto run = [&](const Shape& s, int want_tuned, const char* what) {
    EpilogueCase ec;
    ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, /*epilogue=*/1, t, rng_, ec));
    ASSERT_NO_FATAL_FAILURE(ec.ResetC());
    const absl::Status st = g.Run(ec.p, ec.e, stream_);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(g.autotune_stats().shapes, want_tuned) << what;
    EXPECT_LT(RelError(Widen(ec.dc->Download<uint16_t>(), t), ec.want), 1e-2) << what;
  };
  const Shape decode{32, 1024, 4096, 0}, other{100, 520, 1024, 0};
  run(decode, 1, "decode shape, tuning on");
  g.freeze_autotune();
  run(decode, 1, "decode shape again, frozen");
  run(other, 1, "a new shape, frozen: not tuned");
  g.set_autotune(true, 256);
  run(other, 2, "the new shape after unfreezing: tuned");
}

// Autotuning's split-K candidates (cublasLtMatmulAlgoConfig SPLITK_NUM on the heuristic's first
// choices), forced wherever one exists: decode-sized shapes with long K (StarCoder's QKV and
// attention projection at m = 32) must offer one, and every epilogue, accumulate included, must
// still match the CPU.
TEST_P(GemmCudaTest, AutotuneSplitKMatchesCpu) {
  const auto [t, rows] = GetParam();
  if (rows != 0) GTEST_SKIP() << "cuBLASLt only";
  CudaGemm::Options options;
  options.skinny = false;
  options.autotune = true;
  options.autotune_prefer_split_k = true;
  auto gemm = CudaGemm::Create(options);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  CudaGemm& g = **gemm;
  const Shape shapes[] = {{32, 6400, 6144, 0}, {32, 6144, 6144, 0}, {8, 1000, 4104, 8}};
  for (const Shape& s : shapes) {
    for (int epi = 0; epi < 4; ++epi) {
      EpilogueCase ec;
      ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, epi, t, rng_, ec));
      for (int run = 0; run < 2; ++run) {  // the tuning run, then the cached choice
        ASSERT_NO_FATAL_FAILURE(ec.ResetC());
        const absl::Status st = g.Run(ec.p, ec.e, stream_);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = Widen(ec.dc->Download<uint16_t>(), t);
        EXPECT_LT(RelError(got, ec.want), 1e-2)
            << "m " << s.m << " n " << s.n << " k " << s.k << " epilogue " << epi << " run " << run;
      }
    }
  }
  // At least the two long-K epilogue-free shapes offer split-K versions.
  EXPECT_GE(g.autotune_stats().split_k, 2) << "split-K chosen for " << g.autotune_stats().split_k
                                           << " of " << g.autotune_stats().shapes << " shapes";
}

// CudaGemm::Options::skinny_deep_unroll: narrow m = 1 GEMMs (at most 16 warps an SM) through the
// 8-deep instantiation, every epilogue, with and without PDL, and the fused layer norm / KV write;
// then again with skinny_half_fold (fp16 pair sums; bf16 ignores it).
TEST_P(GemmCudaTest, DeepUnrollMatchesCpu) {
  const auto [t, rows] = GetParam();
  if (rows != 2) GTEST_SKIP() << "the deep unroll is instantiated for 2 rows per warp";
  // fp32 fold; fp16 pairs (fp16 only); fp16 pairs on the instantiations built for more resident
  // CTAs an SM (Options::skinny_occupancy: 8 without the deep unroll, c_fc's shape; 4 with it);
  // fp16 pairs with the bias / residual loaded before the fold (skinny_early_epilogue); fp16
  // pairs with the weights' L2 priority evict_normal (skinny_evict_first off; the others take
  // the default, evict_first).
  for (const int form : {0, 1, 2, 3, 4}) {
    SCOPED_TRACE(form == 0   ? "fp32 fold"
                 : form == 1 ? "half fold"
                 : form == 2 ? "half fold, occupancy"
                 : form == 3 ? "half fold, the epilogue's loads before the fold"
                             : "half fold, the weights evict_normal");
    CudaGemm::Options options;
    options.skinny_rows_per_warp = rows;
    options.skinny_max_m = CudaGemm::kSkinnyMaxM;
    options.skinny_deep_unroll = true;
    options.skinny_half_fold = form >= 1;
    options.skinny_occupancy = form == 2;
    options.skinny_early_epilogue = form == 3;
    options.skinny_evict_first = form != 4;
    auto gemm = CudaGemm::Create(options);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    // SantaCoder's QKV and mlp c_proj (k < and > the 2048 elements loaded before the wait), its
    // c_fc (too wide for the deep unroll), odd n, k not a multiple of the unrolled step, padded A.
    const Shape shapes[] = {{1, 2304, 2048, 0}, {1, 2048, 8192, 8}, {1, 8192, 2048, 0},
                            {1, 1001, 264, 0},  {1, 77, 40, 0},     {1, 515, 3000, 16}};
    for (const Shape& s : shapes) {
      for (int epi = 0; epi < 4; ++epi) {
        EpilogueCase ec;
        ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, epi, t, rng_, ec));
        ASSERT_NO_FATAL_FAILURE(ec.ResetC());
        (*gemm)->set_pdl(epi % 2 == 0);
        const absl::Status st = (*gemm)->Run(ec.p, ec.e, stream_);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = Widen(ec.dc->Download<uint16_t>(), t);
        EXPECT_LT(RelError(got, ec.want), 1e-2)
            << "m " << s.m << " n " << s.n << " k " << s.k << " epilogue " << epi;
      }
    }
    // The fused layer norm: QKV-shaped (with the KV write) and c_fc-shaped.
    for (const FShape& s : {kFusedShapes[0], FShape{1, 8192, 2048, 0, 0}}) {
      for (int variant = 0; variant < 4; ++variant) {
        ASSERT_NO_FATAL_FAILURE(CheckFused(**gemm, t, s, variant, RunMode::kEager, rng_, stream_));
      }
    }
  }
}

// A decode layer's chain of m = 1 GEMMs (QKV-, c_proj-, c_fc- and MLP c_proj-shaped, each reading
// the previous one's output; GELU and a residual among them) launched with PDL into one CUDA graph,
// with and without the deep unroll (which loads a whole 4 KiB weight row before the wait), with and
// without the rows staged in shared memory before the wait (Options::skinny_stage_bytes), and with
// the half fold on the occupancy instantiations (Options::skinny_occupancy), and with every link
// releasing the next as it starts (GemmEpilogue::release_dependents_early). Each
// link's output is checked against the CPU on the device's own input, so a link that read its
// input before the previous link had written it shows as that link's error (the outputs are
// poisoned first).
TEST_P(GemmCudaTest, PdlChainMatchesCpu) {
  const auto [t, rows] = GetParam();
  if (rows != 2) GTEST_SKIP() << "the model's form, two rows a warp";
  struct Link {
    int64_t n, k;
    Activation act;
    bool residual;
  };
  const Link links[] = {{2304, 2048, Activation::kIdentity, false},
                        {2048, 2304, Activation::kIdentity, true},
                        {8192, 2048, Activation::kGeluTanh, false},
                        {2048, 8192, Activation::kIdentity, true},
                        {2304, 2048, Activation::kIdentity, false},
                        {1000, 2304, Activation::kIdentity, false}};
  constexpr int kLinks = sizeof(links) / sizeof(links[0]);
  std::vector<float> x0, w[kLinks], bias[kLinks], res[kLinks];
  std::unique_ptr<DeviceMem> dx0 = DeviceMem::From(RandomRounded(x0, 2048, t, rng_, 2.0f));
  std::unique_ptr<DeviceMem> dw[kLinks], dbias[kLinks], dy[kLinks];
  std::vector<uint16_t> res_bits[kLinks];
  for (int i = 0; i < kLinks; ++i) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(links[i].k));
    dw[i] = DeviceMem::From(RandomRounded(w[i], links[i].n * links[i].k, t, rng_, scale));
    dbias[i] = DeviceMem::From(RandomRounded(bias[i], links[i].n, t, rng_, 0.5f));
    res_bits[i] = RandomRounded(res[i], links[i].n, t, rng_);
    dy[i] = std::make_unique<DeviceMem>(links[i].n * 2);
  }
  GemmParams params[kLinks];  // link i reads link i - 1's output
  for (int i = 0; i < kLinks; ++i) {
    GemmParams& p = params[i];
    p.a = i == 0 ? dx0->get() : dy[i - 1]->get();
    p.b = dw[i]->get();
    p.c = dy[i]->get();
    p.m = 1;
    p.n = links[i].n;
    p.k = links[i].k;
    p.lda = p.k;
    p.ldb = p.k;
    p.ldc = p.n;
    p.dtype = t;
  }
  for (const int form : {0, 1, 2, 3, 4}) {
    SCOPED_TRACE(form == 0   ? "default unroll"
                 : form == 1 ? "deep unroll"
                 : form == 2 ? "deep, no staging"
                 : form == 3 ? "deep, half fold, occupancy (the model's fp16 form with it)"
                             : "deep, each link releasing the next as it starts");
    CudaGemm::Options options;
    options.skinny_deep_unroll = form >= 1;
    if (form == 2) options.skinny_stage_bytes = 0;
    options.skinny_half_fold = form == 3;
    options.skinny_occupancy = form == 3;
    options.pdl = true;
    auto gemm = CudaGemm::Create(options);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    for (int i = 0; i < kLinks; ++i) {
      if (links[i].residual) {
        ASSERT_EQ(
            cudaMemcpy(dy[i]->get(), res_bits[i].data(), links[i].n * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
      } else {
        dy[i]->Poison();
      }
    }
    ASSERT_NO_FATAL_FAILURE(RunInGraph(stream_, [&](cudaStream_t stream) {
      for (int i = 0; i < kLinks; ++i) {
        GemmEpilogue e;
        e.bias = dbias[i]->get();
        e.activation = links[i].act;
        e.accumulate = links[i].residual;
        e.release_dependents_early = form == 4;
        RETURN_IF_ERROR((*gemm)->Run(params[i], e, stream));
      }
      return absl::OkStatus();
    }));
    std::vector<float> in = x0;
    for (int i = 0; i < kLinks; ++i) {
      std::vector<float> prod(links[i].n), want(links[i].n);
      GemmParams c = params[i];
      c.a = in.data();
      c.b = w[i].data();
      c.c = prod.data();
      c.dtype = DType::kF32;
      ASSERT_TRUE(GemmCpu(c).ok());
      BiasActivationParams post;
      post.input = prod.data();
      post.bias = bias[i].data();
      post.residual = links[i].residual ? res[i].data() : nullptr;
      post.output = want.data();
      post.rows = 1;
      post.cols = links[i].n;
      post.activation = links[i].act;
      ASSERT_TRUE(BiasActivationCpu(post).ok());
      in = Widen(dy[i]->Download<uint16_t>(), t);  // the next link's reference input
      EXPECT_LT(RelError(in, want), 1e-2)
          << "link " << i << " (n " << links[i].n << ", k " << links[i].k << ")";
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
  p.k = p.lda = p.ldb = 64;
  GemmEpilogue e;  // a layer norm without its per-column sums
  e.ln_weight = e.ln_bias = reinterpret_cast<void*>(256);
  EXPECT_TRUE(absl::IsUnimplemented(SkinnyGemmCuda(p, e, nullptr)));
}

// LayerNormFoldSumsCuda against double sums on the host: padded rows, odd n, k not a multiple of
// a warp's 256 elements.
TEST_P(GemmCudaTest, LayerNormFoldSumsMatchHost) {
  const auto [t, rows] = GetParam();
  if (rows != 2) GTEST_SKIP() << "once a dtype is enough";
  const int64_t n = 1001, k = 264, ldb = 272;
  std::vector<float> b, w, lb;
  auto bb = RandomRounded(b, n * ldb, t, rng_, 0.05f);
  auto wb = RandomRounded(w, k, t, rng_, 0.5f, 1.0f);
  auto lbb = RandomRounded(lb, k, t, rng_, 0.5f);
  auto db = DeviceMem::From(bb), dw = DeviceMem::From(wb), dlb = DeviceMem::From(lbb);
  DeviceMem sums(2 * n * sizeof(float));
  sums.Poison();
  ASSERT_TRUE(LayerNormFoldSumsCuda(db->get(), ldb, n, k, t, dw->get(), dlb->get(),
                                    sums.get<float>(), sums.get<float>() + n, stream_)
                  .ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const auto got = sums.Download<float>();
  for (int64_t c = 0; c < n; ++c) {
    double ws = 0, bs = 0;
    for (int64_t j = 0; j < k; ++j) {
      ws += double{b[c * ldb + j]} * w[j];
      bs += double{b[c * ldb + j]} * lb[j];
    }
    ASSERT_NEAR(got[c], ws, 1e-5 * (1 + std::abs(ws))) << "column " << c;
    ASSERT_NEAR(got[n + c], bs, 1e-5 * (1 + std::abs(bs))) << "column " << c;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(LayerNormFoldSumsCuda(db->get(), ldb, n, 260, t, dw->get(),
                                                            dlb->get(), sums.get<float>(),
                                                            sums.get<float>() + n, stream_)));
}

INSTANTIATE_TEST_SUITE_P(All, GemmCudaTest,
                         ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values(0, 1, 2, 4)),
                         [](const auto& info) {
                           const int rows = std::get<1>(info.param);
                           return std::string(DTypeName(std::get<0>(info.param))) +
                                  (rows ? "_skinny" + std::to_string(rows) : "_cublaslt");
                         });

// --- Split-K decode kernel (SkinnySplitKGemmCuda, CudaGemm::Options::skinny_split_k) ----------

class GemmSplitKTest : public testing::CudaStreamTest<DType> {};

// Against GemmCpu + BiasActivationCpu for m = 1, 2, 5, 8: decode shapes of both models, long k
// over few rows (a row group shared by many warps), k not a multiple of a step or a batch, odd n,
// padded strides, tiny shapes; every epilogue; the grid as large as fits and at one CTA per SM
// (each warp then spans several row groups). Each case runs twice eagerly and twice as a replayed
// CUDA graph on the same workspace, C poisoned (or reset to the residual) before each run; the
// counters are zero after every run and the output is bit-identical run to run (the partial sums
// are added in a fixed order).
TEST_P(GemmSplitKTest, MatchesCpuWithEveryEpilogue) {
  const DType t = GetParam();
  const size_t ws_bytes = SkinnySplitKWorkspaceBytes(sms_);
  const size_t counter_bytes = SkinnySplitKCounterBytes(sms_);
  ASSERT_LT(counter_bytes, ws_bytes);
  DeviceMem ws(ws_bytes);
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws_bytes), cudaSuccess);
  auto counters_zero = [&] {
    std::vector<int32_t> v(counter_bytes / sizeof(int32_t));
    EXPECT_EQ(cudaMemcpy(v.data(), ws.get(), counter_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return std::all_of(v.begin(), v.end(), [](int32_t x) { return x == 0; });
  };
  const Shape shapes[] = {{1, 6400, 6144, 0}, {2, 2304, 2048, 8}, {5, 1001, 264, 0},
                          {8, 40, 24576, 16}, {1, 16, 8200, 0},   {2, 77, 40, 0},
                          {5, 3, 8, 0},       {8, 4096, 1024, 0}, {1, 2048, 8192, 8},
                          {2, 24576, 512, 0}};
  for (const int ctas_per_sm : {0, 1}) {
    for (const Shape& s : shapes) {
      for (int epi = 0; epi < 4; ++epi) {  // none, bias, bias + GELU-tanh, bias + accumulate
        EpilogueCase ec;
        ASSERT_NO_FATAL_FAILURE(MakeEpilogueCase(s, epi, t, rng_, ec));
        const GemmParams& p = ec.p;
        const GemmEpilogue& e = ec.e;
        SkinnySplitKOptions o;
        o.pdl = epi % 2 == 1;  // PDL launch (no previous kernel: a no-op wait)
        o.ctas_per_sm = ctas_per_sm;

        cudaGraphExec_t exec = nullptr;
        std::vector<uint16_t> first;
        for (int run = 0; run < 4; ++run) {  // 0, 1: eager; 2, 3: the same graph replayed
          ASSERT_NO_FATAL_FAILURE(ec.ResetC());
          if (run < 2) {
            const absl::Status st = SkinnySplitKGemmCuda(p, e, stream_, ws.get(), ws_bytes, o);
            ASSERT_TRUE(st.ok()) << st;
          } else {
            if (run == 2) {
              ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                        cudaSuccess);
              const absl::Status st = SkinnySplitKGemmCuda(p, e, stream_, ws.get(), ws_bytes, o);
              cudaGraph_t graph = nullptr;
              ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
              ASSERT_TRUE(st.ok()) << st;
              ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
              cudaGraphDestroy(graph);
            }
            ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
          }
          ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
          const auto bits = ec.dc->Download<uint16_t>();
          EXPECT_LT(RelError(Widen(bits, t), ec.want), 1e-2)
              << "m " << s.m << " n " << s.n << " k " << s.k << " pad " << s.pad << " epilogue "
              << epi << " ctas/SM " << ctas_per_sm << " run " << run;
          EXPECT_TRUE(counters_zero())
              << "counters left set: m " << s.m << " n " << s.n << " k " << s.k << " run " << run;
          if (run == 0) {
            first = bits;
          } else {
            EXPECT_EQ(bits, first) << "not deterministic: m " << s.m << " n " << s.n << " k " << s.k
                                   << " epilogue " << epi << " run " << run;
          }
        }
        if (exec) cudaGraphExecDestroy(exec);
      }
    }
  }
}

// Through CudaGemm with the knob: the fused layer norm and KV-cache write, eagerly and in graphs.
// The knob is turned on after Create, and the first split-K Run is captured: no workspace yet, so
// that graph holds the skinny kernel (still correct); the next eager Run allocates the workspace
// and later graphs hold the split-K kernel.
TEST_P(GemmSplitKTest, CudaGemmFusedLayerNormAndKvWriteMatchCpu) {
  const DType t = GetParam();
  auto gemm = CudaGemm::Create(CudaGemm::Options{});
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  CudaGemm& g = **gemm;
  g.set_skinny_split_k(true);
  ASSERT_TRUE(g.skinny_split_k());
  CheckFused(g, t, kFusedShapes[0], 1, RunMode::kGraph, rng_, stream_);
  for (const FShape& s : kFusedShapes) {
    for (int variant = 0; variant < 4; ++variant) {
      CheckFused(g, t, s, variant, RunMode::kEager, rng_, stream_);
      CheckFused(g, t, s, variant, RunMode::kGraph, rng_, stream_);
    }
  }
  // Created with the knob on (workspace allocated by Create), one CTA per SM.
  CudaGemm::Options options;
  options.skinny_split_k = true;
  options.skinny_split_ctas_per_sm = 1;
  options.skinny_max_m = CudaGemm::kSkinnyMaxM;
  auto gemm2 = CudaGemm::Create(options);
  ASSERT_TRUE(gemm2.ok()) << gemm2.status();
  for (const FShape& s : kFusedShapes) {
    CheckFused(**gemm2, t, s, 3, RunMode::kGraph, rng_, stream_);
  }
}

TEST_P(GemmSplitKTest, RefusesWhatItCannotDo) {
  const DType t = GetParam();
  DeviceMem ws(SkinnySplitKWorkspaceBytes(sms_));
  ASSERT_EQ(cudaMemset(ws.get(), 0, SkinnySplitKWorkspaceBytes(sms_)), cudaSuccess);
  DeviceMem a(9 * 64 * 2), b(64 * 64 * 2), c(9 * 64 * 2);
  GemmParams p;
  p.a = a.get();
  p.b = b.get();
  p.c = c.get();
  p.m = 9;
  p.n = p.k = p.lda = p.ldb = p.ldc = 64;
  p.dtype = t;
  const size_t bytes = SkinnySplitKWorkspaceBytes(sms_);
  EXPECT_TRUE(absl::IsUnimplemented(SkinnySplitKGemmCuda(p, {}, stream_, ws.get(), bytes)));
  p.m = 2;
  p.k = p.lda = p.ldb = 60;  // not a multiple of 8
  EXPECT_TRUE(absl::IsUnimplemented(SkinnySplitKGemmCuda(p, {}, stream_, ws.get(), bytes)));
  p.k = p.lda = p.ldb = 64;
  GemmEpilogue erf;
  erf.activation = Activation::kGeluErf;
  EXPECT_TRUE(absl::IsUnimplemented(SkinnySplitKGemmCuda(p, erf, stream_, ws.get(), bytes)));
  EXPECT_TRUE(absl::IsInvalidArgument(SkinnySplitKGemmCuda(p, {}, stream_, ws.get(), bytes - 4)));
  EXPECT_TRUE(absl::IsInvalidArgument(SkinnySplitKGemmCuda(p, {}, stream_, nullptr, bytes)));
  EXPECT_TRUE(SkinnySplitKGemmCuda(p, {}, stream_, ws.get(), bytes).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(All, GemmSplitKTest, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace mqa
