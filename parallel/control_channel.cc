#include "parallel/control_channel.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {
namespace {

constexpr int kRoom = ControlChannel::kFrameBytes - ControlChannel::kLengthBytes;

void PutLength(uint64_t length, char* out) {
  for (int i = 0; i < ControlChannel::kLengthBytes; ++i)
    out[i] = static_cast<char>(length >> (8 * i));
}

uint64_t GetLength(const char* in) {
  uint64_t length = 0;
  for (int i = 0; i < ControlChannel::kLengthBytes; ++i) {
    length |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return length;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControlChannel>> ControlChannel::Create(
    const World& world, const ControlChannelOptions& options) {
  ASSIGN_OR_RETURN(Communicator comm, world.Dup());
  return std::unique_ptr<ControlChannel>(new ControlChannel(std::move(comm), options));
}

ControlChannel::ControlChannel(Communicator comm, const ControlChannelOptions& options)
    : comm_(std::move(comm)), options_(options), rank_(comm_.rank()), frame_(kFrameBytes) {}

// A receive still posted at destruction (a worker leaving after a timeout) cannot be cancelled
// (MPI has no cancel for collectives); the job is ending, so it is left to MPI_Finalize/Abort.
ControlChannel::~ControlChannel() = default;

absl::Status ControlChannel::Broken(absl::Status status) {
  broken_ = status;
  return status;
}

absl::Status ControlChannel::Send(const pb::StepPlan& plan) {
  if (rank_ != 0) return absl::FailedPreconditionError("ControlChannel::Send is for rank 0");
  if (!broken_.ok()) return broken_;
  const size_t length = plan.ByteSizeLong();
  if (static_cast<int64_t>(length) > options_.max_plan_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepPlan of ", length, " bytes is over the limit"));
  }
  std::string bytes;
  if (!plan.SerializeToString(&bytes)) return absl::InternalError("StepPlan does not serialize");
  PutLength(length, frame_.data());
  const size_t inline_bytes = std::min<size_t>(length, kRoom);
  std::memcpy(frame_.data() + kLengthBytes, bytes.data(), inline_bytes);
  std::memset(frame_.data() + kLengthBytes + inline_bytes, 0, kRoom - inline_bytes);

  const absl::Time deadline = absl::Now() + options_.send_timeout;
  BackoffPolicy policy;  // rank 0 has work waiting: poll hard, short sleeps
  policy.spin = absl::Milliseconds(1);
  policy.max_sleep = absl::Microseconds(500);
  MPI_Request request = MPI_REQUEST_NULL;
  if (int rc = MPI_Ibcast(frame_.data(), kFrameBytes, MPI_BYTE, 0, comm_.get(), &request);
      rc != MPI_SUCCESS) {
    return Broken(absl::InternalError(absl::StrCat("MPI_Ibcast of a plan frame: MPI error ", rc)));
  }
  if (absl::Status s = WaitForRequest(&request, deadline, "sending a step plan", policy); !s.ok()) {
    return Broken(s);
  }
  if (length > kRoom) {
    if (int rc = MPI_Ibcast(bytes.data() + kRoom, static_cast<int>(length - kRoom), MPI_BYTE, 0,
                            comm_.get(), &request);
        rc != MPI_SUCCESS) {
      return Broken(absl::InternalError(absl::StrCat("MPI_Ibcast of a plan tail: MPI error ", rc)));
    }
    if (absl::Status s = WaitForRequest(&request, deadline, "sending a step plan", policy);
        !s.ok()) {
      return Broken(s);
    }
  }
  plan_bytes_ += length;
  ++plans_;
  return absl::OkStatus();
}

absl::StatusOr<pb::StepPlan> ControlChannel::Receive(absl::Time deadline) {
  if (rank_ == 0) return absl::FailedPreconditionError("ControlChannel::Receive is for workers");
  if (!broken_.ok()) return broken_;
  if (pending_ == Pending::kNone) {
    if (int rc = MPI_Ibcast(frame_.data(), kFrameBytes, MPI_BYTE, 0, comm_.get(), &request_);
        rc != MPI_SUCCESS) {
      return Broken(
          absl::InternalError(absl::StrCat("MPI_Ibcast of a plan frame: MPI error ", rc)));
    }
    pending_ = Pending::kFrame;
  }
  while (true) {
    absl::Status s = WaitForRequest(&request_, deadline, "waiting for rank 0's step plan",
                                    options_.receive_backoff);
    if (absl::IsDeadlineExceeded(s)) return s;  // still posted: the next call continues
    if (!s.ok()) return Broken(s);
    if (pending_ == Pending::kTail) return FinishReceive();
    const uint64_t length = GetLength(frame_.data());
    if (length > static_cast<uint64_t>(options_.max_plan_bytes)) {
      return Broken(
          absl::DataLossError(absl::StrCat("step plan frame announces ", length, " bytes")));
    }
    if (length <= kRoom) return FinishReceive();
    tail_.resize(length - kRoom);
    if (int rc = MPI_Ibcast(tail_.data(), static_cast<int>(tail_.size()), MPI_BYTE, 0, comm_.get(),
                            &request_);
        rc != MPI_SUCCESS) {
      return Broken(absl::InternalError(absl::StrCat("MPI_Ibcast of a plan tail: MPI error ", rc)));
    }
    pending_ = Pending::kTail;
  }
}

absl::StatusOr<pb::StepPlan> ControlChannel::FinishReceive() {
  const uint64_t length = GetLength(frame_.data());
  std::string bytes(frame_.data() + kLengthBytes, std::min<uint64_t>(length, kRoom));
  if (length > kRoom) bytes.append(tail_.data(), tail_.size());
  pending_ = Pending::kNone;
  pb::StepPlan plan;
  if (!plan.ParseFromString(bytes)) {
    return Broken(
        absl::DataLossError(absl::StrCat("a step plan of ", length, " bytes does not parse")));
  }
  plan_bytes_ += length;
  ++plans_;
  return plan;
}

}  // namespace mqa
