// Collectives across the tensor-parallel ranks. One interface, three implementations:
//   LocalCollectives (one rank: every call is a no-op / copy),
//   MpiCollectives   (CPU tensors; GPU tensors staged through the host, so that several ranks
//                     can share one GPU in tests, which NCCL refuses),
//   NcclCollectives  (GPU tensors; the unique id shared with MPI_Bcast).
// All calls are collective: every rank calls them in the same order. Owned by the thread that
// runs the model (one per rank).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/tensor.h"

namespace mqa {

class World;

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: every rank ends with the element-wise sum over ranks (f32/f16/bf16).
  virtual absl::Status AllReduceSum(Tensor& tensor) = 0;
  // Each rank contributes `input` ([n, ...]); `output` ([world_size * n, ...]) gets rank r's
  // rows at [r*n, (r+1)*n) on every rank.
  virtual absl::Status AllGather(const Tensor& input, Tensor& output) = 0;
  // `output` on root receives every rank's `input`, rank order (other ranks' output unused).
  virtual absl::Status Gather(const Tensor& input, Tensor& output, int root) = 0;
  // `tensor` on every rank becomes root's.
  virtual absl::Status Broadcast(Tensor& tensor, int root) = 0;
  // Waits until every collective issued so far has finished (GPU work included), polling for
  // peer failures instead of blocking: call it before a blocking host read of a collective's
  // result (a blocking cudaMemcpy would hang forever if a peer died). MPI and local calls are
  // already complete when they return.
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
};

struct CollectivesOptions {
  // A collective that has not finished by then returns DeadlineExceeded: a peer is gone or stuck.
  // The ranks are then out of step; the caller should end the job (World::Abort).
  absl::Duration timeout = absl::Seconds(30);
  // cudaStream_t that orders GPU tensors' work (nullptr: the legacy default stream). NCCL enqueues
  // on it; MPI stages GPU tensors through pinned host memory with copies on it.
  void* cuda_stream = nullptr;
};

// A single rank: AllReduceSum and Broadcast do nothing; AllGather/Gather copy input to output.
std::unique_ptr<Collectives> MakeLocalCollectives();

// Every rank of `world` (its own duplicate communicator). CPU tensors, or GPU tensors staged
// through the host (several ranks may share one GPU). `world` must outlive the result.
absl::StatusOr<std::unique_ptr<Collectives>> MakeMpiCollectives(
    const World& world, const CollectivesOptions& options = {});

// NCCL over every rank of `world`, on CUDA device `device` (usually world.local_rank()); the
// unique id is broadcast from rank 0 with MPI. GPU tensors only; one GPU per rank. Collective:
// every rank calls it. FailedPrecondition in a build without CUDA.
absl::StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(
    const World& world, int device, const CollectivesOptions& options = {});

}  // namespace mqa
