#include "parallel/mpi_wait.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {
namespace {

std::atomic<bool> g_abandon_stuck_waits{false};
constexpr absl::Duration kPatienceWhenEnding = absl::Milliseconds(400);
constexpr absl::Duration kMaxPatienceWhenEnding = absl::Seconds(5);
constexpr int kPatienceOverSlowest = 4;

// The slowest wait that completed lately: the longest of the current window and the one before
// (each kWindow long), so that one slow moment is forgotten within two windows.
class SlowestRecentWait {
 public:
  void Record(absl::Duration waited, absl::Time now) {
    std::lock_guard<std::mutex> lock(mu_);
    Roll(now);
    current_ = std::max(current_, waited);
  }
  absl::Duration Get(absl::Time now) {
    std::lock_guard<std::mutex> lock(mu_);
    Roll(now);
    return std::max(current_, previous_);
  }

 private:
  static constexpr absl::Duration kWindow = absl::Seconds(15);
  void Roll(absl::Time now) {
    if (now - window_start_ < kWindow) return;
    previous_ = now - window_start_ < 2 * kWindow ? current_ : absl::ZeroDuration();
    current_ = absl::ZeroDuration();
    window_start_ = now;
  }
  std::mutex mu_;
  absl::Time window_start_ = absl::InfinitePast();
  absl::Duration current_ = absl::ZeroDuration();
  absl::Duration previous_ = absl::ZeroDuration();
};

SlowestRecentWait& SlowestWaits() {
  static SlowestRecentWait* waits = new SlowestRecentWait();
  return *waits;
}

WaitHooks& Hooks() {
  static WaitHooks* hooks = new WaitHooks();
  return *hooks;
}

}  // namespace

void SetWaitHooks(WaitHooks hooks) { Hooks() = std::move(hooks); }

void AbandonStuckWaits() { g_abandon_stuck_waits.store(true); }

absl::Duration PatienceWhenEnding() {
  return std::clamp(kPatienceOverSlowest * SlowestWaits().Get(absl::Now()), kPatienceWhenEnding,
                    kMaxPatienceWhenEnding);
}

absl::Status WaitForRequest(MPI_Request* request, absl::Time deadline, absl::string_view what,
                            const BackoffPolicy& policy) {
  const absl::Time start = absl::Now();
  absl::Duration sleep = policy.min_sleep;
  while (true) {
    if (Hooks().on_poll) Hooks().on_poll();
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char text[MPI_MAX_ERROR_STRING] = {};
      int len = 0;
      MPI_Error_string(rc, text, &len);
      return absl::InternalError(
          absl::StrCat(what, ": MPI error ", rc, ": ", absl::string_view(text, len)));
    }
    if (done) {
      SlowestWaits().Record(absl::Now() - start, absl::Now());
      return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": no answer from the other ranks after ", absl::FormatDuration(now - start)));
    }
    const absl::Duration waited = now - start;
    if (waited >= kPatienceWhenEnding && g_abandon_stuck_waits.load(std::memory_order_relaxed) &&
        waited >= PatienceWhenEnding() && !(Hooks().peers_alive && Hooks().peers_alive())) {
      return absl::AbortedError(absl::StrCat(
          what, ": the job is being ended and the other ranks have not answered for ",
          absl::FormatDuration(waited), ": a rank has died or stopped"));
    }
    if (waited < policy.spin) continue;
    if (waited > policy.spin + policy.hold) sleep = std::min(sleep * 1.5, policy.max_sleep);
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(std::min(sleep, deadline - now)));
  }
}

}  // namespace mqa
