// Decode GEMM benchmark: CudaGemm's skinny kernel (m <= 8), its split-K variant
// (Options::skinny_split_k), each with and without PDL launch, and cuBLASLt, on the Linear shapes
// of StarCoder (E 6144, 40 layers) and SantaCoder (E 2048, 24 layers) at m = 1 and 8, and
// cuBLASLt alone at m = 32, fp16 (--dtype bfloat16 for bf16). Each time is one call of a CUDA
// graph of 20 calls that rotate over copies of the weight (together >= 256 MB, so the weights
// stream from HBM, not L2), median of 9 replays. TB/s counts the weight bytes only, beside the
// copy ceiling measured in the same run (cudaMemcpy D2D of 2 GiB, read + write). Per model and m:
// one decode step's GEMM time (layers x the four per-layer GEMMs + lm_head) against the weight
// bytes at the copy ceiling.
//
//   gemm_bench [--dtype float16|bfloat16] [--m 1,8,32] [--model starcoder|santacoder|both]
//              [--split-ctas N]   (split-K grid: N CTAs per SM; 0, the default: as many as fit)
//              [--chain only]     (instead: one layer's GEMMs as four skinny launches beside
//                                  the decode chain kernel, ChainSection below)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.cuh"
#include "benchmarks/chain_timeline.h"
#include "kernels/decode_chain_cuda.h"
#include "kernels/gemm_cuda.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using bench::DeviceBuffer;
using bench::Fill;

double CopyCeilingGBs() {
  return 2.0 * bench::kCopyCeilingBytes / (bench::CopyCeilingMs(nullptr) * 1e6);
}

constexpr int kCalls = 20;  // calls per graph
constexpr int kReplays = 9;

// Microseconds per call: `calls` of fn(i, stream) captured into a graph, median over replays.
// Negative when a call fails (its status is printed once).
template <typename F>
double TimeGraphUs(cudaStream_t s, F&& fn) {
  for (int i = 0; i < 2; ++i) {  // eager warm-up: plans, workspaces
    const absl::Status st = fn(i, s);
    if (!st.ok()) {
      std::fprintf(stderr, "  %s\n", st.ToString().c_str());
      return -1;
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(s));
  bool ok = true;
  cudaGraph_t graph =
      bench::CaptureGraph(s, kCalls, [&](int i, cudaStream_t st) { ok = ok && fn(i, st).ok(); });
  if (!ok) {
    cudaGraphDestroy(graph);
    return -1;
  }
  const double us = bench::ReplayGraphUs(s, graph, kCalls, /*warmups=*/1, kReplays);
  cudaGraphDestroy(graph);
  return us;
}

enum class Gemm { kCAttn, kAttnProj, kFc, kMlpProj, kLmHead };
constexpr Gemm kGemms[] = {Gemm::kCAttn, Gemm::kAttnProj, Gemm::kFc, Gemm::kMlpProj, Gemm::kLmHead};

const char* GemmName(Gemm g) {
  switch (g) {
    case Gemm::kCAttn:
      return "c_attn";
    case Gemm::kAttnProj:
      return "attn.c_proj";
    case Gemm::kFc:
      return "c_fc";
    case Gemm::kMlpProj:
      return "mlp.c_proj";
    case Gemm::kLmHead:
      return "lm_head";
  }
  return "?";
}

struct Model {
  const char* name;
  int64_t embed, layers, vocab, head_dim;
};
constexpr Model kModels[] = {{"starcoder", 6144, 40, 49152, 128},
                             {"santacoder", 2048, 24, 49152, 128}};

// n, k and the model's epilogue (bias; GELU-tanh on c_fc; the residual add on the projections).
struct Shape {
  int64_t n, k;
  bool bias, gelu, accumulate;
};
Shape ShapeOf(const Model& md, Gemm g) {
  const int64_t e = md.embed;
  switch (g) {
    case Gemm::kCAttn:
      return {e + 2 * md.head_dim, e, true, false, false};  // MQA: one K and one V head
    case Gemm::kAttnProj:
      return {e, e, true, false, true};
    case Gemm::kFc:
      return {4 * e, e, true, true, false};
    case Gemm::kMlpProj:
      return {e, 4 * e, true, false, true};
    case Gemm::kLmHead:
      return {md.vocab, e, false, false, false};
  }
  return {};
}

struct Variant {
  const char* name;
  bool skinny, split_k, pdl;
};
constexpr Variant kVariants[] = {{"skinny", true, false, false},
                                 {"skinny+pdl", true, false, true},
                                 {"split-K", true, true, false},
                                 {"split-K+pdl", true, true, true},
                                 {"cuBLASLt", false, false, false}};
constexpr int kNumVariants = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));

