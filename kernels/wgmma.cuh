// Warpgroup MMA (sm_90a wgmma.mma_async) wrappers for the shapes kernels/paged_attention_hopper.cuh
// uses, and the shared-memory matrix descriptor. The operand lists are long but mechanical (one
// "+f" per fp32 accumulator register: N / 2 of them for m64nNk16); they were written out by a
// short loop, not by hand.
//
// Accumulator layout (per thread of the 128-thread warpgroup; warp w, lane = 4 g + t): for each
// 8-column block j, d[4j + 0..1] hold row 16 w + g, columns 8 j + 2 t .. + 1, and d[4j + 2..3] row
// 16 w + g + 8, the same columns. A from registers (RS): per 16-column k step, four 32-bit registers
// {row g, cols 2t..; row g + 8, cols 2t..; row g, cols 2t + 8..; row g + 8, cols 2t + 8..} of the
// warp's 16 rows - the same as mma.sync m16n8k16's A fragment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace mqa::wgmma {

// Shared-memory matrix descriptor, 128-byte swizzle (chunk c of 128-byte row r at c ^ (r & 7);
// atoms of 8 rows x 128 bytes, 1024-byte aligned). lbo / sbo in bytes: K-major operands: sbo = the
// stride of 8-row groups, lbo unused; MN-major: lbo = the stride of 64-element column blocks, sbo =
// the stride of 8-row groups along K.
__device__ __forceinline__ uint64_t Desc128B(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void Fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's async proxy.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The asm templates and output operand lists, shared by the f16 and bf16 forms (TY is the type
// string). scale-d comes through a predicate set from a register: 0 overwrites D, 1 accumulates.
#define MQA_WGMMA_SS_M64N32K16(TY) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
  "%16, %17, p, 1, 1, 0, 0;\n}\n"
#define MQA_WGMMA_SS_M64N64K16(TY) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "%32, %33, p, 1, 1, 0, 0;\n}\n"
#define MQA_WGMMA_RS_M64N64K16_TB(TY) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
  "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
#define MQA_WGMMA_RS_M64N128K16_TB(TY) \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
  "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
#define MQA_WGMMA_D16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define MQA_WGMMA_D32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MQA_WGMMA_D64 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// One wrapper per shape; the f16 / bf16 dispatch is the same for all. SS: A and B from
// descriptors (both K-major), d (+)= A B, accumulating when `accumulate`. RS_TB: A from four
// registers per thread, B from a descriptor, MN-major (N contiguous), d += A B.
#define MQA_WGMMA_DEFINE_SS(NAME, ASM, DN, DREGS)                                        \
  template <typename T>                                                                  \
  __device__ __forceinline__ void NAME(float(&d)[DN], uint64_t a, uint64_t b,            \
                                       bool accumulate) {                                \
    const int scale_d = accumulate ? 1 : 0;                                              \
    if constexpr (std::is_same_v<T, __half>) {                                           \
      asm volatile(ASM("f16") : DREGS : "l"(a), "l"(b), "r"(scale_d));                   \
    } else {                                                                             \
      asm volatile(ASM("bf16") : DREGS : "l"(a), "l"(b), "r"(scale_d));                  \
    }                                                                                    \
  }
#define MQA_WGMMA_DEFINE_RS_TB(NAME, ASM, DN, DREGS)                                     \
  template <typename T>                                                                  \
  __device__ __forceinline__ void NAME(float(&d)[DN], const uint32_t(&a)[4], uint64_t b) { \
    if constexpr (std::is_same_v<T, __half>) {                                           \
      asm volatile(ASM("f16")                                                            \
                   : DREGS                                                               \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));        \
    } else {                                                                             \
      asm volatile(ASM("bf16")                                                           \
                   : DREGS                                                               \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));        \
    }                                                                                    \
  }

MQA_WGMMA_DEFINE_SS(MmaSS_m64n32k16, MQA_WGMMA_SS_M64N32K16, 16, MQA_WGMMA_D16)
MQA_WGMMA_DEFINE_SS(MmaSS_m64n64k16, MQA_WGMMA_SS_M64N64K16, 32, MQA_WGMMA_D32)
MQA_WGMMA_DEFINE_RS_TB(MmaRS_m64n64k16_tb, MQA_WGMMA_RS_M64N64K16_TB, 32, MQA_WGMMA_D32)
MQA_WGMMA_DEFINE_RS_TB(MmaRS_m64n128k16_tb, MQA_WGMMA_RS_M64N128K16_TB, 64, MQA_WGMMA_D64)

#undef MQA_WGMMA_DEFINE_SS
#undef MQA_WGMMA_DEFINE_RS_TB
#undef MQA_WGMMA_SS_M64N32K16
#undef MQA_WGMMA_SS_M64N64K16
#undef MQA_WGMMA_RS_M64N64K16_TB
#undef MQA_WGMMA_RS_M64N128K16_TB
#undef MQA_WGMMA_D16
#undef MQA_WGMMA_D32
#undef MQA_WGMMA_D64

}  // namespace mqa::wgmma
