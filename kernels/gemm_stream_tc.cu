// Weight-streaming tensor-core decode GEMM (see gemm_stream_tc.h).
//
// Tiles: a weight tile is BM rows x BK columns (BM * BK * 2 bytes; LaunchShape picks them by m);
// its activation tile is the kMP (m padded) rows of A over the same BK columns. Both land in
// shared memory through 16-byte cp.async, rows of BK / 8 16-byte chunks with chunk c of row r
// stored at chunk c ^ (r & 7) (the XOR flips the low three bits only, i.e. within each 128-byte
// segment), so that the 8 row addresses of every ldmatrix phase hit 8 different bank groups. Rows
// past n or m and columns past k are zero-filled (cp.async src-size 0).
//
// Why wide tiles: a weight row is contiguous in memory, the rows of a tile are k * 2 bytes apart.
// With BK = 64 each tile reads 128 bytes of each of 128 rows, and HBM serves such short runs
// below its streaming rate (ncu, StarCoder QKV at m = 32: 52% of DRAM peak, the SMs mostly idle
// waiting); BK = 256 reads 512-byte runs, as the skinny kernel's warps do. Measured (H200,
// 2026-12-03): a StarCoder step's GEMMs at m = 32 take 8.87 ms with 64 x 256 tiles against 10.23
// with 128 x 64 — still behind cuBLASLt's 7.80, so CudaGemm keeps this kernel off by default.
//
// Warps: (BM / 32) row groups x (BK / 64) column slices; warp (rg, ks) owns 32 weight rows (two
// m16 tiles) and 64 columns of every tile: per 16-column step it loads its two weight fragments
// (ldmatrix.x4) and every activation fragment (ldmatrix.x4 per pair of n8 tiles) and issues
// 2 * NT mma.m16n8k16. With several column slices, the slices' accumulators are summed through
// shared memory (the stage just consumed) whenever a row block's piece ends, each warp of a row
// group then owning every (BK / 64)-th accumulator fragment.
//
// Work: the T = row_blocks * k_tiles tiles, in order (row block major), are split into `grid`
// contiguous ranges of q or q + 1 tiles. A CTA walks its range; whenever its piece of a row block
// ends it either writes C (it covered the whole block) or stores its fp32 accumulators to its
// partial slot (2 per CTA: its range's first and last row block) and bumps the block's counter
// (kept at index "CTA holding the block's first tile", unique among shared blocks); the last to
// arrive sums every contributor's slot in CTA order (so the result does not depend on who was
// last), applies the epilogue and zeroes the counter.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/device_info.h"
#include "kernels/forward_cuda_common.cuh"
#include "kernels/gemm_stream_tc.h"
#include "kernels/mma.cuh"
#include "kernels/tma.cuh"
#include "kernels/tma_map.h"
#include "kernels/wgmma.cuh"
#include "runtime/cuda_check.h"

namespace mqa {
namespace {

constexpr int kMaxBM = 128;            // the workspace's partial slots assume no taller tile
constexpr int kMaxCtasPerSm = 2;       // the workspace size assumes no more
constexpr int kDefaultMinTiles = 8;
constexpr int kCounterBytes = 4096;    // one int per CTA: grids of up to 1024 CTAs
constexpr int kMaxGrid = kCounterBytes / static_cast<int>(sizeof(int));
constexpr int kTwoCtaBudget = 112 * 1024;  // shared memory per CTA when two fit on an SM
constexpr int kOneCtaBudget = 220 * 1024;  // ... when only one does

// NT: n8 tiles of activation rows (m padded to 8 * NT); BM x BK: the weight tile.
template <int NT, int BM, int BK>
struct Config {
  static constexpr int kMP = 8 * NT;
  static constexpr int kRowBytes = BK * 2;
  static constexpr int kChunks = kRowBytes / 16;  // per tile row
  static constexpr int kRowGroups = BM / 32;
  static constexpr int kSlices = BK / 64;
  static constexpr int kWarps = kRowGroups * kSlices;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLoadRows = kThreads / kChunks;  // tile rows one pass of the loader covers
  static constexpr int kWBytes = BM * kRowBytes;
  static constexpr int kABytes = kMP * kRowBytes;
  static constexpr int kStageBytes = kWBytes + kABytes;
  static constexpr bool kTwoPerSm = kTwoCtaBudget / kStageBytes >= 3;
  static constexpr int kStages =
      std::min(6, (kTwoPerSm ? kTwoCtaBudget : kOneCtaBudget) / kStageBytes);
  static constexpr int kMinCtas = kTwoPerSm ? 2 : 1;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kFrags = 2 * NT;          // accumulator fragments (mt, nt) of a warp
  static constexpr int kSlotFloats = BM * kMP;   // one fp32 partial of a row block
  static constexpr int kFixupSlots = NT <= 2 ? 8 / NT : (NT <= 6 ? 2 : 1);  // loaded at once
  static_assert(BM % 32 == 0 && BM <= kMaxBM && BK % 64 == 0, "tile shape");
  static_assert(kThreads % kChunks == 0 && BM % kLoadRows == 0, "loader covers whole rows");
  static_assert(kStages >= 3, "pipeline too shallow");
  static_assert(NT == 1 || NT % 2 == 0, "activation fragments are loaded in pairs of n8 tiles");
  static_assert(kSlices == 1 || kStageBytes >= kWarps * kFrags * 128 * 4,
                "the slice reduction lives in one stage");
};

template <typename T>
struct StreamArgs {
  const T* a = nullptr;
  const T* b = nullptr;
  T* c = nullptr;
  const T* bias = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int m = 0, n = 0, k = 0;
  int k_tiles = 0;  // tiles per row block
  int q = 0;        // CTA i runs q + (i < rem) tiles
  int rem = 0;
  bool accumulate = false;
  int* counters = nullptr;   // [grid]; null when every CTA runs whole row blocks
  float* partials = nullptr; // [grid][2][kSlotFloats]

