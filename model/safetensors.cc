#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {
namespace {

// Closes a file descriptor on scope exit; the mapping stays valid after close.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

absl::Status ErrnoError(const std::string& path, const char* what, int err) {
  const std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  return err == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
}

// Converts `count` elements; the source may sit at any byte offset in the mapping (a header
// length that is not a multiple of 8 misaligns every tensor), so misaligned input goes through
// an aligned bounce buffer rather than being read through a misaligned pointer.
void ConvertFromMapping(const char* src, DType src_dtype, char* dst, DType dst_dtype,
                        size_t count) {
  const size_t esize = DTypeSize(src_dtype);
  if (reinterpret_cast<uintptr_t>(src) % esize == 0) {
    ConvertFloats(src, src_dtype, dst, dst_dtype, count);
    return;
  }
  constexpr size_t kChunk = 1 << 14;
  alignas(16) char bounce[kChunk * 4];
  const size_t dsize = DTypeSize(dst_dtype);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(kChunk, count - done);
    std::memcpy(bounce, src + done * esize, n * esize);
    ConvertFloats(bounce, src_dtype, dst + done * dsize, dst_dtype, n);
    done += n;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open", errno);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(path, "fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) return ErrnoError(path, "mmap", errno);
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(file->bytes(), path));
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(std::move(file), std::move(header)));
}

const SafetensorsTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = header_.tensors.find(name);
  return it == header_.tensors.end() ? nullptr : &it->second;
}

absl::Status SafetensorsFile::ReadSliceInto(const SafetensorsTensorInfo& info,
                                            const TensorSlice& slice, void* dst,
                                            DType dst_dtype) const {
  MQA_CHECK(Find(info.name) == &info);
  if (!info.dtype.has_value()) {
    return absl::UnimplementedError(absl::StrCat(path(), ": tensor '", info.name, "' has dtype ",
                                                 info.dtype_name,
                                                 "; mqaserve reads F32, F16 and BF16 tensors"));
  }
  if (!IsFloatDType(dst_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(path(), ": tensor '", info.name,
                                                   "': cannot convert to ",
                                                   std::string(DTypeName(dst_dtype))));
  }
  ASSIGN_OR_RETURN(ResolvedSlice r, ResolveSlice(info, slice, path()));
  const DType src_dtype = *info.dtype;
  const size_t esize = info.element_size;
  const size_t dsize = DTypeSize(dst_dtype);
  const char* base = file_->bytes().data() + header_.data_offset + info.begin;
  char* out = static_cast<char*>(dst);
  const int64_t width = r.col_end - r.col_begin;
  if (width == r.cols) {
    // Whole rows are one contiguous run in the file.
    ConvertFromMapping(base + r.row_begin * r.cols * esize, src_dtype, out, dst_dtype,
                       static_cast<size_t>(r.out_numel()));
    return absl::OkStatus();
  }
  for (int64_t row = r.row_begin; row < r.row_end; ++row) {
    ConvertFromMapping(base + (row * r.cols + r.col_begin) * esize, src_dtype,
                       out + (row - r.row_begin) * width * dsize, dst_dtype,
                       static_cast<size_t>(width));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> SafetensorsFile::Read(std::string_view name, const TensorSlice& slice,
                                             DType dtype) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path(), ": no tensor '", std::string(name), "'"));
  }
  ASSIGN_OR_RETURN(ResolvedSlice r, ResolveSlice(*info, slice, path()));
  ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(r.out_shape, dtype));
  RETURN_IF_ERROR(ReadSliceInto(*info, slice, t.raw(), dtype));
  return t;
}

}  // namespace mqa
