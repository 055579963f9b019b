// Per-SM shares of the decode chain's rows (kernels/decode_chain.h): DecodeChainSharesFromRates
// partitions every n exactly in SM-id order, in proportion to the rates; the calibrator recovers
// persistent per-SM rates from synthetic timelines (CTAs placed on SMs in a different order every
// launch) and gives equal shares where the timelines hold noise only; what each refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/decode_chain.h"

namespace mqa {
namespace {

// Rows [r0, r1) of the CTA on SM `sm` of a phase of n rows, as the kernel computes them.
std::pair<int64_t, int64_t> Rows(const DecodeChainSmShares& s, int sm, int64_t n) {
  return {DecodeChainShareRow(s.bounds[sm], n, false), DecodeChainShareRow(s.bounds[sm], n, true)};
}

TEST(DecodeChainShares, FromRatesPartitionsEveryNInSmOrder) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> rate(0.85, 1.15);
  // 132 SMs with ids spread over 0..143 (ids need not be contiguous), given out of order.
  std::vector<int> ids(144);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(132);
  std::vector<std::pair<int, double>> rates;
  for (int id : ids) rates.emplace_back(id, rate(rng));
  const absl::StatusOr<DecodeChainSmShares> s = DecodeChainSharesFromRates(rates);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sms, 132);
  std::vector<int> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  for (int id = 0; id < kDecodeChainMaxSmIds; ++id) {
    if (!std::binary_search(sorted.begin(), sorted.end(), id)) {
      EXPECT_EQ(s->bounds[id], kDecodeChainNoShare) << "SM " << id;
    }
  }
  double total = 0;
  for (const auto& [id, r] : rates) total += r;
  for (int64_t n : {1, 7, 131, 132, 133, 2300, 6144, 6400, 24576, 49152}) {
    int64_t next = 0;
    for (int id : sorted) {
      const auto [r0, r1] = Rows(*s, id, n);
      ASSERT_EQ(r0, next) << "n " << n << " SM " << id << ": a gap or an overlap";
      ASSERT_LE(r0, r1);
      next = r1;
      const double r = std::find_if(rates.begin(), rates.end(), [&](const auto& p) {
                         return p.first == id;
                       })->second;
      // Each bound is rounded to 1 / kDecodeChainShareOne (half a unit) and then to a row.
      const double tol = static_cast<double>(n) / kDecodeChainShareOne + 2.0;
      EXPECT_NEAR(static_cast<double>(r1 - r0), n * r / total, tol) << "n " << n << " SM " << id;
    }
    EXPECT_EQ(next, n) << "n " << n << ": rows past the last SM's";
  }
}

TEST(DecodeChainShares, FromRatesRefuses) {
  EXPECT_FALSE(DecodeChainSharesFromRates({}).ok());
  EXPECT_FALSE(DecodeChainSharesFromRates({{0, 1.0}, {0, 1.0}}).ok());  // one id twice
  EXPECT_FALSE(DecodeChainSharesFromRates({{0, 1.0}, {1, 0.0}}).ok());
  EXPECT_FALSE(DecodeChainSharesFromRates({{0, 1.0}, {1, NAN}}).ok());
  EXPECT_FALSE(DecodeChainSharesFromRates({{-1, 1.0}}).ok());
  EXPECT_FALSE(DecodeChainSharesFromRates({{kDecodeChainMaxSmIds, 1.0}}).ok());
}

// Timelines of `launches` launches of a StarCoder-shaped chain (phases 6144, 24576, 6144 and
// 6400 rows) on `grid` SMs whose ids are `ids`, CTAs placed on them in a fresh order each launch;
// SM i streams at true_rate[i] with independent per-(launch, phase) noise of `noise`.
std::vector<std::vector<unsigned long long>> Timelines(const std::vector<int>& ids,
                                                       const std::vector<double>& true_rate,
                                                       double noise, int launches,
                                                       std::mt19937& rng) {
  const int grid = static_cast<int>(ids.size());
  const int64_t rows_of[4] = {6144, 24576, 6144, 6400};
  std::normal_distribution<double> z(0.0, 1.0);
  std::vector<std::vector<unsigned long long>> out;
  for (int l = 0; l < launches; ++l) {
    std::vector<int> order(grid);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<unsigned long long> w(DecodeChainTimelineWords(grid), 0);
    for (int b = 0; b < grid; ++b) {
      const int i = order[b];  // CTA b runs on SM ids[i]
      auto at = [&](int e) -> unsigned long long& {
        return w[static_cast<size_t>(b) * kDecodeChainTimelineWords + e];
      };
      at(kChainGlobalStart) = 1000;
      at(kChainClockStart) = 1000;
      at(kChainSmId) = static_cast<unsigned long long>(ids[i]);
      unsigned long long clock = 5000;
      for (int g = 0; g < 4; ++g) {
        const int64_t n = rows_of[g];
        const int64_t rows = (b + 1) * n / grid - b * n / grid;
        // ~2 GHz, 24 KiB a row of 12288 elements -> about 5.6 ns a row at 4.3 TB/s / 132 SMs.
        const double t = rows * 11000.0 / true_rate[i] * (1.0 + noise * z(rng));
        const int base = kChainPhaseEvents + g * kChainPhaseEventCount;
        at(base + kChainFirstFull) = clock;
        clock += static_cast<unsigned long long>(t);
        at(base + kChainLastRelease) = clock;
        clock += 3000;
      }
      at(kChainClockEnd) = clock;
      at(kChainGlobalEnd) = clock;
    }
    out.push_back(std::move(w));
  }
  return out;
}