  // CTA i's first tile and tile count; the CTA whose range holds `tile`.
  __device__ int64_t Start(int i) const { return static_cast<int64_t>(i) * q + min(i, rem); }
  __device__ int Count(int i) const { return q + (i < rem ? 1 : 0); }
  __device__ int Owner(int64_t tile) const {
    const int64_t big = static_cast<int64_t>(rem) * (q + 1);
    return static_cast<int>(tile < big ? tile / (q + 1) : rem + (tile - big) / q);
  }
  // The owners of row block rb's first and last tiles.
  __device__ void Contributors(int rb, int* first, int* last) const {
    const int64_t tile0 = static_cast<int64_t>(rb) * k_tiles;
    *first = Owner(tile0);
    *last = Owner(tile0 + k_tiles - 1);
  }
};

using fwd::ArrivedLast;  // partials of a row block shared by CTAs first..last: counters[first]
using fwd::CpAsync16;  // the cp.async helpers live in kernels/forward_cuda_common.cuh
using fwd::CpAsyncCommit;
using fwd::CpAsyncWait;
using fwd::SmemAddr;

using mma::Ldmatrix2;
using mma::Ldmatrix4;
using mma::Mma16816;

// Byte offset of 16-byte chunk `chunk` of tile row `row` (the XOR swizzle) in rows of
// `row_bytes`.
__device__ __forceinline__ uint32_t Swizzle(int row, int chunk, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

template <typename T, int NT, int kAct, int BM, int BK>
__global__ void __launch_bounds__(Config<NT, BM, BK>::kThreads, Config<NT, BM, BK>::kMinCtas)
    StreamTcKernel(const StreamArgs<T> p) {
  using Cfg = Config<NT, BM, BK>;
  constexpr int S = Cfg::kStages;
  constexpr int kRowBytes = Cfg::kRowBytes;
  constexpr int kSlices = Cfg::kSlices;
  constexpr int kFrags = Cfg::kFrags;
  constexpr int kFixupSlots = Cfg::kFixupSlots;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp / kSlices, slice = warp % kSlices;  // row group, column slice
  const int cta = blockIdx.x;
  const int kt_count = p.k_tiles;
  const int64_t begin = p.Start(cta);
  const int count = p.Count(cta);
  const uint32_t smem0 = SmemAddr(smem);

  // Loader: thread t copies chunk t % kChunks of tile rows t / kChunks + kLoadRows j.
  const int ld_row = tid / Cfg::kChunks, ld_chunk = tid % Cfg::kChunks;
  auto load_w = [&](int stage, int rb, int kt) {
    const uint32_t dst = smem0 + stage * Cfg::kStageBytes;
    const int col = kt * BK + ld_chunk * 8;
    const int row0 = rb * BM + ld_row;
    const T* src = p.b + static_cast<int64_t>(row0) * p.ldb + col;
#pragma unroll
    for (int j = 0; j < BM / Cfg::kLoadRows; ++j) {
      const int row = ld_row + j * Cfg::kLoadRows;
      const bool valid = col < p.k && row0 + j * Cfg::kLoadRows < p.n;
      CpAsync16(dst + Swizzle(row, ld_chunk, kRowBytes),
                valid ? src + static_cast<int64_t>(j * Cfg::kLoadRows) * p.ldb : p.b, valid);
    }
  };
  auto load_a = [&](int stage, int kt) {
    const uint32_t dst = smem0 + stage * Cfg::kStageBytes + Cfg::kWBytes;
    const int col = kt * BK + ld_chunk * 8;
#pragma unroll
    for (int j = 0; j < (Cfg::kMP + Cfg::kLoadRows - 1) / Cfg::kLoadRows; ++j) {
      const int row = ld_row + j * Cfg::kLoadRows;
      if (row < Cfg::kMP) {
        const bool valid = col < p.k && row < p.m;
        CpAsync16(dst + Swizzle(row, ld_chunk, kRowBytes), valid ? p.a + row * p.lda + col : p.a,
                  valid);
      }
    }
  };
  auto advance = [kt_count](int& rb, int& kt) {
    if (++kt == kt_count) {
      kt = 0;
      ++rb;
    }
  };

  // Prologue: the weights of the first S - 1 tiles (independent of the previous kernel) in one
  // group before the PDL wait, then their activations one group per tile. Groups: W, A_0 ..
  // A_{S-2}, then one per main-loop iteration; waiting until at most S - 2 are pending at
  // iteration i completes tile i.
  int lrb = static_cast<int>(begin / kt_count), lkt = static_cast<int>(begin % kt_count);
  {
    int rb = lrb, kt = lkt;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (s < count) load_w(s, rb, kt);
      advance(rb, kt);
    }
    CpAsyncCommit();
  }
  fwd::PdlWait();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < count) load_a(s, lkt);
    CpAsyncCommit();
    advance(lrb, lkt);
  }

  // Fragment addresses (see the header comment of this file for the layouts). Chunks are counted
  // from the warp's column slice (8 chunks of 16 bytes = 64 columns).
  const int frag_x = lane & 7;
  const int chunk0 = slice * 8;
  uint32_t w_row_off[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) w_row_off[mt] = (rg * 32 + mt * 16 + (lane & 15)) * kRowBytes;
  const int w_chunk_hi = lane >> 4;
  const int a_row = frag_x + ((lane >> 4) << 3);  // + 16 per pair of n8 tiles
  const int a_chunk_hi = (lane >> 3) & 1;

