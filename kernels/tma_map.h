// Host side of the Hopper tensor-memory-accelerator copies (kernels/tma.cuh): encoding a 2-D
// tensor map. Shared by the paged attention's TMA kernel and the streaming decode GEMM.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "runtime/dtype.h"

namespace mqa {

// A map over a row-major 2-D tensor of 2-byte elements (fp16 / bf16): `cols` contiguous elements
// a row, `rows` rows `row_stride_bytes` apart (a multiple of 16), boxes of box_cols x box_rows
// elements (box_cols * 2 <= 128), 128-byte swizzle; boxes reaching past the tensor are zero-filled.
// The driver's encoder comes through the runtime's entry-point query (no libcuda link). False when
// the driver has none or rejects the map (the caller falls back to a kernel without TMA).
bool EncodeTmaMap2d(CUtensorMap* map, const void* base, DType dtype, uint64_t cols, uint64_t rows,
                    uint64_t row_stride_bytes, uint32_t box_cols, uint32_t box_rows);

}  // namespace mqa