// One layer's GEMMs in the decode chain's phase order: attn.c_proj, c_fc, mlp.c_proj and the next
// layer's c_attn.
std::array<Shape, 4> ChainOrderShapes(const Model& md) {
  return {ShapeOf(md, Gemm::kAttnProj), ShapeOf(md, Gemm::kFc), ShapeOf(md, Gemm::kMlpProj),
          ShapeOf(md, Gemm::kCAttn)};
}

// A chain whose producer loads nothing (DecodeChainTuning::consume_only) with `stage_bytes` stages.
DecodeChainTuning ConsumeOnly(int stage_bytes) {
  DecodeChainTuning t;
  t.stage_bytes = stage_bytes;
  t.consume_only = true;
  return t;
}

// The automatic ring with every boundary a grid barrier (no LL inputs).
DecodeChainTuning BarriersOnly() {
  DecodeChainTuning t;
  t.ll_inputs = 0;
  return t;
}

// `t` with the fold DecodeChainTuning::mma_fold = `mma` (1: tiled, tensor cores; 0: row runs,
// fp32 on the CUDA cores).
DecodeChainTuning WithFold(DecodeChainTuning t, int mma) {
  t.mma_fold = mma;
  return t;
}

// `t` with the fp16-pair fold on or off (DecodeChainTuning::half_fold).
DecodeChainTuning HalfFold(DecodeChainTuning t, int on = 1) {
  t.half_fold = on;
  return t;
}

// `t` with the fused MLP (DecodeChainTuning::fused_mlp: mlp.c_proj from its transposed copy).
DecodeChainTuning Fused(DecodeChainTuning t) {
  t.fused_mlp = 1;
  return t;
}

// The ring's own cost: the producer loads nothing and the consumers fold nothing.
DecodeChainTuning NoLoadNoFold(int stage_bytes) {
  DecodeChainTuning t = ConsumeOnly(stage_bytes);
  t.stream_only = true;
  return t;
}