  float acc[2][NT][4];
  auto zero_acc = [&] {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  };
  zero_acc();

  auto compute = [&](int stage) {
    const uint32_t w_base = smem0 + stage * Cfg::kStageBytes;
    const uint32_t a_base = w_base + Cfg::kWBytes;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int chunk = chunk0 + 2 * ks;
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        Ldmatrix4(af[mt], w_base + w_row_off[mt] + (((chunk + w_chunk_hi) ^ frag_x) << 4));
      }
      uint32_t bf[NT][2];
      if constexpr (NT == 1) {
        Ldmatrix2(bf[0], a_base + frag_x * kRowBytes + (((chunk + a_chunk_hi) ^ frag_x) << 4));
      } else {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t r[4];
          Ldmatrix4(r, a_base + (np * 16 + a_row) * kRowBytes +
                           (((chunk + a_chunk_hi) ^ frag_x) << 4));
          bf[2 * np][0] = r[0];
          bf[2 * np][1] = r[1];
          bf[2 * np + 1][0] = r[2];
          bf[2 * np + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) Mma16816<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
  };

  // Fragment f = mt * NT + nt of a warp; with several slices, the warp of slice s owns (writes,
  // stores, fixes up) the fragments f with f % kSlices == s after the slice reduction.
  auto owned = [&](int mt, int nt) { return kSlices == 1 || (mt * NT + nt) % kSlices == slice; };

  // Sums the row group's slices into the owners' acc. `stage`: the stage just computed (all of
  // its cp.async complete; the next refill of it follows the next iteration's barrier).
  auto reduce_slices = [&](int stage) {
    if constexpr (kSlices > 1) {
      float* red = reinterpret_cast<float*>(smem + stage * Cfg::kStageBytes);
      __syncthreads();  // every warp done reading the stage
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          *reinterpret_cast<float4*>(red + ((warp * kFrags + mt * NT + nt) * 32 + lane) * 4) =
              make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]);
        }
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (!owned(mt, nt)) continue;
          float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
          for (int s = 0; s < kSlices; ++s) {  // in slice order: deterministic
            const float4 v = *reinterpret_cast<const float4*>(
                red + (((rg * kSlices + s) * kFrags + mt * NT + nt) * 32 + lane) * 4);
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
          }
          acc[mt][nt][0] = sum.x;
          acc[mt][nt][1] = sum.y;
          acc[mt][nt][2] = sum.z;
          acc[mt][nt][3] = sum.w;
        }
    }
  };

  // Accumulator (mt, nt, e) of this thread is C[col][row]: weight row `row` = output column,
  // activation row `col` = output row (the mma's D fragment: rows g, g + 8; columns 2t, 2t + 1).
  const int g = lane >> 2, t = lane & 3;
  auto epilogue = [&](int rb) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = rb * BM + rg * 32 + mt * 16 + half * 8 + g;
        if (row >= p.n) continue;
        const float bias = p.bias != nullptr ? fwd::ToFloat(p.bias[row]) : 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (!owned(mt, nt)) continue;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = nt * 8 + 2 * t + e;
            if (col >= p.m) continue;
            float v = fwd::Activate<kAct>(acc[mt][nt][half * 2 + e] + bias);
            T* out = p.c + col * p.ldc + row;
            if (p.accumulate) v += fwd::ToFloat(*out);
            *out = fwd::FromFloat<T>(v);
          }
        }
      }
    }
  };

  // Partials are stored in fragment order: thread-private, fully coalesced float4s.
  auto slot_of = [&](int owner, int piece) {
    return p.partials + (static_cast<int64_t>(owner) * 2 + piece) * Cfg::kSlotFloats +
           rg * (kFrags * 128) + lane * 4;
  };
  const int first_rb = static_cast<int>(begin / kt_count);

  // Ends this CTA's piece of row block rb (tiles [piece_kt0, last_kt] of it are in acc, summed
  // over the slices by reduce_slices).
  auto finish_piece = [&](int rb, bool whole) {
    if (whole) {
      epilogue(rb);
      return;
    }
    const int piece = rb == first_rb ? 0 : 1;
    float* mine = slot_of(cta, piece);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (!owned(mt, nt)) continue;
        __stcg(reinterpret_cast<float4*>(mine + (mt * NT + nt) * 128),
               make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]));
      }
    int first = 0, last = 0;
    p.Contributors(rb, &first, &last);
    if (!ArrivedLast(p.counters, first, last - first, tid == 0, &s_last, [] { __syncthreads(); }))
      return;
    zero_acc();
    // kFixupSlots contributors' loads in flight at once (this runs in the kernel's tail), summed
    // in CTA order.
    for (int o0 = first; o0 <= last; o0 += kFixupSlots) {
      float4 v[kFixupSlots][2][NT];
#pragma unroll
      for (int u = 0; u < kFixupSlots; ++u) {
        const int o = o0 + u;
        if (o > last) break;
        const float* src = slot_of(o, p.Start(o) / kt_count == rb ? 0 : 1);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (!owned(mt, nt)) continue;
            v[u][mt][nt] = __ldcg(reinterpret_cast<const float4*>(src + (mt * NT + nt) * 128));
          }
      }
