// SIGTERM / SIGINT handling for a multi-threaded, MPI-launched process.
//
// BlockTerminationSignals() must run first in main, before MPI or any other thread of ours starts,
// so that every thread inherits the blocked mask and the signals are only ever taken by sigwait in
// one place: a TerminationWatcher's thread (rank 0), or nowhere (workers, which stop when rank 0
// sends the shutdown plan; mpirun and Slurm signal every rank). Threads that libraries start
// before main (OpenBLAS) keep the signals unblocked: a handler forwards what lands there.
#pragma once

#include <functional>
#include <pthread.h>
#include <thread>

namespace mqa {

void BlockTerminationSignals();

// Calls on_first on the first SIGTERM or SIGINT and on_second on any later one, on a thread of
// its own. The destructor stops that thread.
class TerminationWatcher {
 public:
  TerminationWatcher(std::function<void()> on_first, std::function<void()> on_second);
  ~TerminationWatcher();
  TerminationWatcher(const TerminationWatcher&) = delete;
  TerminationWatcher& operator=(const TerminationWatcher&) = delete;

 private:
  std::thread thread_;
  pthread_t handle_;
};

}  // namespace mqa
