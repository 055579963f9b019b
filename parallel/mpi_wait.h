// Waiting for a nonblocking MPI request without blocking forever and without spinning a core.
//
// Open MPI's blocking calls (MPI_Wait, MPI_Bcast, ...) busy-poll, which pins a core at 100% on an
// idle worker, and they never return if a peer died. Instead every mqaserve MPI operation is
// nonblocking and completed here: MPI_Test in a tight loop for a short while (the answer usually
// comes soon), then MPI_Test between sleeps that grow while nothing happens, until a deadline.
// Stateless; callable from whichever single thread owns the request.
#pragma once

#include <mpi.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mqa {

struct BackoffPolicy {
  // Poll without sleeping this long first.
  absl::Duration spin = absl::Microseconds(100);
  // Then sleep min_sleep between polls for hold, then grow the sleep by 1.5x up to max_sleep.
  absl::Duration min_sleep = absl::Microseconds(50);
  absl::Duration hold = absl::Milliseconds(20);
  absl::Duration max_sleep = absl::Milliseconds(5);
};

// Any thread, e.g. on SIGTERM. From then on a wait that has lasted PatienceWhenEnding() gives up
// with Aborted: a wait that much longer than healthy ones after the launcher started ending the
// job means a peer is gone. mpirun and Slurm SIGTERM the surviving ranks when one dies and SIGKILL
// them about a second later; this lets rank 0 fail its requests and say why in that second.
void AbandonStuckWaits();

// 0.4 s, or four times the slowest wait that completed in the last 15 to 30 s when that is longer
// (a loaded machine, a CPU step of a large model), up to 5 s: a graceful SIGTERM of every rank
// (Slurm's) must not be taken for a death because the machine is slow, which would fail the
// requests the drain exists to finish.
absl::Duration PatienceWhenEnding();

// What a wait consults, for TerminationLiveness (termination_liveness.h): on_poll runs at every
// poll (it may start MPI operations of its own), and once the job is ending a wait past its
// patience is given up only while peers_alive, when set, says false. Set on the MPI thread at
// start-up and cleared at shutdown, while no wait runs.
struct WaitHooks {
  std::function<void()> on_poll;
  std::function<bool()> peers_alive;
};
void SetWaitHooks(WaitHooks hooks);

// Waits until `*request` completes (then it is MPI_REQUEST_NULL) or `deadline` passes: then
// DeadlineExceeded naming `what`, with the request still pending (the caller may wait again or
// give up on the job; MPI cannot cancel a collective). An MPI error is an Internal status.
absl::Status WaitForRequest(MPI_Request* request, absl::Time deadline, absl::string_view what,
                            const BackoffPolicy& policy = {});

}  // namespace mqa
