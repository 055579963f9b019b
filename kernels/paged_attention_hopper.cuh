// Variant 11 ("hopper"): paged decode attention on Hopper's warpgroup MMA (wgmma). Included by
// kernels/paged_attention.cu inside its anonymous namespace (it shares KernelArgs, the copy and
// pack helpers and the split-KV merge kernel).
//
// Why: the mma.sync kernel is latency-bound at every size (ncu 2026-12-03: 64 x 8192 at 61% of
// DRAM with 11.5 warps an SM and no eligible warp in 54% of cycles; ~1 us of per-tile work for a
// lone CTA). Here one warpgroup (4 warps, 128 threads) owns all <= 64 query rows of a (sequence,
// KV head, split) — the heads sharing the KV head, padded to the wgmma's M = 64 — and each KV tile
// costs a handful of asynchronous instructions: S = Q K^T as D / 16 wgmma.m64n32k16 (Q and K from
// shared memory), then O += P V as 2 wgmma.m64n{D}k16 with P straight from the registers the
// softmax left it in.
//
// Shared memory (128-byte swizzle, kernels/wgmma.cuh): Q as D / 64 column slabs of 64 rows x 128
// bytes; each of kStages stages holds the K and the V tile (kTN tokens) in the same slab layout.
// Q and K are K-major operands; V, stored token-major, is the MN-major B of P V (N = D contiguous).
// Tiles arrive through 16-byte cp.async (the paged cache is not a TMA-describable tensor), made
// visible to the async proxy with fence.proxy.async before the barrier that publishes a stage.
// Splits, partials and the merge kernel are variant 3's (T partials, fp32 log2-domain lse).
//
// Query rows past 64 (prefill, multi-token queries with large groups) take several 64-row tiles,
// one CTA each (grid x = row tile * splits + split), each over the KV range its last row sees.
//
// Limits (the host falls back to the mma.sync kernel otherwise): head_dim 64 or 128; the split's
// block-table entries fit the shared table (kTableCap).
namespace hopper {

constexpr int kRows = 64;  // the wgmma's M: query rows per warpgroup
// KV tokens per stage: decode 32 (short splits, deep pipeline); prefill 64 (the score MMA's N and
// the per-tile barrier, wait and bookkeeping amortized over twice the tokens).
constexpr int kDecodeTN = 32;
constexpr int kPrefillTN = 64;

// kWG warpgroups a CTA (1, or 2 for prefill: 128 query rows sharing every K / V stage, half the
// KV traffic per FLOP, one CTA an SM with a deeper pipeline).
template <int D, int kTN, int kWG = 1>
struct HShape {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kTN == 32 || kTN == 64, "32 or 64 tokens a stage");
  static_assert(kWG == 1 || kWG == 2, "one or two warpgroups");
  static constexpr int kThreads = 128 * kWG;
  static constexpr int kCtaRows = kRows * kWG;
  static constexpr int kSlabs = D / 64;              // 64-column (128-byte) slabs
  static constexpr int kQSlabBytes = kCtaRows * 128;  // 8 KiB a warpgroup
  static constexpr int kKvSlabBytes = kTN * 128;     // 4 KiB
  static constexpr int kQBytes = kSlabs * kQSlabBytes;
  static constexpr int kTileBytes = kSlabs * kKvSlabBytes;  // K or V of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  // One warpgroup: as many as leave two CTAs an SM (D = 128 with 64-token stages: 2); two: one
  // CTA an SM, 5 stages of 64 tokens at D = 128.
  static constexpr int kStages = D == 64 ? 6 : kTN == 32 ? 5 : kWG == 1 ? 2 : 5;
  static constexpr int kMinCtas = kWG == 1 ? 2 : 1;
  // + 1024: the dynamic shared memory is aligned up to the 128-byte swizzle's 1024-byte pattern.
  static constexpr int kSmemBytes = 1024 + kQBytes + kStages * kStageBytes;
  static constexpr int kChunks = D / 8;                 // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kKvPasses = kTN / kRowsPerPass;
  static constexpr int kQPasses = kCtaRows / kRowsPerPass;
  static constexpr int kSN = kTN / 2;  // S accumulators per thread (m64 x kTN / 128)
  static constexpr int kON = D / 2;    // O accumulators per thread
};

