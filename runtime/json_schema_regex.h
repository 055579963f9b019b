// JSON output guided by a regular expression (runtime/guided.h): vLLM's guided_json and OpenAI's
// response_format {"type": "json_schema"} / {"type": "json_object"} as patterns RegexGuide
// compiles.
//
// Schemas (a subset of JSON Schema): "type" string (minLength, maxLength; "format" date, time,
// date-time, uuid, email; "pattern" not supported),
// integer, number, boolean, null, array ("items", minItems, maxItems), object ("properties" in
// their order, those not in "required" optional; no other keys are generated); "enum" and
// "const" of JSON values; "anyOf" / "oneOf" as alternatives; "$ref" to "#/$defs/..." or
// "#/definitions/..." (not recursive beyond kJsonSchemaMaxDepth). Between tokens at most one
// space (none with `compact`: vLLM's disable_any_whitespace); integers of at most 19 digits,
// fractions of at most 17 and exponents of at most two (what int64 / double parsers take). Anything
// else is refused with InvalidArgument naming the place.
//
// Any JSON object (json_object) is not a regular language: it is approximated by objects nested
// at most kAnyJsonDepth deep.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace mqa {

inline constexpr int kJsonSchemaMaxDepth = 12;
inline constexpr int kAnyJsonDepth = 3;

// `schema` keeps its keys' order (ordered_json): properties are generated in that order.
absl::StatusOr<std::string> JsonSchemaToRegex(const nlohmann::ordered_json& schema,
                                              bool compact = false);
// Any JSON object, nested at most kAnyJsonDepth deep.
std::string AnyJsonObjectRegex();

}  // namespace mqa
