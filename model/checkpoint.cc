#include "model/checkpoint.h"

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"
#include "runtime/text_file.h"

namespace mqa {
namespace {

using nlohmann::json;

// Keeps the status code, puts `context` in front of the message.
absl::Status WithContext(const absl::Status& s, const std::string& context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  const std::string index_path = model_dir + "/" + kIndexFile;
  const std::string single_path = model_dir + "/" + kSingleFile;
  std::error_code ec;

  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec)) {
      return absl::NotFoundError(absl::StrCat(
          model_dir, ": no ", kSingleFile, " or ", kIndexFile,
          " (only safetensors checkpoints are read; convert pytorch_model.bin first, or use "
          "load_format=dummy for random weights)"));
    }
    ckpt->source_ = single_path;
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    for (const auto& [name, info] : file->header().tensors) {
      ckpt->entries_.emplace(name, Entry{file.get(), &info});
    }
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }

  ckpt->source_ = index_path;
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": expected an object with a 'weight_map' object"));
  }

  // Open every shard once, in name order.
  std::map<std::string, SafetensorsFile*> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for tensor '",
                                                     name, "' must be a file name string"));
    }
    const std::string file_name = shard.get<std::string>();
    if (file_name.empty() || file_name == "." || file_name == ".." ||
        file_name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor '", name, "' names shard '", file_name,
                       "', which is not a plain file name in the checkpoint folder"));
    }
    if (shards.contains(file_name)) continue;
    auto file = SafetensorsFile::Open(model_dir + "/" + file_name);
    if (!file.ok()) {
      return WithContext(file.status(), absl::StrCat(index_path, ": shard '", file_name,
                                                     "' (listed for tensor '", name, "')"));
    }
    shards.emplace(file_name, file->get());
    ckpt->files_.push_back(*std::move(file));
  }

  // A tensor stored in two shards is ambiguous, whatever the index says.
  std::map<std::string_view, const SafetensorsFile*> seen;
  for (const auto& file : ckpt->files_) {
    for (const auto& [name, info] : file->header().tensors) {
      auto [it, inserted] = seen.emplace(name, file.get());
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", name,
                                                       "' is stored in both ", it->second->path(),
                                                       " and ", file->path()));
      }
    }
  }

  for (const auto& [name, shard] : index["weight_map"].items()) {
    SafetensorsFile* file = shards.at(shard.get<std::string>());
    const SafetensorsTensorInfo* info = file->Find(name);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat(index_path, ": tensor '", name,
                                              "' is listed in shard '", shard.get<std::string>(),
                                              "', but ", file->path(), " has no such tensor"));
    }
    ckpt->entries_.emplace(name, Entry{file, info});
  }
  return ckpt;
}

const Checkpoint::Entry* Checkpoint::Find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

absl::Status Checkpoint::ReadSliceInto(std::string_view name, const TensorSlice& slice, void* dst,
                                       DType dst_dtype) const {
  const Entry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(source_, ": no tensor '", std::string(name), "'"));
  }
  return e->file->ReadSliceInto(*e->info, slice, dst, dst_dtype);
}

absl::StatusOr<Tensor> Checkpoint::Read(std::string_view name, const TensorSlice& slice,
                                        DType dtype) const {
  const Entry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(source_, ": no tensor '", std::string(name), "'"));
  }
  return e->file->Read(name, slice, dtype);
}

}  // namespace mqa
