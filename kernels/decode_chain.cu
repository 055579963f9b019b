// The batch-1 decode chain (see decode_chain.h): a producer warp streams each CTA's weight rows
// through a shared-memory ring; sixteen consumer warps fold them into per-row sums, phase by phase,
// with a grid-wide barrier between phases.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/decode_chain_cuda.h"
#include "kernels/device_info.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/mma.cuh"
#include "kernels/tma.cuh"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

constexpr int kConsumerWarps = 16;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
constexpr int kDefaultStageBytes = 32768;
constexpr int kLongChainStageBytes = 49152;  // stages of a chain streaming >= kLongChainCtaBytes
constexpr int64_t kLongChainCtaBytes = int64_t{2} << 20;  // a CTA
constexpr int kShortChainStages = 3;                      // at most, for shorter chains
constexpr int kSegBytes = 512;  // one warp's 32 lanes x 16 bytes: 256 elements of one row
constexpr int kSegElems = 256;
constexpr int kMinStages = 3;
constexpr int kMaxStages = 16;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps
// A chain's workspace slot: the grid barrier's counter at 0, phase i's steal counter at
// kStealCounterStride x (i + 1) (each in its own 128-byte line).
constexpr int kStealCounterStride = 128;
constexpr int kCounterStride = kStealCounterStride * (kMaxDecodeChainPhases + 1);
// A slot's launch epoch (the flags of its LL words), in the barrier counter's line.
constexpr int kEpochOffset = 64;
// LL boundaries (DecodeChainTuning::ll_inputs): a phase whose output is the next phase's input
// also writes each output element as an 8-byte word {element bits, flag} into one of two areas
// of the slot (phase parity), and the next phase polls those words instead of waiting at the grid
// barrier and then loading its input: one L2 round trip after the slowest CTA's store instead of
// two (its barrier arrival seen, then the input). An 8-byte store is single-copy atomic, so a
// word with the expected flag holds the element. At most kLlMaxN elements.
constexpr int kLlMaxN = 8192;
constexpr size_t kLlAreaBytes = size_t{kLlMaxN} * 8;
// The fused MLP's fp32 output vector (DecodeChainTuning::fused_mlp), after the LL areas: at most
// kFusedMaxN elements (a thread's two 16-byte chunks of a transposed row, kConsumers threads).
constexpr int kFusedMaxN = 2 * kConsumers * 8;
constexpr size_t kFusedOffset = kCounterStride + 2 * kLlAreaBytes;
// The fused MLP's pool (DecodeChainTuning::fused_pool): the up outputs of each CTA's donated rows
// (fp32, at most kFusedMaxUp rows in all) and a flag a CTA saying they are written (the launch
// epoch + 1; at most kFusedMaxGrid CTAs).
constexpr int kFusedMaxUp = 32768;
constexpr int kFusedMaxGrid = 1024;
constexpr size_t kFusedUpOffset = kFusedOffset + size_t{kFusedMaxN} * 4;
constexpr size_t kFusedFlagOffset = kFusedUpOffset + size_t{kFusedMaxUp} * 4;
constexpr size_t kSlotBytes = kFusedFlagOffset + size_t{kFusedMaxGrid} * 4;
// Measured default (-1) of DecodeChainTuning::fused_pool: none. H200, 2026-12-04 ~16:10 UTC,
// gemm_bench --chain only, one StarCoder layer: the pool balances the fused phase (its CTAs' last
// releases within 5.5 us instead of 19) but each donated stage waits for its ticket (an atomic
// queued behind the SM's bulk loads): stream only 191.4 us against 177.4 without the fused MLP,
// the layer 195.4 / 199.2 / 202.8 us with pools of 3 / 6 / 10 against 193.2 with none (186.7
// without the fused MLP); mqabench latency StarCoder b1 8.385 / 8.383 ms a step with 6, 8.630 /
// 8.613 with 12, against 8.151 / 8.149 with none. Kept as a knob.
constexpr int kDefaultFusedPool = 0;
constexpr int kMaxPoolRows = 64;  // rows of one donated stage, at most
// Measured default (-1): off. H200, 2026-12-04, two calls side by side with the barrier form
// (mqabench --chain ll,nl, StarCoder b1 decode step): ~11:05 UTC 8.064 / 8.058 ms with LL against
// 8.087 / 8.070 without; ~11:12 UTC 7.984 / 7.986 with against 7.962 without. Within the spread
// either way; one layer in isolation (gemm_bench --chain only) StarCoder 190.3 against 190.0 us,
// SantaCoder 38.3 against 39.6 us. The timeline: the QKV phase's input came 0.9 us sooner after
// the slowest CTA's epilogue, the c_fc phase's 1.5 us later (its LL stores queue behind the
// ring's bulk loads of the next phase). Kept as a knob (DecodeChainTuning::ll_inputs, mqabench
// --chain ll).
constexpr int kDefaultLlInputs = 0;
// Work stealing (DecodeChainTuning::steal_chunks): the dynamically dealt chunks a CTA may take in
// a phase, at most, and the rows they may add to its row sums.
constexpr int kMaxStealChunks = 64;
constexpr int kMaxStealRows = 256;
// Measured side by side on the H200 (2026-12-04, mqabench latency StarCoder b1, --chain wN;
// benchmarks/mqabench/NOTES.md, version 9): stealing in every phase balanced the CTAs' finishing
// times but made the step 0.5-1.7% slower with 2 chunks, 0.9-1.9% with 4 and 1.3-2.6% with 8 (the
// short phases, ~12 chunks a CTA, lost more to the tickets than they gained); only in phases of
// at least 16 chunks a CTA (a StarCoder layer's two MLP projections, ~47), 0.7% faster with 2 or 4
// in one call (w0 7.993 / 7.991, w2 7.936 / 7.933, w4 7.936 / 7.939 ms a step) and 0.6% slower
// with 2 in the next, on another machine (w0 7.890 / 7.889, w2 7.938 / 7.938). No robust gain:
// off by default.
constexpr int kDefaultStealChunks = 0;
constexpr int kDefaultStealMinChunks = 16;
// Bytes a ring stage's bias side buffer: a stolen chunk's bias (16-byte aligned span of at most
// kMaxStealRows / 4 rows) arrives with its weights.
constexpr int kBiasSideBytes = (kMaxStealRows / 4) * 2 + 32;
// The tiled layout (DecodeChainTuning::mma_fold): a stage holds a tile of R <= kTileMaxRows rows
// (a multiple of 8) x C columns of a phase's weights, each row's C elements one bulk copy, rows
// C x 2 + kTilePad bytes apart (the 8 row addresses of an ldmatrix then fall in 8 different bank
// groups); a CTA's rows are walked tile by tile, each tile's columns C at a time. The consumers
// fold a stage on tensor cores: the input's 16 columns as the A operand of an m16n8k16 MMA (the
// same vector in all 16 rows), 8 weight rows' 16 columns as B, so one MMA folds 256 weights into
// 8 row sums, kept in the MMA's fp32 accumulators over the whole tile (each warp takes every 16th
// 16-column chunk of a stage); once the tile's last columns are folded each warp adds its sums
// into the CTA's row sums. A slot of the ring is stage_bytes + kTileSlack bytes.
constexpr int kTileMaxRows = 32;
constexpr int kTilePad = 16;
constexpr int kTileSlack = kTileMaxRows * kTilePad;
// Measured default (-1): the row-run layout. H200, 2026-12-04 ~13:42 UTC (gemm_bench --chain only,
// one StarCoder layer): the tiled fold with 32-row tiles folds 2.1x faster than the fp32 one
// (consume only 111 against 175 us, of which ~54 are the ring and the boundaries), but its
// stages are 24-32 bulk copies of 1-2 KiB and the producer streams them 16-47% slower (stream
// only 215 / 262 us at 48 / 32 KiB stages against 185); with 8-row tiles (8 copies of 6 KiB) the
// stream is 6% slower (196 against 185) and the fold no faster (consume only 171). Whole chain:
// 8-row tiles 207, 16-row 204, 32-row 298 against 194 us; end to end StarCoder b1 8.78 against
// 8.10 ms a step, SantaCoder (chain on) 1.33 against 1.22 ms. Kept as a knob (mma_fold).
constexpr int kDefaultMmaFold = 0;
// Measured default (-1) of DecodeChainTuning::fused_mlp: off. H200, 2026-12-04, mqabench latency
// StarCoder b1 (decode step, --chain auto,fm,auto,fm): ~15:59 UTC 8.210 / 8.213 ms separate,
// 8.145 / 8.178 fused (-0.6%); ~16:10 UTC (another machine) 7.992 / 7.992 separate, 8.151 /
// 8.149 fused (+2.0%); ~16:14 and ~16:22 UTC +1.3% and +1.4%. One layer in isolation (gemm_bench --chain only) 190.5 against 190.9 us,
// then 186.7 against 193.2. The timeline: the barrier between c_fc and mlp.c_proj goes, but the
// pair's CTAs carry their c_fc lateness into mlp.c_proj (their finishing times spread over 19-21
// us instead of ~7-10), and the barrier after the pair waits for the slowest; the fp32 vector's
// additions take ~2-3 us at the phase's end. And it costs a transposed copy of mlp.c_proj (12 GB
// for StarCoder). Kept as a knob (mqabench --chain fm).
constexpr int kDefaultFusedMlp = 0;

// A phase's part in the fused MLP (DecodeChainTuning::fused_mlp).
enum ChainPhaseKind : int {
  kPhasePlain = 0,
  kPhaseUp = 1,      // the up projection: its outputs (after bias, GELU, rounding) stay in the
                     // CTA's shared memory; its input (the residual) + the down bias go into y32
  kPhaseDown = 2,    // the down projection's transposed weight: rows [r0, r1) of it, times the
                     // CTA's up outputs, added into y32 (no barrier, no input, no epilogue)
  kPhaseFromY32 = 3  // the phase after: its input is y32 rounded to T, which it also writes to
                     // the residual stream (each CTA a slice)
};

struct ChainPhaseArgs {
  const void* w;
  const void* bias;
  const void* input;
  const void* ln_w;
  const void* ln_b;
  void* out;
  float eps;
  int gelu;
  int accumulate;
  int n, k;
  // Work stealing (0 rows_chunk: none; each CTA's rows are CtaRows'): rows are grouped in chunks
  // of rows_chunk (one ring stage at most); CTA b owns chunks [b x static_chunks, (b + 1) x
  // static_chunks), and chunks [grid x static_chunks, chunks) are dealt one at a time by an atomic
  // counter, at most max_steal to a CTA.
  int rows_chunk, static_chunks, chunks, max_steal;
  // LL boundary (kLlMaxN): ll_out, this phase also writes its output as LL words; ll_in, its
  // input comes from the previous phase's LL words (no grid barrier before it).
  int ll_out, ll_in;
  // The tiled layout (kTileMaxRows): rows a tile (0: the row-run layout, one contiguous run of the
  // CTA's rows streamed a stage at a time) and columns a stage (a divisor of k, a multiple of 64).
  int tile_rows, tile_cols;
  int kind;              // ChainPhaseKind
  float* y32;            // the fused MLP's fp32 vector (kinds 1-3)
  const void* y32_bias;  // kPhaseUp: the down projection's bias, or null
  // kPhaseUp / kPhaseDown with a pool: each CTA's last `pool` stages of pool_rows rows are dealt
  // at run time (kDefaultFusedPool); up_g / flags: the slot's kFusedUpOffset / kFusedFlagOffset.
  int pool, pool_rows;
  float* up_g;
  unsigned* flags;
};

struct ChainAttentionArgs {
  const void* qkv;
  void* key_cache;
  void* value_cache;
  const int32_t* block_table;
  const int32_t* context_len;
  const int32_t* slot;
  void* out;
  int heads, kv_heads, head_dim, block_size;
  float scale;
  int max_context;
  int short_context;  // ShortAttention's form: every head has its CTA, contexts <= kShortContext
  // DecodeChainTuning::head_hold (short form only, where it is at least 1): a head CTA's producer
  // streams no weights until its head's K rows, which the short form copies into that CTA's ring,
  // have been read (1) or its head is written (2).
  int hold;
  // The short form's V rows, copied into shared memory by the bulk-copy engine: the bytes of the
  // union of the V rows and the partial sums at the start of the input buffer (q and the table
  // follow it).
  int v_union;
};

struct ChainArgs {
  ChainPhaseArgs ph[kMaxDecodeChainPhases];
  int num_phases;
  int has_attention;
  ChainAttentionArgs at;
  int stages;
  int in_bytes;  // the input buffer: max k elements of T, or the attention's float scratch
  int ln_k;      // elements of each LN weight / bias buffer (the largest k with a layer norm)
  int stage_bytes;
  int slot_bytes;   // a ring slot: stage_bytes, + kTileSlack where a phase is tiled
  int stream_only;  // DecodeChainTuning::stream_only
  int consume_only;  // DecodeChainTuning::consume_only
  int ll;            // some phase has an LL boundary (ChainPhaseArgs::ll_out): read the epoch
  int side_offset;  // bytes from the shared-memory base to the bias side buffers (work stealing)
  int inflight;     // DecodeChainTuning::max_inflight (<= stages; 0: no limit)
  unsigned* counter;  // the grid barrier's; phase i's steal counter kStealCounterStride x (i + 1)
                      // bytes further
  unsigned long long* stamps;  // DecodeChainTuning::timeline (the kStamps instantiation)
  int acc_floats;              // the row sums' floats in shared memory (the up outputs follow them)
  float* y32;  // the fused MLP's vector (zeroed by the launch before its pair), or null
  int y32_n;   // its elements
  // DecodeChainTuning::sm_shares: CtaRows takes the CTA's rows from shares[%smid].
  int sm_shares;
  uint32_t shares[kDecodeChainMaxSmIds];
};

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// Records event `e` of this CTA's timeline (kernels/decode_chain_cuda.h) in the kStamps form.
template <bool kStamps>
__device__ __forceinline__ void Stamp(const ChainArgs& a, int e) {
  if constexpr (kStamps) {
    a.stamps[static_cast<int64_t>(blockIdx.x) * kDecodeChainTimelineWords + e] = clock64();
  }
}
template <bool kStamps>
__device__ __forceinline__ void StampPhase(const ChainArgs& a, int gi, int event) {
  Stamp<kStamps>(a, kChainPhaseEvents + gi * kChainPhaseEventCount + event);
}

