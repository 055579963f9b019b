// A step's kernels on the GPU's clock, as a tracer (benchmarks/mqabench/kernel_trace.h, CUPTI)
// records them, and what each one adds to the step: where kernels overlap (PDL lets a kernel
// start before its predecessor ends), only the time past everything before it counts. Host code
// only, no CUDA: tests/benchmarks/kernel_timeline_test.cc checks it on made-up records.
//
// For kernels sorted by start, with F the latest end among the kernels before kernel i:
//   gap_i     = max(0, start_i - F)                  the device ran none of this step's kernels
//   exposed_i = max(0, end_i - max(start_i, F))      kernel i alone extends the step
// so that a step's span (first start to last end) is the sum of its gaps and exposed times.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mqa::bench {

// The upper median (0 for none); mqabench's figures use it too.
double Median(std::vector<double> v);

struct KernelRecord {
  std::string name;  // demangled
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  int64_t grid = 0;    // CTAs (x * y * z)
  int block = 0;       // threads a CTA
  int smem_bytes = 0;  // static + dynamic shared memory a CTA
};

// A kernel's place in its step, in microseconds; start from the step's first kernel start.
struct KernelSpan {
  double start_us = 0;
  double duration_us = 0;
  double gap_us = 0;
  double exposed_us = 0;
};

// Sorts `step` by start (then end) and returns each kernel's span, in that order.
std::vector<KernelSpan> StepSpans(std::vector<KernelRecord>& step);

// One kernel position of a step, medians over the steps that ran the same kernels.
struct TimelineRow {
  std::string name;  // ShortKernelName
  int64_t grid = 0;
  int block = 0;
  int smem_bytes = 0;
  KernelSpan median;
};

struct Timeline {
  std::vector<TimelineRow> rows;
  int steps_used = 0;  // steps whose kernels (name, grid, block, order) equal the last step's
  int steps_total = 0;
  double span_us = 0;  // median over the steps used of first start to last end
};

// Medians over `steps` (each a step's records, any order) of every kernel position. Steps whose
// kernel sequence differs from the last step's (another CUDA graph bucket, a capture step) are
// left out; an error if no step has a kernel.
absl::StatusOr<Timeline> MedianTimeline(std::vector<std::vector<KernelRecord>> steps);

// A row per distinct (name, grid, block): how many times a step runs it, and the sums over those
// positions of the medians (one step's share). Ordered by exposed time, largest first.
struct KernelGroup {
  std::string name;
  int64_t grid = 0;
  int block = 0;
  int smem_bytes = 0;  // a CTA's, as the rows: parts launches of one kernel and grid
  int count = 0;
  double duration_us = 0;
  double gap_us = 0;
  double exposed_us = 0;
};
std::vector<KernelGroup> GroupTimeline(const Timeline& t);

// "void mqa::(anonymous namespace)::Foo<__half, 1>(mqa::Args<__half>)" -> "Foo<__half, 1>":
// no return type, argument list or namespaces of the function's own name; template arguments
// kept (they tell a kernel's variants apart); at most `max_chars` characters.
std::string ShortKernelName(std::string_view demangled, size_t max_chars = 72);

// The grouped table (the top `max_groups` groups, the rest summed in one line) under `title`.
void PrintTimelineSummary(std::FILE* out, const std::string& title, const Timeline& t,
                          size_t max_groups = 16);

// Every row of `t` as CSV (position, name, grid, block, smem, start, duration, gap, exposed).
absl::Status WriteTimelineCsv(const std::string& path, const Timeline& t);

}  // namespace mqa::bench
