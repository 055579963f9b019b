// Paged attention benchmark: the MQA kernel against the per-head (2023) baseline on decode
// batches, and causal prefill TFLOP/s, each beside the ceilings measured in the same run (a
// large device-to-device copy, read + write bytes; a cuBLAS bf16 8192^3 GEMM on random data).
// The KV pool rotates among several sets of block tables so that timed data is not L2-resident.
// The last table compares the decode-path variants (PagedAttentionTuning::variant) side by side;
// `attention_bench --variants-only` prints only that table.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <cstring>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "kernels/paged_attention_cuda.h"

namespace mqa {
namespace {

using bench::Fill;

// Median over `reps` of the mean time (µs) of `iters` calls of fn(i).
template <typename F>
double TimeUs(F&& fn, int reps, int iters) {
  bench::Events ev;
  for (int i = 0; i < 3; ++i) fn(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(ev.a));
    for (int i = 0; i < iters; ++i) fn(r * iters + i);
    CHECK_CUDA(cudaEventRecord(ev.b));
    t.push_back(1000.0 * ev.Ms() / iters);
  }
  CHECK_CUDA(cudaGetLastError());
  return bench::Median(t);
}

// Same, but the `iters` calls are captured once into a CUDA graph and the graph is replayed.
template <typename F>
double TimeGraphUs(F&& fn, int reps, int iters) {
  bench::Stream s;
  return bench::TimeGraphUs(s.s, iters, /*warmups=*/1, reps, fn);
}

double CopyCeilingGBs() {
  const size_t bytes = size_t{2} << 30;
  bench::DeviceBuffer src(bytes), dst(bytes);
  Fill<__half>(src.ptr, bytes / 2, 1);
  const double us = TimeUs(
      [&](int) { cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice); }, 7, 3);
  return 2.0 * bytes / (us * 1e3);
}

// The copy ceiling at the attention call's own size: a device-to-device copy moving the same
// traffic (bytes / 2 read + bytes / 2 written), timed as the attention is (a graph of 20), source
// and destination rotating through 1 GiB so that consecutive copies miss L2 as the attention's
// rotating block tables do. Launch and ramp latency are in it, as in the attention's time: at
// small sizes this, not the large-copy bandwidth, is what a kernel can reach.
double SameTrafficCopyUs(double bytes) {
  const size_t pool = size_t{1} << 30;
  const size_t half = (static_cast<size_t>(bytes / 2) + 255) & ~size_t{255};
  static bench::DeviceBuffer buf(pool);
  const size_t slots = std::max<size_t>(1, pool / (2 * half));
  char* base = static_cast<char*>(buf.ptr);
  auto call = [&](int i, cudaStream_t s) {
    char* src = base + (i % slots) * 2 * half;
    CHECK_CUDA(cudaMemcpyAsync(src + half, src, half, cudaMemcpyDeviceToDevice, s));
  };
  return TimeGraphUs(call, 9, 20);
}

