// A safetensors checkpoint: one file (DIR/model.safetensors) or several shards named by
// DIR/model.safetensors.index.json's "weight_map". Presents one name -> tensor lookup over all
// files and reads whole tensors or tensor-parallel slices of them, converted to a target dtype.
//
// Thread safety: immutable after Open; concurrent reads are safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/safetensors.h"
#include "runtime/tensor.h"

namespace mqa {

class Checkpoint {
 public:
  static constexpr const char* kSingleFile = "model.safetensors";
  static constexpr const char* kIndexFile = "model.safetensors.index.json";

  // Opens the index if there is one, else the single file. Errors: NotFound when the folder
  // holds neither (naming the folder); every file and index error names the file and tensor.
  // Validation: each tensor the index lists must exist in the shard it names; a tensor found in
  // two shards is an error; shard names must be plain file names inside the folder.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& model_dir);

  // Where one tensor lives.
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensorInfo* info = nullptr;
  };

  // nullptr when the checkpoint has no such tensor.
  const Entry* Find(std::string_view name) const;
  std::vector<std::string> TensorNames() const;
  // The file errors should name for this checkpoint as a whole (the index or the single file).
  const std::string& source() const { return source_; }
  size_t num_files() const { return files_.size(); }

  // Writes `slice` of tensor `name`, converted to `dst_dtype`, densely to `dst`.
  absl::Status ReadSliceInto(std::string_view name, const TensorSlice& slice, void* dst,
                             DType dst_dtype) const;
  // A new host tensor holding `slice` of tensor `name`.
  absl::StatusOr<Tensor> Read(std::string_view name, const TensorSlice& slice = TensorSlice::All(),
                              DType dtype = DType::kF32) const;

 private:
  Checkpoint() = default;
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace mqa
