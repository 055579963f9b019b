// The MPI world of one mqaserve job: initialises MPI on construction and finalises it on
// destruction (RAII), and knows this process's rank, the world size, and its node-local rank
// (from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), which picks the GPU: never global rank % gpus.
//
// Ownership: create exactly one World per process, in main, before anything that talks MPI, and
// keep it alive until all of those (collectives, control channels, Communicators) are destroyed.
// Threads: MPI is initialised with MPI_THREAD_MULTIPLE when the library offers it, else at least
// MPI_THREAD_FUNNELED. mqaserve calls MPI from one thread only (the engine thread on rank 0, the
// main thread on workers); HTTP threads never do. Under FUNNELED that one thread must be the one
// that called World::Init (mpi_from_any_thread() says whether another thread may be it).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mqa {

// An owned MPI communicator (MPI_Comm_free on destruction), with MPI_ERRORS_RETURN so that
// failures come back as error codes, which the MPI_RETURN_IF_ERROR macro turns into a Status.
class Communicator {
 public:
  Communicator() = default;
  // Takes ownership of `comm` (not MPI_COMM_WORLD / MPI_COMM_SELF / MPI_COMM_NULL).
  explicit Communicator(MPI_Comm comm) : comm_(comm) {}
  ~Communicator();
  Communicator(Communicator&& other) noexcept : comm_(other.comm_) { other.comm_ = MPI_COMM_NULL; }
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // A new communicator with the same group (own message space): used so that the control
  // channel and the collectives never match each other's messages.
  static absl::StatusOr<Communicator> Dup(MPI_Comm comm);

  MPI_Comm get() const { return comm_; }
  int rank() const;
  int size() const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

class World {
 public:
  // Initialises MPI (or adopts it if already initialised, then does not finalise it). argc/argv
  // may be null.
  static absl::StatusOr<std::unique_ptr<World>> Init(int* argc = nullptr, char*** argv = nullptr);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes of this node, and their count: the GPU index is local_rank().
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }
  bool is_root() const { return rank_ == 0; }
  int thread_level() const { return thread_level_; }
  // True when the single MPI-calling thread may be other than the initialising one
  // (MPI_THREAD_SERIALIZED or better).
  bool mpi_from_any_thread() const { return thread_level_ >= MPI_THREAD_SERIALIZED; }

  // All ranks of the job (a duplicate of MPI_COMM_WORLD; errors returned, not fatal).
  MPI_Comm comm() const { return world_.get(); }
  // A fresh duplicate of comm() for one component's traffic.
  absl::StatusOr<Communicator> Dup() const { return Communicator::Dup(world_.get()); }

  // Ends the whole job: prints `status` (with rank and host) to stderr and calls MPI_Abort, which
  // makes mpirun / srun kill every rank. For errors that leave the ranks out of step (a failed or
  // timed-out collective): returning instead would leave the others waiting.
  [[noreturn]] void Abort(const absl::Status& status, int exit_code = 1) const;

  // "rank 1/4 on host-a (local 1/2)", for log lines.
  std::string Describe() const;

 private:
  World() = default;
  bool owns_mpi_ = false;
  int thread_level_ = 0;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::string hostname_;
  Communicator world_;
};

// The CUDA device of this rank: its node-local rank (never global rank % devices, which breaks
// when nodes run different numbers of ranks). FailedPrecondition, naming the host, when the node
// runs more ranks than it has devices (NCCL needs a GPU per rank).
absl::StatusOr<int> DeviceForRank(const World& world, int device_count);

}  // namespace mqa
