// After SIGTERM every live rank tells rank 0 so (one byte on a communicator of its own), so that
// rank 0's waits can tell a peer that is slow from one that is gone. Once the job is ending
// (AbandonStuckWaits, mpi_wait.h) rank 0 gives up on a wait past its patience only while some
// peer has not said it is alive: under Slurm's graceful SIGTERM of every rank a loaded machine's
// slow step is waited out, while a rank killed outright (mpirun then SIGTERMs the others) never
// says so and the wait is given up as before.
//
// Threads: NoteTerminating from any thread (a signal watcher); the rest on the rank's MPI thread,
// through the wait hooks it installs (mpi_wait.h).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "parallel/world.h"

namespace mqa {

class TerminationLiveness {
 public:
  // Collective over the world (a communicator is duplicated); installs the wait hooks for its
  // lifetime. One rank: nothing to do.
  static absl::StatusOr<std::unique_ptr<TerminationLiveness>> Create(const World& world);
  ~TerminationLiveness();
  TerminationLiveness(const TerminationLiveness&) = delete;
  TerminationLiveness& operator=(const TerminationLiveness&) = delete;

  // Any thread: this rank is being ended and is alive. A worker says so to rank 0 from its next
  // MPI wait.
  static void NoteTerminating();

 private:
  explicit TerminationLiveness(Communicator comm);
  void OnPoll();      // a worker: sends its note once, after NoteTerminating
  bool PeersAlive();  // rank 0: every peer's note has arrived

  Communicator comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<MPI_Request> notes_;   // rank 0: one receive a peer
  std::vector<uint8_t> note_bytes_;  // their buffers
  bool sent_ = false;                // a worker: its note went out
};

}  // namespace mqa
