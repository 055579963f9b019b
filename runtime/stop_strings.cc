#include "runtime/stop_strings.h"

#include <algorithm>
#include <utility>

namespace mqa {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {}

StopStringMatcher::Result StopStringMatcher::Push(const std::string& delta) {
  return Take(delta, /*final=*/false);
}

std::string StopStringMatcher::Flush() { return Take("", /*final=*/true).text; }

StopStringMatcher::Result StopStringMatcher::Take(const std::string& delta, bool final) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  const size_t old_size = held_.size();
  held_ += delta;
  // The stop that ends first (ties: the one that begins first, i.e. the longer), so that the
  // result does not depend on how the text arrived. Every occurrence ending in the old text was
  // found by an earlier call, so the search starts where a new one could.
  size_t best_end = std::string::npos;
  size_t best_begin = 0;
  int best = -1;
  for (size_t s = 0; s < stops_.size(); ++s) {
    const std::string& stop = stops_[s];
    if (stop.empty()) continue;
    const size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const size_t at = held_.find(stop, from);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < best_end || (end == best_end && at < best_begin)) {
      best_end = end;
      best_begin = at;
      best = static_cast<int>(s);
    }
  }
  if (best >= 0) {
    result.text = held_.substr(0, include_stop_ ? best_end : best_begin);
    result.stopped = true;
    result.stop = stops_[best];
    result.stop_index = best;
    stopped_ = true;
    held_.clear();
    return result;
  }
  // Hold back the longest tail that is a proper prefix of a stop string: it may yet complete.
  size_t hold = 0;
  if (!final) {
    for (const std::string& stop : stops_) {
      if (stop.empty()) continue;
      for (size_t len = std::min(stop.size() - 1, held_.size()); len > hold; --len) {
        if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
  }
  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

}  // namespace mqa