// This CTA's statically owned output rows of a phase: an equal contiguous share of n, its SM's
// share (ChainArgs::sm_shares), or with work stealing its static_chunks chunks.
__device__ __forceinline__ void CtaRows(const ChainArgs& a, const ChainPhaseArgs& ph, int& r0,
                                        int& r1) {
  if (ph.rows_chunk > 0) {
    r0 = static_cast<int>(blockIdx.x) * ph.static_chunks * ph.rows_chunk;
    r1 = r0 + ph.static_chunks * ph.rows_chunk;
  } else if (a.sm_shares) {
    unsigned smid;
    asm("mov.u32 %0, %%smid;\n" : "=r"(smid));
    const uint32_t b = smid < kDecodeChainMaxSmIds ? a.shares[smid] : kDecodeChainNoShare;
    if (b == kDecodeChainNoShare) __trap();  // an SM the shares do not know: rows would be lost
    r0 = static_cast<int>(DecodeChainShareRow(b, ph.n, false));
    r1 = static_cast<int>(DecodeChainShareRow(b, ph.n, true));
  } else {
    r0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) * ph.n / gridDim.x);
    r1 = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * ph.n / gridDim.x);
  }
}

// Row sums a CTA may hold in a phase: its static rows, and the stolen chunks' at most.
__device__ __forceinline__ int CtaMaxRows(const ChainArgs& a, const ChainPhaseArgs& ph) {
  int r0, r1;
  CtaRows(a, ph, r0, r1);
  return r1 - r0 + (ph.rows_chunk > 0 ? ph.max_steal * ph.rows_chunk : 0);
}

__device__ __forceinline__ unsigned* StealCounter(const ChainArgs& a, int i) {
  return reinterpret_cast<unsigned*>(reinterpret_cast<char*>(a.counter) +
                                     kStealCounterStride * (i + 1));
}

__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// *p += v in place at L2, nothing returned (red: the thread does not wait for it).
__device__ __forceinline__ void RedAdd(__half* p, __half v) {
  asm volatile("red.global.add.noftz.f16 [%0], %1;\n" ::"l"(p), "h"(__half_as_ushort(v))
               : "memory");
}
__device__ __forceinline__ void RedAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  asm volatile("red.global.add.noftz.bf16 [%0], %1;\n" ::"l"(p), "h"(__bfloat16_as_ushort(v))
               : "memory");
}

// `op` (a sum or a maximum) over the consumer threads, starting from `init`; every consumer gets
// it. `red`: kConsumerWarps floats.
template <typename Op>
__device__ __forceinline__ float ConsumerReduce(float v, float init, Op op, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  tma::NamedBarrier(kConsumerBarrier, kConsumers);
  float r = init;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) r = op(r, red[w]);
  tma::NamedBarrier(kConsumerBarrier, kConsumers);  // red may be rewritten next
  return r;
}
__device__ __forceinline__ float ConsumerSum(float v, float* red) {
  return ConsumerReduce(
      v, 0.0f, [](float x, float y) { return x + y; }, red);
}
__device__ __forceinline__ float ConsumerMax(float v, float* red) {
  return ConsumerReduce(
      v, -INFINITY, [](float x, float y) { return fmaxf(x, y); }, red);
}

// Copies the new token's K / V rows (the QKV row's tail) to the caches at `slot` (*at.slot; one
// CTA does).
template <typename T>
__device__ __forceinline__ void WriteNewKv(const ChainAttentionArgs& at, int slot) {
  if (slot < 0) return;
  const T* qkv = static_cast<const T*>(at.qkv);
  const int w = at.kv_heads * at.head_dim;
  const int64_t q_cols = static_cast<int64_t>(at.heads) * at.head_dim;
  T* kd = static_cast<T*>(at.key_cache) + static_cast<int64_t>(slot) * w;
  T* vd = static_cast<T*>(at.value_cache) + static_cast<int64_t>(slot) * w;
  for (int i = threadIdx.x; i < w; i += kConsumers) {
    kd[i] = qkv[q_cols + i];
    vd[i] = qkv[q_cols + w + i];
  }
}

// Head h's output from the consumers' partial sums: each thread's 8 columns (o, of column chunk c
// in position group g of G) into `partials` (G x D floats), then thread d < D sums column d over
// the groups and writes it divided by the softmax denominator `sum`. Leaves partials free.
template <typename T>
__device__ __forceinline__ void FinishHead(const ChainAttentionArgs& at, float* partials,
                                           const float (&o)[8], int g, int c, int G, int h,
                                           float sum) {
  const int D = at.head_dim, tid = threadIdx.x;
  float* part = partials + g * D + 8 * c;
#pragma unroll
  for (int e = 0; e < 8; ++e) part[e] = o[e];
  tma::NamedBarrier(kConsumerBarrier, kConsumers);
  if (tid < D) {
    float t = 0.0f;
    for (int j = 0; j < G; ++j) t += partials[j * D + tid];
    static_cast<T*>(at.out)[static_cast<int64_t>(h) * D + tid] = fwd::FromFloat<T>(t / sum);
  }
  tma::NamedBarrier(kConsumerBarrier, kConsumers);  // scratch and scores are reused
}

// The attention phase (DecodeChainAttention), consumer threads only: this CTA's heads one at a
// time, scores in `scores` (>= context floats), q and the pass-2 partial sums in `scratch` (>=
// D + 8 x 512 floats); then CTA 0 writes the new K / V row to the caches.
// Timeline (kStamps): phase 0's kChainInputReady once the first head's q is in shared memory,
// kChainFirstFull after its scores' maximum, kChainLastRelease after its output is written.
template <typename T, bool kStamps>
__device__ void AttentionPhase(const ChainArgs& a, float* scores, int capacity, float* scratch,
                               float* red) {
  const ChainAttentionArgs& at = a.at;
  const bool t0 = threadIdx.x == 0 && blockIdx.x < at.heads;
  using V = fwd::Vec16<T>;
  const int ctx = *at.context_len;
  if (ctx > capacity) __trap();  // the caller's max_context was not an upper bound
  const int D = at.head_dim, H = at.heads, KVH = at.kv_heads;
  const int group = H / KVH;
  const T* qkv = static_cast<const T*>(at.qkv);
  const T* kc = static_cast<const T*>(at.key_cache);
  const T* vc = static_cast<const T*>(at.value_cache);
  const int tid = threadIdx.x;
  // Where position p's K row of KV head kvh starts (its V row is at the same offset of vc):
  // the cache, or the QKV row for the new token (p = ctx - 1).
  auto row_offset = [&](int p, int kvh) -> int64_t {
    const int64_t slot =
        static_cast<int64_t>(at.block_table[p / at.block_size]) * at.block_size + p % at.block_size;
    return (slot * KVH + kvh) * D;
  };
  for (int h = blockIdx.x; h < H; h += gridDim.x) {
    const int kvh = h / group;
    const T* knew = qkv + static_cast<int64_t>(H + kvh) * D;
    const T* vnew = qkv + static_cast<int64_t>(H + KVH + kvh) * D;
    for (int d = tid; d < D; d += kConsumers) {
      const unsigned short bits =
          __ldcg(reinterpret_cast<const unsigned short*>(qkv + static_cast<int64_t>(h) * D + d));
      scratch[d] = fwd::ToFloat(*reinterpret_cast<const T*>(&bits)) * at.scale;
    }
    tma::NamedBarrier(kConsumerBarrier, kConsumers);
    if (t0 && h == blockIdx.x) StampPhase<kStamps>(a, 0, kChainInputReady);
    // Pass 1: thread (g, c) holds 16-byte chunk c of the K rows g, g + G, ... (a row's chunks are
    // consecutive lanes: a warp's load reads whole rows), four rows' loads in flight; a row's dot
    // is summed across its lanes, and its first lane stores the score. The loop runs as often in
    // every lane of a warp (the shuffles), from the warp's first row group wg.
    const int chunks = D / 8, G = kConsumers / chunks, g = tid / chunks, c = tid - g * chunks;
    const int wg = (tid >> 5) * (32 / chunks);
    float qc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) qc[e] = scratch[8 * c + e];
    float m = -INFINITY;
    for (int base = wg; base < ctx; base += 4 * G) {
      V kv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = base + (g - wg) + u * G;
        if (p < ctx) {
          const T* k = (p == ctx - 1 ? knew : kc + row_offset(p, kvh)) + 8 * c;
          *reinterpret_cast<int4*>(&kv[u]) = __ldcg(reinterpret_cast<const int4*>(k));
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = base + (g - wg) + u * G;
        float d = 0.0f;
        if (p < ctx) {
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(fwd::ToFloat(kv[u].v[e]), qc[e], d);
        }
        for (int o = chunks / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (p < ctx) {
          if (c == 0) scores[p] = d;
          m = fmaxf(m, d);
        }
      }
    }
    m = ConsumerMax(m, red);
    if (t0 && h == blockIdx.x) StampPhase<kStamps>(a, 0, kChainFirstFull);
    float sum = 0.0f;
    for (int p = tid; p < ctx; p += kConsumers) {
      const float e = __expf(scores[p] - m);
      scores[p] = e;
      sum += e;
    }
    sum = ConsumerSum(sum, red);  // its barriers also publish `scores`
    // Pass 2: thread (g, c) sums 16-byte chunk c of the V rows of positions g, g + G, ..., four
    // rows' loads in flight; partials [G][D] after q in `scratch`.
    float o[8] = {};
    for (int p0 = g; p0 < ctx; p0 += 4 * G) {
      V vv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = p0 + u * G;
        if (p < ctx) {
          const T* v = (p == ctx - 1 ? vnew : vc + row_offset(p, kvh)) + 8 * c;
          *reinterpret_cast<int4*>(&vv[u]) = __ldcg(reinterpret_cast<const int4*>(v));
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int p = p0 + u * G;
        if (p < ctx) {
          const float w = scores[p];
#pragma unroll
          for (int e = 0; e < 8; ++e) o[e] = fmaf(w, fwd::ToFloat(vv[u].v[e]), o[e]);
        }
      }
    }
    FinishHead<T>(at, scratch + D, o, g, c, G, h, sum);
    if (t0 && h == blockIdx.x) StampPhase<kStamps>(a, 0, kChainLastRelease);
  }
  if (blockIdx.x == 0) WriteNewKv<T>(at, *at.slot);
}

// The attention phase's short form (ChainAttentionArgs::short_context): CTA h < heads takes head
// h; a context of at most kConsumers x 64 / D positions (256 at D = 128) fits 8 rows a thread.
// Before the PDL wait: the context length and the block table (into shared memory, after the V
// rows and q), then the K and V rows before the newest by the bulk-copy engine (requested by one
// warp, a block's rows one copy; earlier steps' chains wrote them and are complete before this
// launch, since a decode graph's kernels write only their own layer's newest row): K into the CTA's
// ring, whose producer is held until the dots have read them (ChainAttentionArgs::hold >= 1; the
// loop form where the ring cannot hold max_context rows), V into the input buffer; the new token's
// cache slot for the CTA that writes it (the last, which has no head). After the wait only q and
// the newest K and V rows (the previous kernel's) remain to be read. Thread (g, c) dots K rows g, g
// + G, ... at 16-byte chunk c (G = kConsumers / (D / 8); the newest, which the previous kernel
// wrote, from the QKV row through a register) and P V reads its V rows g, g + G, ... from shared
// memory. K by the bulk-copy engine as well, measured on an H200 (2026-12-07 05:40-05:51 UTC,
// StarCoder b1 128 / 128 decode step, separate processes in rotation, fourteen rounds):
// median 7.839 ms against 7.857 (-0.2%; faster in 11 of the 14 rounds; a third library with the
// same chain code as main's, 7.858), where K had been loaded into registers, whole rows a warp (the
// form described next). Until version 53 V went the K rows' way into registers once the dots were
// done, one more round trip under the softmax's reductions (issued earlier, beside K, it spilled
// and stalled the issuing threads: +1.3% in version 50, ba219ae +0.3% in version 53). The table and
// the K / V copies before the PDL wait, measured on an H100 (2026-12-07 07:52 UTC, StarCoder b1 128
// / 128 decode step, separate processes in rotation, six rounds): median 10.680 ms against 10.717
// (-0.35%; faster in all six rounds), where they had been issued after q's request; K before the
// wait and V after it (c88b039) gave the same 10.681. Layer 20's head CTAs write their heads 5.1 us
// after the wait instead of 7.1, and attn.c_proj's loop starts 2.4 us sooner
// (benchmarks/mqabench/NOTES.md version 55). The bulk copies, measured on an H100 (2026-12-07 03:53
// UTC, StarCoder b1 128 / 128 decode step, separate processes in rotation, three rounds): 10.947
// / 10.950 / 10.947 ms against 10.999 / 10.989 / 10.991 (-0.4%); layer 20's head CTAs have the
// scores' maximum 2.0 us sooner, the head written ~2 us sooner and attn.c_proj starts 1.1 us
// sooner. Until version 52 (benchmarks/mqabench/ NOTES.md) a thread read 128 contiguous bytes of
// one K row, so a warp's load touched 16 bytes of 32 lines, and issuing a head's K kept the LSU
// busy ~2 us. Reading K in V's layout, measured on an H100 (2026-12-07 01:55 UTC, StarCoder b1 128
// / 128 decode step, separate processes in rotation, three rounds): 10.995 / 11.012 / 10.982 ms
// against 11.046 / 11.028 / 11.020 (-0.3%); layer 20's head CTAs have q in 2.4 us sooner and K 2.3
// us sooner (attn.c_proj starts 1.8 us sooner). The loop form's pass 1 in the same layout measured
// equal (512 / 128: 11.130 / 11.125 against 11.124 / 11.123 ms). The row weights stay in registers;
// the PDL wait is done here.
constexpr int kShortAttentionRows = 8;  // V rows a thread (and 16-byte K chunks)
// Measured default (-1) of DecodeChainTuning::head_hold: on (and since the K rows moved into the
// head CTAs' rings, 0 is run as 1 in the short form). H100, 2026-12-06 12:51-12:53 UTC
// (StarCoder b1 128 / 128, decode step, separate processes in rotation, three rounds): held
// 11.032 / 11.025 / 11.022 ms against 11.073 / 11.081 / 11.072 not held (-0.45%); with the V rows
// also copied into shared memory before the PDL wait 11.031 / 11.029 / 11.032, those copies alone
// 11.083 / 11.071 / 11.081 (benchmarks/mqabench/NOTES.md version 46). Confirmed at 13:25 UTC:
// 11.016 / 11.016 against 11.067 / 11.066; held until the head is written (2) 11.016 / 11.013, the
// same (version 40's form of that, with a smaller share of attn.c_proj's rows, had gained
// nothing).
constexpr int kDefaultHeadHold = 1;

