#include "runtime/http/api_types.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar.h"
#include "runtime/guided.h"
#include "runtime/json_schema_regex.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

// Status payloads: the OpenAI `param` of an error, and an HTTP status that no absl code maps to.
constexpr char kParamPayload[] = "type.mqaserve/param";
constexpr char kHttpStatusPayload[] = "type.mqaserve/http_status";

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// ---- JSON field readers: null or absent leaves the default ----

template <typename Json>
const Json* Field(const Json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// The field's string, or null when it is absent or not a string.
template <typename Json>
const std::string* StringField(const Json& object, const char* name) {
  const Json* value = Field(object, name);
  return value != nullptr && value->is_string() ? &value->template get_ref<const std::string&>()
                                                : nullptr;
}

absl::Status TypeError(const char* name, const char* expected) {
  return InvalidParam(name, absl::StrCat("'", name, "' must be ", expected));
}

absl::Status ReadBool(const json& object, const char* name, bool* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) return TypeError(name, "a boolean");
  *out = value->get<bool>();
  return absl::OkStatus();
}

// Integers only (16.0 is refused: a float where an integer belongs is a client bug).
absl::Status ReadInt64(const json& object, const char* name, std::optional<int64_t>* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (value->is_number_unsigned()) {
    uint64_t u = value->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidParam(name, absl::StrCat("'", name, "' is out of range: ", u));
    }
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (!value->is_number_integer()) return TypeError(name, "an integer");
  *out = value->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadInt(const json& object, const char* name, int64_t min, int64_t max, int* out,
                     bool* given = nullptr) {
  std::optional<int64_t> v;
  RETURN_IF_ERROR(ReadInt64(object, name, &v));
  if (!v.has_value()) return absl::OkStatus();
  if (*v < min || *v > max) {
    return InvalidParam(name,
                        absl::StrCat("'", name, "' must be in [", min, ", ", max, "], got ", *v));
  }
  *out = static_cast<int>(*v);
  if (given != nullptr) *given = true;
  return absl::OkStatus();
}

absl::Status ReadFloat(const json& object, const char* name, float* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number()) return TypeError(name, "a number");
  double v = value->get<double>();
  if (!std::isfinite(v)) return InvalidParam(name, absl::StrCat("'", name, "' must be finite"));
  *out = static_cast<float>(v);
  return absl::OkStatus();
}

// presence_penalty / frequency_penalty: in [-2, 2] (OpenAI's range; TGI's too).
absl::Status ReadAdditivePenalty(const json& object, const char* name, float* out) {
  RETURN_IF_ERROR(ReadFloat(object, name, out));
  if (!(*out >= -2.0f && *out <= 2.0f)) {
    return InvalidParam(name, absl::StrCat("'", name, "' must be in [-2, 2], got ", *out));
  }
  return absl::OkStatus();
}

// repetition_penalty: > 0.
absl::Status ReadRepetitionPenalty(const json& object, float* out) {
  RETURN_IF_ERROR(ReadFloat(object, "repetition_penalty", out));
  if (!(*out > 0.0f)) {
    return InvalidParam("repetition_penalty",
                        absl::StrCat("'repetition_penalty' must be > 0, got ", *out));
  }
  return absl::OkStatus();
}

