#include "launcher/signals.h"

#include <csignal>

namespace mqa {
namespace {

// SIGUSR2 is how the destructor wakes the watcher; it is blocked like the others.
sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A client that disconnects mid-write must be an error return, not a dead process.
  std::signal(SIGPIPE, SIG_IGN);
}

TerminationWatcher::TerminationWatcher(std::function<void()> on_first,
                                       std::function<void()> on_second) {
  thread_ = std::thread([on_first = std::move(on_first), on_second = std::move(on_second)] {
    const sigset_t set = WatchedSignals();
    int received = 0;
    for (int signal = 0; sigwait(&set, &signal) == 0;) {
      if (signal == SIGUSR2) return;
      if (received++ == 0) {
        on_first();
      } else {
        on_second();
      }
    }
  });
}

TerminationWatcher::~TerminationWatcher() {
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace mqa