#pragma unroll
      for (int u = 0; u < kFixupSlots; ++u) {
        if (o0 + u > last) break;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (!owned(mt, nt)) continue;
            acc[mt][nt][0] += v[u][mt][nt].x;
            acc[mt][nt][1] += v[u][mt][nt].y;
            acc[mt][nt][2] += v[u][mt][nt].z;
            acc[mt][nt][3] += v[u][mt][nt].w;
          }
      }
    }
    epilogue(rb);
    if (tid == 0) p.counters[first] = 0;
  };

  int crb = first_rb, ckt = static_cast<int>(begin % kt_count);
  int piece_kt0 = ckt;
  int cstage = 0, lstage = S - 1;
  for (int i = 0; i < count; ++i) {
    CpAsyncWait<S - 2>();
    __syncthreads();  // tile i visible to all; everyone is done with the stage refilled below
    if (i + S - 1 < count) {
      load_w(lstage, lrb, lkt);
      load_a(lstage, lkt);
    }
    CpAsyncCommit();
    advance(lrb, lkt);
    lstage = lstage + 1 == S ? 0 : lstage + 1;

    compute(cstage);

    const bool last_tile = i + 1 == count;
    if (last_tile) fwd::PdlTrigger();
    if (ckt + 1 == kt_count || last_tile) {
      reduce_slices(cstage);
      finish_piece(crb, piece_kt0 == 0 && ckt + 1 == kt_count);
      zero_acc();
      piece_kt0 = 0;
    }
    cstage = cstage + 1 == S ? 0 : cstage + 1;
    advance(crb, ckt);
  }
  CpAsyncWait<0>();
}

template <int NT, int BM, int BK>
size_t SlotBytes() {
  return static_cast<size_t>(Config<NT, BM, BK>::kSlotFloats) * sizeof(float);
}

int NtFor(int64_t m) {
  if (m <= 8) return 1;
  if (m <= 16) return 2;
  if (m <= 32) return 4;
  if (m <= 48) return 6;
  return 8;
}

// Sets the kernel's shared-memory limit and reads the SM count and residency once per thread and
// device.
struct KernelInfo {
  int device = -1;
  int sms = 0;
  int resident = 0;  // CTAs per SM
};

// The kernel's shared-memory limit set, the SM count and its residency read, once per kernel,
// thread and device (kKernel: a distinct instantiation, so that each has its own cache).
template <auto kKernel>
absl::Status KernelInfoFor(int threads, int smem_bytes, KernelInfo& out) {
  static thread_local KernelInfo info;
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (info.device != device) {
    KernelInfo fresh;
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    ASSIGN_OR_RETURN(fresh.sms, CurrentDeviceSms());
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fresh.resident, kKernel,
                                                                       threads, smem_bytes));
    fresh.device = device;
    info = fresh;
  }
  out = info;
  return absl::OkStatus();
}

// The call's operands and epilogue as the kernels take them (the work split comes from Deal).
template <typename T>
StreamArgs<T> MakeArgs(const GemmParams& p, const GemmEpilogue& e) {
  StreamArgs<T> s;
  s.a = static_cast<const T*>(p.a);
  s.b = static_cast<const T*>(p.b);
  s.c = static_cast<T*>(p.c);
  s.bias = static_cast<const T*>(e.bias);
  s.lda = p.lda;
  s.ldb = p.ldb;
  s.ldc = p.ldc;
  s.m = static_cast<int>(p.m);
  s.n = static_cast<int>(p.n);
  s.k = static_cast<int>(p.k);
  s.accumulate = e.accumulate;
  return s;
}

// Deals s.k_tiles x row_blocks tiles to `grid` CTAs (at most one tile in min_tiles fewer where the
// tiles are few), with the workspace's counters and partial slots (2 a CTA of slot_bytes) where it
// holds them, else one whole row block a CTA. Returns the grid.
template <typename T>
int64_t Deal(StreamArgs<T>& s, int64_t row_blocks, int64_t grid, int64_t min_tiles,
             size_t slot_bytes, void* workspace, size_t workspace_bytes) {
  const int64_t tiles = row_blocks * s.k_tiles;
  grid = std::max<int64_t>(1, std::min(grid, tiles / min_tiles));
  const size_t need = kCounterBytes + static_cast<size_t>(grid) * 2 * slot_bytes;
  const bool aligned_ws = reinterpret_cast<uintptr_t>(workspace) % 16 == 0;
  if (workspace == nullptr || !aligned_ws || workspace_bytes < need) {
    grid = row_blocks;  // one whole row block per CTA: no partials, no counters
  } else {
    s.counters = static_cast<int*>(workspace);
    s.partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + kCounterBytes);
  }
  s.q = static_cast<int>(tiles / grid);
  s.rem = static_cast<int>(tiles % grid);
  return grid;
}

