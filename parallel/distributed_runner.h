// Tensor parallelism across MPI ranks, seen from the engine as one ModelRunner.
//
// Rank 0: DistributedRunner wraps rank 0's local runner (shard 0). Each Execute encodes the step
// as a StepPlan of deltas (PlanEncoder), broadcasts it on the control channel, then runs shard 0;
// the shards meet in the forward's collectives. Workers: RunWorker receives each plan, rebuilds the
// identical StepInput (PlanDecoder) and runs their shard, until the shutdown plan.
//
// Threads: rank 0's engine thread owns the DistributedRunner (it calls MPI); a worker's main
// thread runs RunWorker. An error on either side leaves the ranks out of step: callers end the
// job (World::Abort).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "parallel/control_channel.h"
#include "parallel/plan_codec.h"
#include "runtime/model_runner.h"

namespace mqa {

class DistributedRunner final : public ModelRunner {
 public:
  // `channel` must outlive the runner.
  DistributedRunner(std::unique_ptr<ModelRunner> local, ControlChannel* channel,
                    const PlanCodecOptions& codec);

  absl::StatusOr<Tensor> Execute(const StepInput& input) override;
  // The plan goes out as for Execute; rank 0's shard samples (the workers run Execute: the same
  // forward and collectives).
  bool samples_on_device() const override { return local_->samples_on_device(); }
  absl::StatusOr<SampledStep> ExecuteSampled(const StepInput& input,
                                             absl::Span<const RowSamplingParams> params,
                                             bool with_logits) override;
  int64_t vocab_size() const override { return local_->vocab_size(); }
  int num_kv_blocks() const override { return local_->num_kv_blocks(); }
  int block_size() const override { return local_->block_size(); }
  // An empty plan, so that workers can tell an idle rank 0 from a dead one.
  absl::Status KeepAlive() override;
  // The last plan: workers return from RunWorker. Later Executes fail.
  absl::Status Shutdown();

  const ControlChannel& channel() const { return *channel_; }

 private:
  // Encodes the step and broadcasts it to the workers.
  absl::Status SendPlan(const StepInput& input);

  std::unique_ptr<ModelRunner> local_;
  ControlChannel* channel_;
  PlanEncoder encoder_;
  bool shut_down_ = false;
};

struct WorkerOptions {
  PlanCodecOptions codec;
  // No plan (not even a keep-alive) for this long: rank 0 is gone; the worker returns an error.
  absl::Duration receive_timeout = absl::Seconds(60);
};

// A worker's loop: returns OK after the shutdown plan, an error when a plan is missing, corrupt or
// its step fails.
absl::Status RunWorker(ControlChannel& channel, ModelRunner& local, const WorkerOptions& options);

}  // namespace mqa
