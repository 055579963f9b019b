// One CTA computes a batch-1 decode step's attention for every query head of one KV head (MQA) on
// tensor cores: O[h] = softmax(scale q_h K^T) V over a context of at most 256 positions, with Q,
// K and V already in shared memory. Written to measure whether a kernel in which every CTA needs
// every head's output (a decode chain's attn.c_proj phase, whose rows each read all heads) could
// attend for itself instead of waiting at a grid barrier for the CTAs that own heads: with one
// KV head a CTA's K and V are 64 KiB at 256 positions whatever the head count. Not used by the
// model: on an H100 (mqa_block_bench, 2026-12-06) it takes 3.5 us of a CTA at 48 heads x 128
// positions and 4.9 us at 256 (16 heads: 1.7 / 2.4 us) after 1.7-2.4 us of loads, bounded by
// shared-memory reads (every warp re-reads Q and P: ~0.7 MB of ldmatrix at 256 positions), and a
// chain CTA has no room for K and V beside its weight ring (benchmarks/mqabench/NOTES.md, version
// 42).
//
// 512 threads (16 warps). Warp w takes positions [16 w, 16 w + 16) for the scores (Q from
// ldmatrix, K^T from ldmatrix of K's rows), the row maxima and sums meet in `red` across the warps,
// P = exp(S - max) goes to shared memory in T, and warp w then takes output dimensions
// [8 w, 8 w + 8) of P V (V^T from ldmatrix.trans of V's rows). Head dimension 128.
//
// Shared-memory layouts: every row is a whole number of 16-byte chunks, chunk c of row r stored at
// chunk c ^ (r & 7) (the 8 rows an ldmatrix reads fall in 8 different bank groups):
//   q_s [kMt * 16][128] (rows >= heads zero), k_s and v_s [256][128] (rows >= ctx zero: a masked
//   score is set to -inf, but a garbage V row times P = 0 could be NaN), p_s [kMt * 16][256],
//   red: (2 x 16 + 2) x kMt * 16 floats (each warp's row maxima and sums, then the rows' totals).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/mma.cuh"

namespace mqa::mqa_block {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kD = 128;           // head dimension
constexpr int kMaxContext = 256;  // 16 positions a warp
constexpr int kQRowBytes = kD * 2, kPRowBytes = kMaxContext * 2;

// Bytes of each region for kMt 16-row tiles of heads.
constexpr int QBytes(int mt) { return mt * 16 * kQRowBytes; }
constexpr int KvBytes() { return kMaxContext * kQRowBytes; }  // K or V
constexpr int PBytes(int mt) { return mt * 16 * kPRowBytes; }
constexpr int RedBytes(int mt) { return (2 * kWarps + 2) * mt * 16 * 4; }

// Byte offset of 16-byte chunk c of row r in rows of `row_bytes`.
__device__ __forceinline__ uint32_t Swz(int r, int c, int row_bytes) {
  return static_cast<uint32_t>(r * row_bytes + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ void Ldmatrix2Trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float x, float y) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The 512 threads' barrier: named barrier `bar` (the caller's other threads, such as a producer
// warp, do not take part).
__device__ __forceinline__ void Sync(int bar) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(bar), "n"(kThreads) : "memory");
}