template <typename T, int NT, int kAct, int BM, int BK>
absl::Status Launch(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream, bool pdl,
                    void* workspace, size_t workspace_bytes, const StreamTcTuning& tuning) {
  using Cfg = Config<NT, BM, BK>;
  constexpr auto kKernel = StreamTcKernel<T, NT, kAct, BM, BK>;
  KernelInfo info;
  RETURN_IF_ERROR(KernelInfoFor<kKernel>(Cfg::kThreads, Cfg::kSmemBytes, info));
  if (info.resident < 1) {
    return absl::InternalError("StreamTcGemmCuda: the kernel does not fit on an SM");
  }
  StreamArgs<T> s = MakeArgs<T>(p, e);
  const int64_t row_blocks = (p.n + BM - 1) / BM;
  s.k_tiles = static_cast<int>(std::max<int64_t>(1, (p.k + BK - 1) / BK));
  if (row_blocks * s.k_tiles > INT32_MAX) {
    return absl::UnimplementedError("StreamTcGemmCuda: shape too large");
  }
  const int per_sm = std::clamp(tuning.ctas_per_sm > 0 ? tuning.ctas_per_sm : kMaxCtasPerSm, 1,
                                std::min(info.resident, kMaxCtasPerSm));
  // min_tiles_per_cta counts 16 KiB tiles (128 x 64); larger tiles count for more.
  const int64_t min_tiles = std::max<int64_t>(
      1, (tuning.min_tiles_per_cta > 0 ? tuning.min_tiles_per_cta : kDefaultMinTiles) * 128 * 64 /
             (BM * BK));
  const int64_t grid = Deal(s, row_blocks, std::min<int64_t>(int64_t{info.sms} * per_sm, kMaxGrid),
                            min_tiles, SlotBytes<NT, BM, BK>(), workspace, workspace_bytes);
  CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdlSmem(pdl, kKernel, dim3(static_cast<unsigned>(grid)),
                                               dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, s));
  return absl::OkStatus();
}

// The weight tile: 64 x 256 (8 warps, one CTA an SM) up to m = 32, 128 x 64 (4 warps, two CTAs an
// SM) above, where the wide tile's activation stages no longer leave room for a deep pipeline
// (H200, gemm_stream_bench, StarCoder decode GEMMs a step: m = 32 8.87 ms vs 10.23 with 128 x 64,
// m = 64 13.69 vs 12.54; 64 x 128 and 32 x 256 lay between or below).
template <typename T, int NT, int kAct>
absl::Status LaunchShape(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                         bool pdl, void* workspace, size_t workspace_bytes,
                         const StreamTcTuning& tuning) {
  if constexpr (NT <= 4) {
    return Launch<T, NT, kAct, 64, 256>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
  } else {
    return Launch<T, NT, kAct, 128, 64>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
  }
}

// ---------------------------------------------------------------------------------------------
// The Hopper form (StreamTcTuning::tma). A tile is 64 weight rows x (64 x boxes) columns: `boxes`
// TMA boxes of 64 rows x 64 columns (8 KiB, 128-byte swizzle: the layout wgmma reads K-major), and
// as many boxes of the kMP activation rows over the same columns; TMA zero-fills rows past n or m
// and columns past k, so every stage carries the same bytes. Warps 0-3 are the consumer
// warpgroup, warp 4 the producer (one lane issues every copy). The n-th use of stage s waits on
// full[s] for parity n & 1; the producer's n-th refill of it waits for empty[s]'s (n - 1)-th
// completion (one arrival a consumer warp). The consumers keep one stage's MMAs in flight: stage
// i is released once stage i + 1's are issued and i's have completed. The tile order, the partial
// slots (a slot holds the 64 x kMP accumulators of a row block piece in thread order: float4 j of
// thread t at (j * 128 + t) * 4) and the fixup are the cp.async form's.
constexpr int kTmaRows = 64;      // weight rows a tile (wgmma's M)
constexpr int kTmaThreads = 160;  // a consumer warpgroup and a producer warp
constexpr int kTmaSmemBudget = 192 * 1024;
constexpr int kTmaMaxStages = 16;
constexpr int kTmaDefaultBoxes = 4;  // measured (H100): 1, 2 and 4 boxes, BENCHMARKS.md
constexpr bool kTmaDefaultHints = true;

template <int NT>
struct TmaConfig {
  static constexpr int kMP = 8 * NT;  // activation rows, padded: wgmma's N (32 or 64)
  static constexpr int kWBox = kTmaRows * 128;
  static constexpr int kABox = kMP * 128;
  static constexpr int kSmemBytes = kTmaSmemBudget + 1024;  // + alignment slack
  static constexpr int kAcc = NT * 4;                       // accumulators a thread (m64nN: N / 2)
  static constexpr int kSlotFloats = kTmaRows * kMP;
  static_assert(NT == 4 || NT == 8, "wgmma N of 32 or 64");
  // Stages of `boxes` boxes in the budget.
  static constexpr int Stages(int boxes) {
    const int stages = kTmaSmemBudget / (boxes * (kWBox + kABox));
    return stages < kTmaMaxStages ? stages : kTmaMaxStages;
  }
  static_assert(Stages(4) >= 3, "pipeline too shallow");
};

struct TmaShape {
  int stages = 2;  // ring stages (<= kTmaMaxStages)
  bool hints = false;
};

