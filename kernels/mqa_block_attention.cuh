// One CTA computes a batch-1 decode step's attention for every query head of one KV head (MQA) on
// tensor cores: O[h] = softmax(scale q_h K^T) V over a context of at most 256 positions. Written
// for a kernel in which every CTA needs every head's output (a decode chain's attn.c_proj phase,
// whose rows each read all heads), so that each CTA attends for itself instead of waiting at a
// grid barrier for the CTAs that own heads: with one KV head a CTA's K and V are 64 KiB each at 256
// positions whatever the head count. Not used by the model: inside the decode chain it measured
// equal to the short form on H100s and 0.9% slower on an H200 (benchmarks/mqabench/NOTES.md,
// versions 42-43; the chain's form is in the history, 5b781a2); its own kernel
// (mqa_block_attention.h) keeps it tested and measured.
//
// 512 threads (16 warps). K lives in registers as the B fragments of S = Q K^T (warp w holds
// positions [16 w, 16 w + 16): 32 registers a thread, loadable before a programmatic-dependent
// wait), V and Q in shared memory. Warp w computes the scores of its positions (Q from ldmatrix),
// the row maxima and sums meet across the warps in `red`, P = exp(S - max) goes to shared memory
// in T in two halves of 128 positions (each over Q's space, dead once the scores are taken), and
// after each half warp w adds that half's P V for output dimensions [8 w, 8 w + 8) (V^T from
// ldmatrix.trans). Head dimension 128.
//
// Shared memory (BlockSmemBytes): v_s [256][128] T, then q_s [kMt * 16][128] T (rows >= heads
// zero), then red (18 x kMt * 16 floats). Every row is a whole number of 16-byte chunks, chunk c of
// row r stored at chunk c ^ (r & 7), so that the 8 rows an ldmatrix reads fall in 8 bank groups.
// V rows in [ctx, 16 ceil(ctx / 16)) must be zero (a masked score is -inf and its P 0, but
// garbage V could be NaN); rows past them are not read.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/forward_cuda_common.cuh"
#include "kernels/mma.cuh"
#include "kernels/tma.cuh"

namespace mqa::mqa_block {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kD = 128;           // head dimension
constexpr int kMaxContext = 256;  // 16 positions a warp
constexpr int kRowBytes = kD * 2;  // a Q, K or V row, and a P row of half the positions
constexpr int kHalf = kMaxContext / 2;

// Bytes of the regions for kMt 16-row tiles of heads, in this order.
constexpr int VBytes() { return kMaxContext * kRowBytes; }
constexpr int QBytes(int mt) { return mt * 16 * kRowBytes; }
constexpr int RedBytes(int mt) { return (kWarps + 2) * mt * 16 * 4; }
constexpr int BlockSmemBytes(int mt) { return VBytes() + QBytes(mt) + RedBytes(mt); }

// K's B fragments as loaded: [nt][j] the 16 bytes j of lane t's 64 (memory dimensions 32 t + 8 j
// ..) of position 16 w + 8 nt + g; KWord picks k-step kk's register i (0..1: the n8 tile of
// positions 16 w + 0..7, 2..3: + 8..15) out of them. Kept as loaded, so that nothing waits for
// the loads until the scores (a move out of them before a PDL wait would stall there).
struct KFragments {
  uint4 raw[2][4];
};
__device__ __forceinline__ uint32_t KWord(const KFragments& kf, int kk, int i) {
  const int nt = i >> 1, f = 2 * kk + (i & 1);  // fragment word f = 2 kk + h
  const uint4& v = kf.raw[nt][f >> 2];
  return (f & 3) == 0 ? v.x : (f & 3) == 1 ? v.y : (f & 3) == 2 ? v.z : v.w;
}

// Byte offset of 16-byte chunk c of row r.
__device__ __forceinline__ uint32_t Swz(int r, int c) {
  return static_cast<uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
}

// The head dimensions in an order of our own (S = Q K^T sums over them, so any order both Q and K
// share gives the same scores): logical dimension 16 kk + 8 h + 2 t + e, the element e of lane
// quad position t in half h of k-step kk's fragment, is memory dimension 32 t + 2 (2 kk + h) + e.
// Lane t's K fragments are then the 64 contiguous bytes of memory dimensions 32 t .. 32 t + 31 of
// each of its two positions (four 16-byte loads a position, not sixteen 4-byte ones); Q is stored
// in shared memory in the logical order (LoadQ).
// This thread's K fragments for positions p in [lo, hi) (of its warp's 16), row(p) the position's
// 128 elements (16-byte aligned); the others untouched. Plain loads: callable before a PDL wait.
template <typename T, typename RowFn>
__device__ __forceinline__ void LoadKFragments(KFragments& kf, RowFn row, int lo, int hi) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & (kWarps - 1);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int p = 16 * warp + 8 * nt + g;
    if (p < lo || p >= hi) continue;
    const uint4* r = reinterpret_cast<const uint4*>(row(p)) + 4 * t;
#pragma unroll
    for (int j = 0; j < 4; ++j) kf.raw[nt][j] = __ldcg(r + j);
  }
}

