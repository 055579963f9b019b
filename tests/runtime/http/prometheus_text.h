// A strict parser of the Prometheus text exposition format, for tests: every line must be a
// HELP / TYPE comment or a well-formed sample of a family whose TYPE came first.
#pragma once

#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mqa::testing {

struct PrometheusPage {
  std::map<std::string, std::string> types;  // family -> gauge | counter | histogram | ...
  // "name{labels as written}" (or "name") -> value
  std::map<std::string, double> samples;
  std::vector<std::pair<std::string, double>> ordered;
};

inline bool IsMetricName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') return false;
  }
  return true;
}

// Checks `k="v",k2="v2"` (escapes \\ \" \n only).
inline bool ValidLabels(const std::string& labels) {
  size_t i = 0;
  while (i < labels.size()) {
    size_t eq = labels.find('=', i);
    if (eq == std::string::npos || !IsMetricName(labels.substr(i, eq - i))) return false;
    if (eq + 1 >= labels.size() || labels[eq + 1] != '"') return false;
    size_t j = eq + 2;
    for (; j < labels.size() && labels[j] != '"'; ++j) {
      if (labels[j] == '\\') {
        if (j + 1 >= labels.size()) return false;
        char e = labels[j + 1];
        if (e != '\\' && e != '"' && e != 'n') return false;
        ++j;
      }
    }
    if (j >= labels.size()) return false;
    i = j + 1;
    if (i < labels.size()) {
      if (labels[i] != ',') return false;
      ++i;
    }
  }
  return true;
}

inline absl::StatusOr<PrometheusPage> ParsePrometheusText(const std::string& text) {
  PrometheusPage page;
  int line_no = 0;
  for (absl::string_view line_view : absl::StrSplit(text, '\n')) {
    ++line_no;
    std::string line(line_view);
    auto bad = [&](const char* why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", why, ": ", line));
    };
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (parts.size() < 3 || (parts[1] != "HELP" && parts[1] != "TYPE")) continue;
      if (!IsMetricName(parts[2])) return bad("bad family name");
      if (parts[1] == "TYPE") {
        if (parts.size() != 4) return bad("TYPE without a type");
        page.types[parts[2]] = parts[3];
      }
      continue;
    }
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) return bad("no value");
    std::string name = line.substr(0, name_end);
    if (!IsMetricName(name)) return bad("bad metric name");
    std::string key = name;
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      size_t close = line.rfind('}');
      if (close == std::string::npos || close < name_end) return bad("unclosed labels");
      std::string labels = line.substr(name_end + 1, close - name_end - 1);
      if (!ValidLabels(labels)) return bad("bad labels");
      key = line.substr(0, close + 1);
      value_start = close + 1;
    }
    if (value_start >= line.size() || line[value_start] != ' ') return bad("no space before value");
    std::string value_text = line.substr(value_start + 1);
    double value = 0;
    if (value_text == "+Inf") {
      value = std::numeric_limits<double>::infinity();
    } else if (value_text == "-Inf") {
      value = -std::numeric_limits<double>::infinity();
    } else if (value_text == "NaN") {
      value = std::numeric_limits<double>::quiet_NaN();
    } else if (!absl::SimpleAtod(value_text, &value)) {
      return bad("bad value");
    }
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      std::string s(suffix);
      if (!page.types.count(family) && family.size() > s.size() &&
          family.compare(family.size() - s.size(), s.size(), s) == 0) {
        family = family.substr(0, family.size() - s.size());
      }
    }
    if (!page.types.count(family)) return bad("sample before its TYPE");
    if (page.samples.count(key)) return bad("duplicate sample");
    page.samples[key] = value;
    page.ordered.emplace_back(key, value);
  }
  return page;
}

}  // namespace mqa::testing