// A string or a list of strings, appended to `out` as given.
absl::Status ReadStrings(const json& object, const char* name, std::vector<std::string>* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (value->is_string()) {
    out->push_back(value->get<std::string>());
    return absl::OkStatus();
  }
  if (!value->is_array()) return TypeError(name, "a string or a list of strings");
  for (const json& item : *value) {
    if (!item.is_string()) return TypeError(name, "a string or a list of strings");
    out->push_back(item.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ReadString(const json& object, const char* name, std::string* out) {
  const json* value = Field(object, name);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) return TypeError(name, "a string");
  *out = value->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadTokenList(const json& list, const char* name, std::vector<int32_t>* out) {
  out->clear();
  out->reserve(list.size());
  for (const json& item : list) {
    if (!item.is_number_integer()) return TypeError(name, "a list of integer token ids");
    int64_t id = item.is_number_unsigned() && item.get<uint64_t>() > kIntMax ? kIntMax + int64_t{1}
                                                                             : item.get<int64_t>();
    if (id < 0 || id > kIntMax) {
      return InvalidParam(name, absl::StrCat("token id ", item.dump(), " in '", name,
                                             "' is outside the vocabulary"));
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return absl::OkStatus();
}

constexpr int kMaxTools = 128;

// vLLM's guided_regex (a pattern) or guided_choice (a list of strings, each taken literally) into
// one pattern (runtime/guided.h), or guided_grammar (GBNF, runtime/grammar.h); the server
// compiles it. At most one of them.
constexpr size_t kMaxGuidedPatternBytes = 16384;
absl::Status ReadGuidance(const json& object, SamplingParams* p) {
  const json* regex = Field(object, "guided_regex");
  const json* choice = Field(object, "guided_choice");
  const json* grammar = Field(object, "guided_grammar");
  if ((regex != nullptr) + (choice != nullptr) + (grammar != nullptr) > 1) {
    return InvalidParam(grammar != nullptr ? "guided_grammar" : "guided_choice",
                        "give one of 'guided_regex', 'guided_choice' and 'guided_grammar'");
  }
  if (grammar != nullptr) {
    if (!grammar->is_string() || grammar->get_ref<const std::string&>().empty()) {
      return TypeError("guided_grammar", "a non-empty string (a GBNF grammar)");
    }
    if (grammar->get_ref<const std::string&>().size() > kMaxGuidedPatternBytes) {
      return InvalidParam("guided_grammar", absl::StrCat("the grammar is longer than ",
                                                         kMaxGuidedPatternBytes, " bytes"));
    }
    p->guided_grammar = grammar->get<std::string>();
    return absl::OkStatus();
  }
  std::string* pattern = &p->guided_regex;
  if (regex != nullptr) {
    if (!regex->is_string() || regex->get_ref<const std::string&>().empty()) {
      return TypeError("guided_regex", "a non-empty string (a regular expression)");
    }
    *pattern = regex->get<std::string>();
  } else if (choice != nullptr) {
    if (!choice->is_array() || choice->empty()) {
      return TypeError("guided_choice", "a non-empty list of non-empty strings");
    }
    std::vector<std::string> choices;
    for (const json& item : *choice) {
      if (!item.is_string() || item.get_ref<const std::string&>().empty()) {
        return TypeError("guided_choice", "a non-empty list of non-empty strings");
      }
      choices.push_back(item.get<std::string>());
    }
    *pattern = RegexGuide::ChoicePattern(choices);
  }
  if (pattern->size() > kMaxGuidedPatternBytes) {
    return InvalidParam(
        regex != nullptr ? "guided_regex" : "guided_choice",
        absl::StrCat("the guidance is longer than ", kMaxGuidedPatternBytes, " bytes"));
  }
  return absl::OkStatus();
}

// A JSON schema (runtime/json_schema_regex.h) as a guided pattern, with no space between tokens
// when `compact`; errors name `param`.
absl::Status SchemaPattern(const nlohmann::ordered_json& schema, const char* param,
                           std::string* pattern, bool compact = false) {
  absl::StatusOr<std::string> converted = JsonSchemaToRegex(schema, compact);
  if (!converted.ok()) return InvalidParam(param, converted.status().message());
  *pattern = *std::move(converted);
  if (pattern->size() > kMaxGuidedPatternBytes * 64) {
    return InvalidParam(param, "the schema's pattern is too large");
  }
  return absl::OkStatus();
}

// A schema given as its text, or as a JSON value found at `path` in the request body: read again
// from the body in order (ordered_json), so that properties keep the client's order. Errors name
// `param`.
absl::StatusOr<nlohmann::ordered_json> OrderedSchema(const json& value, absl::string_view body,
                                                     const char* path, const char* param) {
  if (!value.is_string()) {
    // The same body parsed again: the value is there (duplicate keys aside, which may pick
    // another one; then the schema is whatever that is, checked as any other).
    nlohmann::ordered_json whole =
        nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
    const nlohmann::ordered_json::json_pointer pointer(path);
    if (whole.is_discarded() || !whole.contains(pointer)) {
      return InvalidParam(param, absl::StrCat("'", param, "' holds no schema"));
    }
    return std::move(whole[pointer]);
  }
  nlohmann::ordered_json schema =
      nlohmann::ordered_json::parse(value.get_ref<const std::string&>(), nullptr, false);
  if (schema.is_discarded()) {
    return InvalidParam(param, absl::StrCat("'", param, "' holds text that is not valid JSON"));
  }
  return schema;
}

// vLLM's guided_whitespace_pattern (structured_outputs' disable_any_whitespace lowers to ""): the
// JSON guides' whitespace between tokens. Only "" (none) is taken besides the default, at most
// one space; true for "".
absl::StatusOr<bool> ReadCompactJson(const json& object) {
  const json* ws = Field(object, "guided_whitespace_pattern");
  if (ws == nullptr) return false;
  if (!ws->is_string()) return TypeError("guided_whitespace_pattern", "a string");
  if (!ws->get_ref<const std::string&>().empty()) {
    return InvalidParam("guided_whitespace_pattern",
                        "only \"\" (no whitespace between JSON tokens) is supported; the "
                        "default allows one space");
  }
  return true;
}

// vLLM's guided_json (a schema, or its text) and OpenAI's response_format (text, json_object,
// json_schema) into the request's pattern. The schema is read from `body` again in order
// (nlohmann::ordered_json): properties are generated in the order the client gave them.
absl::Status ReadJsonGuidance(absl::string_view body, const json& object, SamplingParams* p,
                              const char* schema_path = "/guided_json") {
  std::string* pattern = &p->guided_regex;
  ASSIGN_OR_RETURN(const bool compact, ReadCompactJson(object));
  const json* guided = Field(object, "guided_json");
  const json* format = Field(object, "response_format");
  std::string type = "text";
  if (format != nullptr) {
    const json* t = format->is_object() ? Field(*format, "type") : nullptr;
    if (t == nullptr || !t->is_string()) {
      return TypeError("response_format", "an object with a \"type\"");
    }
    type = t->get<std::string>();
    if (type != "text" && type != "json_object" && type != "json_schema") {
      return InvalidParam("response_format",
                          "'response_format' type must be text, json_object or json_schema");
    }
  }
  if (guided == nullptr && type == "text") return absl::OkStatus();
  const char* param = guided != nullptr ? "guided_json" : "response_format";
  if ((guided != nullptr && type != "text") || !pattern->empty() || !p->guided_grammar.empty()) {
    return InvalidParam(param,
                        "give one kind of guidance (guided_regex, guided_choice, "
                        "guided_grammar, guided_json or a JSON response_format)");
  }
  if (type == "json_object") {  // any object, at any depth: a grammar (JSON is not regular)
    p->guided_grammar = GrammarGuide::JsonObjectGrammar(compact);
    return absl::OkStatus();
  }
  if (guided != nullptr) {
    if (!guided->is_string() && !guided->is_object() && !guided->is_boolean()) {
      return TypeError("guided_json", "a JSON schema (an object, or its text)");
    }
    ASSIGN_OR_RETURN(const nlohmann::ordered_json schema,
                     OrderedSchema(*guided, body, schema_path, param));
    return SchemaPattern(schema, param, pattern, compact);
  }
  const json* json_schema = Field(*format, "json_schema");
  const json* value =
      json_schema != nullptr && json_schema->is_object() ? Field(*json_schema, "schema") : nullptr;
  if (value == nullptr) {
    return InvalidParam(param, "json_schema needs {\"json_schema\": {\"schema\": ...}}");
  }
  // OpenAI's schema is an object: text here is a (refused) schema, not parsed.
  if (value->is_string()) return SchemaPattern(value->get<std::string>(), param, pattern, compact);
  ASSIGN_OR_RETURN(const nlohmann::ordered_json schema,
                   OrderedSchema(*value, body, "/response_format/json_schema/schema", param));
  return SchemaPattern(schema, param, pattern, compact);
}

// vLLM's structured_outputs (which replaced its guided_* fields in 0.12): {"json": schema},
// {"regex": ...}, {"choice": [...]}, {"grammar": ...} or {"json_object": true}, with xgrammar's
// flags. Lowered into the guided_* fields (json_object: a json_object response_format) that the
// readers take, so the two spellings guide alike; true when there was one (a schema then lies at
// /structured_outputs/json in the body). Errors of the lowered fields are renamed back by
// StructuredOutputsError.
absl::StatusOr<bool> LowerStructuredOutputs(json& object) {
  const json* so = Field(object, "structured_outputs");
  if (so == nullptr) return false;
  if (!so->is_object()) {
    return TypeError("structured_outputs",
                     "an object: {\"json\": ...}, {\"regex\": ...}, {\"choice\": [...]}, "
                     "{\"grammar\": ...} or {\"json_object\": true}");
  }
  for (const char* old : {"guided_regex", "guided_choice", "guided_grammar", "guided_json"}) {
    if (Field(object, old) != nullptr) {
      return InvalidParam("structured_outputs",
                          absl::StrCat("give 'structured_outputs' or '", old, "', not both"));
    }
  }
  json guided = json::object();
  int kinds = 0;
  for (const auto& [key, value] : so->items()) {
    if (value.is_null()) continue;
    const std::string name = absl::StrCat("structured_outputs.", key);
    if (key == "json" || key == "regex" || key == "choice" || key == "grammar") {
      guided["guided_" + key] = value;
      ++kinds;
    } else if (key == "json_object") {
      if (!value.is_boolean()) return TypeError(name.c_str(), "a boolean");
      if (!value.get<bool>()) continue;
      if (Field(object, "response_format") != nullptr) {
        return InvalidParam("structured_outputs",
                            "give 'structured_outputs' or 'response_format', not both");
      }
      guided["response_format"] = {{"type", "json_object"}};
      ++kinds;
    } else if (key == "disable_fallback" || key == "disable_additional_properties") {
      // Backend choices that change nothing here: one guide, no fallback, and guided JSON has
      // no properties beyond the schema's.
      if (!value.is_boolean()) return TypeError(name.c_str(), "a boolean");
    } else if (key == "disable_any_whitespace") {
      if (!value.is_boolean()) return TypeError(name.c_str(), "a boolean");
      if (value.get<bool>()) guided["guided_whitespace_pattern"] = "";
    } else if (key == "whitespace_pattern") {
      guided["guided_whitespace_pattern"] = value;  // ReadCompactJson checks it
    } else if (key == "structural_tag") {
      return InvalidParam(name, absl::StrCat("'", name, "' is not supported by this server"));
    } else {
      return InvalidParam(name, absl::StrCat("unknown field '", name, "'"));
    }
  }
  if (kinds > 1) {
    return InvalidParam("structured_outputs",
                        "give one of json, regex, choice, grammar and json_object");
  }
  for (auto& [key, value] : guided.items()) object[key] = value;
  object.erase("structured_outputs");
  return true;
}

// An error of a lowered field (guided_X) as the client spelled it (structured_outputs.X).
absl::Status StructuredOutputsError(absl::Status status) {
  std::string param = ErrorParam(status);
  if (!absl::StartsWith(param, "guided_")) return status;
  const std::string renamed = absl::StrCat("structured_outputs.", param.substr(7));
  return ApiError(status.code(), renamed,
                  absl::StrReplaceAll(
                      status.message(),
                      {{"'" + param + "'", "'" + renamed + "'"},
                       {"guided_regex", "structured_outputs.regex"},
                       {"guided_choice", "structured_outputs.choice"},
                       {"guided_grammar", "structured_outputs.grammar"},
                       {"guided_json", "structured_outputs.json"},
                       {"guided_whitespace_pattern", "structured_outputs.whitespace_pattern"}}));
}

// The body as a JSON object: json, or nlohmann::ordered_json where the client's key order matters.
template <typename Json = json>
absl::StatusOr<Json> ParseObject(absl::string_view body) {
  if (!IsValidUtf8(body)) return InvalidParam("", "the request body is not valid UTF-8");
  Json parsed = Json::parse(body.begin(), body.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return InvalidParam("", "the request body is not valid JSON");
  if (!parsed.is_object()) return InvalidParam("", "the request body must be a JSON object");
  return parsed;
}

// Beam search's limits: a width the top-k log-probabilities can serve, and none of the fields it
// would ignore (it ranks whole continuations by the model's own log-probabilities).
absl::Status CheckBeamSearch(const json& object, const CompletionRequest& request) {
  if (!request.beam_search.has_value()) return absl::OkStatus();
  const SamplingParams& p = request.params;
  if (p.n > kMaxBeamWidth) {
    return InvalidParam("n", absl::StrCat("beam search takes n (the beam width) up to ",
                                          kMaxBeamWidth, ", got ", p.n));
  }
  if (!std::isfinite(request.beam_search->length_penalty)) {
    return InvalidParam("length_penalty", "'length_penalty' must be finite");
  }
  for (const char* name : {"logprobs",
                           "prompt_logprobs",
                           "echo",
                           "stop",
                           "stop_token_ids",
                           "bad_words",
                           "logit_bias",
                           "allowed_token_ids",
                           "min_tokens",
                           "presence_penalty",
                           "frequency_penalty",
                           "repetition_penalty",
                           "top_p",
                           "top_k",
                           "min_p",
                           "guided_regex",
                           "guided_choice",
                           "guided_json",
                           "guided_grammar",
                           "response_format",
                           "suffix",
                           "best_of"}) {
    if (Field(object, name) != nullptr) {
      return InvalidParam(name, absl::StrCat("'", name, "' does not go with beam search"));
    }
  }
  return absl::OkStatus();
}

// The server's defaults (generation_config.json's) into the sampling fields the body leaves
// unset; max_tokens is ApplyDefaultMaxTokens'. Beam search ranks by the model's own
// log-probabilities: none of these reach it.
void ApplyDefaults(const json& defaults, json& object) {
  if (!defaults.is_object()) return;
  const json* beams = Field(object, "use_beam_search");
  if (beams != nullptr && *beams == true) return;
  for (const auto& [key, value] : defaults.items()) {
    if (key != "max_tokens" && Field(object, key.c_str()) == nullptr) object[key] = value;
  }
}

// The defaults' max_tokens where the client gave none: still a default, which a long prompt cuts
// to what fits (ResolveMaxTokens), as vLLM caps the generation config's max_new_tokens.
void ApplyDefaultMaxTokens(const json& defaults, CompletionRequest* request) {
  if (request->max_tokens_given || !defaults.is_object()) return;
  auto it = defaults.find("max_tokens");
  if (it != defaults.end() && it->is_number_integer() && it->get<int64_t>() >= 1) {
    request->params.max_tokens = static_cast<int>(std::min<int64_t>(it->get<int64_t>(), kIntMax));
  }
}

absl::Status ReadModel(const json& object, std::optional<std::string>* model) {
  const json* value = Field(object, "model");
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) return TypeError("model", "a string");
  *model = value->get<std::string>();
  return absl::OkStatus();
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]
absl::Status ReadPrompts(const json& object, std::vector<PromptInput>* prompts) {
  const json* value = Field(object, "prompt");
  if (value == nullptr) return InvalidParam("prompt", "'prompt' is required");
  constexpr char kShape[] =
      "a string, a list of strings, a list of token ids or a list of lists of token ids";
  if (value->is_string()) {
    prompts->push_back({.is_text = true, .text = value->get<std::string>()});
  } else if (value->is_array()) {
    if (value->empty()) return InvalidParam("prompt", "'prompt' must not be empty");
    const json& first = value->front();
    if (first.is_number_integer()) {
      PromptInput prompt{.is_text = false};
      RETURN_IF_ERROR(ReadTokenList(*value, "prompt", &prompt.token_ids));
      prompts->push_back(std::move(prompt));
    } else {
      for (const json& item : *value) {
        if (item.is_string()) {
          prompts->push_back({.is_text = true, .text = item.get<std::string>()});
        } else if (item.is_array()) {
          PromptInput prompt{.is_text = false};
          RETURN_IF_ERROR(ReadTokenList(item, "prompt", &prompt.token_ids));
          prompts->push_back(std::move(prompt));
        } else {
          return TypeError("prompt", kShape);
        }
      }
    }
  } else {
    return TypeError("prompt", kShape);
  }
  if (prompts->size() > static_cast<size_t>(kMaxPromptsPerRequest)) {
    return InvalidParam("prompt", absl::StrCat("at most ", kMaxPromptsPerRequest,
                                               " prompts per request, got ", prompts->size()));
  }
  for (const PromptInput& prompt : *prompts) {
    if (prompt.is_text ? prompt.text.empty() : prompt.token_ids.empty()) {
      return InvalidParam("prompt", "'prompt' must not be empty");
    }
  }
  return absl::OkStatus();
}

// The fields shared by /v1/completions and /v1/infill (everything but the prompt).
absl::Status ReadCommon(const json& object, CompletionRequest* request) {
  SamplingParams& p = request->params;
  p.max_tokens = kDefaultMaxTokens;
  RETURN_IF_ERROR(ReadModel(object, &request->model));
  RETURN_IF_ERROR(ReadInt(object, "max_tokens", std::numeric_limits<int>::min(), kIntMax,
                          &p.max_tokens, &request->max_tokens_given));
  RETURN_IF_ERROR(ReadBool(object, "echo", &request->echo));
  if (p.max_tokens < 0 || (p.max_tokens == 0 && !request->echo)) {
    return InvalidParam(
        "max_tokens",
        absl::StrCat("'max_tokens' must be at least 1 (0 only with echo), got ", p.max_tokens));
  }
  RETURN_IF_ERROR(ReadFloat(object, "temperature", &p.temperature));
  if (p.temperature < 0.0f) {
    return InvalidParam("temperature",
                        absl::StrCat("'temperature' must be >= 0, got ", p.temperature));
  }
  RETURN_IF_ERROR(ReadFloat(object, "top_p", &p.top_p));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return InvalidParam("top_p", absl::StrCat("'top_p' must be in (0, 1], got ", p.top_p));
  }
  RETURN_IF_ERROR(ReadInt(object, "top_k", std::numeric_limits<int>::min(), kIntMax, &p.top_k));
  if (p.top_k < -1) {
    return InvalidParam("top_k",
                        absl::StrCat("'top_k' must be -1 (disabled) or >= 0, got ", p.top_k));
  }
  RETURN_IF_ERROR(ReadFloat(object, "min_p", &p.min_p));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return InvalidParam("min_p", absl::StrCat("'min_p' must be in [0, 1], got ", p.min_p));
  }
  RETURN_IF_ERROR(ReadInt(object, "n", std::numeric_limits<int>::min(), kIntMax, &p.n));
  if (p.n < 1 || p.n > kMaxN) {
    return InvalidParam("n", absl::StrCat("'n' must be in [1, ", kMaxN, "], got ", p.n));
  }
  // best_of: the n most likely of best_of samples (1 or n: each sample is returned).
  int best_of = 1;
  RETURN_IF_ERROR(ReadInt(object, "best_of", std::numeric_limits<int>::min(), kIntMax, &best_of));
  if (best_of != 1 && best_of < p.n) {
    return InvalidParam("best_of", absl::StrCat("'best_of' must be at least 'n' (got ", best_of,
                                                " with n = ", p.n, ")"));
  }
  if (best_of > kMaxN) {
    return InvalidParam("best_of", absl::StrCat("'best_of' must be at most ", kMaxN));
  }
  if (best_of > p.n) request->best_of = best_of;
  RETURN_IF_ERROR(ReadAdditivePenalty(object, "presence_penalty", &p.presence_penalty));
  RETURN_IF_ERROR(ReadAdditivePenalty(object, "frequency_penalty", &p.frequency_penalty));
  RETURN_IF_ERROR(ReadRepetitionPenalty(object, &p.repetition_penalty));
  std::optional<int64_t> seed;
  RETURN_IF_ERROR(ReadInt64(object, "seed", &seed));
  // Negative seeds are accepted (OpenAI's seed is any int64) and reinterpreted as unsigned.
  if (seed.has_value()) p.seed = static_cast<uint64_t>(*seed);

  RETURN_IF_ERROR(ReadStrings(object, "stop", &p.stop));
  for (const std::string& s : p.stop) {
    if (s.empty()) return InvalidParam("stop", "'stop' strings must not be empty");
  }
  if (const json* ids = Field(object, "allowed_token_ids"); ids != nullptr) {
    if (!ids->is_array() || ids->empty()) {
      return TypeError("allowed_token_ids", "a non-empty list of integer token ids");
    }
    RETURN_IF_ERROR(ReadTokenList(*ids, "allowed_token_ids", &p.allowed_token_ids));
  }
  // Guided decoding (vLLM's guided_regex, guided_choice, guided_grammar, and its
  // structured_outputs lowered into them: runtime/guided.h, runtime/grammar.h; guided_json and
  // response_format: ReadJsonGuidance).
  RETURN_IF_ERROR(ReadGuidance(object, &p));
  // vLLM's priority (lower first; the engine refuses anything but 0 unless it schedules by
  // priority).
  RETURN_IF_ERROR(ReadInt(object, "priority", std::numeric_limits<int>::min(), kIntMax, &p.priority));
  bool beam_search = false;
  RETURN_IF_ERROR(ReadBool(object, "use_beam_search", &beam_search));
  if (beam_search) request->beam_search.emplace();
  if (Field(object, "length_penalty") != nullptr) {
    if (!beam_search) {
      return InvalidParam("length_penalty", "'length_penalty' needs 'use_beam_search': true");
    }
    RETURN_IF_ERROR(ReadFloat(object, "length_penalty", &request->beam_search->length_penalty));
  }
  if (const json* bad_words = Field(object, "bad_words"); bad_words != nullptr) {
    if (!bad_words->is_array()) return TypeError("bad_words", "a list of non-empty strings");
    for (const json& word : *bad_words) {
      if (!word.is_string() || word.get_ref<const std::string&>().empty()) {
        return TypeError("bad_words", "a list of non-empty strings");
      }
      p.bad_words.push_back(word.get<std::string>());
    }
  }
  if (const json* ids = Field(object, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return TypeError("stop_token_ids", "a list of integer token ids");
    RETURN_IF_ERROR(ReadTokenList(*ids, "stop_token_ids", &p.stop_token_ids));
  }
  RETURN_IF_ERROR(ReadBool(object, "include_stop_str_in_output", &p.include_stop_str_in_output));
  RETURN_IF_ERROR(ReadBool(object, "ignore_eos", &p.ignore_eos));
  RETURN_IF_ERROR(ReadBool(object, "skip_special_tokens", &p.skip_special_tokens));
  RETURN_IF_ERROR(
      ReadInt(object, "min_tokens", std::numeric_limits<int>::min(), kIntMax, &p.min_tokens));
  if (p.min_tokens < 0) {
    return InvalidParam("min_tokens",
                        absl::StrCat("'min_tokens' must be >= 0, got ", p.min_tokens));
  }
  if (request->max_tokens_given && p.min_tokens > p.max_tokens) {
    return InvalidParam("min_tokens",
                        absl::StrCat("'min_tokens' (", p.min_tokens,
                                     ") must not exceed 'max_tokens' (", p.max_tokens, ")"));
  }
  if (const json* bias = Field(object, "logit_bias"); bias != nullptr) {
    if (!bias->is_object()) return TypeError("logit_bias", "an object of token id -> bias");
    for (const auto& [key, value] : bias->items()) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(key, &id) || id < 0) {
        return InvalidParam("logit_bias",
                            absl::StrCat("'logit_bias' keys must be token ids, got '", key, "'"));
      }
      if (!value.is_number()) return TypeError("logit_bias", "an object of token id -> bias");
      const double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0)) {
        return InvalidParam("logit_bias",
                            absl::StrCat("'logit_bias' values must be in [-100, 100], got ", b));
      }
      p.logit_bias.emplace_back(id, static_cast<float>(b));
    }
  }
  if (const json* logprobs = Field(object, "logprobs"); logprobs != nullptr) {
    int value = 0;
    RETURN_IF_ERROR(ReadInt(object, "logprobs", 0, kMaxLogprobs, &value));
    p.logprobs = value;
  }
  RETURN_IF_ERROR(ReadBool(object, "return_token_ids", &request->return_token_ids));
  RETURN_IF_ERROR(ReadBool(object, "stream", &request->stream));
  if (const json* options = Field(object, "stream_options"); options != nullptr) {
    if (!options->is_object()) return TypeError("stream_options", "an object");
    if (!request->stream) {
      return InvalidParam("stream_options", "'stream_options' is only allowed with stream=true");
    }
    if (const json* usage = Field(*options, "include_usage"); usage != nullptr) {
      if (!usage->is_boolean()) return TypeError("stream_options", "{\"include_usage\": bool}");
      request->include_usage = usage->get<bool>();
    }
    // vLLM's: every chunk carries the usage so far (with include_usage).
    if (const json* running = Field(*options, "continuous_usage_stats"); running != nullptr) {
      if (!running->is_boolean()) {
        return TypeError("stream_options", "{\"continuous_usage_stats\": bool}");
      }
      request->continuous_usage = running->get<bool>();
    }
  }
  if (request->best_of > 0 && request->stream) {
    return InvalidParam("best_of",
                        "'best_of' greater than 'n' cannot be streamed (the best are "
                        "known only at the end)");
  }
  return absl::OkStatus();
}

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
    case 413:
      return "invalid_request_error";
    case 401:
    case 403:
      return "authentication_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return "server_error";
  }
}