// Byte offset of 16-byte chunk c of row r in the slab layout (slab = c / 8, swizzled within it).
template <int kSlabBytes>
__device__ __forceinline__ uint32_t SlabOffset(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * kSlabBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Keeps the compiler from moving reads or writes of wgmma accumulators across the wait that
// completes them (the asm statements that issue the MMA name them, but the hardware writes them
// later).
template <int N>
__device__ __forceinline__ void FenceRegs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One KV tile's math for the warpgroup that holds rows r0 / r1 of this thread: S = Q K^T
// (wgmma from shared memory), the online softmax (log2 domain, the scale folded into the
// exponent; tokens at or past kv_stop and past a row's causal limit masked), then O += P V with P
// from registers. Both MMAs are waited on before it returns: the tile's stage may be refilled.
template <typename T, int D, int kTN, typename H>
__device__ __forceinline__ void TileMath(uint32_t q_wg_addr, uint32_t k_addr, int tok0, int kv_stop,
                                         int qpos0, int qpos1, float scale_log2,
                                         float (&o)[H::kON], float (&m)[2], float (&l)[2]) {
  const uint32_t v_addr = k_addr + H::kTileBytes;
  float s[H::kSN];
  FenceRegs(s);
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t koff = (kk & 3) * 32;
    const uint64_t qd = wgmma::Desc128B(q_wg_addr + (kk >> 2) * H::kQSlabBytes + koff, 16, 1024);
    const uint64_t kd = wgmma::Desc128B(k_addr + (kk >> 2) * H::kKvSlabBytes + koff, 16, 1024);
    if constexpr (kTN == 32) {
      wgmma::MmaSS_m64n32k16<T>(s, qd, kd, kk > 0);
    } else {
      wgmma::MmaSS_m64n64k16<T>(s, qd, kd, kk > 0);
    }
  }
  wgmma::Commit();
  wgmma::Wait<0>();
  FenceRegs(s);

  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kTN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = tok0 + 8 * j + (e & 1);
      const int qpos = e < 2 ? qpos0 : qpos1;
      if (tok >= kv_stop || tok > qpos) s[4 * j + e] = -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
    }
  }
  float alpha[2], mu[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    mu[r] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = Exp2(m[r] - mu[r]);
    m[r] = m_new;
  }
  float rs[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < H::kSN; ++j) {
    s[j] = Exp2(fmaf(s[j], scale_log2, -mu[(j >> 1) & 1]));
    rs[(j >> 1) & 1] += s[j];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];
  FenceRegs(o);
#pragma unroll
  for (int j = 0; j < H::kON; ++j) o[j] *= alpha[(j >> 1) & 1];

  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < kTN / 16; ++kk) {
    const uint32_t pa[4] = {
        Pack2<T>(s[8 * kk + 0], s[8 * kk + 1]), Pack2<T>(s[8 * kk + 2], s[8 * kk + 3]),
        Pack2<T>(s[8 * kk + 4], s[8 * kk + 5]), Pack2<T>(s[8 * kk + 6], s[8 * kk + 7])};
    const uint64_t vd = wgmma::Desc128B(v_addr + kk * 16 * 128, H::kKvSlabBytes, 1024);
    if constexpr (D == 128) {
      wgmma::MmaRS_m64n128k16_tb<T>(o, pa, vd);
    } else {
      wgmma::MmaRS_m64n64k16_tb<T>(o, pa, vd);
    }
  }
  wgmma::Commit();
  wgmma::Wait<0>();
  FenceRegs(o);
}

// Q rows row_begin .. row_end - 1 of (sequence, KV head kvh) into the Q slabs at q_s, through
// 16-byte cp.async by H::kThreads threads (tid < H::kThreads; padding rows zero-filled). The
// caller commits the group.
template <typename T, typename H>
__device__ __forceinline__ void IssueQ(unsigned char* q_s, const KernelArgs& a, int tid,
                                       int row_begin, int row_end, int q_begin, int kvh) {
  constexpr int D = H::kChunks * 8;
  const T* query = static_cast<const T*>(a.query);
  const int cc = tid % H::kChunks, rr0 = tid / H::kChunks;
#pragma unroll
  for (int k = 0; k < H::kQPasses; ++k) {
    const int r = rr0 + k * H::kRowsPerPass, row = row_begin + r;
    const bool valid = row < row_end;
    const int64_t token = q_begin + row / a.group;
    const int head = kvh * a.group + row % a.group;
    CpAsync16(q_s + SlabOffset<H::kQSlabBytes>(r, cc),
              valid ? query + token * a.query_stride + head * D + cc * 8 : query, valid);
  }
}

// The four threads of a quad (t = 0..3) hold parts of the same two rows' softmax sums: after this
// each holds the rows' totals.
__device__ __forceinline__ void SumOverQuad(float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
}

// A row's log2-sum-exp from its running max and sum; -inf when the split saw none of its keys.
__device__ __forceinline__ float RowLse(float m, float l) {
  return l > 0.0f ? m + __log2f(l) : -INFINITY;
}

// The epilogue: this thread's rows r0 and r1 (< row_end) normalised into the output (one split)
// or into the split's partial rows and log2-domain lse (the merge kernel follows).
template <typename T, int D, typename H>
__device__ __forceinline__ void StoreRows(const KernelArgs& a, float (&o)[H::kON],
                                          const float (&m)[2], float (&l)[2], int r0, int r1,
                                          int row_end, int q_begin, int kvh, int split, int t) {
  SumOverQuad(l);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? r0 : r1;
    if (row >= row_end) continue;
    const int64_t token = q_begin + row / a.group;
    const int head = kvh * a.group + row % a.group;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    T* dst;
    if (a.num_splits == 1) {
      dst = static_cast<T*>(a.output) + (token * a.num_heads + head) * D;
    } else {
      const int64_t prow =
          (static_cast<int64_t>(split) * a.num_tokens + token) * a.num_heads + head;
      dst = reinterpret_cast<T*>(a.partial_o) + prow * D;
      if (t == 0) a.partial_lse[prow] = RowLse(m[r], l[r]);
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dst + 8 * j + 2 * t) =
          Pack2<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
  }
}

