#include "launcher/signals.h"

#include <atomic>
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

// Threads started before main (OpenBLAS's pool) do not inherit the blocked mask, so the kernel may
// deliver SIGTERM to one of them. The handler passes it on to the watcher thread, or keeps it for
// the watcher to find when none is running yet (workers never start one: they stop on rank 0's
// shutdown plan).
std::atomic<pthread_t*> g_watcher{nullptr};
std::atomic<int> g_pending_signal{0};

void ForwardToWatcher(int signal) {
  if (pthread_t* watcher = g_watcher.load()) {
    pthread_kill(*watcher, signal);  // async-signal-safe
  } else {
    g_pending_signal.store(signal);
  }
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  struct sigaction action = {};
  action.sa_handler = ForwardToWatcher;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
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
  handle_ = thread_.native_handle();
  g_watcher.store(&handle_);
  // A signal that arrived before there was a watcher.
  if (const int pending = g_pending_signal.exchange(0)) pthread_kill(handle_, pending);
}

TerminationWatcher::~TerminationWatcher() {
  g_watcher.store(nullptr);
  pthread_kill(handle_, SIGUSR2);
  thread_.join();
}

}  // namespace mqa
