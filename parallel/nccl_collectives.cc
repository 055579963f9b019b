// Collectives over NCCL for GPU tensors, one GPU per rank. The communicator is non-blocking
// (ncclConfig_t::blocking = 0) so that no NCCL call can hang the host: every call returns at once
// and we poll ncclCommGetAsyncError, with a deadline, for the enqueue to finish or fail. The
// collectives themselves are stream-ordered on options.cuda_stream; Synchronize() waits for them
// while polling for asynchronous errors (a dead peer), and aborts the communicator on timeout.
#include <nccl.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "parallel/collectives.h"
#include "parallel/mpi_wait.h"
#include "parallel/world.h"
#include "runtime/cuda_check.h"
#include "runtime/status.h"

namespace mqa {
namespace {

absl::StatusOr<ncclDataType_t> NcclType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

// Sleeps between polls that grow from 10 us to 1 ms.
class Poller {
 public:
  void Pause() {
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(sleep_));
    sleep_ = std::min(sleep_ * 2, absl::Milliseconds(1));
  }

 private:
  absl::Duration sleep_ = absl::Microseconds(10);
};

// Owns an ncclComm_t: finalised and destroyed when healthy, aborted after an error (aborting
// never waits for peers).
class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm() { Close(); }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t* out() { return &comm_; }
  ncclComm_t get() const { return comm_; }
  void MarkFailed() { failed_ = true; }
  bool failed() const { return failed_; }