// Variant 15's cluster merge: as StoreRows, but this CTA's normalised rows (fp32) into ep_s
// ([kRows][D + kEpPad], local row = row - row_begin) and their log2-sum-exp into lse_s (-inf: the
// split saw none of the row's keys), for ClusterMerge to read across the cluster.
constexpr int kEpPad = 4;  // floats of padding a row (bank spread): the row stride is D + 4
template <typename T, int D, typename H>
__device__ __forceinline__ void StoreRowsShared(float (&o)[H::kON], const float (&m)[2],
                                                float (&l)[2], int r0, int r1, int row_begin,
                                                int t, float* ep_s, float* lse_s) {
  SumOverQuad(l);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = (r == 0 ? r0 : r1) - row_begin;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* dst = ep_s + row * (D + kEpPad);
    if (t == 0) lse_s[row] = RowLse(m[r], l[r]);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j + 2 * t) =
          make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
  }
}

// What a CTA of either kernel works on, from its block index and the step metadata.
struct Work {
  int seq, kvh, split, row_begin, row_end, first_block, kv_begin, kv_stop, num_tiles, q_begin,
      pos0;
};

template <int kCtaRows, int kTN>
__device__ __forceinline__ Work FindWork(const KernelArgs& a) {
  Work w;
  // x = row tile * splits + split, the row tiles reversed so that a causal prefill's heaviest
  // (last) tiles start first.
  w.seq = blockIdx.z;
  w.kvh = blockIdx.y;
  w.split = blockIdx.x % a.num_splits;
  w.row_begin = (gridDim.x / a.num_splits - 1 - blockIdx.x / a.num_splits) * kCtaRows;
  w.kv_begin = w.split * a.chunk;
  w.first_block = w.kv_begin >> a.block_shift;
  w.q_begin = a.query_start[w.seq];
  const int q_len = a.query_start[w.seq + 1] - w.q_begin;
  const int ctx = a.context_lens[w.seq];
  w.pos0 = ctx - q_len;
  // Rows row_begin .. row_end - 1 of the (sequence, KV head); rows are (token, head) pairs.
  w.row_end = min(w.row_begin + kCtaRows, q_len * a.group);
  const int kv_end = w.pos0 + (w.row_end - 1) / a.group + 1;
  w.kv_stop = w.split == a.num_splits - 1 ? kv_end : min(w.kv_begin + a.chunk, kv_end);
  w.num_tiles = w.row_begin >= w.row_end || w.kv_begin >= kv_end
                    ? 0  // the merge skips splits past a query
                    : (w.kv_stop - w.kv_begin + kTN - 1) / kTN;
  return w;
}

