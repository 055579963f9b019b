// Per-SM shares of the decode chain's rows (kernels/decode_chain.h): built from rates, and
// calibrated from chain timelines. Host code only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/decode_chain.h"
#include "runtime/status.h"

namespace mqa {
namespace {

// The furthest a calibrated share moves from an equal one (log of the rate): the persistent
// differences measured were 2-4% (benchmarks/mqabench/NOTES.md version 13); a larger estimate is
// more likely a disturbed calibration than a slow SM.
constexpr double kMaxLogShare = 0.15;

double Pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

}  // namespace

absl::StatusOr<DecodeChainSmShares> DecodeChainSharesFromRates(
    const std::vector<std::pair<int, double>>& rates) {
  if (rates.empty()) return absl::InvalidArgumentError("DecodeChain shares: no SMs");
  std::vector<std::pair<int, double>> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto [sm, rate] = sorted[i];
    if (sm < 0 || sm >= kDecodeChainMaxSmIds || (i > 0 && sorted[i - 1].first == sm) ||
        !(rate > 0) || !std::isfinite(rate)) {
      return absl::InvalidArgumentError(absl::StrCat("DecodeChain shares: SM ", sm, " rate ", rate,
                                                     " (distinct ids 0..", kDecodeChainMaxSmIds - 1,
                                                     ", rates > 0)"));
    }
    total += rate;
  }
  DecodeChainSmShares s;
  std::fill(std::begin(s.bounds), std::end(s.bounds), kDecodeChainNoShare);
  s.sms = static_cast<int>(sorted.size());
  double cum = 0;
  uint32_t lo = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    cum += sorted[i].second;
    const uint32_t hi =
        i + 1 == sorted.size()
            ? kDecodeChainShareOne
            : std::min(kDecodeChainShareOne,
                       static_cast<uint32_t>(std::llround(kDecodeChainShareOne * cum / total)));
    s.bounds[sorted[i].first] = lo | hi << 16;
    lo = hi;
  }
  return s;
}

std::string DecodeChainShareCalibration::Summary() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%d SMs from %d launches (%d phase samples): half-sample correlation %.2f, "
                "reliability %.2f, shares %.3f .. %.3f of an equal one",
                shares.sms, launches, samples, half_correlation, reliability, min_share, max_share);
  return buf;
}

DecodeChainShareCalibrator::DecodeChainShareCalibrator(int grid, std::vector<int64_t> phase_rows)
    : grid_(grid), phase_rows_(std::move(phase_rows)) {
  for (int h = 0; h < 2; ++h) {
    sum_[h].assign(kDecodeChainMaxSmIds, 0.0);
    weight_[h].assign(kDecodeChainMaxSmIds, 0.0);
  }
}

absl::Status DecodeChainShareCalibrator::AddLaunch(const unsigned long long* words) {
  auto word = [&](int b, int e) {
    return words[static_cast<size_t>(b) * kDecodeChainTimelineWords + e];
  };
  if (word(0, kChainGlobalStart) == 0) return absl::OkStatus();  // not recorded
  std::vector<int> sm(grid_);
  std::vector<bool> seen(kDecodeChainMaxSmIds, false);
  for (int b = 0; b < grid_; ++b) {
    if (word(b, kChainGlobalStart) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DecodeChain calibration: CTA ", b, " of ", grid_,
          " recorded nothing (a smaller grid: SMs left spare? shares need a CTA on every SM)"));
    }
    const unsigned long long id = word(b, kChainSmId);
    if (id >= static_cast<unsigned long long>(kDecodeChainMaxSmIds) || seen[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("DecodeChain calibration: CTA ", b, " on SM ", id,
                       id >= static_cast<unsigned long long>(kDecodeChainMaxSmIds)
                           ? " (out of range)"
                           : " (two CTAs on one SM: the chain needs one an SM)"));
    }
    seen[id] = true;
    sm[b] = static_cast<int>(id);
  }
  const int half = launches_ % 2;
  ++launches_;
  const int phases = static_cast<int>(phase_rows_.size());
  for (int g = 0; g < phases && g <= kMaxDecodeChainPhases; ++g) {
    const int64_t n = phase_rows_[g];
    if (n < grid_) continue;  // CTAs without rows
    const int base = kChainPhaseEvents + g * kChainPhaseEventCount;
    std::vector<double> x(grid_), t(grid_);
    bool complete = true;
    for (int b = 0; b < grid_ && complete; ++b) {
      const unsigned long long first = word(b, base + kChainFirstFull);
      const unsigned long long last = word(b, base + kChainLastRelease);
      const int64_t rows = (b + 1) * n / grid_ - b * n / grid_;
      complete = first != 0 && last > first;
      if (complete) {
        t[b] = static_cast<double>(last - first);
        x[b] = std::log(static_cast<double>(rows) / t[b]);
      }
    }
    if (!complete) continue;
    double mean = 0;
    for (double v : x) mean += v;
    mean /= grid_;
    std::vector<double> sorted_t = t;
    std::nth_element(sorted_t.begin(), sorted_t.begin() + grid_ / 2, sorted_t.end());
    const double w = sorted_t[grid_ / 2];  // a phase weighs by its length
    for (int b = 0; b < grid_; ++b) {
      sum_[half][sm[b]] += w * (x[b] - mean);
      weight_[half][sm[b]] += w;
    }
    ++samples_;
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodeChainShareCalibration> DecodeChainShareCalibrator::Finish() const {
  std::vector<int> sms;
  std::vector<double> half0, half1;
  std::vector<std::pair<int, double>> rates;
  for (int s = 0; s < kDecodeChainMaxSmIds; ++s) {
    if (weight_[0][s] == 0 && weight_[1][s] == 0) continue;
    if (weight_[0][s] == 0 || weight_[1][s] == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("DecodeChain calibration: SM ", s, " is in one half of the samples only"));
    }
    sms.push_back(s);
    half0.push_back(sum_[0][s] / weight_[0][s]);
    half1.push_back(sum_[1][s] / weight_[1][s]);
  }
  if (static_cast<int>(sms.size()) != grid_ || launches_ < 2) {
    return absl::FailedPreconditionError(absl::StrCat("DecodeChain calibration: ", sms.size(),
                                                      " SMs of ", grid_, " seen in ", launches_,
                                                      " launches (every SM in two at least)"));
  }
  DecodeChainShareCalibration c;
  c.launches = launches_;
  c.samples = samples_;
  c.half_correlation = Pearson(half0, half1);
  c.reliability = c.half_correlation > 0 ? 2 * c.half_correlation / (1 + c.half_correlation) : 0;
  double mean_share = 0;
  for (size_t i = 0; i < sms.size(); ++i) {
    const int s = sms[i];
    const double est = (sum_[0][s] + sum_[1][s]) / (weight_[0][s] + weight_[1][s]);
    const double log_share = std::clamp(c.reliability * est, -kMaxLogShare, kMaxLogShare);
    rates.emplace_back(s, std::exp(log_share));
    mean_share += rates.back().second;
  }
  mean_share /= static_cast<double>(rates.size());
  c.min_share = c.max_share = rates[0].second / mean_share;
  for (const auto& [s, r] : rates) {
    c.min_share = std::min(c.min_share, r / mean_share);
    c.max_share = std::max(c.max_share, r / mean_share);
  }
  ASSIGN_OR_RETURN(c.shares, DecodeChainSharesFromRates(rates));
  return c;
}

}  // namespace mqa