// kBoxes: 64-column boxes a tile (a template parameter: a runtime count would put the MMAs on a
// path the compiler treats as divergent, and it serialises them).
template <typename T, int NT, int kAct, int kBoxes>
__global__ void __launch_bounds__(kTmaThreads, 1)
    StreamTmaKernel(const StreamArgs<T> p, const TmaShape shape,
                    const __grid_constant__ CUtensorMap w_map,
                    const __grid_constant__ CUtensorMap a_map) {
  using Cfg = TmaConfig<NT>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kTmaMaxStages];  // full[s], then empty[s]
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cta = blockIdx.x;
  const int kt_count = p.k_tiles;  // work units (64-column boxes) a row block
  const int S = shape.stages;
  constexpr int boxes = kBoxes;
  const int64_t begin = p.Start(cta);
  const int count = p.Count(cta);
  const uint32_t smem0 = (SmemAddr(smem_raw) + 1023u) & ~1023u;  // 128-byte swizzle: 1 KiB atoms
  const uint32_t bar0 = SmemAddr(bars);
  const uint32_t stage_bytes = boxes * (Cfg::kWBox + Cfg::kABox);
  auto full = [&](int s) { return bar0 + 8u * s; };
  auto empty = [&](int s) { return bar0 + 8u * (kTmaMaxStages + s); };
  auto w_addr = [&](int s) { return smem0 + s * stage_bytes; };
  auto a_addr = [&](int s) { return w_addr(s) + boxes * Cfg::kWBox; };
  // The CTA's units in stages: a stage takes the next kBoxes units of one row block (fewer where
  // the row block or the range ends: its other boxes are read past k, i.e. zero-filled without
  // touching memory), so a piece of len units is ceil(len / kBoxes) stages.
  struct Walk {
    int64_t u, end;
    int kb;
    int rb = 0, first = 0, valid = 0;
    __device__ bool Next() {
      if (u >= end) return false;
      rb = static_cast<int>(u / kb);
      first = static_cast<int>(u % kb);
      const int64_t left = end - u < kb - first ? end - u : kb - first;
      valid = static_cast<int>(left < kBoxes ? left : kBoxes);
      u += valid;
      return true;
    }
  };

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      tma::MbarInit(full(s), 1);
      tma::MbarInit(empty(s), 4);
    }
    tma::FenceMbarInit();
  }
  __syncthreads();

  if (warp == 4) {  // producer
    if (lane != 0) return;
    tma::PrefetchMap(&w_map);
    tma::PrefetchMap(&a_map);
    const uint64_t w_policy = tma::EvictFirstPolicy(), a_policy = tma::EvictLastPolicy();
    // Column of box b of the stage `w` describes; past k for the boxes it does not use.
    auto col = [&](const Walk& w, int b) { return (b < w.valid ? w.first + b : kt_count) * 64; };
    auto load_w = [&](int s, const Walk& w) {
      for (int b = 0; b < boxes; ++b) {
        const uint32_t dst = w_addr(s) + b * Cfg::kWBox;
        const int x = col(w, b), y = w.rb * kTmaRows;
        if (shape.hints) {
          tma::Load2dHint(dst, &w_map, x, y, full(s), w_policy);
        } else {
          tma::Load2d(dst, &w_map, x, y, full(s));
        }
      }
    };
    auto load_a = [&](int s, const Walk& w) {
      for (int b = 0; b < boxes; ++b) {
        const uint32_t dst = a_addr(s) + b * Cfg::kABox;
        if (shape.hints) {
          tma::Load2dHint(dst, &a_map, col(w, b), 0, full(s), a_policy);
        } else {
          tma::Load2d(dst, &a_map, col(w, b), 0, full(s));
        }
      }
    };
    // The first stages' weights before the PDL wait (they depend on nothing), their activations
    // after it.
    Walk w{begin, begin + count, kt_count};
    int pre = 0;
    while (pre < S && w.Next()) {
      tma::MbarArriveExpectTx(full(pre), stage_bytes);
      load_w(pre, w);
      ++pre;
    }
    fwd::PdlWait();
    Walk wa{begin, begin + count, kt_count};
    for (int i = 0; i < pre && wa.Next(); ++i) load_a(i, wa);
    for (int i = pre; w.Next(); ++i) {
      const int s = i % S;
      tma::MbarWait(empty(s), ((i / S) - 1) & 1);
      tma::MbarArriveExpectTx(full(s), stage_bytes);
      load_w(s, w);
      load_a(s, w);
    }
    return;
  }

  // Consumers. Nothing of the previous kernel is read before its completion: the activations
  // come after the producer's wait; C, the workspace and the counters after this one.
  fwd::PdlWait();
  float acc[Cfg::kAcc];
  auto zero_acc = [&] {
#pragma unroll
    for (int i = 0; i < Cfg::kAcc; ++i) acc[i] = 0.0f;
  };
  auto fence_acc = [&] {
#pragma unroll
    for (int r = 0; r < Cfg::kAcc; ++r) asm volatile("" : "+f"(acc[r])::"memory");
  };
  zero_acc();
  const int g = lane >> 2, t = lane & 3;

  // acc[4 j + 2 h + e] is C[col][row]: weight row `row` (output column) = 16 warp + 8 h + g of the
  // tile, activation row `col` (output row) = 8 j + 2 t + e. The residuals (accumulate) are all
  // loaded before the first store: one round trip, not one a store (the compiler cannot tell
  // that the stores do not alias the later loads).
  auto epilogue = [&](int rb) {
    float residual[Cfg::kAcc];
    if (p.accumulate) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = rb * kTmaRows + warp * 16 + h * 8 + g;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = j * 8 + 2 * t + e;
            residual[4 * j + 2 * h + e] =
                row < p.n && col < p.m ? fwd::ToFloat(p.c[col * p.ldc + row]) : 0.0f;
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rb * kTmaRows + warp * 16 + h * 8 + g;
      if (row >= p.n) continue;
      const float bias = p.bias != nullptr ? fwd::ToFloat(p.bias[row]) : 0.0f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = j * 8 + 2 * t + e;
          if (col >= p.m) continue;
          float v = fwd::Activate<kAct>(acc[4 * j + 2 * h + e] + bias);
          if (p.accumulate) v += residual[4 * j + 2 * h + e];
          p.c[col * p.ldc + row] = fwd::FromFloat<T>(v);
        }
      }
    }
  };
  auto slot_of = [&](int owner, int piece) {
    return p.partials + (static_cast<int64_t>(owner) * 2 + piece) * Cfg::kSlotFloats + tid * 4;
  };
  const int first_rb = static_cast<int>(begin / kt_count);
  auto finish_piece = [&](int rb, bool whole) {
    if (whole) {
      epilogue(rb);
      return;
    }
    const int piece = rb == first_rb ? 0 : 1;
    float* mine = slot_of(cta, piece);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      __stcg(reinterpret_cast<float4*>(mine + j * 512),
             make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    }
    int first = 0, last = 0;
    p.Contributors(rb, &first, &last);
    if (!ArrivedLast(p.counters, first, last - first, tid == 0, &s_last,
                     [] { tma::NamedBarrier(1, 128); })) {
      return;
    }
    zero_acc();
    for (int o = first; o <= last; ++o) {  // in CTA order: the sum does not depend on arrivals
      const float* src = slot_of(o, p.Start(o) / kt_count == rb ? 0 : 1);
      float4 v[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) v[j] = __ldcg(reinterpret_cast<const float4*>(src + j * 512));
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[4 * j] += v[j].x;
        acc[4 * j + 1] += v[j].y;
        acc[4 * j + 2] += v[j].z;
        acc[4 * j + 3] += v[j].w;
      }
    }
    epilogue(rb);
    if (tid == 0) p.counters[first] = 0;
  };

  // A piece at a time (its tiles of one row block), so that every wgmma wait is on a straight
  // path: MMA waits under a condition make the compiler serialise the MMAs.
  int i = 0;                                                               // stages consumed
  int done = 0, crb = first_rb, ckt = static_cast<int>(begin % kt_count);  // units
  while (done < count) {
    const int len = min(count - done, kt_count - ckt);
    const int stages = (len + kBoxes - 1) / kBoxes;
    int pending = -1;  // the stage whose MMAs may still run (released once they are done)
    for (int j = 0; j < stages; ++j, ++i) {
      const int s = i % S;
      tma::MbarWait(full(s), (i / S) & 1);
      wgmma::Fence();
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint64_t wd = wgmma::Desc128B(w_addr(s) + b * Cfg::kWBox + kk * 32, 16, 1024);
          const uint64_t ad = wgmma::Desc128B(a_addr(s) + b * Cfg::kABox + kk * 32, 16, 1024);
          if constexpr (NT == 4) {
            wgmma::MmaSS_m64n32k16<T>(acc, wd, ad, true);
          } else {
            wgmma::MmaSS_m64n64k16<T>(acc, wd, ad, true);
          }
        }
      }
      wgmma::Commit();
      wgmma::Wait<1>();
      if (lane == 0 && pending >= 0) tma::MbarArrive(empty(pending));
      pending = s;
    }
    wgmma::Wait<0>();
    fence_acc();  // acc is touched only here (a use while MMAs run would serialise them)
    if (lane == 0) tma::MbarArrive(empty(pending));
    done += len;
    if (done == count) fwd::PdlTrigger();
    finish_piece(crb, ckt == 0 && len == kt_count);
    zero_acc();
    ++crb;
    ckt = 0;
  }
}