// Q's rows [0, kMt * 16) into q_s in the logical dimension order (above), rows >= heads zero; q:
// row r's 128 elements at q + r * kD (4-byte aligned). Plain loads and shared stores.
template <typename T, int kMt>
__device__ __forceinline__ void LoadQ(uint32_t q_s, const T* q, int heads) {
  constexpr int kWords = kD / 2;
  for (int i = threadIdx.x; i < kMt * 16 * kWords; i += kThreads) {
    const int r = i / kWords, wm = i % kWords;  // memory word wm = 16 t + f
    const int t = wm / 16, f = wm % 16;
    const int wl = 4 * f + t;  // logical word (16 kk + 8 h + 2 t) / 2 = 8 kk + 4 h + t = 4 f + t
    const uint32_t v = r < heads ? __ldcg(reinterpret_cast<const uint32_t*>(q + r * kD) + wm) : 0u;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_s + Swz(r, wl / 4) + 4 * (wl % 4)), "r"(v)
                 : "memory");
  }
}

// Positions p in [lo, hi) of V into v_s with cp.async: row(p) (128 elements, 16-byte aligned) for
// p < valid_hi, zeros past it (`any`: a valid global address, not read). The caller commits and
// waits. (Two copies to one row must not be in flight at once: their order is not kept.)
template <typename T, typename RowFn>
__device__ __forceinline__ void IssueVRows(uint32_t v_s, RowFn row, int lo, int hi, int valid_hi,
                                           const T* any) {
  constexpr int kChunks = kD / 8;
  for (int i = lo * kChunks + static_cast<int>(threadIdx.x); i < hi * kChunks; i += kThreads) {
    const int p = i / kChunks, c = i % kChunks;
    const bool valid = p < valid_hi;
    fwd::CpAsync16(v_s + Swz(p, c), valid ? row(p) + 8 * c : any, valid);
  }
}

