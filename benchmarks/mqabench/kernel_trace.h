// mqabench --kernel-trace: every kernel the device runs between Start() and the tracer's
// destruction, with its start and end on the GPU's clock, through CUPTI's activity API
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels concurrent: PDL overlaps show).
// CUPTI times a kernel by instrumenting it, so a traced step runs somewhat slower than an untraced
// one; mqabench prints the two side by side.
//
// One tracer at a time in a process; owned and called by one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmarks/kernel_timeline.h"

namespace mqa::bench {

class KernelTrace {
 public:
  // Fails where CUPTI cannot trace (no device, a profiler already attached, another tracer).
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start();
  ~KernelTrace();  // stops tracing
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // The kernels that ran since Start() or the last Take(), in completion order of CUPTI's buffers
  // (any order: kernel_timeline sorts). Waits for the device first.
  absl::StatusOr<std::vector<KernelRecord>> Take();

  // Records CUPTI dropped for want of buffer space, since Start().
  size_t dropped() const;

 private:
  KernelTrace() = default;
};

// mqabench's use of it: one traced iteration of a latency row, its first step the prefill and the
// rest decode steps. Start() before the prefill, EndStep() after every step, then Finish().
class StepTraceRecorder {
 public:
  absl::Status Start();
  absl::Status EndStep();  // the kernels since Start() or the last EndStep() are one step
  // Stops tracing; prints the prefill's and the decode steps' grouped timelines (medians over
  // the decode steps that ran the same kernels as the last one) beside `untraced_graph_ms` (the
  // untraced decode graph's median time, < 0 if unknown), and writes every kernel position's
  // medians to PATH_PREFIX-prefill.csv and PATH_PREFIX-decode.csv.
  absl::Status Finish(const std::string& path_prefix, double untraced_graph_ms);

 private:
  std::unique_ptr<KernelTrace> trace_;
  std::vector<std::vector<KernelRecord>> steps_;
};

}  // namespace mqa::bench
