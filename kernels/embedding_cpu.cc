#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/embedding.h"

namespace mqa {

absl::Status EmbeddingCpu(const EmbeddingParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbeddingCpu: dtype ", std::string(DTypeName(p.dtype)), " (only float32)"));
  }
  if (p.num_tokens < 0 || p.hidden <= 0 || p.table_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("EmbeddingCpu: num_tokens ", p.num_tokens,
                                                   ", hidden ", p.hidden, ", rows ", p.table_rows));
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.ids || !p.table || !p.output || (p.position_table && !p.positions)) {
    return absl::InvalidArgumentError("EmbeddingCpu: null pointer");
  }
  const float* table = static_cast<const float*>(p.table);
  const float* pos_table = static_cast<const float*>(p.position_table);
  float* out = static_cast<float*>(p.output);
  const int64_t h = p.hidden;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    float* y = out + t * h;
    const int64_t row = static_cast<int64_t>(p.ids[t]) - p.table_start;
    if (row >= 0 && row < p.table_rows) {
      std::memcpy(y, table + row * h, h * sizeof(float));
    } else {
      std::memset(y, 0, h * sizeof(float));
    }
    if (pos_table) {
      const int32_t pos = p.positions[t];
      if (pos < 0 || pos >= p.position_rows) {
        return absl::InvalidArgumentError(absl::StrCat("EmbeddingCpu: position ", pos, " of token ",
                                                       t, " outside [0, ", p.position_rows, ")"));
      }
      const float* pe = pos_table + static_cast<int64_t>(pos) * h;
      for (int64_t c = 0; c < h; ++c) y[c] += pe[c];
    }
  }
  return absl::OkStatus();
}

}  // namespace mqa