// Whether the SMs that stream a long phase slowly are the same ones from phase to phase and from
// call to call (timeline words of `calls` consecutive calls, kChainSmId included): if they are, a
// static share of rows weighted by SM would balance the phases without work stealing's tickets.
// Durations are a phase's first full stage to its last release, in the SM's clocks.
void PrintSmPersistence(const Model& md, const std::vector<unsigned long long>& h, size_t per_call,
                        int grid, int call) {
  auto word = [&](int c, int b, int e) {
    return h[static_cast<size_t>(c) * per_call +
             static_cast<size_t>(b) * kDecodeChainTimelineWords + e];
  };
  constexpr int kSms = 256;
  // dur[c][g][sm]: call c (call - 1 .. call + 1), long phases g = 1, 2.
  std::vector<double> dur[3][2];
  int same_sm = 0;
  for (int c = 0; c < 3; ++c) {
    for (int g = 0; g < 2; ++g) dur[c][g].assign(kSms, std::nan(""));
    for (int b = 0; b < grid; ++b) {
      const int cc = call - 1 + c;
      const unsigned long long sm = word(cc, b, kChainSmId);
      if (sm >= kSms) continue;
      if (c == 1 && word(cc - 1, b, kChainSmId) == sm) ++same_sm;
      for (int g = 0; g < 2; ++g) {
        const int base = kChainPhaseEvents + (g + 1) * kChainPhaseEventCount;
        const unsigned long long f = word(cc, b, base + kChainFirstFull);
        const unsigned long long l = word(cc, b, base + kChainLastRelease);
        if (f != 0 && l > f) dur[c][g][sm] = static_cast<double>(l - f);
      }
    }
  }
  auto corr = [&](const std::vector<double>& x, const std::vector<double>& y) {
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    int n = 0;
    for (int i = 0; i < kSms; ++i) {
      if (std::isnan(x[i]) || std::isnan(y[i])) continue;
      sx += x[i], sy += y[i], sxx += x[i] * x[i], syy += y[i] * y[i], sxy += x[i] * y[i], ++n;
    }
    if (n < 3) return std::nan("");
    const double vx = sxx - sx * sx / n, vy = syy - sy * sy / n;
    return (sxy - sx * sy / n) / std::sqrt(vx * vy);
  };
  // The 13 slowest SMs of a phase in a call, and how many of them are among the next call's.
  auto slowest = [&](const std::vector<double>& x) {
    std::vector<std::pair<double, int>> v;
    for (int i = 0; i < kSms; ++i) {
      if (!std::isnan(x[i])) v.push_back({-x[i], i});
    }
    std::sort(v.begin(), v.end());
    std::vector<int> out;
    for (size_t i = 0; i < v.size() && i < 13; ++i) out.push_back(v[i].second);
    return out;
  };
  auto overlap = [&](const std::vector<int>& a, const std::vector<int>& b) {
    int n = 0;
    for (int x : a) n += std::count(b.begin(), b.end(), x);
    return n;
  };
  std::printf(
      "%-10s per-SM persistence (calls %d..%d): CTA b on the same SM as the call before: %d of "
      "%d; corr(ln_2 + c_fc, mlp.c_proj) over SMs %.2f / %.2f / %.2f; corr over SMs of the call "
      "before: c_fc %.2f / %.2f, mlp.c_proj %.2f / %.2f; of the 13 slowest SMs in mlp.c_proj, "
      "also slowest in the next call: %d / %d\n",
      md.name, call - 1, call + 1, same_sm, grid, corr(dur[0][0], dur[0][1]),
      corr(dur[1][0], dur[1][1]), corr(dur[2][0], dur[2][1]), corr(dur[0][0], dur[1][0]),
      corr(dur[1][0], dur[2][0]), corr(dur[0][1], dur[1][1]), corr(dur[1][1], dur[2][1]),
      overlap(slowest(dur[0][1]), slowest(dur[1][1])),
      overlap(slowest(dur[1][1]), slowest(dur[2][1])));
}