std::vector<int> SpreadIds(int grid, std::mt19937& rng) {
  std::vector<int> ids(grid + 12);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(grid);
  return ids;
}

TEST(DecodeChainShares, CalibratorRecoversPersistentRates) {
  std::mt19937 rng(11);
  const int grid = 132;
  const std::vector<int> ids = SpreadIds(grid, rng);
  std::normal_distribution<double> z(0.0, 0.03);  // SMs 3% apart (one standard deviation)
  std::vector<double> true_rate(grid);
  for (double& r : true_rate) r = std::exp(z(rng));
  DecodeChainShareCalibrator cal(grid, {6144, 24576, 6144, 6400});
  for (const auto& w : Timelines(ids, true_rate, 0.01, 40, rng)) {
    ASSERT_TRUE(cal.AddLaunch(w.data()).ok());
  }
  const absl::StatusOr<DecodeChainShareCalibration> c = cal.Finish();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launches, 40);
  EXPECT_EQ(c->samples, 160);
  EXPECT_GT(c->half_correlation, 0.8) << c->Summary();
  EXPECT_GT(c->reliability, 0.9) << c->Summary();
  // Each SM's share of c_fc follows its true rate.
  std::vector<double> share, want;
  double total = 0;
  for (double r : true_rate) total += r;
  for (int i = 0; i < grid; ++i) {
    const auto [r0, r1] = Rows(c->shares, ids[i], 24576);
    share.push_back(static_cast<double>(r1 - r0));
    want.push_back(24576 * true_rate[i] / total);
  }
  double err = 0;
  for (int i = 0; i < grid; ++i) err = std::max(err, std::abs(share[i] - want[i]) / want[i]);
  EXPECT_LT(err, 0.02) << c->Summary();
  EXPECT_LT(c->min_share, 0.97) << c->Summary();
  EXPECT_GT(c->max_share, 1.03) << c->Summary();
}

TEST(DecodeChainShares, CalibratorGivesEqualSharesForNoise) {
  std::mt19937 rng(13);
  const int grid = 132;
  const std::vector<int> ids = SpreadIds(grid, rng);
  DecodeChainShareCalibrator cal(grid, {6144, 24576, 6144, 6400});
  for (const auto& w : Timelines(ids, std::vector<double>(grid, 1.0), 0.03, 20, rng)) {
    ASSERT_TRUE(cal.AddLaunch(w.data()).ok());
  }
  const absl::StatusOr<DecodeChainShareCalibration> c = cal.Finish();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LT(c->reliability, 0.5) << c->Summary();
  EXPECT_GT(c->min_share, 0.98) << c->Summary();
  EXPECT_LT(c->max_share, 1.02) << c->Summary();
}

TEST(DecodeChainShares, CalibratorRefuses) {
  std::mt19937 rng(17);
  const int grid = 8;
  std::vector<int> ids = SpreadIds(grid, rng);
  const std::vector<double> rate(grid, 1.0);
  {
    DecodeChainShareCalibrator cal(grid, {64, 256});
    EXPECT_EQ(cal.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
    const auto w = Timelines(ids, rate, 0.01, 1, rng);
    ASSERT_TRUE(cal.AddLaunch(w[0].data()).ok());
    EXPECT_EQ(cal.Finish().status().code(), absl::StatusCode::kFailedPrecondition)
        << "one launch: no second half";
    // A launch with nothing recorded is skipped.
    std::vector<unsigned long long> empty(DecodeChainTimelineWords(grid), 0);
    ASSERT_TRUE(cal.AddLaunch(empty.data()).ok());
    EXPECT_FALSE(cal.Finish().ok());
  }
  {
    DecodeChainShareCalibrator cal(grid, {64, 256});
    auto w = Timelines(ids, rate, 0.01, 1, rng)[0];
    w[kChainSmId] = w[kDecodeChainTimelineWords + kChainSmId];  // CTAs 0 and 1 on one SM
    EXPECT_EQ(cal.AddLaunch(w.data()).code(), absl::StatusCode::kInvalidArgument);
    w[kChainSmId] = kDecodeChainMaxSmIds;
    EXPECT_EQ(cal.AddLaunch(w.data()).code(), absl::StatusCode::kInvalidArgument);
    auto spare = Timelines(ids, rate, 0.01, 1, rng)[0];
    spare[(grid - 1) * kDecodeChainTimelineWords + kChainGlobalStart] = 0;  // a grid of 7
    EXPECT_EQ(cal.AddLaunch(spare.data()).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace mqa