const char* ErrorCode(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_value";
    case 401:
      return "invalid_api_key";
    case 404:
      return "not_found";
    case 413:
      return "request_too_large";
    case 429:
      return "queue_full";
    case 503:
      return "unavailable";
    default:
      return "internal_error";
  }
}

}  // namespace

absl::Status ApiError(absl::StatusCode code, absl::string_view param, absl::string_view message) {
  absl::Status status(code, message);
  if (!param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  return ApiError(absl::StatusCode::kInvalidArgument, param, message);
}

absl::Status PayloadTooLarge(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kHttpStatusPayload, absl::Cord("413"));
  return status;
}

std::string ErrorParam(const absl::Status& status) {
  auto param = status.GetPayload(kParamPayload);
  return param.has_value() ? std::string(*param) : std::string();
}

int HttpStatusFor(const absl::Status& status) {
  if (auto forced = status.GetPayload(kHttpStatusPayload)) {
    return std::stoi(std::string(*forced));
  }
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
      return 500;
    case absl::StatusCode::kDoNotUseReservedForFutureExpansionUseDefaultInSwitchInstead_:
      return 500;
  }
  return 500;
}

std::string ErrorBody(const absl::Status& status) {
  int http_status = HttpStatusFor(status);
  std::string param = ErrorParam(status);
  json error = {{"message", std::string(status.message())},
                {"type", ErrorType(http_status)},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", ErrorCode(http_status)}};
  return DumpJson(json{{"error", error}});
}

std::string DumpJson(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json UsageObject(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

std::string SseEvent(const json& value) { return absl::StrCat("data: ", DumpJson(value), "\n\n"); }

std::string ErrorBodyForHttpStatus(int http_status, absl::string_view message) {
  json error = {{"message", std::string(message)},
                {"type", ErrorType(http_status)},
                {"param", nullptr},
                {"code", ErrorCode(http_status)}};
  return DumpJson(json{{"error", error}});
}

namespace {

absl::StatusOr<CompletionRequest> ParseCompletionObject(absl::string_view body, json& object,
                                                        const json& defaults,
                                                        const char* schema_path) {
  ApplyDefaults(defaults, object);
  CompletionRequest request;
  RETURN_IF_ERROR(ReadPrompts(object, &request.prompts));
  RETURN_IF_ERROR(ReadCommon(object, &request));
  ApplyDefaultMaxTokens(defaults, &request);
  RETURN_IF_ERROR(ReadJsonGuidance(body, object, &request.params, schema_path));
  RETURN_IF_ERROR(CheckBeamSearch(object, request));
  if (Field(object, "prompt_logprobs") != nullptr) {
    RETURN_IF_ERROR(
        ReadInt(object, "prompt_logprobs", 0, kMaxLogprobs, &request.prompt_logprobs.emplace()));
    if (request.stream) {
      return InvalidParam("prompt_logprobs",
                          "'prompt_logprobs' is not available with stream=true (use echo with "
                          "logprobs)");
    }
  }
  // The engine computes the prompt's log-probabilities once, with the larger of the two counts
  // of alternatives: OpenAI's echo + logprobs holds them in the logprobs object, vLLM's
  // prompt_logprobs in choices[i].prompt_logprobs.
  std::optional<int>& engine_count = request.params.prompt_logprobs;
  if (request.echo && request.params.logprobs.has_value()) engine_count = request.params.logprobs;
  if (request.prompt_logprobs.has_value()) {
    engine_count = std::max(engine_count.value_or(0), *request.prompt_logprobs);
  }
  if (Field(object, "truncate_prompt_tokens") != nullptr) {
    RETURN_IF_ERROR(ReadInt(object, "truncate_prompt_tokens", 1, kIntMax,
                            &request.truncate_prompt_tokens.emplace()));
  }
  if (Field(object, "suffix") != nullptr) {
    if (request.truncate_prompt_tokens.has_value()) {
      return InvalidParam("truncate_prompt_tokens",
                          "'truncate_prompt_tokens' cannot be combined with 'suffix'");
    }
    RETURN_IF_ERROR(ReadString(object, "suffix", &request.suffix.emplace()));
    if (request.echo) return InvalidParam("suffix", "'suffix' cannot be combined with 'echo'");
    for (const PromptInput& prompt : request.prompts) {
      if (!prompt.is_text) {
        return InvalidParam("suffix", "'suffix' needs text prompts (each is the infill's prefix)");
      }
    }
  }
  return request;
}

}  // namespace

// The body read by `parse(object, schema_path)` after structured_outputs is lowered into the
// guided fields; its errors of those fields named as the client spelled them.
template <typename Request, typename Parse>
absl::StatusOr<Request> ParseLoweringStructuredOutputs(absl::string_view body, Parse parse) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  ASSIGN_OR_RETURN(const bool lowered, LowerStructuredOutputs(object));
  absl::StatusOr<Request> request =
      parse(object, lowered ? "/structured_outputs/json" : "/guided_json");
  if (!request.ok() && lowered) return StructuredOutputsError(request.status());
  return request;
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body,
                                                         const json& defaults) {
  return ParseLoweringStructuredOutputs<CompletionRequest>(
      body, [&](json& object, const char* schema_path) {
        return ParseCompletionObject(body, object, defaults, schema_path);
      });
}

absl::StatusOr<InfillRequest> ParseInfillRequest(absl::string_view body, const json& defaults) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  ApplyDefaults(defaults, object);
  InfillRequest request;
  RETURN_IF_ERROR(ReadString(object, "input_prefix", &request.input_prefix));
  RETURN_IF_ERROR(ReadString(object, "input_suffix", &request.input_suffix));
  RETURN_IF_ERROR(ReadString(object, "prompt", &request.prompt));
  if (Field(object, "input_prefix") == nullptr && Field(object, "input_suffix") == nullptr) {
    return InvalidParam("input_prefix", "'input_prefix' or 'input_suffix' is required");
  }
  RETURN_IF_ERROR(ReadCommon(object, &request.common));
  ApplyDefaultMaxTokens(defaults, &request.common);
  if (request.common.echo) return InvalidParam("echo", "'echo' is not supported by /v1/infill");
  if (request.common.beam_search.has_value()) {
    return InvalidParam("use_beam_search", "beam search is served by /v1/completions");
  }
  return request;
}

namespace {

// An earlier assistant turn's tool_calls: a list of {"id", "type", "function": {"name",
// "arguments"}} whose arguments (JSON text) are parsed into an object, as vLLM gives them to
// templates (which iterate over them or print them with tojson).
absl::Status ReadHistoryToolCalls(const json& calls, json* out) {
  constexpr char kShape[] =
      "a message's 'tool_calls' must be a list of {\"function\": {\"name\": string, "
      "\"arguments\": JSON text}}";
  if (!calls.is_array()) return InvalidParam("messages", kShape);
  *out = calls;
  for (json& call : *out) {
    json* function = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
    if (function == nullptr || !function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string()) {
      return InvalidParam("messages", kShape);
    }
    auto arguments = function->find("arguments");
    if (arguments == function->end() || !arguments->is_string()) continue;
    json parsed = json::parse(arguments->get_ref<const std::string&>(), nullptr, false);
    if (parsed.is_discarded()) {
      return InvalidParam(
          "messages", absl::StrCat("the arguments of an earlier call of '",
                                   (*function)["name"].get<std::string>(), "' are not JSON text"));
    }
    *arguments = std::move(parsed);
  }
  return absl::OkStatus();
}

// OpenAI's tools: a list of {"type": "function" (the default), "function": {"name", "description",
// "parameters": a JSON schema, "strict"}}, names unique and of OpenAI's form. An empty list is
// none.
absl::Status ReadTools(const json& object, json* tools) {
  const json* value = Field(object, "tools");
  if (value == nullptr) return absl::OkStatus();
  constexpr char kShape[] =
      "a list of {\"type\": \"function\", \"function\": {\"name\", \"description\", "
      "\"parameters\"}} objects";
  if (!value->is_array()) return TypeError("tools", kShape);
  if (value->empty()) return absl::OkStatus();
  if (value->size() > static_cast<size_t>(kMaxTools)) {
    return InvalidParam("tools", absl::StrCat("at most ", kMaxTools, " tools"));
  }
  std::vector<std::string> names;
  for (const json& tool : *value) {
    const json* type = tool.is_object() ? Field(tool, "type") : nullptr;
    const json* function = tool.is_object() ? Field(tool, "function") : nullptr;
    if ((type != nullptr && *type != "function") || function == nullptr || !function->is_object()) {
      return TypeError("tools", kShape);
    }
    const json* name = Field(*function, "name");
    const std::string text = name != nullptr && name->is_string() ? name->get<std::string>() : "";
    const bool name_ok =
        !text.empty() && text.size() <= 64 && std::all_of(text.begin(), text.end(), [](char c) {
          return absl::ascii_isalnum(c) || c == '_' || c == '-';
        });
    if (!name_ok) {
      return InvalidParam("tools", "a function's 'name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
    }
    if (std::find(names.begin(), names.end(), text) != names.end()) {
      return InvalidParam("tools", absl::StrCat("two tools are named '", text, "'"));
    }
    names.push_back(text);
    const json* description = Field(*function, "description");
    const json* parameters = Field(*function, "parameters");
    if ((description != nullptr && !description->is_string()) ||
        (parameters != nullptr && !parameters->is_object())) {
      return InvalidParam("tools", absl::StrCat("tool '", text,
                                                "': 'description' must be a string and "
                                                "'parameters' a JSON schema object"));
    }
  }
  *tools = *value;
  return absl::OkStatus();
}

// tool_choice into the request's mode and, for a named function or "required", the pattern that
// guides the output to the call (runtime/http/tool_calls.h). The tools' parameter schemas are read
// from `body` again in order, so that arguments are generated in the client's property order.
absl::Status ReadToolChoice(absl::string_view body, const json& object, ChatRequest* request) {
  const json& tools = request->chat.tools;
  std::string mode = tools.is_null() ? "none" : "auto";
  std::string name;
  if (const json* choice = Field(object, "tool_choice"); choice != nullptr) {
    constexpr char kShape[] =
        "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
        "{\"name\": ...}}";
    const json* function = choice->is_object() ? Field(*choice, "function") : nullptr;
    const json* named =
        function != nullptr && function->is_object() ? Field(*function, "name") : nullptr;
    if (choice->is_string() && (*choice == "none" || *choice == "auto" || *choice == "required")) {
      mode = choice->get<std::string>();
    } else if (named != nullptr && named->is_string()) {
      mode = "named";
      name = named->get<std::string>();
    } else {
      return TypeError("tool_choice", kShape);
    }
  }
  if (mode == "none") return absl::OkStatus();
  if (mode == "auto") {  // the model decides; the server's parser reads its calls (or refuses)
    if (tools.is_null()) return absl::OkStatus();
    if (request->echo) return InvalidParam("echo", "'echo' does not go with a tool choice");
    request->tool_choice = {.mode = ToolChoiceMode::kAuto};
    return absl::OkStatus();
  }
  if (tools.is_null()) {
    return InvalidParam("tool_choice", "a tool choice other than \"none\" needs 'tools'");
  }
  std::string& pattern = request->common.params.guided_regex;
  if (!pattern.empty() || !request->common.params.guided_grammar.empty()) {
    return InvalidParam(
        "tool_choice",
        "a tool call is guided output: give a tool choice or guidance "
        "(guided_regex, guided_choice, guided_grammar, guided_json, response_format), not "
        "both");
  }
  if (request->echo) return InvalidParam("echo", "'echo' does not go with a tool choice");
  bool parallel = true;
  RETURN_IF_ERROR(ReadBool(object, "parallel_tool_calls", &parallel));
  // The body parsed again with its keys in order (it parsed once already).
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  MQA_CHECK(!ordered.is_discarded());
  const nlohmann::ordered_json& ordered_tools = ordered["tools"];
  auto parameters = [&](size_t i) {
    const nlohmann::ordered_json& function = ordered_tools[i]["function"];
    auto it = function.find("parameters");
    return it != function.end() && !it->is_null() ? *it
                                                  : nlohmann::ordered_json{{"type", "object"}};
  };
  if (mode == "named") {
    for (size_t i = 0; i < tools.size(); ++i) {
      if (tools[i]["function"]["name"] != name) continue;
      request->tool_choice = {.mode = ToolChoiceMode::kNamed, .name = name};
      const json& function = tools[i]["function"];
      if (!function.contains("parameters") || function["parameters"].is_null()) {
        // Any object as the arguments, at any depth.
        request->common.params.guided_grammar = GrammarGuide::JsonObjectGrammar();
        return absl::OkStatus();
      }
      return SchemaPattern(parameters(i), "tools", &pattern);
    }
    return InvalidParam("tool_choice",
                        absl::StrCat("'tool_choice' names '", name, "', which is not in 'tools'"));
  }
  // "required": [{"name": one of the tools, "parameters": its arguments}, ...], the tools' $defs
  // gathered at the root, where their $refs point.
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  nlohmann::ordered_json root = {{"type", "array"}, {"minItems", 1}};
  if (!parallel) root["maxItems"] = 1;
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::ordered_json params = parameters(i);
    for (const char* defs : {"$defs", "definitions"}) {
      auto it = params.find(defs);
      if (it == params.end() || !it->is_object()) continue;
      for (const auto& [key, value] : it->items()) {
        nlohmann::ordered_json& slot = root[defs][key];
        if (!slot.is_null() && slot != value) {
          return InvalidParam("tools",
                              absl::StrCat("two tools define ", defs, "/", key, " differently"));
        }
        slot = value;
      }
    }
    const std::string function = tools[i]["function"]["name"];
    nlohmann::ordered_json call = {{"type", "object"}};
    call["properties"]["name"] = {{"const", function}};
    call["properties"]["parameters"] = params;
    call["required"] = {"name", "parameters"};
    calls.push_back(std::move(call));
  }
  root["items"] = {{"anyOf", std::move(calls)}};
  request->tool_choice = {.mode = ToolChoiceMode::kRequired};
  return SchemaPattern(root, "tools", &pattern);
}

// messages: a non-empty list of {"role": string, "content": string or text parts} (other keys
// kept for the template), content normalised to a string.
absl::Status ReadMessages(const json& object, json* out) {
  const json* messages = Field(object, "messages");
  if (messages == nullptr) return InvalidParam("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) {
    return TypeError("messages", "a non-empty list of {\"role\", \"content\"} objects");
  }
  if (messages->size() > static_cast<size_t>(kMaxPromptsPerRequest)) {
    return InvalidParam("messages", absl::StrCat("at most ", kMaxPromptsPerRequest, " messages"));
  }
  *out = json::array();
  for (const json& m : *messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return TypeError("messages", "a list of objects with a string 'role'");
    }
    json message = m;
    const json* content = Field(m, "content");
    if (content == nullptr) {
      message["content"] = "";
    } else if (content->is_array()) {
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return InvalidParam("messages",
                              "message content parts must be {\"type\": \"text\", \"text\": ...}");
        }
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
      }
      message["content"] = text;
    } else if (!content->is_string()) {
      return TypeError("messages", "objects whose 'content' is a string or a list of text parts");
    }
    if (const json* calls = Field(m, "tool_calls"); calls != nullptr) {
      RETURN_IF_ERROR(ReadHistoryToolCalls(*calls, &message["tool_calls"]));
    }
    out->push_back(std::move(message));
  }
  return absl::OkStatus();
}

