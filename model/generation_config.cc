#include "model/generation_config.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/text_file.h"

namespace mqa {
namespace {

using json = nlohmann::json;

}  // namespace

absl::StatusOr<GenerationDefaults> ReadGenerationConfig(const std::string& path) {
  GenerationDefaults defaults;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return defaults;
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  const json config = json::parse(*text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  auto bad = [&](const char* field, const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"", field, "\" must be ", want, ", got ", config[field].dump()));
  };
  // (file field, API field, check): numbers within what the API accepts.
  struct Number {
    const char* field;
    const char* api;
    bool integer;
    double min, max;
    bool min_open;
    const char* want;
  };
  static constexpr Number kNumbers[] = {
      {"temperature", "temperature", false, 0, 1e6, false, "a number >= 0"},
      {"top_p", "top_p", false, 0, 1, true, "a number in (0, 1]"},
      {"top_k", "top_k", true, -1, 1e9, false, "an integer >= -1"},
      {"min_p", "min_p", false, 0, 1, false, "a number in [0, 1]"},
      {"repetition_penalty", "repetition_penalty", false, 0, 1e6, true, "a number > 0"},
      {"max_new_tokens", "max_tokens", true, 1, 1e9, false, "an integer >= 1"},
  };
  for (const Number& n : kNumbers) {
    auto it = config.find(n.field);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_number() || (n.integer && !it->is_number_integer())) return bad(n.field, n.want);
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < n.min || v > n.max || (n.min_open && v == n.min)) {
      return bad(n.field, n.want);
    }
    defaults.sampling[n.api] = *it;
  }
  // transformers' top_k 0 means no top-k, as the API's -1 does.
  if (defaults.sampling.contains("top_k") && defaults.sampling["top_k"] == 0) {
    defaults.sampling["top_k"] = -1;
  }
  if (auto it = config.find("eos_token_id"); it != config.end() && !it->is_null()) {
    const json ids = it->is_array() ? *it : json::array({*it});
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return bad("eos_token_id", "a token id or a list of token ids");
      }
      defaults.eos_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  return defaults;
}

}  // namespace mqa
