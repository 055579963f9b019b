#include "runtime/speculative.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mqa {

namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--speculative-config: '", field, "' ", why));
}

}  // namespace

absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(absl::string_view text) {
  SpeculativeConfig config;
  if (text.empty()) return config;
  const nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        "--speculative-config: expected a JSON object such as "
        "{\"method\": \"ngram\", \"num_speculative_tokens\": 5}");
  }
  for (const auto& [key, value] : object.items()) {
    if (key == "method") {
      if (value != "ngram") return Bad(key, "must be \"ngram\" (the only method implemented)");
    } else if (key == "num_speculative_tokens" || key == "prompt_lookup_max" ||
               key == "prompt_lookup_min") {
      if (!value.is_number_integer()) return Bad(key, "must be an integer");
      const int64_t n = value.get<int64_t>();
      if (n < 1 || n > 15) return Bad(key, "must be in 1..15");
      const int v = static_cast<int>(n);
      if (key == "num_speculative_tokens") config.num_speculative_tokens = v;
      if (key == "prompt_lookup_max") config.prompt_lookup_max = v;
      if (key == "prompt_lookup_min") config.prompt_lookup_min = v;
    } else {
      return Bad(key,
                 "is not a field of the ngram method (method, num_speculative_tokens, "
                 "prompt_lookup_max, prompt_lookup_min)");
    }
  }
  if (object.value("method", "") != "ngram") return Bad("method", "is required (\"ngram\")");
  if (config.num_speculative_tokens == 0) return Bad("num_speculative_tokens", "is required");
  if (!object.contains("prompt_lookup_max")) {
    config.prompt_lookup_max = std::max(config.prompt_lookup_max, config.prompt_lookup_min);
  }
  if (config.prompt_lookup_min > config.prompt_lookup_max) {
    return Bad("prompt_lookup_min", "must not exceed prompt_lookup_max");
  }
  return config;
}

std::vector<int32_t> ProposeNgramDraft(absl::Span<const int32_t> tokens,
                                       const SpeculativeConfig& config, int max_tokens) {
  const int len = static_cast<int>(tokens.size());
  if (max_tokens <= 0) return {};
  for (int n = std::min(config.prompt_lookup_max, len - 1); n >= config.prompt_lookup_min; --n) {
    const absl::Span<const int32_t> suffix = tokens.subspan(len - n);
    // The latest earlier occurrence: it starts at i < len - n, so a token follows it.
    for (int i = len - n - 1; i >= 0; --i) {
      if (tokens[i] != suffix[0] || !std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) {
        continue;
      }
      const int from = i + n;
      const int count = std::min(max_tokens, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace mqa
