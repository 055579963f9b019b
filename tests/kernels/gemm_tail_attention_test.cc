// The QKV GEMM's tail attention (GemmEpilogue::tail, kernels/gemm.h): a one-token decode step's
// ln_1 + QKV projection + KV-cache write + attention in one skinny-kernel launch. Against:
//   - the same GEMM without the tail (the fused layer norm and KV write, checked against the CPU
//     by gemm_cuda_test): C bit-equal;
//   - the cache: the new row at its slot equal to C's K / V columns, every other row unchanged;
//   - PagedAttentionCpu on C's q and the cache as the kernel left it: relative error < 1e-2,
//     every output element written (poisoned first);
//   - with the output projection (GemmTailAttention::proj_weight) into the GEMM's own input row,
//     in place as the model runs it: that row bit-equal to attn.c_proj's own skinny GEMM (bias,
//     residual) run afterwards on the attention output the launch wrote, and near a double
//     reference of the same; without it the row untouched.
// Random caches and block tables (blocks in random order), contexts that are not multiples of the
// block size or of the 64-token split, a graph bucket longer than the context, one and several
// splits, MQA and grouped heads, fp16 (pair fold on and off) and bf16, with and without PDL,
// eagerly and captured in a CUDA graph; two launches back to back (each must leave its counters
// zeroed for the next); launches with and without the projection in turn. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/gemm_cuda.h"
#include "kernels/paged_attention.h"
#include "runtime/status.h"
#include "tests/kernels/forward_cuda_test_util.h"

namespace mqa {
namespace {

using testing::DeviceMem;
using testing::RandomRounded;
using testing::RelError;
using testing::Widen;

struct TailCase {
  int heads, kv_heads, k, block_size, ctx, max_context;
};

// (dtype, fp16 pair fold, PDL, GemmTailAttention::cluster_merge)
class GemmTailAttentionTest : public testing::CudaStreamTest<std::tuple<DType, bool, bool, bool>> {
 protected:
  std::unique_ptr<CudaGemm> MakeGemm(bool deep = true) {
    const auto [t, half, pdl, cluster] = GetParam();
    CudaGemm::Options o;
    o.skinny_deep_unroll = deep;
    o.skinny_half_fold = half;
    auto gemm = CudaGemm::Create(o);
    EXPECT_TRUE(gemm.ok()) << gemm.status();
    if (!gemm.ok()) return nullptr;
    (*gemm)->set_pdl(pdl);
    return std::move(*gemm);
  }
};

// One step's operands on the device: hidden row, QKV weight and bias, ln_1 and its fold sums, the
// caches, the block table, the slot and the context length.
struct TailOperands {
  TailCase c;
  DType t;
  bool cluster = false;  // GemmTailAttention::cluster_merge
  int64_t n = 0, kv_width = 0, num_blocks = 0;
  std::vector<uint16_t> kc, vc;  // the caches before the step
  std::vector<uint16_t> a0;      // the hidden row (A) before the step
  // The output projection: [k, heads D] and its bias (k: the hidden row's width).
  std::vector<float> fproj_w, fproj_b;
  std::unique_ptr<DeviceMem> proj_w, proj_b;
  std::vector<int32_t> table;
  int32_t slot = 0;
  std::unique_ptr<DeviceMem> a, b, bias, lw, lb, sums, dk, dv, dtable, dslot, dctx, work;
  GemmParams p;
  GemmEpilogue e;