template <typename T, int D, int kTN, int kWG>
__global__ void __launch_bounds__(HShape<D, kTN, kWG>::kThreads, HShape<D, kTN, kWG>::kMinCtas)
    HopperDecodeKernel(const KernelArgs a) {
  using H = HShape<D, kTN, kWG>;
  constexpr int kThreads = H::kThreads;
  extern __shared__ unsigned char smem_raw[];
  __shared__ int32_t table_s[kTableCap];
  const uint32_t raw = SmemAddr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  unsigned char* q_s = smem;
  unsigned char* kv_s = smem + H::kQBytes;
  const uint32_t q_addr = SmemAddr(q_s), kv_addr = SmemAddr(kv_s);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  // x = row tile * splits + split, the row tiles reversed so that a causal prefill's heaviest
  // (last) tiles start first.
  const int seq = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x % a.num_splits;
  const int row_begin = (gridDim.x / a.num_splits - 1 - blockIdx.x / a.num_splits) * H::kCtaRows;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const int kv_begin = split * a.chunk;
  const int first_block = kv_begin >> a.block_shift;
  for (int i = tid; i < a.table_blocks; i += kThreads) {
    table_s[i] = table[min(first_block + i, a.max_blocks_per_seq - 1)];
  }
  const int q_begin = a.query_start[seq];
  const int q_len = a.query_start[seq + 1] - q_begin;
  const int ctx = a.context_lens[seq];
  const int G = a.group;
  const int total_rows = q_len * G;
  const int pos0 = ctx - q_len;
  // Rows row_begin .. row_end - 1 of the (sequence, KV head); rows are (token, head) pairs.
  const int row_end = min(row_begin + H::kCtaRows, total_rows);
  const int kv_end = pos0 + (row_end - 1) / G + 1;
  if (row_begin >= row_end || kv_begin >= kv_end) return;  // the merge skips splits past a query
  const int kv_stop = split == a.num_splits - 1 ? kv_end : min(kv_begin + a.chunk, kv_end);
  const int num_tiles = (kv_stop - kv_begin + kTN - 1) / kTN;

  const T* query = static_cast<const T*>(a.query);
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  const int block_mask = (1 << a.block_shift) - 1;
  const int64_t slot_elems = static_cast<int64_t>(a.num_kv_heads) * D;
  const int cc = tid % H::kChunks, rr0 = tid / H::kChunks;
  const int64_t col_off = static_cast<int64_t>(kvh) * D + cc * 8;

  // Everything above reads only step metadata and block tables; Q and the KV rows may be written
  // by the kernel this one follows under PDL.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __syncthreads();  // table_s

#pragma unroll
  for (int k = 0; k < H::kQPasses; ++k) {
    const int r = rr0 + k * H::kRowsPerPass, row = row_begin + r;
    const bool valid = row < row_end;
    const int64_t token = q_begin + row / G;
    const int head = kvh * G + row % G;
    CpAsync16(q_s + SlabOffset<H::kQSlabBytes>(r, cc),
              valid ? query + token * a.query_stride + head * D + cc * 8 : query, valid);
  }
  auto issue_tile = [&](int tile) {
    unsigned char* ks = kv_s + (tile % H::kStages) * H::kStageBytes;
    unsigned char* vs = ks + H::kTileBytes;
#pragma unroll
    for (int k = 0; k < H::kKvPasses; ++k) {
      const int r = rr0 + k * H::kRowsPerPass;
      const int tok = kv_begin + tile * kTN + r;
      const bool valid = tok < kv_stop;
      int64_t off = 0;
      if (valid) {
        const int32_t block = table_s[(tok >> a.block_shift) - first_block];
        off = ((static_cast<int64_t>(block) << a.block_shift) + (tok & block_mask)) * slot_elems +
              col_off;
      }
      const uint32_t so = SlabOffset<H::kKvSlabBytes>(r, cc);
      CpAsync16(ks + so, key_cache + off, valid);
      CpAsync16(vs + so, value_cache + off, valid);
    }
  };
  // Groups: Q with tile 0, then one per tile (empty past the last), so that at iteration i
  // waiting until at most kStages - 2 groups are pending completes tile i.
#pragma unroll
  for (int s = 0; s < H::kStages - 1; ++s) {
    if (s < num_tiles) issue_tile(s);
    CpAsyncCommit();
  }

  // This thread's rows: r0 = row_begin + 16 warp + g and r1 = r0 + 8 (warpgroup w holds rows
  // 64 w .. 64 w + 63 of the CTA's); a padding row (>= row_end) takes no causal mask (its output
  // is dropped).
  const int wg = kWG == 1 ? 0 : warp >> 2;
  const uint32_t q_wg_addr = q_addr + wg * kRows * 128;  // the warpgroup's rows in each Q slab
  const int r0 = row_begin + warp * 16 + g, r1 = r0 + 8;
  const int qpos0 = r0 < row_end ? pos0 + r0 / G : INT_MAX;
  const int qpos1 = r1 < row_end ? pos0 + r1 / G : INT_MAX;
  float o[H::kON];
#pragma unroll
  for (int i = 0; i < H::kON; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int i = 0; i < num_tiles; ++i) {
    CpAsyncWait<H::kStages - 2>();
    wgmma::FenceProxyAsync();
    __syncthreads();  // tile i visible to every warp; every warp is done with tile i - 1's stage
    if (i + H::kStages - 1 < num_tiles) issue_tile(i + H::kStages - 1);
    CpAsyncCommit();
    TileMath<T, D, kTN, H>(q_wg_addr, kv_addr + (i % H::kStages) * H::kStageBytes,
                           kv_begin + i * kTN + 2 * t, kv_stop, qpos0, qpos1, a.scale_log2, o, m,
                           l);
  }
  CpAsyncWait<0>();
  // The merge kernel (a programmatic dependent) may launch; it waits for this grid to complete.
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  StoreRows<T, D, H>(a, o, m, l, r0, r1, row_end, q_begin, kvh, split, t);
}

// Variant 13 ("hopper-tma"): the decode form of the kernel above (<= 64 query rows, 32-token
// stages, one consumer warpgroup) with a producer warp. Warp 4 (one thread) copies K and V tiles
// with TMA — the paged cache as a 2-D tensor [slots, kv_heads x D], one box of 16 slots x 64
// columns per block row and slab, 128-byte swizzled by the copy engine into the slab layout the
// wgmma descriptors read — and completes each stage's "full" mbarrier; the consumer warpgroup
// waits on it, runs the tile and arrives on the stage's "empty" mbarrier, which the producer waits
// for before refilling. No CTA-wide barrier inside the loop (variant 11 meets at cp.async.wait and
// __syncthreads every tile).
//
// Boxes are issued only for 16-slot rows that start before kv_stop, so a tile past the context
// reads nothing beyond the sequence's blocks; the rows after kv_stop in the last tile hold
// whatever the cache (or an earlier tile) left there. Their scores are masked, but P = 0 times a
// NaN in V is NaN in the P V MMA: the consumers zero those V rows before the last tile's math.
// Needs block_size >= 16 and splits starting at multiples of 16 tokens (the host checks).
//
// kCtas CTAs an SM: 2 (as variant 11: 5 stages at D = 128) or 3 (3 stages: three consumer
// warpgroups an SM instead of two; 3 x 160 threads x <= 136 registers fit the register file).
// On the H200 (2026-12-03 ~17:45 UTC, attention_bench --one, graph us, 2 / 3 CTAs): 64 x 2048
// 28.52 / 29.57, 32 x 576 10.97 / 12.00, 64 x 8192 78.38 / 79.18, 256 x 1024 40.94 / 39.21, 1 x 8192
// 9.49 / 9.51, 1 x 192 6.23 / 6.20: the third warpgroup does not pay (ncu: the consumers wait for
// data, not the other way round), so two is the default.
constexpr int kTmaBoxRows = 16;
constexpr int kTmaBoxCols = 64;  // 128 bytes: the swizzle span

