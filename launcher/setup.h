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

}  // namespace mqa
