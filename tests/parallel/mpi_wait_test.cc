// WaitForRequest once the job is ending (AbandonStuckWaits): a wait gives up after 0.4 s, or after
// four times the slowest wait that completed lately when the machine is slow. One rank: the
// requests are receives from itself, satisfied by a send from another thread or never.
#include "parallel/mpi_wait.h"

#include <mpi.h>

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/parallel/mpi_test_env.h"

namespace mqa {
namespace {

// A receive from this rank that a send `delay` later satisfies; waited for before the job ends.
absl::Duration SlowHealthyWait(absl::Duration delay) {
  int value = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(&value, 1, MPI_INT, 0, 7, TestWorld().comm(), &request);
  std::thread sender([delay] {
    absl::SleepFor(delay);
    int one = 1;
    MPI_Send(&one, 1, MPI_INT, 0, 7, TestWorld().comm());
  });
  const absl::Time start = absl::Now();
  EXPECT_TRUE(WaitForRequest(&request, absl::Now() + absl::Seconds(10), "slow").ok());
  sender.join();
  EXPECT_EQ(value, 1);
  return absl::Now() - start;
}

// How long a receive that nothing satisfies is waited for once the job is ending.
absl::Duration StuckWait() {
  int value = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(&value, 1, MPI_INT, 0, 8, TestWorld().comm(), &request);
  const absl::Time start = absl::Now();
  absl::Status status = WaitForRequest(&request, absl::Now() + absl::Seconds(20), "stuck");
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  MPI_Cancel(&request);
  MPI_Request_free(&request);
  return waited;
}

TEST(MpiWait, EndingJobGivesUpAfterFourTimesTheSlowestHealthyWait) {
  ASSERT_EQ(TestWorld().size(), 1);
  AbandonStuckWaits();
  // Healthy waits of a few milliseconds: 0.4 s.
  for (int i = 0; i < 3; ++i) SlowHealthyWait(absl::Milliseconds(2));
  EXPECT_EQ(PatienceWhenEnding(), absl::Milliseconds(400));
  const absl::Duration quick = StuckWait();
  EXPECT_GE(quick, absl::Milliseconds(400));
  EXPECT_LT(quick, absl::Milliseconds(1500));
  // A slow machine: a healthy wait of 0.3 s (under the 0.4 s it may take) makes a stuck one wait
  // at least 1.2 s.
  const absl::Duration slow = SlowHealthyWait(absl::Milliseconds(300));
  EXPECT_GE(slow, absl::Milliseconds(300));
  EXPECT_GE(PatienceWhenEnding(), absl::Milliseconds(4 * 300));
  EXPECT_LE(PatienceWhenEnding(), absl::Seconds(5));
  const absl::Duration patient = StuckWait();
  EXPECT_GE(patient, absl::Milliseconds(4 * 300));
  EXPECT_LT(patient, absl::Seconds(5) + absl::Seconds(1));
}

}  // namespace
}  // namespace mqa