//
// kCtas = 1 (variant 18, "the pair"): one CTA an SM with two consumer warpgroups that take a
// split's tiles alternately (warpgroup i % 2 takes tile i; both read the one Q), each fed by its
// own producer warp (10 stages at D = 128, the even ones one warpgroup's); at the end the second warpgroup leaves its running max,
// sums and O in shared memory (each thread its own registers' slots) and the first folds them
// into its own before the store. A split is then twice as long for the same consumers an SM:
// where one split a sequence fills the SMs (variant 18) no merge at all; forced with more splits
// (PagedAttentionTuning::tma_pair), up to kClusterMergeCap of them merge in a cluster, more by the
// merge kernel (ATTENTION_NOTES.md, version 24).
template <int D, int kCtas>
struct TmaShape : HShape<D, kDecodeTN, 1> {
  using Base = HShape<D, kDecodeTN, 1>;
  static_assert(kCtas >= 1 && kCtas <= 3, "one (the pair), two or three CTAs an SM");
  static constexpr int kWgs = kCtas == 1 ? 2 : 1;  // consumer warpgroups
  static constexpr int kStages = kCtas == 1   ? (D == 64 ? 16 : 10)
                                 : D == 64    ? 6
                                 : kCtas == 2 ? 5
                                              : 3;
  // + the producer warps: one a consumer warpgroup (the pair's second issues the odd tiles, so
  // that neither warpgroup's refills wait behind the other's releases).
  static constexpr int kCtaThreads = (Base::kThreads + 32) * kWgs;
  // The pair's exchange: the second warpgroup's O, max and sums, [kON + 4][128] floats, past
  // the stages (H200 ~18:10 UTC: 12 stages with the exchange inside them were no faster).
  static constexpr int kXBytes = kCtas == 1 ? (Base::kON + 4) * Base::kThreads * 4 : 0;
  static constexpr int kSmemBytes = 1024 + Base::kQBytes + kStages * Base::kStageBytes + kXBytes;
};