// hold_s: the CTA's producer's go-ahead (ChainAttentionArgs::hold), set once the K rows in its
// ring are read (1) or the head is written (2). (Holding the other CTAs' producers too, until their
// own PDL wait or until every head's q is in, lost on an H100: benchmarks/mqabench/NOTES.md,
// versions 52 and 53.) vbase: the input buffer (the V rows, then q and the table;
// ChainAttentionArgs::v_union); v_bar: the mbarrier the V rows' bulk copies complete (initialised
// for one arrival, used once); kbase, k_bar: the CTA's ring and the mbarrier of the K rows' copies
// into it.
template <typename T, bool kStamps>
__device__ void ShortAttentionPhase(const ChainArgs& a, float* red, volatile int* hold_s,
                                    unsigned char* vbase, uint64_t* v_bar_p, unsigned char* kbase,
                                    uint64_t* k_bar_p) {
  using V = fwd::Vec16<T>;
  const ChainAttentionArgs& at = a.at;
  const int D = at.head_dim, H = at.heads, KVH = at.kv_heads;
  const int h = blockIdx.x;
  const bool active = h < H;
  const int kvh = active ? h / (H / KVH) : 0;
  const int tid = threadIdx.x;
  // Thread (g, c) holds the K and V rows g, g + G, ... at 16-byte chunk c: a row's chunks are
  // consecutive lanes, so that a warp's load reads whole rows (512 contiguous bytes at D = 128)
  // and a row's dot is summed across its `chunks` lanes.
  const int chunks = D / 8, G = kConsumers / chunks, g = tid / chunks, c = tid - g * chunks;
  int ctx = 0;
  int4 klast = {}, vlast = {};
  // At `vbase`: the V rows before the newest (at.v_union bytes; the partial sums over them once
  // P V is done), then q (D floats) and the table.
  T* vs = reinterpret_cast<T*>(vbase);
  const uint32_t v_bar = fwd::SmemAddr(v_bar_p);
  const uint32_t k_bar = fwd::SmemAddr(k_bar_p);
  T* ks = reinterpret_cast<T*>(kbase);  // the K rows before the newest, in the held ring
  float* q_s = reinterpret_cast<float*>(vbase + at.v_union);
  float* partials = reinterpret_cast<float*>(vbase);
  int* table = reinterpret_cast<int*>(q_s + D);
  auto cached = [&](const T* cache, int p) {
    const int64_t slot =
        static_cast<int64_t>(table[p / at.block_size]) * at.block_size + p % at.block_size;
    return cache + (slot * KVH + kvh) * D;
  };
  const T* kc = static_cast<const T*>(at.key_cache);
  const T* vc = static_cast<const T*>(at.value_cache);
  const bool writer = blockIdx.x == gridDim.x - 1 && !active;  // heads < grid: has no head
  int new_slot = -1;
  if (writer) new_slot = *at.slot;
  // The context length and the block table (entries <= max_context <= kConsumers), then the K
  // and V rows' copies, all before the PDL wait (see above the function). The form before it
  // requested the table's entries before the wait but stored them, and issued the rows, after
  // it, behind q's request; that form had replaced the table waited for and the K rows loaded
  // into registers before the wait, measured on an H200
  // (2026-12-06 23:38 UTC, StarCoder b1 128 / 128 decode step, separate processes in rotation,
  // three rounds): 8.033 / 8.035 / 8.035 ms against 8.043 / 8.040 / 8.047 (-0.1%), its layer-20
  // head CTAs' wait returning with the others' (2.97 us median against 7.80).
  int entry = 0;
  const int entries = (at.max_context + at.block_size - 1) / at.block_size;
  if (active) {
    if (tid < entries) entry = at.block_table[tid];
    ctx = *at.context_len;
    if (tid < entries) table[tid] = entry;
    tma::NamedBarrier(kConsumerBarrier, kConsumers);  // the table
    if (ctx > G * kShortAttentionRows) __trap();      // the caller's max_context was not a bound
    {
      // The K and V rows before the newest into shared memory by the bulk-copy engine, all
      // requested by the last warp (a block's rows one copy where they are contiguous, with one
      // KV head; else a row a copy), K's first: no registers held, no load issued by the other
      // warps. The newest rows from the QKV row into registers by the threads that read them
      // (V's stored beside the others after the dot).
      const int p_new = ctx - 1;
      if (tid >= kConsumers - 32) {
        const int lane = tid - (kConsumers - 32);
        const int per = KVH == 1 ? at.block_size : 1;
        const int copies = (p_new + per - 1) / per;
        if (lane == 0) {
          tma::MbarArriveExpectTx(k_bar, static_cast<uint32_t>(p_new * D * 2));
          tma::MbarArriveExpectTx(v_bar, static_cast<uint32_t>(p_new * D * 2));
        }
        __syncwarp();
        auto copy_rows = [&](T* dst, const T* cache, uint32_t bar) {
          for (int b = lane; b < copies; b += 32) {
            const int p0 = b * per, rows = min(per, p_new - p0);
            BulkLoad(fwd::SmemAddr(dst + p0 * D), cached(cache, p0),
                     static_cast<uint32_t>(rows * D * 2), bar);
          }
        };
        copy_rows(ks, kc, k_bar);
        copy_rows(vs, vc, v_bar);
      }
    }
  }
  fwd::PdlWait();
  if (threadIdx.x == 0) Stamp<kStamps>(a, kChainPdlDone);
  fwd::PdlTrigger();
  // The KV write goes to a CTA without a head (heads < grid, or CTA 0 after its head).
  if (writer) WriteNewKv<T>(at, new_slot);
  if (active) {
    const T* qkv = static_cast<const T*>(at.qkv);
    const T* knew = qkv + static_cast<int64_t>(H + kvh) * D;
    const T* vnew = qkv + static_cast<int64_t>(H + KVH + kvh) * D;
    unsigned short q_bits = 0;
    if (tid < D) {
      q_bits =
          __ldcg(reinterpret_cast<const unsigned short*>(qkv + static_cast<int64_t>(h) * D + tid));
    }
    {
      const int p_new = ctx - 1;
      if (p_new >= g && (p_new - g) % G == 0) {
        klast = __ldcg(reinterpret_cast<const int4*>(knew + 8 * c));
        vlast = __ldcg(reinterpret_cast<const int4*>(vnew + 8 * c));
      }
    }
    if (tid < D) q_s[tid] = fwd::ToFloat(*reinterpret_cast<const T*>(&q_bits)) * at.scale;
    tma::NamedBarrier(kConsumerBarrier, kConsumers);
    if (tid == 0) {
      StampPhase<kStamps>(a, 0, kChainInputReady);
    }
    // Row g + j G's dot: this thread's 8 dimensions, then the sum over the row's lanes (every
    // lane of the row gets it; a row past the context is -inf).
    float dot[kShortAttentionRows];
    float mx = -INFINITY;
    {
      float qc[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) qc[e] = q_s[8 * c + e];
      tma::MbarWait(k_bar, 0);  // the bulk copies of K have landed
#pragma unroll
      for (int j = 0; j < kShortAttentionRows; ++j) {
        const int p = g + j * G;
        V k;
        *reinterpret_cast<int4*>(&k) = p == ctx - 1 ? klast
                                       : p < ctx
                                           ? *reinterpret_cast<const int4*>(ks + p * D + 8 * c)
                                           : int4{};
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(fwd::ToFloat(k.v[e]), qc[e], d);
        for (int o = chunks / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        dot[j] = g + j * G < ctx ? d : -INFINITY;
        mx = fmaxf(mx, dot[j]);
      }
    }
    // The newest V row beside the others (this thread's chunk, read back only by this thread).
    if (ctx - 1 >= g && (ctx - 1 - g) % G == 0) {
      *reinterpret_cast<int4*>(vs + (ctx - 1) * D + 8 * c) = vlast;
    }
    const float m = ConsumerMax(mx, red);  // its barriers: every thread's K reads are done
    if (tid == 0) {
      if (at.hold == 1) *hold_s = 1;  // K is read: the producer may fill the ring
      StampPhase<kStamps>(a, 0, kChainFirstFull);
    }
    float e_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kShortAttentionRows; ++j) {
      dot[j] = g + j * G < ctx ? __expf(dot[j] - m) : 0.0f;  // now the row's weight
      e_sum += dot[j];
    }
    const float sum = ConsumerSum(c == 0 ? e_sum : 0.0f, red);  // each row once
    float o[8] = {};
    tma::MbarWait(v_bar, 0);  // the bulk copies of V have landed
#pragma unroll
    for (int j = 0; j < kShortAttentionRows; ++j) {
      const int p = g + j * G;
      if (p < ctx) {
        const float w = dot[j];
        V v;
        *reinterpret_cast<int4*>(&v) = *reinterpret_cast<const int4*>(vs + p * D + 8 * c);
#pragma unroll
        for (int x = 0; x < 8; ++x) o[x] = fmaf(w, fwd::ToFloat(v.v[x]), o[x]);
      }
    }
    // The partials go over the V rows: every thread's P V is done first.
    tma::NamedBarrier(kConsumerBarrier, kConsumers);
    FinishHead<T>(at, partials, o, g, c, G, h, sum);
    if (tid == 0) {
      if (at.hold == 2) *hold_s = 1;  // the head is written
      StampPhase<kStamps>(a, 0, kChainLastRelease);
    }
  }
  if (blockIdx.x == 0 && gridDim.x - 1 < H) WriteNewKv<T>(at, *at.slot);
}

// Every CTA's consumers arrive; returns once all have (`target` arrivals in all). The phase's
// stores happen before (named barrier, then a gpu-scope release by the arriving thread, which the
// others' acquire loads pair with); loads after it go through L2 (ld.global.cg), never a stale L1
// line.
__device__ __forceinline__ void GridBarrier(unsigned* counter, unsigned target) {
  tma::NamedBarrier(kConsumerBarrier, kConsumers);
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
    unsigned seen;
    do {
      seen = fwd::LoadAcquireGpu(counter);
    } while (seen < target);
  }
  tma::NamedBarrier(kConsumerBarrier, kConsumers);
}

// This CTA's arrival on the grid counter without waiting (a phase with no barrier before it: an
// LL input, the fused MLP's down phase), so that the barriers after it and the last CTA out still
// count one arrival a CTA and phase.
__device__ __forceinline__ void GridArrive(unsigned* counter) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// Adds 8 fp32 values into the fused MLP's vector at `dst` (two 16-byte red.adds).
__device__ __forceinline__ void AddY32(float4* dst, const float* f) {
  atomicAdd(dst, make_float4(f[0], f[1], f[2], f[3]));
  atomicAdd(dst + 1, make_float4(f[4], f[5], f[6], f[7]));
}

// The LN weight and bias of `ph` into shared memory with cp.async (no register waits on them):
// thread t copies the 16-byte vectors t, t + kConsumers, ..., the same ones it reads in LoadInput,
// so its own cp.async.wait_all is all the ordering needed. Issued ahead of the phase's grid
// barrier (or PDL wait), so the copies are done by the time the input arrives.
template <typename T>
__device__ __forceinline__ void CopyLnParams(const ChainPhaseArgs& ph, T* lnw, T* lnb) {
  if (ph.ln_w == nullptr) return;
  const int nvec = ph.k / 8;
  for (int v = threadIdx.x; v < nvec; v += kConsumers) {
    fwd::CpAsync16(fwd::SmemAddr(lnw + 8 * v), static_cast<const T*>(ph.ln_w) + 8 * v, true);
    fwd::CpAsync16(fwd::SmemAddr(lnb + 8 * v), static_cast<const T*>(ph.ln_b) + 8 * v, true);
  }
  fwd::CpAsyncCommit();
}

// One LL word: an output element's bits beside its flag, stored at once.
template <typename T>
__device__ __forceinline__ void StoreLl(unsigned long long* w, T value, unsigned flag) {
  const unsigned long long word = (static_cast<unsigned long long>(flag) << 32) |
                                  *reinterpret_cast<const unsigned short*>(&value);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(w), "l"(word) : "memory");
}

