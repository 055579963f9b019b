#include "runtime/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#ifdef MQA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace mqa {

absl::StatusOr<std::shared_ptr<Buffer>> Buffer::Allocate(Device device, size_t bytes) {
  const size_t padded = (bytes + 63) / 64 * 64;
  switch (device) {
    case Device::kCpu: {
      void* p = std::aligned_alloc(64, padded == 0 ? 64 : padded);
      if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("host alloc ", bytes));
      return std::shared_ptr<Buffer>(new Buffer(device, p, bytes));
    }
    case Device::kCuda: {
#ifdef MQA_WITH_CUDA
      void* p = nullptr;
      cudaError_t rc = cudaMalloc(&p, padded == 0 ? 64 : padded);
      if (rc != cudaSuccess) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cudaMalloc(", bytes, "): ", cudaGetErrorString(rc)));
      }
      return std::shared_ptr<Buffer>(new Buffer(device, p, bytes));
#else
      return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
    }
  }
  return absl::InternalError("unknown device");
}

Buffer::~Buffer() {
  switch (device_) {
    case Device::kCpu:
      std::free(data_);
      break;
    case Device::kCuda:
#ifdef MQA_WITH_CUDA
      cudaFree(data_);
#endif
      break;
  }
}

absl::StatusOr<Tensor> Tensor::Empty(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  ASSIGN_OR_RETURN(t.buffer_, Buffer::Allocate(device, t.nbytes()));
  return t;
}

Tensor Tensor::Cpu(std::vector<int64_t> shape, DType dtype) {
  auto t = Empty(std::move(shape), dtype, Device::kCpu);
  MQA_CHECK_OK(t.status());
  return *std::move(t);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  MQA_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0]);
  Tensor t = *this;
  const size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / shape_[0];
  t.offset_ += begin * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::Reshape(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  MQA_CHECK(t.numel() == numel());
  return t;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(std::string(DTypeName(dtype_)), "[", absl::StrJoin(shape_, ", "), "]",
                      device_ == Device::kCpu ? " cpu" : " cuda");
}

void ConvertFloats(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, count * DTypeSize(src_dtype));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (src_dtype) {
      case DType::kF32: return static_cast<const float*>(src)[i];
      case DType::kF16: return HalfBitsToFloat(static_cast<const uint16_t*>(src)[i]);
      case DType::kBF16: return BFloat16BitsToFloat(static_cast<const uint16_t*>(src)[i]);
      case DType::kI32:
      case DType::kI64: break;
    }
    MQA_CHECK(false && "ConvertFloats: not a float dtype");
    return 0;
  };
  for (size_t i = 0; i < count; ++i) {
    const float v = load(i);
    switch (dst_dtype) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = FloatToHalfBits(v); break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = FloatToBFloat16Bits(v); break;
      case DType::kI32:
      case DType::kI64: MQA_CHECK(false && "ConvertFloats: not a float dtype");
    }
  }
}

}  // namespace mqa
