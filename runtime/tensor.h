// Tensors: a shape, a dtype and a shared, RAII-owned buffer on the CPU or a CUDA device.
// A Tensor is a cheap handle (copies share the buffer). Not thread-safe for concurrent writes;
// the thread that owns the engine owns its tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace mqa {

enum class Device : uint8_t { kCpu, kCuda };

// Owns one allocation: host memory (64-byte aligned) or device memory (cudaMalloc).
class Buffer {
 public:
  static absl::StatusOr<std::shared_ptr<Buffer>> Allocate(Device device, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }

 private:
  Buffer(Device device, void* data, size_t size) : device_(device), data_(data), size_(size) {}
  Device device_;
  void* data_;
  size_t size_;
};

class Tensor {
 public:
  Tensor() = default;

  static absl::StatusOr<Tensor> Empty(std::vector<int64_t> shape, DType dtype,
                                      Device device = Device::kCpu);
  // Host tensor; host allocation failure is fatal (as for std::vector).
  static Tensor Cpu(std::vector<int64_t> shape, DType dtype = DType::kF32);

  bool defined() const { return buffer_ != nullptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return numel() * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() const { return static_cast<char*>(buffer_->data()) + offset_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  template <typename T>
  absl::Span<T> span() const {
    return absl::Span<T>(data<T>(), numel());
  }

  // Rows [begin, end) of the leading dimension, sharing the buffer.
  Tensor Rows(int64_t begin, int64_t end) const;
  // Same buffer, new shape with the same element count.
  Tensor Reshape(std::vector<int64_t> shape) const;

  std::string DebugString() const;

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

// Host-side element conversion between any two float dtypes (f32/f16/bf16).
void ConvertFloats(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t count);

}  // namespace mqa
