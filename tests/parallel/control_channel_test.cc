// Rank 0 encodes random engine steps and broadcasts the plans; every worker decodes them and
// must rebuild exactly the StepInput that rank 0 started from (each rank runs the same seeded
// simulator, so a worker knows what rank 0 had).
#include "parallel/control_channel.h"

#include <gtest/gtest.h>

#include <thread>

#include "parallel/plan_codec.h"
#include "tests/parallel/mpi_test_env.h"
#include "tests/parallel/step_simulator.h"

namespace mqa {
namespace {

constexpr int kBlockSize = 16;

std::unique_ptr<ControlChannel> MakeChannel() {
  auto channel = ControlChannel::Create(TestWorld());
  MQA_CHECK_OK(channel.status());
  return *std::move(channel);
}

TEST(ControlChannel, EveryWorkerRebuildsEveryStepInput) {
  auto channel = MakeChannel();
  const PlanCodecOptions codec{.block_size = kBlockSize, .send_mirror_hash = true};
  // Long prompts in large chunks: some plans overflow the frame.
  StepSimulator sim(/*seed=*/42, kBlockSize, /*num_blocks=*/3000, /*max_prompt=*/2000,
                    /*max_chunk=*/1024);
  constexpr int kSteps = 150;
  if (TestWorld().is_root()) {
    PlanEncoder encoder(codec);
    int64_t framed_only = 0;
    for (int step = 0; step < kSteps; ++step) {
      auto plan = encoder.Encode(sim.Next());
      ASSERT_TRUE(plan.ok()) << plan.status();
      framed_only += plan->ByteSizeLong() <= ControlChannel::kFrameBytes - 8;
      ASSERT_TRUE(channel->Send(*plan).ok());
    }
    // Both wire paths ran: plans inside the frame, and plans with a tail.
    EXPECT_GT(framed_only, 0);
    EXPECT_LT(framed_only, kSteps);
    ASSERT_TRUE(channel->Send(encoder.EncodeShutdown()).ok());
    EXPECT_EQ(channel->plans(), kSteps + 1);
  } else {
    PlanDecoder decoder(codec);
    for (int step = 0;; ++step) {
      auto plan = channel->ReceiveFor(absl::Seconds(60));
      ASSERT_TRUE(plan.ok()) << plan.status();
      auto in = decoder.Decode(*plan);
      ASSERT_TRUE(in.ok()) << in.status();
      if (plan->shutdown()) {
        EXPECT_EQ(step, kSteps);
        break;
      }
      ExpectSameStepInput(sim.Next(), *in);
      ASSERT_FALSE(HasFailure()) << "step " << step;
    }
  }
}

TEST(ControlChannel, ReceiveTimesOutAndThenContinues) {
  auto channel = MakeChannel();
  pb::StepPlan plan;
  plan.set_step(7);
  plan.add_logits_rows(3);
  if (TestWorld().is_root()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(channel->Send(plan).ok());
    EXPECT_FALSE(channel->Receive().ok());  // rank 0 only sends
  } else {
    auto early = channel->ReceiveFor(absl::Milliseconds(50));
    EXPECT_TRUE(absl::IsDeadlineExceeded(early.status())) << early.status();
    auto got = channel->ReceiveFor(absl::Seconds(30));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->step(), 7u);
    ASSERT_EQ(got->logits_rows_size(), 1);
    EXPECT_EQ(got->logits_rows(0), 3);
    EXPECT_FALSE(channel->Send(plan).ok());  // workers only receive
  }
}

TEST(ControlChannel, WorkersDetectAMirrorThatDiffersFromRankZeros) {
  auto channel = MakeChannel();
  const PlanCodecOptions codec{.block_size = kBlockSize, .send_mirror_hash = true};
  StepSimulator sim(7, kBlockSize, 300);
  if (TestWorld().is_root()) {
    PlanEncoder encoder(codec);
    for (int step = 0; step < 10; ++step) {
      auto plan = encoder.Encode(sim.Next());
      ASSERT_TRUE(plan.ok());
      if (step == 9) plan->set_mirror_hash(plan->mirror_hash() ^ 1);  // rank 0's view differs
      ASSERT_TRUE(channel->Send(*plan).ok());
    }
  } else {
    PlanDecoder decoder(codec);
    for (int step = 0; step < 10; ++step) {
      auto plan = channel->ReceiveFor(absl::Seconds(60));
      ASSERT_TRUE(plan.ok()) << plan.status();
      auto in = decoder.Decode(*plan);
      if (step < 9) {
        ASSERT_TRUE(in.ok()) << in.status();
      } else {
        EXPECT_EQ(in.status().code(), absl::StatusCode::kDataLoss) << in.status();
      }
    }
  }
}

}  // namespace
}  // namespace mqa