// Eight consecutive LL words once every one carries `flag`, as eight elements of T (16 bytes).
__device__ __forceinline__ int4 PollLl(const unsigned long long* w, unsigned flag) {
  unsigned long long x[8];
  for (;;) {
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];\n"
                   : "=l"(x[j]), "=l"(x[j + 1])
                   : "l"(w + j)
                   : "memory");
    }
    bool ok = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) ok &= static_cast<unsigned>(x[j] >> 32) == flag;
    if (ok) break;
    __nanosleep(32);
  }
  int4 r;
  r.x = static_cast<int>((x[0] & 0xffff) | ((x[1] & 0xffff) << 16));
  r.y = static_cast<int>((x[2] & 0xffff) | ((x[3] & 0xffff) << 16));
  r.z = static_cast<int>((x[4] & 0xffff) | ((x[5] & 0xffff) << 16));
  r.w = static_cast<int>((x[6] & 0xffff) | ((x[7] & 0xffff) << 16));
  return r;
}

// The phase's input vector into `x` (shared memory, in T: every input is a T tensor, and a layer
// norm's output is rounded to T as LayerNormCuda writes it, so nothing is lost), normalised
// there where the phase has a layer norm (its parameters already copied by CopyLnParams). Thread
// t handles the 16-byte vectors t, t + kConsumers, ...; the caller's barrier publishes `x`.
// ll: the previous phase's LL words (ChainPhaseArgs::ll_in) carrying `flag`, or null: the input
// tensor, after the grid barrier.
template <typename T, bool kFused>
__device__ void LoadInput(const ChainPhaseArgs& ph, T* x, const T* lnw, const T* lnb, float* red,
                          const unsigned long long* ll, unsigned flag) {
  using V = fwd::Vec16<T>;
  const int nvec = ph.k / 8;
  const int4* in = static_cast<const int4*>(ph.input);
  int4* xs = reinterpret_cast<int4*>(x);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < nvec; v += kConsumers) {
    int4 raw;
    // The vectors v = blockIdx.x (mod grid) are this CTA's share of the fused MLP's writes.
    const bool share = kFused && ph.kind != kPhasePlain && v % gridDim.x == blockIdx.x;
    if (kFused &&
        ph.kind == kPhaseFromY32) {  // the fused MLP's sum, rounded once: the residual stream
      const float4* y = reinterpret_cast<const float4*>(ph.y32) + 2 * v;
      const float4 lo = __ldcg(y), hi = __ldcg(y + 1);
      const float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      V val;
#pragma unroll
      for (int e = 0; e < 8; ++e) val.v[e] = fwd::FromFloat<T>(f[e]);
      raw = *reinterpret_cast<const int4*>(&val);
      if (share) const_cast<int4*>(in)[v] = raw;  // nobody reads the stream in this phase
    } else {
      raw = ll != nullptr ? PollLl(ll + 8 * v, flag) : __ldcg(in + v);
    }
    if (kFused && ph.kind == kPhaseUp &&
        share) {  // the fused MLP's sum starts at residual + down bias
      V val, b;
      *reinterpret_cast<int4*>(&val) = raw;
      *reinterpret_cast<int4*>(&b) =
          ph.y32_bias != nullptr ? __ldg(static_cast<const int4*>(ph.y32_bias) + v) : int4{};
      float f[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = fwd::ToFloat(val.v[e]) + fwd::ToFloat(b.v[e]);
      AddY32(reinterpret_cast<float4*>(ph.y32) + 2 * v, f);
    }
    xs[v] = raw;
    if (ph.ln_w != nullptr) {
      V val;
      *reinterpret_cast<int4*>(&val) = raw;
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += fwd::ToFloat(val.v[e]);
    }
  }
  if (ph.ln_w == nullptr) return;
  const float mean = ConsumerSum(sum, red) / ph.k;
  float sq = 0.0f;
  for (int v = threadIdx.x; v < nvec; v += kConsumers) {  // this thread's own vectors
    V val;
    *reinterpret_cast<int4*>(&val) = xs[v];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = fwd::ToFloat(val.v[e]) - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(ConsumerSum(sq, red) / ph.k + ph.eps);
  fwd::CpAsyncWait<0>();  // this thread's LN vectors
  const V* w = reinterpret_cast<const V*>(lnw);
  const V* b = reinterpret_cast<const V*>(lnb);
  for (int v = threadIdx.x; v < nvec; v += kConsumers) {
    V val;
    *reinterpret_cast<int4*>(&val) = xs[v];
    const V wv = w[v], bv = b[v];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      val.v[e] = fwd::FromFloat<T>((fwd::ToFloat(val.v[e]) - mean) * rstd * fwd::ToFloat(wv.v[e]) +
                                   fwd::ToFloat(bv.v[e]));
    }
    xs[v] = *reinterpret_cast<const int4*>(&val);
  }
}

__device__ __forceinline__ float2 Widen2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 Widen2(__nv_bfloat162 h) { return __bfloat1622float2(h); }

// 16 bytes of weights (8 elements of T) dotted with 16 bytes of the input, in fp32.
template <typename T>
__device__ __forceinline__ float Dot8(const int4& w, const int4& x) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const T2* h = reinterpret_cast<const T2*>(&w);
  const T2* g = reinterpret_cast<const T2*>(&x);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = Widen2(h[i]), q = Widen2(g[i]);
    s = fmaf(p.x, q.x, s);
    s = fmaf(p.y, q.y, s);
  }
  return s;
}

// The consumers' stage loop of a tiled phase (kTileMaxRows): `rows` of the CTA's rows in tiles
// of ph.tile_rows, each tile ph.k / ph.tile_cols stages from slot s (pass `pass`) on; the tile's
// row sums are added into `acc` (indexed from the CTA's first row) once its last stage is folded.
// Lanes hold the MMA fragments: g = lane / 4 the accumulator row (all 16 A rows are the input, so
// every row holds the same sums), tq = lane % 4 the column pair, i.e. weight rows 8 q + 2 tq + e
// of the tile in d[q][e] (e < 2). Rows past `rows` in a tile's slot are left from earlier stages
// (anything, NaN included); they only reach their own accumulator columns, which are not added.
template <typename T, bool kStamps, typename Release>
__device__ __forceinline__ void TiledFold(const ChainArgs& a, const ChainPhaseArgs& ph, int gi,
                                          int rows, uint32_t ring_s, uint32_t full0, const T* xin,
                                          float* acc, int& s, uint32_t& pass, Release&& release) {
  const int R = ph.tile_rows, C = ph.tile_cols, nt = R / 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tq = lane & 3;
  const uint32_t stride = static_cast<uint32_t>(C) * sizeof(T) + kTilePad;
  // ldmatrix: lane i addresses row i % 8 (+ 8 for lanes 16..31) at columns 8 ((i / 8) % 2)..
  const uint32_t lane_off = ((lane & 7) + 8 * (lane >> 4)) * stride + ((lane >> 3) & 1) * 16;
  const int chunks = C / 16;
  bool first = true;
  for (int t0 = 0; t0 < rows; t0 += R) {
    float d[kTileMaxRows / 8][4] = {};
    for (int c0 = 0; c0 < ph.k; c0 += C) {
      tma::MbarWait(full0 + s * 8, pass & 1);
      if (threadIdx.x == 0 && first) StampPhase<kStamps>(a, gi, kChainFirstFull);
      first = false;
      if (!a.stream_only) {
        const uint32_t base = ring_s + s * a.slot_bytes + lane_off;
        for (int j = warp; j < chunks; j += kConsumerWarps) {
          const T* x = xin + c0 + 16 * j + 2 * tq;
          uint32_t af[4];
          af[0] = af[1] = *reinterpret_cast<const uint32_t*>(x);
          af[2] = af[3] = *reinterpret_cast<const uint32_t*>(x + 8);
          const uint32_t at = base + 32 * j;
#pragma unroll
          for (int p = 0; p < kTileMaxRows / 16; ++p) {
            if (2 * p + 1 < nt) {
              uint32_t b[4];
              mma::Ldmatrix4(b, at + 16 * p * stride);
              mma::Mma16816<T>(d[2 * p], af, b[0], b[1]);
              mma::Mma16816<T>(d[2 * p + 1], af, b[2], b[3]);
            } else if (2 * p < nt) {
              uint32_t b[2];
              mma::Ldmatrix2(b, at + 16 * p * stride);
              mma::Mma16816<T>(d[2 * p], af, b[0], b[1]);
            }
          }
        }
      }
      release();
    }
    if (lane < 4) {
#pragma unroll
      for (int q = 0; q < kTileMaxRows / 8; ++q) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = 8 * q + 2 * tq + e;
          if (q < nt && t0 + r < rows) atomicAdd(acc + t0 + r, d[q][e]);
        }
      }
    }
  }
}

// As Dot8 with the products summed in fp16 pairs (fwd::HalfPairDot8; DecodeChainTuning::
// half_fold); bf16: Dot8.
template <typename T>
__device__ __forceinline__ float Dot8HalfPairs(const int4& w, const int4& x) {
  if constexpr (std::is_same_v<T, __half>) {
    return fwd::HalfPairDot8(&w, &x);
  } else {
    return Dot8<T>(w, x);
  }
}

// The fused MLP's down projection, one stage: rows [0, nr) of the transposed weight (row_bytes
// each, from `stage`), row j times h[j], added into this thread's fp32 sums y of output chunks
// c0 and c0 + per_group (8 outputs each, where < row_chunks). With two groups (rows of at most
// kConsumers / 2 chunks) group g takes the rows j = g (mod 2). fp16: two rows' products summed
// as an HFMA2 pair (h is a rounded fp16 value), then widened; bf16: in fp32.
template <typename T>
__device__ __forceinline__ void AxpyStage(const unsigned char* stage, const float* h, int nr,
                                          int row_bytes, int groups, int grp, int c0, int per_group,
                                          int row_chunks, float (&y)[16]) {
  for (int j = grp; j < nr; j += 2 * groups) {
    const int j1 = j + groups;
    const bool two = j1 < nr;
    const float h0 = h[j], h1 = two ? h[j1] : 0.0f;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int c = c0 + u * per_group;
      if (c >= row_chunks) continue;
      const int4 w0 = *reinterpret_cast<const int4*>(stage + j * row_bytes + c * 16);
      int4 w1 = {0, 0, 0, 0};  // (never the stage's stale rows: 0 x NaN)
      if (two) w1 = *reinterpret_cast<const int4*>(stage + j1 * row_bytes + c * 16);
      if constexpr (std::is_same_v<T, __half>) {
        const __half2 a = __float2half2_rn(h0), b = __float2half2_rn(h1);
        const __half2* p = reinterpret_cast<const __half2*>(&w0);
        const __half2* q = reinterpret_cast<const __half2*>(&w1);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __half22float2(__hfma2(q[e], b, __hmul2(p[e], a)));
          y[8 * u + 2 * e] += f.x;
          y[8 * u + 2 * e + 1] += f.y;
        }
      } else {
        const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&w0);
        const __nv_bfloat162* q = reinterpret_cast<const __nv_bfloat162*>(&w1);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(p[e]), g = __bfloat1622float2(q[e]);
          y[8 * u + 2 * e] += f.x * h0 + g.x * h1;
          y[8 * u + 2 * e + 1] += f.y * h0 + g.y * h1;
        }
      }
    }
  }
}

// The first row of the fused MLP's pool item (ticket) t: CTA t % grid's (t / grid)-th donated
// stage of pool_rows rows, counting from the end of its rows (CtaRows) back.
__device__ __forceinline__ int PoolFirstRow(const ChainPhaseArgs& ph, int t) {
  const int o = t % static_cast<int>(gridDim.x), q = t / static_cast<int>(gridDim.x);
  return static_cast<int>(static_cast<int64_t>(o + 1) * ph.n / gridDim.x) -
         (ph.pool - q) * ph.pool_rows;
}

// Whether ring slot `full` (pass `pass`) holds another stage of the phase (true), or the phase has
// ended: its producer published in *count that it streamed `consumed` stages. The count is
// published before any stage of the next phase is loaded, so a full stage seen with the count
// still unknown is this phase's.
__device__ __forceinline__ bool NextStageOrEnd(uint32_t full, uint32_t pass, const int* count,
                                               int consumed) {
  for (;;) {
    const bool f = tma::MbarTest(full, pass & 1);
    if (*reinterpret_cast<volatile const int*>(count) == consumed) return false;
    if (f) return true;
  }
}

// A consumer warp is done with ring slot s: its lane 0 arrives on the slot's empty barrier, and
// (s, pass) advance.
__device__ __forceinline__ void ReleaseStage(uint32_t empty0, int& s, uint32_t& pass, int stages) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) tma::MbarArrive(empty0 + s * 8);
  if (++s == stages) {
    s = 0;
    ++pass;
  }
}