// kFuseKv: the instantiation that also does PagedAttentionCuda's kv_write (KernelArgs::new_key;
// PagedAttentionTuning::fuse_kv_write), separate so that the measured kernel is unchanged.
template <typename T, int D, int kCtas, bool kFuseKv = false>
__global__ void __launch_bounds__(TmaShape<D, kCtas>::kCtaThreads, kCtas)
    HopperTmaDecodeKernel(const KernelArgs a, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map) {
  using H = TmaShape<D, kCtas>;
  constexpr int kTN = kDecodeTN;
  constexpr bool kPair = kCtas == 1;
  constexpr int kWgs = H::kWgs;
  constexpr int kWgThreads = H::kThreads;        // one warpgroup
  constexpr int kConsumers = kWgThreads * kWgs;  // every consumer warpgroup
  // The cluster merge: the fused instantiation (variant 15) and the pair (18).
  constexpr bool kCluster = kFuseKv || kPair;
  constexpr int kBoxBytes = kTmaBoxRows * 128;
  extern __shared__ unsigned char smem_raw[];
  __shared__ int32_t table_s[kTableCap];
  __shared__ alignas(8) uint64_t full_bar[H::kStages], empty_bar[H::kStages];
  const uint32_t raw = SmemAddr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  unsigned char* q_s = smem;
  unsigned char* kv_s = smem + H::kQBytes;
  const uint32_t q_addr = SmemAddr(q_s), kv_addr = SmemAddr(kv_s);
  const uint32_t full0 = SmemAddr(full_bar), empty0 = SmemAddr(empty_bar);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const Work w = FindWork<H::kCtaRows, kTN>(a);
  const int32_t* table = a.block_tables + static_cast<int64_t>(w.seq) * a.max_blocks_per_seq;
  for (int i = tid; i < a.table_blocks; i += H::kCtaThreads) {
    table_s[i] = table[min(w.first_block + i, a.max_blocks_per_seq - 1)];
  }
  // Variants 15 and 18 (KernelArgs::cluster_merge): the splits of the row tile are one cluster;
  // each CTA leaves its rows in the KV stages (free once every tile is consumed) and ClusterMerge
  // combines them there. Every CTA of the cluster, every thread, takes part in its barriers: one
  // with no work brings rows of -inf.
  float* ep_s = reinterpret_cast<float*>(kv_s);
  float* lse_s = ep_s + kRows * (D + kEpPad);
  static_assert(kRows * (D + kEpPad + 1) * sizeof(float) <= H::kStages * H::kStageBytes,
                "the cluster merge's rows fit the KV stages");
  constexpr int kCtaThreads = H::kCtaThreads;
  // Every thread of the CTA calls it (the producer warps and an idle CTA's included).
  auto cluster_merge = [&]() {
    ClusterMerge<T, D, kCtaThreads, kRows, D + kEpPad>(a, w.kvh, w.row_begin, w.row_end, w.q_begin,
                                                       ep_s, lse_s);
  };
  if (w.num_tiles == 0) {
    if constexpr (kCluster) {
      if (a.cluster_merge) {
        for (int r = tid; r < kRows; r += kCtaThreads) lse_s[r] = -INFINITY;
        asm volatile("griddepcontrol.wait;\n" ::: "memory");  // before writing the output
        cluster_merge();
      }
    }
    return;
  }
  const int kv_begin = w.kv_begin, kv_stop = w.kv_stop, num_tiles = w.num_tiles;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < H::kStages; ++s) {
      tma::MbarInit(full0 + 8 * s, 1);
      tma::MbarInit(empty0 + 8 * s, kWgThreads / 32);  // the warps of the tile's warpgroup
    }
    tma::FenceMbarInit();
  }
  const bool producer = warp >= kConsumers / 32 && lane == 0;
  if (producer) {
    tma::PrefetchMap(&k_map);
    tma::PrefetchMap(&v_map);
  }
  // Tile i's K and V boxes into its stage (the producer's), once the stage is free.
  const int block_mask = (1 << a.block_shift) - 1;
  const int col0 = w.kvh * D;
  auto issue_tile = [&](int i) {
    const int stage = i % H::kStages;
    if (i >= H::kStages) tma::MbarWait(empty0 + 8 * stage, ((i / H::kStages) - 1) & 1);
    const int tok0 = kv_begin + i * kTN;
    const int boxes = min(kTN / kTmaBoxRows, (kv_stop - tok0 + kTmaBoxRows - 1) / kTmaBoxRows);
    const uint32_t full = full0 + 8 * stage;
    tma::MbarArriveExpectTx(full, boxes * H::kSlabs * 2 * kBoxBytes);
    const uint32_t k_stage = kv_addr + stage * H::kStageBytes;
    for (int b = 0; b < boxes; ++b) {
      const int tok = tok0 + b * kTmaBoxRows;
      const int slot =
          (table_s[(tok >> a.block_shift) - w.first_block] << a.block_shift) + (tok & block_mask);
#pragma unroll
      for (int sl = 0; sl < H::kSlabs; ++sl) {
        const uint32_t dst = k_stage + sl * H::kKvSlabBytes + b * kBoxBytes;
        tma::Load2d(dst, &k_map, col0 + sl * kTmaBoxCols, slot, full);
        tma::Load2d(dst + H::kTileBytes, &v_map, col0 + sl * kTmaBoxCols, slot, full);
      }
    }
  };
  // Before the wait: metadata and block tables; and with the KV write fused (the step's new row
  // is written here, after the wait, not by an earlier kernel), the first stages' K and V: every
  // cached row they hold was written by an earlier step (the previous kernel writes only the QKV
  // row), and the new row's stale copy is replaced in shared memory as below.
  int early = 0;
  if constexpr (kFuseKv && !kPair) {  // (not the pair: one producer issues them)
    if (a.new_key != nullptr && a.kv_before_wait) {
      __syncthreads();  // table_s, the barriers
      early = min(num_tiles, H::kStages);
      if (producer) {
        for (int i = 0; i < early; ++i) issue_tile(i);
      }
    }
  }
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __syncthreads();  // table_s, the barriers

  if (warp >= kConsumers / 32) {  // a producer: every tile, or (the pair) its warpgroup's
    if (lane == 0) {
      for (int i = early + (warp - kConsumers / 32); i < num_tiles; i += kWgs) issue_tile(i);
    }
    __syncwarp();
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
    if constexpr (kCluster) {
      if (a.cluster_merge) {
        cluster_merge();
      }
    }
    return;
  }

  // This thread's warpgroup, and its place in it (the rows and fragments it holds are the same
  // in either warpgroup).
  const int wg = tid / kWgThreads, wtid = tid % kWgThreads, wwarp = wtid >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (wg == 0) IssueQ<T, H>(q_s, a, wtid, w.row_begin, w.row_end, w.q_begin, w.kvh);
  CpAsyncCommit();
  const int r0 = w.row_begin + wwarp * 16 + g, r1 = r0 + 8;
  const int qpos0 = r0 < w.row_end ? w.pos0 + r0 / a.group : INT_MAX;
  const int qpos1 = r1 < w.row_end ? w.pos0 + r1 / a.group : INT_MAX;
  float o[H::kON];