// The conversation fields that /v1/chat/completions and /tokenize share.
absl::Status ReadChat(const json& object, ChatTemplate::Chat* chat) {
  RETURN_IF_ERROR(ReadMessages(object, &chat->messages));
  RETURN_IF_ERROR(ReadTools(object, &chat->tools));
  RETURN_IF_ERROR(ReadBool(object, "add_generation_prompt", &chat->add_generation_prompt));
  RETURN_IF_ERROR(ReadBool(object, "continue_final_message", &chat->continue_final_message));
  if (chat->continue_final_message && chat->add_generation_prompt) {
    return InvalidParam("continue_final_message",
                        "'continue_final_message' and 'add_generation_prompt' cannot both be true "
                        "(add_generation_prompt is true unless given false)");
  }
  if (const json* kwargs = Field(object, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return TypeError("chat_template_kwargs", "an object");
    for (const char* reserved : {"messages", "add_generation_prompt", "tools", "documents"}) {
      if (kwargs->contains(reserved)) {
        return InvalidParam("chat_template_kwargs",
                            absl::StrCat("'chat_template_kwargs' may not set '", reserved,
                                         "' (give it as a request field)"));
      }
    }
    chat->kwargs = *kwargs;
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::StatusOr<ChatRequest> ParseChatObject(absl::string_view body, json& object,
                                            const json& defaults, const char* schema_path) {
  ApplyDefaults(defaults, object);
  ChatRequest request;
  for (const char* name : {"prompt", "suffix", "chat_template"}) {
    const json* value = Field(object, name);
    const bool empty_list = value != nullptr && value->is_array() && value->empty();
    if (value != nullptr && !empty_list) {
      return InvalidParam(name,
                          absl::StrCat("'", name, "' is not supported by /v1/chat/completions"));
    }
  }
  // Chat's logprobs is a boolean, with top_logprobs the count of alternatives: /v1/completions'
  // logprobs count once read.
  bool logprobs = false;
  RETURN_IF_ERROR(ReadBool(object, "logprobs", &logprobs));
  int top_logprobs = 0;
  const bool top_given = Field(object, "top_logprobs") != nullptr;
  RETURN_IF_ERROR(ReadInt(object, "top_logprobs", 0, kMaxLogprobs, &top_logprobs));
  if (top_given && !logprobs) {
    return InvalidParam("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  object.erase("logprobs");
  object.erase("top_logprobs");
  RETURN_IF_ERROR(ReadChat(object, &request.chat));
  // Chat's echo is its own (ReadCommon's would score the prompt).
  RETURN_IF_ERROR(ReadBool(object, "echo", &request.echo));
  object.erase("echo");
  if (Field(object, "max_completion_tokens") != nullptr) {
    if (Field(object, "max_tokens") != nullptr) {
      return InvalidParam("max_completion_tokens",
                          "give 'max_completion_tokens' or 'max_tokens', not both");
    }
    object["max_tokens"] = object["max_completion_tokens"];
  }
  RETURN_IF_ERROR(ReadCommon(object, &request.common));
  if (request.common.beam_search.has_value()) {
    return InvalidParam("use_beam_search", "beam search is served by /v1/completions");
  }
  if (request.common.best_of > 0) {
    return InvalidParam("best_of", "'best_of' is served by /v1/completions");
  }
  RETURN_IF_ERROR(ReadJsonGuidance(body, object, &request.common.params, schema_path));
  RETURN_IF_ERROR(ReadToolChoice(body, object, &request));
  if (logprobs) request.common.params.logprobs = top_logprobs;
  // Chat's default (OpenAI's, vLLM's): up to the context, not /v1/completions' 16 tokens.
  if (!request.common.max_tokens_given) {
    request.common.params.max_tokens = std::numeric_limits<int>::max();
  }
  ApplyDefaultMaxTokens(defaults, &request.common);
  return request;
}

}  // namespace

absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body, const json& defaults) {
  return ParseLoweringStructuredOutputs<ChatRequest>(
      body, [&](json& object, const char* schema_path) {
        return ParseChatObject(body, object, defaults, schema_path);
      });
}

namespace {

// The fields of another API's request (`object`) that the chat request reads as they are
// (`passed`: copied into `chat`), those read separately (`read`), and a 400 naming any other.
absl::Status RouteFields(const nlohmann::ordered_json& object,
                         std::span<const std::string_view> passed,
                         std::span<const std::string_view> read, absl::string_view route,
                         nlohmann::ordered_json* chat) {
  for (const auto& [key, value] : object.items()) {
    auto among = [&name = key](std::span<const std::string_view> names) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    if (among(passed)) {
      (*chat)[key] = value;
    } else if (!among(read)) {
      return InvalidParam(key,
                          absl::StrCat("'", key, "' is not a field this server reads on ", route));
    }
  }
  return absl::OkStatus();
}

// An error of the chat request another API amounts to, named as that API's field: `names` maps
// chat fields to the client's (the param, and the field quoted in the message).
absl::Status RenameChatError(
    absl::Status status, std::span<const std::pair<absl::string_view, absl::string_view>> names) {
  const std::string param = ErrorParam(status);
  for (const auto& [chat, client] : names) {
    if (param != chat) continue;
    return ApiError(status.code(), client,
                    absl::StrReplaceAll(status.message(), {{absl::StrCat("'", chat, "'"),
                                                            absl::StrCat("'", client, "'")}}));
  }
  return status;
}

// An input item's content as text: a string, or a list of text parts.
absl::StatusOr<std::string> ResponsesContentText(const nlohmann::ordered_json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return TypeError("input", "a string or a list of messages with text content");
  }
  std::string text;
  for (const auto& part : content) {
    const auto type = part.is_object() ? part.find("type") : part.end();
    const std::string kind =
        part.is_object() && type != part.end() && type->is_string() ? type->get<std::string>() : "";
    if (kind != "input_text" && kind != "output_text" && kind != "text") {
      return InvalidParam("input", absl::StrCat("content parts of type '", kind,
                                                "' are not supported (text parts only)"));
    }
    const auto value = part.find("text");
    if (value == part.end() || !value->is_string()) {
      return TypeError("input", "a list of messages whose text parts carry \"text\"");
    }
    text += value->get<std::string>();
  }
  return text;
}

}  // namespace

absl::StatusOr<ResponsesRequest> ParseResponsesRequest(absl::string_view body, const json& defaults,
                                                       const PreviousConversation& previous) {
  // In the client's key order: a json_schema format keeps its properties' order.
  ASSIGN_OR_RETURN(const nlohmann::ordered_json object, ParseObject<nlohmann::ordered_json>(body));
  auto field = [&](const char* name) { return Field(object, name); };
  ResponsesRequest request;
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();
  for (const char* name : {"reasoning", "conversation", "prompt"}) {
    if (field(name) != nullptr) {
      return InvalidParam(name, absl::StrCat("'", name, "' is not supported by this server"));
    }
  }
  // Function tools ({"type": "function", "name", "description", "parameters", "strict"}) as the
  // chat's ({"type": "function", "function": {...}}); other tool types are OpenAI's own.
  if (const auto* tools = field("tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return TypeError("tools", "a list of function tools");
    nlohmann::ordered_json chat_tools = nlohmann::ordered_json::array();
    for (const auto& tool : *tools) {
      const auto type = tool.is_object() ? tool.find("type") : tool.end();
      if (!tool.is_object() || type == tool.end() || *type != "function") {
        return InvalidParam(
            "tools", absl::StrCat("tools of type ", type == tool.end() ? "null" : type->dump(),
                                  " are not supported (function tools only)"));
      }
      nlohmann::ordered_json function = tool;
      function.erase("type");
      function.erase("strict");
      chat_tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    if (!chat_tools.empty()) chat["tools"] = std::move(chat_tools);
    request.tools = json::parse(tools->dump());
  }
  if (const auto* choice = field("tool_choice"); choice != nullptr && !choice->is_null()) {
    // {"type": "function", "name"} names a function; the strings are the chat's.
    const auto type = choice->is_object() ? choice->find("type") : choice->end();
    const auto name = choice->is_object() ? choice->find("name") : choice->end();
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (type != choice->end() && *type == "function" && name != choice->end()) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      return TypeError("tool_choice",
                       "\"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"name\": ...}");
    }
    request.tool_choice = json::parse(choice->dump());
  }
  if (const auto* background = field("background");
      background != nullptr && !(background->is_boolean() && !background->get<bool>())) {
    return InvalidParam("background", "background responses are not supported");
  }
  if (const auto* include = field("include");
      include != nullptr && !(include->is_array() && include->empty())) {
    return InvalidParam("include", "'include' is not supported by this server");
  }
  if (const auto* store = field("store"); store != nullptr && !store->is_null()) {
    if (!store->is_boolean()) return TypeError("store", "a boolean");
    request.store = store->get<bool>();
  }
  if (const auto* truncation = field("truncation");
      truncation != nullptr && *truncation != "disabled") {
    return InvalidParam("truncation", "only 'disabled' truncation is supported");
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (const auto* instructions = field("instructions");
      instructions != nullptr && !instructions->is_null()) {
    if (!instructions->is_string()) return TypeError("instructions", "a string");
    request.instructions = instructions->get<std::string>();
    messages.push_back({{"role", "system"}, {"content", *request.instructions}});
  }
  if (const auto* id = field("previous_response_id"); id != nullptr && !id->is_null()) {
    if (!id->is_string()) return TypeError("previous_response_id", "a string");
    if (previous == nullptr) {
      return InvalidParam("previous_response_id", "responses are not stored by this server");
    }
    ASSIGN_OR_RETURN(request.conversation, previous(id->get<std::string>()));
    request.previous_response_id = id->get<std::string>();
  }
  // One input message: the chat's (developer is the system role of chat templates) and its item.
  auto add_input = [&](const std::string& role, std::string text) {
    const char* part = role == "assistant" ? "output_text" : "input_text";
    request.input_items.push_back(
        {{"type", "message"}, {"role", role}, {"content", {{{"type", part}, {"text", text}}}}});
    request.conversation.push_back(
        {{"role", role == "developer" ? "system" : role}, {"content", std::move(text)}});
  };
  // An earlier call ({"type": "function_call", "call_id", "name", "arguments"}): a tool call of
  // an assistant message (consecutive calls in one), and its result ({"type":
  // "function_call_output", "call_id", "output"}): a tool message.
  auto add_function_call = [&](const nlohmann::ordered_json& item) -> absl::Status {
    const std::string* call_id = StringField(item, "call_id");
    const std::string* name = StringField(item, "name");
    const std::string* arguments = StringField(item, "arguments");
    if (call_id == nullptr || name == nullptr || arguments == nullptr) {
      return TypeError("input", "function_call items with a string call_id, name and arguments");
    }
    request.input_items.push_back({{"type", "function_call"},
                                   {"call_id", *call_id},
                                   {"name", *name},
                                   {"arguments", *arguments}});
    nlohmann::ordered_json call = {{"id", *call_id},
                                   {"type", "function"},
                                   {"function", {{"name", *name}, {"arguments", *arguments}}}};
    nlohmann::ordered_json& conversation = request.conversation;
    if (!conversation.empty() && conversation.back()["role"] == "assistant" &&
        conversation.back().contains("tool_calls")) {
      conversation.back()["tool_calls"].push_back(std::move(call));
    } else {
      conversation.push_back({{"role", "assistant"},
                              {"content", ""},
                              {"tool_calls", nlohmann::ordered_json::array({std::move(call)})}});
    }
    return absl::OkStatus();
  };
  auto add_function_output = [&](const nlohmann::ordered_json& item) -> absl::Status {
    const std::string* call_id = StringField(item, "call_id");
    const std::string* output = StringField(item, "output");
    if (call_id == nullptr || output == nullptr) {
      return TypeError("input", "function_call_output items with a string call_id and output");
    }
    request.input_items.push_back(
        {{"type", "function_call_output"}, {"call_id", *call_id}, {"output", *output}});
    request.conversation.push_back(
        {{"role", "tool"}, {"tool_call_id", *call_id}, {"content", *output}});
    return absl::OkStatus();
  };
  const auto* input = field("input");
  if (input == nullptr) return InvalidParam("input", "'input' is required");
  if (input->is_string()) {
    add_input("user", input->get<std::string>());
  } else if (input->is_array() && !input->empty()) {
    for (const auto& item : *input) {
      if (!item.is_object()) return TypeError("input", "a string or a list of messages");
      const auto type = item.find("type");
      if (type != item.end() && *type == "function_call") {
        RETURN_IF_ERROR(add_function_call(item));
        continue;
      }
      if (type != item.end() && *type == "function_call_output") {
        RETURN_IF_ERROR(add_function_output(item));
        continue;
      }
      if (type != item.end() && *type != "message") {
        return InvalidParam("input",
                            absl::StrCat("input items of type ", type->dump(),
                                         " are not supported (messages and function calls)"));
      }
      const auto role = item.find("role");
      const auto content = item.find("content");
      if (role == item.end() || !role->is_string() || content == item.end()) {
        return TypeError("input", "a list of messages with a role and content");
      }
      const std::string r = role->get<std::string>();
      if (r != "user" && r != "assistant" && r != "system" && r != "developer") {
        return InvalidParam("input", absl::StrCat("unknown role '", r, "'"));
      }
      ASSIGN_OR_RETURN(std::string text, ResponsesContentText(*content));
      add_input(r, std::move(text));
    }
  } else {
    return TypeError("input", "a string or a non-empty list of messages");
  }
  for (const auto& message : request.conversation) messages.push_back(message);
  chat["messages"] = std::move(messages);
  if (const auto* max_output = field("max_output_tokens")) {
    if (!max_output->is_number_integer() || max_output->get<int64_t>() < 1 ||
        max_output->get<int64_t>() > kIntMax) {
      return TypeError("max_output_tokens", "a positive integer");
    }
    request.max_output_tokens = max_output->get<int>();
    chat["max_tokens"] = *max_output;
  }
  if (const auto* text = field("text")) {
    const auto format = text->is_object() ? text->find("format") : text->end();
    if (!text->is_object()) return TypeError("text", "an object ({\"format\": ...})");
    if (format != text->end() && !format->is_null()) {
      const auto type = format->is_object() ? format->find("type") : format->end();
      if (type == format->end() || !type->is_string()) {
        return TypeError("text.format", "an object with a \"type\"");
      }
      if (*type == "json_schema") {
        const auto schema = format->find("schema");
        if (schema == format->end()) {
          return InvalidParam("text.format", "a json_schema format needs its \"schema\"");
        }
        chat["response_format"] = {
            {"type", "json_schema"},
            {"json_schema", {{"name", format->value("name", "schema")}, {"schema", *schema}}}};
      } else if (*type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (*type != "text") {
        return InvalidParam("text.format",
                            "'text.format' type must be text, json_object or "
                            "json_schema");
      }
      request.text_format = json::parse(format->dump());
    }
  }
  if (const auto* metadata = field("metadata")) {
    if (!metadata->is_object()) return TypeError("metadata", "an object");
    request.metadata = json::parse(metadata->dump());
  }
  // Fields the chat request reads as they are (vLLM's extras included); the rest is refused.
  static constexpr std::string_view kPassed[] = {"model",
                                                 "temperature",
                                                 "top_p",
                                                 "stream",
                                                 "user",
                                                 "seed",
                                                 "top_k",
                                                 "min_p",
                                                 "repetition_penalty",
                                                 "presence_penalty",
                                                 "frequency_penalty",
                                                 "stop",
                                                 "stop_token_ids",
                                                 "ignore_eos",
                                                 "min_tokens",
                                                 "logit_bias",
                                                 "bad_words",
                                                 "structured_outputs",
                                                 "guided_regex",
                                                 "guided_choice",
                                                 "guided_json",
                                                 "guided_grammar",
                                                 "priority",
                                                 "skip_special_tokens",
                                                 "chat_template_kwargs",
                                                 "parallel_tool_calls"};
  static constexpr std::string_view kRead[] = {
      "input",       "instructions", "max_output_tokens",
      "text",        "metadata",     "store",
      "tools",       "tool_choice",  "background",
      "include",     "truncation",   "previous_response_id",
      "reasoning",   "conversation", "prompt",
      "service_tier"};
  RETURN_IF_ERROR(RouteFields(object, kPassed, kRead, "/v1/responses", &chat));
  static constexpr std::pair<absl::string_view, absl::string_view> kChatNames[] = {
      {"max_tokens", "max_output_tokens"},
      {"messages", "input"},
      {"response_format", "text.format"},
  };
  absl::StatusOr<ChatRequest> parsed = ParseChatRequest(chat.dump(), defaults);
  if (!parsed.ok()) return RenameChatError(parsed.status(), kChatNames);
  if (parsed->common.params.n != 1) return InvalidParam("n", "one response a call");
  if (const auto* parallel = field("parallel_tool_calls");
      parallel != nullptr && parallel->is_boolean()) {
    request.parallel_tool_calls = parallel->get<bool>();
  }
  request.chat = *std::move(parsed);
  return request;
}

namespace {

// Text blocks ({"type": "text", "text"}) or a string, as one string; errors name `param`.
absl::StatusOr<std::string> AnthropicText(const nlohmann::ordered_json& content,
                                          const char* param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return TypeError(param, "a string or a list of text blocks");
  std::string text;
  for (const auto& block : content) {
    const auto type = block.is_object() ? block.find("type") : block.end();
    if (!block.is_object() || type == block.end() || *type != "text") {
      return InvalidParam(param, absl::StrCat("content blocks of type ",
                                              type != block.end() ? type->dump() : "null",
                                              " are not supported (text blocks only)"));
    }
    const auto value = block.find("text");
    if (value == block.end() || !value->is_string()) {
      return TypeError(param, "a list of text blocks with \"text\"");
    }
    text += value->get<std::string>();
  }
  return text;
}

}  // namespace

absl::StatusOr<ChatRequest> ParseAnthropicRequest(absl::string_view body, const json& defaults,
                                                  bool count_only) {
  ASSIGN_OR_RETURN(const nlohmann::ordered_json object, ParseObject<nlohmann::ordered_json>(body));
  auto field = [&](const char* name) { return Field(object, name); };
  nlohmann::ordered_json chat = nlohmann::ordered_json::object();
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (const auto* system = field("system")) {
    ASSIGN_OR_RETURN(std::string text, AnthropicText(*system, "system"));
    messages.push_back({{"role", "system"}, {"content", std::move(text)}});
  }
  const auto* turns = field("messages");
  if (turns == nullptr || !turns->is_array() || turns->empty()) {
    return TypeError("messages", "a non-empty list of messages");
  }
  for (const auto& turn : *turns) {
    const auto role = turn.is_object() ? turn.find("role") : turn.end();
    const auto content = turn.is_object() ? turn.find("content") : turn.end();
    if (!turn.is_object() || role == turn.end() || content == turn.end()) {
      return TypeError("messages", "a list of {\"role\", \"content\"} messages");
    }
    if (*role != "user" && *role != "assistant") {
      return InvalidParam("messages", absl::StrCat("unknown role ", role->dump(),
                                                   " (user or assistant; the system prompt is "
                                                   "'system')"));
    }
    // Text blocks are the turn's content; an assistant's tool_use blocks its tool calls, a user's
    // tool_result blocks tool messages ahead of its text.
    std::string text;
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    bool results = false;
    const nlohmann::ordered_json blocks =
        content->is_array() ? *content : nlohmann::ordered_json::array();
    if (!content->is_array()) {
      ASSIGN_OR_RETURN(text, AnthropicText(*content, "messages"));
    }
    for (const auto& block : blocks) {
      const auto type = block.is_object() ? block.find("type") : block.end();
      if (type != block.end() && *type == "tool_use" && *role == "assistant") {
        const std::string* id = StringField(block, "id");
        const std::string* name = StringField(block, "name");
        const auto* input = Field(block, "input");
        if (id == nullptr || name == nullptr || input == nullptr || !input->is_object()) {
          return TypeError("messages",
                           "tool_use blocks with a string id and name and an object input");
        }
        calls.push_back({{"id", *id},
                         {"type", "function"},
                         {"function", {{"name", *name}, {"arguments", input->dump()}}}});
      } else if (type != block.end() && *type == "tool_result" && *role == "user") {
        const std::string* id = StringField(block, "tool_use_id");
        if (id == nullptr) {
          return TypeError("messages", "tool_result blocks with a string tool_use_id");
        }
        std::string output;
        // (A null content is refused as AnthropicText refuses it.)
        if (const auto result = block.find("content"); result != block.end()) {
          ASSIGN_OR_RETURN(output, AnthropicText(*result, "messages"));
        }
        messages.push_back(
            {{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(output)}});
        results = true;
      } else {
        ASSIGN_OR_RETURN(std::string piece,
                         AnthropicText(nlohmann::ordered_json::array({block}), "messages"));
        text += piece;
      }
    }
    if (!calls.empty()) {
      messages.push_back({{"role", *role}, {"content", std::move(text)}, {"tool_calls", calls}});
    } else if (!results || !text.empty()) {
      messages.push_back({{"role", *role}, {"content", std::move(text)}});
    }
  }
  chat["messages"] = std::move(messages);
  // A last assistant turn is a prefill: the answer goes on from it.
  if (chat["messages"].back()["role"] == "assistant") {
    chat["add_generation_prompt"] = false;
    chat["continue_final_message"] = true;
  }
  if (const auto* max_tokens = field("max_tokens")) {
    if (!max_tokens->is_number_integer() || max_tokens->get<int64_t>() < 1 ||
        max_tokens->get<int64_t>() > kIntMax) {
      return TypeError("max_tokens", "a positive integer");
    }
    chat["max_tokens"] = *max_tokens;
  } else if (!count_only) {
    return InvalidParam("max_tokens", "'max_tokens' is required");
  }
  if (const auto* stops = field("stop_sequences")) {
    if (!stops->is_array()) return TypeError("stop_sequences", "a list of strings");
    chat["stop"] = *stops;
  }
  if (const auto* v = field("mcp_servers"); v != nullptr && !(v->is_array() && v->empty())) {
    return InvalidParam("mcp_servers", "'mcp_servers' is not supported by this server");
  }
  // Client tools ({"name", "description", "input_schema"}) as the chat's functions; Anthropic's
  // server tools (typed, e.g. web_search_...) run on Anthropic's side.
  if (const auto* tools = field("tools"); tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return TypeError("tools", "a list of tools");
    nlohmann::ordered_json functions = nlohmann::ordered_json::array();
    for (const auto& tool : *tools) {
      const auto type = tool.is_object() ? tool.find("type") : tool.end();
      if (!tool.is_object() || (type != tool.end() && !type->is_null() && *type != "custom")) {
        return InvalidParam(
            "tools", absl::StrCat("tools of type ", type != tool.end() ? type->dump() : "null",
                                  " are not supported (client tools only)"));
      }
      nlohmann::ordered_json function = {{"name", tool.value("name", nlohmann::ordered_json())}};
      if (tool.contains("description")) function["description"] = tool["description"];
      if (tool.contains("input_schema")) function["parameters"] = tool["input_schema"];
      functions.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    if (!functions.empty()) chat["tools"] = std::move(functions);
  }
  if (const auto* choice = field("tool_choice"); choice != nullptr && !choice->is_null()) {
    const auto type = choice->is_object() ? choice->find("type") : choice->end();
    const auto name = choice->is_object() ? choice->find("name") : choice->end();
    if (type == choice->end() || !type->is_string()) {
      return TypeError("tool_choice", "{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    }
    if (*type == "auto" || *type == "none") {
      chat["tool_choice"] = *type;
    } else if (*type == "any") {
      chat["tool_choice"] = "required";
    } else if (*type == "tool" && name != choice->end()) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      return TypeError(
          "tool_choice",
          "{\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\"}");
    }
    const auto serial = choice->find("disable_parallel_tool_use");
    if (serial != choice->end() && serial->is_boolean() && serial->get<bool>()) {
      chat["parallel_tool_calls"] = false;
    }
  }
  if (const auto* thinking = field("thinking");
      thinking != nullptr &&
      !(thinking->is_object() && thinking->value("type", "") == "disabled")) {
    return InvalidParam("thinking", "extended thinking is not supported");
  }
  if (const auto* metadata = field("metadata"); metadata != nullptr && !metadata->is_object()) {
    return TypeError("metadata", "an object");
  }
  static constexpr std::string_view kPassed[] = {"model", "temperature", "top_p", "top_k",
                                                 "stream"};
  static constexpr std::string_view kRead[] = {
      "messages",    "system",   "max_tokens", "stop_sequences", "tools",
      "tool_choice", "thinking", "metadata",   "mcp_servers",    "service_tier"};
  RETURN_IF_ERROR(RouteFields(object, kPassed, kRead, "/v1/messages", &chat));
  static constexpr std::pair<absl::string_view, absl::string_view> kChatNames[] = {
      {"stop", "stop_sequences"}};
  absl::StatusOr<ChatRequest> parsed = ParseChatRequest(chat.dump(), defaults);
  if (!parsed.ok()) return RenameChatError(parsed.status(), kChatNames);
  return parsed;
}

std::string AnthropicErrorBody(const absl::Status& status) {
  const int http = HttpStatusFor(status);
  const char* type = http == 400   ? "invalid_request_error"
                     : http == 401 ? "authentication_error"
                     : http == 403 ? "permission_error"
                     : http == 404 ? "not_found_error"
                     : http == 413 ? "request_too_large"
                     : http == 429 ? "rate_limit_error"
                     : http == 503 ? "overloaded_error"
                                   : "api_error";
  return DumpJson(json{{"type", "error"},
                       {"error", {{"type", type}, {"message", std::string(status.message())}}}});
}

absl::StatusOr<LlamaCppRequest> ParseLlamaCppRequest(absl::string_view body, bool infill,
                                                     int max_model_len) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  LlamaCppRequest request;
  CompletionRequest& c = request.completion;
  SamplingParams& p = c.params;
  if (infill) {
    RETURN_IF_ERROR(ReadString(object, "input_prefix", &request.input_prefix));
    RETURN_IF_ERROR(ReadString(object, "input_suffix", &request.input_suffix));
    RETURN_IF_ERROR(ReadString(object, "prompt", &request.infill_prompt));
    if (const json* extra = Field(object, "input_extra"); extra != nullptr) {
      // Context chunks ({"filename", "text"}), before the prefix as plain text.
      if (!extra->is_array()) return TypeError("input_extra", "a list of {\"text\"} chunks");
      std::string context;
      for (const json& chunk : *extra) {
        const json* text = chunk.is_object() ? Field(chunk, "text") : nullptr;
        if (text == nullptr || !text->is_string()) {
          return TypeError("input_extra", "a list of {\"text\"} chunks");
        }
        context += text->get<std::string>();
      }
      request.input_prefix = context + request.input_prefix;
    }
  } else {
    const json* prompt = Field(object, "prompt");
    if (prompt == nullptr) return InvalidParam("prompt", "'prompt' is required");
    if (prompt->is_string()) {
      if (prompt->get_ref<const std::string&>().empty()) {
        return InvalidParam("prompt", "'prompt' must not be empty");
      }
      c.prompts.push_back({.is_text = true, .text = prompt->get<std::string>()});
    } else if (prompt->is_array() && !prompt->empty() &&
               std::all_of(prompt->begin(), prompt->end(),
                           [](const json& t) { return t.is_number_integer(); })) {
      PromptInput tokens{.is_text = false};
      RETURN_IF_ERROR(ReadTokenList(*prompt, "prompt", &tokens.token_ids));
      c.prompts.push_back(std::move(tokens));
    } else {
      return TypeError("prompt", "a string or a list of token ids (one prompt a call here)");
    }
  }
  RETURN_IF_ERROR(ReadBool(object, "stream", &c.stream));
  for (const auto& [name, neutral] :
       std::vector<std::pair<const char*, double>>{{"mirostat", 0},
                                                   {"dry_multiplier", 0},
                                                   {"tfs_z", 1},
                                                   {"xtc_probability", 0},
                                                   {"dynatemp_range", 0},
                                                   {"n_indent", 0}}) {
    const json* value = Field(object, name);
    if (value != nullptr && !(value->is_number() && value->get<double>() == neutral)) {
      return InvalidParam(name, absl::StrCat("'", name, "' is not supported by this server"));
    }
  }
  if (const json* images = Field(object, "image_data");
      images != nullptr && !(images->is_array() && images->empty())) {
    return InvalidParam("image_data", "this model reads text only");
  }
  // llama.cpp's defaults.
  float temperature = 0.8f;
  RETURN_IF_ERROR(ReadFloat(object, "temperature", &temperature));
  p.temperature = std::max(temperature, 0.0f);  // <= 0: greedy, as llama.cpp
  p.top_k = 40;
  RETURN_IF_ERROR(ReadInt(object, "top_k", std::numeric_limits<int>::min(), kIntMax, &p.top_k));
  if (p.top_k <= 0) p.top_k = -1;
  p.top_p = 0.95f;
  RETURN_IF_ERROR(ReadFloat(object, "top_p", &p.top_p));
  p.top_p = std::clamp(p.top_p, 1e-6f, 1.0f);
  p.min_p = 0.05f;
  RETURN_IF_ERROR(ReadFloat(object, "min_p", &p.min_p));
  p.min_p = std::clamp(p.min_p, 0.0f, 1.0f);
  RETURN_IF_ERROR(ReadFloat(object, "typical_p", &p.typical_p));
  if (!(p.typical_p > 0.0f) || p.typical_p > 1.0f) p.typical_p = 1.0f;  // llama.cpp: off
  float repeat_penalty = 1.0f;
  RETURN_IF_ERROR(ReadFloat(object, "repeat_penalty", &repeat_penalty));
  if (!(repeat_penalty > 0.0f)) {
    return InvalidParam("repeat_penalty", "'repeat_penalty' must be > 0");
  }
  p.repetition_penalty = repeat_penalty;
  RETURN_IF_ERROR(ReadAdditivePenalty(object, "presence_penalty", &p.presence_penalty));
  RETURN_IF_ERROR(ReadAdditivePenalty(object, "frequency_penalty", &p.frequency_penalty));
  int last_n = 64;
  RETURN_IF_ERROR(ReadInt(object, "repeat_last_n", -1, kIntMax, &last_n));
  if (last_n == 0) {  // no window: no penalties
    p.repetition_penalty = 1.0f;
    p.presence_penalty = p.frequency_penalty = 0.0f;
  } else {
    p.penalty_last_n = last_n == -1 ? std::max(1, max_model_len) : last_n;
  }
  std::optional<int64_t> seed;
  RETURN_IF_ERROR(ReadInt64(object, "seed", &seed));
  if (seed.has_value() && *seed != -1) p.seed = static_cast<uint64_t>(*seed);
  if (const json* stop = Field(object, "stop"); stop != nullptr) {
    if (!stop->is_array()) return TypeError("stop", "a list of strings");
    for (const json& item : *stop) {
      if (!item.is_string()) return TypeError("stop", "a list of strings");
      if (!item.get_ref<const std::string&>().empty()) p.stop.push_back(item.get<std::string>());
    }
  }
  RETURN_IF_ERROR(ReadBool(object, "ignore_eos", &p.ignore_eos));
  RETURN_IF_ERROR(ReadInt(object, "n_probs", 0, kMaxLogprobs, &request.n_probs));
  if (request.n_probs > 0) p.logprobs = request.n_probs;
  if (const json* bias = Field(object, "logit_bias"); bias != nullptr) {
    constexpr char kShape[] = "[[token id, bias or false], ...] or {\"token id\": bias}";
    auto add = [&](int64_t id, const json& value) -> absl::Status {
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return InvalidParam("logit_bias", "'logit_bias' token ids must be >= 0");
      }
      if (value == false) {  // never this token
        p.logit_bias.emplace_back(static_cast<int32_t>(id), -100.0f);
      } else if (value.is_number() && std::isfinite(value.get<double>())) {
        p.logit_bias.emplace_back(static_cast<int32_t>(id),
                                  std::clamp(value.get<float>(), -100.0f, 100.0f));
      } else {
        return TypeError("logit_bias", kShape);
      }
      return absl::OkStatus();
    };
    if (bias->is_array()) {
      for (const json& pair : *bias) {
        if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer()) {
          return TypeError("logit_bias", kShape);
        }
        RETURN_IF_ERROR(add(pair[0].get<int64_t>(), pair[1]));
      }
    } else if (bias->is_object()) {
      for (const auto& [key, value] : bias->items()) {
        int64_t id = 0;
        if (!absl::SimpleAtoi(key, &id)) return TypeError("logit_bias", kShape);
        RETURN_IF_ERROR(add(id, value));
      }
    } else {
      return TypeError("logit_bias", kShape);
    }
  }
  if (const json* grammar = Field(object, "grammar"); grammar != nullptr) {
    if (!grammar->is_string()) return TypeError("grammar", "a GBNF grammar");
    if (!grammar->get_ref<const std::string&>().empty()) {
      p.guided_grammar = grammar->get<std::string>();
    }
  }
  if (const json* schema = Field(object, "json_schema"); schema != nullptr) {
    if (!p.guided_grammar.empty()) {
      return InvalidParam("json_schema", "give 'grammar' or 'json_schema', not both");
    }
    ASSIGN_OR_RETURN(const nlohmann::ordered_json ordered,
                     OrderedSchema(*schema, body, "/json_schema", "json_schema"));
    if (ordered.is_object() && ordered.empty()) {
      p.guided_grammar = GrammarGuide::JsonObjectGrammar();  // {}: any JSON object
    } else {
      RETURN_IF_ERROR(SchemaPattern(ordered, "json_schema", &p.guided_regex));
    }
  }
  int n_predict = -1;
  RETURN_IF_ERROR(ReadInt(object, "n_predict", -1, kIntMax, &n_predict));
  if (n_predict >= 0) {
    p.max_tokens = n_predict;
    c.max_tokens_given = true;
  } else {
    p.max_tokens = std::numeric_limits<int>::max();  // to the context
  }
  return request;
}

namespace {

// The one prompt of TGI's and Triton's APIs: field `name`, a non-empty string.
absl::Status ReadRequiredTextPrompt(const json& object, const char* name, CompletionRequest* c) {
  const json* text = Field(object, name);
  if (text == nullptr) return InvalidParam(name, absl::StrCat("'", name, "' is required"));
  if (!text->is_string()) return TypeError(name, "a string");
  if (text->get_ref<const std::string&>().empty()) {
    return InvalidParam(name, absl::StrCat("'", name, "' must not be empty"));
  }
  c->prompts.push_back({.is_text = true, .text = text->get<std::string>()});
  return absl::OkStatus();
}

// A TensorRT-LLM words input: a string (one word; "" none) or a list of strings ("" skipped).
absl::Status ReadTritonWords(const json& object, const char* name, std::vector<std::string>* out) {
  std::vector<std::string> words;
  RETURN_IF_ERROR(ReadStrings(object, name, &words));
  for (std::string& word : words) {
    if (!word.empty()) out->push_back(std::move(word));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TritonRequest> ParseTritonGenerateRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  static constexpr std::string_view kInputs[] = {"text_input",
                                                 "max_tokens",
                                                 "bad_words",
                                                 "stop_words",
                                                 "end_id",
                                                 "pad_id",
                                                 "temperature",
                                                 "top_k",
                                                 "top_p",
                                                 "runtime_top_k",
                                                 "runtime_top_p",
                                                 "repetition_penalty",
                                                 "presence_penalty",
                                                 "frequency_penalty",
                                                 "length_penalty",
                                                 "min_length",
                                                 "min_tokens",
                                                 "random_seed",
                                                 "seed",
                                                 "return_log_probs",
                                                 "beam_width",
                                                 "stream",
                                                 "return_context_logits",
                                                 "return_generation_logits",
                                                 "exclude_input_in_output"};
  for (const auto& [name, value] : object.items()) {
    if (std::find(std::begin(kInputs), std::end(kInputs), name) == std::end(kInputs)) {
      return InvalidParam(name, absl::StrCat("unexpected inference input '", name,
                                             "' for this model (TensorRT-LLM's generate inputs)"));
    }
  }
  TritonRequest request;
  CompletionRequest& c = request.completion;
  SamplingParams& p = c.params;
  RETURN_IF_ERROR(ReadRequiredTextPrompt(object, "text_input", &c));
  if (Field(object, "max_tokens") == nullptr) {
    return InvalidParam("max_tokens", "'max_tokens' is required");
  }
  RETURN_IF_ERROR(ReadInt(object, "max_tokens", 1, kIntMax, &p.max_tokens, &c.max_tokens_given));
  RETURN_IF_ERROR(ReadBool(object, "stream", &c.stream));
  RETURN_IF_ERROR(ReadTritonWords(object, "stop_words", &p.stop));
  p.include_stop_str_in_output = true;  // TensorRT-LLM's output ends with the stop word
  RETURN_IF_ERROR(ReadTritonWords(object, "bad_words", &p.bad_words));
  int end_id = -1, pad_id = -1;
  RETURN_IF_ERROR(ReadInt(object, "end_id", 0, kIntMax, &end_id));
  RETURN_IF_ERROR(ReadInt(object, "pad_id", 0, kIntMax, &pad_id));  // nothing to pad here
  if (end_id >= 0) p.stop_token_ids.push_back(end_id);
  int top_k = 0;
  float top_p = 0.0f, temperature = 1.0f;
  for (const char* name : {"top_k", "runtime_top_k"}) {
    RETURN_IF_ERROR(ReadInt(object, name, 0, kIntMax, &top_k));
  }
  for (const char* name : {"top_p", "runtime_top_p"}) {
    RETURN_IF_ERROR(ReadFloat(object, name, &top_p));
    if (!(top_p >= 0.0f && top_p <= 1.0f)) {
      return InvalidParam(name, absl::StrCat("'", name, "' must be in [0, 1], got ", top_p));
    }
  }
  RETURN_IF_ERROR(ReadFloat(object, "temperature", &temperature));
  if (!(temperature >= 0.0f)) {
    return InvalidParam("temperature",
                        absl::StrCat("'temperature' must be >= 0, got ", temperature));
  }
  const bool sampling = top_k > 1 || top_p > 0.0f;
  p.temperature = sampling ? temperature : 0.0f;
  p.top_k = top_k > 0 ? top_k : -1;
  p.top_p = top_p > 0.0f ? top_p : 1.0f;
  RETURN_IF_ERROR(ReadRepetitionPenalty(object, &p.repetition_penalty));
  RETURN_IF_ERROR(ReadAdditivePenalty(object, "presence_penalty", &p.presence_penalty));
  RETURN_IF_ERROR(ReadAdditivePenalty(object, "frequency_penalty", &p.frequency_penalty));
  float length_penalty = 1.0f;  // a beam-search score's: nothing to do at beam width 1
  RETURN_IF_ERROR(ReadFloat(object, "length_penalty", &length_penalty));
  for (const char* name : {"min_length", "min_tokens"}) {
    RETURN_IF_ERROR(ReadInt(object, name, 0, kIntMax, &p.min_tokens));
  }
  for (const char* name : {"random_seed", "seed"}) {
    if (const json* value = Field(object, name); value != nullptr && value->is_number_unsigned()) {
      p.seed = value->get<uint64_t>();  // a u64, as TensorRT-LLM's
    } else if (value != nullptr) {
      return TypeError(name, "an unsigned integer");
    }
  }
  RETURN_IF_ERROR(ReadBool(object, "return_log_probs", &request.return_log_probs));
  int beam_width = 1;
  RETURN_IF_ERROR(ReadInt(object, "beam_width", 1, kIntMax, &beam_width));
  if (beam_width != 1) {
    return InvalidParam("beam_width",
                        "'beam_width' > 1 is not served on this route (use /v1/completions "
                        "with use_beam_search)");
  }
  for (const char* name : {"return_context_logits", "return_generation_logits"}) {
    bool on = false;
    RETURN_IF_ERROR(ReadBool(object, name, &on));
    if (on) return InvalidParam(name, absl::StrCat("'", name, "' is not supported by this server"));
  }
  bool exclude_input = true;
  RETURN_IF_ERROR(ReadBool(object, "exclude_input_in_output", &exclude_input));
  if (!exclude_input) {
    return InvalidParam("exclude_input_in_output",
                        "the output never includes the input here (exclude_input_in_output true)");
  }
  return request;
}

std::string TritonErrorBody(const absl::Status& status) {
  return json({{"error", std::string(status.message())}})
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<TgiRequest> ParseTgiRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  TgiRequest request;
  CompletionRequest& c = request.completion;
  SamplingParams& p = c.params;
  RETURN_IF_ERROR(ReadRequiredTextPrompt(object, "inputs", &c));
  RETURN_IF_ERROR(ReadBool(object, "stream", &c.stream));
  json none = json::object();
  const json* parameters = Field(object, "parameters");
  if (parameters != nullptr && !parameters->is_object()) {
    return TypeError("parameters", "an object");
  }
  const json& params = parameters != nullptr ? *parameters : none;

  if (Field(params, "adapter_id") != nullptr) {
    return InvalidParam("adapter_id", "'adapter_id' is not supported by this server");
  }
  // TGI's grammar: {"type": "regex", "value": pattern} (runtime/guided.h) or {"type": "json",
  // "value": a JSON schema or its text} (runtime/json_schema_regex.h, read in order from the body).
  if (const json* grammar = Field(params, "grammar"); grammar != nullptr && !grammar->is_null()) {
    const json* type = grammar->is_object() ? Field(*grammar, "type") : nullptr;
    const json* value = grammar->is_object() ? Field(*grammar, "value") : nullptr;
    if (type == nullptr || (*type != "regex" && *type != "json" && *type != "json_object")) {
      return InvalidParam("grammar", "'grammar' needs a type: regex or json");
    }
    if (*type == "regex") {
      if (value == nullptr || !value->is_string() ||
          value->get_ref<const std::string&>().empty()) {
        return TypeError("grammar", "{\"type\": \"regex\", \"value\": a non-empty string}");
      }
      p.guided_regex = value->get<std::string>();
    } else {
      if (value == nullptr) return TypeError("grammar", "{\"type\": \"json\", \"value\": a schema}");
      ASSIGN_OR_RETURN(const nlohmann::ordered_json schema,
                       OrderedSchema(*value, body, "/parameters/grammar/value", "grammar"));
      RETURN_IF_ERROR(SchemaPattern(schema, "grammar", &p.guided_regex));
    }
  }
  bool watermark = false;
  RETURN_IF_ERROR(ReadBool(params, "watermark", &watermark));
  if (watermark) return InvalidParam("watermark", "'watermark' is not supported by this server");
  RETURN_IF_ERROR(ReadInt(params, "best_of", 1, kTgiMaxBestOf, &request.best_of));
  RETURN_IF_ERROR(ReadBool(params, "details", &request.details));
  RETURN_IF_ERROR(ReadBool(params, "decoder_input_details", &request.decoder_input_details));
  RETURN_IF_ERROR(ReadBool(params, "return_full_text", &request.return_full_text));
  RETURN_IF_ERROR(ReadInt(params, "top_n_tokens", 0, kTgiMaxTopNTokens, &request.top_n_tokens));
  p.max_tokens = kTgiDefaultMaxNewTokens;
  RETURN_IF_ERROR(
      ReadInt(params, "max_new_tokens", 1, kIntMax, &p.max_tokens, &c.max_tokens_given));
  if (Field(params, "truncate") != nullptr) {
    RETURN_IF_ERROR(ReadInt(params, "truncate", 1, kIntMax, &c.truncate_prompt_tokens.emplace()));
  }

  bool do_sample = false;
  RETURN_IF_ERROR(ReadBool(params, "do_sample", &do_sample));
  // TGI: temperature > 0, top_k > 0, top_p in (0, 1); any of them turns sampling on.
  request.sampling = do_sample;
  float temperature = 1.0f;
  RETURN_IF_ERROR(ReadFloat(params, "temperature", &temperature));
  if (Field(params, "temperature") != nullptr) {
    if (!(temperature > 0.0f)) {
      return InvalidParam("temperature",
                          absl::StrCat("'temperature' must be > 0, got ", temperature));
    }
    request.sampling |= temperature != 1.0f;
  }
  if (Field(params, "top_k") != nullptr) {
    RETURN_IF_ERROR(ReadInt(params, "top_k", 1, kIntMax, &p.top_k));
    request.sampling = true;
  }
  if (Field(params, "top_p") != nullptr) {
    RETURN_IF_ERROR(ReadFloat(params, "top_p", &p.top_p));
    if (!(p.top_p > 0.0f && p.top_p < 1.0f)) {
      return InvalidParam("top_p", absl::StrCat("'top_p' must be in (0, 1), got ", p.top_p));
    }
    request.sampling = true;
  }
  if (Field(params, "typical_p") != nullptr) {  // a warper, so sampling, as TGI has it
    RETURN_IF_ERROR(ReadFloat(params, "typical_p", &p.typical_p));
    if (!(p.typical_p > 0.0f && p.typical_p < 1.0f)) {
      return InvalidParam("typical_p",
                          absl::StrCat("'typical_p' must be in (0, 1), got ", p.typical_p));
    }
    request.sampling = true;
  }
  p.temperature = request.sampling ? temperature : 0.0f;
  if (request.best_of > 1 && !request.sampling) {
    return InvalidParam("best_of",
                        "'best_of' > 1 needs sampling (do_sample, or a temperature, "
                        "top_k or top_p)");
  }
  RETURN_IF_ERROR(ReadRepetitionPenalty(params, &p.repetition_penalty));
  RETURN_IF_ERROR(ReadAdditivePenalty(params, "frequency_penalty", &p.frequency_penalty));
  std::optional<int64_t> seed;
  if (const json* value = Field(params, "seed"); value != nullptr && value->is_number_unsigned()) {
    p.seed = value->get<uint64_t>();  // TGI's seed is a u64
  } else {
    RETURN_IF_ERROR(ReadInt64(params, "seed", &seed));
    if (seed.has_value()) {
      if (*seed < 0) return InvalidParam("seed", "'seed' must be >= 0");
      p.seed = static_cast<uint64_t>(*seed);
    }
  }
  if (const json* stop = Field(params, "stop"); stop != nullptr) {
    if (!stop->is_array()) return TypeError("stop", "a list of strings");
    for (const json& item : *stop) {
      if (!item.is_string() || item.get_ref<const std::string&>().empty()) {
        return TypeError("stop", "a list of non-empty strings");
      }
      p.stop.push_back(item.get<std::string>());
    }
  }
  p.include_stop_str_in_output = true;  // TGI's generated_text ends with the stop sequence
  // (The generated tokens' log-probabilities depend on the route, which may stream: the server
  // sets params.logprobs.)
  // The prefill scores appear only in the details (TGI ignores decoder_input_details without).
  if (request.decoder_input_details && request.details) p.prompt_logprobs = request.top_n_tokens;
  return request;
}

int TgiHttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 422;
    default:
      return HttpStatusFor(status);
  }
}

std::string TgiErrorBody(const absl::Status& status) {
  const int http_status = TgiHttpStatusFor(status);
  const char* type = http_status == 422   ? "validation"
                     : http_status == 429 ? "overloaded"
                     : http_status == 401 ? "authentication"
                     : http_status == 404 ? "not_found"
                                          : "generation";
  return json{{"error", std::string(status.message())}, {"error_type", type}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  TokenizeRequest request;
  RETURN_IF_ERROR(ReadModel(object, &request.model));
  if (Field(object, "messages") != nullptr) {  // vLLM's: a conversation, through the template
    if (Field(object, "prompt") != nullptr) {
      return InvalidParam("prompt", "give 'prompt' or 'messages', not both");
    }
    RETURN_IF_ERROR(ReadChat(object, &request.chat.emplace()));
    return request;
  }
  // llama.cpp's clients send the text as "content".
  const char* field = Field(object, "prompt") == nullptr && Field(object, "content") != nullptr
                          ? "content"
                          : "prompt";
  if (Field(object, field) == nullptr) return InvalidParam("prompt", "'prompt' is required");
  RETURN_IF_ERROR(ReadString(object, field, &request.prompt));
  return request;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json object, ParseObject(body));
  DetokenizeRequest request;
  RETURN_IF_ERROR(ReadModel(object, &request.model));
  const json* tokens = Field(object, "tokens");
  if (tokens == nullptr) return InvalidParam("tokens", "'tokens' is required");
  if (!tokens->is_array()) return TypeError("tokens", "a list of integer token ids");
  RETURN_IF_ERROR(ReadTokenList(*tokens, "tokens", &request.tokens));
  return request;
}

absl::Status ValidatePromptTokens(absl::Span<const int32_t> ids, int64_t vocab_size,
                                  absl::string_view param) {
  if (ids.empty()) return InvalidParam(param, absl::StrCat("'", param, "' must not be empty"));
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      return InvalidParam(param, absl::StrCat("token id ", id, " in '", param,
                                              "' is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ResolveMaxTokens(const CompletionRequest& request, int prompt_len,
                                     int max_model_len) {
  int max_tokens = request.params.max_tokens;
  if (request.max_tokens_given || prompt_len >= max_model_len) {
    if (static_cast<int64_t>(prompt_len) + max_tokens > max_model_len) {
      return InvalidParam(
          request.max_tokens_given ? "max_tokens" : "prompt",
          absl::StrCat("This model's maximum context length is ", max_model_len,
                       " tokens; the request asks for ", prompt_len + int64_t{max_tokens},
                       " tokens (", prompt_len, " in the prompt, ", max_tokens,
                       " in the completion). Reduce the prompt or max_tokens."));
    }
    return max_tokens;
  }
  return std::min(max_tokens, max_model_len - prompt_len);
}

bool IsValidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;  // continuation byte, overlong lead (C0, C1) or F5..FF
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace mqa
