#include "runtime/stop_strings.h"

#include <algorithm>
#include <utility>

namespace mqa {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {}

StopStringMatcher::Result StopStringMatcher::Push(const std::string& delta) {
  Result result;
  if (stopped_) return result;
  held_ += delta;
  // Everything emitted so far ends before any possible start of a stop string, so a match lies
  // wholly within held_. Take the earliest (ties: the longest).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at == std::string::npos) continue;
    if (at < best || (at == best && stop.size() > best_stop->size())) {
      best = at;
      best_stop = &stop;
    }
  }
  if (best_stop != nullptr) {
    result.text = held_.substr(0, include_stop_ ? best + best_stop->size() : best);
    result.stopped = true;
    result.stop = *best_stop;
    stopped_ = true;
    held_.clear();
    return result;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t len = std::min(stop.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string rest = std::move(held_);
  held_.clear();
  return rest;
}

}  // namespace mqa