  TailOperands(const TailCase& tc, DType dt, bool cluster_merge, std::mt19937& rng,
               cudaStream_t stream)
      : c(tc), t(dt), cluster(cluster_merge) {
    constexpr int D = kGemmTailHeadDim;
    kv_width = int64_t{c.kv_heads} * D;
    n = int64_t{c.heads} * D + 2 * kv_width;
    std::vector<float> fa, fb, fbias, flw, flb, fk, fv;
    a0 = RandomRounded(fa, c.k, t, rng, 2.0f, 1.0f);
    a = DeviceMem::From(a0);
    proj_w = DeviceMem::From(RandomRounded(fproj_w, int64_t{c.k} * c.heads * D, t, rng, 0.05f));
    proj_b = DeviceMem::From(RandomRounded(fproj_b, c.k, t, rng, 0.5f));
    b = DeviceMem::From(RandomRounded(fb, n * c.k, t, rng, 0.05f));
    bias = DeviceMem::From(RandomRounded(fbias, n, t, rng));
    lw = DeviceMem::From(RandomRounded(flw, c.k, t, rng, 0.5f, 1.0f));
    lb = DeviceMem::From(RandomRounded(flb, c.k, t, rng, 0.5f));
    const int64_t blocks_needed = (c.max_context + c.block_size - 1) / c.block_size;
    num_blocks = blocks_needed + 5;
    kc = RandomRounded(fk, num_blocks * c.block_size * kv_width, t, rng);
    vc = RandomRounded(fv, num_blocks * c.block_size * kv_width, t, rng);
    dk = DeviceMem::From(kc);
    dv = DeviceMem::From(vc);
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(perm.begin(), perm.begin() + blocks_needed);
    dtable = DeviceMem::From(table);
    const int pos = c.ctx - 1;
    slot = table[pos / c.block_size] * c.block_size + pos % c.block_size;
    dslot = DeviceMem::From(std::vector<int32_t>{slot});
    dctx = DeviceMem::From(std::vector<int32_t>{c.ctx});
    work = std::make_unique<DeviceMem>(GemmTailAttentionWorkspaceBytes(c.heads));
    EXPECT_EQ(cudaMemset(work->get(), 0, GemmTailAttentionWorkspaceBytes(c.heads)), cudaSuccess);
    sums = std::make_unique<DeviceMem>(2 * n * sizeof(float));
    EXPECT_TRUE(LayerNormFoldSumsCuda(b->get(), c.k, n, c.k, t, lw->get(), lb->get(),
                                      sums->get<float>(), sums->get<float>() + n, stream)
                    .ok());
    p.a = a->get();
    p.b = b->get();
    p.lda = p.ldb = c.k;
    p.ldc = n;
    p.m = 1;
    p.n = n;
    p.k = c.k;
    p.dtype = t;
    e.bias = bias->get();
    e.ln_weight = lw->get();
    e.ln_bias = lb->get();
    e.ln_wsum = sums->get<float>();
    e.ln_bsum = sums->get<float>() + n;
    e.key_cache = dk->get();
    e.value_cache = dv->get();
    e.slot_mapping = dslot->get<int32_t>();
    e.kv_col0 = int64_t{c.heads} * D;
    e.kv_width = kv_width;
  }

  // e with the tail writing `out` (c.max_context as the bound); with `hidden`, the output
  // projection adding into it (k elements; op.a itself for the model's in-place form).
  GemmEpilogue WithTail(void* out, void* hidden = nullptr) const {
    GemmEpilogue with = e;
    with.tail = {.output = out,
                 .block_table = dtable->get<int32_t>(),
                 .context_len = dctx->get<int32_t>(),
                 .heads = c.heads,
                 .kv_heads = c.kv_heads,
                 .head_dim = kGemmTailHeadDim,
                 .block_size = c.block_size,
                 .max_context = c.max_context,
                 .scale = 1.0f / std::sqrt(float(kGemmTailHeadDim)),
                 .workspace = work->get(),
                 .workspace_bytes = GemmTailAttentionWorkspaceBytes(c.heads),
                 .cluster_merge = cluster};
    if (hidden != nullptr) {
      with.tail.proj_weight = proj_w->get();
      with.tail.proj_bias = proj_b->get();
      with.tail.hidden = hidden;
      with.tail.proj_n = c.k;
    }
    return with;
  }

  // Whether a head's splits merge in a cluster (cluster_merge with 2-8 splits).
  bool InCluster() const {
    return cluster && splits() > 1 && splits() <= kGemmTailMaxClusterSplits;
  }

  // The launch's CTAs: the attention's, then the GEMM's (padded to whole clusters).
  int64_t LaunchCtas() const {
    const int64_t gemm_ctas = (n + 7) / 8;
    return int64_t{c.heads} * splits() +
           (InCluster() ? (gemm_ctas + splits() - 1) / splits() * splits() : gemm_ctas);
  }

