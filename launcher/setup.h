// What each rank does after start-up: load its shard, then serve / generate (rank 0) or follow
// rank 0's plans (workers).
#pragma once

#include "absl/status/status.h"
#include "launcher/options.h"
#include "parallel/world.h"

namespace mqa {

// Runs this rank to the end of the job. An error is one line for the user (it names the file,
// flag or rank that failed); the caller ends the job with it.
absl::Status RunRank(const Options& options, const World& world);

// The decode-graph warm-up at start-up and the decode GEMM tuning during it: the warm-up only for
// CUDA at one rank with graphs on (--cuda-graph-warmup, not --enforce-eager); the tuning only with
// the warm-up and --gemm-autotune decode (without a warm-up nothing is tuned, so that no live
// step ever pays a timing pass).
struct DecodeWarmUpPlan {
  bool warm_up = false;
  bool tune_gemms = false;
};
DecodeWarmUpPlan PlanDecodeWarmUp(const Options& options, bool cuda, int world_size);

// True when every rank returned this same error from RunRank (start-up checks and loading are
// agreed collectively) or when the workers have already left: then rank 0 alone prints it and
// every rank exits non-zero normally; any other error needs World::Abort to end the job.
bool IsJobWideError(const absl::Status& status);

}  // namespace mqa
