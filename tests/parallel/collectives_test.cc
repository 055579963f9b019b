// Collectives over MPI (run with 2 and 4 ranks) and the one-rank LocalCollectives: exact sums of
// random inputs chosen so that every partial sum is representable (the order of the reduction
// cannot change the answer), f32/f16/bf16, odd sizes.
#include "parallel/collectives.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "parallel/world.h"
#include "tests/parallel/mpi_test_env.h"

namespace mqa {
namespace {

// A random value that rank `rank` holds at element i: k * 2^-scale_bits with |k| < 2^bits, never
// zero, so sums of up to 16 ranks are exact in every dtype for the chosen bits.
float RankValue(uint64_t seed, int rank, int64_t i, int bits, int scale_bits) {
  // splitmix64 of (seed, rank, i): cheap and well mixed.
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + rank * 0xbf58476d1ce4e5b9ull +
               static_cast<uint64_t>(i) * 0x94d049bb133111ebull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const int k = static_cast<int>(1 + (z >> 1) % ((1u << bits) - 1)) * ((z & 1) ? 1 : -1);
  return std::ldexp(static_cast<float>(k), -scale_bits);
}

struct DTypeCase {
  DType dtype;
  int bits;        // significant bits of each value: the sum over 4 ranks needs 2 more
  int scale_bits;  // values in (-2^(bits-scale_bits), 2^(bits-scale_bits))
};

Tensor FillRank(DType dtype, int64_t n, uint64_t seed, int rank, const DTypeCase& c) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = RankValue(seed, rank, i, c.bits, c.scale_bits);
  Tensor t = Tensor::Cpu({n}, dtype);
  ConvertFloats(values.data(), DType::kF32, t.raw(), dtype, n);
  return t;
}

std::vector<float> ToF32(const Tensor& t) {
  std::vector<float> out(t.numel());
  ConvertFloats(t.raw(), t.dtype(), out.data(), DType::kF32, t.numel());
  return out;
}

class MpiCollectivesTest : public ::testing::TestWithParam<DTypeCase> {
 protected:
  void SetUp() override {
    auto c = MakeMpiCollectives(TestWorld());
    ASSERT_TRUE(c.ok()) << c.status();
    coll_ = *std::move(c);
  }
  std::unique_ptr<Collectives> coll_;
};

TEST_P(MpiCollectivesTest, AllReduceSumIsExactForOddSizes) {
  const DTypeCase c = GetParam();
  const int size = coll_->world_size();
  ASSERT_EQ(size, TestWorld().size());
  ASSERT_EQ(coll_->rank(), TestWorld().rank());
  for (int64_t n : {1, 7, 1000, 4099, 65537}) {
    Tensor t = FillRank(c.dtype, n, /*seed=*/n, coll_->rank(), c);
    ASSERT_TRUE(coll_->AllReduceSum(t).ok());
    const std::vector<float> got = ToF32(t);
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += RankValue(n, r, i, c.bits, c.scale_bits);
      ASSERT_EQ(got[i], want) << "n=" << n << " i=" << i;
    }
  }
}

TEST_P(MpiCollectivesTest, AllGatherAndGatherPlaceRowsInRankOrder) {
  const DTypeCase c = GetParam();
  const int size = coll_->world_size();
  const int rank = coll_->rank();
  for (int64_t rows : {1, 3, 17}) {
    const int64_t cols = 5;
    Tensor in = FillRank(c.dtype, rows * cols, /*seed=*/100 + rows, rank, c).Reshape({rows, cols});
    Tensor all = Tensor::Cpu({size * rows, cols}, c.dtype);
    ASSERT_TRUE(coll_->AllGather(in, all).ok());
    Tensor gathered = Tensor::Cpu({size * rows, cols}, c.dtype);
    std::memset(gathered.raw(), 0, gathered.nbytes());
    const int root = size - 1;
    ASSERT_TRUE(coll_->Gather(in, gathered, root).ok());
    for (int r = 0; r < size; ++r) {
      Tensor expect = FillRank(c.dtype, rows * cols, 100 + rows, r, c);
      ASSERT_EQ(
          std::memcmp(all.Rows(r * rows, (r + 1) * rows).raw(), expect.raw(), expect.nbytes()), 0)
          << "all-gather rank " << r;
      if (rank == root) {
        ASSERT_EQ(std::memcmp(gathered.Rows(r * rows, (r + 1) * rows).raw(), expect.raw(),
                              expect.nbytes()),
                  0)
            << "gather rank " << r;
      }
    }
  }
}