  // After a launch with the projection into `hidden` (which held a0 before): `hidden` against
  // attn.c_proj's own skinny GEMM run now on the attention output `out` the launch wrote (bit for
  // bit: the same fold order and rounding), and near a double reference (its change on its own
  // too, since the residual is most of the row).
  void CheckProj(CudaGemm& gemm, const DeviceMem& out, const DeviceMem& hidden, const char* how,
                 cudaStream_t stream) const {
    const int64_t width = int64_t{c.heads} * kGemmTailHeadDim;
    const auto sep = DeviceMem::From(a0);
    GemmParams q;
    q.a = out.get();
    q.b = proj_w->get();
    q.c = sep->get();
    q.lda = q.ldb = width;
    q.ldc = c.k;
    q.m = 1;
    q.n = c.k;
    q.k = width;
    q.dtype = t;
    GemmEpilogue pe;
    pe.bias = proj_b->get();
    pe.accumulate = true;
    ASSERT_TRUE(gemm.Run(q, pe, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto got = hidden.Download<uint16_t>();
    EXPECT_EQ(got, sep->Download<uint16_t>()) << how << ": hidden differs from attn.c_proj's GEMM";
    const std::vector<float> att = Widen(out.Download<uint16_t>(), t), old = Widen(a0, t);
    const std::vector<float> fgot = Widen(got, t);
    std::vector<float> want(c.k), got_delta(c.k), want_delta(c.k);
    for (int64_t r = 0; r < c.k; ++r) {
      double dot = 0;
      for (int64_t j = 0; j < width; ++j) dot += double(fproj_w[r * width + j]) * att[j];
      want[r] = static_cast<float>((dot + fproj_b[r]) + old[r]);
      got_delta[r] = fgot[r] - old[r];
      want_delta[r] = want[r] - old[r];
    }
    EXPECT_LT(RelError(fgot, want), 1e-2) << how << ": hidden, ctx " << c.ctx;
    EXPECT_LT(RelError(got_delta, want_delta), 2e-2) << how << ": hidden's change, ctx " << c.ctx;
  }

  // `row` (A itself, or a projection's own row) set to a0, as before a projection into it.
  void ResetRow(const DeviceMem& row) const {
    ASSERT_EQ(cudaMemcpy(row.get(), a0.data(), a0.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  // C of the same GEMM without the tail: what a tail run's C must equal bit for bit.
  std::vector<uint16_t> PlainQkv(CudaGemm& gemm, cudaStream_t stream) const {
    DeviceMem c(n * 2);
    GemmParams q = p;
    q.c = c.get();
    EXPECT_TRUE(gemm.Run(q, e, stream).ok());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return c.Download<uint16_t>();
  }

  int splits() const { return (c.max_context + kGemmTailTokens - 1) / kGemmTailTokens; }
  // The attention's output row (heads x D elements of 2 bytes).
  int64_t out_bytes() const { return int64_t{c.heads} * kGemmTailHeadDim * 2; }
  // The workspace's partials (past the counters and the LL words), which only the L2 merge
  // writes: filled with a byte pattern before a run, compared after it.
  size_t PartialsOffset() const { return GemmTailCounterBytes(c.heads) + GemmTailLlBytes(c.heads); }
  void MarkPartials() const {
    EXPECT_EQ(cudaMemset(static_cast<char*>(work->get()) + PartialsOffset(), 0x5a,
                         GemmTailAttentionWorkspaceBytes(c.heads) - PartialsOffset()),
              cudaSuccess);
  }
  bool PartialsUntouched() const {
    const auto bytes = work->Download<uint8_t>();
    return std::all_of(bytes.begin() + PartialsOffset(), bytes.end(),
                       [](uint8_t b) { return b == 0x5a; });
  }

  // The checks of one tail run that wrote C = `qkv` and `out`: C against `want_qkv` (the same
  // GEMM without the tail), the caches (unless a later run has rewritten the newest row), and the
  // attention against PagedAttentionCpu over the caches as this run left them.
  void Check(const DeviceMem& qkv, const DeviceMem& out, const std::vector<uint16_t>& want_qkv,
             const char* how, bool check_caches = true) const {
    constexpr int D = kGemmTailHeadDim;
    const auto got_qkv = qkv.Download<uint16_t>();
    ASSERT_EQ(got_qkv, want_qkv) << how << ": C differs from the GEMM without the tail";
    const auto got_k = dk->Download<uint16_t>(), got_v = dv->Download<uint16_t>();
    std::vector<uint16_t> want_k = kc, want_v = vc;
    for (int64_t j = 0; j < kv_width; ++j) {
      want_k[slot * kv_width + j] = got_qkv[c.heads * D + j];
      want_v[slot * kv_width + j] = got_qkv[c.heads * D + kv_width + j];
    }
    if (check_caches) {
      ASSERT_EQ(got_k, want_k) << how << ": key cache";
      ASSERT_EQ(got_v, want_v) << how << ": value cache";
    }

    const std::vector<float> q = Widen(got_qkv, t), fk = Widen(want_k, t), fv = Widen(want_v, t);
    const std::vector<int32_t> query_start = {0, 1}, ctx = {c.ctx};
    std::vector<float> want(int64_t{c.heads} * D);
    PagedAttentionParams ap;
    ap.query = q.data();
    ap.query_stride = n;
    ap.output = want.data();
    ap.key_cache = fk.data();
    ap.value_cache = fv.data();
    ap.block_tables = table.data();
    ap.query_start = query_start.data();
    ap.context_lens = ctx.data();
    ap.num_seqs = 1;
    ap.num_tokens = 1;
    ap.num_heads = c.heads;
    ap.num_kv_heads = c.kv_heads;
    ap.head_dim = D;
    ap.block_size = c.block_size;
    ap.max_blocks_per_seq = static_cast<int>(table.size());
    ap.max_context_len = c.max_context;
    ap.max_query_len = 1;
    ap.scale = 1.0f / std::sqrt(float(D));
    ap.dtype = DType::kF32;
    ASSERT_TRUE(PagedAttentionCpu(ap).ok());
    EXPECT_LT(RelError(Widen(out.Download<uint16_t>(), t), want), 1e-2)
        << how << ": heads " << c.heads << "/" << c.kv_heads << " k " << c.k << " block "
        << c.block_size << " ctx " << c.ctx << " max " << c.max_context;
  }
};

constexpr TailCase kCases[] = {
    // SantaCoder's shape (16 heads, one KV head, E 2048) at a 256-token graph bucket: 4 splits.
    {16, 1, 2048, 16, 1, 256},   {16, 1, 2048, 16, 2, 256},   {16, 1, 2048, 16, 63, 256},
    {16, 1, 2048, 16, 64, 256},  {16, 1, 2048, 16, 65, 256},  {16, 1, 2048, 16, 200, 256},
    {16, 1, 2048, 16, 256, 256}, {16, 1, 2048, 32, 300, 512},  // 8 splits: 128 CTAs
    {4, 2, 512, 8, 77, 128},                                   // grouped heads, block 8
    {2, 1, 256, 16, 40, 40},     // one split: the output written directly
    {8, 1, 1024, 64, 129, 192},  // a block of 64, three splits, the last one short
    {2, 1, 256, 16, 700, 1024},  // 16 splits: the merge folds two batches of 8
};

// With cluster_merge, the heads of 2-8 splits merge in a cluster (the partials in the workspace
// are never written; GEMM CTAs padded where their count is not a multiple of the splits: the
// 1280-column case at three splits); one split or sixteen take the other paths.
TEST_P(GemmTailAttentionTest, MatchesGemmAndPagedAttentionCpu) {
  const DType t = std::get<0>(GetParam());
  const bool cluster = std::get<3>(GetParam());
  auto gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  int projections = 0;
  for (const TailCase& c : kCases) {
    TailOperands op(c, t, cluster, rng_, stream_);
    DeviceMem got_c(op.n * 2), out(op.out_bytes());
    // The GEMM without the tail first (it writes the same cache row: the tail run rewrites it).
    GemmParams p = op.p;
    const auto want_qkv = op.PlainQkv(*gemm, stream_);
    for (const bool proj : {false, true}) {
      got_c.Poison();
      out.Poison();
      op.MarkPartials();
      p.c = got_c.get();
      const absl::Status st =
          gemm->Run(p, op.WithTail(out.get(), proj ? op.a->get() : nullptr), stream_);
      if (proj && absl::IsUnimplemented(st)) {
        // Refused only where the launch may not be resident at once (3 CTAs an SM at most).
        EXPECT_GT(op.LaunchCtas(), 2 * sms_) << st;
        continue;
      }
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const char* how = proj ? "eager, with the projection" : "eager";
      ASSERT_NO_FATAL_FAILURE(op.Check(got_c, out, want_qkv, how));
      const bool in_cluster = op.InCluster();
      if (op.splits() > 1) {
        EXPECT_EQ(op.PartialsUntouched(), in_cluster)
            << op.splits() << " splits: " << (in_cluster ? "the cluster merge" : "the L2 merge")
            << " expected";
      }
      if (proj) {
        ++projections;
        ASSERT_NO_FATAL_FAILURE(op.CheckProj(*gemm, out, *op.a, how, stream_));
        ASSERT_NO_FATAL_FAILURE(op.ResetRow(*op.a));
      } else {
        EXPECT_EQ(op.a->Download<uint16_t>(), op.a0) << "A written without the projection";
      }
    }
  }
  EXPECT_GE(projections, 10) << "the projection ran in too few cases";
}

// Three launches back to back on one workspace (no synchronisation between them), with the
// projection, without, and with it again, then the same captured in a CUDA graph, twice (a fresh
// capture each round: the second replays a new graph on the workspace the first graph's launches
// left): every launch must find its counters zeroed, and each projection waits for its own
// launch's heads (the words a head's output sets carry the launch's epoch) and adds into its own
// row.
TEST_P(GemmTailAttentionTest, BackToBackAndInGraphs) {
  const DType t = std::get<0>(GetParam());
  auto gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  TailOperands op({16, 1, 2048, 16, 150, 256}, t, std::get<3>(GetParam()), rng_, stream_);
  DeviceMem c1(op.n * 2), c2(op.n * 2), c3(op.n * 2);
  DeviceMem out1(op.out_bytes()), out2(op.out_bytes()), out3(op.out_bytes());
  DeviceMem h1(op.c.k * 2), h3(op.c.k * 2);
  const auto want_qkv = op.PlainQkv(*gemm, stream_);
  auto enqueue = [&](cudaStream_t s) -> absl::Status {
    GemmParams q = op.p;
    q.c = c1.get();
    RETURN_IF_ERROR(gemm->Run(q, op.WithTail(out1.get(), h1.get()), s));
    q.c = c2.get();
    RETURN_IF_ERROR(gemm->Run(q, op.WithTail(out2.get()), s));
    q.c = c3.get();
    return gemm->Run(q, op.WithTail(out3.get(), h3.get()), s);
  };
  for (int round = 0; round < 3; ++round) {
    for (DeviceMem* m : {&c1, &c2, &c3, &out1, &out2, &out3}) m->Poison();
    for (const DeviceMem* h : {&h1, &h3}) ASSERT_NO_FATAL_FAILURE(op.ResetRow(*h));
    if (round == 0) {
      ASSERT_TRUE(enqueue(stream_).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    } else {
      ASSERT_NO_FATAL_FAILURE(testing::RunInGraph(stream_, enqueue));
    }
    const char* how = round == 0 ? "back to back" : "graph";
    ASSERT_NO_FATAL_FAILURE(op.Check(c1, out1, want_qkv, how));
    ASSERT_NO_FATAL_FAILURE(op.Check(c2, out2, want_qkv, how));
    ASSERT_NO_FATAL_FAILURE(op.Check(c3, out3, want_qkv, how));
    ASSERT_NO_FATAL_FAILURE(op.CheckProj(*gemm, out1, h1, how, stream_));
    ASSERT_NO_FATAL_FAILURE(op.CheckProj(*gemm, out3, h3, how, stream_));
    EXPECT_EQ(op.a->Download<uint16_t>(), op.a0) << how << ": A written";
  }
}

// GemmTailAttention::stamps (mqabench --tail-timeline) leaves the outputs as they are; every CTA
// of the launch records its kind and its events, in order: a GEMM CTA start, PDL wait, dot
// products (a CTA with columns), end; an attention CTA start, PDL wait, K / V in, count-in, q in,
// scores, warps merged, end (the splits merged only where the head has several splits).
TEST_P(GemmTailAttentionTest, StampsKeepOutputsAndComeInOrder) {
  const DType t = std::get<0>(GetParam());
  auto gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  TailOperands op({16, 1, 2048, 16, 150, 256}, t, std::get<3>(GetParam()), rng_, stream_);
  DeviceMem got_c(op.n * 2), out(op.out_bytes());
  GemmParams p = op.p;
  const auto want_qkv = op.PlainQkv(*gemm, stream_);
  constexpr int kMaxCtas = 1024;
  constexpr int64_t kStampBytes = int64_t{kMaxCtas} * kGemmTailStampWords * 8;
  DeviceMem stamps(kStampBytes);
  ASSERT_EQ(cudaMemset(stamps.get(), 0, kStampBytes), cudaSuccess);
  got_c.Poison();
  out.Poison();
  GemmEpilogue e = op.WithTail(out.get());
  e.tail.stamps = stamps.get<unsigned long long>();
  p.c = got_c.get();
  ASSERT_TRUE(gemm->Run(p, e, stream_).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(op.Check(got_c, out, want_qkv, "stamped"));
  const auto w = stamps.Download<unsigned long long>();
  int counts[3] = {0, 0, 0};
  for (int cta = 0; cta < kMaxCtas; ++cta) {
    const unsigned long long* s = &w[static_cast<size_t>(cta) * kGemmTailStampWords];
    if (s[kTailStampKind] == 0) continue;
    ASSERT_TRUE(s[kTailStampKind] == 1 || s[kTailStampKind] == 2) << "CTA " << cta;
    const bool gemm_cta = s[kTailStampKind] == 1;
    ++counts[s[kTailStampKind]];
    std::vector<int> events = {kTailStampStart, kTailStampPdlDone};
    if (gemm_cta) {
      // A CTA that pads the grid to whole clusters has no columns: no dot products.
      if (s[kTailStampDot] != 0) events.push_back(kTailStampDot);
      events.push_back(kTailStampEnd);
    } else {
      events.insert(events.end(), {kTailStampKvIn, kTailStampWordsIn, kTailStampScores,
                                   kTailStampPartial, kTailStampEnd});
    }
    for (size_t i = 0; i < events.size(); ++i) {
      EXPECT_NE(s[events[i]], 0u) << "CTA " << cta << " event " << events[i];
      if (i > 0)
        EXPECT_LE(s[events[i - 1]], s[events[i]]) << "CTA " << cta << " event " << events[i];
    }
  }
  EXPECT_EQ(counts[2], 16 * op.splits());
  EXPECT_GT(counts[1], 0);
}

// The LL words' flag is the epoch plus one, 16 bits: started two launches before it wraps, with
// every word stale (the previous launch's flag over a value that is not C's), launches of two
// different inputs in turn, synchronised and then back to back in a graph, each take only their
// own words. Taking a stale word would give the wrong attention (or, with the flag ignored, the
// first launch would read the stale value).
TEST_P(GemmTailAttentionTest, FlagsWrapAndStaleWordsAreNotTaken) {
  const DType t = std::get<0>(GetParam());
  auto gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  TailOperands op({16, 1, 2048, 16, 150, 256}, t, std::get<3>(GetParam()), rng_, stream_);
  std::vector<float> fa;
  const auto a2 = DeviceMem::From(RandomRounded(fa, op.c.k, t, rng_, 2.0f, 1.0f));
  const void* inputs[2] = {op.a->get(), a2->get()};
  constexpr uint32_t kStartEpoch = 0xfffe;
  ASSERT_EQ(cudaMemcpy(op.work->get(), &kStartEpoch, 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint32_t> stale(GemmTailLlBytes(op.c.heads) / 4, (kStartEpoch << 16) | 0x3c00u);
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(op.work->get()) + GemmTailCounterBytes(op.c.heads),
                       stale.data(), stale.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  std::vector<uint16_t> want[2];
  DeviceMem c0(op.n * 2), c1(op.n * 2);
  DeviceMem out0(op.out_bytes()), out1(op.out_bytes());
  for (int i = 0; i < 2; ++i) {
    GemmParams p = op.p;
    p.a = inputs[i];
    p.c = c0.get();
    ASSERT_TRUE(gemm->Run(p, op.e, stream_).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    want[i] = c0.Download<uint16_t>();
  }
  // Epochs 0xfffe, 0xffff, 0x10000 (flags 0xffff, 0, 1), each launch checked before the next.
  for (int launch = 0; launch < 3; ++launch) {
    const int i = launch % 2;
    c0.Poison();
    out0.Poison();
    GemmParams p = op.p;
    p.a = inputs[i];
    p.c = c0.get();
    ASSERT_TRUE(gemm->Run(p, op.WithTail(out0.get()), stream_).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(op.Check(c0, out0, want[i], "synchronised"));
  }
  // Then the second input and the first back to back in a graph, twice.
  for (int round = 0; round < 2; ++round) {
    c0.Poison();
    c1.Poison();
    out0.Poison();
    out1.Poison();
    ASSERT_NO_FATAL_FAILURE(testing::RunInGraph(stream_, [&](cudaStream_t s) -> absl::Status {
      GemmParams p = op.p;
      p.a = inputs[1];
      p.c = c1.get();
      RETURN_IF_ERROR(gemm->Run(p, op.WithTail(out1.get()), s));
      p.a = inputs[0];
      p.c = c0.get();
      return gemm->Run(p, op.WithTail(out0.get()), s);
    }));
    ASSERT_NO_FATAL_FAILURE(op.Check(c1, out1, want[1], "graph, first launch", false));
    ASSERT_NO_FATAL_FAILURE(op.Check(c0, out0, want[0], "graph, second launch"));
  }
  uint32_t epoch = 0;
  ASSERT_EQ(cudaMemcpy(&epoch, op.work->get(), 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(epoch, kStartEpoch + 7) << "one epoch a launch";
}

// What the tail does not take is refused before anything runs (Unimplemented, or
// InvalidArgument for a tail that cannot be meant), and C is left untouched.
TEST_P(GemmTailAttentionTest, RefusesWhatItCannotDo) {
  const DType t = std::get<0>(GetParam());
  auto gemm = MakeGemm();
  ASSERT_NE(gemm, nullptr);
  TailOperands op({16, 1, 2048, 16, 100, 256}, t, std::get<3>(GetParam()), rng_, stream_);
  DeviceMem c(op.n * 2), out(op.out_bytes());
  GemmParams p = op.p;
  p.c = c.get();
  auto refused = [&](const GemmParams& gp, const GemmEpilogue& e, bool invalid, const char* why) {
    c.Poison();
    const absl::Status st = gemm->Run(gp, e, stream_);
    EXPECT_TRUE(invalid ? absl::IsInvalidArgument(st) : absl::IsUnimplemented(st))
        << why << ": " << st;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const auto bits = c.Download<uint16_t>();
    EXPECT_TRUE(std::all_of(bits.begin(), bits.end(), [](uint16_t b) { return b == 0xffff; }))
        << why << ": C was written";
  };
  GemmEpilogue e = op.WithTail(out.get());
  e.tail.max_context = 1024;  // 16 heads x 16 splits > kGemmTailMaxCtas
  refused(p, e, false, "too many splits");
  e = op.WithTail(out.get());
  e.tail.head_dim = 64;
  refused(p, e, false, "head_dim 64");
  e = op.WithTail(out.get());
  e.key_cache = nullptr;
  refused(p, e, false, "no fused KV write");
  e = op.WithTail(out.get());
  e.tail.block_size = 24;
  refused(p, e, true, "block size not a power of two");
  e = op.WithTail(out.get());
  e.tail.workspace = nullptr;
  refused(p, e, true, "no workspace");
  e = op.WithTail(out.get(), op.a->get());
  e.tail.proj_n = static_cast<int>(op.n) + 8;  // more rows than C's columns
  refused(p, e, false, "a projection wider than C");
  e = op.WithTail(out.get(), op.a->get());
  e.tail.hidden = nullptr;
  refused(p, e, false, "a projection without its row");
  EXPECT_EQ(op.a->Download<uint16_t>(), op.a0) << "A written by a refused projection";
  auto shallow = MakeGemm(/*deep=*/false);
  ASSERT_NE(shallow, nullptr);
  c.Poison();
  EXPECT_TRUE(absl::IsUnimplemented(shallow->Run(p, op.WithTail(out.get()), stream_)))
      << "without the deep unroll";
}

INSTANTIATE_TEST_SUITE_P(All, GemmTailAttentionTest,
                         ::testing::Values(std::make_tuple(DType::kF16, true, true, false),
                                           std::make_tuple(DType::kF16, false, false, false),
                                           std::make_tuple(DType::kF16, true, false, false),
                                           std::make_tuple(DType::kBF16, false, true, false),
                                           std::make_tuple(DType::kF16, true, true, true),
                                           std::make_tuple(DType::kBF16, false, false, true)));

}  // namespace
}  // namespace mqa