  // Waits until the communicator has no call in progress; an asynchronous error (a peer died, a
  // network failure) becomes a Status and marks the communicator failed.
  absl::Status WaitIdle(absl::Time deadline, absl::string_view what) {
    Poller poller;
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) state = rc;
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        failed_ = true;
        return absl::InternalError(absl::StrCat(what, ": NCCL error: ", ncclGetErrorString(state),
                                                " (", ncclGetLastError(comm_), ")"));
      }
      if (absl::Now() >= deadline) {
        failed_ = true;
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": NCCL still in progress at the deadline"));
      }
      poller.Pause();
    }
  }

 private:
  void Close() {
    if (comm_ == nullptr) return;
    if (!failed_) {
      const ncclResult_t rc = ncclCommFinalize(comm_);
      if (rc != ncclSuccess && rc != ncclInProgress) failed_ = true;
      if (!failed_ && !WaitIdle(absl::Now() + absl::Seconds(10), "ncclCommFinalize").ok()) {
        failed_ = true;
      }
    }
    if (failed_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
};

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(int rank, int size, const CollectivesOptions& options)
      : rank_(rank), size_(size), options_(options) {}

  absl::Status Init(const World& world, int device) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    const absl::Time deadline = absl::Now() + options_.timeout;
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    ASSIGN_OR_RETURN(Communicator comm, world.Dup());
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_RETURN_IF_ERROR(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, comm.get(), &request));
    RETURN_IF_ERROR(WaitForRequest(&request, deadline, "broadcast of the NCCL unique id"));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    RETURN_IF_ERROR(Check(ncclCommInitRankConfig(comm_.out(), size_, id, rank_, &config), deadline,
                          "ncclCommInitRankConfig"));
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  absl::Status AllReduceSum(Tensor& tensor) override {
    RETURN_IF_ERROR(CheckGpu("AllReduceSum", tensor));
    if (tensor.dtype() != DType::kF32 && tensor.dtype() != DType::kF16 &&
        tensor.dtype() != DType::kBF16) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllReduceSum: not a float tensor: ", tensor.DebugString()));
    }
    ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(tensor.dtype()));
    const absl::Time deadline = absl::Now() + options_.timeout;
    return Check(ncclAllReduce(tensor.raw(), tensor.raw(), tensor.numel(), type, ncclSum,
                               comm_.get(), stream()),
                 deadline, "ncclAllReduce");
  }

  absl::Status AllGather(const Tensor& input, Tensor& output) override {
    RETURN_IF_ERROR(CheckGpu("AllGather", input));
    RETURN_IF_ERROR(CheckGpu("AllGather", output));
    RETURN_IF_ERROR(CheckGatherShapes("AllGather", input, output));
    const absl::Time deadline = absl::Now() + options_.timeout;
    return Check(
        ncclAllGather(input.raw(), output.raw(), input.nbytes(), ncclUint8, comm_.get(), stream()),
        deadline, "ncclAllGather");
  }

  absl::Status Gather(const Tensor& input, Tensor& output, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Gather: root ", root, " of ", size_));
    }
    RETURN_IF_ERROR(CheckGpu("Gather", input));
    if (rank_ == root) {
      RETURN_IF_ERROR(CheckGpu("Gather", output));
      RETURN_IF_ERROR(CheckGatherShapes("Gather", input, output));
    }
    RETURN_IF_ERROR(Healthy("Gather"));
    const absl::Time deadline = absl::Now() + options_.timeout;
    const size_t bytes = input.nbytes();
    // NCCL has no gather: point-to-point sends to the root, fused in one group.
    NCCL_RETURN_IF_ERROR(ncclGroupStart());
    if (rank_ == root) {
      char* out = static_cast<char*>(output.raw());
      for (int r = 0; r < size_; ++r) {
        if (r == root) continue;
        NCCL_RETURN_IF_ERROR(ncclRecv(out + r * bytes, bytes, ncclUint8, r, comm_.get(), stream()));
      }
    } else {
      NCCL_RETURN_IF_ERROR(ncclSend(input.raw(), bytes, ncclUint8, root, comm_.get(), stream()));
    }
    RETURN_IF_ERROR(Check(ncclGroupEnd(), deadline, "NCCL gather"));
    if (rank_ == root) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(output.raw()) + root * bytes,
                                           input.raw(), bytes, cudaMemcpyDeviceToDevice, stream()));
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(Tensor& tensor, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " of ", size_));
    }
    RETURN_IF_ERROR(CheckGpu("Broadcast", tensor));
    const absl::Time deadline = absl::Now() + options_.timeout;
    return Check(ncclBroadcast(tensor.raw(), tensor.raw(), tensor.nbytes(), ncclUint8, root,
                               comm_.get(), stream()),
                 deadline, "ncclBroadcast");
  }

  absl::Status Synchronize() override {
    RETURN_IF_ERROR(Healthy("Synchronize"));
    const absl::Time deadline = absl::Now() + options_.timeout;
    Poller poller;
    while (true) {
      const cudaError_t rc = cudaStreamQuery(stream());
      if (rc == cudaSuccess) return absl::OkStatus();
      if (rc != cudaErrorNotReady) {
        comm_.MarkFailed();
        CUDA_RETURN_IF_ERROR(rc);
      }
      RETURN_IF_ERROR(Healthy("Synchronize"));
      if (absl::Now() >= deadline) {
        comm_.MarkFailed();
        return absl::DeadlineExceededError(absl::StrCat("NCCL collectives not finished after ",
                                                        absl::FormatDuration(options_.timeout),
                                                        ": a peer rank is gone or stuck"));
      }
      poller.Pause();
    }
  }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(options_.cuda_stream); }

  // An error seen earlier (possibly asynchronously, from a previous collective) fails every
  // later call: the ranks are out of step.
  absl::Status Healthy(absl::string_view what) {
    if (comm_.failed()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": the NCCL communicator failed earlier"));
    }
    ncclResult_t state = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_.get(), &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      comm_.MarkFailed();
      return absl::InternalError(
          absl::StrCat(what, ": NCCL asynchronous error: ", ncclGetErrorString(state)));
    }
    return absl::OkStatus();
  }

  // The result of a non-blocking NCCL call: done, in progress (wait for the enqueue), or failed.
  absl::Status Check(ncclResult_t rc, absl::Time deadline, absl::string_view what) {
    if (rc == ncclSuccess) return Healthy(what);
    if (rc == ncclInProgress) return comm_.WaitIdle(deadline, what);
    comm_.MarkFailed();
    return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(rc)));
  }

  absl::Status CheckGpu(absl::string_view op, const Tensor& t) {
    if (!t.defined() || t.device() != Device::kCuda) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": NCCL collectives take GPU tensors, got ", t.defined() ? t.DebugString() : "none"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckGatherShapes(absl::string_view op, const Tensor& input, const Tensor& output) {
    if (output.dtype() != input.dtype() || output.nbytes() != input.nbytes() * size_) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": output ", output.DebugString(),
                                                     " must hold ", size_, " x input ",
                                                     input.DebugString()));
    }
    return absl::OkStatus();
  }

  int rank_;
  int size_;
  CollectivesOptions options_;
  NcclComm comm_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(
    const World& world, int device, const CollectivesOptions& options) {
  auto nccl = std::make_unique<NcclCollectives>(world.rank(), world.size(), options);
  RETURN_IF_ERROR(nccl->Init(world, device));
  return nccl;
}

}  // namespace mqa
