#include "parallel/distributed_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {

DistributedRunner::DistributedRunner(std::unique_ptr<ModelRunner> local, ControlChannel* channel,
                                     const PlanCodecOptions& codec)
    : local_(std::move(local)), channel_(channel), encoder_(codec) {}

absl::Status DistributedRunner::SendPlan(const StepInput& input) {
  if (shut_down_) return absl::FailedPreconditionError("the workers have been shut down");
  ASSIGN_OR_RETURN(const pb::StepPlan plan, encoder_.Encode(input));
  return channel_->Send(plan);
}

absl::StatusOr<Tensor> DistributedRunner::Execute(const StepInput& input) {
  RETURN_IF_ERROR(SendPlan(input));
  return local_->Execute(input);
}

absl::StatusOr<SampledStep> DistributedRunner::ExecuteSampled(
    const StepInput& input, absl::Span<const RowSamplingParams> params, bool with_logits) {
  RETURN_IF_ERROR(SendPlan(input));
  return local_->ExecuteSampled(input, params, with_logits);
}

absl::Status DistributedRunner::KeepAlive() {
  if (shut_down_) return absl::OkStatus();
  StepInput idle;
  idle.query_start = {0};
  ASSIGN_OR_RETURN(const pb::StepPlan plan, encoder_.Encode(idle));
  return channel_->Send(plan);
}

absl::Status DistributedRunner::Shutdown() {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  return channel_->Send(encoder_.EncodeShutdown());
}

absl::Status RunWorker(ControlChannel& channel, ModelRunner& local, const WorkerOptions& options) {
  PlanDecoder decoder(options.codec);
  while (true) {
    absl::StatusOr<pb::StepPlan> plan = channel.ReceiveFor(options.receive_timeout);
    if (absl::IsDeadlineExceeded(plan.status())) {
      return absl::UnavailableError(absl::StrCat(
          "no plan from rank 0 for ", absl::FormatDuration(options.receive_timeout),
          ": rank 0 is gone or stuck"));
    }
    RETURN_IF_ERROR(plan.status());
    if (plan->shutdown()) return absl::OkStatus();
    ASSIGN_OR_RETURN(const StepInput input, decoder.Decode(*plan));
    if (input.num_seqs() == 0 && input.block_copies.empty()) continue;  // keep-alive
    RETURN_IF_ERROR(local.Execute(input).status());
  }
}

}  // namespace mqa