TEST_P(MpiCollectivesTest, BroadcastCopiesRootEverywhere) {
  const DTypeCase c = GetParam();
  for (int root = 0; root < coll_->world_size(); ++root) {
    Tensor t = FillRank(c.dtype, 1001, /*seed=*/7, coll_->rank(), c);
    ASSERT_TRUE(coll_->Broadcast(t, root).ok());
    Tensor expect = FillRank(c.dtype, 1001, 7, root, c);
    ASSERT_EQ(std::memcmp(t.raw(), expect.raw(), t.nbytes()), 0) << "root " << root;
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, MpiCollectivesTest,
                         ::testing::Values(DTypeCase{DType::kF32, 20, 10},
                                           DTypeCase{DType::kF16, 8, 8},
                                           DTypeCase{DType::kBF16, 4, 4}),
                         [](const auto& info) { return std::string(DTypeName(info.param.dtype)); });

TEST(MpiCollectivesErrors, BadArgumentsAreStatusesNotCrashes) {
  auto coll = MakeMpiCollectives(TestWorld());
  ASSERT_TRUE(coll.ok());
  Tensor ints = Tensor::Cpu({4}, DType::kI32);
  EXPECT_EQ((*coll)->AllReduceSum(ints).code(), absl::StatusCode::kInvalidArgument);
  Tensor in = Tensor::Cpu({4}, DType::kF32);
  Tensor small = Tensor::Cpu({3}, DType::kF32);
  EXPECT_EQ((*coll)->AllGather(in, small).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*coll)->Broadcast(in, TestWorld().size()).code(), absl::StatusCode::kInvalidArgument);
}

// Fault design: a collective that a peer does not join returns DeadlineExceeded at the deadline
// instead of hanging, and the collectives refuse further work. (Here the peers join late, so
// the abandoned collective completes and the job can finish cleanly.)
TEST(MpiCollectivesErrors, MissingPeerTimesOutInsteadOfHanging) {
  if (TestWorld().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  CollectivesOptions options;  // rank 0 gives up soon; the late ranks are patient
  options.timeout = TestWorld().is_root() ? absl::Milliseconds(300) : absl::Seconds(30);
  auto coll = MakeMpiCollectives(TestWorld(), options);
  ASSERT_TRUE(coll.ok());
  Tensor t = Tensor::Cpu({1000}, DType::kF32);
  std::fill_n(t.data<float>(), 1000, 1.0f);
  if (TestWorld().is_root()) {
    const absl::Time start = absl::Now();
    const absl::Status status = (*coll)->AllReduceSum(t);
    const absl::Duration took = absl::Now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    EXPECT_GE(took, absl::Milliseconds(300));
    EXPECT_LT(took, absl::Seconds(3));
    EXPECT_EQ((*coll)->AllReduceSum(t).code(), absl::StatusCode::kFailedPrecondition);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    EXPECT_TRUE((*coll)->AllReduceSum(t).ok());
  }
  // Rank 0 drives progress for the late ranks while it waits here; `t` outlives the collective.
  ASSERT_EQ(MPI_Barrier(TestWorld().comm()), MPI_SUCCESS);
}

TEST(LocalCollectives, OneRankCopiesAndKeeps) {
  auto coll = MakeLocalCollectives();
  EXPECT_EQ(coll->world_size(), 1);
  const DTypeCase c{DType::kF32, 20, 10};
  Tensor t = FillRank(DType::kF32, 33, 1, 0, c);
  const std::vector<float> before = ToF32(t);
  ASSERT_TRUE(coll->AllReduceSum(t).ok());
  EXPECT_EQ(ToF32(t), before);
  Tensor out = Tensor::Cpu({33});
  ASSERT_TRUE(coll->AllGather(t, out).ok());
  EXPECT_EQ(ToF32(out), before);
  Tensor out2 = Tensor::Cpu({33});
  ASSERT_TRUE(coll->Gather(t, out2, 0).ok());
  EXPECT_EQ(ToF32(out2), before);
  EXPECT_FALSE(coll->Gather(t, out2, 1).ok());
}

TEST(World, LocalRanksPartitionTheNode) {
  World& w = TestWorld();
  // All test ranks run on one host: local rank equals global rank, local size the world size.
  EXPECT_EQ(w.local_size(), w.size());
  EXPECT_EQ(w.local_rank(), w.rank());
  EXPECT_FALSE(w.hostname().empty());
  auto device = DeviceForRank(w, w.local_size());
  ASSERT_TRUE(device.ok());
  EXPECT_EQ(*device, w.local_rank());
  EXPECT_EQ(DeviceForRank(w, w.local_size() - 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mqa
