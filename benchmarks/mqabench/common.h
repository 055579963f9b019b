// mqabench's shared pieces: the flags (mqabench.cc parses them; its header comment lists them),
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
#include "model/config.h"
#include "model/gpt_bigcode_runner.h"
#include "parallel/collectives.h"
#include "runtime/dtype.h"
#include "runtime/model_runner.h"

namespace mqa::bench {

struct Flags {
  std::string mode;
  std::string model = "configs/starcoder";
  int batch_size = 1, input_len = 128, output_len = 128, num_iters = 3, num_iters_warmup = 1;
  std::string load_format = "dummy", dtype = "float16", gemm = "skinnyd";  // the runner's default
  int block_size = 16;
  bool cuda_graphs = true;
  std::string fast = "pdl+ln";  // the runner's default
  std::string autotune = "decode";  // as the server: tuned during the decode-graph warm-up
  std::string small = "on";  // the runner's default
  std::string async = "off";
  std::string engine = "off";  // off: mqabench's own step loop; on: the serving engine; both
  std::string chain = "auto";
  std::string chain_timeline;  // comma list of layers (empty: off)
  std::string kernel_trace;    // CSV path prefix (empty: off)
  std::string attn =
      "18";  // comma list of PagedAttentionTuning variants (18: the runner's default)
  std::string skip = "none";      // comma list of op sets left out (timing only)
  std::string attn_wm = "0";      // comma list of attention warps_m (0: automatic)
  std::string attn_splits = "0";  // comma list of attention split counts (0: automatic)
  std::string attn_tn = "0";      // comma list of variant 11's KV tokens a stage (0: automatic)
  int num_prompts = 500, max_num_seqs = 256, max_num_batched_tokens = 4096;
  // Speculative decoding's check step: each decode step brings the last token and this many
  // draft tokens a sequence, with a logits row for each (0: plain decode steps).
  int verify_tokens = 0;
  int graph_query = 1;  // GptBigCodeOptions::max_graph_query (--graph-query)
  int speculative = 0;  // --engine rows: EngineOptions::speculative's drafts a step (--speculative)
  uint64_t seed = 0;
};

// The --chain form kKfN: K KiB ring stages (a positive multiple of 8), at most N requested ahead.
bool ParseRingForm(const std::string& row, int* kib, int* inflight);

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