// The fused MLP's down projection (kPhaseDown) for the consumers: no barrier and no input (the
// up outputs `up_out` are this CTA's own, published by the named barrier); stage after stage of
// whole transposed rows from ring slot s (pass `pass`), then the sums added into y32; returns the
// ring position after it {s, pass}. Not inlined: its sixteen fp32 sums would otherwise raise the
// register pressure of the whole kernel (spills).
// With a pool (ChainPhaseArgs::pool), the CTA's own donated rows are left out, and then the
// stages the producer took by ticket are folded, their up outputs read from the owners' copies in
// the workspace (once the owner's flag says `epoch` + 1) into `pool_h` (shared); the producer
// lists them in `stolen` and publishes their count in `*streamed` (as for work stealing).
template <typename T, bool kStamps>
__device__ __noinline__ uint2 DownPhase(const ChainArgs& a, const ChainPhaseArgs& ph, int gi,
                                        const unsigned char* ring, uint32_t full0, uint32_t empty0,
                                        const float* up_out, int s, uint32_t pass,
                                        const int* stolen, const int* streamed, unsigned epoch,
                                        float* pool_h) {
  const bool t0 = threadIdx.x == 0;
  if (t0) GridArrive(a.counter);
  tma::NamedBarrier(kConsumerBarrier, kConsumers);
  int r0, r1;
  CtaRows(a, ph, r0, r1);
  r1 -= ph.pool * ph.pool_rows;
  const int row_chunks = ph.k / 8;  // 16-byte chunks of a row (k: the output length)
  const int groups = row_chunks <= kConsumers / 2 ? 2 : 1;
  const int per_group = kConsumers / groups;
  const int grp = static_cast<int>(threadIdx.x) / per_group;
  const int c0 = static_cast<int>(threadIdx.x) % per_group;
  const int row_bytes = ph.k * static_cast<int>(sizeof(T));
  const int rows_stage = a.stage_bytes / row_bytes;
  float y[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) y[e] = 0.0f;
  if (t0) Stamp<kStamps>(a, kChainLoopStart + gi);
  for (int rb = 0; rb < r1 - r0; rb += rows_stage) {
    tma::MbarWait(full0 + s * 8, pass & 1);
    if (t0 && rb == 0) StampPhase<kStamps>(a, gi, kChainFirstFull);
    if (!a.stream_only) {
      AxpyStage<T>(ring + s * a.slot_bytes, up_out + rb, min(rows_stage, r1 - r0 - rb), row_bytes,
                   groups, grp, c0, per_group, row_chunks, y);
    }
    ReleaseStage(empty0, s, pass, a.stages);
  }
  int consumed = (r1 - r0 + rows_stage - 1) / rows_stage;
  for (int taken = 0; ph.pool > 0; ++taken) {
    if (!NextStageOrEnd(full0 + s * 8, pass, streamed, consumed)) break;
    const int t = stolen[taken];
    const int o = t % static_cast<int>(gridDim.x);  // the owner, whose flag says its rows are in
    const int first = PoolFirstRow(ph, t);
    if (threadIdx.x < static_cast<unsigned>(ph.pool_rows)) {
      unsigned f;
      do {
        f = fwd::LoadAcquireGpu(ph.flags + o);
      } while (f != epoch + 1);
      pool_h[threadIdx.x] = __ldcg(ph.up_g + first + threadIdx.x);
    }
    tma::NamedBarrier(kConsumerBarrier, kConsumers);
    if (!a.stream_only) {
      AxpyStage<T>(ring + s * a.slot_bytes, pool_h, ph.pool_rows, row_bytes, groups, grp, c0,
                   per_group, row_chunks, y);
    }
    tma::NamedBarrier(kConsumerBarrier, kConsumers);  // pool_h is rewritten next
    ReleaseStage(empty0, s, pass, a.stages);
    ++consumed;
  }
  if (t0) StampPhase<kStamps>(a, gi, kChainLastRelease);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int c = c0 + u * per_group;
    if (c < row_chunks) {
      AddY32(reinterpret_cast<float4*>(ph.y32) + 2 * c, y + 8 * u);
    }
  }
  if (t0) StampPhase<kStamps>(a, gi, kChainEpilogueDone);
  return make_uint2(static_cast<unsigned>(s), pass);
}

// kFoldRowsFused / kFoldHalfPairsFused: the same folds with the fused MLP's code
// (DecodeChainTuning::fused_mlp; kinds kPhaseUp..kPhaseFromY32), bf16's and fp16's.
enum ChainFold : int {
  kFoldRows = 0,
  kFoldTiles = 1,
  kFoldHalfPairs = 2,
  kFoldRowsFused = 3,
  kFoldHalfPairsFused = 4,
};
// Measured default (-1) of DecodeChainTuning::half_fold: on. H200, 2026-12-04 ~14:16 UTC,
// mqabench latency StarCoder b1 --chain auto,hf,auto,hf: decode step 8.006 / 8.046 ms with the
// fp32 fold, 7.947 / 7.948 with fp16 pairs (1.0357 / 1.0339 -> 1.0202 / 1.0206 s); SantaCoder with
// the chain on every layer 1.177 -> 1.145 ms; one StarCoder layer in isolation equal (186.5 /
// 186.7 us, consume only 171.6 -> 155.9). HF parity (the chain rows) 0.00205 either way.
constexpr int kDefaultHalfFold = 1;

