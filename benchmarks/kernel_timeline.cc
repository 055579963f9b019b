#include "benchmarks/kernel_timeline.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mqa::bench {
namespace {

using Signature = std::vector<std::tuple<std::string, int64_t, int>>;

Signature SignatureOf(const std::vector<KernelRecord>& sorted) {
  Signature s;
  s.reserve(sorted.size());
  for (const KernelRecord& r : sorted) s.emplace_back(r.name, r.grid, r.block);
  return s;
}

}  // namespace

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<KernelSpan> StepSpans(std::vector<KernelRecord>& step) {
  std::sort(step.begin(), step.end(), [](const KernelRecord& a, const KernelRecord& b) {
    return std::tie(a.start_ns, a.end_ns) < std::tie(b.start_ns, b.end_ns);
  });
  std::vector<KernelSpan> spans;
  spans.reserve(step.size());
  if (step.empty()) return spans;
  const uint64_t t0 = step.front().start_ns;
  uint64_t frontier = t0;  // the latest end so far
  for (const KernelRecord& r : step) {
    const uint64_t end = std::max(r.end_ns, r.start_ns);  // a record's end is never before start
    KernelSpan s;
    s.start_us = (r.start_ns - t0) * 1e-3;
    s.duration_us = (end - r.start_ns) * 1e-3;
    s.gap_us = r.start_ns > frontier ? (r.start_ns - frontier) * 1e-3 : 0.0;
    const uint64_t from = std::max(r.start_ns, frontier);
    s.exposed_us = end > from ? (end - from) * 1e-3 : 0.0;
    frontier = std::max(frontier, end);
    spans.push_back(s);
  }
  return spans;
}

absl::StatusOr<Timeline> MedianTimeline(std::vector<std::vector<KernelRecord>> steps) {
  Timeline t;
  t.steps_total = static_cast<int>(steps.size());
  std::vector<std::vector<KernelSpan>> spans(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) spans[i] = StepSpans(steps[i]);
  int ref = -1;  // the last step with kernels
  for (int i = static_cast<int>(steps.size()) - 1; i >= 0 && ref < 0; --i) {
    if (!steps[i].empty()) ref = i;
  }
  if (ref < 0) return absl::NotFoundError("kernel timeline: no kernel was recorded");
  const Signature want = SignatureOf(steps[ref]);
  const size_t n = want.size();
  std::vector<std::vector<double>> start(n), duration(n), gap(n), exposed(n);
  std::vector<double> span;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].size() != n || SignatureOf(steps[i]) != want) continue;
    ++t.steps_used;
    uint64_t last_end = 0;
    for (size_t j = 0; j < n; ++j) {
      start[j].push_back(spans[i][j].start_us);
      duration[j].push_back(spans[i][j].duration_us);
      gap[j].push_back(spans[i][j].gap_us);
      exposed[j].push_back(spans[i][j].exposed_us);
      last_end = std::max(last_end, steps[i][j].end_ns);
    }
    span.push_back((last_end - steps[i].front().start_ns) * 1e-3);
  }
  t.span_us = Median(std::move(span));
  for (size_t j = 0; j < n; ++j) {
    const KernelRecord& r = steps[ref][j];
    TimelineRow row;
    row.name = ShortKernelName(r.name);
    row.grid = r.grid;
    row.block = r.block;
    row.smem_bytes = r.smem_bytes;
    row.median.start_us = Median(start[j]);
    row.median.duration_us = Median(duration[j]);
    row.median.gap_us = Median(gap[j]);
    row.median.exposed_us = Median(exposed[j]);
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::vector<KernelGroup> GroupTimeline(const Timeline& t) {
  std::map<std::tuple<std::string, int64_t, int, int>, KernelGroup> by_key;
  for (const TimelineRow& r : t.rows) {
    KernelGroup& g = by_key[{r.name, r.grid, r.block, r.smem_bytes}];
    g.name = r.name;
    g.grid = r.grid;
    g.block = r.block;
    g.smem_bytes = r.smem_bytes;
    ++g.count;
    g.duration_us += r.median.duration_us;
    g.gap_us += r.median.gap_us;
    g.exposed_us += r.median.exposed_us;
  }
  std::vector<KernelGroup> groups;
  for (auto& [key, g] : by_key) groups.push_back(std::move(g));
  std::stable_sort(groups.begin(), groups.end(), [](const KernelGroup& a, const KernelGroup& b) {
    return a.exposed_us > b.exposed_us;
  });
  return groups;
}

std::string ShortKernelName(std::string_view s, size_t max_chars) {
  // The argument list: the last top-level (...) group, when the name ends with one.
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s = s.substr(0, i);
        break;
      }
    }
  }
  // The function's own name starts after the last space (a return type) or "::" (a namespace or
  // class) outside any <...> or (...).
  size_t begin = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<' || c == '(') ++depth;
    if ((c == '>' || c == ')') && depth > 0) --depth;
    if (depth != 0) continue;
    if (c == ' ') begin = i + 1;
    if (c == ':' && i + 1 < s.size() && s[i + 1] == ':') begin = i + 2;
  }
  std::string name(s.substr(begin));
  if (name.size() > max_chars && max_chars > 3) name = name.substr(0, max_chars - 3) + "...";
  return name;
}

