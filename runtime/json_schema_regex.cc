#include "runtime/json_schema_regex.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/guided.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::ordered_json;

// Between tokens: at most one space, or (compact) none.
constexpr const char* kWs = " ?";
// One character of a JSON string: anything but a quote, a backslash or a control character, or
// an escape (\u of anything but a surrogate, which parsers refuse alone; other characters come as
// UTF-8).
constexpr const char* kStringChar =
    R"((?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))";
// Numbers a 64-bit integer / a double holds: at most 18 digits after the first, exponents of at
// most two digits.
constexpr const char* kInteger = "-?(?:0|[1-9][0-9]{0,17})";
constexpr const char* kNumber =
    "-?(?:0|[1-9][0-9]{0,17})(?:\\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?";

// A literal (a JSON value's text) as a pattern.
std::string Literal(const json& value) { return RegexGuide::ChoicePattern({value.dump()}); }

// The quantifier for min..max repeats (max -1: no bound).
std::string RepeatSuffix(int min, int max) {
  if (max >= 0) return absl::StrCat("{", min, ",", max, "}");
  return min == 0 ? std::string("*") : absl::StrCat("{", min, ",}");
}

// min..max of `item` (max -1: no bound, max >= 1), separated by commas.
std::string CommaList(const std::string& item, int min, int max, const char* ws) {
  const std::string items =
      absl::StrCat(item, "(?:", ws, ",", ws, item, ")",
                   RepeatSuffix(std::max(0, min - 1), max < 0 ? -1 : max - 1));
  return min == 0 ? absl::StrCat("(?:", items, ")?") : items;
}

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("JSON schema at ", where.empty() ? "the root" : where, ": ", what));
}

class Converter {
 public:
  Converter(const json& root, bool compact) : root_(root), ws_(compact ? "" : kWs) {}

