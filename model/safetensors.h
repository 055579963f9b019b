// Reading safetensors files: a pure header parser, an mmap-backed file, and converting reads of
// a whole tensor or of one tensor-parallel slice of it (rows, columns, or a 1-D range).
//
// File format: 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F16", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data section; offsets are relative to the data section's start (byte 8 + N).
//
// Thread safety: a SafetensorsFile is immutable after Open; concurrent reads are safe. The
// mapping lives as long as the SafetensorsFile; raw views into it must not outlive it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace mqa {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;      // as written in the header: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;  // set for F32 / F16 / BF16, the dtypes mqaserve can read
  size_t element_size = 0;     // bytes per element of dtype_name
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // [begin, end): bytes relative to the data section
  uint64_t end = 0;

  int64_t numel() const;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts in the file
  uint64_t data_size = 0;    // file size - data_offset
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafetensorsTensorInfo, std::less<>> tensors;
};

// Parses and validates the header of a safetensors file whose complete contents are
// `file_bytes`: length prefix within the file, JSON validity, dtype names, shapes, that
// shape product x element size equals each data_offsets span, that spans lie inside the data
// section, do not overlap, and that no name appears twice. Pure (no I/O); `source` names the
// file in every error message.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file_bytes,
                                                         std::string_view source);

// A part of a tensor seen as 2-D [rows = shape[0], cols = product of the other dims]:
// rows [row_begin, row_end) x cols [col_begin, col_end); an end of -1 means "to the end".
// A 1-D tensor is [n, 1], so Rows() is an element range. Column slices need a 2-D tensor.
struct TensorSlice {
  int64_t row_begin = 0;
  int64_t row_end = -1;
  int64_t col_begin = 0;
  int64_t col_end = -1;

  static TensorSlice All() { return {}; }
  static TensorSlice Rows(int64_t begin, int64_t end) { return {begin, end, 0, -1}; }
  static TensorSlice Cols(int64_t begin, int64_t end) { return {0, -1, begin, end}; }
};

// The slice resolved against a tensor's shape: concrete bounds and the output shape.
struct ResolvedSlice {
  int64_t rows = 0, cols = 0;  // the tensor as 2-D
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  std::vector<int64_t> out_shape;
  int64_t out_numel() const { return (row_end - row_begin) * (col_end - col_begin); }
};

// Checks `slice` against `info`'s shape; errors name `source` and the tensor.
absl::StatusOr<ResolvedSlice> ResolveSlice(const SafetensorsTensorInfo& info,
                                           const TensorSlice& slice, std::string_view source);

// Owns a read-only private mapping of a whole file (RAII: unmapped in the destructor).
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, void* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  void* data_;  // nullptr for an empty file
  size_t size_;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header (ParseSafetensorsHeader).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const SafetensorsHeader& header() const { return header_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensorInfo* Find(std::string_view name) const;

  // Converts `slice` of tensor `info` (which must belong to this file) to `dst_dtype` and
  // writes it densely (row-major, out_shape) to `dst`. Only the slice's bytes are touched in
  // the mapping, so reading one rank's shard does not read the rest of the tensor.
  // Non-float tensors are an error naming the file, tensor and dtype.
  absl::Status ReadSliceInto(const SafetensorsTensorInfo& info, const TensorSlice& slice, void* dst,
                             DType dst_dtype) const;

  // A new host tensor holding `slice` of tensor `name` in `dtype`.
  absl::StatusOr<Tensor> Read(std::string_view name, const TensorSlice& slice = TensorSlice::All(),
                              DType dtype = DType::kF32) const;

 private:
  SafetensorsFile(std::unique_ptr<MappedFile> file, SafetensorsHeader header)
      : file_(std::move(file)), header_(std::move(header)) {}
  std::unique_ptr<MappedFile> file_;
  SafetensorsHeader header_;
};

}  // namespace mqa
