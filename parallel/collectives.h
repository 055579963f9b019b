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
#include "runtime/tensor.h"

namespace mqa {

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
};

// A single rank: AllReduceSum and Broadcast do nothing; AllGather/Gather copy input to output.
std::unique_ptr<Collectives> MakeLocalCollectives();

}  // namespace mqa