  absl::StatusOr<std::string> Value(const json& schema, const std::string& where, int depth) {
    if (depth > kJsonSchemaMaxDepth) return Bad(where, "nested too deep (or a recursive $ref)");
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) return Bad(where, "false admits nothing");
      return AnyValue(kAnyJsonDepth - 1);
    }
    if (!schema.is_object()) return Bad(where, "a schema must be an object");
    if (auto ref = schema.find("$ref"); ref != schema.end()) {
      if (!ref->is_string()) return Bad(where, "$ref must be a string");
      const std::string r = ref->get<std::string>();
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (r.rfind(p, 0) == 0) {
          const json* defs = root_.contains(p.substr(2, p.size() - 3))
                                 ? &root_[p.substr(2, p.size() - 3)]
                                 : nullptr;
          const std::string name = r.substr(p.size());
          if (defs == nullptr || !defs->is_object() || !defs->contains(name)) {
            return Bad(where, absl::StrCat("$ref ", r, " is not defined"));
          }
          return Value((*defs)[name], absl::StrCat(where, "/$ref"), depth + 1);
        }
      }
      return Bad(where, absl::StrCat("$ref ", r, " (only #/$defs/ and #/definitions/)"));
    }
    if (auto c = schema.find("const"); c != schema.end()) return Literal(*c);
    if (auto e = schema.find("enum"); e != schema.end()) {
      if (!e->is_array() || e->empty()) return Bad(where, "enum must be a non-empty array");
      std::vector<std::string> options;
      for (const json& v : *e) options.push_back(Literal(v));
      return absl::StrCat("(?:", absl::StrJoin(options, "|"), ")");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto any = schema.find(key); any != schema.end()) {
        if (!any->is_array() || any->empty()) {
          return Bad(where, absl::StrCat(key, " must be a non-empty array"));
        }
        std::vector<std::string> options;
        for (size_t i = 0; i < any->size(); ++i) {
          ASSIGN_OR_RETURN(std::string o,
                           Value((*any)[i], absl::StrCat(where, "/", key, "/", i), depth + 1));
          options.push_back(std::move(o));
        }
        return absl::StrCat("(?:", absl::StrJoin(options, "|"), ")");
      }
    }
    std::string type;
    if (auto t = schema.find("type"); t != schema.end()) {
      if (t->is_array()) {  // several types: alternatives
        std::vector<std::string> options;
        for (const json& one : *t) {
          json copy = schema;
          copy["type"] = one;
          ASSIGN_OR_RETURN(std::string o, Value(copy, where, depth + 1));
          options.push_back(std::move(o));
        }
        return absl::StrCat("(?:", absl::StrJoin(options, "|"), ")");
      }
      if (!t->is_string()) return Bad(where, "type must be a string or an array of strings");
      type = t->get<std::string>();
    } else if (schema.contains("properties")) {
      type = "object";
    } else if (schema.contains("items")) {
      type = "array";
    } else {
      return AnyValue(kAnyJsonDepth - 1);
    }
    if (type == "string") return String(schema, where);
    if (type == "integer") return std::string(kInteger);
    if (type == "number") return std::string(kNumber);
    if (type == "boolean") return std::string("(?:true|false)");
    if (type == "null") return std::string("null");
    if (type == "array") return Array(schema, where, depth);
    if (type == "object") return Object(schema, where, depth);
    return Bad(where, absl::StrCat("type \"", type, "\" is not supported"));
  }

 private:
  static absl::StatusOr<int> Count(const json& schema, const char* key, const std::string& where,
                                   int fallback) {
    auto it = schema.find(key);
    if (it == schema.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1000) {
      return Bad(where, absl::StrCat(key, " must be an integer in 0..1000"));
    }
    return static_cast<int>(it->get<int64_t>());
  }

  absl::StatusOr<std::string> String(const json& schema, const std::string& where) {
    if (schema.contains("pattern")) return Bad(where, "string pattern is not supported");
    if (auto f = schema.find("format"); f != schema.end()) {
      // The formats whose text needs no escaping inside the quotes.
      static const std::pair<const char*, const char*> kFormats[] = {
          {"date", "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"},
          {"time",
           "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})"
           "?"},
          {"date-time",
           "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T(?:[01][0-9]|2[0-3]):[0-5][0-9]:"
           "[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})"},
          {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
          {"email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\\.[A-Za-z0-9-]{1,63}){1,8}"},
      };
      for (const auto& [name, pattern] : kFormats) {
        if (*f == name) return absl::StrCat("\"", pattern, "\"");
      }
      return Bad(where, absl::StrCat("string format ", f->dump(),
                                     " (date, time, date-time, uuid, email are supported)"));
    }
    ASSIGN_OR_RETURN(const int min, Count(schema, "minLength", where, 0));
    ASSIGN_OR_RETURN(const int max, Count(schema, "maxLength", where, -1));
    if (max >= 0 && max < min) return Bad(where, "maxLength < minLength");
    return absl::StrCat("\"", kStringChar, RepeatSuffix(min, max), "\"");
  }

  absl::StatusOr<std::string> Array(const json& schema, const std::string& where, int depth) {
    std::string item = AnyValue(kAnyJsonDepth - 1);
    if (auto it = schema.find("items"); it != schema.end()) {
      ASSIGN_OR_RETURN(item, Value(*it, absl::StrCat(where, "/items"), depth + 1));
    }
    ASSIGN_OR_RETURN(const int min, Count(schema, "minItems", where, 0));
    ASSIGN_OR_RETURN(const int max, Count(schema, "maxItems", where, -1));
    if (max >= 0 && max < min) return Bad(where, "maxItems < minItems");
    if (max == 0) return absl::StrCat("\\[", ws_, "\\]");
    return absl::StrCat("\\[", ws_, CommaList(item, min, max, ws_), ws_, "\\]");
  }

  absl::StatusOr<std::string> Object(const json& schema, const std::string& where, int depth) {
    std::vector<std::pair<std::string, bool>> members;  // pattern of "key": value, required
    if (auto props = schema.find("properties"); props != schema.end()) {
      if (!props->is_object()) return Bad(where, "properties must be an object");
      std::vector<std::string> required;
      if (auto r = schema.find("required"); r != schema.end() && r->is_array()) {
        for (const json& name : *r) {
          if (name.is_string()) required.push_back(name.get<std::string>());
        }
      }
      for (const auto& [name, sub] : props->items()) {
        ASSIGN_OR_RETURN(std::string value,
                         Value(sub, absl::StrCat(where, "/properties/", name), depth + 1));
        const bool needed = std::find(required.begin(), required.end(), name) != required.end();
        members.push_back({absl::StrCat(Literal(json(name)), ws_, ":", ws_, value), needed});
      }
    } else {
      return AnyObject(kAnyJsonDepth - 1);
    }
    // Members in order, the optional ones optional, commas only between members present: after
    // the first present member each further one brings its comma.
    std::vector<std::string> after(members.size() + 1), first(members.size() + 1);
    for (int k = static_cast<int>(members.size()) - 1; k >= 0; --k) {
      const auto& [m, needed] = members[k];
      const std::string with_comma = absl::StrCat(ws_, ",", ws_, m);
      after[k] = needed ? absl::StrCat(with_comma, after[k + 1])
                        : absl::StrCat("(?:", with_comma, ")?", after[k + 1]);
      first[k] = needed ? absl::StrCat(m, after[k + 1])
                        : absl::StrCat("(?:", m, after[k + 1], "|", first[k + 1], ")");
    }
    return absl::StrCat("\\{", ws_, first[0], ws_, "\\}");
  }

  std::string AnyValue(int depth) const {
    std::string scalar = absl::StrCat("(?:\"", kStringChar, "*\"|", kNumber, "|true|false|null)");
    if (depth <= 0) return scalar;
    const std::string inner = AnyValue(depth - 1);
    const std::string array = absl::StrCat("\\[", ws_, CommaList(inner, 0, -1, ws_), ws_, "\\]");
    return absl::StrCat("(?:", scalar, "|", array, "|", AnyObject(depth - 1), ")");
  }

 public:
  std::string AnyObject(int depth) const {
    const std::string value = AnyValue(depth);
    const std::string member = absl::StrCat("\"", kStringChar, "*\"", ws_, ":", ws_, value);
    return absl::StrCat("\\{", ws_, CommaList(member, 0, -1, ws_), ws_, "\\}");
  }

 private:
  const json& root_;
  const char* const ws_;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToRegex(const nlohmann::ordered_json& schema, bool compact) {
  return Converter(schema, compact).Value(schema, "", 0);
}

std::string AnyJsonObjectRegex() {
  static const json kNone;
  return Converter(kNone, false).AnyObject(kAnyJsonDepth - 1);
}

}  // namespace mqa