// out[h][d] (h < heads, T, row stride kD elements; shared or global memory) = the attention of
// head h. Every thread of the 512 calls it (warp = threadIdx.x / 32 of them) once Q, K and V are
// in shared memory and visible to all of them; `red` is shared memory. heads <= kMt * 16,
// 1 <= ctx <= kMaxContext. scale_log2 = scale x log2(e). Leaves q_s, p_s and red as scratch.
template <typename T, int kMt>
__device__ __forceinline__ void BlockMqaAttention(uint32_t q_s, uint32_t k_s, uint32_t v_s,
                                                  uint32_t p_s, float* red, int heads, int ctx,
                                                  float scale_log2, T* out, int bar) {
  constexpr int R = kMt * 16;  // score rows (heads, padded)
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & (kWarps - 1);
  const int g = lane >> 2, t = lane & 3;
  const int tok0 = 16 * warp;
  float* red_max = red;                   // [warp][row]
  float* red_sum = red + kWarps * R;      // [warp][row]
  float* row_max = red + 2 * kWarps * R;  // [row]: over the warps
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
      uint32_t b[4];  // matrix j = lane / 8: positions + 8 (j / 2), dimensions 16 kk + 8 (j % 2)
      const int j = lane >> 3;
      mma::Ldmatrix4(b, k_s + Swz(tok0 + 8 * (j >> 1) + (lane & 7), 2 * kk + (j & 1), kQRowBytes));
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        uint32_t a[4];
        mma::Ldmatrix4(a, q_s + Swz(16 * mt + (lane & 15), 2 * kk + (lane >> 4), kQRowBytes));
        mma::Mma16816<T>(s[mt][0], a, b[0], b[1]);
        mma::Mma16816<T>(s[mt][1], a, b[2], b[3]);
      }
    }
  }
  // Row maxima over the warp's positions (positions >= ctx masked), then over the warps.
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
      if (t == 0) red_max[warp * R + 16 * mt + g + 8 * h] = m;
    }
  }
  Sync(bar);
  // (One thread a row reduces over the warps: 16 x R shared loads in all, not 16 a row a thread.)
  if (threadIdx.x < R) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red_max[w * R + threadIdx.x]);
    row_max[threadIdx.x] = m;
  }
  Sync(bar);
  // P = exp(S - max) in T into p_s, and each warp's row sums.
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * mt + g + 8 * h;
      const float ms = row_max[row] * scale_log2;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const float p0 = FastExp2(fmaf(s[mt][nt][2 * h], scale_log2, -ms));
        const float p1 = FastExp2(fmaf(s[mt][nt][2 * h + 1], scale_log2, -ms));
        sum += p0 + p1;
        const int tok = tok0 + 8 * nt + 2 * t;
        asm volatile(
            "st.shared.b32 [%0], %1;\n" ::"r"(p_s + Swz(row, tok >> 3, kPRowBytes) + 4 * t),
            "r"(PackPair<T>(p0, p1))
            : "memory");
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t == 0) red_sum[warp * R + row] = sum;
    }
  }
  Sync(bar);
  if (threadIdx.x < R) {  // the rows' sums (read after P V's barrier-free loop: see below)
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += red_sum[w * R + threadIdx.x];
    row_sum[threadIdx.x] = l;
  }
  // O = P V for dimensions [8 warp, 8 warp + 8), over the positions' 16-row tiles.
  float o[kMt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.0f;
  }
  const int tiles = (ctx + 15) / 16;
#pragma unroll 4
  for (int kk = 0; kk < tiles; ++kk) {
    uint32_t b[2];  // lanes 0..7: positions 16 kk + 0..7, lanes 8..15: + 8 (16..31: the same)
    Ldmatrix2Trans(b, v_s + Swz(16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7), warp, kQRowBytes));
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      uint32_t a[4];
      mma::Ldmatrix4(a, p_s + Swz(16 * mt + (lane & 15), 2 * kk + (lane >> 4), kPRowBytes));
      mma::Mma16816<T>(o[mt], a, b[0], b[1]);
    }
  }
  Sync(bar);  // row_sum
  // Normalised by the rows' sums over every warp.
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * mt + g + 8 * h;
      if (row >= heads) continue;
      const float inv = 1.0f / row_sum[row];
      *reinterpret_cast<uint32_t*>(out + row * kD + 8 * warp + 2 * t) =
          PackPair<T>(o[mt][2 * h] * inv, o[mt][2 * h + 1] * inv);
    }
  }
}

}  // namespace mqa::mqa_block
