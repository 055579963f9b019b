// Prints one decode-chain call's timeline (DecodeChainTuning::timeline, the event words of
// kernels/decode_chain_cuda.h): every event as min / median / max over the CTAs, in us from the
// call's first CTA start. Shared by gemm_bench (--chain only: one layer, isolated) and mqabench
// (--chain-timeline: a layer of a real decode step). Host code only.
//
// Clock64 events are placed on %globaltimer's axis through each CTA's start stamp and the median
// clock rate (the start-to-end globaltimer span over the clock64 span).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/decode_chain_cuda.h"

namespace mqa::bench {

struct ChainTimelineView {
  const unsigned long long* call = nullptr;      // grid x kDecodeChainTimelineWords words
  const unsigned long long* previous = nullptr;  // the launch before it on the stream, or null
  const char* previous_name = "previous call";
  int grid = 0;
  std::vector<std::string> phases;  // a label a phase (an attention phase first)
  std::vector<double> ideal_us;     // a phase's weights at the copy rate (0: none)
  // CTAs [0, head_ctas) own a head of the attention inside the chain (0: none): their rows and
  // the other CTAs' are printed again apart (min / median / max over each group).
  int head_ctas = 0;
};

inline void PrintChainTimeline(const std::string& title, const ChainTimelineView& v) {
  const int grid = v.grid;
  const int phases = static_cast<int>(v.phases.size());
  auto word = [&](const unsigned long long* call, int cta, int e) {
    return call[static_cast<size_t>(cta) * kDecodeChainTimelineWords + e];
  };
  std::vector<double> rate;  // ns a clock
  for (int b = 0; b < grid; ++b) {
    const double dg =
        static_cast<double>(word(v.call, b, kChainGlobalEnd) - word(v.call, b, kChainGlobalStart));
    const double dc =
        static_cast<double>(word(v.call, b, kChainClockEnd) - word(v.call, b, kChainClockStart));
    if (dc > 0) rate.push_back(dg / dc);
  }
  std::sort(rate.begin(), rate.end());
  const double ns_per_clock = rate.empty() ? 0.0 : rate[rate.size() / 2];
  unsigned long long t0 = ~0ull, prev_end = 0;
  std::vector<unsigned long long> starts;
  for (int b = 0; b < grid; ++b) {
    t0 = std::min(t0, word(v.call, b, kChainGlobalStart));
    if (v.previous != nullptr) prev_end = std::max(prev_end, word(v.previous, b, kChainGlobalEnd));
    starts.push_back(word(v.call, b, kChainGlobalStart));
  }
  std::sort(starts.begin(), starts.end());
  unsigned long long tick = ~0ull;  // the smallest step between distinct start stamps
  for (size_t i = 1; i < starts.size(); ++i) {
    if (starts[i] > starts[i - 1]) tick = std::min(tick, starts[i] - starts[i - 1]);
  }
  // us from t0 of CTA b's clock64 stamp e (NaN where it was not recorded).
  auto at = [&](int b, int e) {
    const unsigned long long c = word(v.call, b, e);
    if (c == 0) return std::nan("");
    const double ns =
        static_cast<double>(word(v.call, b, kChainGlobalStart) - t0) +
        (static_cast<double>(c) - static_cast<double>(word(v.call, b, kChainClockStart))) *
            ns_per_clock;
    return ns * 1e-3;
  };
  int b_lo = 0, b_hi = grid;  // the CTAs `stats` covers
  auto stats = [&](auto&& value) {
    std::vector<double> x;
    for (int b = b_lo; b < b_hi; ++b) {
      const double y = value(b);
      if (!std::isnan(y)) x.push_back(y);
    }
    char buf[48];
    if (x.empty()) return std::string("           -           ");
    std::sort(x.begin(), x.end());
    std::snprintf(buf, sizeof(buf), "%6.2f %6.2f %6.2f  ", x.front(), x[x.size() / 2], x.back());
    return std::string(buf);
  };
  std::printf(
      "\n%s (%d CTAs; clock %.3f GHz; globaltimer step >= %llu ns). us from the call's first CTA "
      "start, min / median / max over CTAs:\n",
      title.c_str(), grid, ns_per_clock > 0 ? 1.0 / ns_per_clock : 0.0,
      tick == ~0ull ? 0ull : tick);
  if (v.previous != nullptr) {
    std::printf("  %s: last CTA ended at %+.2f us\n", v.previous_name,
                (static_cast<double>(prev_end) - static_cast<double>(t0)) * 1e-3);
  }
  auto table = [&](const char* group) {
    if (group != nullptr) std::printf("  %s:\n", group);
    std::printf(
        "  CTA starts %s; PDL wait done %s; ends %s\n",
        stats([&](int b) { return (word(v.call, b, kChainGlobalStart) - t0) * 1e-3; }).c_str(),
        stats([&](int b) { return at(b, kChainPdlDone); }).c_str(),
        stats([&](int b) { return (word(v.call, b, kChainGlobalEnd) - t0) * 1e-3; }).c_str());
    std::printf("  %-16s", "phase");
    for (int g = 0; g < phases; ++g) std::printf("| %-22s", v.phases[g].c_str());
    if (!v.ideal_us.empty()) {
      std::printf("\n  %-16s", "ideal us");
      double layer = 0;
      for (int g = 0; g < phases; ++g) {
        const double u = g < static_cast<int>(v.ideal_us.size()) ? v.ideal_us[g] : 0.0;
        layer += u;
        std::printf("| %-22.2f", u);
      }
      std::printf("  (copy rate; all %.2f)", layer);
    }
    auto row = [&](const char* name, auto&& event_of) {
      std::printf("\n  %-16s", name);
      for (int g = 0; g < phases; ++g) {
        const int e = event_of(g);
        std::printf("| %s", stats([&](int b) { return at(b, e); }).c_str());
      }
    };
    row("producer first", [](int g) { return kChainProducerEvents + 2 * g; });
    row("producer last", [](int g) { return kChainProducerEvents + 2 * g + 1; });
    row("loop start", [](int g) { return kChainLoopStart + g; });
    const char* events[kChainPhaseEventCount] = {"barrier enter", "barrier exit", "input ready",
                                                 "first stage",   "last release", "epilogue done"};
    for (int e = 0; e < kChainPhaseEventCount; ++e) {
      row(events[e], [e](int g) { return kChainPhaseEvents + g * kChainPhaseEventCount + e; });
    }
    std::printf("\n");
  };
  table(nullptr);
  if (v.head_ctas > 0 && v.head_ctas < grid) {
    const std::string heads = "CTAs 0-" + std::to_string(v.head_ctas - 1) + " (a head each)";
    b_hi = v.head_ctas;
    table(heads.c_str());
    b_lo = v.head_ctas;
    b_hi = grid;
    table("the other CTAs");
  }
}

}  // namespace mqa::bench