// Shared memory: the ring (stages x stage_bytes), the input (in_bytes), the LN weight and bias
// (ln_k elements of T each), the row sums (max rows a CTA x fp32), the stages' full / empty
// barriers, the reduction scratch; for work stealing, the chunks the producer took in each phase
// and, once it knows, how many stages it streamed for the phase.
// kFold: kFoldRows (the row-run layout, fp32 fold), kFoldTiles (some phase has the tiled layout)
// or kFoldHalfPairs (row runs, DecodeChainTuning::half_fold); separate instantiations, so that the
// default kernel keeps its register allocation.
template <typename T, bool kStamps, int kFold>
__global__ void __launch_bounds__(kThreads, 1)
    DecodeChainKernel(const __grid_constant__ ChainArgs a) {
  constexpr bool kTiled = kFold == kFoldTiles;
  constexpr bool kFused = kFold == kFoldRowsFused || kFold == kFoldHalfPairsFused;
  constexpr bool kHalf = kFold == kFoldHalfPairs || kFold == kFoldHalfPairsFused;
  extern __shared__ __align__(1024) unsigned char smem[];
  const int stages = a.stages;
  unsigned char* ring = smem;
  T* xin = reinterpret_cast<T*>(smem + stages * a.slot_bytes);
  T* lnw = reinterpret_cast<T*>(smem + stages * a.slot_bytes + a.in_bytes);
  T* lnb = lnw + a.ln_k;
  float* acc = reinterpret_cast<float*>(lnb + a.ln_k);
  float* up_out = acc + a.acc_floats;  // the fused MLP's up outputs (the CTA's rows)
  __shared__ __align__(8) uint64_t bars[2 * kMaxStages];
  __shared__ __align__(8) uint64_t v_bar;  // the short form's V rows (ShortAttentionPhase)
  __shared__ __align__(8) uint64_t k_bar;  // its K rows, in the ring (its producer held)
  __shared__ float red[kConsumerWarps];
  __shared__ int stolen[kMaxDecodeChainPhases][kMaxStealChunks];
  __shared__ int phase_stages[kMaxDecodeChainPhases];
  __shared__ int hold_s;  // ChainAttentionArgs::hold: set by ShortAttentionPhase
  const uint32_t ring_s = fwd::SmemAddr(ring);
  const uint32_t side_s = fwd::SmemAddr(smem + a.side_offset);
  const uint32_t full0 = fwd::SmemAddr(bars);
  const uint32_t empty0 = full0 + kMaxStages * 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      tma::MbarInit(full0 + s * 8, 1);
      tma::MbarInit(empty0 + s * 8, kConsumerWarps);
    }
    for (int i = 0; i < kMaxDecodeChainPhases; ++i) phase_stages[i] = -1;
    tma::MbarInit(fwd::SmemAddr(&v_bar), 1);
    tma::MbarInit(fwd::SmemAddr(&k_bar), 1);
    hold_s = 0;
    tma::FenceMbarInit();
  }
  __syncthreads();
  if constexpr (kStamps) {
    if (threadIdx.x == 0) {
      a.stamps[static_cast<int64_t>(blockIdx.x) * kDecodeChainTimelineWords + kChainGlobalStart] =
          GlobalTimer();
      Stamp<kStamps>(a, kChainClockStart);
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;\n" : "=r"(smid));
      a.stamps[static_cast<int64_t>(blockIdx.x) * kDecodeChainTimelineWords + kChainSmId] = smid;
    }
  }

  if (warp == kConsumerWarps) {  // the producer: weights only, so before the PDL wait too
    if (lane == 0) {
      const uint64_t policy = tma::EvictFirstPolicy();
      const int stage_bytes = a.stage_bytes;
      const int slot_bytes = a.slot_bytes;
      int s = 0;
      uint32_t pass = 0;
      // The stage issued `inflight` loads ago (ws, wpass): with an in-flight limit the producer
      // waits for its arrival before issuing the next, so that the SM's queue of requests stays
      // short and the consumers' own loads (input, barrier, residual) do not wait behind it.
      int ws = 0, issued = 0;
      uint32_t wpass = 0;
      // One stage of `len` bytes: `copy(dst, bar)` issues its bulk loads into slot s.
      auto issue = [&](uint32_t len, auto&& copy) {
        if (pass > 0) tma::MbarWait(empty0 + s * 8, (pass - 1) & 1);
        if (a.inflight > 0 && issued >= a.inflight) {
          tma::MbarWait(full0 + ws * 8, wpass & 1);
          if (++ws == stages) {
            ws = 0;
            ++wpass;
          }
        }
        if (a.consume_only) {
          tma::MbarArrive(full0 + s * 8);
        } else {
          tma::MbarArriveExpectTx(full0 + s * 8, len);
          copy(ring_s + s * slot_bytes, full0 + s * 8);
        }
        ++issued;
        if (++s == stages) {
          s = 0;
          ++pass;
        }
      };
      // A ticket of phase i's steal counter. The previous launch's last CTA left the counters at
      // zero, and the PDL wait is what orders that before this: no ticket is taken before it.
      bool waited = false;
      auto ticket = [&](int i) -> int {
        if (!waited) {
          fwd::PdlWait();
          waited = true;
        }
        return static_cast<int>(atomicAdd(StealCounter(a, i), 1u));
      };
      if (a.has_attention && a.at.hold && blockIdx.x < a.at.heads) {
        while (*reinterpret_cast<volatile int*>(&hold_s) == 0) __nanosleep(64);
      }
      for (int i = 0; i < a.num_phases; ++i) {
        const ChainPhaseArgs& ph = a.ph[i];
        int r0, r1;
        CtaRows(a, ph, r0, r1);
        const bool pooled = kFused && ph.kind == kPhaseDown && ph.pool > 0;
        if (pooled) r1 -= ph.pool * ph.pool_rows;  // the donated rows: below, by ticket
        const int64_t row_bytes = static_cast<int64_t>(ph.k) * sizeof(T);
        const char* w = static_cast<const char*>(ph.w);
        const char* src = w + r0 * row_bytes;
        const int64_t bytes = (r1 - r0) * row_bytes;
        const bool steal = ph.rows_chunk > 0;
        const int event = kChainProducerEvents + 2 * (i + a.has_attention);
        if (bytes > 0 || steal) Stamp<kStamps>(a, event);
        // Tickets are requested three chunks ahead of their use (an atomic waits behind the
        // SM's queue of bulk loads): the first three before the last three static stages.
        const int static_stages = static_cast<int>((bytes + stage_bytes - 1) / stage_bytes);
        int streamed = 0, ta = 0, tb = 0, tc = 0;
        if (kTiled && ph.tile_rows > 0) {  // the tiled layout: row tiles, each C columns a stage
          const uint32_t row_len = static_cast<uint32_t>(ph.tile_cols) * sizeof(T);
          for (int t0 = 0; t0 < r1 - r0; t0 += ph.tile_rows) {
            const int rows = min(ph.tile_rows, r1 - r0 - t0);
            for (int c0 = 0; c0 < ph.k; c0 += ph.tile_cols) {
              const char* tile = w + (r0 + t0) * row_bytes + c0 * static_cast<int64_t>(sizeof(T));
              issue(rows * row_len, [&](uint32_t dst, uint32_t bar) {
                for (int r = 0; r < rows; ++r) {
                  BulkLoad(dst + r * (row_len + kTilePad), tile + r * row_bytes, row_len, bar,
                           policy);
                }
              });
            }
          }
        }
        for (int64_t off = 0; (!kTiled || ph.tile_rows == 0) && off < bytes;
             off += stage_bytes, ++streamed) {
          if (steal) {
            if (streamed == max(0, static_stages - 3)) ta = ticket(i);
            if (streamed == max(0, static_stages - 2)) tb = ticket(i);
            if (streamed == static_stages - 1) tc = ticket(i);
          }
          const uint32_t len =
              static_cast<uint32_t>(bytes - off < stage_bytes ? bytes - off : stage_bytes);
          issue(len,
                [&](uint32_t dst, uint32_t bar) { BulkLoad(dst, src + off, len, bar, policy); });
        }
        if (steal) {
          if (bytes == 0) {
            ta = ticket(i);
            tb = ticket(i);
            tc = ticket(i);
          }
          // Chunks past the static ones, one ticket each, oldest first (a CTA's tickets rise, so
          // once one is past the pool the younger ones are too); each use requests a ticket in
          // its place while the CTA may take more. The consumers find the chunk in stolen[i].
          const int base = static_cast<int>(gridDim.x) * ph.static_chunks;
          int taken = 0;
          auto take = [&](int& t) -> bool {
            const int c = base + t;
            if (c >= ph.chunks) return false;
            stolen[i][taken++] = c;
            t = taken + 3 <= ph.max_steal ? ticket(i) : ph.chunks;
            const int rows = min(ph.rows_chunk, ph.n - c * ph.rows_chunk);
            // The chunk's bias: the 16-byte aligned span that holds it (the host checked the
            // bias is 16-byte aligned and n a multiple of 8, so the span stays inside it).
            const char* side = nullptr;
            uint32_t side_len = 0;
            if (ph.bias != nullptr) {
              const uintptr_t b = reinterpret_cast<uintptr_t>(ph.bias) + 2u * c * ph.rows_chunk;
              const uintptr_t b0 = b & ~uintptr_t{15};
              side = reinterpret_cast<const char*>(b0);
              side_len = static_cast<uint32_t>((b + 2u * rows - b0 + 15) & ~uintptr_t{15});
            }
            const char* src = w + static_cast<int64_t>(c) * ph.rows_chunk * row_bytes;
            const uint32_t len = static_cast<uint32_t>(rows * row_bytes);
            issue(len + side_len, [&](uint32_t dst, uint32_t bar) {
              BulkLoad(dst, src, len, bar, policy);
              if (side_len > 0) BulkLoad(side_s + s * kBiasSideBytes, side, side_len, bar);
            });
            ++streamed;
            return true;
          };
          while (take(ta) && take(tb) && take(tc)) {
          }
          // Before any stage of the next phase, whose full barrier's arrival publishes it.
          *reinterpret_cast<volatile int*>(&phase_stages[i]) = streamed;
        }
        if (kFused && pooled) {
          // The pool of donated stages (PoolFirstRow): a stage each, until the pool is empty (or
          // the list is full: no ticket is taken that would not be streamed).
          const int items = static_cast<int>(gridDim.x) * ph.pool;
          const uint32_t len = static_cast<uint32_t>(ph.pool_rows * row_bytes);
          for (int taken = 0; taken < kMaxStealChunks; ++taken) {
            const int t = ticket(i);
            if (t >= items) break;
            stolen[i][taken] = t;
            const char* from = w + static_cast<int64_t>(PoolFirstRow(ph, t)) * row_bytes;
            issue(len, [&](uint32_t dst, uint32_t bar) { BulkLoad(dst, from, len, bar, policy); });
            ++streamed;
          }
          *reinterpret_cast<volatile int*>(&phase_stages[i]) = streamed;
        }
        if (bytes > 0 || steal) Stamp<kStamps>(a, event + 1);
      }
      Stamp<kStamps>(a, kChainProducerDone);
    }
    return;
  }

  // Consumers. A phase's constants are requested ahead of the wait that precedes it (the PDL
  // wait for the first, the grid barrier for the others): its LN parameters into shared memory,
  // and the bias of row threadIdx.x into a register where the CTA has at most one row a thread.
  // (The raw bits stay in the register until the epilogue converts them: converting here would
  // wait for the load before the barrier.)
  auto bias_of = [&](const ChainPhaseArgs& ph) -> unsigned short {
    int r0, r1;
    CtaRows(a, ph, r0, r1);
    const int r = r0 + static_cast<int>(threadIdx.x);
    return ph.bias != nullptr && r < r1 ? static_cast<const unsigned short*>(ph.bias)[r] : 0;
  };
  unsigned short bias_reg = 0;
  // The row sums to zero (shared memory only): the most rows this CTA holds in any phase.
  // Before the PDL wait, in every CTA: the loop bounds read every phase's kernel parameters, the
  // first reads of phases 1-3's on this SM (constant-cache misses behind the other SMs' ring
  // fills); after the wait they held each CTA ~1.7 us, a head CTA on the attention window's
  // critical path (NOTES version 50: -0.3..-0.4% a StarCoder b1 step on an H100).
  {
    int max_rows = 0;
    for (int i = 0; i < a.num_phases; ++i) max_rows = max(max_rows, CtaMaxRows(a, a.ph[i]));
    for (int r = threadIdx.x; r < max_rows; r += kConsumers) acc[r] = 0.0f;
  }
  if (!a.has_attention) {
    CopyLnParams<T>(a.ph[0], lnw, lnb);
    bias_reg = bias_of(a.ph[0]);
  }
  float* scores = reinterpret_cast<float*>(xin);
  const int capacity = a.in_bytes / 8;  // floats in each half of the input buffer
  if (a.has_attention && a.at.short_context) {
    ShortAttentionPhase<T, kStamps>(a, red, &hold_s, reinterpret_cast<unsigned char*>(xin), &v_bar,
                                    ring, &k_bar);  // the PDL wait inside
  } else {
    fwd::PdlWait();
    if (threadIdx.x == 0) Stamp<kStamps>(a, kChainPdlDone);
    fwd::PdlTrigger();
  }
  // The slot's launch epoch: this launch's LL flags (the last CTA out of the previous launch
  // advanced it; the PDL wait orders that before this load). Only where the launch has an LL
  // boundary: thread 0 waits for the load here, ahead of its share of the first input.
  // (Kept in shared memory, read where used: a register across the stage loop spills.)
  __shared__ unsigned epoch_s;
  if (threadIdx.x == 0 && (a.ll || kFused)) epoch_s = __ldcg(a.counter + kEpochOffset / 4);
  __shared__ float pool_h[kMaxPoolRows];  // the fused MLP's donated rows' up outputs
  auto ll_area = [&](int gi) {
    return reinterpret_cast<unsigned long long*>(reinterpret_cast<char*>(a.counter) +
                                                 kCounterStride + (gi & 1) * kLlAreaBytes);
  };
  // The fused MLP's vector back to zero: the launch before on this slot (the last to read it)
  // is complete (the PDL wait above), and the grid barrier before the up phase orders these
  // stores before any addition into it.
  for (int v = blockIdx.x * kConsumers + threadIdx.x; kFused && v < a.y32_n / 4;
       v += gridDim.x * kConsumers) {
    reinterpret_cast<float4*>(a.y32)[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  if (a.has_attention) {
    if (!a.at.short_context)
      AttentionPhase<T, kStamps>(a, scores, capacity, scores + capacity, red);
    if (threadIdx.x == 0) StampPhase<kStamps>(a, 0, kChainEpilogueDone);
  }

  int s = 0;
  uint32_t pass = 0;
  auto release = [&]() { ReleaseStage(empty0, s, pass, stages); };
  for (int i = 0; i < a.num_phases; ++i) {
    const ChainPhaseArgs& ph = a.ph[i];
    const int gi = i + a.has_attention;  // the phase's index counting the attention
    const bool t0 = threadIdx.x == 0;    // the thread that stamps the timeline
    if (kFused && ph.kind == kPhaseDown) {
      const uint2 at = DownPhase<T, kStamps>(a, ph, gi, ring, full0, empty0, up_out, s, pass,
                                             stolen[i], &phase_stages[i], epoch_s, pool_h);
      s = static_cast<int>(at.x);
      pass = at.y;
      continue;
    }
    if (gi > 0) {
      CopyLnParams<T>(ph, lnw, lnb);  // in flight through the barrier
      bias_reg = bias_of(ph);
      if (t0) StampPhase<kStamps>(a, gi, kChainBarrierEnter);
      if (ph.ll_in) {
        // No wait: the input's LL words say when it is there. The arrival keeps the counter's
        // targets (and the last CTA's count) as with a barrier.
        if (t0)
          GridArrive(a.counter);
      } else {
        GridBarrier(a.counter, static_cast<unsigned>(gi) * gridDim.x);
      }
      if (t0) StampPhase<kStamps>(a, gi, kChainBarrierExit);
    }
    int r0, r1;
    CtaRows(a, ph, r0, r1);
    // The residual this phase adds to row threadIdx.x, loaded beside the input.
    T* out = static_cast<T*>(ph.out);
    float residual = 0.0f;
    if (ph.accumulate && threadIdx.x < r1 - r0) {
      const unsigned short bits =
          __ldcg(reinterpret_cast<const unsigned short*>(out + r0 + threadIdx.x));
      residual = fwd::ToFloat(*reinterpret_cast<const T*>(&bits));
    }
    LoadInput<T, kFused>(ph, xin, lnw, lnb, red, ph.ll_in ? ll_area(gi - 1) : nullptr,
                         epoch_s * 8 + static_cast<unsigned>(gi));
    tma::NamedBarrier(kConsumerBarrier, kConsumers);
    if (t0) StampPhase<kStamps>(a, gi, kChainInputReady);

    const int k = ph.k;
    const int64_t bytes = static_cast<int64_t>(r1 - r0) * k * sizeof(T);
    const int stage_bytes = a.stage_bytes;
    const int slot_bytes = a.slot_bytes;
    const int stage_elems = stage_bytes / static_cast<int>(sizeof(T));
    // Each warp takes a contiguous block of a stage's segments (so it mostly stays in one row
    // and reduces once a stage); its loads of up to four segments are issued together.
    const int per_warp = stage_bytes / kSegBytes / kConsumerWarps;
    // (row, col) of this warp's first segment in the next stage, advanced a stage at a time.
    int row_b = (warp * per_warp * kSegElems) / k;
    int col_b = warp * per_warp * kSegElems - row_b * k;
    int cur = -1;  // the row `part` belongs to
    float part = 0.0f;
    auto flush = [&]() {
      float v = part;
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) atomicAdd(acc + cur, v);
      part = 0.0f;
    };
    // Folds this warp's segments [j0, j1) of `stage`, the first at row sum `row`, column `col`.
    auto fold = [&](const unsigned char* stage, int j0, int j1, int row, int col) {
      for (int j = j0; j < j1; j += 4) {
        int4 w[4], x[4];
        int rows[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (j + u < j1) {
            rows[u] = row;
            w[u] = *reinterpret_cast<const int4*>(stage + (j + u) * kSegBytes + lane * 16);
            x[u] = *reinterpret_cast<const int4*>(xin + col + 8 * lane);
            col += kSegElems;
            if (col == k) {
              col = 0;
              ++row;
            }
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (j + u < j1) {
            const float d = kHalf ? Dot8HalfPairs<T>(w[u], x[u]) : Dot8<T>(w[u], x[u]);
            if (rows[u] != cur) {
              if (cur >= 0) flush();
              cur = rows[u];
            }
            part += d;
          }
        }
      }
    };
    if (t0) Stamp<kStamps>(a, kChainLoopStart + gi);
    if constexpr (kTiled) {
      if (ph.tile_rows > 0) {
        TiledFold<T, kStamps>(a, ph, gi, r1 - r0, ring_s, full0, xin, acc, s, pass, release);
      }
    }
    for (int64_t off = 0; (!kTiled || ph.tile_rows == 0) && off < bytes; off += stage_bytes) {
      const int segs =
          static_cast<int>(bytes - off < stage_bytes ? bytes - off : stage_bytes) / kSegBytes;
      const int j0 = warp * per_warp, j1 = min(j0 + per_warp, segs);
      tma::MbarWait(full0 + s * 8, pass & 1);
      if (t0 && off == 0) StampPhase<kStamps>(a, gi, kChainFirstFull);
      if (!a.stream_only && j0 < j1) fold(ring + s * slot_bytes, j0, j1, row_b, col_b);
      release();
      col_b += stage_elems;
      while (col_b >= k) {
        col_b -= k;
        ++row_b;
      }
    }
    // Row sums in use: the static rows, then rows_chunk for each stolen chunk.
    int rows = r1 - r0;
    if (ph.rows_chunk > 0) {
      const int R = ph.rows_chunk;
      int consumed = static_cast<int>((bytes + stage_bytes - 1) / stage_bytes);
      for (int taken = 0;; ++taken) {
        // The next stage, or the phase's end: the producer publishes how many stages it streamed
        // for the phase before it loads any of the next phase's (NextStageOrEnd).
        const bool full = NextStageOrEnd(full0 + s * 8, pass, &phase_stages[i], consumed);
        __syncwarp();
        if (!full) break;
        if (t0 && bytes == 0 && taken == 0) StampPhase<kStamps>(a, gi, kChainFirstFull);
        const int c = stolen[i][taken];
        const int chunk_rows = min(R, ph.n - c * R);
        // The chunk's bias (it came with the stage, into the side buffer) into the registers of
        // the threads whose row sums it fills, as a static row's. (Its residual is not loaded:
        // the epilogue adds into the output.)
        const unsigned q = threadIdx.x - static_cast<unsigned>(rows);
        if (q < static_cast<unsigned>(chunk_rows) && ph.bias != nullptr) {
          const unsigned short* side =
              reinterpret_cast<const unsigned short*>(smem + a.side_offset + s * kBiasSideBytes);
          bias_reg = side[(c * R) % 8 + static_cast<int>(q)];
        }
        const int j0 = warp * per_warp, j1 = min(j0 + per_warp, chunk_rows * k / kSegElems);
        if (!a.stream_only && j0 < j1) {
          fold(ring + s * slot_bytes, j0, j1, rows + j0 * kSegElems / k, j0 * kSegElems % k);
        }
        release();
        ++consumed;
        rows += R;
      }
    }
    if (cur >= 0) flush();
    tma::NamedBarrier(kConsumerBarrier, kConsumers);
    if (t0) StampPhase<kStamps>(a, gi, kChainLastRelease);

    // Epilogue: bias, GELU, residual, store; the sums back to zero for the next phase. Row sum
    // threadIdx.x's bias and residual are in registers already; further ones (a CTA with more
    // rows than threads) load theirs here. A stolen row's residual is not loaded (the load would
    // be issued late, and wait behind the ring's bulk loads): its sum is added to the output in
    // place (one rounding more than a static row's).
    const T* bias = static_cast<const T*>(ph.bias);
    for (int r = threadIdx.x; r < rows; r += kConsumers) {
      float v = acc[r];
      acc[r] = 0.0f;
      int row = r0 + r;  // a static row, or a stolen chunk's (none past n in a short last chunk)
      const bool stolen_row = r >= r1 - r0;
      if (stolen_row) {
        const int d = r - (r1 - r0);
        row = stolen[i][d / ph.rows_chunk] * ph.rows_chunk + d % ph.rows_chunk;
        if (row >= ph.n) continue;
      }
      const bool first = r == static_cast<int>(threadIdx.x);
      if (first) {
        v += fwd::ToFloat(*reinterpret_cast<const T*>(&bias_reg));
      } else if (bias != nullptr) {
        v += fwd::ToFloat(bias[row]);
      }
      if (ph.gelu) v = fwd::Activate<1>(v);
      if (kFused && ph.kind == kPhaseUp) {  // kept for the down projection, as the dtype holds it
        up_out[r] = fwd::ToFloat(fwd::FromFloat<T>(v));
        if (r >= r1 - r0 - ph.pool * ph.pool_rows) ph.up_g[row] = up_out[r];  // donated
        continue;
      }
      T* o = out + row;
      if (ph.accumulate && stolen_row) {
        RedAdd(o, fwd::FromFloat<T>(v));
        continue;
      }
      if (ph.accumulate) {
        if (first) {
          v += residual;
        } else {
          const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(o));
          v += fwd::ToFloat(*reinterpret_cast<const T*>(&bits));
        }
      }
      const T value = fwd::FromFloat<T>(v);
      *o = value;
      if (ph.ll_out) StoreLl(ll_area(gi) + row, value, epoch_s * 8 + static_cast<unsigned>(gi) + 1);
    }
    if (kFused && ph.kind == kPhaseUp && ph.pool > 0) {  // the donated rows' outputs are written
      tma::NamedBarrier(kConsumerBarrier, kConsumers);
      if (t0) {
        asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(ph.flags + blockIdx.x),
                     "r"(epoch_s + 1)
                     : "memory");
      }
    }
    if (t0) StampPhase<kStamps>(a, gi, kChainEpilogueDone);
  }
  // The last CTA out leaves the counters at zero for the next launch (every CTA's producer has
  // taken its last ticket: its consumers saw the phase's stage count, published after it).
  bool steals = false;
  for (int i = 0; i < a.num_phases; ++i) steals |= a.ph[i].rows_chunk > 0;
  if ((a.num_phases + a.has_attention > 1 || steals) && threadIdx.x == 0) {
    const unsigned total = static_cast<unsigned>(a.num_phases + a.has_attention) * gridDim.x;
    if (atomicAdd(a.counter, 1u) == total - 1) {
      atomicExch(a.counter, 0u);
      atomicAdd(a.counter + kEpochOffset / 4, 1u);  // the next launch's LL flags
      for (int i = 0; i < a.num_phases; ++i) {
        if (a.ph[i].rows_chunk > 0 || a.ph[i].pool > 0) atomicExch(StealCounter(a, i), 0u);
      }
    }
  }
  if constexpr (kStamps) {
    if (threadIdx.x == 0) {
      Stamp<kStamps>(a, kChainClockEnd);
      a.stamps[static_cast<int64_t>(blockIdx.x) * kDecodeChainTimelineWords + kChainGlobalEnd] =
          GlobalTimer();
    }
  }
}