// out[h][d] (h < heads, T, rows of kD elements; shared or global memory, which may overlap v_s:
// written after the last read of V) = the attention of head h. Every thread of the 512 calls it
// once kf holds K (positions >= ctx any value: their scores are masked) and Q and V are in shared
// memory and visible to all of them. heads <= kMt * 16, 1 <= ctx <= kMaxContext, scale_log2 = scale
// x log2(e); `bar`: a named barrier id the 512 threads, and no other thread of the CTA, wait on.
template <typename T, int kMt>
__device__ __forceinline__ void BlockMqaAttention(const KFragments& kf, uint32_t v_s, uint32_t q_s,
                                                  float* red, int heads, int ctx, float scale_log2,
                                                  T* out, int bar) {
  constexpr int R = kMt * 16;  // score rows (heads, padded)
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & (kWarps - 1);
  const int g = lane >> 2, t = lane & 3;
  const int tok0 = 16 * warp;
  float* red_w = red;  // [warp][row]: the warps' maxima, then their sums
  float* row_max = red + kWarps * R;
  float* row_sum = row_max + R;

  // S = Q K^T for this warp's 16 positions (two n8 tiles), every row tile.
  float s[kMt][2][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
    }
  }
  if (tok0 < ctx) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        mma::Ldmatrix4(a, q_s + Swz(16 * mt + (lane & 15), 2 * kk + (lane >> 4)));
        mma::Mma16816<T>(s[mt][0], a, KWord(kf, kk, 0), KWord(kf, kk, 1));
        mma::Mma16816<T>(s[mt][1], a, KWord(kf, kk, 2), KWord(kf, kk, 3));
      }
    }
  }
  // Row maxima over the warp's positions (>= ctx masked), then over the warps (a thread a row).
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (tok0 + 8 * nt + 2 * t + e >= ctx) s[mt][nt][2 * h + e] = -INFINITY;
          m = fmaxf(m, s[mt][nt][2 * h + e]);
        }
      }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      if (t == 0) red_w[warp * R + 16 * mt + g + 8 * h] = m;
    }
  }
  tma::NamedBarrier(bar, kThreads);
  if (threadIdx.x < R) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red_w[w * R + threadIdx.x]);
    row_max[threadIdx.x] = m;
  }
  tma::NamedBarrier(bar,
                    kThreads);  // (also: every warp is past its scores, so Q's space is free for P)
  // P = exp(S - max), kept in registers as T pairs; each warp's row sums.
  uint32_t pp[kMt][2][2];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * mt + g + 8 * h;
      const float ms = row_max[row] * scale_log2;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float p0 = fwd::Exp2(fmaf(s[mt][nt][2 * h], scale_log2, -ms));
        const float p1 = fwd::Exp2(fmaf(s[mt][nt][2 * h + 1], scale_log2, -ms));
        sum += p0 + p1;
        pp[mt][nt][h] = fwd::Pack2<T>(p0, p1);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t == 0) red_w[warp * R + row] = sum;  // (every max was read before the barrier above)
    }
  }
  // O = P V for dimensions [8 warp, 8 warp + 8), a half of the positions at a time: the half's
  // warps store their P in Q's space, then every warp folds the half's 16-position tiles.
  float o[kMt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.0f;
  }
  const int tiles = (ctx + 15) / 16;
  const uint32_t p_s = q_s;  // [R][128 positions] T
  for (int half = 0; half * (kHalf / 16) < tiles; ++half) {
    if (half > 0)
      tma::NamedBarrier(bar, kThreads);  // every warp is done with the previous half's P
    if (warp / (kWarps / 2) == half) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = 16 * mt + g + 8 * h;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int tok = tok0 - half * kHalf + 8 * nt + 2 * t;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(p_s + Swz(row, tok >> 3) + 4 * t),
                         "r"(pp[mt][nt][h])
                         : "memory");
          }
        }
      }
    }
    tma::NamedBarrier(bar, kThreads);
    if (half == 0 && threadIdx.x < R) {  // the rows' sums, needed at the end
      float l = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) l += red_w[w * R + threadIdx.x];
      row_sum[threadIdx.x] = l;
    }
    const int end = min(tiles, (half + 1) * (kHalf / 16));
#pragma unroll 4
    for (int kk = half * (kHalf / 16); kk < end; ++kk) {
      uint32_t b[2];  // lanes 0..7: positions 16 kk + 0..7, lanes 8..15: + 8 (16..31: the same)
      mma::Ldmatrix2Trans(b, v_s + Swz(16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7), warp));
      const int kh = kk - half * (kHalf / 16);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        mma::Ldmatrix4(a, p_s + Swz(16 * mt + (lane & 15), 2 * kh + (lane >> 4)));
        mma::Mma16816<T>(o[mt], a, b[0], b[1]);
      }
    }
  }
  tma::NamedBarrier(bar, kThreads);  // row_sum; and V is no longer read (out may overlap it)
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * mt + g + 8 * h;
      if (row >= heads) continue;
      const float inv = 1.0f / row_sum[row];
      *reinterpret_cast<uint32_t*>(out + row * kD + 8 * warp + 2 * t) =
          fwd::Pack2<T>(o[mt][2 * h] * inv, o[mt][2 * h + 1] * inv);
    }
  }
}

}  // namespace mqa::mqa_block