#pragma unroll
  for (int i = 0; i < H::kON; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  tma::NamedBarrier(1, kConsumers);  // Q visible to every consumer warp's wgmma

  for (int i = wg; i < num_tiles; i += kWgs) {
    const int stage = i % H::kStages;
    tma::MbarWait(full0 + 8 * stage, (i / H::kStages) & 1);
    const uint32_t k_stage = kv_addr + stage * H::kStageBytes;
    const int tok0 = kv_begin + i * kTN;
    const int valid = kv_stop - tok0;
    // The fused KV write: the split whose range ends at the context (its last row is the query
    // token's position ctx - 1, the step's new token; for a sequence shorter than the batch's
    // longest that is not the last split), last tile.
    const bool new_row = kFuseKv && i == num_tiles - 1 && kv_stop - 1 == w.pos0;
    if (valid < kTN || new_row) {
      unsigned char* ks = kv_s + stage * H::kStageBytes;
      unsigned char* vs = ks + H::kTileBytes;
      // Zero V rows valid .. kTN - 1 (every 16-byte chunk of them, in every slab).
      for (int c = wtid; c < (kTN - valid) * H::kSlabs * 8; c += kWgThreads) {
        const int row = valid + c / (H::kSlabs * 8), rest = c % (H::kSlabs * 8);
        *reinterpret_cast<uint4*>(vs + (rest >> 3) * H::kKvSlabBytes + row * 128 +
                                  ((rest & 7) << 4)) = make_uint4(0, 0, 0, 0);
      }
      if (kFuseKv && new_row && wtid < 2 * H::kChunks) {
        // Thread c < kChunks: 16-byte chunk c of the K row; the next kChunks: of the V row. The
        // copy the TMA brought for this row is stale (the cache is written here).
        const bool is_v = wtid >= H::kChunks;
        const int c = wtid % H::kChunks;
        const int64_t col = static_cast<int64_t>(w.kvh) * D + c * 8;
        const T* src = static_cast<const T*>(is_v ? a.new_value : a.new_key) +
                       w.q_begin * (is_v ? a.new_value_stride : a.new_key_stride) + col;
        const uint4 x = *reinterpret_cast<const uint4*>(src);
        *reinterpret_cast<uint4*>((is_v ? vs : ks) + SlabOffset<H::kKvSlabBytes>(valid - 1, c)) =
            x;
        const int slot = a.slot_mapping[w.q_begin];
        if (slot >= 0) {
          T* cache = static_cast<T*>(const_cast<void*>(is_v ? a.value_cache : a.key_cache));
          *reinterpret_cast<uint4*>(cache + static_cast<int64_t>(slot) * a.num_kv_heads * D + col) =
              x;
        }
      }
      wgmma::FenceProxyAsync();
      tma::NamedBarrier(2 + wg, kWgThreads);  // the tile's warpgroup only
    }
    TileMath<T, D, kTN, H>(q_addr, k_stage, tok0 + 2 * t, kv_stop, qpos0, qpos1, a.scale_log2, o,
                           m, l);
    if (lane == 0) tma::MbarArrive(empty0 + 8 * stage);
  }
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  if constexpr (kPair) {
    // The second warpgroup's state into the exchange ([slot][thread]: conflict-free), the first
    // folds it into its own (rescaled to the larger max) once the named barrier publishes it.
    float* x = reinterpret_cast<float*>(kv_s + H::kStages * H::kStageBytes);
    if (wg == 1) {
#pragma unroll
      for (int j = 0; j < H::kON; ++j) x[j * kWgThreads + wtid] = o[j];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        x[(H::kON + r) * kWgThreads + wtid] = m[r];
        x[(H::kON + 2 + r) * kWgThreads + wtid] = l[r];
      }
    }
    tma::NamedBarrier(1, kConsumers);
    if (wg == 1) {
      if (a.cluster_merge) {
        cluster_merge();
      }
      return;
    }
    float a0[2], a1[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m1 = x[(H::kON + r) * kWgThreads + wtid];
      const float l1 = x[(H::kON + 2 + r) * kWgThreads + wtid];
      const float m_new = fmaxf(m[r], m1);
      const float mu = m_new == -INFINITY ? 0.0f : m_new;
      a0[r] = Exp2(m[r] - mu);
      a1[r] = Exp2(m1 - mu);
      m[r] = m_new;
      l[r] = l[r] * a0[r] + l1 * a1[r];
    }
#pragma unroll
    for (int j = 0; j < H::kON; ++j) {
      const int r = (j >> 1) & 1;
      o[j] = o[j] * a0[r] + x[j * kWgThreads + wtid] * a1[r];
    }
  }
  if constexpr (kCluster) {
    if (a.cluster_merge) {
      // Every consumer is past its last MMA (the pair: the barrier above): the stages are free.
      if constexpr (!kPair) tma::NamedBarrier(1, kConsumers);
      StoreRowsShared<T, D, H>(o, m, l, r0, r1, w.row_begin, t, ep_s, lse_s);
      cluster_merge();
      return;
    }
  }
  StoreRows<T, D, H>(a, o, m, l, r0, r1, w.row_end, w.q_begin, w.kvh, w.split, t);
}

// Sets the kernel's shared-memory limit once; CTAs per SM (0 when it cannot be resident).
template <typename T, int D, int kTN, int kWG>
int HopperResident() {
  using H = HShape<D, kTN, kWG>;
  static const int ctas =
      MaxResidentCtas(HopperDecodeKernel<T, D, kTN, kWG>, H::kThreads, H::kSmemBytes);
  return ctas;
}

