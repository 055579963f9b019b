// A model folder's generation_config.json (what transformers' GenerationConfig.save_pretrained
// writes), read as vLLM reads it with --generation-config auto: the sampling values the model's
// authors chose become the defaults of requests that leave them unset, and every id of its
// eos_token_id ends a sequence (chat fine-tunes list their turn-end token there).
//
// Thread safety: a value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace mqa {

struct GenerationDefaults {
  // API field -> value, for the fields vLLM takes: temperature, top_p, top_k, min_p,
  // repetition_penalty, and max_tokens (the file's max_new_tokens). Only those the file sets.
  nlohmann::json sampling = nlohmann::json::object();
  std::vector<int32_t> eos_token_ids;  // eos_token_id, one id or a list; empty when unset
};

// `path` is the file (the caller picks the folder). A missing file gives empty defaults; a file
// that is not JSON, or a field above of the wrong type or range, is InvalidArgument naming the
// file and the field.
absl::StatusOr<GenerationDefaults> ReadGenerationConfig(const std::string& path);

}  // namespace mqa