template <typename T, int NT, int kAct, int kBoxes>
absl::Status LaunchTmaBoxes(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                            bool pdl, void* workspace, size_t workspace_bytes,
                            const StreamTcTuning& tuning) {
  using Cfg = TmaConfig<NT>;
  constexpr auto kKernel = StreamTmaKernel<T, NT, kAct, kBoxes>;
  KernelInfo info;
  RETURN_IF_ERROR(KernelInfoFor<kKernel>(kTmaThreads, Cfg::kSmemBytes, info));
  if (info.resident < 1) {
    return absl::UnimplementedError("StreamTcGemmCuda: the TMA kernel does not fit on an SM");
  }
  TmaShape shape;
  shape.stages = Cfg::Stages(kBoxes);
  shape.hints = tuning.tma_hints < 0 ? kTmaDefaultHints : tuning.tma_hints != 0;
  CUtensorMap maps[2];
  if (!EncodeTmaMap2d(&maps[0], p.b, p.dtype, static_cast<uint64_t>(p.k),
                      static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.ldb) * 2, 64, kTmaRows) ||
      !EncodeTmaMap2d(&maps[1], p.a, p.dtype, static_cast<uint64_t>(p.k),
                      static_cast<uint64_t>(p.m), static_cast<uint64_t>(p.lda) * 2, 64, Cfg::kMP)) {
    return absl::UnimplementedError("StreamTcGemmCuda: tensor maps unavailable");
  }
  StreamArgs<T> s = MakeArgs<T>(p, e);
  // Work units: 64-column boxes (8 KiB of weights), dealt in equal contiguous ranges whatever
  // the stage's box count (a CTA's range may start or end inside a stage-sized group).
  const int64_t row_blocks = (p.n + kTmaRows - 1) / kTmaRows;
  s.k_tiles = static_cast<int>(std::max<int64_t>(1, (p.k + 63) / 64));
  if (row_blocks * s.k_tiles > INT32_MAX) {
    return absl::UnimplementedError("StreamTcGemmCuda: shape too large");
  }
  // min_tiles_per_cta counts 16 KiB tiles, two units each.
  const int64_t min_tiles = std::max<int64_t>(
      1, (tuning.min_tiles_per_cta > 0 ? tuning.min_tiles_per_cta : kDefaultMinTiles) * 2);
  const int64_t grid = Deal(s, row_blocks, std::min<int64_t>(info.sms, kMaxGrid), min_tiles,
                            Cfg::kSlotFloats * sizeof(float), workspace, workspace_bytes);
  CUDA_RETURN_IF_ERROR(fwd::LaunchMaybePdlSmem(pdl, kKernel, dim3(static_cast<unsigned>(grid)),
                                               dim3(kTmaThreads), Cfg::kSmemBytes, stream, s, shape,
                                               maps[0], maps[1]));
  return absl::OkStatus();
}

