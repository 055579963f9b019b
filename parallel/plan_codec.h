// StepInput <-> StepPlan. Rank 0's PlanEncoder keeps a mirror of the block tables the workers
// hold and puts into each plan only what changed: per sequence of the batch its new tokens, first
// position and the blocks appended since the last plan (a full table reset when the table no
// longer extends what the workers hold, e.g. a sequence re-scheduled after preemption with new
// blocks). Each worker's PlanDecoder applies the plan to its own mirror and rebuilds the identical
// StepInput. Slot mapping and context lengths are derived from positions and tables where they
// follow the usual rule and sent explicitly where not, so decoding is exact for any StepInput,
// while a plan stays O(batch tokens + new blocks), never O(context).
//
// Block table rows: StepInput pads each row with 0 to max_blocks_per_seq, and 0 is also a valid
// block id. The mirror keeps, for a sequence, its row up to the last non-zero entry or
// ceil(context_len / block_size) entries, whichever is longer; the decoder pads it back with 0,
// which reproduces the row exactly either way.
//
// Threads: an encoder belongs to rank 0's engine thread, a decoder to its worker's main thread.
// Both must see every plan, in order (StepPlan.step checks it).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "parallel/step_plan.pb.h"
#include "runtime/model_runner.h"

namespace mqa {

struct PlanCodecOptions {
  // Tokens per KV block; encoder and decoder must agree (each plan carries it and the decoder
  // checks).
  int block_size = 16;
  // Debug: the encoder puts a hash of its mirror in every plan and decoders compare theirs.
  bool send_mirror_hash = false;
};

// Per sequence id, the block table as the workers know it.
using BlockTableMirror = absl::flat_hash_map<int64_t, std::vector<int32_t>>;

// Order-independent, process-independent 64-bit hash of a mirror (not absl::Hash: that one is
// seeded per process).
uint64_t HashMirror(const BlockTableMirror& mirror);

class PlanEncoder {
 public:
  explicit PlanEncoder(const PlanCodecOptions& options = {}) : options_(options) {}

  // What the engine knows besides the StepInput.
  struct Extras {
    std::vector<int64_t> aborted_seq_ids;  // dropped from the mirrors, like finished ones
  };

  // The plan for one step. InvalidArgument if `input` is inconsistent (sizes, query_start, a
  // sequence twice); then the mirror is unchanged and no plan number is used.
  absl::StatusOr<pb::StepPlan> Encode(const StepInput& input, const Extras& extras);
  absl::StatusOr<pb::StepPlan> Encode(const StepInput& input) { return Encode(input, Extras{}); }
  // The last plan of the job.
  pb::StepPlan EncodeShutdown();

  const BlockTableMirror& mirror() const { return mirror_; }

 private:
  PlanCodecOptions options_;
  uint64_t next_step_ = 0;
  BlockTableMirror mirror_;
};

class PlanDecoder {
 public:
  explicit PlanDecoder(const PlanCodecOptions& options = {}) : options_(options) {}

  // Applies `plan` to the mirror and returns the step's input (empty for a shutdown plan).
  // DataLoss if the plan is out of order, malformed, or the mirror hash differs from rank 0's:
  // the worker is out of step and the job must end.
  absl::StatusOr<StepInput> Decode(const pb::StepPlan& plan);

  const BlockTableMirror& mirror() const { return mirror_; }

 private:
  PlanCodecOptions options_;
  uint64_t next_step_ = 0;
  BlockTableMirror mirror_;
};

}  // namespace mqa
