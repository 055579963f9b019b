// The CPU reference of the KV-cache write: fp32, one thread.
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/kv_cache.h"

namespace mqa {

absl::Status ValidateKvCacheWriteShape(const KvCacheWriteParams& p) {
  if (p.num_tokens < 0) return absl::InvalidArgumentError("kv cache write: negative num_tokens");
  if (p.num_kv_heads <= 0 || p.head_dim <= 0 || p.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache write: num_kv_heads (", p.num_kv_heads, "), head_dim (", p.head_dim,
                     ") and block_size (", p.block_size, ") must be positive"));
  }
  const int64_t row = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  if (p.key_stride < row || p.value_stride < row) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache write: key_stride ", p.key_stride,
                                                   " / value_stride ", p.value_stride,
                                                   " < num_kv_heads*head_dim ", row));
  }
  if (p.num_tokens > 0 && (p.key == nullptr || p.value == nullptr || p.key_cache == nullptr ||
                           p.value_cache == nullptr || p.slot_mapping == nullptr)) {
    return absl::InvalidArgumentError("kv cache write: null pointer");
  }
  return absl::OkStatus();
}

absl::Status KvCacheWriteCpu(const KvCacheWriteParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheWriteCpu supports float32 only, got ",
                                                   std::string(DTypeName(p.dtype))));
  }
  if (absl::Status s = ValidateKvCacheWriteShape(p); !s.ok()) return s;
  const auto* key = static_cast<const float*>(p.key);
  const auto* value = static_cast<const float*>(p.value);
  auto* key_cache = static_cast<float*>(p.key_cache);
  auto* value_cache = static_cast<float*>(p.value_cache);
  // A slot is block * block_size + offset, and the cache is [block, offset, head, dim], so the
  // slot indexes whole token rows directly.
  const int64_t row = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  for (int t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding token: nothing to store
    std::memcpy(key_cache + slot * row, key + t * p.key_stride, row * sizeof(float));
    std::memcpy(value_cache + slot * row, value + t * p.value_stride, row * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace mqa