template <typename T, int NT, int kAct>
absl::Status LaunchTma(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream, bool pdl,
                       void* workspace, size_t workspace_bytes, const StreamTcTuning& tuning) {
  switch (tuning.tma_boxes > 0 ? tuning.tma_boxes : kTmaDefaultBoxes) {
    case 1:
      return LaunchTmaBoxes<T, NT, kAct, 1>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case 2:
      return LaunchTmaBoxes<T, NT, kAct, 2>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case 4:
      return LaunchTmaBoxes<T, NT, kAct, 4>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("StreamTcGemmCuda: tma_boxes ", tuning.tma_boxes, " (1, 2 or 4)"));
}

template <typename T, int NT, int kAct>
absl::Status LaunchForm(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream, bool pdl,
                        void* workspace, size_t workspace_bytes, const StreamTcTuning& tuning) {
  if (tuning.tma) {
    // wgmma's N: 32 up to m = 32, else 64.
    if constexpr (NT <= 4) {
      return LaunchTma<T, 4, kAct>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    } else {
      return LaunchTma<T, 8, kAct>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    }
  }
  return LaunchShape<T, NT, kAct>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
}

template <typename T, int NT>
absl::Status LaunchAct(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream, bool pdl,
                       void* workspace, size_t workspace_bytes, const StreamTcTuning& tuning) {
  switch (e.activation) {
    case Activation::kIdentity:
      return LaunchForm<T, NT, 0>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case Activation::kGeluTanh:
      return LaunchForm<T, NT, 1>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case Activation::kGeluErf:
      break;
  }
  return absl::UnimplementedError("StreamTcGemmCuda: GELU (erf) is not fused");
}

template <typename T>
absl::Status LaunchType(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream, bool pdl,
                        void* workspace, size_t workspace_bytes, const StreamTcTuning& tuning) {
  switch (NtFor(p.m)) {
    case 1:
      return LaunchAct<T, 1>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case 2:
      return LaunchAct<T, 2>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case 4:
      return LaunchAct<T, 4>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    case 6:
      return LaunchAct<T, 6>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
    default:
      return LaunchAct<T, 8>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
  }
}

absl::Status CheckParams(const GemmParams& p, const GemmEpilogue& e) {
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("StreamTcGemmCuda: dtype ",
                                                   std::string(DTypeName(p.dtype)),
                                                   " unsupported (float16, bfloat16)"));
  }
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.lda < p.k || p.ldb < p.k || p.ldc < p.n) {
    return absl::InvalidArgumentError(absl::StrCat("StreamTcGemmCuda: m ", p.m, " n ", p.n, " k ",
                                                   p.k, " lda ", p.lda, " ldb ", p.ldb, " ldc ",
                                                   p.ldc));
  }
  if (p.m > 0 && p.n > 0 && (!p.a || !p.b || !p.c)) {
    return absl::InvalidArgumentError("StreamTcGemmCuda: null pointer");
  }
  if (p.n > INT32_MAX || p.k > INT32_MAX) {
    return absl::InvalidArgumentError("StreamTcGemmCuda: dimension over 2^31");
  }
  if (e.accumulate && e.activation != Activation::kIdentity) {
    return absl::InvalidArgumentError("StreamTcGemmCuda: accumulate needs the identity activation");
  }
  return absl::OkStatus();
}

}  // namespace

size_t StreamTcCounterBytes() { return kCounterBytes; }

size_t StreamTcGemmWorkspaceBytes(int num_sms, int64_t max_m) {
  const int64_t m = std::clamp<int64_t>(max_m, 1, kStreamTcMaxM);
  const int64_t grid = std::min<int64_t>(int64_t{std::max(num_sms, 1)} * kMaxCtasPerSm, kMaxGrid);
  const size_t slot = static_cast<size_t>(kMaxBM) * 8 * NtFor(m) * sizeof(float);
  return kCounterBytes + static_cast<size_t>(grid) * 2 * slot;
}

bool StreamTcGemmSupported(const GemmParams& p, const GemmEpilogue& e) {
  if (!CheckParams(p, e).ok()) return false;
  return p.m >= 1 && p.m <= kStreamTcMaxM && p.k % 8 == 0 && p.lda % 8 == 0 && p.ldb % 8 == 0 &&
         fwd::Aligned16(p.a) && fwd::Aligned16(p.b) && e.activation != Activation::kGeluErf &&
         e.ln_weight == nullptr && e.ln_bias == nullptr && e.key_cache == nullptr &&
         e.value_cache == nullptr;
}

absl::Status StreamTcGemmCuda(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                              bool pdl, void* workspace, size_t workspace_bytes,
                              const StreamTcTuning& tuning) {
  RETURN_IF_ERROR(CheckParams(p, e));
  if (p.m == 0 || p.n == 0) return absl::OkStatus();
  if (!StreamTcGemmSupported(p, e)) {
    return absl::UnimplementedError(absl::StrCat(
        "StreamTcGemmCuda: unsupported (m ", p.m, " k ", p.k, " lda ", p.lda, " ldb ", p.ldb,
        ", 16-byte alignment, GELU-erf, layer-norm or KV-write fusion)"));
  }
  return p.dtype == DType::kF16
             ? LaunchType<__half>(p, e, stream, pdl, workspace, workspace_bytes, tuning)
             : LaunchType<__nv_bfloat16>(p, e, stream, pdl, workspace, workspace_bytes, tuning);
}

}  // namespace mqa