// Static shared memory (barriers, scratch) comes out of the same opt-in budget as the dynamic.
constexpr size_t kStaticSmem = 2 * kMaxStages * 8 + kConsumerWarps * 4 +
                               (kMaxStealChunks + 1) * kMaxDecodeChainPhases * 4 +
                               kMaxPoolRows * 4 + 1024;

// The tiled layout's shape for a phase of `max_rows` rows a CTA (at most) and k columns, stages of
// at most `stage_elems` elements: R a multiple of 8 up to kTileMaxRows (exactly `rows` where that
// is > 0), C a multiple of 64 that divides k, R x C <= stage_elems; the fewest stages a CTA
// (ceil(max_rows / R) x k / C), then the fewest rows: each row of a stage is one bulk copy, and
// copies of 1-1.5 KiB (32 rows a 32 or 48 KiB stage) streamed a StarCoder layer 21-47% slower than
// whole stages (H200, 2026-12-04, gemm_bench --chain only). {0, 0} where none fits.
std::pair<int, int> TileShape(int64_t max_rows, int64_t k, int64_t stage_elems, int rows) {
  std::pair<int, int> best = {0, 0};
  int64_t best_stages = INT64_MAX;
  for (int r = 8; r <= kTileMaxRows; r += 8) {
    if (rows > 0 && r != rows) continue;
    int64_t c = std::min<int64_t>(k, stage_elems / r) / 64 * 64;
    while (c >= 64 && k % c != 0) c -= 64;
    if (c < 64) continue;
    const int64_t stages = std::max<int64_t>(1, (max_rows + r - 1) / r) * (k / c);
    if (stages < best_stages) {
      best_stages = stages;
      best = {r, static_cast<int>(c)};
    }
  }
  return best;
}

// The calling thread's device: its opt-in shared memory, and per dtype (fp16, bf16)
// whether the kernel's dynamic shared-memory limit is raised to the most a launch asks for
// (smem_optin - kStaticSmem) and one CTA of that size was found to fit on an SM.
struct LaunchInfo {
  int device = -1;
  int smem_optin = 0;
  bool configured[2][2][5] = {};  // [bf16][timeline][fold]
};

absl::StatusOr<LaunchInfo*> DeviceLaunchInfo() {
  static thread_local LaunchInfo info;
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (info.device != device) {
    LaunchInfo fresh;
    CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&fresh.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    fresh.device = device;
    info = fresh;
  }
  return &info;
}

// 32 x 32 tiles of 2-byte elements through shared memory (the padding column keeps the
// transposed reads free of bank conflicts); 32 x 8 threads, four rows each.
__global__ void __launch_bounds__(256)
    TransposeKernel(const unsigned short* w, unsigned short* wt, int64_t n, int64_t k) {
  __shared__ unsigned short tile[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32,
                c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int r = threadIdx.y; r < 32; r += 8) {
    if (r0 + r < n && c0 + threadIdx.x < k)
      tile[r][threadIdx.x] = w[(r0 + r) * k + c0 + threadIdx.x];
  }
  __syncthreads();
  for (int c = threadIdx.y; c < 32; c += 8) {
    if (c0 + c < k && r0 + threadIdx.x < n)
      wt[(c0 + c) * n + r0 + threadIdx.x] = tile[threadIdx.x][c];
  }
}

}  // namespace