void PrintTimelineSummary(std::FILE* out, const std::string& title, const Timeline& t,
                          size_t max_groups) {
  double gaps = 0, exposed = 0;
  for (const TimelineRow& r : t.rows) {
    gaps += r.median.gap_us;
    exposed += r.median.exposed_us;
  }
  absl::FPrintF(out,
                "%s: %zu kernels a step; median span %.1f us over %d of %d steps (medians a "
                "position: exposed %.1f us + gaps %.1f us)\n",
                title, t.rows.size(), t.span_us, t.steps_used, t.steps_total, exposed, gaps);
  absl::FPrintF(out, "    %5s %7s %5s %6s  %9s %8s  %9s %8s %8s  %s\n", "count", "grid", "block",
                "smem", "exposed", "each", "duration", "each", "gaps", "kernel");
  const std::vector<KernelGroup> groups = GroupTimeline(t);
  KernelGroup rest;
  for (size_t i = 0; i < groups.size(); ++i) {
    const KernelGroup& g = groups[i];
    if (i >= max_groups) {
      rest.count += g.count;
      rest.exposed_us += g.exposed_us;
      rest.duration_us += g.duration_us;
      rest.gap_us += g.gap_us;
      continue;
    }
    absl::FPrintF(out, "    %5d %7d %5d %6d  %9.1f %8.2f  %9.1f %8.2f %8.1f  %s\n", g.count, g.grid,
                  g.block, g.smem_bytes, g.exposed_us, g.exposed_us / g.count, g.duration_us,
                  g.duration_us / g.count, g.gap_us, g.name);
  }
  if (rest.count > 0) {
    absl::FPrintF(out, "    %5d %7s %5s %6s  %9.1f %8s  %9.1f %8s %8.1f  (%zu more kinds)\n",
                  rest.count, "", "", "", rest.exposed_us, "", rest.duration_us, "", rest.gap_us,
                  groups.size() - max_groups);
  }
}

absl::Status WriteTimelineCsv(const std::string& path, const Timeline& t) {
  std::ofstream f(path);
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  f << "position,name,grid,block,smem_bytes,start_us,duration_us,gap_us,exposed_us\n";
  for (size_t j = 0; j < t.rows.size(); ++j) {
    const TimelineRow& r = t.rows[j];
    std::string name = r.name;  // CSV: the name quoted, its quotes doubled
    for (size_t p = 0; (p = name.find('"', p)) != std::string::npos; p += 2) name.insert(p, "\"");
    f << absl::StrFormat("%d,\"%s\",%d,%d,%d,%.3f,%.3f,%.3f,%.3f\n", j, name, r.grid, r.block,
                         r.smem_bytes, r.median.start_us, r.median.duration_us, r.median.gap_us,
                         r.median.exposed_us);
  }
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace mqa::bench
