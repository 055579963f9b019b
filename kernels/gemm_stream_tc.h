// Weight-streaming tensor-core GEMM for decode batches of up to 64 rows: C = act(A B^T + bias)
// [+ C] in PyTorch's weight layout (kernels/gemm.h), fp16 / bf16 operands, fp32 accumulation, the
// output in the operands' dtype. Meant for the m = 9..64 decode shapes that otherwise go to
// cuBLASLt (CudaGemm::Run); the skinny CUDA-core kernel stays the better choice for m <= 8.
//
// "Swap AB": the weight's rows are the MMA's M dimension (mma.sync m16n8k16), the m activation
// rows its N dimension (padded to 8, 16, 32, 48 or 64). Each CTA streams weight tiles (64 x 256
// for m <= 32, 128 x 64 above) through a multi-stage cp.async pipeline in shared memory, beside the matching
// activation tile (L2-resident, re-read by every CTA). The tiles of the whole GEMM (row blocks x
// k tiles, k fastest) are dealt out in equal contiguous ranges to one resident wave of CTAs
// ("stream-K"): no wave quantisation, whatever n is. A row block that several CTAs share is
// summed by the last of them to arrive (fp32 partials in a workspace, an atomic counter per
// block that the kernel leaves at zero), in a fixed order, so results are deterministic.
//
// PDL: with `pdl`, the kernel is launched as a programmatic dependent (forward_cuda_common.cuh):
// the cp.async of its first weight tiles is issued before griddepcontrol.wait (so B must not be
// written by the kernel just before); A, C, the bias and the workspace are touched only after it.
// Dependents are released once the main loop is done.
//
// Thread safety: stateless apart from a per-thread cache of the kernels' device attributes. Calls
// that share a workspace must not run concurrently (stream order, graphs and PDL chains are fine).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/gemm.h"
#include "kernels/gemm_cuda.h"  // GemmEpilogue

namespace mqa {

// Tuning knobs (benchmarks sweep them; the defaults are the measured choice).
struct StreamTcTuning {
  int ctas_per_sm = 0;        // CTAs per SM in the grid; 0: as many as fit, at most 2
  int min_tiles_per_cta = 0;  // each CTA streams at least this many 16 KiB of weight tiles; 0: 8
  // The Hopper form (sm_90, m >= 9): weight tiles of 64 rows x 256 columns and the matching
  // activation rows arrive by TMA (four boxes each, 128-byte swizzle) in a ring of stages that one
  // producer warp keeps full, one CTA an SM; one consumer warpgroup folds each stage with wgmma
  // (m64n32k16 or m64n64k16: weight rows as M, the activation rows padded to 32 or 64 as N) and
  // releases it. The same tile order, partial slots and fixup as the cp.async form. Unimplemented
  // where the device or the driver's tensor-map encoder cannot run it (the caller falls back).
  // Measured (BENCHMARKS.md, 2026-12-05 late evening): a StarCoder b32 decode step 5.4% slower
  // than cuBLASLt on the H200, 0.8% faster on an H100; off in CudaGemm.
  bool tma = false;
  // The TMA form's 64-column boxes a stage (1, 2 or 4: 8, 16 or 32 KiB of weights; the ring holds
  // as many stages as fit 192 KiB, at most 16) and its L2 cache hints (weights evict-first, the
  // activations evict-last; 0 off, 1 on). 0 / -1: the measured defaults
  // (kernels/gemm_stream_tc.cu).
  int tma_boxes = 0;
  int tma_hints = -1;
};

// Largest m the kernel takes.
inline constexpr int64_t kStreamTcMaxM = 64;

// Device bytes of a workspace that serves every call with m <= max_m on a device of `num_sms`
// multiprocessors (16 MiB + 4 KiB for 132 SMs and m <= 64). Its first StreamTcCounterBytes()
// must be zero before the first call (cudaMemset once); every call leaves them zero.
size_t StreamTcGemmWorkspaceBytes(int num_sms, int64_t max_m = kStreamTcMaxM);
size_t StreamTcCounterBytes();

// Whether StreamTcGemmCuda takes this call: fp16 / bf16, 1 <= m <= 64, k and lda / ldb multiples
// of 8, A and B 16-byte aligned, no fused layer norm or KV-cache write, activation identity or
// GELU-tanh (accumulate only with identity).
bool StreamTcGemmSupported(const GemmParams& p, const GemmEpilogue& e);

// C[m, n] = act(A[m, k] B[n, k]^T + bias) (+ C when e.accumulate); p.alpha and p.beta are ignored
// (as in CudaGemm::Run). InvalidArgument for malformed params (as CudaGemm), Unimplemented where
// StreamTcGemmSupported is false (the caller falls back), OK at once for m = 0 or n = 0.
// `workspace` (16-byte aligned, StreamTcGemmWorkspaceBytes(SMs, >= m) bytes; see there): without
// one, or with one too small, each CTA runs one whole row block (no split over k), which for
// small n leaves most of the GPU idle. Allocates nothing: may be captured into a CUDA graph.
absl::Status StreamTcGemmCuda(const GemmParams& p, const GemmEpilogue& e, cudaStream_t stream,
                              bool pdl, void* workspace = nullptr, size_t workspace_bytes = 0,
                              const StreamTcTuning& tuning = {});

}  // namespace mqa
