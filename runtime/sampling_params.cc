#include "runtime/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace mqa {

absl::Status SamplingParams::Validate() const {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (n < 1) return bad("n must be at least 1, got ", n);
  if (!guided_regex.empty() && !guided_grammar.empty()) {
    return bad("guided_regex and guided_grammar: one guide at most");
  }
  if ((!guided_regex.empty() || !guided_grammar.empty()) && guide == nullptr) {
    return bad("guided decoding needs its guide compiled against the tokenizer (the server does)");
  }
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return bad("temperature must be >= 0, got ", temperature);
  }
  if (top_k < -1) return bad("top_k must be -1 (disabled) or at least 1, got ", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad("top_p must be in (0, 1], got ", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad("min_p must be in [0, 1], got ", min_p);
  if (penalty_last_n < -1 || penalty_last_n == 0) {
    return bad("penalty_last_n must be -1 (all) or > 0, got ", penalty_last_n);
  }
  if (!(typical_p > 0.0f && typical_p <= 1.0f)) {
    return bad("typical_p must be in (0, 1], got ", typical_p);
  }
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return bad("repetition_penalty must be > 0, got ", repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return bad("presence_penalty must be in [-2, 2], got ", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return bad("logit_bias token ids must be >= 0, got ", id);
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return bad("logit_bias values must be in [-100, 100], got ", bias);
    }
  }
  for (int32_t id : allowed_token_ids) {
    if (id < 0) return bad("allowed_token_ids must be >= 0, got ", id);
  }
  if (max_tokens < 0 || (max_tokens == 0 && !(prompt_logprobs.has_value() && n == 1))) {
    return bad("max_tokens must be at least 1 (0 only with prompt_logprobs and n = 1), got ",
               max_tokens);
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return bad("min_tokens must be in [0, max_tokens=", max_tokens, "], got ", min_tokens);
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0) return bad("stop_token_ids must be >= 0, got ", id);
  }
  for (const std::string& s : stop) {
    if (s.empty()) return bad("stop strings must not be empty");
  }
  if (logprobs.has_value() && (*logprobs < 0 || *logprobs > kMaxLogprobs)) {
    return bad("logprobs must be in [0, ", kMaxLogprobs, "], got ", *logprobs);
  }
  if (prompt_logprobs.has_value() && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs)) {
    return bad("prompt_logprobs must be in [0, ", kMaxLogprobs, "], got ", *prompt_logprobs);
  }
  return absl::OkStatus();
}

bool DeviceSamplable(const SamplingParams& params) {
  return params.repetition_penalty == 1.0f && params.presence_penalty == 0.0f &&
         params.frequency_penalty == 0.0f && params.min_p == 0.0f && params.typical_p == 1.0f &&
         params.min_tokens == 0 && params.logit_bias.empty() && params.allowed_token_ids.empty() &&
         params.guide == nullptr && params.bad_words_token_ids.empty();
}

}  // namespace mqa
