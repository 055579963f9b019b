// The seam between the engine (scheduler, block manager, sampler: rank 0) and the model (every
// rank). One call per engine step. The engine builds a StepInput from its scheduling decision;
// a ModelRunner runs the forward pass over the paged KV cache and returns the requested logits.
//
// Implementations: GptBigCodeRunner (model/, one rank, CPU or CUDA) and the distributed runner
// (parallel/), which sends each step to the workers as a StepPlan and runs the local shard.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/row_sampling.h"
#include "runtime/tensor.h"

namespace mqa {

struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

struct StepInput {
  // Sequences in this step, in order; sequence s owns token rows [query_start[s], query_start[s+1]).
  std::vector<int64_t> seq_ids;
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens]
  std::vector<int32_t> query_start;   // [num_seqs + 1]
  std::vector<int32_t> context_lens;  // [num_seqs]: tokens in the cache after this step
  std::vector<int32_t> slot_mapping;  // [num_tokens]: physical block * block_size + offset
  // Full block tables, row s = sequence s, padded with 0 to max_blocks_per_seq. (The distributed
  // runner sends only what changed since the last step; see parallel/.)
  std::vector<int32_t> block_tables;
  int max_blocks_per_seq = 0;
  // Token rows whose logits the engine needs, e.g. each sampling sequence's last row (all rows of a
  // prompt when prompt logprobs are asked for).
  std::vector<int32_t> logits_rows;
  // Applied before the forward pass (copy-on-write of a shared partial block).
  std::vector<BlockCopy> block_copies;
  // Sequences whose blocks were released since the last step (lets mirrors drop their tables).
  std::vector<int64_t> finished_seq_ids;
  // The engine's hint for decode lookahead (runtime/decode_lookahead.h): every sequence of this
  // decode step is scheduled again next step with its sampled token unless that token (or the
  // text it ends) stops it, nothing else is waiting to run, and each sequence's last block is its
  // own. A runner that samples on the device may then launch the predicted next step before this
  // step's tokens reach the host. Not part of what a distributed runner sends its workers.
  bool may_look_ahead = false;

  int num_seqs() const { return static_cast<int>(seq_ids.size()); }
  int num_tokens() const { return static_cast<int>(token_ids.size()); }
};

// What ExecuteSampled returns on rank 0.
struct SampledStep {
  std::vector<int32_t> tokens;  // one per logits row, drawn with that row's RowSamplingParams
  Tensor logits;                // fp32 [logits_rows, vocab] on the host when asked for, else empty
};

// Thread ownership: one thread (the engine's) calls a runner; runners are not thread-safe.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs one step. Returns fp32 logits on the host, [logits_rows.size(), vocab_size], on rank 0.
  virtual absl::StatusOr<Tensor> Execute(const StepInput& input) = 0;
  // Whether ExecuteSampled draws the tokens where the logits are (the GPU): the engine then sends
  // per-row sampling parameters and gets token ids back instead of copying every logits row to
  // the host. False: the engine samples on the host from Execute's logits.
  virtual bool samples_on_device() const { return false; }
  // Runs one step and draws one token per logits row with params[row] (runtime/row_sampling.h,
  // kernels/sampling.h). with_logits: also return the logits (for rows the engine samples on the
  // host: penalties, logprobs, ...). Rank 0 only gets tokens; other ranks run it like Execute.
  virtual absl::StatusOr<SampledStep> ExecuteSampled(const StepInput& input,
                                                     absl::Span<const RowSamplingParams> params,
                                                     bool with_logits) {
    (void)input;
    (void)params;
    (void)with_logits;
    return absl::UnimplementedError("this runner does not sample on the device");
  }
  virtual int64_t vocab_size() const = 0;
  // Physical KV blocks available to the block manager, and their size in tokens.
  virtual int num_kv_blocks() const = 0;
  virtual int block_size() const = 0;
  // Called by the engine thread about once a second while there is no work: lets a distributed
  // runner tell its workers that rank 0 is alive. An error ends the engine like a failed step.
  virtual absl::Status KeepAlive() { return absl::OkStatus(); }
};

}  // namespace mqa
