// TerminationLiveness at two ranks: once the job is ending, rank 0 gives up on a wait past its
// patience while rank 1 has not said it is alive, and waits out a slow answer once it has.
#include "parallel/termination_liveness.h"

#include <mpi.h>

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "parallel/mpi_wait.h"
#include "tests/parallel/mpi_test_env.h"

namespace mqa {
namespace {

TEST(TerminationLiveness, RankZeroWaitsOutAPeerThatSaidItIsAlive) {
  ASSERT_EQ(TestWorld().size(), 2);
  absl::StatusOr<std::unique_ptr<TerminationLiveness>> liveness =
      TerminationLiveness::Create(TestWorld());
  ASSERT_TRUE(liveness.ok()) << liveness.status();
  absl::StatusOr<Communicator> comm = TestWorld().Dup();
  ASSERT_TRUE(comm.ok());
  const MPI_Comm c = comm->get();
  int value = 0;
  if (TestWorld().rank() == 0) {
    AbandonStuckWaits();
    // Rank 1 has said nothing: a wait past 0.4 s is taken for a dead peer.
    MPI_Request silent = MPI_REQUEST_NULL;
    MPI_Irecv(&value, 1, MPI_INT, 1, 1, c, &silent);
    absl::Time start = absl::Now();
    absl::Status given_up = WaitForRequest(&silent, absl::Now() + absl::Seconds(20), "silent");
    EXPECT_EQ(given_up.code(), absl::StatusCode::kAborted) << given_up;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    MPI_Cancel(&silent);
    MPI_Wait(&silent, MPI_STATUS_IGNORE);
    int go = 1;
    MPI_Send(&go, 1, MPI_INT, 1, 2, c);
    // Rank 1 says it is alive, then answers 1.5 s later: waited out.
    MPI_Request slow = MPI_REQUEST_NULL;
    MPI_Irecv(&value, 1, MPI_INT, 1, 3, c, &slow);
    start = absl::Now();
    EXPECT_TRUE(WaitForRequest(&slow, absl::Now() + absl::Seconds(20), "slow").ok());
    EXPECT_GE(absl::Now() - start, absl::Seconds(1));
    EXPECT_EQ(value, 7);
  } else {
    int go = 0;
    MPI_Recv(&go, 1, MPI_INT, 0, 2, c, MPI_STATUS_IGNORE);
    TerminationLiveness::NoteTerminating();  // what the worker's SIGTERM watcher does
    // Its next wait says so to rank 0.
    MPI_Request self_recv = MPI_REQUEST_NULL, self_send = MPI_REQUEST_NULL;
    int mine = 0, sent = 1;
    MPI_Irecv(&mine, 1, MPI_INT, 1, 9, c, &self_recv);
    MPI_Isend(&sent, 1, MPI_INT, 1, 9, c, &self_send);
    ASSERT_TRUE(WaitForRequest(&self_recv, absl::Now() + absl::Seconds(5), "self").ok());
    ASSERT_TRUE(WaitForRequest(&self_send, absl::Now() + absl::Seconds(5), "self").ok());
    absl::SleepFor(absl::Milliseconds(1500));
    int answer = 7;
    MPI_Send(&answer, 1, MPI_INT, 0, 3, c);
  }
  MPI_Barrier(c);
  liveness->reset();
}

}  // namespace
}  // namespace mqa