// Reads every KV block of the batch through its block table (K and V, 16-byte streaming loads;
// one CTA per (sequence, range of blocks)), folding the bytes into one word: what any kernel
// that reads this paged cache once can reach, without attention's math, Q or output.
__global__ void __launch_bounds__(256) PagedReadKernel(const uint4* k, const uint4* v,
                                                       const int32_t* tables, int blocks_per_seq,
                                                       int chunks, int block_vecs,
                                                       unsigned* sink) {
  const int seq = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int per = (blocks_per_seq + chunks - 1) / chunks;
  const int b0 = chunk * per, b1 = min(blocks_per_seq, b0 + per);
  unsigned acc = 0;
#pragma unroll 4
  for (int b = b0; b < b1; ++b) {
    const int64_t base = static_cast<int64_t>(tables[seq * blocks_per_seq + b]) * block_vecs;
    for (int i = threadIdx.x; i < block_vecs; i += blockDim.x) {
      const uint4 x = __ldcs(k + base + i), y = __ldcs(v + base + i);
      acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never stores
}

double GemmCeilingTflops() {
  const int n = 8192;
  void *a, *b, *c;
  const size_t bytes = size_t{n} * n * 2;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMalloc(&c, bytes));
  Fill<__nv_bfloat16>(a, size_t{n} * n, 2);
  Fill<__nv_bfloat16>(b, size_t{n} * n, 3);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const float alpha = 1.0f, beta = 0.0f;
  const double us = TimeUs(
      [&](int) {
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                     CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      },
      7, 3);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * double(n) / (us * 1e6);
}

template <typename T>
void* DeviceCopy(const std::vector<T>& v) {
  void* d;
  CHECK_CUDA(cudaMalloc(&d, v.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// A batch of `batch` sequences of equal context, `sets` independent block-table sets over one
// pool (so consecutive timed calls read different memory).
struct Workload {
  PagedAttentionParams p;
  std::vector<int32_t*> tables;  // device, one per set
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int32_t* head_mapping = nullptr;
  double kv_bytes = 0;
  double io_bytes = 0;  // q + out
  double flops = 0;
  std::vector<void*> owned;
};

Workload MakeWorkload(DType dtype, int batch, int ctx, int q_len, int heads, int d, int bs,
                      std::mt19937& rng) {
  Workload w;
  const int blocks_per_seq = (ctx + bs - 1) / bs;
  const double kv_bytes = 2.0 * batch * ctx * d * 2;
  const int sets = static_cast<int>(std::clamp(std::ceil(400e6 / kv_bytes), 1.0, 64.0));
  const int64_t pool_blocks = int64_t{sets} * batch * blocks_per_seq;
  const size_t cache_elems = pool_blocks * bs * d;
  void *kc, *vc;
  CHECK_CUDA(cudaMalloc(&kc, cache_elems * 2));
  CHECK_CUDA(cudaMalloc(&vc, cache_elems * 2));
  Fill(dtype, kc, cache_elems, 11);
  Fill(dtype, vc, cache_elems, 12);
  std::vector<int32_t> perm(pool_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int s = 0; s < sets; ++s) {
    std::vector<int32_t> t(perm.begin() + int64_t{s} * batch * blocks_per_seq,
                           perm.begin() + int64_t{s + 1} * batch * blocks_per_seq);
    w.tables.push_back(static_cast<int32_t*>(DeviceCopy(t)));
  }
  const int tokens = batch * q_len;
  std::vector<int32_t> qs(batch + 1), cl(batch, ctx), map(heads, 0);
  for (int i = 0; i <= batch; ++i) qs[i] = i * q_len;
  void *q, *o;
  CHECK_CUDA(cudaMalloc(&q, static_cast<size_t>(tokens) * heads * d * 2));
  CHECK_CUDA(cudaMalloc(&o, static_cast<size_t>(tokens) * heads * d * 2));
  Fill(dtype, q, static_cast<size_t>(tokens) * heads * d, 13);
  PagedAttentionParams& p = w.p;
  p.query = q;
  p.query_stride = int64_t{heads} * d;
  p.output = o;
  p.key_cache = kc;
  p.value_cache = vc;
  p.block_tables = w.tables[0];
  p.query_start = static_cast<int32_t*>(DeviceCopy(qs));
  p.context_lens = static_cast<int32_t*>(DeviceCopy(cl));
  p.num_seqs = batch;
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.num_kv_heads = 1;
  p.head_dim = d;
  p.block_size = bs;
  p.max_blocks_per_seq = blocks_per_seq;
  p.max_context_len = ctx;
  p.max_query_len = q_len;
  p.scale = 1.0f / std::sqrt(float(d));
  p.dtype = dtype;
  w.head_mapping = static_cast<int32_t*>(DeviceCopy(map));
  w.owned = {kc,
             vc,
             q,
             o,
             const_cast<int32_t*>(p.query_start),
             const_cast<int32_t*>(p.context_lens),
             w.head_mapping};
  w.kv_bytes = kv_bytes;
  w.io_bytes = 2.0 * tokens * heads * d * 2;
  double pairs = 0;  // (query, key) pairs attended
  for (int j = 0; j < q_len; ++j) pairs += ctx - q_len + j + 1;
  w.flops = 4.0 * d * heads * pairs * batch;
  return w;
}

void Free(Workload& w) {
  for (void* p : w.owned) cudaFree(p);
  for (int32_t* t : w.tables) cudaFree(t);
  if (w.workspace) cudaFree(w.workspace);
}

double TimeMqa(Workload& w, const PagedAttentionTuning& tuning, bool graph) {
  w.workspace_bytes = PagedAttentionCudaWorkspaceBytes(w.p, tuning);
  if (w.workspace) cudaFree(w.workspace);
  w.workspace = nullptr;
  if (w.workspace_bytes) {
    CHECK_CUDA(cudaMalloc(&w.workspace, w.workspace_bytes));
    CHECK_CUDA(cudaMemset(w.workspace, 0, w.workspace_bytes));  // variant 2's counters
  }
  const int sets = static_cast<int>(w.tables.size());
  auto call = [&](int i, cudaStream_t s) {
    PagedAttentionParams p = w.p;
    p.block_tables = w.tables[i % sets];
    CHECK_OK(PagedAttentionCuda(p, s, w.workspace, w.workspace_bytes, tuning));
  };
  const int iters = 20;
  if (graph) return TimeGraphUs(call, 9, iters);
  return TimeUs([&](int i) { call(i, nullptr); }, 9, iters);
}

// One call on a stream and one captured into a graph, reporting instead of exiting, so that a
// variant the driver refuses (e.g. a cooperative launch in a graph) costs its column, not the run.
bool VariantWorks(Workload& w, const PagedAttentionTuning& tuning) {
  const size_t bytes = PagedAttentionCudaWorkspaceBytes(w.p, tuning);
  void* ws = nullptr;
  if (bytes) {
    CHECK_CUDA(cudaMalloc(&ws, bytes));
    CHECK_CUDA(cudaMemset(ws, 0, bytes));
  }
  bool ok = PagedAttentionCuda(w.p, nullptr, ws, bytes, tuning).ok() &&
            cudaDeviceSynchronize() == cudaSuccess;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  if (ok && cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const bool launched = PagedAttentionCuda(w.p, s, ws, bytes, tuning).ok();
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && launched;
    cudaGraphExec_t exec = nullptr;
    ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
         cudaGraphLaunch(exec, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  } else {
    ok = false;
  }
  cudaStreamDestroy(s);
  if (ws) cudaFree(ws);
  (void)cudaGetLastError();
  if (!ok) std::printf("variant %d: launch or graph capture failed; column left blank\n",
                       tuning.variant);
  return ok;
}

// The paged read ceiling for the workload's KV (PagedReadKernel), timed as the attention is (a
// graph of 20, the block tables rotating).
double PagedReadUs(Workload& w) {
  const int sets = static_cast<int>(w.tables.size());
  const int bpc = w.p.max_blocks_per_seq;
  const int block_vecs = w.p.block_size * w.p.num_kv_heads * w.p.head_dim * 2 / 16;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int want = 8 * sms;  // eight 256-thread CTAs an SM
  const int chunks = std::clamp((want + w.p.num_seqs - 1) / w.p.num_seqs, 1, bpc);
  static bench::DeviceBuffer sink(256);
  auto call = [&](int i, cudaStream_t s) {
    PagedReadKernel<<<w.p.num_seqs * chunks, 256, 0, s>>>(
        static_cast<const uint4*>(w.p.key_cache), static_cast<const uint4*>(w.p.value_cache),
        w.tables[i % sets], bpc, chunks, block_vecs, static_cast<unsigned*>(sink.ptr));
  };
  return TimeGraphUs(call, 9, 20);
}

double TimeBaseline(Workload& w) {
  const int sets = static_cast<int>(w.tables.size());
  return TimeUs(
      [&](int i) {
        PagedAttentionParams p = w.p;
        p.block_tables = w.tables[i % sets];
        CHECK_OK(PagedAttentionPerHeadBaselineCuda(p, w.head_mapping, nullptr));
      },
      5, 5);
}

// The decode variants side by side on the integrator's configurations, printed last (the GPU
// run's log shows only its tail): per variant graph and stream time, GB/s and % of the copy
// ceiling of this run, beside the per-head baseline.
void VariantTable(double copy_gbs, std::mt19937& rng) {
  // The last two: the model's decode steps of mqabench latency (StarCoder batch 1 at 128 + 64
  // tokens, batch 32 at 512 + 64).
  const int configs[][2] = {{64, 2048},  {1, 8192},   {8, 4096}, {32, 2048},
                            {256, 1024}, {64, 8192},  {1, 192},  {32, 576}};
  struct Row {
    int batch, ctx, splits;
    double base;
    double graph[kNumPagedAttentionVariants], strm[kNumPagedAttentionVariants];
    double gbs[kNumPagedAttentionVariants];
  };
  std::vector<Row> rows;
  for (const auto& c : configs) {
    Workload w = MakeWorkload(DType::kF16, c[0], c[1], 1, 48, 128, 16, rng);
    Row r{c[0], c[1], 1, TimeBaseline(w), {}, {}, {}};
    for (int v = 0; v < kNumPagedAttentionVariants; ++v) {
      PagedAttentionTuning t;
      t.variant = v;
      if (!VariantWorks(w, t)) {
        r.graph[v] = r.strm[v] = INFINITY;
        r.gbs[v] = 0;
        continue;
      }
      r.graph[v] = TimeMqa(w, t, true);
      r.strm[v] = TimeMqa(w, t, false);
      r.gbs[v] = (w.kv_bytes + w.io_bytes) / (r.graph[v] * 1e3);
      if (v == 0) {
        const size_t per_split =
            static_cast<size_t>(w.p.num_tokens) * w.p.num_heads * (w.p.head_dim + 1) * 4;
        r.splits = w.workspace_bytes ? int(w.workspace_bytes / per_split) : 1;
      }
    }
    rows.push_back(r);
    Free(w);
  }
  std::printf(
      "\n== decode variants: 48 q-heads / 1 KV head, D=128, block 16, fp16; copy ceiling %.0f GB/s "
      "(this run); us = graph (stream); GB/s and %%copy from graph time ==\n",
      copy_gbs);
  std::printf("%-11s %3s %9s", "batch x ctx", "spl", "perhead");
  for (int v = 0; v < kNumPagedAttentionVariants; ++v) {
    std::printf(" | %-29s", (std::to_string(v) + ":" + PagedAttentionVariantName(v)).c_str());
  }
  std::printf(" | best\n");
  for (const Row& r : rows) {
    std::printf("%4d x %-4d %3d %9.1f", r.batch, r.ctx, r.splits, r.base);
    int best = 0;
    for (int v = 0; v < kNumPagedAttentionVariants; ++v) {
      std::printf(" | %6.2f (%6.2f) %5.0f %5.1f%%", r.graph[v], r.strm[v], r.gbs[v],
                  100 * r.gbs[v] / copy_gbs);
      if (r.graph[v] < r.graph[best]) best = v;
    }
    std::printf(" | %d %.2fx v0, %.0fx perhead\n", best, r.graph[0] / r.graph[best],
                r.base / r.graph[best]);
  }
}

int Main(bool variants_only) {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  const double copy_gbs = CopyCeilingGBs();
  if (variants_only) {
    std::mt19937 rng(42);
    VariantTable(copy_gbs, rng);
    return 0;
  }
  const double gemm_tflops = GemmCeilingTflops();
  std::printf(
      "ceilings: device-to-device copy %.0f GB/s (read+write), cuBLAS bf16 8192^3 GEMM "
      "%.0f TFLOP/s\n\n",
      copy_gbs, gemm_tflops);
  std::mt19937 rng(42);

  std::printf(
      "decode (variant %d, the default): 48 query heads / 1 KV head, D=128, block 16, fp16; "
      "times in us, "
      "GB/s = (KV + q + out bytes) / graph time; copy(same): a copy moving the same bytes, "
      "graph time, and the attention's time as a %% of it; read(paged): a kernel that only "
      "reads the same KV through the block tables, and the attention's time as a %% of it; "
      "v14: variant 14 (the default before 2026-12-04: the CTA merge), graph time and %% of copy; "
      "pdl: the default launched as the model launches it (a programmatic dependent of the "
      "previous call's merge: its prologue overlaps that kernel), graph time and %% of copy; "
      "v17: variant 17 (the default before 2026-12-04 ~18:20 UTC: no pair), graph time and %% of "
      "copy\n",
      PagedAttentionTuning{}.variant);
  std::printf("%-12s %6s %10s %10s %8s %7s %10s %6s %11s %7s %12s %8s %9s %7s %9s %7s %9s %7s\n",
              "batch x ctx", "splits", "mqa(graph)", "mqa(strm)", "GB/s", "%copy", "copy(same)",
              "%same", "read(paged)", "%paged", "per-head", "speedup", "v14", "%copy", "pdl",
              "%copy", "v17", "%copy");
  const int configs[][2] = {{1, 8192},   {1, 2048},  {8, 2048},  {16, 2048},
                            {32, 2048},  {64, 2048}, {64, 8192}, {128, 2048},
                            {256, 1024}, {128, 512}, {120, 1024}};
  for (const auto& c : configs) {
    Workload w = MakeWorkload(DType::kF16, c[0], c[1], 1, 48, 128, 16, rng);
    const double g = TimeMqa(w, {}, true);
    const double st = TimeMqa(w, {}, false);
    const double base = TimeBaseline(w);
    auto gbs_at = [&](double us) { return (w.kv_bytes + w.io_bytes) / (us * 1e3); };
    const double gbs = gbs_at(g);
    // The split count the launcher chose (workspace / bytes per split).
    const size_t per_split =
        static_cast<size_t>(w.p.num_tokens) * w.p.num_heads * (w.p.head_dim + 1) * 4;
    const int splits = w.workspace_bytes ? int(w.workspace_bytes / per_split) : 1;
    const double same = SameTrafficCopyUs(w.kv_bytes + w.io_bytes);
    const double paged = PagedReadUs(w);
    PagedAttentionTuning cta_merge;
    cta_merge.variant = 14;
    const double g14 = TimeMqa(w, cta_merge, true);
    PagedAttentionTuning pdl;
    pdl.pdl = true;
    const double gp = TimeMqa(w, pdl, true);
    PagedAttentionTuning no_pair;
    no_pair.variant = 17;
    const double g17 = TimeMqa(w, no_pair, true);
    std::printf(
        "%4d x %-5d %6d %10.2f %10.2f %8.0f %6.1f%% %10.2f %5.1f%% %11.2f %6.1f%% %12.2f "
        "%7.1fx %9.2f %6.1f%% %9.2f %6.1f%% %9.2f %6.1f%%\n",
        c[0], c[1], splits, g, st, gbs, 100 * gbs / copy_gbs, same, 100 * same / g, paged,
        100 * paged / g, base, base / g, g14, 100 * gbs_at(g14) / copy_gbs, gp,
        100 * gbs_at(gp) / copy_gbs, g17, 100 * gbs_at(g17) / copy_gbs);
    Free(w);
  }

  // (The layout sweep is dropped: 3x2 won at every decode shape on the H200, 2026-12-02.)
  std::printf("\nsplit sweep (graph us; 0 = the launcher's choice):\n");
  for (const auto& c : {std::pair{1, 8192}, std::pair{64, 2048}, std::pair{1, 256},
                        std::pair{1, 1024}, std::pair{8, 2048}, std::pair{32, 640}}) {
    Workload w = MakeWorkload(DType::kF16, c.first, c.second, 1, 48, 128, 16, rng);
    std::printf("%d x %d:", c.first, c.second);
    for (int s : {0, 1, 2, 4, 8, 16, 32, 64, 128}) {
      if (s * 64 > c.second) continue;  // more splits than KV tiles
      PagedAttentionTuning t;
      t.num_splits = s;
      const double us = TimeMqa(w, t, true);
      std::printf("  %d:%.2f (%.0f GB/s)", s, us, (w.kv_bytes + w.io_bytes) / (us * 1e3));
    }
    std::printf("\n");
    Free(w);
  }

  {
    // Variant 5 merges in the kernel up to 32 splits: does the split cost come from the merge?
    Workload w = MakeWorkload(DType::kF16, 64, 2048, 1, 48, 128, 16, rng);
    std::printf("64 x 2048, variant 5 (in-kernel merge):");
    for (int s : {2, 4, 8, 16, 32}) {
      PagedAttentionTuning t;
      t.num_splits = s;
      t.variant = 5;
      const double us = TimeMqa(w, t, true);
      std::printf("  %d:%.2f (%.0f GB/s)", s, us, (w.kv_bytes + w.io_bytes) / (us * 1e3));
    }
    std::printf("\n");
    Free(w);
  }

  std::printf(
      "\nprefill (causal, 48 heads / 1 KV head, D=128, block 16), TFLOP/s beside the "
      "GEMM's %.0f:\n",
      gemm_tflops);
  struct Pre {
    DType dtype;
    int ctx, q_len;
  };
  for (const Pre& pc : {Pre{DType::kBF16, 4096, 4096}, Pre{DType::kF16, 4096, 4096},
                        Pre{DType::kBF16, 4096, 512}, Pre{DType::kBF16, 1024, 1024}}) {
    Workload w = MakeWorkload(pc.dtype, 1, pc.ctx, pc.q_len, 48, 128, 16, rng);
    for (int variant : {3, 11}) {  // the mma.sync kernel; the wgmma kernel (the model's default)
      PagedAttentionTuning t;
      t.variant = variant;
      const double us = TimeMqa(w, t, false);
      std::printf("%-9s q %5d ctx %5d variant %2d: %9.1f us  %6.1f TFLOP/s (%.0f%% of GEMM)\n",
                  std::string(DTypeName(pc.dtype)).c_str(), pc.q_len, pc.ctx, variant, us,
                  w.flops / (us * 1e6), 100 * w.flops / (us * 1e6) / gemm_tflops);
    }
    Free(w);
  }
  VariantTable(copy_gbs, rng);
  return 0;
}

}  // namespace

int ProfileOne(int batch, int ctx, int variant, int splits, int q_len) {
  std::mt19937 rng(42);
  Workload w = MakeWorkload(DType::kF16, batch, ctx, q_len, 48, 128, 16, rng);
  PagedAttentionTuning t;
  t.variant = variant;
  t.num_splits = splits;
  // MQA_HOPPER_TN=32|64: variant 11's tokens a stage (PagedAttentionTuning::hopper_tile_tokens).
  if (const char* tn = std::getenv("MQA_HOPPER_TN")) t.hopper_tile_tokens = std::atoi(tn);
  // MQA_HOPPER_WG=1|2: its warpgroups a CTA (PagedAttentionTuning::hopper_warpgroups).
  if (const char* wg = std::getenv("MQA_HOPPER_WG")) t.hopper_warpgroups = std::atoi(wg);
  // MQA_HOPPER_TMA_CTAS=2|3: variant 13's CTAs an SM (PagedAttentionTuning::hopper_tma_ctas).
  if (const char* c = std::getenv("MQA_HOPPER_TMA_CTAS")) t.hopper_tma_ctas = std::atoi(c);
  // MQA_TMA_PAIR=1: variant 18's pair forced (PagedAttentionTuning::tma_pair).
  if (const char* pr = std::getenv("MQA_TMA_PAIR")) t.tma_pair = std::atoi(pr) != 0;
  if (std::getenv("MQA_PROFILE_ONLY") == nullptr) {
    const double us = TimeMqa(w, t, true);
    std::printf("%d x %d (q_len %d) variant %d splits %d (hopper tile tokens %d, warpgroups %d): "
                "%.2f us (graph of 20), %.1f TFLOP/s\n",
                batch, ctx, q_len, variant, splits, t.hopper_tile_tokens, t.hopper_warpgroups, us,
                w.flops / (us * 1e6));
  } else {
    w.workspace_bytes = PagedAttentionCudaWorkspaceBytes(w.p, t);
    if (w.workspace_bytes) {
      CHECK_CUDA(cudaMalloc(&w.workspace, w.workspace_bytes));
      CHECK_CUDA(cudaMemset(w.workspace, 0, w.workspace_bytes));
    }
  }
  // Three plain launches: a profiler skips the first two.
  for (int i = 0; i < 3; ++i) {
    CHECK_OK(PagedAttentionCuda(w.p, nullptr, w.workspace, w.workspace_bytes, t));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  Free(w);
  return 0;
}

}  // namespace mqa

int main(int argc, char** argv) {
  // `--one BATCH CTX [VARIANT [SPLITS [Q_LEN]]]`: a few plain launches of one configuration and
  // nothing else, for a profiler (ncu) to look at.
  if (argc > 3 && std::strcmp(argv[1], "--one") == 0) {
    return mqa::ProfileOne(std::atoi(argv[2]), std::atoi(argv[3]), argc > 4 ? std::atoi(argv[4]) : 1,
                           argc > 5 ? std::atoi(argv[5]) : 0, argc > 6 ? std::atoi(argv[6]) : 1);
  }
  return mqa::Main(argc > 1 && std::strcmp(argv[1], "--variants-only") == 0);
}
