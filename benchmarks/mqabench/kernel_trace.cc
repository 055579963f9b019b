#include "benchmarks/mqabench/kernel_trace.h"

#ifdef MQA_WITH_CUPTI
#include <cupti.h>
#endif
#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/cuda_check.h"

#ifdef MQA_WITH_CUPTI
// The check macro's CUPTI variant (only this file calls CUPTI).
#define CUPTI_RETURN_IF_ERROR(expr)                                                            \
  do {                                                                                         \
    CUptiResult mqa_cupti_rc_ = (expr);                                                        \
    if (mqa_cupti_rc_ != CUPTI_SUCCESS) {                                                      \
      const char* mqa_cupti_msg_ = nullptr;                                                    \
      cuptiGetResultString(mqa_cupti_rc_, &mqa_cupti_msg_);                                    \
      return ::absl::FailedPreconditionError(                                                  \
          ::absl::StrCat(#expr, ": ", mqa_cupti_msg_ ? mqa_cupti_msg_ : "CUPTI error", " at ", \
                         __FILE__, ":", __LINE__));                                            \
    }                                                                                          \
  } while (0)

#endif  // MQA_WITH_CUPTI

namespace mqa::bench {
#ifdef MQA_WITH_CUPTI
namespace {

// CUPTI hands records over in buffers it asks for and returns from its own threads.
struct Collector {
  std::mutex mu;
  std::vector<KernelRecord> records;  // guarded by mu
  size_t dropped = 0;                 // guarded by mu
};

Collector& TheCollector() {
  static Collector c;
  return c;
}

std::atomic<bool> g_tracing{false};

constexpr size_t kBufferBytes = size_t{8} << 20;

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return name;  // a C name (cuBLAS's kernels) stays as it is
  std::string out(d);
  std::free(d);
  return out;
}

void CUPTIAPI OnBufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI OnBufferCompleted(CUcontext context, uint32_t stream_id, uint8_t* buffer,
                                size_t /*size*/, size_t valid) {
  std::vector<KernelRecord> got;
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    KernelRecord r;
    r.name = Demangle(k->name);
    r.start_ns = k->start;
    r.end_ns = k->end;
    r.grid = int64_t{k->gridX} * k->gridY * k->gridZ;
    r.block = k->blockX * k->blockY * k->blockZ;
    r.smem_bytes = k->staticSharedMemory + k->dynamicSharedMemory;
    got.push_back(std::move(r));
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped);
  std::free(buffer);
  Collector& c = TheCollector();
  std::lock_guard<std::mutex> lock(c.mu);
  c.dropped += dropped;
  for (KernelRecord& r : got) c.records.push_back(std::move(r));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start() {
  if (g_tracing.exchange(true)) {
    return absl::FailedPreconditionError("KernelTrace: a trace is already running");
  }
  auto fail = [](absl::Status s) {
    g_tracing = false;
    return s;
  };
  {
    Collector& c = TheCollector();
    std::lock_guard<std::mutex> lock(c.mu);
    c.records.clear();
    c.dropped = 0;
  }
  auto start = []() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    static bool registered = false;  // once a process (later traces reuse the callbacks)
    if (!registered) {
      CUPTI_RETURN_IF_ERROR(cuptiActivityRegisterCallbacks(OnBufferRequested, OnBufferCompleted));
      registered = true;
    }
    CUPTI_RETURN_IF_ERROR(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    return absl::OkStatus();
  };
  if (absl::Status s = start(); !s.ok()) return fail(std::move(s));
  return std::unique_ptr<KernelTrace>(new KernelTrace());
}

KernelTrace::~KernelTrace() {
  cudaDeviceSynchronize();
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  Collector& c = TheCollector();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.records.clear();
  }
  g_tracing = false;
}

absl::StatusOr<std::vector<KernelRecord>> KernelTrace::Take() {
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  CUPTI_RETURN_IF_ERROR(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  Collector& c = TheCollector();
  std::lock_guard<std::mutex> lock(c.mu);
  return std::exchange(c.records, {});
}

size_t KernelTrace::dropped() const {
  Collector& c = TheCollector();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.dropped;
}

#else  // no CUPTI: --kernel-trace reports it

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start() {
  return absl::UnimplementedError("KernelTrace: mqabench was built without CUPTI");
}
KernelTrace::~KernelTrace() = default;
absl::StatusOr<std::vector<KernelRecord>> KernelTrace::Take() {
  return absl::UnimplementedError("KernelTrace: mqabench was built without CUPTI");
}
size_t KernelTrace::dropped() const { return 0; }

#endif  // MQA_WITH_CUPTI

absl::Status StepTraceRecorder::Start() {
  steps_.clear();
  ASSIGN_OR_RETURN(trace_, KernelTrace::Start());
  return absl::OkStatus();
}

absl::Status StepTraceRecorder::EndStep() {
  if (trace_ == nullptr) return absl::FailedPreconditionError("StepTraceRecorder: not started");
  ASSIGN_OR_RETURN(std::vector<KernelRecord> step, trace_->Take());
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status StepTraceRecorder::Finish(const std::string& path_prefix, double untraced_graph_ms) {
  if (trace_ == nullptr) return absl::FailedPreconditionError("StepTraceRecorder: not started");
  const size_t dropped = trace_->dropped();
  trace_.reset();
  if (steps_.size() < 2) {
    return absl::FailedPreconditionError("kernel trace: a prefill and a decode step are needed");
  }
  std::vector<std::vector<KernelRecord>> decode(std::make_move_iterator(steps_.begin() + 1),
                                                std::make_move_iterator(steps_.end()));
  ASSIGN_OR_RETURN(const Timeline prefill, MedianTimeline({std::move(steps_.front())}));
  ASSIGN_OR_RETURN(const Timeline steps, MedianTimeline(std::move(decode)));
  steps_.clear();
  std::printf(
      "  kernel trace (CUPTI times each kernel by instrumenting it: a traced decode step spans "
      "%.3f ms against the untraced graph's %.3f ms)%s\n",
      steps.span_us * 1e-3, untraced_graph_ms,
      dropped > 0 ? absl::StrCat("; ", dropped, " records dropped").c_str() : "");
  PrintTimelineSummary(stdout, "  prefill", prefill);
  PrintTimelineSummary(stdout, "  decode step", steps);
  RETURN_IF_ERROR(WriteTimelineCsv(path_prefix + "-prefill.csv", prefill));
  RETURN_IF_ERROR(WriteTimelineCsv(path_prefix + "-decode.csv", steps));
  std::printf("  kernel positions written to %s-prefill.csv and %s-decode.csv\n",
              path_prefix.c_str(), path_prefix.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace mqa::bench
