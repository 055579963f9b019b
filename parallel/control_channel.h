// The control channel: rank 0 broadcasts one StepPlan per engine step to every worker, as a
// length-prefixed protobuf over MPI (its own duplicate communicator, so it never matches
// collective traffic).
//
// Wire format: every plan is one MPI_Ibcast of a fixed kFrameBytes frame (8-byte little-endian
// length, then the first bytes of the serialized plan); a plan longer than the frame's room
// follows with a second MPI_Ibcast of the rest. A decode step's plan fits in the frame, so the
// common case is a single collective.
//
// Waiting: never a blocking MPI call (Open MPI's busy-poll a core, and never return when a peer
// dies). A receiving worker polls MPI_Test, sleeping between polls longer and longer while
// nothing comes (50 us growing to 5 ms), so an idle worker uses well under 10% of a core, and
// returns DeadlineExceeded at its deadline with the receive still posted: the next Receive
// continues it. Rank 0 should therefore send a plan (an empty one will do) at least once per
// worker timeout while idle, so that workers can tell an idle server from a dead one.
//
// Threads: one thread per rank uses a channel (rank 0's engine thread; the worker's main thread).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/mpi_wait.h"
#include "parallel/step_plan.pb.h"
#include "parallel/world.h"

namespace mqa {

struct ControlChannelOptions {
  // How a worker waits for the next plan.
  BackoffPolicy receive_backoff;
  // Rank 0: a send not complete by then (a worker is gone) fails with DeadlineExceeded.
  absl::Duration send_timeout = absl::Seconds(30);
  // Plans larger than this are refused (a corrupted length cannot make a worker allocate more).
  int64_t max_plan_bytes = int64_t{1} << 30;
};

class ControlChannel {
 public:
  static constexpr int kFrameBytes = 2048;
  static constexpr int kLengthBytes = 8;

  // Collective over all ranks of `world` (duplicates its communicator); `world` must outlive the
  // channel. Rank 0 sends; every other rank receives.
  static absl::StatusOr<std::unique_ptr<ControlChannel>> Create(
      const World& world, const ControlChannelOptions& options = {});
  ~ControlChannel();

  // Rank 0: broadcasts `plan` and waits until the send is complete. After an error the channel
  // is broken (the ranks are out of step) and every later call fails.
  absl::Status Send(const pb::StepPlan& plan);

  // Workers: the next plan. DeadlineExceeded if none arrived by `deadline` (the receive stays
  // posted; call again); DataLoss for bytes that do not parse; Internal for an MPI failure.
  absl::StatusOr<pb::StepPlan> Receive(absl::Time deadline = absl::InfiniteFuture());
  absl::StatusOr<pb::StepPlan> ReceiveFor(absl::Duration timeout) {
    return Receive(absl::Now() + timeout);
  }

  int rank() const { return rank_; }
  // Bytes of serialized plans sent (rank 0) or received (workers), and plans.
  int64_t plan_bytes() const { return plan_bytes_; }
  int64_t plans() const { return plans_; }

 private:
  ControlChannel(Communicator comm, const ControlChannelOptions& options);
  absl::Status Broken(absl::Status status);
  absl::StatusOr<pb::StepPlan> FinishReceive();

  enum class Pending : uint8_t { kNone, kFrame, kTail };

  Communicator comm_;
  ControlChannelOptions options_;
  int rank_ = 0;
  absl::Status broken_;
  // Worker state of the receive in progress (kept across a DeadlineExceeded).
  Pending pending_ = Pending::kNone;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<char> frame_;
  std::vector<char> tail_;
  int64_t plan_bytes_ = 0;
  int64_t plans_ = 0;
};

}  // namespace mqa