absl::Status DecodeChainTransposeCuda(const void* w, void* wt, int64_t n, int64_t k,
                                      cudaStream_t stream) {
  if (w == nullptr || wt == nullptr || n < 1 || k < 1 || (n + 31) / 32 > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeChainTranspose: ", n, " x ", k, " (null or unsupported)"));
  }
  TransposeKernel<<<dim3(static_cast<unsigned>((k + 31) / 32),
                         static_cast<unsigned>((n + 31) / 32)),
                    dim3(32, 8), 0, stream>>>(static_cast<const unsigned short*>(w),
                                              static_cast<unsigned short*>(wt), n, k);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::StatusOr<int> DecodeChainGrid(const DecodeChainTuning& tuning) {
  ASSIGN_OR_RETURN(const int sms, CurrentDeviceSms());
  return std::max(1, sms - std::max(0, tuning.spare_sms));
}

size_t DecodeChainWorkspaceBytes(int slots) {
  return static_cast<size_t>(std::max(slots, 1)) * kSlotBytes;
}

std::vector<size_t> DecodeChainCounterOffsets(int slots) {
  std::vector<size_t> offsets;
  for (int s = 0; s < std::max(slots, 1); ++s) {
    for (int i = 0; i <= kMaxDecodeChainPhases; ++i) {
      offsets.push_back(static_cast<size_t>(s) * kSlotBytes + size_t{kStealCounterStride} * i);
    }
  }
  return offsets;
}

absl::Status DecodeChainSupported(const DecodeChainParams& p) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeChain: dtype ",
                                                   std::string(DTypeName(p.dtype)),
                                                   " unsupported (float16, bfloat16)"));
  }
  if (p.num_phases < 1 || p.num_phases > kMaxDecodeChainPhases) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeChain: ", p.num_phases, " phases (1..", kMaxDecodeChainPhases, ")"));
  }
  if (p.has_attention) {
    const DecodeChainAttention& at = p.attention;
    if (!at.qkv || !at.key_cache || !at.value_cache || !at.block_table || !at.context_len ||
        !at.slot || !at.output) {
      return absl::InvalidArgumentError("DecodeChain attention: null pointer");
    }
    if (at.head_dim < 8 || at.head_dim > 256 || kConsumers % at.head_dim != 0 || at.heads < 1 ||
        at.kv_heads < 1 || at.heads % at.kv_heads != 0 || at.block_size < 1 || at.max_context < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("DecodeChain attention: heads ", at.heads, " kv heads ", at.kv_heads,
                       " head dim ", at.head_dim, " (8..256 dividing ", kConsumers, ") block size ",
                       at.block_size, " max context ", at.max_context));
    }
    if (!fwd::Aligned16(at.qkv) || !fwd::Aligned16(at.key_cache) ||
        !fwd::Aligned16(at.value_cache)) {
      return absl::InvalidArgumentError("DecodeChain attention: qkv and caches 16-byte aligned");
    }
  }
  for (int i = 0; i < p.num_phases; ++i) {
    const DecodeChainPhase& ph = p.phases[i];
    const std::string where = absl::StrCat("DecodeChain phase ", i, ": ");
    if (ph.n < 1 || ph.n > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(where, "n ", ph.n));
    }
    if (ph.k < kSegElems || ph.k % kSegElems != 0 || ph.k > kDecodeChainMaxK) {
      return absl::InvalidArgumentError(absl::StrCat(where, "k ", ph.k, " (a multiple of ",
                                                     kSegElems, " up to ", kDecodeChainMaxK, ")"));
    }
    if (ph.weight == nullptr || ph.input == nullptr || ph.output == nullptr ||
        (ph.ln_weight == nullptr) != (ph.ln_bias == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "null pointer"));
    }
    if (!fwd::Aligned16(ph.weight) || !fwd::Aligned16(ph.input) || !fwd::Aligned16(ph.weight_t) ||
        (ph.ln_weight != nullptr &&
         (!fwd::Aligned16(ph.ln_weight) || !fwd::Aligned16(ph.ln_bias)))) {
      return absl::InvalidArgumentError(absl::StrCat(where,
                                                     "weight, input and LN params must "
                                                     "be 16-byte aligned"));
    }
    if (ph.input == ph.output) {
      return absl::InvalidArgumentError(absl::StrCat(where, "input is the output"));
    }
    if (ph.activation != Activation::kIdentity && ph.activation != Activation::kGeluTanh) {
      return absl::InvalidArgumentError(absl::StrCat(where, "activation identity or GELU-tanh"));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeChainCuda(const DecodeChainParams& p, cudaStream_t stream, bool pdl,
                             void* workspace, int slot, const DecodeChainTuning& tuning) {
  RETURN_IF_ERROR(DecodeChainSupported(p));
  if (p.num_phases + (p.has_attention ? 1 : 0) > 1 && workspace == nullptr) {
    return absl::InvalidArgumentError("DecodeChain: a chain of several phases needs a workspace");
  }
  ASSIGN_OR_RETURN(const int grid, DecodeChainGrid(tuning));
  ASSIGN_OR_RETURN(LaunchInfo* const info_ptr, DeviceLaunchInfo());
  LaunchInfo& info = *info_ptr;
  ChainArgs a = {};
  a.num_phases = p.num_phases;
  // The fused MLP: phases up = fused, down = fused + 1 (see DecodeChainTuning::fused_mlp).
  int fused = -1;
  // (One fused instantiation a dtype: fp16 with the pair fold, bf16 with the fp32 one; none
  // with the tiled layout.)
  const bool half = (tuning.half_fold < 0 ? kDefaultHalfFold : tuning.half_fold) != 0;
  const int hold = tuning.head_hold == -1 ? kDefaultHeadHold : tuning.head_hold;
  if (hold < 0 || hold > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeChain: head_hold ", tuning.head_hold, " (0, 1 or 2; -1: the default)"));
  }
  const int mma_fold = tuning.mma_fold < 0 ? kDefaultMmaFold : tuning.mma_fold;
  const bool fuse = (tuning.fused_mlp < 0 ? kDefaultFusedMlp : tuning.fused_mlp) != 0 &&
                    (p.dtype != DType::kF16 || half) && mma_fold == 0;
  // This launch's slot of the workspace (null for a chain of one phase).
  char* const slot_base =
      workspace == nullptr ? nullptr : static_cast<char*>(workspace) + slot * kSlotBytes;
  for (int i = 1; fuse && fused < 0 && i + 2 < p.num_phases; ++i) {
    const DecodeChainPhase& up = p.phases[i];
    const DecodeChainPhase& down = p.phases[i + 1];
    bool read_elsewhere = false;  // the up output never leaves the CTAs
    for (int j = 0; j < p.num_phases; ++j) {
      read_elsewhere |= j != i + 1 && p.phases[j].input == up.output;
    }
    if (down.weight_t != nullptr && down.input == up.output && down.ln_weight == nullptr &&
        down.accumulate && down.activation == Activation::kIdentity && up.input == down.output &&
        p.phases[i + 2].input == down.output && down.n <= kFusedMaxN && down.n % 8 == 0 &&
        (down.bias == nullptr || fwd::Aligned16(down.bias)) && !read_elsewhere) {
      fused = i;
    }
  }
  const DecodeChainSmShares* shares = tuning.sm_shares;
  if (shares != nullptr) {
    if (shares->sms != grid || fused >= 0 || mma_fold != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DecodeChain: per-SM shares for ", shares->sms, " SMs with a grid of ", grid,
          fused >= 0 ? ", the fused MLP" : "", mma_fold != 0 ? ", the tiled layout" : "",
          " (they need a CTA on every SM of the table, row-run phases)"));
    }
    a.sm_shares = 1;
    std::copy(std::begin(shares->bounds), std::end(shares->bounds), a.shares);
  }
  // The most rows a CTA has of a phase of n rows (equal shares, or the widest SM share).
  auto most_rows = [&](int64_t n) {
    if (shares == nullptr) return (n + grid - 1) / grid;
    int64_t most = 0;
    for (uint32_t b : shares->bounds) {
      if (b == kDecodeChainNoShare) continue;
      most = std::max(most, DecodeChainShareRow(b, n, true) - DecodeChainShareRow(b, n, false));
    }
    return most;
  };
  int64_t max_k = 0, max_rows = 0, ln_k = 0;
  for (int i = 0; i < p.num_phases; ++i) {
    const DecodeChainPhase& ph = p.phases[i];
    ChainPhaseArgs& d = a.ph[i];
    d.w = ph.weight;
    d.bias = ph.bias;
    d.input = ph.input;
    d.ln_w = ph.ln_weight;
    d.ln_b = ph.ln_bias;
    d.out = ph.output;
    d.eps = ph.ln_epsilon;
    d.gelu = ph.activation == Activation::kGeluTanh;
    d.accumulate = ph.accumulate;
    d.n = static_cast<int>(ph.n);
    d.k = static_cast<int>(ph.k);
    if (fused >= 0 && i >= fused && i <= fused + 2) {
      d.kind = i - fused + 1;
      d.y32 = reinterpret_cast<float*>(slot_base + kFusedOffset);
      if (d.kind == kPhaseUp) d.y32_bias = p.phases[i + 1].bias;
      if (d.kind == kPhaseDown) {  // rows of the transposed weight, the up phase's partition
        d.w = ph.weight_t;
        d.bias = nullptr;
        d.accumulate = 0;
        d.n = static_cast<int>(ph.k);
        d.k = static_cast<int>(ph.n);
        a.y32 = d.y32;
        a.y32_n = static_cast<int>(ph.n);
      }
    }
    max_k = std::max<int64_t>(max_k, d.k);
    if (ph.ln_weight != nullptr) ln_k = std::max(ln_k, ph.k);
    max_rows = std::max<int64_t>(max_rows, most_rows(d.n));
  }
  // Work stealing (set per phase below, once the stage size is known) adds at most
  // kMaxStealRows row sums to a CTA, and its static rows exceed the equal share by at most one.
  const int steal = tuning.steal_chunks < 0 ? kDefaultStealChunks : tuning.steal_chunks;
  const bool may_steal = steal > 0 && workspace != nullptr;
  const int steal_min_chunks =
      tuning.steal_min_chunks < 0 ? kDefaultStealMinChunks : tuning.steal_min_chunks;
  if (may_steal) max_rows += 1 + kMaxStealRows;
  // The input buffer: the largest k in T (2 bytes), or the attention phase's float scratch.
  int64_t in_bytes = max_k * 2;
  if (p.has_attention) {
    const DecodeChainAttention& at = p.attention;
    a.has_attention = 1;
    a.at = {at.qkv,    at.key_cache, at.value_cache, at.block_table, at.context_len, at.slot,
            at.output, at.heads,     at.kv_heads,    at.head_dim,    at.block_size,  at.scale};
    a.at.max_context = at.max_context;
    static_assert(DecodeChainShortAttentionMaxContext(128) == kConsumers * 64 / 128);
    a.at.short_context =
        at.heads <= grid && at.max_context <= DecodeChainShortAttentionMaxContext(at.head_dim);
    // The short form's K rows go into the head CTAs' rings: their producers are always held,
    // at least until the K rows are read (1).
    a.at.hold = a.at.short_context ? std::max(hold, 1) : 0;
    // Its two halves hold the scores and q + the pass-2 partials (floats) + the short form's copy
    // of the block table.
    const int64_t table = (at.max_context + at.block_size - 1) / at.block_size;
    in_bytes = std::max<int64_t>(
        in_bytes, 2 * std::max<int64_t>(at.max_context, at.head_dim + 8 * kConsumers + table) * 4);
    if (a.at.short_context) {
      // The V rows (max_context x D of T) or the partials, then q and the table: in the input
      // buffer and the LN parameters' space after it (the LN phases come after the attention).
      const int64_t v_union = std::max<int64_t>(
          (int64_t{at.max_context} * at.head_dim * 2 + 15) / 16 * 16, 8 * kConsumers * 4);
      const int64_t need = v_union + (at.head_dim + table) * 4;
      in_bytes = std::max<int64_t>(in_bytes, need - 4 * ln_k);
      a.at.v_union = static_cast<int>(v_union);
    }
  }
  in_bytes = (in_bytes + 15) / 16 * 16;
  a.in_bytes = static_cast<int>(in_bytes);
  a.ln_k = static_cast<int>(ln_k);
  a.counter = reinterpret_cast<unsigned*>(slot_base);
  a.acc_floats = static_cast<int>((max_rows + 3) / 4 * 4);
  const size_t fixed = static_cast<size_t>(in_bytes) + static_cast<size_t>(ln_k) * 2 * 2 +
                       static_cast<size_t>(a.acc_floats) * sizeof(float) * (fused >= 0 ? 2 : 1);
  const int64_t room =
      static_cast<int64_t>(info.smem_optin) - static_cast<int64_t>(fixed + kStaticSmem);
  // The ring, automatically (H200, gemm_bench --chain only, 2026-12-04): 48 KiB stages for chains
  // that stream a lot a CTA (a StarCoder layer, 5.7 MB: 188 us against 190 with 32 KiB; 40 and 24
  // KiB stages 194 and 214, 56 KiB 188.5), three 32 KiB stages for short ones (a SantaCoder layer,
  // 0.64 MB: 37.8 us against 39.9 with six).
  int64_t cta_bytes = 0;
  for (int i = 0; i < p.num_phases; ++i) cta_bytes += p.phases[i].n * p.phases[i].k * 2 / grid;
  const bool long_chain = cta_bytes >= kLongChainCtaBytes;
  int stage_bytes = tuning.stage_bytes > 0 ? tuning.stage_bytes : kDefaultStageBytes;
  if (tuning.stage_bytes == 0 && long_chain && room / kLongChainStageBytes >= kMinStages) {
    stage_bytes = kLongChainStageBytes;
  }
  if (stage_bytes % (kSegBytes * kConsumerWarps) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeChain: stage bytes ", stage_bytes,
                                                   " (a multiple of ", kSegBytes * kConsumerWarps,
                                                   ")"));
  }
  if (fused >= 0 && stage_bytes % (a.ph[fused + 1].k * 2) != 0) {
    return absl::UnimplementedError(
        absl::StrCat("DecodeChain: the fused MLP's rows (", a.ph[fused + 1].k * 2,
                     " bytes) do not divide the stage (", stage_bytes, ")"));
  }
  if (fused >= 0) {  // the pool: where every CTA keeps at least one stage of its own
    ChainPhaseArgs& up = a.ph[fused];
    ChainPhaseArgs& down = a.ph[fused + 1];
    const int pool = tuning.fused_pool < 0 ? kDefaultFusedPool : tuning.fused_pool;
    const int rows = stage_bytes / (down.k * 2);
    if (pool > 0 && rows <= kMaxPoolRows && up.n <= kFusedMaxUp && grid <= kFusedMaxGrid &&
        up.n / grid >= (pool + 1) * rows) {
      for (ChainPhaseArgs* d : {&up, &down}) {
        d->pool = pool;
        d->pool_rows = rows;
        d->up_g = reinterpret_cast<float*>(slot_base + kFusedUpOffset);
        d->flags = reinterpret_cast<unsigned*>(slot_base + kFusedFlagOffset);
      }
    }
  }
  // The tiled layout (mma_fold): each ring slot has kTileSlack bytes more for the rows' padding.
  if (mma_fold > 1 && (mma_fold % 8 != 0 || mma_fold > kTileMaxRows)) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeChain: mma_fold ", mma_fold,
                                                   " (0, 1, or tile rows 8..", kTileMaxRows,
                                                   " a multiple of 8)"));
  }
  const bool tiled = mma_fold != 0;
  const int slot_bytes = stage_bytes + (tiled ? kTileSlack : 0);  // (tiled: some phase may be)
  const int max_stages = tuning.max_stages > 0 ? std::min(tuning.max_stages, kMaxStages)
                         : tuning.stage_bytes == 0 && !long_chain ? kShortChainStages
                                                                  : kMaxStages;
  // With work stealing each stage has a bias side buffer after the fixed part.
  const int side_bytes = may_steal ? kBiasSideBytes : 0;
  const int stages =
      static_cast<int>(std::min<int64_t>(max_stages, room / (slot_bytes + side_bytes)));
  if (stages < kMinStages) {
    return absl::UnimplementedError(absl::StrCat("DecodeChain: ", info.smem_optin,
                                                 " bytes of shared memory leave ", stages,
                                                 " stages for k ", max_k));
  }
  // Work stealing: chunks of whole rows, at most a stage (and a quarter of kMaxStealRows); each
  // CTA keeps all but about `steal` chunks of its equal share, and the rest are dealt at run time
  // to whichever CTA asks first. A phase whose rows exceed a stage, that has fewer than
  // steal_min_chunks chunks a CTA, or whose pool would not fit the CTAs' stolen-chunk lists, keeps
  // static rows only.
  for (int i = 0; may_steal && i < p.num_phases; ++i) {
    const DecodeChainPhase& ph = p.phases[i];
    if (a.ph[i].kind != kPhasePlain) continue;
    const int64_t rows_chunk = std::min<int64_t>(stage_bytes / (ph.k * 2), kMaxStealRows / 4);
    // A stolen chunk's bias is bulk-copied with it as a 16-byte aligned span.
    if (rows_chunk < 1 || (ph.bias != nullptr && (!fwd::Aligned16(ph.bias) || ph.n % 8 != 0))) {
      continue;
    }
    const int64_t chunks = (ph.n + rows_chunk - 1) / rows_chunk;
    if (chunks / grid < steal_min_chunks) continue;
    const int64_t static_chunks = std::max<int64_t>(0, chunks / grid - steal);
    const int64_t max_steal = std::min<int64_t>(kMaxStealChunks, kMaxStealRows / rows_chunk);
    if (grid * max_steal < chunks - grid * static_chunks ||
        (static_chunks + max_steal) * rows_chunk > max_rows) {
      continue;
    }
    ChainPhaseArgs& d = a.ph[i];
    d.rows_chunk = static_cast<int>(rows_chunk);
    d.static_chunks = static_cast<int>(static_chunks);
    d.chunks = static_cast<int>(chunks);
    d.max_steal = static_cast<int>(max_steal);
  }
  // The tiled layout for every phase that keeps static rows (a stolen chunk is whole rows).
  for (int i = 0; tiled && i < p.num_phases; ++i) {
    if (a.ph[i].rows_chunk > 0 || a.ph[i].kind != kPhasePlain) continue;
    const DecodeChainPhase& ph = p.phases[i];
    const auto [rows, cols] =
        TileShape((ph.n + grid - 1) / grid, ph.k, stage_bytes / 2, mma_fold > 1 ? mma_fold : 0);
    a.ph[i].tile_rows = rows;
    a.ph[i].tile_cols = cols;
  }
  // LL boundaries: where a phase's input is the previous phase's output (at most kLlMaxN
  // elements, neither of them stealing rows, and no residual read back in place).
  const int ll = tuning.ll_inputs < 0 ? kDefaultLlInputs : tuning.ll_inputs;
  for (int i = 1; ll != 0 && i < p.num_phases; ++i) {
    const DecodeChainPhase& prev = p.phases[i - 1];
    const DecodeChainPhase& ph = p.phases[i];
    if (ph.input == prev.output && prev.n <= kLlMaxN && prev.n == ph.k && !ph.accumulate &&
        a.ph[i - 1].rows_chunk == 0 && a.ph[i].rows_chunk == 0 && a.ph[i - 1].kind == kPhasePlain &&
        a.ph[i].kind == kPhasePlain) {
      a.ph[i - 1].ll_out = 1;
      a.ph[i].ll_in = 1;
      a.ll = 1;  // (a chain of several phases has its workspace: checked above)
    }
  }
  a.stages = stages;
  a.stage_bytes = stage_bytes;
  a.slot_bytes = slot_bytes;
  // The short form's K rows in the head CTAs' rings: the loop form where they do not fit.
  if (a.at.short_context &&
      static_cast<int64_t>(stages) * slot_bytes < int64_t{a.at.max_context} * a.at.head_dim * 2) {
    a.at.short_context = 0;
    a.at.hold = 0;
  }
  a.stream_only = tuning.stream_only;
  a.consume_only = tuning.consume_only;
  if (tuning.max_inflight < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeChain: max_inflight ", tuning.max_inflight, " (>= 0)"));
  }
  a.inflight = tuning.max_inflight >= stages ? 0 : tuning.max_inflight;
  a.stamps = tuning.timeline;
  a.side_offset = static_cast<int>(static_cast<size_t>(stages) * slot_bytes + fixed);
  const size_t smem = static_cast<size_t>(stages) * (slot_bytes + side_bytes) + fixed;
  return fwd::DispatchFloat(p.dtype, "DecodeChain", [&]<typename T>() -> absl::Status {
    if constexpr (std::is_same_v<T, float>) {
      return absl::InvalidArgumentError("DecodeChain: float32");
    } else {
      const bool stamps = tuning.timeline != nullptr;
      bool any_tiled = false;
      for (int i = 0; i < a.num_phases; ++i) any_tiled |= a.ph[i].tile_rows > 0;
      // The fused MLP has one instantiation a dtype: with its default fold (checked above).
      constexpr int kFusedFold = std::is_same_v<T, __half> ? kFoldHalfPairsFused : kFoldRowsFused;
      const int fold = fused >= 0  ? kFusedFold
                       : any_tiled ? kFoldTiles
                       : half && std::is_same_v<T, __half> ? kFoldHalfPairs
                                                           : kFoldRows;
      auto with_stamps = [&]<bool kS>() {
        return fold == kFusedFold       ? DecodeChainKernel<T, kS, kFusedFold>
               : fold == kFoldTiles     ? DecodeChainKernel<T, kS, kFoldTiles>
               : fold == kFoldHalfPairs ? DecodeChainKernel<T, kS, kFoldHalfPairs>
                                        : DecodeChainKernel<T, kS, kFoldRows>;
      };
      auto* kernel = stamps ? with_stamps.template operator()<true>()
                            : with_stamps.template operator()<false>();
      bool& configured = info.configured[std::is_same_v<T, __half> ? 0 : 1][stamps ? 1 : 0][fold];
      if (!configured) {  // once: every launch's smem is at most this (room above)
        const size_t most = static_cast<size_t>(info.smem_optin) - kStaticSmem;
        CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
        int per_sm = 0;
        CUDA_RETURN_IF_ERROR(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, most));
        if (per_sm < 1) {
          return absl::UnimplementedError("DecodeChain: one CTA does not fit on an SM");
        }
        configured = true;
      }
      CUDA_RETURN_IF_ERROR(
          fwd::LaunchMaybePdlSmem(pdl, kernel, dim3(grid), dim3(kThreads), smem, stream, a));
      return absl::OkStatus();
    }
  });
}

}  // namespace mqa