// --chain: where a chain's time goes. kCalls chains back to back in a graph (as the rows above),
// each recording its CTAs' timeline (DecodeChainTuning::timeline); printed for the middle call
// (benchmarks/chain_timeline.h).
template <typename ParamsOf>
void ChainTimeline(const Model& md, const char* name, DecodeChainTuning tuning, double ceiling,
                   cudaStream_t stream, ParamsOf&& params_of, void* ws) {
  const absl::StatusOr<int> grid_or = DecodeChainGrid(tuning);
  if (!grid_or.ok()) {
    std::printf("%-10s timeline %s: %s\n", md.name, name, grid_or.status().ToString().c_str());
    return;
  }
  const int grid = *grid_or;
  const size_t per_call = DecodeChainTimelineWords(grid);
  DeviceBuffer stamps(kCalls * per_call * sizeof(unsigned long long));
  CHECK_CUDA(cudaMemset(stamps.ptr, 0, kCalls * per_call * sizeof(unsigned long long)));
  auto* base = static_cast<unsigned long long*>(stamps.ptr);
  const double us = TimeGraphUs(stream, [&](int i, cudaStream_t st) {
    DecodeChainTuning t = tuning;
    t.timeline = base + i * per_call;
    return DecodeChainCuda(params_of(i), st, /*pdl=*/true, ws, 0, t);
  });
  if (us < 0) {
    std::printf("%-10s timeline %s: failed\n", md.name, name);
    return;
  }
  std::vector<unsigned long long> h(kCalls * per_call);
  CHECK_CUDA(cudaMemcpy(h.data(), stamps.ptr, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
  const int call = kCalls / 2;
  bench::ChainTimelineView v;
  v.call = h.data() + call * per_call;
  v.previous = h.data() + (call - 1) * per_call;
  v.grid = grid;
  const char* names[4] = {"attn.c_proj", "ln_2 + c_fc", "mlp.c_proj", "ln_1 + c_attn"};
  for (const Shape& sh : ChainOrderShapes(md)) {
    v.phases.push_back(names[v.phases.size()]);
    v.ideal_us.push_back(static_cast<double>(sh.n * sh.k) * 2 / (ceiling * 1e3));
  }
  char title[160];
  std::snprintf(title, sizeof(title),
                "%s timeline, %s (%.1f us a call in this graph; call %d of %d)", md.name, name, us,
                call, kCalls);
  bench::PrintChainTimeline(title, v);
  PrintSmPersistence(md, h, per_call, grid, call);
}

// --chain: one layer's four m = 1 GEMMs (attn.c_proj + residual, c_fc + GELU, mlp.c_proj +
// residual, c_attn) as four skinny+pdl launches, beside the same work as one decode chain
// (kernels/decode_chain.h, with ln_2 and ln_1 inside it) at several DecodeChainTunings, and the
// chain's producer alone (stream-only). Each call is one layer; calls rotate over copies of the
// layer's weights (>= 256 MB in all).
void ChainSection(const Model& md, DType dtype, double ceiling, cudaStream_t stream,
                  CudaGemm& gemm) {
  const std::array<Shape, 4> order_shapes = ChainOrderShapes(md);
  size_t layer_bytes = 0;
  for (const Shape& sh : order_shapes) layer_bytes += static_cast<size_t>(sh.n * sh.k) * 2;
  const int copies =
      static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / layer_bytes + 1, 2, kCalls));
  std::vector<std::unique_ptr<DeviceBuffer>> weights;  // copies x 4
  for (int c = 0; c < copies; ++c) {
    for (int g = 0; g < 4; ++g) {
      const size_t bytes = static_cast<size_t>(order_shapes[g].n * order_shapes[g].k) * 2;
      weights.push_back(std::make_unique<DeviceBuffer>(bytes));
      Fill(dtype, weights.back()->ptr, bytes / 2, 300 + 4 * c + g, 1.0f / 64);
    }
  }
  // mlp.c_proj transposed, a copy each (DecodeChainPhase::weight_t, for the fused MLP rows).
  std::vector<std::unique_ptr<DeviceBuffer>> weights_t;
  for (int c = 0; c < copies; ++c) {
    const Shape& sh = order_shapes[2];
    weights_t.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(sh.n * sh.k) * 2));
    CHECK_OK(DecodeChainTransposeCuda(weights[c * 4 + 2]->ptr, weights_t.back()->ptr, sh.n, sh.k,
                                      stream));
  }
  const int64_t e = md.embed, inner = 4 * md.embed, qkv_n = order_shapes[3].n;
  DeviceBuffer attn(e * 2), hidden(e * 2), mlp(inner * 2), qkv(qkv_n * 2), bias(inner * 2),
      ln_w(e * 2), ln_b(e * 2), ws(DecodeChainWorkspaceBytes(1));
  Fill(dtype, attn.ptr, e, 11, 1.0f);
  Fill(dtype, hidden.ptr, e, 12, 1.0f);
  Fill(dtype, bias.ptr, inner, 13, 0.1f);
  Fill(dtype, ln_w.ptr, e, 14, 1.0f);
  Fill(dtype, ln_b.ptr, e, 15, 0.1f);
  CHECK_CUDA(cudaMemset(ws.ptr, 0, DecodeChainWorkspaceBytes(1)));
  CHECK_CUDA(cudaDeviceSynchronize());
  void* outs[4] = {hidden.ptr, mlp.ptr, hidden.ptr, qkv.ptr};
  const void* ins[4] = {attn.ptr, hidden.ptr, mlp.ptr, hidden.ptr};

  auto report = [&](const char* name, double us) {
    if (us < 0) {
      std::printf("%-10s %-34s failed\n", md.name, name);
      return;
    }
    const double tbs = layer_bytes / (us * 1e6);
    std::printf("%-10s %-34s %8.1f us a layer  %4.2f TB/s  %3.0f%% of copy\n", md.name, name, us,
                tbs, 100.0 * tbs * 1e3 / ceiling);
  };
  std::printf("\n%s: one layer's GEMMs, %.1f MB of weights, %d copies\n", md.name,
              layer_bytes / 1e6, copies);
  gemm.set_skinny(true);
  gemm.set_skinny_split_k(false);
  gemm.set_pdl(true);
  auto skinny_layer = [&](const char* name) {
    report(name, TimeGraphUs(stream, [&](int i, cudaStream_t st) {
             for (int g = 0; g < 4; ++g) {
               const Shape& sh = order_shapes[g];
               GemmParams p;
               p.a = ins[g];
               p.b = weights[(i % copies) * 4 + g]->ptr;
               p.c = outs[g];
               p.lda = sh.k;
               p.ldb = sh.k;
               p.ldc = sh.n;
               p.m = 1;
               p.n = sh.n;
               p.k = sh.k;
               p.dtype = dtype;
               GemmEpilogue ep;
               ep.bias = bias.ptr;
               ep.activation = sh.gelu ? Activation::kGeluTanh : Activation::kIdentity;
               ep.accumulate = sh.accumulate;
               RETURN_IF_ERROR(gemm.Run(p, ep, st));
             }
             return absl::OkStatus();
           }));
  };
  skinny_layer("skinny+pdl, 4 launches");
  // The model's default (deep unroll for narrow GEMMs), and with fp16 pair sums.
  gemm.set_skinny_deep_unroll(true);
  skinny_layer("skinny+pdl+deep, 4 launches");
  gemm.set_skinny_half_fold(true);
  skinny_layer("skinny+pdl+deep+half, 4 launches");
  gemm.set_skinny_half_fold(false);
  gemm.set_skinny_deep_unroll(false);
  // Call i's chain: the layer copy i % copies.
  auto chain_params = [&](int i) {
    DecodeChainParams p;
    p.dtype = dtype;
    p.num_phases = 4;
    for (int g = 0; g < 4; ++g) {
      DecodeChainPhase& ph = p.phases[g];
      ph.weight = weights[(i % copies) * 4 + g]->ptr;
      ph.bias = bias.ptr;
      ph.input = ins[g];
      ph.output = outs[g];
      ph.n = order_shapes[g].n;
      ph.k = order_shapes[g].k;
      ph.accumulate = order_shapes[g].accumulate;
      ph.activation = order_shapes[g].gelu ? Activation::kGeluTanh : Activation::kIdentity;
      if (g == 1 || g == 3) {
        ph.ln_weight = ln_w.ptr;
        ph.ln_bias = ln_b.ptr;
      }
    }
    p.phases[2].weight_t = weights_t[i % copies]->ptr;  // used by the fused MLP rows only
    return p;
  };
  struct ChainRow {
    const char* name;
    DecodeChainTuning t;
  };
  const ChainRow rows[] = {
      {"chain, automatic ring (default)", {}},
      {"chain, tensor-core fold (tiles)", WithFold({}, 1)},
      {"chain, fp16-pair fold (row runs)", HalfFold({})},
      {"chain, fp32 fold (row runs)", HalfFold({}, 0)},
      {"chain, fused MLP", Fused({})},
      {"chain, fused MLP, no pool", Fused({.fused_pool = 0})},
      {"chain, fused MLP, pool of 3", Fused({.fused_pool = 3})},
      {"chain, fused MLP, pool of 10", Fused({.fused_pool = 10})},
      {"chain, fused MLP, at most 3 stages", Fused({0, 3})},
      {"chain, at most 3 stages", {0, 3}},
      {"chain, 48 KiB, consume only, fused MLP", Fused(ConsumeOnly(49152))},
      {"chain, 48 KiB, stream only, fused MLP", Fused({49152, 0, true})},
      {"chain, 48 KiB, consume only, fp16 pairs", HalfFold(ConsumeOnly(49152))},
      {"chain, 48 KiB, consume only, fp32 fold", HalfFold(ConsumeOnly(49152), 0)},
      {"chain, tensor cores, tiles of 16 rows", WithFold({}, 16)},
      {"chain, tensor cores, tiles of 32 rows", WithFold({}, 32)},
      {"chain, 48 KiB, stream only, tiles", WithFold({49152, 0, true}, 1)},
      {"chain, 32 KiB, stream only, tiles", WithFold({32768, 0, true}, 1)},
      {"chain, 48 KiB, consume only, tensor cores", WithFold(ConsumeOnly(49152), 1)},
      {"chain, 32 KiB, consume only, tensor cores", WithFold(ConsumeOnly(32768), 1)},
      {"chain, 32 KiB, consume only, CUDA cores", WithFold(ConsumeOnly(32768), 0)},
      {"chain, automatic ring, grid barriers only", BarriersOnly()},
      {"chain, 32 KiB stages", {32768, 0, false}},
      {"chain, 16 KiB stages", {16384, 0, false}},
      {"chain, 48 KiB stages", {49152, 0, false}},
      {"chain, 40 KiB stages", {40960, 0, false}},
      {"chain, 24 KiB stages", {24576, 0, false}},
      {"chain, 32 KiB x at most 3 stages", {32768, 3, false}},
      {"chain, 32 KiB, 4 spare SMs", {32768, 0, false, 4}},
      {"chain, 32 KiB, at most 1 in flight", {32768, 0, false, 0, 1}},
      {"chain, 32 KiB, at most 2 in flight", {32768, 0, false, 0, 2}},
      {"chain, 32 KiB, at most 3 in flight", {32768, 0, false, 0, 3}},
      {"chain, 16 KiB, at most 4 in flight", {16384, 0, false, 0, 4}},
      {"chain, 16 KiB, at most 3 in flight", {16384, 0, false, 0, 3}},
      {"chain, 16 KiB, at most 2 in flight", {16384, 0, false, 0, 2}},
      {"chain, 24 KiB, at most 2 in flight", {24576, 0, false, 0, 2}},
      {"chain, 8 KiB, at most 6 in flight", {8192, 0, false, 0, 6}},
      {"chain, 48 KiB, at most 1 in flight", {49152, 0, false, 0, 1}},
      {"chain, 32 KiB, stream only", {32768, 0, true}},
      {"chain, 16 KiB, stream only", {16384, 0, true}},
      {"chain, 48 KiB, stream only", {49152, 0, true}},
      {"chain, 16 KiB, consume only", ConsumeOnly(16384)},
      {"chain, 48 KiB, consume only", ConsumeOnly(49152)},
      {"chain, 48 KiB, neither loads nor folds", NoLoadNoFold(49152)},
      {"chain, 16 KiB, neither loads nor folds", NoLoadNoFold(16384)},
      {"chain, stream only, 2 in flight", {32768, 0, true, 0, 2}}};
  // MQA_CHAIN_ROW=TEXT (for a profiler): only the rows whose name holds TEXT, each called a few
  // times on the stream, and no timelines.
  if (const char* only = std::getenv("MQA_CHAIN_ROW")) {
    for (const ChainRow& row : rows) {
      if (std::strstr(row.name, only) == nullptr) continue;
      for (int i = 0; i < 4; ++i) {
        const absl::Status st = DecodeChainCuda(chain_params(i), stream, true, ws.ptr, 0, row.t);
        if (!st.ok()) std::printf("%s: %s\n", row.name, st.ToString().c_str());
      }
      (void)cudaStreamSynchronize(stream);
      std::printf("%-10s %s: ran 4 calls\n", md.name, row.name);
    }
    return;
  }
  for (const ChainRow& row : rows) {
    report(row.name, TimeGraphUs(stream, [&](int i, cudaStream_t st) {
             return DecodeChainCuda(chain_params(i), st, /*pdl=*/true, ws.ptr, 0, row.t);
           }));
  }
  ChainTimeline(md, "default", {}, ceiling, stream, chain_params, ws.ptr);
  ChainTimeline(md, "fused MLP", Fused({}), ceiling, stream, chain_params, ws.ptr);
  ChainTimeline(md, "fused MLP, no pool", Fused({.fused_pool = 0}), ceiling, stream, chain_params,
                ws.ptr);
  ChainTimeline(md, "fp32 fold", HalfFold({}, 0), ceiling, stream, chain_params, ws.ptr);
  ChainTimeline(md, "grid barriers only", BarriersOnly(), ceiling, stream, chain_params, ws.ptr);
  ChainTimeline(md, "at most 2 in flight", {32768, 0, false, 0, 2}, ceiling, stream, chain_params,
                ws.ptr);
  ChainTimeline(md, "48 KiB, consume only", ConsumeOnly(49152), ceiling, stream, chain_params,
                ws.ptr);
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    p = std::strchr(p, ',');
    if (!p) break;
    ++p;
  }
  return v;
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  DType dtype = DType::kF16;
  std::vector<int> ms = {1, 8, 32};
  std::string model_flag = "both";
  int split_ctas = 0;
  bool chain_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--dtype") == 0) {
      dtype = std::strcmp(argv[i + 1], "bfloat16") == 0 ? DType::kBF16 : DType::kF16;
    } else if (std::strcmp(argv[i], "--m") == 0) {
      ms = ParseList(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--model") == 0) {
      model_flag = argv[i + 1];
    } else if (std::strcmp(argv[i], "--chain") == 0) {
      chain_only = std::strcmp(argv[i + 1], "only") == 0;
    } else if (std::strcmp(argv[i], "--split-ctas") == 0) {
      split_ctas = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--dtype float16|bfloat16] [--m 1,8,32] [--model "
                   "starcoder|santacoder|both] [--split-ctas N]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB; %s; split-K CTAs per SM: %s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20,
              std::string(DTypeName(dtype)).c_str(),
              split_ctas > 0 ? std::to_string(split_ctas).c_str() : "as many as fit");
  const double ceiling = CopyCeilingGBs();
  std::printf("copy ceiling: %.0f GB/s (cudaMemcpy D2D of 2 GiB, read + write)\n", ceiling);
  std::printf(
      "per call: us (graph of %d calls over rotating weight copies, median of %d) and "
      "weight TB/s (%% of the copy ceiling)\n\n",
      kCalls, kReplays);

  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto gemm_or = CudaGemm::Create(CudaGemm::Options{});
  CHECK_OK(gemm_or.status());
  CudaGemm& gemm = **gemm_or;
  gemm.set_skinny_split_ctas_per_sm(split_ctas);
  gemm.set_skinny_max_m(CudaGemm::kSkinnyMaxM);  // the skinny columns mean the skinny kernel

  if (chain_only) {
    for (const Model& md : kModels) {
      if (model_flag == "both" || model_flag == md.name) {
        ChainSection(md, dtype, ceiling, stream, gemm);
      }
    }
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
  }
  std::printf("%-10s %-11s %3s %6s %6s %7s", "model", "gemm", "m", "n", "k", "MB");
  for (const Variant& v : kVariants) std::printf(" | %-18s", v.name);
  std::printf("\n");

  // step_us[model][m][variant]: one decode step's GEMMs (negative: a variant did not run).
  std::map<std::string, std::map<int, std::vector<double>>> step_us;
  std::map<std::string, double> step_bytes;
  for (const Model& md : kModels) {
    if (model_flag != "both" && model_flag != md.name) continue;
    double bytes_step = 0;
    for (Gemm g : kGemms) {
      const Shape sh = ShapeOf(md, g);
      const double per_step = g == Gemm::kLmHead ? 1.0 : static_cast<double>(md.layers);
      const size_t weight_bytes = static_cast<size_t>(sh.n * sh.k) * 2;
      bytes_step += per_step * weight_bytes;
      const int copies =
          static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / weight_bytes + 1, 2, kCalls));
      std::vector<std::unique_ptr<DeviceBuffer>> weights;
      for (int c = 0; c < copies; ++c) {
        weights.push_back(std::make_unique<DeviceBuffer>(weight_bytes));
        Fill(dtype, weights.back()->ptr, weight_bytes / 2, 100 + c, 1.0f / 64);
      }
      const int64_t max_m = *std::max_element(ms.begin(), ms.end());
      DeviceBuffer a(max_m * sh.k * 2), c(max_m * sh.n * 2), bias(sh.n * 2);
      Fill(dtype, a.ptr, max_m * sh.k, 7, 1.0f);
      Fill(dtype, c.ptr, max_m * sh.n, 8, 1.0f);
      Fill(dtype, bias.ptr, sh.n, 9, 0.1f);
      CHECK_CUDA(cudaDeviceSynchronize());
      for (const int m : ms) {
        auto& row = step_us[md.name][m];
        row.resize(kNumVariants, 0.0);
        std::printf("%-10s %-11s %3d %6lld %6lld %7.1f", md.name, GemmName(g), m,
                    static_cast<long long>(sh.n), static_cast<long long>(sh.k), weight_bytes / 1e6);
        for (int vi = 0; vi < kNumVariants; ++vi) {
          const Variant& v = kVariants[vi];
          if (m > CudaGemm::kSkinnyMaxM && v.skinny) {  // CudaGemm would run cuBLASLt
            std::printf(" | %-18s", "-");
            row[vi] = -1;
            continue;
          }
          gemm.set_skinny(v.skinny);
          gemm.set_skinny_split_k(v.split_k);
          gemm.set_pdl(v.pdl);
          const double us = TimeGraphUs(stream, [&](int i, cudaStream_t s) {
            GemmParams p;
            p.a = a.ptr;
            p.b = weights[i % copies]->ptr;
            p.c = c.ptr;
            p.lda = sh.k;
            p.ldb = sh.k;
            p.ldc = sh.n;
            p.m = m;
            p.n = sh.n;
            p.k = sh.k;
            p.dtype = dtype;
            GemmEpilogue e;
            e.bias = sh.bias ? bias.ptr : nullptr;
            e.activation = sh.gelu ? Activation::kGeluTanh : Activation::kIdentity;
            e.accumulate = sh.accumulate;
            return gemm.Run(p, e, s);
          });
          if (us < 0) {
            std::printf(" | %-18s", "failed");
            row[vi] = -1;
            continue;
          }
          const double tbs = weight_bytes / (us * 1e6);
          std::printf(" | %7.1f %4.2f %3.0f%%", us, tbs, 100.0 * tbs * 1e3 / ceiling);
          if (row[vi] >= 0) row[vi] += per_step * us;
        }
        std::printf("\n");
      }
    }
    step_bytes[md.name] = bytes_step;
  }

  std::printf(
      "\none decode step's GEMMs (layers x 4 + lm_head), ms, and the share of the floor "
      "(weight bytes at the copy ceiling):\n");
  for (const auto& [name, by_m] : step_us) {
    const double floor_ms = step_bytes[name] / (ceiling * 1e6);
    for (const auto& [m, row] : by_m) {
      std::printf("%-10s m %2d: %.2f GB of weights, floor %.3f ms:", name.c_str(), m,
                  step_bytes[name] / 1e9, floor_ms);
      for (int vi = 0; vi < kNumVariants; ++vi) {
        if (row[vi] < 0) continue;
        std::printf("  %s %.3f ms (%.0f%%)", kVariants[vi].name, row[vi] / 1e3,
                    100.0 * floor_ms / (row[vi] / 1e3));
      }
      std::printf("\n");
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace mqa

int main(int argc, char** argv) { return mqa::Main(argc, argv); }
