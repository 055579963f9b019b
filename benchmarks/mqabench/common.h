// mqabench's shared pieces: the flags (flags.h; mqabench.cc's header comment lists them),
// the benchmark's own sequences and KV blocks, one step's input, the model set up on the device
// with dummy weights beside the measured copy bandwidth, timing helpers; and the two modes
// (latency.cc, throughput.cc). CUDA builds only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "benchmarks/kernel_timeline.h"  // Median
#include "benchmarks/mqabench/flags.h"
#include "model/config.h"
#include "model/gpt_bigcode_runner.h"
#include "parallel/collectives.h"
#include "runtime/dtype.h"
#include "runtime/model_runner.h"

namespace mqa::bench {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b);

// The KV block bookkeeping of the benchmark's sequences (blocks never shared).
class Blocks {
 public:
  Blocks(int num_blocks, int block_size) : block_size_(block_size) {
    for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  }
  bool Reserve(std::vector<int32_t>& table, int tokens) {
    while (static_cast<int>(table.size()) * block_size_ < tokens) {
      if (free_.empty()) return false;
      table.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  void Release(std::vector<int32_t>& table) {
    for (int32_t b : table) free_.push_back(b);
    table.clear();
  }
  int free() const { return static_cast<int>(free_.size()); }
  int block_size() const { return block_size_; }

 private:
  int block_size_;
  std::vector<int32_t> free_;
};
struct Seq {
  std::vector<int32_t> prompt;
  int output_len = 0;
  int generated = 0;
  int context = 0;  // tokens in the cache
  int32_t last = 0;
  std::vector<int32_t> table;
};

// One step over `seqs`: seq i brings chunk[i] tokens; logits for each one's last row (every row
// with all_rows: a speculative decoding check step).
StepInput MakeStep(const std::vector<Seq*>& seqs, const std::vector<std::vector<int32_t>>& chunk,
                   int block_size, bool all_rows = false);

struct Setup {
  ModelConfig config;
  DType dtype = DType::kF16;
  std::unique_ptr<Collectives> collectives;
  std::unique_ptr<GptBigCodeRunner> runner;
  int64_t weight_bytes = 0;
  double copy_bw = 0;
};

// The model of --model with dummy weights made on the device (--dtype, --seed), a runner with
// `num_blocks` KV blocks, room for `max_tokens` tokens and `max_rows` logits rows a step, and the
// device-to-device copy bandwidth measured first; prints both.
absl::StatusOr<Setup> MakeSetup(const Flags& f, int num_blocks, int64_t max_tokens,
                                int64_t max_rows);

// The two modes (mqabench latency / throughput).
absl::Status Latency(const Flags& f);
absl::Status Throughput(const Flags& f);

}  // namespace mqa::bench