// Automatic two-warpgroup prefill (UseTwoWarpgroupPrefill, kernels/paged_attention_cuda.h): two
// warpgroups halve the L2 traffic per FLOP of a long prefix but have half the CTA slots: on the
// H200 (2026-12-03 ~14:25 UTC, attention_bench --one, one vs two warpgroups) 4096-token causal
// 661 -> 619 us, but 32 x 512 512 -> 532, a 512-token chunk at 4096 (192 CTAs) 175 -> 186, 1024
// tokens 54.4 -> 54.3.

// One launchable form of the kernel: the host picks among decode (32-token stages, one
// warpgroup), prefill with one warpgroup and prefill with two (64-token stages).
struct Config {
  void (*kernel)(const KernelArgs) = nullptr;
  // Variant 13: the TMA kernel (launched with the K and V tensor maps; `kernel` is then null).
  void (*tma_kernel)(const KernelArgs, const CUtensorMap, const CUtensorMap) = nullptr;
  unsigned threads = 0;
  int smem_bytes = 0;
  int resident = 0;   // CTAs an SM (0: cannot be resident)
  int tile_rows = 0;  // query rows a CTA
};

template <typename T, int D, int kTN, int kWG>
Config MakeConfig() {
  using H = HShape<D, kTN, kWG>;
  return Config{HopperDecodeKernel<T, D, kTN, kWG>, nullptr, H::kThreads, H::kSmemBytes,
                HopperResident<T, D, kTN, kWG>(), H::kCtaRows};
}

// Variant 13's decode kernel (same shared memory as the 32-token decode form, plus the
// producer warp).
template <typename T, int D, int kCtas, bool kFuseKv = false>
Config MakeTmaConfig() {
  using H = TmaShape<D, kCtas>;
  static const int ctas = MaxResidentCtas(HopperTmaDecodeKernel<T, D, kCtas, kFuseKv>,
                                          H::kCtaThreads, H::kSmemBytes);
  return Config{nullptr, HopperTmaDecodeKernel<T, D, kCtas, kFuseKv>, H::kCtaThreads,
                H::kSmemBytes, ctas, H::kCtaRows};
}

// Variant 18 takes the pair where one split a sequence fills the SMs, on splits of at most this
// many tokens. On the H200 (2026-12-04 ~18:07 UTC, attention_bench --one, graph us, 17 / the
// pair): 128 x 512 (one split a sequence) 17.45 / 14.74, 120 x 1024 (one) 26.35 / 23.49, 128 x
// 2048 (one of 2048) 43.15 / 41.29; with two splits merged in a cluster 64 x 2048 (1024 each)
// 26.97 / 26.18 in isolation but StarCoder b64 (~550 tokens) 9.182 / 9.213 ms a decode step and
// b32 (four of ~150) 8.718 / 8.733 (~18:22 UTC), and 64 x 8192 (two of 4096) 73.40 / 74.50-77.74:
// so only one split.
constexpr int kPairMaxSplitTokens = 2048;

// With hopper_tma_ctas automatic, variant 13 runs the TMA kernel on splits of at most this many
// tokens and 11's kernel on longer ones. On the H200 (2026-12-03, two calls ~17:30 and ~17:50 UTC,
// attention_bench's variant table, graph us, 11 / 13 with two CTAs) the TMA kernel won where a
// CTA streams at most 512 tokens — 64 x 2048 (512 a split) 29.16 / 28.31, 32 x 2048 (256) 17.33 /
// 17.09, 32 x 576 11.50 / 11.04, 1 x 8192 (128) 10.12 / 9.49 — and lost on long splits: 256 x 1024
// (1024) 39.50 / 40.04, 64 x 8192 (2048) 77.54 / 78.30.
constexpr int kTmaMaxSplitTokens = 512;

// ctas: PagedAttentionTuning::hopper_tma_ctas (0: kTmaDefaultCtas).
constexpr int kTmaDefaultCtas = 2;
template <typename T, int D>
Config ChooseTmaConfig(int ctas) {
  return (ctas > 0 ? ctas : kTmaDefaultCtas) == 2 ? MakeTmaConfig<T, D, 2>()
                                                  : MakeTmaConfig<T, D, 3>();
}

// tile_tokens / warpgroups: PagedAttentionTuning's (0: automatic); prefill: more than one
// warpgroup's rows per (sequence, KV head); long_prefill: UseTwoWarpgroupPrefill. Two warpgroups
// always take 64-token stages.
template <typename T, int D>
Config ChooseConfig(int tile_tokens, int warpgroups, bool prefill, bool long_prefill) {
  const int wg = warpgroups > 0 ? warpgroups : long_prefill ? 2 : 1;
  if (wg == 2) return MakeConfig<T, D, kPrefillTN, 2>();
  const int tn = tile_tokens > 0 ? tile_tokens : prefill ? kPrefillTN : kDecodeTN;
  return tn == kPrefillTN ? MakeConfig<T, D, kPrefillTN, 1>() : MakeConfig<T, D, kDecodeTN, 1>();
}

}  // namespace hopper
